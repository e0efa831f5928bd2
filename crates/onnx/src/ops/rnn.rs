//! Recurrent layers unrolled over their (fixed) sequence length: LSTM, GRU and RNN with
//! ONNX's default activations, forward, reverse or bidirectional, either layout, initial
//! states. The input products of all steps are one matmul `X·Wᵀ + Wb`; each step adds
//! `h·Rᵀ` and follows ONNX's gate order and equations:
//! - LSTM (gates i, o, f, c): `c = f·c + i·tanh(ĉ)`, `h = o·tanh(c)`;
//! - GRU (gates z, r, h): `ĥ = tanh(x·Whᵀ + (r·h)·Rhᵀ + Rbh + Wbh)`, or with
//!   `linear_before_reset` `tanh(x·Whᵀ + r·(h·Rhᵀ + Rbh) + Wbh)`; `h = (1 − z)·ĥ + z·h`;
//! - RNN: `h = tanh(x·Wᵀ + h·Rᵀ + Wb + Rb)`.

use tenet_ir::Tensor;

use super::{scalar, signed};
use crate::convert::{Cx, NodeIn, Value};

/// The longest sequence unrolled (each step adds a dozen ops).
const MAX_STEPS: u64 = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    fn gates(self) -> u64 {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Rnn => &["Tanh"],
        }
    }
}

pub(crate) fn lstm(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    recurrent(cx, n, Cell::Lstm)
}

pub(crate) fn gru(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    recurrent(cx, n, Cell::Gru)
}

pub(crate) fn rnn(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    recurrent(cx, n, Cell::Rnn)
}

fn recurrent(cx: &mut Cx, n: &NodeIn, cell: Cell) -> Result<Vec<Value>, String> {
    let hidden = n.int("hidden_size", 0)?;
    let layout = n.int("layout", 0)?;
    let direction = n.string("direction", "forward")?;
    if cell == Cell::Lstm && n.int("input_forget", 0)? != 0 {
        return Err("input_forget = 1 is not supported".into());
    }
    let linear_before_reset = cell == Cell::Gru && n.int("linear_before_reset", 0)? != 0;
    if n.has_attr("clip") {
        return Err("clip is not supported".into());
    }
    if let Some(acts) = n.attr_strings("activations")? {
        let default = cell.default_activations();
        if acts.chunks(default.len()).any(|c| c != default) {
            return Err(format!(
                "activations {acts:?} are not supported (only the defaults {default:?})"
            ));
        }
    }
    if n.has_attr("activation_alpha") || n.has_attr("activation_beta") {
        return Err("activation_alpha/beta are not supported".into());
    }
    if cell == Cell::Lstm && n.opt(7).is_some() {
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
    let c0 = if cell == Cell::Lstm {
        n.opt_t(cx, 6)
    } else {
        None
    };
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
    let g = cell.gates();
    let nd = dirs.len() as u64;
    if h == 0 || w.shape() != [nd, g * h, input] || r.shape() != [nd, g * h, h] {
        return Err(format!(
            "W {} and R {} do not fit hidden_size {h}, input {input} and {nd} direction(s)",
            w.ty(),
            r.ty(),
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
    let one = scalar(cx, dt, 1.0);
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &reverse) in dirs.iter().enumerate() {
        let d = d as u64;
        let take = |t: &Tensor, rows: u64, cols: u64| {
            t.slice(0, d, d + 1, 1).reshape(&signed(&[rows, cols]))
        };
        let wt = take(&w, g * h, input).transpose(0, 1); // [input, g·h]
        let rt = take(&r, g * h, h).transpose(0, 1); // [h, g·h]
        // Wb and Rb, each [g·h].
        let (wb, rb) = match &b {
            Some(b) => {
                let bd = b.slice(0, d, d + 1, 1).reshape(&[(2 * g * h) as i64]);
                (
                    Some(bd.slice(0, 0, g * h, 1)),
                    Some(bd.slice(0, g * h, 2 * g * h, 1)),
                )
            }
            None => (None, None),
        };
        // Every step's input product at once: [steps·batch, g·h].
        let mut xw = x.reshape(&signed(&[steps * batch, input])).matmul(&wt);
        if let Some(wb) = &wb {
            xw = &xw + wb;
        }
        let zero = scalar(cx, dt, 0.0).expand(&[batch, h]);
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
            let xt = xw.slice(0, t * batch, (t + 1) * batch, 1);
            let gate = |m: &Tensor, k: u64| m.slice(1, k * h, (k + 1) * h, 1);
            match cell {
                Cell::Lstm | Cell::Rnn => {
                    let mut gates = &xt + &ht.matmul(&rt);
                    if let Some(rb) = &rb {
                        gates = &gates + rb;
                    }
                    if cell == Cell::Rnn {
                        ht = gates.tanh();
                    } else {
                        let (i, o, f, c) = (
                            gate(&gates, 0).sigmoid(),
                            gate(&gates, 1).sigmoid(),
                            gate(&gates, 2).sigmoid(),
                            gate(&gates, 3).tanh(),
                        );
                        ct = &(&f * &ct) + &(&i * &c);
                        ht = &o * &ct.tanh();
                    }
                }
                Cell::Gru => {
                    let rbk = |k: u64| rb.as_ref().map(|rb| rb.slice(0, k * h, (k + 1) * h, 1));
                    let hr = ht.matmul(&rt); // [batch, 3h]: z, r and h parts of h·Rᵀ
                    let with = |t: Tensor, k: u64| match rbk(k) {
                        Some(b) => &t + &b,
                        None => t,
                    };
                    let z = with(&gate(&xt, 0) + &gate(&hr, 0), 0).sigmoid();
                    let rg = with(&gate(&xt, 1) + &gate(&hr, 1), 1).sigmoid();
                    let hh = if linear_before_reset {
                        &gate(&xt, 2) + &(&rg * &with(gate(&hr, 2), 2))
                    } else {
                        let rh = take(&r, g * h, h).slice(0, 2 * h, 3 * h, 1).transpose(0, 1);
                        with(&gate(&xt, 2) + &(&rg * &ht).matmul(&rh), 2)
                    }
                    .tanh();
                    ht = &(&(&one - &z) * &hh) + &(&z * &ht);
                }
            }
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
    let mut outs = vec![Value::Sym(y), Value::Sym(yh)];
    if cell == Cell::Lstm {
        outs.push(Value::Sym(yc));
    }
    Ok(outs)
}
