//! The bounded worker pool: at most `workers` jobs execute at once (each on a blocking thread,
//! its kernels using their own threads), at most `queue_limit` more wait; beyond that a
//! request is refused as busy at once instead of piling up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tenet_proto::{ApiError, ErrorCode};
use tokio::sync::Semaphore;

pub struct Pool {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    queue_limit: usize,
}

impl Pool {
    pub fn new(workers: usize, queue_limit: usize) -> Pool {
        Pool {
            permits: Arc::new(Semaphore::new(workers)),
            waiting: AtomicUsize::new(0),
            queue_limit,
        }
    }

    /// Run `work` on a worker once one is free.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue_limit {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(ApiError::new(
                        ErrorCode::Busy,
                        format!(
                            "all workers are busy and {} requests are already queued; retry later",
                            self.queue_limit
                        ),
                    ));
                }
                let p = self.permits.clone().acquire_owned().await;
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                p.map_err(|_| ApiError::new(ErrorCode::Busy, "the node is shutting down"))?
            }
        };
        // The permit moves into the blocking task: if the request is abandoned, the worker
        // stays counted until the work really ends.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("a job's worker failed: {e}")))
    }

    /// Requests waiting for a worker now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Workers busy now.
    pub fn busy(&self, workers: usize) -> usize {
        workers - self.permits.available_permits().min(workers)
    }
}
