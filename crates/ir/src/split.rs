//! Cutting a graph into stages that run one after another, each a graph of its own.
//!
//! A stage is a run of consecutive nodes of the whole graph (node order is the execution
//! order). Whatever a later stage reads of an earlier one crosses the cut as a **boundary
//! tensor**: an output of the stage before the cut and an input of the stage after it, named
//! `%N` after the node that computes it in the whole graph. Stages chain strictly — stage
//! k's boundary inputs are exactly stage k−1's boundary outputs — so a value that skips a
//! stage passes through it (an input that is also an output). Sources are not carried:
//! a stage declares the whole graph's inputs it reads (same names) and repeats the weight
//! references, constants and index tensors it uses. Each of the whole graph's outputs is an
//! output of the stage that computes it (or, for an output that is a source, the last stage).
//!
//! Running the stages in order, each with the whole graph's inputs it declares, the boundary
//! tensors of the stage before and the same seed, gives every output bit for bit as the whole
//! graph does: each node computes the same op on the same operand values.
//!
//! Cuts are planned against each stage's own cost certificate (`peak_bytes`, what a node
//! checks before it runs anything) and placed where the crossing is small: between transformer
//! layers, where only the residual stream (and masks) cross, not inside attention.

use std::collections::HashMap;

use crate::error::ValidationError;
use crate::graph::{Graph, Node, Output};
use crate::op::{NodeId, Op};

/// What to split for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitTarget {
    /// Every stage's certificate `peak_bytes` at most this.
    Memory(u64),
    /// This many stages (or fewer where the graph has fewer places to cut), as even in
    /// memory as the cuts allow.
    Stages(usize),
}

/// One stage of a split graph.
#[derive(Clone, Debug)]
pub struct Stage {
    pub graph: Graph,
    /// The whole graph's nodes this stage computes (sources it repeats aside).
    pub nodes: std::ops::Range<usize>,
    /// Boundary tensors read from the stage before, by name (`%N`), in the order of `N`.
    pub boundary_in: Vec<String>,
    /// Boundary tensors written for the stage after, by name, in the order of `N`.
    pub boundary_out: Vec<String>,
    /// The whole graph's inputs this stage reads (same names).
    pub inputs: Vec<String>,
    /// The whole graph's outputs this stage produces (same names).
    pub outputs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error(
        "node {node} ({op}) needs {need} bytes in a stage of its own, above the limit of {limit}: no split fits; raise the limit"
    )]
    TooBig {
        node: NodeId,
        op: &'static str,
        need: u64,
        limit: u64,
    },
    #[error("a split needs at least one stage")]
    NoStages,
    #[error("cut {cut} is not a place to cut: {why}")]
    BadCut { cut: usize, why: String },
    #[error(
        "the graph has an input or output named {0:?}, the name a boundary tensor would take; rename it"
    )]
    NameClash(String),
    #[error("stage {stage}: {source}")]
    Invalid {
        stage: usize,
        source: ValidationError,
    },
}

/// The name of the boundary tensor computed by the whole graph's node `id`.
pub fn boundary_name(id: usize) -> String {
    format!("%{id}")
}

/// Values a stage repeats rather than receives, by node: the model's inputs (declared again),
/// and everything computed from weights and constants alone (an imported model's reshaped
/// norm parameters, a rotary table): each stage that reads one declares or recomputes it, so
/// it never crosses a cut and never makes a stage of its own.
fn repeats(graph: &Graph) -> Vec<bool> {
    let mut fixed = Vec::with_capacity(graph.nodes().len());
    let mut out = Vec::with_capacity(graph.nodes().len());
    for node in graph.nodes() {
        let operands = node.op.operands();
        let f = match &node.op {
            Op::Weight { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::TriMask { .. } => true,
            Op::Input { .. } | Op::Random { .. } => false,
            _ => !operands.is_empty() && operands.iter().all(|o| fixed[o.index()]),
        };
        fixed.push(f);
        out.push(f || matches!(node.op, Op::Input { .. }));
    }
    out
}

/// What planning and building stages read of the whole graph, computed once per split.
struct Facts {
    /// Whether each node is repeated by the stages that read it ([`repeats`]).
    rep: Vec<bool>,
    /// The last node that reads each node ([`last_uses`]).
    last: Vec<Option<usize>>,
}

impl Facts {
    fn of(graph: &Graph) -> Facts {
        Facts {
            rep: repeats(graph),
            last: last_uses(graph),
        }
    }
}

/// The last node (index) that reads each node, if any.
fn last_uses(graph: &Graph) -> Vec<Option<usize>> {
    let mut last = vec![None; graph.nodes().len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        for o in node.op.operands() {
            last[o.index()] = Some(i);
        }
    }
    last
}

/// The places a cut may go: before each computed node (never before a source, so every stage
/// computes something), and the end.
pub fn cut_points(graph: &Graph) -> Vec<usize> {
    candidates(&repeats(graph))
}

fn candidates(rep: &[bool]) -> Vec<usize> {
    let n = rep.len();
    // The first stage must compute something too: no cut up to the first computed node.
    let first = (0..n).find(|&i| !rep[i]).unwrap_or(n);
    (first + 1..n)
        .filter(|&i| !rep[i])
        .chain(std::iter::once(n))
        .collect()
}

/// Bytes crossing a cut before node `i`, for every `i` in `0..=nodes`: the computed values
/// defined before `i` and read at or after it.
pub fn crossing_bytes(graph: &Graph) -> Vec<u64> {
    crossing_bytes_of(graph, &Facts::of(graph))
}

fn crossing_bytes_of(graph: &Graph, f: &Facts) -> Vec<u64> {
    let n = graph.nodes().len();
    let mut diff = vec![0i128; n + 2];
    for (v, &last) in f.last.iter().enumerate() {
        let node = &graph.nodes()[v];
        if let (Some(u), false) = (last, f.rep[v]) {
            let b = node.ty.bytes().unwrap_or(u64::MAX) as i128;
            diff[v + 1] += b;
            diff[u + 1] -= b;
        }
    }
    let mut out = Vec::with_capacity(n + 1);
    let mut acc = 0i128;
    for d in diff.iter().take(n + 1) {
        acc += d;
        out.push(acc.clamp(0, u64::MAX as i128) as u64);
    }
    out
}

/// The computed values crossing a cut before `i`, in node order.
fn crossing(f: &Facts, i: usize) -> Vec<usize> {
    (0..i.min(f.rep.len()))
        .filter(|&v| !f.rep[v] && f.last[v].is_some_and(|u| u >= i))
        .collect()
}

/// Split at the given cuts (strictly increasing node indices, each before a computed node).
pub fn split_at(graph: &Graph, cuts: &[usize]) -> Result<Vec<Stage>, SplitError> {
    let n = graph.nodes().len();
    let f = Facts::of(graph);
    let allowed = candidates(&f.rep);
    let mut bounds = vec![0];
    for &c in cuts {
        if c == 0 || c >= n || c <= *bounds.last().unwrap_or(&0) {
            return Err(SplitError::BadCut {
                cut: c,
                why: format!("cuts must increase and lie in 1..{n}"),
            });
        }
        if allowed.binary_search(&c).is_err() {
            return Err(SplitError::BadCut {
                cut: c,
                why: "it is before a source (an input, weight or constant), not a computed node"
                    .into(),
            });
        }
        bounds.push(c);
    }
    bounds.push(n);
    let names: std::collections::HashSet<&str> = graph
        .inputs()
        .map(|(_, name, _)| name)
        .chain(graph.outputs().iter().map(|o| o.name.as_str()))
        .collect();
    if let Some(clash) = names.iter().find(|s| s.starts_with('%')) {
        return Err(SplitError::NameClash(clash.to_string()));
    }
    let stages = bounds.len() - 1;
    (0..stages)
        .map(|k| {
            let (a, b) = (bounds[k], bounds[k + 1]);
            let (into, out) = (crossing(&f, a), crossing(&f, b));
            build_stage(graph, &f, a..b, &into, &out, k + 1 == stages)
                .map_err(|source| SplitError::Invalid { stage: k, source })
        })
        .collect()
}

/// One stage: nodes `range` of `graph`, reading `into` across the cut before it and writing
/// `out` across the cut after it.
fn build_stage(
    graph: &Graph,
    f: &Facts,
    range: std::ops::Range<usize>,
    into: &[usize],
    out: &[usize],
    last_stage: bool,
) -> Result<Stage, ValidationError> {
    let whole = graph.nodes();
    let mut nodes: Vec<Node> = Vec::new();
    let mut map: HashMap<usize, NodeId> = HashMap::new();
    let mut inputs = Vec::new();
    for &v in into {
        map.insert(v, NodeId(nodes.len() as u32));
        nodes.push(Node {
            op: Op::Input {
                name: boundary_name(v),
            },
            ty: whole[v].ty.clone(),
        });
    }
    let rep = &f.rep;
    // A repeated value used here is declared (an input, a weight, a constant) or recomputed
    // (from weights and constants alone) at its first use, its own operands first.
    let bring = |v: usize,
                 nodes: &mut Vec<Node>,
                 map: &mut HashMap<usize, NodeId>,
                 inputs: &mut Vec<String>|
     -> NodeId {
        if let Some(&id) = map.get(&v) {
            return id;
        }
        // Every node this one needs that is not declared yet, in node order.
        let mut need = vec![v];
        let mut stack = vec![v];
        while let Some(u) = stack.pop() {
            for o in whole[u].op.operands() {
                let o = o.index();
                if !map.contains_key(&o) && !need.contains(&o) {
                    need.push(o);
                    stack.push(o);
                }
            }
        }
        need.sort_unstable();
        for u in need {
            if let Op::Input { name } = &whole[u].op {
                inputs.push(name.clone());
            }
            let op = whole[u].op.map_operands(|o| map[&o.index()]);
            map.insert(u, NodeId(nodes.len() as u32));
            nodes.push(Node {
                op,
                ty: whole[u].ty.clone(),
            });
        }
        map[&v]
    };
    for i in range.clone() {
        let node = &whole[i];
        if rep[i] {
            continue;
        }
        for o in node.op.operands() {
            let o = o.index();
            if !map.contains_key(&o) {
                // Not computed here and not crossing: repeated (planning guarantees it).
                bring(o, &mut nodes, &mut map, &mut inputs);
            }
        }
        let op = node.op.map_operands(|o| map[&o.index()]);
        map.insert(i, NodeId(nodes.len() as u32));
        nodes.push(Node {
            op,
            ty: node.ty.clone(),
        });
    }
    let mut outputs = Vec::new();
    let mut produced = Vec::new();
    for o in graph.outputs() {
        let v = o.node.index();
        let here = range.contains(&v) && !rep[v];
        let source_at_end = last_stage && rep[v];
        if here || source_at_end {
            let id = bring(v, &mut nodes, &mut map, &mut inputs);
            outputs.push(Output {
                name: o.name.clone(),
                node: id,
            });
            produced.push(o.name.clone());
        }
    }
    for &v in out {
        outputs.push(Output {
            name: boundary_name(v),
            node: map[&v],
        });
    }
    let graph = Graph::new(nodes, outputs)?;
    Ok(Stage {
        graph,
        nodes: range,
        boundary_in: into.iter().map(|&v| boundary_name(v)).collect(),
        boundary_out: out.iter().map(|&v| boundary_name(v)).collect(),
        inputs,
        outputs: produced,
    })
}

/// The certificate peak of the stage `a..b` (building it).
fn stage_peak(graph: &Graph, f: &Facts, a: usize, b: usize) -> Result<u64, SplitError> {
    let last_stage = b == graph.nodes().len();
    build_stage(graph, f, a..b, &crossing(f, a), &crossing(f, b), last_stage)
        .map(|s| s.graph.cost().peak_bytes)
        .map_err(|source| SplitError::Invalid { stage: 0, source })
}

/// Cuts for stages of at most `limit` bytes each: each stage runs as far as fits, then steps
/// back, within its second half, to the cut with the fewest bytes crossing.
fn cuts_for_memory(
    graph: &Graph,
    limit: u64,
    cands: &[usize],
    cross: &[u64],
    f: &Facts,
) -> Result<Vec<usize>, SplitError> {
    let n = graph.nodes().len();
    let mut cuts = Vec::new();
    let mut a = 0;
    while a < n {
        // Candidates after `a`; the furthest whose stage fits (peaks grow with the stage).
        let first = cands.partition_point(|&c| c <= a);
        let after = &cands[first..];
        if stage_peak(graph, f, a, after[0])? > limit {
            let node = (a..after[0]).find(|&i| !f.rep[i]).unwrap_or(a);
            return Err(SplitError::TooBig {
                node: NodeId(node as u32),
                op: graph.nodes()[node].op.name(),
                need: stage_peak(graph, f, a, after[0])?,
                limit,
            });
        }
        let (mut lo, mut hi) = (0, after.len() - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if stage_peak(graph, f, a, after[mid])? <= limit {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let end = after[lo];
        if end == n {
            break;
        }
        // The smallest crossing in the stage's second half (the later of equals).
        let half = a + (end - a).div_ceil(2);
        let cut = after[..=lo]
            .iter()
            .copied()
            .filter(|&c| c >= half)
            .min_by_key(|&c| (cross[c], std::cmp::Reverse(c)))
            .unwrap_or(end);
        cuts.push(cut);
        a = cut;
    }
    Ok(cuts)
}

/// A cut that splits stage `a..b` in two of about equal peaks, at the smallest crossing
/// among the cuts near the balance point (the middle half of the stage's cut points around
/// it); `None` if the stage has no place to cut.
fn halve(
    graph: &Graph,
    f: &Facts,
    cands: &[usize],
    cross: &[u64],
    a: usize,
    b: usize,
) -> Result<Option<usize>, SplitError> {
    let inner: Vec<usize> = cands.iter().copied().filter(|&c| c > a && c < b).collect();
    if inner.is_empty() {
        return Ok(None);
    }
    // The first cut whose front part peaks at least as high as its back part.
    let (mut lo, mut hi) = (0, inner.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if stage_peak(graph, f, a, inner[mid])? >= stage_peak(graph, f, inner[mid], b)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let quarter = inner.len() / 4;
    let window = &inner[lo.saturating_sub(quarter)..(lo + quarter + 1).min(inner.len())];
    Ok(window
        .iter()
        .copied()
        .min_by_key(|&c| (cross[c], c.abs_diff(inner[lo])))
        .or(Some(inner[lo])))
}

/// Plan the cuts for `target`.
pub fn plan(graph: &Graph, target: SplitTarget) -> Result<Vec<usize>, SplitError> {
    let f = Facts::of(graph);
    let cands = candidates(&f.rep);
    let cross = crossing_bytes_of(graph, &f);
    match target {
        SplitTarget::Memory(limit) => cuts_for_memory(graph, limit, &cands, &cross, &f),
        SplitTarget::Stages(0) => Err(SplitError::NoStages),
        SplitTarget::Stages(1) => Ok(Vec::new()),
        SplitTarget::Stages(k) => {
            // The smallest limit that needs at most k stages.
            let whole = graph.cost().peak_bytes;
            let (mut lo, mut hi) = (1u64, whole.max(1));
            let mut best = cuts_for_memory(graph, hi, &cands, &cross, &f)?;
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match cuts_for_memory(graph, mid, &cands, &cross, &f) {
                    Ok(cuts) if cuts.len() < k => {
                        best = cuts;
                        hi = mid;
                    }
                    _ => lo = mid + 1,
                }
            }
            // One stage may bound the limit (an embedding table): split the others, the
            // largest first, until there are k stages or no stage has a place to cut.
            while best.len() + 1 < k {
                let n = graph.nodes().len();
                let bounds: Vec<usize> = std::iter::once(0)
                    .chain(best.iter().copied())
                    .chain(std::iter::once(n))
                    .collect();
                let mut order = Vec::new();
                for w in bounds.windows(2) {
                    order.push((stage_peak(graph, &f, w[0], w[1])?, w[0], w[1]));
                }
                order.sort_by_key(|&(peak, ..)| std::cmp::Reverse(peak));
                let Some(cut) = order
                    .iter()
                    .find_map(|&(_, a, b)| halve(graph, &f, &cands, &cross, a, b).transpose())
                    .transpose()?
                else {
                    break;
                };
                best.push(cut);
                best.sort_unstable();
            }
            Ok(best)
        }
    }
}

/// Plan and split.
pub fn split(graph: &Graph, target: SplitTarget) -> Result<Vec<Stage>, SplitError> {
    split_at(graph, &plan(graph, target)?)
}
