//! The `tenet` binary as a user drives it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tenet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run tenet")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "tenet failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenet-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn compile_then_inspect_json() {
    let out = tmp("matmul.tnt");
    let o = stdout(&tenet(&[
        "compile",
        "examples/matmul.tg",
        "-o",
        out.to_str().unwrap(),
    ]));
    let id_line = o.lines().find(|l| l.starts_with("id ")).unwrap();
    let id = id_line.trim_start_matches("id ");
    assert_eq!(id.len(), 64);

    let json: serde_json::Value = serde_json::from_str(&stdout(&tenet(&[
        "inspect",
        out.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["id"], id);
    assert_eq!(json["inputs"][0]["name"], "a");
    assert_eq!(json["inputs"][1]["shape"], serde_json::json!([1024, 1024]));
    assert_eq!(json["outputs"][0]["name"], "c");
    assert_eq!(json["outputs"][0]["dtype"], "f32");
    assert_eq!(json["weights"], serde_json::json!([]));
    assert_eq!(json["cost"]["flops"], 2u64 * 1024 * 1024 * 1024);
    assert_eq!(json["cost"]["peak_bytes"], 3u64 * 4 * 1024 * 1024);

    // The text form inspected directly gives the same id.
    let from_text: serde_json::Value = serde_json::from_str(&stdout(&tenet(&[
        "inspect",
        "examples/matmul.tg",
        "--json",
    ])))
    .unwrap();
    assert_eq!(from_text["id"], id);
}

#[test]
fn compile_is_reproducible_and_text_round_trips() {
    let a = tmp("mlp-a.tnt");
    let b = tmp("mlp-b.tnt");
    stdout(&tenet(&[
        "compile",
        "examples/mlp.tg",
        "-o",
        a.to_str().unwrap(),
        "--weights",
        "examples/mlp.safetensors",
    ]));
    // Compiling the binary again gives the same bytes.
    stdout(&tenet(&[
        "compile",
        a.to_str().unwrap(),
        "-o",
        b.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let text = stdout(&tenet(&["inspect", a.to_str().unwrap(), "--text"]));
    assert_eq!(
        text,
        std::fs::read_to_string(repo().join("examples/mlp.tg")).unwrap()
    );
}

#[test]
fn inspect_lists_weights_and_cost() {
    let o = stdout(&tenet(&[
        "inspect",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
    ]));
    assert!(
        o.contains("weights: checked against the given files"),
        "{o}"
    );
    assert!(o.contains("fc1.weight"), "{o}");
    assert!(o.contains("peak memory"), "{o}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&tenet(&["inspect", "examples/mlp.tg", "--json"]))).unwrap();
    assert_eq!(json["weights"].as_array().unwrap().len(), 4);
    assert_eq!(json["weights"][0]["name"], "fc1.weight");
    assert_eq!(json["ops"]["matmul"], 2);
}

fn stderr_of_failure(args: &[&str]) -> String {
    let o = tenet(args);
    assert!(!o.status.success(), "expected failure for {args:?}");
    String::from_utf8(o.stderr).unwrap()
}

#[test]
fn bad_inputs_are_clear_errors() {
    let bad = tmp("bad.tg");
    std::fs::write(&bad, "tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = matmul(%0, %0) : f32[2,3]\noutput \"c\" = %1\n").unwrap();
    let e = stderr_of_failure(&["inspect", bad.to_str().unwrap()]);
    assert!(
        e.contains("bad.tg:3:6:") && e.contains("inner dimensions differ"),
        "{e}"
    );

    let trunc = tmp("trunc.tnt");
    let good = tmp("good.tnt");
    stdout(&tenet(&[
        "compile",
        "examples/matmul.tg",
        "-o",
        good.to_str().unwrap(),
    ]));
    std::fs::write(&trunc, &std::fs::read(&good).unwrap()[..30]).unwrap();
    let e = stderr_of_failure(&["inspect", trunc.to_str().unwrap()]);
    assert!(e.contains("byte ") && e.contains("truncated"), "{e}");

    let e = stderr_of_failure(&["inspect", "examples/mlp.safetensors"]);
    assert!(e.contains("pass it with --weights"), "{e}");

    // An LLM's options on a graph's deploy, and an arithmetic there is not (before any
    // coordinator is asked).
    let e = stderr_of_failure(&["deploy", "examples/mlp.tg", "--arithmetic", "q8"]);
    assert!(e.contains("add --model smollm2"), "{e}");
    let e = stderr_of_failure(&["deploy", "--model", "smollm2", "--arithmetic", "q4"]);
    assert!(e.contains("exact") && e.contains("q8"), "{e}");

    let e = stderr_of_failure(&[
        "inspect",
        "examples/mlp.tg",
        "--weights",
        "examples/matmul.tg",
    ]);
    assert!(e.contains("not a valid safetensors file"), "{e}");

    let other = tmp("other.safetensors");
    std::fs::write(&other, tenet_models_free_file()).unwrap();
    let e = stderr_of_failure(&[
        "compile",
        "examples/mlp.tg",
        "-o",
        tmp("x.tnt").to_str().unwrap(),
        "--weights",
        other.to_str().unwrap(),
    ]);
    assert!(e.contains("was not given"), "{e}");

    let e = stderr_of_failure(&["inspect", "does-not-exist.tg"]);
    assert!(e.contains("cannot read does-not-exist.tg"), "{e}");
}

/// A minimal valid safetensors file with one tensor, written by hand (header + data).
fn tenet_models_free_file() -> Vec<u8> {
    let header = br#"{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.extend_from_slice(&1.0f32.to_le_bytes());
    v
}

#[test]
fn demo_runs_end_to_end() {
    let dir = tmp("demo");
    let o = stdout(&tenet(&["demo", "--dir", dir.to_str().unwrap()]));
    assert!(o.contains("CAUGHT and slashed"), "{o}");
    assert!(o.contains("all receipts verified: true"), "{o}");
    assert!(dir.join("mlp.tnt").exists() && dir.join("mlp.safetensors").exists());
    let json: serde_json::Value = serde_json::from_str(&stdout(&tenet(&[
        "demo",
        "--json",
        "--dir",
        dir.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(json["verified"], true);
    assert_eq!(json["cheaters_caught"], 1);
    assert!(json["jobs"].as_u64().unwrap() >= 3);
    let cheater = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["cheating"] == true)
        .unwrap();
    assert!(cheater["stake"].as_i64().unwrap() < 1000, "{cheater}");
    // The demo deploys the committed example, and its receipt verifies offline.
    let committed: serde_json::Value =
        serde_json::from_str(&stdout(&tenet(&["inspect", "examples/mlp.tg", "--json"]))).unwrap();
    assert_eq!(json["task"], committed["id"]);
    let receipt = json["receipt"].as_str().unwrap();
    let coordinator = json["coordinator"].as_str().unwrap();
    stdout(&tenet(&[
        "receipt",
        "verify",
        receipt,
        "--coordinator",
        coordinator,
    ]));
}

fn write_npy(path: &Path, t: &tenet_ir::HostTensor) {
    std::fs::write(path, tenet_models::npy_bytes(t).unwrap()).unwrap();
}

#[test]
fn run_matmul_from_npy_agrees_with_f64() {
    let g = tmp("mm.tg");
    std::fs::write(&g, "tenet graph v1\n%0 = input(\"a\") : f32[16,32]\n%1 = input(\"b\") : f32[32,8]\n%2 = matmul(%0, %1) : f32[16,8]\noutput \"c\" = %2\n").unwrap();
    let av: Vec<f32> = (0..16 * 32)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let bv: Vec<f32> = (0..32 * 8)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0)
        .collect();
    let (a, b, c) = (tmp("a.npy"), tmp("b.npy"), tmp("c.npy"));
    write_npy(&a, &tenet_ir::HostTensor::from_f32(&[16, 32], &av).unwrap());
    write_npy(&b, &tenet_ir::HostTensor::from_f32(&[32, 8], &bv).unwrap());
    let arg = |n: &str, p: &Path| format!("{n}={}", p.display());
    stdout(&tenet(&[
        "run",
        g.to_str().unwrap(),
        "-i",
        &arg("a", &a),
        "-i",
        &arg("b", &b),
        "-o",
        c.to_str().unwrap(),
    ]));
    let bytes = std::fs::read(&c).unwrap();
    let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let out: Vec<f32> = bytes[10 + header..]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(out.len(), 16 * 8);
    for i in 0..16 {
        for j in 0..8 {
            let exact: f64 = (0..32)
                .map(|p| av[i * 32 + p] as f64 * bv[p * 8 + j] as f64)
                .sum();
            let bound: f64 = (0..32)
                .map(|p| (av[i * 32 + p] as f64 * bv[p * 8 + j] as f64).abs())
                .sum::<f64>()
                * 32.0
                * f32::EPSILON as f64;
            assert!((out[i * 8 + j] as f64 - exact).abs() <= bound, "c[{i},{j}]");
        }
    }
}

#[test]
fn run_mlp_with_weights_prints_json() {
    let x = tmp("x.json");
    let rows: Vec<String> = (0..8)
        .map(|r| {
            format!(
                "[{}]",
                (0..64)
                    .map(|c| ((r * 64 + c) % 17) as f32 / 16.0)
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    std::fs::write(&x, format!("[{}]", rows.join(","))).unwrap();
    let o = stdout(&tenet(&[
        "run",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "-i",
        &format!("x={}", x.display()),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    assert_eq!(v["probs"]["shape"], serde_json::json!([8, 10]));
    let probs: Vec<f64> = v["probs"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    for row in probs.chunks(10) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{row:?}");
    }
    // Same inputs, same bits: the output file is reproducible.
    let (o1, o2) = (tmp("mlp1.safetensors"), tmp("mlp2.safetensors"));
    for o in [&o1, &o2] {
        stdout(&tenet(&[
            "run",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
            "-i",
            &format!("x={}", x.display()),
            "-o",
            o.to_str().unwrap(),
        ]));
    }
    assert_eq!(std::fs::read(&o1).unwrap(), std::fs::read(&o2).unwrap());
}

#[test]
fn run_reports_input_mistakes() {
    let a = tmp("a3.npy");
    write_npy(
        &a,
        &tenet_ir::HostTensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap(),
    );
    let e = stderr_of_failure(&[
        "run",
        "examples/matmul.tg",
        "-i",
        &format!("a={}", a.display()),
    ]);
    assert!(
        e.contains("holds f32[3], but input \"a\" is f32[1024,1024]"),
        "{e}"
    );
    let e = stderr_of_failure(&[
        "run",
        "examples/matmul.tg",
        "-i",
        &format!("z={}", a.display()),
    ]);
    assert!(
        e.contains("no input \"z\"") && e.contains("a (f32[1024,1024])"),
        "{e}"
    );
    let e = stderr_of_failure(&["run", "examples/matmul.tg"]);
    assert!(
        e.contains("missing --input for: a (f32[1024,1024]), b (f32[1024,1024])"),
        "{e}"
    );
    let e = stderr_of_failure(&["run", "examples/matmul.tg", "-i", "a"]);
    assert!(e.contains("must be NAME=PATH"), "{e}");
    let e = stderr_of_failure(&[
        "run",
        "examples/mlp.tg",
        "-i",
        &format!("x={}", a.display()),
    ]);
    assert!(e.contains("pass it with --weights"), "{e}");
    // A float64 .npy gets a hint.
    let f64_npy = tmp("f64.npy");
    let mut bytes =
        tenet_models::npy_bytes(&tenet_ir::HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap())
            .unwrap();
    let text = String::from_utf8_lossy(&bytes[10..]).replace("<f4", "<f8");
    bytes.truncate(10);
    bytes.extend_from_slice(text.as_bytes());
    std::fs::write(&f64_npy, bytes).unwrap();
    let e = stderr_of_failure(&[
        "run",
        "examples/matmul.tg",
        "-i",
        &format!("a={}", f64_npy.display()),
    ]);
    assert!(e.contains("astype(numpy.float32)"), "{e}");
}

#[test]
fn run_is_byte_identical_across_threads_and_the_reference() {
    let g = tmp("mm2.tg");
    std::fs::write(&g, "tenet graph v1\n%0 = input(\"a\") : f32[64,300]\n%1 = input(\"b\") : f32[300,48]\n%2 = matmul(%0, %1) : f32[64,48]\n%3 = softmax(%2, axis=1) : f32[64,48]\noutput \"c\" = %2\noutput \"p\" = %3\n").unwrap();
    let av: Vec<f32> = (0..64 * 300)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 97.0)
        .collect();
    let bv: Vec<f32> = (0..300 * 48)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 89.0)
        .collect();
    let (a, b) = (tmp("ta.npy"), tmp("tb.npy"));
    write_npy(
        &a,
        &tenet_ir::HostTensor::from_f32(&[64, 300], &av).unwrap(),
    );
    write_npy(
        &b,
        &tenet_ir::HostTensor::from_f32(&[300, 48], &bv).unwrap(),
    );
    let (ia, ib) = (format!("a={}", a.display()), format!("b={}", b.display()));
    let mut files = Vec::new();
    let mut runs = vec![
        ("t1", vec!["--threads", "1"]),
        ("t2", vec!["--threads", "2"]),
        ("ref", vec!["--reference"]),
    ];
    if opencl_listed() {
        runs.push(("opencl", vec!["--device", "opencl"]));
    }
    for (name, extra) in runs {
        let out = tmp(&format!("{name}.safetensors"));
        let mut args = vec![
            "run",
            g.to_str().unwrap(),
            "-i",
            &ia,
            "-i",
            &ib,
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        stdout(&tenet(&args));
        files.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(files[0], files[1], "--threads 1 and 2 differ");
    for other in &files[3..] {
        assert_eq!(&files[0], other, "--device opencl differs from the CPU");
    }
    assert_eq!(
        files[0], files[2],
        "the executor differs from the reference"
    );
}

#[test]
fn run_refuses_graphs_larger_than_memory_before_running() {
    let g = tmp("huge.tg");
    std::fs::write(&g, "tenet graph v1\n%0 = input(\"a\") : f32[1]\n%1 = expand(%0) : f32[1099511627776]\n%2 = exp(%1) : f32[1099511627776]\noutput \"b\" = %2\n").unwrap();
    let a = tmp("one.npy");
    write_npy(&a, &tenet_ir::HostTensor::from_f32(&[1], &[1.0]).unwrap());
    for extra in [None, Some("--reference")] {
        let mut args = vec!["run", g.to_str().unwrap(), "-i"];
        let ia = format!("a={}", a.display());
        args.push(&ia);
        args.extend(extra);
        let e = stderr_of_failure(&args);
        assert!(
            e.contains("needs up to 8796093022208 bytes of tensor memory"),
            "{e}"
        );
    }
}

#[test]
fn bench_json_has_the_documented_keys() {
    let o = stdout(&tenet(&["bench", "--quick", "--json"]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&o).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    // Five kernel workloads, then two MiniLM rows and SmolLM2 decode and prefill rows for the
    // models in the cache.
    let minilm = rows
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("minilm"));
    let smollm2: Vec<_> = rows
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("smollm2"))
        .collect();
    let decode: Vec<_> = rows
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("smollm2 decode"))
        .collect();
    assert_eq!(
        names.len(),
        5 + minilm.clone().count() + smollm2.len(),
        "{names:?}"
    );
    // Decode and prefill rows per thread count, and two batching rows per arithmetic a node
    // serves (`quantized` weights for `exact`, and `q8`).
    let batching: Vec<_> = smollm2
        .iter()
        .filter(|r| r["name"].as_str().unwrap().contains(" requests × "))
        .collect();
    if !smollm2.is_empty() {
        assert_eq!(batching.len(), 4, "{names:?}");
        for (pair, mode) in batching.chunks(2).zip(["quantized", "q8"]) {
            let name = |i: usize| pair[i]["name"].as_str().unwrap();
            assert!(
                name(0).contains(&format!(", {mode} weights, one after")),
                "{names:?}"
            );
            assert!(
                name(1).contains(&format!(", {mode} weights, batched (")),
                "{names:?}"
            );
        }
    }
    for r in &batching {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Per thread count: decode with the f32-exact products and with `qmatmul_q8`, and a
    // prefill.
    let prefill = smollm2
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("smollm2 prefill"))
        .count();
    assert_eq!(decode.len(), 2 * prefill, "{names:?}");
    assert_eq!(
        decode
            .iter()
            .filter(|r| r["name"].as_str().unwrap().contains(", q8 weights"))
            .count(),
        prefill,
        "{names:?}"
    );
    assert_eq!(
        smollm2.len(),
        decode.len() + prefill + batching.len(),
        "{names:?}"
    );
    // Each SmolLM2 decode and prefill row carries llama.cpp's figure, or says why it has none.
    for r in smollm2
        .iter()
        .filter(|r| !r["name"].as_str().unwrap().contains(" requests × "))
    {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        match r["llamacpp_tokens_per_s"].as_f64() {
            Some(v) => assert!(v > 0.0, "{r}"),
            None => assert!(
                r["llamacpp_note"]
                    .as_str()
                    .is_some_and(|n| n.contains("llama")),
                "{r}"
            ),
        }
    }
    assert!([0, 2].contains(&minilm.clone().count()), "{names:?}");
    for r in minilm {
        assert!(r["sentences_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    for r in decode {
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let share = r["ratio_to_bandwidth"].as_f64().unwrap();
        assert!(share > 0.0 && share < 1.5, "{r}");
    }
    assert!(
        names[0].starts_with("matmul") && names[3].starts_with("softmax"),
        "{names:?}"
    );
    for r in &rows {
        assert!(r["tenet_ms"].as_f64().unwrap() > 0.0);
        for key in ["numpy_ms", "gflops", "ratio_to_peak"] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        // Without numpy, the row says why instead of inventing a number.
        if r["numpy_ms"].is_null() {
            assert!(
                r["numpy_note"]
                    .as_str()
                    .is_some_and(|n| n.contains("numpy")),
                "{r}"
            );
        }
    }
    assert!(rows[0]["gflops"].as_f64().unwrap() > 0.0);
    assert!(
        rows[2]["gflops"].is_null(),
        "elementwise rows have no FLOP figure"
    );
}

/// Whether the model is in the cache; if not, says on stderr that the caller skips
/// (`.ci/run` fetches the models first, so CI never skips).
fn model_cached(pkg: &tenet_models::fetch::ModelPackage) -> bool {
    match tenet_models::fetch::cached(pkg) {
        Ok(_) => true,
        Err(e) => {
            // Straight to stderr: the test harness would swallow eprintln!.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED: {e}");
            false
        }
    }
}

/// The weights path in the `run it with: tenet run … --weights PATH …` line `tenet export`
/// prints.
fn weights_named_in(export_output: &str) -> String {
    export_output
        .lines()
        .find_map(|l| l.split("--weights ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no --weights in {export_output}"))
        .to_string()
}

#[test]
fn exported_smollm2_prefill_runs_on_the_gguf_weights() {
    if !model_cached(&tenet_models::fetch::SMOLLM2) {
        return;
    }
    let fixture = repo().join("tests/fixtures/smollm2_greedy.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let case = &fixture["The capital of France is"];
    let ids: Vec<i64> = case["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let graph = tmp("prefill.tnt");
    let out = stdout(&tenet(&[
        "export",
        "smollm2-prefill",
        "-o",
        graph.to_str().unwrap(),
        "--seq",
        &ids.len().to_string(),
    ]));
    let gguf = weights_named_in(&out);
    assert!(gguf.ends_with(".gguf"), "{out}");
    let ids_file = tmp("prefill_ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&ids).unwrap()).unwrap();
    let logits_file = tmp("prefill_logits.json");
    let o = tenet(&[
        "run",
        graph.to_str().unwrap(),
        "--weights",
        &gguf,
        "-i",
        &format!("ids={}", ids_file.display()),
        "-o",
        &format!("logits={}", logits_file.display()),
    ]);
    stdout(&o);
    // Standard error is not a terminal here: one summary line instead of a bar.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("loading") && err.contains(" MB in "), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&logits_file).unwrap()).unwrap();
    let logits: Vec<f64> = v["logits"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top5: Vec<u64> = order[..5].iter().map(|&i| i as u64).collect();
    let want: Vec<u64> = case["top5"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(top5, want);
    for (got, want) in logits
        .iter()
        .zip(case["last_logits_first5"].as_array().unwrap())
    {
        assert!(
            (got - want.as_f64().unwrap()).abs() < 1e-3,
            "{got} vs {want}"
        );
    }
}

#[test]
fn embed_and_export_agree() {
    if !model_cached(&tenet_models::fetch::MINILM) {
        return;
    }
    let o = stdout(&tenet(&["embed", "--json", "hello world"]));
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    let emb: Vec<f64> = v["hello world"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(emb.len(), 384);
    let norm: f64 = emb.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");

    let graph = tmp("minilm.tnt");
    let out = stdout(&tenet(&[
        "export",
        "minilm",
        "-o",
        graph.to_str().unwrap(),
        "--seq",
        "4",
    ]));
    let weights = weights_named_in(&out);
    let (ids, tt, mask) = (tmp("ids.json"), tmp("tt.json"), tmp("mask.json"));
    std::fs::write(&ids, "[[101, 7592, 2088, 102]]").unwrap();
    std::fs::write(&tt, "[[0, 0, 0, 0]]").unwrap();
    std::fs::write(&mask, "[[1, 1, 1, 1]]").unwrap();
    let arg = |n: &str, p: &Path| format!("{n}={}", p.display());
    let o = stdout(&tenet(&[
        "run",
        graph.to_str().unwrap(),
        "--weights",
        &weights,
        "-i",
        &arg("input_ids", &ids),
        "-i",
        &arg("token_type_ids", &tt),
        "-i",
        &arg("attention_mask", &mask),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    let run: Vec<f64> = v["embedding"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(run, emb, "the exported task and `tenet embed` disagree");
}

#[test]
fn generate_json_gives_the_reference_greedy_tokens() {
    if !model_cached(&tenet_models::fetch::SMOLLM2) {
        return;
    }
    let o = stdout(&tenet(&[
        "generate",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "12",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(o.trim()).unwrap();
    let tokens: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(
        tokens,
        [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33]
    );
    assert!(v["text"].as_str().unwrap().starts_with(" Paris."));
    // Sampling is reproducible from its seed.
    let run = || {
        stdout(&tenet(&[
            "generate",
            "--prompt",
            "Once upon a time",
            "--seed",
            "7",
            "--temperature",
            "0.8",
            "--max-tokens",
            "6",
            "--json",
        ]))
    };
    let (a, b): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(run().trim()).unwrap(),
        serde_json::from_str(run().trim()).unwrap(),
    );
    assert_eq!(a["tokens"], b["tokens"]);
}

#[test]
fn economics_prices_honesty_and_finds_the_smallest_check_rate() {
    let args = [
        "economics",
        "--stake",
        "1000",
        "--payment",
        "1",
        "--cost",
        "0.5",
        "--alpha",
        "0.1",
        "--collusion",
        "0.05",
        "--catch",
        "0.99",
    ];
    let text = stdout(&tenet(&args));
    assert!(text.contains("honesty dominates"), "{text}");
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let v: serde_json::Value = serde_json::from_str(&stdout(&tenet(&with_json))).unwrap();
    let min = v["min_alpha"].as_f64().unwrap();
    assert!((min - 0.5 / 940.965).abs() < 1e-12, "{v}");
    assert_eq!(v["honest_dominant"], true);
    // Below the threshold cheating pays, and the report says so.
    let low = format!("{}", min / 2.0);
    let mut below = args.to_vec();
    below[8] = &low;
    assert!(stdout(&tenet(&below)).contains("CHEATING PAYS MORE"));
    let bad = tenet(&[
        "economics",
        "--stake",
        "1",
        "--payment",
        "1",
        "--cost",
        "1",
        "--alpha",
        "2",
        "--collusion",
        "0",
        "--catch",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--alpha must be a probability"));
}

#[test]
fn run_profile_says_where_the_time_went() {
    let x = tmp("x8.json");
    std::fs::write(
        &x,
        serde_json::to_string(&vec![vec![0.25f32; 64]; 8]).unwrap(),
    )
    .unwrap();
    let input = format!("x={}", x.display());
    let args = [
        "run",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "-i",
        &input,
        "--profile",
    ];
    let o = tenet(&args);
    assert!(
        stdout(&o).contains("probs"),
        "the outputs are still printed"
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("profile of graph") && e.contains("step kind"),
        "{e}"
    );
    // Two matmuls, two fused bias passes (add, add + relu) and one softmax.
    let steps = |kind: &str| {
        e.lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("no {kind} line in {e}"))
            .to_string()
    };
    assert_eq!(steps("gemm"), "2");
    assert_eq!(steps("rows"), "1");
    let e = stderr_of_failure(&[&args[..], &["--reference"]].concat());
    assert!(e.contains("cannot be used with"), "{e}");
}

/// Whether `tenet devices --json` lists an OpenCL device that passed its determinism check
/// (required when `TENET_REQUIRE_OPENCL=1`, as `.ci/run` sets).
fn opencl_listed() -> bool {
    let out = stdout(&tenet(&["devices", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let found = v.as_array().unwrap().iter().any(|d| {
        d["spec"].as_str().is_some_and(|s| s.starts_with("opencl")) && d["exact_check"] == "passed"
    });
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    assert!(found || !required, "TENET_REQUIRE_OPENCL=1 but: {out}");
    found
}

#[test]
fn devices_lists_the_cpu_with_its_check_and_bad_specs_are_clear() {
    let out = stdout(&tenet(&["devices", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cpu = &v.as_array().unwrap()[0];
    assert_eq!(cpu["spec"], "cpu");
    assert_eq!(cpu["class"], "cpu");
    assert_eq!(cpu["exact_check"], "passed");
    assert_eq!(cpu["tiers"], serde_json::json!(["exact", "tolerant"]));
    assert!(cpu["memory_bytes"].as_u64().unwrap() > 0);
    let table = stdout(&tenet(&["devices"]));
    assert!(table.contains("determinism check"), "{table}");
    for (spec, says) in [
        ("gpu", "expected cpu, opencl or opencl:N"),
        ("opencl:99", "no OpenCL device 99"),
    ] {
        let err = stderr_of_failure(&["run", "examples/matmul.tg", "--device", spec]);
        if spec == "opencl:99" && !opencl_listed() {
            continue;
        }
        assert!(err.contains(says), "--device {spec}: {err}");
        assert!(err.contains("--device"), "the error names the flag: {err}");
    }
}

/// `tenet import`: an ONNX model (the onnx wheel's Relu node test, kept as a fuzz seed) becomes
/// a graph `tenet run` runs; `--opset-check` lists its ops; a missing shape is explained.
#[test]
fn import_an_onnx_model_then_run_it() {
    let model = "fuzz/corpus/import_onnx/seed-test_relu.onnx";
    let graph = tmp("relu.tnt");
    let o = stdout(&tenet(&["import", model, "-o", graph.to_str().unwrap()]));
    assert!(o.contains("1 ONNX nodes"), "{o}");
    assert!(o.contains("inputs  x: f32[3,4,5]"), "{o}");
    assert!(o.contains("weights none"), "{o}");
    let input = tmp("relu-x.json");
    let values: Vec<f32> = (0..60).map(|i| i as f32 - 30.5).collect();
    std::fs::write(
        &input,
        serde_json::json!({"dtype": "f32", "shape": [3, 4, 5], "data": values}).to_string(),
    )
    .unwrap();
    let out: serde_json::Value = serde_json::from_str(&stdout(&tenet(&[
        "run",
        graph.to_str().unwrap(),
        "-i",
        &format!("x={}", input.display()),
        "--json",
    ])))
    .unwrap();
    let y: Vec<f64> = out["y"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let want: Vec<f64> = values.iter().map(|&v| v.max(0.0) as f64).collect();
    assert_eq!(y, want);

    let check = stdout(&tenet(&["import", model, "--opset-check"]));
    assert!(check.contains("Relu") && check.contains("ok"), "{check}");

    let bad = tenet(&[
        "import",
        model,
        "--shape",
        "x=3,4,6",
        "-o",
        graph.to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("fixed to 5"), "{err}");
}

#[test]
fn split_then_run_the_folder_like_the_whole_graph() {
    let x = tmp("split-x.json");
    let rows: Vec<String> = (0..8)
        .map(|r| {
            let v: Vec<String> = (0..64)
                .map(|c| (((r * 31 + c) % 13) as f32 / 8.0 - 0.7).to_string())
                .collect();
            format!("[{}]", v.join(","))
        })
        .collect();
    std::fs::write(&x, format!("[{}]", rows.join(","))).unwrap();
    let input = format!("x={}", x.display());
    let whole = stdout(&tenet(&[
        "run",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "-i",
        &input,
        "--json",
    ]));
    let dir = tmp("mlp-split");
    let _ = std::fs::remove_dir_all(&dir);
    let o = stdout(&tenet(&[
        "split",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "--stages",
        "2",
        "-o",
        dir.to_str().unwrap(),
    ]));
    assert!(o.contains("into 2 stages"), "{o}");
    assert!(
        o.contains(&format!("run it: tenet run {}", dir.display())),
        "{o}"
    );
    for f in [
        "manifest.json",
        "stage-1.tnt",
        "stage-2.tnt",
        "stage-1.safetensors",
    ] {
        assert!(dir.join(f).is_file(), "{f} written");
    }
    let staged = stdout(&tenet(&[
        "run",
        dir.to_str().unwrap(),
        "-i",
        &input,
        "--json",
    ]));
    assert_eq!(staged, whole, "the split and the whole graph disagree");
    // The same on the reference interpreter.
    let reference = stdout(&tenet(&[
        "run",
        dir.to_str().unwrap(),
        "-i",
        &input,
        "--json",
        "--reference",
    ]));
    assert_eq!(reference, whole);
    let inspected = stdout(&tenet(&["inspect", dir.to_str().unwrap()]));
    assert!(inspected.contains("the stages chain"), "{inspected}");
    // Mistakes a user makes say what to do.
    let e = stderr_of_failure(&[
        "run",
        dir.to_str().unwrap(),
        "-i",
        &input,
        "--weights",
        "examples/mlp.safetensors",
    ]);
    assert!(e.contains("drop --weights"), "{e}");
    let e = stderr_of_failure(&[
        "split",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(e.contains("--stages") || e.contains("--memory"), "{e}");
    let e = stderr_of_failure(&[
        "split",
        "examples/mlp.tg",
        "--weights",
        "examples/mlp.safetensors",
        "--memory",
        "1K",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(e.contains("raise the limit"), "{e}");
    let e = stderr_of_failure(&[
        "split",
        "examples/mlp.tg",
        "--memory",
        "1G",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(e.contains("--weights"), "{e}");
    let e = stderr_of_failure(&["run", repo().join("examples").to_str().unwrap()]);
    assert!(e.contains("without a manifest.json"), "{e}");
}
