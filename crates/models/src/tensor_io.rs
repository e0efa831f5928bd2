//! Tensors in the file formats users bring and want back: `.npy`, `.safetensors` and JSON,
//! chosen by extension. Files are untrusted: headers are parsed without panics, sizes are
//! checked against the bytes present, and every error names the file and what to do.

use std::io::Write;
use std::path::Path;

use tenet_ir::text::format_bits;
use tenet_ir::{DType, HostTensor, TensorType};

use crate::safetensors_io::{WeightsFile, write_safetensors};

/// Largest tensor file read.
pub const MAX_TENSOR_FILE_BYTES: u64 = 16 << 30;

#[derive(Debug, thiserror::Error)]
pub enum TensorIoError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: String, reason: String },
}

fn format_err(path: &Path, reason: impl Into<String>) -> TensorIoError {
    TensorIoError::Format {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn ext(path: &Path) -> String {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Read the tensor for graph input `name` of type `expected` from `path` (`.npy`, `.json`, or
/// `.safetensors` holding a tensor called `name` or exactly one tensor).
pub fn read_tensor(
    path: &Path,
    name: &str,
    expected: &TensorType,
) -> Result<HostTensor, TensorIoError> {
    let size = std::fs::metadata(path)
        .map_err(|source| TensorIoError::Read {
            path: path.display().to_string(),
            source,
        })?
        .len();
    if size > MAX_TENSOR_FILE_BYTES {
        return Err(format_err(
            path,
            format!("{size} bytes is above the {MAX_TENSOR_FILE_BYTES}-byte limit"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|source| TensorIoError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let t = match ext(path).as_str() {
        "npy" => read_npy(&bytes).map_err(|r| format_err(path, r))?,
        "json" => read_json(&bytes, expected).map_err(|r| format_err(path, r))?,
        "safetensors" => {
            let file = WeightsFile::from_bytes(bytes, &path.display().to_string())
                .map_err(|e| format_err(path, e.to_string()))?;
            let key = if file.tensors.contains_key(name) {
                name.to_string()
            } else if file.tensors.len() == 1 {
                file.tensors.keys().next().cloned().unwrap_or_default()
            } else {
                return Err(format_err(
                    path,
                    format!(
                        "has no tensor named {name:?} and holds {} tensors",
                        file.tensors.len()
                    ),
                ));
            };
            file.tensor(&key).cloned().ok_or_else(|| {
                format_err(
                    path,
                    format!("tensor {key:?} has a dtype tenet does not support"),
                )
            })?
        }
        other => {
            return Err(format_err(
                path,
                format!("unknown tensor file type {other:?}: use .npy, .json or .safetensors"),
            ));
        }
    };
    if t.ty() != expected {
        return Err(format_err(
            path,
            format!("holds {}, but input {name:?} is {expected}", t.ty()),
        ));
    }
    Ok(t)
}

// ------------------------------------------------------------------------------------------
// .npy

fn npy_descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
        DType::BF16 => return None,
    })
}

fn dtype_of_descr(descr: &str) -> Result<DType, String> {
    Ok(match descr {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|u1" | "<u1" => DType::U8,
        "|b1" => DType::Bool,
        "<f8" => {
            return Err(
                "holds float64; tenet computes in f32 — save it with a.astype(numpy.float32)"
                    .into(),
            );
        }
        d if d.starts_with('>') => {
            return Err(format!("is big-endian ({d}); save it little-endian"));
        }
        d => {
            return Err(format!(
                "has numpy dtype {d}, which tenet does not support (f4, f2, i4, i8, u1, b1)"
            ));
        }
    })
}

/// Parse the header dict `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`.
fn parse_npy_header(h: &str) -> Result<(String, bool, Vec<u64>), String> {
    let value_after = |key: &str| -> Result<&str, String> {
        let at = h
            .find(&format!("'{key}'"))
            .ok_or(format!("npy header has no '{key}'"))?;
        let rest = &h[at + key.len() + 2..];
        let colon = rest.find(':').ok_or("malformed npy header")?;
        Ok(rest[colon + 1..].trim_start())
    };
    let d = value_after("descr")?;
    let quote = d
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or("malformed descr in npy header")?;
    let end = d[1..].find(quote).ok_or("malformed descr in npy header")?;
    let descr = d[1..1 + end].to_string();
    let f = value_after("fortran_order")?;
    let fortran = if f.starts_with("True") {
        true
    } else if f.starts_with("False") {
        false
    } else {
        return Err("malformed fortran_order in npy header".into());
    };
    let s = value_after("shape")?;
    let close = s.find(')').ok_or("malformed shape in npy header")?;
    let inner = s.strip_prefix('(').ok_or("malformed shape in npy header")?;
    let mut shape = Vec::new();
    for part in inner[..close - 1]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        if shape.len() >= 8 {
            return Err("npy shape has more than 8 dimensions".into());
        }
        shape.push(
            part.parse::<u64>()
                .map_err(|_| format!("bad dimension {part:?} in npy header"))?,
        );
    }
    Ok((descr, fortran, shape))
}

fn read_npy(bytes: &[u8]) -> Result<HostTensor, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not an .npy file (no \\x93NUMPY magic)".into());
    }
    let (header_len, start): (usize, usize) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(start..start.saturating_add(header_len))
        .filter(|_| header_len <= 1 << 16)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "npy header is not text")?;
    let (descr, fortran, shape) = parse_npy_header(header)?;
    if fortran {
        return Err("is in Fortran order; save it with numpy.ascontiguousarray".into());
    }
    let ty = TensorType::new(dtype_of_descr(&descr)?, shape);
    let data = &bytes[start + header_len..];
    let need = ty.bytes().ok_or("npy shape is too large")?;
    if data.len() as u64 != need {
        return Err(format!(
            "npy data is {} bytes; {ty} needs {need}",
            data.len()
        ));
    }
    HostTensor::new(ty, data.to_vec()).map_err(|e| e.to_string())
}

/// `.npy` version 1.0 bytes of a tensor (bf16 has no numpy dtype).
pub fn npy_bytes(t: &HostTensor) -> Result<Vec<u8>, String> {
    let descr = npy_descr(t.dtype())
        .ok_or("numpy has no bfloat16: write bf16 outputs to .safetensors or .json")?;
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        s => format!(
            "({})",
            s.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// JSON

/// Accepts a nested list (shape from the nesting, dtype from the graph), a bare number, or
/// `{"dtype": "f32", "shape": [2, 3], "data": [...]}` with flat or nested data. Floats may be
/// written `"nan"`, `"inf"`, `"-inf"`.
fn read_json(bytes: &[u8], expected: &TensorType) -> Result<HostTensor, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    tensor_from_json(&v, expected)
}

/// A tensor from a JSON value, in any form `.json` tensor files accept (see `read_json`);
/// `expected` supplies what the value leaves out.
pub fn tensor_from_json(
    v: &serde_json::Value,
    expected: &TensorType,
) -> Result<HostTensor, String> {
    let (dtype, declared_shape, data) = match v {
        serde_json::Value::Object(o) => {
            let dtype = match o.get("dtype") {
                Some(serde_json::Value::String(s)) => {
                    DType::from_name(s).ok_or(format!("unknown dtype {s:?}"))?
                }
                None => expected.dtype,
                Some(_) => return Err("\"dtype\" must be a string such as \"f32\"".into()),
            };
            let shape = match o.get("shape") {
                Some(s) => Some(
                    s.as_array()
                        .ok_or("\"shape\" must be a list of integers")?
                        .iter()
                        .map(|d| d.as_u64().ok_or("\"shape\" must be a list of integers"))
                        .collect::<Result<Vec<u64>, _>>()?,
                ),
                None => None,
            };
            (
                dtype,
                shape,
                o.get("data").ok_or("a tensor object needs \"data\"")?,
            )
        }
        other => (expected.dtype, None, other),
    };
    let mut flat = Vec::new();
    let nested_shape = flatten(data, &mut flat, 0)?;
    let shape = match declared_shape {
        Some(s) => {
            if tenet_ir::numel(&s) != Some(flat.len() as u64) {
                return Err(format!(
                    "\"shape\" {s:?} does not match {} values",
                    flat.len()
                ));
            }
            s
        }
        None => nested_shape,
    };
    let ty = TensorType::new(dtype, shape);
    let size = dtype.size() as usize;
    let mut out = Vec::with_capacity(flat.len() * size);
    for item in flat {
        let bits = json_element(item, dtype)?;
        out.extend_from_slice(&bits.to_le_bytes()[..size]);
    }
    HostTensor::new(ty, out).map_err(|e| e.to_string())
}

/// Flatten nested lists row-major, returning the shape; lists must be rectangular.
fn flatten<'a>(
    v: &'a serde_json::Value,
    out: &mut Vec<&'a serde_json::Value>,
    depth: usize,
) -> Result<Vec<u64>, String> {
    match v {
        serde_json::Value::Array(items) => {
            if depth >= 8 {
                return Err("lists are nested more than 8 deep".into());
            }
            let mut inner: Option<Vec<u64>> = None;
            for item in items {
                let s = flatten(item, out, depth + 1)?;
                if inner.as_ref().is_some_and(|i| *i != s) {
                    return Err("nested lists are not rectangular".into());
                }
                inner = Some(s);
            }
            let mut shape = vec![items.len() as u64];
            shape.extend(inner.unwrap_or_default());
            Ok(shape)
        }
        scalar => {
            out.push(scalar);
            Ok(Vec::new())
        }
    }
}

fn json_element(v: &serde_json::Value, dtype: DType) -> Result<u64, String> {
    use serde_json::Value;
    let bad = || format!("{v} is not a valid {dtype} value");
    if dtype.is_float() {
        let x: f64 = match v {
            Value::Number(n) => n.as_f64().ok_or_else(bad)?,
            Value::String(s) => match s.as_str() {
                "nan" | "NaN" => f64::NAN,
                "inf" | "Infinity" => f64::INFINITY,
                "-inf" | "-Infinity" => f64::NEG_INFINITY,
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        // A finite number the dtype cannot hold is a mistake, not an infinity.
        return dtype
            .float_bits(x)
            .ok_or_else(|| format!("{v} is outside {dtype}'s range"));
    }
    if dtype == DType::Bool {
        return match v {
            Value::Bool(b) => Ok(*b as u64),
            Value::Number(n) if n.as_u64() == Some(0) || n.as_u64() == Some(1) => {
                Ok(n.as_u64().unwrap_or(0))
            }
            _ => Err(bad()),
        };
    }
    let n = v.as_i64().ok_or_else(bad)?;
    let fits = match dtype {
        DType::I32 => i32::try_from(n).is_ok(),
        DType::U8 => u8::try_from(n).is_ok(),
        _ => true,
    };
    if !fits {
        return Err(bad());
    }
    Ok(n as u64)
}

/// JSON object `{name: {"dtype", "shape", "data"}}`; floats are printed as the shortest decimal
/// that reads back to the same value, non-finite ones as `"nan"`, `"inf"`, `"-inf"`.
pub fn outputs_json(outputs: &[(String, HostTensor)]) -> String {
    let mut s = String::from("{");
    for (i, (name, t)) in outputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let shape: Vec<String> = t.shape().iter().map(u64::to_string).collect();
        s.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data\":[",
            t.dtype(),
            shape.join(",")
        ));
        let size = t.dtype().size() as usize;
        for (j, chunk) in t.bytes().chunks(size).enumerate() {
            if j > 0 {
                s.push(',');
            }
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(chunk);
            let text = format_bits(t.dtype(), u64::from_le_bytes(b));
            if text.starts_with("nan") || text.ends_with("inf") {
                s.push_str(&format!(
                    "\"{}\"",
                    if text.starts_with("nan") {
                        "nan"
                    } else {
                        &text
                    }
                ));
            } else {
                s.push_str(&text);
            }
        }
        s.push_str("]}");
    }
    s.push('}');
    s
}

// ------------------------------------------------------------------------------------------
// Writing

/// Write outputs to `path` by extension: `.npy` (exactly one tensor), `.json` or
/// `.safetensors` (all of them, by name). The file appears whole or not at all.
pub fn write_outputs(path: &Path, outputs: &[(String, HostTensor)]) -> Result<(), TensorIoError> {
    let bytes = match ext(path).as_str() {
        "npy" => match outputs {
            [(_, t)] => npy_bytes(t).map_err(|r| format_err(path, r))?,
            _ => {
                let names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format_err(
                    path,
                    format!(
                        "an .npy file holds one tensor and the graph has {} outputs ({}): use NAME=PATH, or .safetensors/.json",
                        outputs.len(),
                        names.join(", ")
                    ),
                ));
            }
        },
        "json" => outputs_json(outputs).into_bytes(),
        "safetensors" => {
            let tensors: Vec<(&str, DType, Vec<u64>, Vec<u8>)> = outputs
                .iter()
                .map(|(n, t)| {
                    (
                        n.as_str(),
                        t.dtype(),
                        t.shape().to_vec(),
                        t.bytes().to_vec(),
                    )
                })
                .collect();
            write_safetensors(&tensors).map_err(|e| format_err(path, e.to_string()))?
        }
        other => {
            return Err(format_err(
                path,
                format!("unknown output file type {other:?}: use .npy, .json or .safetensors"),
            ));
        }
    };
    write_atomically(path, &bytes).map_err(|source| TensorIoError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Write via a temporary file in the same directory and rename, so a crash never leaves a
/// partial file behind.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_and_header_parsing() {
        for t in [
            HostTensor::from_f32(&[2, 3], &[1.0, -2.5, f32::NAN, 0.0, -0.0, 7.0]).unwrap(),
            HostTensor::from_i64(&[3], &[1, -2, i64::MAX]).unwrap(),
            HostTensor::from_f32(&[], &[4.0]).unwrap(),
            HostTensor::from_i32(&[0, 5], &[]).unwrap(),
        ] {
            let bytes = npy_bytes(&t).unwrap();
            assert_eq!(
                (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
                0
            );
            assert_eq!(read_npy(&bytes).unwrap(), t);
        }
        let (d, f, s) =
            parse_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }").unwrap();
        assert_eq!((d.as_str(), f, s), ("<f4", false, vec![5]));
        let e = dtype_of_descr("<f8").unwrap_err();
        assert!(e.contains("astype"), "{e}");
    }

    #[test]
    fn hostile_npy_is_refused() {
        let good = npy_bytes(&HostTensor::from_f32(&[4], &[1.0; 4]).unwrap()).unwrap();
        for cut in [0, 5, 9, 20, good.len() - 1] {
            assert!(read_npy(&good[..cut]).is_err());
        }
        let mut huge = good.clone();
        huge[8] = 0xff;
        huge[9] = 0xff;
        assert!(read_npy(&huge).is_err());
        let text =
            String::from_utf8_lossy(&good[10..74]).replace("(4,)", "(99999999999999999999,)");
        let mut bad = good[..10].to_vec();
        bad.extend_from_slice(text.as_bytes());
        assert!(read_npy(&bad).is_err());
    }

    #[test]
    fn json_values_outside_their_dtype_are_refused_not_made_infinite() {
        let ty = TensorType::new(DType::F32, [1]);
        let e = read_json(b"[1e39]", &ty).unwrap_err().to_string();
        assert!(e.contains("outside f32's range"), "{e}");
        let f16 = TensorType::new(DType::F16, [1]);
        assert!(read_json(b"[70000]", &f16).is_err());
        assert!(read_json(b"[\"inf\"]", &ty).is_ok());
        assert!(read_json(b"[3.4e38]", &ty).is_ok());
    }

    #[test]
    fn json_forms() {
        let ty = TensorType::new(DType::F32, [2, 2]);
        let t = read_json(b"[[1, 2], [3.5, \"-inf\"]]", &ty).unwrap();
        assert_eq!(t.to_f32_vec(), vec![1.0, 2.0, 3.5, f32::NEG_INFINITY]);
        let t = read_json(br#"{"dtype": "i64", "shape": [3], "data": [1, 2, 3]}"#, &ty).unwrap();
        assert_eq!(t.ty(), &TensorType::new(DType::I64, [3]));
        assert!(read_json(b"[[1, 2], [3]]", &ty).is_err());
        assert!(read_json(b"[1.5]", &TensorType::new(DType::I32, [1])).is_err());
        assert!(read_json(b"[300]", &TensorType::new(DType::U8, [1])).is_err());
        let out = outputs_json(&[(
            "y".into(),
            HostTensor::from_f32(&[3], &[0.1, f32::NAN, 1e-45]).unwrap(),
        )]);
        assert_eq!(
            out,
            r#"{"y":{"dtype":"f32","shape":[3],"data":[0.1,"nan",1e-45]}}"#
        );
        // What we print reads back to the same bits.
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let back = read_json(
            v["y"].to_string().as_bytes(),
            &TensorType::new(DType::F32, [3]),
        )
        .unwrap();
        assert_eq!(back.to_f32_vec()[0].to_bits(), 0.1f32.to_bits());
        assert_eq!(back.to_f32_vec()[2].to_bits(), 1);
    }
}
