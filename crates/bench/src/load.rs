//! The load benchmark: a local network on 127.0.0.1 (a coordinator with its SQLite ledger
//! and several nodes, real HTTP between them), many concurrent clients each calling a small
//! task over the REST API one job after another. Every answer is checked (status, receipt
//! signature and openings, result against a local run) and, at the end, the ledger must hold
//! every job decided and none unfinished: jobs/s and latency percentiles count only if nothing
//! was lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenet_coordinator::CoordinatorConfig;
use tenet_devices::SimdLevel;
use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder};
use tenet_ledger::{JobState, Ledger};
use tenet_local::LocalNetwork;
use tenet_net::{Bytes, Method, NodeClient, RawRequest, identity};
use tenet_proto::api;

use crate::node::filled;

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub clients: usize,
    pub jobs_per_client: usize,
    pub replicas: usize,
    pub nodes: usize,
    /// `postgres://…` for a PostgreSQL ledger; SQLite when `None`.
    pub ledger: Option<String>,
}

impl Default for LoadConfig {
    fn default() -> LoadConfig {
        LoadConfig {
            clients: 200,
            jobs_per_client: 20,
            replicas: 3,
            nodes: 5,
            ledger: None,
        }
    }
}

/// What it measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub config: LoadConfig,
    /// Jobs answered 200 with a verified receipt and the right result.
    pub completed: usize,
    /// Jobs that got an error or a wrong answer.
    pub failed: usize,
    /// Of the jobs answered, those the ledger holds decided; and the jobs it holds unfinished.
    pub ledger_decided: usize,
    pub ledger_unfinished: usize,
    pub seconds: f64,
    pub jobs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The first few errors, if any.
    pub errors: Vec<String>,
    /// A dashboard watching all along (`watch.rs`).
    pub watch: crate::watch::WatchReport,
    /// Event-stream subscribers left once the load ended: the stalled reader must be gone.
    pub subscribers_after: usize,
}

/// A small task: one 16→32 layer with tanh, the shape of a tiny model call.
pub(crate) fn task() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 16]);
    let w = g.input("w", DType::F32, &[16, 32]);
    g.finish(&[("y", &x.matmul(&w).tanh())])
        .expect("a valid graph")
}

/// The `q` quantile of sorted values (nearest rank); NaN for none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

/// One client's request for [`task`], and the bytes its `y` must have.
pub(crate) struct Call {
    pub body: Bytes,
    pub expected: Vec<u8>,
}

/// `n` calls of [`task`] with inputs from seeds `first..first + n`, each with the result a
/// local run gives.
pub(crate) fn calls(graph: &Graph, n: usize, first: u32) -> Result<Vec<Call>, String> {
    let prepared = tenet_devices::cpu(&tenet_devices::Options {
        threads: Some(1),
        simd: Some(SimdLevel::Portable),
        ..Default::default()
    })
    .compile(graph)
    .map_err(|e| e.to_string())?;
    let w = filled(&[16, 32], 7);
    (0..n)
        .map(|i| {
            let x = filled(&[1, 16], first + i as u32);
            let inputs =
                HashMap::from([("x".to_string(), x.clone()), ("w".to_string(), w.clone())]);
            let y = prepared
                .run(&inputs, &tenet_ir::NoWeights, 0)
                .map_err(|e| e.to_string())?
                .remove(0)
                .1;
            let given = vec![("x".to_string(), x), ("w".to_string(), w.clone())];
            let body = api::to_vec(&api::RunRequest {
                inputs: serde_json::from_str(&tenet_models::outputs_json(&given))
                    .map_err(|e| e.to_string())?,
                tier: None,
                seed: None,
            })
            .map_err(|e| e.to_string())?;
            Ok(Call {
                body: Bytes::from(body),
                expected: y.bytes().to_vec(),
            })
        })
        .collect()
}

/// Check one answer to a [`Call`]: 200, a receipt by this coordinator that verifies, the
/// right result; the answer (its receipt in it).
pub(crate) fn verified(
    status: u16,
    body: &[u8],
    coordinator: &tenet_proto::auth::PublicKey,
    expected: &[u8],
) -> Result<api::RunAnswer, String> {
    let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    if status != 200 {
        return Err(format!("status {status}: {}", text()));
    }
    let answer: api::RunAnswer =
        serde_json::from_slice(body).map_err(|e| format!("{e}: {}", text()))?;
    answer
        .receipt
        .verify_from(coordinator)
        .map_err(|e| format!("receipt does not verify: {e}"))?;
    let ty = tenet_ir::TensorType::new(DType::F32, vec![1u64, 32]);
    let y = tenet_models::tensor_from_json(answer.outputs.get("y").unwrap_or(&Value::Null), &ty)?;
    if y.bytes() != expected {
        return Err("the result differs from a local run".into());
    }
    Ok(answer)
}

/// [`verified`], giving the job's id.
fn check(
    status: u16,
    body: &[u8],
    coordinator: &tenet_proto::auth::PublicKey,
    expected: &[u8],
) -> Result<String, String> {
    Ok(verified(status, body, coordinator, expected)?.job_id)
}

/// Start the network, run the clients, check the ledger, stop. `progress` hears each phase.
pub fn run(config: &LoadConfig, mut progress: impl FnMut(&str)) -> Result<LoadReport, String> {
    let dir = std::env::temp_dir().join(format!("tenet-bench-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let result = rt.block_on(async {
        progress(&format!(
            "starting a coordinator and {} nodes on 127.0.0.1",
            config.nodes
        ));
        let net = LocalNetwork::start_on(
            &dir,
            &vec![None; config.nodes],
            1000,
            CoordinatorConfig {
                replicas: config.replicas,
                node_timeout: Duration::from_secs(120),
                ..CoordinatorConfig::default()
            },
            config.ledger.as_deref(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let report = drive(&net, config, &mut progress).await;
        net.shutdown().await;
        report
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn drive(
    net: &LocalNetwork,
    config: &LoadConfig,
    progress: &mut impl FnMut(&str),
) -> Result<LoadReport, String> {
    let graph = task();
    let auth = (
        "authorization".to_string(),
        format!("Bearer {}", net.api_key),
    );
    let deployer =
        NodeClient::new(&net.coordinator_url, identity::generate()).map_err(|e| e.to_string())?;
    let r = deployer
        .send(RawRequest {
            method: Method::POST,
            path: "/v1/tasks".into(),
            headers: vec![auth.clone()],
            body: Bytes::from(graph.to_bytes()),
        })
        .await
        .map_err(|e| e.to_string())?;
    let deployed: Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
    let path = api::from_value::<api::TaskDeployed>(&deployed)
        .map_err(|_| format!("deploying failed: {deployed}"))?
        .task
        .endpoint;
    let calls = Arc::new(calls(&graph, config.jobs_per_client, 1000)?);
    let coordinator = net.coordinator_key.public();
    progress(&format!(
        "{} clients × {} jobs, {} replicas each",
        config.clients, config.jobs_per_client, config.replicas
    ));
    // A dashboard watching all along: a follower of the event stream, a poller of the page,
    // the nodes and the jobs, and a reader that never reads (it must be dropped).
    let (stop_watch, watching) = tokio::sync::watch::channel(false);
    let addr = net
        .coordinator_url
        .trim_start_matches("http://")
        .to_string();
    let follower = tokio::spawn(crate::watch::follow(
        addr.clone(),
        net.api_key.clone(),
        watching.clone(),
    ));
    let staller = tokio::spawn(crate::watch::stall(
        addr,
        net.api_key.clone(),
        watching.clone(),
    ));
    let poller = tokio::spawn(crate::watch::poll(
        net.coordinator_url.clone(),
        net.api_key.clone(),
        watching,
    ));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..config.clients {
        let (url, path, auth, calls) = (
            net.coordinator_url.clone(),
            path.clone(),
            auth.clone(),
            calls.clone(),
        );
        clients.spawn(async move {
            let http = NodeClient::new(&url, identity::generate()).map_err(|e| e.to_string());
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            let mut ids = Vec::new();
            let Ok(http) = http else {
                return (latencies, ids, vec![http.err().unwrap_or_default()]);
            };
            for call in calls.iter() {
                let t = Instant::now();
                let answer = http
                    .send(RawRequest {
                        method: Method::POST,
                        path: path.clone(),
                        headers: vec![
                            auth.clone(),
                            ("content-type".into(), "application/json".into()),
                        ],
                        body: call.body.clone(),
                    })
                    .await;
                let took = t.elapsed().as_secs_f64() * 1e3;
                match answer
                    .map_err(|e| e.to_string())
                    .and_then(|r| check(r.status, &r.body, &coordinator, &call.expected))
                {
                    Ok(id) => {
                        latencies.push(took);
                        ids.push(id);
                    }
                    Err(e) => errors.push(e),
                }
            }
            (latencies, ids, errors)
        });
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    let mut job_ids = Vec::new();
    let mut failed = 0;
    while let Some(done) = clients.join_next().await {
        let (l, ids, e) = done.map_err(|e| e.to_string())?;
        latencies.extend(l);
        job_ids.extend(ids);
        failed += e.len();
        errors.extend(e.into_iter().take(3));
    }
    let seconds = started.elapsed().as_secs_f64();
    // The stalled reader's stream is cut once it falls a ring behind or leaves an event
    // unread past the slow-reader limit: under a full load, long before the end.
    let subscribers_after = net.core.events.subscribers();
    let _ = stop_watch.send(true);
    let (events, follower_ended) = follower.await.map_err(|e| e.to_string())?;
    let (reads, read_errors) = poller.await.map_err(|e| e.to_string())?;
    let _ = staller.await;
    let watch = crate::watch::WatchReport {
        events,
        follower_ended,
        reads,
        read_errors,
    };
    progress("checking the ledger");
    // Distinct ids only: two answers naming one job would be a lost job.
    job_ids.sort();
    job_ids.dedup();
    let mut ledger_decided = 0;
    for id in &job_ids {
        let job = net.core.ledger.job(id).await.map_err(|e| e.to_string())?;
        ledger_decided += usize::from(job.is_some_and(|j| j.state == JobState::Decided));
    }
    let ledger_unfinished = net
        .core
        .ledger
        .unfinished_jobs()
        .await
        .map_err(|e| e.to_string())?
        .len();
    latencies.sort_by(|a, b| a.total_cmp(b));
    errors.truncate(5);
    Ok(LoadReport {
        config: config.clone(),
        completed: latencies.len(),
        failed,
        ledger_decided,
        ledger_unfinished,
        seconds,
        jobs_per_s: latencies.len() as f64 / seconds,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        errors,
        watch,
        subscribers_after,
    })
}

impl LoadReport {
    /// Every job answered correctly and decided in the ledger, none unfinished.
    pub fn nothing_lost(&self) -> bool {
        let total = self.config.clients * self.config.jobs_per_client;
        self.completed == total && self.ledger_decided == total && self.ledger_unfinished == 0
    }

    pub fn json(&self) -> Value {
        json!({
            "clients": self.config.clients,
            "jobs_per_client": self.config.jobs_per_client,
            "replicas": self.config.replicas,
            "nodes": self.config.nodes,
            "ledger": if self.config.ledger.is_some() { "postgres" } else { "sqlite" },
            "completed": self.completed,
            "failed": self.failed,
            "ledger_decided": self.ledger_decided,
            "ledger_unfinished": self.ledger_unfinished,
            "nothing_lost": self.nothing_lost(),
            "seconds": self.seconds,
            "jobs_per_s": self.jobs_per_s,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "errors": self.errors,
            "dashboard": {
                "events_followed": self.watch.events,
                "follower_dropped": self.watch.follower_ended,
                "reads": self.watch.reads.len(),
                "read_errors": self.watch.read_errors,
                "read_p50_ms": quantile(&self.watch.reads, 0.5),
                "read_max_ms": self.watch.reads.last().copied().unwrap_or(f64::NAN),
                "stalled_reader_dropped": self.subscribers_after <= 1,
            },
        })
    }

    pub fn table(&self) -> String {
        let c = &self.config;
        let total = c.clients * c.jobs_per_client;
        let mut out = format!(
            "tenet load on 127.0.0.1: {} clients × {} jobs, r = {}, {} nodes, {} ledger\n\n",
            c.clients,
            c.jobs_per_client,
            c.replicas,
            c.nodes,
            if c.ledger.is_some() {
                "PostgreSQL"
            } else {
                "SQLite"
            }
        );
        out += &format!(
            "completed and verified   {} of {total}{}\n",
            self.completed,
            if self.failed > 0 {
                format!(" ({} failed)", self.failed)
            } else {
                String::new()
            }
        );
        out += &format!(
            "ledger                   {} decided, {} unfinished -> {}\n",
            self.ledger_decided,
            self.ledger_unfinished,
            if self.nothing_lost() {
                "nothing lost"
            } else {
                "JOBS LOST OR FAILED"
            }
        );
        out += &format!(
            "throughput               {:.1} jobs/s ({:.1} s)\n",
            self.jobs_per_s, self.seconds
        );
        out += &format!(
            "latency per call         p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms\n",
            self.p50_ms, self.p99_ms, self.max_ms
        );
        let w = &self.watch;
        out += &format!(
            "dashboard meanwhile      {} reads (page, nodes, jobs) p50 {:.1} ms max {:.1} ms, {} failed; {} events followed live{}; a reader that never reads {}\n",
            w.reads.len(),
            quantile(&w.reads, 0.5),
            w.reads.last().copied().unwrap_or(f64::NAN),
            w.read_errors,
            w.events,
            if w.follower_ended {
                " (its stream was cut)"
            } else {
                ""
            },
            if self.subscribers_after <= 1 {
                "was dropped"
            } else {
                "was not dropped yet (it is once it falls 1024 events behind or leaves one unread 10 s)"
            }
        );
        for e in &self.errors {
            out += &format!("  error: {e}\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn a_bounded_load_completes_every_job_and_loses_none() {
        let config = LoadConfig {
            clients: 8,
            jobs_per_client: 5,
            ..LoadConfig::default()
        };
        let report = run(&config, |_| {}).unwrap();
        assert!(report.nothing_lost(), "{}", report.table());
        assert_eq!(report.completed, 40);
        assert_eq!(report.ledger_decided, 40);
        assert!(report.p50_ms <= report.p99_ms && report.p99_ms <= report.max_ms);
        // The dashboard read the whole time and followed every job's events live.
        let w = &report.watch;
        assert!(
            !w.reads.is_empty() && w.read_errors == 0,
            "{}",
            report.table()
        );
        assert!(!w.follower_ended, "{}", report.table());
        // Each job: accepted, 3 assigned, 3 committed, 3 revealed, decided.
        assert!(w.events >= 40 * 11, "{}", report.table());
    }
}
