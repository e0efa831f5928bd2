//! Deterministic single-precision matrix product `C = A·B`.
//!
//! Every `C[i, j]` is one unbroken chain of fused multiply-adds along `k`, starting from `+0`
//! (docs/OPS.md, "Matrix product"). The driver blocks the problem BLIS-style (panels of B in
//! cache, panels of A packed, register-blocked micro-kernels), and each k-block of a C tile
//! starts from the partial result the previous k-block stored, so blocking, SIMD width and the
//! split of rows over threads never change a bit.
//!
//! Each chunk of B's columns is packed once, by all threads together, and shared; each thread
//! then owns blocks of whole micro-panels of C's rows, and one that runs out takes column
//! groups from the back of another's. Packing buffers are kept per thread between calls.

use crate::SimdLevel;
use crate::simd::canonical;

#[cfg(target_arch = "x86_64")]
mod few_rows_avx2;
mod offsets;

pub use offsets::{GroupEpilogue, OffsetPanel, sgemm_offsets};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
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
    #[error("SIMD level {0} is not supported by this CPU")]
    Unsupported(&'static str),
}

/// A read-only matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Strided<'a> {
    /// A row-major matrix with `cols` columns.
    pub fn row_major(data: &'a [f32], cols: usize) -> Strided<'a> {
        Strided {
            data,
            rs: cols,
            cs: 1,
        }
    }

    fn offset_rows(self, rows: usize) -> Strided<'a> {
        Strided {
            data: &self.data[rows * self.rs..],
            ..self
        }
    }
}

/// Elements a `rows × cols` view with these strides spans, or `None` on overflow.
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

fn check(operand: &'static str, needed: Option<usize>, len: usize) -> Result<(), GemmError> {
    match needed {
        Some(n) if n <= len => Ok(()),
        _ => Err(GemmError::OutOfBounds {
            operand,
            needed: needed.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// `C[m × n] = A[m × k] · B[k × n]`, C row-major with row stride `c_rs`, on up to `threads`
/// threads. The result is bit-identical to the reference for every level and thread count.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    level: SimdLevel,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    c: &mut [f32],
    c_rs: usize,
) -> Result<(), GemmError> {
    sgemm_then(level, threads, m, n, k, a, b, c, c_rs, None)
}

/// Work on rows of C once they are final (a bias, an activation): `f(first, rows)` gets the
/// index of the first row and the part of C from that row's start to the last row's end
/// (`n` values per row at stride `c_rs`). Every row is passed exactly once, on whichever
/// thread computed it, usually while it is still in cache.
pub type Epilogue<'e> = &'e (dyn Fn(usize, &mut [f32]) + Sync);

/// What every product checks first: the level, C's rows apart, A and C inside their slices.
/// `false` when there is nothing to compute (no rows or no columns).
fn checked(
    level: SimdLevel,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    c: &[f32],
    c_rs: usize,
) -> Result<bool, GemmError> {
    if !level.supported() {
        return Err(GemmError::Unsupported(level.name()));
    }
    if m == 0 || n == 0 {
        return Ok(false);
    }
    if c_rs < n {
        return Err(GemmError::OverlappingRows { rs: c_rs, n });
    }
    check("A", span(m, k, a.rs, a.cs), a.data.len())?;
    check("C", span(m, n, c_rs, 1), c.len())?;
    Ok(true)
}

/// [`sgemm`], then `epilogue` over the rows of C as they become final.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_then(
    level: SimdLevel,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    c: &mut [f32],
    c_rs: usize,
    epilogue: Option<Epilogue<'_>>,
) -> Result<(), GemmError> {
    if !checked(level, m, n, k, a, c, c_rs)? {
        return Ok(());
    }
    check("B", span(k, n, b.rs, b.cs), b.data.len())?;
    let whole = |c: &mut [f32]| {
        if let Some(f) = epilogue {
            f(0, &mut c[..(m - 1) * c_rs + n]);
        }
    };
    if k == 0 {
        for i in 0..m {
            c[i * c_rs..i * c_rs + n].fill(0.0);
        }
        whole(c);
        return Ok(());
    }
    if m <= SMALL_M {
        small_m(level, threads, m, n, k, a, b, c, c_rs);
        whole(c);
        return Ok(());
    }
    let cfg = Config::for_level(level, n);
    (cfg.run)(&cfg, threads, m, n, k, a, b, c, c_rs, epilogue);
    Ok(())
}

/// Writes one panel of B in the packed layout: `pack(first, cols, nr, dst)` sets
/// `dst[p * nr + j]` to `B(p, first + j)` for every step `p < k` and `j < cols` (`cols ≤ nr`;
/// the rest of `dst` is already zero). B never exists as a matrix: a convolution writes its
/// im2col straight into the panels, a panel at a time, while it is in cache.
pub type PackB<'p> = &'p (dyn Fn(usize, usize, usize, &mut [f32]) + Sync);

/// Asked before each panel; `true` abandons the product (C is then partly written).
pub type Stop<'s> = &'s (dyn Fn() -> bool + Sync);

/// Work on a finished part of one row of C (a bias): `f(row, first, values)` gets columns
/// `first..first + values.len()` of that row, on the thread that computed them, while they
/// are in cache. Every element is passed exactly once.
pub type RowPart<'r> = &'r (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// `C[m × n] = A[m × k] · B[k × n]` where `pack` writes B's panels (see [`PackB`]): each thread
/// packs a panel of columns into its own buffer and runs every row of C over it at once, so
/// the panel is read from L1/L2 right after it was written. A is packed once for all the
/// panels (on the calling thread, [`packing_b_scratch_bytes`]) where the level does not read
/// it in place. The same kernels and chains as [`sgemm`], so the same bits.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_packing_b(
    level: SimdLevel,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    pack: PackB<'_>,
    stop: Stop<'_>,
    c: &mut [f32],
    c_rs: usize,
    then: Option<RowPart<'_>>,
) -> Result<(), GemmError> {
    if !checked(level, m, n, k, a, c, c_rs)? {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            let row = &mut c[i * c_rs..i * c_rs + n];
            row.fill(0.0);
            if let Some(f) = then {
                f(i, 0, row);
            }
        }
        return Ok(());
    }
    let cfg = Config::for_level(level, n);
    (cfg.run_packing)(&cfg, threads, m, n, k, a, pack, stop, c, c_rs, then);
    Ok(())
}

/// Bytes of the copy of A that [`sgemm_packing_b`] packs once for all its panels of columns
/// (`m` rows by `k` steps, rows rounded up to any level's panel height), kept by the calling
/// thread for its next product; a caller's memory bound adds it per thread that may call.
pub fn packing_b_scratch_bytes(m: usize, k: usize) -> u64 {
    (m.next_multiple_of(12) * k + ALIGN_FLOATS) as u64 * 4
}

/// Products with at most this many rows (one decoded token, say) skip packing: packing B would
/// cost more than the product itself.
/// Products of at most this many rows run on the column-vectorised few-rows path.
pub const SMALL_M: usize = 4;

/// `C = A·B` for a few rows: every element is the same unbroken fma chain along k, computed in
/// place from A and B; the columns are split across threads.
#[allow(clippy::too_many_arguments)]
fn small_m(
    level: SimdLevel,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    c: &mut [f32],
    c_rs: usize,
) {
    let threads = threads.clamp(1, n.div_ceil(256).max(1));
    let per = n.div_ceil(threads);
    // Columns `j0..` of rows 0..m into `out` (m rows of `out.len() / m` columns, row-major).
    let block = |j0: usize, out: &mut [f32]| {
        let w = out.len() / m;
        #[cfg(target_arch = "x86_64")]
        if level == SimdLevel::Avx512 && x86::gather_fits(b.cs) {
            // SAFETY: `sgemm` checked that the CPU supports AVX-512 and the extents of A and B
            // (for rows < m, columns < n, steps < k); `gather_fits` the offsets' range.
            unsafe { x86::small_m_avx512(m, j0, k, a, b, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `sgemm` checked that the CPU supports AVX2 and FMA and the extents of A and
        // B; `m <= SMALL_M`.
        if level == SimdLevel::Avx2 && unsafe { few_rows_avx2::small_m_avx2(m, j0, k, a, b, out) } {
            return;
        }
        for i in 0..m {
            let row = &mut out[i * w..(i + 1) * w];
            match level {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `sgemm` checked that the CPU supports `level`, which includes FMA for
                // both x86 levels; the extents of A and B were checked there too.
                SimdLevel::Avx512 | SimdLevel::Avx2 => unsafe {
                    x86::dot_rows_fma(i, j0, k, a, b, row)
                },
                _ => dot_rows(i, j0, k, a, b, row),
            }
        }
    };
    // One thread and rows of C that lie end to end (attention's many tiny products): straight
    // into C, nothing allocated.
    if threads == 1 && c_rs == n {
        block(0, &mut c[..m * n]);
        return;
    }
    // One slot per column block, each filled by its own part.
    let mut blocks: Vec<(usize, Vec<f32>)> =
        (0..n).step_by(per).map(|j0| (j0, Vec::new())).collect();
    let parts: Vec<std::ops::Range<usize>> = (0..blocks.len()).map(|i| i..i + 1).collect();
    tenet_sys::parallel::for_each_piece(&mut blocks, &parts, |_, slot| {
        let j0 = slot[0].0;
        let mut out = vec![0.0f32; m * ((j0 + per).min(n) - j0)];
        block(j0, &mut out);
        slot[0].1 = out;
    });
    for (j0, out) in blocks {
        let w = out.len() / m;
        for i in 0..m {
            c[i * c_rs + j0..i * c_rs + j0 + w].copy_from_slice(&out[i * w..(i + 1) * w]);
        }
    }
}

/// Row `i` of A times columns `j0..` of B into `out`: one fma chain along k per element.
fn dot_rows(i: usize, j0: usize, k: usize, a: Strided<'_>, b: Strided<'_>, out: &mut [f32]) {
    for (jj, o) in out.iter_mut().enumerate() {
        let j = j0 + jj;
        let mut acc = 0.0f32;
        for p in 0..k {
            acc = a.data[i * a.rs + p * a.cs].mul_add(b.data[p * b.rs + j * b.cs], acc);
        }
        *o = canonical(acc);
    }
}

/// A micro-kernel: `C[MR × NR] (+)= Apanel · Bpanel` over `kc` steps, where the panels are
/// packed (`a[p * MR + i]`, `b[p * NR + j]`; a kernel that reads A in place takes
/// `a[i * a_rs + p]` instead, and the others ignore `a_rs`), `load` says whether C holds a
/// partial chain, and
/// `last` that this is the final k-block, whose NaN results are stored as the canonical NaN.
/// `ahead` says what to prefetch for the calls that follow.
type Kernel = unsafe fn(
    kc: usize,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    load: bool,
    last: bool,
    ahead: Ahead,
);

/// What a micro-kernel call prefetches for the calls after it. Prefetching never faults, so
/// these pointers are only hints: null or stale ones cost nothing but a wasted load.
#[derive(Clone, Copy)]
struct Ahead {
    /// The C tile the next call uses (null if none), into L1.
    c: *const f32,
    /// A stretch of the B panel the next column of tiles uses, `b_lines` cache lines from
    /// `b`, into L2: the calls down one column each fetch a share (the AVX-512 kernel up to
    /// one line per four k steps), so the column after it finds its panel in L2, not L3.
    /// On 2048² products with two threads this took 57–58 ms to 55–56 here.
    b: *const f32,
    b_lines: usize,
}

impl Ahead {
    const NONE: Ahead = Ahead {
        c: std::ptr::null(),
        b: std::ptr::null(),
        b_lines: 0,
    };

    /// A packed kernel's k-loop: `step(p)` for `p` in `0..kc`, four at a time, fetching one
    /// line of the next column's B panel (into L2) every four steps. Inlined into each
    /// kernel, where the closure's accumulators stay in registers.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn steps(self, kc: usize, mut step: impl FnMut(usize)) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let mut p = 0;
        while p + 4 <= kc {
            if p / 4 < self.b_lines {
                // SAFETY: SSE is in every x86_64 CPU, and prefetching never faults, wherever
                // it points.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(self.b.wrapping_add(p * 4) as *const i8) };
            }
            step(p);
            step(p + 1);
            step(p + 2);
            step(p + 3);
            p += 4;
        }
        while p < kc {
            step(p);
            p += 1;
        }
    }
}

struct Config {
    kc: usize,
    mc: usize,
    kernel: Kernel,
    /// The kernel for the first tile of a column of tiles, whose B panel is not in L1 yet
    /// (it comes from L2 or L3): the same chains, prefetching B ahead as it goes.
    kernel_first: Kernel,
    /// The kernel that reads A in place from a row-major operand (no packing), if the level
    /// has one. It has no first-tile variant: the B panel a column's first tile reads was
    /// fetched into L2 by the tiles of the column before (`Ahead::b`), and prefetching it
    /// into L1 as well cost that tile a quarter more time (3 more load-port operations per
    /// 11), 2048² 50.1–50.6 → 48.9–49.5 ms without it (medians of 12, alternated builds;
    /// other shapes unchanged).
    direct: Option<Kernel>,
    /// Pack A's whole panels, and B's whole panels when its columns are contiguous, with
    /// AVX-512 register transposes.
    pack_avx512: bool,
    /// `blocked::<MR, NR>` for this kernel's tile.
    run: Blocked,
    /// `packing_b::<MR, NR>` for this kernel's tile.
    run_packing: PackingB,
}

type PackingB = fn(
    &Config,
    usize,
    usize,
    usize,
    usize,
    Strided<'_>,
    PackB<'_>,
    Stop<'_>,
    &mut [f32],
    usize,
    Option<RowPart<'_>>,
);

type Blocked = fn(
    &Config,
    usize,
    usize,
    usize,
    usize,
    Strided<'_>,
    Strided<'_>,
    &mut [f32],
    usize,
    Option<Epilogue<'_>>,
);

impl Config {
    /// The AVX-512 configuration for an `MR`×`NR` tile (`NR` = 16·`NV`).
    ///
    /// 8×48 tiles: 24 zmm accumulators, 3 B loads and 8 broadcasts per 24 fmas (0.91 of the
    /// one-core peak with A and B in cache here; 12×32 0.85). KC 1024: the B panel (192 KiB
    /// at 8×48) and MC rows of A (384 KiB) stream from L2, and C goes through the registers
    /// once per 1024 steps. 2048² with 2 threads: KC 128 60.6 ms, 256 56.6, 512 52.9, 1024
    /// 51.7, 2048 51.5; MC 48 54.7, 96 51.7, 192 52.7.
    #[cfg(target_arch = "x86_64")]
    fn avx512<const MR: usize, const NV: usize, const NR: usize>() -> Config {
        const { assert!(NR == 16 * NV) };
        Config {
            kc: 1024,
            mc: 96,
            kernel: x86::kernel_avx512::<MR, NV, 0>,
            kernel_first: x86::kernel_avx512::<MR, NV, B_PREFETCH_STEPS>,
            direct: Some(x86::kernel_avx512_direct::<MR, NV>),
            pack_avx512: true,
            run: blocked::<MR, NR>,
            run_packing: packing_b::<MR, NR>,
        }
    }

    /// The configuration for `level` and products `n` columns wide.
    fn for_level(level: SimdLevel, n: usize) -> Config {
        match level {
            // 12×32 tiles where 48-column panels would pad the product by more than 1/16 and
            // 32-column ones less (attention's 32 and 128 columns: 16 of every 48 or 144
            // computed for nothing; 2048 columns pad to 2064 and stay with 8×48).
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512
                if (n.next_multiple_of(48) - n) * 16 > n
                    && n.next_multiple_of(32) - n < n.next_multiple_of(48) - n =>
            {
                Config::avx512::<12, 2, 32>()
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => Config::avx512::<8, 3, 48>(),
            #[cfg(target_arch = "x86_64")]
            // kc 512 and mc 60 with the prefetching kernel: 2048² with 2 threads 101–107 →
            // 84–86 ms (kc 256, mc 120 without prefetching), 1024² 11.4 → 10.5, MiniLM's
            // 4096×1536×384 26.5 → 23.5; kc 256–1024 and mc 36–120 within ~3% of it.
            SimdLevel::Avx2 => Config {
                kc: 512,
                mc: 60,
                kernel: x86::kernel_avx2,
                kernel_first: x86::kernel_avx2,
                direct: None,
                pack_avx512: false,
                run: blocked::<6, 16>,
                run_packing: packing_b::<6, 16>,
            },
            _ => Config {
                kc: 256,
                mc: 64,
                kernel: kernel_portable,
                kernel_first: kernel_portable,
                direct: None,
                pack_avx512: false,
                run: blocked::<PMR, PNR>,
                run_packing: packing_b::<PMR, PNR>,
            },
        }
    }
}

/// Pack `rows × kc` of A (from row `r0`, column `p0`) as panels of `MR` rows: within a panel,
/// step `p` holds the `MR` values of column `p0 + p`. Rows past `rows` are zero.
fn pack_a<const MR: usize>(
    cfg: &Config,
    dst: &mut [f32],
    a: Strided<'_>,
    r0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
) {
    for (q, panel) in dst.chunks_mut(MR * kc).take(rows.div_ceil(MR)).enumerate() {
        let valid = MR.min(rows - q * MR);
        if a.cs == 1 && valid == MR {
            // Read MR rows side by side, write the panel front to back.
            let src: [&[f32]; MR] =
                std::array::from_fn(|i| &a.data[(r0 + q * MR + i) * a.rs + p0..][..kc]);
            #[cfg(target_arch = "x86_64")]
            if cfg.pack_avx512 {
                // SAFETY: `pack_avx512` is set only in the AVX-512 configuration, which
                // `sgemm` runs only on a CPU that has AVX-512F.
                unsafe { x86::pack_panel_transposed(&src, panel) };
                continue;
            }
            for (p, out) in panel.chunks_exact_mut(MR).enumerate() {
                for (o, row) in out.iter_mut().zip(&src) {
                    *o = row[p];
                }
            }
        } else {
            for (p, out) in panel.chunks_exact_mut(MR).enumerate() {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = if i < valid {
                        a.data[(r0 + q * MR + i) * a.rs + (p0 + p) * a.cs]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Pack `kc × cols` of B (from row `p0`, column `c0`) as panels of `NR` columns: within a
/// panel, step `p` holds the `NR` values of row `p0 + p`. Columns past `cols` are zero.
fn pack_b<const NR: usize>(
    cfg: &Config,
    dst: &mut [f32],
    b: Strided<'_>,
    p0: usize,
    kc: usize,
    c0: usize,
    cols: usize,
) {
    let panels = cols.div_ceil(NR);
    let full = if b.cs == 1 { cols / NR } else { 0 };
    // Full panels row by row: each row of B is read front to back.
    for p in 0..kc {
        let row = &b.data[(p0 + p) * b.rs + c0..];
        for q in 0..full {
            let src: &[f32; NR] = row[q * NR..][..NR].try_into().expect("NR values");
            dst[q * NR * kc + p * NR..][..NR].copy_from_slice(src);
        }
    }
    // Column-contiguous B (a transposed matrix): read each column front to back and write it
    // down the panel at stride NR, which stays in L1.
    if b.rs == 1 && b.cs != 1 {
        for q in 0..panels {
            let j0 = c0 + q * NR;
            let valid = NR.min(cols - q * NR);
            let panel = &mut dst[q * NR * kc..(q + 1) * NR * kc];
            #[cfg(target_arch = "x86_64")]
            if cfg.pack_avx512 && valid == NR {
                let src: [&[f32]; NR] =
                    std::array::from_fn(|j| &b.data[(j0 + j) * b.cs + p0..][..kc]);
                // SAFETY: `pack_avx512` is set only in the AVX-512 configuration, which
                // `sgemm` runs only on a CPU that has AVX-512F.
                unsafe { x86::pack_panel_transposed(&src, panel) };
                continue;
            }
            for j in 0..NR {
                if j < valid {
                    let col = &b.data[(j0 + j) * b.cs + p0..][..kc];
                    for (p, &v) in col.iter().enumerate() {
                        panel[p * NR + j] = v;
                    }
                } else {
                    for p in 0..kc {
                        panel[p * NR + j] = 0.0;
                    }
                }
            }
        }
        return;
    }
    // Strided B and the partial last panel, element by element.
    for q in full..panels {
        let j0 = c0 + q * NR;
        let valid = NR.min(cols - q * NR);
        for p in 0..kc {
            let out = &mut dst[q * NR * kc + p * NR..][..NR];
            for (j, o) in out.iter_mut().enumerate() {
                *o = if j < valid {
                    b.data[(p0 + p) * b.rs + (j0 + j) * b.cs]
                } else {
                    0.0
                };
            }
        }
    }
}

/// Most bytes of packed B one pass over C holds: a chunk of B's columns, packed once and
/// shared by every thread. Threads read it one micro-panel at a time (from L3, or memory), so
/// its size bounds the memory held, not a cache. Every chunk after the first passes over all
/// of A and C again: 2048² in one chunk instead of three (1008, 1008 and 32 columns) took
/// 50.7–52.2 → 49.6–50.9 ms with two threads here.
const PACKED_B_BYTES: usize = 24 << 20;

/// Widest chunk of columns: `mc` rows of C by this many columns (1 MiB at `mc` 96, half of
/// this machine kind's L2) stay in L2 while every k-block of the chunk passes over them, so
/// C comes from memory once.
const NC_MAX: usize = 2688;

thread_local! {
    /// Packing buffers kept between calls: a fresh allocation costs a page fault per 4 KiB
    /// touched, which is most of the packing time of a small product.
    static SCRATCH_A: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static SCRATCH_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// [`sgemm_packing_b`]'s A, packed once for all its panels of columns.
    static SCRATCH_PACKED_A: std::cell::Cell<Vec<f32>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` on this thread's `len`-element scratch buffer (contents unspecified). A nested call
/// finds the buffer taken and allocates its own.
fn with_scratch<R>(
    key: &'static std::thread::LocalKey<std::cell::Cell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    let mut buf = key.take();
    if buf.len() < len + ALIGN_FLOATS {
        buf = vec![0.0; len + ALIGN_FLOATS];
    }
    // Start on a cache line: a 64-byte vector load from a misaligned panel straddles two lines.
    let skip = buf.as_ptr().align_offset(64).min(ALIGN_FLOATS);
    let out = f(&mut buf[skip..skip + len]);
    key.set(buf);
    out
}

/// How many k steps ahead the first tile of a column prefetches its B panel.
#[cfg(target_arch = "x86_64")]
const B_PREFETCH_STEPS: usize = 16;

/// Floats in one cache line: the slack a scratch buffer needs to start on a line boundary.
const ALIGN_FLOATS: usize = 16;

/// Column groups a block of rows is cut into for stealing: a thread that runs out of its own
/// blocks takes one group (a quarter of a block's columns) at a time from the back of another
/// thread's rows, so the threads finish within about a group's time of each other.
const COLUMN_GROUPS: usize = 4;

/// C as the threads of one product share it. Two threads may write different columns of the
/// same rows at once (a stolen column group), which `&mut` slices cannot express, so tiles
/// are reached through the raw pointer; every element is written only by the thread that
/// claimed the unit of work holding it, and claims never overlap.
#[derive(Clone, Copy)]
struct SharedC {
    ptr: *mut f32,
    /// Elements from `ptr` that belong to C.
    len: usize,
}

// SAFETY: the pointer is only used for the elements of claimed, disjoint units of work (see
// the type's comment); the `&mut [f32]` it came from outlives every thread using it.
unsafe impl Send for SharedC {}
// SAFETY: as above.
unsafe impl Sync for SharedC {}

impl SharedC {
    fn new(c: &mut [f32]) -> SharedC {
        SharedC {
            ptr: c.as_mut_ptr(),
            len: c.len(),
        }
    }

    /// C from element `at` on.
    fn from(self, at: usize) -> SharedC {
        assert!(at <= self.len, "offset inside C");
        SharedC {
            // SAFETY: `at` is at most the length (checked above).
            ptr: unsafe { self.ptr.add(at) },
            len: self.len - at,
        }
    }

    /// The first `rows` rows (`n` values each, `c_rs` apart) as one slice, from the first row's
    /// start to the last row's end.
    ///
    /// # Safety
    /// No other thread touches those rows while the slice lives.
    unsafe fn rows<'c>(self, rows: usize, n: usize, c_rs: usize) -> &'c mut [f32] {
        assert!(rows > 0, "at least one row");
        let len = (rows - 1) * c_rs + n;
        assert!(len <= self.len, "rows inside C");
        // SAFETY: in bounds (checked above); exclusive (the caller's guarantee).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    /// Copy `out.len()` elements from `at` into `out`.
    ///
    /// # Safety
    /// No other thread writes those elements meanwhile (they are in the caller's unit).
    unsafe fn read(self, at: usize, out: &mut [f32]) {
        assert!(at + out.len() <= self.len, "read inside C");
        // SAFETY: in bounds (checked above); no concurrent writer (the caller's guarantee).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), out.as_mut_ptr(), out.len()) };
    }

    /// Copy `src` to the elements from `at`.
    ///
    /// # Safety
    /// No other thread reads or writes those elements meanwhile (they are in the caller's unit).
    unsafe fn write(self, at: usize, src: &[f32]) {
        assert!(at + src.len() <= self.len, "write inside C");
        // SAFETY: in bounds (checked above); no concurrent access (the caller's guarantee).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }
}

/// The packed product for one kernel's `MR × NR` tile. Columns go in chunks: each chunk of B is
/// packed once (its panels split across threads) and shared. Each thread owns contiguous rows
/// of C, cut into blocks of `mc` rows, and runs its blocks whole, front to back; a thread that
/// finishes early takes column groups from the back of the others' rows. On a shared host one
/// thread often loses 5–20 ms of a 49 ms 2048² product to its neighbours (per-thread timers
/// here), and with a static split the whole product waited for it. Which thread computes a
/// tile never changes its bits.
#[allow(clippy::too_many_arguments)]
fn blocked<const MR: usize, const NR: usize>(
    cfg: &Config,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    c: &mut [f32],
    c_rs: usize,
    epilogue: Option<Epilogue<'_>>,
) {
    let nc_max = (PACKED_B_BYTES / 4 / k).clamp(NR, NC_MAX) / NR * NR;
    let threads = threads.clamp(1, m.div_ceil(MR));
    let rows_per = m.div_ceil(threads).div_ceil(MR) * MR;
    // Blocks of rows (at most `mc`, whole micro-panels but the last), each thread's from its
    // own rows, and the range of blocks each thread owns.
    let mut blocks = Vec::new();
    let mut owned = Vec::new();
    for start in (0..m).step_by(rows_per) {
        let end = (start + rows_per).min(m);
        let first = blocks.len();
        blocks.extend(
            (start..end)
                .step_by(cfg.mc)
                .map(|r| r..(r + cfg.mc).min(end)),
        );
        owned.push(first..blocks.len());
    }
    let shared = SharedC::new(c);
    let packed_len = n.min(nc_max).div_ceil(NR) * NR * k;
    with_scratch(&SCRATCH_B, packed_len, |packed| {
        for jc in (0..n).step_by(nc_max) {
            let nc = nc_max.min(n - jc);
            let panels = nc.div_ceil(NR);
            let bp = &mut packed[..panels * NR * k];
            // Panel q holds all k steps: `bp[q·NR·k + p·NR + j]` is B(p, jc + q·NR + j).
            let by_panels: Vec<std::ops::Range<usize>> =
                tenet_sys::parallel::ranges(panels, threads, 1)
                    .into_iter()
                    .map(|r| r.start * NR * k..r.end * NR * k)
                    .collect();
            tenet_sys::parallel::for_each_piece(bp, &by_panels, |range, dst| {
                let q0 = range.start / (NR * k);
                let cols = (nc - q0 * NR).min(dst.len() / k);
                pack_b::<NR>(cfg, dst, b, 0, k, jc + q0 * NR, cols);
            });
            let bp = &*bp;
            // Rows are final once the last chunk of columns has passed over them.
            let then = epilogue.filter(|_| jc + nc == n);
            // Panels `q0..q1` of block `block` on this thread; C from the block's first row.
            let compute = |block: usize, q0: usize, q1: usize| {
                let rows = &blocks[block];
                let cols = (q1 * NR).min(nc) - q0 * NR;
                let part = shared.from(rows.start * c_rs);
                let a = a.offset_rows(rows.start);
                let bp = &bp[q0 * NR * k..];
                block_of_chunk::<MR, NR>(
                    cfg,
                    rows.len(),
                    jc + q0 * NR,
                    cols,
                    k,
                    a,
                    None,
                    bp,
                    part,
                    c_rs,
                );
                part
            };
            if owned.len() == 1 {
                for (block, rows) in blocks.iter().enumerate() {
                    let part = compute(block, 0, panels);
                    if let Some(f) = then {
                        // SAFETY: this thread alone computes C, and the block is done.
                        f(rows.start, unsafe { part.rows(rows.len(), n, c_rs) });
                    }
                }
                continue;
            }
            // Units of work: block `u / groups`, column group `u % groups` (`per_group`
            // panels each).
            let per_group = panels.div_ceil(COLUMN_GROUPS.min(panels));
            let groups = panels.div_ceil(per_group);
            let units: Vec<std::ops::Range<usize>> = owned
                .iter()
                .map(|r| r.start * groups..r.end * groups)
                .collect();
            let work = tenet_sys::parallel::Stealing::new(&units);
            // The unit that finishes a block's last group runs the epilogue on it.
            let left: Vec<std::sync::atomic::AtomicUsize> = blocks
                .iter()
                .map(|_| std::sync::atomic::AtomicUsize::new(groups))
                .collect();
            // Units `first..first + count` (whole groups of one block) on this thread.
            let run = |first: usize, count: usize| {
                let (block, g) = (first / groups, first % groups);
                let part = compute(block, g * per_group, ((g + count) * per_group).min(panels));
                let rows = &blocks[block];
                let done = left[block].fetch_sub(count, std::sync::atomic::Ordering::AcqRel);
                if let (Some(f), true) = (then, done == count) {
                    // SAFETY: every unit of this block has finished (the counter reached zero
                    // here, and its acquire-release updates order their writes before this),
                    // and no unit touches these rows again, so this thread alone holds them.
                    f(rows.start, unsafe { part.rows(rows.len(), n, c_rs) });
                }
            };
            tenet_sys::parallel::run_parts(work.owners(), &|t| {
                while let Some(r) = work.take_front(t, groups) {
                    run(r.start, r.len());
                }
                for v in (1..work.owners()).map(|d| (t + d) % work.owners()) {
                    while let Some(u) = work.steal_back(v) {
                        run(u, 1);
                    }
                }
            });
        }
    });
}

/// [`sgemm_packing_b`] for one kernel's `MR × NR` tile: panels of columns, taken from the
/// front of each thread's share (and stolen from the back of another's), each packed and
/// then multiplied by every row block of A.
#[allow(clippy::too_many_arguments)]
fn packing_b<const MR: usize, const NR: usize>(
    cfg: &Config,
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    pack: PackB<'_>,
    stop: Stop<'_>,
    c: &mut [f32],
    c_rs: usize,
    then: Option<RowPart<'_>>,
) {
    let panels = n.div_ceil(NR);
    // With fewer panels than threads (a convolution over a few positions), each panel's rows
    // are split too; a thread packs the panel of each unit it takes unless it has it already.
    let splits = if panels >= threads {
        1
    } else {
        threads.div_ceil(panels).min(m.div_ceil(MR))
    };
    let rows_per = m.div_ceil(splits).div_ceil(MR) * MR;
    let splits = m.div_ceil(rows_per);
    // Every unit runs its rows over a panel of only NR columns, so packing their A in each
    // (as `block_of_chunk` does alone) copied as many floats as a sixteenth of the
    // multiply-adds, 12% of RapidOCR rec's time on AVX2: with more than one panel, A is
    // packed once, as MR-row panels over all k steps, and every unit reads its rows there.
    // A level that reads a row-major A in place needs none.
    let prepack = panels > 1 && cfg.direct.filter(|_| a.cs == 1).is_none();
    let prepacked = if prepack { m.div_ceil(MR) * MR * k } else { 0 };
    with_scratch(&SCRATCH_PACKED_A, prepacked, |pa| {
        if prepack {
            pack_a::<MR>(cfg, pa, a, 0, m, 0, k);
        }
        let pa: Option<&[f32]> = prepack.then_some(&*pa);
        let units = panels * splits;
        let shared = SharedC::new(c);
        let work =
            tenet_sys::parallel::Stealing::new(&tenet_sys::parallel::ranges(units, threads, 1));
        tenet_sys::parallel::run_parts(work.owners(), &|t| {
            with_scratch(&SCRATCH_B, NR * k, |bp| {
                let mut packed = None;
                // Unit `u`: rows of split `u % splits` over panel `u / splits`; false once the
                // caller asks to stop.
                let mut unit = |u: usize| {
                    if stop() {
                        return false;
                    }
                    let q = u / splits;
                    let (first, cols) = (q * NR, NR.min(n - q * NR));
                    if packed != Some(q) {
                        if cols < NR {
                            bp.fill(0.0);
                        }
                        pack(first, cols, NR, bp);
                        packed = Some(q);
                    }
                    let split = (u % splits) * rows_per..((u % splits + 1) * rows_per).min(m);
                    for r0 in split.clone().step_by(cfg.mc) {
                        let mc = cfg.mc.min(split.end - r0);
                        let part = shared.from(r0 * c_rs);
                        // This thread claimed the unit: these rows, columns first..first + cols.
                        block_of_chunk::<MR, NR>(
                            cfg,
                            mc,
                            first,
                            cols,
                            k,
                            a.offset_rows(r0),
                            // r0 is a multiple of MR (splits and blocks are).
                            pa.map(|pa| &pa[r0 / MR * MR * k..]),
                            bp,
                            part,
                            c_rs,
                        );
                    }
                    if let Some(f) = then {
                        for i in split {
                            // SAFETY: this thread claimed the unit and has finished its tiles; no
                            // other unit touches these elements.
                            f(i, first, unsafe {
                                shared.from(i * c_rs + first).rows(1, cols, 0)
                            });
                        }
                    }
                    true
                };
                while let Some(r) = work.take_front(t, 1) {
                    if !r.into_iter().all(&mut unit) {
                        return;
                    }
                }
                for v in (1..work.owners()).map(|d| (t + d) % work.owners()) {
                    while let Some(u) = work.steal_back(v) {
                        if !unit(u) {
                            return;
                        }
                    }
                }
            })
        });
    });
}

/// Rows `0..m` (at most `mc`) of C, columns `jc..jc + nc`, from A and the packed panels `bp`
/// of those columns. Every k-block passes over the block's tiles before the next, so the
/// block's C stays in L2 between the k-blocks that continue its chains. The caller has
/// claimed these rows and columns of `c`: no other thread touches them meanwhile.
///
/// `packed`, when given, is the block's rows of A already packed as `MR`-row panels over all
/// `k` steps ([`packing_b`]'s, shared by its units); otherwise the block packs its own.
#[allow(clippy::too_many_arguments)]
fn block_of_chunk<const MR: usize, const NR: usize>(
    cfg: &Config,
    mc: usize,
    jc: usize,
    nc: usize,
    k: usize,
    a: Strided<'_>,
    packed: Option<&[f32]>,
    bp: &[f32],
    c: SharedC,
    c_rs: usize,
) {
    let (mr, nr) = (MR, NR);
    let kc_max = cfg.kc.min(k);
    // A row-major A needs no packing where the level has kernels that read it in place: in
    // MiniLM's products that took the time of a batch from 413–425 to ~400 ms.
    let direct = cfg.direct.filter(|_| a.cs == 1 && packed.is_none());
    // Packed panels for the block: all of them, or only a partial last one (none when the
    // caller packed them).
    let panels = match (packed, direct) {
        (Some(_), _) => 0,
        (None, Some(_)) => 1,
        (None, None) => mc.div_ceil(mr),
    };
    // The scratch tile for edge tiles, allocated at the first.
    let mut tile = Vec::new();
    with_scratch(&SCRATCH_A, panels * mr * kc_max, |ap| {
        for pc in (0..k).step_by(cfg.kc) {
            let kc = cfg.kc.min(k - pc);
            let (load, last) = (pc > 0, pc + kc == k);
            // Full row panels read A in place when the kernel can; a partial one is packed
            // (zero rows below the end) into the first panel of `ap`.
            let full_rows = if direct.is_some() { mc / mr * mr } else { 0 };
            if packed.is_none() {
                pack_a::<MR>(cfg, ap, a, full_rows, mc - full_rows, pc, kc);
            }
            let panel_lines = (nr * kc).div_ceil(16);
            let lines_per_tile = panel_lines.div_ceil(mc.div_ceil(mr));
            for jr in (0..nc).step_by(nr) {
                let cols = nr.min(nc - jr);
                let bpanel = &bp[(jr / nr) * nr * k + pc * nr..][..nr * kc];
                for ir in (0..mc).step_by(mr) {
                    let rows = mr.min(mc - ir);
                    // This tile's A: in place (row stride a.rs) or a packed panel.
                    let (kernel, kernel_first, a_ptr, a_rs) = match direct {
                        Some(kd) if rows == mr => {
                            let first = ir * a.rs + pc;
                            // Rows ir .. ir+mr, columns pc .. pc+kc: inside A.
                            let rows_span = &a.data[first..(ir + mr - 1) * a.rs + pc + kc];
                            (kd, kd, rows_span.as_ptr(), a.rs)
                        }
                        _ => {
                            let apanel = match packed {
                                // Panel ir / mr over all k steps; steps pc.. of it.
                                Some(pa) => &pa[(ir / mr) * mr * k + pc * mr..][..mr * kc],
                                None => {
                                    let q = if direct.is_some() { 0 } else { ir / mr };
                                    &ap[q * mr * kc..][..mr * kc]
                                }
                            };
                            (cfg.kernel, cfg.kernel_first, apanel.as_ptr(), 0)
                        }
                    };
                    let (row, col) = (ir, jc + jr);
                    // The next full tile down this column of tiles, and this tile's share of
                    // the next column's B panel, for prefetching (a stale or stray address
                    // costs a wasted load, never a fault).
                    let mut ahead = Ahead::NONE;
                    if ir + 2 * mr <= mc {
                        ahead.c = c.ptr.wrapping_add((row + mr) * c_rs + col);
                    }
                    if jr + nr < nc {
                        let start = (ir / mr) * lines_per_tile;
                        let next = (jr / nr + 1) * nr * k + pc * nr + start * 16;
                        ahead.b = bp.as_ptr().wrapping_add(next);
                        ahead.b_lines = lines_per_tile.min(panel_lines.saturating_sub(start));
                    }
                    // A tile that lies inside C runs there; an edge tile runs on a full-size
                    // scratch tile, its valid part copied in and out.
                    let full = rows == mr && cols == nr;
                    let (kernel, dst, ldc, ahead) = if full {
                        // The whole tile lies inside C: rows row..row+mr < m and columns
                        // col..col+nr ≤ n, and C spans (m-1)·c_rs + n elements.
                        let base = row * c_rs + col;
                        assert!(base + (mr - 1) * c_rs + nr <= c.len, "tile inside C");
                        let kernel = if ir == 0 { kernel_first } else { kernel };
                        (kernel, c.ptr.wrapping_add(base), c_rs, ahead)
                    } else {
                        tile.resize(mr * nr, 0.0);
                        for i in 0..rows {
                            // SAFETY: the caller's claimed rows and columns (see below).
                            unsafe { c.read((row + i) * c_rs + col, &mut tile[i * nr..][..cols]) };
                        }
                        (kernel, tile.as_mut_ptr(), nr, Ahead::NONE)
                    };
                    // SAFETY: the kernel reads mr rows of kc values from `a_ptr`, a packed
                    // panel (kc·mr values) or rows of A at stride a_rs (the slice taken above
                    // spans them), kc·nr of `bpanel` (that long), and reads/writes mr rows of
                    // nr values at stride `ldc` from `dst`: the scratch tile (mr × nr), or a
                    // tile inside C (checked above) in the caller's claimed rows and columns,
                    // which no other thread touches; the CPU supports the kernel's
                    // instructions (checked in `sgemm`).
                    unsafe {
                        kernel(
                            kc,
                            a_ptr,
                            a_rs,
                            bpanel.as_ptr(),
                            dst,
                            ldc,
                            load,
                            last,
                            ahead,
                        )
                    };
                    if !full {
                        for i in 0..rows {
                            // SAFETY: the caller's claimed rows and columns (see above).
                            unsafe { c.write((row + i) * c_rs + col, &tile[i * nr..][..cols]) };
                        }
                    }
                }
            }
        }
    });
}

const PMR: usize = 4;
const PNR: usize = 4;

/// Portable 4×4 micro-kernel (plain Rust; `mul_add` is the IEEE fused multiply-add).
///
/// # Safety
/// `a` must hold `kc·4` values, `b` `kc·4`, and `c` 4 rows of 4 values at stride `ldc`.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_portable(
    kc: usize,
    a: *const f32,
    _a_rs: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    load: bool,
    last: bool,
    _ahead: Ahead,
) {
    // SAFETY: the caller guarantees the extents stated above.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, kc * PMR),
            std::slice::from_raw_parts(b, kc * PNR),
        )
    };
    let mut acc = [[0.0f32; PNR]; PMR];
    if load {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: row i of the tile is inside `c` (caller's guarantee).
            let src = unsafe { std::slice::from_raw_parts(c.add(i * ldc), PNR) };
            row.copy_from_slice(src);
        }
    }
    for p in 0..kc {
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = a[p * PMR + i];
            for (j, v) in row.iter_mut().enumerate() {
                *v = ai.mul_add(b[p * PNR + j], *v);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i of the tile is inside `c` (caller's guarantee).
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), PNR) };
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = if last { canonical(v) } else { v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::simd::{canonical, canonical16};

    /// `dot_rows` with hardware FMA (the same chains; `mul_add` compiles to `vfmadd` here).
    ///
    /// # Safety
    /// The CPU supports FMA.
    #[target_feature(enable = "fma")]
    pub(super) unsafe fn dot_rows_fma(
        i: usize,
        j0: usize,
        k: usize,
        a: super::Strided<'_>,
        b: super::Strided<'_>,
        out: &mut [f32],
    ) {
        let arow: Vec<f32> = (0..k).map(|p| a.data[i * a.rs + p * a.cs]).collect();
        let mut chunks = out.chunks_exact_mut(4);
        let mut j = j0;
        for o in &mut chunks {
            let (mut c0, mut c1, mut c2, mut c3) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
            for (p, &x) in arow.iter().enumerate() {
                let base = p * b.rs + j * b.cs;
                c0 = x.mul_add(b.data[base], c0);
                c1 = x.mul_add(b.data[base + b.cs], c1);
                c2 = x.mul_add(b.data[base + 2 * b.cs], c2);
                c3 = x.mul_add(b.data[base + 3 * b.cs], c3);
            }
            for (d, v) in o.iter_mut().zip([c0, c1, c2, c3]) {
                *d = canonical(v);
            }
            j += 4;
        }
        for o in chunks.into_remainder() {
            let mut acc = 0.0f32;
            for (p, &x) in arow.iter().enumerate() {
                acc = x.mul_add(b.data[p * b.rs + j * b.cs], acc);
            }
            *o = canonical(acc);
            j += 1;
        }
    }

    /// How far ahead (in values) `small_m_rows` prefetches each row: 128 measured faster than
    /// 256 and 512 (SmolLM2 decode, 2 threads).
    const ROW_PREFETCH: usize = 128;

    /// Vectors of 16 columns one pass of `small_m_avx512` computes at once.
    const SMALL_V: usize = 4;

    /// Whether 16 columns `cs` apart can be gathered with 32-bit offsets.
    pub(super) fn gather_fits(cs: usize) -> bool {
        cs.checked_mul(15).is_some_and(|x| x <= i32::MAX as usize)
    }

    /// `small_m` for AVX-512: `out` (m rows of `w` columns, row-major) = rows `0..m` of A times
    /// columns `j0..j0 + w` of B. Each lane carries one column's unbroken fma chain along k,
    /// the chain `dot_rows` computes. A transposed B (a weight `[n, k]`, `rs == 1`) goes to
    /// `small_m_rows`; otherwise 64 columns advance together so that their chains hide the fma
    /// latency, and B's values for a step are one load when its columns are adjacent, a gather
    /// when they are not.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `m <= 4`; A holds rows `0..m` × `k` columns and B `k` rows ×
    /// columns `0..j0 + w` at their strides (as `sgemm` checks); `gather_fits(b.cs)`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn small_m_avx512(
        m: usize,
        j0: usize,
        k: usize,
        a: super::Strided<'_>,
        b: super::Strided<'_>,
        out: &mut [f32],
    ) {
        if b.rs == 1 && b.cs != 1 {
            return match m {
                1 => small_m_rows::<1>(j0, k, a, b, out),
                2 => small_m_rows::<2>(j0, k, a, b, out),
                3 => small_m_rows::<3>(j0, k, a, b, out),
                _ => small_m_rows::<4>(j0, k, a, b, out),
            };
        }
        match m {
            1 => small_m_block::<1>(j0, k, a, b, out),
            2 => small_m_block::<2>(j0, k, a, b, out),
            3 => small_m_block::<3>(j0, k, a, b, out),
            _ => small_m_block::<4>(j0, k, a, b, out),
        }
    }

    /// Rows `0..m` of A, step-major: `[p * m + i]` is A(i, p).
    pub(super) fn a_by_step(m: usize, k: usize, a: super::Strided<'_>) -> Vec<f32> {
        // Filled by index into a vector of its final length: a flattening iterator's collect
        // grew it step by step, a quarter of a tiny attention product's time.
        let mut out = vec![0.0; m * k];
        for (p, step) in out.chunks_exact_mut(m.max(1)).enumerate() {
            for (i, v) in step.iter_mut().enumerate() {
                *v = a.data[i * a.rs + p * a.cs];
            }
        }
        out
    }

    /// Transpose a 16×16 block in registers: afterwards `r[q]` lane `l` is what `r[l]` lane
    /// `q` was.
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: &mut [__m512; 16]) {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4g + q], 128-bit lane L: column 4L + q of rows 4g..4g+4.
        let mut u = [_mm512_setzero_ps(); 16];
        let pd = _mm512_castps_pd;
        for g in 0..4 {
            let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t0), pd(t2)));
            u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t0), pd(t2)));
            u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t1), pd(t3)));
            u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t1), pd(t3)));
        }
        for q in 0..4 {
            let x0 = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
            let x1 = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
            let y0 = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
            let y1 = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
            r[q] = _mm512_shuffle_f32x4::<0x88>(x0, y0);
            r[4 + q] = _mm512_shuffle_f32x4::<0xDD>(x0, y0);
            r[8 + q] = _mm512_shuffle_f32x4::<0x88>(x1, y1);
            r[12 + q] = _mm512_shuffle_f32x4::<0xDD>(x1, y1);
        }
    }

    /// One panel of `pack_a` or `pack_b` from sources each contiguous along k (A's rows, or
    /// B's columns when B is a transposed matrix): step `p` of the panel holds value `p` of
    /// every source side by side. Up to 16 sources × 16 steps at a time are loaded whole,
    /// transposed in registers and stored as 16 steps, instead of one scalar copy per value.
    #[target_feature(enable = "avx512f")]
    pub(super) fn pack_panel_transposed<const W: usize>(src: &[&[f32]; W], panel: &mut [f32]) {
        let width = W;
        let kc = panel.len() / width;
        let mut p = 0;
        while p + 16 <= kc {
            for (g, group) in src.chunks(16).enumerate() {
                let mut r = [_mm512_setzero_ps(); 16];
                for (x, source) in r.iter_mut().zip(group) {
                    let seg = &source[p..p + 16];
                    // SAFETY: `seg` holds the 16 values loaded.
                    *x = unsafe { _mm512_loadu_ps(seg.as_ptr()) };
                }
                transpose16(&mut r);
                let mask = crate::simd::mask16(group.len());
                for (t, &x) in r.iter().enumerate() {
                    let out = &mut panel[(p + t) * width + 16 * g..][..group.len()];
                    // SAFETY: the mask stores the group's lanes, and `out` holds that many.
                    unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, x) };
                }
            }
            p += 16;
        }
        for p in p..kc {
            for (i, source) in src.iter().enumerate() {
                panel[p * width + i] = source[p];
            }
        }
    }

    /// `small_m_block` for a B whose columns are contiguous (a transposed weight, `[n, k]`
    /// row-major): 16 columns at a time, each read along its row 16 steps at once and turned
    /// into 16 step vectors by a register transpose, so memory is read a whole line at a time.
    /// Each lane still carries one column's unbroken fma chain along k.
    #[target_feature(enable = "avx512f")]
    fn small_m_rows<const M: usize>(
        j0: usize,
        k: usize,
        a: super::Strided<'_>,
        b: super::Strided<'_>,
        out: &mut [f32],
    ) {
        let w = out.len() / M;
        let arows = a_by_step(M, k, a);
        let mut jb = 0;
        while jb < w {
            let cols = (w - jb).min(16);
            let mut acc = [_mm512_setzero_ps(); M];
            let mut p = 0;
            while p < k {
                let steps = (k - p).min(16);
                let mask = crate::simd::mask16(steps);
                let mut r = [_mm512_setzero_ps(); 16];
                for (l, x) in r.iter_mut().enumerate().take(cols) {
                    let row = &b.data[(j0 + jb + l) * b.cs + p..][..steps];
                    // Sixteen rows are read side by side, too many streams for the hardware
                    // prefetchers to follow: fetch each row a few lines ahead (never faults).
                    _mm_prefetch::<_MM_HINT_T0>(
                        row.as_ptr().wrapping_add(ROW_PREFETCH) as *const i8
                    );
                    // SAFETY: the mask covers exactly the `steps` values of `row`.
                    *x = unsafe { _mm512_maskz_loadu_ps(mask, row.as_ptr()) };
                }
                transpose16(&mut r);
                let xs = &arows[p * M..(p + steps) * M];
                let mut chains = |steps: usize| {
                    for (q, &col) in r.iter().enumerate().take(steps) {
                        for (i, x) in acc.iter_mut().enumerate() {
                            *x = _mm512_fmadd_ps(_mm512_set1_ps(xs[q * M + i]), col, *x);
                        }
                    }
                };
                // A whole block with a constant count, so the loop has a fixed length and `acc`
                // stays in registers (a variable count kept it on the stack: a store and a
                // reload inside every fma chain).
                if steps == 16 {
                    chains(16)
                } else {
                    chains(steps)
                }
                p += steps;
            }
            let keep = crate::simd::mask16(cols);
            for (i, &x) in acc.iter().enumerate() {
                let x = canonical16(x);
                let dst = &mut out[i * w + jb..i * w + jb + cols];
                // SAFETY: the mask covers exactly the `cols` values of `dst`.
                unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), keep, x) };
            }
            jb += cols;
        }
    }

    #[target_feature(enable = "avx512f")]
    fn small_m_block<const M: usize>(
        j0: usize,
        k: usize,
        a: super::Strided<'_>,
        b: super::Strided<'_>,
        out: &mut [f32],
    ) {
        let w = out.len() / M;
        let arows = a_by_step(M, k, a);
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(b.cs as i32));
        let base = b.data.as_ptr();
        let mut jb = 0;
        while jb < w {
            let cols = (w - jb).min(16 * SMALL_V);
            // Lanes of columns past `cols` are masked off: never read, never written.
            let masks: [__mmask16; SMALL_V] =
                std::array::from_fn(|v| crate::simd::mask16(cols.saturating_sub(16 * v)));
            let mut acc = [[_mm512_setzero_ps(); SMALL_V]; M];
            for p in 0..k {
                let mut col = [_mm512_setzero_ps(); SMALL_V];
                for (v, x) in col.iter_mut().enumerate() {
                    // Element (p, j) for the vector's first column j; a pointer formed with
                    // wrapping arithmetic, read only through the mask.
                    let at = base.wrapping_add(p * b.rs + (j0 + jb + 16 * v) * b.cs);
                    // SAFETY: unmasked lanes are columns < j0 + w ≤ n at step p < k, inside B
                    // (the caller's guarantee); masked lanes are not accessed.
                    *x = unsafe {
                        if b.cs == 1 {
                            _mm512_maskz_loadu_ps(masks[v], at)
                        } else {
                            _mm512_mask_i32gather_ps::<4>(
                                _mm512_setzero_ps(),
                                masks[v],
                                offsets,
                                at,
                            )
                        }
                    };
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_ps(arows[p * M + i]);
                    for (x, &c) in row.iter_mut().zip(&col) {
                        *x = _mm512_fmadd_ps(ai, c, *x);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    let x = canonical16(x);
                    let dst = &mut out[i * w + jb..i * w + jb + cols];
                    // SAFETY: lanes of vector v cover dst[16v ..], masked to the `cols` valid
                    // columns, all inside `dst`.
                    unsafe {
                        _mm512_mask_storeu_ps(dst.as_mut_ptr().wrapping_add(16 * v), masks[v], x)
                    };
                }
            }
            jb += cols;
        }
    }

    /// How many k steps ahead the AVX-512 kernel prefetches its A panel.
    const PREFETCH_STEPS: usize = 64;

    /// AVX-512 micro-kernel of `MR` rows × `NV` vectors of 16 columns: `MR·NV` accumulators,
    /// one fma chain per C element. With `B_AHEAD` > 0 it also prefetches its B panel that
    /// many steps ahead (for a panel still in L2 or L3: a stream from L3 alone ran the kernel
    /// at 140 GFLOP/s on one core here, prefetched 16 steps ahead at 164).
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `a` holds `kc·MR` values, `b` `kc·16·NV`, and `c` `MR` rows
    /// of `16·NV` values at stride `ldc`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel_avx512<const MR: usize, const NV: usize, const B_AHEAD: usize>(
        kc: usize,
        a: *const f32,
        _a_rs: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        load: bool,
        last: bool,
        ahead: super::Ahead,
    ) {
        let nr = 16 * NV;
        if !ahead.c.is_null() {
            for i in 0..MR {
                for v in 0..NV {
                    // Prefetching never faults, wherever it points.
                    let line = ahead.c.wrapping_add(i * ldc + 16 * v);
                    _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
                }
            }
        }
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if load {
            for (i, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    // SAFETY: row i, vector v of the tile is inside `c`.
                    *x = unsafe { _mm512_loadu_ps(c.add(i * ldc + 16 * v)) };
                }
            }
        }
        // One k step: NV vector loads of B, MR broadcasts of A, MR·NV fmas.
        let step = |acc: &mut [[__m512; NV]; MR], p: usize| {
            // Prefetching never faults, even past the panel's end.
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add((p + PREFETCH_STEPS) * MR) as *const i8);
            if B_AHEAD > 0 {
                for v in 0..NV {
                    let ahead = b.wrapping_add((p + B_AHEAD) * nr + 16 * v);
                    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                }
            }
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                // SAFETY: step p < kc reads b[p·nr .. (p+1)·nr], inside the B panel.
                *x = unsafe { _mm512_loadu_ps(b.add(p * nr + 16 * v)) };
            }
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: step p < kc, i < MR: inside the A panel.
                let ai = _mm512_set1_ps(unsafe { *a.add(p * MR + i) });
                for (x, &bvv) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(ai, bvv, *x);
                }
            }
        };
        ahead.steps(kc, |p| step(&mut acc, p));
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                let x = if last { canonical16(x) } else { x };
                // SAFETY: row i, vector v of the tile is inside `c`.
                unsafe { _mm512_storeu_ps(c.add(i * ldc + 16 * v), x) };
            }
        }
    }

    /// The AVX-512 `MR`×`16·NV` micro-kernel (8×48 or 12×32) reading A in place: row `i` of the tile's A is
    /// at `a + i·a_rs`, step `p` at offset `p` (a row-major operand, no packing). The same
    /// fma chains as `kernel_avx512`; the 4-step loops are written out in `gemm_direct`.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; rows `0..MR` of A hold `kc` values from `a` at stride
    /// `a_rs`; `b` holds `kc·16·NV` values and `c` `MR` rows of `16·NV` values at stride `ldc`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel_avx512_direct<const MR: usize, const NV: usize>(
        kc: usize,
        a: *const f32,
        a_rs: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        load: bool,
        last: bool,
        ahead: super::Ahead,
    ) {
        const { assert!(MR * NV == 24 && (MR == 8 || MR == 12)) };
        let d = if MR == 8 {
            &crate::gemm_direct::t8x48::LOOPS
        } else {
            &crate::gemm_direct::t12x32::LOOPS
        };
        let nr = 16 * NV;
        // Accumulator i·NV + v is row i, vector v of the tile. The loops over the constants MR
        // and NV unroll, so the accumulators go from C into registers and back with no trip
        // through the stack (one loop over t with t / NV did not: it cost a memset, index
        // arithmetic and a stack round trip per call, ~9 steps' time).
        let at = |i: usize, v: usize| i * ldc + 16 * v;
        if !ahead.c.is_null() {
            for i in 0..MR {
                for v in 0..NV {
                    // Prefetching never faults, wherever it points.
                    _mm_prefetch::<_MM_HINT_T0>(ahead.c.wrapping_add(at(i, v)) as *const i8);
                }
            }
        }
        let mut acc = [_mm512_setzero_ps(); 24];
        if load {
            for i in 0..MR {
                for v in 0..NV {
                    // SAFETY: row i, vector v of the tile is inside `c`.
                    acc[i * NV + v] = unsafe { _mm512_loadu_ps(c.add(at(i, v))) };
                }
            }
        }
        let iters = kc / 4;
        // Iterations that also fetch a line of the next column's B panel, then the rest.
        let with_next = ahead.b_lines.min(iters);
        // Rows 0, 3, 6 and 9 (the 8-row tile ignores the last).
        let bases = |p: usize| std::array::from_fn(|q| a.wrapping_add(3 * q * a_rs + p));
        let lda = a_rs * 4;
        // SAFETY: steps 0..4·iters read rows 0..MR of A and nr values of B per step, inside
        // the operands (the caller's guarantee); `with_next` lines from `ahead.b` are only
        // prefetched.
        unsafe {
            if with_next > 0 {
                (d.steps_next)(&mut acc, bases(0), lda, b, with_next, ahead.b);
            }
            if iters > with_next {
                let (p, bp) = (4 * with_next, b.add(4 * with_next * nr));
                (d.steps)(
                    &mut acc,
                    bases(p),
                    lda,
                    bp,
                    iters - with_next,
                    std::ptr::null(),
                );
            }
        }
        for p in 4 * iters..kc {
            // SAFETY: step p < kc of B and of rows 0..MR of A, as above.
            unsafe {
                let bv: [__m512; NV] =
                    std::array::from_fn(|v| _mm512_loadu_ps(b.add(p * nr + 16 * v)));
                for i in 0..MR {
                    let ai = _mm512_set1_ps(*a.add(i * a_rs + p));
                    for (v, &bvv) in bv.iter().enumerate() {
                        acc[i * NV + v] = _mm512_fmadd_ps(ai, bvv, acc[i * NV + v]);
                    }
                }
            }
        }
        for i in 0..MR {
            for v in 0..NV {
                let x = acc[i * NV + v];
                let x = if last { canonical16(x) } else { x };
                // SAFETY: row i, vector v of the tile is inside `c`.
                unsafe { _mm512_storeu_ps(c.add(at(i, v)), x) };
            }
        }
    }

    /// AVX2+FMA 6×16 micro-kernel: 12 accumulators, one fma chain per C element. Like the
    /// AVX-512 kernel it prefetches its A panel ahead and a share of the next column's B panel
    /// into L2, four steps per iteration.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `a` holds `kc·6` values, `b` `kc·16`, and `c` 6 rows of
    /// 16 values at stride `ldc`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel_avx2(
        kc: usize,
        a: *const f32,
        _a_rs: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        load: bool,
        last: bool,
        ahead: super::Ahead,
    ) {
        const MR: usize = 6;
        if !ahead.c.is_null() {
            for i in 0..MR {
                // Prefetching never faults, wherever it points.
                _mm_prefetch::<_MM_HINT_T0>(ahead.c.wrapping_add(i * ldc) as *const i8);
            }
        }
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        if load {
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: row i (16 values) of the tile is inside `c`.
                unsafe {
                    row[0] = _mm256_loadu_ps(c.add(i * ldc));
                    row[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
                }
            }
        }
        let step = |acc: &mut [[__m256; 2]; MR], p: usize| {
            // Prefetching never faults, even past the panel's end.
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add((p + PREFETCH_STEPS) * MR) as *const i8);
            // SAFETY: step p reads b[p·16 .. p·16+16] and a[p·6 .. p·6+6], inside the panels.
            let (b0, b1, ap) = unsafe {
                (
                    _mm256_loadu_ps(b.add(p * 16)),
                    _mm256_loadu_ps(b.add(p * 16 + 8)),
                    a.add(p * MR),
                )
            };
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: i < 6, inside step p of the A panel.
                let ai = _mm256_set1_ps(unsafe { *ap.add(i) });
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
        };
        ahead.steps(kc, |p| step(&mut acc, p));
        for (i, row) in acc.iter().enumerate() {
            let fix = |v: __m256| if last { crate::simd::canonical8(v) } else { v };
            // SAFETY: row i (16 values) of the tile is inside `c`.
            unsafe {
                _mm256_storeu_ps(c.add(i * ldc), fix(row[0]));
                _mm256_storeu_ps(c.add(i * ldc + 8), fix(row[1]));
            }
        }
    }
}
