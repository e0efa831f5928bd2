//! A job's life in the coordinator: admitted (inputs stored and the job in the ledger before
//! anyone is told its id), driven to a decision in its own task (so a caller that hangs up
//! does not strand it), waited for, and resumed after a restart from what the ledger holds.
//! The phases a job goes through are in [`crate::phases`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tenet_ir::HostTensor;
use tenet_ledger::{JobRecord, JobState, Ledger, LedgerError, NodeRecord, NodeState};
use tenet_net::NodeClient;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::receipt::Receipt;
use tenet_proto::wire::{PullFrom, StageLabel};
use tenet_proto::{Hash, tensor};
use tenet_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How the coordinator runs jobs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Nodes each job runs on (each replicated job, in spot-check mode).
    pub replicas: usize,
    /// Spot-check mode: run each job on one node, and on `replicas` nodes with this
    /// probability (seed 000's α; `tenet economics` says how small it may be).
    pub spot_check: Option<f64>,
    /// Per-element bound against the median in the tolerant tier.
    pub tolerance: f64,
    /// Fraction of stake a node loses when it disagrees with the decided result.
    pub slash_fraction: f64,
    /// Credited to each agreeing node per job.
    pub reward: i64,
    /// How long a node may take to commit or reveal.
    pub node_timeout: Duration,
    /// The largest task this coordinator deploys, by its certificate: it must be able to
    /// referee any task it accepts (0: the memory available when it starts).
    pub max_task_bytes: u64,
    pub max_task_flops: u64,
    /// How long a job's lease lasts unrenewed when several coordinators share the ledger: a
    /// dead coordinator's jobs are taken over this long after its last renewal.
    pub lease: Duration,
    /// A fault to inject, for tests: the coordinator freezes at a point of every job.
    pub stall: Option<Stall>,
}

/// Where a job's driver freezes under [`CoordinatorConfig::stall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallPoint {
    /// All commitments are in, before any reveal is asked.
    BeforeReveal,
    /// The result is decided, before it is written to the ledger.
    BeforeSettle,
}

/// A fault for tests: at `at`, the job's driver and the coordinator's lease keeper freeze for
/// `pause`, as a paused or overloaded process would; the other coordinators on the ledger see
/// its leases lapse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    pub at: StallPoint,
    pub pause: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            replicas: 3,
            spot_check: None,
            tolerance: 1e-4,
            slash_fraction: 0.1,
            reward: 1,
            node_timeout: Duration::from_secs(60),
            max_task_bytes: 0,
            max_task_flops: 10_000_000_000_000,
            lease: Duration::from_secs(10),
            stall: None,
        }
    }
}

/// Why a job could not be run.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("blob store: {0}")]
    Store(#[from] tenet_store::StoreError),
    #[error(
        "only {have} healthy node(s) with bonded stake and of different operators are registered; the job needs {need}"
    )]
    NotEnoughNodes { have: usize, need: usize },
    /// No node (or too few) advertises limits the task's certificate fits: nothing was sent.
    #[error("{0}")]
    ExceedsLimits(String),
    #[error("the job failed on the nodes: {0}")]
    Nodes(String),
    #[error("the refereeing run failed: {0}")]
    Referee(String),
    #[error("no result: {0}")]
    Undecided(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// Too much of one kind of work is running already (try again later).
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Internal(String),
}

/// How long a submission waits for the job another submission tied its key to before taking
/// the key over (that submission's coordinator died before recording the job).
pub const ORPHAN_WAIT: Duration = Duration::from_secs(3);

/// Whether a keyed submission made a job or found the one its key already names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admitted {
    New(String),
    Existing(String),
}

/// A job to run.
#[derive(Clone, Debug)]
pub struct JobRequest {
    pub task: Hash,
    pub weights: Option<Hash>,
    pub inputs: BTreeMap<String, HostTensor>,
    pub tier: Tier,
    pub seed: u64,
}

/// A decided job.
#[derive(Clone, Debug)]
pub struct JobOutcome {
    pub job_id: String,
    pub outputs: Vec<(String, HostTensor)>,
    pub receipt: Receipt,
    /// Nodes that disagreed with the result (and were slashed), with the amount taken.
    pub slashed: Vec<(String, i64)>,
    /// Whether the coordinator had to referee.
    pub refereed: bool,
}

/// The coordinator's core: nodes, blobs, the ledger, and its signing key.
pub struct Coordinator<L: Ledger> {
    pub ledger: L,
    pub(crate) key: KeyPair,
    pub(crate) store: Arc<Store>,
    pub(crate) config: CoordinatorConfig,
    clients: Mutex<HashMap<String, Arc<NodeClient>>>,
    /// Jobs being driven by this process; the flag turns true when one ends.
    pub(crate) running: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// What deployed tasks need of a node and what their outputs weigh, by task id.
    facts: Mutex<HashMap<Hash, Arc<TaskFacts>>>,
    /// Work whose memory grows with a task — a weights file loaded to check a deploy, a
    /// referee run — one at a time, so the coordinator holds at most one task's worth.
    heavy: tokio::sync::Semaphore,
    /// Trainings started through the API (`training.rs`).
    pub(crate) trainings: crate::training::Trainings,
    /// What a running pipeline stage's job tells its nodes beyond the job, by job id: the
    /// inputs they fetch from other nodes (the boundary tensors) and which stage it is. Kept
    /// in memory only: a job resumed after a restart has its inputs uploaded from this
    /// coordinator's store instead.
    pub(crate) stage_jobs: Mutex<HashMap<String, StageJob>>,
    /// Pipelines whose stages were checked against their tasks (at deploy, or at the first
    /// call after a restart), by id.
    pub(crate) pipelines: Mutex<HashMap<Hash, Arc<tenet_pipeline::Manifest>>>,
    /// What happens to jobs and nodes, for the event log and live subscribers (`events.rs`).
    pub events: crate::events::Events,
    /// The node registry as last read, and when: picking a job's replicas and finding each
    /// replica's record read it for every job ([`NODES_FRESH`]).
    nodes_cache: Mutex<Option<(std::time::Instant, Arc<Vec<NodeRecord>>)>>,
    /// Jobs admitted here and not yet started, as recorded (with their first replicas): what
    /// their driver would otherwise read back from the ledger first thing.
    pub(crate) admitted: Mutex<HashMap<String, (JobRecord, Vec<tenet_ledger::Assignment>)>>,
    /// Until when the coordinator is frozen by an injected [`Stall`].
    pub(crate) frozen_until: Mutex<Option<tokio::time::Instant>>,
}

/// A pipeline stage's job, as its nodes are told.
#[derive(Clone, Debug, Default)]
pub(crate) struct StageJob {
    pub pulls: BTreeMap<Hash, PullFrom>,
    pub label: Option<StageLabel>,
}

/// What the coordinator keeps of a deployed task to schedule and check its jobs.
#[derive(Debug)]
pub(crate) struct TaskFacts {
    pub need: Need,
    /// Each output's name and its tensor blob's size: the most a node's answer may carry.
    pub outputs: Vec<(String, u64)>,
}

/// What a task needs of a node, by its cost certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub peak_bytes: u64,
    pub flops: u64,
    /// The job is in the exact tier: only nodes whose device passed its determinism check.
    pub exact: bool,
}

impl Need {
    /// Whether `node`'s advertised limits take it (an unknown limit, 0, takes anything: the
    /// node still checks the certificate itself before running).
    pub fn fits(&self, node: &NodeRecord) -> bool {
        let within = |need: u64, limit: i64| limit <= 0 || need <= limit as u64;
        within(self.peak_bytes, node.memory_limit)
            && within(self.flops, node.max_flops)
            && (node.exact || !self.exact)
    }

    /// The same need for a job of `tier`.
    pub fn for_tier(self, tier: tenet_proto::commit::Tier) -> Need {
        Need {
            exact: tier == tenet_proto::commit::Tier::Exact,
            ..self
        }
    }
}

pub(crate) fn now() -> i64 {
    tenet_proto::unix_now() as i64
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its map consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A uniform draw from [0, 1).
fn unit_random() -> f64 {
    (u64::from_le_bytes(tenet_net::identity::random_bytes::<8>()) >> 11) as f64
        / (1u64 << 53) as f64
}

/// How long a read of the node registry serves picking replicas: a node another coordinator
/// benches or bonds is seen within this; stakes and scores only weigh the draw.
pub const NODES_FRESH: Duration = Duration::from_millis(500);

/// Requests in flight to one node at once, each on a kept connection: jobs on the same node
/// do not queue behind one another's round trips, and a node is not flooded with sockets.
pub const NODE_CONNECTIONS: usize = 8;

/// Inputs of at most this many bytes travel inside the run request instead of as blobs.
const INLINE_INPUT_BYTES: u64 = 256 << 10;

impl<L: Ledger + 'static> Coordinator<L> {
    pub fn new(ledger: L, key: KeyPair, store: Arc<Store>, config: CoordinatorConfig) -> Self {
        Coordinator {
            ledger,
            key,
            store,
            config,
            clients: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            facts: Mutex::new(HashMap::new()),
            heavy: tokio::sync::Semaphore::new(1),
            trainings: Default::default(),
            stage_jobs: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            events: Default::default(),
            frozen_until: Mutex::new(None),
            nodes_cache: Mutex::new(None),
            admitted: Mutex::new(HashMap::new()),
        }
    }

    /// The node registry, read from the ledger at most every [`NODES_FRESH`] (changes this
    /// coordinator makes are seen at once; another coordinator's within that time).
    pub(crate) async fn registry(&self) -> Result<Arc<Vec<NodeRecord>>, DispatchError> {
        if let Some((at, nodes)) = &*lock(&self.nodes_cache)
            && at.elapsed() < NODES_FRESH
        {
            return Ok(nodes.clone());
        }
        let nodes = Arc::new(self.ledger.nodes().await?);
        *lock(&self.nodes_cache) = Some((std::time::Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    /// The registry changed here: read it again next time.
    pub(crate) fn forget_registry(&self) {
        *lock(&self.nodes_cache) = None;
    }

    /// Freeze here if the config injects a stall at `point` (tests only).
    pub(crate) async fn stall_at(&self, point: StallPoint) {
        let Some(stall) = self.config.stall.filter(|s| s.at == point) else {
            return;
        };
        let until = tokio::time::Instant::now() + stall.pause;
        *lock(&self.frozen_until) = Some(until);
        tokio::time::sleep_until(until).await;
    }

    /// Whether an injected stall has the coordinator frozen now.
    pub(crate) fn frozen(&self) -> bool {
        lock(&self.frozen_until).is_some_and(|t| t > tokio::time::Instant::now())
    }

    /// Write the event stream to `log` as well (`--event-log`).
    pub fn with_event_log(mut self, log: tenet_net::events::EventLog) -> Self {
        self.events = crate::events::Events::new(log);
        self
    }

    pub fn key(&self) -> &KeyPair {
        &self.key
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// A client for `node`, reused across jobs (one per URL), carrying up to
    /// [`NODE_CONNECTIONS`] of its jobs' requests at once.
    pub(crate) fn client(&self, node: &NodeRecord) -> Result<Arc<NodeClient>, DispatchError> {
        let mut c = lock(&self.clients);
        if let Some(existing) = c.get(&node.url) {
            return Ok(existing.clone());
        }
        let mut client = NodeClient::pooled(&node.url, self.key.clone(), NODE_CONNECTIONS)
            .map_err(|e| DispatchError::BadRequest(e.to_string()))?;
        // The node's id is its key: requests to it carry a MAC under the key the two share.
        if let Some(key) = tenet_proto::auth::PublicKey::parse(&node.id) {
            client = client.with_node_key(&key);
        }
        let client = Arc::new(client);
        c.insert(node.url.clone(), client.clone());
        Ok(client)
    }

    /// The memory one task may take here (a referee run, a weights file loaded):
    /// `max_task_bytes`, or the memory available.
    pub fn task_memory(&self) -> u64 {
        match self.config.max_task_bytes {
            0 => tenet_exec::available_memory().unwrap_or(4 << 30),
            m => m,
        }
    }

    /// A turn at work whose memory grows with a task (loading a weights file, refereeing):
    /// one at a time.
    pub async fn heavy_turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, DispatchError> {
        self.heavy
            .acquire()
            .await
            .map_err(|e| DispatchError::Internal(e.to_string()))
    }

    /// Whether a task with this certificate may be deployed: within the coordinator's own
    /// limits, since it referees disagreements by running the task itself.
    pub fn check_deployable(&self, cost: &tenet_ir::Cost) -> Result<(), DispatchError> {
        let memory = self.task_memory();
        if cost.peak_bytes > memory || cost.flops > self.config.max_task_flops {
            return Err(DispatchError::ExceedsLimits(format!(
                "the task needs {} bytes of memory and {} flops by its certificate; this coordinator deploys tasks of at most {memory} bytes and {} flops (it must be able to referee them)",
                cost.peak_bytes, cost.flops, self.config.max_task_flops
            )));
        }
        Ok(())
    }

    /// How many healthy staked nodes advertise limits that take a task with this certificate.
    pub async fn nodes_able(&self, cost: &tenet_ir::Cost) -> Result<usize, DispatchError> {
        let need = Need {
            peak_bytes: cost.peak_bytes,
            flops: cost.flops,
            exact: false,
        };
        Ok(self
            .ledger
            .nodes()
            .await?
            .iter()
            .filter(|r| r.state == NodeState::Active && r.stake > 0 && need.fits(r))
            .count())
    }

    /// What a job of task `task` in `tier` needs of a node: the certificate's memory and
    /// flops, and for the exact tier a device that passed its determinism check.
    pub(crate) fn need(&self, task: &Hash, tier: Tier) -> Result<Need, DispatchError> {
        Ok(self.facts(task)?.need.for_tier(tier))
    }

    /// What the coordinator keeps of task `task` (decoded once, then cached).
    pub(crate) fn facts(&self, task: &Hash) -> Result<Arc<TaskFacts>, DispatchError> {
        if let Some(f) = lock(&self.facts).get(task) {
            return Ok(f.clone());
        }
        if tenet_models::generation::Arithmetic::of_task(&task.0).is_some() {
            // A generation: what it needs depends on its request, which each node checks
            // against its own limits; its answer is at most the token limit's tokens.
            let vector = |n: u64| {
                let ty = tenet_ir::TensorType::new(tenet_ir::DType::I64, vec![n]);
                8 * n + tensor::header(&ty).len() as u64
            };
            let facts = Arc::new(TaskFacts {
                need: Need {
                    peak_bytes: 0,
                    flops: 0,
                    exact: false,
                },
                outputs: vec![
                    (
                        "tokens".into(),
                        vector(tenet_models::generation::MAX_NEW_TOKENS),
                    ),
                    ("finish".into(), vector(1)),
                ],
            });
            lock(&self.facts).insert(*task, facts.clone());
            return Ok(facts);
        }
        let graph = tenet_ir::codec::decode(&self.store.get(task)?).map_err(|e| {
            DispatchError::Internal(format!("the stored task {task} does not decode: {e}"))
        })?;
        let cost = graph.cost();
        let outputs = graph
            .outputs()
            .iter()
            .map(|o| {
                let ty = &graph.node(o.node).ty;
                let bytes = ty.bytes().unwrap_or(u64::MAX);
                let blob = bytes.saturating_add(tensor::header(ty).len() as u64);
                (o.name.clone(), blob)
            })
            .collect();
        let facts = Arc::new(TaskFacts {
            need: Need {
                peak_bytes: cost.peak_bytes,
                flops: cost.flops,
                exact: false,
            },
            outputs,
        });
        lock(&self.facts).insert(*task, facts.clone());
        Ok(facts)
    }

    /// Pick up to `n` active nodes with stake whose limits take `need`, none of them in
    /// `exclude` nor of the same operator as a node in `exclude` or as each other, weighted
    /// by stake × score. One party (an operator, or a node without one) never holds two
    /// replicas of a job, however many nodes it runs or however much stake it has.
    pub(crate) async fn pick(
        &self,
        n: usize,
        exclude: &HashSet<String>,
        need: Need,
    ) -> Result<Vec<NodeRecord>, DispatchError> {
        let all = self.registry().await?;
        let mut parties: HashSet<String> = all
            .iter()
            .filter(|r| exclude.contains(&r.id))
            .map(|r| r.party().to_string())
            .collect();
        let mut pool: Vec<NodeRecord> = all
            .iter()
            .filter(|r| {
                r.state == NodeState::Active
                    && r.stake > 0
                    && !exclude.contains(&r.id)
                    && !parties.contains(r.party())
                    && need.fits(r)
            })
            .cloned()
            .collect();
        let mut chosen = Vec::new();
        while chosen.len() < n && !pool.is_empty() {
            let weights: Vec<f64> = pool
                .iter()
                .map(|r| r.stake as f64 * r.score().max(0.01))
                .collect();
            let total: f64 = weights.iter().sum();
            let mut x = unit_random() * total;
            let mut i = 0;
            while i + 1 < pool.len() && x >= weights[i] {
                x -= weights[i];
                i += 1;
            }
            let picked = pool.swap_remove(i);
            parties.insert(picked.party().to_string());
            pool.retain(|r| !parties.contains(r.party()));
            chosen.push(picked);
        }
        Ok(chosen)
    }

    /// Why fewer than `want` nodes could be picked for `need`: no node's limits take the task
    /// (nothing is sent to any node), or too few healthy parties.
    pub(crate) async fn shortfall(&self, have: usize, want: usize, need: Need) -> DispatchError {
        let Ok(nodes) = self.ledger.nodes().await else {
            return DispatchError::NotEnoughNodes { have, need: want };
        };
        let staked: Vec<&NodeRecord> = nodes
            .iter()
            .filter(|r| r.state == NodeState::Active && r.stake > 0)
            .collect();
        let fitting = staked.iter().filter(|r| need.fits(r)).count();
        let exact = staked.iter().filter(|r| r.exact).count();
        if need.exact && exact < want && exact < staked.len() {
            return DispatchError::ExceedsLimits(format!(
                "an exact-tier job needs nodes whose device passed its determinism check: {exact} of the {} healthy staked node(s) do, and the job needs {want} (ask for the tolerant tier, or add nodes)",
                staked.len()
            ));
        }
        if fitting < want && fitting < staked.len() {
            let most = staked.iter().map(|r| r.memory_limit).max().unwrap_or(0);
            let flops = staked.iter().map(|r| r.max_flops).max().unwrap_or(0);
            return DispatchError::ExceedsLimits(format!(
                "the task needs {} bytes of memory and {} flops by its certificate; {fitting} of the {} healthy staked node(s) take that (the largest limits: {most} bytes, {flops} flops), and the job needs {want}",
                need.peak_bytes,
                need.flops,
                staked.len()
            ));
        }
        DispatchError::NotEnoughNodes { have, need: want }
    }

    /// How many replicas a new job gets: `replicas`, or in spot-check mode one, replicated
    /// with probability α.
    fn replicas_for_new_job(&self) -> usize {
        let r = self.config.replicas.max(1);
        match self.config.spot_check {
            Some(alpha) if unit_random() >= alpha => 1,
            _ => r,
        }
    }

    /// Accept a job: store its inputs and record it, with its first replicas, in the ledger.
    /// Once this returns, the job survives a crash of the coordinator; it has not started.
    pub async fn admit(&self, req: JobRequest) -> Result<String, DispatchError> {
        match self.admit_keyed(req, None).await? {
            Admitted::New(id) | Admitted::Existing(id) => Ok(id),
        }
    }

    /// [`Coordinator::admit`] under a caller's idempotency key: the first submission with the
    /// key (to this coordinator or any other on the same ledger) makes the job; a later one
    /// gets that job back instead of a second. The key is tied to the job in the write that
    /// records it, so two racing submissions agree on one; a key whose job never appeared
    /// (tied apart from its job by an earlier version, whose coordinator died in between) is
    /// taken over after [`ORPHAN_WAIT`].
    pub async fn admit_keyed(
        &self,
        req: JobRequest,
        key: Option<&str>,
    ) -> Result<Admitted, DispatchError> {
        self.ensure_task(&req.task).await.map_err(|e| match e {
            DispatchError::NotFound(_) => DispatchError::BadRequest(format!(
                "task {} is not deployed on this coordinator nor on any other on its ledger",
                req.task
            )),
            e => e,
        })?;
        if let Some(w) = &req.weights {
            // A generation's model: deployed here, or by a peer coordinator.
            self.ensure_blob(w, &[]).await?;
        }
        let want = self.replicas_for_new_job();
        let need = self.need(&req.task, req.tier)?;
        let chosen = self.pick(want, &HashSet::new(), need).await?;
        if chosen.len() < want {
            return Err(self.shortfall(chosen.len(), want, need).await);
        }
        let mut inputs = BTreeMap::new();
        // Inputs small enough to travel inside run requests are kept in the ledger with the
        // job too: whichever coordinator ends up driving it has them.
        let mut small = Vec::new();
        for (name, t) in &req.inputs {
            let bytes = tensor::encode(t);
            let hash = self.store.put_bytes(&bytes)?;
            if bytes.len() as u64 <= INLINE_INPUT_BYTES && self.leasing() {
                small.push((hash.to_hex(), bytes));
            }
            inputs.insert(name.clone(), hash);
        }
        let job_id = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>());
        let record = JobRecord {
            id: job_id.clone(),
            task: req.task.to_hex(),
            weights: req.weights.map(|w| w.to_hex()),
            inputs: serde_json::to_string(&inputs)
                .map_err(|e| DispatchError::Internal(e.to_string()))?,
            tier: req.tier.as_str().to_string(),
            seed: req.seed as i64,
            replicas: want as i64,
            state: JobState::Pending,
            created_at: now(),
            updated_at: now(),
            output_hash: None,
            receipt: None,
            error: None,
        };
        let ids: Vec<String> = chosen.into_iter().map(|n| n.id).collect();
        match key {
            // The key tied to the job as it is recorded, in one write.
            Some(key) => {
                if self
                    .ledger
                    .create_keyed_job(&record, &ids, &small, key)
                    .await?
                    .is_some()
                {
                    // The key names another job: an earlier submission's, or (tied by a
                    // coordinator that claimed keys apart from recording jobs, and died in
                    // between) one never recorded, which is taken over.
                    if let Some(existing) = self.tie_key(key, &job_id).await? {
                        return Ok(Admitted::Existing(existing));
                    }
                    self.ledger.create_job(&record, &ids, &small).await?;
                }
            }
            None => self.ledger.create_job(&record, &ids, &small).await?,
        }
        {
            let mut admitted = lock(&self.admitted);
            // Bounded: a caller that admits jobs and never starts them (an API user of
            // `admit`) costs their drivers a read each, not this map's growth.
            if admitted.len() < 4096 {
                let asg = ids
                    .iter()
                    .map(|n| tenet_ledger::Assignment {
                        job_id: job_id.clone(),
                        node_id: n.clone(),
                        state: tenet_ledger::AssignmentState::Assigned,
                        commitment: None,
                        output_hash: None,
                        salt: None,
                    })
                    .collect();
                admitted.insert(job_id.clone(), (record.clone(), asg));
            }
        }
        self.events.job(
            &job_id,
            "accepted",
            serde_json::json!({"task": record.task, "replicas": want, "tier": record.tier}),
        );
        for id in &ids {
            self.events
                .job(&job_id, "assigned", serde_json::json!({"node": id}));
        }
        Ok(Admitted::New(job_id))
    }

    /// Tie `key` to `job_id`; the job it already names, if another submission got there first.
    async fn tie_key(&self, key: &str, job_id: &str) -> Result<Option<String>, DispatchError> {
        for _ in 0..4 {
            let holder = self
                .ledger
                .claim_idempotency_key(key, job_id, now())
                .await?;
            if holder == job_id {
                return Ok(None);
            }
            // The other submission records its job right after tying the key: wait for it.
            let started = std::time::Instant::now();
            while started.elapsed() < ORPHAN_WAIT {
                if self.ledger.job(&holder).await?.is_some() {
                    return Ok(Some(holder));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if self
                .ledger
                .take_over_idempotency_key(key, &holder, job_id)
                .await?
            {
                return Ok(None);
            }
        }
        Err(DispatchError::Busy(format!(
            "idempotency key {key:?} is contended: try again"
        )))
    }

    /// Drive an admitted job to its end in a task of its own; a failure is recorded in the
    /// ledger. Dropping the handle leaves the job running.
    pub fn start(
        self: &Arc<Self>,
        job_id: String,
    ) -> JoinHandle<Result<JobOutcome, DispatchError>> {
        let (done, watcher) = watch::channel(false);
        lock(&self.running).insert(job_id.clone(), watcher);
        let me = self.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let result = me.drive(&job_id).await;
            match &result {
                Ok(out) => {
                    let agreeing: Vec<String> = out
                        .receipt
                        .nodes
                        .iter()
                        .map(|a| a.commitment.node.to_hex())
                        .collect();
                    let dissenting: Vec<&String> = out.slashed.iter().map(|(n, _)| n).collect();
                    me.events.job(
                        &job_id,
                        "decided",
                        serde_json::json!({
                            "agreeing": agreeing, "dissenting": dissenting,
                            "replicas": out.receipt.replicas, "refereed": out.refereed,
                            "disputed": out.receipt.dispute.is_some(),
                            "output": out.receipt.output_hash.to_hex(),
                            "ms": started.elapsed().as_secs_f64() * 1e3,
                        }),
                    );
                    for (node, amount) in &out.slashed {
                        me.events.emit(
                            "slashed",
                            serde_json::json!({"job": job_id, "node": node, "amount": amount}),
                        );
                    }
                }
                Err(e) if crate::scale::lease_lost(e) => {
                    // Another coordinator holds the job now, and ends it.
                    me.events.job(
                        &job_id,
                        "handed-over",
                        serde_json::json!({"error": e.to_string()}),
                    );
                }
                Err(e) => {
                    let _ = me.ledger.fail_job(&job_id, &e.to_string(), now()).await;
                    me.events.job(
                        &job_id,
                        "failed",
                        serde_json::json!({"error": e.to_string()}),
                    );
                }
            }
            lock(&me.running).remove(&job_id);
            let _ = done.send(true);
            result
        })
    }

    /// Run `req` on the configured number of replicas, verified, and wait for the outcome.
    pub async fn run(self: &Arc<Self>, req: JobRequest) -> Result<JobOutcome, DispatchError> {
        let job_id = self.admit(req).await?;
        self.start(job_id)
            .await
            .map_err(|e| DispatchError::Internal(format!("the job's task failed: {e}")))?
    }

    /// [`Coordinator::run`] for one stage of a pipeline: its nodes fetch the inputs in
    /// `pulls` from the peers named there instead of from this coordinator, and are told
    /// which stage they run.
    pub(crate) async fn run_stage(
        self: &Arc<Self>,
        req: JobRequest,
        stage: StageJob,
    ) -> Result<JobOutcome, DispatchError> {
        let job_id = self.admit(req).await?;
        lock(&self.stage_jobs).insert(job_id.clone(), stage);
        let outcome = self.start(job_id.clone()).await;
        lock(&self.stage_jobs).remove(&job_id);
        outcome.map_err(|e| DispatchError::Internal(format!("the job's task failed: {e}")))?
    }

    /// Admit and start `req` without waiting; its id, to wait on or read later.
    pub async fn submit(self: &Arc<Self>, req: JobRequest) -> Result<String, DispatchError> {
        let job_id = self.admit(req).await?;
        drop(self.start(job_id.clone()));
        Ok(job_id)
    }

    /// [`Coordinator::submit`] under an idempotency key: a new job is started; one the key
    /// already names is left as it is (running here, elsewhere, or ended).
    pub async fn submit_keyed(
        self: &Arc<Self>,
        req: JobRequest,
        key: Option<&str>,
    ) -> Result<Admitted, DispatchError> {
        let admitted = self.admit_keyed(req, key).await?;
        if let Admitted::New(id) = &admitted {
            drop(self.start(id.clone()));
        }
        Ok(admitted)
    }

    /// Start every job the ledger holds unfinished (after a restart) that is this
    /// coordinator's to drive: with peers on the ledger, those leased to it before the restart
    /// and those whose lease lapsed; their ids.
    pub async fn resume(self: &Arc<Self>) -> Result<Vec<String>, DispatchError> {
        let mut resumed = Vec::new();
        for job in self.ledger.claim_jobs(i64::MAX, true).await? {
            if lock(&self.running).contains_key(&job.id) {
                continue;
            }
            drop(self.start(job.id.clone()));
            resumed.push(job.id);
        }
        Ok(resumed)
    }

    /// Wait up to `limit` for a job this process is driving to end; true when it is not
    /// running here (any more).
    pub async fn wait(&self, job_id: &str, limit: Duration) -> bool {
        let watcher = lock(&self.running).get(job_id).cloned();
        match watcher {
            None => true,
            Some(mut w) => tokio::time::timeout(limit, w.wait_for(|ended| *ended))
                .await
                .is_ok(),
        }
    }

    /// Jobs being driven by this process now.
    pub fn running_jobs(&self) -> usize {
        lock(&self.running).len()
    }

    /// The job as the nodes see it, rebuilt from its ledger record.
    pub(crate) fn spec_of(&self, job: &JobRecord) -> Result<JobSpec, DispatchError> {
        let corrupt = |what: &str| {
            DispatchError::Internal(format!("job {} in the ledger has a bad {what}", job.id))
        };
        Ok(JobSpec {
            job_id: job.id.clone(),
            task: Hash::parse(&job.task).map_err(|_| corrupt("task"))?,
            weights: job
                .weights
                .as_deref()
                .map(Hash::parse)
                .transpose()
                .map_err(|_| corrupt("weights"))?,
            inputs: serde_json::from_str(&job.inputs).map_err(|_| corrupt("input list"))?,
            tier: Tier::parse(&job.tier).ok_or_else(|| corrupt("tier"))?,
            seed: job.seed as u64,
        })
    }

    /// Small inputs as hex, to travel inside the run request.
    pub(crate) fn inline_inputs(
        &self,
        spec: &JobSpec,
    ) -> Result<BTreeMap<Hash, String>, DispatchError> {
        let mut inline = BTreeMap::new();
        for h in spec.inputs.values() {
            if self
                .store
                .contains(h)
                .is_some_and(|n| n <= INLINE_INPUT_BYTES)
            {
                inline.insert(*h, tenet_proto::to_hex(&self.store.get(h)?));
            }
        }
        Ok(inline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_proto::commit::Tier;

    fn node(memory_limit: i64, exact: bool) -> NodeRecord {
        NodeRecord {
            id: "n".into(),
            url: String::new(),
            stake: 1,
            state: NodeState::Active,
            registered_at: 0,
            last_heartbeat: 0,
            agreed: 0,
            disagreed: 0,
            score_sum: 0.0,
            operator: String::new(),
            memory_limit,
            max_flops: 0,
            device: if exact { "cpu cpu" } else { "gpu opencl:0" }.into(),
            exact,
        }
    }

    /// An exact-tier job goes only to nodes whose device passed its determinism check; a
    /// tolerant one to any node whose limits take it.
    #[test]
    fn exact_jobs_need_a_device_that_passed_its_check() {
        let need = Need {
            peak_bytes: 100,
            flops: 10,
            exact: false,
        };
        let (passed, failed) = (node(0, true), node(0, false));
        assert!(need.for_tier(Tier::Exact).fits(&passed));
        assert!(!need.for_tier(Tier::Exact).fits(&failed));
        assert!(need.for_tier(Tier::Tolerant).fits(&failed));
        assert!(!need.for_tier(Tier::Tolerant).fits(&node(99, true)));
    }
}
