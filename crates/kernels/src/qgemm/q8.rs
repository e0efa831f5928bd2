//! `qmatmul_q8`: the product with a block-quantised weight whose activations are first rounded
//! to 8-bit blocks, with exact integer block products — the reference's definition
//! (`tenet_reference::quant`, "qmatmul_q8"), the arithmetic llama.cpp's CPU dot products do.
//!
//! Each row of A is cut into blocks of 32 and each block rounded once ([`quantize_rows`], the reference's rounding): its
//! scale `d = amax / 127`, integers `q = round_ties_even(x · (1 / d))` clamped to ±127 (0 for
//! NaN) and their sum `Q`. An output is then, over the blocks in order from +0,
//! `acc = fma(d_w · d, S, acc)` (and for Q4_1 `acc = fma(m_w, d · Q, acc)`), where `S` is the
//! block's exact integer dot product with the weight block's integers. Integer sums do not
//! depend on their order, so the SIMD kernels may add them any way; the f32 steps are the
//! same few operations in the same order at every level, so the bits are too.
//!
//! **Why it is shaped this way.** The f32 definition (`qmatmul`) spends a decode and an fma
//! on every weight for every row of A; here a weight costs part of one byte multiply-add
//! (`vpmaddubsw` multiplies 32 byte pairs and adds neighbours). The AVX2 kernel takes 8 weight
//! rows at a time: per block it widens each row's 32 integers to bytes once, then for each row
//! of A (up to `PASS` at a time) multiplies them with the row's 32 rounded bytes, reduces
//! the 8 products to one vector of 8 exact sums (lane r: weight row r) with horizontal adds,
//! and continues 8 f32 chains — one per weight row — with one multiply and one fma (two for
//! Q4_1). Q4_0's `q − 8` is taken as `Σ q·x − 8·Q`; Q8_0's signed weights as `|w|` times `x`
//! with `w`'s sign (`vpsignb`), since `vpmaddubsw` wants one unsigned operand. AVX-512 CPUs
//! run this kernel too.
//!
//! The 8 rows are 8 short streams the hardware prefetchers follow poorly, so each block step
//! prefetches a few lines of the group two ahead: without that the kernel was 1.7× faster
//! than the f32 one with the weights hot in L2 and 1.3–1.5× slower from memory; with it,
//! 1.24–1.5× faster on SmolLM2's decode products (docs/PERFORMANCE.md, "On a Zen 3 host").
//! Byte dot-product instructions (`vpdpbusd`: AVX-512 VNNI, AVX-VNNI) would fold the multiply,
//! the pair sums and the accumulation into one instruction per 64 (32) weights: the next
//! kernels, for hosts that have them.
//!
//! Threads split the weight rows into tiles of `TILE` rows (a few parts per thread claimed
//! from the pool); which thread computes a column never changes its bits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tenet_reference::quant::{Q8Block, quantize_activations};

use super::{
    BLOCK, QWeight, QgemmError, QuantFormat, SharedC, TILE, checked, f16_to_f32, tile_ranges,
};
use crate::SimdLevel;
use crate::simd::canonical;

/// Rows of A one pass of the AVX2 kernel carries (8 accumulators, one per row).
const PASS: usize = 8;

/// Multiply-adds between two questions to the stop function.
const POLL_WORK: usize = 1 << 18;

/// Least work worth a thread of its own (weight bytes), as for `qgemm`.
const MIN_BYTES_PER_THREAD: usize = 96 << 10;

/// Rows of A rounded to 8-bit blocks, `blocks[i · nb + b]` for row `i`, block `b`: each the
/// reference's own rounding (`tenet_reference::quant::quantize_activations`), so there is one
/// definition of it.
pub struct Rounded {
    k: usize,
    blocks: Vec<Q8Block>,
}

impl Rounded {
    fn blocks(&self) -> usize {
        self.k / BLOCK
    }

    fn at(&self, i: usize, b: usize) -> &Q8Block {
        &self.blocks[i * self.blocks() + b]
    }
}

/// Round `m` rows of `k` values of `a` (row stride `a_rs`) to 8-bit blocks.
pub fn quantize_rows(m: usize, k: usize, a: &[f32], a_rs: usize) -> Rounded {
    let blocks = (0..m)
        .flat_map(|i| a[i * a_rs..i * a_rs + k].chunks_exact(BLOCK))
        .map(quantize_activations)
        .collect();
    Rounded { k, blocks }
}

/// Bytes [`qgemm_q8`] allocates for `m` rows of `k`: the rounded rows.
pub fn scratch_bytes(m: usize, k: usize) -> u64 {
    let nb = (k / BLOCK) as u64;
    (m as u64).saturating_mul(nb * std::mem::size_of::<Q8Block>() as u64)
}

/// `C = qmatmul_q8(A, w)`: `A` is `m × k` row-major at row stride `a_rs`, `C` `m × n` at row
/// stride `c_rs`, on up to `threads` threads; the reference's bits at every level and thread
/// count.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_q8(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: QWeight<'_>,
    c: &mut [f32],
    c_rs: usize,
) -> Result<(), QgemmError> {
    qgemm_q8_polled(level, threads, m, a, a_rs, w, c, c_rs, &|| false).map(|_| ())
}

/// [`qgemm_q8`], asking `stop` after each tile of 64 weight rows whose work takes the count of
/// multiply-adds past a multiple of 2¹⁸: once it says yes, the product gives up and returns
/// `Ok(false)`, with C partly written.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_q8_polled(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: QWeight<'_>,
    c: &mut [f32],
    c_rs: usize,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<bool, QgemmError> {
    if !checked(level, m, a, a_rs, &w, c, c_rs)? {
        return Ok(true);
    }
    let (n, k) = (w.n, w.k);
    let rounded = quantize_rows(m, k, a, a_rs);
    let simd = simd_kernel(level);
    let row_bytes = w.row_bytes();
    let tiles = n.div_ceil(TILE);
    let worth = (n * row_bytes / MIN_BYTES_PER_THREAD).max(1);
    let threads = threads.clamp(1, worth.min(tiles));
    let ranges = tile_ranges(threads, tiles);
    let shared = SharedC {
        ptr: c.as_mut_ptr(),
    };
    let stopped = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let body = |part: usize| {
        for t in ranges[part].clone() {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            let j0 = t * TILE;
            let cols = TILE.min(n - j0);
            let rows = &w.bytes[j0 * row_bytes..(j0 + cols) * row_bytes];
            // Whole groups of 8 on the SIMD kernel, the rest (a tile's last few rows) in
            // scalar code: the same definition, so the same bits.
            let simd_cols = if simd { cols / 8 * 8 } else { 0 };
            // SAFETY: the part owns columns j0..j0 + cols of every row of C (parts cover
            // disjoint tiles); `c` spans (m-1)·c_rs + n elements (checked above).
            let c_at = unsafe { shared.at(j0) };
            #[cfg(target_arch = "x86_64")]
            if simd_cols > 0 {
                // SAFETY: `simd_kernel` saw AVX2, FMA and F16C; `rows` holds `simd_cols` whole
                // rows of `nb` blocks; C's rows below m have `simd_cols` columns from `c_at`.
                unsafe {
                    avx2::tile(
                        w.format, rows, row_bytes, simd_cols, &rounded, m, c_at, c_rs,
                    )
                };
            }
            for col in simd_cols..cols {
                let row = &rows[col * row_bytes..(col + 1) * row_bytes];
                for i in 0..m {
                    let v = row_dot(w.format, row, &rounded, i);
                    // SAFETY: as above: column j0 + col of row i is this part's.
                    unsafe { *c_at.add(i * c_rs + col) = v };
                }
            }
            let work = m * cols * k;
            let before = done.fetch_add(work, Ordering::Relaxed);
            if (before + work) / POLL_WORK > before / POLL_WORK && stop() {
                stopped.store(true, Ordering::Relaxed);
            }
        }
    };
    if ranges.len() == 1 {
        body(0);
    } else {
        tenet_sys::parallel::run_parts(ranges.len(), &body);
    }
    Ok(!stopped.load(Ordering::Relaxed))
}

/// Whether the AVX2 kernel runs at `level` on this CPU (AVX-512 CPUs run it too).
fn simd_kernel(level: SimdLevel) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512)
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        false
    }
}

/// A weight block's integer `e`: `q − 8`, `q`, or the signed byte.
fn weight_integer(format: QuantFormat, block: &[u8], e: usize) -> i32 {
    let nibble = |qs: &[u8]| {
        if e < 16 {
            qs[e] & 0x0f
        } else {
            qs[e - 16] >> 4
        }
    };
    match format {
        QuantFormat::Q4_0 => nibble(&block[2..18]) as i32 - 8,
        QuantFormat::Q4_1 => nibble(&block[4..20]) as i32,
        QuantFormat::Q8_0 => block[2 + e] as i8 as i32,
    }
}

/// One output in scalar code: weight row `row` (its blocks) with rounded row `i`, each block
/// the step of `tenet_reference::quant::accumulate_block` (this crate has its own copy of the
/// formulas, as `block_values` has of the dequantisation: it knows no IR types).
fn row_dot(format: QuantFormat, row: &[u8], r: &Rounded, i: usize) -> f32 {
    let mut acc = 0.0f32;
    for (b, block) in row.chunks_exact(format.block_bytes()).enumerate() {
        let x = r.at(i, b);
        let s: i32 = (0..BLOCK)
            .map(|e| weight_integer(format, block, e) * x.q[e] as i32)
            .sum();
        let d_w = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
        acc = (d_w * x.d).mul_add(s as f32, acc);
        if format == QuantFormat::Q4_1 {
            let m_w = f16_to_f32(u16::from_le_bytes([block[2], block[3]]));
            acc = m_w.mul_add(x.d * x.sum as f32, acc);
        }
    }
    canonical(acc)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{PASS, QuantFormat, Rounded};
    use crate::simd::canonical8;

    /// Groups of 8 weight rows ahead that the kernel prefetches.
    const AHEAD: usize = 2;

    /// Format codes for the kernel's const parameter.
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// The 8 rows' (from `at`, `row_bytes` apart) block heads: their f16 scales as f32, and
    /// (for Q4_1) their minimums.
    ///
    /// # Safety
    /// Each of the 8 rows holds 4 bytes at `at`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn heads<const F: u8>(at: *const u8, row_bytes: usize) -> (__m256, __m256) {
        // SAFETY: the caller's: 4 bytes at each row's head (a scale, then a minimum or the
        // first weights).
        let word = |r: usize| unsafe { (at.add(r * row_bytes) as *const i32).read_unaligned() };
        let v = _mm256_setr_epi32(
            word(0),
            word(1),
            word(2),
            word(3),
            word(4),
            word(5),
            word(6),
            word(7),
        );
        let halves = |x: __m256i| {
            _mm256_cvtph_ps(_mm_packus_epi32(
                _mm256_castsi256_si128(x),
                _mm256_extracti128_si256::<1>(x),
            ))
        };
        let low = _mm256_set1_epi32(0xffff);
        let d = halves(_mm256_and_si256(v, low));
        let m = if F == Q4_1 {
            halves(_mm256_srli_epi32::<16>(v))
        } else {
            _mm256_setzero_ps()
        };
        (d, m)
    }

    /// A row's block at `b` as 32 integers in bytes, element order (nibbles as 0..15).
    ///
    /// # Safety
    /// `b` points at a whole block of format `F`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn integers<const F: u8>(b: *const u8) -> __m256i {
        if F == Q8_0 {
            // SAFETY: a Q8_0 block holds 32 bytes after its 2-byte scale.
            return unsafe { _mm256_loadu_si256(b.add(2) as *const __m256i) };
        }
        let at = if F == Q4_1 { 4 } else { 2 };
        // SAFETY: a 4-bit block holds 16 bytes of nibbles from `at`.
        let qs = unsafe { _mm_loadu_si128(b.add(at) as *const __m128i) };
        let low = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(qs, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low);
        _mm256_set_m128i(hi, lo)
    }

    /// Lane r: the sum of all 8 lanes of `p[r]` (exact: integers far below 2³¹).
    #[target_feature(enable = "avx2")]
    fn sums(p: &[__m256i; 8]) -> __m256i {
        let t0 = _mm256_hadd_epi32(p[0], p[1]);
        let t1 = _mm256_hadd_epi32(p[2], p[3]);
        let t2 = _mm256_hadd_epi32(p[4], p[5]);
        let t3 = _mm256_hadd_epi32(p[6], p[7]);
        let u0 = _mm256_hadd_epi32(t0, t1);
        let u1 = _mm256_hadd_epi32(t2, t3);
        let lo = _mm256_permute2x128_si256::<0x20>(u0, u1);
        let hi = _mm256_permute2x128_si256::<0x31>(u0, u1);
        _mm256_add_epi32(lo, hi)
    }

    /// `cols` (a multiple of 8) weight rows of `rows` times every rounded row of `r` (`m` of
    /// them) into C from `c` (row stride `c_rs`), 8 weight rows and up to [`PASS`] rows of A at
    /// a time.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; `rows` holds `cols` rows of `row_bytes`, each
    /// `r.k / 32` blocks of `format`; `c` points at `m` rows of `cols` writable values, `c_rs`
    /// apart, that no other thread touches meanwhile.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile(
        format: QuantFormat,
        rows: &[u8],
        row_bytes: usize,
        cols: usize,
        r: &Rounded,
        m: usize,
        c: *mut f32,
        c_rs: usize,
    ) {
        // SAFETY: the caller's, passed on.
        unsafe {
            match (format, m) {
                (QuantFormat::Q4_0, 1) => kernel::<Q4_0, 1>(rows, row_bytes, cols, r, m, c, c_rs),
                (QuantFormat::Q4_1, 1) => kernel::<Q4_1, 1>(rows, row_bytes, cols, r, m, c, c_rs),
                (QuantFormat::Q8_0, 1) => kernel::<Q8_0, 1>(rows, row_bytes, cols, r, m, c, c_rs),
                (QuantFormat::Q4_0, _) => {
                    kernel::<Q4_0, PASS>(rows, row_bytes, cols, r, m, c, c_rs)
                }
                (QuantFormat::Q4_1, _) => {
                    kernel::<Q4_1, PASS>(rows, row_bytes, cols, r, m, c, c_rs)
                }
                (QuantFormat::Q8_0, _) => {
                    kernel::<Q8_0, PASS>(rows, row_bytes, cols, r, m, c, c_rs)
                }
            }
        }
    }

    /// [`tile`] for format `F`, `P` rows of A a pass (the last pass may have fewer).
    ///
    /// # Safety
    /// As [`tile`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn kernel<const F: u8, const P: usize>(
        rows: &[u8],
        row_bytes: usize,
        cols: usize,
        r: &Rounded,
        m: usize,
        c: *mut f32,
        c_rs: usize,
    ) {
        let nb = r.blocks();
        let bb = match F {
            Q4_0 => 18,
            Q4_1 => 20,
            _ => 34,
        };
        let ones = _mm256_set1_epi16(1);
        let base = rows.as_ptr();
        for g in (0..cols).step_by(8) {
            let group = base.wrapping_add(g * row_bytes);
            // The group `AHEAD` groups on, spread over this group's block steps (a few lines
            // each): the kernel reads 8 rows side by side, 8 short streams the hardware
            // prefetchers follow poorly, and a burst of a whole group's lines at once would
            // queue behind itself.
            let ahead = group.wrapping_add(AHEAD * 8 * row_bytes);
            let lines = (8 * row_bytes).div_ceil(64);
            for i0 in (0..m).step_by(P) {
                let pass = P.min(m - i0);
                let mut acc = [_mm256_setzero_ps(); P];
                for b in 0..nb {
                    if i0 == 0 {
                        for line in b * lines / nb..(b + 1) * lines / nb {
                            // Prefetching never faults, wherever the address points.
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
                        }
                    }
                    let at = group.wrapping_add(b * bb);
                    // SAFETY: rows g..g + 8 are whole rows of `rows` (the caller's), each with
                    // block b at `b * bb`.
                    let (d_w, m_w) = unsafe { heads::<F>(at, row_bytes) };
                    // SAFETY: as above, block b of each of the 8 rows.
                    let w: [__m256i; 8] =
                        std::array::from_fn(|t| unsafe { integers::<F>(at.add(t * row_bytes)) });
                    // Q8_0's weights as magnitudes; each row's bytes then take their signs.
                    let mag: [__m256i; 8] = if F == Q8_0 {
                        std::array::from_fn(|t| _mm256_abs_epi8(w[t]))
                    } else {
                        w
                    };
                    for (p, a) in acc.iter_mut().enumerate().take(pass) {
                        let i = i0 + p;
                        let xb = r.at(i, b);
                        // SAFETY: a block's integers are 32 bytes.
                        let x = unsafe { _mm256_loadu_si256(xb.q.as_ptr() as *const __m256i) };
                        let prods: [__m256i; 8] = std::array::from_fn(|t| {
                            let s = if F == Q8_0 {
                                _mm256_sign_epi8(x, w[t])
                            } else {
                                x
                            };
                            _mm256_madd_epi16(_mm256_maddubs_epi16(mag[t], s), ones)
                        });
                        let mut s = sums(&prods);
                        if F == Q4_0 {
                            s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xb.sum));
                        }
                        let scale = _mm256_mul_ps(d_w, _mm256_set1_ps(xb.d));
                        *a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), *a);
                        if F == Q4_1 {
                            // `d · Q` rounded once, as the reference's step.
                            let dq = xb.d * xb.sum as f32;
                            *a = _mm256_fmadd_ps(m_w, _mm256_set1_ps(dq), *a);
                        }
                    }
                }
                for (p, a) in acc.iter().enumerate().take(pass) {
                    // SAFETY: row i0 + p < m of C has columns g..g + 8 < cols from `c`.
                    unsafe {
                        _mm256_storeu_ps(c.add((i0 + p) * c_rs + g), canonical8(*a));
                    }
                }
            }
        }
    }
}
