//! Quantised blocks (GGUF's Q4_0, Q4_1 and Q8_0): the one definition of their values, used by
//! the `dequantize` and `qmatmul` ops and by the GGUF reader's load-time dequantisation
//! (`tenet_models::gguf`), so a weight dequantised at load and one dequantised in a graph have
//! the same bits.
//!
//! Every block holds 32 elements. Its f16 scale `d` (and Q4_1's minimum `m`) convert exactly to
//! f32; then, with gguf-py's arithmetic, each element is one f32 operation or two, each
//! rounded (never fused):
//!
//! | format | bytes | element `e` |
//! |---|---|---|
//! | Q4_0 | `d` f16, `qs` 16 bytes | `((q − 8) as f32) · d` |
//! | Q4_1 | `d` f16, `m` f16, `qs` 16 bytes | `(d · (q as f32)) + m` |
//! | Q8_0 | `d` f16, `qs` 32 bytes | `((qs[e] as i8) as f32) · d` |
//!
//! For the 4-bit formats `q` is the low nibble of `qs[e]` for `e < 16` and the high nibble of
//! `qs[e − 16]` for `e ≥ 16`. Any scale is allowed: infinities, NaNs and denormals give the
//! formula's IEEE results, and a NaN result is the canonical NaN.

use half::f16;
use tenet_ir::QuantFormat;

use crate::math::canonical;

/// Elements per block.
pub const BLOCK: usize = QuantFormat::BLOCK as usize;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 4-bit quantity of element `e` of a block whose nibbles are `qs` (16 bytes).
#[inline]
pub fn nibble(qs: &[u8], e: usize) -> u8 {
    if e < 16 {
        qs[e] & 0x0f
    } else {
        qs[e - 16] >> 4
    }
}

/// The 32 values of one block of `format`. `block` is exactly `format.block_bytes()` long
/// (panics otherwise: a validated graph's tensors always are).
pub fn dequantize_block(format: QuantFormat, block: &[u8], out: &mut [f32; BLOCK]) {
    assert_eq!(
        block.len() as u64,
        format.block_bytes(),
        "a {} block",
        format.name()
    );
    match format {
        QuantFormat::Q4_0 => {
            let d = f16_at(block, 0);
            let qs = &block[2..18];
            for (e, o) in out.iter_mut().enumerate() {
                *o = canonical((nibble(qs, e) as i32 - 8) as f32 * d);
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            let qs = &block[4..20];
            for (e, o) in out.iter_mut().enumerate() {
                *o = canonical(d * nibble(qs, e) as f32 + m);
            }
        }
        QuantFormat::Q8_0 => {
            let d = f16_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = canonical((q as i8) as f32 * d);
            }
        }
    }
}

/// The values of consecutive blocks `blocks` (a whole number of them), appended to `out`.
pub fn dequantize_into(format: QuantFormat, blocks: &[u8], out: &mut Vec<f32>) {
    let mut vals = [0.0f32; BLOCK];
    for b in blocks.chunks_exact(format.block_bytes() as usize) {
        dequantize_block(format, b, &mut vals);
        out.extend_from_slice(&vals);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(format: QuantFormat, scales: &[u16], qs: impl Fn(usize) -> u8) -> Vec<u8> {
        let mut b: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let n = format.block_bytes() as usize - b.len();
        b.extend((0..n).map(qs));
        b
    }

    #[test]
    fn each_format_follows_its_formula() {
        let one = f16::from_f32(1.0).to_bits();
        let half = f16::from_f32(0.5).to_bits();
        let mut out = [0.0f32; BLOCK];
        // Q4_0: nibble - 8; low nibbles first.
        let b = block(QuantFormat::Q4_0, &[half], |i| (i as u8) | (0xf << 4));
        dequantize_block(QuantFormat::Q4_0, &b, &mut out);
        for e in 0..16 {
            assert_eq!(out[e], (e as f32 - 8.0) * 0.5);
            assert_eq!(out[e + 16], 3.5);
        }
        // Q4_1: d * q + m.
        let b = block(QuantFormat::Q4_1, &[half, one], |i| 0x30 | (i as u8 & 0xf));
        dequantize_block(QuantFormat::Q4_1, &b, &mut out);
        for e in 0..16 {
            assert_eq!(out[e], 0.5 * e as f32 + 1.0);
            assert_eq!(out[e + 16], 2.5);
        }
        // Q8_0: signed bytes times d.
        let b = block(QuantFormat::Q8_0, &[half], |i| (i as u8).wrapping_sub(16));
        dequantize_block(QuantFormat::Q8_0, &b, &mut out);
        for (e, v) in out.iter().enumerate() {
            assert_eq!(*v, (e as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn hostile_scales_give_ieee_results() {
        let mut out = [0.0f32; BLOCK];
        // inf · 0 is NaN (canonical), inf · q is ±inf: low nibble 8 (0), high nibble 9 (1).
        let b = block(QuantFormat::Q4_0, &[0x7c00], |_| 0x98);
        dequantize_block(QuantFormat::Q4_0, &b, &mut out);
        assert_eq!(out[0].to_bits(), 0x7fc0_0000);
        assert_eq!(out[16], f32::INFINITY);
        // A NaN scale with a payload: the canonical NaN.
        let b = block(QuantFormat::Q8_0, &[0x7e01], |_| 1);
        dequantize_block(QuantFormat::Q8_0, &b, &mut out);
        assert!(out.iter().all(|v| v.to_bits() == 0x7fc0_0000));
        // The smallest f16 denormal is an exact f32.
        let b = block(QuantFormat::Q4_1, &[0x0001, 0x8000], |_| 0x11);
        dequantize_block(QuantFormat::Q4_1, &b, &mut out);
        assert!(out.iter().all(|&v| v == 2f32.powi(-24)));
    }
}
