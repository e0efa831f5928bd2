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
    assert!(o.contains("weights bind"), "{o}");
    assert!(dir.join("mlp.tnt").exists() && dir.join("mlp.safetensors").exists());
    let json: serde_json::Value = serde_json::from_str(&stdout(&tenet(&[
        "demo",
        "--json",
        "--dir",
        dir.to_str().unwrap(),
    ])))
    .unwrap();
    assert_eq!(json["verified"], true);
    // The demo's graph is the committed example.
    let committed: serde_json::Value =
        serde_json::from_str(&stdout(&tenet(&["inspect", "examples/mlp.tg", "--json"]))).unwrap();
    assert_eq!(json["id"], committed["id"]);
}
