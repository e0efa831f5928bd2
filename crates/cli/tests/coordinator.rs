//! The coordinator's core against real `tenet node` processes on 127.0.0.1, some told to lie:
//! liars caught and slashed, colluders outvoted, tolerant noise accepted and real deviation
//! caught, a node killed mid-job replaced. Every receipt verifies offline.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tenet_coordinator::{Coordinator, CoordinatorConfig, JobRequest};
use tenet_exec::{Backend, CpuBackend, SimdLevel};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_ledger::{Ledger, SqlLedger};
use tenet_node::identity;
use tenet_proto::Hash;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::Tier;
use tenet_store::{Store, StoreConfig};

mod common;

use common::{Proc, spawn_tenet, url_of};

struct NodeProc {
    child: Proc,
    url: String,
}

fn start_node(dir: &Path, trust: &KeyPair, cheat: Option<&str>) -> NodeProc {
    let key = trust.public().to_hex();
    let dir = dir.to_str().expect("a UTF-8 temporary path");
    let mut args = vec![
        "node",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--no-fsync",
    ];
    args.extend(["--trust", &key, "--data-dir", dir]);
    if let Some(c) = cheat {
        args.extend(["--cheat", c]);
    }
    let (child, line) = spawn_tenet(args);
    NodeProc {
        child,
        url: url_of(&line),
    }
}

struct Cluster {
    coordinator: Arc<Coordinator<SqlLedger>>,
    nodes: Vec<NodeProc>,
    ids: Vec<String>,
    _dir: tempfile::TempDir,
}

async fn cluster(cheats: &[Option<&str>], config: CoordinatorConfig) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let key = identity::generate();
    let ledger = SqlLedger::connect(&format!(
        "sqlite://{}",
        dir.path().join("ledger.db").display()
    ))
    .await
    .unwrap();
    let store = Store::open(&dir.path().join("store"), StoreConfig::default()).unwrap();
    let coordinator = Arc::new(Coordinator::new(ledger, key.clone(), store, config));
    let mut nodes = Vec::new();
    let mut ids = Vec::new();
    for (i, cheat) in cheats.iter().enumerate() {
        let node = start_node(&dir.path().join(format!("node{i}")), &key, *cheat);
        ids.push(coordinator.register_node(&node.url, 1000).await.unwrap().id);
        nodes.push(node);
    }
    Cluster {
        coordinator,
        nodes,
        ids,
        _dir: dir,
    }
}

fn mlp() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 16]);
    let w = g.input("w", DType::F32, &[16, 4]);
    let y = x.matmul(&w).tanh();
    g.finish(&[("y", &y)]).unwrap()
}

fn inputs(seed: u32) -> BTreeMap<String, HostTensor> {
    let t = |shape: &[u64], s: u32| {
        let n: u64 = shape.iter().product();
        let v: Vec<f32> = (0..n as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ s) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        HostTensor::from_f32(shape, &v).unwrap()
    };
    BTreeMap::from([
        ("x".into(), t(&[2, 16], seed)),
        ("w".into(), t(&[16, 4], seed + 1)),
    ])
}

fn local(graph: &Graph, inputs: &BTreeMap<String, HostTensor>) -> HostTensor {
    let inputs: HashMap<String, HostTensor> = inputs.clone().into_iter().collect();
    CpuBackend::new(1, SimdLevel::Portable)
        .prepare(graph)
        .unwrap()
        .run(&inputs, &tenet_ir::NoWeights, 0)
        .unwrap()
        .remove(0)
        .1
}

fn request(task: Hash, seed: u32, tier: Tier) -> JobRequest {
    JobRequest {
        task,
        weights: None,
        inputs: inputs(seed),
        tier,
        seed: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_liar_of_three_is_caught_in_every_one_of_50_exact_jobs_and_slashed() {
    let c = cluster(&[None, Some("flip"), None], CoordinatorConfig::default()).await;
    let graph = mlp();
    let task = c.coordinator.store().put_bytes(&graph.to_bytes()).unwrap();
    let liar = &c.ids[1];
    for i in 0..50 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Exact))
            .await
            .unwrap();
        assert_eq!(out.slashed.len(), 1, "job {i}");
        assert_eq!(
            &out.slashed[0].0, liar,
            "job {i}: the liar is the one slashed"
        );
        assert!(!out.refereed, "two honest nodes are a majority");
        out.receipt.verify().unwrap();
        assert_eq!(out.receipt.nodes.len(), 2);
        assert!(
            out.receipt
                .nodes
                .iter()
                .all(|a| a.commitment.node.to_hex() != *liar)
        );
        assert_eq!(out.outputs[0].1.bytes(), local(&graph, &inputs(i)).bytes());
    }
    let l = &c.coordinator.ledger;
    let liar_rec = l.node(liar).await.unwrap().unwrap();
    assert_eq!((liar_rec.agreed, liar_rec.disagreed), (0, 50));
    // Fifty slashes of 10%, each rounded down.
    let mut stake = 1000i64;
    for _ in 0..50 {
        stake -= (stake as f64 * 0.1).floor() as i64;
    }
    assert_eq!(liar_rec.stake, stake);
    assert_eq!(l.stake_events(liar).await.unwrap().len(), 50);
    for honest in [&c.ids[0], &c.ids[2]] {
        let r = l.node(honest).await.unwrap().unwrap();
        assert_eq!((r.agreed, r.disagreed, r.stake), (50, 0, 1050));
    }
    assert!(l.unfinished_jobs().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_colluders_of_five_returning_the_same_lie_are_outvoted() {
    let config = CoordinatorConfig {
        replicas: 5,
        ..CoordinatorConfig::default()
    };
    let c = cluster(
        &[None, Some("collude"), None, Some("collude"), None],
        config,
    )
    .await;
    let graph = mlp();
    let task = c.coordinator.store().put_bytes(&graph.to_bytes()).unwrap();
    for i in 0..5 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Exact))
            .await
            .unwrap();
        let mut slashed: Vec<&String> = out.slashed.iter().map(|(n, _)| n).collect();
        slashed.sort();
        let mut colluders = vec![&c.ids[1], &c.ids[3]];
        colluders.sort();
        assert_eq!(slashed, colluders);
        assert_eq!(out.outputs[0].1.bytes(), local(&graph, &inputs(i)).bytes());
        out.receipt.verify().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tolerant_tier_accepts_float_noise_and_catches_deviation_above_the_bound() {
    let config = CoordinatorConfig {
        tolerance: 1e-4,
        ..CoordinatorConfig::default()
    };
    let c = cluster(&[None, Some("noise=0.000001"), Some("noise=0.1")], config).await;
    let graph = mlp();
    let task = c.coordinator.store().put_bytes(&graph.to_bytes()).unwrap();
    for i in 0..5 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Tolerant))
            .await
            .unwrap();
        assert_eq!(out.slashed.len(), 1);
        assert_eq!(
            out.slashed[0].0, c.ids[2],
            "only the node above the bound is slashed"
        );
        assert_eq!(out.receipt.nodes.len(), 2, "honest noise agrees");
        out.receipt.verify().unwrap();
        let expected = local(&graph, &inputs(i)).to_f32_vec();
        for (a, b) in out.outputs[0].1.to_f32_vec().iter().zip(expected) {
            assert!((a - b).abs() <= 1e-4);
        }
    }
    let noisy = c.coordinator.ledger.node(&c.ids[1]).await.unwrap().unwrap();
    assert_eq!(noisy.disagreed, 0);
    assert!(noisy.score() > 0.99, "1/(1+distance): {}", noisy.score());
    let liar = c.coordinator.ledger.node(&c.ids[2]).await.unwrap().unwrap();
    assert!(
        liar.score() < 0.99,
        "1/(1+distance) for the liar: {}",
        liar.score()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_job_is_replaced_and_the_job_completes() {
    let config = CoordinatorConfig {
        node_timeout: Duration::from_secs(20),
        ..CoordinatorConfig::default()
    };
    let mut c = cluster(&[None, None, None, None], config).await;
    // A job that runs long enough to kill a node under it.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 16]);
    let w = g.input("w", DType::F32, &[16, 4]);
    let s = g.input("s", DType::F32, &[256, 256]);
    let mut acc = s.clone();
    for _ in 0..300 {
        acc = acc.matmul(&s).tanh();
    }
    let graph = g
        .finish(&[("y", &x.matmul(&w).tanh()), ("z", &acc)])
        .unwrap();
    let task = c.coordinator.store().put_bytes(&graph.to_bytes()).unwrap();
    let mut req = request(task, 1, Tier::Exact);
    req.inputs.insert(
        "s".into(),
        HostTensor::from_f32(&[256, 256], &vec![0.01; 65536]).unwrap(),
    );
    let coord = c.coordinator.clone();
    let job = tokio::spawn(async move { coord.run(req).await });
    // Find the job and one node it was assigned to, then kill that node.
    let l = &c.coordinator.ledger;
    let victim = loop {
        if let Some(j) = l.jobs(1).await.unwrap().pop()
            && let Some(a) = l.assignments(&j.id).await.unwrap().first()
        {
            break a.node_id.clone();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let i = c.ids.iter().position(|id| *id == victim).unwrap();
    c.nodes[i].child.kill().unwrap();
    c.nodes[i].child.wait().unwrap();
    let out = job.await.unwrap().unwrap();
    out.receipt.verify().unwrap();
    assert_eq!(
        out.receipt.nodes.len(),
        3,
        "three replicas agreed, one of them the replacement"
    );
    assert!(
        out.receipt
            .nodes
            .iter()
            .all(|a| a.commitment.node.to_hex() != victim)
    );
    assert_eq!(
        l.node(&victim).await.unwrap().unwrap().state,
        tenet_ledger::NodeState::Unhealthy
    );
    assert!(out.slashed.is_empty(), "a crashed node is not a liar");
    assert_eq!(l.assignments(&out.job_id).await.unwrap().len(), 4);
}
