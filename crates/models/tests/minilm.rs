//! MiniLM through tenet against the numpy reference program's outputs
//! (tests/fixtures/minilm_embeddings.json, a copy of shared/models/fixtures', and
//! tests/fixtures/minilm_extra.json, made by
//! shared/models/reference/minilm_numpy.py). Needs the model in the cache
//! (`tenet models fetch minilm`; `.ci/run` fetches it); without it the tests say they were
//! skipped and pass.

use std::path::Path;

use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_models::fetch::MINILM;
use tenet_models::minilm::MiniLm;

mod common;

fn model() -> Option<MiniLm> {
    let dir = common::cached_or_skip(&MINILM)?;
    Some(MiniLm::load(&dir).expect("the fetched model loads"))
}

fn fixtures() -> Vec<(String, Vec<u32>, Vec<f64>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = Vec::new();
    for path in [
        // A copy of shared/models/fixtures/minilm_embeddings.json.
        root.join("tests/fixtures/minilm_embeddings.json"),
        root.join("tests/fixtures/minilm_extra.json"),
    ] {
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("note: fixture {} not found", path.display());
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (s, case) in v.as_object().unwrap() {
            let ids = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let emb = case["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            out.push((s.clone(), ids, emb));
        }
    }
    assert!(out.len() >= 4, "fixtures missing");
    out
}

fn max_err(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn embeddings_match_the_reference_one_by_one_and_batched() {
    let Some(m) = model() else { return };
    let cases = fixtures();
    let backend = CpuDevice::auto();
    // Each sentence alone (no padding).
    for (s, ids, want) in &cases {
        let b = m.tokenize(&[s.as_str()]).unwrap();
        assert_eq!(&b.ids[0], ids, "token ids of {s:?}");
        let got = m.embed(&[s.as_str()], &backend).unwrap();
        let err = max_err(&got[0], want);
        assert!(err <= 1e-5, "{s:?}: max abs error {err:e}");
    }
    // All together: different lengths, so most are padded; padding must not move any of them.
    let sentences: Vec<&str> = cases.iter().map(|(s, _, _)| s.as_str()).collect();
    let got = m.embed(&sentences, &backend).unwrap();
    for ((s, _, want), g) in cases.iter().zip(&got) {
        let err = max_err(g, want);
        assert!(
            err <= 1e-5,
            "{s:?} in a padded batch: max abs error {err:e}"
        );
    }
}

#[test]
fn embeddings_are_bit_identical_across_threads_and_simd_levels() {
    let Some(m) = model() else { return };
    let sentences = [
        "hello world",
        "Grüße aus Zürich",
        "a third, somewhat longer sentence",
    ];
    let first = m
        .embed(&sentences, &CpuDevice::new(1, SimdLevel::Portable))
        .unwrap();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        for threads in [1, 2] {
            let got = m
                .embed(&sentences, &CpuDevice::new(threads, level))
                .unwrap();
            let bits =
                |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&first), "{level:?} × {threads}");
        }
    }
}

/// The same embeddings, bit for bit, on every other device this machine has (OpenCL: a GPU,
/// or PoCL on the CPU) as on the CPU. Without an OpenCL device only the CPU is checked, unless
/// `TENET_REQUIRE_OPENCL=1`.
#[test]
fn embeddings_are_bit_identical_on_every_device() {
    let Some(m) = model() else { return };
    let sentences = [
        "hello world",
        "Grüße aus Zürich",
        "a third, somewhat longer sentence",
    ];
    let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    let want = bits(
        &m.embed(&sentences, &CpuDevice::new(2, SimdLevel::detect()))
            .unwrap(),
    );
    let mut others = 0;
    for (spec, _) in tenet_devices::list(&Default::default()) {
        if spec == tenet_devices::Spec::Cpu {
            continue;
        }
        let device = tenet_devices::open_spec(spec, &Default::default()).unwrap();
        let got = bits(&m.embed(&sentences, device.as_ref()).unwrap());
        assert!(got == want, "{spec}: embeddings differ from the CPU's");
        others += 1;
    }
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    assert!(
        others > 0 || !required,
        "TENET_REQUIRE_OPENCL=1 but no OpenCL device"
    );
}
