//! Fuzz the text parser: it must never panic, and whatever it accepts must print to canonical
//! text that parses back to the same graph.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenet_ir::text;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(graph) = text::parse(src) {
        let printed = text::print(&graph);
        let reparsed = text::parse(&printed).expect("canonical text parses");
        assert_eq!(reparsed, graph);
        assert_eq!(text::print(&reparsed), printed);
    }
});
