//! A dispute by bisection on the live network: a coordinator asking two replicas (and no
//! third node to break the tie), one honest node and one that lies at a single op inside the
//! graph (`--cheat op=9`, the logits' bias add). The replicas disagree with no majority; the
//! coordinator walks both nodes' trace trees to that op, re-runs it alone, and decides: the
//! honest output is the answer, the liar is slashed, and the receipt carries the dispute's
//! transcript, which `tenet receipt verify` checks offline (and refuses once edited). A liar
//! that stalls the walk loses by rule.

use std::path::PathBuf;
use std::process::Output;

mod common;

use common::tenet;

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The example MLP deployed on a network of an honest node and one told `cheat`, called once
/// the nodes have joined: the call's JSON answer, the coordinator's key, and the folder
/// holding `y.json` (the answer's outputs), `local.json` (a local run's) and `receipt.json`.
fn call_with_a_liar(
    name: &str,
    cheat: &str,
    extra: &[&str],
) -> (serde_json::Value, String, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tenet-dispute-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let net = common::spawn_network(&dir, 2, extra, &[None, Some(cheat)]);
    let remote = ["--coordinator", net.url.as_str()];
    let task: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args([
            "deploy",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
            "--json",
        ])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    let task = task["id"].as_str().unwrap().to_string();
    let x: Vec<Vec<f32>> = (0..8)
        .map(|i| {
            (0..64)
                .map(|j| ((i * 7 + j) % 13) as f32 / 13.0 - 0.4)
                .collect()
        })
        .collect();
    std::fs::write(d("x.json"), serde_json::to_string(&x).unwrap()).unwrap();
    ok(tenet()
        .args([
            "run",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
        ])
        .args(["-i", &format!("x={}", d("x.json")), "-o", &d("local.json")])
        .output()
        .unwrap());
    let answer = ok(common::once_joined(|| {
        tenet()
            .args(["call", &task, "-i", &format!("x={}", d("x.json"))])
            .args([
                "-o",
                &d("y.json"),
                "--receipt",
                &d("receipt.json"),
                "--json",
            ])
            .args(remote)
            .output()
            .unwrap()
    }));
    let r: serde_json::Value = serde_json::from_str(&answer).unwrap();
    // The honest output, bit for bit.
    assert_eq!(
        std::fs::read_to_string(d("y.json")).unwrap(),
        std::fs::read_to_string(d("local.json")).unwrap()
    );
    assert_eq!(r["slashed"].as_array().unwrap().len(), 1, "{r}");
    ok(tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &net.key,
        ])
        .output()
        .unwrap());
    (r, net.key.clone(), dir)
}

#[test]
fn a_liar_at_one_op_is_found_by_bisection_and_slashed() {
    let (r, key, dir) = call_with_a_liar("op", "op=9", &[]);
    let dispute = &r["receipt"]["dispute"];
    assert_eq!(
        dispute["leaf"], 9,
        "the walk ends at the op that lied: {dispute}"
    );
    assert_eq!(
        dispute["verdict"]["Lost"].as_array().unwrap().len(),
        1,
        "{dispute}"
    );
    let rounds = dispute["rounds"].as_array().unwrap().len();
    assert_eq!(rounds, 4, "11 nodes: a tree of depth 4");
    // An edited verdict does not verify.
    let receipt = dir.join("receipt.json");
    let mut edited: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&receipt).unwrap()).unwrap();
    let lost = edited["dispute"]["verdict"]["Lost"][0].as_u64().unwrap();
    edited["dispute"]["verdict"]["Lost"] = serde_json::json!([1 - lost]);
    let path = dir.join("edited.json");
    std::fs::write(&path, edited.to_string()).unwrap();
    let bad = tenet()
        .args([
            "receipt",
            "verify",
            path.to_str().unwrap(),
            "--coordinator",
            &key,
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A liar that stalls the dispute (`--cheat stall=9`: lies at `%9`, then never answers the
/// walk's questions) loses by rule once the node timeout passes: it is slashed as a node that
/// withholds, the whole job is refereed, the honest output is the answer, and the receipt
/// records the stall.
#[test]
fn a_node_stalling_the_walk_loses_by_rule() {
    let (r, _, dir) = call_with_a_liar("stall", "stall=9", &["--node-timeout", "2"]);
    let dispute = &r["receipt"]["dispute"];
    let stalled = dispute["stalled"].as_u64().expect("the stall is recorded");
    assert_eq!(
        dispute["verdict"]["Lost"],
        serde_json::json!([stalled]),
        "{dispute}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A liar that computes honestly and reports flipped outputs (`--cheat flip`): both traces are
/// the same, so the walk finds no op to re-run; the outputs each side committed to decide it —
/// the liar's are not its own trace's output leaves, whose proofs the transcript holds. No
/// whole-job referee is needed, and the receipt verifies (its winner committed to its outputs).
#[test]
fn a_liar_whose_result_departs_from_its_own_trace_loses() {
    let (r, _, dir) = call_with_a_liar("flip", "flip", &[]);
    let dispute = &r["receipt"]["dispute"];
    assert!(dispute["leaf"].is_null(), "{dispute}");
    assert_eq!(dispute["rounds"].as_array().unwrap().len(), 0, "{dispute}");
    assert_eq!(dispute["roots"][0], dispute["roots"][1], "{dispute}");
    let committed = dispute["committed"].as_array().unwrap();
    // The MLP's two outputs, each proven.
    assert_eq!(dispute["outputs"].as_array().unwrap().len(), 2, "{dispute}");
    let lost = dispute["verdict"]["Lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{dispute}");
    let loser = lost[0].as_u64().unwrap() as usize;
    assert_ne!(committed[loser], committed[1 - loser], "{dispute}");
    assert_eq!(
        committed[1 - loser][0],
        dispute["outputs"][0]["leaf"],
        "the winner's result is its trace's"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
