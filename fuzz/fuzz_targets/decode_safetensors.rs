//! Fuzz the safetensors decoder as weights from a stranger meet it (`WeightsFile`, which also
//! recognises GGUF by its magic). Nothing may panic, a loaded file must stay within the small
//! memory limit, and may hold no more than it was charged (copies of misaligned tensors). The
//! seeds (`corpus/decode_safetensors/seed-*`) pass through the same checks in the normal test
//! run (`crates/models/tests/weights_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_models::WeightsFile;

/// Small, so that any amplification passes it.
const BUDGET: u64 = 128 << 10;

fuzz_target!(|data: &[u8]| {
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
        for (name, info) in &f.tensors {
            if let Some(t) = f.tensor(name) {
                assert_eq!(t.shape(), &info.shape[..]);
            }
        }
    }
});
