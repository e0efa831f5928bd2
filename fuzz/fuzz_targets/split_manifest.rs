//! Fuzz a split model's manifest (`manifest.json`), as a node or coordinator reads one from a
//! stranger's pipeline deploy. Nothing may panic, and an accepted manifest chains: each
//! stage reads exactly what the stage before writes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_proto::manifest::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse(data) {
        assert!(!m.stages.is_empty());
        assert!(m.stages[0].boundary_in.is_empty());
        assert!(m.stages.last().unwrap().boundary_out.is_empty());
        for w in m.stages.windows(2) {
            assert_eq!(w[0].boundary_out, w[1].boundary_in);
        }
    }
});
