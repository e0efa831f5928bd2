//! Fuzz what a node decodes from strangers before trusting anything: job and batch bodies,
//! tensor blobs, and signature and MAC headers. Nothing may panic, and an accepted tensor blob must be
//! canonical (re-encode to the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_proto::auth::{AuthHeaders, KeyPair};
use tenet_proto::tensor;
use tenet_proto::wire::{Batch, RunJob};

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<RunJob>(data);
    let _ = serde_json::from_slice::<Batch>(data);
    if let Ok(t) = tensor::decode(data) {
        assert_eq!(tensor::encode(&t), data, "accepted a non-canonical tensor blob");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let values: Vec<&str> = text.splitn(5, '\n').collect();
        // The fifth line as a signature, then as a MAC (checked under a fixed session key).
        let mut names = tenet_proto::auth::HEADER_NAMES;
        for fifth in [tenet_proto::auth::SIGNATURE_HEADER, tenet_proto::auth::MAC_HEADER] {
            names[4] = fifth;
            let parsed = AuthHeaders::from_headers(|name| {
                names.iter().position(|n| *n == name).and_then(|i| values.get(i).copied())
            });
            if let Ok(h) = parsed {
                let _ = h.verify("POST", "/v1/jobs", h.timestamp, 30);
                let server = KeyPair::from_seed([7; 32]);
                if let Some(session) = server.session_key(&h.key) {
                    let _ = h.verify_mac(&session, "POST", "/v1/jobs", h.timestamp, 30);
                }
            }
        }
    }
});
