//! Writing the canonical binary encoding. Payload per op tag:
//!
//! | op | payload |
//! |---|---|
//! | input | name |
//! | weight | file hash [u8; 32], tensor name |
//! | const | byte length u64, bytes |
//! | unary | op u8, x |
//! | binary | op u8, a, b |
//! | where | cond, a, b |
//! | cast, reshape, expand | x |
//! | reduce | op u8, x, axis count u32, axes u32…, keepdim u8 |
//! | matmul | a, b |
//! | permute | x, count u32, perm u32… |
//! | slice | x, count u32, (start, end, step) u64… |
//! | pad | x, count u32, (before, after) u64…, value bits u64 |
//! | concat | axis u32, count u32, operands u32… |
//! | gather | x, indices, axis u32 |
//! | iota | axis u32 |
//! | tri_mask | upper u8, diagonal i64 |
//! | softmax/log_softmax | op u8, x, axis u32 |
//! | layer_norm | x, option gamma, option beta, eps bits u32 |
//! | rms_norm | x, option gamma, eps bits u32 |
//! | conv2d | x, w, option bias, window, groups u32 |
//! | pools | kind u8, x, kernel u32 × 2, window |
//! | random | distribution u8, key u64 |
//! | dequantize | format u8, x |
//! | qmatmul | format u8, a, w |
//! | qmatmul_q8 | format u8, a, w |
//!
//! Operands are node indices (u32); a format is a `QuantFormat` tag (q4_0 0, q4_1 1, q8_0 2);
//! a window is stride u32 × 2, padding u32 × 4, dilation u32 × 2.

use super::{MAGIC, VERSION, tag};
use crate::graph::Graph;
use crate::op::{NodeId, Op, QDot, Window2d};

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(n as u32);
    }
    fn node(&mut self, n: NodeId) {
        self.u32(n.0);
    }
    fn opt_node(&mut self, n: Option<NodeId>) {
        match n {
            None => self.u8(0),
            Some(n) => {
                self.u8(1);
                self.node(n);
            }
        }
    }
    fn name(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn window(&mut self, w: &Window2d) {
        for v in w.stride.iter().chain(&w.padding).chain(&w.dilation) {
            self.u32(*v);
        }
    }
}

/// The canonical bytes of a validated graph.
pub fn encode(graph: &Graph) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + graph.nodes().len() * 32));
    w.0.extend_from_slice(MAGIC);
    w.0.extend_from_slice(&VERSION.to_le_bytes());
    w.len(graph.nodes().len());
    for node in graph.nodes() {
        w.u8(op_tag(&node.op));
        w.u8(node.ty.dtype.tag());
        w.u8(node.ty.rank() as u8);
        for &d in &node.ty.shape {
            w.u64(d);
        }
        payload(&mut w, &node.op);
    }
    w.len(graph.outputs().len());
    for out in graph.outputs() {
        w.name(&out.name);
        w.node(out.node);
    }
    w.0
}

fn op_tag(op: &Op) -> u8 {
    match op {
        Op::Input { .. } => tag::INPUT,
        Op::Weight { .. } => tag::WEIGHT,
        Op::Constant { .. } => tag::CONSTANT,
        Op::Unary { .. } => tag::UNARY,
        Op::Binary { .. } => tag::BINARY,
        Op::Where { .. } => tag::WHERE,
        Op::Cast { .. } => tag::CAST,
        Op::Reduce { .. } => tag::REDUCE,
        Op::MatMul { .. } => tag::MATMUL,
        Op::Reshape { .. } => tag::RESHAPE,
        Op::Permute { .. } => tag::PERMUTE,
        Op::Expand { .. } => tag::EXPAND,
        Op::Slice { .. } => tag::SLICE,
        Op::Pad { .. } => tag::PAD,
        Op::Concat { .. } => tag::CONCAT,
        Op::Gather { .. } => tag::GATHER,
        Op::Iota { .. } => tag::IOTA,
        Op::TriMask { .. } => tag::TRI_MASK,
        Op::Normalize { .. } => tag::NORMALIZE,
        Op::LayerNorm { .. } => tag::LAYER_NORM,
        Op::RmsNorm { .. } => tag::RMS_NORM,
        Op::Conv2d { .. } => tag::CONV2D,
        Op::Pool2d { .. } => tag::POOL2D,
        Op::Random { .. } => tag::RANDOM,
        Op::Dequantize { .. } => tag::DEQUANTIZE,
        Op::QMatMul { dot: QDot::F32, .. } => tag::QMATMUL,
        Op::QMatMul { dot: QDot::Q8, .. } => tag::QMATMUL_Q8,
    }
}

fn payload(w: &mut Writer, op: &Op) {
    match op {
        Op::Input { name } => w.name(name),
        Op::Weight { file, tensor } => {
            w.0.extend_from_slice(&file.0);
            w.name(tensor);
        }
        Op::Constant { data } => {
            w.u64(data.len() as u64);
            w.0.extend_from_slice(data);
        }
        Op::Unary { op, x } => {
            w.u8(op.tag());
            w.node(*x);
        }
        Op::Binary { op, a, b } => {
            w.u8(op.tag());
            w.node(*a);
            w.node(*b);
        }
        Op::Where { cond, a, b } => {
            w.node(*cond);
            w.node(*a);
            w.node(*b);
        }
        Op::Cast { x } | Op::Reshape { x } | Op::Expand { x } => w.node(*x),
        Op::Reduce {
            op,
            x,
            axes,
            keepdim,
        } => {
            w.u8(op.tag());
            w.node(*x);
            w.len(axes.len());
            axes.iter().for_each(|&a| w.u32(a));
            w.u8(*keepdim as u8);
        }
        Op::MatMul { a, b } => {
            w.node(*a);
            w.node(*b);
        }
        Op::Permute { x, perm } => {
            w.node(*x);
            w.len(perm.len());
            perm.iter().for_each(|&p| w.u32(p));
        }
        Op::Slice { x, ranges } => {
            w.node(*x);
            w.len(ranges.len());
            for r in ranges {
                w.u64(r.start);
                w.u64(r.end);
                w.u64(r.step);
            }
        }
        Op::Pad { x, pads, value } => {
            w.node(*x);
            w.len(pads.len());
            for &(lo, hi) in pads {
                w.u64(lo);
                w.u64(hi);
            }
            w.u64(*value);
        }
        Op::Concat { xs, axis } => {
            w.u32(*axis);
            w.len(xs.len());
            xs.iter().for_each(|&x| w.node(x));
        }
        Op::Gather { x, indices, axis } => {
            w.node(*x);
            w.node(*indices);
            w.u32(*axis);
        }
        Op::Iota { axis } => w.u32(*axis),
        Op::TriMask { upper, diagonal } => {
            w.u8(*upper as u8);
            w.u64(*diagonal as u64);
        }
        Op::Normalize { op, x, axis } => {
            w.u8(op.tag());
            w.node(*x);
            w.u32(*axis);
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            w.node(*x);
            w.opt_node(*gamma);
            w.opt_node(*beta);
            w.u32(*eps_bits);
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            w.node(*x);
            w.opt_node(*gamma);
            w.u32(*eps_bits);
        }
        Op::Conv2d {
            x,
            w: weight,
            bias,
            window,
            groups,
        } => {
            w.node(*x);
            w.node(*weight);
            w.opt_node(*bias);
            w.window(window);
            w.u32(*groups);
        }
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => {
            w.u8(kind.tag());
            w.node(*x);
            w.u32(kernel[0]);
            w.u32(kernel[1]);
            w.window(window);
        }
        Op::Random { dist, key } => {
            w.u8(dist.tag());
            w.u64(*key);
        }
        Op::Dequantize { x, format } => {
            w.u8(format.tag());
            w.node(*x);
        }
        Op::QMatMul {
            a,
            w: weight,
            format,
            dot: _,
        } => {
            w.u8(format.tag());
            w.node(*a);
            w.node(*weight);
        }
    }
}
