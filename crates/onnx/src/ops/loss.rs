//! The training losses ONNX names, on gathers and sums: NegativeLogLikelihoodLoss and
//! SoftmaxCrossEntropyLoss (a log_softmax, then the same), with class weights, an ignored
//! index and the three reductions.

use tenet_ir::{DType, Tensor};

use super::shape::gather_elements_of;
use crate::convert::{Cx, NodeIn, Value};

/// `−input[n, target[n, …], …] · weight[target]`, reduced.
fn nll(
    cx: &Cx,
    n: &NodeIn,
    input: &Tensor,
    target: &Tensor,
    weight: Option<Tensor>,
) -> Result<Tensor, String> {
    if input.rank() < 2 || target.rank() + 1 != input.rank() {
        return Err(format!(
            "input {} and target {} do not fit [N, C, …] and [N, …]",
            input.ty(),
            target.ty()
        ));
    }
    let reduction = n.string("reduction", "mean")?;
    let ignore = n
        .has_attr("ignore_index")
        .then(|| n.int("ignore_index", 0))
        .transpose()?;
    let t = target.cast(DType::I64);
    let zero_i = cx.g.scalar(DType::I64, 0.0);
    let ignored = ignore.map(|ii| t.eq(&cx.g.scalar(DType::I64, ii as f64)));
    let safe = match &ignored {
        Some(m) => m.where_(&zero_i, &t),
        None => t.clone(),
    };
    let mut dims = super::signed(&cx.dims(&safe)?);
    dims.insert(1, 1);
    let picked = gather_elements_of(cx, input, &safe.reshape(&dims), 1)
        .reshape(&super::signed(safe.shape()));
    let zero = cx.g.scalar(input.dtype(), 0.0);
    let w = match (weight, &ignored) {
        (Some(w), ig) => {
            let w = w.gather(&safe, 0);
            Some(match ig {
                Some(m) => m.where_(&zero, &w),
                None => w,
            })
        }
        (None, Some(m)) => {
            let one = cx.g.scalar(input.dtype(), 1.0);
            Some(m.where_(&zero, &one))
        }
        (None, None) => None,
    };
    let loss = match &w {
        Some(w) => -(&picked * w),
        None => -picked,
    };
    let all: Vec<i64> = (0..loss.rank() as i64).collect();
    Ok(match reduction.as_str() {
        "none" => loss,
        "sum" => loss.sum(&all, false),
        "mean" => match &w {
            Some(w) => &loss.sum(&all, false) / &w.sum(&all, false),
            None => loss.mean(&all, false),
        },
        other => return Err(format!("reduction = {other:?} is not supported")),
    })
}

pub(crate) fn nll_loss(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let input = n.t(cx, 0)?;
    let target = n.t(cx, 1)?;
    let weight = n.opt_t(cx, 2);
    Ok(vec![Value::Sym(nll(cx, n, &input, &target, weight)?)])
}

pub(crate) fn softmax_cross_entropy(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let scores = n.t(cx, 0)?;
    let labels = n.t(cx, 1)?;
    let weight = n.opt_t(cx, 2);
    let log_prob = scores.log_softmax(1);
    let loss = nll(cx, n, &log_prob, &labels, weight)?;
    Ok(vec![Value::Sym(loss), Value::Sym(log_prob)])
}
