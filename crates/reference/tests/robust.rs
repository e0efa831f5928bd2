//! The interpreter runs every valid graph on hostile values: no panic, outputs of exactly the
//! declared types, and the same bits on every run.

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_ir::testing::{Rng, random_graph, random_tensor};
use tenet_ir::{HostTensor, Op, WeightsId};
use tenet_reference::{RunError, run};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_graphs_run_deterministically(seed in any::<u64>()) {
        let graph = random_graph(seed, 25);
        let mut rng = Rng(seed ^ 0x5eed);
        let inputs: HashMap<String, HostTensor> = graph
            .inputs()
            .map(|(_, name, ty)| (name.to_string(), random_tensor(&mut rng, ty)))
            .collect();
        let weights: HashMap<(WeightsId, String), HostTensor> = graph
            .weights()
            .filter_map(|(_, op, ty)| match op {
                Op::Weight { file, tensor } => Some(((*file, tensor.clone()), random_tensor(&mut rng, ty))),
                _ => None,
            })
            .collect();
        match run(&graph, &inputs, &weights, seed) {
            Ok(outputs) => {
                for ((name, value), out) in outputs.iter().zip(graph.outputs()) {
                    prop_assert_eq!(name, &out.name);
                    prop_assert_eq!(value.ty(), &graph.node(out.node).ty);
                }
                prop_assert_eq!(run(&graph, &inputs, &weights, seed).unwrap(), outputs);
            }
            // Random indices may fall outside the gathered axis: a typed error, not a panic.
            Err(RunError::IndexOutOfRange { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}
