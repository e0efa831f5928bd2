//! Hostile input: mutated encodings and texts never panic, and every failure is a typed error
//! that points inside the input. Anything accepted must be canonical.

use tenet_ir::testing::{Rng, random_graph};
use tenet_ir::*;

const INTERESTING_U32: [u32; 8] = [0, 1, 2, 7, 255, 0x7fff_ffff, 0xffff_fffe, u32::MAX];

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        if bytes.is_empty() {
            bytes.push(rng.next_u64() as u8);
            continue;
        }
        let at = rng.below(bytes.len() as u64) as usize;
        match rng.below(7) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 => {
                let v = rng.pick(&INTERESTING_U32).to_le_bytes();
                for (i, b) in v.iter().enumerate() {
                    if let Some(x) = bytes.get_mut(at + i) {
                        *x = *b;
                    }
                }
            }
            3 => bytes.truncate(at),
            4 => {
                let n = 1 + rng.below(8) as usize;
                bytes.splice(at..at, (0..n).map(|_| rng.next_u64() as u8));
            }
            5 => {
                let end = (at + 1 + rng.below(16) as usize).min(bytes.len());
                bytes.drain(at..end);
            }
            _ => {
                let end = (at + 1 + rng.below(32) as usize).min(bytes.len());
                let chunk = bytes[at..end].to_vec();
                let to = rng.below(bytes.len() as u64) as usize;
                bytes.splice(to..to, chunk);
            }
        }
    }
}

#[test]
fn ten_thousand_binary_mutations() {
    let pool: Vec<Vec<u8>> = (0..64).map(|s| random_graph(s, 20).to_bytes()).collect();
    let mut rng = Rng(0x7e4e7);
    let (mut rejected, mut accepted) = (0, 0);
    for _ in 0..10_000 {
        let mut bytes = rng.pick(&pool).clone();
        mutate(&mut rng, &mut bytes);
        match codec::decode(&bytes) {
            Ok(g) => {
                // A mutation that still decodes must be a different canonical encoding.
                assert_eq!(g.to_bytes(), bytes, "accepted non-canonical bytes");
                accepted += 1;
            }
            Err(e) => {
                assert!(
                    e.offset <= bytes.len() as u64,
                    "offset {} beyond input: {e}",
                    e.offset
                );
                assert!(!e.to_string().is_empty());
                rejected += 1;
            }
        }
    }
    assert!(
        rejected > 9000,
        "only {rejected} rejected, {accepted} accepted"
    );
}

#[test]
fn every_truncation_is_refused() {
    let bytes = random_graph(3, 25).to_bytes();
    for n in 0..bytes.len() {
        let err = codec::decode(&bytes[..n]).unwrap_err();
        assert!(err.offset <= n as u64);
    }
}

fn mutate_text(rng: &mut Rng, text: &mut String) {
    const PIECES: [&str; 16] = [
        "%",
        "(",
        ")",
        "[",
        "]",
        ",",
        "=",
        ":",
        "\"",
        "\n",
        "#",
        "-1",
        "99999999999999999999",
        "f32",
        "nan:0x",
        "é",
    ];
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(chars.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if at < chars.len() => {
                chars.remove(at);
            }
            1 => {
                let piece = rng.pick(&PIECES);
                for (i, c) in piece.chars().enumerate() {
                    chars.insert(at + i, c);
                }
            }
            2 if at < chars.len() => chars[at] = (b'0' + rng.below(10) as u8) as char,
            _ => chars.truncate(at),
        }
    }
    *text = chars.into_iter().collect();
}

#[test]
fn ten_thousand_text_mutations() {
    let pool: Vec<String> = (0..64).map(|s| text::print(&random_graph(s, 20))).collect();
    let mut rng = Rng(0x7e47);
    let mut rejected = 0;
    for _ in 0..10_000 {
        let mut src = rng.pick(&pool).clone();
        mutate_text(&mut rng, &mut src);
        match text::parse(&src) {
            Ok(g) => {
                let canonical = text::print(&g);
                assert_eq!(text::parse(&canonical).unwrap().id(), g.id());
            }
            Err(e) => {
                let lines = src.split('\n').count();
                assert!(
                    e.line >= 1 && e.line <= lines,
                    "line {} of {lines}: {e}",
                    e.line
                );
                assert!(e.column >= 1);
                rejected += 1;
            }
        }
    }
    assert!(rejected > 5000, "only {rejected} rejected");
}

#[test]
fn random_bytes_are_refused() {
    let mut rng = Rng(42);
    for len in [0usize, 1, 7, 8, 10, 14, 100, 1000] {
        for _ in 0..50 {
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if rng.chance(50) && len >= 10 {
                bytes[..8].copy_from_slice(codec::MAGIC);
                bytes[8..10].copy_from_slice(&1u16.to_le_bytes());
            }
            assert!(decode_any(&bytes).is_err());
        }
    }
}
