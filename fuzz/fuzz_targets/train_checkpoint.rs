//! Fuzz a training checkpoint, as `tenet train --resume` reads one somebody else wrote.
//! Nothing may panic, and an accepted checkpoint writes back to a file that reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_train::Checkpoint;

fuzz_target!(|data: &[u8]| {
    if let Ok(ck) = Checkpoint::from_bytes(data, "fuzz") {
        let again = Checkpoint::from_bytes(&ck.to_bytes().unwrap(), "again").unwrap();
        assert_eq!(again.meta, ck.meta);
        assert_eq!(again.tensors.len(), ck.tensors.len());
    }
});
