//! Large buffers that fault in as huge pages, and files mapped read-only into memory.
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

/// A global allocator that counts what it hands out, for tests that bound a program's memory:
/// the system allocator underneath, plus the bytes live now, the most live since the last
/// [`Counting::reset_peak`], and the number of allocations. Install it in a test binary with
/// `#[global_allocator] static A: Counting = Counting::new();` (no test needs `unsafe` then).
/// Every thread's allocations count, so a test measuring one operation must keep others idle.
pub struct Counting {
    live: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
    allocations: std::sync::atomic::AtomicU64,
}

impl Counting {
    pub const fn new() -> Counting {
        Counting {
            live: std::sync::atomic::AtomicUsize::new(0),
            peak: std::sync::atomic::AtomicUsize::new(0),
            allocations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes allocated and not yet freed.
    pub fn live(&self) -> usize {
        self.live.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most bytes live at once since the last reset.
    pub fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Start a new peak from the bytes live now; returns them.
    pub fn reset_peak(&self) -> usize {
        let live = self.live();
        self.peak.store(live, std::sync::atomic::Ordering::SeqCst);
        live
    }

    /// Allocations (and reallocations) made so far.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn grew(&self, bytes: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let live = self.live.fetch_add(bytes, SeqCst) + bytes;
        self.peak.fetch_max(live, SeqCst);
        self.allocations.fetch_add(1, SeqCst);
    }
}

impl Default for Counting {
    fn default() -> Counting {
        Counting::new()
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// `GlobalAlloc`'s contract; the counters are plain atomics and never allocate.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on unchanged.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        self.live
            .fetch_sub(layout.size(), std::sync::atomic::Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds `new_size`'s
        // contract.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Count the new block before the old one goes: a moving realloc holds both.
            self.grew(new_size);
            self.live
                .fetch_sub(layout.size(), std::sync::atomic::Ordering::SeqCst);
        }
        p
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
}
