//! The coordinator against hostile callers and nodes, as real processes on 127.0.0.1 (issue
//! 29): a query that once panicked it, call bodies bounded by the task's inputs and values
//! checked against their dtype, stake that only the admin bonds and replicas that one operator
//! never fills, tasks no node can take refused before any node sees them (and refusals that
//! are not ill health), and a node that commits and then withholds its reveal slashed.

use std::path::PathBuf;

mod common;

use common::{Proc, spawn_tenet as spawn};
use serde_json::{Value, json};
use tenet_ir::{DType, GraphBuilder};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tenet-hostile-coord-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One HTTP exchange with `bearer` as the credential: the status and the JSON answer (status
/// 0 when the connection failed or was dropped, as a panicking handler does).
fn send(
    url: &str,
    method: &str,
    path: &str,
    bearer: &str,
    body: Vec<u8>,
    content_type: &str,
) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = tenet_net::NodeClient::new(url, tenet_net::identity::generate()).unwrap();
    let req = tenet_net::RawRequest {
        method: method.parse().unwrap(),
        path: path.to_string(),
        headers: vec![
            ("authorization".into(), format!("Bearer {bearer}")),
            ("content-type".into(), content_type.into()),
        ],
        body: tenet_net::Bytes::from(body),
    };
    match rt.block_on(http.send(req)) {
        Ok(r) => (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        ),
        Err(_) => (0, Value::Null),
    }
}

fn post_json(url: &str, path: &str, bearer: &str, body: &Value) -> (u16, Value) {
    send(
        url,
        "POST",
        path,
        bearer,
        body.to_string().into_bytes(),
        "application/json",
    )
}

fn get(url: &str, path: &str) -> Value {
    let (status, v) = send(url, "GET", path, "secret", Vec::new(), "application/json");
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

/// A coordinator (callers' key `secret`, admin key `admin`) and its key.
struct Net {
    dir: PathBuf,
    _coord: Proc,
    url: String,
    key: String,
    nodes: Vec<(Proc, String)>,
}

impl Net {
    fn start(name: &str, extra: &[&str]) -> Net {
        let dir = tmp(name);
        let data = dir.join("coord").to_str().unwrap().to_string();
        let mut args = vec![
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--api-key",
            "secret",
            "--admin-key",
            "admin",
        ];
        args.extend(extra);
        let (coord, line) = spawn(&args);
        let words: Vec<&str> = line.split_whitespace().collect();
        Net {
            key: words[2].to_string(),
            url: words.last().unwrap().to_string(),
            _coord: coord,
            dir,
            nodes: Vec::new(),
        }
    }

    /// Start a node that trusts the coordinator; its URL.
    fn node(&mut self, extra: &[&str]) -> String {
        let data = self
            .dir
            .join(format!("node{}", self.nodes.len()))
            .to_str()
            .unwrap()
            .to_string();
        let (p, url) = common::spawn_node(&data, &self.key, extra);
        self.nodes.push((p, url.clone()));
        url
    }

    /// Register the node at `url` as `bearer`, with `stake` if given; the node's record.
    fn register(&self, url: &str, bearer: &str, stake: Option<i64>) -> (u16, Value) {
        post_json(
            &self.url,
            "/v1/nodes",
            bearer,
            &json!({"url": url, "stake": stake}),
        )
    }

    fn bond(&self, id: &str, amount: i64, operator: Option<&str>) -> Value {
        let (status, v) = post_json(
            &self.url,
            &format!("/v1/nodes/{id}/stake"),
            "admin",
            &json!({"amount": amount, "operator": operator}),
        );
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Deploy `graph`; its task id.
    fn deploy(&self, graph: &tenet_ir::Graph) -> (u16, Value) {
        send(
            &self.url,
            "POST",
            "/v1/tasks",
            "secret",
            graph.to_bytes(),
            "application/octet-stream",
        )
    }

    fn call(&self, task: &str, body: &Value) -> (u16, Value) {
        post_json(&self.url, &format!("/v1/tasks/{task}/run"), "secret", body)
    }
}

/// `y = tanh(x)` over four numbers.
fn small_task() -> tenet_ir::Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4]);
    g.finish(&[("y", &x.tanh())]).unwrap()
}

fn deployed(net: &Net, graph: &tenet_ir::Graph) -> String {
    let (status, task) = net.deploy(graph);
    assert_eq!(status, 200, "{task}");
    task["id"].as_str().unwrap().to_string()
}

#[test]
fn a_wait_that_is_not_a_number_of_seconds_is_refused_not_a_panic() {
    let net = Net::start("wait", &[]);
    for wait in ["NaN", "inf", "-1", "1e999", "soon"] {
        let (status, v) = send(
            &net.url,
            "GET",
            &format!("/v1/jobs/nojob?wait={wait}"),
            "secret",
            Vec::new(),
            "application/json",
        );
        assert_eq!(status, 400, "wait={wait}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("seconds"));
    }
    // A number of seconds is fine (an unknown job is simply not found).
    let (status, _) = send(
        &net.url,
        "GET",
        "/v1/jobs/nojob?wait=0.01",
        "secret",
        Vec::new(),
        "",
    );
    assert_eq!(status, 404);
}

#[test]
fn a_call_body_is_bounded_by_its_task_inputs_and_its_values_are_checked() {
    let net = Net::start("bodies", &[]);
    let task = deployed(&net, &small_task());
    // Far more JSON than four numbers can take: refused from its headers, before a byte of it
    // is sent (this client sends none), and the same for a safetensors body.
    for content_type in ["application/json", "application/octet-stream"] {
        let answer = headers_only(
            &net.url,
            &format!("/v1/tasks/{task}/run"),
            content_type,
            100 << 20,
        );
        assert!(
            answer.starts_with("HTTP/1.1 413") && answer.contains("too_large"),
            "{answer}"
        );
    }
    // A body that says nothing of its length is cut off where the inputs end.
    let mut big = br#"{"inputs": {"x": [1, 2, 3, 4]}}"#.to_vec();
    big.resize(1 << 20, b' ');
    let (status, _) = send(
        &net.url,
        "POST",
        &format!("/v1/tasks/{task}/run"),
        "secret",
        big,
        "application/json",
    );
    assert_ne!(status, 200);
    for (body, says) in [
        (
            json!({"inputs": {"x": [1e39, 0, 0, 0]}}),
            "outside f32's range",
        ),
        (json!({"inputs": {"x": [1, 2, 3, 4]}, "seed": -1}), "seed"),
        (json!({"inputs": {"x": [1, 2, 3, 4]}, "seed": "7"}), "seed"),
        (
            json!({"inputs": {"x": [1, 2, 3, 4, 5]}}),
            "more than the 4 values",
        ),
        (json!({"inputs": {"z": [1]}}), "no input z"),
    ] {
        let (status, v) = net.call(&task, &body);
        assert_eq!(status, 422, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    // Every other route takes what it can need and no more: a registration is small.
    let answer = headers_only(&net.url, "/v1/nodes", "application/json", 1 << 20);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A blob streams into the store, checked against its address.
    let bytes = vec![7u8; 3 << 20];
    let hash = tenet_proto::Hash::of(&bytes);
    let (status, v) = send(
        &net.url,
        "PUT",
        &format!("/v1/blobs/{}", tenet_proto::Hash::of(b"other")),
        "secret",
        bytes.clone(),
        "application/octet-stream",
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("hash_mismatch")),
        "{v}"
    );
    let (status, v) = send(
        &net.url,
        "PUT",
        &format!("/v1/blobs/{hash}"),
        "secret",
        bytes,
        "application/octet-stream",
    );
    assert_eq!((status, v["size"].as_u64()), (200, Some(3 << 20)), "{v}");
    // A call to a task that is not here reads no body at all.
    let (status, _) = net.call(&"ab".repeat(32), &json!({"inputs": {}}));
    assert_eq!(status, 404);
}

#[test]
fn stake_is_bonded_by_the_admin_and_one_operator_never_fills_the_replicas() {
    let mut net = Net::start("sybil", &["--replicas", "3"]);
    let task = deployed(&net, &small_task());
    let honest: Vec<String> = (0..2).map(|_| net.node(&[])).collect();
    let colluders: Vec<String> = (0..3).map(|_| net.node(&["--cheat", "collude"])).collect();
    // A caller cannot claim stake, however much.
    let (status, v) = net.register(&colluders[0], "secret", Some(1_000_000_000_000_000));
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden");
    // Registered without stake: no jobs.
    let mut ids = Vec::new();
    for url in honest.iter().chain(&colluders) {
        let (status, n) = net.register(url, "secret", None);
        assert_eq!((status, n["stake"].as_i64()), (200, Some(0)), "{n}");
        ids.push(n["id"].as_str().unwrap().to_string());
    }
    let input = json!({"inputs": {"x": [0.5, -1, 2, 0]}});
    let (status, v) = net.call(&task, &input);
    assert_eq!(status, 503, "{v}");
    // Bonding is the admin's: a caller is refused.
    let (status, _) = post_json(
        &net.url,
        &format!("/v1/nodes/{}/stake", ids[0]),
        "secret",
        &json!({"amount": 1000}),
    );
    assert_eq!(status, 403);
    // The colluders get a huge stake, but one operator answers for all three.
    for id in &ids[2..] {
        net.bond(id, 1_000_000_000_000_000, Some("mallory"));
    }
    let (status, v) = net.call(&task, &input);
    assert_eq!(status, 503, "one party cannot fill three replicas: {v}");
    net.bond(&ids[0], 1000, Some("alice"));
    net.bond(&ids[1], 1000, Some("bob"));
    // Every call now has one colluder at most, and the honest pair outvotes it.
    let want: Vec<f32> = [0.5f32, -1.0, 2.0, 0.0]
        .iter()
        .map(|&x| tenet_reference::math::tanh(x))
        .collect();
    for _ in 0..3 {
        let (status, v) = net.call(&task, &input);
        assert_eq!(status, 200, "{v}");
        let got: Vec<f32> = v["outputs"]["y"]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got, want, "{v}");
        let job = get(
            &net.url,
            &format!("/v1/jobs/{}", v["job_id"].as_str().unwrap()),
        );
        let mallory = job["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| ids[2..].iter().any(|c| a["node"] == c.as_str()))
            .count();
        assert_eq!(mallory, 1, "{job}");
        assert_eq!(v["slashed"].as_array().unwrap().len(), 1, "{v}");
    }
    // Leaving and coming back does not reset a stake, whatever the admin's new claim.
    let before = get(&net.url, &format!("/v1/nodes/{}", ids[2]))["stake"].clone();
    let leave = |bearer: &str| {
        send(
            &net.url,
            "DELETE",
            &format!("/v1/nodes/{}", ids[2]),
            bearer,
            Vec::new(),
            "",
        )
        .0
    };
    // A caller may not deregister (or keep alive) someone else's node.
    assert_eq!(leave("secret"), 403);
    let (status, _) = post_json(
        &net.url,
        &format!("/v1/nodes/{}/heartbeat", ids[0]),
        "secret",
        &json!({}),
    );
    assert_eq!(status, 403);
    assert_eq!(leave("admin"), 200);
    let (status, n) = net.register(&colluders[0], "admin", Some(5));
    assert_eq!(status, 200, "{n}");
    assert_eq!(n["stake"], before, "{n}");
}

#[test]
fn a_task_no_node_can_take_is_refused_before_any_node_sees_it() {
    let mut net = Net::start("limits", &["--max-task-memory", "100000000"]);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let url = net.node(&["--memory-limit", "1000000"]);
        let (status, n) = net.register(&url, "admin", Some(1000));
        assert_eq!(status, 200, "{n}");
        assert_eq!(n["memory_limit"], 1_000_000, "{n}");
        ids.push(n["id"].as_str().unwrap().to_string());
    }
    // 16 MB by its certificate: over every node's 1 MB.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 1]);
    let big = g
        .finish(&[("s", &x.expand(&[2048, 2048]).sum(&[0, 1], false))])
        .unwrap();
    let big_task = deployed(&net, &big);
    for _ in 0..5 {
        let (status, v) = net.call(&big_task, &json!({"inputs": {"x": [[1]]}}));
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["error"]["code"], "exceeds_limits", "{v}");
    }
    // No node was asked, and none was marked unhealthy: small calls still run.
    for (_, url) in &net.nodes {
        let metrics = reqwest_metrics(url);
        assert!(!metrics.contains("route=\"job_run\""), "{metrics}");
    }
    for n in get(&net.url, "/v1/nodes").as_array().unwrap() {
        assert_eq!(n["state"], "active", "{n}");
    }
    let small = deployed(&net, &small_task());
    let (status, v) = net.call(&small, &json!({"inputs": {"x": [1, 2, 3, 4]}}));
    assert_eq!(status, 200, "{v}");
    // 400 MB by its certificate: over what this coordinator deploys at all.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 1]);
    let huge = g
        .finish(&[("s", &x.expand(&[10240, 10240]).sum(&[0, 1], false))])
        .unwrap();
    let (status, v) = net.deploy(&huge);
    assert_eq!(status, 422, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("referee"),
        "{v}"
    );
}

/// Send only the headers of a POST declaring a `length`-byte body, then read what the server
/// answers (it must answer without waiting for the body).
fn headers_only(url: &str, path: &str, content_type: &str, length: u64) -> String {
    headers_only_as(url, "POST", path, content_type, length)
}

fn headers_only_as(url: &str, method: &str, path: &str, content_type: &str, length: u64) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer secret\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n\r\n"
    )
    .unwrap();
    let mut answer = vec![0; 4096];
    let n = s.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

/// A node's Prometheus text (public).
fn reqwest_metrics(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = tenet_net::NodeClient::new(url, tenet_net::identity::generate()).unwrap();
    let req = tenet_net::RawRequest {
        method: tenet_net::Method::GET,
        path: "/metrics".into(),
        headers: Vec::new(),
        body: tenet_net::Bytes::new(),
    };
    let r = rt.block_on(http.send(req)).unwrap();
    String::from_utf8(r.body.to_vec()).unwrap()
}

#[test]
fn a_node_that_commits_and_withholds_its_reveal_is_slashed() {
    // A long node timeout: the call must not wait for it, since two matching reveals of three
    // already decide the job (the staller gets a grace of about a second, then is slashed).
    let mut net = Net::start("withhold", &["--replicas", "3", "--node-timeout", "60"]);
    let task = deployed(&net, &small_task());
    let mut ids = Vec::new();
    for cheat in [None, None, Some("withhold")] {
        let url = match cheat {
            Some(c) => net.node(&["--cheat", c]),
            None => net.node(&[]),
        };
        let (status, n) = net.register(&url, "admin", Some(1000));
        assert_eq!(status, 200, "{n}");
        ids.push(n["id"].as_str().unwrap().to_string());
    }
    let started = std::time::Instant::now();
    let (status, v) = net.call(&task, &json!({"inputs": {"x": [1, 2, 3, 4]}}));
    assert_eq!(status, 200, "{v}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the call waited for the staller's node timeout"
    );
    let slashed = v["slashed"].as_array().unwrap();
    assert_eq!(slashed.len(), 1, "{v}");
    assert_eq!(slashed[0]["node"], ids[2].as_str());
    assert_eq!(slashed[0]["amount"], 100);
    let staller = get(&net.url, &format!("/v1/nodes/{}", ids[2]));
    assert_eq!(staller["stake"], 900, "{staller}");
    let job = get(
        &net.url,
        &format!("/v1/jobs/{}", v["job_id"].as_str().unwrap()),
    );
    assert_eq!(job["state"], "decided");
    // The receipt verifies and names the two nodes that revealed.
    assert_eq!(
        job["receipt"]["nodes"].as_array().unwrap().len(),
        2,
        "{job}"
    );
}

#[test]
fn a_blob_upload_that_stalls_is_dropped_with_its_temporary_file() {
    let net = Net::start("stall", &["--body-timeout", "1"]);
    // Two GiB declared, nothing sent: the coordinator drops it once the body has been silent
    // for a second (it would otherwise hold a temporary file and a writer forever).
    let hash = tenet_proto::Hash::of(b"never sent");
    let answer = headers_only_as(
        &net.url,
        "PUT",
        &format!("/v1/blobs/{hash}"),
        "application/octet-stream",
        2 << 30,
    );
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("truncated_body"),
        "{answer}"
    );
    let tmp = net.dir.join("coord/store/tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Anyone with a caller's key may name a URL to register: the coordinator reads that URL's
/// `/v1/info` answer only up to what a node's info can be, and not a byte of one that
/// declares more.
#[test]
fn a_registered_url_that_answers_without_end_is_refused() {
    use std::io::{Read, Write};
    let net = Net::start("bigprobe", &[]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head);
        // 32 MiB of JSON declared and sent: far beyond any node's info, though within what
        // the client reads of a JSON answer by default.
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 33554432\r\n\r\n",
        );
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..32 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let (status, v) = net.register(&format!("http://{addr}"), "secret", None);
    assert_eq!(status, 503, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("too large") || message.contains("large"),
        "{message}"
    );
    server.join().unwrap();
}
