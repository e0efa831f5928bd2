//! Random graphs covering every op (`tenet_ir::testing`) on the OpenCL device against the
//! reference, bit for bit: outputs, or the same error (a gather index out of range).

mod support;

use proptest::prelude::*;
use tenet_ir::testing::{random_graph, random_io};

use support::{assert_matches, device, hostile_inputs};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn random_graphs_match_the_reference(seed in any::<u64>()) {
        let Some(dev) = device() else {
            return Ok(());
        };
        let graph = random_graph(seed, 25);
        let (inputs, weights) = random_io(&graph, seed ^ 0xabc);
        assert_matches(dev, &graph, &inputs, &weights, seed, "random graph");
        // The same graph on tensors with every dtype's hostile values.
        let inputs = hostile_inputs(&graph, seed ^ 0x5eed);
        assert_matches(dev, &graph, &inputs, &weights, seed, "random graph, hostile inputs");
    }
}

/// Seeds 0..400 in order: the union of their graphs covers every op of the op set, and
/// every one matches the reference.
#[test]
fn seeded_graphs_cover_every_op() {
    let Some(dev) = device() else {
        return;
    };
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..400u64 {
        let graph = random_graph(seed, 25);
        seen.extend(tenet_ir::testing::op_names(&graph));
        let (inputs, weights) = random_io(&graph, seed);
        assert_matches(
            dev,
            &graph,
            &inputs,
            &weights,
            seed,
            &format!("seed {seed}"),
        );
    }
    let all = tenet_ir::testing::every_op_name();
    let missing: Vec<&str> = all.into_iter().filter(|n| !seen.contains(n)).collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
}
