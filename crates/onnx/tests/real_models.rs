//! Real ONNX models against onnxruntime: RapidOCR's PP-OCRv4 text detector and recogniser and
//! its direction classifier (`tenet models fetch rapidocr`) on a real-looking page image, and
//! Silero VAD (`tenet models fetch silero-vad`: an LSTM over a sequence, and the streaming
//! export whose `If` on the sample rate is fixed at import) on a chirp with noise — imported
//! with fixed input shapes, run on the CPU backend, inputs and onnxruntime's outputs from
//! `scripts/onnx-reference.py` (with the Python in `TENET_ONNX_PYTHON`), compared within
//! `|tenet − ort| ≤ 1e-4 + 1e-3·|ort|`; and tenet's outputs are bit-identical at 1 and 2
//! threads. Skips without the models or Python, unless `TENET_REQUIRE_ONNX=1`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tenet_ir::{DType, HostTensor, TensorType};
use tenet_models::{WeightSet, WeightsFile};

fn setup(pkg: &tenet_models::fetch::ModelPackage) -> Option<(PathBuf, String)> {
    let require = std::env::var_os("TENET_REQUIRE_ONNX").is_some_and(|v| v == "1");
    let root = tenet_models::fetch::cache_root();
    let dir = tenet_models::fetch::fetched(&root, pkg);
    let python = std::env::var("TENET_ONNX_PYTHON").ok();
    match (dir, python) {
        (Some(d), Some(p)) => Some((d, p)),
        _ => {
            assert!(
                !require,
                "{} or TENET_ONNX_PYTHON missing (TENET_REQUIRE_ONNX=1)",
                pkg.name
            );
            eprintln!(
                "skipped: run `tenet models fetch {}` and set TENET_ONNX_PYTHON",
                pkg.name
            );
            None
        }
    }
}

/// One input of a model: its name, and how `onnx-reference.py` makes it.
enum Feed {
    /// A page image `[n, c, h, w]`.
    Image([u64; 4]),
    /// Audio `[batch, samples]`.
    Audio([u64; 2]),
    /// Zeros of a shape (a recurrent state).
    Zeros(Vec<u64>),
    /// An i64 scalar fixed at import (a sample rate the graph branches on).
    Fixed(i64),
}

fn check(pkg: &tenet_models::fetch::ModelPackage, file: &str, feeds: &[(&str, Feed)]) {
    let Some((dir, python)) = setup(pkg) else {
        return;
    };
    let model = tenet_models::fetch::find_file(&dir, file).expect("the wheel holds the model");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ort-{file}"));
    let spec: serde_json::Map<String, serde_json::Value> = feeds
        .iter()
        .map(|(name, f)| {
            let v = match f {
                Feed::Image(s) => serde_json::json!(["image", s]),
                Feed::Audio(s) => serde_json::json!(["audio", s]),
                Feed::Zeros(s) => serde_json::json!(["zeros", s]),
                Feed::Fixed(v) => serde_json::json!(["int", v]),
            };
            (name.to_string(), v)
        })
        .collect();
    let status = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/onnx-reference.py"))
        .arg(&model)
        .arg(&out)
        .arg("--inputs")
        .arg(serde_json::Value::Object(spec).to_string())
        .status()
        .expect("TENET_ONNX_PYTHON runs");
    assert!(status.success(), "onnx-reference.py failed");

    let mut opts = tenet_onnx::ImportOptions::default();
    let mut inputs = HashMap::new();
    for (name, f) in feeds {
        let shape = match f {
            Feed::Image(s) => s.to_vec(),
            Feed::Audio(s) => s.to_vec(),
            Feed::Zeros(s) => s.clone(),
            Feed::Fixed(v) => {
                opts.fixed
                    .insert(name.to_string(), HostTensor::from_i64(&[], &[*v]).unwrap());
                continue;
            }
        };
        opts.shapes.insert(name.to_string(), shape.clone());
        let ty = TensorType::new(DType::F32, shape);
        let path = out.join(format!("input_{name}.npy"));
        inputs.insert(
            name.to_string(),
            tenet_models::read_tensor(&path, name, &ty).unwrap(),
        );
    }
    let imported = tenet_onnx::import_file(&model, &opts).expect("the model imports");
    let weights = WeightSet(vec![
        WeightsFile::from_bytes(imported.weights.clone().unwrap(), "w").unwrap(),
    ]);
    let mut runs = Vec::new();
    for threads in [1, 2] {
        let options = tenet_devices::Options {
            threads: Some(threads),
            ..Default::default()
        };
        let device = tenet_devices::open("cpu", &options).unwrap();
        let program = device.compile(&imported.graph).unwrap();
        runs.push(program.run(&inputs, &weights, 0).unwrap());
    }
    for ((name, a), (_, b)) in runs[0].iter().zip(&runs[1]) {
        assert_eq!(
            a.bytes(),
            b.bytes(),
            "{file} {name}: 1 and 2 threads differ"
        );
    }
    for (k, (name, got)) in runs[0].iter().enumerate() {
        let want_ty = got.ty().clone();
        let want = tenet_models::read_tensor(&out.join(format!("output_{k}.npy")), name, &want_ty)
            .unwrap();
        let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
        let mut worst = 0f64;
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            let d = (a as f64 - b as f64).abs();
            assert!(
                d <= 1e-4 + 1e-3 * (b as f64).abs(),
                "{file} {name} element {i}: tenet {a}, onnxruntime {b}"
            );
            worst = worst.max(d);
        }
        eprintln!("{file} {name}: largest difference from onnxruntime {worst:e}");
    }
}

use tenet_models::fetch::{RAPIDOCR, SILERO_VAD};

#[test]
fn rapidocr_detector_matches_onnxruntime() {
    check(
        &RAPIDOCR,
        "ch_PP-OCRv4_det_infer.onnx",
        &[("x", Feed::Image([1, 3, 160, 224]))],
    );
}

#[test]
fn rapidocr_recogniser_matches_onnxruntime() {
    check(
        &RAPIDOCR,
        "ch_PP-OCRv4_rec_infer.onnx",
        &[("x", Feed::Image([1, 3, 48, 320]))],
    );
}

#[test]
fn rapidocr_direction_classifier_matches_onnxruntime() {
    check(
        &RAPIDOCR,
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        &[("x", Feed::Image([1, 3, 48, 192]))],
    );
}

#[test]
fn silero_vad_lstm_over_a_sequence_matches_onnxruntime() {
    check(
        &SILERO_VAD,
        "silero_vad_16k_sequence.onnx",
        &[
            ("input", Feed::Audio([8, 576])),
            ("h", Feed::Zeros(vec![1, 1, 128])),
            ("c", Feed::Zeros(vec![1, 1, 128])),
        ],
    );
}

#[test]
fn silero_vad_streaming_with_its_branch_fixed_matches_onnxruntime() {
    check(
        &SILERO_VAD,
        "silero_vad_op18_ifless.onnx",
        &[
            ("input", Feed::Audio([1, 512])),
            ("state", Feed::Zeros(vec![2, 1, 128])),
            ("sr", Feed::Fixed(16000)),
        ],
    );
}
