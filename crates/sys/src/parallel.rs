//! Running the parts of one kernel on the process's worker threads.
//!
//! Every parallel kernel splits its work into parts decided by the caller's thread count and
//! the shape, never by the pool or by timing, and a part computes the same values on any
//! thread. Which thread runs a part (or, with `Stealing`, takes a work item) depends on
//! timing, which is why nothing a part computes may depend on the thread.
//!
//! The pool is the calling thread plus one helper per other core, started on first use. A job
//! is published in one shared slot; the caller and the helpers claim its parts one at a time
//! from an atomic counter, and the caller returns once every part is done. Helpers spin while
//! they wait for work, and only park after a while without any: a graph runs hundreds of small
//! operations a few microseconds apart (one decoded token is ~1,500), and waking a parked
//! thread costs about 70 µs on these VMs, more than many whole parts. Inside [`on_workers`] (an
//! executor running a graph) helpers keep spinning for longer, as OpenMP runtimes and OpenBLAS
//! do. Spawning threads per operation (the first version) cost ~80 µs each; rayon's pool, the
//! second, parked its workers between operations.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Work below this many elements runs on the calling thread: handing it out costs more.
pub const MIN_PARALLEL_ELEMS: usize = 1 << 15;

/// How long a helper with nothing to do spins before parking, outside and inside a session.
const SPIN: Duration = Duration::from_micros(100);
const SPIN_IN_SESSION: Duration = Duration::from_millis(5);

/// A claim counter's part index while a job is being published: above any job's part count.
const CLOSED: u64 = 0xffff_ffff;

/// The next unclaimed part in a claim counter (its low 32 bits).
fn part_index(claim: u64) -> u64 {
    claim & 0xffff_ffff
}

/// One published job: the body runs part `i` for each claimed `i`.
struct Job<'a> {
    body: &'a (dyn Fn(usize) + Sync),
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    fn run(&self, part: usize) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| (self.body)(part))) {
            self.panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(p);
        }
        self.done.fetch_add(1, SeqCst);
    }
}

struct Pool {
    /// The current job's sequence number (high 32 bits) and its next unclaimed part (low 32).
    claim: AtomicU64,
    /// Parts of the current job.
    parts: AtomicUsize,
    /// The current job, valid while it has unfinished parts (its owner waits for them).
    job: AtomicPtr<Job<'static>>,
    /// Held by the thread whose job is in the slot; others run their parts themselves.
    owner: Mutex<()>,
    /// Sessions open now ([`on_workers`]).
    sessions: AtomicUsize,
    /// Helpers parked or about to park, and the wake-up count they wait on.
    parked: AtomicUsize,
    wake: Mutex<u64>,
    woken: Condvar,
    helpers: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            claim: AtomicU64::new(0),
            parts: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            owner: Mutex::new(()),
            sessions: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            wake: Mutex::new(0),
            woken: Condvar::new(),
            helpers: cores - 1,
        }));
        for i in 0..pool.helpers {
            // A helper that cannot start only means fewer hands: parts are claimed, not assigned.
            let _ = std::thread::Builder::new()
                .name(format!("tenet-worker-{i}"))
                .spawn(move || pool.help());
        }
        pool
    })
}

impl Pool {
    /// Claim one part of the current job and run it; false if there was none to claim.
    fn run_one(&self) -> bool {
        let c = self.claim.load(SeqCst);
        let job = self.job.load(SeqCst);
        let parts = self.parts.load(SeqCst);
        if part_index(c) >= parts as u64 || job.is_null() {
            return false;
        }
        // The exchange succeeds only if no part was claimed and no new job published since
        // `c` was read (publishing first closes the counter under a new sequence number);
        // `job` and `parts` were read after `c`, so they belong to that job.
        if self
            .claim
            .compare_exchange(c, c + 1, SeqCst, SeqCst)
            .is_err()
        {
            return true;
        }
        // SAFETY: the job's owner publishes it before its claim counter and does not return
        // (so the job stays alive) until every claimed part has finished; this part was claimed
        // above and finishes inside `run`, the last use of `job`.
        unsafe { &*job }.run(part_index(c) as usize);
        true
    }

    fn work_available(&self) -> bool {
        part_index(self.claim.load(SeqCst)) < self.parts.load(SeqCst) as u64
    }

    fn help(&self) {
        let mut idle_since = Instant::now();
        loop {
            if self.run_one() {
                idle_since = Instant::now();
                continue;
            }
            let limit = if self.sessions.load(SeqCst) > 0 {
                SPIN_IN_SESSION
            } else {
                SPIN
            };
            if idle_since.elapsed() < limit {
                std::hint::spin_loop();
                continue;
            }
            let mut seen = self.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.parked.fetch_add(1, SeqCst);
            // Checked after announcing the park: a job published after this check finds
            // `parked` non-zero and takes the lock to wake us, which waits for our `wait`.
            if !self.work_available() {
                let epoch = *seen;
                while *seen == epoch {
                    seen = self.woken.wait(seen).unwrap_or_else(|e| e.into_inner());
                }
            }
            self.parked.fetch_sub(1, SeqCst);
            drop(seen);
            idle_since = Instant::now();
        }
    }

    fn wake_parked(&self) {
        if self.parked.load(SeqCst) > 0 {
            *self.wake.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.woken.notify_all();
        }
    }
}

/// Run `f` as one session: the pool's helpers stay awake (spinning) between the parallel
/// operations `f` runs, instead of parking after each. An executor runs a graph's steps inside
/// one such call.
pub fn on_workers<R>(f: impl FnOnce() -> R) -> R {
    let pool = pool();
    pool.sessions.fetch_add(1, SeqCst);
    pool.wake_parked();
    struct Close(&'static Pool);
    impl Drop for Close {
        fn drop(&mut self) {
            self.0.sessions.fetch_sub(1, SeqCst);
        }
    }
    let _close = Close(pool);
    f()
}

/// Run `body(i)` for every `i < parts` on the calling thread and the pool's helpers; returns
/// when all are done. A panic in a part is raised here once every part has finished.
pub fn run_parts(parts: usize, body: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    let guard = if parts > 1 && parts < CLOSED as usize && pool.helpers > 0 {
        pool.owner.try_lock().ok()
    } else {
        None
    };
    // Without the slot (in use by another job, or by the job one of whose parts calls in
    // here) or anyone to share with, every part runs here.
    let Some(guard) = guard else {
        (0..parts).for_each(body);
        return;
    };
    let job = Job {
        body,
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    // First the new sequence number with no part claimable, so that an exchange based on the
    // previous job's counter cannot succeed against this job's `job` and `parts`; then the job;
    // then its parts open.
    let seq = (pool.claim.load(SeqCst) >> 32).wrapping_add(1) & 0xffff_ffff;
    pool.claim.store(seq << 32 | CLOSED, SeqCst);
    pool.job
        .store(&job as *const Job<'_> as *mut Job<'static>, SeqCst);
    pool.parts.store(parts, SeqCst);
    pool.claim.store(seq << 32, SeqCst);
    pool.wake_parked();
    while pool.run_one() {}
    while job.done.load(SeqCst) < parts {
        std::hint::spin_loop();
    }
    pool.parts.store(0, SeqCst);
    pool.job.store(std::ptr::null_mut(), SeqCst);
    drop(guard);
    if let Some(p) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        resume_unwind(p);
    }
}

/// Run `f(range, piece)` over the pieces of `out` cut at the ends of `ranges` (contiguous,
/// covering `out` from the start), in parallel, returning when every piece is done.
pub fn for_each_piece<T: Send>(
    out: &mut [T],
    ranges: &[std::ops::Range<usize>],
    f: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) {
    let mut rest = out;
    let mut at = 0;
    let mut pieces = Vec::with_capacity(ranges.len());
    for r in ranges {
        assert_eq!(r.start, at, "ranges must be contiguous from the start");
        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
        rest = tail;
        at = r.end;
        // Each piece is taken exactly once, by whichever thread claims its index.
        pieces.push(Mutex::new(Some((r.clone(), piece))));
    }
    run_parts(pieces.len(), &|i| {
        let taken = pieces[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((r, piece)) = taken {
            f(r, piece);
        }
    });
}

/// Work items in contiguous ranges, one per owner: an owner takes items from the front of its
/// range, and a thread with nothing left takes them one at a time from the back of another's.
/// Each item is taken exactly once. Owners keep the order (and the caches) a static split
/// would give; the stealing only moves the last items of a range whose owner fell behind.
pub struct Stealing {
    /// Per owner, the first untaken item (low 32 bits) and the end of the range (high 32).
    ranges: Vec<AtomicU64>,
}

impl Stealing {
    /// Items must number below 2³².
    pub fn new(ranges: &[std::ops::Range<usize>]) -> Stealing {
        let pack = |r: &std::ops::Range<usize>| {
            assert!(r.end < 1 << 32, "too many work items");
            AtomicU64::new((r.end as u64) << 32 | r.start.min(r.end) as u64)
        };
        Stealing {
            ranges: ranges.iter().map(pack).collect(),
        }
    }

    #[inline]
    pub fn owners(&self) -> usize {
        self.ranges.len()
    }

    /// The next `want` items of `owner`'s range if that many are left, else the next one.
    #[inline]
    pub fn take_front(&self, owner: usize, want: usize) -> Option<std::ops::Range<usize>> {
        let want = want.max(1) as u64;
        self.claim(owner, |lo, hi| {
            let n = if lo + want <= hi { want } else { 1 };
            (lo + n, hi, lo as usize..(lo + n) as usize)
        })
    }

    /// The last item of `victim`'s range, if any is left.
    #[inline]
    pub fn steal_back(&self, victim: usize) -> Option<usize> {
        self.claim(victim, |lo, hi| (lo, hi - 1, hi as usize - 1))
    }

    /// Shrink range `i` from `(lo, hi)` to the first two values `take` returns and hand back the
    /// third, retrying while other threads change the range; `None` once it is empty.
    #[inline]
    fn claim<R>(&self, i: usize, take: impl Fn(u64, u64) -> (u64, u64, R)) -> Option<R> {
        let slot = &self.ranges[i];
        let mut s = slot.load(SeqCst);
        loop {
            let (lo, hi) = (s & 0xffff_ffff, s >> 32);
            if lo >= hi {
                return None;
            }
            let (lo, hi, taken) = take(lo, hi);
            match slot.compare_exchange_weak(s, hi << 32 | lo, SeqCst, SeqCst) {
                Ok(_) => return Some(taken),
                Err(now) => s = now,
            }
        }
    }
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

    #[test]
    fn stolen_and_owned_items_are_each_taken_once() {
        use std::sync::atomic::AtomicU32;
        for round in 0..2_000usize {
            let (n, owners, want) = (1 + round % 37, 1 + round % 4, 1 + round % 5);
            let ranges = ranges(n, owners, 1);
            let work = Stealing::new(&ranges);
            let taken: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            run_parts(work.owners(), &|t| {
                while let Some(r) = work.take_front(t, want) {
                    assert!(r.len() == want || r.len() == 1);
                    r.for_each(|i| {
                        taken[i].fetch_add(1, SeqCst);
                    });
                }
                for v in (0..work.owners()).filter(|&v| v != t) {
                    while let Some(i) = work.steal_back(v) {
                        assert!(ranges[v].contains(&i), "stolen from the victim's range");
                        taken[i].fetch_add(1, SeqCst);
                    }
                }
            });
            assert!(taken.iter().all(|t| t.load(SeqCst) == 1), "round {round}");
        }
    }

    #[test]
    fn jobs_from_many_threads_and_nested_jobs_all_finish() {
        // Several threads publish jobs at once (one owns the slot, the others run their parts
        // themselves), and parts start jobs of their own (run where they are).
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    for round in 0..300u64 {
                        let mut out = vec![0u64; 64];
                        // Part counts vary from job to job (a stale claim on a job with fewer
                        // parts must not claim a part of the next one).
                        let parts = 2 + (round + t) as usize % 7;
                        on_workers(|| {
                            for_each_piece(&mut out, &ranges(64, parts, 1), |range, piece| {
                                let mut inner = vec![0u64; piece.len()];
                                for_each_piece(&mut inner, &ranges(piece.len(), 2, 1), |r, p| {
                                    for (i, x) in r.zip(p.iter_mut()) {
                                        *x = i as u64;
                                    }
                                });
                                for ((i, x), y) in range.zip(piece.iter_mut()).zip(inner) {
                                    *x = i as u64 * 1000 + t + round + y;
                                }
                            })
                        });
                        let per = 64u64.div_ceil(parts as u64);
                        let want: Vec<u64> =
                            (0..64u64).map(|i| i * 1000 + t + round + i % per).collect();
                        assert_eq!(out, want);
                    }
                });
            }
        });
    }

    #[test]
    fn every_part_of_back_to_back_jobs_runs_exactly_once() {
        // Tiny jobs of varying sizes published as fast as possible keep the helpers claiming
        // while the slot changes hands.
        use std::sync::atomic::AtomicU32;
        for round in 0..20_000usize {
            let parts = 2 + round % 9;
            let runs: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
            run_parts(parts, &|i| {
                runs[i].fetch_add(1, SeqCst);
            });
            let counts: Vec<u32> = runs.iter().map(|r| r.load(SeqCst)).collect();
            assert_eq!(counts, vec![1; parts], "job {round}");
        }
    }

    #[test]
    fn a_panicking_part_panics_the_caller_after_every_part_is_done() {
        let mut out = vec![0u32; 16];
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
            for_each_piece(&mut out, &ranges(16, 4, 1), |range, piece| {
                if range.start == 4 {
                    panic!("part one fails");
                }
                std::thread::sleep(Duration::from_millis(5));
                piece.fill(7);
            })
        }));
        assert!(caught.is_err());
        let filled: Vec<u32> = out.iter().copied().filter(|&x| x == 7).collect();
        assert_eq!(filled.len(), 12, "the other parts ran to the end");
        // The pool still works afterwards.
        for_each_piece(&mut out, &ranges(16, 4, 1), |_, piece| piece.fill(1));
        assert_eq!(out, vec![1; 16]);
    }
}
