//! Typed errors of the `ir` crate. Every message says what is wrong and where.

use crate::op::NodeId;

/// A graph that breaks a rule of the format: a type rule, a limit, or a structural rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// An op's shape or dtype rule, or a mismatch with the node's declared type.
    #[error("node {node} ({op}): {message}")]
    Node {
        node: NodeId,
        op: &'static str,
        message: String,
    },
    /// An operand that is not an earlier node (this is what rules out cycles).
    #[error("node {node} ({op}): operand {operand} is not an earlier node")]
    ForwardReference {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// A size or count above the configured limits.
    #[error("{what} is {value}, above the limit of {limit}")]
    Limit {
        what: String,
        value: u64,
        limit: u64,
    },
    /// A node whose result no output uses (inputs may be unused; nothing else may).
    #[error("node {node} ({op}) is never used by any output; remove it")]
    Unused { node: NodeId, op: &'static str },
    /// Two inputs, two outputs or two weight references with the same name.
    #[error("{what} {name:?} appears twice")]
    Duplicate { what: &'static str, name: String },
    /// An output entry that is malformed.
    #[error("output {name:?}: {message}")]
    Output { name: String, message: String },
    #[error("a graph needs at least one output")]
    NoOutputs,
}

impl ValidationError {
    /// The node the error is about, if it is about one node.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            ValidationError::Node { node, .. }
            | ValidationError::ForwardReference { node, .. }
            | ValidationError::Unused { node, .. } => Some(*node),
            _ => None,
        }
    }
}
