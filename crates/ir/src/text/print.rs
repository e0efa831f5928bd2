//! Printing a graph in the canonical text form (see `text/mod.rs` for the grammar).

use std::fmt::Write;

use super::HEADER;
use super::literal::{element_bits, format_bits};
use crate::dtype::{DType, TensorType};
use crate::graph::Graph;
use crate::op::{NodeId, Op, Window2d};

/// The canonical text of `graph`: parsing it gives the same graph, and printing that graph gives
/// this text again, byte for byte.
pub fn print(graph: &Graph) -> String {
    let mut s = String::new();
    s.push_str(HEADER);
    s.push('\n');
    for (i, node) in graph.nodes().iter().enumerate() {
        let _ = write!(s, "%{i} = {}(", node.op.name());
        let mut args = Args::default();
        push_args(&mut args, &node.op, &node.ty);
        s.push_str(&args.0.join(", "));
        let _ = writeln!(s, ") : {}", node.ty);
    }
    for out in graph.outputs() {
        let _ = writeln!(s, "output \"{}\" = {}", out.name, out.node);
    }
    s
}

#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn pos(&mut self, v: impl ToString) {
        self.0.push(v.to_string());
    }
    fn kw(&mut self, k: &str, v: impl std::fmt::Display) {
        self.0.push(format!("{k}={v}"));
    }
    fn kw_list<T: std::fmt::Display>(&mut self, k: &str, v: impl IntoIterator<Item = T>) {
        self.kw(k, list(v));
    }
    fn opt(&mut self, k: &str, v: Option<NodeId>) {
        if let Some(v) = v {
            self.kw(k, v);
        }
    }
    fn window(&mut self, w: &Window2d) {
        self.kw_list("stride", w.stride);
        self.kw_list("padding", w.padding);
        self.kw_list("dilation", w.dilation);
    }
}

fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let parts: Vec<String> = items.into_iter().map(|v| v.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn push_args(a: &mut Args, op: &Op, ty: &TensorType) {
    let dtype = ty.dtype;
    match op {
        Op::Input { name } => a.pos(format!("\"{name}\"")),
        Op::Weight { file, tensor } => {
            a.pos(format!("\"{tensor}\""));
            a.kw("file", format!("\"{file}\""));
        }
        Op::Constant { data } => {
            let n = data.len() / dtype.size() as usize;
            let items = (0..n).map(|i| format_bits(dtype, element_bits(dtype, data, i)));
            // A scalar's shape is [], printed bare; anything else as a flat row-major list.
            a.pos(if ty.rank() == 0 {
                items.collect::<Vec<_>>().concat()
            } else {
                list(items)
            });
        }
        Op::Unary { x, .. } | Op::Cast { x } | Op::Reshape { x } | Op::Expand { x } => a.pos(x),
        Op::Binary { a: l, b: r, .. } | Op::MatMul { a: l, b: r } => {
            a.pos(l);
            a.pos(r);
        }
        Op::Where { cond, a: l, b: r } => {
            a.pos(cond);
            a.pos(l);
            a.pos(r);
        }
        Op::Reduce {
            x, axes, keepdim, ..
        } => {
            a.pos(x);
            a.kw_list("axes", axes);
            a.kw("keepdim", keepdim);
        }
        Op::Permute { x, perm } => {
            a.pos(x);
            a.kw_list("perm", perm);
        }
        Op::Slice { x, ranges } => {
            a.pos(x);
            a.kw_list("start", ranges.iter().map(|r| r.start));
            a.kw_list("end", ranges.iter().map(|r| r.end));
            a.kw_list("step", ranges.iter().map(|r| r.step));
        }
        Op::Pad { x, pads, value } => {
            a.pos(x);
            a.kw_list("before", pads.iter().map(|p| p.0));
            a.kw_list("after", pads.iter().map(|p| p.1));
            a.kw("value", format_bits(dtype, *value));
        }
        Op::Concat { xs, axis } => {
            xs.iter().for_each(|x| a.pos(x));
            a.kw("axis", axis);
        }
        Op::Gather { x, indices, axis } => {
            a.pos(x);
            a.pos(indices);
            a.kw("axis", axis);
        }
        Op::Iota { axis } => a.kw("axis", axis),
        Op::TriMask { upper, diagonal } => {
            a.kw("upper", upper);
            a.kw("diagonal", diagonal);
        }
        Op::Normalize { x, axis, .. } => {
            a.pos(x);
            a.kw("axis", axis);
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            a.pos(x);
            a.opt("gamma", *gamma);
            a.opt("beta", *beta);
            a.kw("eps", format_bits(DType::F32, *eps_bits as u64));
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            a.pos(x);
            a.opt("gamma", *gamma);
            a.kw("eps", format_bits(DType::F32, *eps_bits as u64));
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => {
            a.pos(x);
            a.pos(w);
            a.opt("bias", *bias);
            a.window(window);
            a.kw("groups", groups);
        }
        Op::Pool2d {
            x, kernel, window, ..
        } => {
            a.pos(x);
            a.kw_list("kernel", kernel);
            a.window(window);
        }
        Op::Random { key, .. } => a.kw("key", key),
        Op::Dequantize { x, format } => {
            a.pos(x);
            a.kw("format", format.name());
        }
        Op::QMatMul {
            a: l, w, format, ..
        } => {
            a.pos(l);
            a.pos(w);
            a.kw("format", format.name());
        }
    }
}
