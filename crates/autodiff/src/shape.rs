//! Shape helpers of the backward rules: undoing a broadcast (a sum over the broadcast axes) and
//! undoing a strided slice (scattering values back to their positions among zeros), both from
//! the op set's own ops.

use tenet_ir::{DType, Tensor};

/// `g` summed down to `target` by numpy's broadcasting rules read backwards: the leading axes
/// `target` lacks, and the axes where `target` has 1 and `g` has more, are summed.
pub fn unbroadcast(g: &Tensor, target: &[u64]) -> Tensor {
    let shape = g.shape().to_vec();
    if shape == target {
        return g.clone();
    }
    let lead = shape.len() - target.len();
    let axes: Vec<i64> = (0..shape.len())
        .filter(|&i| i < lead || (target[i - lead] == 1 && shape[i] != 1))
        .map(|i| i as i64)
        .collect();
    let summed = if axes.is_empty() {
        g.clone()
    } else {
        g.sum(&axes, true)
    };
    reshape(&summed, target)
}

/// `t` reshaped to `shape` (no node when it already has it).
pub fn reshape(t: &Tensor, shape: &[u64]) -> Tensor {
    if t.shape() == shape {
        return t.clone();
    }
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    t.reshape(&dims)
}

/// Zeros of `shape`.
pub fn zeros(like: &Tensor, shape: &[u64]) -> Tensor {
    like.builder().scalar(DType::F32, 0.0).expand(shape)
}

/// The inverse of `slice(axis, start, _, step)` on an axis of length `dim`: `g`'s element `i`
/// along `axis` lands at `start + i·step`, every other position is zero.
pub fn unslice(g: &Tensor, axis: usize, start: u64, step: u64, dim: u64) -> Tensor {
    let shape = g.shape().to_vec();
    let len = shape[axis];
    if len == 0 {
        let mut full = shape;
        full[axis] = dim;
        return zeros(g, &full);
    }
    // Spread by the step: [.., len, ..] -> [.., len, 1, ..] -> pad to [.., len, step, ..]
    // -> [.., len·step, ..]; the element i then sits at i·step.
    let spread = if step == 1 {
        g.clone()
    } else {
        let mut split = shape.clone();
        split.insert(axis + 1, 1);
        let mut pads = vec![(0, 0); split.len()];
        pads[axis + 1] = (0, step - 1);
        let mut merged = shape.clone();
        merged[axis] = len * step;
        reshape(&reshape(g, &split).pad(&pads, 0.0), &merged)
    };
    // Keep what fits before the end of the axis, then pad to `dim`.
    let span = (dim - start).min(len * step);
    let kept = if span < len * step {
        spread.slice(axis as i64, 0, span, 1)
    } else {
        spread
    };
    let after = dim - start - span;
    if start == 0 && after == 0 {
        return kept;
    }
    let mut pads = vec![(0, 0); shape.len()];
    pads[axis] = (start, after);
    kept.pad(&pads, 0.0)
}
