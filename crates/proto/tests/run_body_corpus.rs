//! The coordinator's call body, as a stranger may send it: every seed of the fuzz corpus
//! (`fuzz/corpus/decode_run_body`) and thousands of mutations of them go through the same
//! checks as `cargo fuzz run decode_run_body`. Nothing panics; an accepted body holds every
//! declared input with exactly its declared type.

use tenet_ir::{DType, TensorType};
use tenet_proto::run_body::{RunBodyError, decode_run_json, max_json_body};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode_run_body");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 4, "the corpus lost its seeds");
    seeds
}

/// What the fuzz target checks.
fn check(data: &[u8]) -> Result<(), RunBodyError> {
    let x = TensorType::new(DType::F32, vec![2, 3]);
    let ids = TensorType::new(DType::I64, vec![4]);
    let mask = TensorType::new(DType::Bool, vec![]);
    let half = TensorType::new(DType::F16, vec![0, 2]);
    let inputs = [("x", &x), ("ids", &ids), ("mask", &mask), ("h", &half)];
    let body = decode_run_json(data, &inputs)?;
    assert_eq!(body.inputs.len(), inputs.len());
    for (name, ty) in inputs {
        assert_eq!(body.inputs[name].ty(), ty, "input {name}");
    }
    Ok(())
}

#[test]
fn the_corpus_seeds_decode_as_they_say() {
    for (name, bytes) in corpus() {
        let r = check(&bytes);
        let refused = name.contains("out-of-range") || name.contains("too-many");
        assert_eq!(r.is_err(), refused, "{name}: {r:?}");
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mutated_bodies_never_panic_and_never_pass_with_the_wrong_type() {
    let seeds = corpus();
    let mut rng = Rng(0x5eed_f7e4_e7c3);
    let alphabet = b"{}[]\",:0123456789.e-+ntruefalsnul\\\x00\xff";
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..20_000 {
        let mut v = seeds[i % seeds.len()].1.clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let at = rng.below(v.len());
                    v[at] = alphabet[rng.below(alphabet.len())];
                }
                1 if !v.is_empty() => {
                    let at = rng.below(v.len());
                    v.remove(at);
                }
                2 => {
                    let at = rng.below(v.len() + 1);
                    v.insert(at, alphabet[rng.below(alphabet.len())]);
                }
                3 if !v.is_empty() => {
                    // Repeat a slice: lists grow, nesting deepens.
                    let a = rng.below(v.len());
                    let b = (a + 1 + rng.below(16)).min(v.len());
                    let piece = v[a..b].to_vec();
                    v.splice(a..a, piece);
                }
                _ => v.truncate(rng.below(v.len() + 1)),
            }
        }
        match check(&v) {
            Ok(()) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(
        accepted > 100 && refused > 100,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn deep_nesting_is_refused_without_recursing_into_it() {
    let x = TensorType::new(DType::F32, vec![1]);
    let mut body = br#"{"inputs": {"x": "#.to_vec();
    body.extend(std::iter::repeat_n(b'[', 100_000));
    assert!(body.len() as u64 <= max_json_body([&x]) * 2);
    let e = decode_run_json(&body, &[("x", &x)]);
    assert!(e.is_err());
}
