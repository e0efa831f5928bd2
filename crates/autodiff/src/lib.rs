//! `tenet-autodiff`: reverse-mode automatic differentiation as a graph transform.
//!
//! The gradient of a tenet graph is another tenet graph, built from the same closed op set, so it
//! runs on every backend, has a cost certificate, and its bits are defined by the reference
//! interpreter like any graph's: nodes that compute the same gradient agree bit for bit, which
//! is what verified training rests on. Nothing here adds an op.
//!
//! Two entry points:
//! - [`gradients`]: inside a [`GraphBuilder`], the tensors holding `d loss / d x` for each `x`
//!   of `wrt`, appended to the same builder (how a training step is built: the loss, its
//!   gradients and the optimizer's update in one graph);
//! - [`grad`]: a finished graph, a scalar output and input names in, a graph out whose outputs
//!   are the original ones plus `grad/<input>` for each input named.
//!
//! Every op of the set whose result is f32 has a rule (`rules.rs`); the points where an op has no
//! derivative get the documented choice below, the same one on every machine:
//! - `relu` at 0, `abs` at 0, `sign`, `floor`, `ceil`, `round`: gradient 0;
//! - `max`/`min` of two operands when they tie: half to each;
//! - `reduce_max`/`reduce_min`: shared equally among the tied maxima (minima);
//! - `max_pool2d`: all to the first maximum of the window (in `kh`, then `kw` order), as the
//!   reference picks it;
//! - `pow(a, b)` with respect to `b` where `a <= 0`: 0 (the real logarithm does not exist);
//! - `gather` with repeated indices: the gradients of the repeats are summed;
//! - comparisons, `argmax`/`argmin`, casts to integers, `random_*`, `iota` and quantised
//!   weights carry no gradient.
//!
//! Gradients flow through f32 values only; an f16/bf16 value on the path from `wrt` to the
//! loss is refused (cast to f32 first), so that no storage rounding hides inside a gradient.

mod rules;
mod shape;

use std::collections::HashMap;

use tenet_ir::{BuildError, DType, Graph, GraphBuilder, NodeId, Op, Tensor};

/// Why a gradient could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GradError {
    #[error("the loss must be a scalar f32, got {0}; reduce it first (e.g. `.mean(&[0], false)`)")]
    LossNotScalar(String),
    #[error("the graph has no output named {0:?} (outputs: {1})")]
    NoSuchOutput(String, String),
    #[error("the graph has no input named {0:?} (inputs: {1})")]
    NoSuchInput(String, String),
    #[error("cannot differentiate with respect to {name:?}: it is {ty}, gradients need f32")]
    NotF32 { name: String, ty: String },
    #[error(
        "{op} at {node} computes {ty} on the path from the variables to the loss; gradients flow through f32 only: cast to f32 before it"
    )]
    NotDifferentiable {
        op: &'static str,
        node: String,
        ty: String,
    },
    #[error("the tensors come from different graph builders")]
    ForeignTensor,
    #[error("building the gradient graph: {0}")]
    Build(#[from] BuildError),
}

/// `d loss / d x` for each `x` of `wrt`, appended to the builder `loss` belongs to. `loss` must
/// be a scalar f32; each `x` an f32 tensor of the same builder. A variable the loss does not
/// depend on gets zeros.
pub fn gradients(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>, GradError> {
    Ok(gradients_marked(loss, wrt, &[])?.0)
}

/// [`gradients`], and for each tensor of `marks` (of the same builder, computed before the loss)
/// where the backward pass reached it: the builder's length at that moment. Every node appended
/// before that position belongs to the backward rules of nodes after the mark, every node from
/// it on to the rules of the mark and the nodes before it — so for a mark that separates two
/// groups of layers, cutting the forward pass before the mark and the backward pass at its
/// position gives each group its forward and its backward as runs of consecutive nodes (how a
/// training step is cut into pipeline stages). The gradients are the same nodes, in the same
/// order, as [`gradients`] builds.
pub fn gradients_marked(
    loss: &Tensor,
    wrt: &[&Tensor],
    marks: &[&Tensor],
) -> Result<(Vec<Tensor>, Vec<usize>), GradError> {
    let b = loss.builder();
    for m in marks {
        if !b.owns(m) {
            return Err(GradError::ForeignTensor);
        }
    }
    // A mark after the loss is reached before the pass starts.
    let mut positions = vec![b.len(); marks.len()];
    if let Some(e) = b.error() {
        return Err(e.into());
    }
    if loss.dtype() != DType::F32 || loss.rank() != 0 {
        return Err(GradError::LossNotScalar(loss.ty().to_string()));
    }
    for x in wrt {
        if !b.owns(x) {
            return Err(GradError::ForeignTensor);
        }
        if x.dtype() != DType::F32 {
            return Err(GradError::NotF32 {
                name: x.id().to_string(),
                ty: x.ty().to_string(),
            });
        }
    }
    let count = loss.id().index() + 1;
    let ops: Vec<(Op, Tensor)> = (0..count)
        .map(|i| b.lookup(NodeId(i as u32)).expect("node below the loss"))
        .collect();

    // Nodes the variables reach through floating-point values, and of those, the ones the
    // loss needs.
    let mut varies = vec![false; count];
    for x in wrt {
        // A variable made after the loss cannot reach it: its gradient is zeros.
        if let Some(v) = varies.get_mut(x.id().index()) {
            *v = true;
        }
    }
    for (i, (op, t)) in ops.iter().enumerate() {
        if !varies[i] && op.operands().iter().any(|n| varies[n.index()]) {
            varies[i] = t.dtype().is_float() && rules::carries_gradient(op);
        }
    }
    let mut needed = vec![false; count];
    needed[count - 1] = varies[count - 1];
    for i in (0..count).rev() {
        if needed[i] {
            let (op, t) = &ops[i];
            if t.dtype() != DType::F32 {
                return Err(GradError::NotDifferentiable {
                    op: op.name(),
                    node: t.id().to_string(),
                    ty: t.ty().to_string(),
                });
            }
            for n in op.operands() {
                needed[n.index()] |= varies[n.index()];
            }
        }
    }

    // Adjoints, accumulated in reverse node order: the same program builds the same graph.
    let mut adjoint: HashMap<usize, Tensor> = HashMap::new();
    if needed[count - 1] {
        adjoint.insert(count - 1, b.scalar(DType::F32, 1.0));
    }
    for i in (0..count).rev() {
        for (m, mark) in marks.iter().enumerate() {
            if mark.id().index() == i {
                positions[m] = b.len();
            }
        }
        if !needed[i] {
            continue;
        }
        let Some(g) = adjoint.remove(&i) else {
            continue;
        };
        // The variables keep their adjoint for the caller.
        if wrt.iter().any(|x| x.id().index() == i) {
            adjoint.insert(i, g.clone());
        }
        let (op, y) = &ops[i];
        let operand = |n: NodeId| ops[n.index()].1.clone();
        let wanted = |n: NodeId| needed[n.index()];
        for (n, contribution) in rules::backward(op, y, &g, &operand, &wanted) {
            debug_assert!(needed[n.index()]);
            let slot = n.index();
            let sum = match adjoint.remove(&slot) {
                Some(acc) => acc + contribution,
                None => contribution,
            };
            adjoint.insert(slot, sum);
        }
    }
    let grads = wrt
        .iter()
        .map(|x| match adjoint.get(&x.id().index()) {
            Some(g) => g.clone(),
            None => b.scalar(DType::F32, 0.0).expand(x.shape()),
        })
        .collect();
    if let Some(e) = b.error() {
        return Err(e.into());
    }
    Ok((grads, positions))
}

/// The graph `graph` extended with the gradient of its scalar f32 output `loss` with respect
/// to each input named in `wrt`: its outputs are the original ones, then `grad/<name>` for each
/// name of `wrt`, in that order.
pub fn grad(graph: &Graph, loss: &str, wrt: &[&str]) -> Result<Graph, GradError> {
    let (b, tensors) = GraphBuilder::from_graph(graph);
    let names = |it: &mut dyn Iterator<Item = String>| it.collect::<Vec<_>>().join(", ");
    let loss_node = graph
        .outputs()
        .iter()
        .find(|o| o.name == loss)
        .ok_or_else(|| {
            GradError::NoSuchOutput(
                loss.to_string(),
                names(&mut graph.outputs().iter().map(|o| o.name.clone())),
            )
        })?
        .node;
    let mut vars = Vec::with_capacity(wrt.len());
    for name in wrt {
        let (node, _, _) = graph.inputs().find(|(_, n, _)| n == name).ok_or_else(|| {
            GradError::NoSuchInput(
                name.to_string(),
                names(&mut graph.inputs().map(|(_, n, _)| n.to_string())),
            )
        })?;
        if tensors[node.index()].dtype() != DType::F32 {
            return Err(GradError::NotF32 {
                name: name.to_string(),
                ty: tensors[node.index()].ty().to_string(),
            });
        }
        vars.push(&tensors[node.index()]);
    }
    let grads = gradients(&tensors[loss_node.index()], &vars)?;
    let mut outputs: Vec<(String, &Tensor)> = graph
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), &tensors[o.node.index()]))
        .collect();
    for (name, g) in wrt.iter().zip(&grads) {
        outputs.push((format!("grad/{name}"), g));
    }
    let refs: Vec<(&str, &Tensor)> = outputs.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    Ok(b.finish(&refs)?)
}
