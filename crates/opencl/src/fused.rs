//! Fused elementwise chains: OpenCL C generated for a run of f32 elementwise nodes of one
//! shape whose intermediates nothing outside the run reads (`tenet_exec::Schedule::
//! elementwise_group`, with [`fusable`] as its predicate, as the CPU backend fuses them).
//! One kernel per chain: each work item loads every external operand once per element
//! (through the broadcasting strides of a meta view), evaluates the chain in registers and
//! stores only the last member's value; the intermediates never reach memory.
//!
//! Why the bits are the unfused kernels': each member is computed by the same library
//! function the unfused kernel calls (`tn_unary`, `tn_binary`; `neg` and `abs` as the same
//! sign-bit operations on the bit pattern), on the same values: an unfused f32 op stores its
//! result after `tn_canonical` (any NaN made the canonical one) and nothing else (f32 stores
//! round nothing), so every generated member is followed by `tn_canonical` too, except `neg`
//! and `abs`, which the unfused kernel stores as the bits it made (a NaN's payload kept).
//! External operands are read as the raw bits the unfused kernel would read.
//!
//! Source and builds: op codes and the chain's structure (which operand each member reads) are
//! the kernel's text; shapes and strides are arguments. A graph's distinct chains become one
//! program, cached by its text on the device (so graphs with the same chains, such as a model
//! at another length, build nothing), and the device builds a bounded number of such programs
//! (`MAX_FUSED_PROGRAMS`); past that bound, or for a chain longer than [`MAX_MEMBERS`] or
//! with more than [`MAX_EXTERNALS`] operands, nodes run unfused.

use std::fmt::Write;

use tenet_ir::{BinaryOp, DType, Graph, NodeId, Op, UnaryOp};

/// The most members one fused kernel evaluates (longer runs are cut into several groups).
pub(crate) const MAX_MEMBERS: usize = 32;
/// The most distinct external operands (kernel arguments) of one fused kernel.
pub(crate) const MAX_EXTERNALS: usize = 12;

/// An f32 elementwise node the generated kernels implement (the CPU backend's `fusable`).
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

/// Where a member's operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// The kernel's external operand `k` (`x{k}`).
    External(usize),
    /// An earlier member's value (`v{j}`).
    Member(usize),
}

/// One fused group: its members (graph order) and its external operands (first use first).
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    pub members: Vec<NodeId>,
    pub externals: Vec<NodeId>,
}

impl Chain {
    /// The chain of nodes `members` (consecutive, each fusable), or `None` when it is too big
    /// to generate.
    pub(crate) fn new(graph: &Graph, members: Vec<NodeId>) -> Option<Chain> {
        if members.len() > MAX_MEMBERS {
            return None;
        }
        let mut externals: Vec<NodeId> = Vec::new();
        for m in &members {
            for o in graph.node(*m).op.operands() {
                if !members.contains(&o) && !externals.contains(&o) {
                    externals.push(o);
                }
            }
        }
        (externals.len() <= MAX_EXTERNALS).then_some(Chain { members, externals })
    }

    fn operand(&self, x: NodeId) -> Operand {
        match self.members.iter().position(|&m| m == x) {
            Some(j) => Operand::Member(j),
            None => Operand::External(
                self.externals
                    .iter()
                    .position(|&e| e == x)
                    .expect("every operand is a member or an external"),
            ),
        }
    }

    /// The kernel's OpenCL C, named `name`. Arguments: the result, the external operands
    /// (f32 bits), the element count, the meta buffer and the offset of a view of the
    /// externals over the group's shape.
    pub(crate) fn kernel(&self, graph: &Graph, name: &str) -> String {
        let e = self.externals.len();
        let mut s = format!("kernel void {name}(global uint* out");
        for k in 0..e {
            let _ = write!(s, ", global const uint* x{k}");
        }
        s.push_str(", ulong n, global const long* meta, uint mo) {\n");
        s.push_str("    global const long* m = meta + mo;\n    const int r = (int)m[0];\n");
        // Views of rank 0 or 1 (every contiguous or scalar-broadcast chain, once merged):
        // each operand's offset is base + i · stride, read from meta once.
        s.push_str("    if (r <= 1) {\n");
        for k in 0..e {
            let _ = writeln!(
                s,
                "        const ulong b{k} = (ulong)m[1 + r + {k} * (r + 1)], \
                 s{k} = r == 1 ? (ulong)m[2 + r + {k} * (r + 1)] : 0;"
            );
        }
        s.push_str("        FOR_EACH(i, n) {\n");
        for k in 0..e {
            let _ = writeln!(
                s,
                "            const float e{k} = as_float(x{k}[b{k} + i * s{k}]);"
            );
        }
        self.body(graph, &mut s, "            ");
        s.push_str("        }\n        return;\n    }\n    FOR_EACH(i, n) {\n");
        let _ = writeln!(
            s,
            "        ulong off[{e}];\n        view_offsets(m, i, {e}, off);"
        );
        for k in 0..e {
            let _ = writeln!(s, "        const float e{k} = as_float(x{k}[off[{k}]]);");
        }
        self.body(graph, &mut s, "        ");
        s.push_str("    }\n}\n");
        s
    }

    /// The members' values `v0, v1, …` from `e0, e1, …`, and the store of the last.
    fn body(&self, graph: &Graph, s: &mut String, indent: &str) {
        let val = |o: Operand| match o {
            Operand::External(k) => format!("e{k}"),
            Operand::Member(j) => format!("v{j}"),
        };
        for (j, m) in self.members.iter().enumerate() {
            let expr = match &graph.node(*m).op {
                Op::Unary {
                    op: UnaryOp::Neg,
                    x,
                } => format!("as_float(as_uint({}) ^ 0x80000000u)", val(self.operand(*x))),
                Op::Unary {
                    op: UnaryOp::Abs,
                    x,
                } => format!("as_float(as_uint({}) & 0x7fffffffu)", val(self.operand(*x))),
                Op::Unary { op, x } => format!(
                    "tn_canonical(tn_unary(U_{}, {}))",
                    op.name().to_ascii_uppercase(),
                    val(self.operand(*x))
                ),
                Op::Binary { op, a, b } => format!(
                    "tn_canonical(tn_binary(B_{}, {}, {}))",
                    binary_name(*op),
                    val(self.operand(*a)),
                    val(self.operand(*b))
                ),
                op => unreachable!("{} is not fusable", op.name()),
            };
            let _ = writeln!(s, "{indent}const float v{j} = {expr};");
        }
        let _ = writeln!(s, "{indent}out[i] = as_uint(v{});", self.members.len() - 1);
    }
}

fn binary_name(op: BinaryOp) -> String {
    op.name().to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_ir::{DType, GraphBuilder};

    #[test]
    fn a_chain_loads_each_external_once_and_stores_only_its_end() {
        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, &[4, 3]);
        let y = g.input("y", DType::F32, &[3]);
        let t = (&(&x * &y) + &x).neg().exp();
        let graph = g.finish(&[("t", &t)]).unwrap();
        let members: Vec<NodeId> = (2..6).map(NodeId).collect();
        let chain = Chain::new(&graph, members).unwrap();
        assert_eq!(chain.externals, [NodeId(0), NodeId(1)]);
        let src = chain.kernel(&graph, "k_f");
        // Each external read once per element, in each of the two loops (rank <= 1, any).
        assert_eq!(src.matches("as_float(x").count(), 4);
        assert!(src.contains("const float v0 = tn_canonical(tn_binary(B_MUL, e0, e1));"));
        assert!(src.contains("const float v1 = tn_canonical(tn_binary(B_ADD, v0, e0));"));
        assert!(src.contains("const float v2 = as_float(as_uint(v1) ^ 0x80000000u);"));
        assert!(src.contains("const float v3 = tn_canonical(tn_unary(U_EXP, v2));"));
        assert_eq!(src.matches("out[i] = as_uint(v3);").count(), 2);
    }
}
