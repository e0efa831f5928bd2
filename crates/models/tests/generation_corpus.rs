//! A generation job's inputs, as a stranger may send them to a node: every seed of the fuzz
//! corpus (`fuzz/corpus/decode_generation`) and thousands of mutations of them go through the
//! checks of `cargo fuzz run decode_generation` (`tenet_models::generation::fuzz_one`).
//! Nothing panics; what is accepted is within every limit.

use tenet_models::generation::fuzz_one;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus/decode_generation");
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

#[test]
fn the_corpus_seeds_are_accepted_or_refused_as_named() {
    for (name, bytes) in corpus() {
        assert_eq!(fuzz_one(&bytes), !name.contains("refused"), "{name}");
    }
}

#[test]
fn mutated_inputs_never_panic_and_accepted_ones_are_within_limits() {
    let seeds = corpus();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..20_000 {
        let mut v = seeds[i % seeds.len()].1.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % v.len().max(1);
            match next() % 4 {
                0 if !v.is_empty() => v[at] = next() as u8,
                1 if !v.is_empty() => {
                    v.remove(at);
                }
                2 => v.insert(at.min(v.len()), next() as u8),
                _ if !v.is_empty() => v[at] ^= 1 << (next() % 8),
                _ => {}
            }
        }
        if fuzz_one(&v) {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        accepted > 100 && refused > 100,
        "{accepted} accepted, {refused} refused"
    );
}
