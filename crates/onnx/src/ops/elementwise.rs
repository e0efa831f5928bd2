//! Elementwise ONNX ops: tenet's own unary and binary ops, and the activations ONNX names that
//! tenet composes from them (LeakyRelu, HardSwish, Softplus, ...), each written in the order
//! that docs/ONNX.md gives.

use tenet_ir::{DType, Tensor};

use super::{one, scalar};
use crate::convert::{Cx, NodeIn, Value};
use crate::tensor::dtype_of;

pub(crate) fn unary(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let one_like = |cx: &Cx| scalar(cx, x.dtype(), 1.0);
    let y = match n.op_type() {
        "Abs" => x.abs(),
        "Neg" => -x.clone(),
        "Exp" => x.exp(),
        "Log" => x.log(),
        "Sqrt" => x.sqrt(),
        "Reciprocal" => x.reciprocal(),
        "Sin" => x.sin(),
        "Cos" => x.cos(),
        "Tan" => x.sin() / x.cos(),
        "Tanh" => x.tanh(),
        "Sigmoid" => x.sigmoid(),
        "Relu" => x.relu(),
        "Erf" => x.erf(),
        "Floor" => x.floor(),
        "Ceil" => x.ceil(),
        "Round" => x.round(),
        "Sign" => x.sign(),
        "Not" => x.not(),
        "Softplus" => softplus(cx, &x),
        "Softsign" => &x / &(x.abs() + one_like(cx)),
        "Mish" => &x * &softplus(cx, &x).tanh(),
        "IsNaN" => x.ne(&x),
        "Sinh" | "Cosh" => {
            let half = scalar(cx, x.dtype(), 0.5);
            let (p, m) = (x.exp(), (-x.clone()).exp());
            let sum = if n.op_type() == "Sinh" {
                &p - &m
            } else {
                &p + &m
            };
            &sum * &half
        }
        "Asinh" => (&x + &(&(&x * &x) + &one_like(cx)).sqrt()).log(),
        "Acosh" => (&x + &(&(&x * &x) - &one_like(cx)).sqrt()).log(),
        "Atanh" => {
            let one = one_like(cx);
            &(&(&one + &x) / &(&one - &x)).log() * &scalar(cx, x.dtype(), 0.5)
        }
        other => unreachable!("{other} is not a unary op"),
    };
    one(y)
}

/// `log(1 + exp(x))` without overflow: `relu(x) + log(exp(-|x|) + 1)`.
fn softplus(cx: &Cx, x: &Tensor) -> Tensor {
    let one = scalar(cx, x.dtype(), 1.0);
    x.relu() + ((-x.abs()).exp() + one).log()
}

pub(crate) fn identity(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    Ok(vec![n.get(0)?.clone()])
}

/// Inference-mode dropout: the identity. Training mode (random masks) is refused.
pub(crate) fn dropout(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    n.int("seed", 0)?;
    n.float("ratio", 0.5)?;
    if n.int("is_test", 1)? == 0 {
        return Err("is in training mode (is_test = 0); only inference is imported".into());
    }
    n.known_f64(1, "ratio")?;
    if n.known_f64(2, "training_mode")?.unwrap_or(0.0) != 0.0 {
        return Err("is in training mode; only inference is imported".into());
    }
    Ok(vec![n.get(0)?.clone()])
}

pub(crate) fn binary(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let a = n.t(cx, 0)?;
    let mut b = n.t(cx, 1)?;
    if n.opset < 7 && n.int("broadcast", 0)? != 0 {
        // Before numpy broadcasting: `b` lines up with `a` from `axis` (default: the end).
        let tail = a.rank().saturating_sub(b.rank()) as i64;
        let at = n.int("axis", tail)?;
        let at = if at < 0 { at + a.rank() as i64 } else { at };
        let ones = a.rank() as i64 - at - b.rank() as i64;
        if at < 0 || ones < 0 {
            return Err(format!("axis {at} does not place {} in {}", b.ty(), a.ty()));
        }
        let mut dims = super::signed(b.shape());
        dims.extend(std::iter::repeat_n(1, ones as usize));
        b = b.reshape(&dims);
    } else {
        n.int("broadcast", 0)?;
        n.int("axis", 0)?;
    }
    if n.op_type() == "Pow" && b.dtype() != a.dtype() {
        b = b.cast(a.dtype());
    }
    // Squaring (layer norms written out as `Pow(x - mean, 2)`) as a product: a correctly
    // rounded power of two is the rounded square, and a multiply costs a fraction of `pow`.
    if n.op_type() == "Pow"
        && a.dtype().is_float()
        && b.rank() <= a.rank()
        && b.shape().iter().all(|&d| d == 1)
        && matches!(n.get(1)?, Value::Known(k) if k.t.numel() == 1 && match k.t.dtype() {
            d if d.is_float() => k.t.get_f32(0) == 2.0,
            DType::I64 | DType::I32 => k.t.to_i64_vec()[0] == 2,
            _ => false,
        })
    {
        return one(&a * &a);
    }
    let y = match n.op_type() {
        "Add" => &a + &b,
        "Sub" => &a - &b,
        "Mul" => &a * &b,
        "Div" => &a / &b,
        "Pow" => a.pow(&b),
        "Equal" => a.eq(&b),
        "Less" => a.lt(&b),
        "LessOrEqual" => a.le(&b),
        "Greater" => a.gt(&b),
        "GreaterOrEqual" => a.ge(&b),
        "And" => a.and(&b),
        "Or" => a.or(&b),
        "Xor" => {
            if a.dtype() != DType::Bool {
                return Err(format!("needs bool operands, got {}", a.dtype()));
            }
            a.ne(&b)
        }
        other => unreachable!("{other} is not a binary op"),
    };
    one(y)
}

/// Max, Min, Sum and Mean of any number of operands, folded left to right.
pub(crate) fn variadic(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    if n.input_count() == 0 {
        return Err("needs at least one input".into());
    }
    let xs: Vec<Tensor> = (0..n.input_count())
        .map(|i| n.t(cx, i))
        .collect::<Result<_, _>>()?;
    let mut acc = xs[0].clone();
    for x in &xs[1..] {
        acc = match n.op_type() {
            "Max" => acc.maximum(x),
            "Min" => acc.minimum(x),
            _ => &acc + x,
        };
    }
    if n.op_type() == "Mean" {
        let count = scalar(cx, acc.dtype(), xs.len() as f64);
        acc = &acc / &count;
    }
    one(acc)
}

pub(crate) fn where_(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let c = n.t(cx, 0)?;
    let a = n.t(cx, 1)?;
    let b = n.t(cx, 2)?;
    one(c.where_(&a, &b))
}

pub(crate) fn cast(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    n.int("saturate", 1)?; // only meaningful for float8 targets, which are refused
    let to = n.int("to", 0)?;
    let dtype = dtype_of(to as i32)?;
    one(n.t(cx, 0)?.cast(dtype))
}

pub(crate) fn cast_like(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    n.int("saturate", 1)?;
    let dtype = n.get(1)?.ty().dtype;
    one(n.t(cx, 0)?.cast(dtype))
}

/// `min(max(x, lo), hi)`, bounds from attributes before opset 11 and from inputs after.
pub(crate) fn clip(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let mut y = n.t(cx, 0)?;
    let (lo, hi) = if n.opset < 11 {
        let lo = n.has_attr("min").then(|| n.float("min", 0.0)).transpose()?;
        let hi = n.has_attr("max").then(|| n.float("max", 0.0)).transpose()?;
        (
            lo.map(|v| scalar(cx, y.dtype(), v as f64)),
            hi.map(|v| scalar(cx, y.dtype(), v as f64)),
        )
    } else {
        (n.opt_t(cx, 1), n.opt_t(cx, 2))
    };
    if let Some(lo) = lo {
        y = y.maximum(&lo);
    }
    if let Some(hi) = hi {
        y = y.minimum(&hi);
    }
    one(y)
}

/// Activations with float attributes.
pub(crate) fn activation(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let s = |cx: &Cx, v: f32| scalar(cx, x.dtype(), v as f64);
    let zero = s(cx, 0.0);
    let one_ = s(cx, 1.0);
    let y = match n.op_type() {
        "LeakyRelu" => {
            let alpha = s(cx, n.float("alpha", 0.01)?);
            x.lt(&zero).where_(&(&x * &alpha), &x)
        }
        "Elu" => {
            let alpha = s(cx, n.float("alpha", 1.0)?);
            x.lt(&zero).where_(&(&(x.exp() - one_) * &alpha), &x)
        }
        "Selu" => {
            let alpha = s(cx, n.float("alpha", 1.673_263_2)?);
            let gamma = s(cx, n.float("gamma", 1.050_701)?);
            let neg = &(&(x.exp() * alpha.clone()) - &alpha) * &gamma;
            x.le(&zero).where_(&neg, &(&x * &gamma))
        }
        "Celu" => {
            let alpha = s(cx, n.float("alpha", 1.0)?);
            let neg = &((&x / &alpha).exp() - one_) * &alpha;
            x.relu() + neg.minimum(&zero)
        }
        "HardSigmoid" => {
            let alpha = s(cx, n.float("alpha", 0.2)?);
            let beta = s(cx, n.float("beta", 0.5)?);
            (&(&x * &alpha) + &beta).minimum(&one_).maximum(&zero)
        }
        "HardSwish" => {
            let alpha = s(cx, 1.0 / 6.0);
            let beta = s(cx, 0.5);
            &x * &(&(&x * &alpha) + &beta).minimum(&one_).maximum(&zero)
        }
        "ThresholdedRelu" => {
            let alpha = s(cx, n.float("alpha", 1.0)?);
            x.gt(&alpha).where_(&x, &zero)
        }
        "Swish" => {
            let alpha = s(cx, n.float("alpha", 1.0)?);
            &x * &(&x * &alpha).sigmoid()
        }
        "Shrink" => {
            let bias = s(cx, n.float("bias", 0.0)?);
            let lambd = n.float("lambd", 0.5)?;
            let (lo, hi) = (s(cx, -lambd), s(cx, lambd));
            let inner = x.gt(&hi).where_(&(&x - &bias), &zero);
            x.lt(&lo).where_(&(&x + &bias), &inner)
        }
        "Gelu" => match n.string("approximate", "none")?.as_str() {
            "none" => x.gelu(),
            "tanh" => x.gelu_tanh(),
            other => return Err(format!("approximate = {other:?} is not supported")),
        },
        other => unreachable!("{other} is not an activation"),
    };
    one(y)
}

pub(crate) fn prelu(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let mut slope = n.t(cx, 1)?;
    let s = x.shape();
    if slope.rank() == 1 && x.rank() >= 3 && slope.shape()[0] == s[1] && s[1] != s[s.len() - 1] {
        // A per-channel slope, as models before numpy broadcasting wrote it.
        let mut dims = vec![-1i64];
        dims.extend(std::iter::repeat_n(1, x.rank() - 2));
        slope = slope.reshape(&dims);
    }
    let zero = scalar(cx, x.dtype(), 0.0);
    one(x.lt(&zero).where_(&(&x * &slope), &x))
}

pub(crate) fn is_inf(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let pos = n.int("detect_positive", 1)? != 0;
    let neg = n.int("detect_negative", 1)? != 0;
    let inf = scalar(cx, x.dtype(), f64::INFINITY);
    let ninf = scalar(cx, x.dtype(), f64::NEG_INFINITY);
    let y = match (pos, neg) {
        (true, true) => x.eq(&inf).or(&x.eq(&ninf)),
        (true, false) => x.eq(&inf),
        (false, true) => x.eq(&ninf),
        (false, false) => x.ne(&x).and(&x.eq(&x)),
    };
    one(y)
}

/// Integer Mod: `fmod = 1` is C's remainder `a − trunc(a/b)·b`, `fmod = 0` Python's, which
/// takes the divisor's sign (the remainder plus `b` where their signs differ). A zero divisor
/// gives `a` (tenet's `a / 0 = 0`; ONNX leaves it undefined). Floats are refused: the exact
/// `fmod` is not an op tenet has.
pub(crate) fn modulo(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let fmod = n.int("fmod", 0)? != 0;
    let a = n.t(cx, 0)?;
    let b = n.t(cx, 1)?;
    if !matches!(a.dtype(), DType::I32 | DType::I64) {
        return Err(format!(
            "Mod of {} is not supported (i32 and i64 are)",
            a.dtype()
        ));
    }
    let r = &a - &(&(&a / &b) * &b);
    if fmod {
        return one(r);
    }
    let zero = scalar(cx, a.dtype(), 0.0);
    let differ = r.ne(&zero).and(&r.lt(&zero).ne(&b.lt(&zero)));
    one(differ.where_(&(&r + &b), &r))
}
