//! Fuzz the GGUF decoder as weights from a stranger meet it: the index and header alone, each
//! tensor dequantised when the whole file fits the limit, and the file loaded as weights.
//! Nothing may panic, the decoded header and a loaded file must stay within the small memory
//! limit, and a loaded file may hold no more than it was charged. The seeds
//! (`corpus/decode_gguf/seed-*`) pass through the same checks in the normal test run
//! (`crates/models/tests/weights_corpus.rs`).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tenet_models::WeightsFile;
use tenet_models::gguf::GgufFile;

/// Small, so that any amplification passes it.
const BUDGET: u64 = 128 << 10;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = GgufFile::parse_shared_within(Arc::new(data.to_vec()), BUDGET) {
        assert!(g.header_bytes() <= BUDGET);
        let total = g
            .tensors
            .iter()
            .map(|t| g.dequantized_bytes(t))
            .fold(0u64, u64::saturating_add);
        if total <= BUDGET {
            for t in &g.tensors {
                if let Ok(v) = g.dequantize(t) {
                    assert_eq!(v.shape(), &t.shape[..]);
                }
            }
        }
    }
    if let Ok(f) = WeightsFile::from_bytes_within(data.to_vec(), "fuzz", BUDGET) {
        assert!(f.resident_bytes() <= BUDGET);
        let owned: u64 = f
            .tensors
            .keys()
            .filter_map(|n| f.tensor(n))
            .filter(|t| !t.is_shared())
            .map(|t| t.bytes().len() as u64)
            .sum();
        assert!(owned <= f.resident_bytes(), "holds more than it was charged");
    }
});
