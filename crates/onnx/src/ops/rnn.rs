//! Recurrent layers unrolled over their (fixed) sequence length: LSTM with ONNX's default
//! activations, forward, reverse or bidirectional, either layout. Each step is the gate
//! product `x_t·Wᵀ + h·Rᵀ + (Wb + Rb)` split into ONNX's gate order i, o, f, c, then
//! `c = f·c + i·tanh(ĉ)` and `h = o·tanh(c)`; the input products of all steps are one matmul.

use tenet_ir::Tensor;

use super::signed;
use crate::convert::{Cx, NodeIn, Value};

/// The longest sequence unrolled (each step adds a dozen ops).
const MAX_STEPS: u64 = 4096;

pub(crate) fn lstm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let hidden = n.int("hidden_size", 0)?;
    let layout = n.int("layout", 0)?;
    let direction = n.string("direction", "forward")?;
    if n.int("input_forget", 0)? != 0 {
        return Err("input_forget = 1 is not supported".into());
    }
    if n.has_attr("clip") {
        return Err("clip is not supported".into());
    }
    if let Some(acts) = n.attr_strings("activations")? {
        let default = ["Sigmoid", "Tanh", "Tanh"];
        if acts.chunks(3).any(|c| c != default) {
            return Err(format!(
                "activations {acts:?} are not supported (only Sigmoid, Tanh, Tanh)"
            ));
        }
    }
    if n.has_attr("activation_alpha") || n.has_attr("activation_beta") {
        return Err("activation_alpha/beta are not supported".into());
    }
    if n.opt(7).is_some() {
        return Err("peephole weights (input P) are not supported".into());
    }
    let dirs: Vec<bool> = match direction.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(format!("direction = {other:?} is not supported")),
    };
    let mut x = n.t(cx, 0)?;
    let w = n.t(cx, 1)?;
    let r = n.t(cx, 2)?;
    let b = n.opt_t(cx, 3);
    let h0 = n.opt_t(cx, 5);
    let c0 = n.opt_t(cx, 6);
    if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
        return Err(format!(
            "needs rank-3 X, W and R, got {}, {}, {}",
            x.ty(),
            w.ty(),
            r.ty()
        ));
    }
    if layout == 1 {
        x = x.permute(&[1, 0, 2]);
    } else if layout != 0 {
        return Err(format!("layout = {layout} is not supported"));
    }
    let xs = cx.dims(&x)?;
    let (steps, batch, input) = (xs[0], xs[1], xs[2]);
    let h = u64::try_from(hidden).map_err(|_| format!("hidden_size {hidden} is invalid"))?;
    if h == 0
        || w.shape() != [dirs.len() as u64, 4 * h, input]
        || r.shape() != [dirs.len() as u64, 4 * h, h]
    {
        return Err(format!(
            "W {} and R {} do not fit hidden_size {h}, input {input} and {} direction(s)",
            w.ty(),
            r.ty(),
            dirs.len()
        ));
    }
    if steps == 0 || steps > MAX_STEPS {
        return Err(format!(
            "a sequence of {steps} steps (tenet unrolls 1 to {MAX_STEPS})"
        ));
    }
    if let Some(lens) = n.known_ints(4, "sequence_lens")?
        && lens.iter().any(|&l| l != steps as i64)
    {
        return Err(format!(
            "sequence_lens {lens:?} differ from the sequence's {steps} steps"
        ));
    }
    let dt = x.dtype();
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &reverse) in dirs.iter().enumerate() {
        let d = d as u64;
        let take = |t: &Tensor, rows: u64, cols: u64| {
            t.slice(0, d, d + 1, 1).reshape(&signed(&[rows, cols]))
        };
        let wt = take(&w, 4 * h, input).transpose(0, 1); // [input, 4h]
        let rt = take(&r, 4 * h, h).transpose(0, 1); // [h, 4h]
        let bias = b.as_ref().map(|b| {
            let bd = b.slice(0, d, d + 1, 1).reshape(&[(8 * h) as i64]);
            &bd.slice(0, 0, 4 * h, 1) + &bd.slice(0, 4 * h, 8 * h, 1)
        });
        // Every step's input product at once: [steps·batch, 4h].
        let mut xw = x.reshape(&signed(&[steps * batch, input])).matmul(&wt);
        if let Some(bias) = &bias {
            xw = &xw + bias;
        }
        let zero = cx.g.scalar(dt, 0.0).expand(&[batch, h]);
        let init = |t: &Option<Tensor>| match t {
            Some(t) => t.slice(0, d, d + 1, 1).reshape(&signed(&[batch, h])),
            None => zero.clone(),
        };
        let (mut ht, mut ct) = (init(&h0), init(&c0));
        let mut outs: Vec<Option<Tensor>> = vec![None; steps as usize];
        let order: Vec<u64> = if reverse {
            (0..steps).rev().collect()
        } else {
            (0..steps).collect()
        };
        for t in order {
            let gates = &xw.slice(0, t * batch, (t + 1) * batch, 1) + &ht.matmul(&rt);
            let gate = |k: u64| gates.slice(1, k * h, (k + 1) * h, 1);
            let (i, o, f, c) = (
                gate(0).sigmoid(),
                gate(1).sigmoid(),
                gate(2).sigmoid(),
                gate(3).tanh(),
            );
            ct = &(&f * &ct) + &(&i * &c);
            ht = &o * &ct.tanh();
            outs[t as usize] = Some(ht.reshape(&signed(&[1, 1, batch, h])));
        }
        let steps_out: Vec<Tensor> = outs
            .into_iter()
            .map(|t| t.expect("every step ran"))
            .collect();
        let refs: Vec<&Tensor> = steps_out.iter().collect();
        ys.push(if refs.len() == 1 {
            refs[0].clone()
        } else {
            cx.g.concat(&refs, 0)
        });
        hs.push(ht.reshape(&signed(&[1, batch, h])));
        cs.push(ct.reshape(&signed(&[1, batch, h])));
    }
    let cat = |cx: &Cx, v: &[Tensor], axis: i64| {
        if v.len() == 1 {
            v[0].clone()
        } else {
            cx.g.concat(&v.iter().collect::<Vec<_>>(), axis)
        }
    };
    let (mut y, mut yh, mut yc) = (cat(cx, &ys, 1), cat(cx, &hs, 0), cat(cx, &cs, 0));
    if layout == 1 {
        y = y.permute(&[2, 0, 1, 3]);
        yh = yh.permute(&[1, 0, 2]);
        yc = yc.permute(&[1, 0, 2]);
    }
    Ok(vec![Value::Sym(y), Value::Sym(yh), Value::Sym(yc)])
}
