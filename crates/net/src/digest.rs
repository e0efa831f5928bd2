//! Content addresses of large blobs, hashed on every core. blake3 is a tree hash: aligned
//! power-of-two subtrees of a long input can be hashed independently and their chaining values
//! merged, giving exactly the bits of a one-pass hash (the tests compare with `blake3::hash`).
//! A 4 MiB job output or upload takes ~0.75 ms on one core of this machine kind; on two, about
//! half, off the critical path of every large job.

use blake3::Hasher;
use blake3::hazmat::{ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root};
use tenet_proto::Hash;

/// Below this many bytes one thread hashes the whole blob: handing out work costs more.
const PARALLEL_MIN: usize = 1 << 20;

/// Subtrees per blob handed to the worker pool: enough for two or four cores to share evenly.
const BLOCKS_PER_BLOB: usize = 4;

/// The blake3 hash of `bytes` (in parallel subtrees when large).
pub fn hash(bytes: &[u8]) -> Hash {
    hash_parts(&[bytes])
}

/// The blake3 hash of `parts` joined end to end (a tensor blob's header and its bytes, say),
/// without joining them.
pub fn hash_parts(parts: &[&[u8]]) -> Hash {
    hash_parts_from(parts, PARALLEL_MIN)
}

fn hash_parts_from(parts: &[&[u8]], parallel_min: usize) -> Hash {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total < parallel_min.max(4 * blake3::CHUNK_LEN) {
        let mut h = Hasher::new();
        for p in parts {
            h.update(p);
        }
        return Hash(*h.finalize().as_bytes());
    }
    // Whole blocks of a power-of-two size, a quarter of the blob or less, are subtrees of the
    // blob's tree; the remainder and the parents are hashed here.
    let block = prev_power_of_two(total / BLOCKS_PER_BLOB);
    let mut cvs = vec![[0u8; 32]; total / block];
    let ranges: Vec<_> = (0..cvs.len()).map(|i| i..i + 1).collect();
    tenet_sys::parallel::for_each_piece(&mut cvs, &ranges, |r, out| {
        for (i, cv) in r.zip(out) {
            *cv = subtree(parts, i * block, block);
        }
    });
    let blocks = Blocks { parts, cvs, block };
    let left = left_subtree_len(total as u64) as usize;
    let root = blake3::hazmat::merge_subtrees_root(
        &blocks.cv(0, left),
        &blocks.cv(left, total - left),
        Mode::Hash,
    );
    Hash(*root.as_bytes())
}

fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The chaining value of the subtree of `len` bytes at `start` of the joined parts.
fn subtree(parts: &[&[u8]], start: usize, len: usize) -> ChainingValue {
    let mut h = Hasher::new();
    h.set_input_offset(start as u64);
    let (mut at, end) = (0, start + len);
    for p in parts {
        let (from, to) = (start.max(at), end.min(at + p.len()));
        if from < to {
            h.update(&p[from - at..to - at]);
        }
        at += p.len();
    }
    h.finalize_non_root()
}

/// A blob whose aligned blocks are already hashed.
struct Blocks<'a> {
    parts: &'a [&'a [u8]],
    cvs: Vec<ChainingValue>,
    block: usize,
}

impl Blocks<'_> {
    /// The chaining value of the subtree of `len` bytes at `start`. Every subtree longer than a
    /// block splits at a power of two no smaller than the block, so its pieces stay aligned to
    /// blocks down to the hashed ones.
    fn cv(&self, start: usize, len: usize) -> ChainingValue {
        if len == self.block {
            return self.cvs[start / self.block];
        }
        if len < self.block {
            return subtree(self.parts, start, len);
        }
        let left = left_subtree_len(len as u64) as usize;
        merge_subtrees_non_root(
            &self.cv(start, left),
            &self.cv(start + left, len - left),
            Mode::Hash,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn the_tree_hash_matches_a_one_pass_hash_at_every_awkward_length() {
        let chunk = blake3::CHUNK_LEN;
        for len in [
            0,
            1,
            chunk,
            4 * chunk - 1,
            4 * chunk,
            4 * chunk + 1,
            5 * chunk + 17,
            8 * chunk,
            8 * chunk + 20,
            31 * chunk + 1023,
            64 * chunk + 3,
            100_000,
        ] {
            let data = bytes(len);
            let want = Hash(*blake3::hash(&data).as_bytes());
            // Small thresholds force the tree path for small inputs.
            for split in [0, 1, 20, len / 3, len] {
                let split = split.min(len);
                let parts = [&data[..split], &data[split..]];
                assert_eq!(hash_parts_from(&parts, 0), want, "len {len}, split {split}");
            }
            assert_eq!(hash_parts_from(&[&data], 0), want, "len {len}, one part");
        }
    }

    #[test]
    fn a_large_blob_hashes_as_blake3_does() {
        let data = bytes((4 << 20) + 20);
        let want = Hash(*blake3::hash(&data).as_bytes());
        assert_eq!(hash_parts(&[&data[..20], &data[20..]]), want);
        assert_eq!(hash_parts(&[&data]), want);
    }
}
