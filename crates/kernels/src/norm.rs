//! Layer and RMS normalisation over contiguous rows, vectorised, with the reference's bits.
//!
//! Both sums follow the reference's 16-lane order (one AVX-512 register accumulated front to
//! back, the last block masked, then folded 8, 4, 2, 1); the per-element finish is the same
//! sequence of IEEE operations as `tenet_reference::layer_norm_row` / `rms_norm_row`, lane by
//! lane. Computed NaNs are stored canonical (docs/OPS.md). AVX2 keeps the 16 lanes in two
//! registers; the portable level runs the reference's own code.

use crate::SimdLevel;

/// The affine part of a layer norm: optional per-column scale and shift.
#[derive(Clone, Copy)]
pub struct Affine<'a> {
    pub gamma: Option<&'a [f32]>,
    pub beta: Option<&'a [f32]>,
}

/// Layer norm of one row into `out` (`gamma`/`beta`, when given, as long as the row).
pub fn layer_norm_row(
    level: SimdLevel,
    row: &[f32],
    affine: Affine<'_>,
    eps: f32,
    out: &mut [f32],
) {
    check(row, affine.gamma, affine.beta, out);
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has; the lengths were checked.
        SimdLevel::Avx512 => unsafe { x86::layer_norm(row, affine, eps, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { avx2::layer_norm(row, affine, eps, out) },
        _ => {
            tenet_reference::layer_norm_row(row, affine.gamma, affine.beta, eps, out);
            crate::simd::canonical_nans(out);
        }
    }
}

/// RMS norm of one row into `out` (`gamma`, when given, as long as the row).
pub fn rms_norm_row(
    level: SimdLevel,
    row: &[f32],
    gamma: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) {
    check(row, gamma, None, out);
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx512 => unsafe { x86::rms_norm(row, gamma, eps, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { avx2::rms_norm(row, gamma, eps, out) },
        _ => {
            tenet_reference::rms_norm_row(row, gamma, eps, out);
            crate::simd::canonical_nans(out);
        }
    }
}

fn check(row: &[f32], gamma: Option<&[f32]>, beta: Option<&[f32]>, out: &[f32]) {
    let n = row.len();
    assert!(
        out.len() == n && gamma.is_none_or(|g| g.len() == n) && beta.is_none_or(|b| b.len() == n),
        "a row, its output, gamma and beta must have the same length"
    );
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Affine;

    /// Lanes `0..len` (at most 16) of a block: the mask and the masked load (zeros elsewhere).
    ///
    /// # Safety
    /// `p` points at `len.min(16)` readable floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn block(p: *const f32, len: usize) -> (__mmask16, __m512) {
        let mask = crate::simd::mask16(len);
        // SAFETY: the mask enables only the lanes the caller guarantees readable.
        (mask, unsafe { _mm512_maskz_loadu_ps(mask, p) })
    }

    /// The reference's ordered sum of `f(x_j)` over the row.
    #[target_feature(enable = "avx512f")]
    fn sum(row: &[f32], f: impl Fn(__m512) -> __m512) -> f32 {
        let mut acc = _mm512_setzero_ps();
        for j in (0..row.len()).step_by(16) {
            // SAFETY: `row.len() - j` floats from `j` are inside `row`.
            let (mask, v) = unsafe { block(row.as_ptr().add(j), row.len() - j) };
            acc = _mm512_mask_add_ps(acc, mask, acc, f(v));
        }
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` holds 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
        tenet_reference::fold_lanes(lanes)
    }

    /// `out_j = g((x_j), j)` over the row, 16 lanes at a time, computed NaNs canonical; `g`
    /// gets the block's start.
    #[target_feature(enable = "avx512f")]
    fn map(row: &[f32], out: &mut [f32], g: impl Fn(__m512, usize, __mmask16) -> __m512) {
        for j in (0..row.len()).step_by(16) {
            // SAFETY: `row.len() - j` floats from `j` are inside `row` and `out` (same length).
            unsafe {
                let (mask, v) = block(row.as_ptr().add(j), row.len() - j);
                let y = crate::simd::canonical16(g(v, j, mask));
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), mask, y);
            }
        }
    }

    /// # Safety
    /// The CPU supports AVX-512F; `out`, `gamma` and `beta` are as long as `row`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn layer_norm(row: &[f32], affine: Affine<'_>, eps: f32, out: &mut [f32]) {
        let n = row.len() as f32;
        let mean = sum(row, |v| v) / n;
        let mv = _mm512_set1_ps(mean);
        let var = sum(row, |v| {
            let d = _mm512_sub_ps(v, mv);
            _mm512_mul_ps(d, d)
        }) / n;
        let r = _mm512_set1_ps(1.0 / (var + eps).sqrt());
        map(row, out, |v, j, mask| {
            let mut y = _mm512_mul_ps(_mm512_sub_ps(v, mv), r);
            if let Some(g) = affine.gamma {
                // SAFETY: gamma is as long as the row; the mask covers lanes inside it.
                y = _mm512_mul_ps(y, unsafe { _mm512_maskz_loadu_ps(mask, g.as_ptr().add(j)) });
            }
            if let Some(b) = affine.beta {
                // SAFETY: as for gamma.
                y = _mm512_add_ps(y, unsafe { _mm512_maskz_loadu_ps(mask, b.as_ptr().add(j)) });
            }
            y
        });
    }

    /// # Safety
    /// The CPU supports AVX-512F; `out` and `gamma` are as long as `row`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rms_norm(row: &[f32], gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
        let ms = sum(row, |v| _mm512_mul_ps(v, v)) / row.len() as f32;
        let r = _mm512_set1_ps(1.0 / (ms + eps).sqrt());
        map(row, out, |v, j, mask| {
            let y = _mm512_mul_ps(v, r);
            match gamma {
                // SAFETY: gamma is as long as the row; the mask covers lanes inside it.
                Some(g) => {
                    _mm512_mul_ps(y, unsafe { _mm512_maskz_loadu_ps(mask, g.as_ptr().add(j)) })
                }
                None => y,
            }
        });
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Affine;
    use crate::simd::{canonical8, mask8};

    /// Lanes `0..len` (at most 8) from `p`, zeros elsewhere, and their mask.
    ///
    /// # Safety
    /// `p` points at `len.min(8)` readable floats.
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const f32, len: usize) -> (__m256i, __m256) {
        let mask = mask8(len);
        // SAFETY: the mask enables only the lanes the caller guarantees readable.
        (mask, unsafe { _mm256_maskload_ps(p, mask) })
    }

    /// The reference's ordered sum of `f(x_j)` over the row: its 16 lanes as two registers
    /// (lanes 0–7 and 8–15), a lane outside the row's last block left as it was (adding zero
    /// would turn a −0 into +0), then the reference's fold.
    #[target_feature(enable = "avx2,fma")]
    fn sum(row: &[f32], f: impl Fn(__m256) -> __m256) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        for j in (0..row.len()).step_by(16) {
            for (h, a) in acc.iter_mut().enumerate() {
                let at = j + 8 * h;
                if at >= row.len() {
                    break;
                }
                // SAFETY: `row.len() - at` floats from `at` are inside `row`.
                let (mask, v) = unsafe { load(row.as_ptr().add(at), row.len() - at) };
                *a = _mm256_blendv_ps(*a, _mm256_add_ps(*a, f(v)), _mm256_castsi256_ps(mask));
            }
        }
        let mut lanes = [0.0f32; 16];
        // SAFETY: `lanes` holds 16 floats.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        }
        tenet_reference::fold_lanes(lanes)
    }

    /// `out_j = g(x_j, j, mask)` over the row, 8 lanes at a time, computed NaNs canonical.
    #[target_feature(enable = "avx2,fma")]
    fn map(row: &[f32], out: &mut [f32], g: impl Fn(__m256, usize, __m256i) -> __m256) {
        for j in (0..row.len()).step_by(8) {
            // SAFETY: `row.len() - j` floats from `j` are inside `row` and `out` (same length).
            unsafe {
                let (mask, v) = load(row.as_ptr().add(j), row.len() - j);
                _mm256_maskstore_ps(out.as_mut_ptr().add(j), mask, canonical8(g(v, j, mask)));
            }
        }
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA; `out`, `gamma` and `beta` are as long as `row`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn layer_norm(row: &[f32], affine: Affine<'_>, eps: f32, out: &mut [f32]) {
        let n = row.len() as f32;
        let mean = sum(row, |v| v) / n;
        let mv = _mm256_set1_ps(mean);
        let var = sum(row, |v| {
            let d = _mm256_sub_ps(v, mv);
            _mm256_mul_ps(d, d)
        }) / n;
        let r = _mm256_set1_ps(1.0 / (var + eps).sqrt());
        map(row, out, |v, j, mask| {
            let mut y = _mm256_mul_ps(_mm256_sub_ps(v, mv), r);
            if let Some(g) = affine.gamma {
                // SAFETY: gamma is as long as the row; the mask covers lanes inside it.
                y = _mm256_mul_ps(y, unsafe { _mm256_maskload_ps(g.as_ptr().add(j), mask) });
            }
            if let Some(b) = affine.beta {
                // SAFETY: as for gamma.
                y = _mm256_add_ps(y, unsafe { _mm256_maskload_ps(b.as_ptr().add(j), mask) });
            }
            y
        });
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA; `out` and `gamma` are as long as `row`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rms_norm(row: &[f32], gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
        let ms = sum(row, |v| _mm256_mul_ps(v, v)) / row.len() as f32;
        let r = _mm256_set1_ps(1.0 / (ms + eps).sqrt());
        map(row, out, |v, j, mask| {
            let y = _mm256_mul_ps(v, r);
            match gamma {
                // SAFETY: gamma is as long as the row; the mask covers lanes inside it.
                Some(g) => _mm256_mul_ps(y, unsafe { _mm256_maskload_ps(g.as_ptr().add(j), mask) }),
                None => y,
            }
        });
    }
}
