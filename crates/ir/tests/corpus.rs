//! The fuzz corpus seeds stay valid as the format evolves, and pass the fuzz targets' checks.

use std::path::Path;

use tenet_ir::{codec, text};

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("seed-")
        })
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

#[test]
fn binary_seeds_decode_canonically() {
    let seeds = seeds("decode_graph");
    assert!(seeds.len() >= 10);
    for (name, bytes) in seeds {
        let g = codec::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(g.to_bytes(), bytes, "{name}");
        assert_eq!(
            text::parse(&text::print(&g)).unwrap().id(),
            g.id(),
            "{name}"
        );
    }
}

#[test]
fn text_seeds_are_canonical() {
    let seeds = seeds("parse_text");
    assert!(seeds.len() >= 10);
    for (name, bytes) in seeds {
        let src = String::from_utf8(bytes).unwrap();
        let g = text::parse(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(text::print(&g), src, "{name}");
    }
}
