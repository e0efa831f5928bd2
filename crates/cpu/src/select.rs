//! Comparisons of f32 tensors and the logical ops of bool ones, as plain loops over operands
//! that are either of the result's shape or a single value (a mask against a threshold, the
//! masks a gradient builds). IEEE comparisons (NaN unordered, `-0 == +0`) and 0/1 bytes are
//! exactly the reference's results; other broadcasts go to the reference's code.

use tenet_ir::{BinaryOp, DType, HostTensor, Op, TensorType, UnaryOp};

use crate::view::{Pool, f32s, par_chunks};

/// An operand read at output position `i`: the whole tensor, or one value everywhere.
enum Side<'a, T> {
    Full(&'a [T]),
    One(T),
}

impl<T: Copy> Side<'_, T> {
    #[inline(always)]
    fn at(&self, i: usize) -> T {
        match self {
            Side::Full(v) => v[i],
            Side::One(v) => *v,
        }
    }
}

fn side<'a, T: Copy>(values: &'a [T], n: usize) -> Option<Side<'a, T>> {
    match values.len() {
        len if len == n => Some(Side::Full(values)),
        1 => Some(Side::One(values[0])),
        _ => None,
    }
}

fn compare(op: BinaryOp) -> fn(f32, f32) -> bool {
    match op {
        BinaryOp::Eq => |a, b| a == b,
        BinaryOp::Ne => |a, b| a != b,
        BinaryOp::Lt => |a, b| a < b,
        BinaryOp::Le => |a, b| a <= b,
        BinaryOp::Gt => |a, b| a > b,
        _ => |a, b| a >= b,
    }
}

fn bools(
    pool: &Pool,
    ty: &TensorType,
    threads: usize,
    f: impl Fn(usize) -> bool + Sync,
) -> HostTensor {
    let n = ty.numel().unwrap_or(0) as usize;
    let mut out = pool.take(n);
    par_chunks(&mut out, threads, 64, |range, piece| {
        for (o, i) in piece.iter_mut().zip(range) {
            *o = u8::from(f(i));
        }
    });
    HostTensor::new(ty.clone(), out).expect("sized to the type")
}

/// The op's result when it is one this module computes, `None` otherwise.
pub(crate) fn eval(
    pool: &Pool,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    threads: usize,
) -> Option<HostTensor> {
    let n = ty.numel()? as usize;
    match op {
        Op::Binary { op, .. } if op.is_comparison() => {
            let (a, b) = (operands[0], operands[1]);
            if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
                return None;
            }
            let (av, bv) = (f32s(a), f32s(b));
            let (sa, sb) = (side(&av, n)?, side(&bv, n)?);
            let cmp = compare(*op);
            Some(bools(pool, ty, threads, |i| cmp(sa.at(i), sb.at(i))))
        }
        Op::Binary { op, .. } if op.is_logical() => {
            let (sa, sb) = (side(operands[0].bytes(), n)?, side(operands[1].bytes(), n)?);
            Some(match op {
                BinaryOp::And => bools(pool, ty, threads, |i| sa.at(i) != 0 && sb.at(i) != 0),
                _ => bools(pool, ty, threads, |i| sa.at(i) != 0 || sb.at(i) != 0),
            })
        }
        Op::Unary {
            op: UnaryOp::Not, ..
        } => {
            let x = side(operands[0].bytes(), n)?;
            Some(bools(pool, ty, threads, |i| x.at(i) == 0))
        }
        _ => None,
    }
}
