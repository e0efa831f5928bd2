//! f32 pooling with the reference's bits, without its per-output lists: each output plane (one
//! image's channel) on a thread, each output's in-bounds taps visited in the reference's order
//! (kernel rows, then columns). Max is the reference's `fmax` over them (NaN if any is, +0 over
//! −0; no tap in bounds: NaN); average adds them one by one from +0 and divides by their count
//! (`avg_pool2d`) or by the kernel's area (`avg_pool2d_include_pad`). NaN results canonical.

use tenet_ir::{DType, HostTensor, Op, PoolKind, TensorType, Window2d};
use tenet_reference::fmax;
use tenet_reference::math::{NAN, canonical};

use crate::fused::Poll;
use crate::view::{Pool, f32s, make_f32};

/// For each output index along one axis, the input indices of its in-bounds taps, in order.
fn taps(
    outputs: usize,
    kernel: u32,
    stride: u32,
    pad: u32,
    dilation: u32,
    size: usize,
) -> Vec<Vec<usize>> {
    (0..outputs)
        .map(|o| {
            (0..kernel as usize)
                .filter_map(|k| {
                    let p =
                        (o * stride as usize + k * dilation as usize).checked_sub(pad as usize)?;
                    (p < size).then_some(p)
                })
                .collect()
        })
        .collect()
}

/// Run an f32 `pool2d`; `None` leaves other dtypes to the reference's code.
pub(crate) fn eval(
    pool: &Pool,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
    threads: usize,
    poll: Poll<'_>,
) -> Option<HostTensor> {
    let Op::Pool2d {
        kind,
        kernel,
        window,
        ..
    } = op
    else {
        return None;
    };
    let x = operands.first()?;
    if x.dtype() != DType::F32 || ty.dtype != DType::F32 {
        return None;
    }
    let (h, w) = (x.shape()[2] as usize, x.shape()[3] as usize);
    let (oh, ow) = (ty.shape[2] as usize, ty.shape[3] as usize);
    let Window2d {
        stride,
        padding,
        dilation,
    } = *window;
    let rows = taps(oh, kernel[0], stride[0], padding[0], dilation[0], h);
    let cols = taps(ow, kernel[1], stride[1], padding[1], dilation[1], w);
    let area = (kernel[0] * kernel[1]) as f32;
    let xv = f32s(x);
    let plane_in = h * w;
    let plane_out = oh * ow;
    Some(make_f32(pool, ty, |out| {
        if plane_out == 0 {
            return;
        }
        let planes = out.len() / plane_out;
        let ranges = tenet_sys::parallel::ranges(out.len(), threads.min(planes).max(1), plane_out);
        tenet_sys::parallel::for_each_piece(out, &ranges, |range, piece| {
            for (i, dst) in piece.chunks_mut(plane_out).enumerate() {
                if i % 64 == 63 && poll() {
                    return;
                }
                let plane = range.start / plane_out + i;
                let src = &xv[plane * plane_in..][..plane_in];
                for (r, row_taps) in rows.iter().enumerate() {
                    for (c, col_taps) in cols.iter().enumerate() {
                        let v = match kind {
                            PoolKind::Max => {
                                let mut acc: Option<f32> = None;
                                for &ih in row_taps {
                                    for &iw in col_taps {
                                        let v = src[ih * w + iw];
                                        acc = Some(acc.map_or(v, |a| fmax(a, v)));
                                    }
                                }
                                acc.unwrap_or(NAN)
                            }
                            _ => {
                                let mut sum = 0.0f32;
                                for &ih in row_taps {
                                    for &iw in col_taps {
                                        sum += src[ih * w + iw];
                                    }
                                }
                                let count = if *kind == PoolKind::Avg {
                                    (row_taps.len() * col_taps.len()) as f32
                                } else {
                                    area
                                };
                                sum / count
                            }
                        };
                        dst[r * ow + c] = canonical(v);
                    }
                }
            }
        });
    }))
}
