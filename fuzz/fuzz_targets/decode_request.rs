//! Fuzz what a node decodes from strangers before trusting anything: job and batch bodies,
//! tensor blobs, and signature headers. Nothing may panic, and an accepted tensor blob must be
//! canonical (re-encode to the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_proto::auth::AuthHeaders;
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
        let names = tenet_proto::auth::HEADER_NAMES;
        let parsed = AuthHeaders::from_headers(|name| {
            names.iter().position(|n| *n == name).and_then(|i| values.get(i).copied())
        });
        if let Ok(h) = parsed {
            let _ = h.verify("POST", "/v1/jobs", h.timestamp, 30);
        }
    }
});
