//! Fuzz what a peer decodes from strangers on the peer-to-peer network: node API request
//! frames (CBOR on `/tenet/node/1`) and DHT records offered for storage — adverts, and
//! validators' score records checked against a fixed network spec and clock. The first byte
//! picks which; nothing may panic, and a record that passes the checks is correctly signed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if pick % 2 == 0 {
        if let Ok(raw) = tenet_p2p::wire::decode_request_frame(rest) {
            assert!(raw.headers.len() <= tenet_p2p::wire::MAX_HEADERS);
        }
    } else {
        let (key, value) = match rest.iter().position(|&b| b == 0) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let record = tenet_p2p::advert::record_from_parts(key, value);
        let spec = tenet_p2p::epoch::NetworkSpec::fuzz();
        let now = tenet_p2p::epoch::NetworkSpec::FUZZ_NOW_MS;
        match tenet_p2p::swarm::check_any(&record, Some(&spec), now, tenet_p2p::epoch::Use::Store) {
            Ok(tenet_p2p::swarm::Checked::Advert(a)) => assert!(a.verify()),
            Ok(tenet_p2p::swarm::Checked::Score(tenet_p2p::epoch::ScoreRecord::Commit(c))) => {
                assert!(c.verify())
            }
            Ok(tenet_p2p::swarm::Checked::Score(tenet_p2p::epoch::ScoreRecord::Reveal(r))) => {
                assert!(r.verify())
            }
            Err(_) => {}
        }
    }
});
