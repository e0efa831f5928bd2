//! Products with block-quantised weights (GGUF's Q4_0, Q4_1 and Q8_0) and their dequantisation,
//! with exactly the bits of the reference's `qmatmul` and `dequantize`.
//!
//! `qgemm` computes `C[m × n] = A[m × k] · W^T`, where `W = dequantize(w)` is `[n, k]` and `w`
//! holds each weight row as `k / 32` consecutive blocks. Each `C[i, j]` is one unbroken fma
//! chain along `k` from `+0`, `acc = fma(A[i, p], W[j, p], acc)` for `p` ascending, and each
//! `W[j, p]` is the one definition of a block's value (`tenet_reference::quant`): an f16 scale
//! `d` (and Q4_1's `m`) converted exactly, then `((q − 8) as f32) · d`, `(d · q) + m` (two
//! roundings, never fused) or `(q as i8 as f32) · d`. A NaN weight or product gives a NaN
//! output, stored as the canonical NaN, so a weight's NaN payload never shows.
//!
//! **Why it is shaped this way.** Decoding a token is `m = 1` (a few rows when requests are
//! batched) by weights up to 49152 × 1536: a matrix–vector product whose cost is reading the
//! weight bytes once, about 0.6 byte per multiply-add in Q4_1, and decoding them. Every output
//! is a serial chain along `k`, so the vector lanes run across outputs: the kernel takes 16
//! weight rows (one per AVX-512 lane; 8 at AVX2) and one block index at a time, loads the 16
//! rows' blocks as 128-bit pieces into four registers (rows `t, t+4, t+8, t+12` in register
//! `t`) and transposes them as 4 × 4 dwords within each 128-bit lane (eight unpacks), after
//! which register `c` holds, in lane `r`, bytes `4c .. 4c+4` of row `r`'s nibbles. Element
//! `e` is then a shift of one register; a 16-entry table lookup (`vpermps`, which reads only
//! the low 4 bits of each index, so no mask is needed) turns the nibble into `q − 8` or `q` as
//! an f32, and a multiply by the rows' `d` vector (converted with `vcvtph2ps`) gives the 16
//! weights. Q4_1's `(d · q) + m` is one fma there: `d · q` is exact (11 × 4 significant bits,
//! far from overflow and underflow), so rounding the product first changes nothing. Then one
//! fma per row of A (its value broadcast) continues 16 chains. With one row of A, four groups
//! of 16 rows share each block step (two for Q8_0, whose decoding needs more registers), so
//! that four chains hide the fma latency; with 2–4 rows two groups; with more, one. A pass
//! carries up to 16 rows of A (padded to a power of two by repeating its last row, whose
//! results are not stored), copied step-major first (`[p · K + i]`), so every broadcast is one
//! load at a constant offset.
//!
//! Threads split the output columns (weight rows) into tiles of 64 rows, in a few contiguous
//! parts per thread claimed from the pool (`tenet_sys::parallel`), so a thread the host slows
//! down takes fewer; which thread computes a column never changes its bits. A tile's 64 rows
//! are one contiguous stretch of W, but the kernel reads them as 64 short streams the hardware
//! prefetchers do not follow, so each block step prefetches its share of the next tile: from
//! memory that took a single thread's Q4_1 product from 5–6 GB/s to 15–18. (Prefetching a
//! part's whole first tile at once, 360 lines in a burst, made two threads slower than one.)
//!
//! For many rows of A (a prefill) decoding each weight once per 16 rows costs more than it
//! saves: from [`GEMM_MIN_ROWS`] rows on, a bounded chunk of weight rows is dequantised to f32
//! (in a scratch buffer kept by the thread) and multiplied by the f32 GEMM (`gemm::sgemm`,
//! reading the chunk as a transposed matrix), whose chains are the reference matmul's, so the
//! bits are the same. Both run near the FMA peak there; at 64 rows they were even (SmolLM2's
//! shapes, one thread), at 32 the quantised kernel took 0.63 of the GEMM path's time, at 128
//! the GEMM path 0.9 of the kernel's.
//!
//! Several products of the same rows of A ([`qgemm_siblings`]: attention's q, k and v) can run
//! as one: A's passes copied once and all the weights' tiles split among the threads together,
//! so a small weight does not leave a thread idle.
//!
//! A run's stop function is asked about every 2¹⁸ multiply-adds (after the piece of a tile
//! that crosses each multiple), and on the GEMM path between chunks and between GEMM calls,
//! each writing at most 2¹⁸ outputs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::SimdLevel;
use crate::gemm::{GemmError, Strided, sgemm};
use crate::simd::canonical;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod q8;

/// Elements per block.
pub const BLOCK: usize = 32;

/// A GGUF block format (the kernels' own copy of the graph's `QuantFormat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// `d` f16, 16 bytes of nibbles: `((q − 8) as f32) · d`.
    Q4_0,
    /// `d` f16, `m` f16, 16 bytes of nibbles: `(d · q) + m`.
    Q4_1,
    /// `d` f16, 32 signed bytes: `(q as i8 as f32) · d`.
    Q8_0,
}

impl QuantFormat {
    pub const ALL: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0];

    /// Bytes per block of 32 elements.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QgemmError {
    #[error("k = {0} is not a whole number of {BLOCK}-element blocks")]
    PartialBlock(usize),
    #[error("{len} bytes are not a whole number of {block_bytes}-byte blocks")]
    RaggedBlocks { len: usize, block_bytes: usize },
    #[error(
        "{operand} needs at least {needed} elements for this shape and strides, the slice has {len}"
    )]
    OutOfBounds {
        operand: &'static str,
        needed: usize,
        len: usize,
    },
    #[error("output row stride {rs} is smaller than n = {n}, so rows would overlap")]
    OverlappingRows { rs: usize, n: usize },
    #[error("products of the same rows of A need one k, got {first} and {other}")]
    SiblingK { first: usize, other: usize },
    #[error("SIMD level {0} is not supported by this CPU")]
    Unsupported(&'static str),
    #[error("the f32 product of dequantised weights: {0}")]
    Gemm(#[from] GemmError),
}

/// A quantised weight `[n, k]`: `n` rows of `k / 32` blocks each, row after row.
#[derive(Clone, Copy, Debug)]
pub struct QWeight<'a> {
    format: QuantFormat,
    n: usize,
    k: usize,
    bytes: &'a [u8],
}

impl<'a> QWeight<'a> {
    /// Checks that `k` is a multiple of 32 and that `bytes` holds at least the `n` rows.
    pub fn new(
        format: QuantFormat,
        n: usize,
        k: usize,
        bytes: &'a [u8],
    ) -> Result<QWeight<'a>, QgemmError> {
        if !k.is_multiple_of(BLOCK) {
            return Err(QgemmError::PartialBlock(k));
        }
        let needed = (k / BLOCK)
            .checked_mul(format.block_bytes())
            .and_then(|row| row.checked_mul(n));
        check("W", needed, bytes.len())?;
        Ok(QWeight {
            format,
            n,
            k,
            bytes,
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (the product's columns).
    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.k / BLOCK * self.format.block_bytes()
    }
}

fn check(operand: &'static str, needed: Option<usize>, len: usize) -> Result<(), QgemmError> {
    match needed {
        Some(n) if n <= len => Ok(()),
        _ => Err(QgemmError::OutOfBounds {
            operand,
            needed: needed.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// Elements a `rows × cols` row-major view with row stride `rs` spans, or `None` on overflow.
fn span(rows: usize, cols: usize, rs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1).checked_mul(rs)?.checked_add(cols)
}

// ---------------------------------------------------------------------------------------------
// The definition, in scalar code: the portable level, tails, and what the tests compare with.

/// An f16 (its bits) as the f32 of the same value: every f16 is exactly an f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = (h as u32 & 0x8000) << 16;
    let exp = (h as u32 >> 10) & 0x1f;
    let man = h as u32 & 0x3ff;
    match exp {
        // Zero or a denormal, man · 2⁻²⁴ (exact: a normal f32).
        0 => {
            let v = man as f32 * (1.0 / 16_777_216.0);
            if sign != 0 { -v } else { v }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | man << 13),
        _ => f32::from_bits(sign | (exp + 112) << 23 | man << 13),
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// The 32 values of one block (`format.block_bytes()` bytes), NaNs as computed (not made
/// canonical): the formula of `tenet_reference::quant::dequantize_block`.
pub(crate) fn block_values(format: QuantFormat, block: &[u8], out: &mut [f32; BLOCK]) {
    let nibble = |qs: &[u8], e: usize| {
        if e < 16 {
            qs[e] & 0x0f
        } else {
            qs[e - 16] >> 4
        }
    };
    match format {
        QuantFormat::Q4_0 => {
            let d = f16_at(block, 0);
            let qs = &block[2..18];
            for (e, o) in out.iter_mut().enumerate() {
                *o = (nibble(qs, e) as i32 - 8) as f32 * d;
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (f16_at(block, 0), f16_at(block, 2));
            let qs = &block[4..20];
            for (e, o) in out.iter_mut().enumerate() {
                *o = d * nibble(qs, e) as f32 + m;
            }
        }
        QuantFormat::Q8_0 => {
            let d = f16_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = (q as i8) as f32 * d;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantisation.

/// The values of consecutive blocks of `format` (`blocks.len()` a multiple of the block size)
/// into `out` (32 a block, exactly that many), NaNs canonical: the `dequantize` op's bits.
pub fn dequantize(
    level: SimdLevel,
    format: QuantFormat,
    blocks: &[u8],
    out: &mut [f32],
) -> Result<(), QgemmError> {
    if !level.supported() {
        return Err(QgemmError::Unsupported(level.name()));
    }
    let bb = format.block_bytes();
    if !blocks.len().is_multiple_of(bb) {
        return Err(QgemmError::RaggedBlocks {
            len: blocks.len(),
            block_bytes: bb,
        });
    }
    let nb = blocks.len() / bb;
    if out.len() != nb * BLOCK {
        return Err(QgemmError::OutOfBounds {
            operand: "out",
            needed: nb * BLOCK,
            len: out.len(),
        });
    }
    dequantize_checked(level, format, blocks, out);
    Ok(())
}

/// [`dequantize`] once the lengths and the level are known to be right.
fn dequantize_checked(level: SimdLevel, format: QuantFormat, blocks: &[u8], out: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is supported (checked by the caller), which includes AVX-512F;
        // `out` holds 32 values per block of `blocks` (checked by the caller).
        SimdLevel::Avx512 => unsafe { avx512::dequantize(format, blocks, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is supported (checked by the caller), which includes AVX2; `out`
        // holds 32 values per block of `blocks` (checked by the caller).
        SimdLevel::Avx2 => unsafe { avx2::dequantize(format, blocks, out) },
        _ => {
            let mut vals = [0.0f32; BLOCK];
            let bb = format.block_bytes();
            for (b, o) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(BLOCK)) {
                block_values(format, b, &mut vals);
                for (o, &v) in o.iter_mut().zip(&vals) {
                    *o = canonical(v);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The product.

/// From this many rows of A on, the product dequantises chunks of W and runs the f32 GEMM.
pub const GEMM_MIN_ROWS: usize = 64;

/// Weight rows one tile covers; threads take whole tiles.
pub(crate) const TILE: usize = 64;

/// Most rows of A one pass of the kernel carries (16 accumulators a group of 16 weight rows).
const MAX_PASS: usize = 16;

/// Multiply-adds between two questions to the stop function (the reference's `POLL_WORK`).
const POLL_WORK: usize = 1 << 18;

/// Least work worth a thread of its own: this many multiply-adds, or this many weight bytes.
/// A second thread costs a few microseconds (its first tile is read cold, and the parts are
/// handed out and waited for): a 192 × 576 Q4_1 weight (69 KB, 4 µs on one thread) took as
/// long or longer on two at 1–8 rows, a 576 × 576 one (207 KB) 0.65 of the time.
const MIN_WORK_PER_THREAD: usize = 1 << 19;
const MIN_BYTES_PER_THREAD: usize = 96 << 10;

/// Parts a thread's share is cut into, claimed one at a time: a thread the host slows takes
/// fewer of them.
const PARTS_PER_THREAD: usize = 2;

/// Rows of A from which [`tile_ranges`] takes a product as bound by arithmetic.
const COMPUTE_BOUND_ROWS: usize = 4;

/// Parts a thread's share of a product bound by arithmetic is cut into, at most.
const COMPUTE_BOUND_PARTS: usize = 8;

/// Floats of dequantised weight the GEMM path holds at once (2 MiB).
const CHUNK_FLOATS: usize = 1 << 19;

/// Output elements one f32 GEMM call of the GEMM path writes at most between two questions to
/// the stop function.
const GEMM_POLL_OUTPUTS: usize = 1 << 18;

/// For a product the GEMM path runs (`m >= GEMM_MIN_ROWS`): the weight rows dequantised at a
/// time and the rows of A one f32 GEMM call takes; `None` for the quantised kernel.
pub fn gemm_chunks(m: usize, n: usize, k: usize) -> Option<(usize, usize)> {
    if m < GEMM_MIN_ROWS || n == 0 || k == 0 {
        return None;
    }
    // Whole 48-column panels of the GEMM's 8×48 tile where the budget allows.
    let rows = (CHUNK_FLOATS / k).max(16);
    let rows = if rows >= 48 { rows / 48 * 48 } else { rows };
    let rows = rows.min(n);
    let slab = (GEMM_POLL_OUTPUTS / rows).clamp(1, m);
    Some((rows, slab))
}

/// Bytes `qgemm` may allocate for an `m × k` by `[n, k]` product of `format` on `threads`
/// threads beyond its operands, apart from the f32 GEMM's own packing on the GEMM path (see
/// [`gemm_chunks`]): there, the dequantised chunk (which the thread keeps for its next call);
/// on the quantised path, the step-major copy of A's rows (each pass padded to a power of two
/// rows, at most 16), the zero-padded last tile of W, and the portable kernel's dequantised
/// row per part.
pub fn scratch_bytes(format: QuantFormat, m: usize, n: usize, k: usize, threads: usize) -> u64 {
    let (m64, k64, t64) = (m as u64, k as u64, threads.max(1) as u64);
    let fixed = 4096 + 256 * t64;
    if let Some((rows, _)) = gemm_chunks(m, n, k) {
        return rows as u64 * k64 * 4 + fixed;
    }
    let a = m64.next_multiple_of(MAX_PASS as u64) * k64 * 4;
    let tail = TILE as u64 * (k64 / BLOCK as u64) * format.block_bytes() as u64;
    let rows = t64 * PARTS_PER_THREAD as u64 * k64 * 4;
    a + tail + rows + fixed
}

/// `C = A · W^T`: `A` is `m × k` row-major at row stride `a_rs`, `W` the dequantised `w`
/// (`[n, k]`), `C` `m × n` row-major at row stride `c_rs`, on up to `threads` threads. Every
/// element is the reference's chain and bits, at every level and thread count.
#[allow(clippy::too_many_arguments)]
pub fn qgemm(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: QWeight<'_>,
    c: &mut [f32],
    c_rs: usize,
) -> Result<(), QgemmError> {
    qgemm_polled(level, threads, m, a, a_rs, w, c, c_rs, &|| false).map(|_| ())
}

/// [`qgemm`], asking `stop` about every 2¹⁸ multiply-adds (and between the GEMM path's chunks
/// and calls, each writing at most 2¹⁸ outputs): once it says yes, the product gives up and
/// returns `Ok(false)`, with C partly written.
#[allow(clippy::too_many_arguments)]
pub fn qgemm_polled(
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
    if k == 0 {
        for i in 0..m {
            c[i * c_rs..i * c_rs + n].fill(0.0);
        }
        return Ok(true);
    }
    if let Some((rows, slab)) = gemm_chunks(m, n, k) {
        return by_gemm(level, threads, m, a, a_rs, w, c, c_rs, stop, rows, slab);
    }
    Ok(quantised(
        level,
        threads,
        m,
        a,
        a_rs,
        &[Sibling::new(w, c, c_rs)],
        stop,
    ))
}

/// Several products of the same rows of A, `C_p = A · dequantize(w_p)^T` (each `C_p` `m × n_p`
/// at row stride `c_rs_p`), as one where they take the quantised path: A's passes copied once
/// and the tiles of every weight shared out among the threads together (attention's q, k and
/// v: a small weight does not keep a thread waiting, and the pool is woken once). Where a
/// product takes the GEMM path (many rows), each runs on its own. Every output has the bits of
/// its product alone. `stop` as for [`qgemm_polled`].
pub fn qgemm_siblings(
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
        if !sibling_checked(level, m, a, a_rs, w, c, *c_rs, &mut first_k)? {
            continue;
        }
        if w.k == 0 || gemm_chunks(m, w.n, w.k).is_some() {
            // Nothing to share: zeros, or the GEMM path's own chunks.
            if !qgemm_polled(level, threads, m, a, a_rs, *w, c, *c_rs, stop)? {
                return Ok(false);
            }
            continue;
        }
        work.push(Sibling::new(*w, c, *c_rs));
    }
    Ok(quantised(level, threads, m, a, a_rs, &work, stop))
}

/// The checks every product makes before any work: the level supported, C's rows apart, A's
/// and C's extents. `Ok(false)` for an empty product (nothing to write).
fn checked(
    level: SimdLevel,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: &QWeight<'_>,
    c: &[f32],
    c_rs: usize,
) -> Result<bool, QgemmError> {
    if !level.supported() {
        return Err(QgemmError::Unsupported(level.name()));
    }
    let (n, k) = (w.n, w.k);
    if m == 0 || n == 0 {
        return Ok(false);
    }
    if c_rs < n {
        return Err(QgemmError::OverlappingRows { rs: c_rs, n });
    }
    check("A", span(m, k, a_rs), a.len())?;
    check("C", span(m, n, c_rs), c.len())?;
    Ok(true)
}

/// One of several products of the same A with work to do: its weight, and its C (from the
/// `&mut` slice it came from, which outlives the product) with C's row stride.
#[derive(Clone, Copy)]
struct Sibling<'a> {
    w: QWeight<'a>,
    c: SharedC,
    c_rs: usize,
}

impl<'a> Sibling<'a> {
    fn new(w: QWeight<'a>, c: &mut [f32], c_rs: usize) -> Sibling<'a> {
        let c = SharedC {
            ptr: c.as_mut_ptr(),
        };
        Sibling { w, c, c_rs }
    }
}

/// [`checked`] for one of several sibling products of the same A: also that its `k` is that
/// of the first one with work (`first_k`, set by that one).
#[allow(clippy::too_many_arguments)]
fn sibling_checked(
    level: SimdLevel,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: &QWeight<'_>,
    c: &[f32],
    c_rs: usize,
    first_k: &mut Option<usize>,
) -> Result<bool, QgemmError> {
    if !checked(level, m, a, a_rs, w, c, c_rs)? {
        return Ok(false);
    }
    match *first_k {
        Some(first) if first != w.k => Err(QgemmError::SiblingK { first, other: w.k }),
        _ => {
            *first_k = Some(w.k);
            Ok(true)
        }
    }
}

/// `tiles` of weight rows in contiguous ranges for `threads` threads, claimed one at a time,
/// for a product with `m` rows of A. Reading the weight bounds a product of few rows: one
/// part a thread for small ones (a part's first tile is read cold: nothing prefetched it),
/// larger ones up to [`PARTS_PER_THREAD`], of at least 4 tiles. Arithmetic bounds one of
/// [`COMPUTE_BOUND_ROWS`] rows or more, and a cold first tile costs little next to it: parts
/// of a tile or more, up to [`COMPUTE_BOUND_PARTS`] a thread, so that a thread the host
/// slows, or an odd count of tiles (SmolLM2's q, k and v together: 15, which the first rule
/// cuts into 3 parts of 5, one thread getting two: two thirds of their one-thread time
/// instead of half) leaves less of the work to one thread.
fn tile_ranges(threads: usize, tiles: usize, m: usize) -> Vec<std::ops::Range<usize>> {
    let parts = if threads == 1 {
        1
    } else if m >= COMPUTE_BOUND_ROWS {
        tiles.clamp(threads, threads * COMPUTE_BOUND_PARTS)
    } else {
        (tiles / 4).clamp(threads, threads * PARTS_PER_THREAD)
    };
    tenet_sys::parallel::ranges(tiles, parts, 1)
}

thread_local! {
    /// The GEMM path's dequantised chunk, kept between calls (a fresh one faults in its pages).
    static CHUNK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The GEMM path: `rows` weight rows at a time dequantised (split across threads), then
/// multiplied by `slab` rows of A at a time on the f32 GEMM.
#[allow(clippy::too_many_arguments)]
fn by_gemm(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    w: QWeight<'_>,
    c: &mut [f32],
    c_rs: usize,
    stop: &(dyn Fn() -> bool + Sync),
    rows: usize,
    slab: usize,
) -> Result<bool, QgemmError> {
    let (n, k) = (w.n, w.k);
    let row_bytes = w.row_bytes();
    let mut buf = CHUNK.take();
    if buf.len() < rows * k {
        buf = vec![0.0; rows * k];
    }
    let result = (|| {
        for j0 in (0..n).step_by(rows) {
            if stop() {
                return Ok(false);
            }
            let j1 = (j0 + rows).min(n);
            let chunk = &mut buf[..(j1 - j0) * k];
            let blocks = &w.bytes[j0 * row_bytes..j1 * row_bytes];
            let parts = tenet_sys::parallel::ranges(j1 - j0, threads.max(1), 1);
            let pieces: Vec<std::ops::Range<usize>> =
                parts.iter().map(|r| r.start * k..r.end * k).collect();
            tenet_sys::parallel::for_each_piece(chunk, &pieces, |range, out| {
                let (r0, r1) = (range.start / k, range.end / k);
                dequantize_checked(
                    level,
                    w.format,
                    &blocks[r0 * row_bytes..r1 * row_bytes],
                    out,
                );
            });
            let wt = Strided {
                data: chunk,
                rs: 1,
                cs: k,
            };
            for i0 in (0..m).step_by(slab) {
                if i0 > 0 && stop() {
                    return Ok(false);
                }
                let mm = slab.min(m - i0);
                let a = Strided {
                    data: &a[i0 * a_rs..],
                    rs: a_rs,
                    cs: 1,
                };
                let c = &mut c[i0 * c_rs + j0..];
                sgemm(level, threads, mm, j1 - j0, k, a, wt, c, c_rs)?;
            }
        }
        Ok(true)
    })();
    CHUNK.set(buf);
    result
}

/// C as the threads of one product share it: parts write disjoint columns of the same rows,
/// which `&mut` slices cannot express, so they reach it through the raw pointer.
#[derive(Clone, Copy)]
struct SharedC {
    ptr: *mut f32,
}

// SAFETY: the pointer is only used for the columns of the part that claimed them (parts never
// overlap), and the `&mut [f32]` it came from outlives every thread using it.
unsafe impl Send for SharedC {}
// SAFETY: as above.
unsafe impl Sync for SharedC {}

impl SharedC {
    /// C from element `at` on.
    ///
    /// # Safety
    /// `at` is inside C.
    unsafe fn at(self, at: usize) -> *mut f32 {
        // SAFETY: the caller's guarantee.
        unsafe { self.ptr.add(at) }
    }
}

/// Which kernel family runs the quantised path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The family for a supported level: AVX2's also needs F16C for the scales.
    fn for_level(level: SimdLevel) -> Kernel {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => Kernel::Avx512,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 if std::arch::is_x86_feature_detected!("f16c") => Kernel::Avx2,
            _ => Kernel::Portable,
        }
    }

    /// Rows of A one kernel pass carries at most.
    fn max_pass(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => 8,
            _ => MAX_PASS,
        }
    }
}

/// One pass's rows of A, step-major (`[p · rows + i]`), `rows` a power of two with the last
/// real row repeated up to it; `real` of them are stored.
struct Pass {
    first: usize,
    real: usize,
    rows: usize,
    a: Vec<f32>,
}

/// One product of the quantised path with work to do: its weight, where its C starts and C's
/// row stride, and its last tile padded with zero blocks to a whole tile (if partial).
struct Product<'a> {
    w: QWeight<'a>,
    c: SharedC,
    c_rs: usize,
    tail: Vec<u8>,
}

/// The quantised path: tiles of 64 weight rows split across threads; each tile runs every pass
/// of A's rows while its weights are in L1. Several products of the same A (siblings) share the
/// passes and one split of all their tiles.
fn quantised(
    level: SimdLevel,
    threads: usize,
    m: usize,
    a: &[f32],
    a_rs: usize,
    products: &[Sibling<'_>],
    stop: &(dyn Fn() -> bool + Sync),
) -> bool {
    let kernel = Kernel::for_level(level);
    let Some(k) = products.first().map(|p| p.w.k) else {
        return true;
    };
    let nb = k / BLOCK;
    // A's rows, a pass at a time, step-major.
    let passes: Vec<Pass> = (0..m)
        .step_by(kernel.max_pass())
        .map(|first| {
            let real = kernel.max_pass().min(m - first);
            let rows = real.next_power_of_two();
            let mut at = vec![0.0f32; k * rows];
            for (p, step) in at.chunks_exact_mut(rows).enumerate() {
                for (i, v) in step.iter_mut().enumerate() {
                    *v = a[(first + i.min(real - 1)) * a_rs + p];
                }
            }
            Pass {
                first,
                real,
                rows,
                a: at,
            }
        })
        .collect();
    // Tile `t` overall is tile `t - first[p]` of product p.
    let (mut first, mut tiles, mut worth) = (Vec::new(), 0, 0);
    let products: Vec<Product<'_>> = products
        .iter()
        .map(|&Sibling { w, c, c_rs }| {
            let (n, row_bytes) = (w.n, w.row_bytes());
            let own = n.div_ceil(TILE);
            let tail_rows = n - (own - 1) * TILE;
            let tail: Vec<u8> = if tail_rows < TILE && kernel != Kernel::Portable {
                let mut t = vec![0u8; TILE * row_bytes];
                t[..tail_rows * row_bytes].copy_from_slice(
                    &w.bytes[(own - 1) * TILE * row_bytes..][..tail_rows * row_bytes],
                );
                t
            } else {
                Vec::new()
            };
            first.push(tiles);
            tiles += own;
            let work = m.saturating_mul(n).saturating_mul(k);
            worth += (work / MIN_WORK_PER_THREAD).max(n * row_bytes / MIN_BYTES_PER_THREAD);
            Product { w, c, c_rs, tail }
        })
        .collect();
    let threads = threads.clamp(1, worth.clamp(1, tiles));
    let ranges = tile_ranges(threads, tiles, m);
    let stopped = AtomicBool::new(false);
    // Multiply-adds done by all parts: whichever tile takes the count past a multiple of
    // POLL_WORK asks `stop`.
    let done = AtomicUsize::new(0);
    let progress = |work: usize| {
        let before = done.fetch_add(work, Ordering::Relaxed);
        if (before + work) / POLL_WORK > before / POLL_WORK
            && !stopped.load(Ordering::Relaxed)
            && stop()
        {
            stopped.store(true, Ordering::Relaxed);
        }
        stopped.load(Ordering::Relaxed)
    };
    let body = |part: usize| {
        let mut wrow = Vec::new();
        for t in ranges[part].clone() {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            let p = first.partition_point(|&f| f <= t) - 1;
            let Product { w, c, c_rs, tail } = &products[p];
            let (n, row_bytes, c_rs) = (w.n, w.row_bytes(), *c_rs);
            let j0 = (t - first[p]) * TILE;
            let cols = TILE.min(n - j0);
            let tile_w: &[u8] = if cols < TILE && !tail.is_empty() {
                tail
            } else {
                &w.bytes[j0 * row_bytes..(j0 + cols) * row_bytes]
            };
            for pass in &passes {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                // SAFETY: the part owns columns j0..j0 + cols of every row of this C (parts
                // cover disjoint tiles); C spans (m-1)·c_rs + n elements (checked by the
                // caller), and the pass's rows are below m.
                let c_at = unsafe { c.at(pass.first * c_rs + j0) };
                let args = TileArgs {
                    w: tile_w,
                    row_bytes,
                    nb,
                    a: &pass.a,
                    rows: pass.rows,
                    real: pass.real,
                    c: c_at,
                    c_rs,
                    cols,
                    cold: t == ranges[part].start && pass.first == 0,
                    progress: &progress,
                };
                match kernel {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX-512F is supported (the level was checked); the tile holds
                    // 64 whole rows of nb blocks (the padded tail or W's rows), the pass's A
                    // k·rows values, and C the rows and columns described above.
                    Kernel::Avx512 => unsafe { avx512::tile(w.format, &args) },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: AVX2, FMA and F16C are supported (level checked, F16C detected);
                    // extents as above.
                    Kernel::Avx2 => unsafe { avx2::tile(w.format, &args) },
                    // SAFETY: extents as above.
                    Kernel::Portable => unsafe { portable_tile(w.format, &args, &mut wrow) },
                }
            }
        }
    };
    if ranges.len() == 1 {
        body(0);
    } else {
        tenet_sys::parallel::run_parts(ranges.len(), &body);
    }
    !stopped.load(Ordering::Relaxed)
}

/// One tile of the quantised path for a kernel: weight rows `w` (64 of them for the SIMD
/// kernels, `cols` for the portable one), one pass of A's rows, and where C's part starts.
pub(crate) struct TileArgs<'t> {
    /// The tile's weight rows, `row_bytes` each.
    pub w: &'t [u8],
    pub row_bytes: usize,
    /// Blocks per row.
    pub nb: usize,
    /// The pass's rows of A, step-major: `a[p · rows + i]`.
    pub a: &'t [f32],
    /// Rows in the pass (a power of two), and how many of them are stored.
    pub rows: usize,
    pub real: usize,
    /// C at the pass's first row and the tile's first column.
    pub c: *mut f32,
    pub c_rs: usize,
    /// Columns of C (weight rows) the tile stores, at most 64.
    pub cols: usize,
    /// Whether the tile is the first of its part: nothing prefetched it.
    pub cold: bool,
    /// Told the multiply-adds done after each piece of the tile; `true` means stop (the tile
    /// is left unfinished).
    pub progress: &'t dyn Fn(usize) -> bool,
}

/// The portable kernel: each weight row dequantised once per pass, then each of the pass's
/// rows of A runs its chain along it.
///
/// # Safety
/// `t.c` points at `t.real` rows of `t.cols` writable values, `t.c_rs` apart, that no other
/// thread touches meanwhile.
unsafe fn portable_tile(format: QuantFormat, t: &TileArgs<'_>, wrow: &mut Vec<f32>) {
    let k = t.nb * BLOCK;
    wrow.resize(k, 0.0);
    let mut vals = [0.0f32; BLOCK];
    let bb = format.block_bytes();
    for j in 0..t.cols {
        let row = &t.w[j * t.row_bytes..(j + 1) * t.row_bytes];
        for (b, out) in row.chunks_exact(bb).zip(wrow.chunks_exact_mut(BLOCK)) {
            block_values(format, b, &mut vals);
            out.copy_from_slice(&vals);
        }
        for i in 0..t.real {
            let mut acc = 0.0f32;
            for (p, &wv) in wrow.iter().enumerate() {
                acc = t.a[p * t.rows + i].mul_add(wv, acc);
            }
            // SAFETY: row i < real, column j < cols: inside the caller's part of C.
            unsafe { *t.c.add(i * t.c_rs + j) = canonical(acc) };
        }
        if (t.progress)(t.real * k) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(
            f16_to_f32(0x83ff).to_bits(),
            (-(1023.0 * 2f32.powi(-24))).to_bits()
        );
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e01).is_nan() && f16_to_f32(0x7c01).is_nan());
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
    }

    /// The kernels compute Q4_1's `(d · q) + m` as one fma: the same bits for every f16 `d`,
    /// every nibble and a spread of `m` (signed zeros, infinities, NaN, denormals, the largest
    /// f16, values that cancel `d · q` exactly or nearly), because `d · q` is exact.
    #[test]
    fn q4_1_product_then_sum_is_one_fma() {
        let mut ms: Vec<u16> = vec![
            0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x83ff, 0x7bff, 0xfbff,
        ];
        let mut x = 0x2545_f491_u32;
        ms.extend((0..40).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u16
        }));
        for d in 0..=u16::MAX {
            let d = f16_to_f32(d);
            for q in 0..16u8 {
                let q = q as f32;
                let check = |m: f32| {
                    let (two, one) = (d * q + m, q.mul_add(d, m));
                    assert!(
                        two.to_bits() == one.to_bits() || (two.is_nan() && one.is_nan()),
                        "d {d:e} q {q} m {m:e}: {two:e} vs {one:e}"
                    );
                };
                ms.iter().for_each(|&m| check(f16_to_f32(m)));
                // Exact and near cancellation: m = -(d · q) and its neighbours in f16.
                let minus = -(d * q);
                check(minus);
                check(f32::from_bits(minus.to_bits().wrapping_add(1 << 13)));
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let w = [0u8; 40];
        assert_eq!(
            QWeight::new(QuantFormat::Q4_1, 2, 31, &w).err(),
            Some(QgemmError::PartialBlock(31))
        );
        assert!(matches!(
            QWeight::new(QuantFormat::Q4_1, 3, 32, &w),
            Err(QgemmError::OutOfBounds { operand: "W", .. })
        ));
        let q = QWeight::new(QuantFormat::Q4_1, 2, 32, &w).unwrap();
        let a = [0.0f32; 64];
        let mut c = [0.0f32; 4];
        let level = SimdLevel::Portable;
        assert!(matches!(
            qgemm(level, 1, 2, &a[..40], 32, q, &mut c, 2),
            Err(QgemmError::OutOfBounds { operand: "A", .. })
        ));
        assert!(matches!(
            qgemm(level, 1, 3, &a, 32, q, &mut c, 2),
            Err(QgemmError::OutOfBounds { .. })
        ));
        assert!(matches!(
            qgemm(level, 1, 2, &a, 32, q, &mut c, 1),
            Err(QgemmError::OverlappingRows { .. })
        ));
        assert!(qgemm(level, 1, 2, &a, 32, q, &mut c, 2).is_ok());
        let mut out = [0.0f32; 32];
        assert!(matches!(
            dequantize(level, QuantFormat::Q4_0, &w[..19], &mut out),
            Err(QgemmError::RaggedBlocks { .. })
        ));
        assert!(matches!(
            dequantize(level, QuantFormat::Q4_0, &w[..36], &mut out),
            Err(QgemmError::OutOfBounds { .. })
        ));
        assert!(dequantize(level, QuantFormat::Q4_0, &w[..18], &mut out).is_ok());
    }
}
