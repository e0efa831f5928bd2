//! The few-row product (`small_m`: a decoded token's rows times a weight) with AVX2: each lane
//! carries one column's unbroken fma chain along k, the chain `dot_rows` computes, so the bits
//! are those of every other level.

use std::arch::x86_64::*;

use super::Strided;
use super::x86::a_by_step;
use crate::simd::{canonical8, mask8};

/// The most values of B (k × columns) that [`small_m_avx2`] prefetches all at once.
const PREFETCH_ALL: usize = 16 << 10;

/// How far ahead (in values) `transposed` prefetches each of its eight rows.
const ROW_PREFETCH: usize = 128;

/// `out` (m rows of `w` columns, row-major) = rows `0..m` of A times columns `j0..j0 + w` of B,
/// for a B whose columns are contiguous (a transposed weight, `rs == 1`) or whose rows are
/// (`cs == 1`); `false`, with nothing written, for any other B.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `1 <= m <= 4`; A holds rows `0..m` × `k` columns and B `k`
/// rows × columns `0..j0 + w` at their strides (as `sgemm` checks).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn small_m_avx2(
    m: usize,
    j0: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    out: &mut [f32],
) -> bool {
    let w = out.len() / m.max(1);
    // A small B (attention's keys and values: a layer's cache, which the weights streamed
    // since its last use have pushed out of cache) is read as a few short streams the
    // hardware fetches one miss at a time: ask for all of its lines at once first.
    if k * w <= PREFETCH_ALL && (b.rs == 1 || b.cs == 1) {
        let (along, across, step) = if b.rs == 1 {
            (k, w, b.cs)
        } else {
            (w, k, b.rs)
        };
        let first = if b.rs == 1 { j0 * b.cs } else { j0 };
        for line in 0..across {
            let at = b.data.as_ptr().wrapping_add(first + line * step);
            for v in (0..along).step_by(16) {
                // Prefetching never faults, wherever the address points.
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(v) as *const i8);
            }
        }
    }
    if b.rs == 1 && b.cs != 1 {
        match m {
            1 => transposed::<1>(j0, k, a, b, out),
            2 => transposed::<2>(j0, k, a, b, out),
            3 => transposed::<3>(j0, k, a, b, out),
            _ => transposed::<4>(j0, k, a, b, out),
        }
    } else if b.cs == 1 {
        // Enough columns side by side that the fma chains hide their latency, few enough that
        // accumulators and a row of B fit the 16 registers.
        match m {
            1 => contiguous::<1, 8>(j0, k, a, b, out),
            2 => contiguous::<2, 4>(j0, k, a, b, out),
            3 => contiguous::<3, 3>(j0, k, a, b, out),
            _ => contiguous::<4, 2>(j0, k, a, b, out),
        }
    } else {
        return false;
    }
    true
}

/// Transpose 8×8 in registers: afterwards `r[q]` lane `l` is what `r[l]` lane `q` was.
#[target_feature(enable = "avx2")]
fn transpose8(r: &mut [__m256; 8]) {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (x, y) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(x, y)
        } else {
            _mm256_unpackhi_ps(x, y)
        }
    });
    // s[4h + q], 128-bit half H: column 4H + q of rows 4h..4h+4.
    let s: [__m256; 8] = std::array::from_fn(|i| {
        let (h, q) = (i / 4, i % 4);
        let (x, y) = (t[4 * h + q / 2], t[4 * h + 2 + q / 2]);
        if q % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(x, y)
        } else {
            _mm256_shuffle_ps::<0xEE>(x, y)
        }
    });
    for q in 0..4 {
        r[q] = _mm256_permute2f128_ps::<0x20>(s[q], s[4 + q]);
        r[4 + q] = _mm256_permute2f128_ps::<0x31>(s[q], s[4 + q]);
    }
}

/// B's columns contiguous: 8 columns at a time, each read along its row 8 steps at once and
/// turned into 8 step vectors by a register transpose, so memory is read whole lines.
#[target_feature(enable = "avx2,fma")]
fn transposed<const M: usize>(
    j0: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    out: &mut [f32],
) {
    let w = out.len() / M;
    let arows = a_by_step(M, k, a);
    for jb in (0..w).step_by(8) {
        let cols = (w - jb).min(8);
        let mut acc = [_mm256_setzero_ps(); M];
        for p in (0..k).step_by(8) {
            let steps = (k - p).min(8);
            let mask = mask8(steps);
            let mut r = [_mm256_setzero_ps(); 8];
            for (l, x) in r.iter_mut().enumerate().take(cols) {
                let row = &b.data[(j0 + jb + l) * b.cs + p..][..steps];
                // Eight rows are read side by side, more streams than the hardware prefetchers
                // follow well: fetch each a few lines ahead (prefetching never faults).
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(ROW_PREFETCH) as *const i8);
                // SAFETY: the mask reads exactly the `steps` values of `row`.
                *x = unsafe { _mm256_maskload_ps(row.as_ptr(), mask) };
            }
            transpose8(&mut r);
            let xs = &arows[p * M..(p + steps) * M];
            let mut chains = |steps: usize| {
                for (q, &col) in r.iter().enumerate().take(steps) {
                    for (i, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_fmadd_ps(_mm256_set1_ps(xs[q * M + i]), col, *x);
                    }
                }
            };
            // A constant count for whole blocks keeps the loop fixed and `acc` in registers.
            if steps == 8 { chains(8) } else { chains(steps) }
        }
        let keep = mask8(cols);
        for (i, &x) in acc.iter().enumerate() {
            let dst = &mut out[i * w + jb..i * w + jb + cols];
            // SAFETY: the mask writes exactly the `cols` values of `dst`.
            unsafe { _mm256_maskstore_ps(dst.as_mut_ptr(), keep, canonical8(x)) };
        }
    }
}

/// B's rows contiguous: `V` vectors of 8 adjacent columns advance together, one load each per
/// step.
#[target_feature(enable = "avx2,fma")]
fn contiguous<const M: usize, const V: usize>(
    j0: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    out: &mut [f32],
) {
    let w = out.len() / M;
    let arows = a_by_step(M, k, a);
    for jb in (0..w).step_by(8 * V) {
        let cols = (w - jb).min(8 * V);
        let lanes: [usize; V] = std::array::from_fn(|v| cols.saturating_sub(8 * v).min(8));
        let masks: [__m256i; V] = std::array::from_fn(|v| mask8(lanes[v]));
        let full = cols == 8 * V;
        let mut acc = [[_mm256_setzero_ps(); V]; M];
        for p in 0..k {
            let row = &b.data[p * b.rs + j0 + jb..][..cols];
            let col: [__m256; V] = std::array::from_fn(|v| {
                if full {
                    // SAFETY: the row holds 8·V values.
                    unsafe { _mm256_loadu_ps(row.as_ptr().add(8 * v)) }
                } else {
                    // SAFETY: the mask reads lanes `8v..8v + lanes[v]` of `row`, inside it; a
                    // vector with no lanes reads nothing.
                    unsafe { _mm256_maskload_ps(row.as_ptr().wrapping_add(8 * v), masks[v]) }
                }
            });
            for (i, acc_row) in acc.iter_mut().enumerate() {
                let ai = _mm256_set1_ps(arows[p * M + i]);
                for (x, &c) in acc_row.iter_mut().zip(&col) {
                    *x = _mm256_fmadd_ps(ai, c, *x);
                }
            }
        }
        for (i, acc_row) in acc.iter().enumerate() {
            let dst = &mut out[i * w + jb..i * w + jb + cols];
            for (v, &x) in acc_row.iter().enumerate() {
                // SAFETY: the mask writes lanes `8v..8v + lanes[v]` of `dst`, inside it.
                unsafe {
                    _mm256_maskstore_ps(
                        dst.as_mut_ptr().wrapping_add(8 * v),
                        masks[v],
                        canonical8(x),
                    )
                };
            }
        }
    }
}
