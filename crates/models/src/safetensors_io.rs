//! Reading weights files (safetensors; GGUF, dequantised to f32 at load) and writing
//! safetensors files, and binding a graph's weight references to them.
//!
//! Loading a file costs memory beyond the file's own bytes: GGUF tensors dequantised to f32,
//! copies of misaligned safetensors tensors, and the index. That cost is computed from the
//! index before any tensor is made and refused over the caller's limit
//! ([`WeightsFile::from_bytes_within`]; the plain loaders use
//! [`default_max_resident_bytes`]), and no two tensors may share bytes, so a file cannot make
//! more memory than its size times the dequantisation factor (at most about 7.1: Q4_0).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tenet_ir::{DType, Graph, HostTensor, Op, SharedBytes, TensorType, WeightSource, WeightsId};

/// Largest weights file this crate opens.
pub const MAX_WEIGHTS_FILE_BYTES: u64 = 64 << 30;

/// Memory charged for a safetensors file's index per byte of its JSON header, before the
/// header is parsed: the header is decoded into several structures (the `safetensors` crate's
/// own, then tenet's index and tensors), each holding names and shapes again.
pub const SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE: u64 = 32;

/// Memory charged for each tensor of a GGUF file's index (its entry, name and shape are
/// charged besides).
const GGUF_INDEX_ENTRY_BYTES: u64 = 256;

/// The memory limit the plain loaders ([`WeightsFile::open`], [`WeightsFile::from_bytes`])
/// apply: what the system reports available now (`MemAvailable`), or 4 GiB where it reports
/// nothing, as a node's default memory limit is chosen.
pub fn default_max_resident_bytes() -> u64 {
    tenet_exec::available_memory().unwrap_or(4 << 30)
}

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
    #[error(
        "weights file {path} would take at least {needs} bytes of memory once loaded (tensors \
         dequantised to f32 or copied, and the index), above the limit of {limit} bytes: use a \
         smaller model or one stored as aligned F32 (lent from the file, not copied), or load it \
         where the memory limit is higher (a node's --memory-limit)"
    )]
    OverBudget {
        path: String,
        needs: u64,
        limit: u64,
    },
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
    /// The memory loading was charged beyond the file's own bytes.
    resident_bytes: u64,
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
    /// offsets against the file size and refuses oversized headers. Loading may take up to
    /// [`default_max_resident_bytes`] of memory beyond the file's own bytes.
    pub fn open(path: &Path) -> Result<WeightsFile, WeightsError> {
        WeightsFile::open_within(path, default_max_resident_bytes())
    }

    /// As [`WeightsFile::open`], refusing with [`WeightsError::OverBudget`], before any tensor
    /// is made, a file whose loading would take more than `max_resident_bytes` of memory beyond
    /// its own bytes.
    pub fn open_within(path: &Path, max_resident_bytes: u64) -> Result<WeightsFile, WeightsError> {
        WeightsFile::open_counting_within(path, &AtomicU64::new(0), max_resident_bytes)
    }

    /// As [`WeightsFile::open`], adding to `progress` the bytes hashed (which reads the file in)
    /// and then the bytes of the tensors indexed (about twice the file's size in all), for a
    /// progress bar.
    pub fn open_counting(path: &Path, progress: &AtomicU64) -> Result<WeightsFile, WeightsError> {
        WeightsFile::open_counting_within(path, progress, default_max_resident_bytes())
    }

    /// As [`WeightsFile::open_counting`] under the memory limit of [`WeightsFile::open_within`].
    pub fn open_counting_within(
        path: &Path,
        progress: &AtomicU64,
        max_resident_bytes: u64,
    ) -> Result<WeightsFile, WeightsError> {
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
        WeightsFile::index(bytes, id, &shown, progress, max_resident_bytes)
    }

    /// Index bytes already in memory (a GGUF file is recognised by its magic); `name` is used
    /// in messages. Loading may take up to [`default_max_resident_bytes`] of memory beyond the
    /// bytes themselves.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<WeightsFile, WeightsError> {
        WeightsFile::from_bytes_within(bytes, name, default_max_resident_bytes())
    }

    /// As [`WeightsFile::from_bytes`], refusing with [`WeightsError::OverBudget`], before any
    /// tensor is made, a file whose loading would take more than `max_resident_bytes` of memory
    /// beyond its own bytes: GGUF tensors dequantised to f32, copies of misaligned tensors, and
    /// the index (the decoded GGUF header as charged, or
    /// [`SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE`] per byte of a safetensors header). This is
    /// the loader for weights from strangers.
    pub fn from_bytes_within(
        bytes: Vec<u8>,
        name: &str,
        max_resident_bytes: u64,
    ) -> Result<WeightsFile, WeightsError> {
        let id = WeightsId::of_bytes(&bytes);
        WeightsFile::index(
            Arc::new(bytes),
            id,
            name,
            &AtomicU64::new(0),
            max_resident_bytes,
        )
    }

    /// The memory loading this file was charged beyond the file's own bytes (at most the limit
    /// it was loaded under).
    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    /// Index `shared`, whose hash is `id`, within `budget` bytes of memory.
    fn index(
        shared: SharedBytes,
        id: WeightsId,
        name: &str,
        progress: &AtomicU64,
        budget: u64,
    ) -> Result<WeightsFile, WeightsError> {
        let bytes: &[u8] = (*shared).as_ref();
        if bytes.starts_with(crate::gguf::MAGIC) {
            return WeightsFile::from_gguf(shared, id, name, progress, budget);
        }
        let malformed = |reason: String| WeightsError::Malformed {
            path: name.to_string(),
            reason,
        };
        let over = |needs: u64| WeightsError::OverBudget {
            path: name.to_string(),
            needs,
            limit: budget,
        };
        // The index's cost, from the header's declared length, before the header is parsed.
        let header_len = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        let index_bytes = header_len
            .min(bytes.len() as u64)
            .saturating_mul(SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE);
        if index_bytes > budget {
            return Err(over(index_bytes));
        }
        let st = SafeTensors::deserialize(bytes).map_err(|e| malformed(e.to_string()))?;
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
        drop(st);
        // The `safetensors` crate already refuses overlapping, unordered or out-of-file
        // offsets; checked again here, as the GGUF index is, since a file whose tensors shared
        // bytes could be copied more than once.
        let data_start = (header_len as usize).saturating_add(8);
        check_disjoint(
            tensors.iter().map(|(n, i)| (n.as_str(), &i.range)),
            data_start..bytes.len(),
        )
        .map_err(malformed)?;
        let aligned = |info: &TensorInfo, dtype: DType| {
            (base + info.range.start).is_multiple_of(dtype.size() as usize)
        };
        // A misaligned tensor is copied once at load rather than on every use.
        let copies = tensors
            .values()
            .filter(|i| i.dtype.is_some_and(|d| !aligned(i, d)))
            .fold(0u64, |a, i| a.saturating_add(i.range.len() as u64));
        let resident_bytes = index_bytes.saturating_add(copies);
        if resident_bytes > budget {
            return Err(over(resident_bytes));
        }
        let data = tensors
            .iter()
            .filter_map(|(name, info): (&String, &TensorInfo)| {
                let dtype = info.dtype?;
                let ty = TensorType::new(dtype, info.shape.clone());
                let t = if aligned(info, dtype) {
                    HostTensor::shared(ty, shared.clone(), info.range.clone()).ok()?
                } else {
                    HostTensor::new(ty, bytes.get(info.range.clone())?.to_vec()).ok()?
                };
                progress.fetch_add(info.range.len() as u64, Ordering::Relaxed);
                Some((name.clone(), t))
            })
            .collect();
        Ok(WeightsFile {
            id,
            tensors,
            data,
            resident_bytes,
        })
    }
}

/// Refuse tensors whose byte ranges leave `within` or share a byte; any order is allowed and
/// empty ranges overlap nothing. The error names the tensors.
fn check_disjoint<'a>(
    ranges: impl Iterator<Item = (&'a str, &'a std::ops::Range<usize>)>,
    within: std::ops::Range<usize>,
) -> Result<(), String> {
    let mut sorted: Vec<(&str, &std::ops::Range<usize>)> =
        ranges.filter(|(_, r)| !r.is_empty()).collect();
    sorted.sort_unstable_by_key(|(_, r)| (r.start, r.end));
    for (name, r) in &sorted {
        if r.start < within.start || r.end > within.end {
            return Err(format!(
                "tensor {name:?}: its data (bytes {}..{}) lies outside the data section (bytes {}..{})",
                r.start, r.end, within.start, within.end
            ));
        }
    }
    for pair in sorted.windows(2) {
        let ((a, ra), (b, rb)) = (pair[0], pair[1]);
        if rb.start < ra.end {
            return Err(format!(
                "tensor {b:?}: its data (bytes {}..{}) overlaps tensor {a:?}'s (bytes {}..{}); \
                 each tensor must have bytes of its own",
                rb.start, rb.end, ra.start, ra.end
            ));
        }
    }
    Ok(())
}

impl WeightsFile {
    /// A GGUF file's tensors, named as in the file, each dequantised once to f32 (F32, F16,
    /// Q4_0, Q4_1 and Q8_0; tensors of other ggml types are listed but cannot be referenced).
    /// Graphs declare them f32 with the row-major shape. The id is still the hash of the file's
    /// bytes.
    /// The header is decoded within `budget`, and the memory the whole load takes (header,
    /// index, dequantised tensors) is computed from the index and refused over `budget` before
    /// any tensor is dequantised.
    fn from_gguf(
        bytes: SharedBytes,
        id: WeightsId,
        name: &str,
        progress: &AtomicU64,
        budget: u64,
    ) -> Result<WeightsFile, WeightsError> {
        use crate::gguf::{GgmlType, GgufError, GgufFile};
        let gguf_err = |e: GgufError| WeightsError::Gguf {
            path: name.to_string(),
            reason: e.to_string(),
        };
        let over = |needs: u64| WeightsError::OverBudget {
            path: name.to_string(),
            needs,
            limit: budget,
        };
        let g = match GgufFile::parse_shared_within(bytes, budget) {
            // The caller's limit, not the format's, stopped the header.
            Err(GgufError::HeaderTooLarge { needs, limit, .. }) if limit == budget => {
                return Err(over(needs));
            }
            r => r.map_err(gguf_err)?,
        };
        let resident_bytes = g.tensors.iter().fold(g.header_bytes(), |a, t| {
            let entry = GGUF_INDEX_ENTRY_BYTES
                .saturating_add(2 * t.name.len() as u64)
                .saturating_add(16 * t.shape.len() as u64);
            a.saturating_add(entry)
                .saturating_add(g.dequantized_bytes(t))
        });
        if resident_bytes > budget {
            return Err(over(resident_bytes));
        }
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
        Ok(WeightsFile {
            id,
            tensors,
            data,
            resident_bytes,
        })
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
    let map = tenet_sys::memory::MappedFile::map(&std::fs::File::open(path)?)?;
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
