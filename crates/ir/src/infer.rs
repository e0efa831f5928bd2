//! Shape and dtype rules of every op, written once: the builder, the validator and both decoders
//! call `infer`. docs/OPS.md states the same rules in prose.

use crate::dtype::{DType, TensorType, numel};
use crate::op::{BinaryOp, NodeId, Op, PoolKind, QuantFormat, ReduceOp, UnaryOp, Window2d};

/// Why an op cannot be applied to its operands. The message names the shapes involved.
pub type RuleError = String;

/// The result type of `op`. `ty_of` gives each operand's type. `declared` is the node's stated
/// type: required for ops whose type is not derivable from operands (it is then checked for
/// consistency and returned), ignored otherwise.
pub fn infer(
    op: &Op,
    ty_of: &dyn Fn(NodeId) -> TensorType,
    declared: Option<&TensorType>,
) -> Result<TensorType, RuleError> {
    let need_declared = || {
        declared
            .cloned()
            .ok_or_else(|| "needs a declared result type".to_string())
    };
    match op {
        Op::Input { name } => {
            check_name("input name", name)?;
            need_declared()
        }
        Op::Weight { tensor, .. } => {
            check_name("weight tensor name", tensor)?;
            need_declared()
        }
        Op::Constant { data } => {
            let t = need_declared()?;
            let bytes = t.bytes().ok_or("constant size overflows")?;
            if data.len() as u64 != bytes {
                return Err(format!(
                    "constant of type {t} needs {bytes} bytes of data, has {}",
                    data.len()
                ));
            }
            if t.dtype == DType::Bool && data.iter().any(|&b| b > 1) {
                return Err("bool constant holds a byte other than 0 or 1".into());
            }
            Ok(t)
        }
        Op::Unary { op, x } => {
            let t = ty_of(*x);
            let ok = match op {
                UnaryOp::Not => t.dtype == DType::Bool,
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => t.dtype.is_signed(),
                _ => t.dtype.is_float(),
            };
            if !ok {
                let want = match op {
                    UnaryOp::Not => "bool",
                    UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => {
                        "a float or signed integer"
                    }
                    _ => "a float",
                };
                return Err(format!("operand is {t}, needs {want} dtype"));
            }
            Ok(t)
        }
        Op::Binary { op, a, b } => {
            let (ta, tb) = (ty_of(*a), ty_of(*b));
            if ta.dtype != tb.dtype {
                return Err(format!(
                    "operands {ta} and {tb} have different dtypes (cast one explicitly)"
                ));
            }
            let d = ta.dtype;
            let ok = if op.is_logical() {
                d == DType::Bool
            } else if op.is_comparison() {
                true
            } else if *op == BinaryOp::Pow {
                d.is_float()
            } else {
                d.is_numeric()
            };
            if !ok {
                return Err(format!(
                    "operands {ta} and {tb}: dtype {d} is not allowed here"
                ));
            }
            let shape = broadcast(&ta.shape, &tb.shape)
                .ok_or_else(|| format!("cannot broadcast {ta} with {tb}"))?;
            let dtype = if op.is_comparison() { DType::Bool } else { d };
            Ok(TensorType::new(dtype, shape))
        }
        Op::Where { cond, a, b } => {
            let (tc, ta, tb) = (ty_of(*cond), ty_of(*a), ty_of(*b));
            if tc.dtype != DType::Bool {
                return Err(format!("condition is {tc}, needs bool"));
            }
            if ta.dtype != tb.dtype {
                return Err(format!("branches {ta} and {tb} have different dtypes"));
            }
            let s = broadcast(&tc.shape, &ta.shape)
                .and_then(|s| broadcast(&s, &tb.shape))
                .ok_or_else(|| format!("cannot broadcast {tc}, {ta} and {tb} together"))?;
            Ok(TensorType::new(ta.dtype, s))
        }
        Op::Cast { x } => {
            let (t, d) = (ty_of(*x), need_declared()?);
            if t.shape != d.shape {
                return Err(format!("cast cannot change shape: {t} to {d}"));
            }
            Ok(d)
        }
        Op::Reduce {
            op,
            x,
            axes,
            keepdim,
        } => {
            let t = ty_of(*x);
            check_axes(axes, t.rank())?;
            let ok = match op {
                ReduceOp::Mean => t.dtype.is_float(),
                _ => t.dtype.is_numeric(),
            };
            if !ok {
                return Err(format!(
                    "operand is {t}: dtype not allowed for {}",
                    op.name()
                ));
            }
            let reduced: Vec<u64> = axes.iter().map(|&a| t.shape[a as usize]).collect();
            if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) && numel(&reduced) == Some(0) {
                return Err(format!(
                    "{} over an empty extent of {t} is undefined",
                    op.name()
                ));
            }
            let mut shape = Vec::with_capacity(t.rank());
            for (i, &d) in t.shape.iter().enumerate() {
                if axes.contains(&(i as u32)) {
                    if *keepdim {
                        shape.push(1);
                    }
                } else {
                    shape.push(d);
                }
            }
            let dtype = match op {
                ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
                _ => t.dtype,
            };
            Ok(TensorType::new(dtype, shape))
        }
        Op::MatMul { a, b } => {
            let (ta, tb) = (ty_of(*a), ty_of(*b));
            if ta.rank() < 2 || tb.rank() < 2 {
                return Err(format!(
                    "operands {ta} @ {tb}: both need rank >= 2 (reshape vectors to matrices)"
                ));
            }
            if ta.dtype != tb.dtype || !ta.dtype.is_numeric() {
                return Err(format!("operands {ta} @ {tb}: need the same numeric dtype"));
            }
            let (ra, rb) = (ta.rank(), tb.rank());
            let (m, k) = (ta.shape[ra - 2], ta.shape[ra - 1]);
            let (k2, n) = (tb.shape[rb - 2], tb.shape[rb - 1]);
            if k != k2 {
                return Err(format!(
                    "operands {ta} @ {tb}: inner dimensions differ ({k} vs {k2})"
                ));
            }
            let mut shape =
                broadcast(&ta.shape[..ra - 2], &tb.shape[..rb - 2]).ok_or_else(|| {
                    format!("operands {ta} @ {tb}: batch dimensions do not broadcast")
                })?;
            shape.extend([m, n]);
            Ok(TensorType::new(ta.dtype, shape))
        }
        Op::Reshape { x } => {
            let (t, d) = (ty_of(*x), need_declared()?);
            if t.dtype != d.dtype || t.numel() != d.numel() {
                return Err(format!(
                    "cannot reshape {t} to {d} (element count or dtype differs)"
                ));
            }
            Ok(d)
        }
        Op::Permute { x, perm } => {
            let t = ty_of(*x);
            let mut seen = vec![false; t.rank()];
            if perm.len() != t.rank() {
                return Err(format!("permutation {perm:?} has the wrong length for {t}"));
            }
            for &p in perm {
                match seen.get_mut(p as usize) {
                    Some(s) if !*s => *s = true,
                    _ => return Err(format!("{perm:?} is not a permutation of the axes of {t}")),
                }
            }
            let shape = perm
                .iter()
                .map(|&p| t.shape[p as usize])
                .collect::<Vec<_>>();
            Ok(TensorType::new(t.dtype, shape))
        }
        Op::Expand { x } => {
            let (t, d) = (ty_of(*x), need_declared()?);
            if t.dtype != d.dtype || broadcast(&t.shape, &d.shape).as_ref() != Some(&d.shape) {
                return Err(format!("cannot expand {t} to {d}"));
            }
            Ok(d)
        }
        Op::Slice { x, ranges } => {
            let t = ty_of(*x);
            if ranges.len() != t.rank() {
                return Err(format!(
                    "slice of {t} needs {} ranges, has {}",
                    t.rank(),
                    ranges.len()
                ));
            }
            let mut shape = Vec::with_capacity(t.rank());
            for (axis, (r, &dim)) in ranges.iter().zip(&t.shape).enumerate() {
                if r.step == 0 || r.start > r.end || r.end > dim {
                    return Err(format!(
                        "slice {}:{}:{} is invalid for axis {axis} of {t} (need start <= end <= {dim}, step >= 1)",
                        r.start, r.end, r.step
                    ));
                }
                shape.push(r.len());
            }
            Ok(TensorType::new(t.dtype, shape))
        }
        Op::Pad { x, pads, value } => {
            let t = ty_of(*x);
            if pads.len() != t.rank() {
                return Err(format!(
                    "pad of {t} needs {} (before, after) pairs",
                    t.rank()
                ));
            }
            check_scalar_bits(t.dtype, *value)?;
            let mut shape = Vec::with_capacity(t.rank());
            for (&(lo, hi), &d) in pads.iter().zip(&t.shape) {
                let n = d.checked_add(lo).and_then(|n| n.checked_add(hi));
                shape.push(n.ok_or("padded size overflows")?);
            }
            Ok(TensorType::new(t.dtype, shape))
        }
        Op::Concat { xs, axis } => {
            let first = ty_of(*xs.first().ok_or("concat needs at least one operand")?);
            if *axis as usize >= first.rank() {
                return Err(format!("axis {axis} out of range for {first}"));
            }
            let mut shape = first.shape.clone();
            shape[*axis as usize] = 0;
            for &x in xs {
                let t = ty_of(x);
                let same_other_dims = t.rank() == first.rank()
                    && t.shape
                        .iter()
                        .zip(&first.shape)
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis as usize || a == b);
                if t.dtype != first.dtype || !same_other_dims {
                    return Err(format!(
                        "cannot concatenate {first} and {t} along axis {axis}"
                    ));
                }
                let a = &mut shape[*axis as usize];
                *a = a
                    .checked_add(t.shape[*axis as usize])
                    .ok_or("concatenated size overflows")?;
            }
            Ok(TensorType::new(first.dtype, shape))
        }
        Op::Gather { x, indices, axis } => {
            let (t, ti) = (ty_of(*x), ty_of(*indices));
            if !matches!(ti.dtype, DType::I32 | DType::I64) {
                return Err(format!("indices are {ti}, need i32 or i64"));
            }
            let a = *axis as usize;
            if a >= t.rank() {
                return Err(format!("axis {axis} out of range for {t}"));
            }
            if t.shape[a] == 0 && ti.numel() != Some(0) {
                return Err(format!("gather from empty axis {axis} of {t}"));
            }
            let mut shape = t.shape[..a].to_vec();
            shape.extend(&ti.shape);
            shape.extend(&t.shape[a + 1..]);
            Ok(TensorType::new(t.dtype, shape))
        }
        Op::Iota { axis } => {
            let d = need_declared()?;
            if *axis as usize >= d.rank() || !d.dtype.is_numeric() {
                return Err(format!("iota along axis {axis} cannot produce {d}"));
            }
            Ok(d)
        }
        Op::TriMask { .. } => {
            let d = need_declared()?;
            if d.dtype != DType::Bool || d.rank() < 2 {
                return Err(format!("tri_mask produces bool of rank >= 2, not {d}"));
            }
            Ok(d)
        }
        Op::Normalize { op, x, axis } => {
            let t = ty_of(*x);
            if !t.dtype.is_float() || *axis as usize >= t.rank() {
                return Err(format!(
                    "{} along axis {axis} needs a float tensor of higher rank, got {t}",
                    op.name()
                ));
            }
            Ok(t)
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => norm_rule(
            ty_of(*x),
            [gamma, beta].into_iter().flatten().map(|&g| ty_of(g)),
            *eps_bits,
        ),
        Op::RmsNorm { x, gamma, eps_bits } => {
            norm_rule(ty_of(*x), gamma.iter().map(|&g| ty_of(g)), *eps_bits)
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => {
            let (tx, tw) = (ty_of(*x), ty_of(*w));
            if tx.rank() != 4 || tw.rank() != 4 || !tx.dtype.is_float() || tx.dtype != tw.dtype {
                return Err(format!(
                    "conv2d needs float NCHW input and [out, in/groups, kh, kw] weight of one dtype, got {tx} and {tw}"
                ));
            }
            let g = *groups as u64;
            let (c, o) = (tx.shape[1], tw.shape[0]);
            if g == 0 || c % g != 0 || o % g != 0 || tw.shape[1] != c / g {
                return Err(format!(
                    "conv2d groups={groups}: input {tx} and weight {tw} do not fit (channels must divide by groups, weight dim 1 = in/groups)"
                ));
            }
            if let Some(b) = bias {
                let tb = ty_of(*b);
                if tb != TensorType::new(tx.dtype, [o]) {
                    return Err(format!("conv2d bias is {tb}, needs {}[{o}]", tx.dtype));
                }
            }
            let (h, wd) = window_output(&tx, [tw.shape[2], tw.shape[3]], window, false)?;
            Ok(TensorType::new(tx.dtype, [tx.shape[0], o, h, wd]))
        }
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => {
            let t = ty_of(*x);
            let ok = t.rank() == 4
                && match kind {
                    PoolKind::Max => t.dtype.is_numeric(),
                    PoolKind::Avg | PoolKind::AvgIncludePad => t.dtype.is_float(),
                };
            if !ok {
                return Err(format!(
                    "{} needs an NCHW tensor of a suitable dtype, got {t}",
                    kind.name()
                ));
            }
            let (h, w) = window_output(&t, [kernel[0] as u64, kernel[1] as u64], window, true)?;
            Ok(TensorType::new(t.dtype, [t.shape[0], t.shape[1], h, w]))
        }
        Op::Random { .. } => {
            let d = need_declared()?;
            if !d.dtype.is_float() {
                return Err(format!("random numbers are floats, not {d}"));
            }
            Ok(d)
        }
        Op::Dequantize { x, format } => {
            let t = ty_of(*x);
            let nb = quant_blocks(&t, *format)?;
            let r = t.rank();
            let mut shape = t.shape[..r - 2].to_vec();
            shape.push(
                nb.checked_mul(QuantFormat::BLOCK)
                    .ok_or("dequantised size overflows")?,
            );
            Ok(TensorType::new(DType::F32, shape))
        }
        Op::QMatMul { a, w, format, .. } => {
            let (ta, tw) = (ty_of(*a), ty_of(*w));
            let f = format.name();
            if tw.rank() != 3 {
                return Err(format!(
                    "qmatmul weight is {tw}, needs u8[n, k/32, {}] ({f} blocks of a [n, k] weight)",
                    format.block_bytes()
                ));
            }
            let nb = quant_blocks(&tw, *format)?;
            if nb == 0 {
                return Err(format!(
                    "qmatmul weight {tw} has no blocks: k must be at least 32"
                ));
            }
            let k = nb * QuantFormat::BLOCK;
            if ta.dtype != DType::F32 || ta.rank() < 2 {
                return Err(format!(
                    "qmatmul activations are {ta}, need f32 of rank >= 2 ([..., m, {k}])"
                ));
            }
            let r = ta.rank();
            if ta.shape[r - 1] != k {
                return Err(format!(
                    "qmatmul of {ta} by {f} weight {tw}: inner dimensions differ ({} vs {nb} blocks of 32 = {k})",
                    ta.shape[r - 1]
                ));
            }
            let mut shape = ta.shape.clone();
            shape[r - 1] = tw.shape[0];
            Ok(TensorType::new(DType::F32, shape))
        }
    }
}

/// The block count `nb` of a quantised tensor `u8[..., nb, block_bytes]` of `format`.
fn quant_blocks(t: &TensorType, format: QuantFormat) -> Result<u64, RuleError> {
    let bb = format.block_bytes();
    let r = t.rank();
    if t.dtype != DType::U8 || r < 2 || t.shape[r - 1] != bb {
        return Err(format!(
            "{} blocks are u8[..., nb, {bb}] ({bb} bytes a block of 32 elements), got {t}",
            format.name()
        ));
    }
    Ok(t.shape[r - 2])
}

/// numpy broadcasting of two shapes, `None` if incompatible.
pub fn broadcast(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Names of inputs, weights and outputs: 1 to 256 printable ASCII characters, no quote,
/// backslash or space, so they need no escaping anywhere (text form, JSON, URLs).
pub fn check_name(what: &str, name: &str) -> Result<(), RuleError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} must be 1 to {MAX_NAME_LEN} printable ASCII characters without quotes, backslashes or spaces"
        ))
    }
}

pub const MAX_NAME_LEN: usize = 256;

/// A scalar attribute holds the dtype's bits zero-extended to 64 bits; anything above is invalid.
pub fn check_scalar_bits(dtype: DType, bits: u64) -> Result<(), RuleError> {
    let max = match dtype {
        DType::Bool => 1,
        DType::I64 => u64::MAX,
        d => (1u64 << (8 * d.size())) - 1,
    };
    if bits > max {
        return Err(format!("scalar bits {bits:#x} do not fit dtype {dtype}"));
    }
    Ok(())
}

fn check_axes(axes: &[u32], rank: usize) -> Result<(), RuleError> {
    if axes.is_empty() {
        return Err("needs at least one axis".into());
    }
    if !axes.windows(2).all(|w| w[0] < w[1]) || axes.iter().any(|&a| a as usize >= rank) {
        return Err(format!(
            "axes {axes:?} must be strictly increasing and below the rank {rank}"
        ));
    }
    Ok(())
}

fn norm_rule(
    t: TensorType,
    params: impl Iterator<Item = TensorType>,
    eps_bits: u32,
) -> Result<TensorType, RuleError> {
    if !t.dtype.is_float() || t.rank() == 0 {
        return Err(format!(
            "normalisation needs a float tensor of rank >= 1, got {t}"
        ));
    }
    let eps = f32::from_bits(eps_bits);
    if !(eps.is_finite() && eps >= 0.0) || eps.to_bits() == (-0.0f32).to_bits() {
        return Err(format!("eps {eps} must be finite and >= +0"));
    }
    let last = t.shape[t.rank() - 1];
    for p in params {
        if p != TensorType::new(t.dtype, [last]) {
            return Err(format!("scale/shift is {p}, needs {}[{last}]", t.dtype));
        }
    }
    Ok(t)
}

/// Output height and width of a 2-D window op over NCHW `t`.
fn window_output(
    t: &TensorType,
    kernel: [u64; 2],
    w: &Window2d,
    is_pool: bool,
) -> Result<(u64, u64), RuleError> {
    let mut out = [0u64; 2];
    for i in 0..2 {
        let (k, s, d) = (kernel[i], w.stride[i] as u64, w.dilation[i] as u64);
        let (p0, p1) = (w.padding[i] as u64, w.padding[i + 2] as u64);
        if k == 0 || s == 0 || d == 0 {
            return Err("kernel, stride and dilation must be >= 1".into());
        }
        let span = (k - 1)
            .checked_mul(d)
            .and_then(|v| v.checked_add(1))
            .ok_or("window span overflows")?;
        if is_pool && 2 * p0.max(p1) > span {
            return Err(format!(
                "padding {p0}/{p1} exceeds half the window span {span}"
            ));
        }
        let padded = t.shape[2 + i]
            .checked_add(p0 + p1)
            .ok_or("padded size overflows")?;
        if padded < span {
            return Err(format!(
                "window span {span} exceeds padded input size {padded} of {t}"
            ));
        }
        out[i] = (padded - span) / s + 1;
    }
    Ok((out[0], out[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast(&[2], &[3]), None);
    }

    #[test]
    fn names_are_restricted() {
        assert!(check_name("x", "model.layers.0.attn.q_proj.weight").is_ok());
        assert!(check_name("x", "").is_err());
        assert!(check_name("x", "a b").is_err());
        assert!(check_name("x", "a\"b").is_err());
        assert!(check_name("x", "é").is_err());
        assert!(check_name("x", &"a".repeat(257)).is_err());
    }

    #[test]
    fn scalar_bits_fit_dtype() {
        assert!(check_scalar_bits(DType::U8, 255).is_ok());
        assert!(check_scalar_bits(DType::U8, 256).is_err());
        assert!(check_scalar_bits(DType::Bool, 2).is_err());
        assert!(check_scalar_bits(DType::I64, u64::MAX).is_ok());
        assert!(check_scalar_bits(DType::F16, 0x1_0000).is_err());
    }
}
