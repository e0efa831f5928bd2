//! Where a training step's time goes: the step graph of a model, run a few times on the CPU,
//! with the time per kind of step (`cargo run --release -p tenet-train --example step_profile
//! -- cnn 28 32`: architecture, image side, batch).

use std::collections::HashMap;
use std::time::Instant;

use tenet_ir::{HostTensor, NoWeights};
use tenet_train::{Arch, Model, Optimizer, StepSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arch = Arch::from_name(args.get(1).map_or("cnn", |s| s.as_str())).expect("mlp or cnn");
    let side: u64 = args.get(2).map_or(28, |s| s.parse().unwrap());
    let batch: u64 = args.get(3).map_or(32, |s| s.parse().unwrap());
    let model = Model::new(arch, &[1, side, side], 10);
    let spec = StepSpec {
        model: model.clone(),
        optimizer: Optimizer::adamw(1e-3),
        batch,
        shards: 1,
    };
    let graph = spec.step().unwrap();
    println!(
        "step graph {}: {} nodes, {:.1} MFLOP",
        graph.id(),
        graph.nodes().len(),
        graph.cost().flops as f64 / 1e6
    );
    let device = tenet_devices::open("cpu", &Default::default()).unwrap();
    let program = device.compile(&graph).unwrap();
    let init = device
        .compile(&tenet_train::step::init_graph(&model).unwrap())
        .unwrap();
    let mut inputs: HashMap<String, HostTensor> = init
        .run(&HashMap::new(), &NoWeights, 1)
        .unwrap()
        .into_iter()
        .collect();
    for p in model.params() {
        for slot in ["m", "v"] {
            let ty = tenet_ir::TensorType::new(tenet_ir::DType::F32, p.shape.clone());
            inputs.insert(
                format!("state/{}/{slot}", p.name),
                HostTensor::zeros(ty).unwrap(),
            );
        }
    }
    let n = (batch * side * side) as usize;
    let x: Vec<f32> = (0..n).map(|i| (i % 13) as f32 / 13.0).collect();
    inputs.insert(
        "x".into(),
        HostTensor::from_f32(&[batch, 1, side, side], &x).unwrap(),
    );
    let y: Vec<i64> = (0..batch as i64).map(|i| i % 10).collect();
    inputs.insert("y".into(), HostTensor::from_i64(&[batch], &y).unwrap());
    inputs.insert("step".into(), HostTensor::from_f32(&[], &[1.0]).unwrap());
    let mut totals: Vec<(String, f64)> = Vec::new();
    let runs = 5;
    let started = Instant::now();
    for _ in 0..runs {
        let (_, stats) = program.run_with_stats(&inputs, &NoWeights, 0).unwrap();
        for t in stats.time_by_kind {
            match totals.iter_mut().find(|(k, _)| *k == t.kind) {
                Some(e) => e.1 += t.nanos as f64 / 1e9,
                None => totals.push((t.kind.to_string(), t.nanos as f64 / 1e9)),
            }
        }
    }
    let per = started.elapsed().as_secs_f64() / runs as f64;
    println!(
        "{:.1} ms a step, {:.2} GFLOP/s",
        per * 1e3,
        graph.cost().flops as f64 / per / 1e9
    );
    totals.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
    for (kind, s) in totals.iter().take(15) {
        println!("  {kind:<28} {:8.2} ms", s / runs as f64 * 1e3);
    }
}
