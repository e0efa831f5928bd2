//! The CPU plan: which kernel runs each node, which elementwise nodes fuse into one pass, and
//! when each buffer can be released.

use std::collections::HashMap;

use tenet_exec::{Liveness, Schedule};
use tenet_ir::{DType, Graph, NodeId, NormOp, Op, UnaryOp};

/// One step of the plan, in graph order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// An input, weight or constant.
    Source(NodeId),
    /// An f32 matrix product on the deterministic GEMM. An operand that is a permutation read
    /// only by matmuls is not materialised: `a_permuted` / `b_permuted` name that Permute node,
    /// and the GEMM reads the permutation's source through permuted strides instead of a copy
    /// (a transposed weight, attention's head-major views of Q, K and V).
    Gemm {
        node: NodeId,
        a_permuted: Option<NodeId>,
        b_permuted: Option<NodeId>,
        /// An elementwise group that alone reads the product (a bias, an activation), applied
        /// in place to each block of rows as soon as the GEMM has finished it, while it is
        /// still in cache; its last node is this step's result. Often empty.
        epilogue: Vec<NodeId>,
    },
    /// Consecutive f32 elementwise nodes of one shape evaluated in a single pass; only the last
    /// node's result is materialised (the others are used only inside the group).
    Fused(Vec<NodeId>),
    /// An f32 softmax/log-softmax over the last axis, or an f32 layer/RMS norm, row-parallel.
    /// `prologue` is a fused elementwise group (possibly empty) whose last node is the rows
    /// op's input and is read by nothing else: it is evaluated a block of rows at a time just
    /// before those rows are normalised, and never materialised (attention's scale-and-mask
    /// before its softmax, a residual add before a norm).
    Rows { node: NodeId, prologue: Vec<NodeId> },
    /// Attention, `softmax(prologue(A·B))·V` over a batch of matrices, one batch entry at a
    /// time: the scores and probabilities of one entry live in a thread's scratch (in L2) and
    /// are never materialised. Each part runs the kernel its own step would (the GEMM's chains,
    /// the prologue, the softmax per row), so the bits are those of the three steps.
    Attention {
        scores: Box<Step>,
        softmax: Box<Step>,
        out: Box<Step>,
    },
    /// An f32 `conv2d` (`conv.rs`) with `epilogue`, an elementwise group that alone reads its
    /// output (an activation), applied in place to each part of the output as soon as it is
    /// final, while it is still in cache; the group's last node is this step's result. (A
    /// convolution without one is a [`Step::Generic`] step.)
    Conv { node: NodeId, epilogue: Vec<NodeId> },
    /// A `qmatmul` (block-quantised weight, f32 activations and result) on the kernels'
    /// quantised product (`tenet_kernels::qgemm`): `a`'s batch axes flatten into rows, since
    /// the weight has none.
    QMatMul(NodeId),
    /// A `dequantize` on the kernels' block decoding, split across threads.
    Dequantize(NodeId),
    /// Anything else, on the reference interpreter's code.
    Generic(NodeId),
}

impl Step {
    /// Every node this step computes (folded permutations aside).
    fn nodes(&self, f: &mut impl FnMut(NodeId)) {
        match self {
            Step::Fused(ids) => ids.iter().copied().for_each(f),
            Step::Rows { node, prologue } => {
                f(*node);
                prologue.iter().copied().for_each(f);
            }
            Step::Attention {
                scores,
                softmax,
                out,
            } => {
                scores.nodes(f);
                softmax.nodes(f);
                out.nodes(f);
            }
            Step::Gemm { node, epilogue, .. } | Step::Conv { node, epilogue } => {
                f(*node);
                epilogue.iter().copied().for_each(f);
            }
            Step::Source(id) | Step::QMatMul(id) | Step::Dequantize(id) | Step::Generic(id) => {
                f(*id)
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Plan {
    pub steps: Vec<Step>,
    /// Nodes whose buffers can be dropped after each step.
    pub release: Vec<Vec<NodeId>>,
    /// Graph inputs whose last reader is each step (unused inputs: the first step). Inputs are
    /// the caller's memory, but they stop counting as live there, as in the cost certificate.
    pub input_release: Vec<Vec<NodeId>>,
    /// Quantised products that compute their later siblings too ([`siblings`]), with those
    /// siblings, in plan order.
    pub siblings: HashMap<NodeId, Vec<NodeId>>,
}

/// An f32 elementwise op the fused loop implements.
pub(crate) fn fusable(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let f32s = |ids: &[NodeId]| ids.iter().all(|&o| graph.node(o).ty.dtype == DType::F32);
    node.ty.dtype == DType::F32
        && match &node.op {
            Op::Unary { op, x } => *op != UnaryOp::Not && f32s(&[*x]),
            Op::Binary { op, a, b } => !op.is_comparison() && !op.is_logical() && f32s(&[*a, *b]),
            _ => false,
        }
}

fn rows_op(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let all_f32 = node.ty.dtype == DType::F32
        && node
            .op
            .operands()
            .iter()
            .all(|&o| graph.node(o).ty.dtype == DType::F32);
    all_f32
        && match &node.op {
            Op::Normalize {
                op: NormOp::Softmax | NormOp::LogSoftmax,
                axis,
                ..
            } => *axis as usize + 1 == node.ty.rank(),
            Op::LayerNorm { .. } | Op::RmsNorm { .. } => true,
            _ => false,
        }
}

/// The most members a fused group has: longer chains are cut into groups of this many (each
/// group's result materialised, as the certificate assumes of every node), which bounds a
/// group's member table and the work between two polls of a run's stop flag.
pub(crate) const MAX_GROUP: usize = 256;

pub(crate) fn plan(graph: &Graph) -> Plan {
    let nodes = graph.nodes();
    let n = nodes.len();
    let schedule = Schedule::new(graph);
    let users = schedule.all_users();
    let is_output = schedule.outputs();

    // Permutations read only by f32 matmuls (and not outputs) are folded into those GEMMs,
    // which read the source through permuted strides.
    let folded: Vec<bool> = (0..n)
        .map(|m| {
            let only_read_by_matmuls = users[m].iter().all(|&u| {
                matches!(nodes[u].op, Op::MatMul { .. }) && nodes[u].ty.dtype == DType::F32
            });
            matches!(nodes[m].op, Op::Permute { .. })
                && nodes[m].ty.dtype == DType::F32
                && !is_output[m]
                && !users[m].is_empty()
                && only_read_by_matmuls
        })
        .collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < n {
        let id = NodeId(i as u32);
        let node = &nodes[i];
        if node.op.is_source() {
            steps.push(Step::Source(id));
        } else if folded[i] {
            // Read directly by the matmuls it feeds.
        } else if let Op::MatMul { a, b } = node.op
            && node.ty.dtype == DType::F32
        {
            steps.push(Step::Gemm {
                node: id,
                a_permuted: folded[a.index()].then_some(a),
                b_permuted: folded[b.index()].then_some(b),
                epilogue: Vec::new(),
            });
        } else if matches!(node.op, Op::QMatMul { .. }) {
            steps.push(Step::QMatMul(id));
        } else if matches!(node.op, Op::Dequantize { .. }) {
            steps.push(Step::Dequantize(id));
        } else if rows_op(graph, id) {
            steps.push(Step::Rows {
                node: id,
                prologue: Vec::new(),
            });
        } else if fusable(graph, id) {
            // The longest run of fusable nodes of this shape whose members but the last are
            // used only inside it.
            let end = schedule
                .elementwise_group(graph, i, MAX_GROUP, |m| fusable(graph, NodeId(m as u32)));
            steps.push(Step::Fused((i..=end).map(|m| NodeId(m as u32)).collect()));
            i = end + 1;
            continue;
        } else {
            steps.push(Step::Generic(id));
        }
        i += 1;
    }

    let steps = fold_prologues(graph, steps, users, is_output);
    let steps = fold_attention(graph, steps, users, is_output);
    let steps = fold_epilogues(graph, steps, users, is_output);

    // A node's buffer is released after the step that last reads it (outputs never).
    let mut step_of = vec![0usize; n];
    for (s, step) in steps.iter().enumerate() {
        step.nodes(&mut |id| step_of[id.index()] = s);
    }
    // A folded permutation "runs" with its last reader, so its source lives until then.
    for m in (0..n).filter(|&m| folded[m]) {
        step_of[m] = users[m].iter().map(|&u| step_of[u]).max().unwrap_or(0);
    }
    let Liveness {
        release,
        input_release,
    } = schedule.liveness(graph, &step_of, steps.len());
    let siblings = siblings(graph, &steps);
    Plan {
        steps,
        release,
        input_release,
        siblings,
    }
}

/// Runs of quantised products of one definition (`qmatmul` or `qmatmul_q8`) that read the same
/// A, with nothing but weights read between them (attention's q, k and v products; the MLP's
/// gate and up), each sibling's weight a file weight: the first step of a run computes them all
/// at once (`qgemm_siblings`, `qgemm_q8_siblings`: A prepared once, every weight's tiles shared
/// among the threads), and each later step takes its result. Only weights lie between, so the results made early are ones the certificate counts
/// a few source steps later; the memory bound adds them to the first step's scratch.
fn siblings(graph: &Graph, steps: &[Step]) -> HashMap<NodeId, Vec<NodeId>> {
    let q8_of = |step: &Step| match *step {
        Step::QMatMul(id) => match graph.node(id).op {
            Op::QMatMul { a, w, dot, .. } => Some((id, a, w, dot)),
            _ => None,
        },
        _ => None,
    };
    let is_weight = |id: NodeId| matches!(graph.node(id).op, Op::Weight { .. });
    let mut out = HashMap::new();
    let mut s = 0;
    while s < steps.len() {
        let Some((leader, a, _, dot)) = q8_of(&steps[s]) else {
            s += 1;
            continue;
        };
        let mut followers = Vec::new();
        let mut next = s + 1;
        while next < steps.len() {
            match &steps[next] {
                Step::Source(id) if is_weight(*id) => {}
                step => match q8_of(step) {
                    Some((id, other, w, d)) if other == a && d == dot && is_weight(w) => {
                        followers.push(id)
                    }
                    _ => break,
                },
            }
            next += 1;
        }
        if !followers.is_empty() {
            out.insert(leader, followers);
        }
        s = next;
    }
    out
}

/// The indices of the last `count` steps of `out` that compute something, latest first:
/// the steps a fold may merge with the next one (sources may lie between them).
fn last_computing(out: &[Step], count: usize) -> Vec<usize> {
    (0..out.len())
        .rev()
        .filter(|&i| !matches!(out[i], Step::Source(_)))
        .take(count)
        .collect()
}

/// Move each fused group whose result only a rows op reads into that op's step. Only sources
/// may lie between the two (they compute nothing the group needs), so evaluating the group
/// later reads the same operands.
fn fold_prologues(
    graph: &Graph,
    steps: Vec<Step>,
    users: &[Vec<usize>],
    is_output: &[bool],
) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for step in steps {
        let Step::Rows { node, prologue } = step else {
            out.push(step);
            continue;
        };
        debug_assert!(prologue.is_empty());
        let x = graph.node(node).op.operands()[0];
        let only_for_this_op = !is_output[x.index()]
            && users[x.index()] == [node.index()]
            && graph.node(node).op.operands()[1..].iter().all(|&o| o != x);
        let group = last_computing(&out, 1)
            .first()
            .copied()
            .filter(|&g| matches!(&out[g], Step::Fused(ids) if ids.last() == Some(&x)));
        let prologue = match group {
            Some(g) if only_for_this_op => match out.remove(g) {
                Step::Fused(ids) => ids,
                _ => unreachable!("checked to be a fused group"),
            },
            _ => Vec::new(),
        };
        out.push(Step::Rows { node, prologue });
    }
    out
}

/// Fold `Gemm` (scores) → softmax `Rows` (with its prologue) → `Gemm` (out) into one
/// [`Step::Attention`] where the scores and the probabilities are read by nothing else, the
/// probabilities are the second product's left operand, and both products have the same batch
/// axes (each batch entry is then a whole attention of its own).
fn fold_attention(
    graph: &Graph,
    steps: Vec<Step>,
    users: &[Vec<usize>],
    is_output: &[bool],
) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for step in steps {
        let Step::Gemm {
            node: o,
            a_permuted: None,
            ..
        } = step
        else {
            out.push(step);
            continue;
        };
        let computing = last_computing(&out, 2);
        let fits = match computing[..] {
            [r, g] => attention_fits(graph, &out[g], &out[r], o, users, is_output),
            _ => false,
        };
        if !fits {
            out.push(step);
            continue;
        }
        let (r, g) = (computing[0], computing[1]);
        let softmax = out.remove(r);
        let scores = out.remove(g);
        out.push(Step::Attention {
            scores: Box::new(scores),
            softmax: Box::new(softmax),
            out: Box::new(step),
        });
    }
    out
}

fn attention_fits(
    graph: &Graph,
    scores: &Step,
    softmax: &Step,
    o: NodeId,
    users: &[Vec<usize>],
    is_output: &[bool],
) -> bool {
    let (
        Step::Gemm {
            node: s, epilogue, ..
        },
        Step::Rows { node: p, prologue },
    ) = (scores, softmax)
    else {
        return false;
    };
    if !epilogue.is_empty() {
        return false;
    }
    let (s, p) = (*s, *p);
    let Op::MatMul { a, b } = graph.node(o).op else {
        return false;
    };
    let is_softmax = matches!(
        graph.node(p).op,
        Op::Normalize {
            op: NormOp::Softmax | NormOp::LogSoftmax,
            ..
        }
    );
    // The scores feed the softmax (through its prologue) and nothing else.
    let inside = |u: &usize| *u == p.index() || prologue.iter().any(|m| m.index() == *u);
    let scores_private = !is_output[s.index()] && users[s.index()].iter().all(inside);
    let feeds_softmax = if prologue.is_empty() {
        graph.node(p).op.operands()[0] == s
    } else {
        !users[s.index()].is_empty()
    };
    let probs_private = !is_output[p.index()] && users[p.index()] == [o.index()] && b != p;
    let (ss, os) = (&graph.node(s).ty.shape, &graph.node(o).ty.shape);
    let same_batch =
        ss.len() == os.len() && ss.len() >= 3 && ss[..ss.len() - 2] == os[..os.len() - 2];
    is_softmax && a == p && scores_private && feeds_softmax && probs_private && same_batch
}

/// Move each fused group that alone reads a GEMM's product or an f32 convolution's output (of
/// the same shape) into that step as its epilogue. Only sources may lie between the two, and
/// the GEMM or convolution moves to the group's place, after them: the epilogue may read them
/// (a bias weight).
fn fold_epilogues(
    graph: &Graph,
    steps: Vec<Step>,
    users: &[Vec<usize>],
    is_output: &[bool],
) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for step in steps {
        let Step::Fused(ids) = step else {
            out.push(step);
            continue;
        };
        // The group alone reads `node`, whose value has the group's type.
        let feeds_only = |node: NodeId| {
            let (n, last) = (node.index(), ids[ids.len() - 1]);
            !is_output[n]
                && !users[n].is_empty()
                && users[n].iter().all(|u| ids.iter().any(|m| m.index() == *u))
                && graph.node(node).ty == graph.node(last).ty
        };
        let gemm = last_computing(&out, 1)
            .first()
            .copied()
            .filter(|&g| match &out[g] {
                // A group after an epilogue (split from it by a source between them, say: the
                // 6 of HardSwish's `/ 6`) continues it, up to a group's most members.
                Step::Gemm { node, epilogue, .. } | Step::Conv { node, epilogue } => {
                    epilogue.len() + ids.len() <= MAX_GROUP
                        && feeds_only(*epilogue.last().unwrap_or(node))
                }
                Step::Generic(node) => f32_conv(graph, *node) && feeds_only(*node),
                _ => false,
            });
        match gemm.map(|g| out.remove(g)) {
            Some(Step::Generic(node)) => out.push(Step::Conv {
                node,
                epilogue: ids,
            }),
            Some(Step::Conv { node, mut epilogue }) => {
                epilogue.extend(ids);
                out.push(Step::Conv { node, epilogue });
            }
            Some(Step::Gemm {
                node,
                a_permuted,
                b_permuted,
                mut epilogue,
            }) => {
                epilogue.extend(ids);
                out.push(Step::Gemm {
                    node,
                    a_permuted,
                    b_permuted,
                    epilogue,
                })
            }
            Some(_) => unreachable!("checked to be a GEMM or convolution step"),
            None => out.push(Step::Fused(ids)),
        }
    }
    out
}

/// Whether `id` is a convolution `conv.rs` computes (f32 operands and result).
fn f32_conv(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    matches!(node.op, Op::Conv2d { .. })
        && node.ty.dtype == DType::F32
        && node
            .op
            .operands()
            .iter()
            .all(|&o| graph.node(o).ty.dtype == DType::F32)
}
