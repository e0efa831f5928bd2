//! Deploy and call through the CLI, with a coordinator and three nodes as real processes on
//! 127.0.0.1, one node lying: the verified result equals a local run, the liar is slashed, the
//! receipt verifies offline and a forged one does not; callers without a key are refused.

use std::path::PathBuf;
use std::process::Output;

mod common;

use common::{spawn_tenet as spawn, tenet};

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tenet-e2e-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn deploy_and_call_through_the_cli_with_one_lying_node() {
    let dir = tmp();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let (_coord, line) = spawn([
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d("coord"),
        "--api-key",
        "secret",
    ]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ckey, curl) = (words[2].to_string(), words.last().unwrap().to_string());
    let mut nodes = Vec::new();
    for (i, cheat) in [None, Some("flip"), None].into_iter().enumerate() {
        let data = d(&format!("node{i}"));
        let mut args = vec![
            "node",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--no-fsync",
            "--data-dir",
            &data,
            "--trust",
            &ckey,
        ];
        if let Some(c) = cheat {
            args.extend(["--cheat", c]);
        }
        let (p, line) = spawn(&args);
        let url = line.split_whitespace().last().unwrap().to_string();
        let reg = tenet()
            .args([
                "register",
                &url,
                "--stake",
                "1000",
                "--coordinator",
                &curl,
                "--api-key",
                "secret",
            ])
            .output()
            .unwrap();
        ok(reg);
        nodes.push((p, url));
    }
    let remote = ["--coordinator", curl.as_str(), "--api-key", "secret"];
    // Without the key: refused.
    let refused = tenet()
        .args([
            "deploy",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
            "--coordinator",
            &curl,
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let deployed: serde_json::Value = serde_json::from_str(&ok(tenet()
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
    let task = deployed["id"].as_str().unwrap().to_string();
    assert_eq!(deployed["inputs"][0]["name"], "x");
    let x: Vec<Vec<f32>> = (0..8)
        .map(|i| (0..64).map(|j| ((i * 7 + j) % 13) as f32 / 13.0).collect())
        .collect();
    std::fs::write(d("x.json"), serde_json::to_string(&x).unwrap()).unwrap();
    let out = ok(tenet()
        .args([
            "call",
            &task,
            "-i",
            &format!("x={}", d("x.json")),
            "-o",
            &d("y.json"),
            "--receipt",
            &d("receipt.json"),
        ])
        .args(remote)
        .output()
        .unwrap());
    assert!(out.contains("verified by 2 of 3 node(s)"), "{out}");
    assert!(out.contains("disagreed and was slashed 100"), "{out}");
    // The verified result is the local result, byte for byte.
    ok(tenet()
        .args([
            "run",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
            "-i",
            &format!("x={}", d("x.json")),
            "-o",
            &d("local.json"),
        ])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read(d("y.json")).unwrap(),
        std::fs::read(d("local.json")).unwrap()
    );
    // The receipt verifies offline, against the coordinator's key; a forged one does not.
    let verified = ok(tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &ckey,
        ])
        .output()
        .unwrap());
    assert!(verified.contains("2 of 3 node(s) agreed"), "{verified}");
    let mut r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("receipt.json")).unwrap()).unwrap();
    r["nodes"][0]["output_hash"] = r["nodes"][0]["salt"].clone();
    std::fs::write(d("forged.json"), r.to_string()).unwrap();
    let forged = tenet()
        .args(["receipt", "verify", &d("forged.json")])
        .output()
        .unwrap();
    assert!(!forged.status.success());
    // The API: the job is listed with its state; the OpenAPI document is served.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = tenet_node::NodeClient::new(&curl, tenet_node::identity::generate()).unwrap();
    let get = |path: &str| -> serde_json::Value {
        let req = tenet_node::RawRequest {
            method: tenet_node::Method::GET,
            path: path.to_string(),
            headers: vec![("authorization".into(), "Bearer secret".into())],
            body: tenet_node::Bytes::new(),
        };
        let r = rt.block_on(http.send(req)).unwrap();
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        serde_json::from_slice(&r.body).unwrap()
    };
    assert_eq!(get("/v1/jobs")[0]["state"], "decided");
    assert!(get("/openapi.json")["paths"]["/v1/tasks/{id}/run"]["post"].is_object());
    let stakes: Vec<i64> = get("/v1/nodes")
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["stake"].as_i64().unwrap())
        .collect();
    assert_eq!(
        stakes.iter().filter(|&&s| s == 900).count(),
        1,
        "{stakes:?}"
    );
}
