//! Reductions: the axes from an attribute (before opset 13 for ReduceSum, 18 for the others)
//! or from a known input, ONNX's "no axes means all of them" and `noop_with_empty_axes`, and the
//! composite reductions (SumSquare, L1, L2, LogSum, LogSumExp) on tenet's sum and max.

use tenet_ir::Tensor;

use super::{axis, one};
use crate::convert::{Cx, NodeIn, Value};

pub(crate) fn reduce(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let keep = n.int("keepdims", 1)? != 0;
    let noop = n.int("noop_with_empty_axes", 0)? != 0;
    let from_input = if n.op_type() == "ReduceSum" {
        n.opset >= 13
    } else {
        n.opset >= 18
    };
    let given = if from_input {
        n.known_ints(1, "axes")?
    } else {
        n.ints("axes")?
    };
    let rank = x.rank();
    let mut axes: Vec<usize> = match given {
        Some(a) if !a.is_empty() => a.iter().map(|&v| axis(v, rank)).collect::<Result<_, _>>()?,
        _ if noop => return Ok(vec![n.get(0)?.clone()]),
        _ => (0..rank).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
    let sum = |t: &Tensor| {
        if axes.is_empty() {
            t.clone()
        } else {
            t.sum(&axes, keep)
        }
    };
    let y = match n.op_type() {
        "ReduceSum" => sum(&x),
        "ReduceMean" if axes.is_empty() => x.clone(),
        "ReduceMean" => x.mean(&axes, keep),
        "ReduceMax" if axes.is_empty() => x.clone(),
        "ReduceMax" => x.max(&axes, keep),
        "ReduceMin" if axes.is_empty() => x.clone(),
        "ReduceMin" => x.min(&axes, keep),
        "ReduceSumSquare" => sum(&(&x * &x)),
        "ReduceL1" => sum(&x.abs()),
        "ReduceL2" => sum(&(&x * &x)).sqrt(),
        "ReduceLogSum" => sum(&x).log(),
        "ReduceLogSumExp" => {
            if axes.is_empty() {
                x.clone()
            } else {
                // log Σ exp(x − m) + m with m the maximum, so large inputs do not overflow.
                let m = x.max(&axes, true);
                let s = (&x - &m).exp().sum(&axes, true).log() + m;
                if keep {
                    s
                } else {
                    let dims: Vec<i64> = x
                        .shape()
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !axes.contains(&(*i as i64)))
                        .map(|(_, &d)| d as i64)
                        .collect();
                    s.reshape(&dims)
                }
            }
        }
        other => unreachable!("{other} is not a reduction"),
    };
    one(y)
}

pub(crate) fn arg(cx: &mut Cx, n: &NodeIn) -> Result<Vec<Value>, String> {
    let x = n.t(cx, 0)?;
    let a = axis(n.int("axis", 0)?, x.rank())? as i64;
    let keep = n.int("keepdims", 1)? != 0;
    let last = n.int("select_last_index", 0)? != 0;
    let dim = x.shape()[a as usize];
    // The last extreme is the first one of the reversed axis, counted from the end.
    let src = if last {
        let rev: Vec<i64> = (0..dim as i64).rev().collect();
        x.gather(&super::index_tensor(cx, &[dim], &rev), a)
    } else {
        x.clone()
    };
    let y = if n.op_type() == "ArgMax" {
        src.argmax(&[a], keep)
    } else {
        src.argmin(&[a], keep)
    };
    one(if last {
        &cx.g.scalar(tenet_ir::DType::I64, dim as f64 - 1.0) - &y
    } else {
        y
    })
}
