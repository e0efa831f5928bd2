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
