//! One backward rule per op: given a node's result `y` and the adjoint `g` of that result, the
//! adjoint contributions to each of its operands, written with the op set's own ops. The crate
//! docs list the choices made where an op has no derivative.

use tenet_ir::{
    BinaryOp, DType, NodeId, NormOp, Op, PoolKind, ReduceOp, SliceRange, Tensor, UnaryOp, Window2d,
};

use crate::shape::{reshape, unbroadcast, unslice, zeros};

/// False for ops whose result is constant with respect to their operands (or has no
/// operands): no gradient passes through them.
pub fn carries_gradient(op: &Op) -> bool {
    match op {
        Op::Input { .. }
        | Op::Weight { .. }
        | Op::Constant { .. }
        | Op::Iota { .. }
        | Op::TriMask { .. }
        | Op::Random { .. }
        | Op::Dequantize { .. } => false,
        Op::Unary { op, .. } => !matches!(
            op,
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign | UnaryOp::Not
        ),
        Op::Binary { op, .. } => !(op.is_comparison() || op.is_logical()),
        Op::Reduce { op, .. } => !matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin),
        _ => true,
    }
}

/// The contributions of `g`, the adjoint of node `y` (computed by `op`), to those operands
/// `wanted` says need one. `operand` gives an operand's tensor.
pub fn backward(
    op: &Op,
    y: &Tensor,
    g: &Tensor,
    operand: &dyn Fn(NodeId) -> Tensor,
    wanted: &dyn Fn(NodeId) -> bool,
) -> Vec<(NodeId, Tensor)> {
    let mut out = Vec::new();
    let mut give = |n: NodeId, t: Tensor| {
        if wanted(n) {
            out.push((n, t));
        }
    };
    let b = y.builder();
    let zero = || b.scalar(DType::F32, 0.0);
    match op {
        Op::Unary { op, x } => {
            if wanted(*x) {
                let xt = operand(*x);
                if let Some(gx) = unary(*op, &xt, y, g) {
                    give(*x, gx);
                }
            }
        }
        Op::Binary { op, a, b: bn } => {
            let (at, bt) = (operand(*a), operand(*bn));
            let (ga, gb) = binary(*op, &at, &bt, y, g, wanted(*a), wanted(*bn));
            if let Some(ga) = ga {
                give(*a, unbroadcast(&ga, at.shape()));
            }
            if let Some(gb) = gb {
                give(*bn, unbroadcast(&gb, bt.shape()));
            }
        }
        Op::Where { cond, a, b: bn } => {
            let c = operand(*cond);
            if wanted(*a) {
                give(*a, unbroadcast(&c.where_(g, &zero()), operand(*a).shape()));
            }
            if wanted(*bn) {
                give(
                    *bn,
                    unbroadcast(&c.where_(&zero(), g), operand(*bn).shape()),
                );
            }
        }
        Op::Cast { x } => give(*x, g.clone()),
        Op::Reduce {
            op,
            x,
            axes,
            keepdim: _,
        } => {
            let xt = operand(*x);
            let mut keep = xt.shape().to_vec();
            for &a in axes {
                keep[a as usize] = 1;
            }
            let g_keep = reshape(g, &keep);
            let gx = match op {
                ReduceOp::Sum => g_keep.expand(xt.shape()),
                ReduceOp::Mean => {
                    let n: u64 = axes.iter().map(|&a| xt.shape()[a as usize]).product();
                    (g_keep / n as f64).expand(xt.shape())
                }
                ReduceOp::Max | ReduceOp::Min => {
                    let hit = xt.eq(&reshape(y, &keep));
                    let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
                    let ties = hit.cast(DType::F32).sum(&axes, true);
                    hit.where_(&(g_keep / ties), &zero())
                }
                ReduceOp::ArgMax | ReduceOp::ArgMin => return out,
            };
            give(*x, gx);
        }
        Op::MatMul { a, b: bn } => {
            let (at, bt) = (operand(*a), operand(*bn));
            if wanted(*a) {
                let ga = g.matmul(&bt.transpose(-1, -2));
                give(*a, unbroadcast(&ga, at.shape()));
            }
            if wanted(*bn) {
                let gb = at.transpose(-1, -2).matmul(g);
                give(*bn, unbroadcast(&gb, bt.shape()));
            }
        }
        // `qmatmul_q8` rounds its activations, a step function almost everywhere: its
        // gradient is taken straight through the rounding, the dense product's (as for
        // `qmatmul`), the usual choice for quantised training.
        Op::QMatMul { a, w, format, .. } => {
            let at = operand(*a);
            let dense = operand(*w).dequantize(*format);
            give(*a, unbroadcast(&g.matmul(&dense), at.shape()));
        }
        Op::Reshape { x } => give(*x, reshape(g, operand(*x).shape())),
        Op::Permute { x, perm } => {
            let mut inverse = vec![0u32; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p as usize] = i as u32;
            }
            give(*x, g.permute(&inverse));
        }
        Op::Expand { x } => give(*x, unbroadcast(g, operand(*x).shape())),
        Op::Slice { x, ranges } => {
            let xt = operand(*x);
            give(*x, unslice_all(g, ranges, xt.shape()));
        }
        Op::Pad { x, pads, .. } => {
            let xt = operand(*x);
            let mut gx = g.clone();
            for (axis, (&(before, _), &dim)) in pads.iter().zip(xt.shape()).enumerate() {
                if gx.shape()[axis] != dim {
                    gx = gx.slice(axis as i64, before, before + dim, 1);
                }
            }
            give(*x, gx);
        }
        Op::Concat { xs, axis } => {
            let mut offset = 0;
            for &x in xs {
                let len = operand(x).shape()[*axis as usize];
                if wanted(x) {
                    give(x, g.slice(*axis as i64, offset, offset + len, 1));
                }
                offset += len;
            }
        }
        Op::Gather { x, indices, axis } => {
            if wanted(*x) {
                give(
                    *x,
                    gather_backward(&operand(*x), &operand(*indices), *axis, g),
                );
            }
        }
        Op::Normalize { op, x, axis } => {
            let axis = [*axis as i64];
            let gx = match op {
                NormOp::Softmax => y * &(g - &(g * y).sum(&axis, true)),
                NormOp::LogSoftmax => g - &(y.exp() * g.sum(&axis, true)),
            };
            give(*x, gx);
        }
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps_bits,
        } => {
            let xt = operand(*x);
            let d = &xt - &xt.mean(&[-1], true);
            let r = ((&d * &d).mean(&[-1], true) + f32::from_bits(*eps_bits) as f64).rsqrt();
            let xhat = &d * &r;
            if let Some(bt) = beta {
                give(*bt, unbroadcast(g, operand(*bt).shape()));
            }
            let gxhat = through_gamma(*gamma, &xhat, g, operand, wanted, &mut give);
            if wanted(*x) {
                let centred = &gxhat - &gxhat.mean(&[-1], true);
                let gx = r * (centred - xhat.clone() * (&gxhat * &xhat).mean(&[-1], true));
                give(*x, gx);
            }
        }
        Op::RmsNorm { x, gamma, eps_bits } => {
            let xt = operand(*x);
            let r = ((&xt * &xt).mean(&[-1], true) + f32::from_bits(*eps_bits) as f64).rsqrt();
            let y0 = &xt * &r;
            let gy0 = through_gamma(*gamma, &y0, g, operand, wanted, &mut give);
            if wanted(*x) {
                let gx = r * (&gy0 - &(&y0 * &(&gy0 * &y0).mean(&[-1], true)));
                give(*x, gx);
            }
        }
        Op::Conv2d {
            x,
            w,
            bias,
            window,
            groups,
        } => {
            let (xt, wt) = (operand(*x), operand(*w));
            if let Some(bias) = bias
                && wanted(*bias)
            {
                give(*bias, g.sum(&[0, 2, 3], false));
            }
            if wanted(*x) {
                give(*x, conv_input_grad(&xt, &wt, g, window, *groups));
            }
            if wanted(*w) {
                let [_, _, kh, kw] = dims4(&wt);
                let taps = (kh * kw).saturating_mul(xt.shape().iter().product());
                let gw = if taps <= MAX_TAP_ELEMENTS {
                    conv_weight_grad_by_taps(&xt, &wt, g, window, *groups)
                } else {
                    conv_weight_grad(&xt, &wt, g, window, *groups)
                };
                give(*w, gw);
            }
        }
        Op::Pool2d {
            kind,
            x,
            kernel,
            window,
        } => {
            let xt = operand(*x);
            give(*x, pool_grad(*kind, &xt, y, g, *kernel, window));
        }
        Op::Input { .. }
        | Op::Weight { .. }
        | Op::Constant { .. }
        | Op::Iota { .. }
        | Op::TriMask { .. }
        | Op::Random { .. }
        | Op::Dequantize { .. } => {}
    }
    out
}

/// A norm's adjoint before its scale: `g · gamma` (or `g` without one), giving `gamma` its
/// own contribution, `g · normalized` summed to its shape, on the way.
fn through_gamma(
    gamma: Option<NodeId>,
    normalized: &Tensor,
    g: &Tensor,
    operand: &dyn Fn(NodeId) -> Tensor,
    wanted: &dyn Fn(NodeId) -> bool,
    give: &mut dyn FnMut(NodeId, Tensor),
) -> Tensor {
    let Some(gm) = gamma else {
        return g.clone();
    };
    let gmt = operand(gm);
    if wanted(gm) {
        give(gm, unbroadcast(&(g * normalized), gmt.shape()));
    }
    g * &gmt
}

/// `d y / d x · g` for an elementwise op of one operand; `None` where the derivative is zero.
fn unary(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Option<Tensor> {
    use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, PI};
    let b = x.builder();
    Some(match op {
        UnaryOp::Neg => -g,
        UnaryOp::Abs => g * &x.sign(),
        UnaryOp::Exp => g * y,
        UnaryOp::Log => g / x,
        UnaryOp::Sqrt => g * &(y.reciprocal() * 0.5),
        UnaryOp::Rsqrt => g * &((y / x) * -0.5),
        UnaryOp::Reciprocal => -(g * &(y * y)),
        UnaryOp::Sin => g * &x.cos(),
        UnaryOp::Cos => -(g * &x.sin()),
        UnaryOp::Tanh => g * &(1.0 - &(y * y)),
        UnaryOp::Sigmoid => g * &(y * &(1.0 - y)),
        UnaryOp::Relu => x
            .gt(&b.scalar(DType::F32, 0.0))
            .where_(g, &b.scalar(DType::F32, 0.0)),
        UnaryOp::GeluErf => {
            let cdf = ((x * FRAC_1_SQRT_2).erf() + 1.0) * 0.5;
            let pdf = ((x * x) * -0.5).exp() * (1.0 / (2.0 * PI).sqrt());
            g * &(cdf + x * &pdf)
        }
        UnaryOp::GeluTanh => {
            let (c, a) = ((2.0 / PI).sqrt(), 0.044715);
            let t = ((x + &(((x * x) * x) * a)) * c).tanh();
            let du = ((x * x) * (3.0 * a) + 1.0) * c;
            let dy = (&t + 1.0) * 0.5 + (x * 0.5) * (1.0 - &(&t * &t)) * du;
            g * &dy
        }
        UnaryOp::Erf => g * &((-(x * x)).exp() * FRAC_2_SQRT_PI),
        UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign | UnaryOp::Not => {
            return None;
        }
    })
}

/// The contributions of a binary elementwise op to `a` and `b`, at the broadcast shape.
fn binary(
    op: BinaryOp,
    a: &Tensor,
    bt: &Tensor,
    y: &Tensor,
    g: &Tensor,
    want_a: bool,
    want_b: bool,
) -> (Option<Tensor>, Option<Tensor>) {
    let bld = a.builder();
    let zero = bld.scalar(DType::F32, 0.0);
    let pick = |more: Tensor, tie: Tensor| {
        let w = more.where_(
            &bld.scalar(DType::F32, 1.0),
            &tie.where_(&bld.scalar(DType::F32, 0.5), &zero),
        );
        g * &w
    };
    let (ga, gb) = match op {
        BinaryOp::Add => (want_a.then(|| g.clone()), want_b.then(|| g.clone())),
        BinaryOp::Sub => (want_a.then(|| g.clone()), want_b.then(|| -g)),
        BinaryOp::Mul => (want_a.then(|| g * bt), want_b.then(|| g * a)),
        BinaryOp::Div => (want_a.then(|| g / bt), want_b.then(|| -(g * &(y / bt)))),
        BinaryOp::Pow => (
            want_a.then(|| g * &(bt * &a.pow(&(bt - 1.0)))),
            want_b.then(|| a.gt(&zero).where_(&(g * &(y * &a.log())), &zero)),
        ),
        BinaryOp::Max => (
            want_a.then(|| pick(a.gt(bt), a.eq(bt))),
            want_b.then(|| pick(bt.gt(a), a.eq(bt))),
        ),
        BinaryOp::Min => (
            want_a.then(|| pick(a.lt(bt), a.eq(bt))),
            want_b.then(|| pick(bt.lt(a), a.eq(bt))),
        ),
        _ => (None, None),
    };
    // A contribution must have the broadcast shape even where the rule's factors do not.
    let full = |t: Tensor| {
        if t.shape() == y.shape() {
            t
        } else {
            t.expand(y.shape())
        }
    };
    (ga.map(full), gb.map(full))
}

/// The inverse of a slice over every axis: each kept element back at its position, zeros
/// elsewhere.
fn unslice_all(g: &Tensor, ranges: &[SliceRange], dims: &[u64]) -> Tensor {
    let mut gx = g.clone();
    for (axis, (r, &dim)) in ranges.iter().zip(dims).enumerate() {
        if !(r.start == 0 && r.step == 1 && r.end == dim) {
            gx = unslice(&gx, axis, r.start, r.step, dim);
        }
    }
    gx
}

/// `take`'s gradient: each output position's adjoint added to the input row it read, as one
/// product with a one-hot matrix (repeated indices sum; negative ones count from the end).
fn gather_backward(x: &Tensor, indices: &Tensor, axis: u32, g: &Tensor) -> Tensor {
    let axis = axis as usize;
    let shape = x.shape();
    let dim = shape[axis];
    let pre: u64 = shape[..axis].iter().product();
    let post: u64 = shape[axis + 1..].iter().product();
    let count: u64 = indices.shape().iter().product();
    if count == 0 || dim == 0 {
        return zeros(g, shape);
    }
    let b = x.builder();
    let it = indices.dtype();
    let flat = reshape(indices, &[count, 1]);
    let wrapped = flat
        .lt(&b.scalar(it, 0.0))
        .where_(&(&flat + dim as f64), &flat);
    let onehot = wrapped.eq(&b.iota(it, &[count, dim], 1)).cast(DType::F32);
    let rows = reshape(g, &[pre, count, post]);
    let gx = onehot.transpose(0, 1).matmul(&rows);
    reshape(&gx, shape)
}

/// Reverse a spatial axis of a weight (`gather` with descending indices).
fn flip(t: &Tensor, axis: usize) -> Tensor {
    let n = t.shape()[axis];
    if n <= 1 {
        return t.clone();
    }
    let idx: Vec<i64> = (0..n as i64).rev().collect();
    t.gather(&t.builder().constant_i64(&[n], &idx), axis as i64)
}

/// Bring `t` along `axis` to padding `(before, after)`, either of which may be negative (then
/// that many elements are cut instead).
fn trim(t: &Tensor, axis: usize, before: i64, after: i64) -> (Tensor, u64, u64) {
    let len = t.shape()[axis] as i64;
    let (cut_b, cut_a) = ((-before).max(0), (-after).max(0));
    let t = if cut_b > 0 || cut_a > 0 {
        t.slice(axis as i64, cut_b as u64, (len - cut_a) as u64, 1)
    } else {
        t.clone()
    };
    (t, before.max(0) as u64, after.max(0) as u64)
}

/// The adjoint of a convolution's input: the adjoint spread by the stride, correlated with the
/// flipped kernel (input and output channels swapped within each group) at the same dilation.
fn conv_input_grad(x: &Tensor, w: &Tensor, g: &Tensor, win: &Window2d, groups: u32) -> Tensor {
    let [_, c, h, wd] = dims4(x);
    let [o, cg, kh, kw] = dims4(w);
    let [_, _, ho, wo] = dims4(g);
    let groups = groups as u64;
    let og = o / groups;
    let [sh, sw] = win.stride.map(u64::from);
    let [dh, dw] = win.dilation.map(u64::from);
    let [pt, pl, _, _] = win.padding.map(i64::from);
    let spread_h = (ho - 1) * sh + 1;
    let spread_w = (wo - 1) * sw + 1;
    let gd = unslice(&unslice(g, 2, 0, sh, spread_h), 3, 0, sw, spread_w);
    let kernel = reshape(
        &reshape(w, &[groups, og, cg, kh, kw]).permute(&[0, 2, 1, 3, 4]),
        &[c, og, kh, kw],
    );
    let kernel = flip(&flip(&kernel, 2), 3);
    let before_h = ((kh - 1) * dh) as i64 - pt;
    let after_h = (h + (kh - 1) * dh) as i64 - spread_h as i64 - before_h;
    let before_w = ((kw - 1) * dw) as i64 - pl;
    let after_w = (wd + (kw - 1) * dw) as i64 - spread_w as i64 - before_w;
    let (gd, top, bottom) = trim(&gd, 2, before_h, after_h);
    let (gd, left, right) = trim(&gd, 3, before_w, after_w);
    gd.conv2d(
        &kernel,
        None,
        [1, 1],
        [top, left, bottom, right].map(|p| p as u32),
        [dh as u32, dw as u32],
        groups as u32,
    )
}

/// The adjoint of a convolution's weight: the input (channels as the batch, the batch as
/// channels) correlated with the adjoint as a kernel, the stride and dilation trading places.
fn conv_weight_grad(x: &Tensor, w: &Tensor, g: &Tensor, win: &Window2d, groups: u32) -> Tensor {
    let [n, _, h, wd] = dims4(x);
    let [_, cg, kh, kw] = dims4(w);
    let [_, _, ho, wo] = dims4(g);
    let groups = groups as u64;
    let [sh, sw] = win.stride.map(u64::from);
    let [dh, dw] = win.dilation.map(u64::from);
    let [pt, pl, _, _] = win.padding.map(u64::from);
    let inputs = reshape(
        &reshape(x, &[n, groups, cg, h, wd]).permute(&[2, 1, 0, 3, 4]),
        &[cg, groups * n, h, wd],
    );
    let kernel = g.permute(&[1, 0, 2, 3]);
    let reach = |k: u64, d: u64, o: u64, s: u64, len: u64, p: u64| {
        ((k - 1) * d + (o - 1) * s + 1).saturating_sub(len + p)
    };
    let pb = reach(kh, dh, ho, sh, h, pt);
    let pr = reach(kw, dw, wo, sw, wd, pl);
    let full = inputs.conv2d(
        &kernel,
        None,
        [dh as u32, dw as u32],
        [pt as u32, pl as u32, pb as u32, pr as u32],
        [sh as u32, sw as u32],
        groups as u32,
    );
    let mut gw = full;
    if gw.shape()[2] != kh {
        gw = gw.slice(2, 0, kh, 1);
    }
    if gw.shape()[3] != kw {
        gw = gw.slice(3, 0, kw, 1);
    }
    gw.permute(&[1, 0, 2, 3])
}

/// The most elements the taps of a convolution's input may hold together for its weight
/// gradient to be one product over them ([`conv_weight_grad_by_taps`]); beyond it, the
/// gradient is a convolution that reads the input in place.
const MAX_TAP_ELEMENTS: u64 = 1 << 26;

/// The adjoint of a convolution's weight as one batched product: the input's taps (each
/// kernel position's strided view of the padded input, `[taps, groups, C/g, N·OH·OW]`) times
/// the adjoint (`[groups, N·OH·OW, O/g]`): a long chain per weight, the shape products are
/// fast at (a convolution with the adjoint as a kernel is not: its kernel is the image's size).
fn conv_weight_grad_by_taps(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    win: &Window2d,
    groups: u32,
) -> Tensor {
    let [n, _, _, _] = dims4(x);
    let [o, cg, kh, kw] = dims4(w);
    let [_, _, ho, wo] = dims4(g);
    let groups = groups as u64;
    let og = o / groups;
    let [sh, sw] = win.stride.map(u64::from);
    let [dh, dw] = win.dilation.map(u64::from);
    let [pt, pl, pb, pr] = win.padding.map(u64::from);
    let positions = n * ho * wo;
    // Channels first, padded: every tap is then a strided slice of one tensor.
    let mut xc = x.permute(&[1, 0, 2, 3]);
    if [pt, pl, pb, pr] != [0; 4] {
        xc = xc.pad(&[(0, 0), (0, 0), (pt, pb), (pl, pr)], 0.0);
    }
    let mut taps = Vec::with_capacity((kh * kw) as usize);
    for i in 0..kh {
        for j in 0..kw {
            let tap = slice_hw(
                &xc,
                (i * dh, i * dh + (ho - 1) * sh + 1, sh),
                (j * dw, j * dw + (wo - 1) * sw + 1, sw),
            );
            taps.push(reshape(&tap, &[1, groups, cg, positions]));
        }
    }
    let refs: Vec<&Tensor> = taps.iter().collect();
    let cols = x.builder().concat(&refs, 0);
    let adj = reshape(&g.permute(&[1, 0, 2, 3]), &[groups, og, positions]).transpose(-1, -2);
    // [taps, groups, C/g, O/g] -> [groups, O/g, C/g, taps] = [O, C/g, KH, KW].
    let gw = cols.matmul(&adj).permute(&[1, 3, 2, 0]);
    reshape(&gw, &[o, cg, kh, kw])
}

/// Pooling's adjoint: for each tap of the window, the outputs' adjoints (max: where this tap
/// was the window's first maximum; average: divided by the count) put back at the positions
/// the tap read, summed over the taps, the padding cut off.
fn pool_grad(
    kind: PoolKind,
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
    kernel: [u32; 2],
    win: &Window2d,
) -> Tensor {
    let [_, _, h, wd] = dims4(x);
    let [_, _, ho, wo] = dims4(y);
    let [kh, kw] = kernel.map(u64::from);
    let [sh, sw] = win.stride.map(u64::from);
    let [dh, dw] = win.dilation.map(u64::from);
    let [pt, pl, pb, pr] = win.padding.map(u64::from);
    if [sh, sw] == [kh, kw] && [dh, dw] == [1, 1] && [pt, pl, pb, pr] == [0; 4] {
        return tiled_pool_grad(kind, x, y, g, kh, kw);
    }
    let (hp, wp) = (h + pt + pb, wd + pl + pr);
    let pads = [(0, 0), (0, 0), (pt, pb), (pl, pr)];
    let b = x.builder();
    let zero = b.scalar(DType::F32, 0.0);
    let tap = |t: &Tensor, i: u64, j: u64| {
        slice_hw(
            t,
            (i * dh, i * dh + (ho - 1) * sh + 1, sh),
            (j * dw, j * dw + (wo - 1) * sw + 1, sw),
        )
    };
    let place =
        |t: &Tensor, i: u64, j: u64| unslice(&unslice(t, 2, i * dh, sh, hp), 3, j * dw, sw, wp);
    let mut total: Option<Tensor> = None;
    let mut add = |t: Tensor| {
        total = Some(match total.take() {
            Some(acc) => acc + t,
            None => t,
        })
    };
    match kind {
        PoolKind::Max => {
            // NaN padding never equals the maximum, so only in-bounds positions are picked.
            let padded = x.pad(&pads, f64::NAN);
            let mut taken: Option<Tensor> = None;
            for i in 0..kh {
                for j in 0..kw {
                    let hit = tap(&padded, i, j).eq(y);
                    let first = match &taken {
                        Some(t) => hit.and(&t.not()),
                        None => hit.clone(),
                    };
                    taken = Some(match taken.take() {
                        Some(t) => t.or(&hit),
                        None => hit,
                    });
                    add(place(&first.where_(g, &zero), i, j));
                }
            }
        }
        PoolKind::Avg | PoolKind::AvgIncludePad => {
            let share = if kind == PoolKind::Avg {
                let inside = b
                    .scalar(DType::F32, 1.0)
                    .expand(&[1, 1, h, wd])
                    .pad(&pads, 0.0);
                let mut count: Option<Tensor> = None;
                for i in 0..kh {
                    for j in 0..kw {
                        let t = tap(&inside, i, j);
                        count = Some(match count.take() {
                            Some(c) => c + t,
                            None => t,
                        });
                    }
                }
                g / &count.expect("a window has a tap")
            } else {
                g / (kh * kw) as f64
            };
            for i in 0..kh {
                for j in 0..kw {
                    add(place(&share, i, j));
                }
            }
        }
    }
    let gx = total.expect("a window has a tap");
    gx.slice(2, pt, pt + h, 1).slice(3, pl, pl + wd, 1)
}

/// [`pool_grad`] for windows that tile the input (stride = kernel, no padding, no dilation),
/// the common case: the same choices, with each tap read as a strided view of the windows and
/// the taps' contributions laid back out by one concatenation and one permutation, instead of
/// a padded copy of the input per tap.
fn tiled_pool_grad(kind: PoolKind, x: &Tensor, y: &Tensor, g: &Tensor, kh: u64, kw: u64) -> Tensor {
    let [n, c, h, wd] = dims4(x);
    let [_, _, ho, wo] = dims4(y);
    let (hc, wc) = (ho * kh, wo * kw);
    let covered = if (hc, wc) == (h, wd) {
        x.clone()
    } else {
        x.slice(2, 0, hc, 1).slice(3, 0, wc, 1)
    };
    let laid_out = match kind {
        PoolKind::Max => {
            // Taps first: each tap is then one contiguous run of the permuted windows.
            let windows = reshape(
                &reshape(&covered, &[n, c, ho, kh, wo, kw]).permute(&[3, 5, 0, 1, 2, 4]),
                &[kh * kw, n, c, ho, wo],
            );
            let zero = x.builder().scalar(DType::F32, 0.0);
            let mut taken: Option<Tensor> = None;
            let mut pieces = Vec::new();
            for t in 0..kh * kw {
                {
                    let tap = reshape(&windows.slice(0, t, t + 1, 1), &[n, c, ho, wo]);
                    let hit = tap.eq(y);
                    let first = match &taken {
                        Some(t) => hit.and(&t.not()),
                        None => hit.clone(),
                    };
                    taken = Some(match taken.take() {
                        Some(t) => t.or(&hit),
                        None => hit,
                    });
                    pieces.push(reshape(&first.where_(g, &zero), &[1, n, c, ho, wo]));
                }
            }
            let refs: Vec<&Tensor> = pieces.iter().collect();
            let stacked = reshape(&x.builder().concat(&refs, 0), &[kh, kw, n, c, ho, wo]);
            stacked.permute(&[2, 3, 4, 0, 5, 1])
        }
        PoolKind::Avg | PoolKind::AvgIncludePad => {
            reshape(&(g / (kh * kw) as f64), &[n, c, ho, 1, wo, 1]).expand(&[n, c, ho, kh, wo, kw])
        }
    };
    let gx = reshape(&laid_out, &[n, c, hc, wc]);
    if (hc, wc) == (h, wd) {
        gx
    } else {
        gx.pad(&[(0, 0), (0, 0), (0, h - hc), (0, wd - wc)], 0.0)
    }
}

/// One strided slice over the last two axes of a rank-4 tensor (one copy, not two).
fn slice_hw(t: &Tensor, h: (u64, u64, u64), w: (u64, u64, u64)) -> Tensor {
    let s = t.shape();
    let full = |d: u64| SliceRange {
        start: 0,
        end: d,
        step: 1,
    };
    let range = |(start, end, step): (u64, u64, u64)| SliceRange { start, end, step };
    let op = Op::Slice {
        x: t.id(),
        ranges: vec![full(s[0]), full(s[1]), range(h), range(w)],
    };
    t.builder().node(op, None)
}

fn dims4(t: &Tensor) -> [u64; 4] {
    let s = t.shape();
    [s[0], s[1], s[2], s[3]]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, Window2d};

    use super::{conv_weight_grad, conv_weight_grad_by_taps};

    /// The two ways to a convolution's weight gradient (by taps below the size limit, by a
    /// convolution above it) add the same products in different orders: they agree to
    /// rounding on every geometry.
    #[test]
    fn both_weight_gradients_agree() {
        let mut seed = 0x9e37_79b9_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..60 {
            let groups = 1 + next(2);
            let (cg, og) = (1 + next(2), 1 + next(3));
            let (kh, kw) = (1 + next(3), 1 + next(3));
            let stride = [1 + next(2) as u32, 1 + next(3) as u32];
            let dilation = [1 + next(2) as u32, 1 + next(2) as u32];
            let padding = [
                next(3) as u32,
                next(2) as u32,
                next(2) as u32,
                next(3) as u32,
            ];
            let h = (kh - 1) * dilation[0] as u64 + 1 + next(4);
            let w = (kw - 1) * dilation[1] as u64 + 1 + next(4);
            let n = 1 + next(2);
            let b = GraphBuilder::new();
            let x = b.input("x", DType::F32, &[n, cg * groups, h, w]);
            let k = b.input("w", DType::F32, &[og * groups, cg, kh, kw]);
            let y = x.conv2d(&k, None, stride, padding, dilation, groups as u32);
            let g = b.input("g", DType::F32, y.shape());
            let win = Window2d {
                stride,
                padding,
                dilation,
            };
            let by_taps = conv_weight_grad_by_taps(&x, &k, &g, &win, groups as u32);
            let by_conv = conv_weight_grad(&x, &k, &g, &win, groups as u32);
            let graph = b.finish(&[("taps", &by_taps), ("conv", &by_conv)]).unwrap();
            let mut inputs = HashMap::new();
            for (_, name, ty) in graph.inputs() {
                let count = ty.numel().unwrap() as usize;
                let v: Vec<f32> = (0..count)
                    .map(|_| next(2001) as f32 / 1000.0 - 1.0)
                    .collect();
                inputs.insert(
                    name.to_string(),
                    HostTensor::from_f32(&ty.shape, &v).unwrap(),
                );
            }
            let out = tenet_reference::run(&graph, &inputs, &NoWeights, 0).unwrap();
            let (a, c) = (out[0].1.to_f32_vec(), out[1].1.to_f32_vec());
            assert_eq!(a.len(), c.len());
            for (i, (p, q)) in a.iter().zip(&c).enumerate() {
                assert!((p - q).abs() <= 1e-4 * (1.0 + q.abs()), "[{i}]: {p} vs {q}");
            }
        }
    }
}
