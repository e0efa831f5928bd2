//! Scalar literals of each dtype in the text form, in both directions.
//!
//! Floats print as the shortest decimal that reads back to the same bits (`{:?}`), with `inf`,
//! `-inf`, `nan` for the canonical quiet NaN and `nan:0x…` (the raw bits) for any other NaN, so
//! printing then parsing any constant gives back the same bits. f16 and bf16 values go through
//! their exact f32 value.

use half::{bf16, f16};

use crate::dtype::DType;

/// Bits of one element in the dtype's little-endian representation, zero-extended.
pub fn format_bits(dtype: DType, bits: u64) -> String {
    match dtype {
        DType::F32 => format_float(f32::from_bits(bits as u32), bits, 0x7fc0_0000, 8),
        DType::F16 => format_float(f16::from_bits(bits as u16).to_f32(), bits, 0x7e00, 4),
        DType::BF16 => format_float(bf16::from_bits(bits as u16).to_f32(), bits, 0x7fc0, 4),
        DType::I32 => (bits as u32 as i32).to_string(),
        DType::I64 => (bits as i64).to_string(),
        DType::U8 => (bits as u8).to_string(),
        DType::Bool => (bits != 0).to_string(),
    }
}

fn format_float(v: f32, bits: u64, canonical_nan: u64, hex_digits: usize) -> String {
    if v.is_nan() {
        if bits == canonical_nan {
            "nan".to_string()
        } else {
            format!("nan:0x{bits:0hex_digits$x}")
        }
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{v:?}")
    }
}

/// Parse one literal as `dtype`, returning its bits; `None` with a reason if it does not fit.
pub fn parse_bits(dtype: DType, text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a valid {dtype} literal");
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let hex_digits = if dtype == DType::F32 { 8 } else { 4 };
            if let Some(hex) = text.strip_prefix("nan:0x") {
                let bits = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
                let ok = hex.len() == hex_digits && is_nan_bits(dtype, bits);
                return if ok {
                    Ok(bits)
                } else {
                    Err(format!("{text:?} is not a {dtype} NaN bit pattern"))
                };
            }
            let v: f32 = match text {
                "nan" => f32::NAN,
                "inf" | "+inf" => f32::INFINITY,
                "-inf" => f32::NEG_INFINITY,
                // Refuse spellings Rust accepts but the format does not ("NaN", "infinity").
                t if t
                    .bytes()
                    .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E') =>
                {
                    return Err(bad());
                }
                t => t.parse().map_err(|_| bad())?,
            };
            Ok(match dtype {
                DType::F32 => {
                    if v.is_nan() {
                        0x7fc0_0000
                    } else {
                        v.to_bits() as u64
                    }
                }
                DType::F16 => {
                    if v.is_nan() {
                        0x7e00
                    } else {
                        f16::from_f32(v).to_bits() as u64
                    }
                }
                _ => {
                    if v.is_nan() {
                        0x7fc0
                    } else {
                        bf16::from_f32(v).to_bits() as u64
                    }
                }
            })
        }
        DType::I32 => text
            .parse::<i32>()
            .map(|v| v as u32 as u64)
            .map_err(|_| bad()),
        DType::I64 => text.parse::<i64>().map(|v| v as u64).map_err(|_| bad()),
        DType::U8 => text.parse::<u8>().map(|v| v as u64).map_err(|_| bad()),
        DType::Bool => match text {
            "true" => Ok(1),
            "false" => Ok(0),
            _ => Err(bad()),
        },
    }
}

fn is_nan_bits(dtype: DType, bits: u64) -> bool {
    match dtype {
        DType::F32 => bits <= u32::MAX as u64 && f32::from_bits(bits as u32).is_nan(),
        DType::F16 => bits <= 0xffff && f16::from_bits(bits as u16).is_nan(),
        DType::BF16 => bits <= 0xffff && bf16::from_bits(bits as u16).is_nan(),
        _ => false,
    }
}

/// Read element `i` of little-endian `data` as zero-extended bits.
pub fn element_bits(dtype: DType, data: &[u8], i: usize) -> u64 {
    let size = dtype.size() as usize;
    let mut buf = [0u8; 8];
    buf[..size].copy_from_slice(&data[i * size..(i + 1) * size]);
    u64::from_le_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_bits() {
        let cases: [u32; 9] = [
            0,
            0x8000_0000, // -0.0
            1,           // smallest denormal
            0x7f7f_ffff, // f32::MAX
            0x7f80_0000, // inf
            0xff80_0000, // -inf
            0x7fc0_0000, // canonical NaN
            0xffc0_0001, // NaN with payload and sign
            0.1f32.to_bits(),
        ];
        for bits in cases {
            let text = format_bits(DType::F32, bits as u64);
            assert_eq!(parse_bits(DType::F32, &text), Ok(bits as u64), "{text}");
        }
        for bits in [0u64, 0x8000, 1, 0x7bff, 0x7c00, 0x7e00, 0x7e01, 0x3555] {
            for d in [DType::F16, DType::BF16] {
                let text = format_bits(d, bits);
                assert_eq!(parse_bits(d, &text), Ok(bits), "{d} {text}");
            }
        }
    }

    #[test]
    fn integers_are_range_checked() {
        assert_eq!(parse_bits(DType::U8, "255"), Ok(255));
        assert!(parse_bits(DType::U8, "256").is_err());
        assert_eq!(parse_bits(DType::I32, "-1"), Ok(0xffff_ffff));
        assert_eq!(format_bits(DType::I32, 0xffff_ffff), "-1");
        assert!(parse_bits(DType::I32, "1.5").is_err());
        assert!(parse_bits(DType::F32, "NaN").is_err());
        assert!(parse_bits(DType::F32, "nan:0x3f800000").is_err());
        assert_eq!(parse_bits(DType::Bool, "true"), Ok(1));
    }
}
