//! The fuzz corpus of checkpoints (`fuzz/corpus/train_checkpoint`) and mutations of it, through
//! the checks of `cargo fuzz run train_checkpoint`: seeds named `refused` are refused, the
//! others accepted; no mutation panics; whatever is accepted writes back to a file that reads
//! the same.

use std::path::Path;

use tenet_train::Checkpoint;

fn check(bytes: &[u8]) -> bool {
    match Checkpoint::from_bytes(bytes, "corpus") {
        Ok(ck) => {
            let again = Checkpoint::from_bytes(&ck.to_bytes().unwrap(), "again").unwrap();
            assert_eq!(again.meta, ck.meta);
            assert_eq!(again.tensors.len(), ck.tensors.len());
            for ((n1, t1), (n2, t2)) in again.tensors.iter().zip(&ck.tensors) {
                assert_eq!((n1, t1.bytes()), (n2, t2.bytes()));
            }
            true
        }
        Err(_) => false,
    }
}

#[test]
fn the_fuzz_corpus_and_its_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/train_checkpoint");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 6, "the corpus lost its seeds");
    for (name, bytes) in &seeds {
        assert_eq!(check(bytes), !name.contains("refused"), "{name}");
    }
    let diverged = seeds.iter().find(|(n, _)| n.contains("diverged")).unwrap();
    let ck = Checkpoint::from_bytes(&diverged.1, "diverged").unwrap();
    assert!(ck.history.loss[1].is_nan(), "a null loss reads back as NaN");
    let iters: u64 = std::env::var("TENET_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..iters {
        let mut bytes = seeds[(i as usize) % seeds.len()].1.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 3 {
                0 => bytes[at] ^= 1 << (next() % 8),
                1 => bytes[at] = next() as u8,
                _ => bytes.truncate(at.max(1)),
            }
        }
        check(&bytes);
    }
}
