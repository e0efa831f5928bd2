//! Building graphs from Rust the way one writes PyTorch or tinygrad: lazy tensors, operator
//! overloading, numpy broadcasting.
//!
//! ```
//! use tenet_ir::{DType, GraphBuilder};
//! let g = GraphBuilder::new();
//! let x = g.input("x", DType::F32, &[8, 4]);
//! let w = g.input("w", DType::F32, &[4, 2]);
//! let y = (x.matmul(&w) * 0.5).relu();
//! let graph = g.finish(&[("y", &y)]).unwrap();
//! assert_eq!(graph.outputs()[0].name, "y");
//! ```
//!
//! Ops never fail on the spot, so expressions chain. The first shape or dtype mistake is kept,
//! with the source location of the offending call (`#[track_caller]`), the op and the operand
//! types, and `finish` (or `error`) returns it; every tensor derived from a failed op is inert.
//! Node order in the finished graph is creation order with unused nodes dropped, so the same
//! program builds the same graph, with the same id, every time.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::Location;
use std::rc::Rc;

use half::{bf16, f16};

use crate::dtype::{DType, TensorType};
use crate::error::ValidationError;
use crate::graph::{Graph, Limits, Node, Output, check_node, used_nodes};
use crate::id::WeightsId;
use crate::op::{
    BinaryOp, Distribution, NodeId, NormOp, Op, PoolKind, QDot, QuantFormat, ReduceOp, SliceRange,
    UnaryOp, Window2d,
};

/// A mistake found while building, with where the offending call is in the caller's source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("{location}: {op}: {message}")]
    Op {
        location: String,
        op: &'static str,
        message: String,
    },
    #[error("{0}")]
    Invalid(#[from] ValidationError),
}

#[derive(Default)]
struct State {
    nodes: Vec<Node>,
    error: Option<BuildError>,
    limits: Limits,
    inputs: HashMap<String, NodeId>,
    weights: HashMap<(WeightsId, String), NodeId>,
}

/// Collects nodes; hands out `Tensor`s; `finish` turns them into a validated `Graph`.
#[derive(Clone, Default)]
pub struct GraphBuilder {
    state: Rc<RefCell<State>>,
}

/// A lazy tensor: a node of the graph being built, with its type.
#[derive(Clone)]
pub struct Tensor {
    state: Rc<RefCell<State>>,
    id: NodeId,
    ty: TensorType,
    poisoned: bool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} : {})", self.id, self.ty)
    }
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    pub fn with_limits(limits: Limits) -> GraphBuilder {
        let b = GraphBuilder::new();
        b.state.borrow_mut().limits = limits;
        b
    }

    /// The first error so far, if any.
    pub fn error(&self) -> Option<BuildError> {
        self.state.borrow().error.clone()
    }

    /// The first mistake, forgotten: for interactive callers (the Python package) that report
    /// each mistake as it happens, drop the failed op's tensor, and go on building. A failed op
    /// adds no node, so the graph stays whole.
    pub fn take_error(&self) -> Option<BuildError> {
        self.state.borrow_mut().error.take()
    }

    fn fail(&self, op: &'static str, message: String, loc: &Location<'_>) -> Tensor {
        let mut s = self.state.borrow_mut();
        if s.error.is_none() {
            s.error = Some(BuildError::Op {
                location: loc.to_string(),
                op,
                message,
            });
        }
        drop(s);
        self.poisoned()
    }

    fn poisoned(&self) -> Tensor {
        Tensor {
            state: self.state.clone(),
            id: NodeId(0),
            ty: TensorType::scalar(DType::F32),
            poisoned: true,
        }
    }

    /// Append a node after checking it with the validator's own rules.
    fn push(&self, op: Op, declared: Option<TensorType>, loc: &Location<'_>) -> Tensor {
        let name = op.name();
        let ty = {
            let s = self.state.borrow();
            let ty_of = |n: NodeId| s.nodes[n.index()].ty.clone();
            match crate::infer::infer(&op, &ty_of, declared.as_ref()) {
                Ok(t) => t,
                Err(msg) => {
                    drop(s);
                    return self.fail(name, msg, loc);
                }
            }
        };
        let node = Node { op, ty: ty.clone() };
        let mut s = self.state.borrow_mut();
        let index = s.nodes.len();
        if let Err(e) = check_node(&s.nodes, index, &node, &s.limits) {
            drop(s);
            return self.fail(name, e.to_string(), loc);
        }
        s.nodes.push(node);
        Tensor {
            state: self.state.clone(),
            id: NodeId(index as u32),
            ty,
            poisoned: false,
        }
    }

    /// Build `op` over `operands`, unless one of them is inert or from another builder.
    fn apply(
        &self,
        operands: &[&Tensor],
        declared: Option<TensorType>,
        loc: &Location<'_>,
        make: impl FnOnce(&[NodeId]) -> Op,
    ) -> Tensor {
        if operands.iter().any(|t| t.poisoned) {
            return self.poisoned();
        }
        if operands.iter().any(|t| !Rc::ptr_eq(&t.state, &self.state)) {
            let op = make(&vec![NodeId(0); operands.len()]).name();
            return self.fail(
                op,
                "operands come from different graph builders".into(),
                loc,
            );
        }
        let ids: Vec<NodeId> = operands.iter().map(|t| t.id).collect();
        self.push(make(&ids), declared, loc)
    }

    /// A builder that already holds every node of `graph`, in order, and the tensor of each
    /// node (indexed like `graph.nodes()`): how a graph transform (autodiff) extends a finished
    /// graph. Inputs and weights are registered as if declared here, so asking for them again
    /// gives the same node.
    pub fn from_graph(graph: &Graph) -> (GraphBuilder, Vec<Tensor>) {
        let b = GraphBuilder::new();
        let tensors = graph
            .nodes()
            .iter()
            .map(|node| b.node(node.op.clone(), Some(node.ty.clone())))
            .collect();
        (b, tensors)
    }

    /// Node `id` of this builder: its op and its tensor (`None` past the last node).
    pub fn lookup(&self, id: NodeId) -> Option<(Op, Tensor)> {
        let s = self.state.borrow();
        let node = s.nodes.get(id.index())?;
        Some((
            node.op.clone(),
            Tensor {
                state: self.state.clone(),
                id,
                ty: node.ty.clone(),
                poisoned: false,
            },
        ))
    }

    /// True when `t` is a node of this builder.
    pub fn owns(&self, t: &Tensor) -> bool {
        Rc::ptr_eq(&self.state, &t.state) && !t.poisoned
    }

    /// How many nodes the builder holds.
    pub fn len(&self) -> usize {
        self.state.borrow().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append `op` (its operands are nodes of this builder) with its type inferred, or taken
    /// from `declared` for the ops whose type is declared (docs/OPS.md). A mistake is kept like
    /// any op's.
    #[track_caller]
    pub fn node(&self, op: Op, declared: Option<TensorType>) -> Tensor {
        let loc = Location::caller();
        let count = self.state.borrow().nodes.len();
        if let Some(bad) = op.operands().into_iter().find(|n| n.index() >= count) {
            return self.fail(op.name(), format!("operand {bad} is not a node yet"), loc);
        }
        match (&op, declared) {
            (Op::Input { name }, Some(ty)) => self.input(name, ty.dtype, &ty.shape),
            (Op::Weight { file, tensor }, Some(ty)) => {
                self.weight(*file, tensor, ty.dtype, &ty.shape)
            }
            (_, declared) => self.push(op, declared, loc),
        }
    }

    /// A named graph input.
    #[track_caller]
    pub fn input(&self, name: &str, dtype: DType, shape: &[u64]) -> Tensor {
        let loc = Location::caller();
        if self.state.borrow().inputs.contains_key(name) {
            return self.fail("input", format!("input {name:?} is declared twice"), loc);
        }
        let t = self.push(
            Op::Input {
                name: name.to_string(),
            },
            Some(TensorType::new(dtype, shape)),
            loc,
        );
        if !t.poisoned {
            self.state
                .borrow_mut()
                .inputs
                .insert(name.to_string(), t.id);
        }
        t
    }

    /// Tensor `tensor` of the weights file with id `file`. Asking twice gives the same node.
    #[track_caller]
    pub fn weight(&self, file: WeightsId, tensor: &str, dtype: DType, shape: &[u64]) -> Tensor {
        let loc = Location::caller();
        let key = (file, tensor.to_string());
        let ty = TensorType::new(dtype, shape);
        if let Some(&id) = self.state.borrow().weights.get(&key) {
            let existing = self.state.borrow().nodes[id.index()].ty.clone();
            if existing != ty {
                return self.fail(
                    "weight",
                    format!("{tensor:?} was declared {existing}, now {ty}"),
                    loc,
                );
            }
            return Tensor {
                state: self.state.clone(),
                id,
                ty,
                poisoned: false,
            };
        }
        let t = self.push(
            Op::Weight {
                file,
                tensor: tensor.to_string(),
            },
            Some(ty),
            loc,
        );
        if !t.poisoned {
            self.state.borrow_mut().weights.insert(key, t.id);
        }
        t
    }

    /// A literal tensor from little-endian element bytes.
    #[track_caller]
    pub fn constant(&self, dtype: DType, shape: &[u64], data: Vec<u8>) -> Tensor {
        self.push(
            Op::Constant { data },
            Some(TensorType::new(dtype, shape)),
            Location::caller(),
        )
    }

    #[track_caller]
    pub fn constant_f32(&self, shape: &[u64], values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(DType::F32, shape, data)
    }

    #[track_caller]
    pub fn constant_i64(&self, shape: &[u64], values: &[i64]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(DType::I64, shape, data)
    }

    /// A scalar constant of `dtype` holding `value`; integers and bools must be exact.
    #[track_caller]
    pub fn scalar(&self, dtype: DType, value: f64) -> Tensor {
        let loc = Location::caller();
        match scalar_bytes(dtype, value) {
            Some(data) => self.push(Op::Constant { data }, Some(TensorType::scalar(dtype)), loc),
            None => self.fail(
                "const",
                format!("{value} is not representable as {dtype}"),
                loc,
            ),
        }
    }

    /// The index along `axis` at every position of a tensor of type `dtype[shape]`.
    #[track_caller]
    pub fn iota(&self, dtype: DType, shape: &[u64], axis: u32) -> Tensor {
        self.push(
            Op::Iota { axis },
            Some(TensorType::new(dtype, shape)),
            Location::caller(),
        )
    }

    /// Boolean triangular mask over the last two axes of `shape` (see `Op::TriMask`).
    #[track_caller]
    pub fn tri_mask(&self, shape: &[u64], upper: bool, diagonal: i64) -> Tensor {
        let ty = TensorType::new(DType::Bool, shape);
        self.push(
            Op::TriMask { upper, diagonal },
            Some(ty),
            Location::caller(),
        )
    }

    /// Uniform numbers in [0, 1), a function of the job seed, `key` and the element index only.
    #[track_caller]
    pub fn random_uniform(&self, dtype: DType, shape: &[u64], key: u64) -> Tensor {
        let op = Op::Random {
            dist: Distribution::Uniform,
            key,
        };
        self.push(op, Some(TensorType::new(dtype, shape)), Location::caller())
    }

    /// Standard normal numbers, a function of the job seed, `key` and the element index only.
    #[track_caller]
    pub fn random_normal(&self, dtype: DType, shape: &[u64], key: u64) -> Tensor {
        let op = Op::Random {
            dist: Distribution::Normal,
            key,
        };
        self.push(op, Some(TensorType::new(dtype, shape)), Location::caller())
    }

    /// Concatenate along `axis` (negative counts from the end).
    #[track_caller]
    pub fn concat(&self, xs: &[&Tensor], axis: i64) -> Tensor {
        let loc = Location::caller();
        let Some(first) = xs.first() else {
            return self.fail("concat", "needs at least one tensor".into(), loc);
        };
        let Some(axis) = norm_axis(axis, first.ty.rank()) else {
            return self.fail(
                "concat",
                format!("axis {axis} out of range for {}", first.ty),
                loc,
            );
        };
        self.apply(xs, None, loc, |ids| Op::Concat {
            xs: ids.to_vec(),
            axis,
        })
    }

    /// Validate and return the graph with the given named outputs. Nodes no output needs are
    /// dropped (inputs are kept: they are the graph's interface).
    pub fn finish(&self, outputs: &[(&str, &Tensor)]) -> Result<Graph, BuildError> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        let s = self.state.borrow();
        let outs: Vec<Output> = outputs
            .iter()
            .map(|(name, t)| Output {
                name: name.to_string(),
                node: t.id,
            })
            .collect();
        if outputs
            .iter()
            .any(|(_, t)| !Rc::ptr_eq(&t.state, &self.state))
        {
            return Err(BuildError::Op {
                location: "finish".into(),
                op: "output",
                message: "an output comes from a different graph builder".into(),
            });
        }
        let used = used_nodes(&s.nodes, &outs);
        let mut remap = vec![NodeId(u32::MAX); s.nodes.len()];
        let mut nodes = Vec::new();
        for (i, node) in s.nodes.iter().enumerate() {
            if used[i] || matches!(node.op, Op::Input { .. }) {
                remap[i] = NodeId(nodes.len() as u32);
                nodes.push(Node {
                    op: node.op.map_operands(|n| remap[n.index()]),
                    ty: node.ty.clone(),
                });
            }
        }
        let outs = outs
            .into_iter()
            .map(|o| Output {
                node: remap[o.node.index()],
                ..o
            })
            .collect();
        Ok(Graph::with_limits(nodes, outs, &s.limits)?)
    }
}

fn norm_axis(axis: i64, rank: usize) -> Option<u32> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as u32)
}

/// Bytes of a scalar `value` in `dtype`, or `None` if an integer type cannot hold it exactly.
fn scalar_bytes(dtype: DType, value: f64) -> Option<Vec<u8>> {
    let int =
        |lo: f64, hi: f64| (value.fract() == 0.0 && value >= lo && value <= hi).then_some(value);
    Some(match dtype {
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F16 => f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::I32 => (int(i32::MIN as f64, i32::MAX as f64)? as i32)
            .to_le_bytes()
            .to_vec(),
        DType::I64 => (int(-(2f64.powi(63)), 2f64.powi(63) - 1024.0)? as i64)
            .to_le_bytes()
            .to_vec(),
        DType::U8 => vec![int(0.0, 255.0)? as u8],
        DType::Bool => vec![int(0.0, 1.0)? as u8],
    })
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $fn:ident => $op:ident),+ $(,)?) => {
        impl Tensor {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $fn(&self) -> Tensor {
                    self.unary(UnaryOp::$op, Location::caller())
                }
            )+
        }
    };
}

unary_methods! {
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    reciprocal => Reciprocal, sin => Sin, cos => Cos, tanh => Tanh, sigmoid => Sigmoid,
    relu => Relu,
    /// GELU in its exact erf form.
    gelu => GeluErf,
    /// GELU in its tanh approximation.
    gelu_tanh => GeluTanh,
    erf => Erf, floor => Floor, ceil => Ceil,
    /// Round half to even.
    round => Round,
    sign => Sign,
    /// Logical not of a bool tensor.
    not => Not,
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $fn:ident => $op:ident),+ $(,)?) => {
        impl Tensor {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $fn(&self, other: &Tensor) -> Tensor {
                    self.binary(BinaryOp::$op, other, Location::caller())
                }
            )+
        }
    };
}

binary_methods! {
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow,
    /// Elementwise maximum.
    maximum => Max,
    /// Elementwise minimum.
    minimum => Min,
    eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge,
    /// Logical and of bool tensors.
    and => And,
    /// Logical or of bool tensors.
    or => Or,
}

impl Tensor {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[u64] {
        &self.ty.shape
    }

    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    /// The builder this tensor belongs to.
    pub fn builder(&self) -> GraphBuilder {
        GraphBuilder {
            state: self.state.clone(),
        }
    }

    fn unary(&self, op: UnaryOp, loc: &Location<'_>) -> Tensor {
        self.builder()
            .apply(&[self], None, loc, |n| Op::Unary { op, x: n[0] })
    }

    fn binary(&self, op: BinaryOp, other: &Tensor, loc: &Location<'_>) -> Tensor {
        self.builder()
            .apply(&[self, other], None, loc, |n| Op::Binary {
                op,
                a: n[0],
                b: n[1],
            })
    }

    fn with_scalar(
        &self,
        op: BinaryOp,
        value: f64,
        scalar_first: bool,
        loc: &Location<'_>,
    ) -> Tensor {
        if self.poisoned {
            return self.clone();
        }
        let b = self.builder();
        let s = match scalar_bytes(self.dtype(), value) {
            Some(data) => b.push(
                Op::Constant { data },
                Some(TensorType::scalar(self.dtype())),
                loc,
            ),
            None => {
                return b.fail(
                    op.name(),
                    format!("{value} is not representable as {}", self.dtype()),
                    loc,
                );
            }
        };
        let (l, r) = if scalar_first { (&s, self) } else { (self, &s) };
        l.binary(op, r, loc)
    }

    /// `self ? a : b`, elementwise with broadcasting; `self` must be bool.
    #[track_caller]
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Tensor {
        let loc = Location::caller();
        self.builder()
            .apply(&[self, a, b], None, loc, |n| Op::Where {
                cond: n[0],
                a: n[1],
                b: n[2],
            })
    }

    /// Convert to `dtype` (see docs/OPS.md for the conversion rules).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        let ty = TensorType::new(dtype, self.shape());
        self.builder()
            .apply(&[self], Some(ty), Location::caller(), |n| Op::Cast {
                x: n[0],
            })
    }

    #[track_caller]
    fn reduce(&self, op: ReduceOp, axes: &[i64], keepdim: bool, loc: &Location<'_>) -> Tensor {
        let mut norm: Vec<u32> = Vec::with_capacity(axes.len());
        for &a in axes {
            match norm_axis(a, self.rank()) {
                Some(a) => norm.push(a),
                None => {
                    return self.builder().fail(
                        op.name(),
                        format!("axis {a} out of range for {}", self.ty),
                        loc,
                    );
                }
            }
        }
        norm.sort_unstable();
        norm.dedup();
        self.builder().apply(&[self], None, loc, |n| Op::Reduce {
            op,
            x: n[0],
            axes: norm,
            keepdim,
        })
    }

    /// Sum over `axes` (negative axes count from the end).
    #[track_caller]
    pub fn sum(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Sum, axes, keepdim, Location::caller())
    }

    #[track_caller]
    pub fn mean(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Mean, axes, keepdim, Location::caller())
    }

    #[track_caller]
    pub fn max(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Max, axes, keepdim, Location::caller())
    }

    #[track_caller]
    pub fn min(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::Min, axes, keepdim, Location::caller())
    }

    /// Index (i64) of the first maximum over `axes`, flattened row-major over those axes.
    #[track_caller]
    pub fn argmax(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::ArgMax, axes, keepdim, Location::caller())
    }

    #[track_caller]
    pub fn argmin(&self, axes: &[i64], keepdim: bool) -> Tensor {
        self.reduce(ReduceOp::ArgMin, axes, keepdim, Location::caller())
    }

    /// Batched matrix product with broadcasting over batch dimensions.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        self.builder()
            .apply(&[self, other], None, Location::caller(), |n| Op::MatMul {
                a: n[0],
                b: n[1],
            })
    }

    /// `self @ transpose(dequantize(w))`: `self` is `f32[..., m, k]`, `w` a quantised `[n, k]`
    /// weight as GGUF stores it, `u8[n, k/32, format.block_bytes()]`; the result is
    /// `f32[..., m, n]`, bit for bit the product with the dequantised, transposed weight.
    #[track_caller]
    pub fn qmatmul(&self, w: &Tensor, format: QuantFormat) -> Tensor {
        self.qmatmul_with(w, format, QDot::F32, Location::caller())
    }

    /// `self @ transpose(w)` for a quantised `w` as [`Tensor::qmatmul`], but with `self`'s rows
    /// rounded to 8-bit blocks and exact integer block products ([`QDot::Q8`]; docs/OPS.md):
    /// llama.cpp's arithmetic, not the f32 product's bits.
    #[track_caller]
    pub fn qmatmul_q8(&self, w: &Tensor, format: QuantFormat) -> Tensor {
        self.qmatmul_with(w, format, QDot::Q8, Location::caller())
    }

    fn qmatmul_with(
        &self,
        w: &Tensor,
        format: QuantFormat,
        dot: QDot,
        loc: &'static Location<'static>,
    ) -> Tensor {
        self.builder()
            .apply(&[self, w], None, loc, |n| Op::QMatMul {
                a: n[0],
                w: n[1],
                format,
                dot,
            })
    }

    /// The f32 values of quantised blocks: `u8[..., nb, format.block_bytes()]` to
    /// `f32[..., nb·32]`.
    #[track_caller]
    pub fn dequantize(&self, format: QuantFormat) -> Tensor {
        self.builder()
            .apply(&[self], None, Location::caller(), |n| Op::Dequantize {
                x: n[0],
                format,
            })
    }

    /// Reshape; one dimension may be -1 and is then inferred.
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        let loc = Location::caller();
        let fail = |m: String| self.builder().fail("reshape", m, loc);
        let known: Option<u64> = shape
            .iter()
            .filter(|&&d| d != -1)
            .try_fold(1u64, |acc, &d| {
                u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
            });
        let (Some(known), Some(total)) = (known, self.ty.numel()) else {
            return fail(format!("invalid target shape {shape:?} for {}", self.ty));
        };
        let inferred = shape.iter().filter(|&&d| d == -1).count();
        let fill = match inferred {
            0 => 0,
            1 if known > 0 && total % known == 0 => total / known,
            _ => return fail(format!("cannot infer the -1 in {shape:?} for {}", self.ty)),
        };
        let dims: Vec<u64> = shape
            .iter()
            .map(|&d| if d == -1 { fill } else { d as u64 })
            .collect();
        let ty = TensorType::new(self.dtype(), dims);
        self.builder()
            .apply(&[self], Some(ty), loc, |n| Op::Reshape { x: n[0] })
    }

    #[track_caller]
    pub fn permute(&self, perm: &[u32]) -> Tensor {
        let perm = perm.to_vec();
        self.builder()
            .apply(&[self], None, Location::caller(), |n| Op::Permute {
                x: n[0],
                perm,
            })
    }

    /// Swap two axes (negative axes count from the end).
    #[track_caller]
    pub fn transpose(&self, a: i64, b: i64) -> Tensor {
        let loc = Location::caller();
        let (Some(a), Some(b)) = (norm_axis(a, self.rank()), norm_axis(b, self.rank())) else {
            return self.builder().fail(
                "permute",
                format!("axes {a}, {b} out of range for {}", self.ty),
                loc,
            );
        };
        let mut perm: Vec<u32> = (0..self.rank() as u32).collect();
        perm.swap(a as usize, b as usize);
        self.builder()
            .apply(&[self], None, loc, |n| Op::Permute { x: n[0], perm })
    }

    /// Broadcast to `shape` by numpy rules.
    #[track_caller]
    pub fn expand(&self, shape: &[u64]) -> Tensor {
        let ty = TensorType::new(self.dtype(), shape);
        self.builder()
            .apply(&[self], Some(ty), Location::caller(), |n| Op::Expand {
                x: n[0],
            })
    }

    /// Slice one axis: `start..end` by `step` (other axes whole).
    #[track_caller]
    pub fn slice(&self, axis: i64, start: u64, end: u64, step: u64) -> Tensor {
        let loc = Location::caller();
        let Some(axis) = norm_axis(axis, self.rank()) else {
            return self.builder().fail(
                "slice",
                format!("axis {axis} out of range for {}", self.ty),
                loc,
            );
        };
        let ranges = self
            .shape()
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if i == axis as usize {
                    SliceRange { start, end, step }
                } else {
                    SliceRange {
                        start: 0,
                        end: d,
                        step: 1,
                    }
                }
            })
            .collect();
        self.builder()
            .apply(&[self], None, loc, |n| Op::Slice { x: n[0], ranges })
    }

    /// Pad every axis with `(before, after)` copies of `value`.
    #[track_caller]
    pub fn pad(&self, pads: &[(u64, u64)], value: f64) -> Tensor {
        let loc = Location::caller();
        let Some(bytes) = scalar_bytes(self.dtype(), value) else {
            return self.builder().fail(
                "pad",
                format!("{value} is not representable as {}", self.dtype()),
                loc,
            );
        };
        let mut buf = [0u8; 8];
        buf[..bytes.len()].copy_from_slice(&bytes);
        let value = u64::from_le_bytes(buf);
        let pads = pads.to_vec();
        self.builder().apply(&[self], None, loc, |n| Op::Pad {
            x: n[0],
            pads,
            value,
        })
    }

    /// numpy `take` along `axis`; indices are i32 or i64.
    #[track_caller]
    pub fn gather(&self, indices: &Tensor, axis: i64) -> Tensor {
        let loc = Location::caller();
        let Some(axis) = norm_axis(axis, self.rank()) else {
            return self.builder().fail(
                "gather",
                format!("axis {axis} out of range for {}", self.ty),
                loc,
            );
        };
        self.builder()
            .apply(&[self, indices], None, loc, |n| Op::Gather {
                x: n[0],
                indices: n[1],
                axis,
            })
    }

    #[track_caller]
    fn normalize(&self, op: NormOp, axis: i64, loc: &Location<'_>) -> Tensor {
        let Some(axis) = norm_axis(axis, self.rank()) else {
            return self.builder().fail(
                op.name(),
                format!("axis {axis} out of range for {}", self.ty),
                loc,
            );
        };
        self.builder()
            .apply(&[self], None, loc, |n| Op::Normalize { op, x: n[0], axis })
    }

    #[track_caller]
    pub fn softmax(&self, axis: i64) -> Tensor {
        self.normalize(NormOp::Softmax, axis, Location::caller())
    }

    #[track_caller]
    pub fn log_softmax(&self, axis: i64) -> Tensor {
        self.normalize(NormOp::LogSoftmax, axis, Location::caller())
    }

    /// Layer normalisation over the last axis.
    #[track_caller]
    pub fn layer_norm(&self, gamma: Option<&Tensor>, beta: Option<&Tensor>, eps: f32) -> Tensor {
        let mut operands = vec![self];
        operands.extend(gamma);
        operands.extend(beta);
        let (has_g, has_b) = (gamma.is_some(), beta.is_some());
        self.builder()
            .apply(&operands, None, Location::caller(), |n| Op::LayerNorm {
                x: n[0],
                gamma: has_g.then(|| n[1]),
                beta: has_b.then(|| n[n.len() - 1]),
                eps_bits: eps.to_bits(),
            })
    }

    /// RMS normalisation over the last axis.
    #[track_caller]
    pub fn rms_norm(&self, gamma: Option<&Tensor>, eps: f32) -> Tensor {
        let mut operands = vec![self];
        operands.extend(gamma);
        self.builder()
            .apply(&operands, None, Location::caller(), |n| Op::RmsNorm {
                x: n[0],
                gamma: n.get(1).copied(),
                eps_bits: eps.to_bits(),
            })
    }

    /// NCHW 2-D convolution. `padding` is `[top, left, bottom, right]`.
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [u32; 2],
        padding: [u32; 4],
        dilation: [u32; 2],
        groups: u32,
    ) -> Tensor {
        let mut operands = vec![self, weight];
        operands.extend(bias);
        let window = Window2d {
            stride,
            padding,
            dilation,
        };
        self.builder()
            .apply(&operands, None, Location::caller(), |n| Op::Conv2d {
                x: n[0],
                w: n[1],
                bias: n.get(2).copied(),
                window,
                groups,
            })
    }

    #[track_caller]
    fn pool(
        &self,
        kind: PoolKind,
        kernel: [u32; 2],
        stride: [u32; 2],
        padding: [u32; 4],
        loc: &Location<'_>,
    ) -> Tensor {
        let window = Window2d {
            stride,
            padding,
            dilation: [1, 1],
        };
        self.builder().apply(&[self], None, loc, |n| Op::Pool2d {
            kind,
            x: n[0],
            kernel,
            window,
        })
    }

    #[track_caller]
    pub fn max_pool2d(&self, kernel: [u32; 2], stride: [u32; 2], padding: [u32; 4]) -> Tensor {
        self.pool(PoolKind::Max, kernel, stride, padding, Location::caller())
    }

    /// Average pooling; padded positions are excluded from the count.
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: [u32; 2], stride: [u32; 2], padding: [u32; 4]) -> Tensor {
        self.pool(PoolKind::Avg, kernel, stride, padding, Location::caller())
    }

    /// Any pooling kind over any window, dilation included.
    #[track_caller]
    pub fn pool2d(&self, kind: PoolKind, kernel: [u32; 2], window: Window2d) -> Tensor {
        self.builder()
            .apply(&[self], None, Location::caller(), |n| Op::Pool2d {
                kind,
                x: n[0],
                kernel,
                window,
            })
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(BinaryOp::$op, rhs, Location::caller())
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(BinaryOp::$op, &rhs, Location::caller())
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(BinaryOp::$op, rhs, Location::caller())
            }
        }
        impl std::ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(BinaryOp::$op, &rhs, Location::caller())
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f64) -> Tensor {
                self.with_scalar(BinaryOp::$op, rhs, false, Location::caller())
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f64) -> Tensor {
                self.with_scalar(BinaryOp::$op, rhs, false, Location::caller())
            }
        }
        impl std::ops::$trait<&Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                rhs.with_scalar(BinaryOp::$op, self, true, Location::caller())
            }
        }
        impl std::ops::$trait<Tensor> for f64 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                rhs.with_scalar(BinaryOp::$op, self, true, Location::caller())
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, Location::caller())
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary(UnaryOp::Neg, Location::caller())
    }
}
