//! Softmax and log-softmax over contiguous rows, vectorised, with the reference's bits.
//!
//! The row maximum uses a total-order integer key (so `+0 > −0` and NaN is tracked apart, as
//! `fmax` defines); `exp` evaluates the scalar function's exact operation sequence in SIMD
//! lanes; the sum is the reference's 16-lane order, which is one AVX-512 register (or two AVX2
//! registers) accumulated front to back and then folded 8, 4, 2, 1.

use tenet_reference::math::{self, NAN};

use crate::SimdLevel;

/// Softmax (`log = false`) or log-softmax of each `n`-element row of `x` into `out`.
pub fn softmax_rows(level: SimdLevel, log: bool, x: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output rows differ in size");
    if n == 0 {
        return;
    }
    // Every path stores computed NaNs as the canonical NaN (docs/OPS.md).
    #[cfg(target_arch = "x86_64")]
    if !log && level.or_supported() == SimdLevel::Avx512 {
        assert_eq!(
            x.len() % n,
            0,
            "softmax rows of {n} elements, and a partial one"
        );
        // SAFETY: the CPU has AVX-512F; `x` and `out` have the same length, a multiple of `n`.
        unsafe { x86::rows_pipelined_avx512(x, n, out) };
        return;
    }
    for (row, o) in x.chunks(n).zip(out.chunks_mut(n)) {
        match level.or_supported() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `or_supported` returned a level this CPU has.
            SimdLevel::Avx512 => unsafe { x86::log_row_avx512(row, o) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2 => unsafe { x86::row_avx2(log, row, o) },
            _ => {
                scalar_row(log, row, o);
                crate::simd::canonical_nans(o);
            }
        }
    }
}

/// `(x − m) − log(s)` for every element, NaNs canonical: the log-softmax finish of the SIMD rows.
#[cfg(target_arch = "x86_64")]
fn log_softmax_tail(row: &[f32], m: f32, s: f32, out: &mut [f32]) {
    let ls = math::log(s);
    for (o, &x) in out.iter_mut().zip(row) {
        *o = crate::simd::canonical((x - m) - ls);
    }
}

/// The reference's definition, element by element.
fn scalar_row(log: bool, row: &[f32], out: &mut [f32]) {
    tenet_reference::softmax_or_log_row(log, row, out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::simd::mask16 as lanes;
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
        let mask = lanes(len);
        // SAFETY: the mask enables only the `len` lanes the caller guarantees readable.
        unsafe { _mm512_mask_loadu_ps(fill, mask, p) }
    }

    /// Log-softmax of one row (softmax rows go through `rows_pipelined_avx512`).
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `row` and `out` have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn log_row_avx512(row: &[f32], out: &mut [f32]) {
        let n = row.len();
        // 1. The maximum under fmax's rules: any NaN → NaN; otherwise the total-order maximum.
        // SAFETY: `row` holds `n` floats.
        let m = unsafe { row_max(row.as_ptr(), n) };
        // 2. e_j = exp(x_j − m), summed in the 16-lane order (only the sum is kept).
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        for j in (0..n).step_by(16) {
            let len = (n - j).min(16);
            // SAFETY: `len` floats from `j` are inside `row`.
            let v = unsafe { load(row.as_ptr().add(j), len, _mm512_setzero_ps()) };
            acc = _mm512_mask_add_ps(acc, lanes(len), acc, exp16(_mm512_sub_ps(v, mv)));
        }
        // 3. (x − m) − log(sum).
        log_softmax_tail(row, m, fold16(acc), out);
    }

    /// The reference's fold of 16 lane sums (`l += l + 8`, then 4, 2, 1), in registers.
    #[target_feature(enable = "avx512f")]
    fn fold16(acc: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(acc);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let v8 = _mm256_add_ps(lo, hi);
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
        _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2)))
    }

    /// One block of a row maximum under fmax's rules (any NaN → NaN, otherwise the
    /// total-order maximum), at `p`.
    ///
    /// # Safety
    /// `p` points at `len ≤ 16` readable floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn max_step(p: *const f32, len: usize, best: &mut __m512i, any_nan: &mut u16) {
        let mask = lanes(len);
        // SAFETY: as the caller guarantees.
        let v = unsafe { load(p, len, _mm512_setzero_ps()) };
        let nan = _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(mask, v, v);
        *any_nan |= nan;
        *best = _mm512_mask_max_epi32(*best, mask & !nan, *best, key(_mm512_castps_si512(v)));
    }

    /// The maximum of the `n` floats at `p`, under fmax's rules.
    ///
    /// # Safety
    /// `p` points at `n` readable floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn row_max(p: *const f32, n: usize) -> f32 {
        let (mut best, mut any_nan) = (_mm512_set1_epi32(i32::MIN), 0u16);
        for j in (0..n).step_by(16) {
            // SAFETY: `min(16, n − j)` floats from `j` are readable (the caller's guarantee).
            unsafe { max_step(p.add(j), (n - j).min(16), &mut best, &mut any_nan) };
        }
        max_finish(best, any_nan)
    }

    /// The row maximum from `max_step`'s state: NaN if any lane saw one.
    #[target_feature(enable = "avx512f")]
    fn max_finish(best: __m512i, any_nan: u16) -> f32 {
        if any_nan != 0 {
            return NAN;
        }
        let b = _mm512_reduce_max_epi32(best);
        // `key` on one lane: the map is its own inverse.
        f32::from_bits((b ^ (((b >> 31) as u32) >> 1) as i32) as u32)
    }

    /// Softmax of every `n`-element row of `x`, software-pipelined over rows: one pass over
    /// the columns finds row t+1's maximum, row t's exponentials and their sum, and divides
    /// row t−1 by its sum, so the divider (the slowest unit here) runs beside the
    /// exponentials' multiply-adds instead of after them. Each row's bits are the reference's.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `x` and `out` have the same length, a multiple of `n > 0`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rows_pipelined_avx512(x: &[f32], n: usize, out: &mut [f32]) {
        let rows = x.len() / n;
        if rows == 0 {
            return;
        }
        let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
        // SAFETY: row 0 holds `n` floats.
        let mut m_next = unsafe { row_max(xp, n) };
        // The sum of the row before, whose division is still to come.
        let mut pending: Option<f32> = None;
        for t in 0..rows {
            let mv = _mm512_set1_ps(m_next);
            let next = t + 1 < rows;
            let (mut best, mut any_nan) = (_mm512_set1_epi32(i32::MIN), 0u16);
            let mut acc = _mm512_setzero_ps();
            let sv = _mm512_set1_ps(pending.unwrap_or(1.0));
            for j in (0..n).step_by(16) {
                let len = (n - j).min(16);
                let mask = lanes(len);
                // SAFETY: rows t − 1, t and t + 1 (when they exist) have `len` floats at j, in
                // `x` and `out` alike.
                unsafe {
                    if next {
                        max_step(xp.add((t + 1) * n + j), len, &mut best, &mut any_nan);
                    }
                    let at = t * n + j;
                    let e = exp16(_mm512_sub_ps(
                        load(xp.add(at), len, _mm512_setzero_ps()),
                        mv,
                    ));
                    _mm512_mask_storeu_ps(op.add(at), mask, e);
                    acc = _mm512_mask_add_ps(acc, mask, acc, e);
                    if pending.is_some() {
                        divide_step(op.add(at - n), len, sv);
                    }
                }
            }
            if next {
                m_next = max_finish(best, any_nan);
            }
            pending = Some(fold16(acc));
        }
        let sv = _mm512_set1_ps(pending.unwrap_or(1.0));
        for j in (0..n).step_by(16) {
            // SAFETY: the last row has min(16, n − j) floats at j.
            unsafe { divide_step(op.add((rows - 1) * n + j), (n - j).min(16), sv) };
        }
    }

    /// `p[i] /= s` over one block, computed NaNs canonical.
    ///
    /// # Safety
    /// `p` points at `len ≤ 16` readable and writable floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn divide_step(p: *mut f32, len: usize, sv: __m512) {
        let mask = lanes(len);
        // SAFETY: as the caller guarantees.
        unsafe {
            let y = _mm512_div_ps(load(p, len, _mm512_set1_ps(1.0)), sv);
            _mm512_mask_storeu_ps(p, mask, crate::simd::canonical16(y));
        }
    }

    /// Signed total-order key in 8 lanes (see `key`).
    #[target_feature(enable = "avx2,fma")]
    fn key8(v: __m256i) -> __m256i {
        _mm256_xor_si256(v, _mm256_srli_epi32::<1>(_mm256_srai_epi32::<31>(v)))
    }

    /// The reference's softmax or log-softmax row, 8 lanes at a time: the 16 summation lanes are two
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
                *o = crate::simd::canonical(*o / s);
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
