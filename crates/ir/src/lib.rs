//! `tenet-ir`: the tenet graph.
//!
//! A graph is a closed, statically typed tensor program: named inputs, weights referenced by the
//! content hash of their safetensors file, and named outputs, over a fixed op set (`Op`). It is
//! validated on construction, priced by a static cost certificate (`Cost`), encoded canonically
//! (`codec`), named by the blake3 hash of that encoding (`GraphId`), and readable and writable as
//! text (`text`). Graphs are built from Rust with `GraphBuilder` or from text with
//! `text::parse`, or decoded from bytes a stranger sent with `codec::decode`.
//!
//! This crate performs no I/O and knows nothing of execution, networks or files.

mod builder;
pub mod codec;
mod cost;
mod dtype;
mod error;
mod graph;
mod id;
mod infer;
mod op;
pub mod recycle;
pub mod split;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
mod value;

pub use builder::{BuildError, GraphBuilder, Tensor};
pub use cost::Cost;
pub use dtype::{DType, TensorType, numel};
pub use error::ValidationError;
pub use graph::{Graph, Limits, Node, Output};
pub use id::{GraphId, WeightsId};
pub use infer::{MAX_NAME_LEN, RuleError, broadcast, check_name, infer};
pub use op::{
    BinaryOp, Distribution, NodeId, NormOp, Op, PoolKind, QDot, QuantFormat, ReduceOp, SliceRange,
    UnaryOp, Window2d,
};
pub use value::{HostTensor, NoWeights, SharedBytes, ValueError, WeightSource};

/// Decode a graph from bytes in either form: the binary encoding (starts with `TENETGRF`) or
/// the text form. Errors say which form was assumed.
pub fn decode_any(bytes: &[u8]) -> Result<Graph, AnyDecodeError> {
    if bytes.starts_with(codec::MAGIC) {
        return codec::decode(bytes).map_err(AnyDecodeError::Binary);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| AnyDecodeError::NotText {
        offset: e.valid_up_to() as u64,
    })?;
    text::parse(text).map_err(AnyDecodeError::Text)
}

/// Why `decode_any` refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnyDecodeError {
    #[error("binary graph, {0}")]
    Binary(codec::DecodeError),
    #[error("text graph, {0}")]
    Text(text::ParseError),
    #[error(
        "neither a binary graph (no TENETGRF magic) nor UTF-8 text (invalid byte at offset {offset})"
    )]
    NotText { offset: u64 },
}
