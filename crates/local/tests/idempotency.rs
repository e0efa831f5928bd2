//! Idempotent submission over HTTP on a local network: a call sent again with the same
//! `Idempotency-Key` — async or not, in either order — gets the job the first one made, and the
//! ledger holds one job; a malformed key is refused.

use tenet_coordinator::CoordinatorConfig;
use tenet_ir::{DType, GraphBuilder};
use tenet_ledger::Ledger;
use tenet_local::LocalNetwork;
use tenet_net::{Bytes, Method, NodeClient, RawRequest, identity};
use tenet_proto::api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_twice_with_one_key_is_one_job() {
    let dir = tempfile_dir();
    let net = LocalNetwork::start(
        &dir,
        &[None, None, None],
        1000,
        CoordinatorConfig::default(),
    )
    .await
    .unwrap();
    let client = NodeClient::new(&net.coordinator_url, identity::generate()).unwrap();
    let auth = (
        "authorization".to_string(),
        format!("Bearer {}", net.api_key),
    );
    let send = |method: Method, path: String, body: Vec<u8>, key: Option<&str>| {
        let mut headers = vec![
            auth.clone(),
            ("content-type".to_string(), "application/json".to_string()),
        ];
        if let Some(k) = key {
            headers.push(("idempotency-key".to_string(), k.to_string()));
        }
        client.send(RawRequest {
            method,
            path,
            headers,
            body: Bytes::from(body),
        })
    };
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 4]);
    let graph = g.finish(&[("y", &x.tanh())]).unwrap();
    let r = send(Method::POST, "/v1/tasks".into(), graph.to_bytes(), None)
        .await
        .unwrap();
    let deployed: api::TaskDeployed = serde_json::from_slice(&r.body).unwrap();
    let run = deployed.task.endpoint.clone();
    let body = |v: f32| {
        serde_json::to_vec(&serde_json::json!({"inputs": {"x": {
            "dtype": "f32", "shape": [1, 4], "data": [v, 0.5, -0.5, 1.0]}}}))
        .unwrap()
    };

    // Async first, then again: one job id.
    let first = send(
        Method::POST,
        format!("{run}?async=true"),
        body(0.1),
        Some("key-1"),
    )
    .await
    .unwrap();
    assert_eq!(
        first.status,
        202,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let first: api::Submitted = serde_json::from_slice(&first.body).unwrap();
    let again = send(
        Method::POST,
        format!("{run}?async=true"),
        body(0.1),
        Some("key-1"),
    )
    .await
    .unwrap();
    let again: api::Submitted = serde_json::from_slice(&again.body).unwrap();
    assert_eq!(again.job_id, first.job_id);
    // ...and then waiting for it: the decided job's answer, not a second job.
    let sync = send(Method::POST, run.clone(), body(0.1), Some("key-1"))
        .await
        .unwrap();
    assert_eq!(sync.status, 200, "{}", String::from_utf8_lossy(&sync.body));
    let sync: api::RunAnswer = serde_json::from_slice(&sync.body).unwrap();
    assert_eq!(sync.job_id, first.job_id);
    assert_eq!(sync.state, "decided");
    sync.receipt
        .verify_from(&net.coordinator_key.public())
        .unwrap();
    assert!(sync.outputs.contains_key("y"));

    // Synchronous first, then async with the same key: the same job.
    let one = send(Method::POST, run.clone(), body(0.2), Some("key-2"))
        .await
        .unwrap();
    let one: api::RunAnswer = serde_json::from_slice(&one.body).unwrap();
    let two = send(
        Method::POST,
        format!("{run}?async=true"),
        body(0.2),
        Some("key-2"),
    )
    .await
    .unwrap();
    let two: api::Submitted = serde_json::from_slice(&two.body).unwrap();
    assert_eq!(two.job_id, one.job_id);
    assert_eq!(two.state, "decided");

    // Without a key, every call is a job of its own; with a malformed key, none is.
    let plain = send(Method::POST, run.clone(), body(0.1), None)
        .await
        .unwrap();
    let plain: api::RunAnswer = serde_json::from_slice(&plain.body).unwrap();
    assert_ne!(plain.job_id, first.job_id);
    let long = "k".repeat(200);
    let bad = send(Method::POST, run.clone(), body(0.1), Some(&long))
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert!(String::from_utf8_lossy(&bad.body).contains("Idempotency-Key"));
    let jobs = net.core.ledger.jobs(100).await.unwrap();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    net.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tenet-idem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
