//! Times decoding SmolLM2 whole (a `DecodeSession`) against the same model in stages on the
//! same device (`LocalStages`): what the stage graphs themselves cost, apart from any network.
//! `cargo run --release -p tenet-models --example stage_speed [stages] [steps]`.

use std::time::Instant;

use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::smollm2::stage::{LocalStages, Stage};
use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode, argmax};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let (n, steps) = (
        args.first().copied().unwrap_or(3),
        args.get(1).copied().unwrap_or(40),
    );
    let dir = cached(&SMOLLM2).expect("tenet models fetch smollm2");
    let m =
        SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized).unwrap();
    let device = tenet_devices::cpu(&Default::default());
    let prompt = m.encode("Write a story about a dragon who").unwrap();
    for round in 0..2 {
        let mut s = m.session(&device);
        let mut t = argmax(&s.prefill(&prompt).unwrap());
        let start = Instant::now();
        for _ in 0..steps {
            t = argmax(&s.step(t).unwrap());
        }
        let whole = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let mut l = LocalStages::new(&m, &device, Stage::even(&m.config, n).unwrap());
        let (_, mut t) = l.feed(&prompt).unwrap();
        let start = Instant::now();
        for _ in 0..steps {
            t = l.feed(&[t]).unwrap().1;
        }
        let staged = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!("round {round}: whole {whole:.2} ms a token, {n} local stages {staged:.2} ms");
    }
}
