//! f32 `conv2d` on the kernels' GEMM, with the reference's bits.
//!
//! The reference computes each output as one fma chain over its group's input channels, then
//! the kernel rows, then the kernel columns, **skipping** taps that fall in the padding (then
//! adds the bias once). A product `W[o, k] · X[k, p]` over an im2col matrix whose `k` runs in
//! that order is the same chain — but only where no tap is skipped: an fma with a zero from the
//! padding is not always a no-op (it turns a −0 accumulator into +0, and an infinite weight
//! into NaN). So the output positions are split into classes by which taps are in bounds — a
//! set of kernel rows valid for the output row times a set of kernel columns valid for the
//! output column — and each class is its own product whose `k` runs over its valid taps only:
//! the interior (every tap valid) is one large product, the borders a few small ones. Every
//! chain is then exactly the reference's, at every SIMD level and thread count.
//!
//! A class's im2col matrix never exists whole: the GEMM asks for one panel of its columns at
//! a time in its packed layout (`sgemm_packing_b`), which the class writes straight from the
//! input while the panel stays in cache (an im2col matrix written first and packed after
//! crossed memory twice). The interior (every tap in bounds) needs no panels at all on x86
//! (AVX-512 or AVX2): along an output row, tap `p`'s input is the row's run shifted by a
//! fixed offset, so the kernel reads it in place through a table of tap offsets
//! (`sgemm_offsets`) and writes its products, bias added, straight into the output. At a
//! column stride `s` it reads a copy of the input split by column phase (columns `φ, φ + s,
//! …` of a row side by side), in which each tap's columns are again a run. A class of a few
//! positions (a corner) runs transposed on the GEMM's few-rows path. Each other class's
//! product lands in a scratch block that is copied, bias added, into place. Blocks of (image,
//! group) run on separate threads when there are enough of them; otherwise the panels of a
//! block do.
//! A 1×1 convolution with stride 1 and no padding is a product straight from the input. A
//! depthwise convolution (one input and one output channel per group) runs directly, a plane
//! at a time (`tenet_kernels::depthwise`): every output's chain is again exactly its valid
//! taps in order, computed in registers a block of rows and vectors at a time on x86.

use tenet_ir::{DType, HostTensor, Op, TensorType, Window2d};
use tenet_kernels::SimdLevel;
use tenet_kernels::depthwise::{
    DepthwisePlane, depthwise_plane, scratch_bytes as depthwise_scratch_bytes,
};
use tenet_kernels::gemm::{
    GroupEpilogue, OffsetPanel, SMALL_M, Strided, sgemm, sgemm_offsets, sgemm_packing_b, sgemm_then,
};
use tenet_kernels::vmath::gather_strided;
use tenet_reference::math::canonical;

use crate::fused::Poll;
use crate::view::{Pool, f32s, make_f32};

/// The im2col matrix of one chunk holds about this many floats (4 MiB).
pub(crate) const CHUNK_FLOATS: usize = 1 << 20;
/// A chunk computes at most about this many multiply-adds, so the run's stop function, asked
/// before each chunk, is asked at least every 2²⁴ of them (a few milliseconds).
const CHUNK_WORK: usize = 1 << 24;
/// A chunk has at least this many positions (the product's columns), whatever its size.
const MIN_CHUNK_COLS: usize = 64;

/// Columns of one chunk for a product of `og` rows and depth `k` over `positions` positions.
pub(crate) fn chunk_cols(og: usize, k: usize, positions: usize) -> usize {
    (CHUNK_FLOATS / k.max(1))
        .min(CHUNK_WORK / (og * k).max(1))
        .max(MIN_CHUNK_COLS)
        .min(positions.max(1))
}

/// Classes of at most this many positions run as a transposed product (see `block_product`).
const FEW_POSITIONS: usize = 4;

/// Shapes of one convolution.
#[derive(Clone, Copy)]
struct Dims {
    c: usize,
    h: usize,
    w: usize,
    cg: usize,
    og: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    groups: usize,
}

/// Work on a final part of a convolution's output (an activation after it):
/// `f(range, values)` gets the output's elements `range` (flat, row-major), bias added, on the
/// thread that computed them, while they are in cache. Every element is passed exactly once.
pub(crate) type Epilogue<'a> = &'a (dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync);

/// Run `conv2d` when it is f32, `epilogue` over its output as it becomes final; `None` leaves
/// it to the reference's code.
#[allow(clippy::too_many_arguments)]
pub(crate) fn eval(
    pool: &Pool,
    level: SimdLevel,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    threads: usize,
    poll: Poll<'_>,
    epilogue: Option<Epilogue<'_>>,
) -> Option<Result<HostTensor, String>> {
    let Op::Conv2d { window, groups, .. } = op else {
        return None;
    };
    if ty.dtype != DType::F32 || operands.iter().any(|t| t.dtype() != DType::F32) {
        return None;
    }
    let (x, w) = (operands[0], operands[1]);
    let bias = operands.get(2).map(|b| f32s(b));
    let u = |d: u64| d as usize;
    let (xs, ws, ys) = (x.shape(), w.shape(), &ty.shape);
    let d = Dims {
        c: u(xs[1]),
        h: u(xs[2]),
        w: u(xs[3]),
        cg: u(ws[1]),
        og: u(ws[0]) / (*groups as usize).max(1),
        kh: u(ws[2]),
        kw: u(ws[3]),
        oh: u(ys[2]),
        ow: u(ys[3]),
        groups: *groups as usize,
    };
    let (xv, wv) = (f32s(x), f32s(w));
    let mut result = Ok(());
    let t = make_f32(pool, ty, |out| {
        result = run(
            level,
            threads,
            &d,
            window,
            &xv,
            &wv,
            bias.as_deref(),
            out,
            poll,
            epilogue,
        );
    });
    Some(result.map(|()| t))
}

/// The kernel offsets `i` (of `taps`) that land inside an input of `size` for output `o`.
fn valid_taps(
    o: usize,
    taps: usize,
    stride: u32,
    pad: u32,
    dilation: u32,
    size: usize,
) -> Vec<u32> {
    (0..taps)
        .filter(|&i| {
            let pos = o * stride as usize + i * dilation as usize;
            pos >= pad as usize && pos - (pad as usize) < size
        })
        .map(|i| i as u32)
        .collect()
}

/// Output indices grouped by their valid taps, in order of first appearance.
fn classes(
    outputs: usize,
    taps: usize,
    stride: u32,
    pad: u32,
    dilation: u32,
    size: usize,
) -> Vec<(Vec<u32>, Vec<usize>)> {
    let mut out: Vec<(Vec<u32>, Vec<usize>)> = Vec::new();
    for o in 0..outputs {
        let v = valid_taps(o, taps, stride, pad, dilation, size);
        match out.iter_mut().find(|(t, _)| *t == v) {
            Some((_, list)) => list.push(o),
            None => out.push((v, vec![o])),
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run(
    level: SimdLevel,
    threads: usize,
    d: &Dims,
    win: &Window2d,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    poll: Poll<'_>,
    epilogue: Option<Epilogue<'_>>,
) -> Result<(), String> {
    let p = d.oh * d.ow;
    let block = d.og * p;
    if block == 0 {
        return Ok(());
    }
    let n_blocks = out.len() / block;
    let rows = classes(
        d.oh,
        d.kh,
        win.stride[0],
        win.padding[0],
        win.dilation[0],
        d.h,
    );
    let cols = classes(
        d.ow,
        d.kw,
        win.stride[1],
        win.padding[1],
        win.dilation[1],
        d.w,
    );
    let failed = std::sync::Mutex::new(None::<String>);
    let one_block = |b: usize, dst: &mut [f32], threads: usize| {
        let (n, g) = (b / d.groups, b % d.groups);
        let image = &x[(n * d.c + g * d.cg) * d.h * d.w..][..d.cg * d.h * d.w];
        let weights = &w[g * d.og * d.cg * d.kh * d.kw..][..d.og * d.cg * d.kh * d.kw];
        let bias = bias.map(|b| &b[g * d.og..(g + 1) * d.og]);
        // Block b's elements, as the epilogue numbers them, start at b · block.
        let then = |range: std::ops::Range<usize>, values: &mut [f32]| {
            if let Some(e) = epilogue {
                e(b * block + range.start..b * block + range.end, values);
            }
        };
        let then = epilogue.is_some().then_some(&then as Epilogue<'_>);
        let r = block_product(
            level, threads, d, win, image, weights, bias, &rows, &cols, dst, poll, then,
        );
        if let Err(e) = r {
            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
    };
    if n_blocks >= threads && threads > 1 {
        let ranges = tenet_sys::parallel::ranges(out.len(), threads.min(n_blocks), block);
        tenet_sys::parallel::for_each_piece(out, &ranges, |range, piece| {
            for (i, dst) in piece.chunks_mut(block).enumerate() {
                one_block(range.start / block + i, dst, 1);
            }
        });
    } else {
        for (b, dst) in out.chunks_mut(block).enumerate() {
            one_block(b, dst, threads);
        }
    }
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One (image, group): `dst` is its `og × (oh·ow)` block of the output.
#[allow(clippy::too_many_arguments)]
fn block_product(
    level: SimdLevel,
    threads: usize,
    d: &Dims,
    win: &Window2d,
    image: &[f32],
    weights: &[f32],
    bias: Option<&[f32]>,
    rows: &[(Vec<u32>, Vec<usize>)],
    cols: &[(Vec<u32>, Vec<usize>)],
    dst: &mut [f32],
    poll: Poll<'_>,
    epilogue: Option<Epilogue<'_>>,
) -> Result<(), String> {
    let p = d.oh * d.ow;
    let k_full = d.cg * d.kh * d.kw;
    let add_bias = |o: usize, v: f32| match bias {
        Some(b) => canonical(v + b[o]),
        None => v,
    };
    // The epilogue over the block's elements from `start` (flat within the block).
    let fin = |start: usize, values: &mut [f32]| {
        if let Some(e) = epilogue {
            e(start..start + values.len(), values);
        }
    };
    if d.cg == 1 && d.og == 1 {
        depthwise(level, d, win, image, weights, bias.map(|b| b[0]), dst, poll);
        // One plane: still in cache.
        fin(0, dst);
        return Ok(());
    }
    // A pointwise convolution: the input is already the im2col matrix.
    let pointwise = d.kh == 1
        && d.kw == 1
        && win.stride == [1, 1]
        && win.padding == [0; 4]
        && d.oh == d.h
        && d.ow == d.w;
    if pointwise && d.og <= SMALL_M {
        // A few output channels: the GEMM's few-rows path reads the input in place, then the
        // bias goes on in one pass over the (small) result (24→4 over 240×320 at 2 threads
        // on Zen 3: 0.44 ms, where packed panels took 0.93).
        let then = |first: usize, rows: &mut [f32]| {
            if bias.is_some() {
                for (i, row) in rows.chunks_mut(p).enumerate() {
                    for v in row {
                        *v = add_bias(first + i, *v);
                    }
                }
            }
            fin(first * p, rows);
        };
        sgemm_then(
            level,
            threads,
            d.og,
            p,
            d.cg,
            Strided::row_major(weights, d.cg),
            Strided::row_major(image, p),
            dst,
            p,
            (bias.is_some() || epilogue.is_some()).then_some(&then as _),
        )
        .map_err(|e| e.to_string())?;
        return Ok(());
    }
    if pointwise {
        // Panels packed straight from the input rows; the bias added to each finished part
        // of a row while it is in cache.
        let pack = |first: usize, cols: usize, nr: usize, panel: &mut [f32]| {
            for (ch, dst) in panel.chunks_exact_mut(nr).take(d.cg).enumerate() {
                copy_run(&mut dst[..cols], &image[ch * p + first..][..cols]);
            }
        };
        let then = |o: usize, _first: usize, values: &mut [f32]| {
            for v in values {
                *v = add_bias(o, *v);
            }
        };
        sgemm_packing_b(
            level,
            threads,
            d.og,
            p,
            d.cg,
            Strided::row_major(weights, d.cg),
            &pack,
            poll,
            dst,
            p,
            bias.is_some().then_some(&then as _),
        )
        .map_err(|e| e.to_string())?;
        // The product's parts are a panel of columns (a few dozen values a row): too short
        // to run the epilogue on each, so it runs over the block after.
        finish_block(threads, dst, &fin);
        return Ok(());
    }
    // The classes (a set of valid kernel rows × a set of valid kernel columns), each computed
    // with its weights restricted to its valid taps, in the chain's order.
    struct Class<'c> {
        rtaps: &'c [u32],
        ctaps: &'c [u32],
        ohs: &'c [usize],
        ows: &'c [usize],
        k: usize,
    }
    let mut classes = Vec::new();
    for (rtaps, ohs) in rows {
        for (ctaps, ows) in cols {
            let k = d.cg * rtaps.len() * ctaps.len();
            if k == 0 {
                // No tap in bounds: the chain is empty, +0, then the bias.
                for &oh in ohs {
                    for &ow in ows {
                        for o in 0..d.og {
                            dst[o * p + oh * d.ow + ow] = add_bias(o, 0.0);
                        }
                    }
                }
                continue;
            }
            classes.push(Class {
                rtaps,
                ctaps,
                ohs,
                ows,
                k,
            });
        }
    }
    // The interior (every tap in bounds) last: when its product finishes an output row, the
    // row's border positions are final too, so the epilogue runs on the whole row in cache.
    classes.sort_by_key(|c| c.k == k_full);
    // Output rows whose epilogue has run (with the interior's product).
    let mut finished_rows = vec![false; d.oh];
    let (sh, sw) = (win.stride[0] as usize, win.stride[1] as usize);
    let (dh, dw) = (win.dilation[0] as usize, win.dilation[1] as usize);
    let (pt, pl) = (win.padding[0] as usize, win.padding[1] as usize);
    // Positions `start..end` of a class as runs along output rows: (oh, first and past-last
    // index into the class's columns, offset from `start`).
    let segments = |c: &Class<'_>, start: usize, end: usize, segs: &mut Vec<_>| {
        let nw = c.ows.len();
        segs.clear();
        let mut pos = start;
        while pos < end {
            let (r, c0) = (pos / nw, pos % nw);
            let c1 = nw.min(c0 + (end - pos));
            segs.push((c.ohs[r], c0, c1, pos - start));
            pos += c1 - c0;
        }
    };
    let mut out = Vec::new();
    let mut segs = Vec::new();
    // One buffer for the border classes' weights, one class at a time, kept by the thread.
    let mut restricted = SPARE_WEIGHTS.take();
    for c in &classes {
        let n = c.ohs.len() * c.ows.len();
        let contiguous = c
            .ows
            .last()
            .is_some_and(|&l| l - c.ows[0] + 1 == c.ows.len());
        // One panel of the class's im2col matrix, straight into the GEMM's packed layout:
        // step (channel, i, j) holds the input under tap (i, j) for each of the panel's
        // positions.
        let pack = |first: usize, cols: usize, nr: usize, panel: &mut [f32]| {
            let mut segs = Vec::with_capacity(4);
            segments(c, first, first + cols, &mut segs);
            let mut row = 0;
            for ch in 0..d.cg {
                let plane = &image[ch * d.h * d.w..][..d.h * d.w];
                for &i in c.rtaps {
                    for &j in c.ctaps {
                        let dst_row = &mut panel[row * nr..][..cols];
                        for &(oh, c0, c1, at) in &segs {
                            let ih = oh * sh + i as usize * dh - pt;
                            let line = &plane[ih * d.w..][..d.w];
                            let to = &mut dst_row[at..at + (c1 - c0)];
                            if contiguous {
                                let first = c.ows[c0] * sw + j as usize * dw - pl;
                                if sw == 1 {
                                    copy_run(to, &line[first..first + (c1 - c0)]);
                                } else {
                                    for (q, slot) in to.iter_mut().enumerate() {
                                        *slot = line[first + q * sw];
                                    }
                                }
                            } else {
                                for (slot, &ow) in to.iter_mut().zip(&c.ows[c0..c1]) {
                                    *slot = line[ow * sw + j as usize * dw - pl];
                                }
                            }
                        }
                        row += 1;
                    }
                }
            }
        };
        let a = if c.k == k_full {
            weights
        } else {
            restrict(d, weights, c.rtaps, c.ctaps, &mut restricted);
            &restricted
        };
        // Every tap in bounds: each output row's positions read the input in place through
        // one table of tap offsets, no packing — at a column stride, from a copy of the input
        // split by column phase, where each tap's columns are again a run — and the products,
        // bias added, land straight in the output.
        if n > FEW_POSITIONS
            && c.k == k_full
            && contiguous
            && c.ows.len() >= 16
            && matches!(level.or_supported(), SimdLevel::Avx512 | SimdLevel::Avx2)
        {
            let layout = Layout::new(d, win);
            let phased = (sw > 1).then(|| split_phases(level, d, &layout, image));
            // Rows of C are output channels, its columns the plane's positions; a group is an
            // output row, whose every other position an earlier class has computed.
            let spans: Vec<(usize, usize)> = c
                .ohs
                .iter()
                .map(|&oh| (oh * d.ow, (oh + 1) * d.ow))
                .collect();
            let then = |o: usize, col: usize, values: &mut [f32]| fin(o * p + col, values);
            let done = sgemm_offsets(
                level,
                threads,
                d.og,
                c.k,
                Strided::row_major(a, c.k),
                phased.as_deref().unwrap_or(image),
                &tap_offsets(d, win, &layout),
                &row_panels(d, win, &layout, c.ohs, c.ows),
                dst,
                p,
                bias,
                epilogue.is_some().then_some(GroupEpilogue {
                    spans: &spans,
                    f: &then,
                }),
                poll,
            )
            .map_err(|e| e.to_string())?;
            if done {
                for &oh in c.ohs {
                    finished_rows[oh] = true;
                }
                if poll() {
                    return Ok(()); // stopped part way: the run gives up
                }
                continue;
            }
        }
        out.clear();
        out.resize(d.og * n, 0.0);
        if n <= FEW_POSITIONS {
            // A corner or the border of a narrow input: a panel of the GEMM's width would be
            // mostly padding, so the product runs transposed, `outᵀ = im2colᵀ · Wᵀ`, on the
            // GEMM's few-rows path (the same chains), and is transposed back.
            let mut im2col = vec![0.0; c.k * n];
            pack(0, n, n, &mut im2col);
            let mut t = vec![0.0; n * d.og];
            sgemm(
                level,
                1,
                n,
                d.og,
                c.k,
                Strided {
                    data: &im2col,
                    rs: 1,
                    cs: n,
                },
                Strided {
                    data: a,
                    rs: 1,
                    cs: c.k,
                },
                &mut t,
                d.og,
            )
            .map_err(|e| e.to_string())?;
            for (j, row) in t.chunks_exact(d.og).enumerate() {
                for (o, &v) in row.iter().enumerate() {
                    out[o * n + j] = v;
                }
            }
        } else {
            sgemm_packing_b(
                level,
                threads,
                d.og,
                n,
                c.k,
                Strided::row_major(a, c.k),
                &pack,
                poll,
                &mut out,
                n,
                None,
            )
            .map_err(|e| e.to_string())?;
            if poll() {
                return Ok(()); // stopped part way: the run gives up
            }
        }
        // The class's results into place, bias added.
        segments(c, 0, n, &mut segs);
        for &(oh, c0, c1, at) in &segs {
            for o in 0..d.og {
                let from = &out[o * n + at..][..c1 - c0];
                let plane = &mut dst[o * p..][..p];
                if contiguous {
                    let to = &mut plane[oh * d.ow + c.ows[c0]..][..c1 - c0];
                    for (t, &v) in to.iter_mut().zip(from) {
                        *t = add_bias(o, v);
                    }
                } else {
                    for (&ow, &v) in c.ows[c0..c1].iter().zip(from) {
                        plane[oh * d.ow + ow] = add_bias(o, v);
                    }
                }
            }
        }
    }
    if restricted.capacity() <= KEPT_FLOATS {
        SPARE_WEIGHTS.set(restricted);
    }
    if epilogue.is_some() && !poll() {
        if finished_rows.iter().any(|&f| f) {
            // The rows the interior's product did not finish (the top and bottom borders).
            for (oh, _) in finished_rows.iter().enumerate().filter(|(_, f)| !**f) {
                for o in 0..d.og {
                    let at = o * p + oh * d.ow;
                    fin(at, &mut dst[at..at + d.ow]);
                }
            }
        } else {
            finish_block(threads, dst, &fin);
        }
    }
    Ok(())
}

/// Run `fin` (the epilogue from a block's element `start`) over the whole block `dst`, split
/// across `threads`, in pieces that stay in cache.
fn finish_block(threads: usize, dst: &mut [f32], fin: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    const PIECE: usize = 1 << 14;
    let ranges = tenet_sys::parallel::ranges(dst.len(), threads.max(1), PIECE);
    tenet_sys::parallel::for_each_piece(dst, &ranges, |range, part| {
        for (i, piece) in part.chunks_mut(PIECE).enumerate() {
            fin(range.start + i * PIECE, piece);
        }
    });
}

/// The largest buffer of class weights a thread keeps for its next convolution (4 MiB), so
/// that the border classes of every call do not fault in fresh pages: in a virtual machine
/// that cost 4 µs a page, more than the copy itself.
const KEPT_FLOATS: usize = 1 << 20;

thread_local! {
    static SPARE_WEIGHTS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Into `a`, the weights of a class whose valid taps are `rtaps × ctaps`: per output channel,
/// per input channel, each valid kernel row's valid columns — the chain's order. A kernel
/// row's valid columns are consecutive (the taps in bounds of one output form a run), so
/// each is one copy: this runs for every border class on every call, and fresh buffers
/// copied element by element took 0.43 ms of a 0.8 ms convolution (480→60 channels, 1×3
/// over 1×40 positions, Zen 3).
fn restrict(d: &Dims, weights: &[f32], rtaps: &[u32], ctaps: &[u32], a: &mut Vec<f32>) {
    let run = ctaps.len();
    let consecutive = ctaps.windows(2).all(|w| w[1] == w[0] + 1);
    a.clear();
    a.resize(d.og * d.cg * rtaps.len() * run, 0.0);
    let mut to = a.chunks_exact_mut(run);
    for kernel in weights.chunks_exact(d.kh * d.kw).take(d.og * d.cg) {
        for &i in rtaps {
            let row = &kernel[i as usize * d.kw..][..d.kw];
            let dst = to.next().expect("sized for every valid kernel row");
            match ctaps.first() {
                Some(&j0) if consecutive => {
                    dst.copy_from_slice(&row[j0 as usize..j0 as usize + run]);
                }
                _ => {
                    for (slot, &j) in dst.iter_mut().zip(ctaps) {
                        *slot = row[j as usize];
                    }
                }
            }
        }
    }
}

/// Where an input element lies in the plane the in-place product reads: the input itself at
/// column stride 1, else its copy split by column phase ([`split_phases`]), in which input
/// column `x` of a row is at `(x mod s)·phase_len + x div s`.
struct Layout {
    stride: usize,
    phase_len: usize,
    row_len: usize,
    plane_len: usize,
    /// `⌈pad / stride⌉`: output column `c`'s taps lie `c − shift` elements past where
    /// output column `shift`'s do, whose offsets are all ≥ 0.
    shift: usize,
}

impl Layout {
    fn new(d: &Dims, win: &Window2d) -> Layout {
        let s = win.stride[1] as usize;
        let phase_len = d.w.div_ceil(s);
        Layout {
            stride: s,
            phase_len,
            row_len: s * phase_len,
            plane_len: d.h * s * phase_len,
            shift: (win.padding[1] as usize).div_ceil(s),
        }
    }

    /// Where padded column `q` (input column `q − pad`) of output column `shift` lies in
    /// its row; output column `c`'s lies `c − shift` further.
    fn column(&self, q: usize, pad: usize) -> usize {
        let x = q as isize - pad as isize + (self.shift * self.stride) as isize;
        let x = x as usize; // ≥ 0: shift·stride ≥ pad
        (x % self.stride) * self.phase_len + x / self.stride
    }
}

/// The input split by column phase: each row's columns `φ, φ + s, φ + 2s, …` as phase row
/// `φ` (zeros past the row's end), for reading a convolution of column stride `s` in place.
fn split_phases(level: SimdLevel, d: &Dims, layout: &Layout, image: &[f32]) -> Vec<f32> {
    let s = layout.stride;
    let mut out = vec![0.0f32; d.cg * layout.plane_len];
    for (line, row) in image
        .chunks_exact(d.w)
        .zip(out.chunks_exact_mut(layout.row_len))
    {
        for (phase, dst) in row.chunks_exact_mut(layout.phase_len).enumerate() {
            let n = (d.w - phase.min(d.w)).div_ceil(s);
            gather_strided(level, line, phase, s, &mut dst[..n]);
        }
    }
    out
}

/// For each tap (channel, kernel row, kernel column) in the chain's order, where the element
/// under it for output column `shift` lies from the start of its output row's input rows:
/// `B(p, j)` of a run is the plane at the run's start (`row_panels`) plus this.
fn tap_offsets(d: &Dims, win: &Window2d, layout: &Layout) -> Vec<usize> {
    let (dh, dw) = (win.dilation[0] as usize, win.dilation[1] as usize);
    let pl = win.padding[1] as usize;
    let mut out = Vec::with_capacity(d.cg * d.kh * d.kw);
    for ch in 0..d.cg {
        for i in 0..d.kh {
            for j in 0..d.kw {
                let column = layout.column(j * dw, pl);
                out.push(ch * layout.plane_len + i * dh * layout.row_len + column);
            }
        }
    }
    out
}

/// The interior class's positions as panels read in place, one group per output row: 48
/// columns at a time, then 16 at a time, the last panel of a row ending at the row's end
/// (overlapping the one before it: the same values written twice by the same thread).
fn row_panels(
    d: &Dims,
    win: &Window2d,
    layout: &Layout,
    ohs: &[usize],
    ows: &[usize],
) -> Vec<Vec<OffsetPanel>> {
    let (sh, pt) = (win.stride[0] as usize, win.padding[0] as usize);
    let nw = ows.len();
    // A run from output column `ow` starts `ow − shift` elements into its input rows: every
    // tap of the interior is in bounds, so `ow ≥ shift`.
    let first_col = ows[0] - layout.shift;
    ohs.iter()
        .map(|&oh| {
            let first = (oh * sh - pt) * layout.row_len + first_col;
            // Columns of C are positions of the output plane.
            let in_plane = oh * d.ow + ows[0];
            let mut panels = Vec::new();
            let mut col = 0;
            while col + 48 <= nw {
                panels.push(OffsetPanel {
                    start: first + col,
                    c_col: in_plane + col,
                    width: 48,
                });
                col += 48;
            }
            while col < nw {
                let at = col.min(nw - 16);
                panels.push(OffsetPanel {
                    start: first + at,
                    c_col: in_plane + at,
                    width: 16,
                });
                col += 16;
            }
            panels
        })
        .collect()
}

/// `to.copy_from_slice(from)` for the short runs of a packed panel: whole panels of the
/// widths the GEMM uses as fixed-size copies the compiler inlines (a `memcpy` call per run of
/// 48 floats cost as much as the copy).
#[inline]
fn copy_run(to: &mut [f32], from: &[f32]) {
    fn fixed<const N: usize>(to: &mut [f32], from: &[f32]) -> bool {
        match (
            <&mut [f32; N]>::try_from(&mut *to),
            <&[f32; N]>::try_from(from),
        ) {
            (Ok(t), Ok(f)) => {
                *t = *f;
                true
            }
            _ => false,
        }
    }
    if !(fixed::<48>(to, from) || fixed::<32>(to, from) || fixed::<16>(to, from)) {
        to.copy_from_slice(from);
    }
}

/// One channel of a depthwise convolution: `plane` is the input channel, `taps` its `kh × kw`
/// kernel, `dst` the output channel.
#[allow(clippy::too_many_arguments)]
fn depthwise(
    level: SimdLevel,
    d: &Dims,
    win: &Window2d,
    plane: &[f32],
    taps: &[f32],
    bias: Option<f32>,
    dst: &mut [f32],
    poll: Poll<'_>,
) {
    // Bands of rows of at most about 2^18 multiply-adds, the run's stop function asked before
    // each.
    let band = ((1usize << 18) / (d.ow * d.kh * d.kw).max(1)).max(1);
    for (b, rows) in dst.chunks_mut(band * d.ow).enumerate() {
        if poll() {
            return;
        }
        let geometry = DepthwisePlane {
            h: d.h,
            w: d.w,
            kh: d.kh,
            kw: d.kw,
            row0: b * band,
            oh: rows.len() / d.ow,
            ow: d.ow,
            stride: [win.stride[0] as usize, win.stride[1] as usize],
            pad: [win.padding[0] as usize, win.padding[1] as usize],
            dilation: [win.dilation[0] as usize, win.dilation[1] as usize],
        };
        depthwise_plane(level, &geometry, plane, taps, rows);
    }
    for v in dst.iter_mut() {
        *v = canonical(match bias {
            Some(b) => *v + b,
            None => *v,
        });
    }
}

/// Scratch of one f32 convolution on `threads` threads, for the memory bound: per block being
/// computed, the largest im2col chunk, the class's weights and the chunk's products (the GEMM's
/// own packing is counted by the caller); at a column stride, the input split by phase; for a
/// depthwise one, what its plane kernel allocates per thread.
pub(crate) fn scratch_bytes(
    x: &[u64],
    w: &[u64],
    y: &[u64],
    win: &Window2d,
    groups: u64,
    threads: u64,
) -> u64 {
    let (cg, kh, kw) = (w[1], w[2], w[3]);
    let og = w[0] / groups.max(1);
    let k = cg * kh * kw;
    let p = y[2] * y[3];
    let cols = chunk_cols(og as usize, k as usize, p as usize) as u64;
    // Per block computed at once: the chunks' products (the whole block's outputs) and the
    // class weights; per thread, one im2col chunk.
    let blocks = (x[0] * groups).max(1);
    let parallel = threads.min(blocks);
    let depthwise = if cg == 1 && og == 1 {
        let u = |v: u64| v as usize;
        let plane = DepthwisePlane {
            h: u(x[2]),
            w: u(x[3]),
            kh: u(kh),
            kw: u(kw),
            row0: 0,
            oh: u(y[2]),
            ow: u(y[3]),
            stride: win.stride.map(|s| s as usize),
            pad: [win.padding[0] as usize, win.padding[1] as usize],
            dilation: win.dilation.map(|d| d as usize),
        };
        threads.saturating_mul(depthwise_scratch_bytes(&plane) as u64)
    } else {
        0
    };
    // At a column stride, the input split by phase for the in-place product, per block.
    let sw = u64::from(win.stride[1]).max(1);
    let phased = if sw > 1 && !(cg == 1 && og == 1) {
        parallel * 4 * cg * x[2] * sw * x[3].div_ceil(sw)
    } else {
        0
    };
    (parallel * 4 * (og * p + og * k) + threads * 4 * k * cols)
        .saturating_add(depthwise)
        .saturating_add(phased)
}
