//! Progress of long transfers on standard error: a bar redrawn in place when standard error is
//! a terminal, one summary line when it is not (logs and pipes stay readable).

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
    started: Instant,
    terminal: bool,
}

const WIDTH: usize = 30;

impl Transfer {
    pub fn new(label: impl Into<String>, total: u64) -> Transfer {
        Transfer {
            label: label.into(),
            total,
            taken: Arc::default(),
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

    fn megabytes(bytes: u64) -> f64 {
        bytes as f64 / 1e6
    }

    fn draw(&self) {
        if !self.terminal {
            return;
        }
        let done = self.taken.load(Ordering::Relaxed).min(self.total);
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
