//! Deploy and call through the CLI, with a coordinator and nodes as real processes on
//! 127.0.0.1: with one node lying, the verified result equals a local run, the liar is slashed,
//! the receipt verifies offline and a forged one does not, and callers without a key are
//! refused; a node joins by itself, beats and leaves; a coordinator killed mid-job and
//! restarted finishes the job for a caller that kept waiting; one of two coordinators on one
//! ledger killed mid-job has the job taken over by the other.

use std::path::PathBuf;
use std::process::Output;

mod common;

use common::{spawn_tenet as spawn, tenet};

/// `tenet deploy` of the example MLP with its weights to `remote`, answered as JSON.
fn deploy_mlp(remote: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(tenet()
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
    .unwrap()
}

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
        "--admin-key",
        "admin",
    ]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ckey, curl) = (words[2].to_string(), words.last().unwrap().to_string());
    let mut nodes = Vec::new();
    for (i, cheat) in [None, Some("flip"), None].into_iter().enumerate() {
        let data = d(&format!("node{i}"));
        let extra: &[&str] = match cheat {
            Some(c) => &["--cheat", c],
            None => &[],
        };
        let (p, url) = common::spawn_node(&data, &ckey, extra);
        if i == 0 {
            // A caller's key cannot claim stake: only the admin bonds it.
            let claimed = tenet()
                .args(["register", &url, "--stake", "1000", "--coordinator", &curl])
                .args(["--api-key", "secret"])
                .output()
                .unwrap();
            assert!(!claimed.status.success());
            let err = String::from_utf8_lossy(&claimed.stderr);
            assert!(err.contains("403") && err.contains("admin"), "{err}");
        }
        let reg = tenet()
            .args([
                "register",
                &url,
                "--stake",
                "1000",
                "--coordinator",
                &curl,
                "--admin-key",
                "admin",
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
    let deployed = deploy_mlp(&remote);
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
    let http = tenet_net::NodeClient::new(&curl, tenet_net::identity::generate()).unwrap();
    let get = |path: &str| -> serde_json::Value {
        let req = tenet_net::RawRequest {
            method: tenet_net::Method::GET,
            path: path.to_string(),
            headers: vec![("authorization".into(), "Bearer secret".into())],
            body: tenet_net::Bytes::new(),
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
    // Coordinators named in order: one that cannot be reached is passed for the next, under
    // the same idempotency key.
    let listed = format!("http://127.0.0.1:1,{curl}");
    let failover = tenet()
        .args(["call", &task, "-i", &format!("x={}", d("x.json"))])
        .args(["--coordinator", &listed, "--api-key", "secret"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&failover.stderr);
    assert!(failover.status.success(), "{said}");
    assert!(
        said.contains("submitting to") && said.contains("under the same idempotency key"),
        "{said}"
    );
    assert!(String::from_utf8_lossy(&failover.stdout).contains("verified by"));
}

/// `GET path` on the coordinator with the test's API key; the status and the JSON answer.
fn api_get(url: &str, path: &str) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = tenet_net::NodeClient::new(url, tenet_net::identity::generate()).unwrap();
    let req = tenet_net::RawRequest {
        method: tenet_net::Method::GET,
        path: path.to_string(),
        headers: vec![("authorization".into(), "Bearer secret".into())],
        body: tenet_net::Bytes::new(),
    };
    match rt.block_on(http.send(req)) {
        Ok(r) => (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null),
        ),
        Err(_) => (0, serde_json::Value::Null),
    }
}

/// A task slow enough (a chain of 256² matmuls) to kill a coordinator while nodes run it, as
/// `slow.tnt` in `dir`, and its input as `s.json`.
fn write_slow_task(dir: &std::path::Path) {
    let g = tenet_ir::GraphBuilder::new();
    let s = g.input("s", tenet_ir::DType::F32, &[256, 256]);
    let mut acc = s.clone();
    for _ in 0..600 {
        acc = acc.matmul(&s).tanh();
    }
    let graph = g.finish(&[("y", &acc)]).unwrap();
    std::fs::write(dir.join("slow.tnt"), graph.to_bytes()).unwrap();
    let s_in: Vec<Vec<f32>> = (0..256)
        .map(|i| {
            (0..256)
                .map(|j| ((i * 31 + j * 17) % 19) as f32 / 1900.0)
                .collect()
        })
        .collect();
    std::fs::write(dir.join("s.json"), serde_json::to_string(&s_in).unwrap()).unwrap();
}

/// Three node processes trusting `keys`, each logging its events to `node{i}.log` in `dir`,
/// registered with 1000 stake at the coordinator at `url` by its admin.
fn staked_nodes(dir: &std::path::Path, keys: &[&str], url: &str) -> Vec<common::Proc> {
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    (0..3)
        .map(|i| {
            let log = d(&format!("node{i}.log"));
            let mut extra = vec!["--event-log", log.as_str()];
            for k in &keys[1..] {
                extra.extend(["--trust", k]);
            }
            let (p, node_url) = common::spawn_node(&d(&format!("node{i}")), keys[0], &extra);
            ok(tenet()
                .args([
                    "register",
                    &node_url,
                    "--stake",
                    "1000",
                    "--coordinator",
                    url,
                ])
                .args(["--admin-key", "admin"])
                .output()
                .unwrap());
            p
        })
        .collect()
}

/// Deploy `slow.tnt` from `dir` through `remote` and start `tenet call` on it (its result to
/// `y.json`, its receipt to `receipt.json`, its answer as JSON on standard output).
fn deploy_slow_and_call(dir: &std::path::Path, remote: &[&str]) -> std::process::Child {
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let deployed: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args(["deploy", &d("slow.tnt"), "--json"])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    tenet()
        .args(["call", deployed["id"].as_str().unwrap(), "-i"])
        .arg(format!("s={}", d("s.json")))
        .args([
            "-o",
            &d("y.json"),
            "--receipt",
            &d("receipt.json"),
            "--json",
        ])
        .args(remote)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait until every node's event log says it started a job.
fn wait_until_all_started(d: &dyn Fn(&str) -> String, nodes: usize) {
    let started = |i: usize| {
        std::fs::read_to_string(d(&format!("node{i}.log")))
            .unwrap_or_default()
            .contains("\"started\"")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !(0..nodes).all(started) {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn coordinator_args<'a>(data: &'a str, listen: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "coordinator",
        "--listen",
        listen,
        "--data-dir",
        data,
        "--api-key",
        "secret",
        "--admin-key",
        "admin",
    ];
    a.extend(extra);
    a
}

#[test]
fn a_node_joins_by_itself_sends_heartbeats_runs_jobs_and_leaves_on_sigterm() {
    let dir = tmp();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let coord_dir = d("coord");
    let (_coord, line) = spawn(coordinator_args(
        &coord_dir,
        "127.0.0.1:0",
        &["--replicas", "1"],
    ));
    let curl = line.split_whitespace().last().unwrap().to_string();
    let node_dir = d("node");
    let (mut node, line) = spawn([
        "node",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--no-fsync",
        "--data-dir",
        &node_dir,
        "--coordinator",
        &curl,
        "--api-key",
        "admin",
        "--stake",
        "700",
        "--heartbeat",
        "0.2",
    ]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let (node_id, node_url) = (words[2].to_string(), words.last().unwrap().to_string());
    let (status, nodes) = api_get(&curl, "/v1/nodes");
    assert_eq!(status, 200);
    assert_eq!(nodes.as_array().unwrap().len(), 1, "{nodes}");
    assert_eq!(nodes[0]["id"], node_id.as_str());
    assert_eq!(nodes[0]["url"], node_url.as_str());
    assert_eq!(nodes[0]["stake"], 700);
    assert_eq!(nodes[0]["state"], "active");
    let first_beat = nodes[0]["last_heartbeat"].as_i64().unwrap();
    // Heartbeats move last_heartbeat on (in whole seconds).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, n) = api_get(&curl, &format!("/v1/nodes/{node_id}"));
        if n["last_heartbeat"].as_i64().unwrap() > first_beat {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no heartbeat: {n}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The node trusts the coordinator it joined: a job runs on it.
    let remote = ["--coordinator", curl.as_str(), "--api-key", "secret"];
    let deployed = deploy_mlp(&remote);
    let x: Vec<Vec<f32>> = vec![vec![0.5; 64]; 8];
    std::fs::write(d("x.json"), serde_json::to_string(&x).unwrap()).unwrap();
    let out = ok(tenet()
        .args(["call", deployed["id"].as_str().unwrap(), "-i"])
        .arg(format!("x={}", d("x.json")))
        .args(remote)
        .output()
        .unwrap());
    assert!(out.contains("verified by 1 of 1 node(s)"), "{out}");
    // SIGTERM: the node deregisters, then stops.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &node.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(node.wait().unwrap().success());
    let (_, n) = api_get(&curl, &format!("/v1/nodes/{node_id}"));
    assert_eq!(n["state"], "deregistered", "{n}");
}

#[test]
fn the_coordinator_killed_mid_job_and_restarted_finishes_the_job_and_the_caller_gets_it() {
    let dir = tmp();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let coord_dir = d("coord");
    let (mut coord, line) = spawn(coordinator_args(&coord_dir, "127.0.0.1:0", &[]));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ckey, curl) = (words[2].to_string(), words.last().unwrap().to_string());
    let addr = curl.trim_start_matches("http://").to_string();
    let _nodes = staked_nodes(&dir, &[&ckey], &curl);
    write_slow_task(&dir);
    let remote = ["--coordinator", curl.as_str(), "--api-key", "secret"];
    let caller = deploy_slow_and_call(&dir, &remote);
    // Kill the coordinator once every node has started the job.
    wait_until_all_started(&d, 3);
    coord.kill().unwrap();
    coord.wait().unwrap();
    let committed_before = (0..3)
        .filter(|&i| {
            std::fs::read_to_string(d(&format!("node{i}.log")))
                .unwrap_or_default()
                .contains("\"committed\"")
        })
        .count();
    // Restarted on the same address and data: it resumes the job from its ledger.
    let (_coord, line) = spawn(coordinator_args(&coord_dir, &addr, &[]));
    assert!(line.contains(&ckey), "the same identity: {line}");
    let out = caller.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the caller failed (nodes had committed before the kill: {committed_before}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["state"], "decided");
    let job_id = answer["job_id"].as_str().unwrap();
    // The result is the local result, and the receipt verifies against the coordinator.
    ok(tenet()
        .args(["run", &d("slow.tnt"), "-i"])
        .arg(format!("s={}", d("s.json")))
        .args(["-o", &d("local.json")])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read(d("y.json")).unwrap(),
        std::fs::read(d("local.json")).unwrap()
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
    // The ledger is consistent: one job, decided, three agreeing replicas each credited once,
    // nothing unfinished, and no node ran the job twice.
    let (_, job) = api_get(&curl, &format!("/v1/jobs/{job_id}"));
    assert_eq!(job["state"], "decided");
    let asg = job["assignments"].as_array().unwrap();
    assert_eq!(asg.len(), 3, "{job}");
    assert!(asg.iter().all(|a| a["state"] == "agreed"), "{job}");
    let (_, jobs) = api_get(&curl, "/v1/jobs");
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    let (_, nodes_now) = api_get(&curl, "/v1/nodes");
    for n in nodes_now.as_array().unwrap() {
        assert_eq!(n["stake"], 1001, "{n}");
        assert_eq!(n["agreed"], 1, "{n}");
    }
    for i in 0..3 {
        let log = std::fs::read_to_string(d(&format!("node{i}.log"))).unwrap();
        assert_eq!(log.matches("\"accepted\"").count(), 1, "node {i}: {log}");
    }
}

/// Two coordinators on one ledger; the one a caller's job runs on is killed (SIGKILL) while the
/// nodes run it: the other takes the job over once its lease lapses, the caller — given both —
/// resubmits under the same idempotency key and gets the decision from the survivor, whose
/// signature the deployment's key set vouches for; the job is decided once, each node credited
/// once and run once.
#[test]
fn a_coordinator_killed_mid_job_is_taken_over_by_its_peer_on_the_same_ledger() {
    let dir = tmp();
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let ledger = format!("sqlite://{}", d("ledger.db"));
    let shared = ["--ledger", ledger.as_str(), "--lease", "1"];
    let (dir_a, dir_b) = (d("coord-a"), d("coord-b"));
    let (mut coord_a, line) = spawn(coordinator_args(&dir_a, "127.0.0.1:0", &shared));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (key_a, url_a) = (words[2].to_string(), words.last().unwrap().to_string());
    let (_coord_b, line) = spawn(coordinator_args(&dir_b, "127.0.0.1:0", &shared));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (key_b, url_b) = (words[2].to_string(), words.last().unwrap().to_string());
    assert_ne!(key_a, key_b);
    // Registered with A: B reads the same node registry from the ledger.
    let _nodes = staked_nodes(&dir, &[&key_a, &key_b], &url_a);
    write_slow_task(&dir);
    let both = format!("{url_a},{url_b}");
    let remote = ["--coordinator", both.as_str(), "--api-key", "secret"];
    let caller = deploy_slow_and_call(&dir, &remote);
    wait_until_all_started(&d, 3);
    coord_a.kill().unwrap();
    coord_a.wait().unwrap();
    let out = caller.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the caller failed: {stderr}");
    assert!(
        stderr.contains("under the same idempotency key"),
        "the caller moved to the other coordinator: {stderr}"
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["state"], "decided");
    let job_id = answer["job_id"].as_str().unwrap();
    ok(tenet()
        .args(["run", &d("slow.tnt"), "-i"])
        .arg(format!("s={}", d("s.json")))
        .args(["-o", &d("local.json")])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read(d("y.json")).unwrap(),
        std::fs::read(d("local.json")).unwrap()
    );
    // Signed by B, which settled it; the deployment's key set (as B publishes it) verifies it,
    // and A's key alone does not.
    let receipt: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d("receipt.json")).unwrap()).unwrap();
    assert_eq!(receipt["coordinator"], key_b.as_str());
    let (status, set) = api_get(&url_b, "/v1/coordinators");
    assert_eq!(status, 200, "{set}");
    std::fs::write(d("keys.json"), set.to_string()).unwrap();
    ok(tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &d("keys.json"),
        ])
        .output()
        .unwrap());
    let only_a = tenet()
        .args([
            "receipt",
            "verify",
            &d("receipt.json"),
            "--coordinator",
            &key_a,
        ])
        .output()
        .unwrap();
    assert!(!only_a.status.success());
    // Decided once; every node agreed, was credited once, and ran the job once.
    let (_, job) = api_get(&url_b, &format!("/v1/jobs/{job_id}"));
    assert_eq!(job["state"], "decided", "{job}");
    let asg = job["assignments"].as_array().unwrap();
    assert_eq!(asg.len(), 3, "{job}");
    assert!(asg.iter().all(|a| a["state"] == "agreed"), "{job}");
    let (_, jobs) = api_get(&url_b, "/v1/jobs");
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    let (_, nodes_now) = api_get(&url_b, "/v1/nodes");
    for n in nodes_now.as_array().unwrap() {
        assert_eq!(n["stake"], 1001, "{n}");
        assert_eq!(n["agreed"], 1, "{n}");
    }
    for i in 0..3 {
        let log = std::fs::read_to_string(d(&format!("node{i}.log"))).unwrap();
        assert_eq!(log.matches("\"accepted\"").count(), 1, "node {i}: {log}");
    }
}

/// `tenet bench load --coordinators 2 --kill-one`, small: coordinator and node processes on one
/// SQLite ledger, one coordinator killed halfway through the two-coordinator tier; every call is
/// answered and verified, every job decided once with each node credited once, and the report
/// says what each tier cost.
#[test]
fn the_scale_out_benchmark_loses_nothing_when_a_coordinator_is_killed() {
    let out = ok(tenet()
        .args([
            "bench",
            "load",
            "--coordinators",
            "2",
            "--clients",
            "6",
            "--jobs",
            "4",
            "--nodes",
            "3",
            "--kill-one",
            "--lease",
            "1",
            "--json",
        ])
        .output()
        .unwrap());
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tiers = report["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 2, "{report}");
    for t in tiers {
        assert_eq!(t["nothing_lost"], true, "{t}");
        assert_eq!(t["completed"], 24, "{t}");
        assert_eq!(t["ledger_jobs"], 24, "{t}");
        assert_eq!(t["credit_errors"], 0, "{t}");
        assert!(
            t["cpu_ms_per_job"]["coordinators"].as_f64().unwrap() > 0.0,
            "{t}"
        );
    }
    assert_eq!(tiers[1]["coordinators"], 2);
    assert!(tiers[1]["killed_after"].as_u64().is_some(), "{report}");
    assert_eq!(report["ledger"], "sqlite");
}
