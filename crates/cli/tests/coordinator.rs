//! The coordinator's core against real `tenet node` processes on 127.0.0.1, some told to lie:
//! liars caught and slashed, colluders outvoted, tolerant noise accepted and real deviation
//! caught, a node killed mid-job replaced. Every receipt verifies offline.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tenet_coordinator::{Coordinator, CoordinatorConfig, JobRequest};
use tenet_devices::{CpuDevice, SimdLevel};
use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_ledger::{AssignmentState, JobState, Ledger, NodeState, SqlLedger};
use tenet_net::identity;
use tenet_proto::Hash;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{JobSpec, Tier, output_hash, output_refs};
use tenet_store::{Store, StoreConfig};

mod common;

use common::{Proc, spawn_tenet, url_of};

struct NodeProc {
    child: Proc,
    url: String,
}

fn start_node(dir: &Path, trust: &KeyPair, cheat: Option<&str>) -> NodeProc {
    start_node_at(dir, trust, cheat, "127.0.0.1:0")
}

fn start_node_at(dir: &Path, trust: &KeyPair, cheat: Option<&str>, listen: &str) -> NodeProc {
    start_node_with(dir, trust, cheat, listen, &[])
}

fn start_node_with(
    dir: &Path,
    trust: &KeyPair,
    cheat: Option<&str>,
    listen: &str,
    extra: &[&str],
) -> NodeProc {
    let key = trust.public().to_hex();
    let dir = dir.to_str().expect("a UTF-8 temporary path");
    let mut args = vec!["node", "--listen", listen, "--threads", "1", "--no-fsync"];
    args.extend(["--trust", &key, "--data-dir", dir]);
    if let Some(c) = cheat {
        args.extend(["--cheat", c]);
    }
    args.extend(extra);
    let (child, line) = spawn_tenet(args);
    NodeProc {
        child,
        url: url_of(&line),
    }
}

struct Cluster {
    coordinator: Arc<Coordinator<SqlLedger>>,
    key: KeyPair,
    nodes: Vec<NodeProc>,
    ids: Vec<String>,
    dir: tempfile::TempDir,
    ledger_url: String,
}

impl Cluster {
    /// Put `graph` in the coordinator's store as a task; its id.
    fn put_task(&self, graph: &Graph) -> Hash {
        self.coordinator
            .store()
            .put_bytes(&graph.to_bytes())
            .unwrap()
    }

    /// Start one more node and register it.
    async fn add_node(&mut self, cheat: Option<&str>) -> String {
        self.add_node_with(cheat, &[]).await
    }

    /// Start one more node with `extra` flags and register it.
    async fn add_node_with(&mut self, cheat: Option<&str>, extra: &[&str]) -> String {
        let i = self.nodes.len();
        let node = start_node_with(
            &self.dir.path().join(format!("node{i}")),
            &self.key,
            cheat,
            "127.0.0.1:0",
            extra,
        );
        let id = self
            .coordinator
            .register_node(&node.url, 1000, None)
            .await
            .unwrap()
            .id;
        self.nodes.push(node);
        self.ids.push(id.clone());
        id
    }

    /// A second coordinator on the same ledger file, blob store and key: this one after a
    /// crash and a restart.
    async fn restarted(&self, config: CoordinatorConfig) -> Arc<Coordinator<SqlLedger>> {
        let ledger = SqlLedger::connect(&self.ledger_url).await.unwrap();
        let store = Store::open(&self.dir.path().join("store"), StoreConfig::default()).unwrap();
        Arc::new(Coordinator::new(ledger, self.key.clone(), store, config))
    }
}

async fn cluster(cheats: &[Option<&str>], config: CoordinatorConfig) -> Cluster {
    cluster_on(cheats, config, None).await
}

/// A fresh PostgreSQL database on the server TENET_TEST_POSTGRES_URL names, if it is set.
async fn postgres_database() -> Option<String> {
    let Ok(admin) = std::env::var("TENET_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED: set TENET_TEST_POSTGRES_URL to run the coordinator on PostgreSQL; .ci/run does"
        );
        return None;
    };
    Some(
        SqlLedger::create_scratch_database(&admin, "tenet_coord")
            .await
            .unwrap(),
    )
}

/// A cluster whose ledger is at `ledger_url` (default: SQLite in its directory).
async fn cluster_on(
    cheats: &[Option<&str>],
    config: CoordinatorConfig,
    ledger_url: Option<String>,
) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let key = identity::generate();
    let ledger_url = ledger_url
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("ledger.db").display()));
    let ledger = SqlLedger::connect(&ledger_url).await.unwrap();
    let store = Store::open(&dir.path().join("store"), StoreConfig::default()).unwrap();
    let coordinator = Arc::new(Coordinator::new(ledger, key.clone(), store, config));
    let mut nodes = Vec::new();
    let mut ids = Vec::new();
    for (i, cheat) in cheats.iter().enumerate() {
        let node = start_node(&dir.path().join(format!("node{i}")), &key, *cheat);
        ids.push(
            coordinator
                .register_node(&node.url, 1000, None)
                .await
                .unwrap()
                .id,
        );
        nodes.push(node);
    }
    Cluster {
        coordinator,
        key,
        nodes,
        ids,
        dir,
        ledger_url,
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
    CpuDevice::new(1, SimdLevel::Portable)
        .compile(graph)
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
    let task = c.put_task(&graph);
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
    // The bond at registration, then fifty slashes.
    assert_eq!(l.stake_events(liar).await.unwrap().len(), 51);
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
    let task = c.put_task(&graph);
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
    let task = c.put_task(&graph);
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
    let task = c.put_task(&graph);
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

/// What the coordinator that crashed had already done for a job: ship it to `nodes`, have
/// them run it, and (for `recorded` of them) write their commitments to the ledger.
async fn commit_by_hand(
    c: &Cluster,
    job_id: &str,
    task: Hash,
    inputs: &BTreeMap<String, HostTensor>,
    graph: &Graph,
    recorded: usize,
) {
    let l = &c.coordinator.ledger;
    let mut blobs = BTreeMap::new();
    let mut hashes = BTreeMap::new();
    for (name, t) in inputs {
        let blob = tenet_proto::tensor::encode(t);
        hashes.insert(name.clone(), Hash::of(&blob));
        blobs.insert(Hash::of(&blob), tenet_proto::to_hex(&blob));
    }
    let run = tenet_proto::wire::RunJob {
        job: JobSpec {
            job_id: job_id.to_string(),
            task,
            weights: None,
            inputs: hashes,
            tier: Tier::Exact,
            seed: 0,
        },
        timeout_ms: None,
        blobs,
        pulls: Default::default(),
        stage: None,
    };
    let asg = l.assignments(job_id).await.unwrap();
    for (i, a) in asg.iter().enumerate() {
        let url = &l.node(&a.node_id).await.unwrap().unwrap().url;
        let client = tenet_net::NodeClient::new(url, c.key.clone()).unwrap();
        client.put_blob(graph.to_bytes()).await.unwrap();
        let committed = client.run_job(&run).await.unwrap();
        if i < recorded {
            l.record_commitment(
                job_id,
                &a.node_id,
                &serde_json::to_string(&committed.commitment).unwrap(),
            )
            .await
            .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_resumes_jobs_from_every_unfinished_state() {
    restart_resumes_every_unfinished_state(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_restarted_coordinator_resumes_jobs_and_settles_each_once() {
    if let Some(url) = postgres_database().await {
        restart_resumes_every_unfinished_state(Some(url)).await;
    }
}

async fn restart_resumes_every_unfinished_state(ledger_url: Option<String>) {
    let c = cluster_on(
        &[None, Some("flip"), None],
        CoordinatorConfig::default(),
        ledger_url,
    )
    .await;
    let graph = mlp();
    let task = c.put_task(&graph);
    let l = &c.coordinator.ledger;
    let advance = async |id: &str, from, to| l.advance_job(id, from, to, 1).await.unwrap();
    // Job 1: every replica committed and recorded; the crash came before any reveal.
    let j1 = c
        .coordinator
        .admit(request(task, 1, Tier::Exact))
        .await
        .unwrap();
    advance(&j1, JobState::Pending, JobState::Committing).await;
    commit_by_hand(&c, &j1, task, &inputs(1), &graph, 3).await;
    advance(&j1, JobState::Committing, JobState::Revealing).await;
    // Job 2: every node ran it, but the crash came before the third commitment was recorded.
    let j2 = c
        .coordinator
        .admit(request(task, 2, Tier::Exact))
        .await
        .unwrap();
    advance(&j2, JobState::Pending, JobState::Committing).await;
    commit_by_hand(&c, &j2, task, &inputs(2), &graph, 2).await;
    // Job 3: admitted (acknowledged to its caller), never started.
    let j3 = c
        .coordinator
        .admit(request(task, 3, Tier::Exact))
        .await
        .unwrap();
    assert_eq!(l.unfinished_jobs().await.unwrap().len(), 3);

    let again = c.restarted(CoordinatorConfig::default()).await;
    let mut resumed = again.resume().await.unwrap();
    resumed.sort();
    let mut expected = vec![j1.clone(), j2.clone(), j3.clone()];
    expected.sort();
    assert_eq!(resumed, expected);
    for id in &expected {
        assert!(
            again.wait(id, Duration::from_secs(60)).await,
            "job {id} ended"
        );
    }
    let l = &again.ledger;
    assert!(l.unfinished_jobs().await.unwrap().is_empty());
    let liar = &c.ids[1];
    for (id, seed) in [(&j1, 1), (&j2, 2), (&j3, 3)] {
        let job = l.job(id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Decided, "job {id}: {:?}", job.error);
        let receipt: tenet_proto::receipt::Receipt =
            serde_json::from_str(job.receipt.as_deref().unwrap()).unwrap();
        receipt.verify().unwrap();
        let expected = output_hash(&output_refs(&[(
            "y".to_string(),
            local(&graph, &inputs(seed)),
        )]));
        assert_eq!(receipt.output_hash, expected, "job {id}: the honest result");
        assert_eq!(receipt.nodes.len(), 2);
        for a in l.assignments(id).await.unwrap() {
            let want = if a.node_id == *liar {
                AssignmentState::Disagreed
            } else {
                AssignmentState::Agreed
            };
            assert_eq!(a.state, want, "job {id}, node {}", a.node_id);
        }
    }
    // Each job settled exactly once: three slashes of the liar, three credits per honest node.
    let liar_rec = l.node(liar).await.unwrap().unwrap();
    assert_eq!((liar_rec.stake, liar_rec.disagreed), (729, 3));
    // The bond at registration, then three slashes.
    assert_eq!(l.stake_events(liar).await.unwrap().len(), 4);
    for honest in [&c.ids[0], &c.ids[2]] {
        let r = l.node(honest).await.unwrap().unwrap();
        assert_eq!((r.stake, r.agreed), (1003, 3));
    }
    assert!(again.resume().await.unwrap().is_empty(), "nothing left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_more_nodes_are_asked_before_any_referee() {
    let mut c = cluster(
        &[None, Some("flip"), Some("noise=0.5")],
        CoordinatorConfig::default(),
    )
    .await;
    let graph = mlp();
    let task = c.put_task(&graph);
    // The job's three replicas are fixed at admission: one honest node and two different liars.
    let job = c
        .coordinator
        .admit(request(task, 7, Tier::Exact))
        .await
        .unwrap();
    let mut honest = vec![c.ids[0].clone()];
    for _ in 0..3 {
        honest.push(c.add_node(None).await);
    }
    let out = c.coordinator.start(job.clone()).await.unwrap().unwrap();
    assert!(!out.refereed, "four honest nodes of six are a majority");
    let mut slashed: Vec<String> = out.slashed.iter().map(|(n, _)| n.clone()).collect();
    slashed.sort();
    let mut liars = vec![c.ids[1].clone(), c.ids[2].clone()];
    liars.sort();
    assert_eq!(slashed, liars);
    assert_eq!(out.receipt.nodes.len(), 4);
    assert_eq!(out.receipt.replicas, 6);
    out.receipt.verify().unwrap();
    assert_eq!(out.outputs[0].1.bytes(), local(&graph, &inputs(7)).bytes());
    assert_eq!(
        c.coordinator.ledger.assignments(&job).await.unwrap().len(),
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_check_mode_replicates_a_fraction_alpha_of_jobs_and_catches_the_liar_only_there() {
    let config = CoordinatorConfig {
        spot_check: Some(0.3),
        ..CoordinatorConfig::default()
    };
    let c = cluster(&[None, Some("flip"), None], config).await;
    let graph = mlp();
    let task = c.put_task(&graph);
    let liar = &c.ids[1];
    let (mut replicated, mut caught) = (0, 0);
    for i in 0..60 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Exact))
            .await
            .unwrap();
        out.receipt.verify().unwrap();
        match out.receipt.replicas {
            1 => assert!(out.slashed.is_empty(), "job {i}: nobody to compare with"),
            3 => {
                replicated += 1;
                assert_eq!(out.slashed.len(), 1, "job {i}");
                assert_eq!(&out.slashed[0].0, liar);
                assert_eq!(out.outputs[0].1.bytes(), local(&graph, &inputs(i)).bytes());
                caught += 1;
            }
            n => panic!("job {i} ran on {n} nodes"),
        }
    }
    // Binomial(60, 0.3): mean 18; outside [3, 40] with probability below 1e-7.
    assert!(
        (3..=40).contains(&replicated),
        "{replicated} of 60 replicated"
    );
    let r = c.coordinator.ledger.node(liar).await.unwrap().unwrap();
    assert_eq!(r.disagreed, caught);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_monitor_benches_a_dead_node_and_brings_it_back_and_deregistered_nodes_get_no_jobs()
 {
    let config = CoordinatorConfig {
        replicas: 1,
        ..CoordinatorConfig::default()
    };
    let mut c = cluster(&[None, None], config).await;
    let l = &c.coordinator.ledger;
    let state = async |id: &str| l.node(id).await.unwrap().unwrap().state;
    let url = c.nodes[1].url.clone();
    c.nodes[1].child.kill().unwrap();
    c.nodes[1].child.wait().unwrap();
    assert_eq!(c.coordinator.check_health(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(state(&c.ids[1]).await, NodeState::Unhealthy);
    assert_eq!(state(&c.ids[0]).await, NodeState::Active);
    // Back on the same address with the same identity: active again.
    c.nodes[1] = start_node_at(
        &c.dir.path().join("node1"),
        &c.key,
        None,
        url.trim_start_matches("http://"),
    );
    assert_eq!(c.coordinator.check_health(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(state(&c.ids[1]).await, NodeState::Active);
    // A node that left gets no new jobs, and its heartbeats are refused until it registers again.
    c.coordinator.deregister(&c.ids[0]).await.unwrap();
    assert_eq!(state(&c.ids[0]).await, NodeState::Deregistered);
    assert!(c.coordinator.heartbeat(&c.ids[0]).await.is_err());
    let graph = mlp();
    let task = c.put_task(&graph);
    for i in 0..5 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Exact))
            .await
            .unwrap();
        assert_eq!(out.receipt.nodes[0].commitment.node.to_hex(), c.ids[1]);
    }
    let again = c
        .coordinator
        .register_node(&c.nodes[0].url, 500, None)
        .await
        .unwrap();
    // Coming back keeps the stake it had: a registration's stake is bonded to new nodes only.
    assert_eq!((again.state, again.stake), (NodeState::Active, 1000));
    c.coordinator.heartbeat(&c.ids[0]).await.unwrap();
}

/// Whether this machine has an OpenCL device that passed its determinism check; without one
/// the mixed-device test is skipped, unless `TENET_REQUIRE_OPENCL=1` (set by `.ci/run`).
fn exact_opencl_device() -> bool {
    let found = tenet_devices::list(&Default::default())
        .into_iter()
        .any(|(spec, info)| {
            spec != tenet_devices::Spec::Cpu && info.is_ok_and(|i| i.exact.passed())
        });
    if !found {
        let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TENET_REQUIRE_OPENCL=1 but no OpenCL device passed its determinism check"
        );
        eprintln!("SKIPPED: no OpenCL device here (install pocl-opencl-icd; .ci/run does)");
    }
    found
}

/// The exact tier across devices: one job replicated over a node computing on OpenCL and two
/// on the CPU agrees bit for bit, every time, and nobody is slashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_job_over_an_opencl_node_and_two_cpu_nodes_agrees_bit_for_bit() {
    if !exact_opencl_device() {
        return;
    }
    let mut c = cluster(&[None, None], CoordinatorConfig::default()).await;
    let gpu = c.add_node_with(None, &["--device", "opencl"]).await;
    let record = c.coordinator.ledger.node(&gpu).await.unwrap().unwrap();
    assert!(
        record.device.ends_with("opencl:0") && record.exact,
        "{record:?}"
    );
    // Products, a softmax, a norm and transcendentals: the ops whose bits differ first.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 16]);
    let w = g.input("w", DType::F32, &[16, 4]);
    let h = x.matmul(&w);
    let y = h.softmax(-1) + h.layer_norm(None, None, 1e-5).gelu() + h.tanh().exp();
    let graph = g.finish(&[("y", &y)]).unwrap();
    let task = c.put_task(&graph);
    for i in 0..5 {
        let out = c
            .coordinator
            .run(request(task, i, Tier::Exact))
            .await
            .unwrap();
        assert!(out.slashed.is_empty(), "job {i}: {:?}", out.slashed);
        assert!(!out.refereed, "job {i}");
        assert_eq!(out.receipt.nodes.len(), 3, "job {i}: all three agreed");
        assert!(
            out.receipt
                .nodes
                .iter()
                .any(|a| a.commitment.node.to_hex() == gpu),
            "job {i}: the OpenCL node is among the agreeing"
        );
        assert_eq!(out.outputs[0].1.bytes(), local(&graph, &inputs(i)).bytes());
    }
}

/// SmolLM2's GGUF file and the greedy tokens the model gives locally after `prompt`, or
/// `None` (skipped) without the model in the cache.
fn smollm2_and_tokens(prompt: &str, max_tokens: usize) -> Option<(Vec<u8>, Vec<u32>, Vec<u32>)> {
    use tenet_models::fetch::{SMOLLM2, cached, find_file};
    use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode};
    let Ok(dir) = cached(&SMOLLM2) else {
        eprintln!("SKIPPED: smollm2 is not in the model cache; run `tenet models fetch smollm2`");
        return None;
    };
    let gguf = find_file(&dir, GGUF_FILE)?;
    let model = SmolLm2::load_with(&gguf, WeightsMode::Quantized).unwrap();
    let ids = model.encode(prompt).unwrap();
    let device = CpuDevice::new(1, SimdLevel::detect());
    let tokens = model
        .generate(&ids, max_tokens, None, &device, |_| {})
        .unwrap();
    Some((std::fs::read(&gguf).unwrap(), ids, tokens))
}

fn generation_request(weights: Hash, ids: &[u32], max_tokens: u64) -> JobRequest {
    use tenet_models::generation::{self, GenerationParams};
    let params = GenerationParams {
        max_tokens,
        first_step: 0,
        sampling: None,
        stop: vec![],
    };
    JobRequest {
        task: Hash(generation::task_id()),
        weights: Some(weights),
        inputs: generation::inputs(ids, &params).into_iter().collect(),
        tier: Tier::Exact,
        seed: 0,
    }
}

/// An LLM generation is a job like any other: three nodes generate the tokens with
/// commit-reveal, the liar among them (its first token changed) is slashed, and the
/// receipt verifies; with no majority and no more nodes, the coordinator referees by
/// generating the tokens itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_is_verified_across_nodes_and_a_lying_node_is_slashed() {
    let Some((gguf, ids, want)) = smollm2_and_tokens("The capital of France is", 4) else {
        return;
    };
    let c = cluster(&[None, Some("flip"), None], CoordinatorConfig::default()).await;
    let weights = c.coordinator.store().put_bytes(&gguf).unwrap();
    let out = c
        .coordinator
        .run(generation_request(weights, &ids, 4))
        .await
        .unwrap();
    let (tokens, _) = tenet_models::generation::parse_outputs(&out.outputs).unwrap();
    assert_eq!(tokens, want);
    assert_eq!(out.slashed.len(), 1);
    assert_eq!(out.slashed[0].0, c.ids[1], "the liar is the one slashed");
    assert!(!out.refereed);
    out.receipt.verify().unwrap();
    assert_eq!(out.receipt.nodes.len(), 2);

    // Two replicas that disagree, and nobody else to ask: the coordinator decides.
    let config = CoordinatorConfig {
        replicas: 2,
        ..CoordinatorConfig::default()
    };
    let c = cluster(&[None, Some("flip")], config).await;
    let weights = c.coordinator.store().put_bytes(&gguf).unwrap();
    let out = c
        .coordinator
        .run(generation_request(weights, &ids, 4))
        .await
        .unwrap();
    assert!(out.refereed, "one against one: the referee decides");
    let (tokens, _) = tenet_models::generation::parse_outputs(&out.outputs).unwrap();
    assert_eq!(tokens, want);
    assert_eq!(out.slashed.len(), 1);
    assert_eq!(out.slashed[0].0, c.ids[1]);
    // The receipt says so: one node of two signed the result, which the referee chose.
    assert!(matches!(
        out.receipt.verify(),
        Err(tenet_proto::receipt::ReceiptError::NoMajority {
            agreeing: 1,
            replicas: 2
        })
    ));
}
