//! GGUF v3 files (llama.cpp's format): metadata, tensor index, and dequantisation of F32, F16,
//! Q8_0 and Q4_1 tensors to f32 with exactly gguf-py's arithmetic (Q8_0: `q·d`; Q4_1:
//! `(d·q) + m`, low nibbles first).
//!
//! The file is untrusted: every count and length is checked against the bytes actually present
//! and against limits before anything is allocated, tensor data must lie inside the file, and
//! errors name the byte offset.

use std::collections::BTreeMap;
use std::path::Path;

use half::f16;
use tenet_ir::{DType, HostTensor, SharedBytes, TensorType};

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
const MAX_STRING: u64 = 1 << 20;
const MAX_ARRAY_DEPTH: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("byte {offset}: {reason}")]
    Malformed { offset: u64, reason: String },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Element encodings of tensors (ggml types) this reader knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_1,
    Q8_0,
    /// Any other ggml type: indexed, but not dequantised.
    Other(u32),
}

impl GgmlType {
    fn from_u32(v: u32) -> GgmlType {
        match v {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            o => GgmlType::Other(o),
        }
    }

    /// (elements per block, bytes per block).
    fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 => (1, 2),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Other(_) => return None,
        })
    }
}

/// One tensor of the index. `shape` is row-major (GGUF lists dimensions innermost first).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub kind: GgmlType,
    /// Absolute byte range of the data in the file.
    pub range: std::ops::Range<usize>,
}

/// A parsed GGUF file.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<GgufTensor>,
    bytes: SharedBytes,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err<T>(&self, at: usize, reason: impl Into<String>) -> Result<T, GgufError> {
        Err(GgufError::Malformed {
            offset: at as u64,
            reason: reason.into(),
        })
    }
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let left = (self.b.len() - self.pos) as u64;
        if n > left {
            return self.err(
                self.pos,
                format!("truncated {what}: needs {n} bytes, {left} left"),
            );
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A count of items at least `min_size` bytes each, backed by the bytes left.
    fn count(&mut self, what: &str, min_size: u64) -> Result<u64, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.b.len() - self.pos) as u64;
        if n.saturating_mul(min_size.max(1)) > left {
            return self.err(
                at,
                format!("{what} {n} cannot fit in the {left} bytes left"),
            );
        }
        Ok(n)
    }
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let n = self.count(what, 1)?;
        if n > MAX_STRING {
            return self.err(
                at,
                format!("{what} of {n} bytes is longer than {MAX_STRING}"),
            );
        }
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).or_else(|_| self.err(at, format!("{what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, GgufError> {
        let at = self.pos;
        Ok(match ty {
            0 => Value::U8(self.arr::<1>("u8")?[0]),
            1 => Value::I8(self.arr::<1>("i8")?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr("u16")?)),
            3 => Value::I16(i16::from_le_bytes(self.arr("i16")?)),
            4 => Value::U32(self.u32("u32")?),
            5 => Value::I32(self.u32("i32")? as i32),
            6 => Value::F32(f32::from_bits(self.u32("f32")?)),
            7 => match self.arr::<1>("bool")?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                v => return self.err(at, format!("bool byte {v}")),
            },
            8 => Value::Str(self.string("string")?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return self.err(at, "arrays nested too deeply");
                }
                let elem = self.u32("array element type")?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count("array length", min)?;
                (0..n)
                    .map(|_| self.value(elem, depth + 1))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array)?
            }
            10 => Value::U64(self.u64("u64")?),
            11 => Value::I64(self.u64("i64")? as i64),
            12 => Value::F64(f64::from_bits(self.u64("f64")?)),
            t => return self.err(at, format!("unknown metadata type {t}")),
        })
    }
}

impl GgufFile {
    /// Map and index the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let map = std::fs::File::open(path)
            .and_then(|f| tenet_kernels::memory::MappedFile::map(&f))
            .map_err(|e| GgufError::Io {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        GgufFile::parse_shared(std::sync::Arc::new(map))
    }

    /// Parse and index a whole file in memory.
    pub fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::parse_shared(std::sync::Arc::new(bytes))
    }

    /// Parse and index a file held in a shared buffer (a mapping, say).
    pub fn parse_shared(shared: SharedBytes) -> Result<GgufFile, GgufError> {
        let bytes: &[u8] = (*shared).as_ref();
        let mut r = Reader { b: bytes, pos: 0 };
        if r.take(4, "magic").ok() != Some(&MAGIC[..]) {
            return r.err(0, "not a GGUF file (no \"GGUF\" magic)");
        }
        let version = r.u32("version")?;
        if version != 3 {
            return r.err(
                4,
                format!("GGUF version {version} is not supported (only 3)"),
            );
        }
        // A tensor info takes at least 8 + 4 + 4 + 8 bytes; a key-value at least 8 + 4 + 1.
        let n_tensors = r.count("tensor count", 24)?;
        let n_kv = r.count("metadata count", 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32("metadata type")?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let at = r.pos;
            let name = r.string("tensor name")?;
            let n_dims = r.u32("dimension count")?;
            if n_dims == 0 || n_dims > 4 {
                return r.err(
                    at,
                    format!("tensor {name:?} has {n_dims} dimensions (1 to 4 allowed)"),
                );
            }
            let mut dims = (0..n_dims)
                .map(|_| r.u64("dimension"))
                .collect::<Result<Vec<_>, _>>()?;
            dims.reverse();
            let kind = GgmlType::from_u32(r.u32("tensor type")?);
            let offset = r.u64("tensor offset")?;
            infos.push((at, name, dims, kind, offset));
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32);
        if alignment == 0 || !alignment.is_power_of_two() {
            return r.err(
                r.pos,
                format!("general.alignment {alignment} is not a power of two"),
            );
        }
        let data_start = (r.pos as u64).next_multiple_of(alignment);
        let mut tensors = Vec::with_capacity(infos.len());
        for (at, name, shape, kind, offset) in infos {
            let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let size = match (numel, kind.block()) {
                (Some(n), Some((per, bytes_per))) => {
                    if n % per != 0 {
                        return r.err(at, format!("tensor {name:?}: {n} elements is not a whole number of {per}-element blocks"));
                    }
                    match (n / per).checked_mul(bytes_per) {
                        Some(b) => b,
                        None => return r.err(at, format!("tensor {name:?}: size overflows")),
                    }
                }
                (None, _) => return r.err(at, format!("tensor {name:?}: element count overflows")),
                (Some(_), None) => 0,
            };
            let start = data_start.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(size));
            match (start, end) {
                (Some(s), Some(e)) if e <= bytes.len() as u64 && offset % alignment == 0 => {
                    tensors.push(GgufTensor {
                        name,
                        shape,
                        kind,
                        range: s as usize..e as usize,
                    });
                }
                _ => {
                    return r.err(at, format!("tensor {name:?}: data at offset {offset} (+{size} bytes) lies outside the file or is misaligned"));
                }
            }
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            bytes: shared,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's values as f32, row-major.
    pub fn dequantize(&self, t: &GgufTensor) -> Result<HostTensor, GgufError> {
        let data = &(*self.bytes).as_ref()[t.range.clone()];
        if t.kind == GgmlType::F32 && data.as_ptr().align_offset(4) == 0 {
            // Already f32 and aligned: a view of the file, not a copy.
            let ty = TensorType::new(DType::F32, t.shape.clone());
            return HostTensor::shared(ty.clone(), self.bytes.clone(), t.range.clone()).map_err(
                |e| GgufError::Tensor {
                    name: t.name.clone(),
                    reason: format!("{e} ({ty})"),
                },
            );
        }
        let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let values: Vec<f32> = match t.kind {
            GgmlType::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            GgmlType::F16 => data
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            GgmlType::Q8_0 => data
                .chunks_exact(34)
                .flat_map(|b| {
                    let d = f16_at(b, 0);
                    b[2..34].iter().map(move |&q| (q as i8) as f32 * d)
                })
                .collect(),
            GgmlType::Q4_1 => data
                .chunks_exact(20)
                .flat_map(|b| {
                    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                    let qs = &b[4..20];
                    let lo = qs.iter().map(move |&q| d * (q & 0x0f) as f32 + m);
                    let hi = qs.iter().map(move |&q| d * (q >> 4) as f32 + m);
                    lo.chain(hi)
                })
                .collect(),
            GgmlType::Other(k) => {
                return Err(GgufError::Tensor {
                    name: t.name.clone(),
                    reason: format!(
                        "ggml type {k} cannot be dequantised (F32, F16, Q8_0, Q4_1 can)"
                    ),
                });
            }
        };
        let ty = TensorType::new(DType::F32, t.shape.clone());
        HostTensor::from_f32(&t.shape, &values).map_err(|e| GgufError::Tensor {
            name: t.name.clone(),
            reason: format!("{e} ({ty})"),
        })
    }
}
