//! Fuzz what a peer decodes from strangers on the peer-to-peer network: node API request
//! frames (CBOR on `/tenet/node/1`) and DHT records offered for storage. The first byte picks
//! which; nothing may panic, and a record that passes the checks is a correctly signed advert.
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
        if let Ok(advert) = tenet_p2p::advert::check_record(&record, 2_000_000_000) {
            assert!(advert.verify());
        }
    }
});
