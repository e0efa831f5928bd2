//! Normalisations the row kernels do not take: softmax and log-softmax over any axis of any
//! float dtype, and layer/RMS norms of f16 and bf16 rows.
//!
//! Each row is read in place through its stride and decoded as it is read, in passes (the
//! maximum, the sum, the result), and each result is rounded straight into the output: no
//! permuted copy, no f32 copy of the input or of the result (the reference decodes both
//! whole, which took a softmax over a non-last axis to 2–2.6× its certificate). The passes
//! repeat the reference's operations in its order (`softmax_row`, `layer_norm_row`,
//! `rms_norm_row`: the same maximum, the same ordered sums, an exponential recomputed rather
//! than kept, which gives the same bits), so the results are the reference's.

use std::borrow::Cow;

use half::{bf16, f16};
use tenet_ir::{DType, HostTensor, NormOp, Op, TensorType};
use tenet_reference::math::{self, canonical};
use tenet_reference::{fmax, sum_ordered};

use crate::fused::{POLL_ELEMENTS, Poll};
use crate::view::{Pool, f32s};

/// Elements of a float tensor, decoded one at a time.
enum Floats<'a> {
    F32(Cow<'a, [f32]>),
    F16(&'a [u8]),
    BF16(&'a [u8]),
}

impl Floats<'_> {
    fn of(t: &HostTensor) -> Floats<'_> {
        match t.dtype() {
            DType::F16 => Floats::F16(t.bytes()),
            DType::BF16 => Floats::BF16(t.bytes()),
            _ => Floats::F32(f32s(t)),
        }
    }

    fn get(&self, i: usize) -> f32 {
        match self {
            Floats::F32(v) => v[i],
            Floats::F16(b) => f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            Floats::BF16(b) => bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
        }
    }
}

/// Store `v` as element `i` of `out` (bytes of `dtype`), rounding once as the reference does:
/// NaN made canonical first.
fn put(dtype: DType, out: &mut [u8], i: usize, v: f32) {
    let v = canonical(v);
    match dtype {
        DType::F16 => out[2 * i..2 * i + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        DType::BF16 => out[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
    }
}

/// The result of `op` if this module computes it (a normalisation the planner did not give to
/// the row kernels), else `None`.
pub(crate) fn eval(
    pool: &Pool,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    threads: usize,
    poll: Poll<'_>,
) -> Option<HostTensor> {
    let x = Floats::of(operands.first()?);
    let shape: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
    let size = ty.dtype.size() as usize;
    let (axis, row): (usize, Row<'_>) = match op {
        Op::Normalize { op, axis, .. } => (*axis as usize, Row::Softmax(*op)),
        Op::LayerNorm {
            gamma,
            beta,
            eps_bits,
            ..
        } if ty.dtype != DType::F32 => {
            let param = |o: &Option<tenet_ir::NodeId>, k: usize| o.map(|_| Floats::of(operands[k]));
            let gamma_at = 1;
            let beta_at = 1 + gamma.is_some() as usize;
            (
                shape.len().saturating_sub(1),
                Row::Layer {
                    gamma: param(gamma, gamma_at),
                    beta: param(beta, beta_at),
                    eps: f32::from_bits(*eps_bits),
                },
            )
        }
        Op::RmsNorm {
            gamma, eps_bits, ..
        } if ty.dtype != DType::F32 => (
            shape.len().saturating_sub(1),
            Row::Rms {
                gamma: gamma.map(|_| Floats::of(operands[1])),
                eps: f32::from_bits(*eps_bits),
            },
        ),
        _ => return None,
    };
    let n = shape.get(axis).copied().unwrap_or(1);
    let inner: usize = shape.get(axis + 1..).map_or(1, |s| s.iter().product());
    let numel: usize = shape.iter().product();
    let mut bytes = pool.take(numel * size);
    if n > 0 && inner > 0 {
        // Whole blocks of `n × inner` elements (every row of one outer index) per piece.
        let block = n * inner * size;
        let parallel = if numel >= tenet_sys::parallel::MIN_PARALLEL_ELEMS {
            threads
        } else {
            1
        };
        let pieces = tenet_sys::parallel::ranges(bytes.len(), parallel, block);
        tenet_sys::parallel::for_each_piece(&mut bytes, &pieces, |range, out| {
            let first = range.start / size;
            let mut since_poll = 0;
            for o in 0..out.len() / block {
                for c in 0..inner {
                    // Row `c` of outer block `o`: elements `base + j·inner` of the tensor.
                    let base = o * n * inner + c;
                    let at = |j: usize| first + base + j * inner;
                    row.run(&x, n, &at, &mut |j, v| {
                        put(ty.dtype, out, base + j * inner, v)
                    });
                    since_poll += 3 * n; // three passes over the row
                    if since_poll >= POLL_ELEMENTS {
                        since_poll = 0;
                        if poll() {
                            return;
                        }
                    }
                }
            }
        });
    }
    Some(HostTensor::new(ty.clone(), bytes).expect("sized to the type"))
}

/// One row's computation, by op.
enum Row<'a> {
    Softmax(NormOp),
    Layer {
        gamma: Option<Floats<'a>>,
        beta: Option<Floats<'a>>,
        eps: f32,
    },
    Rms {
        gamma: Option<Floats<'a>>,
        eps: f32,
    },
}

impl Row<'_> {
    /// Compute the `n` results of the row whose element `j` is `x[at(j)]`, handing each to
    /// `put(j, value)`.
    fn run(
        &self,
        x: &Floats<'_>,
        n: usize,
        at: &dyn Fn(usize) -> usize,
        put: &mut dyn FnMut(usize, f32),
    ) {
        let v = |j: usize| x.get(at(j));
        match self {
            Row::Softmax(op) => {
                // tenet_reference::softmax_row, pass by pass.
                let Some(m) = (0..n).map(v).reduce(fmax) else {
                    return;
                };
                let s = sum_ordered((0..n).map(|j| math::exp(v(j) - m)));
                match op {
                    NormOp::Softmax => (0..n).for_each(|j| put(j, math::exp(v(j) - m) / s)),
                    NormOp::LogSoftmax => {
                        let ls = math::log(s);
                        (0..n).for_each(|j| put(j, (v(j) - m) - ls));
                    }
                }
            }
            Row::Layer { gamma, beta, eps } => {
                // tenet_reference::layer_norm_row.
                let len = n as f32;
                let mean = sum_ordered((0..n).map(v)) / len;
                let var = sum_ordered((0..n).map(|j| (v(j) - mean) * (v(j) - mean))) / len;
                let r = 1.0 / (var + eps).sqrt();
                for j in 0..n {
                    let mut y = (v(j) - mean) * r;
                    if let Some(g) = gamma {
                        y *= g.get(j);
                    }
                    if let Some(b) = beta {
                        y += b.get(j);
                    }
                    put(j, y);
                }
            }
            Row::Rms { gamma, eps } => {
                // tenet_reference::rms_norm_row.
                let ms = sum_ordered((0..n).map(|j| v(j) * v(j))) / n as f32;
                let r = 1.0 / (ms + eps).sqrt();
                for j in 0..n {
                    put(
                        j,
                        match gamma {
                            Some(g) => (v(j) * r) * g.get(j),
                            None => v(j) * r,
                        },
                    );
                }
            }
        }
    }
}
