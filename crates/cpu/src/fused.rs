//! One pass over memory for a chain of f32 elementwise ops.
//!
//! The output is cut into chunks that stay in L1; each member of the chain is computed for a
//! chunk from its operands (earlier members' chunk buffers, or external tensors read with
//! broadcasting), and only the last member is written out. Each element is computed exactly as
//! the reference computes it (same scalar functions, NaN made canonical after every computing
//! op), so fusion changes where values live, never their bits.
//!
//! Memory: a member's chunk lives in one of a few scratch buffers, reused once its last reader
//! in the group has run (a chain needs two, however long), each as long as a chunk or the
//! range, whichever is shorter; so a pass holds at most as many chunk buffers as the group has
//! members live at once, which the certificate counts as whole tensors.

use std::collections::HashMap;

use tenet_ir::{BinaryOp, Graph, NodeId, Op, UnaryOp};
use tenet_kernels::SimdLevel;
use tenet_kernels::vmath::{self as vm, Arith, ScalarSide};
use tenet_reference::math::canonical as canon;
use tenet_reference::{binary_f32, unary_f32};

/// Elements per chunk: a few chunk buffers fit in L1.
pub(crate) const CHUNK: usize = 2048;

/// Where a member's operand comes from.
#[derive(Clone)]
pub(crate) enum Src<'a> {
    /// An earlier member of the group, by the scratch buffer (slot) that holds its chunk.
    Member(usize),
    /// An external tensor of the output's shape.
    Full(&'a [f32]),
    /// The values already in the output buffer at the same positions: a result the group
    /// rewrites in place (a GEMM's, attention's scores).
    Prior,
    /// A single value broadcast everywhere.
    Scalar(f32),
    /// An external tensor broadcast to the output shape, addressed over the output's axes
    /// coalesced for this operand (see [`coalesce`]): `dims` multiply to the output's size,
    /// and `strides[d]` is 0 on broadcast axes.
    Broadcast {
        data: &'a [f32],
        dims: Vec<usize>,
        strides: Vec<usize>,
    },
}

pub(crate) enum Kind {
    Unary(UnaryOp),
    Binary(BinaryOp),
}

pub(crate) struct Member<'a> {
    pub kind: Kind,
    pub srcs: Vec<Src<'a>>,
}

/// A fused group ready to evaluate: its members in order, and for every member but the last
/// the scratch buffer (slot) its chunk is computed into. A slot is reused once the member it
/// holds has been read for the last time, so `slots` is the most members live at once.
pub(crate) struct Group<'a> {
    pub members: Vec<Member<'a>>,
    /// Slot of each member but the last.
    slot: Vec<usize>,
    slots: usize,
}

/// Describe the group `ids` of `graph`, reading externals through `value`.
pub(crate) fn members<'a>(
    graph: &Graph,
    ids: &[NodeId],
    value: &dyn Fn(NodeId) -> &'a [f32],
) -> Group<'a> {
    members_with(graph, ids, value, None)
}

/// [`members`], for evaluating in place over `prior`'s values: external `prior` (of the
/// output's shape) is read from the output buffer (see [`eval_in_place`]).
pub(crate) fn members_in_place<'a>(
    graph: &Graph,
    ids: &[NodeId],
    value: &dyn Fn(NodeId) -> &'a [f32],
    prior: NodeId,
) -> Group<'a> {
    members_with(graph, ids, value, Some(prior))
}

fn members_with<'a>(
    graph: &Graph,
    ids: &[NodeId],
    value: &dyn Fn(NodeId) -> &'a [f32],
    prior: Option<NodeId>,
) -> Group<'a> {
    // An empty group (a GEMM without an epilogue) has no members.
    let Some(&last) = ids.last() else {
        return Group {
            members: Vec::new(),
            slot: Vec::new(),
            slots: 0,
        };
    };
    // Each member's position, and the last member that reads it (linear in the group).
    let position: HashMap<NodeId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut last_read = vec![0usize; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        for o in graph.node(id).op.operands() {
            if let Some(&m) = position.get(&o) {
                last_read[m] = i;
            }
        }
    }
    // Slots: member `i` takes a free one before the members it reads last give theirs back,
    // so a member never writes the buffer it reads.
    let mut slot = Vec::with_capacity(ids.len() - 1);
    let (mut free, mut slots) = (Vec::new(), 0usize);
    for (i, &id) in ids.iter().enumerate() {
        if i + 1 < ids.len() {
            slot.push(free.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            }));
        }
        let mut operands = graph.node(id).op.operands();
        operands.dedup();
        for o in operands {
            if let Some(&m) = position.get(&o)
                && last_read[m] == i
            {
                free.push(slot[m]);
            }
        }
    }
    let out_shape = &graph.node(last).ty.shape;
    let out_dims: Vec<usize> = out_shape.iter().map(|&d| d as usize).collect();
    let src = |o: NodeId| -> Src<'a> {
        if let Some(&m) = position.get(&o) {
            return Src::Member(slot[m]);
        }
        if prior == Some(o) {
            return Src::Prior;
        }
        let shape = &graph.node(o).ty.shape;
        let data = value(o);
        if shape == out_shape {
            Src::Full(data)
        } else if data.len() == 1 {
            Src::Scalar(data[0])
        } else {
            // Broadcast strides, aligned at the right.
            let mut strides = vec![0usize; out_shape.len()];
            let off = out_shape.len() - shape.len();
            let mut s = 1usize;
            for d in (0..shape.len()).rev() {
                if shape[d] != 1 {
                    strides[off + d] = s;
                }
                s *= shape[d] as usize;
            }
            let (dims, strides) = coalesce(&out_dims, &strides);
            Src::Broadcast {
                data,
                dims,
                strides,
            }
        }
    };
    let members = ids
        .iter()
        .map(|&id| match &graph.node(id).op {
            Op::Unary { op, x } => Member {
                kind: Kind::Unary(*op),
                srcs: vec![src(*x)],
            },
            Op::Binary { op, a, b } => Member {
                kind: Kind::Binary(*op),
                srcs: vec![src(*a), src(*b)],
            },
            _ => unreachable!("the planner fuses only unary and binary f32 ops"),
        })
        .collect();
    Group {
        members,
        slot,
        slots,
    }
}

/// The output's axes as one broadcast operand walks them: neighbouring axes merged wherever
/// the operand steps through both as through one (contiguous, or constant across both), and
/// axes of size 1 dropped. Runs along the last merged axis are then as long as they can be: a
/// `[1, 3, 64]` operand of a `[64, 3, 64]` output is 64 runs of 192 values, not 192 of 64.
fn coalesce(dims: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut out_dims, mut out_strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&dim, &stride) in dims.iter().zip(strides) {
        if dim == 1 {
            continue;
        }
        match (out_dims.last_mut(), out_strides.last_mut()) {
            (Some(d), Some(s)) if *s == stride * dim => {
                *d *= dim;
                *s = stride;
            }
            _ => {
                out_dims.push(dim);
                out_strides.push(stride);
            }
        }
    }
    if out_dims.is_empty() {
        // Every axis of size 1: one element.
        return (vec![1], vec![0]);
    }
    (out_dims, out_strides)
}

/// Read `len` elements of `src` starting at flat output index `start` into `buf`, or return a
/// direct slice when the data is already laid out that way.
#[allow(clippy::too_many_arguments)]
fn operand<'b>(
    src: &'b Src<'_>,
    bufs: &'b [Vec<f32>],
    prior: &'b [f32],
    start: usize,
    len: usize,
    scratch: &'b mut Vec<f32>,
) -> &'b [f32] {
    match src {
        Src::Member(m) => &bufs[*m][..len],
        Src::Full(d) => &d[start..start + len],
        Src::Prior => &prior[..len],
        Src::Scalar(v) => {
            scratch.clear();
            scratch.resize(len, *v);
            scratch
        }
        Src::Broadcast {
            data,
            dims,
            strides,
        } => {
            // A slice copy where the operand is contiguous along the last axis, a fill where
            // it is broadcast there.
            scratch.clear();
            let last = strides.len() - 1;
            for_runs(start, len, dims, strides, |_, at, run| {
                match strides[last] {
                    0 => scratch.extend(std::iter::repeat_n(data[at], run)),
                    1 => scratch.extend_from_slice(&data[at..at + run]),
                    s => scratch.extend((0..run).map(|j| data[at + j * s])),
                }
            });
            scratch
        }
    }
}

/// Walk output elements `start..start + len` in runs along the last of an operand's coalesced
/// axes `dims`: `f(offset in the range, flat index into the broadcast operand at the run's
/// start, run length)`.
fn for_runs(
    start: usize,
    len: usize,
    dims: &[usize],
    strides: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    // The output multi-index of `start`.
    let rank = dims.len();
    let mut idx = vec![0usize; rank];
    let (mut rem, mut at) = (start, 0usize);
    for d in (0..rank).rev() {
        idx[d] = rem % dims[d];
        rem /= dims[d];
        at += idx[d] * strides[d];
    }
    let (last, inner) = (rank - 1, dims[rank - 1]);
    let mut done = 0;
    while done < len {
        let run = (inner - idx[last]).min(len - done);
        f(done, at, run);
        done += run;
        // Step to the start of the next run.
        at += run * strides[last];
        idx[last] += run;
        let mut d = last;
        while idx[d] >= dims[d] && d > 0 {
            at -= strides[d] * idx[d];
            idx[d] = 0;
            d -= 1;
            idx[d] += 1;
            at += strides[d];
        }
    }
}

/// Runs shorter than this are copied into a buffer first: a kernel call per run would cost
/// more than the copy.
const MIN_DIRECT_RUN: usize = 64;

/// An operand of an arithmetic member over one chunk, without copies where it can be read
/// where it lies.
enum Arg<'b> {
    Slice(&'b [f32]),
    Scalar(f32),
    /// The chunk being written, which holds the prior values (the last member in place).
    Dst,
    /// A broadcast tensor contiguous (stride 1) or constant (stride 0) along runs of its
    /// last coalesced axis.
    Runs {
        data: &'b [f32],
        dims: &'b [usize],
        strides: &'b [usize],
    },
}

/// What resolving a member's operands for one chunk needs.
struct Env<'e> {
    done: &'e [Vec<f32>],
    prior: &'e [f32],
    start: usize,
    len: usize,
    dst_is_prior: bool,
}

impl<'e> Env<'e> {
    fn arg<'b>(&self, src: &'b Src<'_>, runs: bool, scratch: &'b mut Vec<f32>) -> Arg<'b>
    where
        'e: 'b,
    {
        match src {
            Src::Scalar(v) => Arg::Scalar(*v),
            Src::Prior if self.dst_is_prior => Arg::Dst,
            Src::Broadcast {
                data,
                dims,
                strides,
            } if runs => Arg::Runs {
                data,
                dims,
                strides,
            },
            _ => Arg::Slice(operand(
                src, self.done, self.prior, self.start, self.len, scratch,
            )),
        }
    }
}

/// One run of an [`Arg`].
#[derive(Clone, Copy)]
enum Piece<'b> {
    Slice(&'b [f32]),
    Scalar(f32),
    Dst,
}

impl<'b> Arg<'b> {
    fn piece(&self, offset: usize, at: usize, run: usize) -> Piece<'b> {
        match *self {
            Arg::Slice(s) => Piece::Slice(&s[offset..offset + run]),
            Arg::Scalar(v) => Piece::Scalar(v),
            Arg::Dst => Piece::Dst,
            Arg::Runs { data, strides, .. } => match strides[strides.len() - 1] {
                0 => Piece::Scalar(data[at]),
                _ => Piece::Slice(&data[at..at + run]),
            },
        }
    }
}

/// `dst = a op b` for one run, each side a slice, a single value, or `dst` itself; two slices
/// are written as `stores` says.
fn arith_piece(
    level: SimdLevel,
    op: BinaryOp,
    arith: Arith,
    a: Piece<'_>,
    b: Piece<'_>,
    dst: &mut [f32],
    stores: Stores,
) {
    use tenet_kernels::vmath as vm;
    match (a, b) {
        (Piece::Slice(x), Piece::Slice(y)) => match stores {
            Stores::Cached => vm::arith_slice(level, arith, x, y, dst),
            Stores::Streaming => tenet_kernels::streaming::arith_slice(level, arith, x, y, dst),
        },
        (Piece::Slice(x), Piece::Scalar(v)) => {
            vm::arith_scalar_slice(level, arith, x, v, ScalarSide::Right, dst)
        }
        (Piece::Scalar(v), Piece::Slice(y)) => {
            vm::arith_scalar_slice(level, arith, y, v, ScalarSide::Left, dst)
        }
        (Piece::Dst, Piece::Slice(y)) => vm::arith_assign(level, arith, dst, y, ScalarSide::Right),
        (Piece::Slice(x), Piece::Dst) => vm::arith_assign(level, arith, dst, x, ScalarSide::Left),
        (Piece::Dst, Piece::Scalar(v)) => {
            vm::arith_scalar_assign(level, arith, dst, v, ScalarSide::Right)
        }
        (Piece::Scalar(v), Piece::Dst) => {
            vm::arith_scalar_assign(level, arith, dst, v, ScalarSide::Left)
        }
        (Piece::Scalar(p), Piece::Scalar(q)) => dst.fill(canon(binary_f32(op, p, q))),
        (Piece::Dst, Piece::Dst) => {
            unreachable!("a member reading the prior twice is not run in place")
        }
    }
}

/// Whether the last member can be computed over the prior values where they lie: an
/// arithmetic op that reads them once.
fn reads_prior_once_in_place(m: &Member<'_>) -> bool {
    matches!(
        m.kind,
        Kind::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)
    ) && m.srcs.iter().filter(|s| matches!(s, Src::Prior)).count() == 1
}

fn arith_of(op: BinaryOp) -> Option<Arith> {
    match op {
        BinaryOp::Add => Some(Arith::Add),
        BinaryOp::Sub => Some(Arith::Sub),
        BinaryOp::Mul => Some(Arith::Mul),
        BinaryOp::Div => Some(Arith::Div),
        _ => None,
    }
}

/// Compute one member for `len` elements starting at `start` into `dst`. With `dst_is_prior`
/// the member's `Prior` operand is `dst` itself (see [`reads_prior_once_in_place`]); `stores`
/// says how arithmetic over two whole-chunk slices is written.
#[allow(clippy::too_many_arguments)]
fn compute(
    level: SimdLevel,
    m: &Member<'_>,
    done: &[Vec<f32>],
    prior: &[f32],
    start: usize,
    dst: &mut [f32],
    dst_is_prior: bool,
    stores: Stores,
    scratch: &mut [Vec<f32>; 2],
) {
    let len = dst.len();
    let [s0, s1] = scratch;
    match &m.kind {
        Kind::Unary(op) => {
            let x = operand(&m.srcs[0], done, prior, start, len, s0);
            match op {
                UnaryOp::Neg => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, &v)| *d = f32::from_bits(v.to_bits() ^ 0x8000_0000)),
                UnaryOp::Abs => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, &v)| *d = f32::from_bits(v.to_bits() & 0x7fff_ffff)),
                UnaryOp::Exp => tenet_kernels::vmath::exp_slice(level, x, dst),
                UnaryOp::Relu => tenet_kernels::vmath::relu_slice(level, x, dst),
                UnaryOp::Sigmoid => {
                    // The reference's 1 / (1 + exp(−x)), one correctly rounded step at a time.
                    s1.clear();
                    s1.extend(x.iter().map(|&v| f32::from_bits(v.to_bits() ^ 0x8000_0000)));
                    tenet_kernels::vmath::exp_slice(level, s1, dst);
                    vm::arith_scalar_assign(level, Arith::Add, dst, 1.0, ScalarSide::Left);
                    vm::arith_scalar_assign(level, Arith::Div, dst, 1.0, ScalarSide::Left);
                }
                UnaryOp::GeluErf => tenet_kernels::vmath::gelu_erf_slice(level, x, dst),
                op => dst
                    .iter_mut()
                    .zip(x)
                    .for_each(|(d, &v)| *d = canon(unary_f32(*op, v))),
            }
        }
        Kind::Binary(op) => {
            let Some(arith) = arith_of(*op) else {
                if matches!(op, BinaryOp::Max | BinaryOp::Min) {
                    // With a single value on either side (max and min are symmetric), it is
                    // read as a value, not filled into a buffer.
                    let scalar = match (&m.srcs[0], &m.srcs[1]) {
                        (Src::Scalar(v), other) | (other, Src::Scalar(v)) => Some((*v, other)),
                        _ => None,
                    };
                    if let Some((v, other)) = scalar {
                        let a = operand(other, done, prior, start, len, s0);
                        let max = *op == BinaryOp::Max;
                        tenet_kernels::vmath::minmax_scalar_slice(level, max, a, v, dst);
                        return;
                    }
                }
                let a = operand(&m.srcs[0], done, prior, start, len, s0);
                let b = operand(&m.srcs[1], done, prior, start, len, s1);
                if matches!(op, BinaryOp::Max | BinaryOp::Min) {
                    let max = *op == BinaryOp::Max;
                    tenet_kernels::vmath::minmax_slice(level, max, a, b, dst);
                    return;
                }
                dst.iter_mut()
                    .zip(a.iter().zip(b))
                    .for_each(|(d, (&p, &q))| *d = canon(binary_f32(*op, p, q)));
                return;
            };
            let direct = |src: &Src<'_>| match src {
                Src::Broadcast { dims, strides, .. } => {
                    dims[dims.len() - 1] >= MIN_DIRECT_RUN && strides[strides.len() - 1] <= 1
                }
                _ => false,
            };
            // At most one operand is walked in runs; another broadcast one is copied.
            let runs_a = direct(&m.srcs[0]);
            let runs_b = !runs_a && direct(&m.srcs[1]);
            let env = Env {
                done,
                prior,
                start,
                len,
                dst_is_prior,
            };
            let a = env.arg(&m.srcs[0], runs_a, s0);
            let b = env.arg(&m.srcs[1], runs_b, s1);
            let walk = match (&a, &b) {
                (Arg::Runs { dims, strides, .. }, _) | (_, Arg::Runs { dims, strides, .. }) => {
                    Some((*dims, *strides))
                }
                _ => None,
            };
            match walk {
                None => {
                    let (pa, pb) = (a.piece(0, 0, len), b.piece(0, 0, len));
                    arith_piece(level, *op, arith, pa, pb, dst, stores)
                }
                // Runs along a broadcast axis are short: each would end in a fence.
                Some((dims, strides)) => for_runs(start, len, dims, strides, |offset, at, run| {
                    let (pa, pb) = (a.piece(offset, at, run), b.piece(offset, at, run));
                    let dst = &mut dst[offset..offset + run];
                    arith_piece(level, *op, arith, pa, pb, dst, Stores::Cached);
                }),
            }
        }
    }
}

/// Results at least this large are written around the caches where the last member allows
/// (`tenet_kernels::streaming`): far more than the L2 caches hold, so the next step would read
/// them from memory anyway, and the stores then skip reading each line first.
pub(crate) const STREAM_MIN_BYTES: usize = 16 << 20;

/// How the last member stores the group's result.
#[derive(Clone, Copy)]
pub(crate) enum Stores {
    /// Through the caches: for results read again soon (or small ones).
    Cached,
    /// Around the caches: for a result of at least [`STREAM_MIN_BYTES`].
    Streaming,
}

impl Stores {
    /// The stores for a result of `bytes` bytes.
    pub(crate) fn for_result(bytes: usize) -> Stores {
        if bytes >= STREAM_MIN_BYTES {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }
}

/// Element operations between two polls of the run's stop flag (see [`Poll`]): about a
/// millisecond of the slowest member kind.
pub const POLL_ELEMENTS: usize = 1 << 18;

/// How a long pass asks whether to give up: `poll()` is true once the run should stop (the
/// pass then returns with its output unfinished, and the step is abandoned).
pub(crate) type Poll<'p> = &'p (dyn Fn() -> bool + Sync);

/// Evaluate the group for output elements `range`, writing the last member into `out`;
/// `false` if `poll` stopped it first (asked about every [`POLL_ELEMENTS`] element
/// operations).
pub(crate) fn eval_range(
    level: SimdLevel,
    group: &Group<'_>,
    range: std::ops::Range<usize>,
    out: &mut [f32],
    stores: Stores,
    poll: Poll<'_>,
) -> bool {
    eval(level, group, range, out, false, stores, poll)
}

/// [`eval_range`] over members from [`members_in_place`]: `inout` holds the prior values
/// for `range` and receives the group's. Earlier members read a chunk's prior values where
/// they lie; only when the last member (which overwrites the chunk) reads them too are they
/// copied aside first. Either way the bits are those of an evaluation out of place. Groups
/// run in place (epilogues, prologues) are short and their callers poll between blocks.
pub(crate) fn eval_in_place(
    level: SimdLevel,
    group: &Group<'_>,
    range: std::ops::Range<usize>,
    inout: &mut [f32],
) {
    // The result is rewritten where it lies, in cache: a step has just written it there.
    eval(level, group, range, inout, true, Stores::Cached, &|| false);
}

#[allow(clippy::too_many_arguments)]
fn eval(
    level: SimdLevel,
    group: &Group<'_>,
    range: std::ops::Range<usize>,
    out: &mut [f32],
    in_place: bool,
    stores: Stores,
    poll: Poll<'_>,
) -> bool {
    // Scratch no longer than the range (a tiny tensor gets tiny buffers), kept by the thread
    // for its next call: an epilogue runs once for every finished run of a product's or a
    // convolution's output, often a few hundred values, and fresh buffers each time cost more
    // than the arithmetic.
    let chunk = CHUNK.min(range.len());
    let mut kept = SCRATCH.take();
    let bufs = &mut kept.bufs;
    bufs.resize_with(bufs.len().max(group.slots), Vec::new);
    for b in &mut bufs[..group.slots] {
        if b.len() < chunk {
            b.resize(chunk, 0.0);
        }
    }
    let done = eval_with(level, group, range, out, in_place, stores, poll, &mut kept);
    // A thread keeps buffers for the common groups only (at most `KEPT_SLOTS` chunks).
    kept.bufs.truncate(KEPT_SLOTS);
    SCRATCH.set(kept);
    done
}

/// Chunk buffers a thread keeps between calls of [`eval`] (256 KiB).
const KEPT_SLOTS: usize = 32;

/// Buffers [`eval`] keeps between calls on a thread (at most `CHUNK` values each).
#[derive(Default)]
struct Scratch {
    bufs: Vec<Vec<f32>>,
    scratch: [Vec<f32>; 2],
    prior: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// [`eval`] with its buffers: `kept.bufs` holds a slot of at least a chunk for each of the
/// group's slots.
#[allow(clippy::too_many_arguments)]
fn eval_with(
    level: SimdLevel,
    group: &Group<'_>,
    range: std::ops::Range<usize>,
    out: &mut [f32],
    in_place: bool,
    stores: Stores,
    poll: Poll<'_>,
    kept: &mut Scratch,
) -> bool {
    let Scratch {
        bufs,
        scratch,
        prior,
    } = kept;
    let members = &group.members;
    let last = members.len() - 1;
    let last_in_place = in_place && reads_prior_once_in_place(&members[last]);
    let copy_prior =
        in_place && !last_in_place && members[last].srcs.iter().any(|s| matches!(s, Src::Prior));
    let mut start = range.start;
    let mut since_poll = 0usize;
    while start < range.end {
        let len = CHUNK.min(range.end - start);
        let o = start - range.start;
        if copy_prior {
            prior.clear();
            prior.extend_from_slice(&out[o..o + len]);
        }
        // Until the last member writes the chunk, its prior values are still in place.
        let before_last: &[f32] = if copy_prior || !in_place {
            prior
        } else {
            &out[o..o + len]
        };
        for (mi, member) in members[..last].iter().enumerate() {
            // The member's slot is out of the table while it is written: no operand reads it.
            let s = group.slot[mi];
            let mut dst = std::mem::take(&mut bufs[s]);
            compute(
                level,
                member,
                bufs,
                before_last,
                start,
                &mut dst[..len],
                false,
                Stores::Cached,
                scratch,
            );
            bufs[s] = dst;
            since_poll += len;
            if since_poll >= POLL_ELEMENTS {
                since_poll = 0;
                if poll() {
                    return false;
                }
            }
        }
        compute(
            level,
            &members[last],
            bufs,
            prior,
            start,
            &mut out[o..o + len],
            last_in_place,
            stores,
            scratch,
        );
        start += len;
        since_poll += len;
        if since_poll >= POLL_ELEMENTS {
            since_poll = 0;
            if poll() {
                return false;
            }
        }
    }
    true
}
