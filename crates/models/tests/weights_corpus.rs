//! The weights decoders' fuzz corpora (`fuzz/corpus/decode_gguf`, `decode_safetensors`) run
//! through the fuzz targets' own checks in the normal test run, and so do a few thousand
//! deterministic mutations of a valid GGUF and a valid safetensors file: nothing panics, a
//! loaded file was charged no more than the limit, and what it holds is within what it was
//! charged. Seeds named `seed-valid-*` load; `seed-hostile-*` are refused.
//!
//! The generated seeds are the files `weights_build.rs` writes: this test checks they still
//! are, and writes them again with
//! `TENET_WRITE_WEIGHTS_CORPUS=1 cargo test -p tenet-models --test weights_corpus the_corpus`.
//! Other seeds are inputs the fuzzers found (`seed-hostile-fuzz-*`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tenet_models::WeightsFile;
use tenet_models::gguf::GgufFile;

#[path = "common/weights_build.rs"]
mod build;

/// The memory limit the fuzz targets load under (`fuzz/fuzz_targets/decode_*.rs`): small, so
/// that any amplification passes it.
const BUDGET: u64 = 128 << 10;

/// What `fuzz/fuzz_targets/decode_gguf.rs` and `decode_safetensors.rs` do with their input;
/// whether the file loaded.
fn fuzz_one(data: &[u8]) -> bool {
    if let Ok(g) = GgufFile::parse_shared_within(Arc::new(data.to_vec()), BUDGET) {
        assert!(g.header_bytes() <= BUDGET);
        let total = g
            .tensors
            .iter()
            .map(|t| g.dequantized_bytes(t))
            .fold(0u64, u64::saturating_add);
        if total <= BUDGET {
            for t in &g.tensors {
                if let Ok(v) = g.dequantize(t) {
                    assert_eq!(v.shape(), &t.shape[..]);
                }
            }
        }
    }
    match WeightsFile::from_bytes_within(data.to_vec(), "fuzz", BUDGET) {
        Ok(f) => {
            assert!(f.resident_bytes() <= BUDGET);
            let owned: u64 = f
                .tensors
                .keys()
                .filter_map(|n| f.tensor(n))
                .filter(|t| !t.is_shared())
                .map(|t| t.bytes().len() as u64)
                .sum();
            assert!(owned <= f.resident_bytes(), "{owned} held, charged less");
            for (name, info) in &f.tensors {
                if let Some(t) = f.tensor(name) {
                    assert_eq!(t.shape(), &info.shape[..]);
                }
            }
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

/// Every quantised tensor of a file that parses is lent as its blocks, or refused: a view of
/// exactly its own bytes, `[..., cols/32, block_bytes]` for its shape `[..., cols]`, whose
/// values (by the `dequantize` op's definition) are the tensor's dequantised ones. The views
/// cost no memory, so this holds at any size; values are compared while the file's
/// dequantised size is within the fuzz limit.
fn blocks_one(data: &[u8]) {
    let Ok(g) = GgufFile::parse_shared_within(Arc::new(data.to_vec()), BUDGET) else {
        return;
    };
    let total = g
        .tensors
        .iter()
        .map(|t| g.dequantized_bytes(t))
        .fold(0u64, u64::saturating_add);
    for t in &g.tensors {
        let Ok((view, format)) = g.blocks(t) else {
            continue;
        };
        assert_eq!(Some(format), t.kind.format());
        assert!(view.is_shared());
        assert_eq!(view.bytes(), &data[t.range.clone()]);
        let (cols, outer) = t.shape.split_last().unwrap();
        let mut shape = outer.to_vec();
        shape.extend([cols / 32, format.block_bytes()]);
        assert_eq!(view.shape(), &shape[..]);
        if total <= BUDGET {
            let mut values = Vec::new();
            tenet_reference::quant::dequantize_into(format, view.bytes(), &mut values);
            let want = g.dequantize(t).unwrap().to_f32_vec();
            assert!(
                values
                    .iter()
                    .map(|x| x.to_bits())
                    .eq(want.iter().map(|x| x.to_bits())),
                "{}",
                t.name
            );
        }
    }
}

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// The seeds as `weights_build.rs` writes them: (target, file name, bytes).
fn generated() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let g = "decode_gguf";
    let s = "decode_safetensors";
    let mut overlap = build::Gguf::new();
    let at = overlap.data(&build::q4_1_blocks(4));
    overlap.tensor("late", &[64], build::Q4_1, at + 32);
    overlap.tensor("early", &[64], build::Q4_1, at);
    let mut outside = build::Gguf::new();
    let at = outside.data(&[0; 16]);
    outside.tensor("w", &[8], build::F32, at);
    vec![
        (g, "seed-valid-all-types.gguf", build::valid_gguf()),
        (g, "seed-valid-q4_1.gguf", build::q4_1_disjoint(3, 2)),
        (g, "seed-hostile-q4_1-bomb.gguf", build::q4_1_bomb(100, 50)),
        (g, "seed-hostile-overlap.gguf", overlap.finish()),
        (g, "seed-hostile-outside.gguf", outside.finish()),
        (
            g,
            "seed-hostile-metadata-array.gguf",
            build::metadata_bomb(5000),
        ),
        (
            s,
            "seed-valid-small.safetensors",
            build::valid_safetensors(),
        ),
        (
            s,
            "seed-valid-misaligned.safetensors",
            build::misaligned_safetensors(),
        ),
        (
            s,
            "seed-hostile-overlap.safetensors",
            build::overlapping_safetensors(),
        ),
        (
            s,
            "seed-hostile-shape.safetensors",
            build::shape_bomb_safetensors(3000),
        ),
    ]
}

#[test]
fn the_corpus_seeds_are_the_generated_files() {
    let write = std::env::var_os("TENET_WRITE_WEIGHTS_CORPUS").is_some();
    for (target, name, bytes) in generated() {
        let path = corpus(target).join(name);
        if write {
            std::fs::create_dir_all(corpus(target)).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        assert!(bytes.len() <= 8 << 10, "{name}: {} bytes", bytes.len());
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write the seeds with TENET_WRITE_WEIGHTS_CORPUS=1)",
                path.display()
            )
        });
        assert!(
            on_disk == bytes,
            "{name} differs from what weights_build.rs writes"
        );
    }
}

#[test]
fn every_seed_passes_the_fuzz_checks_and_loads_as_its_name_says() {
    for target in ["decode_gguf", "decode_safetensors"] {
        let mut seeds: Vec<PathBuf> = std::fs::read_dir(corpus(target))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        seeds.sort();
        assert!(seeds.len() >= 4, "{target}: {} seeds", seeds.len());
        for path in seeds {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let bytes = std::fs::read(&path).unwrap();
            let loaded = fuzz_one(&bytes);
            blocks_one(&bytes);
            if name.starts_with("seed-valid-") {
                assert!(loaded, "{target}/{name} should load");
            } else if name.starts_with("seed-hostile-") {
                assert!(!loaded, "{target}/{name} should be refused");
            }
        }
    }
}

/// xorshift64: the same mutations on every run.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// `n` mutations of `good`: bytes overwritten, little-endian u64s planted (counts, offsets,
/// dimensions), runs cut out or duplicated.
fn mutate_all(good: &[u8], n: usize, seed: u64) -> usize {
    let mut s = seed;
    let mut loaded = 0;
    for _ in 0..n {
        let mut b = good.to_vec();
        for _ in 0..1 + next(&mut s) % 3 {
            let at = (next(&mut s) % b.len() as u64) as usize;
            match next(&mut s) % 4 {
                0 => b[at] = next(&mut s) as u8,
                1 => {
                    let v = match next(&mut s) % 3 {
                        0 => next(&mut s) % 64,
                        1 => u64::MAX - next(&mut s) % 4,
                        _ => next(&mut s) % (1 << 24),
                    };
                    let end = (at + 8).min(b.len());
                    b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
                }
                2 => {
                    let len = (next(&mut s) % 40) as usize;
                    b.drain(at..(at + len).min(b.len()));
                }
                _ => {
                    let len = (next(&mut s) % 40) as usize;
                    let run = b[at..(at + len).min(b.len())].to_vec();
                    b.splice(at..at, run);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        loaded += fuzz_one(&b) as usize;
        blocks_one(&b);
    }
    loaded
}

#[test]
fn mutated_files_never_panic_or_pass_the_limit() {
    let gguf = mutate_all(&build::valid_gguf(), 3000, 0x9e37_79b9_7f4a_7c15);
    let st = mutate_all(&build::valid_safetensors(), 3000, 0x2545_f491_4f6c_dd1d);
    // Some mutations (of values, not structure) still load, so the checks above ran on them.
    assert!(gguf > 0 && st > 0, "gguf {gguf}, safetensors {st} loaded");
    // Quantised matrices of every format, lent as blocks.
    let quantized = mutate_all(&build::quantized_gguf(), 3000, 0x5851_f42d_4c95_7f2d);
    assert!(quantized > 0, "quantized {quantized} loaded");
    // The hostile seeds, mutated, too.
    mutate_all(&build::q4_1_bomb(100, 50), 1000, 7);
    mutate_all(&build::metadata_bomb(5000), 500, 11);
}
