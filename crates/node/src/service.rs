//! The node's operations, free of HTTP: jobs with commit-reveal, sessions with resident
//! tensors, and the lookups peers use. `http` authenticates requests and calls these.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use hyper::Method;
use tenet_exec::Buffer;
use tenet_ir::HostTensor;
use tenet_ir::recycle::Recycled;
use tenet_models::WeightsFile;
use tenet_models::generation::Arithmetic;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{
    Commitment, JobSpec, OutputRef, Reveal, Tier, output_hash, valid_job_id,
};
use tenet_proto::grant::PullGrant;
use tenet_proto::wire::PullFrom;
use tenet_proto::wire::{
    Batch, BatchError, BatchResults, Committed, DeviceAd, JobState, JobStatus, NodeInfo, OpResult,
    Resident, Revealed, RunJob, SessionCreated, SessionOp,
};
use tenet_proto::{ApiError, ErrorCode, Hash, tensor};
use tenet_store::{Store, StoreConfig};

use crate::config::{ConfigError, NodeConfig};
use crate::engine::{Engine, JobLimits, Task};
use crate::errors::{bad_request, internal, not_found, store_error};
use crate::lru::Lru;
use crate::observe::Metrics;
use crate::pool::Pool;
use tenet_net::client::ClientError;
use tenet_net::events::EventLog;
use tenet_net::gate::Gate;
use tenet_net::identity::{self, KeyFileError, random_bytes};
use tenet_net::serve::{Payload, payload};

/// Generation jobs running at once (each waits on a thread of its own while its model's
/// batcher decodes).
/// Job traces kept for disputes (each a tree of 64 bytes a node and the job's inputs).
const MAX_TRACES_KEPT: usize = 4;
const MAX_GENERATIONS: u64 = 64;

/// `amount` of a counted resource (running generations, their KV-cache bytes) held until
/// dropped.
struct Reservation {
    counter: Arc<AtomicU64>,
    amount: u64,
}

impl Reservation {
    /// `amount` more of `counter`, if that keeps it at most `limit`.
    fn take(counter: &Arc<AtomicU64>, amount: u64, limit: u64) -> Option<Reservation> {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                n.checked_add(amount).filter(|&t| t <= limit)
            })
            .ok()
            .map(|_| Reservation {
                counter: counter.clone(),
                amount,
            })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.amount, Ordering::SeqCst);
    }
}

/// Finished jobs remembered for status and reveal; older ones are forgotten first.
const MAX_JOBS_KEPT: usize = 100_000;
/// Sessions open at once.
const MAX_SESSIONS: usize = 4096;
pub use tenet_proto::wire::INLINE_OUTPUT_BYTES;

/// The most peers a job's pull tries for one input.
const MAX_PULL_PEERS: usize = 8;

/// Jobs at most this costly run on the request's own thread (the event loop): their work
/// figure (`tenet_exec::work`: flops, bytes and 1,024 a node, so a long chain of ops on a
/// tiny tensor is not tiny) at most `TINY_JOB_WORK`, which bounds their run time to about a
/// millisecond on the slowest path, and their certificate's peak at most `TINY_JOB_BYTES`.
const TINY_JOB_WORK: u64 = 1 << 16;
const TINY_JOB_BYTES: u64 = 1 << 20;
/// Bytes of large job outputs kept in memory for fast fetching (they are also written to the
/// blob store, in the background).
const OUTPUT_CACHE_BYTES: u64 = 512 << 20;

/// A large job output in memory. It stays until it has been fetched once and written to the
/// store (or until newer outputs push it out); later fetches read the store.
struct HeldOutput {
    header: Bytes,
    data: Bytes,
    fetched: AtomicBool,
    stored: AtomicBool,
}

impl HeldOutput {
    /// The blob, as handles on the held bytes.
    fn payload(&self) -> Payload {
        self.header.clone().chain(self.data.clone())
    }

    /// Mark it `fetched` or `stored`, and drop it from `outputs` once it is both: fetched,
    /// and safe on disk for any later fetch.
    fn mark(&self, flag: &AtomicBool, outputs: &Mutex<Lru<HeldOutput>>, hash: &Hash) {
        flag.store(true, Ordering::SeqCst);
        if self.fetched.load(Ordering::SeqCst) && self.stored.load(Ordering::SeqCst) {
            lock(outputs).remove(hash);
        }
    }
}

/// A job's result before it is recorded.
struct Executed {
    committed: Committed,
    revealed: Revealed,
    /// Outputs too large to travel inline, as blobs (header and tensor bytes).
    large: Vec<(Hash, Payload)>,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] KeyFileError),
    #[error("cannot open the blob store: {0}")]
    Store(#[from] tenet_store::StoreError),
    #[error("cannot open the event log {path}: {source}")]
    EventLog {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Join(#[from] crate::membership::JoinError),
    #[error("cannot open the device: {0}")]
    Device(String),
}

enum JobEntry {
    Running {
        cancel: Arc<AtomicBool>,
    },
    Committed {
        commitment: Box<Commitment>,
        revealed: Arc<Revealed>,
        shown: bool,
    },
    Failed(ApiError),
}

#[derive(Default)]
struct JobTable {
    jobs: HashMap<String, JobEntry>,
    finished: VecDeque<String>,
}

/// A session tensor: a buffer on the node's device (a handle: runs read it where it lies) and
/// the hash of its blob — `None` once a `write` changed it (rehashing a whole KV cache for
/// every token would cost more than the token; such a tensor is not offered to peers).
#[derive(Clone)]
struct ResidentTensor {
    buffer: Buffer,
    hash: Option<Hash>,
}

#[derive(Default)]
struct Session {
    tensors: HashMap<String, ResidentTensor>,
}

/// Bytes of a session tensor on their way in, counted against the sessions' memory until
/// this is dropped (by then the tensor is resident, or refused).
pub(crate) struct Inbound<'a> {
    node: &'a Node,
    held: u64,
}

impl Inbound<'_> {
    /// Count `n` more bytes; refused if the sessions' memory cannot take them.
    pub(crate) fn take(&mut self, n: u64) -> Result<(), ApiError> {
        let node = self.node;
        let limit = node.config.session_memory_bytes;
        let before = node.inbound_bytes.fetch_add(n, Ordering::Relaxed);
        let resident = node.resident_bytes.load(Ordering::Relaxed);
        if resident.saturating_add(before).saturating_add(n) > limit {
            node.inbound_bytes.fetch_sub(n, Ordering::Relaxed);
            let room = limit.saturating_sub(resident).saturating_sub(before);
            return Err(node.no_room(self.held + n, room + self.held));
        }
        self.held += n;
        Ok(())
    }
}

impl Drop for Inbound<'_> {
    fn drop(&mut self) {
        self.node
            .inbound_bytes
            .fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// Whether `host:port` names this machine (a literal loopback address or `localhost`).
fn is_loopback(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A running node's state.
pub struct Node {
    config: NodeConfig,
    key: KeyPair,
    store: Arc<Store>,
    engine: Engine,
    pool: Pool,
    jobs: Mutex<JobTable>,
    sessions: Mutex<HashMap<String, Arc<Mutex<Session>>>>,
    resident_bytes: AtomicU64,
    /// Bytes of session tensors still arriving (uploads being read, pulls being fetched),
    /// counted against `session_memory_bytes` beside the resident ones.
    inbound_bytes: AtomicU64,
    /// The peers pulls may fetch from, as `host:port`.
    pull_peers: Vec<String>,
    /// Large job outputs, for `GET /v1/blobs` without a trip to the disk.
    outputs: Arc<Mutex<Lru<HeldOutput>>>,
    pub(crate) gate: Gate,
    /// Generation jobs running, and the bytes of their KV caches.
    generations: Arc<AtomicU64>,
    generation_bytes: Arc<AtomicU64>,
    /// Set only on a node told to lie (demos and tests).
    cheat: Option<crate::cheat::Cheat>,
    /// Traces of recent jobs computed for disputes, newest last (`trace.rs`).
    traces: Mutex<VecDeque<(String, Arc<crate::trace::JobTrace>)>>,
    /// Graph jobs run so far, and the recent ones a `--cheat op=K` node lied in (job, node):
    /// its trace must tell the same lie.
    graph_jobs: AtomicU64,
    lied: Mutex<VecDeque<(String, u32)>>,
    /// The node's event log (`--event-log`); off unless configured.
    pub events: EventLog,
    pub(crate) metrics: Metrics,
    info: NodeInfo,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its table consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn hex_blob(hex: &str, what: &str) -> Result<Vec<u8>, ApiError> {
    tenet_proto::from_hex(hex).ok_or_else(|| bad_request(format!("{what} is not valid hex")))
}

/// A run's error, with a stop told apart: a cancellation if `cancel` is set, else a timeout.
fn stopped(e: ApiError, cancel: &AtomicBool) -> ApiError {
    if e.code != ErrorCode::Cancelled {
        e
    } else if cancel.load(Ordering::Relaxed) {
        ApiError::new(ErrorCode::Cancelled, "the job was cancelled")
    } else {
        ApiError::new(
            ErrorCode::Timeout,
            "the job ran past its time limit and was stopped",
        )
    }
}

fn check_name(name: &str, what: &str) -> Result<(), ApiError> {
    if valid_job_id(name) {
        Ok(())
    } else {
        Err(bad_request(format!(
            "{what} `{}` must be 1–64 characters of letters, digits, `_`, `-` and `.`",
            name.chars().take(80).collect::<String>()
        )))
    }
}

impl Node {
    /// Open the data directory (identity, blobs) and get ready to serve.
    pub fn start(mut config: NodeConfig) -> Result<Arc<Node>, StartError> {
        let trusted = config.trusted()?;
        std::fs::create_dir_all(&config.data_dir).map_err(|source| KeyFileError::Io {
            path: config.data_dir.display().to_string(),
            source,
        })?;
        let key = identity::load_or_create(&config.data_dir)?;
        let store = Store::open(
            &config.data_dir.join("store"),
            StoreConfig {
                quota_bytes: config.disk_quota_bytes,
                max_blob_bytes: config.max_blob_bytes,
                durable: config.durable,
                max_pending_bytes: config.max_pending_upload_bytes,
            },
        )?;
        if config.memory_limit_bytes == 0 {
            config.memory_limit_bytes = tenet_exec::available_memory().unwrap_or(4 << 30);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if config.threads_per_job == 0 {
            cores
        } else {
            config.threads_per_job
        };
        let device = tenet_devices::open(
            &config.device,
            &tenet_devices::Options {
                threads: Some(threads),
                memory_limit: Some(config.memory_limit_bytes),
                ..Default::default()
            },
        )
        .map_err(|e| StartError::Device(e.to_string()))?;
        let device_info = device.info();
        let tiers = if device_info.exact.passed() {
            vec![Tier::Exact, Tier::Tolerant]
        } else {
            vec![Tier::Tolerant]
        };
        let ad = DeviceAd {
            spec: device_info.spec.clone(),
            name: device_info.name.clone(),
            class: device_info.class.name().to_string(),
            memory_bytes: device_info.memory,
            tiers: tiers.clone(),
            exact_refused: match &device_info.exact {
                tenet_exec::ExactCheck::Passed => None,
                tenet_exec::ExactCheck::Failed(why) => Some(why.clone()),
            },
        };
        let engine = Engine::new(
            store.clone(),
            device,
            JobLimits {
                memory_bytes: config.memory_limit_bytes,
                flops: config.max_job_flops,
            },
        );
        let events = match &config.event_log {
            Some(p) => EventLog::open(p).map_err(|source| StartError::EventLog {
                path: p.display().to_string(),
                source,
            })?,
            None => EventLog::off(),
        };
        let info = NodeInfo {
            node_id: key.public(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: engine.backend_name(),
            cores,
            memory_limit_bytes: config.memory_limit_bytes,
            max_job_flops: config.max_job_flops,
            tiers,
            price_per_gflop: config.price_per_gflop,
            open: config.open,
            devices: vec![ad],
        };
        Ok(Arc::new(Node {
            pool: Pool::new(config.workers, config.queue_limit),
            gate: Gate::new(trusted, config.open, config.max_clock_skew_secs).with_key(key.clone()),
            key,
            store,
            engine,
            jobs: Mutex::new(JobTable::default()),
            sessions: Mutex::new(HashMap::new()),
            resident_bytes: AtomicU64::new(0),
            inbound_bytes: AtomicU64::new(0),
            pull_peers: config.pull_peer_addrs()?,
            outputs: Arc::new(Mutex::new(Lru::new(OUTPUT_CACHE_BYTES))),
            generations: Arc::new(AtomicU64::new(0)),
            generation_bytes: Arc::new(AtomicU64::new(0)),
            cheat: config.cheat.as_deref().and_then(crate::cheat::Cheat::parse),
            traces: Mutex::new(VecDeque::new()),
            graph_jobs: AtomicU64::new(0),
            lied: Mutex::new(VecDeque::new()),
            events,
            metrics: Metrics::default(),
            info,
            config,
        }))
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The node's identity.
    pub fn key(&self) -> &KeyPair {
        &self.key
    }

    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn job_event(&self, job: &str, phase: &str, extra: serde_json::Value) {
        if self.events.enabled() {
            let mut fields = serde_json::json!({"job": job, "phase": phase});
            if let (Some(f), serde_json::Value::Object(e)) = (fields.as_object_mut(), extra) {
                f.extend(e);
            }
            self.events.emit("job", fields);
        }
    }

    // ---------------------------------------------------------------------------------- jobs

    /// Run a job and commit to its result.
    pub async fn run_job(self: &Arc<Self>, req: RunJob) -> Result<Committed, ApiError> {
        let spec = req.job;
        check_name(&spec.job_id, "job id")?;
        let mut inline = HashMap::new();
        for (hash, hex) in &req.blobs {
            let bytes = hex_blob(hex, &format!("inline blob {}", hash.short()))?;
            let actual = tenet_net::digest::hash(&bytes);
            if actual != *hash {
                return Err(ApiError::new(
                    ErrorCode::HashMismatch,
                    format!("inline blob {hash} hashes to {actual}"),
                ));
            }
            inline.insert(*hash, bytes);
        }
        self.pull_job_inputs(&spec, &req.pulls, &inline).await?;
        self.check_present(&spec, &inline)?;
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let mut t = lock(&self.jobs);
            if t.jobs.contains_key(&spec.job_id) {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!(
                        "job id {} was already used on this node; every job needs a fresh id",
                        spec.job_id
                    ),
                ));
            }
            t.jobs.insert(
                spec.job_id.clone(),
                JobEntry::Running {
                    cancel: cancel.clone(),
                },
            );
        }
        let mut fields = serde_json::json!({"task": spec.task});
        if let Some(l) = &req.stage {
            self.metrics.stage_job(l.stage);
            fields["pipeline"] = serde_json::json!(l.pipeline);
            fields["stage"] = serde_json::json!(format!("{}/{}", l.stage, l.stages));
        }
        self.job_event(&spec.job_id, "accepted", fields);
        let limit = Duration::from_millis(
            req.timeout_ms
                .unwrap_or(self.config.job_timeout_ms)
                .min(self.config.job_timeout_ms),
        );
        let job_id = spec.job_id.clone();
        // A generation waits on its model's batcher, which does the work for every generation
        // at once: it takes a blocking thread of its own rather than a worker, so that
        // concurrent generations are decoded together (at most `MAX_GENERATIONS` at a time).
        if let Some(arithmetic) = Arithmetic::of_task(&spec.task.0) {
            let Some(slot) = Reservation::take(&self.generations, 1, MAX_GENERATIONS) else {
                let e = ApiError::new(
                    ErrorCode::Busy,
                    format!("{MAX_GENERATIONS} generations are running; try again shortly"),
                );
                return self.record(job_id, Err(e));
            };
            let node = self.clone();
            return tokio::task::spawn_blocking(move || {
                let _slot = slot;
                let outcome = node.execute_generation(spec, arithmetic, &inline, &cancel, limit);
                node.record(job_id, outcome)
            })
            .await
            .unwrap_or_else(|e| Err(internal(format!("a generation's task failed: {e}"))));
        }
        // A tiny job whose graph is already planned runs right here: handing it to a worker
        // thread and back would cost more than running it.
        let tiny = self.engine.cached_task(&spec.task).is_some_and(|t| {
            let c = t.graph.cost();
            tenet_exec::work(c, t.graph.nodes().len()) <= TINY_JOB_WORK
                && c.peak_bytes <= TINY_JOB_BYTES
        });
        if tiny {
            let outcome = self.execute(spec, &inline, &cancel, limit);
            return self.record(job_id, outcome);
        }
        // The job is seen through in its own task: if the client goes away, the result is
        // still recorded (and revealable) instead of the job staying `running` forever.
        let node = self.clone();
        tokio::spawn(async move {
            let worker = node.clone();
            let outcome = node
                .pool
                .run(move || worker.execute(spec, &inline, &cancel, limit))
                .await
                .and_then(|r| r);
            node.record(job_id, outcome)
        })
        .await
        .unwrap_or_else(|e| Err(internal(format!("a job's task failed: {e}"))))
    }

    /// Every blob the job names is here (inline, stored or cached), checked before the job's id
    /// is taken: a coordinator may ask to run first and upload only on this answer, then ask
    /// again under the same id (one exchange per replica instead of an upload check per blob).
    fn check_present(
        &self,
        spec: &JobSpec,
        inline: &HashMap<Hash, Vec<u8>>,
    ) -> Result<(), ApiError> {
        let missing = |what: String, hash: &Hash| {
            ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "{what} {hash} is not on this node: upload it with PUT /v1/blobs/{hash}, then send the job again (it was not started)"
                ),
            )
        };
        let generation = Arithmetic::of_task(&spec.task.0).is_some();
        if !generation && !self.engine.holds(&spec.task) {
            return Err(missing("task".into(), &spec.task));
        }
        if let Some(w) = &spec.weights
            && !self.engine.holds(w)
        {
            return Err(missing("weights".into(), w));
        }
        for (name, hash) in &spec.inputs {
            if !inline.contains_key(hash) && !self.engine.holds(hash) {
                return Err(missing(format!("input {name}"), hash));
            }
        }
        Ok(())
    }

    /// Enter a finished job's outcome in the table (and keep its large outputs fetchable).
    fn record(
        &self,
        job_id: String,
        outcome: Result<Executed, ApiError>,
    ) -> Result<Committed, ApiError> {
        let outcome = outcome.map(|done| {
            for (hash, blob) in done.large {
                self.keep_output(hash, blob);
            }
            (done.committed, done.revealed)
        });
        let mut t = lock(&self.jobs);
        let result = match outcome {
            Ok((committed, revealed)) => {
                t.jobs.insert(
                    job_id.clone(),
                    JobEntry::Committed {
                        commitment: Box::new(committed.commitment.clone()),
                        revealed: Arc::new(revealed),
                        shown: false,
                    },
                );
                self.metrics.job("committed");
                self.job_event(
                    &job_id,
                    "committed",
                    serde_json::json!({"exec_us": committed.exec_us, "commitment": committed.commitment.commitment}),
                );
                Ok(committed)
            }
            Err(e) => {
                t.jobs.insert(job_id.clone(), JobEntry::Failed(e.clone()));
                self.metrics.job(match e.code {
                    ErrorCode::Cancelled => "cancelled",
                    ErrorCode::Timeout => "timeout",
                    ErrorCode::ExceedsLimits => "refused",
                    _ => "failed",
                });
                self.job_event(&job_id, "failed", serde_json::json!({"error": e.code}));
                Err(e)
            }
        };
        t.finished.push_back(job_id);
        while t.finished.len() > MAX_JOBS_KEPT {
            if let Some(old) = t.finished.pop_front() {
                t.jobs.remove(&old);
            }
        }
        result
    }

    /// A job's inputs by name: from the blobs sent with it (`inline`), the engine's cache or
    /// the store.
    fn job_inputs(
        &self,
        spec: &JobSpec,
        inline: &HashMap<Hash, Vec<u8>>,
    ) -> Result<HashMap<String, HostTensor>, ApiError> {
        let mut inputs = HashMap::with_capacity(spec.inputs.len());
        for (name, hash) in &spec.inputs {
            let what = format!("input {name}");
            let t = self
                .engine
                .tensor(hash, inline.get(hash).map(Vec::as_slice), &what)?;
            inputs.insert(name.clone(), (*t).clone());
        }
        Ok(inputs)
    }

    /// The blocking part of a job: load, check, run, commit.
    fn execute(
        &self,
        spec: JobSpec,
        inline: &HashMap<Hash, Vec<u8>>,
        cancel: &AtomicBool,
        limit: Duration,
    ) -> Result<Executed, ApiError> {
        // The deadline covers loading and planning the task too: a graph of a million ops
        // takes a second to decode and plan before its first step.
        let deadline = Instant::now() + limit;
        let task = self.engine.task(&spec.task)?;
        self.engine.check_time(&task, limit)?;
        let weights = spec.weights.map(|w| self.engine.weights(&w)).transpose()?;
        let inputs = self.job_inputs(&spec, inline)?;
        self.job_event(&spec.job_id, "started", serde_json::Value::Null);
        let started = Instant::now();
        if started > deadline {
            return Err(ApiError::new(
                ErrorCode::Timeout,
                "the job ran past its time limit while its task and inputs were loaded",
            ));
        }
        let nth = self.graph_jobs.fetch_add(1, Ordering::Relaxed) + 1;
        let lie_at = match self.cheat {
            Some(
                crate::cheat::Cheat::Op { node, job: None } | crate::cheat::Cheat::Stall(node),
            ) => {
                let mut lied = lock(&self.lied);
                lied.push_back((spec.job_id.clone(), node));
                while lied.len() > MAX_JOBS_KEPT {
                    lied.pop_front();
                }
                Some(node)
            }
            Some(crate::cheat::Cheat::Op { node, job: Some(j) }) if j == nth => {
                let mut lied = lock(&self.lied);
                lied.push_back((spec.job_id.clone(), node));
                while lied.len() > MAX_JOBS_KEPT {
                    lied.pop_front();
                }
                Some(node)
            }
            _ => None,
        };
        let (outputs, stats) = match lie_at {
            // The one-op liar runs the job on the reference interpreter, lying at its node.
            Some(k) => (
                crate::trace::run_reference(
                    &task,
                    weights.as_deref(),
                    &inputs,
                    spec.seed,
                    Some(k),
                    &mut |_, _| true,
                )?,
                tenet_exec::RunStats::default(),
            ),
            _ => self.run_task(
                &task,
                weights.as_deref(),
                &inputs,
                spec.seed,
                cancel,
                deadline,
            )?,
        };
        let exec_us = started.elapsed().as_micros() as u64;
        self.commit(spec, outputs, exec_us, stats.peak_bytes)
    }

    /// A finished job's outputs, hashed and committed to (a cheating node lies here first):
    /// the commitment to answer now and the reveal to answer later.
    fn commit(
        &self,
        spec: JobSpec,
        outputs: Vec<(String, HostTensor)>,
        exec_us: u64,
        peak_bytes: u64,
    ) -> Result<Executed, ApiError> {
        let outputs: Vec<(String, HostTensor)> = match self.cheat {
            Some(c) => outputs.into_iter().map(|(n, t)| (n, c.apply(t))).collect(),
            None => outputs,
        };
        // Each output is hashed once (a tensor blob's address is its hash). A large one keeps
        // its buffer: the blob is a short header chained to the tensor's own bytes, not a copy.
        let total: usize = outputs.iter().map(|(_, t)| t.bytes().len()).sum();
        let mut refs = Vec::with_capacity(outputs.len());
        let mut inline_blobs = std::collections::BTreeMap::new();
        let mut large = Vec::new();
        for (name, t) in outputs {
            let header = tensor::header(t.ty());
            let hash = tenet_net::digest::hash_parts(&[&header, t.bytes()]);
            refs.push(OutputRef {
                name,
                hash,
                ty: t.ty().to_string(),
            });
            if total <= INLINE_OUTPUT_BYTES {
                let mut blob = header;
                blob.extend_from_slice(t.bytes());
                inline_blobs.insert(hash, tenet_proto::to_hex(&blob));
            } else {
                // Back to the recycle cache once fetched and stored: the next job's output of
                // this size then needs no fresh pages.
                let data = Bytes::from_owner(Recycled(t.into_bytes()));
                large.push((hash, Bytes::from(header).chain(data)));
            }
        }
        let digest = output_hash(&refs);
        let salt = Hash(random_bytes());
        let job_id = spec.job_id.clone();
        let commitment = Commitment::sign(spec, &self.key, &digest, &salt);
        Ok(Executed {
            committed: Committed {
                commitment,
                exec_us,
                peak_bytes,
            },
            revealed: Revealed {
                reveal: Reveal {
                    job_id,
                    outputs: refs,
                    output_hash: digest,
                    salt,
                },
                blobs: inline_blobs,
            },
            large,
        })
    }

    /// The blocking part of a generation job (`tenet_models::generation`): the model loaded
    /// (once) from the weights blob, the request checked against the node's limits, then
    /// decoded in the model's continuous batch with whatever other generations are running,
    /// until it ends, is cancelled or runs out of time; the new tokens are committed to like
    /// any job's outputs.
    fn execute_generation(
        &self,
        spec: JobSpec,
        arithmetic: Arithmetic,
        inline: &HashMap<Hash, Vec<u8>>,
        cancel: &AtomicBool,
        limit: Duration,
    ) -> Result<Executed, ApiError> {
        use tenet_models::generation;
        use tenet_models::smollm2::{GenerationEvent, GenerationRequest};
        let deadline = Instant::now() + limit;
        let weights = spec.weights.ok_or_else(|| {
            ApiError::new(
                ErrorCode::BadInputs,
                "a generation job names its model's GGUF file as its weights",
            )
        })?;
        let llm = self.engine.llm(&weights, arithmetic)?;
        let inputs = self.job_inputs(&spec, inline)?;
        let config = &llm.model.config;
        let (ids, params) = generation::parse_inputs(&inputs, config.vocab, config.context)
            .map_err(|e| ApiError::new(ErrorCode::BadInputs, e))?;
        let cache =
            self.engine
                .check_generation(&llm.model, ids.len() as u64, params.max_tokens)?;
        // Every running generation's KV cache together stays within the job memory limit
        // (each alone is checked above): beyond it, `busy` until some finish.
        let _held = Reservation::take(&self.generation_bytes, cache, self.config.memory_limit_bytes)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::Busy,
                    format!(
                        "the generations running hold their KV caches' share of this node's {} bytes; try again shortly",
                        self.config.memory_limit_bytes
                    ),
                )
            })?;
        self.job_event(&spec.job_id, "started", serde_json::Value::Null);
        let started = Instant::now();
        let events = llm.batcher.submit(GenerationRequest {
            prompt: ids,
            max_tokens: params.max_tokens as usize,
            sampling: params.sampler(spec.seed),
            first_step: params.first_step,
            stop: params.stop.clone(),
        });
        let mut tokens = Vec::new();
        let finish = loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(ApiError::new(ErrorCode::Cancelled, "the job was cancelled"));
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(ApiError::new(
                    ErrorCode::Timeout,
                    format!(
                        "the generation ran past its time limit after {} tokens",
                        tokens.len()
                    ),
                ));
            }
            // Dropping `events` on the way out cancels the request at the batch's next step.
            match events.recv_timeout(wait.min(Duration::from_millis(50))) {
                Ok(GenerationEvent::Token(t)) => tokens.push(t),
                Ok(GenerationEvent::Done(reason)) => break reason,
                Ok(GenerationEvent::Failed(e)) => return Err(internal(e)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(internal("the model's batcher stopped"));
                }
            }
        };
        let exec_us = started.elapsed().as_micros() as u64;
        self.commit(spec, generation::outputs(&tokens, finish), exec_us, 0)
    }

    fn run_task(
        &self,
        task: &Task,
        weights: Option<&WeightsFile>,
        inputs: &HashMap<String, HostTensor>,
        seed: u64,
        cancel: &AtomicBool,
        deadline: Instant,
    ) -> Result<(Vec<(String, HostTensor)>, tenet_exec::RunStats), ApiError> {
        let stop = || cancel.load(Ordering::Relaxed) || Instant::now() > deadline;
        self.engine
            .run(task, weights, inputs, seed, &stop)
            .map_err(|e| stopped(e, cancel))
    }

    /// Keep a large output fetchable: in memory now, in the blob store soon (without fsync: an
    /// output can be recomputed, and the job record that names it does not survive a crash).
    fn keep_output(&self, hash: Hash, blob: Payload) {
        let size = blob.remaining() as u64;
        let (header, data) = blob.into_inner();
        let held = Arc::new(HeldOutput {
            header,
            data,
            fetched: AtomicBool::new(false),
            stored: AtomicBool::new(false),
        });
        lock(&self.outputs).insert(hash, held.clone(), size);
        let (store, outputs) = (self.store.clone(), self.outputs.clone());
        tokio::task::spawn_blocking(move || {
            if store
                .put_computed(&hash, &[&held.header, &held.data])
                .is_ok()
            {
                held.mark(&held.stored, &outputs, &hash);
            }
        });
    }

    /// A blob: a recent job output from memory, or from the store.
    pub fn blob(&self, hash: &Hash) -> Result<Payload, ApiError> {
        let held = lock(&self.outputs).get(hash);
        if let Some(held) = held {
            let blob = held.payload();
            held.mark(&held.fetched, &self.outputs, hash);
            return Ok(blob);
        }
        self.store.get(hash).map(payload).map_err(store_error)
    }

    /// Where a job is.
    pub fn job_status(&self, id: &str) -> Result<JobStatus, ApiError> {
        let t = lock(&self.jobs);
        let entry = t
            .jobs
            .get(id)
            .ok_or_else(|| not_found(format!("no job {id} on this node")))?;
        let (state, error, commitment) = match entry {
            JobEntry::Running { .. } => (JobState::Running, None, None),
            JobEntry::Committed {
                shown, commitment, ..
            } => (
                if *shown {
                    JobState::Revealed
                } else {
                    JobState::Committed
                },
                None,
                Some((**commitment).clone()),
            ),
            JobEntry::Failed(e) if e.code == ErrorCode::Cancelled => {
                (JobState::Cancelled, Some(e.clone()), None)
            }
            JobEntry::Failed(e) => (JobState::Failed, Some(e.clone()), None),
        };
        Ok(JobStatus {
            job_id: id.to_string(),
            state,
            error,
            commitment,
        })
    }

    /// Ask a running job to stop.
    pub fn cancel_job(&self, id: &str) -> Result<JobStatus, ApiError> {
        {
            let t = lock(&self.jobs);
            match t.jobs.get(id) {
                None => return Err(not_found(format!("no job {id} on this node"))),
                Some(JobEntry::Running { cancel }) => cancel.store(true, Ordering::Relaxed),
                Some(_) => {}
            }
        }
        self.job_event(id, "cancel_requested", serde_json::Value::Null);
        self.job_status(id)
    }

    /// Whether this node was told to stall disputes (`--cheat stall=K`, for tests).
    pub fn stalls_disputes(&self) -> bool {
        matches!(self.cheat, Some(crate::cheat::Cheat::Stall(_)))
    }

    /// Whether this node was told to withhold its reveals (`--cheat withhold`, for tests).
    pub fn withholds_reveals(&self) -> bool {
        self.cheat == Some(crate::cheat::Cheat::Withhold)
    }

    /// Show a committed job's outputs and salt.
    pub fn reveal(&self, id: &str) -> Result<Revealed, ApiError> {
        let mut t = lock(&self.jobs);
        let entry = t
            .jobs
            .get_mut(id)
            .ok_or_else(|| not_found(format!("no job {id} on this node")))?;
        match entry {
            JobEntry::Running { .. } => Err(ApiError::new(
                ErrorCode::Conflict,
                format!("job {id} has not committed yet: a reveal comes only after the commitment"),
            )),
            JobEntry::Failed(e) => Err(ApiError::new(
                ErrorCode::Conflict,
                format!("job {id} failed and has nothing to reveal: {e}"),
            )),
            JobEntry::Committed {
                revealed, shown, ..
            } => {
                *shown = true;
                let r = (**revealed).clone();
                drop(t);
                self.job_event(id, "revealed", serde_json::Value::Null);
                Ok(r)
            }
        }
    }

    /// The trace of committed job `id` (computed on first asking, on the reference
    /// interpreter: call it off the event loop), for a dispute by bisection.
    pub fn job_trace(&self, id: &str) -> Result<Arc<crate::trace::JobTrace>, ApiError> {
        if let Some((_, t)) = lock(&self.traces).iter().find(|(j, _)| j == id) {
            return Ok(t.clone());
        }
        let spec = match lock(&self.jobs).jobs.get(id) {
            Some(JobEntry::Committed { commitment, .. }) => commitment.job.clone(),
            Some(_) => {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!("job {id} has not committed: it has no trace"),
                ));
            }
            None => return Err(not_found(format!("no job {id} on this node"))),
        };
        if Arithmetic::of_task(&spec.task.0).is_some() {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                "a generation job has no graph to trace",
            ));
        }
        let task = self.engine.task(&spec.task)?;
        let weights = spec.weights.map(|w| self.engine.weights(&w)).transpose()?;
        let inputs = self.job_inputs(&spec, &HashMap::new())?;
        let lie_at = lock(&self.lied)
            .iter()
            .find(|(j, _)| j == id)
            .map(|(_, k)| *k);
        let trace = Arc::new(crate::trace::JobTrace::compute(
            task, weights, inputs, spec.seed, lie_at,
        )?);
        let mut traces = lock(&self.traces);
        traces.push_back((id.to_string(), trace.clone()));
        while traces.len() > MAX_TRACES_KEPT {
            traces.pop_front();
        }
        self.job_event(
            id,
            "traced",
            serde_json::json!({"root": trace.tree().root()}),
        );
        Ok(trace)
    }

    // ------------------------------------------------------------------------------ sessions

    pub fn create_session(&self) -> Result<SessionCreated, ApiError> {
        let mut s = lock(&self.sessions);
        if s.len() >= MAX_SESSIONS {
            return Err(ApiError::new(
                ErrorCode::Busy,
                format!("{MAX_SESSIONS} sessions are open; free one first"),
            ));
        }
        let id = tenet_proto::to_hex(&random_bytes::<16>());
        s.insert(id.clone(), Arc::default());
        Ok(SessionCreated { session: id })
    }

    fn session(&self, id: &str) -> Result<Arc<Mutex<Session>>, ApiError> {
        lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| not_found(format!("no session {id} on this node")))
    }

    pub fn delete_session(&self, id: &str) -> Result<(), ApiError> {
        let s = lock(&self.sessions)
            .remove(id)
            .ok_or_else(|| not_found(format!("no session {id} on this node")))?;
        let freed: u64 = lock(&s).tensors.values().map(|t| t.buffer.bytes()).sum();
        self.resident_bytes.fetch_sub(freed, Ordering::Relaxed);
        Ok(())
    }

    /// Make `b` resident as `name`, replacing what had that name. Its hash is of its bytes,
    /// read on the host (downloaded where the device is not the host).
    fn keep(&self, session: &mut Session, name: &str, b: Buffer) -> Result<Resident, ApiError> {
        let hash = tensor::hash(&*self.engine.host(&b)?);
        self.keep_hashed(session, name, b, hash, 0)
    }

    /// [`Node::keep`] for a tensor whose hash is known, of which `arriving` bytes are counted
    /// as arriving (by the caller's [`Inbound`]): the sessions' memory must hold it beside the
    /// resident tensors and every other tensor still arriving.
    fn keep_hashed(
        &self,
        session: &mut Session,
        name: &str,
        b: Buffer,
        hash: Hash,
        arriving: u64,
    ) -> Result<Resident, ApiError> {
        check_name(name, "tensor name")?;
        let add = b.bytes();
        let old = session.tensors.get(name).map_or(0, |r| r.buffer.bytes());
        let limit = self.config.session_memory_bytes;
        let now = self.resident_bytes.load(Ordering::Relaxed);
        let others = self
            .inbound_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(arriving);
        if now
            .saturating_sub(old)
            .saturating_add(others)
            .saturating_add(add)
            > limit
        {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "keeping {name} ({add} bytes) would exceed the {limit} bytes of session tensors this node allows (resident, and {others} bytes arriving); free some first"
                ),
            ));
        }
        self.resident_bytes.fetch_add(add, Ordering::Relaxed);
        self.resident_bytes.fetch_sub(old, Ordering::Relaxed);
        let resident = Resident {
            name: name.to_string(),
            hash,
            ty: b.ty().to_string(),
        };
        session.tensors.insert(
            name.to_string(),
            ResidentTensor {
                buffer: b,
                hash: Some(hash),
            },
        );
        Ok(resident)
    }

    /// Bytes the sessions' memory can still take: what is neither resident nor arriving.
    fn session_room(&self) -> u64 {
        self.config
            .session_memory_bytes
            .saturating_sub(self.resident_bytes.load(Ordering::Relaxed))
            .saturating_sub(self.inbound_bytes.load(Ordering::Relaxed))
    }

    /// Count bytes of a session tensor as they arrive.
    pub(crate) fn inbound(&self) -> Inbound<'_> {
        Inbound {
            node: self,
            held: 0,
        }
    }

    /// Before a tensor upload's body is read: the session exists, the name is valid, and the
    /// declared length (if any) fits the room the sessions' memory has left. The returned
    /// [`Inbound`] counts the body's bytes as they arrive.
    pub(crate) fn tensor_upload(
        &self,
        sid: &str,
        name: &str,
        declared: Option<u64>,
    ) -> Result<Inbound<'_>, ApiError> {
        self.session(sid)?;
        check_name(name, "tensor name")?;
        let room = self.session_room();
        if let Some(size) = declared.filter(|&n| n > room) {
            return Err(self.no_room(size, room));
        }
        Ok(self.inbound())
    }

    fn no_room(&self, size: u64, room: u64) -> ApiError {
        ApiError::new(
            ErrorCode::ExceedsLimits,
            format!(
                "{size} bytes do not fit the {room} bytes left of the {} bytes of session tensors this node keeps (resident and arriving); free some first",
                self.config.session_memory_bytes
            ),
        )
    }

    /// Upload a tensor blob whose blake3 hash is `hash` into a session; `inbound` counted its
    /// bytes as they arrived ([`Node::tensor_upload`]).
    pub(crate) fn put_tensor(
        &self,
        sid: &str,
        name: &str,
        blob: Bytes,
        hash: Hash,
        inbound: Inbound<'_>,
    ) -> Result<Resident, ApiError> {
        let t = tensor::decode_shared(Arc::new(blob))
            .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
        // Decoding is strict, so the blob is the tensor's one encoding and its hash the
        // tensor's hash.
        debug_assert_eq!(tensor::hash(&t), hash);
        let b = self.engine.upload(t)?;
        let s = self.session(sid)?;
        let mut s = lock(&s);
        self.keep_hashed(&mut s, name, b, hash, inbound.held)
    }

    /// A resident tensor's blob (downloaded where the device is not the host).
    pub fn get_tensor(&self, sid: &str, name: &str) -> Result<Vec<u8>, ApiError> {
        let s = self.session(sid)?;
        let b = lock(&s)
            .tensors
            .get(name)
            .map(|r| r.buffer.clone())
            .ok_or_else(|| not_found(format!("no tensor {name} in session {sid}")))?;
        Ok(tensor::encode(&*self.engine.host(&b)?))
    }

    pub fn free_tensor(&self, sid: &str, name: &str) -> Result<(), ApiError> {
        let s = self.session(sid)?;
        let removed = lock(&s)
            .tensors
            .remove(name)
            .ok_or_else(|| not_found(format!("no tensor {name} in session {sid}")))?;
        self.resident_bytes
            .fetch_sub(removed.buffer.bytes(), Ordering::Relaxed);
        Ok(())
    }

    /// A resident tensor (in any session) or a stored blob with this hash: what peers pull.
    pub fn tensor_by_hash(&self, hash: &Hash) -> Result<Payload, ApiError> {
        let sessions: Vec<_> = lock(&self.sessions).values().cloned().collect();
        for s in sessions {
            let found = lock(&s)
                .tensors
                .values()
                .find(|r| r.hash == Some(*hash))
                .map(|r| r.buffer.clone());
            if let Some(b) = found {
                return Ok(payload(tensor::encode(&*self.engine.host(&b)?)));
            }
        }
        // A small output of a job this node committed to (revealed inline, never stored).
        let inline = lock(&self.jobs).jobs.values().find_map(|j| match j {
            JobEntry::Committed { revealed, .. } => revealed.blobs.get(hash).cloned(),
            _ => None,
        });
        if let Some(hex) = inline {
            let bytes = tenet_proto::from_hex(&hex)
                .ok_or_else(|| internal("a kept output is not hex".to_string()))?;
            return Ok(payload(bytes));
        }
        self.blob(hash)
    }

    /// Run one session operation other than `pull`.
    fn apply(&self, session: &mut Session, op: SessionOp) -> Result<OpResult, ApiError> {
        match op {
            SessionOp::Put { name, blob } => {
                let bytes = hex_blob(&blob, &format!("blob for {name}"))?;
                let t = tensor::decode(&bytes)
                    .map_err(|e| ApiError::new(ErrorCode::BadInputs, format!("{name}: {e}")))?;
                let hash = tensor::hash(&t);
                let b = self.engine.upload(t)?;
                Ok(OpResult::Resident(vec![
                    self.keep_hashed(session, &name, b, hash, 0)?,
                ]))
            }
            SessionOp::Get { name } => {
                let r = session
                    .tensors
                    .get(&name)
                    .ok_or_else(|| not_found(format!("no tensor {name} in this session")))?;
                let host = self.engine.host(&r.buffer)?;
                // A cheating node lies about what it hands back here too (a pipeline stage's
                // rows), after computing honestly.
                let t = match self.cheat {
                    Some(c) => std::borrow::Cow::Owned(c.apply(host.into_owned())),
                    None => host,
                };
                Ok(OpResult::Blob(tenet_proto::to_hex(&tensor::encode(&t))))
            }
            SessionOp::Write { name, from, row } => {
                let src = session
                    .tensors
                    .get(&from)
                    .ok_or_else(|| not_found(format!("no tensor {from} in this session")))?
                    .buffer
                    .clone();
                let dst = session
                    .tensors
                    .get_mut(&name)
                    .ok_or_else(|| not_found(format!("no tensor {name} in this session")))?;
                let at = write_offset(dst.buffer.ty(), src.ty(), row).map_err(|m| {
                    ApiError::new(
                        ErrorCode::BadInputs,
                        format!("write {from} into {name}: {m}"),
                    )
                })?;
                self.engine.write(&mut dst.buffer, at, &src)?;
                dst.hash = None;
                Ok(OpResult::Done)
            }
            SessionOp::Free { name } => {
                let r = session
                    .tensors
                    .remove(&name)
                    .ok_or_else(|| not_found(format!("no tensor {name} in this session")))?;
                self.resident_bytes
                    .fetch_sub(r.buffer.bytes(), Ordering::Relaxed);
                Ok(OpResult::Done)
            }
            SessionOp::Run {
                task,
                weights,
                inputs,
                outputs,
                seed,
            } => {
                let task = self.engine.task(&task)?;
                let weights = weights.map(|w| self.engine.weights(&w)).transpose()?;
                let mut feed = HashMap::with_capacity(inputs.len());
                for (input, name) in &inputs {
                    let r = session.tensors.get(name).ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::BadInputs,
                            format!("input {input}: no tensor {name} in this session"),
                        )
                    })?;
                    feed.insert(input.clone(), r.buffer.clone());
                }
                for out in outputs.keys() {
                    if !task.graph.outputs().iter().any(|o| o.name == *out) {
                        return Err(ApiError::new(
                            ErrorCode::BadInputs,
                            format!("the graph has no output named {out}"),
                        ));
                    }
                }
                let never = AtomicBool::new(false);
                let deadline = Instant::now() + Duration::from_millis(self.config.job_timeout_ms);
                // On the resident buffers, where they lie; the outputs stay on the device.
                let stop = || Instant::now() > deadline;
                let (results, _) = self
                    .engine
                    .run_buffers(&task, weights.as_deref(), &feed, seed, &stop)
                    .map_err(|e| stopped(e, &never))?;
                drop(feed);
                let mut kept = Vec::new();
                for (out, b) in results {
                    if let Some(name) = outputs.get(&out) {
                        kept.push(self.keep(session, name, b)?);
                    }
                }
                Ok(OpResult::Resident(kept))
            }
            SessionOp::Pull { .. } => Err(internal("pull runs outside the worker")),
        }
    }

    /// Run `ops` against session `sid` in order, stopping at the first failure. Runs of
    /// consecutive local operations go to one worker together; pulls wait on the network.
    pub async fn batch(
        self: &Arc<Self>,
        sid: &str,
        batch: Batch,
    ) -> Result<BatchResults, ApiError> {
        let session = self.session(sid)?;
        let mut results = Vec::with_capacity(batch.ops.len());
        let mut ops = batch.ops.into_iter().enumerate().peekable();
        while ops.peek().is_some() {
            if let Some((index, SessionOp::Pull { name, hash, peer })) =
                ops.next_if(|(_, op)| matches!(op, SessionOp::Pull { .. }))
            {
                match self.pull(&session, &name, &hash, &peer).await {
                    Ok(r) => results.push(OpResult::Resident(vec![r])),
                    Err(error) => {
                        return Ok(BatchResults {
                            results,
                            error: Some(BatchError { index, error }),
                        });
                    }
                }
                continue;
            }
            let mut chunk = Vec::new();
            while let Some(op) = ops.next_if(|(_, op)| !matches!(op, SessionOp::Pull { .. })) {
                chunk.push(op);
            }
            let node = self.clone();
            let s = session.clone();
            let (done, failed) = self
                .pool
                .run(move || {
                    let mut s = lock(&s);
                    let mut done = Vec::with_capacity(chunk.len());
                    for (index, op) in chunk {
                        match node.apply(&mut s, op) {
                            Ok(r) => done.push(r),
                            Err(error) => return (done, Some(BatchError { index, error })),
                        }
                    }
                    (done, None)
                })
                .await?;
            results.extend(done);
            if failed.is_some() {
                return Ok(BatchResults {
                    results,
                    error: failed,
                });
            }
        }
        Ok(BatchResults {
            results,
            error: None,
        })
    }

    /// Whether pulls may fetch from `peer`: one of the configured pull peers, or, on an open
    /// node, a loopback address.
    fn pull_allowed(&self, peer: &str) -> Result<(), ApiError> {
        let addr = tenet_net::client::authority(peer).ok_or_else(|| {
            bad_request(format!(
                "pull peer `{peer}` is not a node address: expected http://HOST:PORT"
            ))
        })?;
        let loopback = self.config.open && self.config.loopback_pulls && is_loopback(&addr);
        if self.pull_peers.contains(&addr) || loopback {
            return Ok(());
        }
        Err(bad_request(format!(
            "this node does not pull from {addr}: it pulls only from the peers its operator lists (pull_peers, --pull-from URL){}",
            if self.config.open && self.config.loopback_pulls {
                " and, being open, from loopback addresses"
            } else {
                ""
            }
        )))
    }

    /// Fetch tensor `hash` from `peer` and keep it as `name`: only from an allowed peer,
    /// within `pull_timeout_ms`, and reading no more than the sessions' memory can still take
    /// (counted as the bytes arrive).
    async fn pull(
        &self,
        session: &Arc<Mutex<Session>>,
        name: &str,
        hash: &Hash,
        peer: &str,
    ) -> Result<Resident, ApiError> {
        check_name(name, "tensor name")?;
        self.pull_allowed(peer)?;
        let failed = |what: String| ApiError::new(ErrorCode::PeerFailed, what);
        let client = tenet_net::client::NodeClient::new(peer, self.key.clone())
            .map_err(|e| bad_request(e.to_string()))?;
        let timeout = Duration::from_millis(self.config.pull_timeout_ms);
        let room = self.session_room();
        let limit = room.min(
            self.config
                .max_blob_bytes
                .saturating_add(tensor::MAX_TYPE_TEXT as u64 + 1),
        );
        let bounds = tenet_net::client::Bounds::new(timeout, limit);
        let mut inbound = self.inbound();
        let raw = client.signed(Method::GET, &format!("/v1/tensors/{hash}"), Bytes::new());
        let bytes = client
            .exchange(raw, None, bounds, &mut |n| inbound.take(n).is_ok())
            .await
            .and_then(|r| r.into_result())
            .map_err(|e| match e {
                ClientError::TooLarge { size, .. } => self.no_room(size, room),
                e => failed(format!("pulling {} from {peer}: {e}", hash.short())),
            })?;
        if tenet_net::digest::hash(&bytes) != *hash {
            return Err(failed(format!(
                "peer {peer} sent bytes that do not hash to {hash}"
            )));
        }
        let t = tensor::decode(&bytes)
            .map_err(|e| failed(format!("peer {peer} sent a malformed tensor: {e}")))?;
        drop(bytes);
        let b = self.engine.upload(t)?;
        let mut s = lock(session);
        self.keep_hashed(&mut s, name, b, *hash, inbound.held)
    }

    /// Fetch the job's inputs this node has neither stored nor inline from the peers the job
    /// names (a pipeline's boundary tensors, from nodes of the stage before), presenting the
    /// coordinator's grant; each peer in turn until one answers with bytes of that hash.
    async fn pull_job_inputs(
        &self,
        spec: &JobSpec,
        pulls: &std::collections::BTreeMap<Hash, PullFrom>,
        inline: &HashMap<Hash, Vec<u8>>,
    ) -> Result<(), ApiError> {
        for hash in spec.inputs.values() {
            if inline.contains_key(hash) || self.store.contains(hash).is_some() {
                continue;
            }
            let Some(from) = pulls.get(hash) else {
                continue; // the engine says it is missing
            };
            let mut errors = Vec::new();
            for peer in from.peers.iter().take(MAX_PULL_PEERS) {
                match self.pull_blob(hash, peer, &from.grant).await {
                    Ok(()) => {
                        errors.clear();
                        break;
                    }
                    Err(e) => errors.push(e.message),
                }
            }
            if !errors.is_empty() || from.peers.is_empty() {
                return Err(ApiError::new(
                    ErrorCode::PeerFailed,
                    format!(
                        "input {} could not be pulled from any of its {} peer(s): {}",
                        hash.short(),
                        from.peers.len(),
                        errors.join("; ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Fetch blob `hash` from `peer` with `grant` and store it: within `pull_timeout_ms`, no
    /// more than a blob may weigh, and only bytes that hash to it.
    async fn pull_blob(&self, hash: &Hash, peer: &str, grant: &PullGrant) -> Result<(), ApiError> {
        let failed = |what: String| ApiError::new(ErrorCode::PeerFailed, what);
        if tenet_net::client::authority(peer).is_none() {
            return Err(bad_request(format!(
                "pull peer `{peer}` is not a node address: expected http://HOST:PORT"
            )));
        }
        // A trusted coordinator names the peers of its own jobs; on an open node anyone may
        // send a job, so the address must be one the operator allows.
        if self.config.open {
            self.pull_allowed(peer)?;
        }
        let client = tenet_net::client::NodeClient::new(peer, self.key.clone())
            .map_err(|e| bad_request(e.to_string()))?;
        let timeout = Duration::from_millis(self.config.pull_timeout_ms);
        let limit = self
            .config
            .max_blob_bytes
            .saturating_add(tensor::MAX_TYPE_TEXT as u64 + 1);
        let bounds = tenet_net::client::Bounds::new(timeout, limit);
        let mut raw = client.signed(Method::GET, &format!("/v1/tensors/{hash}"), Bytes::new());
        raw.headers
            .push((tenet_proto::grant::GRANT_HEADER.into(), grant.to_header()));
        let bytes = client
            .exchange(raw, None, bounds, &mut |_| true)
            .await
            .and_then(|r| r.into_result())
            .map_err(|e| failed(format!("pulling {} from {peer}: {e}", hash.short())))?;
        if tenet_net::digest::hash(&bytes) != *hash {
            return Err(failed(format!(
                "peer {peer} sent bytes that do not hash to {hash}"
            )));
        }
        self.store.put(hash, &bytes).map_err(store_error)?;
        Ok(())
    }

    /// The Prometheus text.
    pub fn metrics_text(&self) -> String {
        let st = self.store.stats();
        let sessions = lock(&self.sessions).len();
        let running = lock(&self.jobs)
            .jobs
            .values()
            .filter(|j| matches!(j, JobEntry::Running { .. }))
            .count();
        self.metrics.render(&[
            ("tenet_store_blobs", "Blobs stored.", st.blobs as f64),
            (
                "tenet_store_bytes",
                "Bytes of blobs stored.",
                st.bytes as f64,
            ),
            (
                "tenet_store_quota_bytes",
                "The blob store's quota.",
                st.quota as f64,
            ),
            (
                "tenet_jobs_running",
                "Jobs executing or queued now.",
                running as f64,
            ),
            (
                "tenet_queue_waiting",
                "Requests waiting for a worker.",
                self.pool.waiting() as f64,
            ),
            (
                "tenet_workers_busy",
                "Workers executing now.",
                self.pool.busy(self.config.workers) as f64,
            ),
            ("tenet_sessions", "Open sessions.", sessions as f64),
            (
                "tenet_resident_bytes",
                "Bytes of tensors resident in sessions.",
                self.resident_bytes.load(Ordering::Relaxed) as f64,
            ),
        ])
    }
}

/// The byte offset at which `src` goes into `dst` from row `row` of its first axis, or why it
/// cannot: the dtypes and the shapes past the first axis must match and the rows must fit.
fn write_offset(
    dst: &tenet_ir::TensorType,
    src: &tenet_ir::TensorType,
    row: u64,
) -> Result<u64, String> {
    if dst.dtype != src.dtype
        || dst.rank() == 0
        || dst.shape[1..] != src.shape[1.min(src.rank())..]
        || src.rank() != dst.rank()
    {
        return Err(format!("{src} does not fit rows of {dst}"));
    }
    let end = row.checked_add(src.shape[0]).filter(|&e| e <= dst.shape[0]);
    if end.is_none() {
        return Err(format!(
            "{} rows from row {row} do not fit {dst}",
            src.shape[0]
        ));
    }
    let row_elems: u64 = dst.shape[1..].iter().product();
    Ok(row * row_elems * dst.dtype.size())
}

#[cfg(test)]
mod reservation_tests {
    use super::*;

    #[test]
    fn reservations_stay_within_their_limit_and_give_back_when_dropped() {
        let counter = Arc::new(AtomicU64::new(0));
        let a = Reservation::take(&counter, 60, 100).expect("fits");
        assert!(
            Reservation::take(&counter, 41, 100).is_none(),
            "60 + 41 > 100"
        );
        let b = Reservation::take(&counter, 40, 100).expect("60 + 40 fits");
        assert!(
            Reservation::take(&counter, u64::MAX, u64::MAX).is_none(),
            "no overflow"
        );
        drop(a);
        assert_eq!(counter.load(Ordering::SeqCst), 40);
        drop(b);
        assert_eq!(counter.load(Ordering::SeqCst), 0);
    }
}

#[cfg(test)]
mod write_tests {
    use super::write_offset;
    use tenet_ir::{DType, TensorType};

    #[test]
    fn writes_must_fit_rows_of_the_same_kind() {
        let cache = TensorType::new(DType::F32, vec![64, 3, 64]);
        let row = TensorType::new(DType::F32, vec![1, 3, 64]);
        assert_eq!(write_offset(&cache, &row, 0), Ok(0));
        assert_eq!(write_offset(&cache, &row, 63), Ok(63 * 3 * 64 * 4));
        assert!(write_offset(&cache, &row, 64).is_err());
        assert!(write_offset(&cache, &row, u64::MAX).is_err());
        let other = TensorType::new(DType::F16, vec![1, 3, 64]);
        assert!(write_offset(&cache, &other, 0).is_err());
        let wide = TensorType::new(DType::F32, vec![1, 3, 65]);
        assert!(write_offset(&cache, &wide, 0).is_err());
        let flat = TensorType::new(DType::F32, vec![192]);
        assert!(write_offset(&cache, &flat, 0).is_err());
        let scalar = TensorType::new(DType::F32, vec![]);
        assert!(write_offset(&scalar, &scalar, 0).is_err());
    }
}
