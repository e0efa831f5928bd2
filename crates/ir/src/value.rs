//! Host tensors: a type and its elements as little-endian bytes in row-major order.
//!
//! This is the value that crosses every boundary (files, executors, the wire): plain data, so
//! that any backend can read it and its bytes can be hashed. `bool` elements are the bytes 0/1.

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
}

/// A tensor held in host memory.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HostTensor {
    ty: TensorType,
    data: Vec<u8>,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTensor({}, {} bytes)", self.ty, self.data.len())
    }
}

/// A large buffer goes to the process-wide cache ([`crate::recycle`]) for the next result of
/// its size.
impl Drop for HostTensor {
    fn drop(&mut self) {
        crate::recycle::give(std::mem::take(&mut self.data));
    }
}

impl HostTensor {
    /// Wrap bytes, checking their length (and bool bytes) against the type.
    pub fn new(ty: TensorType, data: Vec<u8>) -> Result<HostTensor, ValueError> {
        let expected = ty.bytes().ok_or_else(|| ValueError::Overflow(ty.clone()))?;
        if data.len() as u64 != expected {
            return Err(ValueError::Size {
                ty,
                expected,
                actual: data.len() as u64,
            });
        }
        if let Some(&b) = data
            .iter()
            .find(|&&b| b > 1)
            .filter(|_| ty.dtype == DType::Bool)
        {
            return Err(ValueError::Bool(b));
        }
        Ok(HostTensor { ty, data })
    }

    /// All-zero tensor (false for bool).
    pub fn zeros(ty: TensorType) -> Result<HostTensor, ValueError> {
        let n = ty.bytes().ok_or_else(|| ValueError::Overflow(ty.clone()))?;
        Ok(HostTensor {
            ty,
            data: vec![0; n as usize],
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
        self.data.len() / self.ty.dtype.size() as usize
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn into_bytes(mut self) -> Vec<u8> {
        std::mem::take(&mut self.data)
    }

    /// The same bytes under another type with the same dtype and element count (a reshape
    /// without a copy); the tensor comes back unchanged as the error otherwise.
    pub fn reshaped(mut self, ty: TensorType) -> Result<HostTensor, HostTensor> {
        if ty.dtype == self.ty.dtype && ty.numel() == self.ty.numel() {
            Ok(HostTensor {
                ty,
                data: std::mem::take(&mut self.data),
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
        h.update(&self.data);
        *h.finalize().as_bytes()
    }

    /// Element `i` as f32 (floats exactly; integers and bools converted).
    pub fn get_f32(&self, i: usize) -> f32 {
        let b = &self.data;
        match self.ty.dtype {
            DType::F32 => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
            DType::F16 => f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            DType::BF16 => bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            _ => self.get_i64(i) as f32,
        }
    }

    /// Element `i` as i64 (integers and bools exactly; floats truncated, saturating).
    pub fn get_i64(&self, i: usize) -> i64 {
        let b = &self.data;
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
        (0..self.numel()).map(|i| self.get_f32(i)).collect()
    }

    /// All elements as i64.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.numel()).map(|i| self.get_i64(i)).collect()
    }
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
}
