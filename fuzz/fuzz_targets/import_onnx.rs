//! Fuzz the ONNX importer as a model from a stranger meets it: the protobuf decoder, every
//! tensor's size checks, the op converters and import-time folding, under small limits
//! (`tenet_onnx::fuzz_limits`). Nothing may panic; a model that imports yields a valid graph.
//! The seeds (`corpus/import_onnx/seed-*`) pass through the same call in the normal test run
//! (`crates/onnx/tests/hostile.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(imported) = tenet_onnx::import_bytes(data, None, &tenet_onnx::fuzz_limits()) {
        let g = tenet_ir::codec::decode(&imported.graph.to_bytes()).expect("a valid graph");
        assert_eq!(g.id(), imported.graph.id());
    }
});
