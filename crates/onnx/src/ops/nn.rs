//! Neural-network ONNX ops: products (MatMul, Gemm), convolutions (Conv, and ConvTranspose as a
//! convolution over the zero-upsampled input with the flipped kernel), pooling, and the
//! normalisations (BatchNormalization folded into one scale and shift when its statistics are
//! known, InstanceNormalization and LayerNormalization on tenet's `layer_norm`, Softmax).

use tenet_ir::{DType, GraphBuilder, PoolKind, Tensor, Window2d};

use super::{axis, one, product, scalar, signed};
use crate::convert::{ConvFold, Cx, NodeIn, Value};

pub(crate) fn matmul(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let a = n.t(cx, 0)?;
    let b = n.t(cx, 1)?;
    let (a1, b1) = (a.rank() == 1, b.rank() == 1);
    let a2 = if a1 { a.reshape(&[1, -1]) } else { a };
    let b2 = if b1 { b.reshape(&[-1, 1]) } else { b };
    let mut y = a2.matmul(&b2);
    if a1 || b1 {
        // numpy drops the 1 it put in: before the last axis for a vector on the left, the
        // last axis for one on the right.
        let mut dims = cx.dims(&y)?;
        if b1 {
            dims.pop();
        }
        if a1 {
            let at = if b1 { dims.len() - 1 } else { dims.len() - 2 };
            dims.remove(at);
        }
        y = y.reshape(&signed(&dims));
    }
    one(y)
}

/// `alpha · A' · B' + beta · C`.
pub(crate) fn gemm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    n.int("broadcast", 1)?; // opset < 7: C broadcasts either way here
    let alpha = n.float("alpha", 1.0)?;
    let beta = n.float("beta", 1.0)?;
    let mut a = n.t(cx, 0)?;
    let mut b = n.t(cx, 1)?;
    if n.int("transA", 0)? != 0 {
        a = a.transpose(0, 1);
    }
    if n.int("transB", 0)? != 0 {
        b = b.transpose(0, 1);
    }
    let mut y = a.matmul(&b);
    if alpha != 1.0 {
        y = &y * &scalar(cx, y.dtype(), alpha as f64);
    }
    if let Some(mut c) = n.opt_t(cx, 2) {
        if beta != 1.0 {
            c = &c * &scalar(cx, c.dtype(), beta as f64);
        }
        y = &y + &c;
    }
    one(y)
}

/// The largest pad, output size or output padding ConvTranspose takes (tenet's dimension limit).
const LIMIT: i64 = 1 << 40;

/// Strides, dilations and padding of a 1-D or 2-D window op.
struct Window {
    strides: Vec<u64>,
    dilations: Vec<u64>,
    begin: Vec<u64>,
    end: Vec<u64>,
}

fn positive(attr: Option<Vec<i64>>, rank: usize, what: &str) -> Result<Vec<u64>, String> {
    match attr {
        None => Ok(vec![1; rank]),
        Some(v) if v.len() == rank && v.iter().all(|&x| x >= 1 && x <= u32::MAX as i64) => {
            Ok(v.iter().map(|&x| x as u64).collect())
        }
        Some(v) => Err(format!("{what} {v:?} should be {rank} positive values")),
    }
}

/// Read `strides`, `dilations`, `pads` and `auto_pad` for `spatial` input sizes and `kernel`.
fn window(n: &NodeIn, spatial: &[u64], kernel: &[u64], dilate: bool) -> Result<Window, String> {
    let r = spatial.len();
    let strides = positive(n.ints("strides")?, r, "strides")?;
    let dilations = if dilate {
        positive(n.ints("dilations")?, r, "dilations")?
    } else {
        vec![1; r]
    };
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let pads = n.ints("pads")?;
    let (begin, end) = match auto_pad.as_str() {
        "NOTSET" => match pads {
            None => (vec![0; r], vec![0; r]),
            Some(p)
                if p.len() == 2 * r && p.iter().all(|&x| (0..=u32::MAX as i64).contains(&x)) =>
            {
                (
                    p[..r].iter().map(|&x| x as u64).collect(),
                    p[r..].iter().map(|&x| x as u64).collect(),
                )
            }
            Some(p) => return Err(format!("pads {p:?} should be {} values ≥ 0", 2 * r)),
        },
        "VALID" => (vec![0; r], vec![0; r]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut b = vec![0; r];
            let mut e = vec![0; r];
            for i in 0..r {
                let out = spatial[i].div_ceil(strides[i]);
                let span = (kernel[i] - 1) * dilations[i] + 1;
                let total = ((out.max(1) - 1) * strides[i] + span).saturating_sub(spatial[i]);
                let small = total / 2;
                if auto_pad == "SAME_UPPER" {
                    (b[i], e[i]) = (small, total - small);
                } else {
                    (b[i], e[i]) = (total - small, small);
                }
            }
            (b, e)
        }
        other => return Err(format!("auto_pad = {other:?} is not supported")),
    };
    Ok(Window {
        strides,
        dilations,
        begin,
        end,
    })
}

fn u32s<const N: usize>(v: &[u64]) -> Result<[u32; N], String> {
    let mut out = [0u32; N];
    for (o, &x) in out.iter_mut().zip(v) {
        *o = u32::try_from(x).map_err(|_| format!("{x} is too large for a window"))?;
    }
    Ok(out)
}

/// A 1-D op's operand as 2-D: `[N, C, L]` → `[N, C, 1, L]`.
fn as_2d(x: &Tensor) -> Tensor {
    let s = x.shape();
    x.reshape(&[s[0] as i64, s[1] as i64, 1, s[2] as i64])
}

/// Window parameters of a 1-D op lifted to 2-D (a height of 1).
fn lift(w: Window) -> Window {
    Window {
        strides: [vec![1], w.strides].concat(),
        dilations: [vec![1], w.dilations].concat(),
        begin: [vec![0], w.begin].concat(),
        end: [vec![0], w.end].concat(),
    }
}

fn spatial_rank(x: &Tensor) -> Result<usize, String> {
    match x.rank() {
        3 => Ok(1),
        4 => Ok(2),
        r => Err(format!(
            "has a rank-{r} input; tenet imports 1-D and 2-D windows (rank 3 or 4)"
        )),
    }
}

fn check_kernel(n: &NodeIn, kernel: &[u64]) -> Result<(), String> {
    if kernel.iter().any(|&k| k == 0 || k > u32::MAX as u64) {
        return Err(format!(
            "has a kernel of {kernel:?}; every extent must be 1 or more"
        ));
    }
    if let Some(k) = n.ints("kernel_shape")?
        && k.iter().map(|&x| x as u64).collect::<Vec<_>>() != kernel
    {
        return Err(format!(
            "kernel_shape {k:?} does not match the weight's {kernel:?}"
        ));
    }
    Ok(())
}

pub(crate) fn conv(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let w = n.t(cx, 1)?;
    let bias = n.opt_t(cx, 2);
    let r = spatial_rank(&x)?;
    if w.rank() != r + 2 {
        return Err(format!("weight {} does not match input {}", w.ty(), x.ty()));
    }
    let kernel = w.shape()[2..].to_vec();
    check_kernel(n, &kernel)?;
    let groups = n.int("group", 1)?;
    let groups = u32::try_from(groups).map_err(|_| format!("group {groups} is invalid"))?;
    let win = window(n, &x.shape()[2..], &kernel, true)?;
    let (x2, w2, win) = if r == 1 {
        (as_2d(&x), as_2d(&w), lift(win))
    } else {
        (x.clone(), w, win)
    };
    let (strides, pads, dilations) = (
        u32s(&win.strides)?,
        u32s(&[win.begin[0], win.begin[1], win.end[0], win.end[1]])?,
        u32s(&win.dilations)?,
    );
    let y = x2.conv2d(&w2, bias.as_ref(), strides, pads, dilations, groups);
    // A convolution a BatchNormalization alone reads may be rebuilt with it folded in.
    let known = |i: usize| match n.inputs.get(i) {
        Some(Some(Value::Known(k))) => Some(k.t.clone()),
        _ => None,
    };
    let out = n.out_name(0).to_string();
    if r == 2
        && cx.readers.get(&out) == Some(&1)
        && x.dtype() == tenet_ir::DType::F32
        && let Some(w) = known(1)
        && (n.inputs.get(2).is_none_or(Option::is_none) || known(2).is_some())
    {
        cx.convs.insert(
            out,
            ConvFold {
                x: x2.clone(),
                w,
                b: known(2),
                strides,
                pads,
                dilations,
                groups,
            },
        );
    }
    let y = if r == 1 {
        let s = cx.dims(&y)?;
        y.reshape(&[s[0] as i64, s[1] as i64, s[3] as i64])
    } else {
        y
    };
    one(y)
}

/// ConvTranspose as a convolution: the input with `stride − 1` zeros between elements, padded
/// by `dilation·(k − 1)` less the pads (cropped where that is negative), convolved at stride 1
/// with the kernel's in/out channels swapped per group and its window flipped.
pub(crate) fn conv_transpose(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let w_value = n.get(1)?.clone();
    let bias = n.opt_t(cx, 2);
    let r = spatial_rank(&x)?;
    let w_ty = w_value.ty();
    if w_ty.rank() != r + 2 {
        return Err(format!("weight {w_ty} does not match input {}", x.ty()));
    }
    let kernel = w_ty.shape[2..].to_vec();
    check_kernel(n, &kernel)?;
    let g = n.int("group", 1)?;
    let g = u64::try_from(g)
        .ok()
        .filter(|&g| g >= 1 && w_ty.shape[0] % g == 0)
        .ok_or_else(|| {
            format!(
                "group {g} does not divide the weight's {} channels",
                w_ty.shape[0]
            )
        })?;
    let spatial = x.shape()[2..].to_vec();
    if spatial.contains(&0) {
        return Err(format!("has an empty input {}", x.ty()));
    }
    let strides = positive(n.ints("strides")?, r, "strides")?;
    let dilations = positive(n.ints("dilations")?, r, "dilations")?;
    let out_pad = match n.ints("output_padding")? {
        None => vec![0; r],
        Some(p) if p.len() == r && p.iter().all(|&v| (0..=LIMIT).contains(&v)) => {
            p.iter().map(|&v| v as u64).collect()
        }
        Some(p) => return Err(format!("output_padding {p:?} should be {r} values ≥ 0")),
    };
    let full: Vec<u64> = (0..r)
        .map(|i| {
            let up = strides[i].checked_mul(spatial[i] - 1)?;
            let span = (kernel[i] - 1).checked_mul(dilations[i])?;
            up.checked_add(out_pad[i])?
                .checked_add(span)?
                .checked_add(1)
        })
        .collect::<Option<_>>()
        .ok_or("has an output size that overflows")?;
    if full.iter().any(|&f| f > 1 << 40) {
        return Err(format!(
            "has an output of {full:?}, beyond tenet's dimension limit"
        ));
    }
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let output_shape = n.ints("output_shape")?;
    let pads = n.ints("pads")?;
    let (begin, end): (Vec<i64>, Vec<i64>) = if let Some(os) = output_shape {
        let os = &os[os.len().saturating_sub(r)..];
        if os.len() != r || os.iter().any(|&v| !(1..=LIMIT).contains(&v)) {
            return Err(format!(
                "output_shape {os:?} should have {r} spatial values"
            ));
        }
        split_total(&full, os, auto_pad == "SAME_UPPER")
    } else {
        match auto_pad.as_str() {
            "SAME_UPPER" | "SAME_LOWER" => {
                let want: Vec<i64> = (0..r).map(|i| (spatial[i] * strides[i]) as i64).collect();
                split_total(&full, &want, auto_pad == "SAME_UPPER")
            }
            "NOTSET" | "VALID" => match pads {
                None => (vec![0; r], vec![0; r]),
                Some(p) if p.len() == 2 * r && p.iter().all(|&v| (0..=LIMIT).contains(&v)) => {
                    (p[..r].to_vec(), p[r..].to_vec())
                }
                Some(p) => return Err(format!("pads {p:?} should be {} values ≥ 0", 2 * r)),
            },
            other => return Err(format!("auto_pad = {other:?} is not supported")),
        }
    };
    if r == 2
        && g == 1
        && (0..r).all(|i| kernel[i] == strides[i] && dilations[i] == 1)
        && kernel.iter().product::<u64>() > 1
    {
        return conv_transpose_by_phases(cx, &x, &w_value, bias, &kernel, &begin, &end, &out_pad);
    }
    let (c, o_per_g) = (w_ty.shape[0], w_ty.shape[1]);
    // The kernel as a convolution's: [g, C/g, O/g, k..] → [g, O/g, C/g, k..], flipped in space.
    let flip = |gb: &GraphBuilder, w: &Tensor| -> Tensor {
        let mut dims = vec![g as i64, (c / g) as i64, o_per_g as i64];
        dims.extend(signed(&kernel));
        let mut perm: Vec<u32> = vec![0, 2, 1];
        perm.extend((3..3 + r as u32).collect::<Vec<_>>());
        let mut target = vec![(g * o_per_g) as i64, (c / g) as i64];
        target.extend(signed(&kernel));
        let mut t = w.reshape(&dims).permute(&perm).reshape(&target);
        for (i, &k) in kernel.iter().enumerate() {
            let rev: Vec<i64> = (0..k as i64).rev().collect();
            t = t.gather(&gb.constant_i64(&[k], &rev), 2 + i as i64);
        }
        t
    };
    let wc = match &w_value {
        Value::Known(k) => {
            let folded = cx.eval_known(&format!("{}.flipped", k.name), &[&k.t], |gb, ts| {
                flip(gb, &ts[0])
            })?;
            cx.tensor(&folded)
        }
        Value::Sym(t) => flip(&cx.g, t),
    };
    // Zeros between the input's elements, then padding (or cropping) for the convolution.
    let mut xu = x.clone();
    for (i, &s) in strides.iter().enumerate() {
        let ax = 2 + i;
        if s > 1 {
            let len = cx.dims(&xu)?[ax];
            let mut dims = signed(xu.shape());
            dims.insert(ax + 1, 1);
            let mut pads = vec![(0u64, 0u64); dims.len()];
            pads[ax + 1] = (0, s - 1);
            let mut merged = signed(xu.shape());
            merged[ax] = (len * s) as i64;
            xu = xu.reshape(&dims).pad(&pads, 0.0).reshape(&merged).slice(
                ax as i64,
                0,
                (len - 1) * s + 1,
                1,
            );
        }
    }
    let mut conv_pad = [0u64; 4]; // [top, left, bottom, right] over the last two axes
    for i in 0..r {
        let ax = 2 + i;
        let span = ((kernel[i] - 1) * dilations[i]) as i64;
        let before = span - begin[i];
        let after = span - end[i] + out_pad[i] as i64;
        let len = cx.dims(&xu)?[ax] as i64;
        let (crop_b, crop_a) = ((-before).max(0), (-after).max(0));
        if crop_b + crop_a > 0 {
            if crop_b + crop_a >= len {
                return Err("pads crop away the whole input".into());
            }
            xu = xu.slice(ax as i64, crop_b as u64, (len - crop_a) as u64, 1);
        }
        let slot = if r == 1 { 1 } else { i };
        conv_pad[slot] = before.max(0) as u64;
        conv_pad[slot + 2] = after.max(0) as u64;
    }
    let (xu, wc) = if r == 1 {
        (as_2d(&xu), as_2d(&wc))
    } else {
        (xu, wc)
    };
    let dil: Vec<u64> = if r == 1 {
        vec![1, dilations[0]]
    } else {
        dilations.clone()
    };
    let y = xu.conv2d(
        &wc,
        bias.as_ref(),
        [1, 1],
        u32s(&conv_pad)?,
        u32s(&dil)?,
        g as u32,
    );
    let y = if r == 1 {
        let s = cx.dims(&y)?;
        y.reshape(&[s[0] as i64, s[1] as i64, s[3] as i64])
    } else {
        y
    };
    one(y)
}

/// ConvTranspose whose kernel equals its stride (no overlap, no dilation, one group): each
/// output phase `(a, b)` is a pointwise product with the kernel's tap `(a, b)`, so all phases
/// are one 1×1 convolution with the taps stacked as output channels, whose result is
/// interleaved by one permutation, then cropped or padded to the output and biased. No product
/// runs over inserted zeros.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_by_phases(
    cx: &mut Cx,
    x: &Tensor,
    w: &Value,
    bias: Option<Tensor>,
    kernel: &[u64],
    begin: &[i64],
    end: &[i64],
    out_pad: &[u64],
) -> Result<Vec<Value>, String> {
    let w_ty = w.ty();
    let (c, o) = (w_ty.shape[0], w_ty.shape[1]);
    let (kh, kw) = (kernel[0], kernel[1]);
    let stack = |t: &Tensor| -> Tensor {
        t.permute(&[2, 3, 1, 0])
            .reshape(&[(kh * kw * o) as i64, c as i64, 1, 1])
    };
    let ws = match w {
        Value::Known(k) => {
            let folded = cx.eval_known(&format!("{}.phases", k.name), &[&k.t], |_, ts| {
                stack(&ts[0])
            })?;
            cx.tensor(&folded)
        }
        Value::Sym(t) => stack(t),
    };
    let [n, _, h, wd] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let y = x
        .conv2d(&ws, None, [1, 1], [0; 4], [1, 1], 1)
        .reshape(&signed(&[n, kh, kw, o, h, wd]))
        .permute(&[0, 3, 4, 1, 5, 2])
        .reshape(&signed(&[n, o, h * kh, wd * kw]));
    let mut y = y;
    for (i, full) in [h * kh, wd * kw].into_iter().enumerate() {
        let ax = 2 + i as i64;
        let lo = begin[i];
        let hi = full as i64 + out_pad[i] as i64 - end[i];
        if hi <= lo {
            return Err("pads crop away the whole output".into());
        }
        let (from, to) = (
            lo.max(0) as u64,
            (hi.min(full as i64)).max(lo.max(0)) as u64,
        );
        if from > 0 || to < full {
            y = y.slice(ax, from, to, 1);
        }
        let (before, after) = ((-lo).max(0) as u64, (hi - full as i64).max(0) as u64);
        if before + after > 0 {
            let mut pads = vec![(0u64, 0u64); 4];
            pads[ax as usize] = (before, after);
            y = y.pad(&pads, 0.0);
        }
    }
    if let Some(b) = bias {
        y = &y + &per_channel(&b, 4);
    }
    one(y)
}

/// Pads before and after from a total (`full − wanted`), the odd one after for SAME_UPPER.
fn split_total(full: &[u64], wanted: &[i64], upper: bool) -> (Vec<i64>, Vec<i64>) {
    let mut b = Vec::new();
    let mut e = Vec::new();
    for (f, w) in full.iter().zip(wanted) {
        let total = *f as i64 - w;
        let half = total.div_euclid(2); // ONNX rounds toward −∞ (Python's //)
        if upper {
            b.push(half);
            e.push(total - half);
        } else {
            b.push(total - half);
            e.push(half);
        }
    }
    (b, e)
}

pub(crate) fn pool(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let r = spatial_rank(&x)?;
    let max = n.op_type() == "MaxPool";
    let kernel: Vec<u64> = positive(n.ints("kernel_shape")?, r, "kernel_shape")?;
    if !n.has_attr("kernel_shape") {
        return Err("has no kernel_shape".into());
    }
    let dilate = max || n.opset >= 19;
    let mut win = window(n, &x.shape()[2..], &kernel, dilate)?;
    let ceil = n.int("ceil_mode", 0)? != 0;
    let include_pad = !max && n.int("count_include_pad", 0)? != 0;
    if max {
        n.int("storage_order", 0)?; // only shapes the Indices output, which is refused
    }
    if ceil {
        for (i, &k) in kernel.iter().enumerate() {
            let len = x.shape()[2 + i];
            let span = (k - 1) * win.dilations[i] + 1;
            let padded = len + win.begin[i] + win.end[i];
            if padded < span {
                continue;
            }
            let mut out = (padded - span).div_ceil(win.strides[i]) + 1;
            if (out - 1) * win.strides[i] >= len + win.begin[i] {
                out -= 1; // a last window wholly in the padding is dropped
            }
            let extra = ((out - 1) * win.strides[i] + span).saturating_sub(padded);
            if extra > 0 && include_pad {
                return Err("ceil_mode with count_include_pad is not supported".into());
            }
            win.end[i] += extra;
        }
    }
    let kind = match (max, include_pad) {
        (true, _) => PoolKind::Max,
        (false, false) => PoolKind::Avg,
        (false, true) => PoolKind::AvgIncludePad,
    };
    let (x2, kernel, win) = if r == 1 {
        (as_2d(&x), vec![1, kernel[0]], lift(win))
    } else {
        (x.clone(), kernel, win)
    };
    let window = Window2d {
        stride: u32s(&win.strides)?,
        padding: u32s(&[win.begin[0], win.begin[1], win.end[0], win.end[1]])?,
        dilation: u32s(&win.dilations)?,
    };
    let y = x2.pool2d(kind, u32s(&kernel)?, window);
    let y = if r == 1 {
        let s = cx.dims(&y)?;
        y.reshape(&[s[0] as i64, s[1] as i64, s[3] as i64])
    } else {
        y
    };
    one(y)
}

pub(crate) fn global_pool(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    if x.rank() < 3 {
        return Err(format!("needs a rank ≥ 3 input, got {}", x.ty()));
    }
    let axes: Vec<i64> = (2..x.rank() as i64).collect();
    one(if n.op_type() == "GlobalMaxPool" {
        x.max(&axes, true)
    } else {
        x.mean(&axes, true)
    })
}

/// `[C]` → `[C, 1, …]` to broadcast over an NC… tensor of rank `rank`.
fn per_channel(t: &Tensor, rank: usize) -> Tensor {
    let mut dims = vec![-1i64];
    dims.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    t.reshape(&dims)
}

/// Inference batch normalisation: `x · a + b` with `a = scale / sqrt(var + eps)` and
/// `b = bias − mean · a`, computed once at import when the statistics are known.
pub(crate) fn batch_norm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let eps = n.float("epsilon", 1e-5)?;
    n.float("momentum", 0.9)?;
    if n.int("training_mode", 0)? != 0 || n.int("is_test", 1)? == 0 {
        return Err("is in training mode; only inference is imported".into());
    }
    if n.int("spatial", 1)? != 1 {
        return Err("spatial = 0 is not supported".into());
    }
    n.ints("consumed_inputs")?; // opset 1's bookkeeping, no meaning for inference
    let x = n.t(cx, 0)?;
    let params: Vec<Value> = (1..5)
        .map(|i| n.get(i).cloned())
        .collect::<Result<_, _>>()?;
    let ab = |g: &GraphBuilder, ts: &[Tensor]| -> (Tensor, Tensor) {
        let (scale, bias, mean, var) = (&ts[0], &ts[1], &ts[2], &ts[3]);
        let e = g.scalar(var.dtype(), eps as f64);
        let a = scale / &(var + &e).sqrt();
        let b = bias - &(mean * &a);
        (a, b)
    };
    let (a, b) = if params.iter().all(|p| matches!(p, Value::Known(_))) {
        let known: Vec<&tenet_ir::HostTensor> = params
            .iter()
            .map(|p| match p {
                Value::Known(k) => &*k.t,
                Value::Sym(_) => unreachable!(),
            })
            .collect();
        let name = n.out_name(0).to_string();
        let a = cx.eval_known(&format!("{name}.scale"), &known, |g, ts| ab(g, ts).0)?;
        let b = cx.eval_known(&format!("{name}.shift"), &known, |g, ts| ab(g, ts).1)?;
        (a, b)
    } else {
        let ts: Vec<Tensor> = params.iter().map(|p| cx.tensor(p)).collect();
        let (a, b) = ab(&cx.g, &ts);
        (Value::Sym(a), Value::Sym(b))
    };
    let (a_value, b_value) = (a.clone(), b.clone());
    let (a, b) = (cx.tensor(&a), cx.tensor(&b));
    // After a convolution only it reads: the convolution again, its weights scaled by `a`
    // per output channel and its bias `bias·a + b` (as onnxruntime folds them), instead of a
    // pass over the result.
    let input = n.proto.input.first().cloned().unwrap_or_default();
    if let (Some(c), Value::Known(ka), Value::Known(kb)) = (
        cx.convs.get(&input).cloned(),
        a_value.clone(),
        b_value.clone(),
    ) {
        let o = c.w.shape()[0] as i64;
        let name = n.out_name(0).to_string();
        let w = cx.eval_known(&format!("{name}.folded_weight"), &[&c.w, &ka.t], |_, ts| {
            &ts[0] * &ts[1].reshape(&[o, 1, 1, 1])
        });
        let bias = match &c.b {
            Some(cb) => cx.eval_known(
                &format!("{name}.folded_bias"),
                &[cb, &ka.t, &kb.t],
                |_, ts| &(&ts[0] * &ts[1]) + &ts[2],
            ),
            None => Ok(b_value.clone()),
        };
        // Beyond the import's folding budget: the normalisation as a pass of its own.
        if let (Ok(w), Ok(bias)) = (w, bias) {
            let (w, bias) = (cx.tensor(&w), cx.tensor(&bias));
            return one(c
                .x
                .conv2d(&w, Some(&bias), c.strides, c.pads, c.dilations, c.groups));
        }
    }
    let rank = x.rank();
    one(&(&x * &per_channel(&a, rank)) + &per_channel(&b, rank))
}

/// Per (sample, channel) normalisation over the spatial axes: `layer_norm` of the flattened
/// spatial extent, then the per-channel scale and bias.
pub(crate) fn instance_norm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let eps = n.float("epsilon", 1e-5)?;
    let x = n.t(cx, 0)?;
    let scale = n.t(cx, 1)?;
    let bias = n.t(cx, 2)?;
    if x.rank() < 3 {
        return Err(format!("needs a rank ≥ 3 input, got {}", x.ty()));
    }
    let s = x.shape().to_vec();
    let flat = x
        .reshape(&[s[0] as i64, s[1] as i64, product(&s[2..]) as i64])
        .layer_norm(None, None, eps);
    let y = flat.reshape(&signed(&s));
    one(&(&y * &per_channel(&scale, s.len())) + &per_channel(&bias, s.len()))
}

/// Normalisation over the axes from `axis` on, flattened into tenet's last-axis `layer_norm`
/// (`rms_norm` for RMSNormalization). LayerNormalization's optional Mean and InvStdDev outputs
/// are computed beside it, with the normalised axes kept as 1.
pub(crate) fn layer_norm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let eps = n.float("epsilon", 1e-5)?;
    n.int("stash_type", 1)?; // tenet normalises in f32 whatever the dtype
    let rms = n.op_type() == "RMSNormalization";
    let x = n.t(cx, 0)?;
    let a = axis(n.int("axis", -1)?, x.rank())?;
    let s = x.shape().to_vec();
    let inner = product(&s[a..]);
    let fit = |t: Tensor| -> Tensor {
        let normalized = &s[a..];
        let t = if t.shape() == normalized {
            t
        } else {
            t.expand(normalized)
        };
        t.reshape(&[inner as i64])
    };
    let gamma = n.opt_t(cx, 1).map(fit);
    let beta = if rms { None } else { n.opt_t(cx, 2).map(fit) };
    let mut flat_dims = signed(&s[..a]);
    flat_dims.push(inner as i64);
    let flat = x.reshape(&flat_dims);
    let normed = if rms {
        flat.rms_norm(gamma.as_ref(), eps)
    } else {
        flat.layer_norm(gamma.as_ref(), beta.as_ref(), eps)
    };
    let mut outs = vec![Value::Sym(normed.reshape(&signed(&s)))];
    let wants = |i: usize| n.proto.output.get(i).is_some_and(|o| !o.is_empty());
    if !rms && (wants(1) || wants(2)) {
        let mut kept = signed(&s[..a]);
        kept.extend(std::iter::repeat_n(1, s.len() - a));
        let last = flat.rank() as i64 - 1;
        let mean = flat.mean(&[last], true);
        let d = &flat - &mean;
        let var = (&d * &d).mean(&[last], true);
        let e = scalar(cx, x.dtype(), eps as f64);
        let inv = (&var + &e).sqrt().reciprocal();
        outs.push(Value::Sym(mean.reshape(&kept)));
        outs.push(Value::Sym(inv.reshape(&kept)));
    }
    Ok(outs)
}

/// One-hot of the first maximum along the axis (the trailing axes flattened before opset 13).
pub(crate) fn hardmax(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let s = x.shape().to_vec();
    let (flat, a) = if n.opset >= 13 {
        (x.clone(), axis(n.int("axis", -1)?, x.rank())?)
    } else {
        let a = axis(n.int("axis", 1)?, x.rank().max(1))?;
        (
            x.reshape(&[product(&s[..a]) as i64, product(&s[a..]) as i64]),
            1,
        )
    };
    let arg = flat.argmax(&[a as i64], true);
    let hot =
        cx.g.iota(tenet_ir::DType::I64, flat.shape(), a as u32)
            .eq(&arg)
            .cast(x.dtype());
    one(hot.reshape(&signed(&s)))
}

/// `x / ‖x‖ₚ` along the axis, p = 1 or 2; a zero norm gives zeros (as onnx's reference).
pub(crate) fn lp_norm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let a = axis(n.int("axis", -1)?, x.rank())? as i64;
    let norm = match n.int("p", 2)? {
        1 => x.abs().sum(&[a], true),
        2 => (&x * &x).sum(&[a], true).sqrt(),
        p => return Err(format!("p = {p} is not supported (1 or 2)")),
    };
    let zero = scalar(cx, x.dtype(), 0.0);
    one(norm.eq(&zero).where_(&zero, &(&x / &norm)))
}

/// Local response normalisation across channels: `x / (bias + alpha/size · Σ x²)^beta` over
/// a window of `size` channels, as a sum of shifted slices of the padded squares.
pub(crate) fn lrn(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let alpha = n.float("alpha", 1e-4)?;
    let beta = n.float("beta", 0.75)?;
    let bias = n.float("bias", 1.0)?;
    let size = n.int("size", 0)?;
    if !(1..=1024).contains(&size) || x.rank() < 3 {
        return Err(format!("size {size} on {} is not supported", x.ty()));
    }
    let size = size as u64;
    let c = x.shape()[1];
    let mut pads = vec![(0u64, 0u64); x.rank()];
    pads[1] = ((size - 1) / 2, (size - 1).div_ceil(2));
    let sq = (&x * &x).pad(&pads, 0.0);
    let mut sum = sq.slice(1, 0, c, 1);
    for k in 1..size {
        sum = &sum + &sq.slice(1, k, k + c, 1);
    }
    let dt = x.dtype();
    let base = &(&sum * &scalar(cx, dt, alpha as f64 / size as f64)) + &scalar(cx, dt, bias as f64);
    one(&x / &base.pow(&scalar(cx, dt, beta as f64)))
}

/// Softmax and LogSoftmax: along one axis from opset 13, over the flattened trailing axes
/// from `axis` before it.
pub(crate) fn softmax(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let log = n.op_type() == "LogSoftmax";
    let apply = |t: &Tensor, a: i64| if log { t.log_softmax(a) } else { t.softmax(a) };
    if n.opset >= 13 {
        let a = axis(n.int("axis", -1)?, x.rank())?;
        return one(apply(&x, a as i64));
    }
    let a = axis(n.int("axis", 1)?, x.rank().max(1))?;
    let s = x.shape().to_vec();
    if a + 1 == s.len() {
        return one(apply(&x, -1));
    }
    let flat = x.reshape(&[product(&s[..a]) as i64, product(&s[a..]) as i64]);
    one(apply(&flat, 1).reshape(&signed(&s)))
}

/// Attention (opset 23): `softmax((Q·√s)(K·√s)ᵀ [softcapped] + bias)·V` with numpy's and onnx's
/// rules — heads split from 3-D inputs by `q_num_heads`/`kv_num_heads`, K and V heads repeated
/// for grouped queries, the bias from a boolean or additive mask (padded with masked keys to the
/// key length) and `is_causal`, a row with every key masked giving zeros. Past keys and values,
/// sliding windows and the extra outputs are refused.
pub(crate) fn attention(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    for unsupported in [4, 5, 6] {
        if n.opt(unsupported).is_some() {
            return Err(format!(
                "input {unsupported} (past keys and values, or nonpad_kv_seqlen) is not supported"
            ));
        }
    }
    if n.int("qk_matmul_output_mode", 0)? != 0 {
        return Err("qk_matmul_output_mode other than 0 is not supported".into());
    }
    if n.int("left_window_size", -1)? != -1 || n.int("right_window_size", -1)? != -1 {
        return Err("sliding windows are not supported".into());
    }
    if !matches!(n.int("softmax_precision", 1)?, 1) {
        return Err("softmax_precision other than float is not supported".into());
    }
    let causal = n.int("is_causal", 0)? != 0;
    let softcap = n.float("softcap", 0.0)?;
    let (mut q, mut k, mut v) = (n.t(cx, 0)?, n.t(cx, 1)?, n.t(cx, 2)?);
    let three_d = q.rank() == 3;
    let heads = |t: &Tensor, h: i64, what: &str| -> Result<Tensor, String> {
        let s = t.shape();
        if h <= 0 || !s[2].is_multiple_of(h as u64) {
            return Err(format!("{what} {} does not split into {h} heads", t.ty()));
        }
        Ok(
            t.reshape(&[s[0] as i64, s[1] as i64, h, (s[2] / h as u64) as i64])
                .permute(&[0, 2, 1, 3]),
        )
    };
    if three_d {
        let hq = n.int("q_num_heads", 0)?;
        let hkv = n.int("kv_num_heads", 0)?;
        q = heads(&q, hq, "Q")?;
        k = heads(&k, hkv, "K")?;
        v = heads(&v, hkv, "V")?;
    } else {
        n.int("q_num_heads", 0)?;
        n.int("kv_num_heads", 0)?;
        if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
            return Err(format!("needs rank-3 or rank-4 Q, K, V, got {}", q.ty()));
        }
    }
    let (qs, ks) = (cx.dims(&q)?, cx.dims(&k)?);
    let (hq, hkv, sq, skv, d) = (qs[1], ks[1], qs[2], ks[2], qs[3]);
    if hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "{hq} query heads do not group over {hkv} key heads"
        ));
    }
    if hq != hkv {
        // Each key and value head serves `hq / hkv` consecutive query heads.
        let rep = |t: &Tensor| -> Result<Tensor, String> {
            let s = cx.dims(t)?;
            Ok(t.reshape(&signed(&[s[0], s[1], 1, s[2], s[3]]))
                .expand(&[s[0], s[1], hq / hkv, s[2], s[3]])
                .reshape(&signed(&[s[0], hq, s[2], s[3]])))
        };
        k = rep(&k)?;
        v = rep(&v)?;
    }
    let dt = q.dtype();
    let scale = if n.has_attr("scale") {
        n.float("scale", 0.0)? as f64
    } else {
        1.0 / (d as f64).sqrt()
    };
    let root = scalar(cx, dt, (scale.sqrt() as f32) as f64);
    let mut scores = (&q * &root).matmul(&(&k * &root).transpose(-2, -1));
    if softcap > 0.0 {
        let cap = scalar(cx, dt, softcap as f64);
        scores = &(&scores / &cap).tanh() * &cap;
    }
    let ninf = scalar(cx, dt, f64::NEG_INFINITY);
    let zero = scalar(cx, dt, 0.0);
    // The additive bias: the mask (bool: 0 where kept, -inf elsewhere), padded to the keys.
    let mut bias: Option<Tensor> = match n.opt_t(cx, 3) {
        None => None,
        Some(mask) => {
            let ms = cx.dims(&mask)?;
            let last = *ms.last().ok_or("has a scalar mask")?;
            let additive = if mask.dtype() == DType::Bool {
                mask.where_(&zero, &ninf)
            } else {
                mask
            };
            Some(if last < skv {
                let mut pads = vec![(0u64, 0u64); ms.len()];
                pads[ms.len() - 1] = (0, skv - last);
                additive.pad(&pads, f64::NEG_INFINITY)
            } else {
                additive
            })
        }
    };
    if causal {
        let allowed = cx.g.tri_mask(&[sq, skv], false, 0);
        let c = allowed.where_(&zero, &ninf);
        bias = Some(match bias {
            Some(b) => &b + &c,
            None => c,
        });
    }
    let probs = match &bias {
        None => scores.softmax(-1),
        Some(b) => {
            let p = (&scores + b).softmax(-1);
            // A row whose every key is masked attends to nothing: zeros, not NaN.
            let masked = b.max(&[-1], true).eq(&ninf);
            masked.where_(&zero, &p)
        }
    };
    let mut y = probs.matmul(&v);
    if three_d {
        let s = cx.dims(&y)?;
        y = y
            .permute(&[0, 2, 1, 3])
            .reshape(&signed(&[s[0], s[2], s[1] * s[3]]));
    }
    one(y)
}
