//! Fuzz the binary graph decoder: it must never panic, and whatever it accepts must be canonical
//! (re-encode to the same bytes) and survive a trip through the text form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_ir::{codec, text};

fuzz_target!(|data: &[u8]| {
    if let Ok(graph) = codec::decode(data) {
        assert_eq!(graph.to_bytes(), data, "accepted non-canonical bytes");
        let printed = text::print(&graph);
        let reparsed = text::parse(&printed).expect("printed text parses");
        assert_eq!(reparsed.id(), graph.id());
    }
});
