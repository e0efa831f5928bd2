//! Elementwise arithmetic that writes its result around the caches.
//!
//! An ordinary store first reads the line it fills (to own it), so a pass that writes a large
//! result it never reads moves a quarter more memory than it needs to (x*y+z over 64 MiB
//! operands: three streams read, one written, and one read for the writes). Non-temporal
//! stores skip that read and leave the caches to the operands. They suit results too large to
//! stay in cache for whoever reads them next; the caller decides which those are.
//!
//! The values are those of [`crate::vmath::arith_slice`], bit for bit: only the stores differ.

use crate::SimdLevel;
use crate::vmath::Arith;

/// [`crate::vmath::arith_slice`] with non-temporal stores: `out[i] = a[i] op b[i]`, computed
/// NaNs canonical. The stores are complete (fenced) when this returns, so handing `out` to
/// another thread afterwards needs no more than it would after an ordinary store.
pub fn arith_slice(level: SimdLevel, op: Arith, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "operands and output differ in length"
    );
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::arith_avx512(op, a, b, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::arith_avx2(op, a, b, out) },
        // Portable code has no non-temporal store; the values are the same.
        _ => crate::vmath::arith_slice(SimdLevel::Portable, op, a, b, out),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Arith;
    use crate::simd::{canonical8, canonical16, mask8, mask16};

    /// Where the aligned middle of `out` begins and ends, in elements: a non-temporal store
    /// needs an address aligned to its width (`align` bytes, `lanes` floats).
    fn aligned_middle(out: &[f32], align: usize, lanes: usize) -> (usize, usize) {
        let n = out.len();
        // `align_offset` may answer usize::MAX ("cannot"): then everything is head.
        let head = out.as_ptr().align_offset(align).min(n);
        (head, head + (n - head) / lanes * lanes)
    }

    /// # Safety
    /// The CPU supports AVX-512F; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn arith_avx512(op: Arith, a: &[f32], b: &[f32], out: &mut [f32]) {
        match op {
            Arith::Add => stream16(a, b, out, |x, y| _mm512_add_ps(x, y)),
            Arith::Sub => stream16(a, b, out, |x, y| _mm512_sub_ps(x, y)),
            Arith::Mul => stream16(a, b, out, |x, y| _mm512_mul_ps(x, y)),
            Arith::Div => stream16(a, b, out, |x, y| _mm512_div_ps(x, y)),
        }
    }

    #[target_feature(enable = "avx512f")]
    fn stream16(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(__m512, __m512) -> __m512) {
        let n = out.len();
        let (head, end) = aligned_middle(out, 64, 16);
        // The unaligned head and the tail (each under 16 floats, or all of a short slice)
        // through masked ordinary stores.
        let edge = |out: &mut [f32], from: usize, len: usize| {
            for j in (from..from + len).step_by(16) {
                let mask = mask16(from + len - j);
                // SAFETY: the mask enables only lanes below `from + len <= n`, inside all
                // three slices (they have the same length).
                unsafe {
                    let x = _mm512_maskz_loadu_ps(mask, a.as_ptr().add(j));
                    let y = _mm512_maskz_loadu_ps(mask, b.as_ptr().add(j));
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), mask, canonical16(f(x, y)));
                }
            }
        };
        edge(out, 0, head);
        for j in (head..end).step_by(16) {
            // SAFETY: `j + 16 <= end <= n`, inside all three slices; `out + j` is 64-byte
            // aligned (`out + head` is, and each step moves 64 bytes).
            unsafe {
                let x = _mm512_loadu_ps(a.as_ptr().add(j));
                let y = _mm512_loadu_ps(b.as_ptr().add(j));
                _mm512_stream_ps(out.as_mut_ptr().add(j), canonical16(f(x, y)));
            }
        }
        edge(out, end, n - end);
        // Non-temporal stores are weakly ordered: fence them before anything that tells
        // another thread the result is ready.
        _mm_sfence();
    }

    /// # Safety
    /// The CPU supports AVX2; `a`, `b` and `out` have the same length.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn arith_avx2(op: Arith, a: &[f32], b: &[f32], out: &mut [f32]) {
        match op {
            Arith::Add => stream8(a, b, out, |x, y| _mm256_add_ps(x, y)),
            Arith::Sub => stream8(a, b, out, |x, y| _mm256_sub_ps(x, y)),
            Arith::Mul => stream8(a, b, out, |x, y| _mm256_mul_ps(x, y)),
            Arith::Div => stream8(a, b, out, |x, y| _mm256_div_ps(x, y)),
        }
    }

    #[target_feature(enable = "avx2")]
    fn stream8(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(__m256, __m256) -> __m256) {
        let n = out.len();
        let (head, end) = aligned_middle(out, 32, 8);
        let edge = |out: &mut [f32], from: usize, len: usize| {
            for j in (from..from + len).step_by(8) {
                let mask = mask8(from + len - j);
                // SAFETY: the mask enables only lanes below `from + len <= n`, inside all
                // three slices.
                unsafe {
                    let x = _mm256_maskload_ps(a.as_ptr().add(j), mask);
                    let y = _mm256_maskload_ps(b.as_ptr().add(j), mask);
                    _mm256_maskstore_ps(out.as_mut_ptr().add(j), mask, canonical8(f(x, y)));
                }
            }
        };
        edge(out, 0, head);
        for j in (head..end).step_by(8) {
            // SAFETY: `j + 8 <= end <= n`, inside all three slices; `out + j` is 32-byte
            // aligned (`out + head` is, and each step moves 32 bytes).
            unsafe {
                let x = _mm256_loadu_ps(a.as_ptr().add(j));
                let y = _mm256_loadu_ps(b.as_ptr().add(j));
                _mm256_stream_ps(out.as_mut_ptr().add(j), canonical8(f(x, y)));
            }
        }
        edge(out, end, n - end);
        _mm_sfence();
    }
}
