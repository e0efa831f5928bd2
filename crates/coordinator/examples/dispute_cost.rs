//! What a dispute costs against refereeing the whole job (issue 34's measure): a SmolLM2 prefill
//! job where one party lies at a single op deep inside the graph. Prints the graph's size, the
//! rounds (goal ≤ ⌈log₂ ops⌉ + 2), the bytes the parties sent, the referee's time (goal ≤ 1% of
//! the whole job's) and the whole-job referee's time on this machine's CPU, as the coordinator's
//! fallback referee runs it. Needs SmolLM2 in the cache (`tenet models fetch smollm2`).
//!
//! `cargo run --release -p tenet-coordinator --example dispute_cost -- [TOKENS] [AT]`: the
//! prompt's length (default 16) and where the lie is, as a fraction of the graph (0.7).

use std::collections::HashMap;
use std::time::Instant;

use tenet_coordinator::dispute::{ReferenceParty, settle};
use tenet_ir::HostTensor;
use tenet_models::smollm2::{GGUF_FILE, SmolLm2};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tokens: u64 = args
        .get(1)
        .map_or(16, |s| s.parse().expect("a token count"));
    let at: f64 = args.get(2).map_or(0.7, |s| s.parse().expect("a fraction"));
    let dir = tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2).expect("SmolLM2 fetched");
    let model = SmolLm2::load(&tenet_models::fetch::find_file(&dir, GGUF_FILE).unwrap()).unwrap();
    let graph = model.graph(tokens).unwrap();
    let ids: Vec<i64> = (0..tokens as i64).map(|i| 100 + i * 37).collect();
    let inputs = HashMap::from([(
        "ids".to_string(),
        HostTensor::from_i64(&[tokens], &ids).unwrap(),
    )]);
    let n = graph.nodes().len();
    // The lie: the first computing node at `at` of the graph with bytes to flip.
    let k = (((n as f64) * at) as usize..n)
        .find(|&i| {
            let node = &graph.nodes()[i];
            !node.op.is_source() && node.ty.numel().unwrap_or(0) > 0
        })
        .expect("a computing node") as u32;
    let flip = |t: &mut HostTensor| {
        if let Some(b) = t.bytes_mut() {
            b[0] ^= 1;
        }
    };
    println!(
        "SmolLM2 prefill of {tokens} tokens: {n} ops, {:.2} GFLOP; the liar flips one bit of %{k} ({}, {})",
        graph.cost().flops as f64 / 1e9,
        graph.nodes()[k as usize].op.name(),
        graph.nodes()[k as usize].ty
    );

    let device = tenet_devices::open("cpu", &Default::default()).unwrap();
    let program = device.compile(&graph).unwrap();
    program.run(&inputs, &model.weights, 0).unwrap();
    let started = Instant::now();
    program.run(&inputs, &model.weights, 0).unwrap();
    let whole = started.elapsed();

    let started = Instant::now();
    let honest = ReferenceParty::new(&graph, &inputs, &model.weights, 0, None).unwrap();
    let trace_time = started.elapsed();
    let liar = ReferenceParty::new(&graph, &inputs, &model.weights, 0, Some((k, &flip))).unwrap();
    let started = Instant::now();
    let s = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(settle(&graph, &inputs, &model.weights, 0, &honest, &liar))
        .unwrap();
    let dispute_time = started.elapsed();
    let bound = (n as f64).log2().ceil() as u32 + 2;
    println!(
        "dispute: leaf %{} found, verdict {:?}; {} rounds (goal <= ceil(log2 {n}) + 2 = {bound}), {} bytes from the parties",
        s.transcript.leaf.unwrap_or(u64::MAX),
        s.transcript.verdict,
        s.rounds,
        s.bytes
    );
    println!(
        "referee: {:.3} ms for the one op vs {:.1} ms for the whole job on this CPU: {:.3}% (goal <= 1%)",
        s.referee.as_secs_f64() * 1e3,
        whole.as_secs_f64() * 1e3,
        100.0 * s.referee.as_secs_f64() / whole.as_secs_f64()
    );
    println!(
        "parties' side: a trace by the reference interpreter {:.1} s; the dispute, operands recomputed, {:.1} s",
        trace_time.as_secs_f64(),
        dispute_time.as_secs_f64()
    );
}
