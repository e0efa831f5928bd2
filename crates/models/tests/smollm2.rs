//! SmolLM2 through tenet against tests/fixtures/smollm2_greedy.json (a copy of
//! shared/models/fixtures/smollm2_greedy.json, made by
//! shared/models/reference/smollm2_numpy.py): prompt ids, last-position logits, top-5 and the
//! greedy 12 tokens. Needs the model in the cache (`tenet models fetch smollm2`); without it the
//! test says it was skipped.

use std::path::Path;

use tenet_cpu::CpuDevice;
use tenet_models::fetch::{SMOLLM2, find_file};
use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode, argmax};

mod common;

#[test]
fn prompt_top5_and_greedy_tokens_match_the_reference() {
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    // A copy of shared/models/fixtures/smollm2_greedy.json, kept with the tests.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2_greedy.json");
    let Ok(text) = std::fs::read_to_string(&fixture) else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: fixture {} not found",
            fixture.display()
        );
        return;
    };
    let m = SmolLm2::load(&find_file(&dir, GGUF_FILE).unwrap()).unwrap();
    let backend = CpuDevice::auto();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (prompt, want) in v.as_object().unwrap() {
        let u32s = |k: &str| {
            want[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect::<Vec<_>>()
        };
        let ids = m.encode(prompt).unwrap();
        assert_eq!(ids, u32s("ids"), "prompt ids of {prompt:?}");
        let logits = m.next_logits(&ids, &backend).unwrap();
        for (i, w) in want["last_logits_first5"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            assert!(
                (logits[i] as f64 - w.as_f64().unwrap()).abs() < 1e-3,
                "logit {i} of {prompt:?}"
            );
        }
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        assert_eq!(&order[..5], &u32s("top5")[..], "top-5 after {prompt:?}");
        assert_eq!(
            m.greedy(&ids, 12, &backend).unwrap(),
            u32s("greedy12"),
            "greedy continuation of {prompt:?}"
        );
    }
}

#[test]
fn decoding_with_the_kv_cache_equals_recomputing() {
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let m = SmolLm2::load(&find_file(&dir, GGUF_FILE).unwrap()).unwrap();
    let backend = CpuDevice::auto();
    let prompt = m.encode("Once upon a time, there was a little").unwrap();
    // Logits after the prefill and after each decode step (the cache resident in device
    // buffers, one compiled program per capacity) are the same bits as recomputing the whole
    // sequence with a graph of its length.
    let mut session = m.session(&backend);
    let mut logits = session.prefill(&prompt).unwrap();
    let mut all = prompt.clone();
    for (i, next) in [1838u32, 253, 29, 7042].into_iter().enumerate() {
        let recomputed = m.next_logits(&all, &backend).unwrap();
        assert!(
            logits
                .iter()
                .zip(&recomputed)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "cached logits differ from recomputed ones after {i} steps"
        );
        all.push(next);
        logits = session.step(next).unwrap();
        assert_eq!(session.len(), all.len() as u64);
    }
    // And whole greedy continuations agree.
    assert_eq!(
        m.greedy_cached(&prompt, 8, &backend).unwrap(),
        m.greedy(&prompt, 8, &backend).unwrap()
    );
}

/// A session moves to a larger capacity (past 64 positions) without changing a bit.
#[test]
fn decoding_across_a_capacity_bucket_equals_recomputing() {
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let m = SmolLm2::load(&find_file(&dir, GGUF_FILE).unwrap()).unwrap();
    let backend = CpuDevice::auto();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let mut all = m.encode(&text).unwrap();
    assert!(all.len() >= 62);
    all.truncate(62);
    let mut session = m.session(&backend);
    let mut logits = session.prefill(&all).unwrap();
    assert_eq!(session.capacity(), 64);
    for _ in 0..4 {
        let next = tenet_models::smollm2::argmax(&logits);
        all.push(next);
        logits = session.step(next).unwrap();
    }
    assert_eq!(session.capacity(), 128);
    let recomputed = m.next_logits(&all, &backend).unwrap();
    assert!(
        logits
            .iter()
            .zip(&recomputed)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits after moving to a larger capacity differ from recomputed ones"
    );
}

/// Greedy decoding on every other device this machine has (OpenCL: a GPU, or PoCL on the
/// CPU) gives the CPU's logits bit for bit — after the prompt and after every step with the KV
/// cache resident on that device — and so the same tokens. Without an OpenCL device only the
/// CPU runs, unless `TENET_REQUIRE_OPENCL=1`.
#[test]
fn greedy_tokens_and_logits_are_bit_identical_on_every_device() {
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let m = SmolLm2::load(&find_file(&dir, GGUF_FILE).unwrap()).unwrap();
    let prompt = m.encode("The capital of France is").unwrap();
    let steps = 4;
    let trace = |device: &dyn tenet_exec::Device| -> (Vec<u32>, Vec<Vec<u32>>) {
        let mut session = m.session(device);
        let mut logits = session.prefill(&prompt).unwrap();
        let (mut tokens, mut bits) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            bits.push(logits.iter().map(|x| x.to_bits()).collect());
            let next = tenet_models::smollm2::argmax(&logits);
            tokens.push(next);
            logits = session.step(next).unwrap();
        }
        (tokens, bits)
    };
    let (want_tokens, want_bits) = trace(&CpuDevice::auto());
    let mut others = 0;
    for (spec, _) in tenet_devices::list(&Default::default()) {
        if spec == tenet_devices::Spec::Cpu {
            continue;
        }
        let device = tenet_devices::open_spec(spec, &Default::default()).unwrap();
        let (tokens, bits) = trace(device.as_ref());
        assert_eq!(tokens, want_tokens, "{spec}: greedy tokens");
        for (i, (got, want)) in bits.iter().zip(&want_bits).enumerate() {
            assert!(
                got == want,
                "{spec}: logits differ from the CPU's at step {i}"
            );
        }
        others += 1;
    }
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    assert!(
        others > 0 || !required,
        "TENET_REQUIRE_OPENCL=1 but no OpenCL device"
    );
}

/// The fixture's prompt, ids and greedy tokens, or `None` (the test skipped) without the model
/// or the fixture.
fn fixture() -> Option<(std::path::PathBuf, String, Vec<u32>, Vec<u32>)> {
    let dir = common::cached_or_skip(&SMOLLM2)?;
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2_greedy.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: fixture {} not found",
            path.display()
        );
        return None;
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let (prompt, want) = v.as_object().unwrap().iter().next().unwrap();
    let u32s = |k: &str| -> Vec<u32> {
        want[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    Some((
        find_file(&dir, GGUF_FILE).unwrap(),
        prompt.clone(),
        u32s("ids"),
        u32s("greedy12"),
    ))
}

/// With its weights kept quantised (the GGUF's blocks lent from the mapped file, linear layers
/// as `qmatmul`), SmolLM2 holds about the file's size instead of 540 MB, gives the f32 mode's
/// logits bit for bit after the prompt and after each decode step, and so the reference's
/// greedy tokens. (Few steps: until the CPU has a fast `qmatmul`, it runs the reference's.)
#[test]
fn quantized_weights_give_the_f32_logits_and_the_reference_tokens() {
    let Some((gguf, prompt, ids, greedy)) = fixture() else {
        return;
    };
    let q = SmolLm2::load_with(&gguf, WeightsMode::Quantized).unwrap();
    let f = SmolLm2::load_with(&gguf, WeightsMode::F32).unwrap();
    assert_eq!(
        (q.mode(), f.mode()),
        (WeightsMode::Quantized, WeightsMode::F32)
    );
    // 210 Q4_1 matrices and the Q8_0 embedding stay quantised; nothing is copied.
    assert_eq!(q.config.quantized.len(), 211);
    let file = std::fs::metadata(&gguf).unwrap().len();
    assert_eq!(q.weights.owned_bytes(), 0);
    assert!(q.weights.viewed_bytes() < file);
    assert!(f.weights.owned_bytes() > 5 * file);
    assert_eq!(q.encode(&prompt).unwrap(), ids);
    let device = CpuDevice::auto();
    let (mut sq, mut sf) = (q.session(&device), f.session(&device));
    let (mut lq, mut lf) = (sq.prefill(&ids).unwrap(), sf.prefill(&ids).unwrap());
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    // The graph without a cache gives the prefill's bits too.
    assert!(same(&lq, &q.next_logits(&ids, &device).unwrap()));
    let mut tokens = Vec::new();
    for step in 0..=4 {
        assert_eq!(lq.len(), lf.len());
        assert!(
            same(&lq, &lf),
            "quantised and f32 logits differ after {step} decode steps"
        );
        tokens.push(argmax(&lq));
        if step < 4 {
            lq = sq.step(tokens[step]).unwrap();
            lf = sf.step(tokens[step]).unwrap();
        }
    }
    assert_eq!(
        tokens,
        greedy[..tokens.len()],
        "greedy tokens of {prompt:?}"
    );
    assert_eq!(sq.len(), (ids.len() + 4) as u64);
    assert_eq!(sq.capacity(), 64);
}

/// Eight concurrent greedy requests through one continuous batch (prompts of different
/// lengths, some joining while others decode) get exactly the tokens each gets alone.
#[test]
fn eight_concurrent_requests_get_the_tokens_of_eight_sequential_ones() {
    use std::sync::Arc;
    use tenet_exec::Device;
    use tenet_models::smollm2::{Batcher, GenerationEvent, GenerationRequest};
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let model = Arc::new(SmolLm2::load(&find_file(&dir, GGUF_FILE).unwrap()).unwrap());
    let device: Arc<dyn Device> = Arc::new(CpuDevice::auto());
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "1, 2, 3, 4,",
        "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
        "def add(a, b):",
        "The quick brown fox",
        "Water boils at",
        "My favourite food is",
    ];
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .map(|p| GenerationRequest {
            prompt: model.encode(p).unwrap(),
            max_tokens: 6,
            sampling: None,
            first_step: 0,
            stop: vec![],
        })
        .collect();
    let tokens = |rx: std::sync::mpsc::Receiver<GenerationEvent>| -> Vec<u32> {
        let mut out = Vec::new();
        for e in rx {
            match e {
                GenerationEvent::Token(t) => out.push(t),
                GenerationEvent::Done(_) => return out,
                GenerationEvent::Failed(e) => panic!("{e}"),
            }
        }
        panic!("no end")
    };
    let sequential: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            model
                .generate(&r.prompt, r.max_tokens, None, &*device, |_| {})
                .unwrap()
        })
        .collect();
    let batcher = Batcher::start(model.clone(), device.clone(), 8);
    let receivers: Vec<_> = requests.iter().map(|r| batcher.submit(r.clone())).collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        assert_eq!(tokens(rx), sequential[i], "request {i}: {:?}", prompts[i]);
    }
    assert!(batcher.stats().peak_batch > 1, "{:?}", batcher.stats());
}

/// The model cut into stages (`smollm2::stage`), each holding its own caches between tokens,
/// gives the whole model's logits bit for bit after the prompt and after every decode step —
/// across a capacity bucket (62 prompt tokens: the caches grow from 64 to 128 rows) and for
/// uneven cuts — and its argmax token is the greedy token.
#[test]
fn stages_give_the_whole_models_logits() {
    use tenet_models::smollm2::stage::{LocalStages, Stage};
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let m =
        SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized).unwrap();
    let backend = CpuDevice::auto();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let mut prompt = m.encode(&text).unwrap();
    prompt.truncate(62);
    let steps = 4;
    let mut session = m.session(&backend);
    let mut want = vec![session.prefill(&prompt).unwrap()];
    for _ in 0..steps {
        let next = argmax(want.last().unwrap());
        want.push(session.step(next).unwrap());
    }
    let layers = m.config.layers;
    let cuts = [
        Stage::even(&m.config, 3).unwrap(),
        vec![
            Stage { first: 0, end: 1 },
            Stage {
                first: 1,
                end: layers - 1,
            },
            Stage {
                first: layers - 1,
                end: layers,
            },
        ],
    ];
    for stages in cuts {
        let what = format!("{stages:?}");
        let mut local = LocalStages::new(&m, &backend, stages);
        let (mut logits, mut token) = local.feed(&prompt).unwrap();
        for (i, w) in want.iter().enumerate() {
            assert!(
                logits
                    .iter()
                    .zip(w)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: logits differ at step {i}"
            );
            assert_eq!(token, argmax(w), "{what}: token at step {i}");
            if i < steps {
                (logits, token) = local.feed(&[token]).unwrap();
            }
        }
        assert_eq!(local.len(), 62 + steps as u64);
    }
    assert!(Stage::even(&m.config, 0).is_err());
    assert!(Stage::even(&m.config, layers + 1).is_err());
}

/// What a stage's node must hold is its share: every stage graph's certificate (prefill of a
/// prompt, decode at the first capacities) is well under the whole model's, weights included.
#[test]
fn a_stages_certificate_is_its_share_of_the_models() {
    use tenet_models::smollm2::stage::{Stage, stage_decode_graph, stage_prefill_graph};
    use tenet_models::smollm2::{llama_decode_graph, llama_graph};
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let m =
        SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized).unwrap();
    let (cfg, id) = (&m.config, m.weights.id);
    let whole = llama_graph(cfg, id, 0, 16, true)
        .unwrap()
        .cost()
        .peak_bytes
        .max(llama_decode_graph(cfg, id, 128).unwrap().cost().peak_bytes);
    let mut largest = 0;
    for s in Stage::even(cfg, 3).unwrap() {
        for peak in [
            stage_prefill_graph(cfg, id, s, 16, 64)
                .unwrap()
                .cost()
                .peak_bytes,
            stage_decode_graph(cfg, id, s, 128)
                .unwrap()
                .cost()
                .peak_bytes,
        ] {
            largest = largest.max(peak);
        }
    }
    println!("whole {whole} bytes, largest stage {largest} bytes");
    assert!(
        largest * 3 < whole * 2,
        "whole {whole}, largest stage {largest}"
    );
}
