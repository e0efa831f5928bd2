//! The tensor blob: how one tensor travels and is stored. The bytes are the tensor's type in
//! its canonical text (`f32[2,3]`), one zero byte, then the elements little-endian in row-major
//! order — exactly what [`HostTensor::hash`] hashes, so a tensor blob's address is the tensor's
//! hash. Decoding is strict: a type written any other way, or a length that does not match, is
//! refused, so one tensor has exactly one blob. A blob's type must also fit the graph limits
//! (`tenet_ir::Limits`: rank, each dimension, element count), checked from the header alone
//! before anything is allocated for the elements: a tensor no graph could take is refused.

use tenet_ir::{DType, HostTensor, Limits, SharedBytes, TensorType};

use crate::Hash;

/// Longest type text accepted (rank and digits are bounded by the graph limits far below this).
pub const MAX_TYPE_TEXT: usize = 512;

/// Why bytes are not a tensor blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorBlobError {
    #[error("tensor blob has no type header (expected `dtype[dims]` and a zero byte first)")]
    NoHeader,
    #[error("tensor blob type `{0}` is not a canonical tensor type such as `f32[2,3]`")]
    BadType(String),
    #[error("tensor blob of type {ty} should hold {expected} data bytes but holds {actual}")]
    Size {
        ty: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "tensor blob type `{ty}` has {what} {value}, above the limit of {max} (`tenet_ir::Limits`): no graph can take it; send a smaller tensor"
    )]
    Limit {
        ty: String,
        /// `rank`, `a dimension of`, or `element count` (`u64::MAX` when it overflows).
        what: &'static str,
        value: u64,
        max: u64,
    },
}

/// Refuse a type outside `limits`: rank, each dimension, and element count, as a graph's
/// values are bounded (a zero-size shape with huge dimensions is refused too).
pub fn check_limits(ty: &TensorType, limits: &Limits) -> Result<(), TensorBlobError> {
    let over = |what, value: u64, max: u64| {
        (value > max).then(|| TensorBlobError::Limit {
            ty: ty.to_string(),
            what,
            value,
            max,
        })
    };
    if let Some(e) = over("rank", ty.rank() as u64, limits.max_rank as u64) {
        return Err(e);
    }
    for &d in &ty.shape {
        if let Some(e) = over("a dimension of", d, limits.max_dim) {
            return Err(e);
        }
    }
    match over(
        "element count",
        ty.numel().unwrap_or(u64::MAX),
        limits.max_elements,
    ) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The blob of `t`.
pub fn encode(t: &HostTensor) -> Vec<u8> {
    let mut out = header(t.ty());
    out.reserve_exact(t.bytes().len());
    out.extend_from_slice(t.bytes());
    out
}

/// What a tensor blob of type `ty` starts with: its canonical type text and a NUL. The blob is
/// this header followed by the tensor's bytes, so a sender holding the tensor can send the two
/// without joining them.
pub fn header(ty: &TensorType) -> Vec<u8> {
    let ty = ty.to_string();
    let mut out = Vec::with_capacity(ty.len() + 1);
    out.extend_from_slice(ty.as_bytes());
    out.push(0);
    out
}

/// How many bytes a blob of type `ty` has (its header and its elements); `None` when the
/// element bytes overflow. What a caller that knows the type passes as an answer's size limit.
pub fn blob_size(ty: &TensorType) -> Option<u64> {
    let header = ty.to_string().len() as u64 + 1;
    ty.bytes()?.checked_add(header)
}

/// The address of `t`'s blob (equal to `Hash::of(&encode(t))`, without building the blob).
pub fn hash(t: &HostTensor) -> Hash {
    Hash(t.hash())
}

/// Parse a canonical type text (its size is not checked here: see [`check_limits`]).
pub fn parse_type(text: &str) -> Option<TensorType> {
    let (name, rest) = text.split_once('[')?;
    let dims = rest.strip_suffix(']')?;
    let dtype = DType::from_name(name)?;
    let shape: Vec<u64> = if dims.is_empty() {
        Vec::new()
    } else {
        dims.split(',')
            .map(|d| d.parse().ok())
            .collect::<Option<_>>()?
    };
    let ty = TensorType::new(dtype, shape);
    // Canonical only: no leading zeros, spaces or `+` signs that `parse` would tolerate.
    (ty.to_string() == text).then_some(ty)
}

/// Where a blob's elements start: just past its header's zero byte, if `head` (the blob's
/// first bytes) holds the header.
pub fn data_offset(head: &[u8]) -> Option<usize> {
    let head = &head[..head.len().min(MAX_TYPE_TEXT + 1)];
    head.iter().position(|&b| b == 0).map(|zero| zero + 1)
}

/// Check a blob's header, limits and length: its type and where its elements start.
fn parse(bytes: &[u8]) -> Result<(TensorType, usize), TensorBlobError> {
    let start = data_offset(bytes).ok_or(TensorBlobError::NoHeader)?;
    let head = &bytes[..start - 1];
    let text = std::str::from_utf8(head)
        .map_err(|_| TensorBlobError::BadType(String::from_utf8_lossy(head).into()))?;
    let ty = parse_type(text).ok_or_else(|| TensorBlobError::BadType(text.to_string()))?;
    check_limits(&ty, &Limits::default())?;
    let actual = (bytes.len() - start) as u64;
    let expected = ty
        .bytes()
        .ok_or_else(|| TensorBlobError::BadType(text.to_string()))?;
    if expected != actual {
        return Err(TensorBlobError::Size {
            ty: text.to_string(),
            expected,
            actual,
        });
    }
    Ok((ty, start))
}

/// Read a tensor blob held in a shared buffer: the tensor is a view of the buffer when its
/// elements are aligned for their type (no copy), and a copy otherwise.
pub fn decode_shared(blob: SharedBytes) -> Result<HostTensor, TensorBlobError> {
    let bytes = (*blob).as_ref();
    let (ty, start) = parse(bytes)?;
    if !(bytes[start..].as_ptr() as usize).is_multiple_of(ty.dtype.size() as usize) {
        return copied(ty, bytes, start);
    }
    let range = start..bytes.len();
    let err = |_| bad_elements(bytes, start);
    HostTensor::shared(ty, blob.clone(), range).map_err(err)
}

/// Read a tensor blob.
pub fn decode(bytes: &[u8]) -> Result<HostTensor, TensorBlobError> {
    let (ty, start) = parse(bytes)?;
    copied(ty, bytes, start)
}

/// The tensor of type `ty` whose elements are `bytes[start..]`, copied. A large tensor's bytes
/// go into a cached buffer where one fits (a resident tensor replaced by the next upload
/// under its name leaves one): fresh pages fault in slowly.
fn copied(ty: TensorType, bytes: &[u8], start: usize) -> Result<HostTensor, TensorBlobError> {
    let data = &bytes[start..];
    let owned = match tenet_ir::recycle::take(data.len()) {
        Some(mut cached) => {
            cached.copy_from_slice(data);
            cached
        }
        None => data.to_vec(),
    };
    HostTensor::new(ty, owned).map_err(|_| bad_elements(bytes, start))
}

/// A blob whose elements do not fit its (valid) type: bool bytes other than 0 and 1.
fn bad_elements(bytes: &[u8], start: usize) -> TensorBlobError {
    TensorBlobError::BadType(String::from_utf8_lossy(&bytes[..start - 1]).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trips_and_its_hash_is_the_tensor_hash() {
        let t = HostTensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, f32::NAN]).unwrap();
        let blob = encode(&t);
        assert!(blob.starts_with(b"f32[2,3]\0"));
        assert_eq!(Hash::of(&blob), hash(&t));
        let back = decode(&blob).unwrap();
        assert_eq!(back.ty(), t.ty());
        assert_eq!(back.bytes(), t.bytes());
        assert_eq!(blob_size(t.ty()), Some(blob.len() as u64));
        let scalar = HostTensor::from_i64(&[], &[7]).unwrap();
        assert_eq!(decode(&encode(&scalar)).unwrap().to_i64_vec(), vec![7]);
    }

    #[test]
    fn non_canonical_or_short_blobs_are_refused() {
        assert_eq!(decode(b"f32[2]"), Err(TensorBlobError::NoHeader));
        for bad in [
            "f32[02]", "f32[ 2]", "f32[+2]", "f33[2]", "f32(2)", "f32[2,]",
        ] {
            let mut b = bad.as_bytes().to_vec();
            b.push(0);
            b.extend_from_slice(&[0; 8]);
            assert!(
                matches!(decode(&b), Err(TensorBlobError::BadType(_))),
                "{bad}"
            );
        }
        let mut b = b"f32[2]\0".to_vec();
        b.extend_from_slice(&[0; 7]);
        assert!(matches!(decode(&b), Err(TensorBlobError::Size { .. })));
        let mut b = b"bool[1]\0".to_vec();
        b.push(2);
        assert!(decode(&b).is_err(), "bool bytes other than 0/1 are refused");
        let shared = |bytes: &[u8]| decode_shared(std::sync::Arc::new(bytes.to_vec()));
        assert!(
            shared(&b).is_err(),
            "decode_shared refuses what decode refuses"
        );
        assert_eq!(shared(b"f32[2]"), Err(TensorBlobError::NoHeader));
    }

    /// A header alone (no elements follow): the limits are checked before the length.
    fn header_only(ty: &str) -> Vec<u8> {
        let mut b = ty.as_bytes().to_vec();
        b.push(0);
        b
    }

    #[test]
    fn types_beyond_the_graph_limits_are_refused_naming_the_limit() {
        let limits = Limits::default();
        // Rank 200, each dimension 1: one element, but no graph has rank 200.
        let rank200 = format!("f32[{}]", vec!["1"; 200].join(","));
        let mut blob = header_only(&rank200);
        blob.extend_from_slice(&[0; 4]);
        match decode(&blob) {
            Err(TensorBlobError::Limit {
                what, value, max, ..
            }) => {
                assert_eq!((what, value, max), ("rank", 200, limits.max_rank as u64));
            }
            other => panic!("rank 200: {other:?}"),
        }
        assert!(decode(&blob).unwrap_err().to_string().contains("rank 200"));
        // Zero elements, so zero data bytes, but a dimension of 2^64 - 1.
        for ty in ["f32[0,18446744073709551615]", "u8[18446744073709551615,0]"] {
            let e = decode(&header_only(ty)).unwrap_err();
            assert!(
                matches!(
                    e,
                    TensorBlobError::Limit {
                        what: "a dimension of",
                        value: u64::MAX,
                        ..
                    }
                ),
                "{ty}: {e:?}"
            );
            let shared = decode_shared(std::sync::Arc::new(header_only(ty)));
            assert!(matches!(shared, Err(TensorBlobError::Limit { .. })), "{ty}");
        }
        // Each dimension within its limit, the product over it (or overflowing).
        let e = decode(&header_only("f32[1048576,1048576,2]")).unwrap_err();
        assert!(
            matches!(e, TensorBlobError::Limit { what: "element count", value, .. } if value == 1 << 41)
        );
        let e = decode(&header_only("f32[4294967296,4294967296,4294967296]")).unwrap_err();
        assert!(matches!(
            e,
            TensorBlobError::Limit {
                what: "element count",
                value: u64::MAX,
                ..
            }
        ));
        // At the limits exactly: a shape the graph limits allow is only checked for length.
        let rank8 = format!("f32[{}]", ["1"; 8].join(","));
        let mut ok = header_only(&rank8);
        ok.extend_from_slice(&[0; 4]);
        assert_eq!(decode(&ok).unwrap().ty().rank(), 8);
        let zero = header_only("f32[0,1099511627776]");
        assert_eq!(decode(&zero).unwrap().bytes().len(), 0);
        assert!(check_limits(&TensorType::new(DType::F32, vec![1; 9]), &limits).is_err());
    }

    /// A blob placed at `pad` bytes into a buffer that starts on a 64-byte boundary.
    fn placed(blob: &[u8], pad: usize) -> (std::sync::Arc<Vec<u8>>, std::ops::Range<usize>) {
        let mut buf = vec![0u8; blob.len() + 128];
        let lead = (64 - buf.as_ptr() as usize % 64) % 64 + pad;
        buf[lead..lead + blob.len()].copy_from_slice(blob);
        (std::sync::Arc::new(buf), lead..lead + blob.len())
    }

    /// An owner exposing `range` of a shared buffer: a blob somewhere inside a larger buffer.
    struct Window(std::sync::Arc<Vec<u8>>, std::ops::Range<usize>);

    impl AsRef<[u8]> for Window {
        fn as_ref(&self) -> &[u8] {
            &self.0[self.1.clone()]
        }
    }

    #[test]
    fn decode_shared_views_aligned_elements_and_copies_misaligned_ones() {
        let t = HostTensor::from_f32(&[3, 5], &[0.5; 15]).unwrap();
        let blob = encode(&t);
        let header = blob.len() - t.bytes().len();
        for pad in 0..8 {
            let (buf, range) = placed(&blob, pad);
            let back = decode_shared(std::sync::Arc::new(Window(buf, range))).unwrap();
            assert_eq!(back, t);
            assert_eq!(back, decode(&blob).unwrap());
            // The elements are aligned for f32 exactly when pad + header is a multiple of 4.
            assert_eq!(
                back.is_shared(),
                (pad + header).is_multiple_of(4),
                "pad {pad}"
            );
        }
    }
}
