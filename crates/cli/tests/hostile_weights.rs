//! Weights files built to amplify (issue 29), given to real processes on 127.0.0.1: a GGUF whose
//! 3000 Q4_1 tensors all point at the same 1 MB (about 20 GB once dequantised) as a node's job
//! weights, as a coordinator's deploy weights and run body, and to `tenet inspect`/`tenet run`;
//! and a well-formed GGUF whose dequantised size passes a node's memory limit. Each is refused
//! with a 4xx (or a failing exit) that says why, and the servers keep serving.
//!
//! The processes run under an address-space limit (`ulimit -v`), so that a regression that
//! allocates what the file claims fails here, as an allocation failure, rather than taking
//! the machine's memory.

use std::path::Path;
use std::process::{Command, Output};

use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, WeightsId};
use tenet_net::{ClientError, Method, NodeClient, RawRequest, identity};
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::RunJob;
use tenet_proto::{ErrorCode, Hash, tensor};

mod common;

use common::{Proc, url_of};

/// Address space each process may take, in KiB (4 GiB): far above what any of these needs
/// (under 200 MiB here), far below the 20 GB the amplifying file claims.
const ADDRESS_SPACE_KIB: u64 = 4 << 20;

/// Blocks of Q4_1 (20 bytes each) in about 1 MB.
const MB_OF_BLOCKS: usize = (1 << 20) / 20;

/// `tenet ARGS` under the address-space limit, with few malloc arenas (each reserves 64 MiB of
/// address space per thread that contends).
fn limited() -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_tenet"))
        .env("MALLOC_ARENA_MAX", "2")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    c
}

/// Start a `tenet` service under the limit; it and its `… listening on http://…` line.
fn spawn_limited(args: &[&str]) -> (Proc, String) {
    let mut c = limited();
    c.args(args);
    common::spawn_service(c)
}

/// A directory removed when the test ends.
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tenet-hostile-weights-{name}-"))
        .tempdir()
        .unwrap()
}

/// `n` Q4_1 blocks (scale 1/8 and offset -1 as f16, then 16 bytes of nibbles).
fn q4_1_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * 20);
    for i in 0..n {
        b.extend([0x00, 0x30, 0x00, 0xbc]);
        b.extend((0..16).map(|j| (i * 31 + j * 7) as u8));
    }
    b
}

/// A GGUF v3 file of 1-D Q4_1 tensors `(name, elements, offset in the data section)` over
/// `data`.
fn gguf(tensors: &[(String, u64, u64)], data: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend(0u64.to_le_bytes());
    for (name, n, offset) in tensors {
        b.extend((name.len() as u64).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(n.to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(data);
    b
}

/// 3000 Q4_1 tensors over the same ~1 MB: ~20 GB of f32 if dequantised.
fn bomb() -> Vec<u8> {
    let n = MB_OF_BLOCKS as u64 * 32;
    let tensors: Vec<_> = (0..3000).map(|i| (format!("blk.{i}.w"), n, 0)).collect();
    gguf(&tensors, &q4_1_blocks(MB_OF_BLOCKS))
}

/// `count` disjoint Q4_1 tensors of `blocks` blocks each: well formed, `count × blocks × 128`
/// bytes once dequantised.
fn disjoint(count: usize, blocks: usize) -> Vec<u8> {
    let size = (blocks * 20).next_multiple_of(32) as u64;
    let tensors: Vec<_> = (0..count as u64)
        .map(|i| (format!("blk.{i}.w"), blocks as u64 * 32, i * size))
        .collect();
    let mut data = Vec::new();
    for _ in 0..count {
        data.extend(q4_1_blocks(blocks));
        data.resize(data.len().next_multiple_of(32), 0);
    }
    gguf(&tensors, &data)
}

/// A graph reading tensor `blk.0.w` of `elements` f32 from the weights file `file`.
fn weighted_graph(file: &[u8], elements: u64) -> Graph {
    let g = GraphBuilder::new();
    let w = g.weight(
        WeightsId::of_bytes(file),
        "blk.0.w",
        DType::F32,
        &[elements],
    );
    g.finish(&[("y", &w.relu())]).unwrap()
}

/// y = relu(x) over `n` f32.
fn plain_graph(n: u64) -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[n]);
    g.finish(&[("y", &x.relu())]).unwrap()
}

fn job(id: &str, task: Hash, weights: Option<Hash>, inputs: &[(&str, &HostTensor)]) -> RunJob {
    RunJob {
        job: JobSpec {
            job_id: id.to_string(),
            task,
            weights,
            inputs: inputs
                .iter()
                .map(|(n, t)| (n.to_string(), tensor::hash(t)))
                .collect(),
            tier: Tier::Exact,
            seed: 0,
        },
        timeout_ms: None,
        pulls: Default::default(),
        stage: None,
        blobs: inputs
            .iter()
            .map(|(_, t)| (tensor::hash(t), tenet_proto::to_hex(&tensor::encode(t))))
            .collect(),
    }
}

/// A node under the address-space limit that trusts `key`, after its data directory (so that
/// the directory outlives it).
fn node(name: &str, key: &KeyPair, memory_limit: &str) -> (tempfile::TempDir, Proc, NodeClient) {
    let dir = temp_dir(name);
    let pk = key.public().to_hex();
    let (child, line) = spawn_limited(&[
        "node",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--threads",
        "1",
        "--no-fsync",
        "--trust",
        &pk,
        "--memory-limit",
        memory_limit,
    ]);
    let addr = url_of(&line).trim_start_matches("http://").to_string();
    (dir, child, NodeClient::new(&addr, key.clone()).unwrap())
}

/// The node still answers `/v1/info` and still runs a small job.
async fn still_serving(c: &NodeClient, id: &str) {
    c.info().await.expect("/v1/info answers");
    let graph = plain_graph(4);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let x = HostTensor::from_f32(&[4], &[-1.0, 2.0, -3.0, 4.0]).unwrap();
    let committed = c.run_job(&job(id, task, None, &[("x", &x)])).await;
    assert!(
        committed.is_ok(),
        "a small job after the refusal: {committed:?}"
    );
}

/// The refusal's status, code and message.
fn refusal(e: ClientError) -> (u16, ErrorCode, String) {
    match e {
        ClientError::Api { status, error } => (status, error.code, error.message),
        other => panic!("expected a refusal with a status, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_2g_memory_limit_refuses_the_amplifying_gguf_and_keeps_serving() {
    let key = identity::generate();
    let (_dir, _node, c) = node("bomb", &key, "2G");
    let bomb = bomb();
    let graph = weighted_graph(&bomb, MB_OF_BLOCKS as u64 * 32);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let weights = c.put_blob(bomb).await.unwrap().hash;
    let e = c
        .run_job(&job("bomb", task, Some(weights), &[]))
        .await
        .expect_err("refused");
    let (status, code, message) = refusal(e);
    assert_eq!((status, code), (422, ErrorCode::BadInputs), "{message}");
    assert!(
        message.contains("is not a usable GGUF file")
            && message.contains("\"blk.1.w\": its data")
            && message.contains("overlaps tensor \"blk.0.w\"'s"),
        "{message}"
    );
    still_serving(&c, "after-bomb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_weights_that_dequantise_past_its_memory_limit_and_keeps_serving() {
    // 40 disjoint tensors of 512 KiB of f32 each (20 MiB) from 3.2 MB, on a 16 MiB node; the
    // job reads one of them, so its certificate fits.
    let key = identity::generate();
    let (_dir, _node, c) = node("over", &key, "16M");
    let file = disjoint(40, 4096);
    let graph = weighted_graph(&file, 4096 * 32);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let weights = c.put_blob(file).await.unwrap().hash;
    let e = c
        .run_job(&job("over", task, Some(weights), &[]))
        .await
        .expect_err("refused");
    let (status, code, message) = refusal(e);
    assert_eq!((status, code), (422, ErrorCode::ExceedsLimits), "{message}");
    assert!(
        message.contains(&format!("weights file {}", weights.short()))
            && message.contains("above the limit of 16777216 bytes"),
        "{message}"
    );
    still_serving(&c, "after-over").await;
}

/// A coordinator request with the API key; (status, JSON body).
async fn call(
    http: &NodeClient,
    method: Method,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let req = RawRequest {
        method,
        path: path.to_string(),
        headers: vec![
            ("authorization".into(), "Bearer secret".into()),
            ("content-type".into(), content_type.into()),
        ],
        body: body.into(),
    };
    let r = http.send(req).await.unwrap();
    let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_refuses_the_amplifying_gguf_as_deploy_weights_and_as_a_run_body() {
    let dir = temp_dir("coordinator");
    let (_coordinator, line) = spawn_limited(&[
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().join("coord").to_str().unwrap(),
        "--api-key",
        "secret",
    ]);
    let http = NodeClient::new(&url_of(&line), identity::generate()).unwrap();
    let bomb = bomb();
    let octets = "application/octet-stream";
    // Deploy weights: the blob is stored, the task that binds it is refused.
    let hash = Hash::of(&bomb);
    let (status, v) = call(
        &http,
        Method::PUT,
        &format!("/v1/blobs/{hash}"),
        octets,
        bomb.clone(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let graph = weighted_graph(&bomb, MB_OF_BLOCKS as u64 * 32);
    let (status, v) = call(&http, Method::POST, "/v1/tasks", octets, graph.to_bytes()).await;
    let text = v.to_string();
    assert_eq!(status, 422, "{text}");
    assert!(
        text.contains("is not a usable GGUF file") && text.contains("overlaps"),
        "{text}"
    );
    // A run's body: a task whose input is large enough for the file to be sent as its body.
    let plain = plain_graph(1 << 19);
    let (status, v) = call(&http, Method::POST, "/v1/tasks", octets, plain.to_bytes()).await;
    assert_eq!(status, 200, "{v}");
    let id = v["id"].as_str().expect("the task's id").to_string();
    let (status, v) = call(
        &http,
        Method::POST,
        &format!("/v1/tasks/{id}/run"),
        octets,
        bomb,
    )
    .await;
    let text = v.to_string();
    assert!((400..500).contains(&status), "{status}: {text}");
    assert!(
        text.contains("is not a usable GGUF file") && text.contains("overlaps"),
        "{status}: {text}"
    );
    // Still serving.
    let (status, v) = call(&http, Method::GET, "/v1/info", "text/plain", Vec::new()).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(
        &http,
        Method::GET,
        &format!("/v1/tasks/{id}"),
        octets,
        vec![],
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

fn failed_with(o: &Output, wants: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "succeeded: {err}");
    for w in wants {
        assert!(err.contains(w), "no {w:?} in: {err}");
    }
}

#[test]
fn tenet_inspect_and_run_refuse_the_amplifying_gguf_with_a_clear_message() {
    let dir = temp_dir("cli");
    let bomb = bomb();
    let graph = weighted_graph(&bomb, MB_OF_BLOCKS as u64 * 32);
    let (g, w) = (dir.path().join("graph.tnt"), dir.path().join("bomb.gguf"));
    std::fs::write(&g, graph.to_bytes()).unwrap();
    std::fs::write(&w, &bomb).unwrap();
    let wants = [
        "bomb.gguf is not a usable GGUF file",
        "\"blk.1.w\": its data",
        "overlaps tensor \"blk.0.w\"'s",
    ];
    let inspect = limited()
        .arg("inspect")
        .arg(&g)
        .arg("--weights")
        .arg(&w)
        .output()
        .unwrap();
    failed_with(&inspect, &wants);
    let run = limited()
        .arg("run")
        .arg(&g)
        .arg("--weights")
        .arg(&w)
        .output()
        .unwrap();
    failed_with(&run, &wants);
}
