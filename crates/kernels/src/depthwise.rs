//! Depthwise convolution, one plane (one input and one output channel) at a time, with the
//! reference's bits: each output is the fma chain, from +0, over its in-bounds taps in order
//! of kernel row then column — taps in the padding are skipped, not multiplied by a zero (an
//! fma with a zero is not a no-op: it turns a −0 accumulator into +0, an infinite weight
//! into NaN).
//!
//! The portable code runs each tap as one multiply-add over a run of output columns. On x86
//! the input rows the plane's band reads are first copied, once, into rows split by column
//! phase (`x[m·stride + φ]` for phase `φ`) and padded with zeros, so that every tap of every
//! output column is a plain vector load at any stride; then each output row is computed in
//! blocks of vectors that stay in registers across all taps (one store per vector). Where a
//! vector straddles the plane's edge for a tap, the lanes that tap misses keep their
//! accumulator through a blend: the zeros they read never enter a chain.

use crate::SimdLevel;

/// The geometry of one depthwise convolution plane (one input channel, one output channel).
#[derive(Clone, Copy, Debug)]
pub struct DepthwisePlane {
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    /// The first output row computed, and how many (`out` holds rows `row0..row0 + oh`).
    pub row0: usize,
    pub oh: usize,
    pub ow: usize,
    /// (rows, columns)
    pub stride: [usize; 2],
    /// Padding before: (top, left).
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
}

impl DepthwisePlane {
    /// The input row kernel row `i` of output row `oh` reads, or `None` where it lies in the
    /// padding.
    #[inline(always)]
    fn input_row<'a>(&self, plane: &'a [f32], oh: usize, i: usize) -> Option<&'a [f32]> {
        let y = (oh * self.stride[0] + i * self.dilation[0]).checked_sub(self.pad[0])?;
        (y < self.h).then(|| &plane[y * self.w..][..self.w])
    }
}

/// One depthwise convolution plane: each output `out[r][c]` is the fma chain, from +0, over the
/// in-bounds taps in order of kernel row then column — the reference's convolution for one
/// channel, bias and NaN canonicalisation left to the caller. `taps` is `kh × kw`.
pub fn depthwise_plane(
    level: SimdLevel,
    p: &DepthwisePlane,
    plane: &[f32],
    taps: &[f32],
    out: &mut [f32],
) {
    assert!(plane.len() >= p.h * p.w && taps.len() >= p.kh * p.kw && out.len() >= p.oh * p.ow);
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has, and both x86 levels include
        // AVX2 and FMA.
        SimdLevel::Avx512 | SimdLevel::Avx2 => unsafe { x86::depthwise_avx2(p, plane, taps, out) },
        _ => depthwise_lanes(p, plane, taps, out),
    }
}

/// The most [`depthwise_plane`] allocates in one call on this geometry, in bytes: on x86, the
/// band of input rows split by phase (at least 64 KiB's worth of rows, or the rows one block
/// of output rows reads), one lane mask per vector and kernel column, and small tables.
pub fn scratch_bytes(p: &DepthwisePlane) -> usize {
    let sw = p.stride[1].max(1);
    let nv = p.ow.div_ceil(8);
    let band = Band::of(p);
    4 * band.input_rows * sw * band.phase_len
        + 32 * nv * p.kw
        + 32 * p.kw
        + 16 * p.kh
        + 24 * nv
        + 24 * sw
        + 1024
}

/// How the x86 kernel bands a plane's input rows, split by column phase: one place for the
/// kernel and its scratch bound.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Band {
    /// Floats in one phase row: the (8-lane rounded) output columns plus the farthest tap.
    phase_len: usize,
    /// Input rows one kernel row's reach spans: `(kh − 1)·dilation + 1`.
    reach: usize,
    /// Input rows a band holds at most: about 64 KiB's worth, or one output row's.
    input_rows: usize,
}

impl Band {
    fn of(p: &DepthwisePlane) -> Band {
        let sw = p.stride[1].max(1);
        let phase_len = p.ow.div_ceil(8) * 8 + p.kw.saturating_sub(1) * p.dilation[1] / sw;
        let reach = p.kh.saturating_sub(1) * p.dilation[0] + 1;
        let input_rows = ((16 * 1024) / (sw * phase_len).max(1)).max(reach + p.stride[0]);
        Band {
            phase_len,
            reach,
            input_rows,
        }
    }
}

/// Output columns of one row that the depthwise kernel's interior keeps in registers at once.
const DW_BLOCK: usize = 16;

#[inline(always)]
fn depthwise_lanes(p: &DepthwisePlane, plane: &[f32], taps: &[f32], out: &mut [f32]) {
    let [sh, sw] = p.stride;
    let pl = p.pad[1];
    let dw = p.dilation[1];
    // Flattened at stride 1 over rows of 32 or more (on 15×20 planes the saved row ends cost
    // more than the calls: 2.3 vs 1.8 µs; 30×40: 5.1 vs 6.2 µs, 120×160: 18.5 vs 19.7).
    if sh == 1 && sw == 1 && p.ow == p.w && p.w >= 32 {
        return depthwise_flat(p, plane, taps, out);
    }
    // The output columns whose tap at column offset `off` lands inside the row.
    let reach = |off: usize| {
        let lo = if off >= pl {
            0
        } else {
            (pl - off).div_ceil(sw)
        };
        let hi = if p.w + pl > off {
            ((p.w + pl - off - 1) / sw + 1).min(p.ow)
        } else {
            0
        };
        (lo, hi)
    };
    // With a column stride, columns every kernel column reaches, in whole blocks, are computed
    // in registers, all taps of a block before its one store (a strided run per tap cost 3×
    // as much); the rest one tap at a time over a run of columns (at stride 1 that is faster
    // than blocks: 17 vs 22 µs for a 3×3 over 120×160). Each output's chain is its valid
    // taps in order either way.
    let b_lo = reach(0).0.min(p.ow);
    let all_hi = reach(p.kw.saturating_sub(1) * dw).1;
    let b_hi = if sw == 1 {
        b_lo
    } else {
        b_lo + all_hi.saturating_sub(b_lo) / DW_BLOCK * DW_BLOCK
    };
    for (r, acc) in out.chunks_mut(p.ow).take(p.oh).enumerate() {
        let oh = p.row0 + r;
        acc.fill(0.0);
        for i in 0..p.kh {
            let Some(row) = p.input_row(plane, oh, i) else {
                continue;
            };
            for j in 0..p.kw {
                let off = j * dw;
                let (lo, hi) = reach(off);
                let w = taps[i * p.kw + j];
                for (lo, hi) in [(lo, hi.min(b_lo)), (lo.max(b_hi), hi)] {
                    if lo >= hi {
                        continue;
                    }
                    let first = lo * sw + off - pl;
                    let a = &mut acc[lo..hi];
                    if sw == 1 {
                        let x = &row[first..first + a.len()];
                        a.iter_mut()
                            .zip(x)
                            .for_each(|(a, &v)| *a = v.mul_add(w, *a));
                    } else {
                        a.iter_mut()
                            .enumerate()
                            .for_each(|(q, a)| *a = row[first + q * sw].mul_add(w, *a));
                    }
                }
            }
        }
        match sw {
            2 => depthwise_blocks(p, plane, taps, oh, 2, b_lo..b_hi, acc),
            _ => depthwise_blocks(p, plane, taps, oh, sw, b_lo..b_hi, acc),
        }
    }
}

/// [`depthwise_lanes`] at stride 1 where output rows are as wide as input rows: output `t`
/// (flattened) reads input `t + d` for a tap with offset `d`, so each tap is one fused
/// multiply-add over the whole band of rows it reaches — except the few columns at the ends
/// of each row where it falls outside the row, which keep their value: saved before the run
/// and put back after it, so every output's chain is still exactly its valid taps in order.
/// (One run per tap and row cost a call and a scalar tail per row: 5×5 over 30×40 planes ran
/// at a tenth of the fma rate.)
#[inline(always)]
fn depthwise_flat(p: &DepthwisePlane, plane: &[f32], taps: &[f32], out: &mut [f32]) {
    let [pt, pl] = p.pad;
    let [dh, dw] = p.dilation;
    let w = p.w;
    let out = &mut out[..p.oh * w];
    out.fill(0.0);
    let mut saved: Vec<f32> = Vec::new();
    for i in 0..p.kh {
        // Output rows (of the band) whose input row y = row + i·dh − pt is inside the plane.
        let shift = i * dh;
        let r_lo = pt.saturating_sub(shift).max(p.row0) - p.row0;
        let r_hi = ((p.h + pt).saturating_sub(shift)).min(p.row0 + p.oh);
        if r_hi <= p.row0 + r_lo {
            continue;
        }
        let r_hi = r_hi - p.row0;
        for j in 0..p.kw {
            let off = j * dw;
            // Columns c with c + off − pl outside 0..w: the first `lead`, the last `tail`.
            let lead = pl.saturating_sub(off).min(w);
            let tail = (off + w).saturating_sub(pl + w).min(w - lead);
            // Flattened: output t = (row − row0)·w + c reads input t + d.
            let base = (p.row0 as isize + shift as isize - pt as isize) * w as isize;
            let d = base + off as isize - pl as isize;
            let (mut t0, mut t1) = (r_lo * w, r_hi * w);
            // Clip to the plane: only row-end columns lie beyond it.
            if (t0 as isize) + d < 0 {
                t0 = (-d) as usize;
            }
            let end = (p.h * w) as isize - d;
            if (t1 as isize) > end {
                t1 = end.max(t0 as isize) as usize;
            }
            if t0 >= t1 {
                continue;
            }
            saved.clear();
            if lead + tail > 0 {
                saved.resize((r_hi - r_lo) * (lead + tail), 0.0);
                let mut at = 0;
                for r in r_lo..r_hi {
                    let row = &out[r * w..(r + 1) * w];
                    copy_few(&mut saved[at..at + lead], &row[..lead]);
                    at += lead;
                    copy_few(&mut saved[at..at + tail], &row[w - tail..]);
                    at += tail;
                }
            }
            let wt = taps[i * p.kw + j];
            let x0 = (t0 as isize + d) as usize;
            let x = &plane[x0..x0 + (t1 - t0)];
            out[t0..t1]
                .iter_mut()
                .zip(x)
                .for_each(|(a, &v)| *a = v.mul_add(wt, *a));
            if lead + tail > 0 {
                let mut at = 0;
                for r in r_lo..r_hi {
                    let row = &mut out[r * w..(r + 1) * w];
                    copy_few(&mut row[..lead], &saved[at..at + lead]);
                    at += lead;
                    copy_few(&mut row[w - tail..], &saved[at..at + tail]);
                    at += tail;
                }
            }
        }
    }
}

/// `to.copy_from_slice(from)` for the one to four values a tap misses at a row's ends,
/// without a `memcpy` call each (which cost more than the taps' whole run).
#[inline(always)]
fn copy_few(to: &mut [f32], from: &[f32]) {
    match (to, from) {
        ([], []) => {}
        ([a], [x]) => *a = *x,
        ([a, b], [x, y]) => (*a, *b) = (*x, *y),
        ([a, b, c], [x, y, z]) => (*a, *b, *c) = (*x, *y, *z),
        ([a, b, c, d], [x, y, z, u]) => (*a, *b, *c, *d) = (*x, *y, *z, *u),
        (to, from) => to.copy_from_slice(from),
    }
}

/// Output row `oh`'s columns `cols` (whole blocks, every tap in bounds) at column stride `s`
/// (a constant where the caller passes one, so the loads below compile to vector loads and
/// shuffles): each block's accumulators stay in registers across all taps.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn depthwise_blocks(
    p: &DepthwisePlane,
    plane: &[f32],
    taps: &[f32],
    oh: usize,
    s: usize,
    cols: std::ops::Range<usize>,
    acc: &mut [f32],
) {
    let pl = p.pad[1];
    let dw = p.dilation[1];
    for c0 in cols.step_by(DW_BLOCK) {
        let mut v = [0.0f32; DW_BLOCK];
        for i in 0..p.kh {
            let Some(row) = p.input_row(plane, oh, i) else {
                continue;
            };
            for j in 0..p.kw {
                let w = taps[i * p.kw + j];
                let x = &row[c0 * s + j * dw - pl..][..(DW_BLOCK - 1) * s + 1];
                for (t, v) in v.iter_mut().enumerate() {
                    *v = x[t * s].mul_add(w, *v);
                }
            }
        }
        acc[c0..c0 + DW_BLOCK].copy_from_slice(&v);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::DepthwisePlane;

    /// Lanes of one vector.
    const L: usize = 8;

    /// Vectors of one output row computed together, at most.
    const MAX_VECTORS: usize = 4;
    /// Output rows computed together where every kernel row is in bounds, at most: with four
    /// vectors, 12 accumulators (each a chain of dependent fmas, so a few must run side by
    /// side to hide the fma's latency) plus the weight, a product and a mask fill the 16
    /// registers.
    const MAX_ROWS: usize = 3;

    /// [`super::depthwise_plane`] in 8-lane vectors (see the module's header).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `plane`, `taps` and `out` are as large as
    /// `depthwise_plane` asserts.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn depthwise_avx2(
        p: &DepthwisePlane,
        plane: &[f32],
        taps: &[f32],
        out: &mut [f32],
    ) {
        let [sh, sw] = p.stride;
        let [pt, pl] = p.pad;
        let [dh, dw] = p.dilation;
        let (oh, ow, kh, kw) = (p.oh, p.ow, p.kh, p.kw);
        if oh == 0 || ow == 0 {
            return;
        }
        // Short, wide planes (a recogniser's 6×80) go tap by tap over long runs: there the
        // setup below cost more than it saved (1.2 vs 0.7 µs for a 3×3 over 6×80 on Zen 3).
        if kh == 0 || kw == 0 || sh == 0 || sw == 0 || (oh < 24 && ow >= 64) {
            return super::depthwise_lanes(p, plane, taps, out);
        }
        let nv = ow.div_ceil(L);
        // Each phase row holds the values the output columns read at that phase.
        let super::Band {
            phase_len: lr,
            reach,
            input_rows: band_in,
        } = super::Band::of(p);
        // Per tap column: where its values lie in an input row's phases, and the output
        // columns it reaches (`lo..hi`).
        let tap_cols: Vec<TapColumn> = (0..kw)
            .map(|j| {
                let off = j * dw;
                let lo = if off >= pl {
                    0
                } else {
                    (pl - off).div_ceil(sw)
                };
                let hi = if p.w + pl > off {
                    (p.w + pl - off - 1) / sw + 1
                } else {
                    0
                };
                TapColumn {
                    at: (off % sw) * lr + off / sw,
                    lo: lo.min(ow),
                    hi: hi.min(ow),
                }
            })
            .collect();
        // A vector needs no masks where every tap column reaches all its columns below `ow`.
        let whole = |v: usize| {
            let (a, b) = (v * L, (v * L + L).min(ow));
            tap_cols.iter().all(|t| t.lo <= a && b <= t.hi)
        };
        // The row's vectors in chunks of nearly equal size; a chunk with a vector that needs
        // masks has them all, tap column j's over its vector u at `at + u·kw + j` in `masks`:
        // which of the vector's columns the tap reaches.
        let n_chunks = nv.div_ceil(MAX_VECTORS);
        let mut masks: Vec<__m256> = Vec::new();
        let chunks: Vec<(usize, usize, Option<usize>)> = (0..n_chunks)
            .map(|c| {
                let (v0, v1) = (c * nv / n_chunks, (c + 1) * nv / n_chunks);
                if (v0..v1).all(whole) {
                    return (v0, v1 - v0, None);
                }
                let at = masks.len();
                for v in v0..v1 {
                    for t in &tap_cols {
                        let lanes: [i32; L] = std::array::from_fn(|l| {
                            -i32::from((t.lo..t.hi).contains(&(v * L + l)))
                        });
                        // SAFETY: `lanes` holds 8 values.
                        let m = unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) };
                        masks.push(_mm256_castsi256_ps(m));
                    }
                }
                (v0, v1 - v0, Some(at))
            })
            .collect();
        // Output rows whose every kernel row lies inside the plane.
        let all_rows = |r: usize| {
            let y = (p.row0 + r) * sh;
            y >= pt && y + (kh - 1) * dh - pt < p.h
        };
        let row_step = sh * sw * lr;
        // Each phase's values in bounds, the same for every row: `m0..m1`, read from
        // `m·stride + off` (the rest of a phase row stays +0).
        let phases: Vec<PhaseRun> = (0..sw)
            .map(|phase| {
                let off = phase as isize - pl as isize;
                let (w, s) = (p.w as isize, sw as isize);
                let m0 = if off >= 0 { 0 } else { (-off + s - 1) / s };
                let m1 = if w - 1 - off >= 0 {
                    (w - 1 - off) / s + 1
                } else {
                    0
                };
                let m0 = (m0 as usize).min(lr);
                PhaseRun {
                    m0,
                    m1: (m1.max(0) as usize).clamp(m0, lr),
                    off,
                }
            })
            .collect();
        // Output rows are taken in bands whose input rows, split by phase, fill about 64 KiB
        // (a band's last input rows are read again by the next band).
        let band = ((band_in - reach) / sh + 1).min(oh);
        let mut rows = vec![0f32; ((band - 1) * sh + reach) * sw * lr];
        let mut live = Vec::with_capacity(kh);
        for b0 in (0..oh).step_by(band) {
            let b1 = (b0 + band).min(oh);
            let top = (p.row0 + b0) * sh;
            let ylo = top.saturating_sub(pt).min(p.h);
            let yend = (p.row0 + b1 - 1) * sh + reach;
            let yhi = yend.saturating_sub(pt).min(p.h).max(ylo);
            for (y, row) in (ylo..yhi).zip(rows.chunks_exact_mut(sw * lr)) {
                let line = &plane[y * p.w..][..p.w];
                for (run, dst) in phases.iter().zip(row.chunks_exact_mut(lr)) {
                    let first = (run.m0 as isize * sw as isize + run.off) as usize;
                    crate::vmath::x86::gather_strided_avx2(
                        line,
                        first,
                        sw,
                        &mut dst[run.m0..run.m1],
                    );
                }
            }
            let mut r = b0;
            while r < b1 {
                let n_rows = if all_rows(r) {
                    (r..b1).take(MAX_ROWS).take_while(|&r| all_rows(r)).count()
                } else {
                    1
                };
                // The kernel rows in bounds for output row r, with where their phases start.
                live.clear();
                for i in 0..kh {
                    let y = (p.row0 + r) * sh + i * dh;
                    if y >= pt && y - pt < p.h {
                        live.push((i * kw, (y - pt - ylo) * sw * lr));
                    }
                }
                let dst = &mut out[r * ow..(r + n_rows) * ow];
                for &(v0, n, mask_at) in &chunks {
                    let b = Block {
                        rows: &rows,
                        live: &live,
                        row_step,
                        taps,
                        tap_cols: &tap_cols,
                        masks: mask_at.map_or(&[][..], |at| &masks[at..]),
                        v0,
                        ow,
                    };
                    let masked = mask_at.is_some();
                    match n_rows {
                        3 => by_vectors::<3>(&b, n, masked, dst),
                        2 => by_vectors::<2>(&b, n, masked, dst),
                        _ => by_vectors::<1>(&b, n, masked, dst),
                    }
                }
                r += n_rows;
            }
        }
    }

    /// The values of one phase of an input row that lie inside the row: `m0..m1`, each
    /// `m` read from column `m·stride + off`.
    struct PhaseRun {
        m0: usize,
        m1: usize,
        off: isize,
    }

    /// One tap column: its offset in an input row's phases, and the output columns it reaches.
    struct TapColumn {
        at: usize,
        lo: usize,
        hi: usize,
    }

    /// What one block of output rows × vectors reads.
    struct Block<'a> {
        /// Input rows split by phase.
        rows: &'a [f32],
        /// The first output row's kernel rows in bounds: (first tap, start of its phases).
        live: &'a [(usize, usize)],
        /// From one output row's input rows to the next's (only used where every kernel row
        /// is in bounds for every output row of the block).
        row_step: usize,
        taps: &'a [f32],
        tap_cols: &'a [TapColumn],
        /// The masks of the block's chunk (empty where it needs none).
        masks: &'a [__m256],
        v0: usize,
        ow: usize,
    }

    /// [`block`] for `n` vectors, with masks or without.
    #[target_feature(enable = "avx2,fma")]
    fn by_vectors<const R: usize>(b: &Block<'_>, n: usize, masked: bool, dst: &mut [f32]) {
        match (n, masked) {
            (4, false) => block::<R, 4, false>(b, dst),
            (3, false) => block::<R, 3, false>(b, dst),
            (2, false) => block::<R, 2, false>(b, dst),
            (1, false) => block::<R, 1, false>(b, dst),
            (4, true) => block::<R, 4, true>(b, dst),
            (3, true) => block::<R, 3, true>(b, dst),
            (2, true) => block::<R, 2, true>(b, dst),
            (1, true) => block::<R, 1, true>(b, dst),
            _ => unreachable!("chunks hold 1 to {MAX_VECTORS} vectors"),
        }
    }

    /// `R` output rows × `N` vectors from vector `v0`: the accumulators stay in registers
    /// across every tap; with `MASKED`, each fma's result is kept only in the lanes its tap
    /// reaches.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn block<const R: usize, const N: usize, const MASKED: bool>(b: &Block<'_>, dst: &mut [f32]) {
        let kw = b.tap_cols.len();
        // Every load below lies inside `rows`: the last one ends at the highest live start,
        // plus the block's last row, plus the farthest tap column, plus the block's vectors.
        let far = b.tap_cols.iter().map(|t| t.at).max().unwrap_or(0);
        let last = b.live.iter().map(|l| l.1).max().unwrap_or(0);
        assert!(last + (R - 1) * b.row_step + far + (b.v0 + N) * L <= b.rows.len());
        assert!((!MASKED || b.masks.len() >= N * kw) && dst.len() >= R * b.ow);
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        for &(tap_row, at) in b.live {
            let row_taps = &b.taps[tap_row..][..kw];
            for (j, (t, &w)) in b.tap_cols.iter().zip(row_taps).enumerate() {
                let w = _mm256_set1_ps(w);
                // SAFETY: the first assertion above.
                let x = unsafe { b.rows.as_ptr().add(at + t.at + b.v0 * L) };
                for (q, row) in acc.iter_mut().enumerate() {
                    for (u, a) in row.iter_mut().enumerate() {
                        // SAFETY: as above.
                        let v = unsafe { _mm256_loadu_ps(x.add(q * b.row_step + u * L)) };
                        let f = _mm256_fmadd_ps(v, w, *a);
                        *a = if MASKED {
                            _mm256_blendv_ps(*a, f, b.masks[u * kw + j])
                        } else {
                            f
                        };
                    }
                }
            }
        }
        for (q, row) in acc.iter().enumerate() {
            let line = &mut dst[q * b.ow..][..b.ow];
            for (u, &a) in row.iter().enumerate() {
                store(line, b.v0 + u, a);
            }
        }
    }

    /// Vector `v` of an output row into `dst`, as many of its lanes as lie inside it.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn store(dst: &mut [f32], v: usize, acc: __m256) {
        let at = v * L;
        if at + L <= dst.len() {
            // SAFETY: 8 values from `at` lie in `dst`.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(at), acc) };
        } else {
            let mut lanes = [0f32; L];
            // SAFETY: `lanes` holds 8 values.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
            let n = dst.len() - at;
            dst[at..].copy_from_slice(&lanes[..n]);
        }
    }
}
