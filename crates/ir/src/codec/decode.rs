//! Reading the canonical binary encoding from untrusted bytes.
//!
//! Never panics and never allocates what the input merely claims: every count is checked against
//! the bytes actually left (and against `Limits`) before anything is reserved. Every error names
//! the byte offset where the problem starts.

use std::fmt;

use super::{MAGIC, VERSION, tag};
use crate::dtype::{DType, TensorType};
use crate::error::ValidationError;
use crate::graph::{Graph, Limits, Node, Output};
use crate::id::WeightsId;
use crate::infer::MAX_NAME_LEN;
use crate::op::{
    BinaryOp, Distribution, NodeId, NormOp, Op, PoolKind, QDot, QuantFormat, ReduceOp, SliceRange,
    UnaryOp, Window2d,
};

/// Why a byte string is not a valid encoded graph, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("byte {offset}: {kind}")]
pub struct DecodeError {
    /// Offset of the first byte of the offending item.
    pub offset: u64,
    pub kind: DecodeErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeErrorKind {
    /// The file does not start with `TENETGRF`.
    BadMagic,
    /// A version this build does not read.
    UnsupportedVersion(u16),
    /// The input ends inside an item.
    Truncated {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    /// A tag, flag or boolean byte with no meaning.
    BadTag { what: &'static str, value: u64 },
    /// A count above a limit or above what the remaining bytes could hold.
    TooMany {
        what: &'static str,
        count: u64,
        max: u64,
    },
    /// A name that is not valid UTF-8.
    InvalidUtf8,
    /// Bytes after the end of the graph.
    TrailingBytes(u64),
    /// Structurally fine, but the graph breaks a rule of the format.
    Invalid(ValidationError),
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeErrorKind::BadMagic => {
                write!(
                    f,
                    "not a tenet graph (expected magic \"TENETGRF\"; text graphs start with \"tenet graph v1\")"
                )
            }
            DecodeErrorKind::UnsupportedVersion(v) => {
                write!(
                    f,
                    "graph format version {v} is not supported (this build reads version {VERSION})"
                )
            }
            DecodeErrorKind::Truncated {
                what,
                needed,
                available,
            } => {
                write!(
                    f,
                    "truncated {what}: needs {needed} bytes, {available} left"
                )
            }
            DecodeErrorKind::BadTag { what, value } => write!(f, "invalid {what} {value}"),
            DecodeErrorKind::TooMany { what, count, max } => {
                write!(f, "{what} {count} is more than the {max} allowed here")
            }
            DecodeErrorKind::InvalidUtf8 => write!(f, "name is not valid UTF-8"),
            DecodeErrorKind::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the graph"),
            DecodeErrorKind::Invalid(e) => write!(f, "{e}"),
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type R<T> = Result<T, DecodeError>;

impl<'a> Reader<'a> {
    fn err<T>(&self, offset: usize, kind: DecodeErrorKind) -> R<T> {
        Err(DecodeError {
            offset: offset as u64,
            kind,
        })
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> R<&'a [u8]> {
        if n > self.remaining() {
            return self.err(
                self.pos,
                DecodeErrorKind::Truncated {
                    what,
                    needed: n as u64,
                    available: self.remaining() as u64,
                },
            );
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> R<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> R<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> R<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> R<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn bool(&mut self, what: &'static str) -> R<bool> {
        let at = self.pos;
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => self.err(
                at,
                DecodeErrorKind::BadTag {
                    what,
                    value: v as u64,
                },
            ),
        }
    }

    /// A count of items of at least `item_size` bytes each: checked against `max` and against
    /// the bytes left, so that allocating `count` items is always backed by real input.
    fn count(&mut self, what: &'static str, item_size: usize, max: usize) -> R<usize> {
        let at = self.pos;
        let n = self.u32(what)? as usize;
        if n > max {
            let (count, max) = (n as u64, max as u64);
            return self.err(at, DecodeErrorKind::TooMany { what, count, max });
        }
        let needed = n.saturating_mul(item_size.max(1));
        if needed > self.remaining() {
            let (needed, available) = (needed as u64, self.remaining() as u64);
            return self.err(
                at,
                DecodeErrorKind::Truncated {
                    what,
                    needed,
                    available,
                },
            );
        }
        Ok(n)
    }

    /// An operand: must name a node before `current`.
    fn node(&mut self, current: usize) -> R<NodeId> {
        let at = self.pos;
        let n = self.u32("operand")?;
        if n as usize >= current {
            return self.err(
                at,
                DecodeErrorKind::BadTag {
                    what: "operand (must be an earlier node)",
                    value: n as u64,
                },
            );
        }
        Ok(NodeId(n))
    }

    fn opt_node(&mut self, current: usize) -> R<Option<NodeId>> {
        Ok(if self.bool("option flag")? {
            Some(self.node(current)?)
        } else {
            None
        })
    }

    fn name(&mut self, what: &'static str) -> R<String> {
        let n = self.count(what, 1, MAX_NAME_LEN)?;
        let at = self.pos;
        let bytes = self.take(n, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => self.err(at, DecodeErrorKind::InvalidUtf8),
        }
    }

    fn tagged<T>(&mut self, what: &'static str, from: fn(u8) -> Option<T>) -> R<T> {
        let at = self.pos;
        let v = self.u8(what)?;
        match from(v) {
            Some(t) => Ok(t),
            None => self.err(
                at,
                DecodeErrorKind::BadTag {
                    what,
                    value: v as u64,
                },
            ),
        }
    }

    fn u32s(&mut self, what: &'static str, max: usize) -> R<Vec<u32>> {
        let n = self.count(what, 4, max)?;
        (0..n).map(|_| self.u32(what)).collect()
    }

    fn window(&mut self) -> R<Window2d> {
        let mut v = [0u32; 8];
        for x in &mut v {
            *x = self.u32("window parameter")?;
        }
        Ok(Window2d {
            stride: [v[0], v[1]],
            padding: [v[2], v[3], v[4], v[5]],
            dilation: [v[6], v[7]],
        })
    }
}

/// Decode and validate with the default limits.
pub fn decode(bytes: &[u8]) -> Result<Graph, DecodeError> {
    decode_with_limits(bytes, &Limits::default())
}

/// Decode and validate under `limits`.
pub fn decode_with_limits(bytes: &[u8], limits: &Limits) -> Result<Graph, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    if r.take(8, "magic").ok() != Some(&MAGIC[..]) {
        return r.err(0, DecodeErrorKind::BadMagic);
    }
    let version = u16::from_le_bytes(r.array("version")?);
    if version != VERSION {
        return r.err(8, DecodeErrorKind::UnsupportedVersion(version));
    }
    // A node takes at least 3 bytes (tag, dtype, rank).
    let count = r.count("node count", 3, limits.max_nodes)?;
    let mut nodes = Vec::with_capacity(count);
    let mut offsets = Vec::with_capacity(count);
    for i in 0..count {
        offsets.push(r.pos as u64);
        nodes.push(read_node(&mut r, i, limits)?);
    }
    // An output takes at least 8 bytes (name length, node).
    let n_out = r.count("output count", 8, limits.max_outputs)?;
    let mut outputs = Vec::with_capacity(n_out);
    let outputs_at = r.pos as u64;
    for _ in 0..n_out {
        let name = r.name("output name")?;
        let at = r.pos;
        let node = r.u32("output node")?;
        if node as usize >= count {
            return r.err(
                at,
                DecodeErrorKind::BadTag {
                    what: "output node",
                    value: node as u64,
                },
            );
        }
        outputs.push(Output {
            name,
            node: NodeId(node),
        });
    }
    if r.remaining() > 0 {
        return r.err(r.pos, DecodeErrorKind::TrailingBytes(r.remaining() as u64));
    }
    Graph::with_limits(nodes, outputs, limits).map_err(|e| DecodeError {
        offset: e
            .node()
            .and_then(|n| offsets.get(n.index()).copied())
            .unwrap_or(outputs_at),
        kind: DecodeErrorKind::Invalid(e),
    })
}

fn read_node(r: &mut Reader<'_>, i: usize, limits: &Limits) -> R<Node> {
    let op_at = r.pos;
    let op_tag = r.u8("op tag")?;
    let dtype = r.tagged("dtype", DType::from_tag)?;
    let rank_at = r.pos;
    let rank = r.u8("rank")? as usize;
    if rank > limits.max_rank {
        return r.err(
            rank_at,
            DecodeErrorKind::TooMany {
                what: "rank",
                count: rank as u64,
                max: limits.max_rank as u64,
            },
        );
    }
    let shape = (0..rank)
        .map(|_| r.u64("dimension"))
        .collect::<R<Vec<u64>>>()?;
    let ty = TensorType::new(dtype, shape);
    let max_list = limits.max_rank;
    let op = match op_tag {
        tag::INPUT => Op::Input {
            name: r.name("input name")?,
        },
        tag::WEIGHT => Op::Weight {
            file: WeightsId(r.array("weights file hash")?),
            tensor: r.name("weight tensor name")?,
        },
        tag::CONSTANT => {
            let at = r.pos;
            let len = r.u64("constant length")?;
            let max = (limits.max_constant_bytes).min(r.remaining() as u64);
            if len > max {
                return r.err(
                    at,
                    DecodeErrorKind::TooMany {
                        what: "constant length",
                        count: len,
                        max,
                    },
                );
            }
            Op::Constant {
                data: r.take(len as usize, "constant data")?.to_vec(),
            }
        }
        tag::UNARY => Op::Unary {
            op: r.tagged("unary op", UnaryOp::from_tag)?,
            x: r.node(i)?,
        },
        tag::BINARY => Op::Binary {
            op: r.tagged("binary op", BinaryOp::from_tag)?,
            a: r.node(i)?,
            b: r.node(i)?,
        },
        tag::WHERE => Op::Where {
            cond: r.node(i)?,
            a: r.node(i)?,
            b: r.node(i)?,
        },
        tag::CAST => Op::Cast { x: r.node(i)? },
        tag::REDUCE => Op::Reduce {
            op: r.tagged("reduce op", ReduceOp::from_tag)?,
            x: r.node(i)?,
            axes: r.u32s("axis count", max_list)?,
            keepdim: r.bool("keepdim")?,
        },
        tag::MATMUL => Op::MatMul {
            a: r.node(i)?,
            b: r.node(i)?,
        },
        tag::RESHAPE => Op::Reshape { x: r.node(i)? },
        tag::PERMUTE => Op::Permute {
            x: r.node(i)?,
            perm: r.u32s("permutation length", max_list)?,
        },
        tag::EXPAND => Op::Expand { x: r.node(i)? },
        tag::SLICE => {
            let x = r.node(i)?;
            let n = r.count("slice range count", 24, max_list)?;
            let ranges = (0..n)
                .map(|_| {
                    Ok(SliceRange {
                        start: r.u64("slice start")?,
                        end: r.u64("slice end")?,
                        step: r.u64("slice step")?,
                    })
                })
                .collect::<R<Vec<_>>>()?;
            Op::Slice { x, ranges }
        }
        tag::PAD => {
            let x = r.node(i)?;
            let n = r.count("pad count", 16, max_list)?;
            let pads = (0..n)
                .map(|_| Ok((r.u64("pad before")?, r.u64("pad after")?)))
                .collect::<R<Vec<_>>>()?;
            Op::Pad {
                x,
                pads,
                value: r.u64("pad value")?,
            }
        }
        tag::CONCAT => {
            let axis = r.u32("axis")?;
            let n = r.count("concat operand count", 4, limits.max_operands)?;
            let xs = (0..n).map(|_| r.node(i)).collect::<R<Vec<_>>>()?;
            Op::Concat { xs, axis }
        }
        tag::GATHER => Op::Gather {
            x: r.node(i)?,
            indices: r.node(i)?,
            axis: r.u32("axis")?,
        },
        tag::IOTA => Op::Iota {
            axis: r.u32("axis")?,
        },
        tag::TRI_MASK => Op::TriMask {
            upper: r.bool("upper flag")?,
            diagonal: r.u64("diagonal")? as i64,
        },
        tag::NORMALIZE => Op::Normalize {
            op: r.tagged("normalize op", NormOp::from_tag)?,
            x: r.node(i)?,
            axis: r.u32("axis")?,
        },
        tag::LAYER_NORM => Op::LayerNorm {
            x: r.node(i)?,
            gamma: r.opt_node(i)?,
            beta: r.opt_node(i)?,
            eps_bits: r.u32("eps")?,
        },
        tag::RMS_NORM => Op::RmsNorm {
            x: r.node(i)?,
            gamma: r.opt_node(i)?,
            eps_bits: r.u32("eps")?,
        },
        tag::CONV2D => Op::Conv2d {
            x: r.node(i)?,
            w: r.node(i)?,
            bias: r.opt_node(i)?,
            window: r.window()?,
            groups: r.u32("groups")?,
        },
        tag::POOL2D => Op::Pool2d {
            kind: r.tagged("pool kind", PoolKind::from_tag)?,
            x: r.node(i)?,
            kernel: [r.u32("kernel height")?, r.u32("kernel width")?],
            window: r.window()?,
        },
        tag::RANDOM => Op::Random {
            dist: r.tagged("distribution", Distribution::from_tag)?,
            key: r.u64("random key")?,
        },
        tag::DEQUANTIZE => {
            let format = r.tagged("quantisation format", QuantFormat::from_tag)?;
            Op::Dequantize {
                format,
                x: r.node(i)?,
            }
        }
        tag::QMATMUL | tag::QMATMUL_Q8 => {
            let format = r.tagged("quantisation format", QuantFormat::from_tag)?;
            Op::QMatMul {
                format,
                a: r.node(i)?,
                w: r.node(i)?,
                dot: if op_tag == tag::QMATMUL {
                    QDot::F32
                } else {
                    QDot::Q8
                },
            }
        }
        other => {
            return r.err(
                op_at,
                DecodeErrorKind::BadTag {
                    what: "op tag",
                    value: other as u64,
                },
            );
        }
    };
    Ok(Node { op, ty })
}
