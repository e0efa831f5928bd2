//! A process-wide cache of large tensor buffers, so that a result computed again and again does
//! not fault in and zero fresh pages from the OS every time (tinygrad's LRU allocator and
//! PyTorch's caching allocator do the same).
//!
//! Dropping a [`HostTensor`](crate::HostTensor) of at least [`MIN_BYTES`] gives its buffer here;
//! an executor asks with [`take`] for a buffer of exactly the length it needs before allocating.
//! What comes back holds stale bytes of some earlier tensor: a taker must overwrite every byte.
//! The cache holds at most [`MAX_HELD`] bytes, dropping the buffers given longest ago first.

use std::sync::Mutex;

/// Smaller buffers are left to the allocator, which already reuses them well.
pub const MIN_BYTES: usize = 1 << 20;
/// The most the cache holds at once.
pub const MAX_HELD: usize = 256 << 20;

/// Oldest first.
static HELD: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A cached buffer of exactly `len` bytes (stale contents), if one is held.
pub fn take(len: usize) -> Option<Vec<u8>> {
    if len < MIN_BYTES {
        return None;
    }
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let i = held.iter().rposition(|b| b.len() == len)?;
    Some(held.remove(i))
}

/// Keep `buf` for a later [`take`], unless it is small or larger than the whole cache.
pub fn give(buf: Vec<u8>) {
    if buf.len() < MIN_BYTES || buf.len() > MAX_HELD {
        return;
    }
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let mut total: usize = held.iter().map(Vec::len).sum::<usize>() + buf.len();
    while total > MAX_HELD {
        total -= held.remove(0).len();
    }
    held.push(buf);
}

/// A buffer that goes back to the cache when dropped: for lending a buffer to an owner that
/// frees it later, such as `bytes::Bytes::from_owner`.
pub struct Recycled(pub Vec<u8>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

/// Bytes held now (for tests and metrics).
pub fn held_bytes() -> usize {
    HELD.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(Vec::len)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lengths_come_back_and_the_cap_holds() {
        // Lengths no other test in this binary uses, so parallel tests cannot take them.
        let len = MIN_BYTES + 4093;
        give(vec![7u8; len]);
        assert_eq!(take(len + 1), None);
        let b = take(len).expect("given back");
        assert_eq!((b.len(), b[0]), (len, 7));
        assert_eq!(take(len), None);
        give(vec![0u8; 100]);
        assert_eq!(take(100), None, "small buffers are not kept");
        for _ in 0..(MAX_HELD / len + 2) {
            give(vec![1u8; len]);
        }
        assert!(held_bytes() <= MAX_HELD);
    }

    #[test]
    fn a_lent_buffer_comes_back_when_dropped() {
        let len = MIN_BYTES + 4091;
        drop(Recycled(vec![3u8; len]));
        assert_eq!(take(len).map(|b| b[len - 1]), Some(3));
    }
}
