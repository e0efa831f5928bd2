//! Running the parts of one kernel on the process's worker threads.
//!
//! Every parallel kernel splits its work into a fixed number of parts decided by the caller's
//! thread count, never by the pool or by timing, so which worker runs a part cannot change a bit.
//! The workers are rayon's global pool (one per core), started once: spawning OS threads per
//! operation cost about 80 µs a time here, which dominated small steps such as one decoded token
//! (hundreds of operations).

/// Run `f` on one of the pool's workers (directly if this thread is one). The parts that
/// [`for_each_piece`] hands out from a worker are then waited for by working: a part no other
/// worker has picked up yet is run by the waiting worker itself. A thread outside the pool can
/// only sleep until they are done, and waking a parked worker costs about 70 µs on these VMs —
/// more than many whole parts. An executor runs a graph's steps inside one such call.
pub fn on_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

/// Work below this many elements runs on the calling thread: handing it out costs more.
pub const MIN_PARALLEL_ELEMS: usize = 1 << 15;

/// Run `f(range, piece)` over the pieces of `out` cut at the ends of `ranges` (contiguous,
/// covering `out` from the start), in parallel, returning when every piece is done.
pub fn for_each_piece<T: Send>(
    out: &mut [T],
    ranges: &[std::ops::Range<usize>],
    f: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) {
    if ranges.len() <= 1 {
        if let Some(r) = ranges.first() {
            f(r.clone(), &mut out[r.clone()]);
        }
        return;
    }
    let f = &f;
    // The calling thread runs the first piece itself while the pool takes the others: it would
    // otherwise only sleep until they are done, and waking it costs as much as a small piece.
    rayon::in_place_scope(|s| {
        let mut rest = out;
        let mut at = 0;
        let mut first = None;
        for r in ranges {
            assert_eq!(r.start, at, "ranges must be contiguous from the start");
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            rest = tail;
            at = r.end;
            let r = r.clone();
            if first.is_none() {
                first = Some((r, piece));
            } else {
                s.spawn(move |_| f(r, piece));
            }
        }
        if let Some((r, piece)) = first {
            f(r, piece);
        }
    });
}

/// Split `0..n` into at most `parts` contiguous ranges whose starts are multiples of `align`.
pub fn ranges(n: usize, parts: usize, align: usize) -> Vec<std::ops::Range<usize>> {
    let align = align.max(1);
    let per = n.div_ceil(parts.max(1)).div_ceil(align) * align;
    (0..n)
        .step_by(per.max(1))
        .map(|s| s..(s + per).min(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_output_once() {
        for (n, parts, align) in [(0, 2, 1), (10, 3, 1), (100, 2, 16), (7, 5, 4), (64, 1, 8)] {
            let r = ranges(n, parts, align);
            assert!(r.len() <= parts.max(1));
            let mut out = vec![0u32; n];
            for_each_piece(&mut out, &r, |range, piece| {
                assert_eq!(range.len(), piece.len());
                for (i, x) in range.zip(piece.iter_mut()) {
                    *x += i as u32 + 1;
                }
            });
            assert_eq!(out, (1..=n as u32).collect::<Vec<_>>());
        }
    }
}
