//! Large buffers that fault in as huge pages, an allocator that puts them on cache-line
//! boundaries, and files mapped read-only into memory.
//!
//! A fresh 64 MiB output faults in 16,384 times with 4 KiB pages; with transparent huge pages
//! in `madvise` mode (a common default) the kernel uses 2 MiB pages only where asked. The buffer
//! comes zeroed and untouched from the allocator, and the advice is given before first touch.
//!
//! Tensors are byte vectors, which the system allocator places 16 bytes past a page boundary
//! once they are large (glibc's header before an mmap'd block), so every 64-byte vector load
//! or store of a kernel straddles two cache lines. [`LineAligned`] is a global allocator that
//! gives large blocks a 64-byte boundary instead; the `tenet` binary installs it, and a
//! program embedding the crates can too. The bits never depend on it, only the speed.

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

/// Blocks at least this large get a cache-line boundary from [`LineAligned`]: tensors a kernel
/// streams through. Smaller ones keep the system's alignment and its cheaper small blocks.
pub const LINE_ALIGNED_MIN_BYTES: usize = 16 << 10;

const LINE: usize = 64;

/// The system allocator, with blocks of [`LINE_ALIGNED_MIN_BYTES`] or more on a 64-byte
/// boundary. Install it with `#[global_allocator] static A: LineAligned = LineAligned;`.
pub struct LineAligned;

impl LineAligned {
    /// The layout a block is really allocated with: the same for its allocation, growth and
    /// release, as `GlobalAlloc` requires.
    fn actual(layout: std::alloc::Layout) -> std::alloc::Layout {
        if layout.size() >= LINE_ALIGNED_MIN_BYTES && layout.align() < LINE {
            // Fails only for a size within 64 bytes of isize::MAX, which then keeps its own
            // layout: the same answer every time, as the block's release needs.
            std::alloc::Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
        } else {
            layout
        }
    }
}

// SAFETY: every call forwards to `System` with `actual(layout)`, which is the same for a block
// whenever it is asked with the same layout (allocation, reallocation's old layout, release),
// and satisfies the caller's layout (same size, an alignment at least as large).
unsafe impl std::alloc::GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: `actual` keeps the caller's non-zero size.
        unsafe { std::alloc::System.alloc(Self::actual(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { std::alloc::System.alloc_zeroed(Self::actual(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` with this `layout`, so from `System` with
        // `actual(layout)`.
        unsafe { std::alloc::System.dealloc(ptr, Self::actual(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY (of the unchecked layout): the caller guarantees `new_size`, rounded up to
        // `layout.align()`, does not overflow isize.
        let new =
            unsafe { std::alloc::Layout::from_size_align_unchecked(new_size, layout.align()) };
        let (old_actual, new_actual) = (Self::actual(layout), Self::actual(new));
        if old_actual == layout && new_actual == new {
            // Neither block is over-aligned here: the system's own reallocation (which can
            // grow in place or remap).
            // SAFETY: `ptr` came from `System` with `layout`; the caller's contract on
            // `new_size` holds.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        if old_actual.align() == new_actual.align() {
            // Both over-aligned alike.
            // SAFETY: `ptr` came from `System` with `old_actual`; `new_size` as above.
            return unsafe { std::alloc::System.realloc(ptr, old_actual, new_size) };
        }
        // The block crosses the threshold: a new one, the contents copied, the old released.
        // SAFETY: `new_actual` has a non-zero size (`new_size` is non-zero by contract);
        // the copy covers bytes valid in both blocks, which do not overlap; `ptr` came from
        // `System` with `old_actual`.
        unsafe {
            let fresh = std::alloc::System.alloc(new_actual);
            if !fresh.is_null() {
                std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                std::alloc::System.dealloc(ptr, old_actual);
            }
            fresh
        }
    }
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

/// A whole file mapped read-only into memory: its pages are read from the page cache when first
/// touched and shared with every other process mapping the file, so a weights file costs no
/// copy and no private memory.
///
/// The contract every memory-mapping loader has: the file must not be truncated or rewritten
/// while mapped (weights files are immutable, content-addressed inputs). The mapping is private,
/// so nothing this process does can change the file.
pub struct MappedFile {
    #[cfg(unix)]
    ptr: *const u8,
    #[cfg(unix)]
    len: usize,
    /// Where mapping is not available, the file read into memory.
    #[cfg(not(unix))]
    bytes: Vec<u8>,
}

// SAFETY: the mapping is read-only and owned by this value until it is dropped; sharing
// `&[u8]` views of it between threads is as safe as sharing any immutable slice.
#[cfg(unix)]
unsafe impl Send for MappedFile {}
// SAFETY: as for `Send`: no method mutates the mapping.
#[cfg(unix)]
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Map all of `file` (opened for reading).
    #[cfg(unix)]
    pub fn map(file: &std::fs::File) -> std::io::Result<MappedFile> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the file is larger than the address space"))?;
        if len == 0 {
            // mmap refuses empty mappings; an empty file is an empty slice.
            return Ok(MappedFile {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: a fresh private read-only mapping of `len` bytes of an open descriptor; the
        // kernel picks the address, and the result is checked for MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedFile {
            ptr: ptr as *const u8,
            len,
        })
    }

    #[cfg(not(unix))]
    pub fn map(file: &std::fs::File) -> std::io::Result<MappedFile> {
        use std::io::Read;
        let mut bytes = Vec::new();
        (&*file).read_to_end(&mut bytes)?;
        Ok(MappedFile { bytes })
    }

    pub fn bytes(&self) -> &[u8] {
        #[cfg(unix)]
        // SAFETY: `ptr` points at `len` readable bytes mapped by `map` (or is dangling with
        // `len` 0), valid until `drop` unmaps them, which cannot happen while `self` is
        // borrowed.
        return unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        #[cfg(not(unix))]
        return &self.bytes;
    }
}

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

#[cfg(unix)]
impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr`/`len` are exactly the mapping `map` made, unmapped once, here; no
            // borrow of it can outlive `self`.
            unsafe {
                libc::munmap(self.ptr as *mut libc::c_void, self.len);
            }
        }
    }
}

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

    #[test]
    fn a_mapped_file_reads_back_its_bytes() {
        let dir = std::env::temp_dir().join(format!("tenet-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in [
            ("empty", Vec::new()),
            ("some", (0..=255u8).cycle().take(10_000).collect()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, &content).unwrap();
            let map = super::MappedFile::map(&std::fs::File::open(&path).unwrap()).unwrap();
            assert_eq!(map.bytes(), &content[..]);
            // Other threads may read the same mapping.
            let map = std::sync::Arc::new(map);
            let other = map.clone();
            let sum =
                std::thread::spawn(move || other.bytes().iter().map(|&b| b as u64).sum::<u64>());
            assert_eq!(
                sum.join().unwrap(),
                content.iter().map(|&b| b as u64).sum::<u64>()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn line_aligned_blocks_keep_their_bytes_across_the_threshold() {
        use std::alloc::{GlobalAlloc, Layout};
        let a = super::LineAligned;
        let min = super::LINE_ALIGNED_MIN_BYTES;
        let aligned = |p: *mut u8| (p as usize).is_multiple_of(64);
        // Sizes below, at and above the threshold, growing and shrinking through it, each
        // step keeping the bytes both sizes share; large blocks always on a line boundary.
        let sizes = [
            100,
            min - 1,
            min,
            3 * min + 5,
            40 << 20,
            min + 1,
            7,
            1 << 20,
            1,
        ];
        for align in [1, 4, 16, 128] {
            let mut layout = Layout::from_size_align(sizes[0], align).unwrap();
            // SAFETY: a non-zero size; the block is released below with its layout.
            let mut p = unsafe { a.alloc(layout) };
            assert!(!p.is_null());
            let fill = |p: *mut u8, n: usize| {
                // SAFETY: `p` holds at least `n` bytes.
                (0..n).for_each(|i| unsafe { *p.add(i) = (i % 251) as u8 })
            };
            fill(p, layout.size());
            for &size in &sizes[1..] {
                // SAFETY: `p` came from `a` with `layout`; `size` is non-zero and small.
                let q = unsafe { a.realloc(p, layout, size) };
                assert!(!q.is_null());
                let kept = layout.size().min(size);
                // SAFETY: `q` holds at least `kept` bytes.
                let bytes = unsafe { std::slice::from_raw_parts(q, kept) };
                assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
                assert!((q as usize).is_multiple_of(align));
                if size >= min {
                    assert!(aligned(q), "{size} bytes at {q:p}");
                }
                layout = Layout::from_size_align(size, align).unwrap();
                p = q;
                fill(p, size);
            }
            // SAFETY: `p` came from `a` with `layout`.
            unsafe { a.dealloc(p, layout) };
        }
        let layout = Layout::from_size_align(min * 5, 1).unwrap();
        // SAFETY: a non-zero size; released below with the same layout.
        unsafe {
            let z = a.alloc_zeroed(layout);
            assert!(aligned(z));
            assert!(
                std::slice::from_raw_parts(z, layout.size())
                    .iter()
                    .all(|&b| b == 0)
            );
            a.dealloc(z, layout);
        }
    }
}
