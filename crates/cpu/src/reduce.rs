//! f32 sums and means on the kernels' ordered-sum loops (`tenet_kernels::reduce`), outputs
//! split across threads. Other reductions, and other dtypes, run on the reference's code.

use tenet_ir::{DType, HostTensor, Op, ReduceOp, TensorType};
use tenet_kernels::reduce::{Reduced, ordered_sums};

use crate::fused::Poll;
use crate::movement::strides;
use crate::view::{Pool, f32s, make_f32, par_chunks};

/// Reduced positions listed one by one at most (8 bytes each, per run: a bounded scratch
/// outside the certificate); beyond, the reference's code runs instead.
const MAX_LISTED_POSITIONS: usize = 1 << 14;

/// Outputs whose kept offsets are computed at a time (bounded scratch per thread).
const OUTPUT_BLOCK: usize = 4096;

/// The result of `op` if it is an f32 sum or mean, else `None`.
pub(crate) fn eval(
    pool: &Pool,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    threads: usize,
    poll: Poll<'_>,
) -> Option<HostTensor> {
    let Op::Reduce {
        op: kind @ (ReduceOp::Sum | ReduceOp::Mean),
        axes,
        ..
    } = op
    else {
        return None;
    };
    let x = *operands.first()?;
    if x.dtype() != DType::F32 || ty.dtype != DType::F32 {
        return None;
    }
    let shape = x.shape();
    let st = strides(shape);
    let is_reduced = |d: usize| axes.contains(&(d as u32));
    let (mut kept_dims, mut kept_st, mut red_dims, mut red_st) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in shape.iter().zip(&st).enumerate() {
        if is_reduced(d) {
            red_dims.push(n as usize);
            red_st.push(s);
        } else {
            kept_dims.push(n as usize);
            kept_st.push(s);
        }
    }
    let count: usize = red_dims.iter().product();
    // The reduced axes are the innermost ones: each output sums one contiguous run.
    let innermost = (0..shape.len()).all(|d| is_reduced(d) == (d >= shape.len() - axes.len()));
    let mut listed = Vec::new();
    let reduced = if innermost {
        Reduced::Contiguous(count)
    } else if count <= MAX_LISTED_POSITIONS {
        offsets(&red_dims, &red_st, 0, count, &mut listed);
        Reduced::Offsets(&listed)
    } else {
        return None;
    };
    let mean = *kind == ReduceOp::Mean;
    let xs = f32s(x);
    Some(make_f32(pool, ty, |out| {
        par_chunks(out, threads, 16, |range, chunk| {
            let mut kept = Vec::with_capacity(OUTPUT_BLOCK.min(chunk.len()));
            for (b, block) in chunk.chunks_mut(OUTPUT_BLOCK).enumerate() {
                if b > 0 && poll() {
                    return;
                }
                let first = range.start + b * OUTPUT_BLOCK;
                kept.clear();
                offsets(&kept_dims, &kept_st, first, block.len(), &mut kept);
                ordered_sums(&xs, &kept, reduced, mean, block);
            }
        })
    }))
}

/// Append to `out` the offsets (by `strides`) of positions `first..first + len` in row-major
/// order over `dims`.
fn offsets(dims: &[usize], strides: &[usize], first: usize, len: usize, out: &mut Vec<usize>) {
    let mut idx = vec![0usize; dims.len()];
    let mut rem = first;
    for d in (0..dims.len()).rev() {
        idx[d] = rem % dims[d].max(1);
        rem /= dims[d].max(1);
    }
    let mut at: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
    for _ in 0..len {
        out.push(at);
        // Advance the odometer.
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            at += strides[d];
            if idx[d] < dims[d] {
                break;
            }
            at -= idx[d] * strides[d];
            idx[d] = 0;
        }
    }
}
