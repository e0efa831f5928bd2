//! Several coordinators on one ledger, over HTTP on a local network: a task or a pipeline
//! deployed on one runs on another; a job decided by one is read, outputs and all, from another; a coordinator that
//! freezes mid-job (an injected stall that also stops its lease renewals) has the job taken over
//! and settled by its peer — once: its caller gets the peer's answer, each node is credited
//! once, and the frozen coordinator's late settlement is refused.

use std::time::Duration;

use tenet_coordinator::{CoordinatorConfig, Stall, StallPoint};
use tenet_ir::{DType, GraphBuilder};
use tenet_ledger::{JobState, Ledger, SqlLedger};
use tenet_local::{LocalNetwork, LocalOptions};
use tenet_net::{Bytes, Method, NodeClient, RawRequest, RawResponse, identity};
use tenet_proto::api;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A caller of one coordinator's API with the network's API key.
struct Caller {
    client: NodeClient,
    api_key: String,
}

impl Caller {
    fn new(url: &str, api_key: &str) -> Caller {
        Caller {
            client: NodeClient::new(url, identity::generate()).unwrap(),
            api_key: api_key.to_string(),
        }
    }

    async fn send(&self, method: Method, path: &str, body: Vec<u8>) -> RawResponse {
        self.client
            .send(RawRequest {
                method,
                path: path.to_string(),
                headers: vec![
                    (
                        "authorization".to_string(),
                        format!("Bearer {}", self.api_key),
                    ),
                    ("content-type".to_string(), "application/json".to_string()),
                ],
                body: Bytes::from(body),
            })
            .await
            .unwrap()
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> T {
        let r = self.send(method, path, body).await;
        assert!(
            (200..300).contains(&r.status),
            "{path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        serde_json::from_slice(&r.body).unwrap()
    }
}

fn tanh_task() -> Vec<u8> {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 4]);
    g.finish(&[("y", &x.tanh())]).unwrap().to_bytes()
}

fn call_body(v: f32) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"inputs": {"x": {
        "dtype": "f32", "shape": [1, 4], "data": [v, 0.5, -0.5, 1.0]}}}))
    .unwrap()
}

fn first_y(answer: &api::RunAnswer) -> f64 {
    answer.outputs["y"]["data"][0].as_f64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_on_one_ledger_share_tasks_jobs_and_outputs() {
    let dir = tempdir();
    let options = LocalOptions {
        peer_coordinators: 1,
        ..LocalOptions::default()
    };
    let mut net = LocalNetwork::start_with(
        &dir.path().join("a"),
        &[None, None, None],
        1000,
        CoordinatorConfig::default(),
        None,
        &options,
    )
    .await
    .unwrap();
    let b = net
        .add_coordinator(&dir.path().join("b"), CoordinatorConfig::default())
        .await
        .unwrap();
    let on_a = Caller::new(&net.coordinator_url, &net.api_key);
    let on_b = Caller::new(&b.url, &net.api_key);

    // Deployed on A, called on B: B takes the task from the ledger and signs the receipt.
    let deployed: api::TaskDeployed = on_a.json(Method::POST, "/v1/tasks", tanh_task()).await;
    let run = deployed.task.endpoint.clone();
    let by_b: api::RunAnswer = on_b.json(Method::POST, &run, call_body(0.25)).await;
    assert_eq!(by_b.state, "decided");
    by_b.receipt.verify_from(&b.key.public()).unwrap();
    assert!((first_y(&by_b) - 0.25f64.tanh()).abs() < 1e-6);

    // Decided by A, read from B: B fetches the outputs from A by hash (as a peer).
    let by_a: api::RunAnswer = on_a.json(Method::POST, &run, call_body(0.5)).await;
    by_a.receipt
        .verify_from(&net.coordinator_key.public())
        .unwrap();
    let seen: api::JobView = on_b
        .json(Method::GET, &format!("/v1/jobs/{}", by_a.job_id), vec![])
        .await;
    assert_eq!(seen.job.state, "decided");
    let y = &seen.outputs.as_ref().unwrap()["y"]["data"][0];
    assert!((y.as_f64().unwrap() - 0.5f64.tanh()).abs() < 1e-6);

    // A pipeline (two stages) deployed on A is called on B: its manifest and stage tasks come
    // from the ledger.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 4]);
    let graph = g.finish(&[("y", &x.tanh().exp())]).unwrap();
    let cuts = tenet_ir::split::cut_points(&graph);
    let stages = tenet_ir::split::split_at(&graph, &cuts[..1]).unwrap();
    assert_eq!(stages.len(), 2);
    for stage in &stages {
        let _: api::TaskDeployed = on_a
            .json(Method::POST, "/v1/tasks", stage.graph.to_bytes())
            .await;
    }
    let manifest = tenet_pipeline::manifest_of(&graph, &stages).unwrap();
    let pipeline: api::PipelineDeployed = on_a
        .json(
            Method::POST,
            "/v1/pipelines",
            manifest.to_json().into_bytes(),
        )
        .await;
    let piped: api::PipelineAnswer = on_b
        .json(Method::POST, &pipeline.pipeline.endpoint, call_body(0.5))
        .await;
    let y = piped.outputs["y"]["data"][0].as_f64().unwrap();
    assert!((y - 0.5f64.tanh().exp()).abs() < 1e-5, "{y}");
    assert_eq!(piped.stages.len(), 2);

    // The deployment's key set names both, live.
    let set: api::Coordinators = on_b.json(Method::GET, "/v1/coordinators", vec![]).await;
    let mut keys: Vec<_> = set.coordinators.iter().map(|c| c.key).collect();
    keys.sort_by_key(|k| k.to_hex());
    let mut expected = vec![net.coordinator_key.public(), b.key.public()];
    expected.sort_by_key(|k| k.to_hex());
    assert_eq!(keys, expected);
    assert!(set.coordinators.iter().all(|c| c.live));

    // A blob's bytes are for peers and the admin: a caller with an API key is refused.
    let output = by_a.receipt.outputs[0].hash;
    let refused = on_a
        .send(Method::GET, &format!("/v1/blobs/{output}/data"), vec![])
        .await;
    assert_eq!(
        refused.status,
        403,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_coordinators_job_is_taken_over_and_settled_once() {
    let dir = tempdir();
    let lease = Duration::from_millis(600);
    let options = LocalOptions {
        peer_coordinators: 1,
        ..LocalOptions::default()
    };
    // A freezes — job and lease renewals alike — after deciding, before writing the decision.
    let frozen = CoordinatorConfig {
        lease,
        stall: Some(Stall {
            at: StallPoint::BeforeSettle,
            pause: Duration::from_secs(4),
        }),
        ..CoordinatorConfig::default()
    };
    let mut net = LocalNetwork::start_with(
        &dir.path().join("a"),
        &[None, None, None],
        1000,
        frozen,
        None,
        &options,
    )
    .await
    .unwrap();
    let b = net
        .add_coordinator(
            &dir.path().join("b"),
            CoordinatorConfig {
                lease,
                ..CoordinatorConfig::default()
            },
        )
        .await
        .unwrap();
    let on_a = Caller::new(&net.coordinator_url, &net.api_key);
    let deployed: api::TaskDeployed = on_a.json(Method::POST, "/v1/tasks", tanh_task()).await;
    let started = std::time::Instant::now();
    // The caller waits on A, which freezes; B takes the job over and settles it; A, waking,
    // finds its lease gone and answers with B's decision.
    let answer: api::RunAnswer = on_a
        .json(Method::POST, &deployed.task.endpoint, call_body(0.75))
        .await;
    let waited = started.elapsed();
    assert_eq!(answer.state, "decided");
    assert!((first_y(&answer) - 0.75f64.tanh()).abs() < 1e-6);
    answer
        .receipt
        .verify_from(&b.key.public())
        .expect("the receipt is the coordinator's that settled the job: B, which took it over");
    assert!(
        waited >= Duration::from_secs(4),
        "A answered only after its stall ({waited:?})"
    );

    let ledger = SqlLedger::connect(&net.ledger_url).await.unwrap();
    let job = ledger.job(&answer.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Decided);
    let events = ledger.job_stake_events(&answer.job_id).await.unwrap();
    let mut credited: Vec<&str> = events.iter().map(|e| e.node_id.as_str()).collect();
    credited.sort();
    credited.dedup();
    assert_eq!(
        (events.len(), credited.len()),
        (3, 3),
        "each node credited once for the job: {events:?}"
    );
    assert!(events.iter().all(|e| e.delta == 1), "{events:?}");
    assert_eq!(b.core.running_jobs(), 0);
    net.shutdown().await;
}
