//! `tenet bench onnx`: imported ONNX models against onnxruntime in the same run — RapidOCR's
//! PP-OCRv4 text detector and recogniser and its direction classifier (`tenet models fetch
//! rapidocr`), the same input, the same thread counts, medians of repeated runs after a warm-up.
//! onnxruntime runs through `python3` (or `TENET_PYTHON`); where it cannot, its column is
//! empty and says why. Each row also reports the largest difference between the two outputs,
//! so a fast wrong answer cannot pass unseen.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use tenet_ir::{DType, HostTensor};

/// The models measured: file name in the wheel, tenet's label, input shape.
pub const MODELS: [(&str, &str, [u64; 4]); 3] = [
    (
        "ch_PP-OCRv4_det_infer.onnx",
        "rapidocr det",
        [1, 3, 480, 640],
    ),
    (
        "ch_PP-OCRv4_rec_infer.onnx",
        "rapidocr rec",
        [1, 3, 48, 320],
    ),
    (
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "rapidocr cls",
        [1, 3, 48, 192],
    ),
];

/// What to measure.
pub struct OnnxBenchOptions {
    pub threads: Vec<usize>,
    /// Timed runs per model and thread count (after one untimed).
    pub reps: usize,
    pub python: String,
}

/// One model at one thread count.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub shape: [u64; 4],
    pub threads: usize,
    pub tenet_ms: f64,
    /// `None` with [`Row::onnxruntime_note`] saying why.
    pub onnxruntime_ms: Option<f64>,
    pub onnxruntime_note: Option<String>,
    /// Largest |tenet − onnxruntime| over the first output.
    pub max_abs_diff: Option<f64>,
}

impl Row {
    /// tenet's time over onnxruntime's (below 1: tenet is faster).
    pub fn ratio(&self) -> Option<f64> {
        self.onnxruntime_ms.map(|o| self.tenet_ms / o)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "shape": self.shape,
            "threads": self.threads,
            "tenet_ms": self.tenet_ms,
            "onnxruntime_ms": self.onnxruntime_ms,
            "onnxruntime_note": self.onnxruntime_note,
            "ratio": self.ratio(),
            "max_abs_diff": self.max_abs_diff,
        })
    }
}

const SCRIPT: &str = r#"
import json, sys, time
spec = json.loads(sys.argv[1])
try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(json.dumps({"unavailable": str(e)}))
    sys.exit(0)
x = np.load(spec["input"])
out = {"version": "onnxruntime " + ort.__version__, "threads": {}}
for t in spec["threads"]:
    o = ort.SessionOptions()
    o.intra_op_num_threads = t
    o.inter_op_num_threads = 1
    s = ort.InferenceSession(spec["model"], o, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    y = s.run(None, {name: x})[0]
    times = []
    for _ in range(spec["reps"]):
        a = time.perf_counter()
        s.run(None, {name: x})
        times.append((time.perf_counter() - a) * 1e3)
    times.sort()
    np.save(spec["output"], y)
    out["threads"][str(t)] = times[len(times) // 2]
print(json.dumps(out))
"#;

/// A page-like image in RapidOCR's normalisation: a light gradient with dark bars.
fn page(shape: [u64; 4]) -> HostTensor {
    let [n, c, h, w] = shape;
    let mut v = Vec::with_capacity((n * c * h * w) as usize);
    for _ in 0..n * c {
        for y in 0..h {
            for x in 0..w {
                let line = (y / 8) % 3 == 1 && (x / 5) % 4 != 3;
                let ink = if line {
                    40.0
                } else {
                    225.0 + 20.0 * x as f32 / w as f32
                };
                v.push((ink / 255.0 - 0.5) / 0.5);
            }
        }
    }
    HostTensor::from_f32(&shape, &v).expect("sized to the shape")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run every model at every thread count, tenet and onnxruntime.
pub fn run(opts: &OnnxBenchOptions) -> Result<Vec<Row>, String> {
    let root = tenet_models::fetch::cache_root();
    let dir =
        tenet_models::fetch::fetched(&root, &tenet_models::fetch::RAPIDOCR).ok_or_else(|| {
            "RapidOCR is not in the model cache; run `tenet models fetch rapidocr` first"
                .to_string()
        })?;
    let tmp = std::env::temp_dir().join(format!("tenet-bench-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (file, name, shape) in MODELS {
        let model = tenet_models::fetch::find_file(&dir, file)
            .ok_or_else(|| format!("{file} is missing from the RapidOCR wheel"))?;
        let mut options = tenet_onnx::ImportOptions::default();
        options.shapes.insert("x".into(), shape.to_vec());
        let imported = tenet_onnx::import_file(&model, &options).map_err(|e| e.to_string())?;
        let weights = match &imported.weights {
            Some(b) => tenet_models::WeightSet(vec![
                tenet_models::WeightsFile::from_bytes(b.clone(), name)
                    .map_err(|e| e.to_string())?,
            ]),
            None => tenet_models::WeightSet(Vec::new()),
        };
        let x = page(shape);
        let input = tmp.join(format!("{}.npy", file));
        std::fs::write(&input, tenet_models::npy_bytes(&x)?).map_err(|e| e.to_string())?;
        let inputs = HashMap::from([("x".to_string(), x)]);
        let peer_out = tmp.join(format!("{file}.out.npy"));
        let peer = onnxruntime(
            &opts.python,
            &model,
            &input,
            &peer_out,
            &opts.threads,
            opts.reps,
        );
        for &threads in &opts.threads {
            let device = tenet_devices::open(
                "cpu",
                &tenet_devices::Options {
                    threads: Some(threads),
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?;
            let program = device.compile(&imported.graph).map_err(|e| e.to_string())?;
            let first = program
                .run(&inputs, &weights, 0)
                .map_err(|e| e.to_string())?;
            let mut times = Vec::new();
            for _ in 0..opts.reps {
                let t = Instant::now();
                program
                    .run(&inputs, &weights, 0)
                    .map_err(|e| e.to_string())?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let (ort_ms, note, diff) = match &peer {
                Ok(by_threads) => (
                    by_threads.get(&threads).copied(),
                    None,
                    max_diff(&first[0].1, &peer_out),
                ),
                Err(why) => (None, Some(why.clone()), None),
            };
            rows.push(Row {
                name: name.to_string(),
                shape,
                threads,
                tenet_ms: median(times),
                onnxruntime_ms: ort_ms,
                onnxruntime_note: note,
                max_abs_diff: diff,
            });
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(rows)
}

/// Largest |tenet − onnxruntime| over the first output.
fn max_diff(ours: &HostTensor, theirs: &Path) -> Option<f64> {
    let t = tenet_models::read_tensor(
        theirs,
        "y",
        &tenet_ir::TensorType::new(DType::F32, ours.shape().to_vec()),
    )
    .ok()?;
    Some(
        ours.to_f32_vec()
            .iter()
            .zip(t.to_f32_vec())
            .map(|(&a, b)| (a as f64 - b as f64).abs())
            .fold(0.0, f64::max),
    )
}

/// onnxruntime's median milliseconds per thread count, or why it could not run.
fn onnxruntime(
    python: &str,
    model: &Path,
    input: &Path,
    output: &Path,
    threads: &[usize],
    reps: usize,
) -> Result<HashMap<usize, f64>, String> {
    let spec = serde_json::json!({
        "model": model.to_string_lossy(),
        "input": input.to_string_lossy(),
        "output": output.to_string_lossy(),
        "threads": threads,
        "reps": reps.max(1),
    });
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(spec.to_string())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    parse(python, out.status.success(), &out.stdout, &out.stderr)
}

/// Read the peer's output: its last line holds one JSON object.
fn parse(
    python: &str,
    success: bool,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<HashMap<usize, f64>, String> {
    let v = crate::peer::result(
        "onnxruntime",
        "pip install onnxruntime, or set TENET_ONNX_PYTHON",
        python,
        success,
        stdout,
        stderr,
    )?;
    let mut by = HashMap::new();
    for (t, ms) in v["threads"]
        .as_object()
        .ok_or("onnxruntime output has no threads")?
    {
        match (t.parse::<usize>(), ms.as_f64()) {
            (Ok(t), Some(ms)) if ms.is_finite() && ms > 0.0 => {
                by.insert(t, ms);
            }
            _ => return Err(format!("onnxruntime output: bad timing {t:?}: {ms}")),
        }
    }
    Ok(by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_peers_timings_after_any_chatter() {
        let out = b"warning: something\n{\"version\": \"onnxruntime 1.31.1\", \"threads\": {\"1\": 72.5, \"2\": 37.25}}\n";
        let by = parse("python3", true, out, b"").unwrap();
        assert_eq!(by[&1], 72.5);
        assert_eq!(by[&2], 37.25);
    }

    #[test]
    fn says_why_the_peer_could_not_run() {
        let e = parse(
            "py",
            true,
            b"{\"unavailable\": \"No module named 'onnxruntime'\"}",
            b"",
        )
        .unwrap_err();
        assert!(
            e.contains("not importable by py") && e.contains("No module named"),
            "{e}"
        );
        let e = parse("py", false, b"", b"Traceback\nValueError: bad model\n").unwrap_err();
        assert!(e.contains("ValueError: bad model"), "{e}");
        let e = parse("py", true, b"{\"threads\": {\"1\": -3}}", b"").unwrap_err();
        assert!(e.contains("bad timing"), "{e}");
        assert!(parse("py", true, b"nothing", b"").is_err());
    }
}
