//! Products whose B is read in place through a table of offsets, with no packing: in a panel
//! of `width` consecutive columns from `start`, `B(p, j) = x[start + offsets[p] + j]` — a
//! stride-1 convolution's input under tap `p` for a run of output positions in one output row.
//! Packing that panel first (as [`super::sgemm_packing_b`] does) writes and reads every
//! element once more; with few output channels the packing was a third of the work. The same
//! fma chains as every other path, so the same bits. AVX-512 (8 × 48 and 8 × 16 tiles) and AVX2
//! (6 × 16 tiles, three to a 48-column panel); elsewhere the caller packs.

use super::{GemmError, RowPart, SimdLevel, Stop, Strided, check, span};

/// `width` (16 or 48) consecutive columns of C from `c_col`, whose `B(p, j)` is
/// `x[start + offsets[p] + j]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetPanel {
    pub start: usize,
    pub c_col: usize,
    pub width: usize,
}

/// An epilogue for [`sgemm_offsets`]: once every panel of group `g` is done on row `i` of C,
/// `f(i, start, values)` gets that row's columns `spans[g] = (start, end)` — the group's own
/// columns, and any around them the caller has already made final (a convolution's border
/// positions) — while they are in cache. The caller keeps the spans of different groups
/// apart and writes nothing inside a group's span while the product runs.
#[derive(Clone, Copy)]
pub struct GroupEpilogue<'a> {
    pub spans: &'a [(usize, usize)],
    pub f: RowPart<'a>,
}

/// `C[m × ·] = A[m × k] · B` over the panels of `groups`, plus `bias[i]` on row `i` once each
/// chain is complete (made canonical after, as the reference's bias add is); panels of one
/// group may overlap (they write the same values to the same columns) and run on one thread.
/// `then`, where given, runs on each group's span of every row once the group is done there
/// ([`GroupEpilogue`]).
/// `Ok(false)` when the level has no such kernel (nothing was written: the caller computes it
/// another way).
#[allow(clippy::too_many_arguments)]
pub fn sgemm_offsets(
    level: SimdLevel,
    threads: usize,
    m: usize,
    k: usize,
    a: Strided<'_>,
    x: &[f32],
    offsets: &[usize],
    groups: &[Vec<OffsetPanel>],
    c: &mut [f32],
    c_rs: usize,
    bias: Option<&[f32]>,
    then: Option<GroupEpilogue<'_>>,
    stop: Stop<'_>,
) -> Result<bool, GemmError> {
    if !matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2) || !level.supported() {
        return Ok(false);
    }
    if m == 0 || groups.iter().all(Vec::is_empty) {
        return Ok(true);
    }
    check("A", span(m, k, a.rs, a.cs), a.data.len())?;
    if offsets.len() != k {
        return Err(GemmError::OutOfBounds {
            operand: "offsets",
            needed: k,
            len: offsets.len(),
        });
    }
    let reach = offsets.iter().copied().max().unwrap_or(0);
    for p in groups.iter().flatten() {
        if p.width != 16 && p.width != 48 {
            return Err(GemmError::OutOfBounds {
                operand: "panel width (16 or 48)",
                needed: 48,
                len: p.width,
            });
        }
        let needed = p
            .start
            .checked_add(reach)
            .and_then(|v| v.checked_add(p.width));
        check("B", needed, x.len())?;
        if p.c_col + p.width > c_rs {
            return Err(GemmError::OverlappingRows {
                rs: c_rs,
                n: p.c_col + p.width,
            });
        }
    }
    check("C", span(m, c_rs, c_rs, 1), c.len())?;
    if let Some(e) = then {
        check("epilogue spans", Some(groups.len()), e.spans.len())?;
        if let Some(&(start, end)) = e.spans.iter().find(|(s, e)| s > e || *e > c_rs) {
            return Err(GemmError::OverlappingRows {
                rs: c_rs,
                n: end.max(start),
            });
        }
    }
    if let Some(b) = bias {
        check("bias", Some(m), b.len())?;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if level == SimdLevel::Avx512 {
            run::<8>(
                level, threads, m, k, a, x, offsets, groups, c, c_rs, bias, then, stop,
            );
        } else {
            run::<6>(
                level, threads, m, k, a, x, offsets, groups, c, c_rs, bias, then, stop,
            );
        }
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, bias, then, stop);
        Ok(false)
    }
}

/// The product over `MR`-row tiles (8 with AVX-512, 6 with AVX2: `level` is one of the two and
/// supported).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn run<const MR: usize>(
    level: SimdLevel,
    threads: usize,
    m: usize,
    k: usize,
    a: Strided<'_>,
    x: &[f32],
    offsets: &[usize],
    groups: &[Vec<OffsetPanel>],
    c: &mut [f32],
    c_rs: usize,
    bias: Option<&[f32]>,
    then: Option<GroupEpilogue<'_>>,
    stop: Stop<'_>,
) {
    // AVX-512's 8 × 48 tiles over whole depths (up to 1024 steps, measured on Zen 4); AVX2's
    // 6 × 16 tiles over blocks of 64 steps, each tile of the panel over a block before the next:
    // a block touches a few rows of a few channel planes, each plane its own pages (whole
    // depths of 864 steps ran the detector's 96→24 3×3 layers at 47–52 GFLOP/s on one Zen 3
    // core, blocks of 32–96 at 73–82; `offsets_speed`).
    let kc_block = if MR == 8 { 1024 } else { 64 };
    // A packed once, whole: panel q holds rows q·MR.. of every step (`[p·MR + i]`), zero rows
    // past m.
    let cfg = super::Config::for_level(level, 48);
    let mut ap = vec![0.0f32; m.div_ceil(MR) * MR * k];
    super::pack_a::<MR>(&cfg, &mut ap, a, 0, m, 0, k);
    // The bias padded to whole tiles (the kernel adds one value a row).
    let bias: Option<Vec<f32>> = bias.map(|b| {
        let mut v = b[..m].to_vec();
        v.resize(m.div_ceil(MR) * MR, 0.0);
        v
    });
    let shared = super::SharedC::new(c);
    // With fewer groups than threads (a convolution over a row or two), each group's rows of
    // C are split too: units of different rows never write the same element.
    let splits = if groups.len() >= threads {
        1
    } else {
        threads.div_ceil(groups.len()).min(m.div_ceil(MR))
    };
    let rows_per = m.div_ceil(splits).div_ceil(MR) * MR;
    let splits = m.div_ceil(rows_per);
    let work = tenet_sys::parallel::Stealing::new(&tenet_sys::parallel::ranges(
        groups.len() * splits,
        threads,
        1,
    ));
    let ap = &ap;
    tenet_sys::parallel::run_parts(work.owners(), &|t| {
        let mut tile = [0.0f32; 8 * 48];
        // Unit `u`: the rows of split `u % splits` over the panels of group `u / splits`.
        let mut group = |u: usize| {
            if stop() {
                return false;
            }
            let (g, split) = (u / splits, u % splits);
            let row_range = split * rows_per..((split + 1) * rows_per).min(m);
            for p in &groups[g] {
                // The split's last tile may have fewer than MR rows: it runs on the scratch
                // tile, read once before the steps and written back after them.
                let last_ir = row_range.end.saturating_sub(1) / MR * MR;
                let partial = row_range.end - last_ir < MR;
                let partial_rows = row_range.end - last_ir;
                if partial {
                    for i in 0..partial_rows {
                        // SAFETY: this thread alone writes these rows of this group's columns
                        // (groups do not overlap, nor do splits); row last_ir + i < m.
                        unsafe {
                            shared.read(
                                (last_ir + i) * c_rs + p.c_col,
                                &mut tile[i * p.width..][..p.width],
                            )
                        };
                    }
                }
                // Steps in blocks, every tile of the panel over one block before the next, so
                // the block's rows of x stay in L1 while each tile reads them.
                for pc in (0..k).step_by(kc_block) {
                    let kc = kc_block.min(k - pc);
                    let (load, last) = (pc > 0, pc + kc == k);
                    for ir in row_range.clone().step_by(MR) {
                        let (dst, ldc) = if partial && ir == last_ir {
                            (tile.as_mut_ptr(), p.width)
                        } else {
                            // SAFETY: rows ir..ir+MR ≤ m, columns c_col..c_col+width ≤ c_rs
                            // (both checked by the caller), inside C.
                            (unsafe { shared.ptr.add(ir * c_rs + p.c_col) }, c_rs)
                        };
                        let a_ptr = ap[(ir / MR) * MR * k + pc * MR..].as_ptr();
                        // Null: no bias; else MR values from row ir (inside the padded copy).
                        let b_ptr = match (&bias, last) {
                            (Some(b), true) => b[ir..ir + MR].as_ptr(),
                            _ => std::ptr::null(),
                        };
                        // SAFETY: the CPU has AVX-512F for MR = 8, AVX2 and FMA for MR = 6
                        // (checked by the caller); the kernel reads kc·MR values of the packed
                        // A from a_ptr (inside `ap`), for each step width values of x from
                        // start + offsets[pc + s] (start + the largest offset + width ≤
                        // x.len(), checked by the caller), and reads and writes MR rows of
                        // width values at stride ldc from dst: inside C (a full tile) or the
                        // scratch tile (8 rows of 48); b_ptr is null or holds MR values.
                        unsafe {
                            let xs = x.as_ptr().add(p.start);
                            let offs = offsets.as_ptr().add(pc);
                            match (MR, p.width) {
                                (8, 48) => {
                                    kernel::<3>(kc, a_ptr, xs, offs, dst, ldc, load, last, b_ptr)
                                }
                                (8, _) => {
                                    kernel::<1>(kc, a_ptr, xs, offs, dst, ldc, load, last, b_ptr)
                                }
                                _ => {
                                    for s in (0..p.width).step_by(16) {
                                        kernel_avx2(
                                            kc,
                                            a_ptr,
                                            xs.add(s),
                                            offs,
                                            dst.add(s),
                                            ldc,
                                            load,
                                            last,
                                            b_ptr,
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                if partial {
                    for i in 0..partial_rows {
                        // SAFETY: as for the read above.
                        unsafe {
                            shared.write(
                                (last_ir + i) * c_rs + p.c_col,
                                &tile[i * p.width..][..p.width],
                            )
                        };
                    }
                }
            }
            if let Some(then) = then {
                let (start, end) = then.spans[g];
                for i in row_range {
                    // SAFETY: this unit alone owns these rows of this group's span (groups'
                    // spans are apart, the caller writes none meanwhile, and splits own
                    // different rows), and every panel of the group is done on them; columns
                    // start..end ≤ c_rs of row i < m lie inside C (checked by the caller).
                    let values = unsafe { shared.from(i * c_rs + start).rows(1, end - start, 0) };
                    (then.f)(i, start, values);
                }
            }
            true
        };
        while let Some(r) = work.take_front(t, 1) {
            if !r.into_iter().all(&mut group) {
                return;
            }
        }
        for v in (1..work.owners()).map(|d| (t + d) % work.owners()) {
            while let Some(g) = work.steal_back(v) {
                if !group(g) {
                    return;
                }
            }
        }
    });
}

/// The 8 × 16·NV micro-kernel with B read through offsets: step `p` loads `16·NV` values from
/// `x + offs[p]`, broadcasts the 8 values of the packed A, and runs its fmas — the same chains
/// as the packed kernel. With `last`, the finished chains are made canonical — or, where `bias`
/// is not null, have `bias[i]` added to row `i` and then are made canonical.
///
/// # Safety
/// The CPU supports AVX-512F; `a` holds `kc·8` values; for `p < kc`, `offs[p]` is readable and
/// `x + offs[p]` holds `16·NV` values; `c` holds 8 rows of `16·NV` values at stride `ldc`;
/// `bias` is null or holds 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const NV: usize>(
    kc: usize,
    a: *const f32,
    x: *const f32,
    offs: *const usize,
    c: *mut f32,
    ldc: usize,
    load: bool,
    last: bool,
    bias: *const f32,
) {
    use std::arch::x86_64::*;
    const MR: usize = 8;
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    if load {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, r) in row.iter_mut().enumerate() {
                // SAFETY: row i, vector v of the tile is inside `c`.
                *r = unsafe { _mm512_loadu_ps(c.add(i * ldc + 16 * v)) };
            }
        }
    }
    for p in 0..kc {
        // SAFETY: step p < kc: its offset and the 16·NV values there are readable.
        let bp = unsafe { x.add(*offs.add(p)) };
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, b) in bv.iter_mut().enumerate() {
            // SAFETY: as above.
            *b = unsafe { _mm512_loadu_ps(bp.add(16 * v)) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: step p < kc, i < 8: inside the packed A.
            let ai = _mm512_set1_ps(unsafe { *a.add(p * MR + i) });
            for (r, &b) in row.iter_mut().zip(&bv) {
                *r = _mm512_fmadd_ps(ai, b, *r);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: a non-null bias holds 8 values.
        let b = (!bias.is_null()).then(|| _mm512_set1_ps(unsafe { *bias.add(i) }));
        for (v, &r) in row.iter().enumerate() {
            let r = match (last, b) {
                (true, Some(b)) => crate::simd::canonical16(_mm512_add_ps(r, b)),
                (true, None) => crate::simd::canonical16(r),
                _ => r,
            };
            // SAFETY: row i, vector v of the tile is inside `c`.
            unsafe { _mm512_storeu_ps(c.add(i * ldc + 16 * v), r) };
        }
    }
}

/// The 6 × 16 AVX2 micro-kernel with B read through offsets: the packed AVX2 kernel's chains,
/// its two B vectors loaded from `x + offs[p]`; `last` and `bias` as for [`kernel`].
///
/// # Safety
/// The CPU supports AVX2 and FMA; `a` holds `kc·6` values; for `p < kc`, `offs[p]` is readable
/// and `x + offs[p]` holds 16 values; `c` holds 6 rows of 16 values at stride `ldc`; `bias` is
/// null or holds 6 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_avx2(
    kc: usize,
    a: *const f32,
    x: *const f32,
    offs: *const usize,
    c: *mut f32,
    ldc: usize,
    load: bool,
    last: bool,
    bias: *const f32,
) {
    use std::arch::x86_64::*;
    const MR: usize = 6;
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
    for p in 0..kc {
        // SAFETY: step p < kc: its offset and the 16 values there are readable.
        let (b0, b1) = unsafe {
            let bp = x.add(*offs.add(p));
            (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
        };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: step p < kc, i < 6: inside the packed A.
            let ai = _mm256_set1_ps(unsafe { *a.add(p * MR + i) });
            row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
            row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: a non-null bias holds 6 values.
        let b = (!bias.is_null()).then(|| _mm256_set1_ps(unsafe { *bias.add(i) }));
        let fix = |v: __m256| match (last, b) {
            (true, Some(b)) => crate::simd::canonical8(_mm256_add_ps(v, b)),
            (true, None) => crate::simd::canonical8(v),
            _ => v,
        };
        // SAFETY: row i (16 values) of the tile is inside `c`.
        unsafe {
            _mm256_storeu_ps(c.add(i * ldc), fix(row[0]));
            _mm256_storeu_ps(c.add(i * ldc + 8), fix(row[1]));
        }
    }
}
