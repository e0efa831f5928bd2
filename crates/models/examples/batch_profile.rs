//! A batched decode step's time as the server sees it: BATCH sessions prefilled with prompts
//! of 16, 17, … tokens of one text, then STEPS calls of [`SmolLm2::step_batch`], each timed
//! (median and fastest); with `BATCHER=1` the same requests through a [`Batcher`] as well,
//! its whole wall time (prefills included), as `tenet bench`'s batching row runs them.
//!
//! `cargo run --release -p tenet-models --example batch_profile [THREADS] [BATCH] [MODE] [STEPS]`
//! (default 2 threads, 8 sessions, `q8`, 31 steps); needs the model in the cache (`tenet models
//! fetch smollm2`).
use std::sync::Arc;

use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::smollm2::{Batcher, GGUF_FILE, GenerationRequest, SmolLm2, WeightsMode, argmax};

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let threads: usize = arg(1).map_or(2, |s| s.parse().unwrap());
    let batch: usize = arg(2).map_or(8, |s| s.parse().unwrap());
    let mode: WeightsMode = arg(3).map_or(WeightsMode::Q8, |s| s.parse().unwrap());
    let steps: usize = arg(4).map_or(31, |s| s.parse().unwrap());
    let dir = cached(&SMOLLM2).unwrap();
    let m = Arc::new(SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), mode).unwrap());
    let dev = Arc::new(tenet_cpu::CpuDevice::new(
        threads,
        tenet_cpu::SimdLevel::detect(),
    ));
    let text = m
        .encode(
            "The history of the printing press begins in the fifteenth century, when a \
             goldsmith in Mainz combined movable metal type, oil-based ink and a wooden press.",
        )
        .unwrap();
    let prompt = |i: usize| text[..(16 + i).min(text.len())].to_vec();
    let mut sessions: Vec<_> = (0..batch).map(|_| m.session(&*dev)).collect();
    let mut next = Vec::new();
    let t = std::time::Instant::now();
    for (i, s) in sessions.iter_mut().enumerate() {
        next.push(argmax(&s.prefill(&prompt(i)).unwrap()));
    }
    println!(
        "{batch} prefills: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut times = Vec::new();
    for _ in 0..steps {
        let t = std::time::Instant::now();
        let mut refs: Vec<_> = sessions.iter_mut().collect();
        let logits = m.step_batch(&mut refs, &next).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        next = logits.iter().map(|l| argmax(l)).collect();
    }
    times.sort_by(f64::total_cmp);
    println!(
        "threads {threads}, batch {batch}, {mode}: step_batch median {:.2} ms, fastest {:.2} (capacity {})",
        times[times.len() / 2],
        times[0],
        sessions[0].capacity()
    );
    drop(sessions);
    if std::env::var_os("BATCHER").is_none() {
        return;
    }
    let batcher = Batcher::start(m.clone(), dev, batch);
    let t = std::time::Instant::now();
    let receivers: Vec<_> = (0..batch)
        .map(|i| {
            batcher.submit(GenerationRequest {
                prompt: prompt(i),
                max_tokens: steps + 1,
                sampling: None,
                first_step: 0,
                stop: vec![],
            })
        })
        .collect();
    for rx in receivers {
        for _ in rx {}
    }
    println!(
        "the same through a Batcher: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
}
