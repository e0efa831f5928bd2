//! Block-quantised weights on the kernels' code (`tenet_kernels::qgemm`): `qmatmul` and
//! `qmatmul_q8` as one quantised product whose rows are all of `a`'s rows (its batch axes
//! flattened: the weight has none), and `dequantize` as runs of blocks split across threads. Both have the reference's
//! bits at every SIMD level and thread count.

use tenet_ir::{HostTensor, QDot, QuantFormat, TensorType};
use tenet_kernels::SimdLevel;
use tenet_kernels::qgemm::{self, QWeight};

use crate::fused::{POLL_ELEMENTS, Poll};
use crate::view::{Pool, f32s, make_f32, par_chunks};

/// The kernels' name for a format.
pub(crate) fn format(f: QuantFormat) -> qgemm::QuantFormat {
    match f {
        QuantFormat::Q4_0 => qgemm::QuantFormat::Q4_0,
        QuantFormat::Q4_1 => qgemm::QuantFormat::Q4_1,
        QuantFormat::Q8_0 => qgemm::QuantFormat::Q8_0,
    }
}

/// `qmatmul(a, w)` of result type `ty`: `a` f32 `[..., m, k]`, `w` u8 `[n, k/32, bb]`. `poll`
/// is asked about every 2¹⁸ multiply-adds; a stopped product is left partly written (the run
/// gives up). An error is a kernel's complaint about extents, which a valid graph never
/// causes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qmatmul(
    pool: &Pool,
    level: SimdLevel,
    threads: usize,
    ty: &TensorType,
    a: &HostTensor,
    w: &HostTensor,
    f: QuantFormat,
    dot: QDot,
    poll: Poll<'_>,
) -> Result<HostTensor, String> {
    let k = *a.shape().last().unwrap_or(&0) as usize;
    let n = *w.shape().first().unwrap_or(&0) as usize;
    let rows = a.numel().checked_div(k).unwrap_or(0);
    let av = f32s(a);
    let qw = QWeight::new(format(f), n, k, w.bytes()).map_err(|e| e.to_string())?;
    let product = match dot {
        QDot::F32 => qgemm::qgemm_polled,
        QDot::Q8 => qgemm::q8::qgemm_q8_polled,
    };
    let mut result = Ok(());
    let t = make_f32(pool, ty, |out| {
        result = product(level, threads, rows, &av, k, qw, out, n, poll)
            .map(|_| ())
            .map_err(|e| e.to_string());
    });
    result.map(|()| t)
}

/// Sibling quantised products of one `a` and one definition `dot` (`products`: each result
/// type, weight and format) computed together (`qgemm_siblings`, `qgemm_q8_siblings`), each
/// result the bits of its product alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qmatmul_siblings(
    pool: &Pool,
    level: SimdLevel,
    threads: usize,
    a: &HostTensor,
    products: &[(&TensorType, &HostTensor, QuantFormat)],
    dot: QDot,
    poll: Poll<'_>,
) -> Result<Vec<HostTensor>, String> {
    let k = *a.shape().last().unwrap_or(&0) as usize;
    let rows = a.numel().checked_div(k).unwrap_or(0);
    let av = f32s(a);
    let mut bufs: Vec<Vec<u8>> = products
        .iter()
        .map(|(ty, _, _)| pool.take(ty.numel().unwrap_or(0) as usize * 4))
        .collect();
    let outs: Option<Vec<&mut [f32]>> = bufs
        .iter_mut()
        .map(|b| bytemuck::try_cast_slice_mut::<u8, f32>(b).ok())
        .collect();
    let Some(outs) = outs else {
        // A buffer not aligned for f32 (the allocator's choice): each product on its own.
        return products
            .iter()
            .map(|&(ty, w, f)| qmatmul(pool, level, threads, ty, a, w, f, dot, poll))
            .collect();
    };
    let mut kernel_products = Vec::with_capacity(products.len());
    for ((_, w, f), c) in products.iter().zip(outs) {
        let n = *w.shape().first().unwrap_or(&0) as usize;
        let qw = QWeight::new(format(*f), n, k, w.bytes()).map_err(|e| e.to_string())?;
        kernel_products.push((qw, c, n));
    }
    let siblings = match dot {
        QDot::F32 => qgemm::qgemm_siblings,
        QDot::Q8 => qgemm::q8::qgemm_q8_siblings,
    };
    siblings(level, threads, rows, &av, k, &mut kernel_products, poll)
        .map_err(|e| e.to_string())?;
    products
        .iter()
        .zip(bufs)
        .map(|((ty, _, _), b)| HostTensor::new((*ty).clone(), b).map_err(|e| e.to_string()))
        .collect()
}

/// `dequantize(x)` of result type `ty`: every block of `x`'s bytes, in order, 32 values each.
/// `poll` is asked between runs of 2¹⁸ values.
pub(crate) fn dequantize(
    pool: &Pool,
    level: SimdLevel,
    threads: usize,
    ty: &TensorType,
    x: &HostTensor,
    f: QuantFormat,
    poll: Poll<'_>,
) -> Result<HostTensor, String> {
    let f = format(f);
    let bb = f.block_bytes();
    let bytes = x.bytes();
    let failed = std::sync::Mutex::new(None);
    let t = make_f32(pool, ty, |out| {
        par_chunks(out, threads, qgemm::BLOCK, |range, chunk| {
            for (i, piece) in chunk.chunks_mut(POLL_ELEMENTS).enumerate() {
                if i > 0 && poll() {
                    return;
                }
                let first = (range.start + i * POLL_ELEMENTS) / qgemm::BLOCK;
                let blocks = &bytes[first * bb..(first + piece.len() / qgemm::BLOCK) * bb];
                if let Err(e) = qgemm::dequantize(level, f, blocks, piece) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    return;
                }
            }
        })
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(message) => Err(message),
        None => Ok(t),
    }
}
