//! Softmax and log-softmax over contiguous rows, vectorised, with the reference's bits.
//!
//! The row maximum uses a total-order integer key (so `+0 > −0` and NaN is tracked apart, as
//! `fmax` defines); `exp` evaluates the scalar function's exact operation sequence in SIMD
//! lanes; the sum is the reference's 16-lane order, which is one AVX-512 register (or two AVX2
//! registers) accumulated front to back and then folded 8, 4, 2, 1.

use tenet_ir::NormOp;
use tenet_reference::math::{self, NAN};

use crate::SimdLevel;

/// Softmax (`log = false`) or log-softmax of each `n`-element row of `x` into `out`.
pub fn softmax_rows(level: SimdLevel, log: bool, x: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output rows differ in size");
    if n == 0 {
        return;
    }
    // Every path stores computed NaNs as the canonical NaN (docs/OPS.md).
    for (row, o) in x.chunks(n).zip(out.chunks_mut(n)) {
        match level.or_supported() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` returned a level this CPU has.
            SimdLevel::Avx512 => unsafe { x86::row_avx512(log, row, o) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2 => unsafe { x86::row_avx2(log, row, o) },
            _ => {
                scalar_row(log, row, o);
                o.iter_mut().filter(|v| v.is_nan()).for_each(|v| *v = NAN);
            }
        }
    }
}

/// `(x − m) − log(s)` for every element, NaNs canonical: the log-softmax finish of the SIMD rows.
#[cfg(target_arch = "x86_64")]
fn log_softmax_tail(row: &[f32], m: f32, s: f32, out: &mut [f32]) {
    let ls = math::log(s);
    for (o, &x) in out.iter_mut().zip(row) {
        let y = (x - m) - ls;
        *o = if y.is_nan() { NAN } else { y };
    }
}

/// The reference's definition, element by element.
fn scalar_row(log: bool, row: &[f32], out: &mut [f32]) {
    let op = if log {
        NormOp::LogSoftmax
    } else {
        NormOp::Softmax
    };
    tenet_reference::softmax_row(op, row, out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::vmath::x86::{exp8, exp16};

    /// Signed total-order key of float bits: negative floats flip their low 31 bits, so that
    /// signed integer order is float order with −0 below +0. The map is its own inverse.
    #[target_feature(enable = "avx512f")]
    fn key(v: __m512i) -> __m512i {
        _mm512_xor_si512(v, _mm512_srli_epi32::<1>(_mm512_srai_epi32::<31>(v)))
    }

    /// Lanes `0..len` of a 16-lane block starting at `p`, the rest as `fill`.
    ///
    /// # Safety
    /// `p` points at `len ≤ 16` readable floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const f32, len: usize, fill: __m512) -> __m512 {
        let mask: __mmask16 = if len >= 16 { 0xffff } else { (1u16 << len) - 1 };
        // SAFETY: the mask enables only the `len` lanes the caller guarantees readable.
        unsafe { _mm512_mask_loadu_ps(fill, mask, p) }
    }

    /// # Safety
    /// The CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row_avx512(log: bool, row: &[f32], out: &mut [f32]) {
        let n = row.len();
        // 1. The maximum under fmax's rules: any NaN → NaN; otherwise the total-order maximum.
        let (mut best, mut any_nan) = (_mm512_set1_epi32(i32::MIN), 0u16);
        for j in (0..n).step_by(16) {
            let len = (n - j).min(16);
            // SAFETY: `len` floats from `j` are inside `row`.
            let v = unsafe { load(row.as_ptr().add(j), len, _mm512_setzero_ps()) };
            let lanes: __mmask16 = if len >= 16 { 0xffff } else { (1u16 << len) - 1 };
            let nan = _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(lanes, v, v);
            any_nan |= nan;
            best = _mm512_mask_max_epi32(best, lanes & !nan, best, key(_mm512_castps_si512(v)));
        }
        let m = if any_nan != 0 {
            NAN
        } else {
            let mut lanes = [0i32; 16];
            // SAFETY: `lanes` holds 16 i32.
            unsafe {
                _mm512_storeu_si512(
                    lanes.as_mut_ptr().cast(),
                    key(_mm512_set1_epi32(_mm512_reduce_max_epi32(best))),
                )
            };
            f32::from_bits(lanes[0] as u32)
        };
        // 2. e_j = exp(x_j − m) into `out`, summed in the 16-lane order.
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        for j in (0..n).step_by(16) {
            let len = (n - j).min(16);
            let lanes: __mmask16 = if len >= 16 { 0xffff } else { (1u16 << len) - 1 };
            // SAFETY: `len` floats from `j` are inside `row` and `out`.
            unsafe {
                let e = exp16(_mm512_sub_ps(
                    load(row.as_ptr().add(j), len, _mm512_setzero_ps()),
                    mv,
                ));
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), lanes, e);
                acc = _mm512_mask_add_ps(acc, lanes, acc, e);
            }
        }
        let mut a = [0.0f32; 16];
        // SAFETY: `a` holds 16 floats.
        unsafe { _mm512_storeu_ps(a.as_mut_ptr(), acc) };
        let s = tenet_reference::fold_lanes(a);
        // 3. Normalise.
        if log {
            log_softmax_tail(row, m, s, out);
        } else {
            let sv = _mm512_set1_ps(s);
            for j in (0..n).step_by(16) {
                let len = (n - j).min(16);
                let lanes: __mmask16 = if len >= 16 { 0xffff } else { (1u16 << len) - 1 };
                // SAFETY: `len` floats from `j` are inside `out`.
                unsafe {
                    let e = load(out.as_ptr().add(j), len, _mm512_set1_ps(1.0));
                    let y = _mm512_div_ps(e, sv);
                    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
                    let y = _mm512_mask_blend_ps(nan, y, _mm512_set1_ps(NAN));
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), lanes, y);
                }
            }
        }
    }

    /// Signed total-order key in 8 lanes (see `key`).
    #[target_feature(enable = "avx2,fma")]
    fn key8(v: __m256i) -> __m256i {
        _mm256_xor_si256(v, _mm256_srli_epi32::<1>(_mm256_srai_epi32::<31>(v)))
    }

    /// The same row as `row_avx512`, 8 lanes at a time: the 16 summation lanes are two
    /// registers, and elements past the last full block of 16 finish in scalar lanes.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_avx2(log: bool, row: &[f32], out: &mut [f32]) {
        let n = row.len();
        let full8 = n / 8 * 8;
        // 1. Maximum: NaN anywhere → NaN; otherwise the total-order maximum.
        let mut best = _mm256_set1_epi32(i32::MIN);
        let mut any_nan = false;
        for j in (0..full8).step_by(8) {
            // SAFETY: j + 8 <= n.
            let v = unsafe { _mm256_loadu_ps(row.as_ptr().add(j)) };
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
            any_nan |= _mm256_movemask_ps(nan) != 0;
            let k =
                _mm256_blendv_epi8(key8(_mm256_castps_si256(v)), best, _mm256_castps_si256(nan));
            best = _mm256_max_epi32(best, k);
        }
        let mut lanes = [0i32; 8];
        // SAFETY: `lanes` holds 8 i32.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), key8(best)) };
        let mut m = if full8 > 0 {
            lanes
                .iter()
                .map(|&b| f32::from_bits(b as u32))
                .fold(f32::from_bits(lanes[0] as u32), fmax_scalar)
        } else {
            row[0]
        };
        for &v in &row[full8..] {
            m = fmax_scalar(m, v);
        }
        if any_nan {
            m = NAN;
        }
        // 2. Exponentials and the 16-lane sum.
        let mv = _mm256_set1_ps(m);
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let full16 = n / 16 * 16;
        for j in (0..full16).step_by(16) {
            // SAFETY: j + 16 <= n for `row` and `out`.
            unsafe {
                let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(j)), mv));
                let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(j + 8)), mv));
                _mm256_storeu_ps(out.as_mut_ptr().add(j), e0);
                _mm256_storeu_ps(out.as_mut_ptr().add(j + 8), e1);
                lo = _mm256_add_ps(lo, e0);
                hi = _mm256_add_ps(hi, e1);
            }
        }
        let mut a = [0.0f32; 16];
        // SAFETY: `a` holds 16 floats.
        unsafe {
            _mm256_storeu_ps(a.as_mut_ptr(), lo);
            _mm256_storeu_ps(a.as_mut_ptr().add(8), hi);
        }
        for j in full16..n {
            let e = math::exp(row[j] - m);
            out[j] = e;
            a[j % 16] += e;
        }
        let s = tenet_reference::fold_lanes(a);
        // 3. Normalise.
        if log {
            log_softmax_tail(row, m, s, out);
        } else {
            let sv = _mm256_set1_ps(s);
            for j in (0..full8).step_by(8) {
                // SAFETY: j + 8 <= n.
                unsafe {
                    let y = _mm256_div_ps(_mm256_loadu_ps(out.as_ptr().add(j)), sv);
                    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
                    _mm256_storeu_ps(
                        out.as_mut_ptr().add(j),
                        _mm256_blendv_ps(y, _mm256_set1_ps(NAN), nan),
                    );
                }
            }
            for o in &mut out[full8..] {
                let y = *o / s;
                *o = if y.is_nan() { NAN } else { y };
            }
        }
    }

    /// fmax of docs/OPS.md on two values (NaN absorbs; +0 above −0).
    fn fmax_scalar(a: f32, b: f32) -> f32 {
        if a.is_nan() || b.is_nan() {
            NAN
        } else if a > b || (a == b && a.is_sign_positive()) {
            a
        } else {
            b
        }
    }
}
