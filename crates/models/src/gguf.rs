//! GGUF v3 files (llama.cpp's format): metadata, tensor index, and dequantisation of F32, F16,
//! Q4_0, Q4_1 and Q8_0 tensors to f32 with exactly gguf-py's arithmetic (Q4_0: `(q − 8)·d`;
//! Q4_1: `(d·q) + m`, low nibbles first; Q8_0: `q·d`), by `tenet_reference::quant`, the
//! definition the `dequantize` and `qmatmul` ops share, NaN results made canonical. A quantised
//! tensor can also be lent as it is, its blocks a `u8` view of the file
//! ([`GgufFile::blocks`]), for graphs that compute on the blocks (`dequantize`, `qmatmul`).
//!
//! The file is untrusted: every count and length is checked against the bytes actually present
//! and against limits before anything is allocated, tensor data must lie inside the file, and
//! errors name the byte offset. Tensor names and metadata keys must be unique, so that the index
//! means one thing. Two rules keep a small file from becoming a large amount of memory:
//!
//! - **Tensors' data ranges are disjoint.** They may be listed in any order, but no byte of the
//!   data section belongs to two tensors (empty tensors aside), so the dequantised size of a
//!   file is at most about 7.1× its bytes (Q4_0: 32 f32 from 18 bytes). Overlapping ranges
//!   are refused with the two tensors' names.
//! - **The decoded header has a memory limit.** Metadata and the tensor index are charged, as
//!   they are decoded and before each allocation, what they take in memory (a one-byte array
//!   element becomes a 32-byte [`Value`]); the total may not pass
//!   [`header_memory_limit`]: 1 MiB plus 8 bytes per byte of the file, at most 256 MiB (or a
//!   smaller limit the caller gives, see [`GgufFile::parse_shared_within`]).

use std::collections::BTreeMap;
use std::path::Path;

use half::f16;
use tenet_ir::{DType, HostTensor, QuantFormat, SharedBytes, TensorType};
use tenet_reference::quant;

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
const MAX_STRING: u64 = 1 << 20;
const MAX_ARRAY_DEPTH: usize = 2;

/// The most memory a decoded GGUF header (metadata and tensor index) may take, whatever the
/// file's size.
pub const MAX_HEADER_MEMORY: u64 = 256 << 20;
/// A decoded header may take this many bytes of memory per byte of the file ...
pub const HEADER_MEMORY_PER_FILE_BYTE: u64 = 8;
/// ... plus this many.
pub const HEADER_MEMORY_BASE: u64 = 1 << 20;

/// The memory limit of the decoded header of a GGUF file of `file_len` bytes:
/// `min(1 MiB + 8 × file_len, 256 MiB)`. Real files are far inside it (SmolLM2's 150,000
/// tokenizer strings decode to about 6 MB); an array of one-byte elements, which decodes to
/// 32 bytes an element, is not.
pub fn header_memory_limit(file_len: u64) -> u64 {
    HEADER_MEMORY_PER_FILE_BYTE
        .saturating_mul(file_len)
        .saturating_add(HEADER_MEMORY_BASE)
        .min(MAX_HEADER_MEMORY)
}

/// Bytes charged for each metadata entry besides its key's and value's own heap bytes: the key
/// and value themselves and the map's bookkeeping.
const ENTRY_BYTES: u64 = (std::mem::size_of::<String>() + std::mem::size_of::<Value>() + 16) as u64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("byte {offset}: {reason}")]
    Malformed { offset: u64, reason: String },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error(
        "byte {offset}: decoding the header ({what}) would take at least {needs} bytes of memory, \
         more than the limit of {limit}; \
         a GGUF header may take at most 1 MiB plus 8 bytes per byte of the file, and never more \
         than 256 MiB: this file's metadata is built to amplify, or is not a model's"
    )]
    HeaderTooLarge {
        offset: u64,
        what: String,
        needs: u64,
        limit: u64,
    },
    #[error(
        "loading it would take {needs} bytes besides the file (tensors dequantised or copied), \
         more than the limit of {limit}"
    )]
    OverBudget { needs: u64, limit: u64 },
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
    Q4_0,
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
            2 => GgmlType::Q4_0,
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
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let f = self.format()?;
                (QuantFormat::BLOCK, f.block_bytes())
            }
            GgmlType::Other(_) => return None,
        })
    }

    /// The block format of a quantised type (Q4_0, Q4_1, Q8_0); `None` for the others.
    pub fn format(self) -> Option<QuantFormat> {
        match self {
            GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
            GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
            GgmlType::F32 | GgmlType::F16 | GgmlType::Other(_) => None,
        }
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
    header_bytes: u64,
    bytes: SharedBytes,
}

/// Refuse a tensor name used twice: the index is looked up by name, so a second entry would
/// stand for the first with another type or shape.
fn check_names(tensors: &[GgufTensor], ats: &[usize]) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name).then(a.cmp(&b)));
    for pair in order.windows(2) {
        if tensors[pair[0]].name == tensors[pair[1]].name {
            return Err(GgufError::Malformed {
                offset: ats.get(pair[1]).copied().unwrap_or(0) as u64,
                reason: format!(
                    "tensor {:?} appears twice in the index",
                    tensors[pair[1]].name
                ),
            });
        }
    }
    Ok(())
}

/// Refuse tensors whose data ranges share a byte (`ats`: where each tensor's entry starts).
/// Any order is allowed; empty ranges overlap nothing.
fn check_disjoint(tensors: &[GgufTensor], ats: &[usize]) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| !tensors[i].range.is_empty())
        .collect();
    order.sort_unstable_by_key(|&i| (tensors[i].range.start, tensors[i].range.end));
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if b.range.start < a.range.end {
            return Err(GgufError::Malformed {
                offset: ats.get(pair[1]).copied().unwrap_or(0) as u64,
                reason: format!(
                    "tensor {:?}: its data (bytes {}..{}) overlaps tensor {:?}'s (bytes {}..{}); \
                     each tensor must have bytes of its own",
                    b.name, b.range.start, b.range.end, a.name, a.range.start, a.range.end
                ),
            });
        }
    }
    Ok(())
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    /// Memory the decoded header takes so far, and its limit.
    used: u64,
    limit: u64,
}

impl<'a> Reader<'a> {
    fn err<T>(&self, at: usize, reason: impl Into<String>) -> Result<T, GgufError> {
        Err(GgufError::Malformed {
            offset: at as u64,
            reason: reason.into(),
        })
    }
    /// Count `bytes` of memory against the header's limit, before they are allocated.
    fn charge(&mut self, at: usize, bytes: u64, what: &str) -> Result<(), GgufError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(GgufError::HeaderTooLarge {
                offset: at as u64,
                what: what.to_string(),
                needs: self.used,
                limit: self.limit,
            });
        }
        Ok(())
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
        self.charge(at, n, what)?;
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
                // Each element becomes a whole `Value`, whatever its size in the file.
                let each = std::mem::size_of::<Value>() as u64;
                self.charge(at, n.saturating_mul(each), "a metadata array")?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
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
            .and_then(|f| tenet_sys::memory::MappedFile::map(&f))
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

    /// Parse and index a file held in a shared buffer (a mapping, say), its decoded header
    /// limited to [`header_memory_limit`].
    pub fn parse_shared(shared: SharedBytes) -> Result<GgufFile, GgufError> {
        GgufFile::parse_shared_within(shared, MAX_HEADER_MEMORY)
    }

    /// As [`GgufFile::parse_shared`], the decoded header limited to `max_header_bytes` of
    /// memory as well (the lower limit applies).
    pub fn parse_shared_within(
        shared: SharedBytes,
        max_header_bytes: u64,
    ) -> Result<GgufFile, GgufError> {
        let bytes: &[u8] = (*shared).as_ref();
        let limit = header_memory_limit(bytes.len() as u64).min(max_header_bytes);
        let mut r = Reader {
            b: bytes,
            pos: 0,
            used: 0,
            limit,
        };
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
            let at = r.pos;
            r.charge(at, ENTRY_BYTES, "a metadata entry")?;
            let key = r.string("metadata key")?;
            if metadata.contains_key(&key) {
                return r.err(at, format!("metadata key {key:?} appears twice"));
            }
            let ty = r.u32("metadata type")?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        // The index is held twice while it is built (as read, then checked), and sorted once
        // for the overlap check.
        let info_bytes = (std::mem::size_of::<(usize, String, Vec<u64>, GgmlType, u64)>()
            + std::mem::size_of::<GgufTensor>()
            + 3 * std::mem::size_of::<usize>()) as u64;
        r.charge(
            r.pos,
            n_tensors.saturating_mul(info_bytes),
            "the tensor index",
        )?;
        let mut infos = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let at = r.pos;
            // Up to four dimensions, held twice.
            r.charge(at, 64, "the tensor index")?;
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
        let mut ats = Vec::with_capacity(infos.len());
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
                    ats.push(at);
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
        check_names(&tensors, &ats)?;
        check_disjoint(&tensors, &ats)?;
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            header_bytes: r.used,
            bytes: shared,
        })
    }

    /// The memory the decoded header (metadata and tensor index) was charged.
    pub fn header_bytes(&self) -> u64 {
        self.header_bytes
    }

    /// Bytes [`GgufFile::dequantize`] allocates for `t`: none for an aligned F32 tensor (a view
    /// of the file) or a type it cannot dequantise, 4 per element otherwise.
    pub fn dequantized_bytes(&self, t: &GgufTensor) -> u64 {
        if matches!(t.kind, GgmlType::Other(_)) || self.is_view(t) {
            return 0;
        }
        t.shape
            .iter()
            .fold(1u64, |a, &d| a.saturating_mul(d))
            .saturating_mul(4)
    }

    /// Whether `t` is lent as a view of the file rather than copied.
    fn is_view(&self, t: &GgufTensor) -> bool {
        let data = (*self.bytes)
            .as_ref()
            .get(t.range.clone())
            .unwrap_or_default();
        t.kind == GgmlType::F32 && data.as_ptr().align_offset(4) == 0
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A block-quantised tensor (Q4_0, Q4_1, Q8_0) as it is in the file, with its format: a
    /// `u8` tensor `[..., rows, cols/32, block_bytes]` for the row-major shape `[..., rows,
    /// cols]` — each row's blocks in a row, as the `dequantize` and `qmatmul` ops take them
    /// (docs/OPS.md, "Quantised weights") — that is a view of the file's bytes, not a copy.
    /// The innermost (GGUF's first) dimension must be a whole number of 32-element blocks, so
    /// that no block straddles two rows; a tensor of another type is an error, as is one whose
    /// bytes do not lie in the file or do not match its shape. Errors name the tensor.
    pub fn blocks(&self, t: &GgufTensor) -> Result<(HostTensor, QuantFormat), GgufError> {
        let tensor_err = |reason: String| GgufError::Tensor {
            name: t.name.clone(),
            reason,
        };
        let Some(format) = t.kind.format() else {
            let kind = match t.kind {
                GgmlType::Other(k) => format!("ggml type {k}"),
                k => format!("{k:?}"),
            };
            return Err(tensor_err(format!(
                "{kind} is not block-quantised (Q4_0, Q4_1 and Q8_0 are): it has no blocks to lend"
            )));
        };
        let Some((&cols, outer)) = t.shape.split_last() else {
            return Err(tensor_err("a tensor of no dimensions has no blocks".into()));
        };
        if cols % QuantFormat::BLOCK != 0 {
            return Err(tensor_err(format!(
                "its innermost dimension ({cols} of shape {:?}) is not a multiple of the {} \
                 elements of a {} block, so its rows do not hold whole blocks",
                t.shape,
                QuantFormat::BLOCK,
                format.name()
            )));
        }
        let mut shape = outer.to_vec();
        shape.extend([cols / QuantFormat::BLOCK, format.block_bytes()]);
        let len = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if len != Some(t.range.len() as u64) {
            return Err(tensor_err(format!(
                "shape {:?} in {} blocks takes {} bytes, but its data is bytes {}..{}",
                t.shape,
                format.name(),
                len.map_or("too many".to_string(), |n| n.to_string()),
                t.range.start,
                t.range.end
            )));
        }
        let ty = TensorType::new(DType::U8, shape);
        HostTensor::shared(ty.clone(), self.bytes.clone(), t.range.clone())
            .map(|v| (v, format))
            .map_err(|e| tensor_err(format!("{e} ({ty})")))
    }

    /// The tensor's values as f32, row-major.
    pub fn dequantize(&self, t: &GgufTensor) -> Result<HostTensor, GgufError> {
        let tensor_err = |reason: String| GgufError::Tensor {
            name: t.name.clone(),
            reason,
        };
        let file = (*self.bytes).as_ref();
        let data = file.get(t.range.clone()).ok_or_else(|| {
            tensor_err(format!(
                "bytes {}..{} lie outside the file's {} bytes",
                t.range.start,
                t.range.end,
                file.len()
            ))
        })?;
        if self.is_view(t) {
            // Already f32 and aligned: a view of the file, not a copy.
            let ty = TensorType::new(DType::F32, t.shape.clone());
            return HostTensor::shared(ty.clone(), self.bytes.clone(), t.range.clone())
                .map_err(|e| tensor_err(format!("{e} ({ty})")));
        }
        if let GgmlType::Other(k) = t.kind {
            return Err(tensor_err(format!(
                "ggml type {k} cannot be dequantised (F32, F16, Q4_0, Q4_1, Q8_0 can)"
            )));
        }
        // Exactly the result's bytes, reserved once: no growth, and a refusal rather than an
        // abort if the memory is not there.
        let len = self.dequantized_bytes(t);
        let mut out: Vec<u8> = Vec::new();
        usize::try_from(len)
            .ok()
            .and_then(|n| out.try_reserve_exact(n).ok())
            .ok_or_else(|| tensor_err(format!("cannot allocate {len} bytes to dequantise it")))?;
        match (t.kind, t.kind.format()) {
            (GgmlType::F32, _) => out.extend_from_slice(data),
            (GgmlType::F16, _) => {
                for c in data.chunks_exact(2) {
                    out.extend_from_slice(&f16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes());
                }
            }
            (_, Some(format)) => {
                // The one definition the `dequantize` and `qmatmul` ops use too.
                let mut vals = [0.0f32; quant::BLOCK];
                for b in data.chunks_exact(format.block_bytes() as usize) {
                    quant::dequantize_block(format, b, &mut vals);
                    for v in vals {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            (_, None) => {}
        }
        let ty = TensorType::new(DType::F32, t.shape.clone());
        HostTensor::new(ty.clone(), out).map_err(|e| tensor_err(format!("{e} ({ty})")))
    }
}
