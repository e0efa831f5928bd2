//! Reading weights files (safetensors; GGUF, dequantised to f32 at load) and writing
//! safetensors files, and binding a graph's weight references to them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tenet_ir::{DType, Graph, HostTensor, Op, SharedBytes, TensorType, WeightSource, WeightsId};

/// Largest weights file this crate opens.
pub const MAX_WEIGHTS_FILE_BYTES: u64 = 64 << 30;

/// Why a weights file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read weights file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("weights file {path} is {size} bytes, above the {MAX_WEIGHTS_FILE_BYTES}-byte limit")]
    TooLarge { path: String, size: u64 },
    #[error("{path} is not a valid safetensors file: {reason}")]
    Malformed { path: String, reason: String },
    #[error("{path} is not a usable GGUF file: {reason}")]
    Gguf { path: String, reason: String },
}

/// One tensor's entry in a weights file. `dtype` is `None` for safetensors dtypes tenet does not
/// have (f64, i8, …); such tensors can exist in a file but cannot be referenced by a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub dtype: Option<DType>,
    /// The file's own name for the tensor's encoding (`F32`, `BF16`, `Q4_1`, …).
    pub safetensors_dtype: String,
    pub shape: Vec<u64>,
    /// Byte range of the tensor's data within the file.
    pub range: std::ops::Range<usize>,
}

/// A safetensors file's id, tensor index, and tensors (split out once when the file is opened,
/// then lent to every run). An opened file is memory-mapped, and each tensor whose bytes are
/// aligned for its dtype is a view of the mapping, not a copy (see [`HostTensor::shared`]).
#[derive(Clone, Debug)]
pub struct WeightsFile {
    pub id: WeightsId,
    pub tensors: BTreeMap<String, TensorInfo>,
    data: BTreeMap<String, HostTensor>,
}

fn to_tenet(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn to_safetensors(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

impl WeightsFile {
    /// Map and index a file. The header is validated by the `safetensors` crate, which checks
    /// offsets against the file size and refuses oversized headers.
    pub fn open(path: &Path) -> Result<WeightsFile, WeightsError> {
        WeightsFile::open_counting(path, &AtomicU64::new(0))
    }

    /// As [`WeightsFile::open`], adding to `progress` the bytes hashed (which reads the file in)
    /// and then the bytes of the tensors indexed (about twice the file's size in all), for a
    /// progress bar.
    pub fn open_counting(path: &Path, progress: &AtomicU64) -> Result<WeightsFile, WeightsError> {
        let shown = path.display().to_string();
        let io = |source| WeightsError::Io {
            path: shown.clone(),
            source,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > MAX_WEIGHTS_FILE_BYTES {
            return Err(WeightsError::TooLarge { path: shown, size });
        }
        let (bytes, id) = map_counting(path, progress).map_err(io)?;
        WeightsFile::index(bytes, id, &shown, progress)
    }

    /// Index bytes already in memory (a GGUF file is recognised by its magic); `name` is used
    /// in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<WeightsFile, WeightsError> {
        let id = WeightsId::of_bytes(&bytes);
        WeightsFile::index(Arc::new(bytes), id, name, &AtomicU64::new(0))
    }

    /// Index `shared`, whose hash is `id`.
    fn index(
        shared: SharedBytes,
        id: WeightsId,
        name: &str,
        progress: &AtomicU64,
    ) -> Result<WeightsFile, WeightsError> {
        let bytes: &[u8] = (*shared).as_ref();
        if bytes.starts_with(crate::gguf::MAGIC) {
            return WeightsFile::from_gguf(shared, id, name, progress);
        }
        let st = SafeTensors::deserialize(bytes).map_err(|e| WeightsError::Malformed {
            path: name.to_string(),
            reason: e.to_string(),
        })?;
        let base = bytes.as_ptr() as usize;
        let tensors: BTreeMap<String, TensorInfo> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                // The view borrows `bytes`; its offset within them is where the data lives.
                let start = view.data().as_ptr() as usize - base;
                let info = TensorInfo {
                    dtype: to_tenet(view.dtype()),
                    safetensors_dtype: format!("{:?}", view.dtype()),
                    shape: view.shape().iter().map(|&d| d as u64).collect(),
                    range: start..start + view.data().len(),
                };
                (name, info)
            })
            .collect();
        let data = tensors
            .iter()
            .filter_map(|(name, info): (&String, &TensorInfo)| {
                let dtype = info.dtype?;
                let ty = TensorType::new(dtype, info.shape.clone());
                let aligned = (base + info.range.start).is_multiple_of(dtype.size() as usize);
                // A misaligned tensor is copied once here rather than on every use.
                let t = if aligned {
                    HostTensor::shared(ty, shared.clone(), info.range.clone()).ok()?
                } else {
                    HostTensor::new(ty, bytes.get(info.range.clone())?.to_vec()).ok()?
                };
                progress.fetch_add(info.range.len() as u64, Ordering::Relaxed);
                Some((name.clone(), t))
            })
            .collect();
        Ok(WeightsFile { id, tensors, data })
    }
}

impl WeightsFile {
    /// A GGUF file's tensors, named as in the file, each dequantised once to f32 (F32, F16,
    /// Q8_0 and Q4_1; tensors of other ggml types are listed but cannot be referenced). Graphs
    /// declare them f32 with the row-major shape. The id is still the hash of the file's bytes.
    fn from_gguf(
        bytes: SharedBytes,
        id: WeightsId,
        name: &str,
        progress: &AtomicU64,
    ) -> Result<WeightsFile, WeightsError> {
        use crate::gguf::{GgmlType, GgufFile};
        let gguf_err = |e: crate::gguf::GgufError| WeightsError::Gguf {
            path: name.to_string(),
            reason: e.to_string(),
        };
        let g = GgufFile::parse_shared(bytes).map_err(gguf_err)?;
        let mut tensors = BTreeMap::new();
        let mut data = BTreeMap::new();
        for t in &g.tensors {
            let values = match t.kind {
                GgmlType::Other(_) => None,
                _ => Some(g.dequantize(t).map_err(gguf_err)?),
            };
            let info = TensorInfo {
                dtype: values.as_ref().map(|_| DType::F32),
                safetensors_dtype: match t.kind {
                    GgmlType::Other(k) => format!("ggml type {k}"),
                    kind => format!("{kind:?}"),
                },
                shape: t.shape.clone(),
                range: t.range.clone(),
            };
            tensors.insert(t.name.clone(), info);
            progress.fetch_add(t.range.len() as u64, Ordering::Relaxed);
            if let Some(v) = values {
                data.insert(t.name.clone(), v);
            }
        }
        Ok(WeightsFile { id, tensors, data })
    }

    /// Tensor `name` as a host tensor, if the file has it in a dtype tenet supports.
    pub fn tensor(&self, name: &str) -> Option<&HostTensor> {
        self.data.get(name)
    }
}

/// The file at `path`, memory-mapped, and its hash, computed over 8 MiB slices each added to
/// `progress` (hashing is what reads the file in).
pub(crate) fn map_counting(
    path: &Path,
    progress: &AtomicU64,
) -> std::io::Result<(SharedBytes, WeightsId)> {
    let map = tenet_kernels::memory::MappedFile::map(&std::fs::File::open(path)?)?;
    let mut hasher = blake3::Hasher::new();
    for slice in map.bytes().chunks(8 << 20) {
        hasher.update(slice);
        progress.fetch_add(slice.len() as u64, Ordering::Relaxed);
    }
    Ok((Arc::new(map), WeightsId(*hasher.finalize().as_bytes())))
}

/// Weights from several files, each looked up by its hash.
#[derive(Clone, Debug, Default)]
pub struct WeightSet(pub Vec<WeightsFile>);

impl WeightSource for WeightSet {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        self.0.iter().find(|f| f.id == *file)?.tensor(tensor)
    }
}

/// A graph's weight reference that the given files do not satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    #[error(
        "weight {tensor:?} refers to weights file {file}, which was not given (pass it with --weights)"
    )]
    MissingFile { file: String, tensor: String },
    #[error("weights file {file} has no tensor {tensor:?}")]
    MissingTensor { file: String, tensor: String },
    #[error(
        "weight {tensor:?} is declared {declared} in the graph but is {actual} in weights file {file}"
    )]
    Mismatch {
        file: String,
        tensor: String,
        declared: String,
        actual: String,
    },
}

/// Check every weight reference of `graph` against `files`: the file with that hash is present,
/// holds the tensor, with the declared dtype and shape.
pub fn check_bindings(graph: &Graph, files: &[WeightsFile]) -> Result<(), BindError> {
    for (_, op, ty) in graph.weights() {
        let Op::Weight { file, tensor } = op else {
            continue;
        };
        let Some(wf) = files.iter().find(|f| f.id == *file) else {
            return Err(BindError::MissingFile {
                file: file.to_hex(),
                tensor: tensor.clone(),
            });
        };
        let Some(info) = wf.tensors.get(tensor) else {
            return Err(BindError::MissingTensor {
                file: file.short(),
                tensor: tensor.clone(),
            });
        };
        let matches = info.dtype == Some(ty.dtype) && info.shape == ty.shape;
        if !matches {
            let shape = info
                .shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let actual = match info.dtype {
                Some(d) => TensorType::new(d, info.shape.clone()).to_string(),
                None => format!(
                    "{}[{shape}] (a dtype tenet does not support)",
                    info.safetensors_dtype
                ),
            };
            return Err(BindError::Mismatch {
                file: file.short(),
                tensor: tensor.clone(),
                declared: ty.to_string(),
                actual,
            });
        }
    }
    Ok(())
}

/// Serialise tensors `(name, dtype, shape, little-endian bytes)` as a safetensors file. The
/// output depends only on the tensors, so the file's hash is reproducible.
pub fn write_safetensors(
    tensors: &[(&str, DType, Vec<u64>, Vec<u8>)],
) -> Result<Vec<u8>, WeightsError> {
    let malformed = |reason: String| WeightsError::Malformed {
        path: "<new file>".into(),
        reason,
    };
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            TensorView::new(to_safetensors(*dtype), shape, data)
                .map(|v| (name.to_string(), v))
                .map_err(|e| malformed(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tenet-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn an_opened_file_lends_views_of_its_mapping() {
        let w =
            HostTensor::from_f32(&[2, 3], &[1.0, -2.0, 3.5, 0.0, f32::MIN_POSITIVE, 7.0]).unwrap();
        let bytes = write_safetensors(&[
            ("w", DType::F32, vec![2, 3], w.bytes().to_vec()),
            (
                "ids",
                DType::I64,
                vec![2],
                [5i64, -1].map(i64::to_le_bytes).concat(),
            ),
        ])
        .unwrap();
        let path = temp_file("views.safetensors", &bytes);
        let progress = AtomicU64::new(0);
        let file = WeightsFile::open_counting(&path, &progress).unwrap();
        assert_eq!(file.id, WeightsId::of_bytes(&bytes));
        let got = file.tensor("w").unwrap();
        assert!(got.is_shared(), "an aligned tensor is a view, not a copy");
        assert_eq!(got, &w);
        assert_eq!(file.tensor("ids").unwrap().to_i64_vec(), vec![5, -1]);
        // Hashed (the whole file) and indexed (each tensor's bytes).
        assert_eq!(
            progress.load(Ordering::Relaxed),
            bytes.len() as u64 + 24 + 16
        );
        // The same file from bytes in memory gives the same id and tensors.
        let again = WeightsFile::from_bytes(bytes, "in memory").unwrap();
        assert_eq!((again.id, again.tensor("w")), (file.id, Some(&w)));
    }

    #[test]
    fn a_misaligned_tensor_is_copied_once_at_load() {
        // A one-byte tensor first puts the f32 tensor at an odd offset.
        let mut header = br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}"#.to_vec();
        while !header.len().is_multiple_of(8) {
            header.push(b' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&header);
        bytes.push(7);
        bytes.extend_from_slice(&[1.5f32, -0.25].map(f32::to_le_bytes).concat());
        let file = WeightsFile::open(&temp_file("odd.safetensors", &bytes)).unwrap();
        let b = file.tensor("b").unwrap();
        assert!(!b.is_shared());
        assert_eq!(b.to_f32_vec(), vec![1.5, -0.25]);
        assert!(file.tensor("a").unwrap().is_shared());
    }
}
