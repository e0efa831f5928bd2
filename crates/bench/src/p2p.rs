//! The peer-to-peer benchmark: the same small task called one job after another on the same
//! loopback, once through a coordinator (REST, three nodes, three replicas) and once with no
//! coordinator (`tenet call --p2p`'s path: three hosters found on the DHT, commitments, reveals
//! and the receipt handled by the caller), every answer verified; job latency p50/p99 of each
//! and their ratio (the goal: p2p within 1.5× of the coordinator), and the DHT record round
//! trip (a signed record put by one peer until another reads it back).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenet_coordinator::CoordinatorConfig;
use tenet_local::LocalNetwork;
use tenet_net::{Bytes, Method, NodeClient, RawRequest, identity};
use tenet_p2p::advert::Advert;
use tenet_p2p::call::{CallSpec, find};
use tenet_p2p::host::TaskFiles;
use tenet_p2p::local::{LocalPeers, LocalPeersOptions};
use tenet_proto::Hash;

use crate::load::{calls, quantile, task};
use crate::node::filled;

/// What to run.
#[derive(Clone, Debug)]
pub struct P2pBenchConfig {
    /// Jobs timed on each path (after a few untimed).
    pub jobs: usize,
    /// Replicas per job on each path (and as many nodes or hosters).
    pub replicas: usize,
    /// DHT round trips timed.
    pub records: usize,
}

/// Latency percentiles of one path, ms.
#[derive(Clone, Debug, Default)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
}

impl Latency {
    fn of(mut v: Vec<f64>) -> Latency {
        v.sort_by(|a, b| a.total_cmp(b));
        Latency {
            p50_ms: quantile(&v, 0.5),
            p99_ms: quantile(&v, 0.99),
            mean_ms: v.iter().sum::<f64>() / v.len().max(1) as f64,
        }
    }

    fn json(&self) -> Value {
        json!({"p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "mean_ms": self.mean_ms})
    }
}

/// What it measured.
#[derive(Clone, Debug)]
pub struct P2pReport {
    pub config: P2pBenchConfig,
    pub coordinator: Latency,
    pub p2p: Latency,
    /// Put of a signed record, and the read by another peer that finds it.
    pub dht_put: Latency,
    pub dht_get: Latency,
}

impl P2pReport {
    /// p2p p50 over the coordinator's p50.
    pub fn ratio_p50(&self) -> f64 {
        self.p2p.p50_ms / self.coordinator.p50_ms
    }

    pub fn ratio_p99(&self) -> f64 {
        self.p2p.p99_ms / self.coordinator.p99_ms
    }

    pub fn json(&self) -> Value {
        json!({
            "jobs": self.config.jobs,
            "replicas": self.config.replicas,
            "coordinator": self.coordinator.json(),
            "p2p": self.p2p.json(),
            "ratio_p50": self.ratio_p50(),
            "ratio_p99": self.ratio_p99(),
            "goal_ratio": 1.5,
            "dht_put": self.dht_put.json(),
            "dht_get": self.dht_get.json(),
        })
    }

    pub fn table(&self) -> String {
        let row = |name: &str, l: &Latency| {
            format!(
                "{name:<34} {:>9.2} {:>9.2} {:>9.2}\n",
                l.p50_ms, l.p99_ms, l.mean_ms
            )
        };
        let mut out = format!(
            "{:<34} {:>9} {:>9} {:>9}\n",
            "", "p50 ms", "p99 ms", "mean ms"
        );
        out += &row(
            &format!("job via coordinator (r = {})", self.config.replicas),
            &self.coordinator,
        );
        out += &row(
            &format!("job via p2p, no coordinator (r = {})", self.config.replicas),
            &self.p2p,
        );
        out += &row("DHT put (signed record)", &self.dht_put);
        out += &row("DHT get (another peer)", &self.dht_get);
        out += &format!(
            "p2p / coordinator: {:.2}× at p50, {:.2}× at p99 (goal ≤ 1.5×)\n",
            self.ratio_p50(),
            self.ratio_p99()
        );
        out
    }
}

/// Run both paths and the DHT round trips; `progress` hears each phase.
pub fn run(config: &P2pBenchConfig, mut progress: impl FnMut(&str)) -> Result<P2pReport, String> {
    let dir = std::env::temp_dir().join(format!("tenet-bench-p2p-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let result = rt.block_on(async {
        progress(&format!(
            "coordinator path: a coordinator and {} nodes on 127.0.0.1",
            config.replicas
        ));
        let coordinator = coordinator_path(&dir.join("coordinator"), config).await?;
        progress(&format!(
            "p2p path: {} hosters on 127.0.0.1, no coordinator",
            config.replicas
        ));
        let (p2p, dht_put, dht_get) = p2p_path(&dir.join("p2p"), config).await?;
        Ok(P2pReport {
            config: config.clone(),
            coordinator,
            p2p,
            dht_put,
            dht_get,
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

const WARMUP: usize = 3;

async fn coordinator_path(
    dir: &std::path::Path,
    config: &P2pBenchConfig,
) -> Result<Latency, String> {
    let net = LocalNetwork::start_on(
        dir,
        &vec![None; config.replicas],
        1000,
        CoordinatorConfig {
            replicas: config.replicas,
            ..CoordinatorConfig::default()
        },
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    let result = async {
        let auth = (
            "authorization".to_string(),
            format!("Bearer {}", net.api_key),
        );
        let client = NodeClient::new(&net.coordinator_url, identity::generate())
            .map_err(|e| e.to_string())?;
        let r = client
            .send(RawRequest {
                method: Method::POST,
                path: "/v1/tasks".into(),
                headers: vec![auth.clone()],
                body: Bytes::from(task().to_bytes()),
            })
            .await
            .map_err(|e| e.to_string())?;
        let deployed: Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
        let path = tenet_proto::api::from_value::<tenet_proto::api::TaskDeployed>(&deployed)
            .map_err(|_| format!("deploying failed: {deployed}"))?
            .task
            .endpoint;
        let key = net.coordinator_key.public();
        let mut times = Vec::new();
        for (i, call) in calls(&task(), config.jobs + WARMUP, 1)?.iter().enumerate() {
            let t = Instant::now();
            let answer = client
                .send(RawRequest {
                    method: Method::POST,
                    path: path.clone(),
                    headers: vec![
                        auth.clone(),
                        ("content-type".into(), "application/json".into()),
                    ],
                    body: call.body.clone(),
                })
                .await
                .map_err(|e| e.to_string())?;
            crate::load::verified(answer.status, &answer.body, &key, &call.expected)?;
            if i >= WARMUP {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(Latency::of(times))
    }
    .await;
    net.shutdown().await;
    result
}

async fn p2p_path(
    dir: &std::path::Path,
    config: &P2pBenchConfig,
) -> Result<(Latency, Latency, Latency), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let graph = task();
    let path = dir.join("task.tnt");
    std::fs::write(&path, graph.to_bytes()).map_err(|e| e.to_string())?;
    let peers = LocalPeers::start(
        dir,
        &LocalPeersOptions {
            validators: 0,
            lying_validators: Vec::new(),
            hosters: config.replicas,
            lying_hosters: Vec::new(),
            cheat: String::new(),
            tasks: vec![TaskFiles {
                graph: path,
                weights: None,
                name: None,
            }],
            epoch_ms: 60_000,
            genesis_in_ms: 0,
            transport: tenet_p2p::Transport::Tcp,
            event_logs: None,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let key = identity::generate();
    let client = peers.client(key.clone()).await.map_err(|e| e.to_string())?;
    let found = find(
        &client,
        Hash(graph.id().0),
        None,
        config.replicas,
        Duration::from_secs(20),
    )
    .await
    .map_err(|e| e.to_string())?;
    let w = filled(&[16, 32], 7);
    let expected = calls(&graph, config.jobs + WARMUP, 1)?;
    let mut times = Vec::new();
    for (i, call) in expected.iter().enumerate() {
        let x = filled(&[1, 16], 1 + i as u32);
        let spec = CallSpec::exact(
            vec![("w".into(), w.clone()), ("x".into(), x)],
            config.replicas,
            Duration::from_secs(30),
        );
        let t = Instant::now();
        let outcome = tenet_p2p::call::call(&client, &key, &found, spec)
            .await
            .map_err(|e| e.to_string())?;
        outcome
            .receipt
            .verify_from(&key.public())
            .map_err(|e| e.to_string())?;
        if outcome.outputs.first().map(|(_, y)| y.bytes()) != Some(&call.expected[..]) {
            return Err("a p2p result differs from a local run".into());
        }
        if i >= WARMUP {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    // DHT round trips: the client puts a fresh signed advert of itself; a hoster reads it.
    let reader = &peers.hosters[peers.hosters.len() - 1].net;
    let mut puts = Vec::new();
    let mut gets = Vec::new();
    for i in 0..config.records {
        let advert = Advert::sign(
            &key,
            Vec::new(),
            Vec::new(),
            format!("bench {i}"),
            0,
            0.0,
            tenet_proto::unix_now(),
        );
        let record = advert.record().ok_or("the advert has no record")?;
        let t = Instant::now();
        client.put_record(record).await.map_err(|e| e.to_string())?;
        puts.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = reader
                .adverts(&client.peer_id())
                .await
                .map_err(|e| e.to_string())?;
            if got.iter().any(|a| a.device == advert.device) {
                break;
            }
            if Instant::now() > deadline {
                return Err("a record put on the DHT was not found by another peer".into());
            }
        }
        gets.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((Latency::of(times), Latency::of(puts), Latency::of(gets)))
}
