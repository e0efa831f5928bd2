//! `tenet node` as a real process on 127.0.0.1, driven through the signed client and, where a
//! client would refuse to misbehave, through raw sockets.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tenet_devices::{CpuDevice, SimdLevel};
use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_net::{Method, NodeClient, identity};
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::{Batch, JobState, OpResult, RunJob, SessionOp};
use tenet_proto::{ErrorCode, Hash, tensor};

mod common;

use common::{Proc, spawn_tenet, url_of};

/// A node process, killed when dropped.
struct NodeProc {
    child: Proc,
    addr: String,
    dir: PathBuf,
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tenet-node-test-{}-{name}-{}",
        std::process::id(),
        identity::random_bytes::<4>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl NodeProc {
    fn start(dir: &Path, extra: &[&str]) -> NodeProc {
        let dir_arg = dir.to_str().expect("a UTF-8 temporary path");
        let mut args = vec!["node", "--listen", "127.0.0.1:0", "--data-dir", dir_arg];
        args.extend(["--threads", "1"]);
        args.extend_from_slice(extra);
        let (child, line) = spawn_tenet(args);
        let url = url_of(&line);
        NodeProc {
            addr: url.trim_start_matches("http://").to_string(),
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn client(&self, key: &KeyPair) -> NodeClient {
        NodeClient::new(&self.addr, key.clone()).unwrap()
    }
}

/// A client key, and a node that trusts it.
fn trusted_node(name: &str, extra: &[&str]) -> (NodeProc, KeyPair) {
    let key = identity::generate();
    let pk = key.public().to_hex();
    let mut args = vec!["--trust", pk.as_str()];
    args.extend_from_slice(extra);
    (NodeProc::start(&temp_dir(name), &args), key)
}

/// y = tanh(x @ w) + b over small shapes.
fn small_graph() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4, 8]);
    let w = g.input("w", DType::F32, &[8, 3]);
    let b = g.input("b", DType::F32, &[3]);
    let y = x.matmul(&w).tanh().add(&b);
    g.finish(&[("y", &y)]).unwrap()
}

fn tensor_of(shape: &[u64], seed: u32) -> HostTensor {
    let n: u64 = shape.iter().product();
    let v: Vec<f32> = (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    HostTensor::from_f32(shape, &v).unwrap()
}

fn local_run(graph: &Graph, inputs: &HashMap<String, HostTensor>) -> Vec<(String, HostTensor)> {
    CpuDevice::new(1, SimdLevel::Portable)
        .compile(graph)
        .unwrap()
        .run(inputs, &tenet_ir::NoWeights, 0)
        .unwrap()
}

fn job(id: &str, task: Hash, inputs: &[(&str, &HostTensor)]) -> RunJob {
    RunJob {
        job: JobSpec {
            job_id: id.to_string(),
            task,
            weights: None,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_run_commit_reveal() {
    let (node, key) = trusted_node("happy", &[]);
    let c = node.client(&key);
    let info = c.info().await.unwrap();
    assert!(!info.open);
    let graph = small_graph();
    let stored = c.put_blob(graph.to_bytes()).await.unwrap();
    assert_eq!(stored.hash, Hash::from(graph.id()));
    assert!(!stored.existed);
    assert!(
        c.put_blob(graph.to_bytes()).await.unwrap().existed,
        "skipped after HEAD"
    );
    let (x, w, b) = (
        tensor_of(&[4, 8], 1),
        tensor_of(&[8, 3], 2),
        tensor_of(&[3], 3),
    );
    // x goes up as a blob; w and b travel inline with the job.
    c.put_blob(tensor::encode(&x)).await.unwrap();
    let mut req = job("job-1", stored.hash, &[("x", &x), ("w", &w), ("b", &b)]);
    req.blobs.remove(&tensor::hash(&x));
    let committed = c.run_job(&req).await.unwrap();
    let commitment = &committed.commitment;
    assert!(commitment.verify());
    assert_eq!(commitment.node, info.node_id);
    assert_eq!(commitment.job, req.job);
    assert_eq!(
        c.job_status("job-1").await.unwrap().state,
        JobState::Committed
    );
    let revealed = c.reveal("job-1").await.unwrap();
    assert!(revealed.reveal.opens(commitment));
    assert_eq!(
        c.job_status("job-1").await.unwrap().state,
        JobState::Revealed
    );
    let inputs = HashMap::from([("x".into(), x), ("w".into(), w), ("b".into(), b)]);
    let expected = local_run(&graph, &inputs);
    let out = &revealed.reveal.outputs[0];
    assert_eq!(out.name, "y");
    assert_eq!(
        out.hash,
        tensor::hash(&expected[0].1),
        "bit-identical to a local run"
    );
    let blob = tenet_proto::from_hex(&revealed.blobs[&out.hash]).unwrap();
    assert_eq!(
        tensor::decode(&blob).unwrap().bytes(),
        expected[0].1.bytes()
    );
    let again = c.run_job(&req).await.unwrap_err();
    assert_eq!(
        again.code(),
        Some(ErrorCode::Conflict),
        "job ids are single-use"
    );

    // A job with weights: a safetensors file uploaded as a blob, named by its hash.
    let wdata: Vec<u8> = tensor_of(&[8, 3], 5).bytes().to_vec();
    let file =
        tenet_models::write_safetensors(&[("fc.weight", DType::F32, vec![8, 3], wdata)]).unwrap();
    let wid = tenet_ir::WeightsId::of_bytes(&file);
    let g = GraphBuilder::new();
    let xin = g.input("x", DType::F32, &[4, 8]);
    let fc = g.weight(wid, "fc.weight", DType::F32, &[8, 3]);
    let weighted = g.finish(&[("y", &xin.matmul(&fc).relu())]).unwrap();
    let wtask = c.put_blob(weighted.to_bytes()).await.unwrap().hash;
    let wblob = c.put_blob(file.clone()).await.unwrap().hash;
    c.pin(&wblob, true).await.unwrap();
    let xw = tensor_of(&[4, 8], 6);
    let mut req = job("job-weights", wtask, &[("x", &xw)]);
    let e = c.run_job(&req).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(ErrorCode::BadInputs),
        "weights not named: {e}"
    );
    req.job.job_id = "job-weights-2".into();
    req.job.weights = Some(wblob);
    let committed = c.run_job(&req).await.unwrap();
    let revealed = c.reveal("job-weights-2").await.unwrap();
    assert!(revealed.reveal.opens(&committed.commitment));
    let wf = tenet_models::WeightsFile::from_bytes(file, "w").unwrap();
    let expected = CpuDevice::new(1, SimdLevel::Portable)
        .compile(&weighted)
        .unwrap()
        .run(
            &HashMap::from([("x".into(), xw)]),
            &tenet_models::WeightSet(vec![wf]),
            0,
        )
        .unwrap();
    assert_eq!(
        revealed.reveal.outputs[0].hash,
        tensor::hash(&expected[0].1)
    );

    // A large output is stored as a blob instead of travelling inline. At over 1 MiB it is
    // hashed in parallel subtrees, sent as header and tensor bytes unjoined, and received into
    // a recycled buffer.
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[600, 600]);
    let big = g.finish(&[("e", &a.exp())]).unwrap();
    let task = c.put_blob(big.to_bytes()).await.unwrap().hash;
    let a_t = tensor_of(&[600, 600], 4);
    let committed = c
        .run_job(&job("job-big", task, &[("a", &a_t)]))
        .await
        .unwrap();
    let revealed = c.reveal("job-big").await.unwrap();
    assert!(revealed.reveal.opens(&committed.commitment));
    assert!(revealed.blobs.is_empty());
    let h = revealed.reveal.outputs[0].hash;
    let bytes = c.get_blob(&h).await.unwrap();
    assert_eq!(Hash::of(&bytes), h);
    let expected = local_run(&big, &HashMap::from([("a".into(), a_t)]));
    assert_eq!(
        tensor::decode(&bytes).unwrap().bytes(),
        expected[0].1.bytes()
    );
    // The output reaches the store in the background; once there (and fetched), the memory
    // copy is dropped and later fetches read the disk.
    let mut stored = false;
    for _ in 0..200 {
        stored = c.has_blob(&h).await.unwrap().is_some();
        if stored {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(stored, "a large output is written to the blob store");
    assert_eq!(c.get_blob(&h).await.unwrap(), bytes);
    assert_eq!(c.get_blob(&h).await.unwrap(), bytes);
}

/// Send bytes on a fresh socket, half-close, and read the answer: (status, body).
fn raw_http(addr: &str, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn head_with(method: &str, path: &str, headers: &[(String, String)], length: usize) -> String {
    let mut h = format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {length}\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

fn set(headers: &mut [(String, String)], name: &str, value: String) {
    headers.iter_mut().find(|(k, _)| k == name).unwrap().1 = value;
}

/// A graph that runs for a while in little memory: 3000 small matmuls in a chain.
fn slow_graph() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[256, 256]);
    let mut y = x.clone();
    for _ in 0..3000 {
        y = y.matmul(&x).tanh();
    }
    g.finish(&[("y", &y)]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clear_4xx_and_the_node_keeps_serving() {
    // 4 MiB: the slow graph's certificate (768 KiB) plus the executor's scratch (its GEMM
    // packing, the run's tables) fits; the 8 MiB graph below does not.
    let (node, key) = trusted_node("hostile", &["--memory-limit", "4M"]);
    let c = node.client(&key);
    let expect = |r: tenet_net::RawResponse, status: u16, code: ErrorCode| {
        assert_eq!(r.status, status, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.error().expect("an error body").code, code);
    };
    let path = "/v1/jobs/nope";

    // A forged signature: one bit changed.
    let mut r = c.signed(Method::GET, path, vec![]);
    let sig = r
        .headers
        .iter()
        .find(|(k, _)| k == "x-tenet-signature")
        .unwrap()
        .1
        .clone();
    let flipped = format!("{}{}", if &sig[..1] == "0" { "1" } else { "0" }, &sig[1..]);
    set(&mut r.headers, "x-tenet-signature", flipped);
    expect(c.send(r).await.unwrap(), 401, ErrorCode::BadSignature);
    // A stranger's signature presented under the trusted key.
    let stranger = NodeClient::new(&node.addr, identity::generate()).unwrap();
    let mut r = stranger.signed(Method::GET, path, vec![]);
    set(&mut r.headers, "x-tenet-key", key.public().to_hex());
    expect(c.send(r).await.unwrap(), 401, ErrorCode::BadSignature);
    // The stranger under its own key.
    let r = stranger.signed(Method::GET, path, vec![]);
    expect(
        stranger.send(r).await.unwrap(),
        403,
        ErrorCode::UntrustedKey,
    );
    // No signature at all.
    let r = tenet_net::RawRequest {
        headers: vec![],
        ..c.signed(Method::GET, path, vec![])
    };
    expect(c.send(r).await.unwrap(), 401, ErrorCode::Unauthenticated);
    // A replayed request: the first gets its answer, the copy is refused.
    let r = c.signed(Method::GET, path, vec![]);
    expect(c.send(r.clone()).await.unwrap(), 404, ErrorCode::NotFound);
    expect(c.send(r).await.unwrap(), 401, ErrorCode::ReplayedNonce);
    // A stale timestamp.
    let old = key.sign_request(
        "GET",
        path,
        &Hash::of(b""),
        tenet_proto::unix_now() - 3600,
        [5; 16],
    );
    let headers = old
        .to_pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let r = tenet_net::RawRequest {
        headers,
        ..c.signed(Method::GET, path, vec![])
    };
    expect(c.send(r).await.unwrap(), 401, ErrorCode::StaleTimestamp);
    // A body that is not the signed one.
    let mut r = c.signed(Method::POST, "/v1/jobs", b"{}".to_vec());
    r.body = tenet_net::Bytes::from_static(b"{ }");
    expect(c.send(r).await.unwrap(), 401, ErrorCode::BadSignature);

    // A blob whose bytes do not match its address (signed honestly over that address).
    let claimed = Hash::of(b"the real bytes");
    let blob_path = format!("/v1/blobs/{claimed}");
    let h = key.sign_request(
        "PUT",
        &blob_path,
        &claimed,
        tenet_proto::unix_now(),
        [6; 16],
    );
    let headers = h
        .to_pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let r = tenet_net::RawRequest {
        method: Method::PUT,
        path: blob_path.clone(),
        headers,
        body: tenet_net::Bytes::from_static(b"other bytes!!!"),
    };
    expect(c.send(r).await.unwrap(), 400, ErrorCode::HashMismatch);
    assert_eq!(c.has_blob(&claimed).await.unwrap(), None);
    // A truncated body: 1000 bytes declared, 10 sent, then the socket closes for writing.
    let headers = c.auth_headers(&Method::PUT, &blob_path, b"the real bytes");
    let headers: Vec<_> = headers
        .into_iter()
        .map(|(k, v)| {
            if k == "x-tenet-body-hash" {
                (k, claimed.to_hex())
            } else {
                (k, v)
            }
        })
        .collect();
    let (status, body) = raw_http(
        &node.addr,
        &head_with("PUT", &blob_path, &headers, 1000),
        b"the real b",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("truncated_body"), "{body}");
    let job_body = b"{\"job_id\":\"t\"}";
    let headers = c.auth_headers(&Method::POST, "/v1/jobs", job_body);
    let (status, body) = raw_http(
        &node.addr,
        &head_with("POST", "/v1/jobs", &headers, 500),
        job_body,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("truncated_body"), "{body}");

    // A graph file of random bytes.
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let junk_task = c.put_blob(junk).await.unwrap().hash;
    let e = c.run_job(&job("junk", junk_task, &[])).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidGraph), "{e}");
    // A graph whose certificate exceeds the node's 4 MiB memory limit.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 20]);
    let huge = g.finish(&[("y", &x.exp())]).unwrap();
    let task = c.put_blob(huge.to_bytes()).await.unwrap().hash;
    let x_t = HostTensor::zeros(tenet_ir::TensorType::new(DType::F32, [1 << 20])).unwrap();
    c.put_blob(tensor::encode(&x_t)).await.unwrap();
    let mut req = job("huge", task, &[("x", &x_t)]);
    req.blobs.clear();
    let e = c.run_job(&req).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ExceedsLimits), "{e}");
    assert!(e.to_string().contains("8388608"), "says what it needs: {e}");
    // Inputs that do not fit the graph.
    let graph = small_graph();
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let wrong = tensor_of(&[5, 8], 1);
    let (w, b) = (tensor_of(&[8, 3], 2), tensor_of(&[3], 3));
    let e = c
        .run_job(&job("wrong", task, &[("x", &wrong), ("w", &w), ("b", &b)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadInputs), "{e}");

    // A reveal before the commit, then cancellation and a timeout.
    let slow = slow_graph();
    assert!(slow.cost().peak_bytes <= 1 << 20);
    let slow_task = c.put_blob(slow.to_bytes()).await.unwrap().hash;
    let s = tensor_of(&[256, 256], 7);
    let slow_job = job("slow-1", slow_task, &[("x", &s)]);
    let runner = node.client(&key);
    let first = slow_job.clone();
    let running = tokio::spawn(async move { runner.run_job(&first).await });
    let started = Instant::now();
    while c.job_status("slow-1").await.ok().map(|s| s.state) != Some(JobState::Running) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the job never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let e = c.reveal("slow-1").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    let e = c.reveal("never-ran").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    c.cancel_job("slow-1").await.unwrap();
    let e = running.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Cancelled), "{e}");
    assert_eq!(
        c.job_status("slow-1").await.unwrap().state,
        JobState::Cancelled
    );
    let mut timed = slow_job.clone();
    timed.job.job_id = "slow-2".into();
    // Long enough that the job's work (10¹¹ units, 209 ms at the top speed admission assumes)
    // could fit, so it is admitted, runs, and is stopped.
    timed.timeout_ms = Some(300);
    let t0 = Instant::now();
    let e = c.run_job(&timed).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));

    // After all of that the node still serves honest work.
    assert!(c.info().await.is_ok());
    let (x, w, b) = (
        tensor_of(&[4, 8], 1),
        tensor_of(&[8, 3], 2),
        tensor_of(&[3], 3),
    );
    let ok = c
        .run_job(&job("fine", task, &[("x", &x), ("w", &w), ("b", &b)]))
        .await
        .unwrap();
    assert!(ok.commitment.verify());
    let metrics = c.metrics().await.unwrap();
    assert!(
        metrics.contains("tenet_jobs_total{outcome=\"refused\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tenet_jobs_total{outcome=\"cancelled\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tenet_jobs_total{outcome=\"timeout\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("route=\"job_run\",status=\"422\""),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_an_upload_leaves_no_partial_blob() {
    let (mut node, key) = trusted_node("kill9", &[]);
    let c = node.client(&key);
    let kept = c.put_blob(vec![1u8; 1 << 20]).await.unwrap().hash;
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let hash = Hash::of(&data);
    let path = format!("/v1/blobs/{hash}");
    let headers = c.auth_headers(&Method::PUT, &path, &data);
    let mut s = std::net::TcpStream::connect(&node.addr).unwrap();
    s.write_all(head_with("PUT", &path, &headers, data.len()).as_bytes())
        .unwrap();
    s.write_all(&data[..1 << 20]).unwrap();
    // Wait until the node is writing the blob, then kill it mid-upload.
    let tmp = node.dir.join("store").join("tmp");
    let started = Instant::now();
    while std::fs::read_dir(&tmp).unwrap().count() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "upload never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    drop(s);
    let dir = node.dir.clone();
    let pk = key.public().to_hex();
    let restarted = NodeProc::start(&dir, &["--trust", &pk]);
    let c = restarted.client(&key);
    assert_eq!(
        c.has_blob(&hash).await.unwrap(),
        None,
        "absent, not partial"
    );
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    assert!(
        c.has_blob(&kept).await.unwrap().is_some(),
        "finished blobs survive"
    );
    assert_eq!(c.get_blob(&kept).await.unwrap().len(), 1 << 20);
    // The same node identity after the restart.
    assert_eq!(
        identity::read_key(&dir.join("node.key")).unwrap().public(),
        c.info().await.unwrap().node_id
    );
    // And the interrupted upload can be made again.
    assert!(!c.put_blob(data).await.unwrap().existed);
    assert!(c.has_blob(&hash).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_tensors_resident_batch_many_ops_and_pull_from_peers() {
    // Two nodes that trust the client and each other (their keys are made before they start).
    let client_key = identity::generate();
    let (dir_a, dir_b) = (temp_dir("peer-a"), temp_dir("peer-b"));
    let (key_a, key_b) = (identity::generate(), identity::generate());
    identity::write_key(&dir_a.join("node.key"), &key_a).unwrap();
    identity::write_key(&dir_b.join("node.key"), &key_b).unwrap();
    let ck = client_key.public().to_hex();
    let a = NodeProc::start(
        &dir_a,
        &["--trust", &ck, "--trust", &key_b.public().to_hex()],
    );
    // B pulls from A: a peer its operator lists.
    let a_url = format!("http://{}", a.addr);
    let b = NodeProc::start(
        &dir_b,
        &[
            "--trust",
            &ck,
            "--trust",
            &key_a.public().to_hex(),
            "--pull-from",
            &a_url,
        ],
    );
    let ca = a.client(&client_key);
    let cb = b.client(&client_key);

    let graph = small_graph();
    let task = ca.put_blob(graph.to_bytes()).await.unwrap().hash;
    let sid = ca.create_session().await.unwrap();
    let (x, w, bias) = (
        tensor_of(&[4, 8], 1),
        tensor_of(&[8, 3], 2),
        tensor_of(&[3], 3),
    );
    ca.put_tensor(&sid, "x", tensor::encode(&x)).await.unwrap();
    ca.put_tensor(&sid, "w", tensor::encode(&w)).await.unwrap();
    // Large uploads (received into reused buffers, kept as views of them) read back whole,
    // also when the next upload under the same name replaces one.
    for seed in [5, 6] {
        let big = tensor_of(&[3, 1 << 18], seed);
        let kept = ca
            .put_tensor(&sid, "big", tensor::encode(&big))
            .await
            .unwrap();
        assert_eq!(kept.hash, tensor::hash(&big));
        assert_eq!(
            ca.get_tensor(&sid, "big").await.unwrap(),
            tensor::encode(&big)
        );
    }
    ca.free_tensor(&sid, "big").await.unwrap();
    let put_b = SessionOp::Put {
        name: "b".into(),
        blob: tenet_proto::to_hex(&tensor::encode(&bias)),
    };
    let run = |out: &str| SessionOp::Run {
        task,
        weights: None,
        inputs: [("x", "x"), ("w", "w"), ("b", "b")]
            .into_iter()
            .map(|(i, n)| (i.to_string(), n.to_string()))
            .collect(),
        outputs: [("y".to_string(), out.to_string())].into(),
        seed: 0,
    };
    // 1000 runs in one round trip, each leaving its output resident.
    let mut ops = vec![put_b];
    ops.extend((0..1000).map(|i| run(&format!("y{}", i % 10))));
    ops.push(SessionOp::Get { name: "y9".into() });
    ops.push(SessionOp::Free { name: "y0".into() });
    let res = ca.batch(&sid, &Batch { ops }).await.unwrap();
    assert!(res.error.is_none(), "{:?}", res.error);
    assert_eq!(res.results.len(), 1003);
    let expected = local_run(
        &graph,
        &HashMap::from([("x".into(), x), ("w".into(), w), ("b".into(), bias)]),
    );
    let y = &expected[0].1;
    let OpResult::Blob(hex) = &res.results[1001] else {
        panic!("get returns a blob")
    };
    assert_eq!(
        tensor::decode(&tenet_proto::from_hex(hex).unwrap())
            .unwrap()
            .bytes(),
        y.bytes()
    );
    let OpResult::Resident(r) = &res.results[1] else {
        panic!("run keeps its outputs")
    };
    assert_eq!(r[0].hash, tensor::hash(y));
    assert_eq!(ca.get_tensor(&sid, "y3").await.unwrap(), tensor::encode(y));
    let e = ca.get_tensor(&sid, "y0").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "freed");
    // A failing op stops the batch and says which.
    let bad = Batch {
        ops: vec![
            SessionOp::Free { name: "y1".into() },
            SessionOp::Free { name: "y1".into() },
            SessionOp::Free { name: "y2".into() },
        ],
    };
    let res = ca.batch(&sid, &bad).await.unwrap();
    assert_eq!(res.results.len(), 1);
    assert_eq!(res.error.as_ref().unwrap().index, 1);
    assert_eq!(res.error.unwrap().error.code, ErrorCode::NotFound);

    // Node B pulls y3 from node A by hash, node to node.
    let sid_b = cb.create_session().await.unwrap();
    let pull = SessionOp::Pull {
        name: "from_a".into(),
        hash: tensor::hash(y),
        peer: format!("http://{}", a.addr),
    };
    let res = cb
        .batch(
            &sid_b,
            &Batch {
                ops: vec![
                    pull,
                    SessionOp::Get {
                        name: "from_a".into(),
                    },
                ],
            },
        )
        .await
        .unwrap();
    assert!(res.error.is_none(), "{:?}", res.error);
    assert_eq!(
        cb.get_tensor(&sid_b, "from_a").await.unwrap(),
        tensor::encode(y)
    );
    // A pull of something A does not have fails cleanly.
    let missing = SessionOp::Pull {
        name: "z".into(),
        hash: Hash::of(b"nothing"),
        peer: format!("http://{}", a.addr),
    };
    let res = cb
        .batch(&sid_b, &Batch { ops: vec![missing] })
        .await
        .unwrap();
    assert_eq!(res.error.unwrap().error.code, ErrorCode::PeerFailed);
    ca.delete_session(&sid).await.unwrap();
    assert_eq!(
        ca.get_tensor(&sid, "y3").await.unwrap_err().code(),
        Some(ErrorCode::NotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_log_records_requests_and_job_phases_and_sigterm_stops_cleanly() {
    let dir = temp_dir("events");
    let log = dir.join("events.jsonl");
    let (mut node, key) = trusted_node("events", &["--event-log", log.to_str().unwrap()]);
    let c = node.client(&key);
    let graph = small_graph();
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let (x, w, b) = (
        tensor_of(&[4, 8], 1),
        tensor_of(&[8, 3], 2),
        tensor_of(&[3], 3),
    );
    c.run_job(&job("logged", task, &[("x", &x), ("w", &w), ("b", &b)]))
        .await
        .unwrap();
    c.reveal("logged").await.unwrap();
    drop(c);
    let status = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(s) = node.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "SIGTERM did not stop the node"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(exit.success(), "graceful shutdown exits 0");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let phases: Vec<&str> = lines
        .iter()
        .filter(|l| l["event"] == "job" && l["job"] == "logged")
        .map(|l| l["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["accepted", "started", "committed", "revealed"]);
    let run = lines
        .iter()
        .find(|l| l["event"] == "request" && l["route"] == "job_run")
        .unwrap();
    assert_eq!(run["status"], 200);
    assert_eq!(run["key"], key.public().to_hex());
    assert!(run["us"].as_u64().is_some() && run["ts_us"].as_u64().unwrap() > 0);
    assert_eq!(lines.first().unwrap()["event"], "start");
    assert_eq!(lines.last().unwrap()["event"], "shutdown");
}

#[test]
fn the_node_benchmark_runs_and_reports_every_workload() {
    let mut bench = common::tenet();
    bench.args(["bench", "node", "--quick", "--json", "--threads", "1"]);
    let report = common::json_of(bench, "");
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for expected in [
        "tiny job round trip (run → signed commitment)",
        "1000 small ops in one batch, per op",
        "4 MiB tensor upload into a session (hashed)",
        "4 MiB upload (hashed, fsynced: the default)",
        "1024² matmul job overhead over local",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    // Linux reports the node process's CPU time, so the uploads' rows come with it.
    if cfg!(target_os = "linux") {
        assert!(
            names.contains(&"node CPU per upload (fsynced)"),
            "{names:?}"
        );
    }
    for r in rows
        .iter()
        .filter(|r| r["unit"] != "ms" || !r["name"].as_str().unwrap().contains("overhead"))
    {
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(rows.iter().any(|r| r["goal_met"].is_boolean()));
}

#[test]
fn a_node_that_trusts_nobody_or_cannot_listen_refuses_to_start_and_says_why() {
    let dir = temp_dir("refuse");
    let out = common::tenet()
        .args(["node", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trusts no keys") && err.contains("--trust") && err.contains("--open"),
        "{err}"
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = common::tenet()
        .args(["node", "--open", "--listen", &addr, "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert_eq!(
        err.matches("in use").count(),
        1,
        "the cause is said once: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_client_went_away_still_commits_and_can_be_revealed() {
    let (node, key) = trusted_node("abandoned", &[]);
    let c = node.client(&key);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[256, 256]);
    let mut y = x.clone();
    for _ in 0..400 {
        y = y.matmul(&x).tanh();
    }
    let graph = g.finish(&[("y", &y)]).unwrap();
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let xt = tensor_of(&[256, 256], 9);
    let req = job("abandoned", task, &[("x", &xt)]);
    let runner = node.client(&key);
    let request = tokio::spawn(async move { runner.run_job(&req).await });
    let started = Instant::now();
    while c.job_status("abandoned").await.ok().map(|s| s.state) != Some(JobState::Running) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the job never started"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    request.abort(); // the client hangs up mid-job
    let _ = request.await;
    loop {
        let state = c.job_status("abandoned").await.unwrap().state;
        if state == JobState::Committed {
            break;
        }
        assert_eq!(state, JobState::Running);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the job never finished"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let revealed = c.reveal("abandoned").await.unwrap();
    let expected = local_run(&graph, &HashMap::from([("x".into(), xt)]));
    assert_eq!(
        revealed.reveal.outputs[0].hash,
        tensor::hash(&expected[0].1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_from_real_commitments_verify_offline_replay_and_catch_alterations() {
    use tenet_proto::commit::Sig;
    use tenet_proto::receipt::{Attestation, Receipt};
    let (a, key) = trusted_node("receipt-a", &[]);
    let pk = key.public().to_hex();
    let b = NodeProc::start(&temp_dir("receipt-b"), &["--trust", &pk]);
    let graph = small_graph();
    let (x, w, bias) = (
        tensor_of(&[4, 8], 1),
        tensor_of(&[8, 3], 2),
        tensor_of(&[3], 3),
    );
    let req = job(
        "receipted",
        Hash::from(graph.id()),
        &[("x", &x), ("w", &w), ("b", &bias)],
    );
    let mut attestations = Vec::new();
    let mut revealed = None;
    for node in [&a, &b] {
        let c = node.client(&key);
        c.put_blob(graph.to_bytes()).await.unwrap();
        let committed = c.run_job(&req).await.unwrap();
        let r = c.reveal("receipted").await.unwrap();
        attestations.push(Attestation {
            commitment: committed.commitment,
            output_hash: r.reveal.output_hash,
            salt: r.reveal.salt,
        });
        revealed = Some(r);
    }
    let r = revealed.unwrap().reveal;
    let coordinator = identity::generate();
    let receipt = Receipt {
        version: 1,
        job: req.job.clone(),
        outputs: r.outputs.clone(),
        output_hash: r.output_hash,
        replicas: 2,
        tolerance: 0.0,
        nodes: attestations,
        coordinator: coordinator.public(),
        issued_at: tenet_proto::unix_now(),
        dispute: None,
        signature: Sig([0; 64]),
    }
    .sign(&coordinator);
    let dir = temp_dir("receipt-files");
    let file = dir.join("receipt.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&receipt).unwrap()).unwrap();
    let blobs = dir.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join(Hash::from(graph.id()).to_hex()),
        graph.to_bytes(),
    )
    .unwrap();
    for t in [&x, &w, &bias] {
        std::fs::write(blobs.join(tensor::hash(t).to_hex()), tensor::encode(t)).unwrap();
    }
    let tenet = |args: &[&str]| common::tenet().args(args).output().unwrap();
    let f = file.to_str().unwrap();
    let ok = tenet(&[
        "receipt",
        "verify",
        f,
        "--coordinator",
        &coordinator.public().to_hex(),
        "--replay",
        blobs.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        out.contains("receipt verified") && out.contains("bit-identical"),
        "{out}"
    );
    // Altered: a different output hash in the JSON.
    let mut v: serde_json::Value = serde_json::to_value(&receipt).unwrap();
    v["output_hash"] = serde_json::json!(Hash::of(b"forged").to_hex());
    let forged = dir.join("forged.json");
    std::fs::write(&forged, v.to_string()).unwrap();
    let bad = tenet(&["receipt", "verify", forged.to_str().unwrap()]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does NOT verify"));
    assert!(out.contains("the key you gave"), "{out}");
    // Signed by someone else than the coordinator the caller expects.
    let other = identity::generate().public().to_hex();
    let wrong = tenet(&["receipt", "verify", f, "--coordinator", &other]);
    assert!(!wrong.status.success());
    // Without --coordinator the check is against the key the receipt names: it says whose
    // signature that is, and that nobody pinned it.
    let unpinned = tenet(&["receipt", "verify", f]);
    let out = String::from_utf8_lossy(&unpinned.stdout);
    assert!(unpinned.status.success());
    assert!(
        out.contains(&coordinator.public().to_hex()) && out.contains("UNPINNED"),
        "{out}"
    );
    let json = tenet(&["receipt", "verify", f, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["coordinator_pinned"], false, "{v}");
}
