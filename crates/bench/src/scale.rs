//! The scale-out benchmark: the load benchmark's clients against 1 and then N coordinator
//! processes sharing one ledger (PostgreSQL, a fresh database per tier), with nodes as
//! processes too, in one run. Every answer is checked (its receipt signed by a coordinator of
//! the deployment, the result against a local run), and afterwards the ledger: every
//! acknowledged job decided, none unfinished, no job made twice, each node credited once per
//! job. Each tier's CPU is read from each process's own accounting (`/proc/PID/stat`):
//! coordinators, PostgreSQL, nodes and the clients (this process), per verified job.
//!
//! With `kill_one`, coordinator 0 of the N tier is killed (SIGKILL) halfway through: callers
//! waiting on it resubmit their call, under its idempotency key, to the next coordinator, and
//! the jobs it was driving are taken over once their leases lapse.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenet_ledger::{JobState, Ledger, SqlLedger};
use tenet_net::{Bytes, Method, NodeClient, RawRequest, identity};
use tenet_proto::api;
use tenet_proto::auth::PublicKey;

use crate::load::{Call, calls, quantile, task};

/// What to run.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// The `tenet` executable to start coordinators and nodes with.
    pub exe: PathBuf,
    pub clients: usize,
    pub jobs_per_client: usize,
    pub replicas: usize,
    pub nodes: usize,
    /// Coordinators in the scaled tier (the first tier has one).
    pub coordinators: usize,
    /// A PostgreSQL server URL whose user may create databases (one per tier); SQLite files
    /// shared by the processes when `None`.
    pub ledger: Option<String>,
    /// Kill coordinator 0 of the scaled tier halfway through.
    pub kill_one: bool,
    /// The coordinators' lease time.
    pub lease: Duration,
}

impl ScaleConfig {
    pub fn new(exe: PathBuf) -> ScaleConfig {
        ScaleConfig {
            exe,
            clients: 200,
            jobs_per_client: 20,
            replicas: 3,
            nodes: 5,
            coordinators: 3,
            ledger: None,
            kill_one: false,
            lease: Duration::from_secs(2),
        }
    }
}

/// CPU seconds of each tier of processes over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub coordinators: f64,
    /// `None` when no PostgreSQL process runs on this machine (a SQLite ledger, or a remote
    /// server).
    pub postgres: Option<f64>,
    pub nodes: f64,
    pub clients: f64,
}

/// One tier's run.
#[derive(Clone, Debug)]
pub struct TierReport {
    pub coordinators: usize,
    pub completed: usize,
    pub failed: usize,
    pub ledger_decided: usize,
    pub ledger_unfinished: usize,
    /// Jobs in the ledger (a job made twice for one call would show here).
    pub ledger_jobs: usize,
    /// Acknowledged jobs whose nodes were not each credited exactly once.
    pub credit_errors: usize,
    pub seconds: f64,
    pub jobs_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub cpu: Cpu,
    /// Calls resubmitted to another coordinator after theirs could not be reached.
    pub failovers: usize,
    /// Jobs answered when coordinator 0 was killed, if it was.
    pub killed_after: Option<usize>,
    /// Receipts by each coordinator key (in start order).
    pub signed_by: Vec<usize>,
    pub errors: Vec<String>,
}

impl TierReport {
    fn total(&self, config: &ScaleConfig) -> usize {
        config.clients * config.jobs_per_client
    }

    /// Every call answered and verified, every job decided once, none unfinished, every node
    /// credited once per job.
    pub fn nothing_lost(&self, config: &ScaleConfig) -> bool {
        let total = self.total(config);
        self.completed == total
            && self.ledger_decided == total
            && self.ledger_jobs == total
            && self.ledger_unfinished == 0
            && self.credit_errors == 0
    }

    fn per_job_ms(&self, seconds: f64) -> f64 {
        seconds * 1e3 / self.completed.max(1) as f64
    }
}

/// Both tiers.
#[derive(Clone, Debug)]
pub struct ScaleReport {
    pub config: ScaleConfig,
    pub tiers: Vec<TierReport>,
}

/// A started process, killed when dropped.
struct Proc {
    child: Child,
    pid: u32,
    url: String,
    key: Option<PublicKey>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(exe: &Path, args: &[String], log: &Path, with_key: bool) -> Result<Proc, String> {
    let (child, line) = crate::hostile::spawn(exe, args, log)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let key = if with_key {
        Some(
            words
                .get(2)
                .and_then(|k| PublicKey::parse(k))
                .ok_or_else(|| format!("no key in the first line: {line}"))?,
        )
    } else {
        None
    };
    Ok(Proc {
        pid: child.id(),
        child,
        url: words.last().unwrap_or(&"").to_string(),
        key,
    })
}

/// User plus system CPU seconds of process `pid` (its threads together) and, with
/// `children`, of its reaped children.
fn cpu_seconds(pid: &str, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14–17 of the line: 11–14 after the name.
    let ticks = f.get(11).copied().unwrap_or(0)
        + f.get(12).copied().unwrap_or(0)
        + if children {
            f.get(13).copied().unwrap_or(0) + f.get(14).copied().unwrap_or(0)
        } else {
            0
        };
    // /proc reports in USER_HZ, 100 a second on Linux's ABI.
    ticks as f64 / 100.0
}

/// Every PostgreSQL server process on this machine, CPU included (the postmaster with the
/// backends it reaped); `None` when there is none.
fn postgres_cpu() -> Option<f64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "postgres" {
            *total.get_or_insert(0.0) += cpu_seconds(pid, true);
        }
    }
    total
}

fn snapshot(coordinators: &[Proc], nodes: &[Proc]) -> Cpu {
    let sum = |ps: &[Proc]| {
        ps.iter()
            .map(|p| cpu_seconds(&p.pid.to_string(), false))
            .sum()
    };
    Cpu {
        coordinators: sum(coordinators),
        postgres: postgres_cpu(),
        nodes: sum(nodes),
        clients: cpu_seconds("self", false),
    }
}

/// Run the one-coordinator tier, then the N-coordinator tier; `progress` hears each phase.
pub fn run(config: &ScaleConfig, mut progress: impl FnMut(&str)) -> Result<ScaleReport, String> {
    if config.coordinators == 0 || config.replicas == 0 || config.nodes < config.replicas {
        return Err(
            "--coordinators and --replicas must be at least 1, and --nodes at least --replicas"
                .into(),
        );
    }
    let dir = std::env::temp_dir().join(format!("tenet-bench-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut tiers = Vec::new();
    let mut counts = vec![1];
    if config.coordinators > 1 {
        counts.push(config.coordinators);
    }
    for n in counts {
        let tier_dir = dir.join(format!("tier-{n}"));
        std::fs::create_dir_all(&tier_dir).map_err(|e| e.to_string())?;
        let report = rt.block_on(tier(config, n, &tier_dir, &mut progress));
        let _ = std::fs::remove_dir_all(&tier_dir);
        tiers.push(report?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ScaleReport {
        config: config.clone(),
        tiers,
    })
}

async fn tier(
    config: &ScaleConfig,
    n: usize,
    dir: &Path,
    progress: &mut impl FnMut(&str),
) -> Result<TierReport, String> {
    let (ledger_url, scratch) = match &config.ledger {
        Some(admin) => {
            let url = SqlLedger::create_scratch_database(admin, "tenet_bench_scale")
                .await
                .map_err(|e| {
                    format!("cannot create a database for the tier on {admin} (its user must be allowed to): {e}")
                })?;
            (url.clone(), Some((admin.clone(), url)))
        }
        None => (
            format!("sqlite://{}", dir.join("ledger.db").display()),
            None,
        ),
    };
    let result = tier_on(config, n, dir, &ledger_url, progress).await;
    if let Some((admin, url)) = scratch {
        let name = url.rsplit_once('/').map_or("", |(_, n)| n).to_string();
        let _ =
            SqlLedger::admin_execute(&admin, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
    }
    result
}

async fn tier_on(
    config: &ScaleConfig,
    n: usize,
    dir: &Path,
    ledger_url: &str,
    progress: &mut impl FnMut(&str),
) -> Result<TierReport, String> {
    let (api_key, admin_key) = ("bench-caller".to_string(), "bench-admin".to_string());
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    progress(&format!(
        "{n} coordinator process(es) and {} node processes on 127.0.0.1, ledger {}",
        config.nodes,
        if ledger_url.starts_with("sqlite") {
            "SQLite"
        } else {
            "PostgreSQL"
        }
    ));
    let mut coordinators = Vec::new();
    for i in 0..n {
        let args: Vec<String> = [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path(dir.join(format!("coordinator-{i}"))),
            "--ledger",
            ledger_url,
            "--api-key",
            &api_key,
            "--admin-key",
            &admin_key,
            "--replicas",
            &config.replicas.to_string(),
            "--node-timeout",
            "120",
            "--lease",
            &config.lease.as_secs_f64().to_string(),
        ]
        .map(String::from)
        .to_vec();
        coordinators.push(start(
            &config.exe,
            &args,
            &dir.join(format!("coordinator-{i}.log")),
            true,
        )?);
    }
    let keys: Vec<PublicKey> = coordinators.iter().filter_map(|c| c.key).collect();
    let mut nodes = Vec::new();
    for i in 0..config.nodes {
        let mut args: Vec<String> = [
            "node",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path(dir.join(format!("node-{i}"))),
            "--threads",
            "1",
            "--no-fsync",
        ]
        .map(String::from)
        .to_vec();
        for k in &keys {
            args.extend(["--trust".to_string(), k.to_hex()]);
        }
        nodes.push(start(
            &config.exe,
            &args,
            &dir.join(format!("node-{i}.log")),
            false,
        )?);
    }
    let admin =
        NodeClient::new(&coordinators[0].url, identity::generate()).map_err(|e| e.to_string())?;
    for node in &nodes {
        let body = api::to_vec(&api::Register {
            url: node.url.clone(),
            stake: Some(1000),
        })
        .map_err(|e| e.to_string())?;
        let r = send(&admin, Method::POST, "/v1/nodes".into(), &admin_key, body)
            .await
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!(
                "registering a node: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
    }
    let graph = task();
    let r = send(
        &admin,
        Method::POST,
        "/v1/tasks".into(),
        &api_key,
        graph.to_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let endpoint = serde_json::from_slice::<api::TaskDeployed>(&r.body)
        .map_err(|_| format!("deploying failed: {}", String::from_utf8_lossy(&r.body)))?
        .task
        .endpoint;
    let calls = Arc::new(calls(&graph, config.jobs_per_client, 1000)?);
    let urls: Arc<Vec<String>> = Arc::new(coordinators.iter().map(|c| c.url.clone()).collect());
    let keys = Arc::new(keys);
    let answered = Arc::new(AtomicUsize::new(0));
    let total = config.clients * config.jobs_per_client;
    progress(&format!(
        "{} clients × {} jobs, r = {}, spread over {n} coordinator(s){}",
        config.clients,
        config.jobs_per_client,
        config.replicas,
        if config.kill_one && n > 1 {
            "; coordinator 0 is killed halfway"
        } else {
            ""
        }
    ));
    let before = snapshot(&coordinators, &nodes);
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..config.clients {
        let (urls, keys, calls, answered, endpoint, api_key) = (
            urls.clone(),
            keys.clone(),
            calls.clone(),
            answered.clone(),
            endpoint.clone(),
            api_key.clone(),
        );
        clients.spawn(async move {
            client(c, &urls, &keys, &calls, &answered, &endpoint, &api_key).await
        });
    }
    // Coordinator 0 dies halfway (SIGKILL: no goodbye, its leases just stop being renewed).
    let mut killed_after = None;
    let mut killed_cpu = 0.0;
    if config.kill_one && n > 1 {
        while answered.load(Ordering::Relaxed) < total / 2
            && started.elapsed() < Duration::from_secs(600)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Its CPU up to its death counts: once reaped, /proc knows it no more.
        killed_cpu = cpu_seconds(&coordinators[0].pid.to_string(), false);
        let _ = coordinators[0].child.kill();
        let _ = coordinators[0].child.wait();
        killed_after = Some(answered.load(Ordering::Relaxed));
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    let mut ids = Vec::new();
    let mut failed = 0;
    let mut failovers = 0;
    let mut signed_by = vec![0; n];
    while let Some(done) = clients.join_next().await {
        let out = done.map_err(|e| e.to_string())?;
        latencies.extend(out.latencies);
        ids.extend(out.ids);
        failed += out.errors.len();
        failovers += out.failovers;
        for (i, s) in out.signed_by.iter().enumerate() {
            signed_by[i] += s;
        }
        errors.extend(out.errors.into_iter().take(3));
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = snapshot(&coordinators, &nodes);
    let cpu = Cpu {
        coordinators: after.coordinators + killed_cpu - before.coordinators,
        postgres: after.postgres.zip(before.postgres).map(|(a, b)| a - b),
        nodes: after.nodes - before.nodes,
        clients: after.clients - before.clients,
    };
    drop(nodes);
    drop(coordinators);
    progress("checking the ledger");
    let ledger = SqlLedger::connect(ledger_url)
        .await
        .map_err(|e| e.to_string())?;
    ids.sort();
    ids.dedup();
    let mut ledger_decided = 0;
    let mut credit_errors = 0;
    for id in &ids {
        let job = ledger.job(id).await.map_err(|e| e.to_string())?;
        ledger_decided += usize::from(job.is_some_and(|j| j.state == JobState::Decided));
        let events = ledger
            .job_stake_events(id)
            .await
            .map_err(|e| e.to_string())?;
        let mut credited: Vec<&str> = events
            .iter()
            .filter(|e| e.delta > 0)
            .map(|e| e.node_id.as_str())
            .collect();
        let all = credited.len();
        credited.sort();
        credited.dedup();
        credit_errors += usize::from(all != config.replicas || credited.len() != all);
    }
    let ledger_unfinished = ledger
        .unfinished_jobs()
        .await
        .map_err(|e| e.to_string())?
        .len();
    let ledger_jobs = ledger
        .jobs(i64::MAX)
        .await
        .map_err(|e| e.to_string())?
        .len();
    ledger.close().await;
    latencies.sort_by(|a, b| a.total_cmp(b));
    errors.truncate(5);
    Ok(TierReport {
        coordinators: n,
        completed: latencies.len(),
        failed,
        ledger_decided,
        ledger_unfinished,
        ledger_jobs,
        credit_errors,
        seconds,
        jobs_per_s: latencies.len() as f64 / seconds,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        cpu,
        failovers,
        killed_after,
        signed_by,
        errors,
    })
}

/// One request to a coordinator with a bearer key.
async fn send(
    client: &NodeClient,
    method: Method,
    path: String,
    key: &str,
    body: Vec<u8>,
) -> Result<tenet_net::RawResponse, tenet_net::ClientError> {
    client
        .send(RawRequest {
            method,
            path,
            headers: vec![
                ("authorization".into(), format!("Bearer {key}")),
                ("content-type".into(), "application/json".into()),
            ],
            body: Bytes::from(body),
        })
        .await
}

/// What one client saw.
struct ClientRun {
    latencies: Vec<f64>,
    ids: Vec<String>,
    errors: Vec<String>,
    failovers: usize,
    signed_by: Vec<usize>,
}

/// Client `c`: its calls one after another, each to its home coordinator (`c` mod N) under a
/// fresh idempotency key, resubmitted to the next coordinator whenever one cannot be reached.
async fn client(
    c: usize,
    urls: &[String],
    keys: &[PublicKey],
    calls: &[Call],
    answered: &AtomicUsize,
    endpoint: &str,
    api_key: &str,
) -> ClientRun {
    let mut run = ClientRun {
        latencies: Vec::new(),
        ids: Vec::new(),
        errors: Vec::new(),
        failovers: 0,
        signed_by: vec![0; urls.len()],
    };
    let mut http: Vec<Option<NodeClient>> = urls.iter().map(|_| None).collect();
    let mut home = c % urls.len();
    for call in calls {
        let key = tenet_proto::to_hex(&identity::random_bytes::<16>());
        let t = Instant::now();
        let mut outcome = Err("no coordinator answered".to_string());
        // Every coordinator in turn, twice round: a call is never lost to one dying.
        for attempt in 0..2 * urls.len() {
            let i = (home + attempt) % urls.len();
            let client = match &http[i] {
                Some(h) => h,
                None => match NodeClient::new(&urls[i], identity::generate()) {
                    Ok(h) => http[i].insert(h),
                    Err(e) => {
                        outcome = Err(e.to_string());
                        continue;
                    }
                },
            };
            let sent = client
                .send(RawRequest {
                    method: Method::POST,
                    path: endpoint.to_string(),
                    headers: vec![
                        ("authorization".into(), format!("Bearer {api_key}")),
                        ("content-type".into(), "application/json".into()),
                        ("idempotency-key".into(), key.clone()),
                    ],
                    body: call.body.clone(),
                })
                .await;
            match sent {
                Ok(r) => {
                    outcome = checked(r.status, &r.body, keys, &call.expected);
                    if attempt > 0 {
                        run.failovers += 1;
                        // The next calls go where this one was answered.
                        home = i;
                    }
                    break;
                }
                Err(e) => {
                    outcome = Err(e.to_string());
                    http[i] = None;
                    if (attempt + 1) % urls.len() == 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        match outcome {
            Ok((id, signer)) => {
                run.latencies.push(t.elapsed().as_secs_f64() * 1e3);
                run.ids.push(id);
                run.signed_by[signer] += 1;
                answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => run.errors.push(e),
        }
    }
    run
}

/// A 200 whose receipt a coordinator of the deployment signed and whose result is right: the
/// job's id and which coordinator signed.
fn checked(
    status: u16,
    body: &[u8],
    keys: &[PublicKey],
    expected: &[u8],
) -> Result<(String, usize), String> {
    let peek: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let signer = peek["receipt"]["coordinator"]
        .as_str()
        .and_then(PublicKey::parse)
        .and_then(|k| keys.iter().position(|x| *x == k))
        .ok_or_else(|| {
            format!(
                "status {status}: no receipt by a coordinator of the deployment: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            )
        })?;
    let answer = crate::load::verified(status, body, &keys[signer], expected)?;
    Ok((answer.job_id, signer))
}

impl ScaleReport {
    fn one(&self) -> &TierReport {
        &self.tiers[0]
    }

    fn scaled(&self) -> Option<&TierReport> {
        self.tiers.get(1)
    }

    /// The scaled tier's jobs/s over the single coordinator's.
    pub fn throughput_ratio(&self) -> Option<f64> {
        self.scaled().map(|s| s.jobs_per_s / self.one().jobs_per_s)
    }

    /// The scaled tier's coordinator CPU per job over the single coordinator's.
    pub fn coordinator_cpu_ratio(&self) -> Option<f64> {
        self.scaled().map(|s| {
            s.per_job_ms(s.cpu.coordinators) / self.one().per_job_ms(self.one().cpu.coordinators)
        })
    }

    /// Nothing lost in any tier; with several coordinators and none killed, 3 coordinators
    /// at ≥ 0.9× one's jobs/s with coordinator CPU per job within 10 %.
    pub fn goals_met(&self) -> bool {
        let lost = self.tiers.iter().any(|t| !t.nothing_lost(&self.config));
        if lost {
            return false;
        }
        if self.config.kill_one {
            return true;
        }
        self.throughput_ratio().is_none_or(|r| r >= 0.9)
            && self.coordinator_cpu_ratio().is_none_or(|r| r <= 1.1)
    }

    fn tier_json(&self, t: &TierReport) -> Value {
        json!({
            "coordinators": t.coordinators,
            "completed": t.completed,
            "failed": t.failed,
            "ledger_jobs": t.ledger_jobs,
            "ledger_decided": t.ledger_decided,
            "ledger_unfinished": t.ledger_unfinished,
            "credit_errors": t.credit_errors,
            "nothing_lost": t.nothing_lost(&self.config),
            "seconds": t.seconds,
            "jobs_per_s": t.jobs_per_s,
            "p50_ms": t.p50_ms,
            "p99_ms": t.p99_ms,
            "max_ms": t.max_ms,
            "cpu_ms_per_job": {
                "coordinators": t.per_job_ms(t.cpu.coordinators),
                "postgres": t.cpu.postgres.map(|s| t.per_job_ms(s)),
                "nodes": t.per_job_ms(t.cpu.nodes),
                "clients": t.per_job_ms(t.cpu.clients),
            },
            "failovers": t.failovers,
            "killed_after": t.killed_after,
            "signed_by": t.signed_by,
            "errors": t.errors,
        })
    }

    pub fn json(&self) -> Value {
        let c = &self.config;
        json!({
            "clients": c.clients,
            "jobs_per_client": c.jobs_per_client,
            "replicas": c.replicas,
            "nodes": c.nodes,
            "ledger": if c.ledger.is_some() { "postgres" } else { "sqlite" },
            "lease_s": c.lease.as_secs_f64(),
            "kill_one": c.kill_one,
            "tiers": self.tiers.iter().map(|t| self.tier_json(t)).collect::<Vec<_>>(),
            "throughput_ratio": self.throughput_ratio(),
            "coordinator_cpu_ratio": self.coordinator_cpu_ratio(),
            "projection": self.projection_json(),
            "goals_met": self.goals_met(),
        })
    }

    /// Jobs/s a core of each tier sustains, from the single coordinator's per-job CPU.
    fn per_core(&self) -> (f64, Option<f64>, f64) {
        let t = self.one();
        let rate = |s: f64| 1e3 / t.per_job_ms(s).max(1e-9);
        (
            rate(t.cpu.coordinators),
            t.cpu.postgres.map(rate),
            rate(t.cpu.nodes),
        )
    }

    fn projection_json(&self) -> Value {
        let (coord, pg, node) = self.per_core();
        json!({
            "coordinator_jobs_per_core_s": coord,
            "postgres_jobs_per_core_s": pg,
            "node_jobs_per_core_s": node,
            "cores_per_machine": PROJECTION_CORES,
            "coordinator_machines_before_the_ledger_limits":
                pg.map(|pg| (pg / coord).floor()),
        })
    }

    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "tenet scale-out on 127.0.0.1: {} clients × {} jobs, r = {}, {} node processes, {} ledger, lease {:.1} s{}\n\n",
            c.clients,
            c.jobs_per_client,
            c.replicas,
            c.nodes,
            if c.ledger.is_some() {
                "PostgreSQL"
            } else {
                "SQLite"
            },
            c.lease.as_secs_f64(),
            if c.kill_one {
                "; coordinator 0 of the scaled tier killed halfway"
            } else {
                ""
            }
        );
        out += "coordinators  jobs/s   p50 ms   p99 ms   verified   lost?           CPU ms per job: coord  postgres  nodes  clients\n";
        for t in &self.tiers {
            let pg = t
                .cpu
                .postgres
                .map_or("   -".to_string(), |s| format!("{:6.2}", t.per_job_ms(s)));
            out += &format!(
                "{:>12}  {:6.1}  {:7.1}  {:7.1}  {:>5}/{:<5} {:<15} {:>22.3}  {pg:>8}  {:5.2}  {:7.2}\n",
                t.coordinators,
                t.jobs_per_s,
                t.p50_ms,
                t.p99_ms,
                t.completed,
                t.total(c),
                if t.nothing_lost(c) {
                    "nothing lost"
                } else {
                    "LOST OR TWICE"
                },
                t.per_job_ms(t.cpu.coordinators),
                t.per_job_ms(t.cpu.nodes),
                t.per_job_ms(t.cpu.clients),
            );
        }
        out += "\n";
        if let (Some(tr), Some(cr)) = (self.throughput_ratio(), self.coordinator_cpu_ratio()) {
            let n = self.tiers[1].coordinators;
            out += &format!(
                "{n} coordinators vs 1: jobs/s {tr:.2}x (goal >= 0.9x), coordinator CPU per job {cr:.2}x (goal <= 1.1x)\n"
            );
        }
        for t in &self.tiers {
            if t.coordinators > 1 || t.failovers > 0 {
                out += &format!(
                    "  {} coordinators: receipts signed by each {:?}; {} calls resubmitted to another coordinator{}\n",
                    t.coordinators,
                    t.signed_by,
                    t.failovers,
                    t.killed_after.map_or(String::new(), |k| format!(
                        " (coordinator 0 killed after {k} answers)"
                    ))
                );
            }
            out += &format!(
                "  ledger with {} coordinator(s): {} jobs, {} decided, {} unfinished, {} with a node not credited exactly once\n",
                t.coordinators,
                t.ledger_jobs,
                t.ledger_decided,
                t.ledger_unfinished,
                t.credit_errors
            );
            for e in &t.errors {
                out += &format!("    error: {e}\n");
            }
        }
        let (coord, pg, node) = self.per_core();
        out += &format!(
            "\nprojection from the single coordinator's CPU per job: one core settles {coord:.0} jobs/s as a coordinator{}, runs {node:.0} jobs/s of this task's replicas as nodes\n",
            pg.map_or(String::new(), |pg| format!(
                ", {pg:.0} jobs/s as PostgreSQL"
            ))
        );
        if let Some(pg) = pg {
            out += &format!(
                "  N coordinator machines of {PROJECTION_CORES} cores on one PostgreSQL machine of {PROJECTION_CORES} cores: min(N × {:.0}, {:.0}) jobs/s; the ledger limits from N = {:.0}\n",
                coord * PROJECTION_CORES as f64,
                pg * PROJECTION_CORES as f64,
                (pg / coord).ceil()
            );
        }
        out += &format!(
            "goals: {}\n",
            if self.goals_met() { "met" } else { "NOT met" }
        );
        out
    }
}

/// The cores of the machines the projection imagines.
const PROJECTION_CORES: usize = 16;
