//! SmolLM2 through tenet against tests/fixtures/smollm2_greedy.json (a copy of
//! shared/models/fixtures/smollm2_greedy.json, made by
//! shared/models/reference/smollm2_numpy.py): prompt ids, last-position logits, top-5 and the
//! greedy 12 tokens. Needs the model in the cache (`tenet models fetch smollm2`); without it the
//! test says it was skipped.

use std::path::Path;

use tenet_cpu::CpuDevice;
use tenet_models::fetch::{SMOLLM2, find_file};
use tenet_models::smollm2::{GGUF_FILE, SmolLm2};

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
    // Logits after prefill + one cached step are the same bits as recomputing both tokens.
    let (_, cache) = m
        .step(&prompt, tenet_models::smollm2::Cache::default(), &backend)
        .unwrap();
    let next = 1838u32;
    let (cached, cache2) = m.step(&[next], cache, &backend).unwrap();
    let mut all = prompt.clone();
    all.push(next);
    let recomputed = m.next_logits(&all, &backend).unwrap();
    assert_eq!(cache2.len, all.len() as u64);
    assert!(
        cached
            .iter()
            .zip(&recomputed)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "cached logits differ from recomputed ones"
    );
    // And whole greedy continuations agree.
    assert_eq!(
        m.greedy_cached(&prompt, 8, &backend).unwrap(),
        m.greedy(&prompt, 8, &backend).unwrap()
    );
}
