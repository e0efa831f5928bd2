//! The ONNX backend tests, imported and run: the `onnx` wheel's node tests (written out by
//! `scripts/onnx-node-tests.py` with the Python in `TENET_ONNX_PYTHON`), and its
//! pytorch-converted, pytorch-operator and simple models (`tenet models fetch
//! onnx-tests`). Every test must either be refused at import with a clear error, or run and
//! match its stored outputs within the stated tolerance — on the reference interpreter and, bit
//! for bit the same, on the CPU backend. Never a wrong result, never a panic; and every test in
//! `backend_passing.txt` must pass, so support cannot silently shrink. Without the data the
//! suites skip, unless `TENET_REQUIRE_ONNX=1` (set by .ci/run).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use tenet_ir::{DType, HostTensor};
use tenet_models::{WeightSet, WeightsFile};

/// `|got − want| ≤ atol + rtol·|want|` for float outputs. For f32, (1e-6, 1e-3): onnx's own
/// runner uses (1e-7, 1e-3), and tenet's transcendentals differ from numpy's by an ulp or so.
/// Half types round every op's result (docs/OPS.md) where numpy rounds once at the end, so
/// they get a few of their own ulps: f16 (1e-3, 8e-3), bf16 (1e-2, 3e-2).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (1e-3, 8e-3),
        DType::BF16 => (1e-2, 3e-2),
        _ => (1e-6, 1e-3),
    }
}

fn require() -> bool {
    std::env::var_os("TENET_REQUIRE_ONNX").is_some_and(|v| v == "1")
}

/// The node tests, generated once per target directory.
fn node_tests() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TENET_ONNX_NODE_TESTS") {
        return Some(PathBuf::from(dir));
    }
    let python = std::env::var_os("TENET_ONNX_PYTHON")?;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx-node-tests-1.23.2");
    let stamp = dir.join(".complete");
    if !stamp.is_file() {
        let _ = std::fs::remove_dir_all(&dir);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/onnx-node-tests.py");
        let status = Command::new(&python)
            .arg(script)
            .arg(&dir)
            .status()
            .expect("TENET_ONNX_PYTHON runs");
        assert!(status.success(), "onnx-node-tests.py failed: {status}");
        std::fs::write(&stamp, "").unwrap();
    }
    Some(dir)
}

/// One suite of the `onnx` wheel's stored test data.
fn wheel_suite(name: &str) -> Option<PathBuf> {
    let root = tenet_models::fetch::cache_root();
    let dir = tenet_models::fetch::fetched(&root, &tenet_models::fetch::ONNX_TESTS)?;
    Some(dir.join("onnx/backend/test/data").join(name))
}

#[derive(Debug)]
enum Outcome {
    Pass,
    Refused(String),
    Wrong(String),
}

fn read_pb(path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    tenet_onnx::read_tensor_pb(&bytes).map(|(_, t)| t)
}

fn close(got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("got {}, expected {}", got.ty(), want.ty()));
    }
    if !got.dtype().is_float() {
        return if got.bytes() == want.bytes() {
            Ok(())
        } else {
            Err("integer elements differ".into())
        };
    }
    let (atol, rtol) = tolerance(got.dtype());
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            ((a as f64) - (b as f64)).abs() <= atol + rtol * (b as f64).abs()
        };
        if !ok {
            return Err(format!("element {i}: got {a}, expected {b}"));
        }
    }
    Ok(())
}

/// The test's data sets, in order.
fn data_sets(dir: &Path) -> Vec<PathBuf> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    sets
}

/// A data set's `input_K.pb` files, in order, with the names they carry.
fn set_inputs(set: &Path) -> Result<Vec<(String, HostTensor)>, String> {
    let mut out = Vec::new();
    for k in 0.. {
        let path = set.join(format!("input_{k}.pb"));
        if !path.is_file() {
            break;
        }
        let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        out.push(tenet_onnx::read_tensor_pb(&bytes).map_err(|e| format!("input {k}: {e}"))?);
    }
    Ok(out)
}

fn run_case(dir: &Path) -> Outcome {
    let model = dir.join("model.onnx");
    let sets = data_sets(dir);
    match tenet_onnx::import_file(&model, &Default::default()) {
        Ok(imported) => run_sets(&imported, &sets, &[]),
        // Inputs such as axes or sizes must be known at import: fix each one the importer
        // names to the data set's value, as a user would with `tenet import --fix`.
        Err(e) if e.to_string().contains("known when the model is imported") => {
            // (An If's condition, Reshape's shape, Resize's sizes, ...)
            for set in &sets {
                let inputs = match set_inputs(set) {
                    Ok(i) => i,
                    Err(e) => return Outcome::Refused(e),
                };
                let mut opts = tenet_onnx::ImportOptions::default();
                let imported = loop {
                    let message = match tenet_onnx::import_file(&model, &opts) {
                        Ok(i) => break i,
                        Err(e) => e.to_string(),
                    };
                    let named = message
                        .split("--fix \"")
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                        .and_then(|name| inputs.iter().find(|(n, _)| n == name));
                    match named {
                        Some((name, t)) if !opts.fixed.contains_key(name) => {
                            opts.fixed.insert(name.clone(), t.clone());
                        }
                        _ => return Outcome::Refused(message),
                    }
                };
                let fixed: Vec<String> = opts.fixed.keys().cloned().collect();
                let outcome = run_sets(&imported, std::slice::from_ref(set), &fixed);
                if !matches!(outcome, Outcome::Pass) {
                    return outcome;
                }
            }
            Outcome::Pass
        }
        Err(e) => Outcome::Refused(e.to_string()),
    }
}

/// Run the imported graph on each data set (less its `fixed` inputs) and compare.
fn run_sets(imported: &tenet_onnx::Imported, sets: &[PathBuf], fixed: &[String]) -> Outcome {
    let graph = &imported.graph;
    let weights = match &imported.weights {
        Some(bytes) => WeightSet(vec![
            WeightsFile::from_bytes(bytes.clone(), "imported").expect("the importer's file reads"),
        ]),
        None => WeightSet(Vec::new()),
    };
    let input_names: Vec<String> = graph.inputs().map(|(_, n, _)| n.to_string()).collect();
    let device = tenet_devices::open("cpu", &Default::default()).unwrap();
    let program = match device.compile(graph) {
        Ok(p) => p,
        Err(e) => return Outcome::Wrong(format!("the CPU backend cannot compile it: {e}")),
    };
    for set in sets {
        let given = match set_inputs(set) {
            Ok(i) => i,
            Err(e) => return Outcome::Refused(e),
        };
        let given: Vec<(String, HostTensor)> = given
            .into_iter()
            .filter(|(n, _)| !fixed.contains(n))
            .collect();
        let by_name = given.iter().all(|(n, _)| input_names.contains(n));
        let inputs: HashMap<String, HostTensor> = given
            .into_iter()
            .enumerate()
            .filter_map(|(k, (n, t))| {
                let name = if by_name {
                    Some(n)
                } else {
                    input_names.get(k).cloned()
                };
                name.map(|n| (n, t))
            })
            .collect();
        let reference = match tenet_reference::run(graph, &inputs, &weights, 0) {
            Ok(o) => o,
            Err(e) => return Outcome::Wrong(format!("the reference failed: {e}")),
        };
        let fast = match program.run(&inputs, &weights, 0) {
            Ok(o) => o,
            Err(e) => return Outcome::Wrong(format!("the CPU backend failed: {e}")),
        };
        for (k, ((name, r), (_, f))) in reference.iter().zip(&fast).enumerate() {
            if r.bytes() != f.bytes() {
                return Outcome::Wrong(format!(
                    "output {name}: the CPU backend's bits differ from the reference's"
                ));
            }
            let want = match read_pb(&set.join(format!("output_{k}.pb"))) {
                Ok(t) => t,
                Err(e) => return Outcome::Refused(format!("output {k}: {e}")),
            };
            if let Err(e) = close(r, &want) {
                return Outcome::Wrong(format!("output {name}: {e}"));
            }
        }
    }
    Outcome::Pass
}

/// Run every test under `root`; check the outcomes; print and return the tally.
fn suite(label: &str, root: Option<PathBuf>) {
    let Some(root) = root.filter(|r| r.is_dir()) else {
        assert!(
            !require(),
            "{label}: ONNX test data missing (TENET_REQUIRE_ONNX=1)"
        );
        eprintln!("{label}: skipped (no ONNX test data; see crates/onnx/tests/backend.rs)");
        return;
    };
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    let expected = expected_passing(label);
    let mut outcomes = BTreeMap::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let outcome = std::panic::catch_unwind(|| run_case(case))
            .unwrap_or_else(|_| Outcome::Wrong("panicked".into()));
        outcomes.insert(name, outcome);
    }
    let passed: Vec<&String> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Pass))
        .map(|(n, _)| n)
        .collect();
    let wrong: Vec<String> = outcomes
        .iter()
        .filter_map(|(n, o)| match o {
            Outcome::Wrong(e) => Some(format!("{n}: {e}")),
            _ => None,
        })
        .collect();
    let lost: Vec<&String> = expected
        .iter()
        .filter(|n| !matches!(outcomes.get(*n), Some(Outcome::Pass)))
        .collect();
    let report = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("onnx-{label}.txt"));
    let mut text = String::new();
    for (n, o) in &outcomes {
        let line = match o {
            Outcome::Pass => format!("pass    {n}\n"),
            Outcome::Refused(e) => format!("refused {n}: {e}\n"),
            Outcome::Wrong(e) => format!("WRONG   {n}: {e}\n"),
        };
        text.push_str(&line);
    }
    std::fs::write(&report, text).unwrap();
    eprintln!(
        "{label}: {} of {} pass, {} refused, {} wrong (details: {})",
        passed.len(),
        cases.len(),
        cases.len() - passed.len() - wrong.len(),
        wrong.len(),
        report.display()
    );
    let new: Vec<&&String> = passed.iter().filter(|n| !expected.contains(**n)).collect();
    if !new.is_empty() {
        eprintln!(
            "{label}: {} pass but are not in backend_passing.txt: {new:?}",
            new.len()
        );
    }
    assert!(
        wrong.is_empty(),
        "{label}: wrong results:\n{}",
        wrong.join("\n")
    );
    assert!(
        lost.is_empty(),
        "{label}: listed as passing but do not pass: {lost:?}"
    );
}

/// The tests of `label` listed in backend_passing.txt (`label/test_name` lines).
fn expected_passing(label: &str) -> Vec<String> {
    include_str!("backend_passing.txt")
        .lines()
        .filter_map(|l| l.strip_prefix(label)?.strip_prefix('/'))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn node_tests_pass_or_are_refused() {
    suite("node", node_tests());
}

#[test]
fn pytorch_operator_tests_pass_or_are_refused() {
    suite("pytorch-operator", wheel_suite("pytorch-operator"));
}

#[test]
fn pytorch_converted_tests_pass_or_are_refused() {
    suite("pytorch-converted", wheel_suite("pytorch-converted"));
}

#[test]
fn simple_tests_pass_or_are_refused() {
    suite("simple", wheel_suite("simple"));
}
