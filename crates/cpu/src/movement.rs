//! Movement ops as strided copies: permute, expand, slice, gather, concat, pad and where move
//! element bytes, so a copy with the right index arithmetic gives exactly the reference's bits.
//! The index walks an odometer over the output and copies contiguous runs in one go.

use tenet_ir::{HostTensor, NodeId, Op, TensorType};
use tenet_reference::RunError;

use crate::view::Pool;

/// Row-major strides (in elements) of `shape`.
pub(crate) fn strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

/// The strides of `permute(x, perm)` read in place: axis `d` steps like axis `perm[d]` of a
/// row-major `x` of shape `source`.
pub(crate) fn permuted_strides(source: &[u64], perm: &[u32]) -> Vec<usize> {
    let own = strides(source);
    perm.iter().map(|&p| own[p as usize]).collect()
}

/// Below this many output bytes a copy runs on one thread: handing out work costs more.
const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// [`strided_copy`] with the output split along its first axis across up to `threads`
/// threads (a large copy is bound by one core's memory bandwidth, not the machine's).
fn strided_copy_par(
    threads: usize,
    src: &[u8],
    size: usize,
    base: usize,
    shape: &[u64],
    step: &[usize],
    out: &mut [u8],
) {
    // Leading axes of extent 1 (a batch of one) do not split: the first longer one does.
    let ones = shape
        .iter()
        .take_while(|&&d| d == 1)
        .count()
        .min(shape.len().saturating_sub(1));
    let (shape, step) = (&shape[ones..], &step[ones..]);
    let lead = shape.first().map_or(0, |&d| d as usize);
    if threads < 2 || lead < 2 || out.len() < PARALLEL_COPY_BYTES {
        return strided_copy(src, size, base, shape, step, out);
    }
    let per = out.len() / lead;
    let pieces: Vec<std::ops::Range<usize>> = tenet_sys::parallel::ranges(lead, threads, 1)
        .into_iter()
        .map(|r| r.start * per..r.end * per)
        .collect();
    tenet_sys::parallel::for_each_piece(out, &pieces, |bytes, piece| {
        let (first, count) = (bytes.start / per, bytes.len() / per);
        let mut sub = shape.to_vec();
        sub[0] = count as u64;
        strided_copy(src, size, base + first * step[0], &sub, step, piece);
    });
}

/// Below this many output bytes a concatenation runs on one thread. Lower than a strided
/// copy's threshold: a batched decode step stacks its members' caches (a few hundred KB a
/// layer, read from memory) and nothing else runs meanwhile.
const PARALLEL_CONCAT_BYTES: usize = 128 << 10;

/// `out` = `runs` one after another (their lengths sum to `out.len()`), cut into equal byte
/// ranges across up to `threads` threads.
fn concat_runs(threads: usize, runs: &[&[u8]], out: &mut [u8]) {
    if threads < 2 || out.len() < PARALLEL_CONCAT_BYTES {
        let mut at = 0;
        for run in runs {
            out[at..at + run.len()].copy_from_slice(run);
            at += run.len();
        }
        return;
    }
    // Each piece a multiple of 64 bytes, so no two threads write one cache line.
    let pieces = tenet_sys::parallel::ranges(out.len(), threads, 64);
    tenet_sys::parallel::for_each_piece(out, &pieces, |bytes, piece| {
        let mut at = 0;
        for run in runs {
            let (start, end) = (at.max(bytes.start), (at + run.len()).min(bytes.end));
            if start < end {
                piece[start - bytes.start..end - bytes.start]
                    .copy_from_slice(&run[start - at..end - at]);
            }
            at += run.len();
            if at >= bytes.end {
                break;
            }
        }
    });
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
    // A short, strided innermost axis (an interleave, a ×2 upsampling) walks the last two axes
    // as one block, so the odometer turns once per block instead of every few elements.
    if inner_step != 1 && inner <= 8 && rank >= 2 && matches!(size, 2 | 4) {
        let (rows, row_step) = (shape[rank - 2] as usize, step[rank - 2]);
        let block = rows * inner * size;
        return strided_blocks(
            src,
            base,
            &shape[..rank - 2],
            &step[..rank - 2],
            out,
            block,
            |src, offset, dst| match size {
                4 => copy_block::<4>(src, offset, rows, row_step, inner, inner_step, dst),
                _ => copy_block::<2>(src, offset, rows, row_step, inner, inner_step, dst),
            },
        );
    }
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

/// The elements of one block of the last two axes, `S` bytes each: row `r`, element `j` from
/// source element `offset + r·row_step + j·inner_step`.
#[inline(always)]
fn copy_block<const S: usize>(
    src: &[u8],
    offset: usize,
    rows: usize,
    row_step: usize,
    inner: usize,
    inner_step: usize,
    dst: &mut [u8],
) {
    if inner_step == 0 && row_step == 1 {
        // Each element repeated `inner` times (nearest-neighbour upsampling along the last
        // axis).
        let from = &src[offset * S..(offset + rows) * S];
        for (d, v) in dst.chunks_exact_mut(inner * S).zip(from.chunks_exact(S)) {
            for e in d.chunks_exact_mut(S) {
                e.copy_from_slice(v);
            }
        }
        return;
    }
    let mut at = 0;
    for r in 0..rows {
        let row = offset + r * row_step;
        for j in 0..inner {
            let from = (row + j * inner_step) * S;
            let v: [u8; S] = src[from..from + S].try_into().expect("S bytes");
            dst[at..at + S].copy_from_slice(&v);
            at += S;
        }
    }
}

/// Runs `block(src, offset, dst)` for each block of `block` bytes of the output, in row-major
/// order over the outer axes `shape` (source offsets stepping by `step`).
#[allow(clippy::too_many_arguments)]
fn strided_blocks(
    src: &[u8],
    base: usize,
    shape: &[u64],
    step: &[usize],
    out: &mut [u8],
    block: usize,
    f: impl Fn(&[u8], usize, &mut [u8]),
) {
    if block == 0 {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    let mut offset = base;
    for dst in out.chunks_exact_mut(block) {
        f(src, offset, dst);
        for d in (0..shape.len()).rev() {
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

/// Element steps that read `inp` broadcast (numpy rules) to `out`: 0 along axes `inp` lacks or
/// has as 1.
fn broadcast_steps(out: &[u64], inp: &[u64]) -> Vec<usize> {
    let st = strides(inp);
    let off = out.len() - inp.len();
    (0..out.len())
        .map(|d| {
            if d < off || inp[d - off] == 1 {
                0
            } else {
                st[d - off]
            }
        })
        .collect()
}

/// Calls `row(offsets)` once per row of `shape` (all axes but the last), in row-major order,
/// with each operand's element offset at the row's start (`steps[k]` are operand `k`'s steps).
fn for_each_row<const K: usize>(
    shape: &[u64],
    steps: [&[usize]; K],
    mut row: impl FnMut([usize; K]),
) {
    if shape.contains(&0) {
        return;
    }
    let outer = shape.len().saturating_sub(1);
    let mut idx = vec![0usize; outer];
    let mut at = [0usize; K];
    loop {
        row(at);
        let mut d = outer;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for k in 0..K {
                at[k] += steps[k][d];
            }
            if idx[d] < shape[d] as usize {
                break;
            }
            for k in 0..K {
                at[k] -= steps[k][d] * idx[d];
            }
            idx[d] = 0;
        }
    }
}

/// `where(cond, a, b)` with broadcasting: each element's bytes copied from `a` or `b`.
fn select(ty: &TensorType, c: &HostTensor, a: &HostTensor, b: &HostTensor, out: &mut [u8]) {
    // The element size as a constant, so each element moves as one load and store rather
    // than a call to copy a run-time number of bytes (which cost ~2 ms a token in a decode
    // step's masks).
    match ty.dtype.size() {
        1 => select_sized::<1>(ty, c, a, b, out),
        2 => select_sized::<2>(ty, c, a, b, out),
        4 => select_sized::<4>(ty, c, a, b, out),
        8 => select_sized::<8>(ty, c, a, b, out),
        n => unreachable!("no dtype is {n} bytes"),
    }
}

fn select_sized<const N: usize>(
    ty: &TensorType,
    c: &HostTensor,
    a: &HostTensor,
    b: &HostTensor,
    out: &mut [u8],
) {
    let (sc, sa, sb) = (
        broadcast_steps(&ty.shape, c.shape()),
        broadcast_steps(&ty.shape, a.shape()),
        broadcast_steps(&ty.shape, b.shape()),
    );
    let last = ty.rank().saturating_sub(1);
    let inner = ty.shape.last().copied().unwrap_or(1) as usize;
    let inner_step = |s: &[usize]| s.get(last).copied().unwrap_or(0);
    let (ic, ia, ib) = (inner_step(&sc), inner_step(&sa), inner_step(&sb));
    let (cb, ab, bb) = (c.bytes(), a.bytes(), b.bytes());
    let element =
        |src: &[u8], i: usize| -> [u8; N] { src[i * N..(i + 1) * N].try_into().expect("N bytes") };
    let mut rows = out.chunks_exact_mut(inner.max(1) * N);
    for_each_row(&ty.shape, [&sc, &sa, &sb], |[oc, oa, ob]| {
        let Some(row) = rows.next() else { return };
        for (j, dst) in row.chunks_exact_mut(N).enumerate() {
            let e = if cb[oc + j * ic] != 0 {
                element(ab, oa + j * ia)
            } else {
                element(bb, ob + j * ib)
            };
            dst.copy_from_slice(&e);
        }
    });
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
    threads: usize,
    id: NodeId,
    op: &Op,
    ty: &TensorType,
    operands: &[&HostTensor],
) -> Option<Result<HostTensor, RunError>> {
    let x = *operands.first()?;
    let size = x.dtype().size() as usize;
    let src_strides = strides(x.shape());
    Some(Ok(match op {
        Op::Reshape { .. } => copied(pool, ty, |out| out.copy_from_slice(x.bytes())),
        Op::Permute { perm, .. } => {
            let step = permuted_strides(x.shape(), perm);
            copied(pool, ty, |out| {
                strided_copy_par(threads, x.bytes(), size, 0, &ty.shape, &step, out)
            })
        }
        Op::Expand { .. } => {
            let step = broadcast_steps(&ty.shape, x.shape());
            copied(pool, ty, |out| {
                strided_copy_par(threads, x.bytes(), size, 0, &ty.shape, &step, out)
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
                strided_copy_par(threads, x.bytes(), size, base, &ty.shape, &step, out)
            })
        }
        Op::Gather { axis, .. } => {
            let a = *axis as usize;
            let dim = x.shape()[a];
            let pre: usize = x.shape()[..a].iter().product::<u64>() as usize;
            let post: usize = x.shape()[a + 1..].iter().product::<u64>() as usize;
            let idx = operands.get(1)?.to_i64_vec();
            if ty.numel() == Some(0) {
                // No element reads an index, so none can be out of range (as in the reference).
                return Some(Ok(tensor(ty, Vec::new())));
            }
            // Every index is checked before any is used, so a bad one fails the step whole.
            let mut rows = Vec::with_capacity(idx.len());
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
                rows.push(v as usize);
            }
            // Into a buffer from the pool: a fresh one would fault in page by page (an
            // embedding lookup's output is megabytes).
            let row = post * size;
            copied(pool, ty, |out| match row {
                // Single f32 or i32 elements (RoPE's pair swap): copies of a known size.
                4 => gather_rows(x.bytes(), 4, pre, dim as usize, &rows, out),
                _ => gather_rows(x.bytes(), row, pre, dim as usize, &rows, out),
            })
        }
        Op::Concat { axis, .. } => {
            let a = *axis as usize;
            let outer = ty.shape[..a].iter().product::<u64>() as usize;
            // Operand rows along and after the axis are contiguous in both: the output is
            // these runs of bytes one after another.
            let runs: Vec<&[u8]> = (0..outer)
                .flat_map(|o| {
                    operands.iter().map(move |part| {
                        let block = part.shape()[a..].iter().product::<u64>() as usize * size;
                        &part.bytes()[o * block..(o + 1) * block]
                    })
                })
                .collect();
            copied(pool, ty, |out| concat_runs(threads, &runs, out))
        }
        Op::Pad { pads, value, .. } => {
            let fill = &value.to_le_bytes()[..size];
            let out_strides = strides(&ty.shape);
            let base: usize = pads
                .iter()
                .zip(&out_strides)
                .map(|(&(lo, _), s)| lo as usize * s)
                .sum();
            let inner = x.shape().last().copied().unwrap_or(1) as usize * size;
            copied(pool, ty, |out| {
                if fill.iter().all(|&b| b == fill[0]) {
                    out.fill(fill[0]);
                } else {
                    for chunk in out.chunks_exact_mut(size) {
                        chunk.copy_from_slice(fill);
                    }
                }
                let mut from = 0;
                for_each_row(x.shape(), [&out_strides], |[to]| {
                    let to = (base + to) * size;
                    out[to..to + inner].copy_from_slice(&x.bytes()[from..from + inner]);
                    from += inner;
                });
            })
        }
        Op::Where { .. } => {
            let [c, a, b] = operands else {
                return None;
            };
            copied(pool, ty, |out| select(ty, c, a, b, out))
        }
        _ => return None,
    }))
}

/// Gather's copy: for each of `pre` outer entries, rows `rows` (each `row` bytes) of the
/// `dim` rows there, in order, into `out`. Always inlined, so a caller passing a constant
/// `row` gets copies of a known size.
#[inline(always)]
fn gather_rows(src: &[u8], row: usize, pre: usize, dim: usize, rows: &[usize], out: &mut [u8]) {
    let mut chunks = out.chunks_exact_mut(row.max(1));
    for p in 0..pre {
        for &v in rows {
            let at = (p * dim + v) * row;
            if let Some(dst) = chunks.next() {
                dst.copy_from_slice(&src[at..at + row]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_split_across_threads_moves_the_same_bytes() {
        // Large enough to be split: a permutation of attention's shape and a strided slice.
        let shape = [6u64, 400, 8, 33];
        let n: usize = shape.iter().product::<u64>() as usize;
        let src: Vec<u8> = (0..n * 4).map(|i| (i * 7 + i / 251) as u8).collect();
        let permuted = [6u64, 8, 400, 33];
        let step = permuted_strides(&shape, &[0, 2, 1, 3]);
        // Every other column of the third axis, from the second batch entry on.
        let sliced = [5u64, 400, 4, 33];
        let own = strides(&shape);
        let slice_step = [own[0], own[1], 2 * own[2], own[3]];
        for (out_shape, base, step) in [
            (&permuted, 0, &step[..]),
            (&sliced, own[0] + own[2], &slice_step[..]),
        ] {
            let len = out_shape.iter().product::<u64>() as usize * 4;
            assert!(
                len >= PARALLEL_COPY_BYTES,
                "the copy must be big enough to split"
            );
            let mut one = vec![0u8; len];
            strided_copy(&src, 4, base, out_shape, step, &mut one);
            for threads in [2, 3] {
                let mut split = vec![0u8; len];
                strided_copy_par(threads, &src, 4, base, out_shape, step, &mut split);
                assert!(split == one, "{threads} threads, shape {out_shape:?}");
            }
        }
    }

    #[test]
    fn a_concatenation_split_across_threads_moves_the_same_bytes() {
        // Runs of uneven lengths (not multiples of a cache line), past the threshold.
        let runs: Vec<Vec<u8>> = (0..9)
            .map(|r| {
                (0..(r * 7919 + 20_001))
                    .map(|i| (i * 31 + r) as u8)
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = runs.iter().map(Vec::as_slice).collect();
        let want: Vec<u8> = runs.concat();
        assert!(want.len() >= PARALLEL_CONCAT_BYTES, "big enough to split");
        for threads in [1, 2, 3, 7] {
            let mut got = vec![0u8; want.len()];
            concat_runs(threads, &refs, &mut got);
            assert!(got == want, "{threads} threads");
        }
    }
}
