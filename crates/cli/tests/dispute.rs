//! A dispute by bisection on the live network: a coordinator asking two replicas (and no
//! third node to break the tie), one honest node and one that lies at a single op inside the
//! graph (`--cheat op=9`, the logits' bias add). The replicas disagree with no majority;
//! the coordinator walks both nodes' trace trees to that op, re-runs it alone, and decides:
//! the honest output is the answer, the liar is slashed, and the receipt carries the dispute's
//! transcript, which `tenet receipt verify` checks offline (and refuses once edited).

use std::process::Output;

mod common;

use common::{spawn_tenet, tenet};

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_liar_at_one_op_is_found_by_bisection_and_slashed() {
    let dir = std::env::temp_dir().join(format!("tenet-dispute-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let (_coord, line) = spawn_tenet([
        "coordinator",
        "--open",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d("coord"),
        "--replicas",
        "2",
    ]);
    let curl = common::url_of(&line);
    let ckey = line.split_whitespace().nth(2).unwrap().to_string();
    let mut nodes = Vec::new();
    for (i, cheat) in [None, Some("op=9")].into_iter().enumerate() {
        let mut extra = vec!["--coordinator", curl.as_str(), "--stake", "1000"];
        if let Some(c) = cheat {
            extra.extend(["--cheat", c]);
        }
        nodes.push(common::spawn_node(&d(&format!("node{i}")), &ckey, &extra));
    }
    let remote = ["--coordinator", curl.as_str()];
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
    // The local answer, to compare with.
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
    // Nodes join by themselves: retry while both have not.
    let mut answer = None;
    for _ in 0..40 {
        let o = tenet()
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
            .unwrap();
        if o.status.success() {
            answer = Some(String::from_utf8(o.stdout).unwrap());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let r: serde_json::Value = serde_json::from_str(&answer.expect("both nodes joined")).unwrap();
    // The honest output, bit for bit.
    assert_eq!(
        std::fs::read_to_string(d("y.json")).unwrap(),
        std::fs::read_to_string(d("local.json")).unwrap()
    );
    let slashed = r["slashed"].as_array().unwrap();
    assert_eq!(slashed.len(), 1, "{r}");
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
    // Offline: the receipt with its dispute verifies; an edited walk does not.
    ok(tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &ckey,
        ])
        .output()
        .unwrap());
    let mut edited: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d("receipt.json")).unwrap()).unwrap();
    let lost = edited["dispute"]["verdict"]["Lost"][0].as_u64().unwrap();
    edited["dispute"]["verdict"]["Lost"] = serde_json::json!([1 - lost]);
    std::fs::write(d("edited.json"), edited.to_string()).unwrap();
    let bad = tenet()
        .args([
            "receipt",
            "verify",
            &d("edited.json"),
            "--coordinator",
            &ckey,
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
    let dir = std::env::temp_dir().join(format!("tenet-dispute-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let (_coord, line) = spawn_tenet([
        "coordinator",
        "--open",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d("coord"),
        "--replicas",
        "2",
        "--node-timeout",
        "2",
    ]);
    let curl = common::url_of(&line);
    let ckey = line.split_whitespace().nth(2).unwrap().to_string();
    let mut nodes = Vec::new();
    for (i, cheat) in [None, Some("stall=9")].into_iter().enumerate() {
        let mut extra = vec!["--coordinator", curl.as_str(), "--stake", "1000"];
        if let Some(c) = cheat {
            extra.extend(["--cheat", c]);
        }
        nodes.push(common::spawn_node(&d(&format!("node{i}")), &ckey, &extra));
    }
    let remote = ["--coordinator", curl.as_str()];
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
        .map(|i| (0..64).map(|j| ((i * 5 + j) % 11) as f32 / 11.0).collect())
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
    let mut answer = None;
    for _ in 0..40 {
        let o = tenet()
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
            .unwrap();
        if o.status.success() {
            answer = Some(String::from_utf8(o.stdout).unwrap());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let r: serde_json::Value = serde_json::from_str(&answer.expect("both nodes joined")).unwrap();
    assert_eq!(
        std::fs::read_to_string(d("y.json")).unwrap(),
        std::fs::read_to_string(d("local.json")).unwrap()
    );
    assert_eq!(r["slashed"].as_array().unwrap().len(), 1, "{r}");
    let dispute = &r["receipt"]["dispute"];
    let stalled = dispute["stalled"].as_u64().expect("the stall is recorded");
    assert_eq!(
        dispute["verdict"]["Lost"],
        serde_json::json!([stalled]),
        "{dispute}"
    );
    ok(tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &ckey,
        ])
        .output()
        .unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
