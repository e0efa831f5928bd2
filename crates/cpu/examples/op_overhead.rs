//! What one small op costs the CPU backend beyond its arithmetic: a chain of `n` elementwise
//! ops on a decode-sized row (576 f32, as SmolLM2's hidden state), each unfusable from the
//! next (every intermediate is also an output of a `max` with the chain's input, so no
//! elementwise fusion joins them), run many times; µs per op. A decode step runs ~1000 such
//! small ops besides its products, so this bounds how much of a token is bookkeeping.
//! `cargo run --release -p tenet-cpu --example op_overhead [n] [threads] [runs]`.

use std::collections::HashMap;
use std::time::Instant;

use tenet_cpu::CpuDevice;
use tenet_exec::Device;
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let n = args.first().copied().unwrap_or(1000);
    let threads = args.get(1).copied().unwrap_or(2);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 576]);
    let w = g.input("w", DType::F32, &[576]);
    let mut y = x.clone();
    for i in 0..n {
        // Alternate an add with a row sum broadcast back: the shapes of a norm's pieces.
        y = if i % 2 == 0 {
            &y + &w
        } else {
            &y * &y.mean(&[-1], true)
        };
    }
    let graph = g.finish(&[("y", &y)]).expect("a graph");
    let device = CpuDevice::new(threads, tenet_cpu::SimdLevel::detect());
    let program = device.compile(&graph).expect("compiles");
    let inputs: HashMap<String, HostTensor> = [
        (
            "x".to_string(),
            HostTensor::from_f32(&[1, 576], &[0.001; 576]).unwrap(),
        ),
        (
            "w".to_string(),
            HostTensor::from_f32(&[576], &[0.0; 576]).unwrap(),
        ),
    ]
    .into();
    for _ in 0..3 {
        program.run(&inputs, &NoWeights, 0).expect("runs");
    }
    let reps = args.get(2).copied().unwrap_or(50);
    let start = Instant::now();
    for _ in 0..reps {
        program.run(&inputs, &NoWeights, 0).expect("runs");
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / (reps * n) as f64;
    println!(
        "{n} small ops ({} graph nodes), {threads} thread(s): {per:.2} µs per op",
        graph.nodes().len()
    );
}
