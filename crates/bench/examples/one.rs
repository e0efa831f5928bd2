//! Run one bench-sized graph repeatedly, for profiling: `one softmax|layernorm|xyz|matmul
//! [threads]`, at the SIMD level `TENET_SIMD` names (detected when unset), `REPS` times
//! (15 when unset).
use std::collections::HashMap;
use tenet_exec::Device;
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights};
fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "softmax".into());
    let threads: usize = std::env::args().nth(2).map_or(2, |s| s.parse().unwrap());
    let g = GraphBuilder::new();
    let side = if which == "matmul" { 2048 } else { 4096 };
    let x = g.input("x", DType::F32, &[side, side]);
    // x*y+z as the bench runs it: three distinct 16M inputs, so three streams are read.
    let (out, names): (_, &[&str]) = match which.as_str() {
        "matmul" => (x.matmul(&x), &["x"]),
        "softmax" => (x.softmax(-1), &["x"]),
        "layernorm" => (x.layer_norm(None, None, 1e-5), &["x"]),
        _ => {
            let y = g.input("y", DType::F32, &[side, side]);
            let z = g.input("z", DType::F32, &[side, side]);
            (&x * &y + &z, &["x", "y", "z"])
        }
    };
    let graph = g.finish(&[("y", &out)]).unwrap();
    let v: Vec<f32> = (0..side * side)
        .map(|i| ((i % 1000) as f32) / 500.0 - 1.0)
        .collect();
    let inputs: HashMap<String, HostTensor> = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                HostTensor::from_f32(&[side, side], &v).unwrap(),
            )
        })
        .collect();
    let p = tenet_devices::cpu(&tenet_devices::Options {
        threads: Some(threads),
        simd: Some(tenet_devices::SimdLevel::from_env().unwrap()),
        ..Default::default()
    })
    .compile(&graph)
    .unwrap();
    for _ in 0..std::env::var("REPS").map_or(15, |s| s.parse().unwrap()) {
        let t = std::time::Instant::now();
        std::hint::black_box(p.run(&inputs, &NoWeights, 0).unwrap());
        eprintln!("{:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    }
}
