//! Fuzz event logs as `tenet timeline` reads them — a node operator's log is anyone's file:
//! the input is one or more logs split at NUL bytes. Nothing may panic, and whatever is read
//! draws as SVG and PNG of the width asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let logs: Vec<(&str, &[u8])> = data
        .split(|&b| b == 0)
        .take(8)
        .map(|part| ("fuzz.jsonl", part))
        .collect();
    if let Ok(t) = tenet_timeline::from_sources(&logs, &tenet_timeline::Limits::default()) {
        let style = tenet_timeline::Style::default();
        let _ = tenet_timeline::render_svg(&t, &style);
        let png = tenet_timeline::render_png(&t, &style);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
});
