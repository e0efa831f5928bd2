//! The fuzz corpus of what a peer decodes from strangers (`fuzz/corpus/p2p_frames`, inputs of
//! `cargo fuzz run p2p_frames`: the first byte picks a node API request frame or a DHT record)
//! and mutations of it, through that target's checks: nothing panics, the well-formed seeds
//! decode, the malformed ones are refused, and no record — advert or validator's score record
//! — passes without a valid signature.

use std::path::Path;

use tenet_p2p::advert::record_from_parts;
use tenet_p2p::epoch::{NetworkSpec, ScoreRecord, Use};
use tenet_p2p::swarm::{Checked, check_any};
use tenet_p2p::wire::{MAX_HEADERS, decode_request_frame};

/// What the fuzz target does with one input: whether it was accepted.
fn check(data: &[u8]) -> bool {
    let Some((&pick, rest)) = data.split_first() else {
        return false;
    };
    if pick % 2 == 0 {
        match decode_request_frame(rest) {
            Ok(raw) => {
                assert!(raw.headers.len() <= MAX_HEADERS);
                true
            }
            Err(_) => false,
        }
    } else {
        let (key, value) = match rest.iter().position(|&b| b == 0) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let spec = NetworkSpec::fuzz();
        match check_any(
            &record_from_parts(key, value),
            Some(&spec),
            NetworkSpec::FUZZ_NOW_MS,
            Use::Store,
        ) {
            Ok(Checked::Advert(a)) => {
                assert!(a.verify());
                true
            }
            Ok(Checked::Score(ScoreRecord::Commit(c))) => {
                assert!(c.verify());
                true
            }
            Ok(Checked::Score(ScoreRecord::Reveal(r))) => {
                assert!(r.verify());
                true
            }
            Err(_) => false,
        }
    }
}

#[test]
fn the_fuzz_corpus_and_its_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/p2p_frames");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 8, "the corpus lost its seeds");
    for (name, bytes) in &seeds {
        let accepted = check(bytes);
        let want = name == "seed-request-info"
            || name == "seed-request-job"
            || name == "seed-record-score-commit";
        assert_eq!(accepted, want, "{name}");
    }
    // The score-commit seed is what the fuzz validator signs (regenerate it from here).
    let key = tenet_proto::auth::KeyPair::from_seed([7; 32]);
    let spec = NetworkSpec::fuzz();
    let now = NetworkSpec::FUZZ_NOW_MS;
    let commit = tenet_p2p::epoch::ScoreCommit::sign(
        &key,
        spec.epoch_at(now).unwrap(),
        tenet_proto::Hash::of(b"scores"),
        tenet_proto::Hash::of(b"seed"),
        now,
    );
    let record = ScoreRecord::Commit(commit).record(&spec, now).unwrap();
    let mut seed = vec![1u8];
    seed.extend_from_slice(record.key.as_ref());
    seed.push(0);
    seed.extend_from_slice(&record.value);
    let path = dir.join("seed-record-score-commit");
    if std::env::var_os("TENET_WRITE_SEEDS").is_some() {
        std::fs::write(&path, &seed).unwrap();
    }
    assert_eq!(std::fs::read(&path).unwrap(), seed, "the seed is stale");
    // A frame the codec itself wrote decodes to what was sent.
    let sent = tenet_p2p::wire::Request {
        method: "PUT".into(),
        path: "/v1/blobs/ab".into(),
        headers: vec![("x-tenet-nonce".into(), "00".into())],
        body: tenet_p2p::wire::Blob(vec![1u8, 2, 3].into()),
    };
    let frame = tenet_p2p::wire::encode_request_frame(sent.clone());
    let got = decode_request_frame(&frame).unwrap();
    assert_eq!(
        (got.path.as_str(), &got.body[..]),
        ("/v1/blobs/ab", &[1u8, 2, 3][..])
    );

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
        let (_, seed) = &seeds[(next() % seeds.len() as u64) as usize];
        let mut data = seed.clone();
        for _ in 0..1 + next() % 4 {
            let r = next();
            match r % 4 {
                0 if !data.is_empty() => {
                    let at = (next() % data.len() as u64) as usize;
                    data[at] = (r >> 8) as u8;
                }
                1 if !data.is_empty() => data.truncate((next() % data.len() as u64) as usize),
                2 => data.insert((next() % (data.len() as u64 + 1)) as usize, (r >> 16) as u8),
                _ => data.extend_from_slice(&seed[..seed.len().min(8)]),
            }
        }
        // A mutated record never passes: a valid signature cannot be made by chance.
        if check(&data) && data.first().is_some_and(|b| b % 2 == 1) {
            panic!("mutation {i} passed the record checks");
        }
    }
}
