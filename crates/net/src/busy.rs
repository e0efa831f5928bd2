//! Busy polling: waiting for a socket by spinning for a short window before sleeping.
//!
//! Waking a thread whose CPU has gone idle is slow on a virtual machine: the wake-up is an
//! interrupt delivered through the hypervisor. On this project's 2-core VM a bare loopback
//! round trip measures 4–6 µs while both sides stay awake and 50–75 µs when both sleep between
//! messages, and an HTTP request pays that twice, once each way. So the node keeps its event
//! loop awake for a window after each request (the next one often follows at once), and the
//! client spins while it waits for a short answer; after the window both sleep as before.
//!
//! Spinning here means yielding to the tokio runtime in a loop: with only yielded tasks left, a
//! runtime polls its sockets without blocking, so data that arrives is seen within a few µs
//! instead of after a wake-up. The cost is one core kept busy for at most the window.
//!
//! Spinning time is not wasted: both sides hand the spin an `idle` chore (making the next
//! signature's nonce ahead of time, `tenet_proto::auth::KeyPair::refill_nonce`), so the
//! 15 µs of a signature's curve arithmetic is done while waiting instead of while answering.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Keeps an event loop awake for `window` after each [`BusyPoll::touch`].
pub struct BusyPoll {
    window_us: u64,
    /// Until when to spin, in µs since `epoch`.
    until_us: AtomicU64,
    wake: Notify,
    epoch: Instant,
}

impl BusyPoll {
    pub fn new(window: Duration) -> Arc<BusyPoll> {
        Arc::new(BusyPoll {
            window_us: window.as_micros() as u64,
            until_us: AtomicU64::new(0),
            wake: Notify::new(),
            epoch: Instant::now(),
        })
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Something happened: keep spinning until a window from now.
    pub fn touch(&self) {
        if self.window_us == 0 {
            return;
        }
        self.until_us
            .fetch_max(self.now_us() + self.window_us, Ordering::Relaxed);
        // Stores a permit if the spinner is running, so its next sleep ends at once: harmless.
        self.wake.notify_one();
    }

    /// The spinner: run it as a task of the runtime to keep awake. Never returns. `idle` is
    /// a short chore that says whether it did anything: it runs between spins, and after a
    /// window until it has nothing left to do.
    pub async fn run(self: Arc<Self>, mut idle: impl FnMut() -> bool) {
        loop {
            while self.now_us() < self.until_us.load(Ordering::Relaxed) {
                idle();
                tokio::task::yield_now().await;
            }
            while idle() {
                tokio::task::yield_now().await;
            }
            self.wake.notified().await;
        }
    }
}

/// Await `fut`, spinning for up to `window` before sleeping: polled again after every yield
/// to the runtime (which meanwhile polls its sockets without blocking), then awaited normally.
/// `idle` runs once, after the first yield (by then a request is on its way), if the answer
/// has not come yet.
pub async fn spin_wait<F: Future>(fut: F, window: Duration, idle: impl FnOnce()) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut idle = Some(idle);
    let started = Instant::now();
    let mut yields = 0;
    loop {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        match polled {
            Poll::Ready(out) => return out,
            Poll::Pending if started.elapsed() < window => {
                if yields == 1
                    && let Some(chore) = idle.take()
                {
                    chore();
                }
                yields += 1;
                tokio::task::yield_now().await
            }
            Poll::Pending => return fut.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spin_wait_returns_what_the_future_gives_whether_it_is_quick_or_slow() {
        let chores = std::cell::Cell::new(0);
        let quick = spin_wait(async { 7 }, Duration::from_millis(5), || {
            chores.set(chores.get() + 1)
        })
        .await;
        assert_eq!(quick, 7);
        assert_eq!(
            chores.get(),
            0,
            "an answer at once leaves no time for the chore"
        );
        // Slower than the window: the spin gives up and the future is awaited normally.
        let slow = spin_wait(
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                8
            },
            Duration::from_millis(5),
            || chores.set(chores.get() + 1),
        )
        .await;
        assert_eq!(slow, 8);
        assert_eq!(
            chores.get(),
            1,
            "a slow answer leaves time for the chore, once"
        );
    }

    #[tokio::test]
    async fn the_spinner_runs_for_its_window_after_a_touch_and_then_sleeps() {
        let busy = BusyPoll::new(Duration::from_millis(30));
        let chores = Arc::new(AtomicU64::new(0));
        let done = chores.clone();
        // A chore with three pieces of work in it.
        let spinner = tokio::spawn(busy.clone().run(move || {
            done.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < 3).then_some(n + 1)
            })
            .is_ok()
        }));
        busy.touch();
        let deadline = busy.until_us.load(Ordering::Relaxed);
        assert!(
            deadline >= 30_000,
            "a touch opens a window of 30 ms: {deadline}"
        );
        // While the window is open the spinner keeps yielding, yet other tasks still run.
        let other = tokio::spawn(async { 1 + 1 });
        assert_eq!(other.await.unwrap(), 2);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(busy.now_us() > busy.until_us.load(Ordering::Relaxed));
        assert!(!spinner.is_finished());
        assert_eq!(
            chores.load(Ordering::Relaxed),
            3,
            "the chore ran until it was done"
        );
        spinner.abort();
        // A zero window never spins.
        let off = BusyPoll::new(Duration::ZERO);
        off.touch();
        assert_eq!(off.until_us.load(Ordering::Relaxed), 0);
    }
}
