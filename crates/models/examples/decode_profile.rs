//! Where a SmolLM2 decode step's time goes on the CPU: the decode graph (capacity 64, quantised
//! weights) run 45 times, the last 40 timed, its `RunStats` summed by kind of step.
//!
//! `cargo run --release -p tenet-models --example decode_profile [THREADS]` (default 2); needs
//! the model in the cache (`tenet models fetch smollm2`).
use std::collections::HashMap;
use tenet_exec::Device;
use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode, llama_decode_graph};

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    let dir = cached(&SMOLLM2).unwrap();
    let m =
        SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized).unwrap();
    let dev = tenet_cpu::CpuDevice::new(threads, tenet_cpu::SimdLevel::detect());
    let cap = 64;
    let g = llama_decode_graph(&m.config, m.weights.id, cap).unwrap();
    println!("decode graph: {} nodes", g.nodes().len());
    let p = dev.compile(&g).unwrap();
    let c = &m.config;
    let mut inputs = HashMap::new();
    inputs.insert(
        "ids".to_string(),
        tenet_ir::HostTensor::from_i64(&[1], &[42]).unwrap(),
    );
    inputs.insert(
        "pos".to_string(),
        tenet_ir::HostTensor::from_i64(&[1], &[10]).unwrap(),
    );
    for l in 0..c.layers {
        let z = tenet_ir::HostTensor::from_f32(
            &[cap, c.kv_heads, c.hidden / c.heads],
            &vec![0.0; (cap * c.kv_heads * (c.hidden / c.heads)) as usize],
        )
        .unwrap();
        inputs.insert(format!("cache_k{l}"), z.clone());
        inputs.insert(format!("cache_v{l}"), z);
    }
    let mut total: HashMap<&str, (u32, u64)> = HashMap::new();
    let runs = 40;
    let start = std::time::Instant::now();
    for i in 0..runs + 5 {
        let (_, stats) = p.run_with_stats(&inputs, &m.weights, 0).unwrap();
        if i >= 5 {
            for s in stats.time_by_kind {
                let e = total.entry(s.kind).or_default();
                e.0 += s.steps;
                e.1 += s.nanos;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64() / (runs + 5) as f64 * 1e3;
    let mut rows: Vec<_> = total.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let sum: u64 = rows.iter().map(|r| r.1.1).sum();
    println!("threads {threads}: {wall:.3} ms a step wall; by kind (ms a step):");
    for (k, (n, ns)) in rows {
        println!(
            "  {k:<14} {:>5} steps {:>8.3} ms",
            n / runs,
            ns as f64 / runs as f64 / 1e6
        );
    }
    println!("  sum {:.3} ms", sum as f64 / runs as f64 / 1e6);
}
