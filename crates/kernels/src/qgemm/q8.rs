//! `qmatmul_q8`: the product with a block-quantised weight whose activations are first rounded
//! to 8-bit blocks, with exact integer block products — the reference's definition
//! (`tenet_reference::quant`, "qmatmul_q8"), the arithmetic llama.cpp's CPU dot products do.
//!
//! Each row of A is cut into blocks of 32 and each block rounded once ([`quantize_rows`], the
//! reference's rounding): its scale `d = amax / 127`, integers `q = round_ties_even(x · (1 / d))` clamped to ±127 (0 for
//! NaN) and their sum `Q`. An output is then, over the blocks in order from +0,
//! `acc = fma(d_w · d, S, acc)` (and for Q4_1 `acc = fma(m_w, d · Q, acc)`), where `S` is the
//! block's exact integer dot product with the weight block's integers. Integer sums do not
//! depend on their order, so the SIMD kernels may add them any way; the f32 steps are the
//! same few operations in the same order at every level, so the bits are too.
//!
//! **Why it is shaped this way.** The f32 definition (`qmatmul`) spends a decode and an fma
//! on every weight for every row of A; here a weight costs part of one byte multiply-add
//! (`vpmaddubsw` multiplies 32 byte pairs and adds neighbours). The AVX2 kernel takes 8 weight
//! rows at a time and continues 8 f32 chains, one per weight row, in the lanes of one vector.
//! For the 4-bit formats it loads the 8 rows' 16 bytes of nibbles of a block and turns them
//! (a 4 × 4 dword transpose in each 128-bit half) so that each vector holds one 4-byte piece of
//! every row, lane r row r; masks and a shift split the nibbles. A row of A's block then meets
//! them as 8 broadcast 4-byte pieces: 8 `vpmaddubsw` summed in 16 bits (exact: at most
//! 8 · 2 · 15 · 127) and one `vpmaddwd` leave row r's exact sum `S` in lane r, with no
//! horizontal adds. Q4_0's `q − 8` is taken as `Σ q·x − 8·Q`. Q8_0's 32 signed bytes a row
//! are multiplied whole (as `|w|` times `x` with `w`'s sign, `vpsignb`, since `vpmaddubsw`
//! wants one unsigned operand) and the 8 rows' products reduced with horizontal adds. Rows of
//! A go in passes of up to `PASS` whose count is a constant of the code, so the accumulators
//! stay in registers (a pass of a run-time size had kept them in memory). With the turned
//! pieces, a decode step's products (`qgemv_speed`, Zen 3) went 8.3 → 7.3 ms at one thread,
//! 5.3 → 4.5 at two (21 of the 24 GB/s the machine streams), and 34 → 22 ms for 8 rows of A.
//! AVX-512 CPUs run this kernel too. Rounding the activations is vectorised as well
//! ([`quantize_rows`]).
//!
//! The 8 rows are 8 short streams the hardware prefetchers follow poorly, so each block step
//! prefetches a few lines of the group two ahead: without that the kernel was 1.7× faster
//! than the f32 one with the weights hot in L2 and 1.3–1.5× slower from memory; with it,
//! 1.24–1.5× faster on SmolLM2's decode products (docs/PERFORMANCE.md, "On a Zen 3 host").
//! On CPUs with AVX-512 VNNI, [`vnni`] takes 16 weight rows at a time in the same layout and
//! folds the multiply, the pair sums and the accumulation into one `vpdpbusd` per 4 weights of
//! the 16 rows: on an Intel Xeon (Emerald Rapids, 2 cores) a decode step's products for 8 rows
//! of A went from 20.3 to 12.8 ms at one thread and 12.7 to 8.5 at two (`qgemv_speed`,
//! `TENET_SIMD=avx2` against `avx512`); for one row, where memory bounds them, 5.6 → 5.1 ms
//! at two.
//!
//! Threads split the weight rows into tiles of `TILE` rows (a few parts per thread claimed
//! from the pool); which thread computes a column never changes its bits. Sibling products
//! of the same A ([`qgemm_q8_siblings`]) share one rounding of A and one split of all their
//! tiles.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tenet_reference::quant::{Q8Block, quantize_activations};

use super::{
    BLOCK, QWeight, QgemmError, QuantFormat, Sibling, TILE, f16_to_f32, sibling_checked,
    tile_ranges,
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
    /// Each block's `d · Q` (Q4_1's second step), rounded once here rather than once for
    /// every group of 8 weight rows that meets the block.
    dq: Vec<f32>,
}

impl Rounded {
    fn blocks(&self) -> usize {
        self.k / BLOCK
    }

    /// Row `i`'s block `b`.
    pub fn at(&self, i: usize, b: usize) -> &Q8Block {
        &self.blocks[i * self.blocks() + b]
    }

    /// Row `i`'s block `b`'s `d · Q`.
    fn dq(&self, i: usize, b: usize) -> f32 {
        self.dq[i * self.blocks() + b]
    }

    fn new(k: usize, blocks: Vec<Q8Block>) -> Rounded {
        let dq = blocks.iter().map(|b| b.d * b.sum as f32).collect();
        Rounded { k, blocks, dq }
    }
}

/// Round `m` rows of `k` values of `a` (row stride `a_rs`) to 8-bit blocks at `level`: the
/// AVX2 rounding ([`avx2::quantize_block`]) is the reference's, bit for bit (tested), and a
/// decode step rounds ~150,000 activations, which the scalar `round_ties_even` (a libm call
/// without SSE4.1) made ~10% of the step.
///
/// # Panics
/// If `a` is shorter than `(m - 1) · a_rs + k` or `k` is not a multiple of 32.
pub fn quantize_rows(level: SimdLevel, m: usize, k: usize, a: &[f32], a_rs: usize) -> Rounded {
    let rows = (0..m).map(|i| &a[i * a_rs..i * a_rs + k]);
    assert_eq!(k % BLOCK, 0, "whole blocks");
    #[cfg(target_arch = "x86_64")]
    if matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512)
        && std::arch::is_x86_feature_detected!("avx2")
    {
        let blocks = rows
            .flat_map(|row| row.chunks_exact(BLOCK))
            // SAFETY: AVX2 is present (checked above); each chunk is a whole block.
            .map(|x| unsafe { avx2::quantize_block(x.as_ptr()) })
            .collect();
        return Rounded::new(k, blocks);
    }
    let _ = level;
    let blocks = rows
        .flat_map(|row| row.chunks_exact(BLOCK))
        .map(quantize_activations)
        .collect();
    Rounded::new(k, blocks)
}

/// Bytes [`qgemm_q8`] allocates for `m` rows of `k`: the rounded rows (each block and its
/// `d · Q`).
pub fn scratch_bytes(m: usize, k: usize) -> u64 {
    let nb = (k / BLOCK) as u64;
    let block = (std::mem::size_of::<Q8Block>() + std::mem::size_of::<f32>()) as u64;
    (m as u64).saturating_mul(nb * block)
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
    qgemm_q8_siblings(level, threads, m, a, a_rs, &mut [(w, c, c_rs)], stop)
}

/// Several products of the same rows of A, `C_p = qmatmul_q8(A, w_p)` (each `C_p` `m × n_p`
/// at row stride `c_rs_p`), as one: A rounded once, and the tiles of every weight shared out
/// among the threads together, so that a small weight (attention's keys and values, 69 KB in
/// SmolLM2) does not keep a thread waiting and each product does not wake the pool on its
/// own. Every output has the bits of its product alone. `stop` as for [`qgemm_q8_polled`].
pub fn qgemm_q8_siblings(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    products: &mut [(QWeight<'_>, &mut [f32], usize)],
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<bool, QgemmError> {
    let mut work = Vec::with_capacity(products.len());
    let mut first_k = None;
    for (w, c, c_rs) in products.iter_mut() {
        if sibling_checked(level, m, a, a_rs, w, c, *c_rs, &mut first_k)? {
            work.push(Sibling::new(*w, c, *c_rs));
        }
    }
    let Some(k) = work.first().map(|s| s.w.k) else {
        return Ok(true);
    };
    let rounded = quantize_rows(level, m, k, a, a_rs);
    let kernel = kernel_at(level);
    // Tile `t` overall is tile `t - first[p]` of product p.
    let mut first = Vec::with_capacity(work.len());
    let mut tiles = 0;
    let mut bytes = 0;
    for s in &work {
        first.push(tiles);
        tiles += s.w.n.div_ceil(TILE);
        bytes += s.w.n * s.w.row_bytes();
    }
    let worth = (bytes / MIN_BYTES_PER_THREAD).max(1);
    let threads = threads.clamp(1, worth.min(tiles));
    let ranges = tile_ranges(threads, tiles, m);
    let stopped = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let body = |part: usize| {
        for t in ranges[part].clone() {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            let p = first.partition_point(|&f| f <= t) - 1;
            let Sibling { w, c, c_rs } = work[p];
            let row_bytes = w.row_bytes();
            let j0 = (t - first[p]) * TILE;
            let cols = TILE.min(w.n - j0);
            let rows = &w.bytes[j0 * row_bytes..(j0 + cols) * row_bytes];
            // Whole groups of 16 on the VNNI kernel, then of 8 on the AVX2 one, the rest (a
            // tile's last few rows) in scalar code: the same definition, so the same bits.
            let wide_cols = if kernel == Kernel::Vnni {
                cols / 16 * 16
            } else {
                0
            };
            let simd_cols = if kernel == Kernel::Scalar {
                0
            } else {
                cols / 8 * 8
            };
            // SAFETY: the part owns columns j0..j0 + cols of every row of this C (parts cover
            // disjoint tiles); C spans (m-1)·c_rs + n elements (checked above).
            let c_at = unsafe { c.at(j0) };
            #[cfg(target_arch = "x86_64")]
            if wide_cols > 0 {
                // SAFETY: `kernel` saw AVX-512 VNNI; `rows` holds `wide_cols` whole rows of
                // `nb` blocks; C's rows below m have `wide_cols` columns from `c_at`.
                unsafe {
                    vnni::tile(
                        w.format, rows, row_bytes, wide_cols, &rounded, m, c_at, c_rs,
                    )
                };
            }
            #[cfg(target_arch = "x86_64")]
            if simd_cols > wide_cols {
                // SAFETY: `kernel` saw AVX2, FMA and F16C; `rows` holds `simd_cols` whole
                // rows of `nb` blocks; C's rows below m have `simd_cols` columns from `c_at`.
                unsafe {
                    avx2::tile(
                        w.format,
                        &rows[wide_cols * row_bytes..],
                        row_bytes,
                        simd_cols - wide_cols,
                        &rounded,
                        m,
                        c_at.add(wide_cols),
                        c_rs,
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

/// Which kernel computes whole groups of weight rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Scalar,
    /// Groups of 8 ([`avx2`]).
    Avx2,
    /// Groups of 16 ([`vnni`]), then of 8 on the AVX2 kernel.
    Vnni,
}

/// The kernel that runs at `level` on this CPU: AVX-512 CPUs with VNNI run [`vnni`], other
/// AVX-512 CPUs the AVX2 kernel.
fn kernel_at(level: SimdLevel) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if !matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512)
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            Kernel::Scalar
        } else if level == SimdLevel::Avx512 && vnni::available() {
            Kernel::Vnni
        } else {
            Kernel::Avx2
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        Kernel::Scalar
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

/// The passes over `m` rows of A: `(first row, rows)`, [`PASS`] rows at a time, then 4, 2
/// and 1 — each a count the SIMD kernels compile a pass for, so that its accumulators stay in
/// registers.
fn passes(m: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut i0 = 0;
    std::iter::from_fn(move || {
        let rows = match m - i0 {
            0 => return None,
            left if left >= PASS => PASS,
            left if left >= 4 => 4,
            left if left >= 2 => 2,
            _ => 1,
        };
        i0 += rows;
        Some((i0 - rows, rows))
    })
}

/// A group's `lines` cache lines spread evenly over `steps` block steps, for prefetching:
/// step b takes lines `b · lines / steps ..` up to the next step's first, kept as a running
/// quotient rather than two divisions a step.
struct Spread {
    lines: usize,
    steps: usize,
    line: usize,
    carry: usize,
}

impl Spread {
    fn new(lines: usize, steps: usize) -> Spread {
        Spread {
            lines,
            steps: steps.max(1),
            line: 0,
            carry: 0,
        }
    }

    /// The lines of the next step.
    fn next_step(&mut self) -> std::ops::Range<usize> {
        self.carry += self.lines;
        let end = self.line + self.carry / self.steps;
        self.carry %= self.steps;
        let lines = self.line..end;
        self.line = end;
        lines
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use tenet_reference::quant::Q8Block;

    use super::{BLOCK, PASS, QuantFormat, Rounded, Spread, passes};
    use crate::simd::canonical8;

    /// Groups of 8 weight rows ahead that the kernel prefetches.
    const AHEAD: usize = 2;

    /// Format codes for the kernel's const parameter.
    pub(super) const Q4_0: u8 = 0;
    pub(super) const Q4_1: u8 = 1;
    pub(super) const Q8_0: u8 = 2;

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

    /// `tenet_reference::quant::quantize_activations` of the 32 values at `x`, the same bits:
    /// the largest magnitude (a block with a NaN takes the reference's NaN scale and all-zero
    /// integers), the same scalar `d` and `1 / d`, then per value the same product, a rounding
    /// to nearest with ties to even (`vroundps`, as `round_ties_even`), NaN to 0, and the
    /// clamp to ±127.
    ///
    /// # Safety
    /// The CPU supports AVX2; `x` points at 32 readable values.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_block(x: *const f32) -> Q8Block {
        // SAFETY: the caller's: 32 values at `x`.
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.add(8 * i)) });
        let nan = v.iter().fold(_mm256_setzero_ps(), |a, &x| {
            _mm256_or_ps(a, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
        });
        if _mm256_movemask_ps(nan) != 0 {
            return Q8Block {
                d: f32::NAN / 127.0,
                q: [0; BLOCK],
                sum: 0,
            };
        }
        let sign = _mm256_set1_ps(-0.0);
        let abs = v.map(|x| _mm256_andnot_ps(sign, x));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d == 0.0 { 0.0 } else { 1.0 / d });
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let ints = v.map(|x| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, inv),
            );
            // NaN (an infinity times 0) to +0, then the clamp.
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
            _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
        });
        let total = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        let t = _mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256::<1>(total),
        );
        let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)));
        // Packing works within 128-bit halves: dwords come out in the order 0 4 1 5 2 6 3 7.
        let words = [
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        ];
        let bytes = _mm256_packs_epi16(words[0], words[1]);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut q = [0i8; BLOCK];
        // SAFETY: `q` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, bytes) };
        Q8Block { d, q, sum }
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
            match format {
                QuantFormat::Q4_0 => kernel::<Q4_0>(rows, row_bytes, cols, r, m, c, c_rs),
                QuantFormat::Q4_1 => kernel::<Q4_1>(rows, row_bytes, cols, r, m, c, c_rs),
                QuantFormat::Q8_0 => kernel::<Q8_0>(rows, row_bytes, cols, r, m, c, c_rs),
            }
        }
    }

    /// The nibbles of block `at` (a 4-bit format's 16 bytes from `at + NIBBLES`) of 8 rows
    /// `row_bytes` apart, turned so that every vector holds one 4-byte piece of each row:
    /// `lo[c]` lane r the integers `4c .. 4c + 4` of row r, `hi[c]` those of `16 + 4c ..`.
    ///
    /// # Safety
    /// Each of the 8 rows holds 16 bytes at `at`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibble_pieces(at: *const u8, row_bytes: usize) -> ([__m256i; 4], [__m256i; 4]) {
        // Rows t and t + 4 in the two 128-bit halves of register t.
        // SAFETY: the caller's: 16 bytes at each row.
        let r: [__m256i; 4] = std::array::from_fn(|t| unsafe {
            _mm256_loadu2_m128i(
                at.add((t + 4) * row_bytes) as *const __m128i,
                at.add(t * row_bytes) as *const __m128i,
            )
        });
        // A 4 × 4 transpose of dwords within each half: piece c of rows 0..4 | 4..8.
        let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
        let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
        let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        let pieces = [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ];
        let low = _mm256_set1_epi8(0x0f);
        let lo = pieces.map(|p| _mm256_and_si256(p, low));
        let hi = pieces.map(|p| _mm256_and_si256(_mm256_srli_epi16::<4>(p), low));
        (lo, hi)
    }

    /// Lane r: row r's exact `Σ q · x` over a block, from its pieces ([`nibble_pieces`]) and the
    /// activation block's 32 bytes at `x`: each piece times the matching 4 bytes of `x`
    /// (broadcast), summed in 16 bits (a piece's pair sum is at most 2 · 15 · 127 = 3810, eight
    /// of them 30480: no saturation, so exact), then the pairs of each lane into 32 bits.
    ///
    /// # Safety
    /// `x` points at 32 readable bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn piece_sums(lo: &[__m256i; 4], hi: &[__m256i; 4], x: *const i8) -> __m256i {
        // SAFETY: the caller's: bytes 0..32 of `x`.
        let word =
            |at: usize| unsafe { _mm256_set1_epi32((x.add(at) as *const i32).read_unaligned()) };
        let mut s = _mm256_maddubs_epi16(lo[0], word(0));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[0], word(16)));
        for c in 1..4 {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[c], word(4 * c)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[c], word(16 + 4 * c)));
        }
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }

    /// [`tile`] for format `F`: each group of 8 weight rows times the rows of A in [`passes`].
    ///
    /// # Safety
    /// As [`tile`].
    #[target_feature(enable = "avx2,fma,f16c")]
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
        for g in (0..cols).step_by(8) {
            let group = Group {
                at: base.wrapping_add(g * row_bytes),
                row_bytes,
            };
            // SAFETY: row i of C has columns g..g + 8 < cols from `c.add(i * c_rs)`.
            let c = c.wrapping_add(g);
            for (i0, rows) in passes(m) {
                // SAFETY: the caller's, for rows g..g + 8 of the weight and i0.. of A and C.
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

    /// 8 consecutive weight rows of `row_bytes` from `at`.
    #[derive(Clone, Copy)]
    struct Group {
        at: *const u8,
        row_bytes: usize,
    }

    /// Rows `i0 .. i0 + P` of A times the 8 weight rows of `w`, into C's rows from
    /// `c + i0 · c_rs` (8 columns each); the first pass (`i0 = 0`) prefetches the group
    /// [`AHEAD`] on, a few lines each block step (8 rows side by side are 8 short streams the
    /// hardware prefetchers follow poorly, and a whole group's lines at once would queue
    /// behind each other).
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; `w` holds 8 whole rows of `r.k / 32` blocks of
    /// format `F`; rows `i0 .. i0 + P` exist in `r`, and C's 8 values at each are writable
    /// and touched by no other thread meanwhile.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn pass<const F: u8, const P: usize>(
        w: Group,
        r: &Rounded,
        i0: usize,
        c: *mut f32,
        c_rs: usize,
    ) {
        let nb = r.blocks();
        let (bb, nibbles) = match F {
            Q4_0 => (18, 2),
            Q4_1 => (20, 4),
            _ => (34, 2),
        };
        let ahead = w.at.wrapping_add(AHEAD * 8 * w.row_bytes);
        let mut spread = Spread::new((8 * w.row_bytes).div_ceil(64), nb);
        let mut acc = [_mm256_setzero_ps(); P];
        for b in 0..nb {
            if i0 == 0 {
                for line in spread.next_step() {
                    // Prefetching never faults, wherever the address points.
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
                }
            }
            let at = w.at.wrapping_add(b * bb);
            // SAFETY: the 8 rows are whole rows (the caller's), each with block b at `b * bb`:
            // its head, then 16 bytes of nibbles or 32 signed bytes.
            let (d_w, m_w) = unsafe { heads::<F>(at, w.row_bytes) };
            // The 4-bit formats' pieces ([`nibble_pieces`]); Q8_0's rows as they are, with
            // their magnitudes, each row's bytes then taking their signs.
            let (lo, hi) = if F == Q8_0 {
                ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4])
            } else {
                // SAFETY: as above.
                unsafe { nibble_pieces(at.add(nibbles), w.row_bytes) }
            };
            let bytes: [__m256i; 8] = if F == Q8_0 {
                // SAFETY: as above: 32 bytes after each row's 2-byte scale.
                std::array::from_fn(|t| unsafe {
                    _mm256_loadu_si256(at.add(t * w.row_bytes + 2) as *const __m256i)
                })
            } else {
                [_mm256_setzero_si256(); 8]
            };
            let mag = bytes.map(|v| _mm256_abs_epi8(v));
            for (p, a) in acc.iter_mut().enumerate() {
                let xb = r.at(i0 + p, b);
                let mut s = if F == Q8_0 {
                    // SAFETY: a block's integers are 32 bytes.
                    let x = unsafe { _mm256_loadu_si256(xb.q.as_ptr() as *const __m256i) };
                    let ones = _mm256_set1_epi16(1);
                    sums(&std::array::from_fn(|t| {
                        let signed = _mm256_sign_epi8(x, bytes[t]);
                        _mm256_madd_epi16(_mm256_maddubs_epi16(mag[t], signed), ones)
                    }))
                } else {
                    // SAFETY: as above.
                    unsafe { piece_sums(&lo, &hi, xb.q.as_ptr()) }
                };
                if F == Q4_0 {
                    s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xb.sum));
                }
                let scale = _mm256_mul_ps(d_w, _mm256_set1_ps(xb.d));
                *a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), *a);
                if F == Q4_1 {
                    // `d · Q` rounded once, as the reference's step.
                    let dq = r.dq(i0 + p, b);
                    *a = _mm256_fmadd_ps(m_w, _mm256_set1_ps(dq), *a);
                }
            }
        }
        for (p, a) in acc.iter().enumerate() {
            // SAFETY: the caller's: row i0 + p of C has 8 writable values from `c`.
            unsafe { _mm256_storeu_ps(c.add((i0 + p) * c_rs), canonical8(*a)) };
        }
    }
}
