//! A validated graph: nodes in execution order plus named outputs.
//!
//! A `Graph` can only be obtained through validation (`Graph::new`), so every `Graph` value obeys
//! the format's rules: operands precede their users (no cycles), each node's declared type is what
//! the op's rules give, sizes stay within `Limits`, names are unique, and every non-input node
//! contributes to an output. The cost certificate is computed during validation.

use std::collections::HashSet;
use std::sync::OnceLock;

use crate::codec;
use crate::cost::{self, Cost};
use crate::dtype::TensorType;
use crate::error::ValidationError;
use crate::id::GraphId;
use crate::infer::{check_name, infer};
use crate::op::{NodeId, Op};

/// One node: an op and its (declared, checked) result type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub op: Op,
    pub ty: TensorType,
}

/// A named result of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    pub name: String,
    pub node: NodeId,
}

/// Limits enforced on every graph, decoded or built. A node applies its own, stricter, memory
/// and FLOP limits to the cost certificate before running anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_nodes: usize,
    pub max_rank: usize,
    pub max_dim: u64,
    pub max_elements: u64,
    pub max_operands: usize,
    pub max_outputs: usize,
    pub max_constant_bytes: u64,
    pub max_total_constant_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_nodes: 1 << 20,
            max_rank: 8,
            max_dim: 1 << 40,
            max_elements: 1 << 40,
            max_operands: 4096,
            max_outputs: 4096,
            max_constant_bytes: 1 << 20,
            max_total_constant_bytes: 64 << 20,
        }
    }
}

/// A validated tenet graph.
#[derive(Clone, Debug)]
pub struct Graph {
    nodes: Vec<Node>,
    outputs: Vec<Output>,
    cost: Cost,
    id: OnceLock<GraphId>,
}

impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.nodes == other.nodes && self.outputs == other.outputs
    }
}

impl Eq for Graph {}

impl Graph {
    /// Validate with the default limits.
    pub fn new(nodes: Vec<Node>, outputs: Vec<Output>) -> Result<Graph, ValidationError> {
        Graph::with_limits(nodes, outputs, &Limits::default())
    }

    pub fn with_limits(
        nodes: Vec<Node>,
        outputs: Vec<Output>,
        limits: &Limits,
    ) -> Result<Graph, ValidationError> {
        validate(&nodes, &outputs, limits)?;
        let cost = cost::certify(&nodes, &outputs)?;
        Ok(Graph {
            nodes,
            outputs,
            cost,
            id: OnceLock::new(),
        })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// The graph inputs in node order: (node, name, type).
    pub fn inputs(&self) -> impl Iterator<Item = (NodeId, &str, &TensorType)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match &n.op {
                Op::Input { name } => Some((NodeId(i as u32), name.as_str(), &n.ty)),
                _ => None,
            })
    }

    /// The weight references in node order: (node, op, type); the op is always `Op::Weight`.
    pub fn weights(&self) -> impl Iterator<Item = (NodeId, &Op, &TensorType)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op, Op::Weight { .. }))
            .map(|(i, n)| (NodeId(i as u32), &n.op, &n.ty))
    }

    /// The static cost certificate (FLOPs, bytes, peak live memory in node order).
    pub fn cost(&self) -> &Cost {
        &self.cost
    }

    /// The canonical binary encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// The graph's id: blake3 of its canonical encoding.
    pub fn id(&self) -> GraphId {
        *self.id.get_or_init(|| GraphId::of_bytes(&self.to_bytes()))
    }

    /// Consume into parts (for transformations that build a new graph).
    pub fn into_parts(self) -> (Vec<Node>, Vec<Output>) {
        (self.nodes, self.outputs)
    }
}

fn limit(what: impl Into<String>, value: u64, limit: u64) -> Result<(), ValidationError> {
    limit_of(|| what.into(), value, limit)
}

/// [`limit`] with the description built only for the error: a graph checks several limits a
/// node, and formatting each description eagerly was a fifth of building a model's graph.
fn limit_of(what: impl FnOnce() -> String, value: u64, limit: u64) -> Result<(), ValidationError> {
    if value > limit {
        Err(ValidationError::Limit {
            what: what(),
            value,
            limit,
        })
    } else {
        Ok(())
    }
}

/// Check one node against the nodes before it. Used by `validate` and by the builder, so both
/// apply exactly the same rules.
pub(crate) fn check_node(
    nodes: &[Node],
    index: usize,
    node: &Node,
    limits: &Limits,
) -> Result<(), ValidationError> {
    let id = NodeId(index as u32);
    let op_name = node.op.name();
    let operands = node.op.operands();
    limit_of(
        || format!("operand count of node {id} ({op_name})"),
        operands.len() as u64,
        limits.max_operands as u64,
    )?;
    for &operand in &operands {
        if operand.index() >= index {
            return Err(ValidationError::ForwardReference {
                node: id,
                op: op_name,
                operand,
            });
        }
    }
    let ty = &node.ty;
    limit_of(
        || format!("rank of node {id}"),
        ty.rank() as u64,
        limits.max_rank as u64,
    )?;
    for &d in &ty.shape {
        limit_of(|| format!("a dimension of node {id}"), d, limits.max_dim)?;
    }
    limit_of(
        || format!("element count of node {id}"),
        ty.numel().unwrap_or(u64::MAX),
        limits.max_elements,
    )?;
    if let Op::Constant { data } = &node.op {
        limit_of(
            || format!("size of constant {id} in bytes"),
            data.len() as u64,
            limits.max_constant_bytes,
        )?;
    }
    let ty_of = |n: NodeId| nodes[n.index()].ty.clone();
    let inferred = infer(&node.op, &ty_of, Some(ty)).map_err(|message| ValidationError::Node {
        node: id,
        op: op_name,
        message,
    })?;
    if &inferred != ty {
        return Err(ValidationError::Node {
            node: id,
            op: op_name,
            message: format!("declared type {ty} but the operands give {inferred}"),
        });
    }
    Ok(())
}

fn validate(nodes: &[Node], outputs: &[Output], limits: &Limits) -> Result<(), ValidationError> {
    limit("node count", nodes.len() as u64, limits.max_nodes as u64)?;
    limit(
        "output count",
        outputs.len() as u64,
        limits.max_outputs as u64,
    )?;
    if outputs.is_empty() {
        return Err(ValidationError::NoOutputs);
    }
    let mut input_names = HashSet::new();
    let mut weight_refs = HashSet::new();
    let mut constant_bytes = 0u64;
    for (i, node) in nodes.iter().enumerate() {
        check_node(nodes, i, node, limits)?;
        match &node.op {
            Op::Input { name } if !input_names.insert(name.as_str()) => {
                return Err(ValidationError::Duplicate {
                    what: "input",
                    name: name.clone(),
                });
            }
            Op::Weight { file, tensor } if !weight_refs.insert((file, tensor.as_str())) => {
                return Err(ValidationError::Duplicate {
                    what: "weight reference",
                    name: format!("{}[{tensor}]", file.short()),
                });
            }
            Op::Constant { data } => constant_bytes += data.len() as u64,
            _ => {}
        }
    }
    limit(
        "total constant bytes",
        constant_bytes,
        limits.max_total_constant_bytes,
    )?;
    let mut output_names = HashSet::new();
    for out in outputs {
        check_name("output name", &out.name).map_err(|message| ValidationError::Output {
            name: out.name.clone(),
            message,
        })?;
        if out.node.index() >= nodes.len() {
            return Err(ValidationError::Output {
                name: out.name.clone(),
                message: format!(
                    "refers to {} but the graph has {} nodes",
                    out.node,
                    nodes.len()
                ),
            });
        }
        if !output_names.insert(out.name.as_str()) {
            return Err(ValidationError::Duplicate {
                what: "output",
                name: out.name.clone(),
            });
        }
    }
    let used = used_nodes(nodes, outputs);
    for (i, node) in nodes.iter().enumerate() {
        if !used[i] && !matches!(node.op, Op::Input { .. }) {
            return Err(ValidationError::Unused {
                node: NodeId(i as u32),
                op: node.op.name(),
            });
        }
    }
    Ok(())
}

/// Which nodes some output depends on.
pub(crate) fn used_nodes(nodes: &[Node], outputs: &[Output]) -> Vec<bool> {
    let mut used = vec![false; nodes.len()];
    for out in outputs {
        if let Some(u) = used.get_mut(out.node.index()) {
            *u = true;
        }
    }
    for i in (0..nodes.len()).rev() {
        if used[i] {
            for operand in nodes[i].op.operands() {
                if let Some(u) = used.get_mut(operand.index()) {
                    *u = true;
                }
            }
        }
    }
    used
}
