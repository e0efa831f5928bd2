//! Element types and tensor types (dtype + static shape).
//!
//! Shapes are fully static: every dimension is known when the graph is built, which is what lets
//! the cost certificate be computed before anything runs.

use std::fmt;

/// Element type of a tensor.
///
/// `F16` and `BF16` are storage types: every op computes on them in `f32` and rounds the result
/// to the storage type once, round-to-nearest-even (see docs/OPS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element in memory and on the wire (`Bool` is one byte, 0 or 1).
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The name used in the text form and in error messages (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Tag byte in the binary encoding.
    pub fn tag(self) -> u8 {
        self as u8
    }

    pub fn from_tag(tag: u8) -> Option<DType> {
        DType::ALL.get(tag as usize).copied()
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8)
    }

    /// Floats and signed integers: the types with a meaningful sign.
    pub fn is_signed(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64
        )
    }

    /// Everything but `Bool`.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// The bits of `x` in this float dtype (rounded to f32, then to the storage type, each to
    /// nearest even), in the low bytes; `None` for a finite `x` the dtype cannot hold (it would
    /// become infinite) or a dtype that is not a float. What a text number (JSON) becomes.
    pub fn float_bits(self, x: f64) -> Option<u64> {
        let x32 = x as f32;
        let (bits, infinite) = match self {
            DType::F32 => (x32.to_bits() as u64, x32.is_infinite()),
            DType::F16 => {
                let h = half::f16::from_f32(x32);
                (h.to_bits() as u64, h.is_infinite())
            }
            DType::BF16 => {
                let h = half::bf16::from_f32(x32);
                (h.to_bits() as u64, h.is_infinite())
            }
            _ => return None,
        };
        (!infinite || !x.is_finite()).then_some(bits)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dtype and a static shape: `f32[1024,1024]`, or `f32[]` for a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<u64>>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, Vec::new())
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements, or `None` if the product overflows `u64`.
    pub fn numel(&self) -> Option<u64> {
        numel(&self.shape)
    }

    /// Size in bytes, or `None` on overflow.
    pub fn bytes(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.size())
    }
}

/// Product of dimensions, `None` on overflow. The empty product (a scalar) is 1.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        // `pad` so that width and alignment flags work in tables.
        f.pad(&format!("{}[{}]", self.dtype, dims.join(",")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_tags_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_tag(d.tag()), Some(d));
        }
        assert_eq!(DType::from_tag(7), None);
        assert_eq!(DType::from_name("f64"), None);
    }

    #[test]
    fn display_and_sizes() {
        let t = TensorType::new(DType::BF16, [2, 3]);
        assert_eq!(t.to_string(), "bf16[2,3]");
        assert_eq!(t.bytes(), Some(12));
        assert_eq!(TensorType::scalar(DType::I64).to_string(), "i64[]");
        assert_eq!(TensorType::new(DType::F32, [u64::MAX, 2]).numel(), None);
        assert_eq!(TensorType::new(DType::F32, [0, 5]).numel(), Some(0));
    }
}
