//! Shapes and movement: the ops that produce known values from static shapes (Constant, Shape,
//! Size, ConstantOfShape, Range), and the ones that move elements (Reshape, Transpose, Slice,
//! Gather, Pad, Resize, ...) as tenet movement ops. Shape-valued inputs (Reshape's shape,
//! Slice's bounds, Expand's shape, ...) must be known at import time, which fixed input shapes
//! and folding make them.

use tenet_ir::{DType, HostTensor, Tensor, TensorType};

use super::{axis, index_tensor, one, product, signed};
use crate::convert::{Cx, NodeIn, Value, ints_of};

pub(crate) fn constant(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let name = n.out_name(0);
    let t = if let Some(t) = n.tensor_attr("value")? {
        t
    } else if n.has_attr("value_float") {
        HostTensor::from_f32(&[], &[n.float("value_float", 0.0)?]).map_err(|e| e.to_string())?
    } else if let Some(v) = n.floats("value_floats")? {
        HostTensor::from_f32(&[v.len() as u64], &v).map_err(|e| e.to_string())?
    } else if n.has_attr("value_int") {
        HostTensor::from_i64(&[], &[n.int("value_int", 0)?]).map_err(|e| e.to_string())?
    } else if let Some(v) = n.ints("value_ints")? {
        HostTensor::from_i64(&[v.len() as u64], &v).map_err(|e| e.to_string())?
    } else {
        return Err(
            "has no value tenet can read (strings and sparse values are not supported)".into(),
        );
    };
    Ok(vec![Value::known(name, t)])
}

/// A known i64 vector.
fn known_i64(name: &str, v: &[i64]) -> Result<Vec<Value>, String> {
    let t = HostTensor::from_i64(&[v.len() as u64], v).map_err(|e| e.to_string())?;
    Ok(vec![Value::known(name, t)])
}

pub(crate) fn shape(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let ty = n.get(0)?.ty();
    let r = ty.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(n.int("start", 0)?);
    let end = clamp(n.int("end", r)?);
    let dims: Vec<i64> = ty.shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    known_i64(n.out_name(0), &dims)
}

pub(crate) fn size(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let numel = product(&n.get(0)?.ty().shape) as i64;
    let t = HostTensor::from_i64(&[], &[numel]).map_err(|e| e.to_string())?;
    Ok(vec![Value::known(n.out_name(0), t)])
}

/// Known dims from a shape input, each ≥ 0.
fn dims_of(v: Vec<i64>, what: &str) -> Result<Vec<u64>, String> {
    v.iter()
        .map(|&d| u64::try_from(d).map_err(|_| format!("{what} {v:?} has a negative dimension")))
        .collect()
}

pub(crate) fn constant_of_shape(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let dims = dims_of(
        n.known_ints(0, "shape")?.ok_or("needs its shape input")?,
        "shape",
    )?;
    let value = match n.tensor_attr("value")? {
        Some(v) if v.numel() == 1 => v,
        Some(v) => return Err(format!("value should hold one element, got {}", v.ty())),
        None => HostTensor::from_f32(&[1], &[0.0]).map_err(|e| e.to_string())?,
    };
    let ty = TensorType::new(value.dtype(), dims.clone());
    let bytes = ty.bytes().ok_or("shape has too many elements")?;
    if n.may_keep(bytes) {
        let data = value.bytes().repeat(product(&dims) as usize);
        let t = HostTensor::new(ty, data).map_err(|e| e.to_string())?;
        return Ok(vec![Value::known(n.out_name(0), t)]);
    }
    let one_elem = cx.g.constant(value.dtype(), &[], value.bytes().to_vec());
    one(one_elem.expand(&dims))
}

pub(crate) fn range(_cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let start = n.known(0, "start")?.ok_or("needs start")?;
    let limit = n.known(1, "limit")?.ok_or("needs limit")?;
    let delta = n.known(2, "delta")?.ok_or("needs delta")?;
    let dtype = start.dtype();
    // Known at import: bounded like any folded value.
    let max = (n.max_fold_bytes.min(n.fold_budget.get()) / 8).min(1 << 26) as f64;
    if dtype.is_float() {
        let (s, l, d) = (start.get_f32(0), limit.get_f32(0), delta.get_f32(0));
        let count = ((l - s) / d).ceil().max(0.0) as f64;
        if count.is_nan() || count > max {
            return Err(format!("would make {count} elements"));
        }
        let v: Vec<f32> = (0..count as usize).map(|i| s + i as f32 * d).collect();
        let t = HostTensor::from_f32(&[v.len() as u64], &v).map_err(|e| e.to_string())?;
        let t = if dtype == DType::F32 {
            t
        } else {
            return Err(format!("Range of {dtype} is not supported"));
        };
        return Ok(vec![Value::known(n.out_name(0), t)]);
    }
    let (s, l, d) = (
        ints_of(&start, "start")?[0],
        ints_of(&limit, "limit")?[0],
        ints_of(&delta, "delta")?[0],
    );
    if d == 0 {
        return Err("has delta 0".into());
    }
    let span = (l as i128 - s as i128) as f64 / d as f64;
    let count = span.ceil().max(0.0);
    if count > max {
        return Err(format!("would make {count} elements"));
    }
    let v: Vec<i64> = (0..count as i64)
        .map(|i| s.wrapping_add(i.wrapping_mul(d)))
        .collect();
    let t = match dtype {
        DType::I64 => HostTensor::from_i64(&[v.len() as u64], &v),
        DType::I32 => HostTensor::from_i32(
            &[v.len() as u64],
            &v.iter().map(|&x| x as i32).collect::<Vec<_>>(),
        ),
        other => return Err(format!("Range of {other} is not supported")),
    }
    .map_err(|e| e.to_string())?;
    Ok(vec![Value::known(n.out_name(0), t)])
}

pub(crate) fn reshape(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let target = if n.opset < 5 {
        n.ints("shape")?.ok_or("has no shape")?
    } else {
        n.known_ints(1, "shape")?.ok_or("needs its shape input")?
    };
    let allow_zero = n.int("allowzero", 0)? != 0;
    let dims: Vec<i64> = target
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if d == 0 && !allow_zero {
                x.shape().get(i).map(|&v| v as i64).ok_or_else(|| {
                    format!("shape {target:?} copies dimension {i}, which the input lacks")
                })
            } else {
                Ok(d)
            }
        })
        .collect::<Result<_, _>>()?;
    one(x.reshape(&dims))
}

pub(crate) fn flatten(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let r = x.rank();
    let a = n.int("axis", 1)?;
    let a = if a == r as i64 {
        r
    } else if a < 0 && a + r as i64 == 0 {
        0
    } else {
        axis(a, r.max(1))?
    };
    let s = x.shape();
    one(x.reshape(&[product(&s[..a]) as i64, product(&s[a..]) as i64]))
}

/// Axes from an attribute before `opset_input`, from input 1 after.
fn axes_arg(n: &NodeIn, opset_input: i64) -> Result<Option<Vec<i64>>, String> {
    if n.opset >= opset_input {
        n.known_ints(1, "axes")
    } else {
        n.ints("axes")
    }
}

pub(crate) fn squeeze(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let s = x.shape().to_vec();
    let axes: Vec<usize> = match axes_arg(n, 13)? {
        Some(a) => a
            .iter()
            .map(|&v| axis(v, s.len()))
            .collect::<Result<_, _>>()?,
        None => (0..s.len()).filter(|&i| s[i] == 1).collect(),
    };
    if let Some(&bad) = axes.iter().find(|&&a| s[a] != 1) {
        return Err(format!("squeezes axis {bad} of size {}", s[bad]));
    }
    let dims: Vec<i64> = (0..s.len())
        .filter(|i| !axes.contains(i))
        .map(|i| s[i] as i64)
        .collect();
    one(x.reshape(&dims))
}

pub(crate) fn unsqueeze(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let given = axes_arg(n, 13)?.ok_or("needs axes")?;
    let out_rank = x.rank() + given.len();
    let mut axes: Vec<usize> = given
        .iter()
        .map(|&v| axis(v, out_rank))
        .collect::<Result<_, _>>()?;
    axes.sort_unstable();
    let mut src = x.shape().iter();
    let dims: Vec<i64> = (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                src.next().map(|&d| d as i64).unwrap_or(1)
            }
        })
        .collect();
    one(x.reshape(&dims))
}

pub(crate) fn transpose(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let perm: Vec<u32> = match n.ints("perm")? {
        Some(p) => p
            .iter()
            .map(|&v| u32::try_from(v).map_err(|_| format!("perm {p:?} is invalid")))
            .collect::<Result<_, _>>()?,
        None => (0..x.rank() as u32).rev().collect(),
    };
    one(x.permute(&perm))
}

pub(crate) fn concat(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let xs: Vec<Tensor> = (0..n.input_count())
        .map(|i| n.t(cx, i))
        .collect::<Result<_, _>>()?;
    let first = xs.first().ok_or("has no inputs")?;
    let a = axis(n.int("axis", 1)?, first.rank())? as i64;
    if xs.len() == 1 {
        return one(first.clone());
    }
    let refs: Vec<&Tensor> = xs.iter().collect();
    one(cx.g.concat(&refs, a))
}

pub(crate) fn split(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let a = axis(n.int("axis", 0)?, x.rank())?;
    let len = x.shape()[a];
    let outputs = n.proto.output.len() as u64;
    let given = if n.opset >= 13 {
        n.known_ints(1, "split")?
    } else {
        n.ints("split")?
    };
    let num_outputs = n.int("num_outputs", 0)?;
    let parts: Vec<u64> = match given {
        Some(s) => dims_of(s, "split")?,
        None => {
            let k = if num_outputs > 0 {
                num_outputs as u64
            } else {
                outputs
            };
            if k == 0 {
                return Err("has no outputs".into());
            }
            let each = if num_outputs > 0 {
                len.div_ceil(k)
            } else {
                len / k
            };
            if num_outputs == 0 && len % k != 0 {
                return Err(format!("cannot split {len} evenly into {k} outputs"));
            }
            (0..k)
                .map(|i| each.min(len.saturating_sub(i * each)))
                .collect()
        }
    };
    if parts.iter().sum::<u64>() != len {
        return Err(format!(
            "split {parts:?} does not add up to the axis's {len}"
        ));
    }
    let mut start = 0;
    let mut outs = Vec::new();
    for p in parts {
        outs.push(Value::Sym(x.slice(a as i64, start, start + p, 1)));
        start += p;
    }
    Ok(outs)
}

/// The most indices a converter lists for a gather (reversed slices, edge and reflect pads).
const MAX_INDEX_LIST: u64 = 1 << 20;

/// numpy-style slicing of one axis (a negative step): the selected indices, in order.
fn slice_indices(dim: u64, start: i64, end: i64, step: i64) -> Vec<i64> {
    let d = dim as i128;
    let norm = |v: i64| if v < 0 { v as i128 + d } else { v as i128 };
    let (mut s, mut e) = (norm(start), norm(end));
    let mut out = Vec::new();
    if step > 0 {
        s = s.clamp(0, d);
        e = e.clamp(0, d);
        let mut i = s;
        while i < e {
            out.push(i as i64);
            i += step as i128;
        }
    } else {
        s = s.clamp(0, d - 1);
        e = e.clamp(-1, d - 1);
        let mut i = s;
        while i > e {
            out.push(i as i64);
            i += step as i128;
        }
    }
    out
}

pub(crate) fn slice(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let mut x = n.t(cx, 0)?;
    let (starts, ends, axes, steps) = if n.opset < 10 {
        (
            n.ints("starts")?.ok_or("needs starts")?,
            n.ints("ends")?.ok_or("needs ends")?,
            n.ints("axes")?,
            None,
        )
    } else {
        (
            n.known_ints(1, "starts")?.ok_or("needs starts")?,
            n.known_ints(2, "ends")?.ok_or("needs ends")?,
            n.known_ints(3, "axes")?,
            n.known_ints(4, "steps")?,
        )
    };
    let r = x.rank();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&v| axis(v, r)).collect::<Result<_, _>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    for i in 0..starts.len() {
        let a = axes[i];
        let dim = cx.dims(&x)?[a];
        let step = steps[i];
        if step == 0 {
            return Err("has a step of 0".into());
        }
        if step > 0 {
            // numpy's clamping, then the builder's slice (no index list).
            let d = dim as i128;
            let norm = |v: i64| if v < 0 { v as i128 + d } else { v as i128 };
            let s = norm(starts[i]).clamp(0, d) as u64;
            let e = (norm(ends[i]).clamp(0, d) as u64).max(s);
            x = x.slice(a as i64, s, e, step as u64);
        } else {
            if dim > MAX_INDEX_LIST {
                return Err(format!(
                    "reverses an axis of {dim}; tenet lists at most {MAX_INDEX_LIST} indices"
                ));
            }
            let idx = slice_indices(dim, starts[i], ends[i], step);
            x = x.gather(&index_tensor(cx, &[idx.len() as u64], &idx), a as i64);
        }
    }
    one(x)
}

pub(crate) fn gather(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let idx = n.t(cx, 1)?;
    let a = axis(n.int("axis", 0)?, x.rank())?;
    one(x.gather(&idx, a as i64))
}

/// ONNX's two-way broadcast of two shapes.
fn broadcast(a: &[u64], b: &[u64]) -> Result<Vec<u64>, String> {
    let r = a.len().max(b.len());
    let at = |s: &[u64], i: usize| {
        if i + s.len() >= r {
            s[i + s.len() - r]
        } else {
            1
        }
    };
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(format!(
                "shapes {a:?} and {b:?} do not broadcast ({x} vs {y})"
            )),
        })
        .collect()
}

pub(crate) fn expand(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let shape = dims_of(n.known_ints(1, "shape")?.ok_or("needs its shape")?, "shape")?;
    let out = broadcast(x.shape(), &shape)?;
    if out == x.shape() {
        return one(x);
    }
    one(x.expand(&out))
}

pub(crate) fn tile(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let reps = dims_of(
        n.known_ints(1, "repeats")?.ok_or("needs repeats")?,
        "repeats",
    )?;
    if reps.len() != x.rank() {
        return Err(format!("repeats {reps:?} do not match rank {}", x.rank()));
    }
    let s = x.shape().to_vec();
    let mut split = Vec::new();
    let mut wide = Vec::new();
    for (d, r) in s.iter().zip(&reps) {
        split.extend([1, *d as i64]);
        wide.extend([*r, *d]);
    }
    let out: Vec<i64> = s
        .iter()
        .zip(&reps)
        .map(|(d, r)| {
            d.checked_mul(*r)
                .filter(|&v| v <= 1 << 40)
                .map(|v| v as i64)
        })
        .collect::<Option<_>>()
        .ok_or_else(|| format!("repeats {reps:?} make a tensor beyond tenet's limits"))?;
    one(x.reshape(&split).expand(&wide).reshape(&out))
}

pub(crate) fn pad(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let mut x = n.t(cx, 0)?;
    let mode = n.string("mode", "constant")?;
    let r = x.rank();
    let (pads, value, axes) = if n.opset < 11 {
        let p = n
            .ints("pads")?
            .or(n.ints("paddings")?)
            .ok_or("needs pads")?;
        (p, n.float("value", 0.0)? as f64, None)
    } else {
        (
            n.known_ints(1, "pads")?.ok_or("needs pads")?,
            n.known_f64(2, "constant_value")?.unwrap_or(0.0),
            n.known_ints(3, "axes")?,
        )
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&v| axis(v, r)).collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads {pads:?} should have {} values",
            2 * axes.len()
        ));
    }
    let k = axes.len();
    if pads.iter().any(|&p| p.unsigned_abs() > 1 << 40) {
        return Err(format!("pads {pads:?} are beyond tenet's dimension limit"));
    }
    // Negative pads crop first.
    for (i, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[i], pads[k + i]);
        if b < 0 || e < 0 {
            let len = cx.dims(&x)?[a] as i64;
            let s = (-b).max(0);
            let end = len - (-e).max(0);
            if s > end {
                return Err(format!("pads {pads:?} crop more than axis {a} holds"));
            }
            x = x.slice(a as i64, s as u64, end as u64, 1);
        }
    }
    let before = |i: usize| pads[i].max(0) as u64;
    let after = |i: usize| pads[k + i].max(0) as u64;
    match mode.as_str() {
        "constant" => {
            let mut pairs = vec![(0u64, 0u64); r];
            for (i, &a) in axes.iter().enumerate() {
                pairs[a] = (before(i), after(i));
            }
            if pairs.iter().all(|&p| p == (0, 0)) {
                return one(x);
            }
            one(x.pad(&pairs, value))
        }
        "edge" | "reflect" | "wrap" => {
            for (i, &a) in axes.iter().enumerate() {
                let (b, e) = (before(i) as i64, after(i) as i64);
                if b == 0 && e == 0 {
                    continue;
                }
                let len = cx.dims(&x)?[a] as i64;
                if (len as u64).saturating_add((b + e) as u64) > MAX_INDEX_LIST {
                    return Err(format!(
                        "{mode} padding of an axis to {} elements; tenet lists at most {MAX_INDEX_LIST} indices",
                        len + b + e
                    ));
                }
                if len == 0 || (mode == "reflect" && (b >= len || e >= len)) {
                    return Err(format!("{mode} padding of {b}/{e} on an axis of {len}"));
                }
                let idx: Vec<i64> = (-b..len + e)
                    .map(|p| match mode.as_str() {
                        "edge" => p.clamp(0, len - 1),
                        "wrap" => p.rem_euclid(len),
                        _ if p < 0 => -p,
                        _ if p >= len => 2 * (len - 1) - p,
                        _ => p,
                    })
                    .collect();
                x = x.gather(&index_tensor(cx, &[idx.len() as u64], &idx), a as i64);
            }
            one(x)
        }
        other => Err(format!("mode = {other:?} is not supported")),
    }
}

fn nchw(x: &Tensor) -> Result<[u64; 4], String> {
    match x.shape() {
        &[a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(format!("needs an NCHW input, got {}", x.ty())),
    }
}

pub(crate) fn depth_to_space(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let [nb, c, h, w] = nchw(&x)?;
    let b = n.int("blocksize", 0)?;
    let b = u64::try_from(b)
        .ok()
        .filter(|&b| (1..=1 << 16).contains(&b) && c % (b * b) == 0)
        .ok_or_else(|| format!("blocksize {b} does not divide {c} channels"))?;
    let c2 = c / (b * b);
    let (dims, perm): (Vec<u64>, [u32; 6]) = match n.string("mode", "DCR")?.as_str() {
        "DCR" => (vec![nb, b, b, c2, h, w], [0, 3, 4, 1, 5, 2]),
        "CRD" => (vec![nb, c2, b, b, h, w], [0, 1, 4, 2, 5, 3]),
        other => return Err(format!("mode = {other:?} is not supported")),
    };
    one(x
        .reshape(&signed(&dims))
        .permute(&perm)
        .reshape(&signed(&[nb, c2, h * b, w * b])))
}

pub(crate) fn space_to_depth(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let [nb, c, h, w] = nchw(&x)?;
    let b = n.int("blocksize", 0)?;
    let b = u64::try_from(b)
        .ok()
        .filter(|&b| (1..=1 << 16).contains(&b) && h % b == 0 && w % b == 0)
        .ok_or_else(|| format!("blocksize {b} does not divide {h}×{w}"))?;
    one(x
        .reshape(&signed(&[nb, c, h / b, b, w / b, b]))
        .permute(&[0, 3, 5, 1, 2, 4])
        .reshape(&signed(&[nb, c * b * b, h / b, w / b])))
}

pub(crate) fn trilu(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let upper = n.int("upper", 1)? != 0;
    let k = n.known_ints(1, "k")?.map(|v| v[0]).unwrap_or(0);
    let s = x.shape();
    if s.len() < 2 {
        return Err(format!("needs a rank ≥ 2 input, got {}", x.ty()));
    }
    let mask = cx.g.tri_mask(&s[s.len() - 2..], upper, k);
    let zero = cx.g.scalar(x.dtype(), 0.0);
    one(mask.where_(&x, &zero))
}

/// Resize and Upsample, modes `nearest` and `linear`, as one gather (nearest) or two gathers and
/// a blend (linear) per resized axis.
pub(crate) fn resize(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let mut x = n.t(cx, 0)?;
    let r = x.rank();
    let in_dims = x.shape().to_vec();
    let mode = n.string("mode", "nearest")?;
    let upsample = n.op_type() == "Upsample";
    let legacy = upsample || n.opset < 11;
    let (ctm, nearest_mode) = if legacy {
        ("asymmetric".to_string(), "floor".to_string())
    } else {
        n.float("cubic_coeff_a", -0.75)?;
        n.float("extrapolation_value", 0.0)?;
        if n.int("exclude_outside", 0)? != 0 {
            return Err("exclude_outside = 1 is not supported".into());
        }
        if n.int("antialias", 0)? != 0 {
            return Err("antialias = 1 is not supported".into());
        }
        let policy = n.string("keep_aspect_ratio_policy", "stretch")?;
        if policy != "stretch" {
            return Err(format!(
                "keep_aspect_ratio_policy = {policy:?} is not supported"
            ));
        }
        (
            n.string("coordinate_transformation_mode", "half_pixel")?,
            n.string("nearest_mode", "round_prefer_floor")?,
        )
    };
    let axes: Vec<usize> = match n.ints("axes")? {
        Some(a) => a.iter().map(|&v| axis(v, r)).collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    let (scales, sizes): (Option<Vec<f32>>, Option<Vec<i64>>) = if upsample && n.opset < 9 {
        (Some(n.floats("scales")?.ok_or("needs scales")?), None)
    } else if legacy {
        let s = n.known(1, "scales")?.ok_or("needs scales")?;
        (Some(s.to_f32_vec()), None)
    } else {
        n.opt(1); // roi: only tf_crop_and_resize reads it, which is refused
        let scales = n
            .known(2, "scales")?
            .map(|t| t.to_f32_vec())
            .filter(|v| !v.is_empty());
        (scales, n.known_ints(3, "sizes")?)
    };
    let mut out_dims = in_dims.clone();
    let mut axis_scale = vec![1f32; r];
    match (&scales, &sizes) {
        (_, Some(sz)) => {
            if sz.len() != axes.len() {
                return Err(format!("sizes {sz:?} do not match {} axes", axes.len()));
            }
            for (k, &a) in axes.iter().enumerate() {
                out_dims[a] =
                    u64::try_from(sz[k]).map_err(|_| format!("size {} is negative", sz[k]))?;
                axis_scale[a] = out_dims[a] as f32 / in_dims[a] as f32;
            }
        }
        (Some(sc), None) => {
            if sc.len() != axes.len() {
                return Err(format!("scales {sc:?} do not match {} axes", axes.len()));
            }
            for (k, &a) in axes.iter().enumerate() {
                if !(sc[k] > 0.0 && sc[k] < 1e6) {
                    return Err(format!("scale {} is not a positive number", sc[k]));
                }
                axis_scale[a] = sc[k];
                out_dims[a] = (in_dims[a] as f64 * sc[k] as f64).floor() as u64;
            }
        }
        (None, None) => return Err("needs scales or sizes".into()),
    }
    let linear = match mode.as_str() {
        "nearest" => false,
        "linear" | "bilinear" => true,
        other => return Err(format!("mode = {other:?} is not supported")),
    };
    for a in 0..r {
        let (len, out, scale) = (in_dims[a], out_dims[a], axis_scale[a]);
        if out == len && scale == 1.0 {
            continue;
        }
        if len == 0 || out == 0 || out > 1 << 24 {
            return Err(format!("resizes an axis from {len} to {out}"));
        }
        // ONNX's length_resized: the unrounded `len · scale` when scales were given.
        let resized = if sizes.is_some() {
            out as f32
        } else {
            len as f32 * scale
        };
        let coord = |i: u64| -> Result<f32, String> {
            let i = i as f32;
            Ok(match ctm.as_str() {
                "half_pixel" => (i + 0.5) / scale - 0.5,
                "pytorch_half_pixel" if out > 1 => (i + 0.5) / scale - 0.5,
                "pytorch_half_pixel" => 0.0,
                "align_corners" if out == 1 => 0.0,
                "align_corners" => i * (len - 1) as f32 / (resized - 1.0),
                "asymmetric" => i / scale,
                other => {
                    return Err(format!(
                        "coordinate_transformation_mode = {other:?} is not supported"
                    ));
                }
            })
        };
        let last = (len - 1) as i64;
        if !linear {
            let idx: Vec<i64> = (0..out)
                .map(|i| {
                    let c = coord(i)?;
                    let j = match nearest_mode.as_str() {
                        "round_prefer_floor" if c.fract() == 0.5 => c.floor(),
                        "round_prefer_floor" => c.round(),
                        "round_prefer_ceil" => (c + 0.5).floor(),
                        "floor" => c.floor(),
                        "ceil" => c.ceil(),
                        other => return Err(format!("nearest_mode = {other:?} is not supported")),
                    };
                    Ok((j as i64).clamp(0, last))
                })
                .collect::<Result<_, String>>()?;
            let times = out / len;
            if out % len == 0
                && idx
                    .iter()
                    .enumerate()
                    .all(|(i, &j)| j == (i as u64 / times) as i64)
            {
                // Each input element repeated `times` times: a broadcast copy, not a gather.
                let mut dims = cx.dims(&x)?;
                dims.insert(a + 1, 1);
                let mut wide = dims.clone();
                wide[a + 1] = times;
                let mut merged = signed(&dims);
                merged.remove(a + 1);
                merged[a] = out as i64;
                x = x.reshape(&signed(&dims)).expand(&wide).reshape(&merged);
            } else {
                x = x.gather(&index_tensor(cx, &[out], &idx), a as i64);
            }
            continue;
        }
        if x.dtype() != DType::F32 {
            return Err(format!("linear resizing needs f32, got {}", x.dtype()));
        }
        let mut lo = Vec::new();
        let mut hi = Vec::new();
        let mut w = Vec::new();
        for i in 0..out {
            let c = coord(i)?.clamp(0.0, last as f32);
            let f = c.floor();
            lo.push(f as i64);
            hi.push((f as i64 + 1).min(last));
            w.push(c - f);
        }
        let x0 = x.gather(&index_tensor(cx, &[out], &lo), a as i64);
        let x1 = x.gather(&index_tensor(cx, &[out], &hi), a as i64);
        let mut wshape = vec![1u64; r];
        wshape[a] = out;
        let wt = cx.g.constant_f32(&wshape, &w);
        let one_minus: Vec<f32> = w.iter().map(|v| 1.0 - v).collect();
        let wl = cx.g.constant_f32(&wshape, &one_minus);
        x = &(&x0 * &wl) + &(&x1 * &wt);
    }
    one(x)
}

/// `out[i…] = data[i… with axis replaced by indices[i…]]`, as one gather from the flattened
/// data at indices computed in the graph (negative indices count from the end).
pub(crate) fn gather_elements_of(cx: &Cx, data: &Tensor, indices: &Tensor, a: usize) -> Tensor {
    let ds = data.shape().to_vec();
    let is = indices.shape().to_vec();
    let idx = indices.cast(DType::I64);
    let zero = cx.g.scalar(DType::I64, 0.0);
    let dim = cx.g.scalar(DType::I64, ds[a] as f64);
    let idx = idx.lt(&zero).where_(&(&idx + &dim), &idx);
    let mut stride = 1u64;
    let mut flat: Option<Tensor> = None;
    for j in (0..ds.len()).rev() {
        let coord = if j == a {
            idx.clone()
        } else {
            cx.g.iota(DType::I64, &is, j as u32)
        };
        let term = if stride == 1 {
            coord
        } else {
            &coord * &cx.g.scalar(DType::I64, stride as f64)
        };
        flat = Some(match flat {
            None => term,
            Some(f) => &f + &term,
        });
        stride *= ds[j];
    }
    let flat = flat.expect("rank ≥ 1");
    data.reshape(&[-1]).gather(&flat, 0)
}

pub(crate) fn gather_elements(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let idx = n.t(cx, 1)?;
    let a = axis(n.int("axis", 0)?, x.rank())?;
    if idx.rank() != x.rank() {
        return Err(format!(
            "indices {} and data {} differ in rank",
            idx.ty(),
            x.ty()
        ));
    }
    one(gather_elements_of(cx, &x, &idx, a))
}

pub(crate) fn eye_like(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let ty = n.get(0)?.ty();
    if ty.rank() != 2 {
        return Err(format!("needs a 2-D input, got {ty}"));
    }
    let dtype = if n.has_attr("dtype") {
        crate::tensor::dtype_of(n.int("dtype", 1)? as i32)?
    } else {
        ty.dtype
    };
    let k = n.int("k", 0)?;
    let rows = cx.g.iota(DType::I64, &ty.shape, 0);
    let cols = cx.g.iota(DType::I64, &ty.shape, 1);
    let diag = (&cols - &rows).eq(&cx.g.scalar(DType::I64, k as f64));
    one(diag.cast(dtype))
}

pub(crate) fn one_hot(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let idx = n.t(cx, 0)?;
    let depth = n.known_f64(1, "depth")?.ok_or("needs depth")?;
    if !(depth >= 1.0 && depth <= (1u64 << 24) as f64) {
        return Err(format!("depth {depth} is out of range"));
    }
    let depth = depth as u64;
    let values = n.t(cx, 2)?;
    if values.shape() != [2] {
        return Err(format!("values should be [off, on], got {}", values.ty()));
    }
    let out_rank = idx.rank() + 1;
    let a = axis(n.int("axis", -1)?, out_rank)?;
    let mut out_shape = idx.shape().to_vec();
    out_shape.insert(a, depth);
    let idx = idx.cast(DType::I64);
    let zero = cx.g.scalar(DType::I64, 0.0);
    let d = cx.g.scalar(DType::I64, depth as f64);
    let idx = idx.lt(&zero).where_(&(&idx + &d), &idx);
    let mut dims = signed(&cx.dims(&idx)?);
    dims.insert(a, 1);
    let hot = idx
        .reshape(&dims)
        .eq(&cx.g.iota(DType::I64, &out_shape, a as u32));
    let off = values.slice(0, 0, 1, 1).reshape(&[]);
    let on = values.slice(0, 1, 2, 1).reshape(&[]);
    one(hot.where_(&on, &off))
}
