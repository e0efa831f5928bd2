//! Where a SmolLM2 decode step's time goes on the CPU: the decode graph (capacity 64, quantised
//! weights) run 45 times, the last 40 timed, its `RunStats` summed by kind of step.
//!
//! `cargo run --release -p tenet-models --example decode_profile [THREADS] [BATCH] [MODE]`
//! (default 2 threads, one sequence, `quantized` weights; a batch of more runs the batched
//! decode graph with every member at position 10; MODE is a `WeightsMode`: `q8` for
//! `qmatmul_q8`); needs the model in the cache (`tenet models fetch smollm2`). The last run's
//! slowest steps are listed with their shapes. `BUILD_ONLY=1` instead times building and
//! compiling a 20-token prefill graph (what admitting a request costs before any arithmetic).
use std::collections::HashMap;
use tenet_exec::Device;
use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::smollm2::{
    GGUF_FILE, SmolLm2, WeightsMode, llama_decode_batch_graph, llama_decode_graph, llama_graph,
};

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    let batch: u64 = std::env::args().nth(2).map_or(1, |s| s.parse().unwrap());
    let dir = cached(&SMOLLM2).unwrap();
    let mode: WeightsMode = std::env::args()
        .nth(3)
        .map_or(WeightsMode::Quantized, |s| s.parse().unwrap());
    let m = SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), mode).unwrap();
    let dev = tenet_cpu::CpuDevice::new(threads, tenet_cpu::SimdLevel::detect());
    let cap = 64;
    let built = std::time::Instant::now();
    let g = if batch == 1 {
        llama_decode_graph(&m.config, m.weights.id, cap).unwrap()
    } else {
        llama_decode_batch_graph(&m.config, m.weights.id, batch, cap).unwrap()
    };
    println!(
        "decode graph: {} nodes, built in {:.1} ms",
        g.nodes().len(),
        built.elapsed().as_secs_f64() * 1e3
    );
    if std::env::var_os("BUILD_ONLY").is_some() {
        let t = std::time::Instant::now();
        for _ in 0..200 {
            let g = llama_graph(&m.config, m.weights.id, 0, 20, true).unwrap();
            std::hint::black_box(dev.compile(&g).unwrap());
        }
        println!(
            "a 20-token prefill graph built and compiled: {:.2} ms",
            t.elapsed().as_secs_f64() * 1e3 / 200.0
        );
        return;
    }
    let compile = std::time::Instant::now();
    let p = dev.compile(&g).unwrap();
    println!(
        "compiled in {:.1} ms",
        compile.elapsed().as_secs_f64() * 1e3
    );
    let c = &m.config;
    let mut inputs = HashMap::new();
    let members = batch as usize;
    inputs.insert(
        "ids".to_string(),
        tenet_ir::HostTensor::from_i64(&[batch], &vec![42; members]).unwrap(),
    );
    inputs.insert(
        "pos".to_string(),
        tenet_ir::HostTensor::from_i64(&[batch], &vec![10; members]).unwrap(),
    );
    let suffixes: Vec<String> = if batch == 1 {
        vec![String::new()]
    } else {
        (0..batch).map(|b| format!("_{b}")).collect()
    };
    for (l, sfx) in (0..c.layers).flat_map(|l| suffixes.iter().map(move |s| (l, s))) {
        let z = tenet_ir::HostTensor::from_f32(
            &[cap, c.kv_heads, c.hidden / c.heads],
            &vec![0.0; (cap * c.kv_heads * (c.hidden / c.heads)) as usize],
        )
        .unwrap();
        inputs.insert(format!("cache_k{l}{sfx}"), z.clone());
        inputs.insert(format!("cache_v{l}{sfx}"), z);
    }
    let mut total: HashMap<&str, (u32, u64)> = HashMap::new();
    let runs = 40;
    let start = std::time::Instant::now();
    for i in 0..runs + 5 {
        let (_, stats) = p.run_with_stats(&inputs, &m.weights, 0).unwrap();
        if i == runs + 4 {
            println!("slowest steps of the last run:");
            for (id, kind, ns) in &stats.slowest {
                let node = g.node(*id);
                println!(
                    "  {kind:<10} {:>8.3} ms  {:?}",
                    *ns as f64 / 1e6,
                    node.ty.shape
                );
            }
        }
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
    println!(
        "threads {threads}, batch {batch}, {mode}: {wall:.3} ms a step wall; by kind (ms a step):"
    );
    for (k, (n, ns)) in rows {
        println!(
            "  {k:<14} {:>5} steps {:>8.3} ms",
            n / runs,
            ns as f64 / runs as f64 / 1e6
        );
    }
    println!("  sum {:.3} ms", sum as f64 / runs as f64 / 1e6);
}
