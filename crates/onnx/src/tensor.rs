//! ONNX tensors (`TensorProto`: initializers, `Constant` values, the backend tests' `.pb`
//! files) as tenet `HostTensor`s: dtype mapping, every way ONNX stores elements (raw bytes,
//! typed fields, an external file beside the model), each size checked against the data
//! actually present before anything is allocated.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

use tenet_ir::{DType, HostTensor, TensorType};

use crate::onnx_proto::TensorProto;

/// ONNX `TensorProto.DataType` codes tenet maps onto its own dtypes.
pub(crate) fn dtype_of(code: i32) -> Result<DType, String> {
    Ok(match code {
        1 => DType::F32,
        2 => DType::U8,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        16 => DType::BF16,
        other => {
            return Err(format!(
                "dtype {} has no tenet equivalent",
                dtype_name(other)
            ));
        }
    })
}

/// The ONNX code of a tenet dtype.
pub(crate) fn code_of(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 1,
        DType::U8 => 2,
        DType::I32 => 6,
        DType::I64 => 7,
        DType::Bool => 9,
        DType::F16 => 10,
        DType::BF16 => 16,
    }
}

/// ONNX's name of a dtype code, for messages.
pub(crate) fn dtype_name(code: i32) -> String {
    let name = match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE (tenet has no f64: export the model in float32)",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17..=20 => "FLOAT8",
        21 | 22 => "INT4/UINT4",
        _ => return format!("code {code}"),
    };
    name.to_string()
}

/// Where a tensor's external data may be read from, and how much of it.
pub(crate) struct External<'a> {
    /// The model's folder: external files must lie inside it.
    pub dir: Option<&'a Path>,
}

/// Decode one `TensorProto` into a tensor of at most `max_bytes` bytes.
pub(crate) fn to_host(
    t: &TensorProto,
    external: &External<'_>,
    max_bytes: u64,
) -> Result<HostTensor, String> {
    let code = t.data_type.unwrap_or(0);
    let dtype = dtype_of(code)?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(u64::try_from(d).map_err(|_| format!("has a negative dimension {d}"))?);
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("claims dims {:?}, too many elements", t.dims))?;
    let bytes = numel
        .checked_mul(dtype.size())
        .filter(|&b| b <= max_bytes)
        .ok_or_else(|| {
            format!(
                "claims dims {:?} ({numel} elements), more than the {max_bytes}-byte limit",
                t.dims
            )
        })?;
    let ty = TensorType::new(dtype, shape);
    let wrong_count = |field: &str, got: usize| {
        format!("claims {numel} elements of {dtype} but its {field} holds {got}")
    };
    let data: Vec<u8> = if t.data_location == Some(1) {
        read_external(t, external, bytes)?
    } else if let Some(raw) = &t.raw_data {
        if raw.len() as u64 != bytes {
            return Err(format!(
                "claims dims {:?} of {dtype} ({bytes} bytes) but its raw data holds {} bytes",
                t.dims,
                raw.len()
            ));
        }
        raw.clone()
    } else {
        match dtype {
            DType::F32 => {
                if t.float_data.len() as u64 != numel {
                    return Err(wrong_count("float_data", t.float_data.len()));
                }
                t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            DType::I64 => {
                if t.int64_data.len() as u64 != numel {
                    return Err(wrong_count("int64_data", t.int64_data.len()));
                }
                t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            DType::I32 | DType::U8 | DType::Bool | DType::F16 | DType::BF16 => {
                if t.int32_data.len() as u64 != numel {
                    return Err(wrong_count("int32_data", t.int32_data.len()));
                }
                let mut out = Vec::with_capacity(bytes as usize);
                for &v in &t.int32_data {
                    match dtype {
                        DType::I32 => out.extend_from_slice(&v.to_le_bytes()),
                        DType::F16 | DType::BF16 => {
                            let h = u16::try_from(v).map_err(|_| {
                                format!("holds {v} in int32_data, not a 16-bit pattern")
                            })?;
                            out.extend_from_slice(&h.to_le_bytes())
                        }
                        _ => out.push(
                            u8::try_from(v)
                                .map_err(|_| format!("holds {v} in int32_data, not a byte"))?,
                        ),
                    }
                }
                out
            }
        }
    };
    HostTensor::new(ty, data).map_err(|e| e.to_string())
}

/// The bytes of an external tensor: `location` relative to the model's folder and inside it,
/// `offset` and `length` within the file, `length` equal to what the dims claim.
fn read_external(t: &TensorProto, external: &External<'_>, bytes: u64) -> Result<Vec<u8>, String> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for e in &t.external_data {
        let value = e.value.as_deref().unwrap_or("");
        match e.key.as_deref().unwrap_or("") {
            "location" => location = Some(value.to_string()),
            "offset" => {
                offset = value
                    .parse()
                    .map_err(|_| format!("has an external offset {value:?} that is not a number"))?
            }
            "length" => {
                length = Some(value.parse::<u64>().map_err(|_| {
                    format!("has an external length {value:?} that is not a number")
                })?)
            }
            _ => {}
        }
    }
    let location = location.ok_or("stores its data externally but names no location")?;
    let Some(dir) = external.dir else {
        return Err(format!(
            "stores its data in the external file {location:?}, but the model was not read from a folder"
        ));
    };
    let rel = Path::new(&location);
    if location.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!(
            "stores its data in {location:?}, which is not a plain path inside the model's folder"
        ));
    }
    let path = dir.join(rel);
    let inside = match (dir.canonicalize(), path.canonicalize()) {
        (Ok(d), Ok(p)) => p.starts_with(&d),
        _ => false,
    };
    if !inside {
        return Err(format!(
            "stores its data in {location:?}, which does not exist inside the model's folder {}",
            dir.display()
        ));
    }
    if let Some(length) = length
        && length != bytes
    {
        return Err(format!(
            "stores {length} external bytes but its dims claim {bytes}"
        ));
    }
    let mut file =
        std::fs::File::open(&path).map_err(|e| format!("cannot open {location:?}: {e}"))?;
    let size = file
        .metadata()
        .map_err(|e| format!("cannot read {location:?}: {e}"))?
        .len();
    if offset.checked_add(bytes).is_none_or(|end| end > size) {
        return Err(format!(
            "reads bytes {offset}..{} of {location:?}, which has {size}",
            offset.saturating_add(bytes)
        ));
    }
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot read {location:?}: {e}"))?;
    let mut data = vec![0u8; bytes as usize];
    file.read_exact(&mut data)
        .map_err(|e| format!("cannot read {location:?}: {e}"))?;
    Ok(data)
}

/// A tenet tensor as a `TensorProto` with raw data (for writing test data and reference runs).
pub fn to_proto(name: &str, t: &HostTensor) -> TensorProto {
    TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(code_of(t.dtype())),
        name: Some(name.to_string()),
        raw_data: Some(t.bytes().to_vec()),
        ..TensorProto::default()
    }
}
