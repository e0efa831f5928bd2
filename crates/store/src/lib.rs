//! `tenet-store`: content-addressed blobs on disk.
//!
//! A blob is named by the blake3 hash of its bytes. Writes stream into a file under `tmp/`
//! while the hash is computed; only bytes that hash to the promised address are renamed into
//! `blobs/` (after an fsync when the store is durable), so a partial or wrong upload is never
//! visible — also after `kill -9`, because `open` deletes whatever `tmp/` holds. Blobs survive
//! restarts. A disk quota bounds the total; when a new blob needs room, the least recently used
//! unpinned blobs are evicted. Pins are persistent (`pins/` holds one empty file per pinned
//! blob) or transient ([`Hold`], released on drop, for blobs a running job is reading).
//!
//! Room is taken as bytes arrive, never for a length a writer only declared: an upload that
//! promises 2 GiB and sends nothing evicts nothing. Writes in progress together hold at most
//! `max_pending_bytes`, and nothing is evicted for room that eviction could not make.
//!
//! Calls are blocking file I/O, short for the small reads and writes a node does per request.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use tenet_proto::Hash;

/// Limits of a store.
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    /// Total bytes of blobs kept; least recently used unpinned blobs are evicted beyond it.
    pub quota_bytes: u64,
    /// The largest single blob accepted.
    pub max_blob_bytes: u64,
    /// fsync each blob (and its directory) before it becomes visible.
    pub durable: bool,
    /// The most bytes that writes still in progress may hold together (taken as their bytes
    /// arrive); a write beyond it is refused as [`StoreError::Busy`].
    pub max_pending_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            quota_bytes: 8 << 30,
            max_blob_bytes: 2 << 30,
            durable: true,
            max_pending_bytes: 4 << 30,
        }
    }
}

/// How far ahead of the bytes written a writer of known length reserves room, so that the
/// store's lock is taken once per this many bytes rather than once per write.
const RESERVE_STEP: u64 = 4 << 20;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no blob {0}")]
    NotFound(Hash),
    #[error("the bytes hash to {actual}, not to the address {expected} they were sent to")]
    HashMismatch { expected: Hash, actual: Hash },
    #[error("blob of {size} bytes is larger than this store's {max}-byte limit per blob")]
    TooLarge { size: u64, max: u64 },
    #[error("the body ended after {got} of its {declared} declared bytes")]
    Truncated { got: u64, declared: u64 },
    #[error(
        "no room for {needed} more bytes: the {quota}-byte quota is full of pinned or in-use blobs"
    )]
    Full { needed: u64, quota: u64 },
    #[error(
        "uploads in progress already hold {pending} bytes and this store lets them hold {max} together; try again when they finish"
    )]
    Busy { pending: u64, max: u64 },
    #[error("blob store I/O at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

struct Entry {
    size: u64,
    last_used: u64,
    pinned: bool,
    holds: u32,
}

#[derive(Default)]
struct Index {
    blobs: HashMap<Hash, Entry>,
    /// Bytes of stored blobs.
    total: u64,
    /// Bytes promised to writers in progress.
    reserved: u64,
    clock: u64,
}

/// A directory of content-addressed blobs.
pub struct Store {
    root: PathBuf,
    config: StoreConfig,
    index: Mutex<Index>,
    tmp_counter: AtomicU64,
}

/// Counts a store reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub blobs: u64,
    pub bytes: u64,
    pub pinned: u64,
    pub quota: u64,
}

impl Store {
    /// Open (creating if needed) the store at `root`, discarding unfinished writes.
    pub fn open(root: &Path, config: StoreConfig) -> Result<Arc<Store>, StoreError> {
        let blobs = root.join("blobs");
        let tmp = root.join("tmp");
        let pins = root.join("pins");
        for d in [&blobs, &tmp, &pins] {
            fs::create_dir_all(d).map_err(io(d))?;
        }
        // Whatever a killed process left half-written is not a blob.
        for e in fs::read_dir(&tmp).map_err(io(&tmp))? {
            let p = e.map_err(io(&tmp))?.path();
            fs::remove_file(&p).map_err(io(&p))?;
        }
        let mut found = Vec::new();
        for shard in fs::read_dir(&blobs).map_err(io(&blobs))? {
            let shard = shard.map_err(io(&blobs))?.path();
            if !shard.is_dir() {
                continue;
            }
            for e in fs::read_dir(&shard).map_err(io(&shard))? {
                let e = e.map_err(io(&shard))?;
                let name = e.file_name();
                let Some(hash) = name.to_str().and_then(|n| Hash::parse(n).ok()) else {
                    continue;
                };
                let meta = e.metadata().map_err(io(&shard))?;
                found.push((meta.modified().ok(), hash, meta.len()));
            }
        }
        // Oldest first, so the LRU clock starts in the order blobs were last written or used.
        found.sort();
        let mut index = Index::default();
        for (_, hash, size) in found {
            index.clock += 1;
            let pinned = pins.join(hash.to_hex()).exists();
            index.total += size;
            index.blobs.insert(
                hash,
                Entry {
                    size,
                    last_used: index.clock,
                    pinned,
                    holds: 0,
                },
            );
        }
        Ok(Arc::new(Store {
            root: root.to_path_buf(),
            config,
            index: Mutex::new(index),
            tmp_counter: AtomicU64::new(0),
        }))
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock leaves the index consistent (every update is one
        // statement group with no I/O between), so a poisoned lock is still usable.
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the blob `hash` lives (whether or not it exists).
    pub fn path(&self, hash: &Hash) -> PathBuf {
        let hex = hash.to_hex();
        self.root.join("blobs").join(&hex[..2]).join(hex)
    }

    /// The blob's size if the store has it (and mark it used).
    pub fn contains(&self, hash: &Hash) -> Option<u64> {
        let mut ix = self.lock();
        ix.clock += 1;
        let now = ix.clock;
        ix.blobs.get_mut(hash).map(|e| {
            e.last_used = now;
            e.size
        })
    }

    /// Read a whole blob.
    pub fn get(&self, hash: &Hash) -> Result<Vec<u8>, StoreError> {
        if self.contains(hash).is_none() {
            return Err(StoreError::NotFound(*hash));
        }
        let p = self.path(hash);
        fs::read(&p).map_err(|e| match e.kind() {
            // Evicted between the check and the read.
            std::io::ErrorKind::NotFound => StoreError::NotFound(*hash),
            _ => io(&p)(e),
        })
    }

    /// Store `bytes` under `expected`, refusing them if they hash to anything else.
    pub fn put(self: &Arc<Self>, expected: &Hash, bytes: &[u8]) -> Result<bool, StoreError> {
        if self.contains(expected).is_some() {
            if Hash::of(bytes) != *expected {
                return Err(StoreError::HashMismatch {
                    expected: *expected,
                    actual: Hash::of(bytes),
                });
            }
            return Ok(true);
        }
        let mut w = self.writer(*expected, Some(bytes.len() as u64))?;
        w.write(bytes)?;
        w.finish()
    }

    /// Store bytes the caller computed and addressed itself (job outputs): not hashed again,
    /// and not fsynced whatever the store's setting, since they can be recomputed and a crash
    /// losing them loses nothing a caller relied on. Still written to a temporary file and
    /// renamed, so a partial blob is never visible.
    pub fn put_computed(
        self: &Arc<Self>,
        expected: &Hash,
        parts: &[&[u8]],
    ) -> Result<bool, StoreError> {
        if self.contains(expected).is_some() {
            return Ok(true);
        }
        let size = parts.iter().map(|p| p.len() as u64).sum();
        let mut w = self.writer(*expected, Some(size))?;
        w.durable = false;
        w.hasher = None;
        for part in parts {
            w.write(part)?;
        }
        w.finish()
    }

    /// Store `bytes` under their own hash.
    pub fn put_bytes(self: &Arc<Self>, bytes: &[u8]) -> Result<Hash, StoreError> {
        let h = Hash::of(bytes);
        self.put(&h, bytes)?;
        Ok(h)
    }

    /// Start streaming a blob that must hash to `expected`; `declared` is its size if known
    /// (the body must then have exactly that many bytes). Nothing is reserved yet: room is
    /// made as the bytes are written, so a declared length alone evicts nothing.
    pub fn writer(
        self: &Arc<Self>,
        expected: Hash,
        declared: Option<u64>,
    ) -> Result<BlobWriter, StoreError> {
        let max = self.config.max_blob_bytes;
        if let Some(size) = declared {
            if size > max {
                return Err(StoreError::TooLarge { size, max });
            }
            let quota = self.config.quota_bytes;
            if size > quota {
                return Err(StoreError::Full {
                    needed: size,
                    quota,
                });
            }
        }
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp =
            self.root
                .join("tmp")
                .join(format!("{}-{n}-{}", std::process::id(), expected.short()));
        let file = fs::File::create(&tmp).map_err(io(&tmp))?;
        Ok(BlobWriter {
            store: self.clone(),
            expected,
            declared,
            reserved: 0,
            written: 0,
            hasher: Some(blake3::Hasher::new()),
            durable: self.config.durable,
            file: Some(std::io::BufWriter::with_capacity(256 << 10, file)),
            tmp,
        })
    }

    /// Reserve `bytes` more for a write in progress, evicting least recently used unpinned
    /// blobs as needed — and none at all if evicting every one of them would not make room.
    fn make_room(&self, bytes: u64) -> Result<(), StoreError> {
        let mut ix = self.lock();
        let max = self.config.max_pending_bytes;
        if ix.reserved.saturating_add(bytes) > max {
            return Err(StoreError::Busy {
                pending: ix.reserved,
                max,
            });
        }
        let quota = self.config.quota_bytes;
        let over = (ix.total + ix.reserved)
            .saturating_add(bytes)
            .saturating_sub(quota);
        if over == 0 {
            ix.reserved += bytes;
            return Ok(());
        }
        let mut victims: Vec<(u64, Hash, u64)> = ix
            .blobs
            .iter()
            .filter(|(_, e)| !e.pinned && e.holds == 0)
            .map(|(h, e)| (e.last_used, *h, e.size))
            .collect();
        if victims.iter().map(|v| v.2).sum::<u64>() < over {
            return Err(StoreError::Full {
                needed: bytes,
                quota,
            });
        }
        victims.sort_unstable();
        let mut freed = 0;
        for (_, hash, size) in victims {
            if freed >= over {
                break;
            }
            // Removing the file under the lock keeps the index and the disk in step; eviction
            // is rare and unlinking is quick.
            let p = self.path(&hash);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&p)(e)),
            }
            ix.blobs.remove(&hash);
            ix.total -= size;
            freed += size;
        }
        ix.reserved += bytes;
        Ok(())
    }

    /// Keep `hash` across evictions and restarts until `unpin`.
    pub fn pin(&self, hash: &Hash) -> Result<(), StoreError> {
        let p = self.root.join("pins").join(hash.to_hex());
        let mut ix = self.lock();
        let e = ix.blobs.get_mut(hash).ok_or(StoreError::NotFound(*hash))?;
        if !e.pinned {
            fs::File::create(&p).map_err(io(&p))?;
            e.pinned = true;
        }
        Ok(())
    }

    /// Let `hash` be evicted again.
    pub fn unpin(&self, hash: &Hash) -> Result<(), StoreError> {
        let p = self.root.join("pins").join(hash.to_hex());
        let mut ix = self.lock();
        if let Some(e) = ix.blobs.get_mut(hash) {
            e.pinned = false;
        }
        match fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&p)(e)),
            _ => Ok(()),
        }
    }

    /// Keep `hash` from eviction while the returned guard lives.
    pub fn hold(self: &Arc<Self>, hash: &Hash) -> Result<Hold, StoreError> {
        let mut ix = self.lock();
        let e = ix.blobs.get_mut(hash).ok_or(StoreError::NotFound(*hash))?;
        e.holds += 1;
        Ok(Hold {
            store: self.clone(),
            hash: *hash,
        })
    }

    pub fn stats(&self) -> StoreStats {
        let ix = self.lock();
        StoreStats {
            blobs: ix.blobs.len() as u64,
            bytes: ix.total,
            pinned: ix.blobs.values().filter(|e| e.pinned).count() as u64,
            quota: self.config.quota_bytes,
        }
    }
}

/// A transient pin: the blob is not evicted while this lives.
pub struct Hold {
    store: Arc<Store>,
    hash: Hash,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(e) = self.store.lock().blobs.get_mut(&self.hash) {
            e.holds = e.holds.saturating_sub(1);
        }
    }
}

/// A blob being written. Dropping it without `finish` discards the bytes.
pub struct BlobWriter {
    store: Arc<Store>,
    expected: Hash,
    declared: Option<u64>,
    reserved: u64,
    written: u64,
    /// None for bytes whose address the caller computed ([`Store::put_computed`]).
    hasher: Option<blake3::Hasher>,
    durable: bool,
    file: Option<std::io::BufWriter<fs::File>>,
    tmp: PathBuf,
}

impl BlobWriter {
    /// Append bytes.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let after = self.written + bytes.len() as u64;
        let max = self.store.config.max_blob_bytes;
        if after > max {
            return Err(StoreError::TooLarge { size: after, max });
        }
        if let Some(d) = self.declared
            && after > d
        {
            return Err(StoreError::TooLarge {
                size: after,
                max: d,
            });
        }
        if after > self.reserved {
            // Room for the bytes in hand, and with a known length a step more (never past it).
            let target = match self.declared {
                Some(d) => after.max((self.reserved + RESERVE_STEP).min(d)),
                None => after,
            };
            self.store.make_room(target - self.reserved)?;
            self.reserved = target;
        }
        if let Some(h) = self.hasher.as_mut() {
            h.update(bytes);
        }
        if let Some(f) = self.file.as_mut() {
            f.write_all(bytes).map_err(io(&self.tmp))?;
        }
        self.written = after;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Check the hash and make the blob visible. Returns whether the store already had it.
    pub fn finish(mut self) -> Result<bool, StoreError> {
        if let Some(d) = self.declared
            && self.written < d
        {
            return Err(StoreError::Truncated {
                got: self.written,
                declared: d,
            });
        }
        if let Some(h) = &self.hasher {
            let actual: Hash = h.finalize().into();
            if actual != self.expected {
                return Err(StoreError::HashMismatch {
                    expected: self.expected,
                    actual,
                });
            }
        }
        let file = self.file.take().expect("finish runs once");
        let file = file
            .into_inner()
            .map_err(|e| io(&self.tmp)(e.into_error()))?;
        if self.durable {
            file.sync_data().map_err(io(&self.tmp))?;
        }
        drop(file);
        let dest = self.store.path(&self.expected);
        let shard = dest.parent().expect("blob paths have a shard directory");
        fs::create_dir_all(shard).map_err(io(shard))?;
        fs::rename(&self.tmp, &dest).map_err(io(&dest))?;
        if self.durable {
            fs::File::open(shard)
                .and_then(|d| d.sync_all())
                .map_err(io(shard))?;
        }
        let store = self.store.clone();
        let mut ix = store.lock();
        ix.reserved -= self.reserved;
        self.reserved = 0;
        ix.clock += 1;
        let now = ix.clock;
        let existed = ix.blobs.contains_key(&self.expected);
        if existed {
            if let Some(e) = ix.blobs.get_mut(&self.expected) {
                e.last_used = now;
            }
        } else {
            ix.total += self.written;
            ix.blobs.insert(
                self.expected,
                Entry {
                    size: self.written,
                    last_used: now,
                    pinned: false,
                    holds: 0,
                },
            );
        }
        Ok(existed)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
        if self.reserved > 0 {
            self.store.lock().reserved -= self.reserved;
        }
    }
}

#[cfg(test)]
mod tests;
