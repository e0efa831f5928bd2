//! Disputes settled by bisection on a real job: one data-parallel training shard (the MLP's
//! forward pass, loss, gradients by autodiff), two parties answering from their traces, one of
//! them corrupting a single op's value. The walk finds that op in `depth` rounds, the referee
//! re-runs it alone and names the liar; the transcript replays offline; a party that answers
//! against its own root, or hands over operands that do not check out, loses by rule.

use std::collections::HashMap;

use tenet_coordinator::dispute::{ReferenceParty, TraceParty, settle};
use tenet_ir::{Graph, HostTensor, NoWeights};
use tenet_proto::Hash;
use tenet_proto::trace::{Proof, Verdict, depth_for};
use tenet_train::{Arch, Model, Optimizer, StepSpec};

fn shard_job() -> (Graph, HashMap<String, HostTensor>) {
    let model = Model::new(Arch::Mlp, &[1, 8, 8], 10);
    let spec = StepSpec {
        model: model.clone(),
        optimizer: Optimizer::adamw(1e-3),
        batch: 8,
        shards: 2,
    };
    let graph = spec.shard().unwrap();
    let init = tenet_train::step::init_graph(&model).unwrap();
    let mut inputs: HashMap<String, HostTensor> =
        tenet_reference::run(&init, &HashMap::new(), &NoWeights, 3)
            .unwrap()
            .into_iter()
            .collect();
    let x: Vec<f32> = (0..4 * 64).map(|i| ((i * 7) % 17) as f32 / 17.0).collect();
    inputs.insert("x".into(), HostTensor::from_f32(&[4, 1, 8, 8], &x).unwrap());
    inputs.insert(
        "y".into(),
        HostTensor::from_i64(&[4], &[1, 7, 3, 3]).unwrap(),
    );
    (graph, inputs)
}

fn flip(t: &mut HostTensor) {
    if let Some(b) = t.bytes_mut()
        && !b.is_empty()
    {
        b[0] ^= 1;
    }
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn operands_of(graph: &Graph) -> impl Fn(u64) -> Vec<u64> + '_ {
    move |leaf| {
        graph.nodes()[leaf as usize]
            .op
            .operands()
            .iter()
            .map(|o| u64::from(o.0))
            .collect()
    }
}

#[test]
fn the_walk_finds_the_one_corrupted_op_and_the_referee_names_the_liar() {
    let (graph, inputs) = shard_job();
    let n = graph.nodes().len() as u64;
    let honest = ReferenceParty::new(&graph, &inputs, &NoWeights, 0, None).unwrap();
    // Every computing node deep in the graph whose value has bytes, a few of them.
    let targets: Vec<u32> = (0..n as u32)
        .filter(|&k| {
            let node = &graph.nodes()[k as usize];
            !node.op.is_source() && node.ty.numel().unwrap_or(0) > 0
        })
        .step_by(7)
        .collect();
    assert!(targets.len() >= 5, "{} nodes", n);
    for &k in &targets {
        let corrupt: &(dyn Fn(&mut HostTensor) + Sync) = &flip;
        let liar = ReferenceParty::new(&graph, &inputs, &NoWeights, 0, Some((k, corrupt))).unwrap();
        assert_ne!(liar.root(), honest.root());
        for (swap, lost) in [(false, 1), (true, 0)] {
            let s = if swap {
                block(settle(&graph, &inputs, &NoWeights, 0, &liar, &honest)).unwrap()
            } else {
                block(settle(&graph, &inputs, &NoWeights, 0, &honest, &liar)).unwrap()
            };
            let t = &s.transcript;
            assert_eq!(t.leaf, Some(u64::from(k)), "the first differing node");
            assert_eq!(t.verdict, Verdict::Lost(vec![lost]), "corrupted %{k}");
            assert_eq!(s.rounds, depth_for(n) + 1);
            t.check(Some(&operands_of(&graph))).unwrap();
        }
    }
    // Equal traces: nothing to settle.
    let again = ReferenceParty::new(&graph, &inputs, &NoWeights, 0, None).unwrap();
    let s = block(settle(&graph, &inputs, &NoWeights, 0, &honest, &again)).unwrap();
    assert_eq!(s.transcript.verdict, Verdict::Lost(vec![]));
    assert_eq!(s.rounds, 0);
}

/// A party that makes up its answers: children that do not hash to what it said before
/// (`true`), or operand values other than what it committed to (`false`).
struct MadeUp<'a, P: TraceParty>(&'a P, bool);

impl<P: TraceParty> TraceParty for MadeUp<'_, P> {
    fn root(&self) -> Hash {
        self.0.root()
    }
    async fn children(&self, depth: u32, index: u64) -> Option<(Hash, Hash)> {
        let (l, r) = self.0.children(depth, index).await?;
        // From the third round on.
        Some(if depth >= 2 && self.1 { (r, l) } else { (l, r) })
    }
    async fn leaf(&self, leaf: u64) -> Option<(Proof, HostTensor)> {
        let (proof, mut v) = self.0.leaf(leaf).await?;
        if !self.1 {
            flip(&mut v);
        }
        Some((proof, v))
    }
}

#[test]
fn inconsistent_answers_and_bad_operands_lose_by_rule() {
    let (graph, inputs) = shard_job();
    let honest = ReferenceParty::new(&graph, &inputs, &NoWeights, 0, None).unwrap();
    let corrupt: &(dyn Fn(&mut HostTensor) + Sync) = &flip;
    let k = (graph.nodes().len() / 2) as u32;
    let liar = ReferenceParty::new(&graph, &inputs, &NoWeights, 0, Some((k, corrupt))).unwrap();
    let made_up = MadeUp(&liar, true);
    let s = block(settle(&graph, &inputs, &NoWeights, 0, &honest, &made_up)).unwrap();
    assert_eq!(s.transcript.verdict, Verdict::Lost(vec![1]));
    assert_eq!(s.transcript.leaf, None);
    s.transcript.check(Some(&operands_of(&graph))).unwrap();
    // Party 0 hands over operand values that are not what it committed to: it loses, even
    // though its own leaf was right.
    let bad_values = MadeUp(&honest, false);
    let s = block(settle(&graph, &inputs, &NoWeights, 0, &bad_values, &liar)).unwrap();
    // Party 1's operands decide the op: party 1 computed it wrongly, party 0's operands were
    // not what it committed to. Both lose.
    assert_eq!(s.transcript.verdict, Verdict::Lost(vec![0, 1]));
    assert_eq!(s.transcript.bad_operands, vec![0]);
    s.transcript.check(Some(&operands_of(&graph))).unwrap();
}
