//! Large buffers that fault in as huge pages.
//!
//! A fresh 64 MiB output faults in 16,384 times with 4 KiB pages; with transparent huge pages
//! in `madvise` mode (a common default) the kernel uses 2 MiB pages only where asked. The buffer
//! comes zeroed and untouched from the allocator, and the advice is given before first touch.

/// Buffers at least this large get the advice.
const HUGE_THRESHOLD: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// A zeroed byte buffer of `len` bytes, backed by huge pages where the OS allows.
pub fn zeroed_bytes(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    if len >= HUGE_THRESHOLD {
        advise_huge(&v);
    }
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(v: &[u8]) {
    let start = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (v.as_ptr() as usize + v.len()) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: madvise with MADV_HUGEPAGE only changes how the kernel backs pages of this
        // live allocation (the range lies inside `v`); it never changes their contents or
        // mapping. A failure (e.g. THP disabled) is harmless and ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: &[u8]) {}

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_and_sized() {
        for len in [0, 10, 5 << 20] {
            let v = super::zeroed_bytes(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 0));
        }
    }
}
