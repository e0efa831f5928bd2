//! Fuzz a generation job's inputs as a node checks them before decoding anything
//! (`tenet_models::generation::parse_inputs`): nothing may panic, and whatever is accepted is
//! within every limit and re-encodes to the same parse. The byte layout is
//! `tenet_models::generation::fuzz_one`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tenet_models::generation::fuzz_one(data);
});
