//! A model larger than any one node, through the CLI with a coordinator and nodes as real
//! processes on 127.0.0.1: MiniLM split in three stages (`tenet split`), deployed as one
//! pipeline (`tenet deploy DIR`) to nodes whose `--memory-limit` is below the whole model's
//! certificate (the whole task is refused: no node could run it) and above each stage's; one
//! node lies. The call's outputs are the local run's, bit for bit; the liar is caught and
//! slashed in every stage; the pipeline receipt verifies offline, and one whose boundary hash
//! was changed does not. SmolLM2's prompt pass likewise over nodes of 300 MiB. Needs the models
//! in the cache (`.ci/run` fetches them).

use std::path::PathBuf;
use std::process::Output;

mod common;

use common::{spawn_tenet as spawn, tenet};

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn tmp(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tenet-pipeline-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn minilm_split_over_nodes_smaller_than_the_model() {
    let Ok(minilm) = tenet_models::fetch::cached(&tenet_models::fetch::MINILM) else {
        eprintln!("SKIPPED: MiniLM is not in the cache (tenet models fetch minilm)");
        return;
    };
    let weights = tenet_models::fetch::find_file(&minilm, "model.safetensors").unwrap();
    let dir = tmp("minilm");
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    ok(tenet()
        .args(["export", "minilm", "-o", &d("minilm.tnt"), "--seq", "8"])
        .output()
        .unwrap());
    let split = ok(tenet()
        .args([
            "split",
            &d("minilm.tnt"),
            "--stages",
            "3",
            "-o",
            &d("split"),
        ])
        .args(["--weights", weights.to_str().unwrap(), "--json"])
        .output()
        .unwrap());
    let manifest: serde_json::Value = serde_json::from_str(&split).unwrap();
    let stage_peak = manifest["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["peak_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    let whole = tenet_ir::decode_any(&std::fs::read(d("minilm.tnt")).unwrap())
        .unwrap()
        .cost()
        .peak_bytes;
    // Nodes that take every stage but not the whole model.
    let limit = (stage_peak + whole) / 2;
    assert!(stage_peak < limit && limit < whole);
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
    let limit_arg = limit.to_string();
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    for (i, cheat) in [None, Some("flip"), None].into_iter().enumerate() {
        let events = d(&format!("events{i}.jsonl"));
        let mut extra = vec!["--memory-limit", limit_arg.as_str(), "--event-log", &events];
        if let Some(c) = cheat {
            extra.extend(["--cheat", c]);
        }
        let (p, url) = common::spawn_node(&d(&format!("node{i}")), &ckey, &extra);
        ok(tenet()
            .args(["register", &url, "--stake", "1000", "--coordinator", &curl])
            .args(["--admin-key", "admin"])
            .output()
            .unwrap());
        nodes.push(p);
        urls.push(url);
    }
    let remote = ["--coordinator", curl.as_str(), "--api-key", "secret"];
    // Inputs: one sentence of eight tokens.
    std::fs::write(
        d("ids.json"),
        "[[101, 1037, 13117, 1997, 5711, 2006, 3674, 102]]",
    )
    .unwrap();
    std::fs::write(d("types.json"), "[[0, 0, 0, 0, 0, 0, 0, 0]]").unwrap();
    std::fs::write(d("mask.json"), "[[1, 1, 1, 1, 1, 1, 1, 1]]").unwrap();
    let inputs = [
        "-i",
        &format!("input_ids={}", d("ids.json")),
        "-i",
        &format!("token_type_ids={}", d("types.json")),
        "-i",
        &format!("attention_mask={}", d("mask.json")),
    ]
    .map(|s| s.to_string());
    // The whole model: deployable, but no node's limits take it.
    let whole_task: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args([
            "deploy",
            &d("minilm.tnt"),
            "--weights",
            weights.to_str().unwrap(),
            "--json",
        ])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(whole_task["nodes_able"], 0, "{whole_task}");
    let refused = tenet()
        .args(["call", whole_task["id"].as_str().unwrap()])
        .args(&inputs)
        .args(remote)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("memory"), "{err}");
    // The split: deployed as one pipeline; every stage fits every node.
    let deployed: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args(["deploy", &d("split"), "--json"])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(
        deployed["nodes_able"],
        serde_json::json!([3, 3, 3]),
        "{deployed}"
    );
    let pipeline = deployed["id"].as_str().unwrap().to_string();
    let out = ok(tenet()
        .args(["call", &pipeline])
        .args(&inputs)
        .args(["-o", &d("y.json"), "--receipt", &d("receipt.json")])
        .args(remote)
        .output()
        .unwrap());
    eprintln!("{out}");
    assert!(out.contains("verified in 3 stage(s)"), "{out}");
    assert_eq!(
        out.matches("agreed by 2 of 3 node(s)").count(),
        3,
        "every stage decided by the two honest nodes: {out}"
    );
    assert_eq!(out.matches("disagreed and was slashed").count(), 3, "{out}");
    // The verified result is the whole model's local result, byte for byte.
    ok(tenet()
        .args([
            "run",
            &d("minilm.tnt"),
            "--weights",
            weights.to_str().unwrap(),
        ])
        .args(&inputs)
        .args(["-o", &d("local.json")])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read(d("y.json")).unwrap(),
        std::fs::read(d("local.json")).unwrap()
    );
    // The receipt verifies offline against the coordinator's key; a changed boundary hash
    // does not.
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
    assert!(verified.contains("3 stage(s) chained"), "{verified}");
    let mut r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("receipt.json")).unwrap()).unwrap();
    let inputs1 = r["stages"][1]["job"]["inputs"].as_object_mut().unwrap();
    let boundary = inputs1.keys().find(|k| k.starts_with('%')).unwrap().clone();
    inputs1.insert(boundary, serde_json::json!("00".repeat(32)));
    std::fs::write(d("tampered.json"), r.to_string()).unwrap();
    let tampered = tenet()
        .args([
            "receipt",
            "verify",
            &d("tampered.json"),
            "--coordinator",
            &ckey,
        ])
        .output()
        .unwrap();
    assert!(!tampered.status.success());
    assert!(
        String::from_utf8_lossy(&tampered.stderr).contains("does NOT verify"),
        "{}",
        String::from_utf8_lossy(&tampered.stderr)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The later stages' nodes fetched the boundary tensors from the nodes that agreed on
    // them, each with the coordinator's grant (no node trusts another): the coordinator
    // relayed none of them.
    let metric = |text: &str, line: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    let metrics: Vec<String> = urls
        .iter()
        .map(|u| {
            let c = tenet_net::NodeClient::new(u, tenet_net::identity::generate()).unwrap();
            let req = tenet_net::RawRequest {
                method: tenet_net::Method::GET,
                path: "/metrics".into(),
                headers: vec![],
                body: tenet_net::Bytes::new(),
            };
            String::from_utf8(rt.block_on(c.send(req)).unwrap().body.to_vec()).unwrap()
        })
        .collect();
    let served: u64 = metrics
        .iter()
        .map(|t| {
            metric(
                t,
                "tenet_requests_total{route=\"tensor_by_hash\",status=\"200\"}",
            )
        })
        .sum();
    assert!(served >= 6, "boundary tensors served to peers: {served}");
    // Each node's metrics and event log say which stage each of its jobs was.
    for stage in 1..=3 {
        let line = format!("tenet_stage_jobs_total{{stage=\"{stage}\"}}");
        let jobs: u64 = metrics.iter().map(|t| metric(t, &line)).sum();
        assert_eq!(jobs, 3, "stage {stage} ran on three nodes");
    }
    let log = std::fs::read_to_string(d("events0.jsonl")).unwrap();
    assert!(
        log.contains(&format!("\"pipeline\":\"{pipeline}\"")),
        "{log}"
    );
    assert!(log.contains("\"stage\":\"2/3\""), "{log}");
    // Without a grant from the coordinator a node serves no tensor to a stranger; a grant
    // signed by another key, or for another tensor, opens nothing.
    let boundary = r["stages"][0]["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"].as_str().unwrap().starts_with('%'))
        .unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let hash = tenet_proto::Hash::parse(&boundary).unwrap();
    let fetch = |grant: Option<tenet_proto::grant::PullGrant>| {
        let c = tenet_net::NodeClient::new(&urls[0], tenet_net::identity::generate()).unwrap();
        let mut req = c.signed(
            tenet_net::Method::GET,
            &format!("/v1/tensors/{boundary}"),
            tenet_net::Bytes::new(),
        );
        if let Some(g) = grant {
            req.headers
                .push((tenet_proto::grant::GRANT_HEADER.into(), g.to_header()));
        }
        rt.block_on(c.send(req)).unwrap().status
    };
    let now = tenet_proto::unix_now();
    let stranger = tenet_proto::auth::KeyPair::from_seed([3; 32]);
    assert_eq!(fetch(None), 403);
    let forged = tenet_proto::grant::PullGrant::sign(hash, now, &stranger);
    assert_eq!(fetch(Some(forged)), 403);
    // Manifests that do not chain, or name stages that are not deployed, are refused at
    // deploy with a message that says so.
    let http = tenet_net::NodeClient::new(&curl, tenet_net::identity::generate()).unwrap();
    let post = |body: String| {
        let req = tenet_net::RawRequest {
            method: tenet_net::Method::POST,
            path: "/v1/pipelines".into(),
            headers: vec![
                ("authorization".into(), "Bearer secret".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: tenet_net::Bytes::from(body),
        };
        let r = rt.block_on(http.send(req)).unwrap();
        (r.status, String::from_utf8_lossy(&r.body).to_string())
    };
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("split/manifest.json")).unwrap()).unwrap();
    let mut types = good.clone();
    types["stages"][1]["boundary_in"][0]["dtype"] = "f16".into();
    let (status, body) = post(types.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("does not chain"), "{body}");
    let mut missing = good.clone();
    missing["stages"].as_array_mut().unwrap().remove(1);
    let (status, body) = post(missing.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("does not chain"), "{body}");
    let mut undeployed = good.clone();
    undeployed["stages"][0]["graph"] = "ab".repeat(32).into();
    let (status, body) = post(undeployed.to_string());
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not deployed"), "{body}");
    let (status, body) = post(good.to_string());
    assert_eq!(status, 200, "{body}");
    drop(nodes);
    // Every node and the coordinator keep the weights they were sent: hundreds of MB.
    let _ = std::fs::remove_dir_all(&dir);
}

/// SmolLM2's prompt pass (the f32 weights, 514 MiB by its certificate) over three nodes that
/// each take 300 MiB: split in three, deployed as one pipeline, its logits and KV rows are the
/// whole graph's local run, byte for byte. Needs SmolLM2 in the cache.
#[test]
fn smollm2_prompt_split_over_nodes_smaller_than_the_model() {
    let Ok(dir) = tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2) else {
        eprintln!("SKIPPED: SmolLM2 is not in the cache (tenet models fetch smollm2)");
        return;
    };
    let gguf = tenet_models::fetch::find_file(&dir, tenet_models::smollm2::GGUF_FILE).unwrap();
    let gguf = gguf.to_str().unwrap();
    let root = tmp("smollm2");
    let d = |p: &str| root.join(p).to_str().unwrap().to_string();
    ok(tenet()
        .args([
            "export",
            "smollm2-prefill",
            "-o",
            &d("sm.tnt"),
            "--seq",
            "6",
        ])
        .output()
        .unwrap());
    let split: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args(["split", &d("sm.tnt"), "--stages", "3", "-o", &d("split")])
        .args(["--weights", gguf, "--json"])
        .output()
        .unwrap()))
    .unwrap();
    let whole = tenet_ir::decode_any(&std::fs::read(d("sm.tnt")).unwrap())
        .unwrap()
        .cost()
        .peak_bytes;
    let limit: u64 = 300 << 20;
    for s in split["stages"].as_array().unwrap() {
        assert!(s["peak_bytes"].as_u64().unwrap() < limit, "{s}");
    }
    assert!(
        whole > limit,
        "the whole model ({whole} bytes) must not fit one node"
    );
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
        "--replicas",
        "2",
    ]);
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ckey, curl) = (words[2].to_string(), words.last().unwrap().to_string());
    let limit_arg = limit.to_string();
    let mut nodes = Vec::new();
    for i in 0..2 {
        let (p, url) = common::spawn_node(
            &d(&format!("node{i}")),
            &ckey,
            &["--memory-limit", &limit_arg],
        );
        ok(tenet()
            .args(["register", &url, "--stake", "1000", "--coordinator", &curl])
            .args(["--admin-key", "admin"])
            .output()
            .unwrap());
        nodes.push(p);
    }
    let remote = ["--coordinator", curl.as_str(), "--api-key", "secret"];
    let deployed: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args(["deploy", &d("split"), "--json"])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(
        deployed["nodes_able"],
        serde_json::json!([2, 2, 2]),
        "{deployed}"
    );
    // "The capital of France is" in SmolLM2's vocabulary.
    std::fs::write(d("ids.json"), "[504, 3575, 282, 4649, 314, 253]").unwrap();
    let input = format!("ids={}", d("ids.json"));
    let out = ok(tenet()
        .args(["call", deployed["id"].as_str().unwrap(), "-i", &input])
        .args(["-o", &d("y.safetensors"), "--receipt", &d("receipt.json")])
        .args(remote)
        .output()
        .unwrap());
    assert!(out.contains("verified in 3 stage(s)"), "{out}");
    ok(tenet()
        .args(["run", &d("sm.tnt"), "--weights", gguf, "-i", &input])
        .args(["-o", &d("local.safetensors")])
        .output()
        .unwrap());
    assert_eq!(
        std::fs::read(d("y.safetensors")).unwrap(),
        std::fs::read(d("local.safetensors")).unwrap(),
        "the pipeline's outputs and the whole graph's differ"
    );
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
    assert!(verified.contains("3 stage(s) chained"), "{verified}");
    drop(nodes);
    // The split, the coordinator's and the nodes' stores hold the weights several times over:
    // gigabytes.
    let _ = std::fs::remove_dir_all(&root);
}

/// `tenet generate --nodes`: SmolLM2 in three stages on three node processes whose
/// `--memory-limit` (60 MiB) is below the whole model's certificates (~100 MB: asked to run it
/// as one stage, a node refuses), each stage's KV cache resident in its node's session, a
/// fourth and a fifth node spare. The stage-2 node is killed after the first tokens: a spare
/// takes its stage, rebuilt from the rows it was given so far; later the stage-3 node hangs
/// (SIGSTOP): given up on after a few seconds, the other spare takes its stage. The text is the
/// local `tenet generate`'s, byte for byte; sampled text too.
#[test]
fn smollm2_generation_across_nodes_survives_a_killed_stage() {
    use std::io::Read;
    if tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2).is_err() {
        eprintln!("SKIPPED: SmolLM2 is not in the cache (tenet models fetch smollm2)");
        return;
    }
    let root = tmp("generate");
    let prompt = "Write a story about a dragon who";
    let local = ok(tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "40"])
        .output()
        .unwrap());
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    let limit = (60u64 << 20).to_string();
    for i in 0..5 {
        let dir = root.join(format!("node{i}"));
        let (p, url) = common::spawn_open_node(dir.to_str().unwrap(), &["--memory-limit", &limit]);
        urls.push(url);
        nodes.push(Some(p));
    }
    // The whole model as one stage does not fit such a node.
    let whole = tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "2"])
        .args(["--nodes", &urls[0]])
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&whole.stderr);
    assert!(!whole.status.success(), "{why}");
    assert!(why.contains("this node runs jobs of up to"), "{why}");
    let mut child = tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "40"])
        .args(["--stages", "3", "--nodes", &urls.join(",")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // The prompt is echoed first; a few generated bytes later, kill stage 2's node.
    let mut seen = Vec::new();
    let mut buf = [0u8; 64];
    while seen.len() < prompt.len() + 4 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "generation ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    drop(nodes[1].take());
    while seen.len() < prompt.len() + 60 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "generation ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let hung = nodes[2].as_ref().unwrap().id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &hung])
            .status()
            .unwrap()
            .success()
    );
    stdout.read_to_end(&mut seen).unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &hung])
        .status();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    assert_eq!(String::from_utf8(seen).unwrap(), local, "{err}");
    // Spares are taken in the order given.
    let line = |failed: &str| {
        err.lines()
            .find(|l| l.contains(&format!("{failed} failed (")))
            .unwrap_or_else(|| panic!("no line for {failed}: {err}"))
            .to_string()
    };
    let killed = line(&urls[1]);
    assert!(killed.starts_with("stage 1: "), "{killed}");
    assert!(
        killed.ends_with(&format!("rebuilt on {} from the tokens so far", urls[3])),
        "{killed}"
    );
    let hung = line(&urls[2]);
    assert!(hung.starts_with("stage 2: "), "{hung}");
    assert!(hung.contains("did not answer within"), "{hung}");
    assert!(
        hung.ends_with(&format!("rebuilt on {} from the tokens so far", urls[4])),
        "{hung}"
    );
    assert!(err.contains("stage layers 10..20"), "{err}");
    // Sampled (seed, temperature, top-p) on the nodes still up: the local run's text too.
    let sampled = ["--seed", "7", "--temperature", "0.8", "--top-p", "0.9"];
    let local = ok(tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "12"])
        .args(sampled)
        .output()
        .unwrap());
    let up = [urls[0].as_str(), urls[4].as_str(), urls[3].as_str()].join(",");
    let across = ok(tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "12"])
        .args(sampled)
        .args(["--nodes", &up])
        .output()
        .unwrap());
    assert_eq!(across, local);
    drop(nodes);
    let _ = std::fs::remove_dir_all(&root);
}

/// `tenet generate --nodes --replicas 3`: every stage on three nodes at once, one of them
/// lying about its rows (`--cheat flip`): the majority's bits go on, the liar is replaced by
/// the spare, and the text is the local run's.
#[test]
fn smollm2_generation_across_nodes_outvotes_a_lying_stage_node() {
    if tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2).is_err() {
        eprintln!("SKIPPED: SmolLM2 is not in the cache (tenet models fetch smollm2)");
        return;
    }
    let root = tmp("generate-r3");
    let prompt = "The capital of France is";
    let local = ok(tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "12"])
        .output()
        .unwrap());
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    // Stage 0 on nodes 0-2, stage 1 on nodes 3-5 (node 4 lies), node 6 spare.
    for i in 0..7 {
        let dir = root.join(format!("node{i}"));
        let cheat: &[&str] = if i == 4 { &["--cheat", "flip"] } else { &[] };
        let (p, url) = common::spawn_open_node(dir.to_str().unwrap(), cheat);
        urls.push(url);
        nodes.push(p);
    }
    let out = tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "12"])
        .args([
            "--stages",
            "2",
            "--replicas",
            "3",
            "--nodes",
            &urls.join(","),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), local, "{err}");
    assert!(
        err.contains(&format!(
            "stage 1: {} failed (its answer differed from the majority's); rebuilt on {}",
            urls[4], urls[6]
        )),
        "{err}"
    );
    assert_eq!(err.matches(" failed (").count(), 1, "{err}");
    drop(nodes);
    let _ = std::fs::remove_dir_all(&root);
}

/// `tenet bench pipeline` runs end to end: the local decode, then r = 1 and r = 3 across node
/// processes, every run with the local tokens, and the figures in its JSON.
#[test]
fn bench_pipeline_reports_both_replications() {
    if tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2).is_err() {
        eprintln!("SKIPPED: SmolLM2 is not in the cache (tenet models fetch smollm2)");
        return;
    }
    let out = ok(tenet()
        .args(["bench", "pipeline", "--tokens", "6", "--stages", "2"])
        .args(["--threads", "1", "--json"])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["same_tokens"], true, "{v}");
    assert_eq!(v["stages"], serde_json::json!([[0, 15], [15, 30]]), "{v}");
    for run in ["local", "r1", "r3"] {
        assert!(v[run]["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert_eq!(v["r1"]["stage_us_per_token"].as_array().unwrap().len(), 2);
    assert!(v["hop_overhead_us"].is_number(), "{v}");
}

/// `tenet generate --coordinator`: the coordinator cuts the deployed SmolLM2 into two stages,
/// picks three of its six staked nodes for each (one lying with `--cheat flip`), and drives
/// them. The liar is outvoted and slashed, the text is the local run's, and the staged receipt
/// verifies offline; one with a token changed does not.
#[test]
fn smollm2_staged_generation_through_the_coordinator_slashes_a_liar() {
    if tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2).is_err() {
        eprintln!("SKIPPED: SmolLM2 is not in the cache (tenet models fetch smollm2)");
        return;
    }
    let root = tmp("staged");
    let d = |p: &str| root.join(p).to_str().unwrap().to_string();
    let prompt = "The capital of France is";
    let local: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args([
            "generate",
            "--prompt",
            prompt,
            "--max-tokens",
            "10",
            "--json",
        ])
        .output()
        .unwrap()))
    .unwrap();
    let (_coord, line) = spawn([
        "coordinator",
        "--open",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &d("coord"),
        "--replicas",
        "3",
    ]);
    let curl = common::url_of(&line);
    let ckey = line.split_whitespace().nth(2).unwrap().to_string();
    let mut nodes = Vec::new();
    for i in 0..6 {
        let mut extra = vec!["--coordinator", curl.as_str(), "--stake", "1000"];
        if i == 4 {
            extra.extend(["--cheat", "flip"]);
        }
        nodes.push(common::spawn_node(&d(&format!("node{i}")), &ckey, &extra));
    }
    ok(tenet()
        .args(["deploy", "--model", "smollm2", "--coordinator", &curl])
        .output()
        .unwrap());
    // Nodes join by themselves: retry while not all six have.
    let mut answer = None;
    for _ in 0..40 {
        let o = tenet()
            .args([
                "generate",
                "--prompt",
                prompt,
                "--max-tokens",
                "10",
                "--json",
            ])
            .args(["--coordinator", &curl, "--stages", "2"])
            .output()
            .unwrap();
        if o.status.success() {
            answer = Some(String::from_utf8(o.stdout).unwrap());
            break;
        }
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(err.contains("node"), "{err}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let v: serde_json::Value =
        serde_json::from_str(&answer.expect("all six nodes joined")).unwrap();
    assert_eq!(v["tokens"], local["tokens"], "{v}");
    let slashed = v["slashed"].as_array().unwrap();
    assert_eq!(slashed.len(), 1, "{v}");
    assert!(slashed[0]["amount"].as_i64().unwrap() > 0, "{v}");
    assert_eq!(v["receipt"]["outvoted"].as_array().unwrap().len(), 1, "{v}");
    assert!(
        v["replaced"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("differed from the majority"),
        "{v}"
    );
    // As a user reads it: the local run's text, and where each stage ran.
    let plain = tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "10"])
        .args(["--coordinator", &curl, "--stages", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&plain.stderr).to_string();
    assert!(plain.status.success(), "{err}");
    let local_text = ok(tenet()
        .args(["generate", "--prompt", prompt, "--max-tokens", "10"])
        .output()
        .unwrap());
    assert_eq!(
        String::from_utf8(plain.stdout).unwrap(),
        local_text,
        "{err}"
    );
    assert!(err.contains("staged receipt verified"), "{err}");
    assert!(err.contains("stage layers 15..30: agreed by"), "{err}");
    let file = d("receipt.json");
    std::fs::write(&file, v["receipt"].to_string()).unwrap();
    let checked = ok(tenet()
        .args(["receipt", "verify", &file, "--coordinator", &ckey])
        .output()
        .unwrap());
    assert!(checked.contains("verified: staged generation"), "{checked}");
    let mut tampered = v["receipt"].clone();
    tampered["tokens"][0] = serde_json::json!(7);
    std::fs::write(&file, tampered.to_string()).unwrap();
    let refused = tenet().args(["receipt", "verify", &file]).output().unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("does NOT verify"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    drop(nodes);
    let _ = std::fs::remove_dir_all(&root);
}
