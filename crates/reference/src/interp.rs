//! The interpreter: executes a validated graph node by node, in graph order.

use std::collections::HashMap;

use half::{bf16, f16};
use tenet_ir::{
    BinaryOp, DType, Distribution, Graph, HostTensor, NodeId, NormOp, Op, PoolKind, QDot,
    QuantFormat, ReduceOp, TensorType, UnaryOp, WeightSource, Window2d,
};

use crate::math::{self, NAN, canonical as canon};
use crate::philox;
use crate::quant;

/// Why a graph could not be run on the given inputs and weights.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("missing input {name:?}: the graph expects {expected}")]
    MissingInput { name: String, expected: TensorType },
    #[error("unexpected input {name:?}: the graph's inputs are {known}")]
    UnknownInput { name: String, known: String },
    #[error("input {name:?} is {actual}, the graph expects {expected}")]
    InputType {
        name: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("weight {tensor:?} of weights file {file} was not supplied")]
    MissingWeight { file: String, tensor: String },
    #[error("weight {tensor:?} is {actual}, the graph expects {expected}")]
    WeightType {
        tensor: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("node {node} (gather): index {index} is out of range for an axis of size {size}")]
    IndexOutOfRange { node: NodeId, index: i64, size: u64 },
    /// The caller's stop function said stop while an op ran ([`eval_op_polled`]).
    #[error("stopped by the caller")]
    Stopped,
}

/// Run `graph` on named `inputs`, reading weights from `weights`; `seed` feeds the random ops.
/// Returns the outputs in the graph's output order.
pub fn run(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &dyn WeightSource,
    seed: u64,
) -> Result<Vec<(String, HostTensor)>, RunError> {
    run_observed(graph, inputs, weights, seed, &mut |_, _| true)
}

/// [`run`], handing every node's value to `observe` as it is computed, in node order (how a
/// job's trace is hashed); `observe` may change the value (a test's liar does) and stops the
/// run by answering false, after which the outputs are empty.
pub fn run_observed(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &dyn WeightSource,
    seed: u64,
    observe: &mut dyn FnMut(NodeId, &mut HostTensor) -> bool,
) -> Result<Vec<(String, HostTensor)>, RunError> {
    check_inputs(graph, inputs)?;
    let nodes = graph.nodes();
    // Release each value after its last use, as the cost certificate assumes.
    let mut last_use = vec![0usize; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for o in n.op.operands() {
            last_use[o.index()] = i;
        }
    }
    for o in graph.outputs() {
        last_use[o.node.index()] = usize::MAX;
    }
    let mut values: Vec<Option<HostTensor>> = vec![None; nodes.len()];
    let never = Stopper::new(&|| false);
    for (i, node) in nodes.iter().enumerate() {
        let operands: Vec<&HostTensor> = node
            .op
            .operands()
            .iter()
            .map(|o| {
                values[o.index()]
                    .as_ref()
                    .expect("operands precede their users")
            })
            .collect();
        let mut value = eval(
            NodeId(i as u32),
            &node.op,
            &node.ty,
            &operands,
            inputs,
            weights,
            seed,
            &never,
        )?;
        if !observe(NodeId(i as u32), &mut value) {
            return Ok(Vec::new());
        }
        values[i] = Some(value);
        for o in node.op.operands() {
            if last_use[o.index()] == i {
                values[o.index()] = None;
            }
        }
    }
    Ok(graph
        .outputs()
        .iter()
        .map(|o| {
            (
                o.name.clone(),
                values[o.node.index()].clone().expect("outputs are kept"),
            )
        })
        .collect())
}

/// Evaluate one computing node (not an input or weight) on its operand values, given in the
/// order of `op.operands()`. This is the definition executors fall back to for ops they do not
/// accelerate.
pub fn eval_op(
    node: NodeId,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    seed: u64,
) -> Result<HostTensor, RunError> {
    eval_op_polled(node, op, ty, operands, seed, &|| false)
}

/// [`eval_op`], asking `stop` as a long op (a product, a convolution, a pooling) goes, every
/// [`POLL_WORK`] multiply-adds or window taps: once it says yes the op is abandoned with
/// [`RunError::Stopped`]. The bits of an op that runs to its end are the same.
pub fn eval_op_polled(
    node: NodeId,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    seed: u64,
    stop: &dyn Fn() -> bool,
) -> Result<HostTensor, RunError> {
    let stopper = Stopper::new(stop);
    let t = eval(
        node,
        op,
        ty,
        operands,
        &HashMap::new(),
        &tenet_ir::NoWeights,
        seed,
        &stopper,
    )?;
    stopper.result(t)
}

/// Multiply-adds (or window taps) between two questions to a caller's stop function.
pub const POLL_WORK: u64 = 1 << 18;

/// Asks a stop function as a long op goes. Once it says stop, every later step of the op is
/// skipped and the op's values are never used: the op returns [`RunError::Stopped`].
struct Stopper<'a> {
    stop: &'a dyn Fn() -> bool,
    work: std::cell::Cell<u64>,
    stopped: std::cell::Cell<bool>,
}

impl<'a> Stopper<'a> {
    fn new(stop: &'a dyn Fn() -> bool) -> Stopper<'a> {
        Stopper {
            stop,
            work: std::cell::Cell::new(0),
            stopped: std::cell::Cell::new(false),
        }
    }

    /// Whether to skip the next piece of `work`: the op has been told to stop.
    fn skip(&self, work: u64) -> bool {
        if self.stopped.get() {
            return true;
        }
        let done = self.work.get().saturating_add(work);
        if done < POLL_WORK {
            self.work.set(done);
            return false;
        }
        self.work.set(0);
        let stop = (self.stop)();
        self.stopped.set(stop);
        stop
    }

    fn result(&self, t: HostTensor) -> Result<HostTensor, RunError> {
        if self.stopped.get() {
            return Err(RunError::Stopped);
        }
        Ok(t)
    }
}

/// Check that `inputs` are exactly the graph's inputs, each of its declared type.
pub fn check_inputs<T: std::borrow::Borrow<HostTensor>>(
    graph: &Graph,
    inputs: &HashMap<String, T>,
) -> Result<(), RunError> {
    for (_, name, ty) in graph.inputs() {
        match inputs.get(name) {
            None => {
                return Err(RunError::MissingInput {
                    name: name.to_string(),
                    expected: ty.clone(),
                });
            }
            Some(t) if t.borrow().ty() != ty => {
                return Err(RunError::InputType {
                    name: name.to_string(),
                    expected: ty.clone(),
                    actual: t.borrow().ty().clone(),
                });
            }
            Some(_) => {}
        }
    }
    let known: Vec<&str> = graph.inputs().map(|(_, n, _)| n).collect();
    let mut given: Vec<&String> = inputs.keys().collect();
    given.sort();
    if let Some(extra) = given.into_iter().find(|n| !known.contains(&n.as_str())) {
        return Err(RunError::UnknownInput {
            name: extra.clone(),
            known: known.join(", "),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Element access and encoding.

/// Encode f32 values as `ty` (a float dtype), rounding once to the storage type.
fn floats_to(ty: &TensorType, vals: impl IntoIterator<Item = f32>) -> HostTensor {
    let mut data = Vec::new();
    for v in vals {
        let v = canon(v);
        match ty.dtype {
            DType::F16 => data.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => data.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
            _ => data.extend_from_slice(&v.to_le_bytes()),
        }
    }
    tensor(ty, data)
}

/// Encode i64 values as `ty` (an integer or bool dtype), truncating two's complement.
fn ints_to(ty: &TensorType, vals: impl IntoIterator<Item = i64>) -> HostTensor {
    let mut data = Vec::new();
    for v in vals {
        match ty.dtype {
            DType::I32 => data.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => data.extend_from_slice(&v.to_le_bytes()),
            DType::U8 => data.push(v as u8),
            _ => data.push((v != 0) as u8),
        }
    }
    tensor(ty, data)
}

fn bools_to(shape: &[u64], vals: impl IntoIterator<Item = bool>) -> HostTensor {
    tensor(
        &TensorType::new(DType::Bool, shape),
        vals.into_iter().map(u8::from).collect(),
    )
}

fn tensor(ty: &TensorType, data: Vec<u8>) -> HostTensor {
    HostTensor::new(ty.clone(), data).expect("the interpreter produces exactly the declared type")
}

/// Numeric values of any tensor, by class.
enum Vals {
    F(Vec<f32>),
    I(Vec<i64>),
}

fn vals(t: &HostTensor) -> Vals {
    if t.dtype().is_float() {
        Vals::F(t.to_f32_vec())
    } else {
        Vals::I(t.to_i64_vec())
    }
}

/// Copy elements by source index into a tensor of type `ty`.
fn take(src: &HostTensor, ty: &TensorType, index: impl IntoIterator<Item = usize>) -> HostTensor {
    let size = src.dtype().size() as usize;
    let b = src.bytes();
    let mut data = Vec::with_capacity(ty.bytes().unwrap_or(0) as usize);
    for i in index {
        data.extend_from_slice(&b[i * size..(i + 1) * size]);
    }
    tensor(ty, data)
}

// ---------------------------------------------------------------------------------------------
// Index arithmetic.

fn strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// All multi-indices of `shape` in row-major order.
fn indices(shape: &[u64]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let n = shape.iter().product::<u64>() as usize;
    let st = strides(shape);
    (0..n).map(move |flat| {
        st.iter()
            .zip(shape)
            .map(|(&s, &d)| (flat / s) % d as usize)
            .collect()
    })
}

/// For each element of `out` (row-major), the flat index of the element of `inp` it reads under
/// numpy broadcasting.
fn broadcast_index(out: &[u64], inp: &[u64]) -> Vec<usize> {
    let st = strides(inp);
    let off = out.len() - inp.len();
    indices(out)
        .map(|idx| {
            (0..inp.len())
                .map(|d| if inp[d] == 1 { 0 } else { idx[off + d] * st[d] })
                .sum()
        })
        .collect()
}

/// The project's summation order: 16 accumulators, element `j` into lane `j mod 16`, then a
/// pairwise tree over the lanes (docs/OPS.md, "Summation order").
pub fn sum_ordered(xs: impl IntoIterator<Item = f32>) -> f32 {
    let mut acc = [0.0f32; 16];
    for (j, x) in xs.into_iter().enumerate() {
        acc[j % 16] += x;
    }
    fold_lanes(acc)
}

/// The last step of the summation order: the 16 lane accumulators combined pairwise,
/// `l += l + 8`, then `+ 4`, `+ 2`, `+ 1`. SIMD kernels call this on their stored lanes.
pub fn fold_lanes(mut acc: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// The op set's maximum: NaN if either is (the canonical NaN), `max(−0, +0) = +0`; the same
/// whichever order its operands come in.
pub fn fmax(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_positive() {
        a
    } else {
        b
    }
}

/// The op set's minimum: NaN if either is, `min(−0, +0) = −0`.
pub fn fmin(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else if a.is_sign_negative() {
        a
    } else {
        b
    }
}

// ---------------------------------------------------------------------------------------------
// Ops.

#[allow(clippy::too_many_arguments)]
fn eval(
    id: NodeId,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    inputs: &HashMap<String, HostTensor>,
    weights: &dyn WeightSource,
    seed: u64,
    stopper: &Stopper<'_>,
) -> Result<HostTensor, RunError> {
    let ids = op.operands();
    let arg = |n: &NodeId| -> &HostTensor {
        let at = ids
            .iter()
            .position(|i| i == n)
            .expect("an operand of this op");
        operands[at]
    };
    Ok(match op {
        Op::Input { name } => inputs[name].clone(),
        Op::Weight { file, tensor: name } => {
            let w = weights
                .weight(file, name)
                .cloned()
                .ok_or_else(|| RunError::MissingWeight {
                    file: file.to_hex(),
                    tensor: name.clone(),
                })?;
            if w.ty() != ty {
                return Err(RunError::WeightType {
                    tensor: name.clone(),
                    expected: ty.clone(),
                    actual: w.ty().clone(),
                });
            }
            w
        }
        Op::Constant { data } => tensor(ty, data.clone()),
        Op::Unary { op, x } => unary(*op, arg(x)),
        Op::Binary { op, a, b } => binary(*op, arg(a), arg(b), ty),
        Op::Where { cond, a, b } => {
            let (c, a, b) = (arg(cond), arg(a), arg(b));
            let (ic, ia, ib) = (
                broadcast_index(&ty.shape, c.shape()),
                broadcast_index(&ty.shape, a.shape()),
                broadcast_index(&ty.shape, b.shape()),
            );
            let size = a.dtype().size() as usize;
            let mut data = Vec::new();
            for k in 0..ic.len() {
                let (src, i) = if c.bytes()[ic[k]] != 0 {
                    (a, ia[k])
                } else {
                    (b, ib[k])
                };
                data.extend_from_slice(&src.bytes()[i * size..(i + 1) * size]);
            }
            tensor(ty, data)
        }
        Op::Cast { x } => cast(arg(x), ty),
        Op::Reduce { op, x, axes, .. } => reduce(*op, arg(x), axes, ty),
        Op::MatMul { a, b } => matmul(arg(a), arg(b), ty, stopper),
        Op::Dequantize { x, format } => dequantize(arg(x), *format, ty, stopper),
        Op::QMatMul {
            a,
            w,
            format,
            dot: QDot::F32,
        } => qmatmul(arg(a), arg(w), *format, ty, stopper),
        Op::QMatMul {
            a,
            w,
            format,
            dot: QDot::Q8,
        } => qmatmul_q8(arg(a), arg(w), *format, ty, stopper),
        Op::Reshape { x } => tensor(ty, arg(x).bytes().to_vec()),
        Op::Permute { x, perm } => {
            let x = arg(x);
            let st = strides(x.shape());
            let index = indices(&ty.shape)
                .map(|idx| {
                    idx.iter()
                        .zip(perm)
                        .map(|(&i, &p)| i * st[p as usize])
                        .sum::<usize>()
                })
                .collect::<Vec<_>>();
            take(x, ty, index)
        }
        Op::Expand { x } => {
            let x = arg(x);
            take(x, ty, broadcast_index(&ty.shape, x.shape()))
        }
        Op::Slice { x, ranges } => {
            let x = arg(x);
            let st = strides(x.shape());
            let index = indices(&ty.shape)
                .map(|idx| {
                    idx.iter()
                        .zip(ranges)
                        .zip(&st)
                        .map(|((&i, r), &s)| (r.start as usize + i * r.step as usize) * s)
                        .sum::<usize>()
                })
                .collect::<Vec<_>>();
            take(x, ty, index)
        }
        Op::Pad { x, pads, value } => {
            let x = arg(x);
            let size = x.dtype().size() as usize;
            let fill = &value.to_le_bytes()[..size];
            let st = strides(x.shape());
            let mut data = Vec::new();
            for idx in indices(&ty.shape) {
                let src: Option<usize> = idx.iter().zip(pads).zip(x.shape()).zip(&st).try_fold(
                    0usize,
                    |acc, (((&i, &(lo, _)), &d), &s)| {
                        let j = (i as u64).checked_sub(lo)?;
                        (j < d).then(|| acc + j as usize * s)
                    },
                );
                match src {
                    Some(i) => data.extend_from_slice(&x.bytes()[i * size..(i + 1) * size]),
                    None => data.extend_from_slice(fill),
                }
            }
            tensor(ty, data)
        }
        Op::Concat { xs, axis } => {
            let a = *axis as usize;
            let parts: Vec<&HostTensor> = xs.iter().map(arg).collect();
            let size = ty.dtype.size() as usize;
            let mut data = Vec::new();
            for idx in indices(&ty.shape) {
                let mut c = idx[a] as u64;
                let mut k = 0;
                while c >= parts[k].shape()[a] {
                    c -= parts[k].shape()[a];
                    k += 1;
                }
                let st = strides(parts[k].shape());
                let i: usize = idx
                    .iter()
                    .enumerate()
                    .map(|(d, &v)| if d == a { c as usize } else { v } * st[d])
                    .sum();
                data.extend_from_slice(&parts[k].bytes()[i * size..(i + 1) * size]);
            }
            tensor(ty, data)
        }
        Op::Gather {
            x,
            indices: ix,
            axis,
        } => gather(id, arg(x), arg(ix), *axis as usize, ty)?,
        Op::Iota { axis } => {
            let a = *axis as usize;
            let pos = indices(&ty.shape).map(|idx| idx[a] as i64);
            if ty.dtype.is_float() {
                floats_to(ty, pos.map(|v| v as f32))
            } else {
                ints_to(ty, pos)
            }
        }
        Op::TriMask { upper, diagonal } => {
            let r = ty.rank();
            let keep = indices(&ty.shape).map(|idx| {
                let (i, j) = (idx[r - 2] as i128, idx[r - 1] as i128);
                let d = *diagonal as i128;
                if *upper { j >= i + d } else { j <= i + d }
            });
            bools_to(&ty.shape, keep.collect::<Vec<_>>())
        }
        Op::Normalize { op, x, axis } => normalize(*op, arg(x), *axis as usize, ty),
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            let g = gamma.as_ref().map(|g| arg(g).to_f32_vec());
            let b = beta.as_ref().map(|b| arg(b).to_f32_vec());
            let eps = f32::from_bits(*eps_bits);
            rows(arg(x), ty, |row, out| {
                layer_norm_row(row, g.as_deref(), b.as_deref(), eps, out)
            })
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            let g = gamma.as_ref().map(|g| arg(g).to_f32_vec());
            let eps = f32::from_bits(*eps_bits);
            rows(arg(x), ty, |row, out| {
                rms_norm_row(row, g.as_deref(), eps, out)
            })
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => conv2d(
            arg(x),
            arg(w),
            bias.as_ref().map(arg),
            window,
            *groups as usize,
            ty,
            stopper,
        ),
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => pool2d(*kind, arg(x), *kernel, window, ty, stopper),
        Op::Random { dist, key } => {
            let n = ty.numel().unwrap_or(0);
            let scale = 1.0 / 16_777_216.0;
            let values = (0..n).map(|i| {
                let w = philox::words(seed, *key, i);
                match dist {
                    Distribution::Uniform => (w[0] >> 8) as f32 * scale,
                    Distribution::Normal => {
                        let u1 = ((w[0] >> 8) + 1) as f32 * scale;
                        let u2 = (w[1] >> 8) as f32 * scale;
                        (-2.0 * math::log(u1)).sqrt() * math::cos(6.283_185_5 * u2)
                    }
                }
            });
            floats_to(ty, values.collect::<Vec<_>>())
        }
    })
}

fn unary(op: UnaryOp, x: &HostTensor) -> HostTensor {
    use UnaryOp::*;
    let ty = x.ty();
    if x.dtype().is_float() && matches!(op, Neg | Abs) {
        // Sign-bit operations: exact on every value, NaN payloads untouched.
        let size = x.dtype().size() as usize;
        let mut data = x.bytes().to_vec();
        for top in data.iter_mut().skip(size - 1).step_by(size) {
            *top = if op == Neg { *top ^ 0x80 } else { *top & 0x7f };
        }
        return tensor(ty, data);
    }
    if op == Not {
        return bools_to(
            &ty.shape,
            x.bytes().iter().map(|&b| b == 0).collect::<Vec<_>>(),
        );
    }
    match vals(x) {
        Vals::I(v) => ints_to(
            ty,
            v.into_iter().map(|a| match op {
                Neg => a.wrapping_neg(),
                Abs => a.wrapping_abs(),
                Sign => a.signum(),
                _ => a.max(0), // relu: the only other op defined on integers
            }),
        ),
        Vals::F(v) => floats_to(
            ty,
            v.into_iter().map(|a| unary_f32(op, a)).collect::<Vec<_>>(),
        ),
    }
}

/// One float element of a unary op (docs/OPS.md, "Elementwise").
pub fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    use UnaryOp::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => math::exp(x),
        Log => math::log(x),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Reciprocal => 1.0 / x,
        Sin => math::sin(x),
        Cos => math::cos(x),
        Tanh => math::tanh(x),
        Sigmoid => 1.0 / (1.0 + math::exp(-x)),
        Relu => {
            if x.is_nan() {
                NAN
            } else if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        GeluErf => math::gelu_erf(x),
        GeluTanh => {
            let u = (x + 0.044_715 * ((x * x) * x)) * 0.797_884_6;
            (x * 0.5) * (1.0 + math::tanh(u))
        }
        Erf => math::erf(x),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        Sign => {
            if x.is_nan() {
                NAN
            } else if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        Not => NAN, // bool only; handled before
    }
}

fn binary(op: BinaryOp, a: &HostTensor, b: &HostTensor, ty: &TensorType) -> HostTensor {
    use BinaryOp::*;
    let (ia, ib) = (
        broadcast_index(&ty.shape, a.shape()),
        broadcast_index(&ty.shape, b.shape()),
    );
    let pairs = ia.iter().zip(&ib);
    match (vals(a), vals(b)) {
        (Vals::F(x), Vals::F(y)) => {
            if op.is_comparison() {
                let r = pairs.map(|(&i, &j)| compare(op, x[i].partial_cmp(&y[j])));
                return bools_to(&ty.shape, r.collect::<Vec<_>>());
            }
            let r = pairs.map(|(&i, &j)| binary_f32(op, x[i], y[j]));
            floats_to(ty, r.collect::<Vec<_>>())
        }
        (Vals::I(x), Vals::I(y)) => {
            if op.is_comparison() {
                let r = pairs.map(|(&i, &j)| compare(op, Some(x[i].cmp(&y[j]))));
                return bools_to(&ty.shape, r.collect::<Vec<_>>());
            }
            let r = pairs.map(|(&i, &j)| {
                let (p, q) = (x[i], y[j]);
                match op {
                    Add => p.wrapping_add(q),
                    Sub => p.wrapping_sub(q),
                    Mul => p.wrapping_mul(q),
                    Div => {
                        if q == 0 {
                            0
                        } else {
                            p.wrapping_div(q)
                        }
                    }
                    Max => p.max(q),
                    Min => p.min(q),
                    And => ((p != 0) && (q != 0)) as i64,
                    _ => ((p != 0) || (q != 0)) as i64, // Or
                }
            });
            ints_to(ty, r.collect::<Vec<_>>())
        }
        _ => unreachable!("validated graphs have operands of one dtype"),
    }
}

/// One element of a float arithmetic binary op (add, sub, mul, div, pow, max, min), before
/// rounding to the storage type (docs/OPS.md, "Elementwise").
pub fn binary_f32(op: BinaryOp, p: f32, q: f32) -> f32 {
    use BinaryOp::*;
    match op {
        Add => p + q,
        Sub => p - q,
        Mul => p * q,
        Div => p / q,
        Pow => math::pow(p, q),
        Max => fmax(p, q),
        Min => fmin(p, q),
        _ => NAN, // comparisons and logic produce bool; handled by the caller
    }
}

fn compare(op: BinaryOp, ord: Option<std::cmp::Ordering>) -> bool {
    use BinaryOp::*;
    use std::cmp::Ordering::*;
    match (op, ord) {
        (Ne, None) => true,
        (_, None) => false,
        (Eq, Some(o)) => o == Equal,
        (Ne, Some(o)) => o != Equal,
        (Lt, Some(o)) => o == Less,
        (Le, Some(o)) => o != Greater,
        (Gt, Some(o)) => o == Greater,
        (_, Some(o)) => o != Less, // Ge
    }
}

fn cast(x: &HostTensor, ty: &TensorType) -> HostTensor {
    let (from, to) = (x.dtype(), ty.dtype);
    if from == to {
        return x.clone();
    }
    if to == DType::Bool {
        return match vals(x) {
            Vals::F(v) => bools_to(
                &ty.shape,
                v.into_iter().map(|a| a != 0.0).collect::<Vec<_>>(),
            ),
            Vals::I(v) => bools_to(&ty.shape, v.into_iter().map(|a| a != 0).collect::<Vec<_>>()),
        };
    }
    match (vals(x), to.is_float()) {
        (Vals::F(v), true) => floats_to(ty, v),
        // int → float goes through f32 (one rounding for f32, a second for f16/bf16).
        (Vals::I(v), true) => floats_to(ty, v.into_iter().map(|a| a as f32).collect::<Vec<_>>()),
        (Vals::I(v), false) => ints_to(ty, v),
        (Vals::F(v), false) => {
            // Truncate toward zero, saturate at the target's bounds, NaN → 0.
            let conv = v.into_iter().map(|a| match to {
                DType::I32 => a as i32 as i64,
                DType::U8 => a as u8 as i64,
                _ => a as i64,
            });
            ints_to(ty, conv.collect::<Vec<_>>())
        }
    }
}

/// Offsets of the kept positions (one per output element) and of the reduced positions (in
/// row-major order over the reduced axes), so element `j` of output `o` is `kept[o] + red[j]`.
fn split_offsets(shape: &[u64], axes: &[u32]) -> (Vec<usize>, Vec<usize>) {
    let st = strides(shape);
    let (mut kept_dims, mut kept_st, mut red_dims, mut red_st) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in shape.iter().zip(&st).enumerate() {
        if axes.contains(&(d as u32)) {
            red_dims.push(n);
            red_st.push(s);
        } else {
            kept_dims.push(n);
            kept_st.push(s);
        }
    }
    let offsets = |dims: &[u64], sts: &[usize]| -> Vec<usize> {
        indices(dims)
            .map(|idx| idx.iter().zip(sts).map(|(i, s)| i * s).sum())
            .collect()
    };
    (offsets(&kept_dims, &kept_st), offsets(&red_dims, &red_st))
}

fn reduce(op: ReduceOp, x: &HostTensor, axes: &[u32], ty: &TensorType) -> HostTensor {
    use ReduceOp::*;
    let (kept, red) = split_offsets(x.shape(), axes);
    let (kept, red) = (&kept, &red);
    match vals(x) {
        Vals::F(v) => {
            let v = &v;
            let row = |o: usize| red.iter().map(move |&r| v[kept[o] + r]);
            let arg = |o: usize, better: fn(f32, f32) -> bool| {
                let mut best = 0;
                for (j, val) in row(o).enumerate().skip(1) {
                    let b = v[kept[o] + red[best]];
                    if !b.is_nan() && (val.is_nan() || better(val, b)) {
                        best = j;
                    }
                }
                best as i64
            };
            match op {
                Sum => floats_to(
                    ty,
                    (0..kept.len())
                        .map(|o| sum_ordered(row(o)))
                        .collect::<Vec<_>>(),
                ),
                Mean => floats_to(
                    ty,
                    (0..kept.len())
                        .map(|o| sum_ordered(row(o)) / red.len() as f32)
                        .collect::<Vec<_>>(),
                ),
                Max => floats_to(
                    ty,
                    (0..kept.len())
                        .map(|o| row(o).reduce(fmax).unwrap_or(NAN))
                        .collect::<Vec<_>>(),
                ),
                Min => floats_to(
                    ty,
                    (0..kept.len())
                        .map(|o| row(o).reduce(fmin).unwrap_or(NAN))
                        .collect::<Vec<_>>(),
                ),
                ArgMax => ints_to(
                    ty,
                    (0..kept.len())
                        .map(|o| arg(o, |a, b| a > b))
                        .collect::<Vec<_>>(),
                ),
                ArgMin => ints_to(
                    ty,
                    (0..kept.len())
                        .map(|o| arg(o, |a, b| a < b))
                        .collect::<Vec<_>>(),
                ),
            }
        }
        Vals::I(v) => {
            let v = &v;
            let row = |o: usize| red.iter().map(move |&r| v[kept[o] + r]);
            let arg = |o: usize, better: fn(i64, i64) -> bool| {
                let mut best = 0;
                for (j, val) in row(o).enumerate().skip(1) {
                    if better(val, v[kept[o] + red[best]]) {
                        best = j;
                    }
                }
                best as i64
            };
            let out = (0..kept.len()).map(|o| match op {
                Sum | Mean => row(o).fold(0i64, i64::wrapping_add),
                Max => row(o).max().unwrap_or(0),
                Min => row(o).min().unwrap_or(0),
                ArgMax => arg(o, |a, b| a > b),
                ArgMin => arg(o, |a, b| a < b),
            });
            ints_to(ty, out.collect::<Vec<_>>())
        }
    }
}

fn matmul(a: &HostTensor, b: &HostTensor, ty: &TensorType, stopper: &Stopper<'_>) -> HostTensor {
    let (ra, rb, r) = (a.shape().len(), b.shape().len(), ty.rank());
    let (m, k, n) = (
        a.shape()[ra - 2] as usize,
        a.shape()[ra - 1] as usize,
        b.shape()[rb - 1] as usize,
    );
    let batch = &ty.shape[..r - 2];
    let ia = broadcast_index(batch, &a.shape()[..ra - 2]);
    let ib = broadcast_index(batch, &b.shape()[..rb - 2]);
    match (vals(a), vals(b)) {
        (Vals::F(x), Vals::F(y)) => {
            let mut out = Vec::with_capacity(ia.len() * m * n);
            for (&ba, &bb) in ia.iter().zip(&ib) {
                let (x, y) = (&x[ba * m * k..], &y[bb * k * n..]);
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0.0f32;
                        if stopper.skip(k as u64) {
                            out.push(acc);
                            continue;
                        }
                        for p in 0..k {
                            acc = x[i * k + p].mul_add(y[p * n + j], acc);
                        }
                        out.push(acc);
                    }
                }
            }
            floats_to(ty, out)
        }
        (Vals::I(x), Vals::I(y)) => {
            let mut out = Vec::with_capacity(ia.len() * m * n);
            for (&ba, &bb) in ia.iter().zip(&ib) {
                let (x, y) = (&x[ba * m * k..], &y[bb * k * n..]);
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0i64;
                        if stopper.skip(k as u64) {
                            out.push(acc);
                            continue;
                        }
                        for p in 0..k {
                            acc = acc.wrapping_add(x[i * k + p].wrapping_mul(y[p * n + j]));
                        }
                        out.push(acc);
                    }
                }
            }
            ints_to(ty, out)
        }
        _ => unreachable!("validated graphs have operands of one dtype"),
    }
}

/// `dequantize`: each block's 32 values by [`quant::dequantize_block`], blocks in order.
fn dequantize(
    x: &HostTensor,
    format: QuantFormat,
    ty: &TensorType,
    stopper: &Stopper<'_>,
) -> HostTensor {
    let mut out = Vec::with_capacity(ty.numel().unwrap_or(0) as usize);
    let mut vals = [0.0f32; quant::BLOCK];
    for b in x.bytes().chunks_exact(format.block_bytes() as usize) {
        if !stopper.skip(quant::BLOCK as u64) {
            quant::dequantize_block(format, b, &mut vals);
        }
        out.extend_from_slice(&vals);
    }
    floats_to(ty, out)
}

/// `qmatmul`: `a[..., m, k]` times the transpose of the dequantised `w[n, k/32, bb]`, each
/// output the matmul's chain `acc = +0; acc = fma(a[i, p], deq(w)[j, p], acc)`, p ascending.
fn qmatmul(
    a: &HostTensor,
    w: &HostTensor,
    format: QuantFormat,
    ty: &TensorType,
    stopper: &Stopper<'_>,
) -> HostTensor {
    let k = *a.shape().last().expect("rank >= 2") as usize;
    let n = w.shape()[0] as usize;
    let rows = a.numel().checked_div(k).unwrap_or(0);
    let x = a.to_f32_vec();
    // The dequantised weight, row j holding W[j, 0..k]; asking `stop` as it goes.
    let mut wd = vec![0.0f32; n * k];
    let mut vals = [0.0f32; quant::BLOCK];
    let blocks = w.bytes().chunks_exact(format.block_bytes() as usize);
    for (row, b) in wd.chunks_exact_mut(quant::BLOCK).zip(blocks) {
        if stopper.skip(quant::BLOCK as u64) {
            break;
        }
        quant::dequantize_block(format, b, &mut vals);
        row.copy_from_slice(&vals);
    }
    let mut out = Vec::with_capacity(rows * n);
    for i in 0..rows {
        for j in 0..n {
            let mut acc = 0.0f32;
            if stopper.skip(k as u64) {
                out.push(acc);
                continue;
            }
            for p in 0..k {
                acc = x[i * k + p].mul_add(wd[j * k + p], acc);
            }
            out.push(acc);
        }
    }
    floats_to(ty, out)
}

/// `qmatmul_q8`: each row of `a[..., m, k]` rounded to 8-bit blocks, each output the blocks'
/// integer products combined in block order (`quant`'s header defines every step).
fn qmatmul_q8(
    a: &HostTensor,
    w: &HostTensor,
    format: QuantFormat,
    ty: &TensorType,
    stopper: &Stopper<'_>,
) -> HostTensor {
    let k = *a.shape().last().expect("rank >= 2") as usize;
    let n = w.shape()[0] as usize;
    let rows = a.numel().checked_div(k).unwrap_or(0);
    let x = a.to_f32_vec();
    let bb = format.block_bytes() as usize;
    let nb = k / quant::BLOCK;
    let mut out = Vec::with_capacity(rows * n);
    for i in 0..rows {
        let blocks: Vec<quant::Q8Block> = x[i * k..(i + 1) * k]
            .chunks_exact(quant::BLOCK)
            .map(quant::quantize_activations)
            .collect();
        for j in 0..n {
            let mut acc = 0.0f32;
            if !stopper.skip(k as u64) {
                let row = &w.bytes()[j * nb * bb..(j + 1) * nb * bb];
                for (wb, xb) in row.chunks_exact(bb).zip(&blocks) {
                    acc = quant::accumulate_block(format, wb, xb, acc);
                }
            }
            out.push(acc);
        }
    }
    floats_to(ty, out)
}

fn gather(
    id: NodeId,
    x: &HostTensor,
    ix: &HostTensor,
    a: usize,
    ty: &TensorType,
) -> Result<HostTensor, RunError> {
    let size_a = x.shape()[a];
    let idx_vals = ix.to_i64_vec();
    let ri = ix.shape().len();
    let st = strides(x.shape());
    let ist = strides(ix.shape());
    let mut index = Vec::with_capacity(ty.numel().unwrap_or(0) as usize);
    for out in indices(&ty.shape) {
        let pos: usize = out[a..a + ri].iter().zip(&ist).map(|(i, s)| i * s).sum();
        let raw = idx_vals[pos];
        let v = if raw < 0 {
            raw.wrapping_add(size_a as i64)
        } else {
            raw
        };
        if v < 0 || v as u64 >= size_a {
            return Err(RunError::IndexOutOfRange {
                node: id,
                index: raw,
                size: size_a,
            });
        }
        let mut flat = v as usize * st[a];
        for d in 0..a {
            flat += out[d] * st[d];
        }
        for d in a + 1..x.shape().len() {
            flat += out[d + ri - 1] * st[d];
        }
        index.push(flat);
    }
    Ok(take(x, ty, index))
}

/// Apply `f` to every row along the last axis of float tensor `x`.
fn rows(x: &HostTensor, ty: &TensorType, f: impl Fn(&[f32], &mut [f32])) -> HostTensor {
    let v = x.to_f32_vec();
    let n = *x.shape().last().unwrap_or(&1) as usize;
    let mut out = vec![0.0f32; v.len()];
    if n > 0 {
        for (row, o) in v.chunks(n).zip(out.chunks_mut(n)) {
            f(row, o);
        }
    }
    floats_to(ty, out)
}

/// Layer normalisation of one row (docs/OPS.md, "Normalisations").
pub fn layer_norm_row(
    row: &[f32],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) {
    let n = row.len() as f32;
    let mean = sum_ordered(row.iter().copied()) / n;
    let var = sum_ordered(row.iter().map(|&v| (v - mean) * (v - mean))) / n;
    let r = 1.0 / (var + eps).sqrt();
    for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
        let mut y = (v - mean) * r;
        if let Some(g) = gamma {
            y *= g[j];
        }
        if let Some(b) = beta {
            y += b[j];
        }
        *o = y;
    }
}

/// RMS normalisation of one row (docs/OPS.md, "Normalisations").
pub fn rms_norm_row(row: &[f32], gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let ms = sum_ordered(row.iter().map(|&v| v * v)) / row.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
        *o = match gamma {
            Some(g) => (v * r) * g[j],
            None => v * r,
        };
    }
}

/// Softmax or log-softmax of one contiguous row (docs/OPS.md, "Normalisations").
#[inline]
pub fn softmax_row(op: NormOp, row: &[f32], out: &mut [f32]) {
    softmax_or_log_row(matches!(op, NormOp::LogSoftmax), row, out)
}

/// [`softmax_row`] for callers that do not speak the graph's types (the kernels): log-softmax
/// if `log`, else softmax.
pub fn softmax_or_log_row(log: bool, row: &[f32], out: &mut [f32]) {
    let Some(m) = row.iter().copied().reduce(fmax) else {
        return;
    };
    for (o, &a) in out.iter_mut().zip(row) {
        *o = math::exp(a - m);
    }
    let s = sum_ordered(out.iter().copied());
    if log {
        let ls = math::log(s);
        for (o, &a) in out.iter_mut().zip(row) {
            *o = (a - m) - ls;
        }
    } else {
        out.iter_mut().for_each(|e| *e /= s);
    }
}

fn normalize(op: NormOp, x: &HostTensor, axis: usize, ty: &TensorType) -> HostTensor {
    let v = x.to_f32_vec();
    let (kept, red) = split_offsets(x.shape(), &[axis as u32]);
    let mut out = vec![0.0f32; v.len()];
    let (mut row, mut res) = (vec![0.0f32; red.len()], vec![0.0f32; red.len()]);
    for &base in &kept {
        for (r, &off) in row.iter_mut().zip(&red) {
            *r = v[base + off];
        }
        softmax_row(op, &row, &mut res);
        for (&y, &off) in res.iter().zip(&red) {
            out[base + off] = y;
        }
    }
    floats_to(ty, out)
}

/// Input coordinate for output position `o`, kernel tap `k` along one spatial axis, or `None`
/// inside the padding.
fn tap(
    o: usize,
    k: usize,
    stride: u32,
    pad_before: u32,
    dilation: u32,
    size: u64,
) -> Option<usize> {
    let pos = (o * stride as usize + k * dilation as usize).checked_sub(pad_before as usize)?;
    (pos < size as usize).then_some(pos)
}

fn conv2d(
    x: &HostTensor,
    w: &HostTensor,
    bias: Option<&HostTensor>,
    win: &Window2d,
    groups: usize,
    ty: &TensorType,
    stopper: &Stopper<'_>,
) -> HostTensor {
    let (xv, wv) = (x.to_f32_vec(), w.to_f32_vec());
    let bv = bias.map(|b| b.to_f32_vec());
    let [_, c, h, wd] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let [o_ch, cg, kh, kw] =
        [w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]].map(|d| d as usize);
    let og = o_ch / groups;
    let (xs, ws) = (strides(x.shape()), strides(w.shape()));
    let out = indices(&ty.shape).map(|idx| {
        let [n, o, oh, ow] = [idx[0], idx[1], idx[2], idx[3]];
        let g = o / og;
        let mut acc = 0.0f32;
        if stopper.skip((cg * kh * kw) as u64) {
            return acc;
        }
        for ci in 0..cg {
            for i in 0..kh {
                let Some(ih) = tap(oh, i, win.stride[0], win.padding[0], win.dilation[0], h) else {
                    continue;
                };
                for j in 0..kw {
                    let Some(iw) = tap(ow, j, win.stride[1], win.padding[1], win.dilation[1], wd)
                    else {
                        continue;
                    };
                    let xi = n * xs[0] + (g * cg + ci) * xs[1] + ih * xs[2] + iw * xs[3];
                    let wi = o * ws[0] + ci * ws[1] + i * ws[2] + j * ws[3];
                    acc = xv[xi].mul_add(wv[wi], acc);
                }
            }
        }
        match &bv {
            Some(b) => acc + b[o],
            None => acc,
        }
    });
    let _ = c;
    floats_to(ty, out.collect::<Vec<_>>())
}

fn pool2d(
    kind: PoolKind,
    x: &HostTensor,
    kernel: [u32; 2],
    win: &Window2d,
    ty: &TensorType,
    stopper: &Stopper<'_>,
) -> HostTensor {
    let xs = strides(x.shape());
    let taps = (kernel[0] as u64).saturating_mul(kernel[1] as u64);
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let window = |idx: &[usize]| -> Vec<usize> {
        let mut taps = Vec::new();
        for i in 0..kernel[0] as usize {
            let Some(ih) = tap(idx[2], i, win.stride[0], win.padding[0], win.dilation[0], h) else {
                continue;
            };
            for j in 0..kernel[1] as usize {
                let Some(iw) = tap(idx[3], j, win.stride[1], win.padding[1], win.dilation[1], w)
                else {
                    continue;
                };
                taps.push(idx[0] * xs[0] + idx[1] * xs[1] + ih * xs[2] + iw * xs[3]);
            }
        }
        taps
    };
    match vals(x) {
        Vals::F(v) => {
            let out = indices(&ty.shape).map(|idx| {
                if stopper.skip(taps) {
                    return NAN;
                }
                let taps = window(&idx);
                match kind {
                    PoolKind::Max => taps.iter().map(|&t| v[t]).reduce(fmax).unwrap_or(NAN),
                    _ => {
                        let sum = taps.iter().fold(0.0f32, |acc, &t| acc + v[t]);
                        let count = if kind == PoolKind::Avg {
                            taps.len() as f32
                        } else {
                            (kernel[0] * kernel[1]) as f32
                        };
                        sum / count
                    }
                }
            });
            floats_to(ty, out.collect::<Vec<_>>())
        }
        Vals::I(v) => {
            let out = indices(&ty.shape).map(|idx| {
                if stopper.skip(taps) {
                    return 0;
                }
                window(&idx).iter().map(|&t| v[t]).max().unwrap_or(0)
            });
            ints_to(ty, out.collect::<Vec<_>>())
        }
    }
}
