//! Movement ops as strided copies: permute, expand, slice and gather move element bytes, so a
//! copy with the right index arithmetic gives exactly the reference's bits. The index walks an
//! odometer over the output and copies contiguous runs in one go.

use tenet_ir::{HostTensor, NodeId, Op, TensorType};
use tenet_reference::RunError;

use crate::view::Pool;

/// Row-major strides (in elements) of `shape`.
fn strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// Output element `i` (row-major over `shape`) is source element `base + Σ idx[d]·step[d]`;
/// `out` holds exactly the output's bytes.
fn strided_copy(
    src: &[u8],
    size: usize,
    base: usize,
    shape: &[u64],
    step: &[usize],
    out: &mut [u8],
) {
    if out.is_empty() {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        out.copy_from_slice(&src[base * size..(base + 1) * size]);
        return;
    }
    let inner = shape[rank - 1] as usize;
    let inner_step = step[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    let mut offset = base;
    let mut at = 0;
    loop {
        if inner_step == 1 {
            out[at..at + inner * size]
                .copy_from_slice(&src[offset * size..(offset + inner) * size]);
        } else {
            for j in 0..inner {
                let from = (offset + j * inner_step) * size;
                out[at + j * size..at + (j + 1) * size].copy_from_slice(&src[from..from + size]);
            }
        }
        at += inner * size;
        // Advance the odometer over the outer dimensions.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            offset += step[d];
            if idx[d] < shape[d] as usize {
                break;
            }
            offset -= step[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// A tensor of type `ty` whose bytes `fill` writes into a pooled buffer.
fn copied(pool: &Pool, ty: &TensorType, fill: impl FnOnce(&mut [u8])) -> HostTensor {
    let mut buf = pool.take(ty.bytes().unwrap_or(0) as usize);
    fill(&mut buf);
    tensor(ty, buf)
}

fn tensor(ty: &TensorType, data: Vec<u8>) -> HostTensor {
    HostTensor::new(ty.clone(), data).expect("movement preserves element counts")
}

/// Evaluate a movement op, or `None` if `op` is not one.
pub(crate) fn eval(
    pool: &Pool,
    id: NodeId,
    op: &Op,
    ty: &TensorType,
    x: &HostTensor,
    indices: Option<&HostTensor>,
) -> Option<Result<HostTensor, RunError>> {
    let size = x.dtype().size() as usize;
    let src_strides = strides(x.shape());
    Some(Ok(match op {
        Op::Reshape { .. } => tensor(ty, x.bytes().to_vec()),
        Op::Permute { perm, .. } => {
            let step: Vec<usize> = perm.iter().map(|&p| src_strides[p as usize]).collect();
            copied(pool, ty, |out| {
                strided_copy(x.bytes(), size, 0, &ty.shape, &step, out)
            })
        }
        Op::Expand { .. } => {
            let off = ty.rank() - x.shape().len();
            let step: Vec<usize> = (0..ty.rank())
                .map(|d| {
                    if d < off || x.shape()[d - off] == 1 {
                        0
                    } else {
                        src_strides[d - off]
                    }
                })
                .collect();
            copied(pool, ty, |out| {
                strided_copy(x.bytes(), size, 0, &ty.shape, &step, out)
            })
        }
        Op::Slice { ranges, .. } => {
            let base = ranges
                .iter()
                .zip(&src_strides)
                .map(|(r, s)| r.start as usize * s)
                .sum();
            let step: Vec<usize> = ranges
                .iter()
                .zip(&src_strides)
                .map(|(r, s)| r.step as usize * s)
                .collect();
            copied(pool, ty, |out| {
                strided_copy(x.bytes(), size, base, &ty.shape, &step, out)
            })
        }
        Op::Gather { axis, .. } => {
            let a = *axis as usize;
            let dim = x.shape()[a];
            let pre: usize = x.shape()[..a].iter().product::<u64>() as usize;
            let post: usize = x.shape()[a + 1..].iter().product::<u64>() as usize;
            let idx = indices?.to_i64_vec();
            if ty.numel() == Some(0) {
                // No element reads an index, so none can be out of range (as in the reference).
                return Some(Ok(tensor(ty, Vec::new())));
            }
            let mut out = Vec::with_capacity(ty.bytes().unwrap_or(0) as usize);
            for p in 0..pre {
                for &raw in &idx {
                    let v = if raw < 0 {
                        raw.wrapping_add(dim as i64)
                    } else {
                        raw
                    };
                    if v < 0 || v as u64 >= dim {
                        return Some(Err(RunError::IndexOutOfRange {
                            node: id,
                            index: raw,
                            size: dim,
                        }));
                    }
                    let at = (p * dim as usize + v as usize) * post * size;
                    out.extend_from_slice(&x.bytes()[at..at + post * size]);
                }
            }
            tensor(ty, out)
        }
        _ => return None,
    }))
}
