//! Split graphs against whole ones: stages run in order give every output bit for bit (random
//! graphs cut anywhere, on the reference interpreter; real models through a split's folder on
//! the CPU backend), plans respect their limits, and manifests that do not chain are refused.

use std::collections::HashMap;

use tenet_ir::split::{SplitTarget, cut_points, split, split_at};
use tenet_ir::testing::{RandomWeights, Rng, random_graph, random_io};
use tenet_ir::{Graph, HostTensor};

type Outcome = Result<Vec<(String, HostTensor)>, String>;

/// The whole graph and its stages chained, on the reference, with the same seed.
fn whole_and_chained(
    graph: &Graph,
    stages: &[tenet_ir::split::Stage],
    inputs: &HashMap<String, HostTensor>,
    weights: &RandomWeights,
    seed: u64,
) -> (Outcome, Outcome) {
    let whole = tenet_reference::run(graph, inputs, weights, seed).map_err(|e| e.to_string());
    let mut carried: HashMap<String, HostTensor> = HashMap::new();
    let mut results: HashMap<String, HostTensor> = HashMap::new();
    for s in stages {
        let mut ins = std::mem::take(&mut carried);
        for name in &s.inputs {
            ins.insert(name.clone(), inputs[name].clone());
        }
        match tenet_reference::run(&s.graph, &ins, weights, seed) {
            Ok(outs) => {
                for (name, t) in outs {
                    if s.boundary_out.contains(&name) {
                        carried.insert(name, t);
                    } else {
                        results.insert(name, t);
                    }
                }
            }
            Err(e) => return (whole, Err(e.to_string())),
        }
    }
    let chained = graph
        .outputs()
        .iter()
        .map(|o| {
            results
                .remove(&o.name)
                .map(|t| (o.name.clone(), t))
                .ok_or_else(|| format!("{} not produced", o.name))
        })
        .collect();
    (whole, chained)
}

fn same(a: &[(String, HostTensor)], b: &[(String, HostTensor)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((n, x), (m, y))| n == m && x.ty() == y.ty() && x.bytes() == y.bytes())
}

#[test]
fn random_graphs_cut_anywhere_keep_every_bit() {
    let mut checked = 0;
    for seed in 0..300u64 {
        let graph = random_graph(seed, 24);
        let points = cut_points(&graph);
        let mut rng = Rng(seed ^ 0x5eed);
        // Up to three cuts among the places a cut may go (the last point is the end).
        let inner = &points[..points.len() - 1];
        let mut cuts: Vec<usize> = (0..rng.below(4))
            .filter(|_| !inner.is_empty())
            .map(|_| *rng.pick(inner))
            .collect();
        cuts.sort();
        cuts.dedup();
        let stages = split_at(&graph, &cuts).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(stages.len(), cuts.len() + 1);
        // Chained: each stage reads what the stage before writes, the first and last nothing.
        assert!(stages[0].boundary_in.is_empty() && stages.last().unwrap().boundary_out.is_empty());
        for w in stages.windows(2) {
            assert_eq!(w[0].boundary_out, w[1].boundary_in, "seed {seed}");
        }
        let (inputs, weights) = random_io(&graph, seed);
        match whole_and_chained(&graph, &stages, &inputs, &weights, seed) {
            (Ok(w), Ok(c)) => {
                assert!(same(&w, &c), "seed {seed}, cuts {cuts:?}: outputs differ");
                checked += 1;
            }
            // A run the whole graph refuses (a gather out of range) the stages refuse too.
            (Err(_), Err(_)) => {}
            (w, c) => panic!(
                "seed {seed}, cuts {cuts:?}: whole {:?}, stages {:?}",
                w.map(|_| ()),
                c.map(|_| ())
            ),
        }
    }
    assert!(checked > 200, "only {checked} graphs ran");
}

#[test]
fn plans_respect_their_limit_and_stage_count() {
    for seed in 0..60u64 {
        let graph = random_graph(seed, 40);
        let whole = graph.cost().peak_bytes;
        for k in [2usize, 3] {
            let stages = split(&graph, SplitTarget::Stages(k)).unwrap();
            assert!(
                stages.len() <= k,
                "seed {seed}: {} stages for {k}",
                stages.len()
            );
        }
        let limit = whole * 3 / 4;
        match split(&graph, SplitTarget::Memory(limit)) {
            Ok(stages) => {
                for s in &stages {
                    assert!(s.graph.cost().peak_bytes <= limit, "seed {seed}");
                }
            }
            Err(tenet_ir::split::SplitError::TooBig { need, .. }) => assert!(need > limit),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

/// The split of the example MLP (`examples/mlp.tg`) in two: where the cut goes, what crosses
/// it and the stage graphs' ids. A change here changes what deployed pipelines are called:
/// it must be deliberate.
#[test]
fn the_example_split_is_stable() {
    let (graph, _) = tenet_models::examples::mlp().unwrap();
    let stages = split(&graph, SplitTarget::Stages(2)).unwrap();
    let got: Vec<(std::ops::Range<usize>, Vec<String>, String)> = stages
        .iter()
        .map(|s| {
            (
                s.nodes.clone(),
                s.boundary_out.clone(),
                s.graph.id().short(),
            )
        })
        .collect();
    let want = vec![
        (0..4, vec!["%2".to_string()], "11c2a5c17223".to_string()),
        (4..11, vec![], "1a61180b02fe".to_string()),
    ];
    assert_eq!(got, want);
}
