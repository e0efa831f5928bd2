//! The cost certificate: what running a graph costs, computed from the graph alone.
//!
//! A node prices or refuses a job from these figures before executing anything. The counting
//! conventions are documented in docs/OPS.md ("Cost certificate"). `peak_bytes` is an upper
//! bound on live tensor memory when nodes run in graph order with no buffer aliasing: graph
//! inputs, weights and constants are live from the start until their last use, every other node
//! from its own step until its last consumer has run, and outputs until the end.

use crate::dtype::TensorType;
use crate::error::ValidationError;
use crate::graph::{Node, Output};
use crate::op::{NormOp, Op};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Floating-point (or integer) operations, by the conventions in docs/OPS.md.
    pub flops: u64,
    /// Bytes read by all computing nodes from their operands.
    pub bytes_read: u64,
    /// Bytes written by all computing nodes.
    pub bytes_written: u64,
    /// Bytes of all weight tensors referenced.
    pub weight_bytes: u64,
    /// Bytes of all graph inputs.
    pub input_bytes: u64,
    /// Bytes of all graph outputs (each named output counted once).
    pub output_bytes: u64,
    /// Bytes of literal constants.
    pub constant_bytes: u64,
    /// Peak live tensor bytes in graph order (see the module doc).
    pub peak_bytes: u64,
}

fn bytes(t: &TensorType) -> u128 {
    t.bytes().unwrap_or(u64::MAX) as u128
}

fn numel(t: &TensorType) -> u128 {
    t.numel().unwrap_or(u64::MAX) as u128
}

/// Product that saturates instead of overflowing (limits keep real graphs far below).
fn mul(factors: &[u128]) -> u128 {
    factors.iter().fold(1u128, |acc, &f| acc.saturating_mul(f))
}

/// FLOPs of one node given its operands' types.
fn node_flops(node: &Node, operand_types: &[&TensorType]) -> u128 {
    let out = numel(&node.ty);
    match &node.op {
        Op::Input { .. } | Op::Weight { .. } | Op::Constant { .. } => 0,
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where { .. }
        | Op::Random { .. }
        | Op::Dequantize { .. } => out,
        Op::Reduce { .. } => numel(operand_types[0]),
        Op::MatMul { .. } | Op::QMatMul { .. } => {
            let a = operand_types[0];
            mul(&[2, out, a.shape[a.rank() - 1] as u128])
        }
        Op::Cast { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Expand { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::Gather { .. }
        | Op::Iota { .. }
        | Op::TriMask { .. } => 0,
        Op::Normalize { op, .. } => match op {
            NormOp::Softmax => mul(&[4, out]),
            NormOp::LogSoftmax => mul(&[5, out]),
        },
        Op::LayerNorm { gamma, beta, .. } => {
            mul(&[6 + gamma.is_some() as u128 + beta.is_some() as u128, out])
        }
        Op::RmsNorm { gamma, .. } => mul(&[4 + gamma.is_some() as u128, out]),
        Op::Conv2d { bias, .. } => {
            let w = operand_types[1];
            let per_out = mul(&[w.shape[1] as u128, w.shape[2] as u128, w.shape[3] as u128]);
            mul(&[2, out, per_out]).saturating_add(if bias.is_some() { out } else { 0 })
        }
        Op::Pool2d { kernel, .. } => mul(&[out, kernel[0] as u128, kernel[1] as u128]),
    }
}

fn fit(what: &str, v: u128) -> Result<u64, ValidationError> {
    u64::try_from(v).map_err(|_| ValidationError::Limit {
        what: what.to_string(),
        value: u64::MAX,
        limit: u64::MAX,
    })
}

/// Compute the certificate of validated nodes. Fails only if a figure overflows 64 bits.
pub(crate) fn certify(nodes: &[Node], outputs: &[Output]) -> Result<Cost, ValidationError> {
    let n = nodes.len();
    // Step at which each node's buffer may be released: its last consumer, or `n` for outputs.
    let mut last_use = vec![0usize; n];
    let (mut flops, mut read, mut written) = (0u128, 0u128, 0u128);
    let (mut weights, mut inputs, mut constants) = (0u128, 0u128, 0u128);
    for (i, node) in nodes.iter().enumerate() {
        let operands = node.op.operands();
        let types: Vec<&TensorType> = operands.iter().map(|o| &nodes[o.index()].ty).collect();
        flops = flops.saturating_add(node_flops(node, &types));
        match node.op {
            Op::Input { .. } => inputs += bytes(&node.ty),
            Op::Weight { .. } => weights += bytes(&node.ty),
            Op::Constant { .. } => constants += bytes(&node.ty),
            _ => {
                let operand_bytes = types
                    .iter()
                    .fold(0u128, |acc, t| acc.saturating_add(bytes(t)));
                read = read.saturating_add(operand_bytes);
                written = written.saturating_add(bytes(&node.ty));
            }
        }
        for o in operands {
            last_use[o.index()] = i;
        }
    }
    let mut output_bytes = 0u128;
    let mut counted = vec![false; n];
    for out in outputs {
        last_use[out.node.index()] = n;
        if !std::mem::replace(&mut counted[out.node.index()], true) {
            output_bytes += bytes(&nodes[out.node.index()].ty);
        }
    }
    // Sweep live intervals [start, last_use] over steps 0..=n.
    let mut delta = vec![0i128; n + 2];
    for (i, node) in nodes.iter().enumerate() {
        let start = if node.op.is_source() { 0 } else { i };
        let end = last_use[i].max(start);
        let b = bytes(&node.ty) as i128;
        delta[start] += b;
        delta[end + 1] -= b;
    }
    let (mut live, mut peak) = (0i128, 0i128);
    for d in &delta[..=n] {
        live += d;
        peak = peak.max(live);
    }
    Ok(Cost {
        flops: fit("FLOP count", flops)?,
        bytes_read: fit("bytes read", read)?,
        bytes_written: fit("bytes written", written)?,
        weight_bytes: fit("weight bytes", weights)?,
        input_bytes: fit("input bytes", inputs)?,
        output_bytes: fit("output bytes", output_bytes)?,
        constant_bytes: fit("constant bytes", constants)?,
        peak_bytes: fit("peak bytes", peak as u128)?,
    })
}
