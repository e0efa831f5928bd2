//! An independent, slow, obvious evaluator of a `tenet_ir::Graph` in **f64**, for gradient
//! checks by central finite differences.
//!
//! It follows the op semantics of docs/OPS.md, but computes every float in f64 with plain
//! arithmetic (no f32 rounding, no summation order, no half-precision storage rounding): it is
//! the mathematical function the graph denotes, evaluated about as exactly as f64 allows.
//! `crates/reference/src/interp.rs` (the f32 interpreter that defines the bits) was read for
//! shape, broadcast and index details only; nothing of it is called here.
//!
//! Every tensor is a flat row-major `Vec<f64>` whose shape is its node's `TensorType`.
//! Integer and bool tensors are held as f64 too (bool as 0.0 / 1.0); integer arithmetic wraps
//! to the node's dtype as OPS.md says, and is exact while values stay below 2^53 in magnitude.
//!
//! Choices where "in f64" needs a word:
//! - `cast` between float dtypes keeps the f64 value (no rounding to f16/bf16/f32); int →
//!   float keeps the value; float → int truncates toward zero, saturates at the target's
//!   bounds, NaN → 0; int → int wraps (two's complement); → bool is `x != 0` (NaN → true).
//! - `gelu_erf` and `gelu_tanh` use OPS.md's f32 constants (0.70710677, 0.044715, 0.7978846),
//!   taken exactly as f64 values, so the function is the one the spec writes down.
//! - `erf` is this file's own f64 function ([`erf`]): a positive-term series below 1, a
//!   continued fraction for erfc above (within 6e-16 relative).
//! - `pow` is `f64::powf` (IEEE special cases); `exp`, `log`, `sin`, `cos`, `tanh`, `sqrt` are
//!   std's f64 functions.
//! - Sums (reductions, matmul, conv2d, the norms, softmax) are plain sequential f64 sums.
//! - NaNs are whatever f64 arithmetic gives (no canonical payloads); `max`/`min` and the
//!   reductions built on them follow OPS.md's NaN and signed-zero rules.
//!
//! Ops not needed for gradient checks (`weight`, `random_*`, `dequantize`, `qmatmul`) panic.

#![allow(dead_code)]

use std::collections::HashMap;

use half::{bf16, f16};
use tenet_ir::{
    BinaryOp, DType, Graph, NormOp, Op, PoolKind, ReduceOp, SliceRange, TensorType, UnaryOp,
    Window2d,
};

/// `gelu_erf`'s `t = x * C`, C the f32 constant `0x3f3504f3` of docs/OPS.md, as f64.
pub const GELU_ERF_C: f64 = f32::from_bits(0x3f35_04f3) as f64;
/// `gelu_tanh`'s cubic coefficient, the f32 literal `0.044715`, as f64.
pub const GELU_TANH_A: f64 = 0.044_715_f32 as f64;
/// `gelu_tanh`'s outer factor, the f32 constant `0x3f4c422a`, as f64.
pub const GELU_TANH_C: f64 = f32::from_bits(0x3f4c_422a) as f64;

/// Evaluate `graph` in f64 on named `inputs` (flat row-major values of each input's declared
/// shape, whatever its dtype). Returns every output by name.
///
/// Panics, with a message naming the node, on a missing, unknown or wrongly sized input, an
/// out-of-range gather index, and on the ops this evaluator does not support.
pub fn eval_f64(graph: &Graph, inputs: &HashMap<String, Vec<f64>>) -> HashMap<String, Vec<f64>> {
    let values = eval_all_f64(graph, inputs);
    graph
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), values[o.node.index()].clone()))
        .collect()
}

/// [`eval_f64`], returning the value of every node, indexed like `graph.nodes()`.
pub fn eval_all_f64(graph: &Graph, inputs: &HashMap<String, Vec<f64>>) -> Vec<Vec<f64>> {
    let known: Vec<&str> = graph.inputs().map(|(_, n, _)| n).collect();
    for name in inputs.keys() {
        assert!(
            known.contains(&name.as_str()),
            "f64_eval: input {name:?} is not an input of the graph (its inputs: {known:?})"
        );
    }
    let nodes = graph.nodes();
    let mut values: Vec<Vec<f64>> = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let v = eval_node(i, &node.op, &node.ty, graph, inputs, &values);
        assert_eq!(
            v.len(),
            numel(&node.ty.shape),
            "f64_eval: node %{i} ({}) produced {} values for {}",
            node.op.name(),
            v.len(),
            node.ty
        );
        values.push(v);
    }
    values
}

// ---------------------------------------------------------------------------------------------
// Index arithmetic.

fn numel(shape: &[u64]) -> usize {
    shape.iter().product::<u64>() as usize
}

fn strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// The multi-index of flat row-major position `flat` in `shape`.
fn unravel(flat: usize, shape: &[u64]) -> Vec<usize> {
    let mut idx = vec![0usize; shape.len()];
    let mut rest = flat;
    for d in (0..shape.len()).rev() {
        let n = shape[d] as usize;
        idx[d] = rest % n;
        rest /= n;
    }
    idx
}

/// Flat position in `inp` (numpy-broadcast to `out`) read by the output multi-index `idx`.
fn broadcast_at(idx: &[usize], inp: &[u64]) -> usize {
    let off = idx.len() - inp.len();
    let st = strides(inp);
    (0..inp.len())
        .map(|d| if inp[d] == 1 { 0 } else { idx[off + d] * st[d] })
        .sum()
}

/// For every output element (row-major in `out`), the flat position it reads in `inp`.
fn broadcast_map(out: &[u64], inp: &[u64]) -> Vec<usize> {
    (0..numel(out))
        .map(|f| broadcast_at(&unravel(f, out), inp))
        .collect()
}

/// Offsets of the kept positions and of the reduced positions (row-major over the reduced
/// axes), so element `j` of kept position `o` is at `kept[o] + red[j]`.
fn split_offsets(shape: &[u64], axes: &[u32]) -> (Vec<usize>, Vec<usize>) {
    let st = strides(shape);
    let (mut kd, mut ks, mut rd, mut rs) = (vec![], vec![], vec![], vec![]);
    for d in 0..shape.len() {
        if axes.contains(&(d as u32)) {
            rd.push(shape[d]);
            rs.push(st[d]);
        } else {
            kd.push(shape[d]);
            ks.push(st[d]);
        }
    }
    let offsets = |dims: &[u64], sts: &[usize]| -> Vec<usize> {
        (0..numel(dims))
            .map(|f| unravel(f, dims).iter().zip(sts).map(|(i, s)| i * s).sum())
            .collect()
    };
    (offsets(&kd, &ks), offsets(&rd, &rs))
}

// ---------------------------------------------------------------------------------------------
// Scalars.

fn is_int(d: DType) -> bool {
    matches!(d, DType::I32 | DType::I64 | DType::U8 | DType::Bool)
}

/// An integer-valued element as an exact integer (values are integers below 2^53).
fn int(v: f64) -> i128 {
    v as i128
}

/// Two's complement truncation of `v` to `dtype`, back as f64.
fn wrap(dtype: DType, v: i128) -> f64 {
    match dtype {
        DType::I32 => v as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::U8 => v as u8 as f64,
        DType::Bool => f64::from(u8::from(v != 0)),
        d => panic!("f64_eval: wrap to non-integer dtype {d}"),
    }
}

/// A plain sequential f64 sum from +0 (std's float `Sum` starts at -0, and an empty sum is
/// +0 in OPS.md).
fn sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    xs.into_iter().fold(0.0, |acc, x| acc + x)
}

fn b2f(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// OPS.md's `max`: NaN if either is NaN, `max(-0, +0) = +0`.
pub fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
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

/// OPS.md's `min`: NaN if either is NaN, `min(-0, +0) = -0`.
pub fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
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

/// The error function in f64 (std has none): within 6e-16 relative of 40-digit values on
/// [0, 6] (checked against mpmath when written; tests/f64_eval.rs checks tabulated values).
///
/// Below 1: `erf(x) = 2/√π · x · e^{-x²} · Σ_n (2x²)^n / (1·3·…·(2n+1))`, a series of
/// positive terms (no cancellation), with `e^{-x²}` taken from `x²` split exactly into
/// `hi + lo`. From 1: `erf = 1 - erfc`, `erfc(x) = e^{-x²}/√π · 1/(x + ½/(x + 1/(x + 3/2/(x +
/// …))))`, the continued fraction evaluated backwards from depth 500 (converged to f64 from
/// x ≈ 0.7 on). ±1 from 6 on (erfc(6) < 2.2e-17); NaN stays NaN; odd.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return -erf(-x);
    }
    if x == 0.0 {
        return x;
    }
    if x >= 6.0 {
        return 1.0;
    }
    // e^{-x²} with x² = hi + lo exactly.
    let hi = x * x;
    let lo = x.mul_add(x, -hi);
    let e = (-hi).exp() * (-lo).exp();
    if x < 1.0 {
        let two_x2 = 2.0 * x * x;
        let (mut term, mut sum) = (1.0f64, 1.0f64);
        let mut n = 0u32;
        loop {
            n += 1;
            term *= two_x2 / f64::from(2 * n + 1);
            sum += term;
            if term < sum * 1e-18 {
                break;
            }
        }
        std::f64::consts::FRAC_2_SQRT_PI * x * e * sum
    } else {
        1.0 - erfc_cf(x, e)
    }
}

/// erfc(x) for x >= 1 by its continued fraction; `e` is `exp(-x²)`.
fn erfc_cf(x: f64, e: f64) -> f64 {
    let mut f = x;
    for n in (1..=500u32).rev() {
        f = x + f64::from(n) * 0.5 / f;
    }
    e / (std::f64::consts::PI.sqrt() * f)
}

fn unary_float(op: UnaryOp, x: f64) -> f64 {
    use UnaryOp::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Reciprocal => 1.0 / x,
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Relu => {
            if x.is_nan() {
                f64::NAN
            } else if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        GeluErf => (x * 0.5) * (1.0 + erf(x * GELU_ERF_C)),
        GeluTanh => {
            let u = (x + GELU_TANH_A * ((x * x) * x)) * GELU_TANH_C;
            (x * 0.5) * (1.0 + u.tanh())
        }
        Erf => erf(x),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        Sign => {
            if x.is_nan() {
                f64::NAN
            } else if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        Not => panic!("f64_eval: not of a float"),
    }
}

fn unary(op: UnaryOp, dtype: DType, x: &[f64]) -> Vec<f64> {
    if op == UnaryOp::Not {
        return x.iter().map(|&v| b2f(v == 0.0)).collect();
    }
    if dtype.is_float() {
        return x.iter().map(|&v| unary_float(op, v)).collect();
    }
    x.iter()
        .map(|&v| {
            let a = int(v);
            let r = match op {
                UnaryOp::Neg => -a,
                UnaryOp::Abs => a.abs(),
                UnaryOp::Sign => a.signum(),
                UnaryOp::Relu => a.max(0),
                _ => panic!("f64_eval: unary {} of integer dtype {dtype}", op.name()),
            };
            wrap(dtype, r)
        })
        .collect()
}

fn compare(op: BinaryOp, a: f64, b: f64) -> bool {
    use BinaryOp::*;
    match op {
        Eq => a == b,
        Ne => a != b,
        Lt => a < b,
        Le => a <= b,
        Gt => a > b,
        Ge => a >= b,
        _ => unreachable!(),
    }
}

/// One element of a binary op on operands of dtype `dtype`.
fn binary_elem(op: BinaryOp, dtype: DType, a: f64, b: f64) -> f64 {
    use BinaryOp::*;
    if op.is_comparison() {
        return b2f(compare(op, a, b));
    }
    match op {
        And => return b2f(a != 0.0 && b != 0.0),
        Or => return b2f(a != 0.0 || b != 0.0),
        _ => {}
    }
    if dtype.is_float() {
        return match op {
            Add => a + b,
            Sub => a - b,
            Mul => a * b,
            Div => a / b,
            Pow => a.powf(b),
            Max => fmax(a, b),
            Min => fmin(a, b),
            _ => unreachable!(),
        };
    }
    let (p, q) = (int(a), int(b));
    let r = match op {
        Add => p + q,
        Sub => p - q,
        Mul => p.wrapping_mul(q),
        // Truncating; x / 0 = 0; MIN / -1 wraps back to MIN.
        Div => {
            if q == 0 {
                0
            } else {
                p / q
            }
        }
        Max => p.max(q),
        Min => p.min(q),
        _ => panic!("f64_eval: {} of integer dtype {dtype}", op.name()),
    };
    wrap(dtype, r)
}

/// Decode element `i` of little-endian `data` of `dtype` as f64.
fn decode(dtype: DType, data: &[u8], i: usize) -> f64 {
    let s = dtype.size() as usize;
    let b = &data[i * s..(i + 1) * s];
    match dtype {
        DType::F32 => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => f64::from(i32::from_le_bytes(b.try_into().unwrap())),
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => f64::from(b[0]),
        DType::Bool => b2f(b[0] != 0),
    }
}

/// `cast` of one element from `from` to `to` (see the module comment).
fn cast_elem(from: DType, to: DType, v: f64) -> f64 {
    if from == to {
        return v;
    }
    match to {
        DType::Bool => b2f(v != 0.0),
        DType::F32 | DType::F16 | DType::BF16 => v,
        DType::I32 | DType::I64 | DType::U8 if is_int(from) => wrap(to, int(v)),
        // float → int: truncate toward zero, saturate, NaN → 0 (Rust's `as`).
        DType::I32 => v as i32 as f64,
        DType::I64 => v as i64 as f64,
        DType::U8 => v as u8 as f64,
    }
}

// ---------------------------------------------------------------------------------------------
// Ops.

fn eval_node(
    at: usize,
    op: &Op,
    ty: &TensorType,
    graph: &Graph,
    inputs: &HashMap<String, Vec<f64>>,
    values: &[Vec<f64>],
) -> Vec<f64> {
    let v = |n: &tenet_ir::NodeId| -> &Vec<f64> { &values[n.index()] };
    let ty_of = |n: &tenet_ir::NodeId| -> &TensorType { &graph.nodes()[n.index()].ty };
    let unsupported = || -> ! {
        panic!(
            "f64_eval: node %{at} is {}, which the f64 evaluator does not support \
             (weights, random numbers and quantised ops are not needed for gradient checks)",
            op.name()
        )
    };
    match op {
        Op::Input { name } => {
            let x = inputs.get(name).unwrap_or_else(|| {
                panic!("f64_eval: missing input {name:?} ({ty})");
            });
            assert_eq!(
                x.len(),
                numel(&ty.shape),
                "f64_eval: input {name:?} has {} values, its type {ty} needs {}",
                x.len(),
                numel(&ty.shape)
            );
            x.clone()
        }
        Op::Weight { .. } | Op::Random { .. } | Op::Dequantize { .. } | Op::QMatMul { .. } => {
            unsupported()
        }
        Op::Constant { data } => (0..numel(&ty.shape))
            .map(|i| decode(ty.dtype, data, i))
            .collect(),
        Op::Unary { op, x } => unary(*op, ty_of(x).dtype, v(x)),
        Op::Binary { op, a, b } => {
            let dtype = ty_of(a).dtype;
            let (ia, ib) = (
                broadcast_map(&ty.shape, &ty_of(a).shape),
                broadcast_map(&ty.shape, &ty_of(b).shape),
            );
            let (xa, xb) = (v(a), v(b));
            ia.iter()
                .zip(&ib)
                .map(|(&i, &j)| binary_elem(*op, dtype, xa[i], xb[j]))
                .collect()
        }
        Op::Where { cond, a, b } => {
            let ic = broadcast_map(&ty.shape, &ty_of(cond).shape);
            let ia = broadcast_map(&ty.shape, &ty_of(a).shape);
            let ib = broadcast_map(&ty.shape, &ty_of(b).shape);
            (0..ic.len())
                .map(|k| {
                    if v(cond)[ic[k]] != 0.0 {
                        v(a)[ia[k]]
                    } else {
                        v(b)[ib[k]]
                    }
                })
                .collect()
        }
        Op::Cast { x } => {
            let from = ty_of(x).dtype;
            v(x).iter().map(|&e| cast_elem(from, ty.dtype, e)).collect()
        }
        Op::Reduce { op, x, axes, .. } => reduce(*op, ty_of(x), v(x), axes),
        Op::MatMul { a, b } => matmul(ty_of(a), v(a), ty_of(b), v(b), ty),
        Op::Reshape { x } => v(x).clone(),
        Op::Permute { x, perm } => {
            let st = strides(&ty_of(x).shape);
            (0..numel(&ty.shape))
                .map(|f| {
                    let idx = unravel(f, &ty.shape);
                    let src: usize = idx
                        .iter()
                        .zip(perm)
                        .map(|(&i, &p)| i * st[p as usize])
                        .sum();
                    v(x)[src]
                })
                .collect()
        }
        Op::Expand { x } => broadcast_map(&ty.shape, &ty_of(x).shape)
            .into_iter()
            .map(|i| v(x)[i])
            .collect(),
        Op::Slice { x, ranges } => slice(&ty_of(x).shape, v(x), ranges, ty),
        Op::Pad { x, pads, value } => {
            let tx = ty_of(x);
            let fill = decode(tx.dtype, &value.to_le_bytes(), 0);
            let st = strides(&tx.shape);
            (0..numel(&ty.shape))
                .map(|f| {
                    let idx = unravel(f, &ty.shape);
                    let mut src = 0usize;
                    for d in 0..idx.len() {
                        let (lo, _) = pads[d];
                        let i = idx[d] as u64;
                        if i < lo || i - lo >= tx.shape[d] {
                            return fill;
                        }
                        src += (i - lo) as usize * st[d];
                    }
                    v(x)[src]
                })
                .collect()
        }
        Op::Concat { xs, axis } => {
            let a = *axis as usize;
            (0..numel(&ty.shape))
                .map(|f| {
                    let mut idx = unravel(f, &ty.shape);
                    let mut k = 0;
                    while idx[a] >= ty_of(&xs[k]).shape[a] as usize {
                        idx[a] -= ty_of(&xs[k]).shape[a] as usize;
                        k += 1;
                    }
                    let st = strides(&ty_of(&xs[k]).shape);
                    let src: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
                    v(&xs[k])[src]
                })
                .collect()
        }
        Op::Gather { x, indices, axis } => gather(
            at,
            &ty_of(x).shape,
            v(x),
            &ty_of(indices).shape,
            v(indices),
            *axis as usize,
            ty,
        ),
        Op::Iota { axis } => (0..numel(&ty.shape))
            .map(|f| {
                let i = unravel(f, &ty.shape)[*axis as usize];
                if ty.dtype.is_float() {
                    i as f64
                } else {
                    wrap(ty.dtype, i as i128)
                }
            })
            .collect(),
        Op::TriMask { upper, diagonal } => {
            let r = ty.shape.len();
            (0..numel(&ty.shape))
                .map(|f| {
                    let idx = unravel(f, &ty.shape);
                    let (i, j) = (idx[r - 2] as i128, idx[r - 1] as i128);
                    let d = *diagonal as i128;
                    b2f(if *upper { j >= i + d } else { j <= i + d })
                })
                .collect()
        }
        Op::Normalize { op, x, axis } => normalize(*op, &ty_of(x).shape, v(x), *axis),
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            let eps = f64::from(f32::from_bits(*eps_bits));
            let g = gamma.as_ref().map(|g| v(g).as_slice());
            let b = beta.as_ref().map(|b| v(b).as_slice());
            rows(&ty_of(x).shape, v(x), |row, out| {
                let n = row.len() as f64;
                let mean = sum(row.iter().copied()) / n;
                let var = sum(row.iter().map(|&e| (e - mean) * (e - mean))) / n;
                let r = 1.0 / (var + eps).sqrt();
                for (j, (o, &e)) in out.iter_mut().zip(row).enumerate() {
                    let mut y = (e - mean) * r;
                    if let Some(g) = g {
                        y *= g[j];
                    }
                    if let Some(b) = b {
                        y += b[j];
                    }
                    *o = y;
                }
            })
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            let eps = f64::from(f32::from_bits(*eps_bits));
            let g = gamma.as_ref().map(|g| v(g).as_slice());
            rows(&ty_of(x).shape, v(x), |row, out| {
                let ms = sum(row.iter().map(|&e| e * e)) / row.len() as f64;
                let r = 1.0 / (ms + eps).sqrt();
                for (j, (o, &e)) in out.iter_mut().zip(row).enumerate() {
                    *o = match g {
                        Some(g) => (e * r) * g[j],
                        None => e * r,
                    };
                }
            })
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => conv2d(
            &ty_of(x).shape,
            v(x),
            &ty_of(w).shape,
            v(w),
            bias.as_ref().map(|b| v(b).as_slice()),
            window,
            *groups as usize,
            ty,
        ),
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => pool2d(*kind, ty_of(x), v(x), *kernel, window, ty),
    }
}

fn reduce(op: ReduceOp, tx: &TensorType, x: &[f64], axes: &[u32]) -> Vec<f64> {
    use ReduceOp::*;
    let (kept, red) = split_offsets(&tx.shape, axes);
    let float = tx.dtype.is_float();
    kept.iter()
        .map(|&base| {
            let row: Vec<f64> = red.iter().map(|&r| x[base + r]).collect();
            match op {
                Sum if float => sum(row.iter().copied()),
                Sum => wrap(
                    tx.dtype,
                    row.iter().fold(0i128, |acc, &e| acc.wrapping_add(int(e))),
                ),
                // n = 0 gives 0 / 0 = NaN, as OPS.md says.
                Mean => sum(row.iter().copied()) / row.len() as f64,
                Max => row
                    .iter()
                    .copied()
                    .reduce(fmax)
                    .expect("reduce_max over an empty extent"),
                Min => row
                    .iter()
                    .copied()
                    .reduce(fmin)
                    .expect("reduce_min over an empty extent"),
                ArgMax | ArgMin => {
                    let better = |a: f64, b: f64| if op == ArgMax { a > b } else { a < b };
                    // The first extreme element; the first NaN counts as the extreme.
                    let mut best = 0usize;
                    for (j, &e) in row.iter().enumerate().skip(1) {
                        let b = row[best];
                        if !b.is_nan() && (e.is_nan() || better(e, b)) {
                            best = j;
                        }
                    }
                    best as f64
                }
            }
        })
        .collect()
}

fn matmul(ta: &TensorType, a: &[f64], tb: &TensorType, b: &[f64], ty: &TensorType) -> Vec<f64> {
    let (ra, rb, r) = (ta.shape.len(), tb.shape.len(), ty.shape.len());
    let (m, k) = (ta.shape[ra - 2] as usize, ta.shape[ra - 1] as usize);
    let n = tb.shape[rb - 1] as usize;
    let batch = &ty.shape[..r - 2];
    let ia = broadcast_map(batch, &ta.shape[..ra - 2]);
    let ib = broadcast_map(batch, &tb.shape[..rb - 2]);
    let float = ta.dtype.is_float();
    let mut out = Vec::with_capacity(ia.len() * m * n);
    for (&ba, &bb) in ia.iter().zip(&ib) {
        let (x, y) = (&a[ba * m * k..], &b[bb * k * n..]);
        for i in 0..m {
            for j in 0..n {
                if float {
                    let mut acc = 0.0f64;
                    for p in 0..k {
                        acc += x[i * k + p] * y[p * n + j];
                    }
                    out.push(acc);
                } else {
                    let mut acc = 0i128;
                    for p in 0..k {
                        acc = acc.wrapping_add(int(x[i * k + p]).wrapping_mul(int(y[p * n + j])));
                    }
                    out.push(wrap(ta.dtype, acc));
                }
            }
        }
    }
    out
}

fn slice(shape: &[u64], x: &[f64], ranges: &[SliceRange], ty: &TensorType) -> Vec<f64> {
    let st = strides(shape);
    (0..numel(&ty.shape))
        .map(|f| {
            let idx = unravel(f, &ty.shape);
            let src: usize = idx
                .iter()
                .zip(ranges)
                .zip(&st)
                .map(|((&i, r), &s)| (r.start as usize + i * r.step as usize) * s)
                .sum();
            x[src]
        })
        .collect()
}

fn gather(
    at: usize,
    xs: &[u64],
    x: &[f64],
    is: &[u64],
    ix: &[f64],
    a: usize,
    ty: &TensorType,
) -> Vec<f64> {
    let size = xs[a] as i128;
    let st = strides(xs);
    let ist = strides(is);
    let ri = is.len();
    (0..numel(&ty.shape))
        .map(|f| {
            let out = unravel(f, &ty.shape);
            let pos: usize = out[a..a + ri].iter().zip(&ist).map(|(i, s)| i * s).sum();
            let raw = int(ix[pos]);
            let k = if raw < 0 { raw + size } else { raw };
            assert!(
                (0..size).contains(&k),
                "f64_eval: node %{at} (gather): index {raw} is out of range for an axis of size {size}"
            );
            let mut src = k as usize * st[a];
            for d in 0..a {
                src += out[d] * st[d];
            }
            for d in a + 1..xs.len() {
                src += out[d + ri - 1] * st[d];
            }
            x[src]
        })
        .collect()
}

/// Apply `f` to every row along the last axis.
fn rows(shape: &[u64], x: &[f64], f: impl Fn(&[f64], &mut [f64])) -> Vec<f64> {
    let n = *shape.last().expect("rank >= 1") as usize;
    let mut out = vec![0.0f64; x.len()];
    if n > 0 {
        for (row, o) in x.chunks(n).zip(out.chunks_mut(n)) {
            f(row, o);
        }
    }
    out
}

fn normalize(op: NormOp, shape: &[u64], x: &[f64], axis: u32) -> Vec<f64> {
    let (kept, red) = split_offsets(shape, &[axis]);
    let mut out = vec![0.0f64; x.len()];
    for &base in &kept {
        let row: Vec<f64> = red.iter().map(|&r| x[base + r]).collect();
        let Some(m) = row.iter().copied().reduce(fmax) else {
            continue;
        };
        let e: Vec<f64> = row.iter().map(|&a| (a - m).exp()).collect();
        let s = sum(e.iter().copied());
        for (j, &r) in red.iter().enumerate() {
            out[base + r] = match op {
                NormOp::Softmax => e[j] / s,
                NormOp::LogSoftmax => (row[j] - m) - s.ln(),
            };
        }
    }
    out
}

/// Input coordinate of output position `o`, kernel tap `k`, or `None` in the padding.
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

#[allow(clippy::too_many_arguments)]
fn conv2d(
    xs: &[u64],
    x: &[f64],
    ws: &[u64],
    w: &[f64],
    bias: Option<&[f64]>,
    win: &Window2d,
    groups: usize,
    ty: &TensorType,
) -> Vec<f64> {
    let (h, wd) = (xs[2], xs[3]);
    let [o_ch, cg, kh, kw] = [ws[0], ws[1], ws[2], ws[3]].map(|d| d as usize);
    let og = o_ch / groups;
    let (xst, wst) = (strides(xs), strides(ws));
    (0..numel(&ty.shape))
        .map(|f| {
            let idx = unravel(f, &ty.shape);
            let [n, o, oh, ow] = [idx[0], idx[1], idx[2], idx[3]];
            let g = o / og;
            let mut acc = 0.0f64;
            for ci in 0..cg {
                for i in 0..kh {
                    let Some(ih) = tap(oh, i, win.stride[0], win.padding[0], win.dilation[0], h)
                    else {
                        continue;
                    };
                    for j in 0..kw {
                        let Some(iw) =
                            tap(ow, j, win.stride[1], win.padding[1], win.dilation[1], wd)
                        else {
                            continue;
                        };
                        let xi = n * xst[0] + (g * cg + ci) * xst[1] + ih * xst[2] + iw * xst[3];
                        let wi = o * wst[0] + ci * wst[1] + i * wst[2] + j * wst[3];
                        acc += x[xi] * w[wi];
                    }
                }
            }
            match bias {
                Some(b) => acc + b[o],
                None => acc,
            }
        })
        .collect()
}

fn pool2d(
    kind: PoolKind,
    tx: &TensorType,
    x: &[f64],
    kernel: [u32; 2],
    win: &Window2d,
    ty: &TensorType,
) -> Vec<f64> {
    let (xs, float) = (&tx.shape, tx.dtype.is_float());
    let st = strides(xs);
    let (h, w) = (xs[2], xs[3]);
    (0..numel(&ty.shape))
        .map(|f| {
            let idx = unravel(f, &ty.shape);
            let mut taps = Vec::new();
            for i in 0..kernel[0] as usize {
                let Some(ih) = tap(idx[2], i, win.stride[0], win.padding[0], win.dilation[0], h)
                else {
                    continue;
                };
                for j in 0..kernel[1] as usize {
                    let Some(iw) =
                        tap(idx[3], j, win.stride[1], win.padding[1], win.dilation[1], w)
                    else {
                        continue;
                    };
                    taps.push(x[idx[0] * st[0] + idx[1] * st[1] + ih * st[2] + iw * st[3]]);
                }
            }
            match kind {
                // Integers hold no NaN, so `fmax` is their plain maximum too. A dilated window
                // can fall wholly in the padding: the reference gives NaN (floats) or 0.
                PoolKind::Max => {
                    taps.iter()
                        .copied()
                        .reduce(fmax)
                        .unwrap_or(if float { f64::NAN } else { 0.0 })
                }
                // An empty window is 0 / 0 = NaN, as in the reference.
                PoolKind::Avg => sum(taps.iter().copied()) / taps.len() as f64,
                PoolKind::AvgIncludePad => {
                    sum(taps.iter().copied()) / f64::from(kernel[0] * kernel[1])
                }
            }
        })
        .collect()
}
