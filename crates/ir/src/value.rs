//! Host tensors: a type and its elements as little-endian bytes in row-major order.
//!
//! This is the value that crosses every boundary (files, executors, the wire): plain data, so
//! that any backend can read it and its bytes can be hashed. `bool` elements are the bytes 0/1.
//!
//! The bytes are either owned or a range of a buffer shared with other tensors (a mapped
//! weights file, a received blob): a shared tensor clones as a handle, never as a copy.

use std::sync::Arc;

use half::{bf16, f16};

use crate::dtype::{DType, TensorType};

/// Why bytes do not form a tensor of a given type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("a tensor of type {ty} needs {expected} bytes, got {actual}")]
    Size {
        ty: TensorType,
        expected: u64,
        actual: u64,
    },
    #[error("a bool tensor holds the byte {0} (only 0 and 1 are allowed)")]
    Bool(u8),
    #[error("tensor type {0} has too many elements")]
    Overflow(TensorType),
    #[error("bytes {start}..{end} lie outside a shared buffer of {len} bytes")]
    Range {
        start: usize,
        end: usize,
        len: usize,
    },
}

/// A buffer that tensors can share: its bytes never change while any handle lives.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where a tensor's bytes live.
enum Storage {
    Owned(Vec<u8>),
    Shared {
        owner: SharedBytes,
        start: usize,
        len: usize,
    },
}

/// A tensor held in host memory.
pub struct HostTensor {
    ty: TensorType,
    data: Storage,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = if self.is_shared() { ", shared" } else { "" };
        write!(
            f,
            "HostTensor({}, {} bytes{shared})",
            self.ty,
            self.bytes().len()
        )
    }
}

/// An owned tensor copies its bytes; a shared one clones its handle.
impl Clone for HostTensor {
    fn clone(&self) -> HostTensor {
        let data = match &self.data {
            Storage::Owned(v) => Storage::Owned(v.clone()),
            Storage::Shared { owner, start, len } => Storage::Shared {
                owner: owner.clone(),
                start: *start,
                len: *len,
            },
        };
        HostTensor {
            ty: self.ty.clone(),
            data,
        }
    }
}

/// Equal type and bytes, wherever the bytes live.
impl PartialEq for HostTensor {
    fn eq(&self, other: &HostTensor) -> bool {
        self.ty == other.ty && self.bytes() == other.bytes()
    }
}

impl Eq for HostTensor {}

impl std::hash::Hash for HostTensor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ty.hash(state);
        self.bytes().hash(state);
    }
}

/// A large owned buffer goes to the process-wide cache ([`crate::recycle`]) for the next
/// result of its size.
impl Drop for HostTensor {
    fn drop(&mut self) {
        if let Storage::Owned(v) = &mut self.data {
            crate::recycle::give(std::mem::take(v));
        }
    }
}

impl HostTensor {
    /// Wrap bytes, checking their length (and bool bytes) against the type.
    pub fn new(ty: TensorType, data: Vec<u8>) -> Result<HostTensor, ValueError> {
        check_bytes(&ty, &data)?;
        Ok(HostTensor {
            ty,
            data: Storage::Owned(data),
        })
    }

    /// A tensor over bytes `range` of a shared buffer, checked as [`HostTensor::new`] checks:
    /// no copy is made, and clones share the buffer too.
    pub fn shared(
        ty: TensorType,
        owner: SharedBytes,
        range: std::ops::Range<usize>,
    ) -> Result<HostTensor, ValueError> {
        let len = (*owner).as_ref().len();
        let bytes = (*owner)
            .as_ref()
            .get(range.clone())
            .ok_or(ValueError::Range {
                start: range.start,
                end: range.end,
                len,
            })?;
        check_bytes(&ty, bytes)?;
        Ok(HostTensor {
            ty,
            data: Storage::Shared {
                owner,
                start: range.start,
                len: range.len(),
            },
        })
    }

    /// The same tensor with its bytes moved (not copied) into a shared buffer, so that clones
    /// of it are handles: for a tensor kept in a cache and lent to many runs.
    pub fn into_shared(mut self) -> HostTensor {
        if let Storage::Owned(v) = &mut self.data {
            let v = std::mem::take(v);
            let len = v.len();
            self.data = Storage::Shared {
                owner: Arc::new(v),
                start: 0,
                len,
            };
        }
        self
    }

    /// The bytes for writing in place, if this tensor owns them (a shared buffer is never
    /// written through: other handles read it).
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.data {
            Storage::Owned(v) => Some(v.as_mut_slice()),
            Storage::Shared { .. } => None,
        }
    }

    /// Whether the bytes belong to a shared buffer (see [`HostTensor::shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.data, Storage::Shared { .. })
    }

    /// All-zero tensor (false for bool).
    pub fn zeros(ty: TensorType) -> Result<HostTensor, ValueError> {
        let n = ty.bytes().ok_or_else(|| ValueError::Overflow(ty.clone()))?;
        Ok(HostTensor {
            ty,
            data: Storage::Owned(vec![0; n as usize]),
        })
    }

    pub fn from_f32(shape: &[u64], values: &[f32]) -> Result<HostTensor, ValueError> {
        HostTensor::new(
            TensorType::new(DType::F32, shape),
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    pub fn from_i64(shape: &[u64], values: &[i64]) -> Result<HostTensor, ValueError> {
        HostTensor::new(
            TensorType::new(DType::I64, shape),
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    pub fn from_i32(shape: &[u64], values: &[i32]) -> Result<HostTensor, ValueError> {
        HostTensor::new(
            TensorType::new(DType::I32, shape),
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[u64] {
        &self.ty.shape
    }

    /// Number of elements (the bytes exist, so this cannot overflow).
    pub fn numel(&self) -> usize {
        self.bytes().len() / self.ty.dtype.size() as usize
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Storage::Owned(v) => v,
            Storage::Shared { owner, start, len } => &(**owner).as_ref()[*start..*start + *len],
        }
    }

    /// The bytes, owned (a shared tensor's are copied).
    pub fn into_bytes(mut self) -> Vec<u8> {
        match &mut self.data {
            Storage::Owned(v) => std::mem::take(v),
            Storage::Shared { .. } => self.bytes().to_vec(),
        }
    }

    /// The same bytes under another type with the same dtype and element count (a reshape
    /// without a copy); the tensor comes back unchanged as the error otherwise.
    pub fn reshaped(mut self, ty: TensorType) -> Result<HostTensor, HostTensor> {
        if ty.dtype == self.ty.dtype && ty.numel() == self.ty.numel() {
            Ok(HostTensor {
                ty,
                data: std::mem::replace(&mut self.data, Storage::Owned(Vec::new())),
            })
        } else {
            Err(self)
        }
    }

    /// blake3 of the type's canonical text and the bytes: what commitments and receipts name.
    pub fn hash(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(self.ty.to_string().as_bytes());
        h.update(&[0]);
        h.update(self.bytes());
        *h.finalize().as_bytes()
    }

    /// Element `i` as f32 (floats exactly; integers and bools converted).
    pub fn get_f32(&self, i: usize) -> f32 {
        let b = self.bytes();
        match self.ty.dtype {
            DType::F32 => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
            DType::F16 => f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            DType::BF16 => bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            _ => self.get_i64(i) as f32,
        }
    }

    /// Element `i` as i64 (integers and bools exactly; floats truncated, saturating).
    pub fn get_i64(&self, i: usize) -> i64 {
        let b = self.bytes();
        match self.ty.dtype {
            DType::I32 => {
                i32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as i64
            }
            DType::I64 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&b[8 * i..8 * i + 8]);
                i64::from_le_bytes(a)
            }
            DType::U8 | DType::Bool => b[i] as i64,
            _ => self.get_f32(i) as i64,
        }
    }

    /// All elements as f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if self.ty.dtype == DType::F32 {
            // Whole words at a time: a decode step downloads its logits (49,152 of them, 8
            // times that for a batch) through here, and the element-wise path's bounds checks
            // and dispatch cost more than the copy.
            return self
                .bytes()
                .chunks_exact(4)
                .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
        }
        (0..self.numel()).map(|i| self.get_f32(i)).collect()
    }

    /// All elements as i64.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.numel()).map(|i| self.get_i64(i)).collect()
    }
}

/// `bytes` against `ty`: the exact length, and only 0/1 in a bool tensor.
fn check_bytes(ty: &TensorType, bytes: &[u8]) -> Result<(), ValueError> {
    let expected = ty.bytes().ok_or_else(|| ValueError::Overflow(ty.clone()))?;
    if bytes.len() as u64 != expected {
        return Err(ValueError::Size {
            ty: ty.clone(),
            expected,
            actual: bytes.len() as u64,
        });
    }
    // Only bool bytes are checked: scanning every other tensor's bytes (a zeroed output is
    // all zeros, so the scan ran to its end) cost more than many small ops' arithmetic.
    if ty.dtype == DType::Bool
        && let Some(&b) = bytes.iter().find(|&&b| b > 1)
    {
        return Err(ValueError::Bool(b));
    }
    Ok(())
}

/// Where an executor finds the tensors a graph's `weight` nodes name.
pub trait WeightSource {
    /// Tensor `tensor` of the weights file `file`, if this source has it.
    fn weight(&self, file: &crate::WeightsId, tensor: &str) -> Option<&HostTensor>;
}

/// A graph without weights needs no source.
pub struct NoWeights;

impl WeightSource for NoWeights {
    fn weight(&self, _: &crate::WeightsId, _: &str) -> Option<&HostTensor> {
        None
    }
}

impl WeightSource for std::collections::HashMap<(crate::WeightsId, String), HostTensor> {
    fn weight(&self, file: &crate::WeightsId, tensor: &str) -> Option<&HostTensor> {
        self.get(&(*file, tensor.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_sizes_and_bools() {
        let t = HostTensor::from_f32(&[2], &[1.5, -2.0]).unwrap();
        assert_eq!(t.to_f32_vec(), vec![1.5, -2.0]);
        assert!(HostTensor::new(TensorType::new(DType::F32, [3]), vec![0; 8]).is_err());
        assert_eq!(
            HostTensor::new(TensorType::new(DType::Bool, [2]), vec![1, 2]),
            Err(ValueError::Bool(2))
        );
        let i = HostTensor::from_i32(&[2], &[-7, 9]).unwrap();
        assert_eq!(i.to_i64_vec(), vec![-7, 9]);
    }

    #[test]
    fn hash_covers_type_and_bytes() {
        let a = HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let b = HostTensor::from_f32(&[1, 2], &[1.0, 2.0]).unwrap();
        let c = HostTensor::from_f32(&[2], &[1.0, 3.0]).unwrap();
        assert_ne!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert_eq!(a.hash(), a.clone().hash());
    }

    #[test]
    fn shared_tensors_borrow_their_buffer_and_behave_like_owned_ones() {
        let owned = HostTensor::from_f32(&[2], &[1.5, -2.0]).unwrap();
        let mut buf = vec![9u8; 3];
        buf.extend_from_slice(owned.bytes());
        let buf: SharedBytes = Arc::new(buf);
        let ty = TensorType::new(DType::F32, [2]);
        let shared = HostTensor::shared(ty.clone(), buf.clone(), 3..11).unwrap();
        assert!(shared.is_shared() && !owned.is_shared());
        assert_eq!(shared, owned);
        assert_eq!(shared.hash(), owned.hash());
        assert_eq!(shared.to_f32_vec(), vec![1.5, -2.0]);
        // A clone is another handle on the same bytes, not a copy.
        let copy = shared.clone();
        assert_eq!(copy.bytes().as_ptr(), shared.bytes().as_ptr());
        assert_eq!(Arc::strong_count(&buf), 3);
        let reshaped = copy.reshaped(TensorType::new(DType::F32, [1, 2])).unwrap();
        assert!(reshaped.is_shared());
        assert_eq!(reshaped.into_bytes(), owned.bytes());
        // An owned tensor turns shared without copying its bytes.
        let at = owned.bytes().as_ptr();
        let moved = owned.clone().into_shared();
        assert!(moved.is_shared() && moved == owned);
        let again = owned.into_shared();
        assert_eq!(again.bytes().as_ptr(), at);
        assert_eq!(again.clone().bytes().as_ptr(), at);
        // The same checks as `new`, and the range must lie inside the buffer.
        assert!(matches!(
            HostTensor::shared(ty.clone(), buf.clone(), 3..10),
            Err(ValueError::Size { .. })
        ));
        assert_eq!(
            HostTensor::shared(ty, buf.clone(), 4..12).unwrap_err(),
            ValueError::Range {
                start: 4,
                end: 12,
                len: 11
            }
        );
        let bools: SharedBytes = Arc::new(vec![0u8, 1, 2]);
        let ty = TensorType::new(DType::Bool, [3]);
        assert_eq!(
            HostTensor::shared(ty, bools, 0..3).unwrap_err(),
            ValueError::Bool(2)
        );
    }
}
