//! Real ONNX models against onnxruntime: RapidOCR's PP-OCRv4 text detector and recogniser and
//! its direction classifier (`tenet models fetch rapidocr`), imported with fixed input shapes,
//! run on the CPU backend on a real-looking page image (`scripts/onnx-reference.py`, which
//! also runs onnxruntime with the Python in `TENET_ONNX_PYTHON`), compared within
//! `|tenet − ort| ≤ 1e-4 + 1e-3·|ort|`; and tenet's outputs are bit-identical at 1 and 2
//! threads. Skips without the model or Python, unless `TENET_REQUIRE_ONNX=1`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tenet_ir::{DType, TensorType};
use tenet_models::{WeightSet, WeightsFile};

fn setup() -> Option<(PathBuf, String)> {
    let require = std::env::var_os("TENET_REQUIRE_ONNX").is_some_and(|v| v == "1");
    let root = tenet_models::fetch::cache_root();
    let dir = tenet_models::fetch::fetched(&root, &tenet_models::fetch::RAPIDOCR);
    let python = std::env::var("TENET_ONNX_PYTHON").ok();
    match (dir, python) {
        (Some(d), Some(p)) => Some((d, p)),
        _ => {
            assert!(
                !require,
                "RapidOCR or TENET_ONNX_PYTHON missing (TENET_REQUIRE_ONNX=1)"
            );
            eprintln!("skipped: run `tenet models fetch rapidocr` and set TENET_ONNX_PYTHON");
            None
        }
    }
}

fn check(file: &str, shape: &[u64]) {
    let Some((dir, python)) = setup() else {
        return;
    };
    let model = tenet_models::fetch::find_file(&dir, file).expect("the wheel holds the model");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ort-{file}"));
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let status = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/onnx-reference.py"))
        .arg(&model)
        .arg(&out)
        .arg(dims.join(","))
        .status()
        .expect("TENET_ONNX_PYTHON runs");
    assert!(status.success(), "onnx-reference.py failed");

    let mut opts = tenet_onnx::ImportOptions::default();
    opts.shapes.insert("x".into(), shape.to_vec());
    let imported = tenet_onnx::import_file(&model, &opts).expect("the model imports");
    let weights = WeightSet(vec![
        WeightsFile::from_bytes(imported.weights.clone().unwrap(), "w").unwrap(),
    ]);
    let ty = TensorType::new(DType::F32, shape.to_vec());
    let x = tenet_models::read_tensor(&out.join("input.npy"), "x", &ty).unwrap();
    let inputs = HashMap::from([("x".to_string(), x)]);
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

#[test]
fn rapidocr_detector_matches_onnxruntime() {
    check("ch_PP-OCRv4_det_infer.onnx", &[1, 3, 160, 224]);
}

#[test]
fn rapidocr_recogniser_matches_onnxruntime() {
    check("ch_PP-OCRv4_rec_infer.onnx", &[1, 3, 48, 320]);
}

#[test]
fn rapidocr_direction_classifier_matches_onnxruntime() {
    check("ch_ppocr_mobile_v2.0_cls_infer.onnx", &[1, 3, 48, 192]);
}
