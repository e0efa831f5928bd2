//! The OpenCL C source of the kernel families, assembled from `cl/*.cl`.
//!
//! Kernels are generic: shapes, strides, dtypes and op codes are arguments (the strided views
//! in a per-program meta buffer), so each family is one OpenCL program built once per device
//! and reused by every graph (`OpenClDevice` caches built programs by source text). Op and
//! dtype codes are generated here from the IR's own enums, so the two sides cannot disagree.

use std::fmt::Write;

use tenet_ir::{BinaryOp, Distribution, NormOp, PoolKind, ReduceOp, UnaryOp};

use crate::source::{self, Quirks};

/// A group of kernels built as one OpenCL program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// Elementwise ops, casts, movement, gather and the generated sources.
    Elementwise,
    /// Reductions, softmax and the norms.
    Reduce,
    /// Matrix products, convolution and pooling.
    Linalg,
}

impl Family {
    fn body(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("cl/elementwise.cl"),
            Family::Reduce => include_str!("cl/reduce.cl"),
            Family::Linalg => include_str!("cl/linalg.cl"),
        }
    }

    /// The whole program source: the preamble (pragmas and the project's math library),
    /// op codes, the shared helpers, then this family's kernels.
    pub(crate) fn source(self, quirks: &Quirks) -> String {
        let mut s = source::preamble(quirks);
        s.push_str(&op_codes());
        s.push_str(include_str!("cl/common.cl"));
        s.push_str(self.body());
        s
    }
}

/// `#define U_NEG 0` and so on for every op enum, from the enums' tags.
fn op_codes() -> String {
    let mut s = String::new();
    let mut put = |prefix: &str, name: &str, tag: u8| {
        let _ = writeln!(s, "#define {prefix}_{} {tag}", name.to_ascii_uppercase());
    };
    for op in UnaryOp::ALL {
        put("U", op.name(), op.tag());
    }
    for op in BinaryOp::ALL {
        put("B", op.name(), op.tag());
    }
    for op in ReduceOp::ALL {
        put("R", op.name(), op.tag());
    }
    for op in NormOp::ALL {
        put("N", op.name(), op.tag());
    }
    for op in PoolKind::ALL {
        put("P", op.name(), op.tag());
    }
    for op in Distribution::ALL {
        put("D", op.name(), op.tag());
    }
    s
}
