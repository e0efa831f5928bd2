//! `qmatmul_q8`'s kernel for CPUs with AVX-512 VNNI (Intel since Ice Lake, AMD since Zen 4):
//! 16 weight rows at a time, one row in each 32-bit lane of a 512-bit register, and one
//! `vpdpbusd` for every 4 weights of the 16 rows.
//!
//! The layout is the AVX2 kernel's, twice as wide: a block's bytes of 16 rows are turned (a
//! 4 × 4 dword transpose in each 128-bit lane) so that each register holds one 4-byte piece of
//! every row, lane r row r. `vpdpbusd` multiplies a piece's 4 unsigned bytes by the activation
//! block's matching 4 signed bytes (broadcast) and adds the 4 products to the lane's 32-bit
//! sum, exactly, with no 16-bit step to saturate: 8 of them leave row r's block sum in lane r,
//! where the AVX2 kernel spends 8 `vpmaddubsw`, 7 16-bit adds and a `vpmaddwd` on 8 rows.
//! Signed weights (Q8_0) are offset by 128 to make them unsigned, and the offset's share,
//! `128 · Q`, is taken off again, as Q4_0's `8 · Q` is. The sums are the same integers, and the
//! f32 steps after them the same operations in the same order, so the bits are the AVX2
//! kernel's and the reference's (the kernels' suites run at every level this CPU has).

use std::arch::x86_64::*;

use super::{PASS, Rounded, Spread, avx2::Q4_0, avx2::Q4_1, avx2::Q8_0, passes};
use crate::simd::canonical16;

/// Groups of 16 weight rows ahead that the kernel prefetches.
const AHEAD: usize = 1;

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// `cols` (a multiple of 16) weight rows of `rows` times every rounded row of `r` (`m` of
/// them) into C from `c` (row stride `c_rs`).
///
/// # Safety
/// [`available`] said yes; `rows` holds `cols` rows of `row_bytes`, each `r.k / 32` blocks of
/// `format`; `c` points at `m` rows of `cols` writable values, `c_rs` apart, that no other
/// thread touches meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    format: super::QuantFormat,
    rows: &[u8],
    row_bytes: usize,
    cols: usize,
    r: &Rounded,
    m: usize,
    c: *mut f32,
    c_rs: usize,
) {
    use super::QuantFormat as Format;
    // SAFETY: the caller's, passed on.
    unsafe {
        match format {
            Format::Q4_0 => kernel::<Q4_0>(rows, row_bytes, cols, r, m, c, c_rs),
            Format::Q4_1 => kernel::<Q4_1>(rows, row_bytes, cols, r, m, c, c_rs),
            Format::Q8_0 => kernel::<Q8_0>(rows, row_bytes, cols, r, m, c, c_rs),
        }
    }
}

/// [`tile`] for format `F`: each group of 16 weight rows times the rows of A in [`passes`].
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn kernel<const F: u8>(
    rows: &[u8],
    row_bytes: usize,
    cols: usize,
    r: &Rounded,
    m: usize,
    c: *mut f32,
    c_rs: usize,
) {
    let base = rows.as_ptr();
    let step = row_bytes as i32;
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(step),
    );
    for g in (0..cols).step_by(16) {
        let group = Group {
            at: base.wrapping_add(g * row_bytes),
            row_bytes,
            offsets,
        };
        let c = c.wrapping_add(g);
        for (i0, rows) in passes(m) {
            // SAFETY: the caller's, for rows g..g + 16 of the weight and i0.. of A and C.
            unsafe {
                match rows {
                    PASS => pass::<F, PASS>(group, r, i0, c, c_rs),
                    4 => pass::<F, 4>(group, r, i0, c, c_rs),
                    2 => pass::<F, 2>(group, r, i0, c, c_rs),
                    _ => pass::<F, 1>(group, r, i0, c, c_rs),
                }
            }
        }
    }
}

/// 16 consecutive weight rows of `row_bytes` from `at`; `offsets` lane r is `r · row_bytes`.
#[derive(Clone, Copy)]
struct Group {
    at: *const u8,
    row_bytes: usize,
    offsets: __m512i,
}

/// The 16 rows' block heads at `at`: their f16 scales as f32 and (Q4_1) their minimums.
///
/// # Safety
/// Each of the 16 rows (`offsets` from `at`) holds 4 bytes at `at`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn heads<const F: u8>(at: *const u8, offsets: __m512i) -> (__m512, __m512) {
    // SAFETY: the caller's: 4 bytes at each row's head.
    let v = unsafe { _mm512_i32gather_epi32::<1>(offsets, at as *const i32) };
    // `vpmovdw` keeps each lane's low 16 bits: the scale.
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    let m = if F == Q4_1 {
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)))
    } else {
        _mm512_setzero_ps()
    };
    (d, m)
}

/// The 16 bytes at `at` of 16 rows `row_bytes` apart, turned: vector c holds bytes
/// `4c .. 4c + 4` of every row, lane r row r.
///
/// # Safety
/// Each of the 16 rows holds 16 bytes at `at`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn turned(at: *const u8, row_bytes: usize) -> [__m512i; 4] {
    // SAFETY: the caller's: 16 bytes at each row.
    let row = |i: usize| unsafe { _mm_loadu_si128(at.add(i * row_bytes) as *const __m128i) };
    // Rows t, t + 4, t + 8 and t + 12 in the four 128-bit lanes of register t.
    let r: [__m512i; 4] = std::array::from_fn(|t| {
        let v = _mm512_castsi128_si512(row(t));
        let v = _mm512_inserti32x4::<1>(v, row(t + 4));
        let v = _mm512_inserti32x4::<2>(v, row(t + 8));
        _mm512_inserti32x4::<3>(v, row(t + 12))
    });
    let t0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// Block `at`'s weight integers of the 16 rows as unsigned pieces: `pieces[c]` lane r holds
/// row r's integers `4c .. 4c + 4` (nibbles as they are; Q8_0's signed bytes plus 128).
///
/// # Safety
/// The 16 rows hold a whole block of format `F` at `at`.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn pieces<const F: u8>(at: *const u8, row_bytes: usize) -> [__m512i; 8] {
    if F == Q8_0 {
        let flip = _mm512_set1_epi8(-128);
        // SAFETY: the caller's: 32 bytes after each row's 2-byte scale.
        let (first, second) =
            unsafe { (turned(at.add(2), row_bytes), turned(at.add(18), row_bytes)) };
        std::array::from_fn(|c| {
            _mm512_xor_si512(if c < 4 { first[c] } else { second[c - 4] }, flip)
        })
    } else {
        let nibbles = if F == Q4_1 { 4 } else { 2 };
        // SAFETY: the caller's: 16 bytes of nibbles after each row's head.
        let p = unsafe { turned(at.add(nibbles), row_bytes) };
        let low = _mm512_set1_epi8(0x0f);
        // Bytes 0..16 of a block are the low nibbles of its 16 bytes, 16..32 the high ones.
        std::array::from_fn(|c| {
            if c < 4 {
                _mm512_and_si512(p[c], low)
            } else {
                _mm512_and_si512(_mm512_srli_epi32::<4>(p[c - 4]), low)
            }
        })
    }
}

/// Rows `i0 .. i0 + P` of A times the 16 weight rows of `w`, into C's rows from
/// `c + i0 · c_rs` (16 columns each); the first pass prefetches the group [`AHEAD`] on, a few
/// lines each block step, as the AVX2 kernel does.
///
/// # Safety
/// [`available`] said yes; `w` holds 16 whole rows of `r.k / 32` blocks of format `F`; rows
/// `i0 .. i0 + P` exist in `r`, and C's 16 values at each are writable and touched by no other
/// thread meanwhile.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn pass<const F: u8, const P: usize>(
    w: Group,
    r: &Rounded,
    i0: usize,
    c: *mut f32,
    c_rs: usize,
) {
    let nb = r.blocks();
    let bb = match F {
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 34,
    };
    let ahead = w.at.wrapping_add(AHEAD * 16 * w.row_bytes);
    let mut spread = Spread::new((16 * w.row_bytes).div_ceil(64), nb);
    let mut acc = [_mm512_setzero_ps(); P];
    for b in 0..nb {
        if i0 == 0 {
            for line in spread.next_step() {
                // Prefetching never faults, wherever the address points.
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
            }
        }
        let at = w.at.wrapping_add(b * bb);
        // SAFETY: the 16 rows are whole rows (the caller's), each with block b at `b * bb`.
        let (d_w, m_w) = unsafe { heads::<F>(at, w.offsets) };
        // SAFETY: as above.
        let pieces = unsafe { pieces::<F>(at, w.row_bytes) };
        for (p, a) in acc.iter_mut().enumerate() {
            let xb = r.at(i0 + p, b);
            let x = xb.q.as_ptr();
            // SAFETY: a block's integers are 32 bytes.
            let word = |at: usize| unsafe {
                _mm512_set1_epi32((x.add(at) as *const i32).read_unaligned())
            };
            // Two chains of 4, so that the adds do not wait on each other.
            let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pieces[0], word(0));
            let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pieces[4], word(16));
            for c in 1..4 {
                s0 = _mm512_dpbusd_epi32(s0, pieces[c], word(4 * c));
                s1 = _mm512_dpbusd_epi32(s1, pieces[4 + c], word(16 + 4 * c));
            }
            let mut s = _mm512_add_epi32(s0, s1);
            if F == Q4_0 {
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * xb.sum));
            } else if F == Q8_0 {
                s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * xb.sum));
            }
            let scale = _mm512_mul_ps(d_w, _mm512_set1_ps(xb.d));
            *a = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), *a);
            if F == Q4_1 {
                // `d · Q` rounded once, as the reference's step.
                *a = _mm512_fmadd_ps(m_w, _mm512_set1_ps(r.dq(i0 + p, b)), *a);
            }
        }
    }
    for (p, a) in acc.iter().enumerate() {
        // SAFETY: the caller's: row i0 + p of C has 16 writable values from `c`.
        unsafe { _mm512_storeu_ps(c.add((i0 + p) * c_rs), canonical16(*a)) };
    }
}
