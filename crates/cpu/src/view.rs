//! f32 views of host tensors and f32 output buffers that become host tensors without a copy.

use std::borrow::Cow;

use tenet_ir::{HostTensor, TensorType};

/// The elements of an f32 tensor, borrowed when its bytes are aligned (they are whenever the
/// allocator returned them, which is always in practice), copied otherwise.
pub(crate) fn f32s(t: &HostTensor) -> Cow<'_, [f32]> {
    match bytemuck::try_cast_slice::<u8, f32>(t.bytes()) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(t.to_f32_vec()),
    }
}

/// Buffers released during a run, handed out again for results of exactly the same size, so
/// that repeated layers do not fault in and zero fresh memory each time. The run loop sets a
/// budget before each step (the cost certificate's peak minus the live tensors); on a miss,
/// pooled buffers are dropped, largest first, until pooled + new fits it. So the memory held
/// never exceeds what the certificate allows.
/// Released buffers shorter than this are freed, not pooled.
const MIN_POOLED: usize = 64 << 10;

#[derive(Default)]
pub(crate) struct Pool {
    bufs: std::sync::Mutex<Vec<Vec<u8>>>,
    budget: std::sync::atomic::AtomicU64,
}

impl Pool {
    pub(crate) fn give(&self, buf: Vec<u8>) {
        // Small buffers go back to the allocator, which reuses them well: kept here, a long
        // chain's thousands of scalar constants would pile up for the whole run.
        if buf.len() >= MIN_POOLED {
            self.bufs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(buf);
        }
    }

    /// Bytes the pool and the next result may use together.
    pub(crate) fn set_budget(&self, bytes: u64) {
        self.budget
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// A buffer of exactly `len` bytes: reused from this run or an earlier one (stale contents), or
    /// freshly zeroed.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let mut pool = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().position(|b| b.len() == len) {
            return pool.swap_remove(i);
        }
        let budget = self.budget.load(std::sync::atomic::Ordering::Relaxed);
        pool.sort_by_key(Vec::len);
        let mut held: u64 = pool.iter().map(|b| b.len() as u64).sum();
        // Over budget: the largest pooled buffers leave the run for the process-wide cache
        // (bounded there, and outside any certificate), where a later step or run of this size
        // still finds them instead of faulting in fresh pages.
        while held + len as u64 > budget {
            match pool.pop() {
                Some(b) => {
                    held -= b.len() as u64;
                    tenet_ir::recycle::give(b);
                }
                None => break,
            }
        }
        drop(pool);
        tenet_ir::recycle::take(len).unwrap_or_else(|| tenet_sys::memory::zeroed_bytes(len))
    }
}

impl Drop for Pool {
    /// What the run leaves pooled goes to the process-wide cache (bounded there), so the next
    /// run of a graph finds its buffers instead of faulting in fresh pages.
    fn drop(&mut self) {
        let bufs = std::mem::take(self.bufs.get_mut().unwrap_or_else(|e| e.into_inner()));
        bufs.into_iter().for_each(tenet_ir::recycle::give);
    }
}

/// Compute an f32 tensor of type `ty` whose every element `fill` writes.
pub(crate) fn make_f32(pool: &Pool, ty: &TensorType, fill: impl FnOnce(&mut [f32])) -> HostTensor {
    let n = ty.numel().unwrap_or(0) as usize;
    let mut bytes = pool.take(n * 4);
    match bytemuck::try_cast_slice_mut::<u8, f32>(&mut bytes) {
        Ok(out) => fill(out),
        Err(_) => {
            let mut tmp = vec![0.0f32; n];
            fill(&mut tmp);
            bytes = tmp.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
    }
    HostTensor::new(ty.clone(), bytes).expect("sized to the type")
}

/// Run `f(range, out_slice)` over disjoint pieces of `out` on up to `threads` threads, each
/// range a multiple of `align` elements (except the last). Small outputs stay on this thread.
pub(crate) fn par_chunks<T: Send>(
    out: &mut [T],
    threads: usize,
    align: usize,
    f: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) {
    use tenet_sys::parallel;
    let threads = if out.len() < parallel::MIN_PARALLEL_ELEMS {
        1
    } else {
        threads
    };
    parallel::for_each_piece(out, &parallel::ranges(out.len(), threads, align), f);
}
