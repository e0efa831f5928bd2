//! MiniLM throughput probe (tuning aid): batch 32 × 128 tokens, `RUNS` times (default 3),
//! with the time by step kind and the page faults of each run (a steady run should have none:
//! fresh buffers fault in page by page).
use std::time::Instant;
use tenet_exec::Device;
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
    let backend = tenet_cpu::CpuDevice::auto();
    let p = backend.compile(&graph).unwrap();
    let inputs = tenet_models::minilm::MiniLm::inputs(&batch);
    for _ in 0..std::env::var("RUNS").map_or(3, |v| v.parse().unwrap()) {
        let f0 = minor_faults();
        let t = Instant::now();
        let (_, stats) = p.run_with_stats(&inputs, &m.weights, 0).unwrap();
        let secs = t.elapsed().as_secs_f64();
        for k in &stats.time_by_kind {
            print!("{} {}×{:.1}ms  ", k.kind, k.steps, k.nanos as f64 / 1e6);
        }
        match (f0, minor_faults()) {
            (Some(a), Some(b)) => println!("page faults {}", b - a),
            _ => println!(),
        }
        println!(
            "batch {b}x{s}: {:.1} ms, {:.1} sentences/s, {:.1} GFLOP/s",
            secs * 1e3,
            b as f64 / secs,
            graph.cost().flops as f64 / secs / 1e9
        );
    }
}

/// This process's minor page faults so far (Linux).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(7)?.parse().ok()
}
