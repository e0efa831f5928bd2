//! Round trips: binary and text encodings preserve the graph and its id.

use proptest::prelude::*;
use tenet_ir::testing::{op_names, random_graph};
use tenet_ir::*;

fn check_round_trips(g: &Graph) {
    let bytes = g.to_bytes();
    let back = codec::decode(&bytes).expect("canonical bytes decode");
    assert_eq!(&back, g);
    assert_eq!(back.to_bytes(), bytes, "re-encoding changes the bytes");
    assert_eq!(back.id(), g.id());

    let text = text::print(g);
    let parsed = text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&parsed, g, "text round trip changed the graph:\n{text}");
    assert_eq!(
        text::print(&parsed),
        text,
        "text -> graph -> text is not identical"
    );
    assert_eq!(parsed.id(), g.id());
    assert_eq!(decode_any(text.as_bytes()).unwrap().id(), g.id());
    assert_eq!(decode_any(&bytes).unwrap().id(), g.id());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn random_graphs_round_trip(seed in any::<u64>()) {
        check_round_trips(&random_graph(seed, 30));
    }
}

#[test]
fn the_generator_covers_every_op() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..3000 {
        seen.extend(op_names(&random_graph(seed, 30)));
    }
    let all = tenet_ir::testing::every_op_name();
    let missing: Vec<_> = all.iter().filter(|n| !seen.contains(*n)).collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
}

#[test]
fn hand_written_text_with_names_and_comments_parses_to_canonical_form() {
    let src = "# a comment\n\ntenet graph v1\n%x = input(\"x\") : f32[2,3]  # trailing\n%s = sum(%x, keepdim=true, axes=[1]) : f32[2,1]\noutput \"s\" = %s\n";
    let g = text::parse(src).unwrap();
    assert_eq!(
        text::print(&g),
        "tenet graph v1\n%0 = input(\"x\") : f32[2,3]\n%1 = sum(%0, axes=[1], keepdim=true) : f32[2,1]\noutput \"s\" = %1\n"
    );
}
