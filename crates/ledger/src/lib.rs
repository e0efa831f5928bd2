//! `tenet-ledger`: what the coordinator must never lose — nodes and their stakes, jobs and
//! their state machine, each replica's commitment and reveal, results, receipts, slashes and
//! credits.
//!
//! [`Ledger`] is the trait; [`SqlLedger`] implements it on SQLite (the embedded default, in WAL
//! mode with full fsync) and on PostgreSQL, chosen by the URL, with the same SQL where the
//! dialects agree and per-dialect schema where they do not. One test suite
//! (`tests/suite.rs`) runs against both. The ledger stores identities and hashes as text and
//! knows nothing of the wire format, HTTP or the executor.

mod schema;
mod sql;

use std::future::Future;

pub use sql::SqlLedger;

/// Why a ledger operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the ledger database failed: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{0} not found in the ledger")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("unsupported ledger URL `{0}`: use sqlite://PATH or postgres://USER@HOST:PORT/DB")]
    BadUrl(String),
    #[error("the ledger holds a value this version cannot read: {0}")]
    Corrupt(String),
    /// A write to a job through a leasing handle whose lease on it lapsed or was taken by
    /// another coordinator (`holder`): the job is someone else's to drive now.
    #[error("this coordinator no longer holds the lease on job {job} (held by `{holder}`)")]
    LeaseLost { job: String, holder: String },
}

pub type Result<T> = std::result::Result<T, LedgerError>;

macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            pub fn parse(s: &str) -> Result<$name> {
                match s {
                    $($text => Ok($name::$variant),)*
                    other => Err(LedgerError::Corrupt(format!(
                        "{} `{other}`", stringify!($name)
                    ))),
                }
            }
        }
    };
}

text_enum! {
    /// A node's standing.
    NodeState {
        Registered = "registered",
        Active = "active",
        Unhealthy = "unhealthy",
        Deregistered = "deregistered",
    }
}

text_enum! {
    /// Where a job is. `Pending` → `Committing` (replicas run and commit) → `Revealing` (all
    /// commitments in; reveals asked) → `Decided`, or `Failed` from any state before it.
    JobState {
        Pending = "pending",
        Committing = "committing",
        Revealing = "revealing",
        Decided = "decided",
        Failed = "failed",
    }
}

text_enum! {
    /// Where one replica of a job is.
    AssignmentState {
        Assigned = "assigned",
        Committed = "committed",
        Revealed = "revealed",
        Failed = "failed",
        Agreed = "agreed",
        Disagreed = "disagreed",
    }
}

/// What a node advertises about what it can run (from its `/v1/info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLimits {
    pub memory_limit: i64,
    pub max_flops: i64,
    pub device: String,
    pub exact: bool,
}

/// A registered node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    /// The node's public key (hex).
    pub id: String,
    pub url: String,
    /// Stake in the smallest unit.
    pub stake: i64,
    pub state: NodeState,
    pub registered_at: i64,
    pub last_heartbeat: i64,
    /// Jobs where the node agreed with the decided result, and where it did not.
    pub agreed: i64,
    pub disagreed: i64,
    /// Sum of per-job scores (1 for agreement in the exact tier; 1/(1+distance) in tolerant).
    pub score_sum: f64,
    /// Who answers for the node's stake, as the admin named them when bonding (empty: the node
    /// answers for itself). No two replicas of a job share an operator.
    pub operator: String,
    /// The most tensor memory and flops one job may need on this node, as it advertises them
    /// (0: not known).
    pub memory_limit: i64,
    pub max_flops: i64,
    /// The device the node runs jobs on, as it advertises it (`cpu cpu`, `gpu opencl:0`;
    /// empty: not known).
    pub device: String,
    /// Whether that device passed its determinism check and may serve the exact tier.
    pub exact: bool,
}

impl NodeRecord {
    /// The party a job's replicas must not repeat: the operator, or the node itself.
    pub fn party(&self) -> &str {
        if self.operator.is_empty() {
            &self.id
        } else {
            &self.operator
        }
    }

    /// Mean score over decided jobs (1.0 for a node with none yet).
    pub fn score(&self) -> f64 {
        let n = self.agreed + self.disagreed;
        if n == 0 {
            1.0
        } else {
            self.score_sum / n as f64
        }
    }
}

/// A job as the ledger keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    pub id: String,
    pub task: String,
    pub weights: Option<String>,
    /// The inputs (name → hash) as JSON.
    pub inputs: String,
    pub tier: String,
    pub seed: i64,
    /// Replicas asked for.
    pub replicas: i64,
    pub state: JobState,
    pub created_at: i64,
    pub updated_at: i64,
    pub output_hash: Option<String>,
    /// The receipt (JSON) once decided.
    pub receipt: Option<String>,
    pub error: Option<String>,
}

/// One replica of a job on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub job_id: String,
    pub node_id: String,
    pub state: AssignmentState,
    /// The node's signed commitment (JSON).
    pub commitment: Option<String>,
    pub output_hash: Option<String>,
    pub salt: Option<String>,
}

/// A change of a node's stake.
#[derive(Clone, Debug, PartialEq)]
pub struct StakeEvent {
    pub node_id: String,
    pub job_id: Option<String>,
    /// Negative for a slash.
    pub delta: i64,
    pub reason: String,
    pub at: i64,
}

/// How a node came out of a decided job.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub node_id: String,
    pub agreed: bool,
    pub score: f64,
    /// The node committed but never revealed (slashed as if it had disagreed).
    pub withheld: bool,
}

/// How a decided job settles, all in one transaction: its result and receipt, how each judged
/// node came out (counters and scores), a slash of every node that disagreed and a credit to
/// every node that agreed. A coordinator that dies halfway leaves either none of it or all.
#[derive(Clone, Debug)]
pub struct Settlement<'a> {
    pub output_hash: &'a str,
    pub receipt: &'a str,
    /// Reveals not yet recorded: (node, output hash, salt).
    pub reveals: &'a [(String, String, String)],
    pub verdicts: &'a [Verdict],
    /// Fraction of stake (rounded down) taken from each node that disagreed.
    pub slash_fraction: f64,
    /// Credited to each node that agreed.
    pub reward: i64,
    pub at: i64,
}

/// A coordinator process sharing the ledger, as it announces itself.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorRecord {
    /// The process's lease holder id (unique to it).
    pub holder: String,
    /// The public key (hex) its receipts are signed with.
    pub key: String,
    /// Where its API listens (`http://host:port`).
    pub url: String,
    pub started_at: i64,
    /// Milliseconds since it last announced itself, by the ledger's clock (when read).
    pub silent_ms: i64,
}

/// Why the ledger records a slash for a disagreeing replica.
pub const DISAGREED: &str = "its committed result disagreed with the decided result";

/// Why the ledger records a slash for a replica that committed and then withheld its reveal.
pub const WITHHELD: &str = "it committed to a result and did not reveal it in time";

/// The reason recorded when the admin bonds stake to a node (or takes it back).
pub const BONDED: &str = "bonded by the admin";
pub const UNBONDED: &str = "unbonded by the admin";

/// Everything the coordinator records. Every method is one transaction.
pub trait Ledger: Send + Sync {
    /// Who this handle drives jobs as, when it leases them (several coordinators share the
    /// ledger); `None` for a handle that is the ledger's only driver.
    fn lease_holder(&self) -> Option<&str>;
    /// Record a new node with its stake (a stake event when positive), or bring back a node
    /// that deregistered: its URL, state, times and limits are updated, but its stake and
    /// operator stay what they were (stake moves only by bonds, slashes and credits).
    fn register_node(&self, node: &NodeRecord) -> impl Future<Output = Result<()>> + Send;
    /// The admin bonds `delta` more stake to a node (negative: takes it back, never below zero)
    /// and, when given, names its operator; one transaction with its stake event.
    fn bond(
        &self,
        id: &str,
        delta: i64,
        operator: Option<&str>,
        at: i64,
    ) -> impl Future<Output = Result<NodeRecord>> + Send;
    /// The limits and device a node advertises (from its `/v1/info`).
    fn set_node_limits(
        &self,
        id: &str,
        limits: &NodeLimits,
    ) -> impl Future<Output = Result<()>> + Send;
    fn set_node_state(&self, id: &str, state: NodeState)
    -> impl Future<Output = Result<()>> + Send;
    fn heartbeat(&self, id: &str, at: i64) -> impl Future<Output = Result<()>> + Send;
    fn node(&self, id: &str) -> impl Future<Output = Result<Option<NodeRecord>>> + Send;
    fn nodes(&self) -> impl Future<Output = Result<Vec<NodeRecord>>> + Send;

    /// Record a new job, its first replicas, and the small blobs (hash, bytes) it needs that
    /// must outlive the coordinator admitting it (its inputs that travel inside run requests);
    /// through a leasing handle, the job is leased to it.
    fn create_job(
        &self,
        job: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
    ) -> impl Future<Output = Result<()>> + Send;
    /// [`Ledger::create_job`] under a caller's idempotency `key`, tied to the job in the same
    /// transaction: `None` when the job was recorded, else the job the key already names (and
    /// nothing was recorded). Of two submissions racing with one key, on any coordinators
    /// sharing the ledger, one records its job.
    fn create_keyed_job(
        &self,
        job: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
        key: &str,
    ) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Add a replica (a rescheduled or extra node).
    fn assign(&self, job_id: &str, node_id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Move a job from `from` to `to`; refused if it is not in `from`.
    fn advance_job(
        &self,
        job_id: &str,
        from: JobState,
        to: JobState,
        at: i64,
    ) -> impl Future<Output = Result<()>> + Send;
    fn record_commitment(
        &self,
        job_id: &str,
        node_id: &str,
        commitment: &str,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The commit phase is over: record these (node, commitment) pairs and move the job from
    /// pending or committing to revealing, in one transaction.
    fn record_commitments(
        &self,
        job_id: &str,
        commitments: &[(String, String)],
        at: i64,
    ) -> impl Future<Output = Result<()>> + Send;
    fn record_reveal(
        &self,
        job_id: &str,
        node_id: &str,
        output_hash: &str,
        salt: &str,
    ) -> impl Future<Output = Result<()>> + Send;
    fn fail_assignment(
        &self,
        job_id: &str,
        node_id: &str,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The job is decided and settled ([`Settlement`]); returns each slashed node with the
    /// amount taken.
    fn decide_job(
        &self,
        job_id: &str,
        settlement: &Settlement<'_>,
    ) -> impl Future<Output = Result<Vec<(String, i64)>>> + Send;
    fn fail_job(
        &self,
        job_id: &str,
        error: &str,
        at: i64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Take `fraction` of a node's stake (rounded down); returns the amount taken.
    fn slash(
        &self,
        node_id: &str,
        job_id: &str,
        fraction: f64,
        reason: &str,
        at: i64,
    ) -> impl Future<Output = Result<i64>> + Send;
    fn credit(
        &self,
        node_id: &str,
        job_id: &str,
        amount: i64,
        at: i64,
    ) -> impl Future<Output = Result<()>> + Send;

    fn job(&self, id: &str) -> impl Future<Output = Result<Option<JobRecord>>> + Send;
    /// The newest `limit` jobs, newest first.
    fn jobs(&self, limit: i64) -> impl Future<Output = Result<Vec<JobRecord>>> + Send;
    /// Jobs not yet decided or failed: what a restarted coordinator resumes.
    fn unfinished_jobs(&self) -> impl Future<Output = Result<Vec<JobRecord>>> + Send;
    fn assignments(&self, job_id: &str) -> impl Future<Output = Result<Vec<Assignment>>> + Send;
    fn stake_events(&self, node_id: &str) -> impl Future<Output = Result<Vec<StakeEvent>>> + Send;
    /// The stake events recorded for one job (its slashes and credits), by an index.
    fn job_stake_events(
        &self,
        job_id: &str,
    ) -> impl Future<Output = Result<Vec<StakeEvent>>> + Send;
    /// Through a leasing handle: lease to it up to `limit` unfinished jobs whose lease lapsed
    /// (or that never had one) — and with `own`, those its holder leased before (a restart
    /// under the same holder) — oldest first; they are its to drive. Of coordinators claiming
    /// at once, each job goes to one.
    fn claim_jobs(
        &self,
        limit: i64,
        own: bool,
    ) -> impl Future<Output = Result<Vec<JobRecord>>> + Send;
    /// Through a leasing handle: extend every unexpired lease it holds by its lease time; how
    /// many. A lease that lapsed stays lapsed (another coordinator may have claimed the job).
    fn renew_leases(&self) -> impl Future<Output = Result<u64>> + Send;
    /// Announce a coordinator sharing the ledger (or that it is still alive).
    fn announce_coordinator(
        &self,
        c: &CoordinatorRecord,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Every coordinator that ever announced itself on the ledger, with how long each has
    /// been silent.
    fn coordinators(&self) -> impl Future<Output = Result<Vec<CoordinatorRecord>>> + Send;
    /// Keep a deployed document — a task's graph, a pipeline's manifest — under its hash, so
    /// every coordinator on the ledger can run it.
    fn put_task(&self, id: &str, body: &[u8], at: i64) -> impl Future<Output = Result<()>> + Send;
    fn task(&self, id: &str) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
    /// A small blob recorded with a job ([`Ledger::create_job`]).
    fn blob(&self, hash: &str) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
    /// Tie a caller's idempotency `key` to `job_id` unless it is tied already; the job the key
    /// names afterwards (`job_id`, or the one an earlier submission tied it to). Atomic: of
    /// two submissions racing with one key, on any coordinators sharing the ledger, one wins.
    fn claim_idempotency_key(
        &self,
        key: &str,
        job_id: &str,
        at: i64,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Move `key` from `from` (a job that was never created: its coordinator died between
    /// claiming the key and recording the job) to `to`; whether it moved (false: someone else
    /// moved it first, or it no longer names `from`).
    fn take_over_idempotency_key(
        &self,
        key: &str,
        from: &str,
        to: &str,
    ) -> impl Future<Output = Result<bool>> + Send;
}
