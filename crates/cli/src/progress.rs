//! Progress of long transfers and loads on standard error: a bar redrawn in place when standard
//! error is a terminal, one summary line when it is not (logs and pipes stay readable).

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One transfer of `total` bytes.
pub struct Transfer {
    label: String,
    total: u64,
    taken: Arc<AtomicU64>,
    /// Counts per byte of `total`: a load that reads a file and then indexes it counts each
    /// byte twice.
    passes: u64,
    started: Instant,
    terminal: bool,
}

const WIDTH: usize = 30;

/// Files at least this large are loaded under a progress bar.
pub const LOAD_BAR_BYTES: u64 = 64 << 20;

/// Run `load` of a file of `size` bytes under a bar labelled `label` when the file is large,
/// directly otherwise. `load` adds to its counter the bytes it reads and then the bytes it
/// indexes (or dequantises): each byte counts twice.
pub fn loading<T: Send>(label: &str, size: u64, load: impl FnOnce(&AtomicU64) -> T + Send) -> T {
    if size < LOAD_BAR_BYTES {
        return load(&AtomicU64::new(0));
    }
    let mut bar = Transfer::new(label, size);
    bar.passes = 2;
    bar.watch_blocking(load)
}

impl Transfer {
    pub fn new(label: impl Into<String>, total: u64) -> Transfer {
        Transfer {
            label: label.into(),
            total,
            taken: Arc::default(),
            passes: 1,
            started: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// What the sender adds the bytes it has handed over to.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.taken.clone()
    }

    /// Run `work`, redrawing the bar every 100 ms until it ends.
    pub async fn watch<T>(&self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                out = &mut work => {
                    self.finish();
                    return out;
                }
                _ = tick.tick() => self.draw(),
            }
        }
    }

    /// Run `work` on a scoped thread, redrawing the bar every 100 ms until it ends; `work`
    /// adds the bytes it has processed to the counter it is given.
    pub fn watch_blocking<T: Send>(&self, work: impl FnOnce(&AtomicU64) -> T + Send) -> T {
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let out = std::thread::scope(|s| {
            let job = s.spawn(move || {
                let out = work(&self.taken);
                drop(done);
                out
            });
            // Woken when the work ends (its sender dropped, also by a panic), else every 100 ms.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(Duration::from_millis(100))
            {
                self.draw();
            }
            job.join()
        });
        self.taken
            .store(self.total * self.passes, Ordering::Relaxed);
        self.finish();
        out.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    fn megabytes(bytes: u64) -> f64 {
        bytes as f64 / 1e6
    }

    fn draw(&self) {
        if !self.terminal {
            return;
        }
        let done = (self.taken.load(Ordering::Relaxed) / self.passes).min(self.total);
        let fraction = if self.total == 0 {
            1.0
        } else {
            done as f64 / self.total as f64
        };
        let filled = (fraction * WIDTH as f64).round() as usize;
        let rate = Self::megabytes(done) / self.started.elapsed().as_secs_f64().max(1e-3);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{} [{}{}] {:>3.0}% {:.1}/{:.1} MB {:.0} MB/s ",
            self.label,
            "#".repeat(filled),
            ".".repeat(WIDTH - filled),
            fraction * 100.0,
            Self::megabytes(done),
            Self::megabytes(self.total),
            rate
        );
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.terminal {
            self.draw();
            eprintln!();
        } else {
            eprintln!(
                "{}: {:.1} MB in {:.2} s",
                self.label,
                Self::megabytes(self.total),
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}
