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
//!
//! ## `qmatmul_q8`: activations in 8-bit blocks, integer products
//!
//! `qmatmul_q8` never dequantises. Each row of the activations is cut into blocks of 32 like
//! the weight's, and each block `x` is rounded to integers ([`quantize_activations`]):
//!
//! - `amax` = the largest `|x_e|` (NaN if any `x_e` is NaN), `d` = `amax / 127`, `inv` =
//!   `1 / d` (0 when `d` is 0), each one rounded f32 operation;
//! - `q_e` = `x_e · inv` rounded to the nearest integer, ties to even, clamped to ±127 (0 when
//!   the product is NaN), and `Q` = `Σ q_e` (exact).
//!
//! A weight block's integers are `w_e` = `q − 8` (Q4_0), `q` (Q4_1, its minimum apart) or the
//! signed byte (Q8_0), and the block's dot product `S` = `Σ w_e · q_e` is exact (an integer of
//! at most 19 bits, so exact as an f32 too). An output element is then, over the row's blocks
//! in order, starting from +0:
//!
//! `acc = fma(d_w · d, S, acc)`, and for Q4_1 next `acc = fma(m_w, d · Q, acc)`
//!
//! with `d_w · d` and `d · Q` each one rounded product — the arithmetic llama.cpp's integer
//! dot products do, in one fixed order, so every backend and SIMD level gets these bits.

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

/// One block of activations rounded for `qmatmul_q8` (see the module's header): its scale,
/// its integers and their sum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q8Block {
    pub d: f32,
    pub q: [i8; BLOCK],
    pub sum: i32,
}

/// Round 32 activations to a [`Q8Block`] (the module's header says how).
pub fn quantize_activations(x: &[f32]) -> Q8Block {
    assert_eq!(x.len(), BLOCK, "a block of activations");
    let amax = if x.iter().any(|v| v.is_nan()) {
        f32::NAN
    } else {
        x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    };
    let d = amax / 127.0;
    let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut q = [0i8; BLOCK];
    for (o, &v) in q.iter_mut().zip(x) {
        let r = (v * inv).round_ties_even();
        *o = if r.is_nan() {
            0
        } else {
            r.clamp(-127.0, 127.0) as i8
        };
    }
    let sum = q.iter().map(|&v| v as i32).sum();
    Q8Block { d, q, sum }
}

/// A weight block's integer `e` for `qmatmul_q8`: `q − 8`, `q`, or the signed byte.
fn weight_integer(format: QuantFormat, block: &[u8], e: usize) -> i32 {
    match format {
        QuantFormat::Q4_0 => nibble(&block[2..18], e) as i32 - 8,
        QuantFormat::Q4_1 => nibble(&block[4..20], e) as i32,
        QuantFormat::Q8_0 => block[2 + e] as i8 as i32,
    }
}

/// `acc` after one weight block of `format` and its row's activation block `x`:
/// `fma(d_w · d, S, acc)`, then for Q4_1 `fma(m_w, d · Q, acc)`.
pub fn accumulate_block(format: QuantFormat, block: &[u8], x: &Q8Block, acc: f32) -> f32 {
    assert_eq!(
        block.len() as u64,
        format.block_bytes(),
        "a {} block",
        format.name()
    );
    let s: i32 = (0..BLOCK)
        .map(|e| weight_integer(format, block, e) * x.q[e] as i32)
        .sum();
    let acc = (f16_at(block, 0) * x.d).mul_add(s as f32, acc);
    match format {
        QuantFormat::Q4_1 => f16_at(block, 2).mul_add(x.d * x.sum as f32, acc),
        _ => acc,
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
