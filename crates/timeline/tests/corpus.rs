//! The fuzz corpus of event logs (`fuzz/corpus/timeline_logs`, inputs of `cargo fuzz run
//! timeline_logs`: logs split at NUL bytes) and mutations of it, through that target's checks:
//! nothing panics, the fixtures read, and whatever is read draws as SVG and as a PNG.

use std::path::Path;

use tenet_timeline::{Limits, Style, from_sources, render_png, render_svg};

/// What the fuzz target does with one input: whether it was read.
fn check(data: &[u8], png: bool) -> bool {
    let logs: Vec<(&str, &[u8])> = data
        .split(|&b| b == 0)
        .take(8)
        .map(|part| ("corpus.jsonl", part))
        .collect();
    match from_sources(&logs, &Limits::default()) {
        Ok(t) => {
            let svg = render_svg(&t, &Style::default());
            assert!(
                svg.starts_with("<svg") || svg.starts_with("<?xml"),
                "{}",
                &svg[..40.min(svg.len())]
            );
            if png {
                let bytes = render_png(&t, &Style::default());
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            }
            true
        }
        Err(_) => false,
    }
}

#[test]
fn the_fuzz_corpus_and_its_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/timeline_logs");
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
        // Every seed but the empty log reads (lines that are not events are skipped).
        assert_eq!(check(bytes, true), !name.contains("empty"), "{name}");
    }
    let iters: u64 = std::env::var("TENET_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..iters {
        let mut bytes = seeds[(i as usize) % seeds.len()].1.clone();
        if bytes.is_empty() {
            bytes.push(b'{');
        }
        for _ in 0..1 + next() % 6 {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 4 {
                0 => bytes[at] ^= 1 << (next() % 8),
                1 => {
                    let alphabet = b"{}[]\":,0123456789e-\n\0";
                    bytes[at] = alphabet[(next() % alphabet.len() as u64) as usize];
                }
                2 => bytes.truncate(at.max(1)),
                _ => {
                    let line = bytes[at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(bytes.len(), |n| at + n);
                    let copy = bytes[at..line].to_vec();
                    bytes.splice(at..at, copy);
                }
            }
        }
        check(&bytes, i % 100 == 0);
    }
}
