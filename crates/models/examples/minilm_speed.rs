//! MiniLM throughput probe (tuning aid): batch 32 × 128 tokens.
use std::time::Instant;
use tenet_exec::Backend;
fn main() {
    let dir = tenet_models::fetch::cached(&tenet_models::fetch::MINILM).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let m = tenet_models::minilm::MiniLm::load(&dir).unwrap();
    let (b, s) = (32usize, 128usize);
    let batch = tenet_models::minilm::Batch {
        ids: (0..b)
            .map(|i| (0..s).map(|j| (1000 + i * 7 + j) as u32).collect())
            .collect(),
        seq: s,
    };
    let graph = m.graph(b, s).unwrap();
    let backend = tenet_exec::CpuBackend::auto();
    let p = backend.prepare(&graph).unwrap();
    let inputs = tenet_models::minilm::MiniLm::inputs(&batch);
    for _ in 0..3 {
        let t = Instant::now();
        let (_, stats) = p.run_with_stats(&inputs, &m.weights, 0).unwrap();
        let secs = t.elapsed().as_secs_f64();
        for k in &stats.time_by_kind {
            print!("{} {}×{:.1}ms  ", k.kind, k.steps, k.nanos as f64 / 1e6);
        }
        println!();
        println!(
            "batch {b}x{s}: {:.1} ms, {:.1} sentences/s, {:.1} GFLOP/s",
            secs * 1e3,
            b as f64 / secs,
            graph.cost().flops as f64 / secs / 1e9
        );
    }
}
