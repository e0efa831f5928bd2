//! The quantised product and dequantisation with AVX2, FMA and F16C: the AVX-512 kernels'
//! layout at half the width, 8 weight rows in the 8 lanes (see the parent module's header).
//! Without a 16-entry permute, a nibble is masked and converted instead of looked up.

use std::arch::x86_64::*;

use super::{BLOCK, QuantFormat, TILE, TileArgs, f16_to_f32};
use crate::simd::{canonical8, mask8};

/// One tile (`TILE` weight rows of `t.w`) times one pass of A's rows into C.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; otherwise as `avx512::tile`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(format: QuantFormat, t: &TileArgs<'_>) {
    assert!(t.w.len() >= TILE * t.row_bytes && t.a.len() >= t.nb * BLOCK * t.rows);
    assert!(t.row_bytes == t.nb * format.block_bytes() && t.cols <= TILE);
    macro_rules! run {
        ($kern:ident, $($rows:literal => $groups:literal),*) => {
            match t.rows {
                // SAFETY: the caller's extents (checked above where they can be) and CPU.
                $($rows => unsafe { groups::<$rows, $groups>(t, $kern::<$rows, $groups>) },)*
                _ => unreachable!("AVX2 passes have 1, 2, 4 or 8 rows"),
            }
        };
    }
    match format {
        QuantFormat::Q4_0 => run!(q4_0, 1 => 2, 2 => 2, 4 => 1, 8 => 1),
        QuantFormat::Q4_1 => run!(q4_1, 1 => 2, 2 => 2, 4 => 1, 8 => 1),
        QuantFormat::Q8_0 => run!(q8_0, 1 => 2, 2 => 2, 4 => 1, 8 => 1),
    }
}

/// A kernel: `G` groups of 8 weight rows from `w` (`rs` bytes apart, `nb` blocks each) times
/// `K` rows of A (step-major at `a`), leaving the chains in `acc`.
///
/// `pf` is where the same rows of the next tile start: each block step prefetches its share of
/// them (a prefetch never faults, so any address will do; past W's end it fetches nothing).
/// With `cold` (a part's first tile, which no earlier step prefetched) each block step also
/// prefetches each row two lines ahead of the block it reads.
type Kern<const K: usize, const G: usize> = unsafe fn(
    w: *const u8,
    rs: usize,
    nb: usize,
    a: *const f32,
    acc: &mut [[__m256; G]; K],
    pf: *const u8,
    cold: bool,
);

/// Run `kern` over the tile's groups and store the results.
///
/// # Safety
/// As [`tile`], with `K == t.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups<const K: usize, const G: usize>(t: &TileArgs<'_>, kern: Kern<K, G>) {
    let width = 8 * G;
    for s in (0..t.cols).step_by(width) {
        let mut acc = [[_mm256_setzero_ps(); G]; K];
        // SAFETY: rows s..s + width are inside the tile's TILE rows (a multiple of width);
        // A holds nb·32 steps of K values (the caller's guarantee).
        unsafe {
            kern(
                t.w.as_ptr().add(s * t.row_bytes),
                t.row_bytes,
                t.nb,
                t.a.as_ptr(),
                &mut acc,
                t.w.as_ptr().wrapping_add((TILE + s) * t.row_bytes),
                t.cold,
            )
        };
        for (i, row) in acc.iter().enumerate().take(t.real) {
            for (g, &v) in row.iter().enumerate() {
                let j = s + 8 * g;
                if j < t.cols {
                    // SAFETY: row i < real, columns j..j + min(8, cols - j) < cols: the
                    // caller's part of C.
                    unsafe {
                        _mm256_maskstore_ps(
                            t.c.add(i * t.c_rs + j),
                            mask8(t.cols - j),
                            canonical8(v),
                        )
                    };
                }
            }
        }
        if (t.progress)(width * K * t.nb * BLOCK) {
            return;
        }
    }
}

/// Prefetch share `b` (`bytes` long) of the next tile's rows from `pf`, into L1.
#[inline(always)]
fn prefetch_share(pf: *const u8, b: usize, bytes: usize) {
    let from = pf.wrapping_add(b * bytes);
    for line in (0..bytes).step_by(64) {
        // SAFETY: SSE is in every x86_64 CPU, and prefetching never faults, wherever it points.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(line) as *const i8) };
    }
}

/// Prefetch byte `off` of each of `rows` rows `rs` apart from `w`, into L1.
#[inline(always)]
fn prefetch_rows(w: *const u8, rs: usize, rows: usize, off: usize) {
    for r in 0..rows {
        // SAFETY: SSE is in every x86_64 CPU, and prefetching never faults, wherever it points.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(r * rs + off) as *const i8) };
    }
}

/// Eight 128-bit pieces, `off` bytes into rows `0..8` (`rs` apart) of `w`: register `t` holds
/// rows `t` and `t + 4` in its two 128-bit lanes.
///
/// # Safety
/// Each row `r < 8` has 16 readable bytes at `w + r·rs + off`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows4(w: *const u8, rs: usize, off: usize) -> [__m256i; 4] {
    let mut out = [_mm256_setzero_si256(); 4];
    for (t, o) in out.iter_mut().enumerate() {
        // SAFETY: the caller's guarantee, for rows t and t + 4.
        unsafe {
            let ld = |r: usize| _mm_loadu_si128(w.add(r * rs + off) as *const __m128i);
            *o = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(ld(t)), ld(4 + t));
        }
    }
    out
}

/// The 4 × 4 dword transpose within each 128-bit lane: afterwards register `c` lane `r` is
/// dword `c` of row `r`'s piece.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose4(x: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(x[0], x[1]);
    let t1 = _mm256_unpackhi_epi32(x[0], x[1]);
    let t2 = _mm256_unpacklo_epi32(x[2], x[3]);
    let t3 = _mm256_unpackhi_epi32(x[2], x[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Dword 0 of each row's piece.
#[target_feature(enable = "avx2")]
#[inline]
fn column0(x: [__m256i; 4]) -> __m256i {
    let t0 = _mm256_unpacklo_epi32(x[0], x[1]);
    let t2 = _mm256_unpacklo_epi32(x[2], x[3]);
    _mm256_unpacklo_epi64(t0, t2)
}

/// The f16 in the low half of each lane, as f32 (exact).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn low_f16(h: __m256i) -> __m256 {
    let lo = _mm256_and_si256(h, _mm256_set1_epi32(0xffff));
    // Per 128-bit lane: the four halves twice; quads 0 and 2 hold all eight in order.
    let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_packus_epi32(lo, lo));
    _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
}

macro_rules! q4_kernel {
    ($name:ident, $q41:expr) => {
        /// # Safety
        /// See [`Kern`]: `w` holds 8·G rows of `nb` blocks, `rs` bytes apart; `a` holds
        /// `nb · 32 · K` values.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const K: usize, const G: usize>(
            w: *const u8,
            rs: usize,
            nb: usize,
            a: *const f32,
            acc: &mut [[__m256; G]; K],
            pf: *const u8,
            cold: bool,
        ) {
            const Q41: bool = $q41;
            let (bb, qoff) = if Q41 { (20, 4) } else { (18, 2) };
            let (nibble, eight) = (_mm256_set1_epi32(0xf), _mm256_set1_epi32(8));
            for b in 0..nb {
                let off = b * bb;
                prefetch_share(pf, b, 8 * G * bb);
                if cold {
                    prefetch_rows(w, rs, 8 * G, off + 128);
                }
                let mut x = [[_mm256_setzero_si256(); 4]; G];
                let mut d = [_mm256_setzero_ps(); G];
                let mut mn = [_mm256_setzero_ps(); G];
                for g in 0..G {
                    // SAFETY: rows 8g..8g + 8 of w have block b at `off`: bytes off..off+16 and
                    // off+qoff..off+qoff+16 lie inside it.
                    let (h, q) = unsafe {
                        let wg = w.add(8 * g * rs);
                        (column0(rows4(wg, rs, off)), rows4(wg, rs, off + qoff))
                    };
                    x[g] = transpose4(q);
                    d[g] = low_f16(h);
                    if Q41 {
                        mn[g] = low_f16(_mm256_srli_epi32::<16>(h));
                    }
                }
                // SAFETY: block b's 32 steps of K values lie inside A (the caller's guarantee).
                let ab = unsafe { a.add(b * BLOCK * K) };
                macro_rules! elem {
                    ($e:literal, $c:literal, $s:literal) => {
                        for g in 0..G {
                            let q = _mm256_and_si256(_mm256_srli_epi32::<$s>(x[g][$c]), nibble);
                            // d · q is exact, so `(d · q) + m` rounds once either way.
                            let v = if Q41 {
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d[g], mn[g])
                            } else {
                                let q = _mm256_sub_epi32(q, eight);
                                _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[g])
                            };
                            for i in 0..K {
                                // SAFETY: step e of the block, row i < K: inside A.
                                let ai = unsafe { *ab.add($e * K + i) };
                                acc[i][g] = _mm256_fmadd_ps(_mm256_set1_ps(ai), v, acc[i][g]);
                            }
                        }
                    };
                }
                elem!(0, 0, 0);
                elem!(1, 0, 8);
                elem!(2, 0, 16);
                elem!(3, 0, 24);
                elem!(4, 1, 0);
                elem!(5, 1, 8);
                elem!(6, 1, 16);
                elem!(7, 1, 24);
                elem!(8, 2, 0);
                elem!(9, 2, 8);
                elem!(10, 2, 16);
                elem!(11, 2, 24);
                elem!(12, 3, 0);
                elem!(13, 3, 8);
                elem!(14, 3, 16);
                elem!(15, 3, 24);
                elem!(16, 0, 4);
                elem!(17, 0, 12);
                elem!(18, 0, 20);
                elem!(19, 0, 28);
                elem!(20, 1, 4);
                elem!(21, 1, 12);
                elem!(22, 1, 20);
                elem!(23, 1, 28);
                elem!(24, 2, 4);
                elem!(25, 2, 12);
                elem!(26, 2, 20);
                elem!(27, 2, 28);
                elem!(28, 3, 4);
                elem!(29, 3, 12);
                elem!(30, 3, 20);
                elem!(31, 3, 28);
            }
        }
    };
}

q4_kernel!(q4_0, false);
q4_kernel!(q4_1, true);

/// The 8-bit kernel: element `4c + t` is byte `t` of dword column `c`, sign-extended.
///
/// # Safety
/// See [`Kern`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0<const K: usize, const G: usize>(
    w: *const u8,
    rs: usize,
    nb: usize,
    a: *const f32,
    acc: &mut [[__m256; G]; K],
    pf: *const u8,
    cold: bool,
) {
    const BB: usize = 34;
    for b in 0..nb {
        let off = b * BB;
        prefetch_share(pf, b, 8 * G * BB);
        if cold {
            prefetch_rows(w, rs, 8 * G, off + 128);
        }
        let mut x = [[_mm256_setzero_si256(); 8]; G];
        let mut d = [_mm256_setzero_ps(); G];
        for g in 0..G {
            // SAFETY: rows 8g..8g + 8 of w have block b at `off`; bytes off..off+16,
            // off+2..off+18 and off+18..off+34 lie inside it.
            let (h, lo, hi) = unsafe {
                let wg = w.add(8 * g * rs);
                (
                    column0(rows4(wg, rs, off)),
                    rows4(wg, rs, off + 2),
                    rows4(wg, rs, off + 18),
                )
            };
            let (lo, hi) = (transpose4(lo), transpose4(hi));
            x[g] = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
            d[g] = low_f16(h);
        }
        // SAFETY: block b's 32 steps of K values lie inside A (the caller's guarantee).
        let ab = unsafe { a.add(b * BLOCK * K) };
        macro_rules! elem {
            ($e:literal, $c:literal, $l:literal) => {
                for g in 0..G {
                    let q = _mm256_srai_epi32::<24>(_mm256_slli_epi32::<$l>(x[g][$c]));
                    let v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[g]);
                    for i in 0..K {
                        // SAFETY: step e of the block, row i < K: inside A.
                        let ai = unsafe { *ab.add($e * K + i) };
                        acc[i][g] = _mm256_fmadd_ps(_mm256_set1_ps(ai), v, acc[i][g]);
                    }
                }
            };
        }
        elem!(0, 0, 24);
        elem!(1, 0, 16);
        elem!(2, 0, 8);
        elem!(3, 0, 0);
        elem!(4, 1, 24);
        elem!(5, 1, 16);
        elem!(6, 1, 8);
        elem!(7, 1, 0);
        elem!(8, 2, 24);
        elem!(9, 2, 16);
        elem!(10, 2, 8);
        elem!(11, 2, 0);
        elem!(12, 3, 24);
        elem!(13, 3, 16);
        elem!(14, 3, 8);
        elem!(15, 3, 0);
        elem!(16, 4, 24);
        elem!(17, 4, 16);
        elem!(18, 4, 8);
        elem!(19, 4, 0);
        elem!(20, 5, 24);
        elem!(21, 5, 16);
        elem!(22, 5, 8);
        elem!(23, 5, 0);
        elem!(24, 6, 24);
        elem!(25, 6, 16);
        elem!(26, 6, 8);
        elem!(27, 6, 0);
        elem!(28, 7, 24);
        elem!(29, 7, 16);
        elem!(30, 7, 8);
        elem!(31, 7, 0);
    }
}

/// `dequantize` a block at a time, 8 values to a register.
///
/// # Safety
/// The CPU supports AVX2; `out` holds 32 values per whole block of `blocks`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize(format: QuantFormat, blocks: &[u8], out: &mut [f32]) {
    let bb = format.block_bytes();
    assert!(out.len() >= blocks.len() / bb * BLOCK);
    let nibble = _mm256_set1_epi32(0xf);
    for (blk, o) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(BLOCK)) {
        let d = _mm256_set1_ps(f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])));
        let load8 = |at: usize| {
            let bytes: &[u8; 8] = blk[at..at + 8].try_into().expect("8 bytes");
            // SAFETY: `bytes` is 8 readable bytes.
            unsafe { _mm_loadl_epi64(bytes.as_ptr() as *const __m128i) }
        };
        let vals: [__m256; 4] = match format {
            QuantFormat::Q8_0 => std::array::from_fn(|q| {
                let x = _mm256_cvtepi8_epi32(load8(2 + 8 * q));
                _mm256_mul_ps(_mm256_cvtepi32_ps(x), d)
            }),
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                let q41 = format == QuantFormat::Q4_1;
                let qoff = if q41 { 4 } else { 2 };
                let m = _mm256_set1_ps(if q41 {
                    f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]))
                } else {
                    0.0
                });
                let (x0, x1) = (
                    _mm256_cvtepu8_epi32(load8(qoff)),
                    _mm256_cvtepu8_epi32(load8(qoff + 8)),
                );
                let value = |q: __m256i| {
                    if q41 {
                        _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m)
                    } else {
                        let q = _mm256_sub_epi32(q, _mm256_set1_epi32(8));
                        _mm256_mul_ps(_mm256_cvtepi32_ps(q), d)
                    }
                };
                [
                    value(_mm256_and_si256(x0, nibble)),
                    value(_mm256_and_si256(x1, nibble)),
                    value(_mm256_srli_epi32::<4>(x0)),
                    value(_mm256_srli_epi32::<4>(x1)),
                ]
            }
        };
        let o: &mut [f32; BLOCK] = o.try_into().expect("a block of values");
        for (q, v) in vals.into_iter().enumerate() {
            // SAFETY: `o` holds 32 writable values; this stores 8 of them from 8q.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * q), canonical8(v)) };
        }
    }
}
