//! What a run of the CPU backend may cost beyond the cost certificate: the memory bound a node
//! checks against its limit, and the work figure its run time is bounded by.
//!
//! **Memory.** A run holds at most the certificate's `peak_bytes` of tensors (the executor's own
//! count, `RunStats::peak_bytes`, never exceeds it), plus scratch that is not tensor memory:
//!
//! | part | bytes |
//! |---|---|
//! | fixed (the run's tables, thread pool bookkeeping) | [`RUN_FIXED`] |
//! | per thread (a block of a reduction's output offsets, small tables) | [`PER_THREAD`] × threads |
//! | per live value (the table of values held) | [`PER_VALUE`] × the most values live at once |
//! | the largest step's own scratch | see [`step_scratch`] |
//!
//! A step's scratch: a fused group, (members + 3) chunk buffers per thread, each at most
//! `fused::CHUNK` floats and never longer than the tensor; a norm with a fused prologue, that
//! and a block of rows per thread; an f32 product, the GEMM's packing per thread that runs one
//! (B at most `(n + 47)·k` floats and 24 MiB, A a block of at most 96 rows by 1,024 steps;
//! kept by the thread for the next product; products of at most 4 rows, or with k above
//! 2¹⁷, pack nothing); attention, per thread, the scores and probabilities of one batch entry
//! and the packing of its two products; a `qmatmul`, the quantised product's scratch
//! (`tenet_kernels::qgemm::scratch_bytes`: a step-major copy of A's rows and a padded last tile
//! of the weight, or for many rows a bounded chunk of dequantised weight rows) plus, for many
//! rows, the f32 GEMM's packing per thread; `dequantize`, none; an f32 convolution
//! (`conv.rs`), per block computed at once, the class's weights and products (a depthwise
//! one: its plane kernel's own, `depthwise::scratch_bytes`), per thread a
//! packed panel (bounded by an im2col chunk of `conv::chunk_cols` columns), plus the GEMM's
//! packing and the weights packed once for all panels of columns
//! (`gemm::packing_b_scratch_bytes`); an f32 sum over listed
//! positions, 8 bytes each; a
//! gather, 16 bytes per index; an op with no fast path
//! (computed by the reference's code), [`REFERENCE_BYTES_PER_ELEMENT`] per element of its
//! operands and result. Every other step (movement, reductions on the kernels, normalisations
//! in `norms`) needs none beyond the per-thread allowance.
//!
//! **Time.** [`tenet_exec::work`] is a function of the certificate and the node count: the run performs
//! O(work) operations (planning and every step are linear in what they touch) and asks its
//! stop function at least once per [`crate::POLL_ELEMENTS`] element operations of a step (an
//! op on the reference's code: every [`tenet_reference::POLL_WORK`] multiply-adds or window
//! taps of a product, convolution or pooling).

use tenet_ir::{DType, Graph, NodeId, Op, QDot, ReduceOp};

use tenet_kernels::qgemm;

use crate::fused::CHUNK;
use crate::plan::{Plan, Step};

/// The run's fixed tables.
pub const RUN_FIXED: u64 = 64 << 10;
/// Scratch each thread may hold outside any step's own figure.
pub const PER_THREAD: u64 = 64 << 10;
/// The table entry of one live value.
pub const PER_VALUE: u64 = 192;
/// Working memory of an op computed by the reference interpreter's code (it decodes its
/// operands to f32 or i64, lists index offsets, and builds its result as a list of values
/// before encoding it), per element of its operands and result.
pub const REFERENCE_BYTES_PER_ELEMENT: u64 = 96;
fn elems(graph: &Graph, id: NodeId) -> u64 {
    graph.node(id).ty.numel().unwrap_or(u64::MAX)
}

/// Floats of one chunk buffer of a fused group whose tensors have `numel` elements.
fn chunk(numel: u64) -> u64 {
    numel.min(CHUNK as u64)
}

/// A fused group's scratch on `threads` threads.
fn group(graph: &Graph, ids: &[NodeId], threads: u64) -> u64 {
    let Some(&last) = ids.last() else { return 0 };
    threads * (ids.len() as u64 + 3) * chunk(elems(graph, last)) * 4
}

/// GEMM packing for one `m × k` by `k × n` product on one thread.
fn packing(m: u64, n: u64, k: u64) -> u64 {
    if m <= 4 || k > crate::cpu::BIG_K as u64 {
        // The few-rows kernel: one row block of C per thread, no packing.
        return 4 * n.min(1 << 20) * 4;
    }
    // B: whole 48-column panels of all k steps, at most the 24 MiB budget (below `BIG_K`);
    // A: a block of at most 96 rows by at most 1,024 steps.
    let b = ((n + 47) * k * 4).min(24 << 20) + 64;
    let a = (m.next_multiple_of(12)).min(96) * k.min(1024) * 4 + 64;
    b + a
}

/// (m, n, k) of a matmul node.
fn mnk(graph: &Graph, id: NodeId) -> (u64, u64, u64) {
    let Op::MatMul { a, .. } = graph.node(id).op else {
        return (0, 0, 0);
    };
    let (sa, so) = (&graph.node(a).ty.shape, &graph.node(id).ty.shape);
    let (ra, ro) = (sa.len(), so.len());
    (sa[ra - 2], so[ro - 1], sa[ra - 1])
}

/// The scratch of one step beyond the tensors the certificate counts (see the module doc).
pub(crate) fn step_scratch(graph: &Graph, step: &Step, threads: u64) -> u64 {
    match step {
        Step::Source(_) => 0,
        Step::Fused(ids) => group(graph, ids, threads),
        Step::Rows { node, prologue } => {
            if prologue.is_empty() {
                0
            } else {
                let block = (8 * CHUNK as u64).min(elems(graph, *node));
                group(graph, prologue, threads) + threads * block * 4
            }
        }
        Step::Gemm { node, epilogue, .. } => {
            let (m, n, k) = mnk(graph, *node);
            threads * packing(m, n, k) + group(graph, epilogue, threads)
        }
        Step::Attention {
            scores,
            softmax,
            out,
        } => {
            let (Step::Gemm { node: s, .. }, Step::Gemm { node: o, .. }) = (&**scores, &**out)
            else {
                return 0;
            };
            let (m, n1, k) = mnk(graph, *s);
            let (_, n2, _) = mnk(graph, *o);
            let prologue = match &**softmax {
                Step::Rows { prologue, .. } => group(graph, prologue, threads),
                _ => 0,
            };
            threads * (2 * m * n1 * 4 + packing(m, n1, k) + packing(m, n2, n1)) + prologue
        }
        Step::QMatMul(id) => qmatmul(graph, *id, threads),
        Step::Dequantize(_) => 0,
        Step::Generic(id) => generic(graph, *id, threads),
        Step::Conv { node, epilogue } => {
            generic(graph, *node, threads).saturating_add(group(graph, epilogue, threads))
        }
    }
}

/// What a step that computes its later sibling products too (`Plan::siblings`) holds beyond
/// its own product: their results, which the certificate counts only from their own steps on,
/// and (counted as if apart) their scratch.
fn made_early(graph: &Graph, plan: &Plan, step: &Step, threads: u64) -> u64 {
    let Step::QMatMul(id) = step else { return 0 };
    plan.siblings.get(id).map_or(0, |later| {
        later
            .iter()
            .map(|&s| {
                let bytes = graph.node(s).ty.bytes().unwrap_or(u64::MAX);
                bytes
                    .saturating_add(PER_VALUE)
                    .saturating_add(qmatmul(graph, s, threads))
            })
            .fold(0u64, u64::saturating_add)
    })
}

/// A `qmatmul`'s scratch: the quantised product's own (`qgemm::scratch_bytes`), and where it
/// runs many rows on the f32 GEMM, that GEMM's packing per thread for each call's rows.
fn qmatmul(graph: &Graph, id: NodeId, threads: u64) -> u64 {
    let Op::QMatMul { a, w, format, dot } = graph.node(id).op else {
        return 0;
    };
    let sa = &graph.node(a).ty.shape;
    let k = sa.last().copied().unwrap_or(0);
    let rows = graph
        .node(a)
        .ty
        .numel()
        .unwrap_or(u64::MAX)
        .checked_div(k)
        .unwrap_or(0);
    let n = graph.node(w).ty.shape[0];
    let (rows, n, k) = (rows as usize, n as usize, k as usize);
    if dot == QDot::Q8 {
        return qgemm::q8::scratch_bytes(rows, k);
    }
    let format = crate::quant::format(format);
    let own = qgemm::scratch_bytes(format, rows, n, k, threads as usize);
    match qgemm::gemm_chunks(rows, n, k) {
        Some((chunk, slab)) => {
            own.saturating_add(threads * packing(slab as u64, chunk as u64, k as u64))
        }
        None => own,
    }
}

/// Scratch of a step run one op at a time.
fn generic(graph: &Graph, id: NodeId, threads: u64) -> u64 {
    let node = graph.node(id);
    let f32s = |o: NodeId| graph.node(o).ty.dtype == DType::F32;
    let fast = match &node.op {
        Op::Conv2d {
            x,
            w,
            groups,
            window,
            ..
        } if node.ty.dtype == DType::F32 && f32s(*x) && f32s(*w) => {
            // conv.rs: the block's chunk products and class weights, an im2col chunk and the
            // GEMM's packing per thread.
            let (xs, ws, ys) = (
                &graph.node(*x).ty.shape,
                &graph.node(*w).ty.shape,
                &node.ty.shape,
            );
            let og = ws[0] / u64::from(*groups).max(1);
            let k = ws[1] * ws[2] * ws[3];
            let cols =
                crate::conv::chunk_cols(og as usize, k as usize, (ys[2] * ys[3]) as usize) as u64;
            let packed_a = tenet_kernels::gemm::packing_b_scratch_bytes(og as usize, k as usize);
            return crate::conv::scratch_bytes(xs, ws, ys, window, u64::from(*groups), threads)
                .saturating_add(threads * packing(og, cols, k))
                .saturating_add(threads.saturating_mul(packed_a));
        }
        Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Expand { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Pad { .. }
        | Op::Where { .. }
        | Op::Normalize { .. } => true,
        // pool.rs: the in-bounds taps of each output row and column, 8 bytes each, and a list
        // for each.
        Op::Pool2d { x, kernel, .. } if f32s(*x) && node.ty.dtype == DType::F32 => {
            let ys = &node.ty.shape;
            return 8 * (ys[2] * u64::from(kernel[0]) + ys[3] * u64::from(kernel[1]))
                + 64 * (ys[2] + ys[3]);
        }
        Op::Gather { indices, .. } => return 16 * elems(graph, *indices),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => node.ty.dtype != DType::F32,
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean,
            x,
            axes,
            ..
        } => {
            // The kernels' sums take these (reduce.rs): the reduced axes innermost, or few
            // enough reduced positions to list.
            let shape = &graph.node(*x).ty.shape;
            let r = shape.len();
            let innermost = (0..r).all(|d| axes.contains(&(d as u32)) == (d >= r - axes.len()));
            let count: u64 = axes.iter().map(|&a| shape[a as usize]).product();
            if f32s(*x) && node.ty.dtype == DType::F32 && (innermost || count <= 1 << 14) {
                // The listed reduced positions, 8 bytes each.
                return if innermost { 0 } else { 8 * count };
            }
            false
        }
        _ => false,
    };
    if fast {
        return 0;
    }
    let touched = node.op.operands().iter().fold(elems(graph, id), |acc, &o| {
        acc.saturating_add(elems(graph, o))
    });
    touched.saturating_mul(REFERENCE_BYTES_PER_ELEMENT)
}

/// The most values a run of `plan` holds at once (inputs and weights included).
fn max_live_values(graph: &Graph, plan: &Plan) -> u64 {
    let (mut live, mut most) = (0i64, 0i64);
    for (s, step) in plan.steps.iter().enumerate() {
        live += 1;
        most = most.max(live);
        live -= plan.release[s].len() as i64;
        let _ = step;
    }
    most.max(graph.outputs().len() as i64) as u64
}

/// The CPU backend's memory bound for `graph` planned as `plan` on `threads` threads.
pub(crate) fn memory(graph: &Graph, plan: &Plan, threads: usize) -> u64 {
    let threads = threads as u64;
    let largest = plan
        .steps
        .iter()
        .map(|s| {
            step_scratch(graph, s, threads).saturating_add(made_early(graph, plan, s, threads))
        })
        .max()
        .unwrap_or(0);
    graph
        .cost()
        .peak_bytes
        .saturating_add(RUN_FIXED)
        .saturating_add(PER_THREAD * threads)
        .saturating_add(PER_VALUE.saturating_mul(max_live_values(graph, plan)))
        .saturating_add(largest)
}
