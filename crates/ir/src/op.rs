//! The closed op set of a tenet graph.
//!
//! Every op's shape rule, dtype rule and arithmetic order is specified in docs/OPS.md; the shape
//! and dtype rules are implemented once, in `infer.rs`. Ops whose result type cannot be derived
//! from their operands (inputs, weights, constants, cast, reshape, expand, iota, tri_mask,
//! random) take it from the node's declared type.

use crate::id::WeightsId;

/// Index of a node in its graph. Operands always refer to earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "%{}", self.0)
    }
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The op's name in the text form.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn from_name(name: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }

            /// Tag byte in the binary encoding (position in `ALL`).
            pub fn tag(self) -> u8 {
                self as u8
            }

            pub fn from_tag(tag: u8) -> Option<$name> {
                Self::ALL.get(tag as usize).copied()
            }
        }
    };
}

named_enum! {
    /// Elementwise ops of one operand.
    UnaryOp {
        Neg = "neg", Abs = "abs", Exp = "exp", Log = "log", Sqrt = "sqrt", Rsqrt = "rsqrt",
        Reciprocal = "reciprocal", Sin = "sin", Cos = "cos", Tanh = "tanh", Sigmoid = "sigmoid",
        Relu = "relu", GeluErf = "gelu_erf", GeluTanh = "gelu_tanh", Erf = "erf",
        Floor = "floor", Ceil = "ceil", Round = "round", Sign = "sign", Not = "not",
    }
}

named_enum! {
    /// Elementwise ops of two operands, with numpy broadcasting.
    BinaryOp {
        Add = "add", Sub = "sub", Mul = "mul", Div = "div", Pow = "pow", Max = "max",
        Min = "min", Eq = "eq", Ne = "ne", Lt = "lt", Le = "le", Gt = "gt", Ge = "ge",
        And = "and", Or = "or",
    }
}

named_enum! {
    /// Reductions over any set of axes.
    ReduceOp {
        Sum = "sum", Mean = "mean", Max = "reduce_max", Min = "reduce_min",
        ArgMax = "argmax", ArgMin = "argmin",
    }
}

named_enum! {
    /// Ops normalising along one axis.
    NormOp {
        Softmax = "softmax", LogSoftmax = "log_softmax",
    }
}

named_enum! {
    /// 2-D pooling kinds.
    PoolKind {
        Max = "max_pool2d", Avg = "avg_pool2d", AvgIncludePad = "avg_pool2d_include_pad",
    }
}

named_enum! {
    /// Distributions of the counter-based random op.
    Distribution {
        Uniform = "random_uniform", Normal = "random_normal",
    }
}

named_enum! {
    /// How a `qmatmul` multiplies (docs/OPS.md, "Quantised weights"): `qmatmul` (`F32`) is
    /// the f32 matmul with the dequantised weight, bit for bit; `qmatmul_q8` (`Q8`) first
    /// rounds each 32-value block of the activations to 8-bit integers with an f32 scale and
    /// takes exact integer dot products with the weight's integer blocks, combined in f32 in
    /// block order — llama.cpp's arithmetic (what byte dot-product instructions compute), and
    /// its own bits.
    QDot {
        F32 = "qmatmul", Q8 = "qmatmul_q8",
    }
}

named_enum! {
    /// Block formats of quantised weights (GGUF's), the `format=` of `dequantize` and
    /// `qmatmul`. A quantised tensor is a `u8` tensor `[..., nb, block_bytes]` holding the
    /// file's blocks verbatim, each block [`QuantFormat::BLOCK`] elements along the logical
    /// last axis (docs/OPS.md, "Quantised weights").
    QuantFormat {
        Q4_0 = "q4_0", Q4_1 = "q4_1", Q8_0 = "q8_0",
    }
}

impl QuantFormat {
    /// Elements per block.
    pub const BLOCK: u64 = 32;

    /// Bytes per block: Q4_0 an f16 scale and 16 bytes of nibbles; Q4_1 an f16 scale, an f16
    /// minimum and 16 bytes of nibbles; Q8_0 an f16 scale and 32 signed bytes.
    pub fn block_bytes(self) -> u64 {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q8_0 => 34,
        }
    }
}

impl UnaryOp {
    /// True for ops that are only defined on floating-point operands.
    pub fn float_only(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Exp | Log
                | Sqrt
                | Rsqrt
                | Reciprocal
                | Sin
                | Cos
                | Tanh
                | Sigmoid
                | GeluErf
                | GeluTanh
                | Erf
                | Floor
                | Ceil
                | Round
        )
    }
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

/// One axis of a slice: elements `start, start+step, ...` below `end`.
/// Canonical: `start <= end <= dim`, `step >= 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceRange {
    pub start: u64,
    pub end: u64,
    pub step: u64,
}

impl SliceRange {
    /// Number of elements this range selects (assumes a valid range).
    pub fn len(&self) -> u64 {
        if self.end <= self.start || self.step == 0 {
            0
        } else {
            (self.end - self.start).div_ceil(self.step)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Geometry shared by conv2d and the 2-D pools. Padding is `[top, left, bottom, right]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window2d {
    pub stride: [u32; 2],
    pub padding: [u32; 4],
    pub dilation: [u32; 2],
}

/// One node's operation. Operands are earlier nodes; attributes are part of the op and of the
/// graph's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A named graph input supplied by the caller; its type is the node's declared type.
    Input {
        name: String,
    },
    /// Tensor `tensor` of the safetensors file whose blake3 hash is `file`.
    Weight {
        file: WeightsId,
        tensor: String,
    },
    /// A literal tensor: little-endian element bytes in row-major order (`bool` as 0/1 bytes).
    Constant {
        data: Vec<u8>,
    },
    Unary {
        op: UnaryOp,
        x: NodeId,
    },
    Binary {
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
    },
    /// `cond ? a : b` elementwise, all three broadcast together.
    Where {
        cond: NodeId,
        a: NodeId,
        b: NodeId,
    },
    /// Convert to the node's declared dtype (same shape).
    Cast {
        x: NodeId,
    },
    /// Reduce over `axes` (strictly increasing, at least one).
    Reduce {
        op: ReduceOp,
        x: NodeId,
        axes: Vec<u32>,
        keepdim: bool,
    },
    /// Batched matrix product `[..., m, k] @ [..., k, n]`, batch dims broadcast.
    MatMul {
        a: NodeId,
        b: NodeId,
    },
    /// Same elements in row-major order, the node's declared shape.
    Reshape {
        x: NodeId,
    },
    Permute {
        x: NodeId,
        perm: Vec<u32>,
    },
    /// Broadcast to the node's declared shape by numpy rules.
    Expand {
        x: NodeId,
    },
    Slice {
        x: NodeId,
        ranges: Vec<SliceRange>,
    },
    /// Constant padding: `pads[axis] = (before, after)`; `value` holds the fill value's bits in
    /// the operand's dtype, zero-extended to 64 bits.
    Pad {
        x: NodeId,
        pads: Vec<(u64, u64)>,
        value: u64,
    },
    Concat {
        xs: Vec<NodeId>,
        axis: u32,
    },
    /// numpy `take`: `out[pre, idx, post] = x[pre, indices[idx], post]`.
    Gather {
        x: NodeId,
        indices: NodeId,
        axis: u32,
    },
    /// The index along `axis`, in the node's declared type.
    Iota {
        axis: u32,
    },
    /// Boolean mask over the last two axes: lower keeps `j <= i + diagonal`, upper
    /// `j >= i + diagonal`.
    TriMask {
        upper: bool,
        diagonal: i64,
    },
    /// Softmax or log-softmax along one axis.
    Normalize {
        op: NormOp,
        x: NodeId,
        axis: u32,
    },
    /// Layer normalisation over the last axis, optional scale and shift of the last axis' size.
    LayerNorm {
        x: NodeId,
        gamma: Option<NodeId>,
        beta: Option<NodeId>,
        eps_bits: u32,
    },
    /// RMS normalisation over the last axis, optional scale.
    RmsNorm {
        x: NodeId,
        gamma: Option<NodeId>,
        eps_bits: u32,
    },
    /// NCHW convolution; weight `[out, in/groups, kh, kw]`, optional bias `[out]`.
    Conv2d {
        x: NodeId,
        w: NodeId,
        bias: Option<NodeId>,
        window: Window2d,
        groups: u32,
    },
    /// NCHW pooling with kernel `[kh, kw]`.
    Pool2d {
        kind: PoolKind,
        x: NodeId,
        kernel: [u32; 2],
        window: Window2d,
    },
    /// Counter-based random numbers: element `i` is a function of the job seed, `key` and `i`
    /// only, identical on every machine.
    Random {
        dist: Distribution,
        key: u64,
    },
    /// The f32 values of quantised blocks: `u8[..., nb, block_bytes]` to `f32[..., nb·32]`.
    Dequantize {
        x: NodeId,
        format: QuantFormat,
    },
    /// `a @ transpose(dequantize(w))`: `a` is `f32[..., m, k]`, `w` is `u8[n, k/32,
    /// block_bytes]` (a linear layer's weight as GGUF stores it, `[out, in]` with blocks along
    /// `in`); the result is `f32[..., m, n]`. `dot` says how the products are taken (and so
    /// the bits): see [`QDot`].
    QMatMul {
        a: NodeId,
        w: NodeId,
        format: QuantFormat,
        dot: QDot,
    },
}

/// Visit every operand slot of an op in order. Written once as a macro so that the same match
/// serves `&Op` (bindings are `&NodeId`) and `&mut Op` (bindings are `&mut NodeId`).
macro_rules! for_each_operand {
    ($op:expr, $f:expr) => {{
        #[allow(unused_mut)] // FnMut for `operands`, a plain Fn for `map_operands`
        let mut f = $f;
        match $op {
            Op::Input { .. }
            | Op::Weight { .. }
            | Op::Constant { .. }
            | Op::Iota { .. }
            | Op::TriMask { .. }
            | Op::Random { .. } => {}
            Op::Unary { x, .. }
            | Op::Cast { x }
            | Op::Reduce { x, .. }
            | Op::Reshape { x }
            | Op::Permute { x, .. }
            | Op::Expand { x }
            | Op::Slice { x, .. }
            | Op::Pad { x, .. }
            | Op::Normalize { x, .. }
            | Op::Pool2d { x, .. }
            | Op::Dequantize { x, .. } => f(x),
            Op::Binary { a, b, .. } | Op::MatMul { a, b } | Op::QMatMul { a, w: b, .. } => {
                f(a);
                f(b);
            }
            Op::Where { cond, a, b } => {
                f(cond);
                f(a);
                f(b);
            }
            Op::Concat { xs, .. } => {
                for x in xs {
                    f(x);
                }
            }
            Op::Gather { x, indices, .. } => {
                f(x);
                f(indices);
            }
            Op::LayerNorm { x, gamma, beta, .. } => {
                f(x);
                if let Some(g) = gamma {
                    f(g);
                }
                if let Some(b) = beta {
                    f(b);
                }
            }
            Op::RmsNorm { x, gamma, .. } => {
                f(x);
                if let Some(g) = gamma {
                    f(g);
                }
            }
            Op::Conv2d { x, w, bias, .. } => {
                f(x);
                f(w);
                if let Some(b) = bias {
                    f(b);
                }
            }
        }
    }};
}

impl Op {
    /// The name of this op in the text form and in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Weight { .. } => "weight",
            Op::Constant { .. } => "const",
            Op::Unary { op, .. } => op.name(),
            Op::Binary { op, .. } => op.name(),
            Op::Where { .. } => "where",
            Op::Cast { .. } => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::MatMul { .. } => "matmul",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Expand { .. } => "expand",
            Op::Slice { .. } => "slice",
            Op::Pad { .. } => "pad",
            Op::Concat { .. } => "concat",
            Op::Gather { .. } => "gather",
            Op::Iota { .. } => "iota",
            Op::TriMask { .. } => "tri_mask",
            Op::Normalize { op, .. } => op.name(),
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Conv2d { .. } => "conv2d",
            Op::Pool2d { kind, .. } => kind.name(),
            Op::Random { dist, .. } => dist.name(),
            Op::Dequantize { .. } => "dequantize",
            Op::QMatMul { dot, .. } => dot.name(),
        }
    }

    /// The operands, in order (optional operands that are absent are skipped).
    pub fn operands(&self) -> Vec<NodeId> {
        let mut out = Vec::new();
        for_each_operand!(self, |n: &NodeId| out.push(*n));
        out
    }

    /// True for nodes that bring data into the graph rather than compute it.
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Weight { .. } | Op::Constant { .. }
        )
    }
}

impl Op {
    /// The same op with every operand replaced by `f(operand)`.
    pub fn map_operands(&self, f: impl Fn(NodeId) -> NodeId) -> Op {
        let mut op = self.clone();
        for_each_operand!(&mut op, |n: &mut NodeId| *n = f(*n));
        op
    }
}
