//! Losses and the accuracy count, as graph pieces.

use tenet_ir::{DType, Tensor};

/// Softmax cross-entropy of `logits: f32[B, C]` against `labels: i64[B]`, summed over the rows
/// and multiplied by `scale` (`1 / global batch` makes a shard's term of the batch mean).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor, scale: f64) -> Tensor {
    let [rows, classes] = [logits.shape()[0], logits.shape()[1]];
    let b = logits.builder();
    let onehot = labels
        .reshape(&[rows as i64, 1])
        .eq(&b.iota(DType::I64, &[rows, classes], 1))
        .cast(DType::F32);
    let picked = (logits.log_softmax(-1) * onehot).sum(&[0, 1], false);
    picked * -scale
}

/// Mean squared error of two tensors of one shape, over every element.
pub fn mse(prediction: &Tensor, target: &Tensor) -> Tensor {
    let d = prediction - target;
    let axes: Vec<i64> = (0..d.rank() as i64).collect();
    (&d * &d).mean(&axes, false)
}

/// How many rows of `logits` have their largest logit (the first, on ties) at the label, as
/// an f32 scalar.
pub fn correct(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits
        .argmax(&[1], false)
        .eq(labels)
        .cast(DType::F32)
        .sum(&[0], false)
}
