//! Planning: every node of a graph becomes where its value comes from (an input, a weight, a
//! constant, another node's memory for reshapes, or new memory) and the kernel launches that
//! compute it, with every shape, stride and offset worked out here, on the host, from the
//! node types. The kernels index only within the extents computed here, which are derived from
//! the same types the buffers are allocated for: that is what makes the launches in
//! `cl_api.rs` sound.
//!
//! The work-group shapes are chosen here too: float products with at most 4 rows (a decode
//! step's activations times a weight) run on the few-row kernel `k_gemv` (`cl/gemv.cl`:
//! parallel over columns, one fma chain per output), others pick one of the device's SGEMM
//! tiles by the product's shape ([`choose_gemm`]); products with a quantised weight run on
//! `k_qgemv` (same file: a group's weight rows staged through local memory, 4 rows of
//! activations at a time) wherever `k_gemv` can run; the row kernels (reductions, softmax,
//! norms) run 16 lanes per row, `Caps::rows` rows per group, lanes or rows adjacent by which
//! of them is contiguous in memory.
//!
//! Two kinds of node are folded into a later launch and get no memory (`Source::Folded`):
//! a permutation read only by `k_gemv` products (they read its source through permuted
//! strides, so a transposed weight is never copied), and the members but the last of a fused
//! elementwise chain (`fused.rs`: consecutive f32 elementwise nodes of one shape, found by
//! `tenet_exec::Schedule::elementwise_group`, whose intermediates nothing else reads; the last
//! member's launch evaluates the whole chain). `Plan::step_of` says which step's launch
//! computes each node, so values a folded node reads live until that launch. Neither changes
//! a bit: the permuted strides address exactly the elements the copy would hold, and the
//! fused kernel computes each member with the unfused kernel's function and rounding.

use std::borrow::Cow;
use std::collections::HashMap;

use tenet_exec::Schedule;
use tenet_ir::{DType, Graph, Node, NodeId, Op, QDot, TensorType, WeightsId};

use crate::fused::{self, Chain};
use crate::kernels::{Family, GEMV_ROWS, GEMV_T, GemmTile, LANES};

/// Where a node's value comes from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Input(String),
    Weight(WeightsId, String),
    /// Index into the program's uploaded constants.
    Constant(usize),
    /// The same memory as another node (reshape, cast to the same dtype).
    Alias(NodeId),
    /// New memory, filled by `fill` then `launches`.
    Computed,
    /// No memory: computed inside a later node's launch (a fused chain's intermediate, a
    /// permutation a product reads through strides), and read by nothing else.
    Folded,
}

/// One argument of a planned launch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// The node's own result.
    Out,
    /// An operand's value (a placeholder buffer when it is empty).
    Value(NodeId),
    /// An optional operand: its value, or the placeholder when absent.
    MaybeValue(Option<NodeId>),
    /// The program's meta buffer (shapes and strides).
    Meta,
    /// The run's gather flags (first bad position per gather) and values (the bad index).
    GatherFlags,
    GatherValues,
    /// This gather's slot in them (`int`).
    GatherSlot,
    /// The run's seed.
    Seed,
    U64(u64),
    I64(i64),
    I32(i32),
    U32(u32),
}

/// How a launch's work items are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grid {
    /// One item per element of the index space (`Launch::items`), walked in grid-stride
    /// loops, in groups of the kernel's preferred size.
    Items,
    /// `groups[0] × groups[1]` work groups of `group` items (global range `[groups[0] ·
    /// group, groups[1], 1]`); the kernel walks whatever its groups do not cover.
    Groups { group: u32, groups: [u64; 2] },
}

#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub family: Family,
    pub kernel: Cow<'static, str>,
    pub args: Vec<Arg>,
    /// Work items the kernel's index space needs; no launch when 0.
    pub items: u64,
    pub grid: Grid,
}

/// What the planner may use on this device.
#[derive(Clone, Debug)]
pub(crate) struct Caps {
    /// The SGEMM tiles the device runs, largest first (none: `k_matmul`, one item per output).
    pub gemm: Vec<GemmTile>,
    /// The device's compute units: a product should have at least this many blocks.
    pub compute_units: u64,
    /// Rows per work group of the row kernels (`Tuning::rows`).
    pub rows: u32,
    /// Which float products run on `k_gemv`.
    pub gemv: Gemv,
    /// Whether chains of f32 elementwise nodes are fused into generated kernels.
    pub fuse: bool,
}

/// Which float products run on the few-row kernel `k_gemv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gemv {
    /// None (the device cannot run it, or tests force another kernel).
    Off,
    /// Those with at most `GEMV_ROWS` rows.
    FewRows,
    /// Every one (tests).
    All,
}

/// The most work groups along a launch's second dimension (CUDA's grid limit, which NVIDIA's
/// OpenCL shares); kernels loop over the rest.
const MAX_GROUPS_Y: u64 = 65_535;
/// The most work groups a row kernel is launched with; its groups loop over the rest.
const MAX_ROW_GROUPS: u64 = 4096;

/// The SGEMM tile for an `m × n` product over `batches`: the largest tile that wastes at most
/// a quarter of its blocks' outputs on the edges and still gives every compute unit a block;
/// if none does, the tile that wastes least (the smaller on ties: more blocks).
pub(crate) fn choose_gemm(
    tiles: &[GemmTile],
    m: u64,
    n: u64,
    batches: u64,
    compute_units: u64,
) -> Option<GemmTile> {
    let covered = |t: &GemmTile| {
        let (bm, bn) = (t.bm() as u64, t.bn() as u64);
        (m.div_ceil(bm) * bm) as f64 * (n.div_ceil(bn) * bn) as f64
    };
    let useful = |t: &GemmTile| (m as f64 * n as f64) / covered(t).max(1.0);
    let blocks = |t: &GemmTile| {
        m.div_ceil(t.bm() as u64)
            .saturating_mul(n.div_ceil(t.bn() as u64))
            .saturating_mul(batches)
    };
    tiles
        .iter()
        .find(|t| useful(t) >= 0.75 && blocks(t) >= compute_units)
        .or_else(|| tiles.iter().max_by(|a, b| useful(a).total_cmp(&useful(b))))
        .copied()
}

/// The grid of a row kernel over `rows` rows.
fn row_grid(caps: &Caps, rows: u64) -> Grid {
    Grid::Groups {
        group: LANES * caps.rows,
        groups: [rows.div_ceil(caps.rows as u64).clamp(1, MAX_ROW_GROUPS), 1],
    }
}

#[derive(Clone, Debug)]
pub(crate) struct NodePlan {
    pub source: Source,
    /// Bytes repeated over the whole result before the launches (pad's value).
    pub fill: Option<Vec<u8>>,
    pub launches: Vec<Launch>,
    /// This node's slot in the run's gather flags, for gathers that can fail.
    pub gather_slot: Option<usize>,
    /// Element operations its launches perform, roughly: how a run paces its waits.
    pub work: u64,
}

/// A whole graph planned.
pub(crate) struct Plan {
    pub nodes: Vec<NodePlan>,
    /// Shapes and strides every launch reads through `Arg::Meta`.
    pub meta: Vec<i64>,
    /// Constant tensors' bytes, uploaded once at compile.
    pub constants: Vec<(TensorType, Vec<u8>)>,
    /// The gathers that check their indices, by slot, in graph order.
    pub gathers: Vec<NodeId>,
    /// The step whose launches compute each node: its own, or for a folded node the step of
    /// the launch that computes it (its values' readers then keep them until that step).
    pub step_of: Vec<usize>,
    /// The generated kernels of the graph's fused chains (`Family::Fused`); empty if none.
    pub fused: String,
}

/// Row-major element strides of a shape.
fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Strides reading `inp` broadcast to `out` (numpy rules: aligned at the right; a dimension
/// of 1 or a missing one repeats), scaled by `scale` elements.
fn broadcast_strides(out: &[u64], inp: &[u64], scale: u64) -> Vec<u64> {
    let st = strides(inp);
    let off = out.len() - inp.len();
    (0..out.len())
        .map(|d| {
            if d < off || inp[d - off] == 1 {
                0
            } else {
                st[d - off] * scale
            }
        })
        .collect()
}

/// Axes of a one-operand view (dims and strides, in row-major order) with size-1 axes dropped
/// and each run of axes that steps through memory as one axis merged into it: the same
/// elements in the same order, so the kernel's offset is usually one multiply (the reduced
/// axes of a reduction; the kept axes of reductions and softmax).
fn merge_axes(dims: &[u64], strides: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let (mut d, mut s): (Vec<u64>, Vec<u64>) = (vec![], vec![]);
    for (&dim, &st) in dims.iter().zip(strides) {
        if dim == 1 {
            continue;
        }
        match (d.last_mut(), s.last_mut()) {
            (Some(pd), Some(ps)) if *ps == st.saturating_mul(dim) => {
                *pd *= dim;
                *ps = st;
            }
            _ => {
                d.push(dim);
                s.push(st);
            }
        }
    }
    (d, s)
}

fn numel(ty: &TensorType) -> u64 {
    ty.numel().unwrap_or(0)
}

fn dt(d: DType) -> i32 {
    d.tag() as i32
}

struct Planner {
    meta: Vec<i64>,
}

impl Planner {
    /// Append a view of `operands` (base offset, strides) over `dims`; returns its offset.
    fn view(&mut self, dims: &[u64], operands: &[(u64, Vec<u64>)]) -> u32 {
        let at = self.meta.len() as u32;
        self.meta.push(dims.len() as i64);
        self.meta.extend(dims.iter().map(|&d| d as i64));
        for (base, st) in operands {
            debug_assert_eq!(st.len(), dims.len());
            self.meta.push(*base as i64);
            self.meta.extend(st.iter().map(|&s| s as i64));
        }
        at
    }

    /// Append raw values; returns their offset.
    fn raw(&mut self, values: &[i64]) -> u32 {
        let at = self.meta.len() as u32;
        self.meta.extend_from_slice(values);
        at
    }
}

fn launch(
    family: Family,
    kernel: impl Into<Cow<'static, str>>,
    items: u64,
    args: Vec<Arg>,
) -> Launch {
    Launch {
        family,
        kernel: kernel.into(),
        args,
        items,
        grid: Grid::Items,
    }
}

/// A strided copy of `dims` elements of `size` bytes from `x` into the result.
fn copy(
    p: &mut Planner,
    x: NodeId,
    size: u64,
    dims: &[u64],
    dst: (u64, Vec<u64>),
    src: (u64, Vec<u64>),
) -> Option<Launch> {
    let n: u64 = dims.iter().product();
    if n == 0 {
        return None;
    }
    let mo = p.view(dims, &[dst, src]);
    Some(launch(
        Family::Elementwise,
        "k_copy",
        n,
        vec![
            Arg::Out,
            Arg::Value(x),
            Arg::U64(n),
            Arg::I32(size as i32),
            Arg::Meta,
            Arg::U32(mo),
        ],
    ))
}

/// Whether `node` is a float product that runs on `k_gemv` on a device with `caps`.
fn on_gemv(nodes: &[Node], node: &Node, caps: &Caps) -> bool {
    let Op::MatMul { a, .. } = &node.op else {
        return false;
    };
    let ta = &nodes[a.index()].ty;
    node.ty.dtype.is_float()
        && match caps.gemv {
            Gemv::Off => false,
            Gemv::FewRows => ta.shape[ta.rank() - 2] <= GEMV_ROWS,
            Gemv::All => true,
        }
}

/// Plan every node of `graph` for a device with `caps`.
pub(crate) fn plan(graph: &Graph, caps: &Caps) -> Plan {
    let nodes = graph.nodes();
    let n = nodes.len();
    let schedule = Schedule::new(graph);
    let users = schedule.all_users();
    // Permutations read only by products on `k_gemv` (and not outputs): those read the
    // permutation's source through permuted strides, and the permutation computes nothing.
    let folded: Vec<bool> = (0..n)
        .map(|m| {
            matches!(nodes[m].op, Op::Permute { .. })
                && !schedule.is_output(m)
                && !users[m].is_empty()
                && users[m].iter().all(|&u| on_gemv(nodes, &nodes[u], caps))
        })
        .collect();
    let mut p = Planner { meta: Vec::new() };
    let mut constants = Vec::new();
    let mut gathers = Vec::new();
    let mut out = Vec::with_capacity(n);
    let mut step_of: Vec<usize> = (0..n).collect();
    // The fused kernels' names by their text (named `K`), and their source.
    let mut fused_names: HashMap<String, String> = HashMap::new();
    let mut fused_src = String::new();
    let mut i = 0;
    while i < n {
        let node = &nodes[i];
        let folded_node = || NodePlan {
            source: Source::Folded,
            fill: None,
            launches: Vec::new(),
            gather_slot: None,
            work: 0,
        };
        if folded[i] {
            step_of[i] = users[i].iter().copied().max().unwrap_or(i);
            out.push(folded_node());
            i += 1;
            continue;
        }
        if caps.fuse && numel(&node.ty) > 0 && fused::fusable(graph, NodeId(i as u32)) {
            let end = schedule.elementwise_group(graph, i, fused::MAX_MEMBERS, |m| {
                fused::fusable(graph, NodeId(m as u32))
            });
            let chain = (end > i)
                .then(|| Chain::new(graph, (i..=end).map(|m| NodeId(m as u32)).collect()))
                .flatten();
            if let Some(chain) = chain {
                step_of[i..end].fill(end);
                out.extend((i..end).map(|_| folded_node()));
                let key = chain.kernel(graph, "K");
                let count = fused_names.len();
                let name = fused_names
                    .entry(key)
                    .or_insert_with(|| {
                        let name = format!("k_fused_{count}");
                        fused_src.push_str(&chain.kernel(graph, &name));
                        fused_src.push('\n');
                        name
                    })
                    .clone();
                out.push(plan_chain(&mut p, nodes, &chain, name));
                i = end + 1;
                continue;
            }
        }
        let mut np = NodePlan {
            source: Source::Computed,
            fill: None,
            launches: Vec::new(),
            gather_slot: None,
            work: work(nodes, node),
        };
        plan_node(&mut p, nodes, node, &mut np, &mut constants, caps, &folded);
        // Nothing to compute into an empty result (and no index of an empty gather is read).
        if numel(&node.ty) == 0 && matches!(np.source, Source::Computed) {
            np.launches.clear();
            np.fill = None;
            np.gather_slot = None;
        }
        if np.gather_slot.is_some() {
            np.gather_slot = Some(gathers.len());
            gathers.push(NodeId(i as u32));
        }
        out.push(np);
        i += 1;
    }
    Plan {
        nodes: out,
        meta: p.meta,
        constants,
        gathers,
        step_of,
        fused: fused_src,
    }
}

/// The last member of a fused chain: one launch of its generated kernel `name`, reading each
/// external operand through a view broadcast to the chain's shape.
fn plan_chain(p: &mut Planner, nodes: &[Node], chain: &Chain, name: String) -> NodePlan {
    let last = &nodes[chain.members.last().expect("a chain has members").index()];
    let shape = &last.ty.shape;
    let n = numel(&last.ty);
    let operands: Vec<Vec<u64>> = chain
        .externals
        .iter()
        .map(|x| broadcast_strides(shape, &nodes[x.index()].ty.shape, 1))
        .collect();
    let (dims, operands) = merge_view(shape, operands);
    let views: Vec<(u64, Vec<u64>)> = operands.into_iter().map(|st| (0, st)).collect();
    let mo = p.view(&dims, &views);
    let mut args = vec![Arg::Out];
    args.extend(chain.externals.iter().map(|&x| Arg::Value(x)));
    args.extend([Arg::U64(n), Arg::Meta, Arg::U32(mo)]);
    NodePlan {
        source: Source::Computed,
        fill: None,
        launches: vec![launch(Family::Fused, name, n, args)],
        gather_slot: None,
        work: chain
            .members
            .iter()
            .map(|m| work(nodes, &nodes[m.index()]))
            .fold(0, u64::saturating_add),
    }
}

/// A view of several operands over `dims` with size-1 axes dropped and neighbouring axes
/// merged wherever every operand steps through them as through one axis: the same elements
/// in the same order (a contiguous elementwise op becomes one axis: offsets without division).
fn merge_view(dims: &[u64], operands: Vec<Vec<u64>>) -> (Vec<u64>, Vec<Vec<u64>>) {
    let mut d: Vec<u64> = Vec::new();
    let mut s: Vec<Vec<u64>> = vec![Vec::new(); operands.len()];
    for (a, &dim) in dims.iter().enumerate() {
        if dim == 1 {
            continue;
        }
        let chains = !d.is_empty()
            && operands
                .iter()
                .zip(&s)
                .all(|(st, ms)| *ms.last().expect("same rank") == st[a].saturating_mul(dim));
        if chains {
            *d.last_mut().expect("not empty") *= dim;
            for (st, ms) in operands.iter().zip(s.iter_mut()) {
                *ms.last_mut().expect("same rank") = st[a];
            }
        } else {
            d.push(dim);
            for (st, ms) in operands.iter().zip(s.iter_mut()) {
                ms.push(st[a]);
            }
        }
    }
    (d, s)
}

/// The buffer a product's operand `x` is read from and its element strides over `x`'s shape:
/// `x` itself, row-major, or for a folded permutation its source through permuted strides.
fn operand_view(nodes: &[Node], folded: &[bool], x: NodeId) -> (NodeId, Vec<u64>) {
    match &nodes[x.index()].op {
        Op::Permute { x: src, perm } if folded[x.index()] => {
            let st = strides(&nodes[src.index()].ty.shape);
            (*src, perm.iter().map(|&q| st[q as usize]).collect())
        }
        _ => (x, strides(&nodes[x.index()].ty.shape)),
    }
}

/// Batch strides of an operand of `shape` with element strides `st` broadcast to `batch`.
fn batch_strides(batch: &[u64], shape: &[u64], st: &[u64]) -> Vec<u64> {
    let off = batch.len() - shape.len();
    (0..batch.len())
        .map(|d| {
            if d < off || shape[d - off] == 1 {
                0
            } else {
                st[d - off]
            }
        })
        .collect()
}

/// Element operations of a node's kernels: the inner loop's length times the outputs for
/// products, windows and reductions; elements touched for everything else.
fn work(nodes: &[Node], node: &Node) -> u64 {
    let out = numel(&node.ty);
    let ty_of = |x: &NodeId| &nodes[x.index()].ty;
    match &node.op {
        Op::MatMul { a, .. } | Op::QMatMul { a, .. } => {
            out.saturating_mul(*ty_of(a).shape.last().unwrap_or(&1))
        }
        Op::Conv2d { w, .. } => out.saturating_mul(ty_of(w).shape[1..].iter().product()),
        Op::Pool2d { kernel, .. } => out.saturating_mul(kernel[0] as u64 * kernel[1] as u64),
        Op::Normalize { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } => out.saturating_mul(3),
        op => op
            .operands()
            .iter()
            .fold(out, |acc, x| acc.saturating_add(numel(ty_of(x)))),
    }
}

fn plan_node(
    p: &mut Planner,
    nodes: &[Node],
    node: &Node,
    np: &mut NodePlan,
    constants: &mut Vec<(TensorType, Vec<u8>)>,
    caps: &Caps,
    folded: &[bool],
) {
    let ty = &node.ty;
    let n = numel(ty);
    let ty_of = |x: &NodeId| &nodes[x.index()].ty;
    let ew = Family::Elementwise;
    match &node.op {
        Op::Input { name } => np.source = Source::Input(name.clone()),
        Op::Weight { file, tensor } => np.source = Source::Weight(*file, tensor.clone()),
        Op::Constant { data } => {
            np.source = Source::Constant(constants.len());
            constants.push((ty.clone(), data.clone()));
        }
        Op::Unary { op, x } => np.launches.push(launch(
            ew,
            "k_unary",
            n,
            vec![
                Arg::Out,
                Arg::Value(*x),
                Arg::U64(n),
                Arg::I32(op.tag() as i32),
                Arg::I32(dt(ty.dtype)),
            ],
        )),
        Op::Binary { op, a, b } => {
            let (ta, tb) = (ty_of(a), ty_of(b));
            let (dims, st) = merge_view(
                &ty.shape,
                vec![
                    broadcast_strides(&ty.shape, &ta.shape, 1),
                    broadcast_strides(&ty.shape, &tb.shape, 1),
                ],
            );
            let views: Vec<(u64, Vec<u64>)> = st.into_iter().map(|s| (0, s)).collect();
            let mo = p.view(&dims, &views);
            np.launches.push(launch(
                ew,
                "k_binary",
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*a),
                    Arg::Value(*b),
                    Arg::U64(n),
                    Arg::I32(op.tag() as i32),
                    Arg::I32(dt(ta.dtype)),
                    Arg::Meta,
                    Arg::U32(mo),
                ],
            ));
        }
        Op::Where { cond, a, b } => {
            let mo = p.view(
                &ty.shape,
                &[
                    (0, broadcast_strides(&ty.shape, &ty_of(cond).shape, 1)),
                    (0, broadcast_strides(&ty.shape, &ty_of(a).shape, 1)),
                    (0, broadcast_strides(&ty.shape, &ty_of(b).shape, 1)),
                ],
            );
            np.launches.push(launch(
                ew,
                "k_where",
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*cond),
                    Arg::Value(*a),
                    Arg::Value(*b),
                    Arg::U64(n),
                    Arg::I32(ty.dtype.size() as i32),
                    Arg::Meta,
                    Arg::U32(mo),
                ],
            ));
        }
        Op::Cast { x } => {
            let from = ty_of(x).dtype;
            if from == ty.dtype {
                np.source = Source::Alias(*x);
            } else {
                np.launches.push(launch(
                    ew,
                    "k_cast",
                    n,
                    vec![
                        Arg::Out,
                        Arg::Value(*x),
                        Arg::U64(n),
                        Arg::I32(dt(from)),
                        Arg::I32(dt(ty.dtype)),
                    ],
                ));
            }
        }
        Op::Reduce { op, x, axes, .. } => {
            let tx = ty_of(x);
            let st = strides(&tx.shape);
            let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
            for (d, (&dim, &s)) in tx.shape.iter().zip(&st).enumerate() {
                if axes.contains(&(d as u32)) {
                    rd.push(dim);
                    rs.push(s);
                } else {
                    kd.push(dim);
                    ks.push(s);
                }
            }
            let nred: u64 = rd.iter().product();
            let (rd, rs) = merge_axes(&rd, &rs);
            let (kd, ks) = merge_axes(&kd, &ks);
            // Lanes adjacent when a row's elements are; rows adjacent when only they are.
            let lanes_fast = rs.last() == Some(&1) || ks.last() != Some(&1);
            let mk = p.view(&kd, &[(0, ks)]);
            let mut red = vec![rd.len() as i64];
            red.extend(rd.iter().map(|&d| d as i64));
            red.extend(rs.iter().map(|&s| s as i64));
            let mr = p.raw(&red);
            np.launches.push(Launch {
                grid: row_grid(caps, n),
                ..launch(
                    Family::Reduce,
                    "k_reduce",
                    n,
                    vec![
                        Arg::Out,
                        Arg::Value(*x),
                        Arg::U64(n),
                        Arg::U64(nred),
                        Arg::I32(op.tag() as i32),
                        Arg::I32(dt(tx.dtype)),
                        Arg::I32(dt(ty.dtype)),
                        Arg::Meta,
                        Arg::U32(mk),
                        Arg::U32(mr),
                        Arg::I32(lanes_fast as i32),
                    ],
                )
            });
        }
        Op::MatMul { a, b } => {
            let (ta, tb) = (ty_of(a), ty_of(b));
            let (ra, rb, r) = (ta.rank(), tb.rank(), ty.rank());
            let (m, k, nn) = (ta.shape[ra - 2], ta.shape[ra - 1], tb.shape[rb - 1]);
            let batch = &ty.shape[..r - 2];
            let batches: u64 = batch.iter().product();
            if on_gemv(nodes, node, caps) {
                let ((ba, sa), (bb, sb)) = (
                    operand_view(nodes, folded, *a),
                    operand_view(nodes, folded, *b),
                );
                let mo = p.view(
                    batch,
                    &[
                        (0, batch_strides(batch, &ta.shape[..ra - 2], &sa[..ra - 2])),
                        (0, batch_strides(batch, &tb.shape[..rb - 2], &sb[..rb - 2])),
                    ],
                );
                let geometry = [sa[ra - 2], sa[ra - 1], sb[rb - 2], sb[rb - 1]];
                let mg = p.raw(&geometry.map(|v| v as i64));
                let mblocks = m.div_ceil(GEMV_ROWS);
                np.launches.push(Launch {
                    grid: Grid::Groups {
                        group: GEMV_T,
                        groups: [
                            nn.div_ceil(GEMV_T as u64).max(1),
                            mblocks.saturating_mul(batches).clamp(1, MAX_GROUPS_Y),
                        ],
                    },
                    ..launch(
                        Family::Linalg,
                        "k_gemv",
                        n,
                        vec![
                            Arg::Out,
                            Arg::Value(ba),
                            Arg::Value(bb),
                            Arg::U64(m),
                            Arg::U64(nn),
                            Arg::U64(k),
                            Arg::I32(dt(ty.dtype)),
                            Arg::Meta,
                            Arg::U32(mo),
                            Arg::U32(mg),
                            Arg::U64(batches),
                        ],
                    )
                });
                return;
            }
            let mo = p.view(
                batch,
                &[
                    (0, broadcast_strides(batch, &ta.shape[..ra - 2], m * k)),
                    (0, broadcast_strides(batch, &tb.shape[..rb - 2], k * nn)),
                ],
            );
            let tile = if ty.dtype.is_float() {
                choose_gemm(&caps.gemm, m, nn, batches, caps.compute_units)
            } else {
                None
            };
            if let Some(t) = tile {
                // float4 loads and stores where every row of the operand starts 16-byte
                // aligned: f32 with k (A's rows) or n (B's and the result's) a multiple of 4.
                let f32 = ty.dtype == DType::F32;
                let vec = (f32 && k % 4 == 0) as i32 | (((f32 && nn % 4 == 0) as i32) << 1);
                let mblocks = m.div_ceil(t.bm() as u64);
                np.launches.push(Launch {
                    grid: Grid::Groups {
                        group: t.threads(),
                        groups: [
                            nn.div_ceil(t.bn() as u64),
                            mblocks.saturating_mul(batches).clamp(1, MAX_GROUPS_Y),
                        ],
                    },
                    ..launch(
                        Family::Linalg,
                        t.name,
                        n,
                        vec![
                            Arg::Out,
                            Arg::Value(*a),
                            Arg::Value(*b),
                            Arg::U64(m),
                            Arg::U64(nn),
                            Arg::U64(k),
                            Arg::I32(dt(ty.dtype)),
                            Arg::I32(vec),
                            Arg::Meta,
                            Arg::U32(mo),
                            Arg::U64(batches),
                        ],
                    )
                });
            } else {
                np.launches.push(launch(
                    Family::Linalg,
                    "k_matmul",
                    n,
                    vec![
                        Arg::Out,
                        Arg::Value(*a),
                        Arg::Value(*b),
                        Arg::U64(n),
                        Arg::U64(m),
                        Arg::U64(nn),
                        Arg::U64(k),
                        Arg::I32(dt(ty.dtype)),
                        Arg::Meta,
                        Arg::U32(mo),
                    ],
                ));
            }
        }
        Op::Reshape { x } => np.source = Source::Alias(*x),
        Op::Permute { x, perm } => {
            let st = strides(&ty_of(x).shape);
            let src: Vec<u64> = perm.iter().map(|&q| st[q as usize]).collect();
            np.launches.extend(copy(
                p,
                *x,
                ty.dtype.size(),
                &ty.shape,
                (0, strides(&ty.shape)),
                (0, src),
            ));
        }
        Op::Expand { x } => {
            let src = broadcast_strides(&ty.shape, &ty_of(x).shape, 1);
            np.launches.extend(copy(
                p,
                *x,
                ty.dtype.size(),
                &ty.shape,
                (0, strides(&ty.shape)),
                (0, src),
            ));
        }
        Op::Slice { x, ranges } => {
            let st = strides(&ty_of(x).shape);
            let base = ranges.iter().zip(&st).map(|(r, s)| r.start * s).sum();
            let src = ranges.iter().zip(&st).map(|(r, s)| r.step * s).collect();
            np.launches.extend(copy(
                p,
                *x,
                ty.dtype.size(),
                &ty.shape,
                (0, strides(&ty.shape)),
                (base, src),
            ));
        }
        Op::Pad { x, pads, value } => {
            let size = ty.dtype.size();
            np.fill = Some(value.to_le_bytes()[..size as usize].to_vec());
            let tx = ty_of(x);
            let ost = strides(&ty.shape);
            let base = pads.iter().zip(&ost).map(|(&(lo, _), s)| lo * s).sum();
            np.launches.extend(copy(
                p,
                *x,
                size,
                &tx.shape,
                (base, ost),
                (0, strides(&tx.shape)),
            ));
        }
        Op::Concat { xs, axis } => {
            let a = *axis as usize;
            let ost = strides(&ty.shape);
            let mut at = 0u64;
            for x in xs {
                let tx = ty_of(x);
                np.launches.extend(copy(
                    p,
                    *x,
                    ty.dtype.size(),
                    &tx.shape,
                    (at * ost[a], ost.clone()),
                    (0, strides(&tx.shape)),
                ));
                at += tx.shape[a];
            }
        }
        Op::Gather { x, indices, axis } => {
            let (tx, ti) = (ty_of(x), ty_of(indices));
            let a = *axis as usize;
            let idx_n = numel(ti);
            let post: u64 = tx.shape[a + 1..].iter().product();
            let size_a = tx.shape[a] as i64;
            let idt = Arg::I32(dt(ti.dtype));
            np.gather_slot = Some(0); // numbered by `plan`
            np.launches.push(launch(
                ew,
                "k_gather_check",
                idx_n,
                vec![
                    Arg::Value(*indices),
                    Arg::U64(idx_n),
                    Arg::I64(size_a),
                    idt,
                    Arg::GatherFlags,
                    Arg::GatherSlot,
                ],
            ));
            np.launches.push(launch(
                ew,
                "k_gather_fetch",
                1,
                vec![
                    Arg::Value(*indices),
                    idt,
                    Arg::GatherFlags,
                    Arg::GatherValues,
                    Arg::GatherSlot,
                ],
            ));
            np.launches.push(launch(
                ew,
                "k_gather",
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*x),
                    Arg::Value(*indices),
                    Arg::U64(n),
                    Arg::U64(idx_n),
                    Arg::U64(post),
                    Arg::I64(size_a),
                    idt,
                    Arg::I32(ty.dtype.size() as i32),
                ],
            ));
        }
        Op::Iota { axis } => {
            let a = *axis as usize;
            let inner: u64 = ty.shape[a + 1..].iter().product();
            np.launches.push(launch(
                ew,
                "k_iota",
                n,
                vec![
                    Arg::Out,
                    Arg::U64(n),
                    Arg::U64(inner),
                    Arg::U64(ty.shape[a]),
                    Arg::I32(dt(ty.dtype)),
                ],
            ));
        }
        Op::TriMask { upper, diagonal } => {
            let r = ty.rank();
            np.launches.push(launch(
                ew,
                "k_tri_mask",
                n,
                vec![
                    Arg::Out,
                    Arg::U64(n),
                    Arg::U64(ty.shape[r - 2]),
                    Arg::U64(ty.shape[r - 1]),
                    Arg::I32(*upper as i32),
                    Arg::I64(*diagonal),
                ],
            ));
        }
        Op::Normalize { op, x, axis } => {
            let a = *axis as usize;
            let st = strides(&ty.shape);
            let len = ty.shape[a];
            let (mut kd, mut ks) = (vec![], vec![]);
            for (d, (&dim, &s)) in ty.shape.iter().zip(&st).enumerate() {
                if d != a {
                    kd.push(dim);
                    ks.push(s);
                }
            }
            let rows: u64 = kd.iter().product();
            let (kd, ks) = merge_axes(&kd, &ks);
            let lanes_fast = st[a] == 1 || ks.last() != Some(&1);
            let mk = p.view(&kd, &[(0, ks)]);
            np.launches.push(Launch {
                grid: row_grid(caps, rows),
                ..launch(
                    Family::Reduce,
                    "k_softmax",
                    rows,
                    vec![
                        Arg::Out,
                        Arg::Value(*x),
                        Arg::U64(rows),
                        Arg::U64(len),
                        Arg::U64(st[a]),
                        Arg::I32(op.tag() as i32),
                        Arg::I32(dt(ty.dtype)),
                        Arg::Meta,
                        Arg::U32(mk),
                        Arg::I32(lanes_fast as i32),
                    ],
                )
            });
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            let len = *ty.shape.last().unwrap_or(&1);
            let rows = n.checked_div(len).unwrap_or(0);
            np.launches.push(Launch {
                grid: row_grid(caps, rows),
                ..launch(
                    Family::Reduce,
                    "k_layer_norm",
                    rows,
                    vec![
                        Arg::Out,
                        Arg::Value(*x),
                        Arg::MaybeValue(*gamma),
                        Arg::MaybeValue(*beta),
                        Arg::U64(rows),
                        Arg::U64(len),
                        Arg::I32(gamma.is_some() as i32),
                        Arg::I32(beta.is_some() as i32),
                        Arg::U32(*eps_bits),
                        Arg::I32(dt(ty.dtype)),
                    ],
                )
            });
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            let len = *ty.shape.last().unwrap_or(&1);
            let rows = n.checked_div(len).unwrap_or(0);
            np.launches.push(Launch {
                grid: row_grid(caps, rows),
                ..launch(
                    Family::Reduce,
                    "k_rms_norm",
                    rows,
                    vec![
                        Arg::Out,
                        Arg::Value(*x),
                        Arg::MaybeValue(*gamma),
                        Arg::U64(rows),
                        Arg::U64(len),
                        Arg::I32(gamma.is_some() as i32),
                        Arg::U32(*eps_bits),
                        Arg::I32(dt(ty.dtype)),
                    ],
                )
            });
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => {
            let (tx, tw) = (ty_of(x), ty_of(w));
            let g = *groups as u64;
            let o = tw.shape[0];
            let geometry = [
                tx.shape[0],
                tx.shape[1],
                tx.shape[2],
                tx.shape[3],
                o,
                tw.shape[1],
                tw.shape[2],
                tw.shape[3],
                ty.shape[2],
                ty.shape[3],
                window.stride[0] as u64,
                window.stride[1] as u64,
                window.padding[0] as u64,
                window.padding[1] as u64,
                window.dilation[0] as u64,
                window.dilation[1] as u64,
                o / g,
            ];
            let mo = p.raw(&geometry.map(|v| v as i64));
            np.launches.push(launch(
                Family::Linalg,
                "k_conv2d",
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*x),
                    Arg::Value(*w),
                    Arg::MaybeValue(*bias),
                    Arg::U64(n),
                    Arg::I32(bias.is_some() as i32),
                    Arg::I32(dt(ty.dtype)),
                    Arg::Meta,
                    Arg::U32(mo),
                ],
            ));
        }
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => {
            let tx = ty_of(x);
            let geometry = [
                tx.shape[1],
                tx.shape[2],
                tx.shape[3],
                kernel[0] as u64,
                kernel[1] as u64,
                ty.shape[2],
                ty.shape[3],
                window.stride[0] as u64,
                window.stride[1] as u64,
                window.padding[0] as u64,
                window.padding[1] as u64,
                window.dilation[0] as u64,
                window.dilation[1] as u64,
            ];
            let mo = p.raw(&geometry.map(|v| v as i64));
            // The reference divides by `(kernel[0] * kernel[1]) as f32` (u32 product).
            let count = (kernel[0].wrapping_mul(kernel[1]) as f32).to_bits();
            np.launches.push(launch(
                Family::Linalg,
                "k_pool2d",
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*x),
                    Arg::U64(n),
                    Arg::I32(kind.tag() as i32),
                    Arg::I32(dt(ty.dtype)),
                    Arg::U32(count),
                    Arg::Meta,
                    Arg::U32(mo),
                ],
            ));
        }
        Op::Dequantize { x, format } => np.launches.push(launch(
            ew,
            "k_dequantize",
            n,
            vec![
                Arg::Out,
                Arg::Value(*x),
                Arg::U64(n),
                Arg::I32(format.tag() as i32),
                Arg::U32(format.block_bytes() as u32),
            ],
        )),
        Op::QMatMul { a, w, format, dot } => {
            // Every batch's rows in a row: `a` is contiguous and `w` has no batch.
            let (tw, ta) = (ty_of(w), ty_of(a));
            let (nn, nb, bb) = (tw.shape[0], tw.shape[1], format.block_bytes());
            // `qmatmul_q8` has its own kernel, one item an output (no few-row variant yet).
            if *dot == QDot::F32 && caps.gemv != Gemv::Off {
                let rows: u64 = ta.shape[..ta.rank() - 1].iter().product();
                // Every row's span starts on a word when the rows' length is a multiple of
                // 4 bytes (a buffer starts on one).
                let words = nb.wrapping_mul(bb) % 4 == 0;
                np.launches.push(Launch {
                    grid: Grid::Groups {
                        group: GEMV_T,
                        groups: [
                            nn.div_ceil(GEMV_T as u64).max(1),
                            rows.div_ceil(GEMV_ROWS).clamp(1, MAX_GROUPS_Y),
                        ],
                    },
                    ..launch(
                        Family::Linalg,
                        "k_qgemv",
                        n,
                        vec![
                            Arg::Out,
                            Arg::Value(*a),
                            Arg::Value(*w),
                            Arg::U64(rows),
                            Arg::U64(nn),
                            Arg::U64(nb),
                            Arg::I32(format.tag() as i32),
                            Arg::U32(bb as u32),
                            Arg::I32(words as i32),
                        ],
                    )
                });
                return;
            }
            let kernel = match dot {
                QDot::F32 => "k_qmatmul",
                QDot::Q8 => "k_qmatmul_q8",
            };
            np.launches.push(launch(
                Family::Linalg,
                kernel,
                n,
                vec![
                    Arg::Out,
                    Arg::Value(*a),
                    Arg::Value(*w),
                    Arg::U64(n),
                    Arg::U64(nn),
                    Arg::U64(nb),
                    Arg::I32(format.tag() as i32),
                    Arg::U32(bb as u32),
                ],
            ));
        }
        Op::Random { dist, key } => np.launches.push(launch(
            ew,
            "k_random",
            n,
            vec![
                Arg::Out,
                Arg::U64(n),
                Arg::I32(dist.tag() as i32),
                Arg::I32(dt(ty.dtype)),
                Arg::Seed,
                Arg::U64(*key),
            ],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::GEMM_TILES;

    fn pick(m: u64, n: u64, batches: u64, cu: u64) -> &'static str {
        choose_gemm(&GEMM_TILES, m, n, batches, cu).unwrap().name
    }

    #[test]
    fn products_get_the_largest_tile_that_keeps_the_device_busy() {
        // An H100's 132 compute units, MiniLM at batch 32 × 128 tokens.
        assert_eq!(pick(4096, 4096, 1, 132), "k_gemm_128x128");
        assert_eq!(pick(4096, 1536, 1, 132), "k_gemm_128x128");
        assert_eq!(pick(4096, 384, 1, 132), "k_gemm_64x64");
        assert_eq!(pick(128, 128, 384, 132), "k_gemm_128x128");
        // Attention's P·V: 32 columns would waste three quarters of a 128-wide block.
        assert_eq!(pick(128, 32, 384, 132), "k_gemm_32x32");
        // Nothing fits well: the least waste, the smaller tile on ties.
        assert_eq!(pick(3, 5, 1, 132), "k_gemm_32x32");
        assert_eq!(pick(100, 100, 1, 2), "k_gemm_32x32");
        assert_eq!(pick(1024, 1024, 1, 2), "k_gemm_128x128");
        assert!(choose_gemm(&[], 8, 8, 1, 1).is_none());
    }

    #[test]
    fn elementwise_views_merge_only_where_every_operand_agrees() {
        // x[2, 3, 4] * y[4]: y's stride 0 on the first two axes breaks the chain at the last.
        let (d, s) = merge_view(&[2, 3, 4], vec![vec![12, 4, 1], vec![0, 0, 1]]);
        assert_eq!((d, s), (vec![6, 4], vec![vec![4, 1], vec![0, 1]]));
        // Both contiguous: one axis; size-1 axes drop; a scalar view has no axes.
        let (d, s) = merge_view(&[2, 1, 3], vec![vec![3, 3, 1], vec![3, 3, 1]]);
        assert_eq!((d, s), (vec![6], vec![vec![1], vec![1]]));
        let (d, s) = merge_view(&[1], vec![vec![1]]);
        assert_eq!((d, s), (vec![], vec![vec![]]));
        // A broadcast scalar merges with anything.
        let (d, s) = merge_view(&[5, 7], vec![vec![7, 1], vec![0, 0]]);
        assert_eq!((d, s), (vec![35], vec![vec![1], vec![0]]));
    }

    #[test]
    fn reduced_axes_merge_only_where_memory_agrees() {
        // [2, 3, 4] reduced over all axes: one run of 24.
        assert_eq!(merge_axes(&[2, 3, 4], &[12, 4, 1]), (vec![24], vec![1]));
        // Axes 0 and 2 of [2, 3, 4]: strides 12 and 1 do not chain.
        assert_eq!(merge_axes(&[2, 4], &[12, 1]), (vec![2, 4], vec![12, 1]));
        // Size-1 axes drop out; nothing left is an empty view (one element).
        assert_eq!(merge_axes(&[1, 5, 1], &[5, 1, 1]), (vec![5], vec![1]));
        assert_eq!(merge_axes(&[1, 1], &[1, 1]), (vec![], vec![]));
        // An empty axis stays (no element is read).
        assert_eq!(merge_axes(&[3, 0], &[0, 1]), (vec![0], vec![1]));
    }
}
