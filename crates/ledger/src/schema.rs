//! The ledger's schema, as numbered migrations applied in order at connect time and recorded in
//! `ledger_migrations`. Both dialects share the DDL except where they cannot (an auto-numbered
//! key). Never edit an applied migration; add the next one.

/// The ledger's clock in milliseconds since the Unix epoch, as SQL: leases are timed by the one
/// clock every coordinator sharing the ledger reads, not by each machine's own.
pub fn now_ms(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS BIGINT)",
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

/// Which database the SQL is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

const NODES_JOBS: &str = "
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    stake BIGINT NOT NULL,
    state TEXT NOT NULL,
    registered_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL,
    agreed BIGINT NOT NULL DEFAULT 0,
    disagreed BIGINT NOT NULL DEFAULT 0,
    score_sum DOUBLE PRECISION NOT NULL DEFAULT 0
);
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    weights TEXT,
    inputs TEXT NOT NULL,
    tier TEXT NOT NULL,
    seed BIGINT NOT NULL,
    replicas BIGINT NOT NULL,
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    output_hash TEXT,
    receipt TEXT,
    error TEXT
);
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_created ON jobs (created_at);
CREATE TABLE assignments (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    node_id TEXT NOT NULL REFERENCES nodes (id),
    state TEXT NOT NULL,
    commitment TEXT,
    output_hash TEXT,
    salt TEXT,
    PRIMARY KEY (job_id, node_id)
);
";

const STAKE_EVENTS_SQLITE: &str = "
CREATE TABLE stake_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id TEXT NOT NULL REFERENCES nodes (id),
    job_id TEXT,
    delta BIGINT NOT NULL,
    reason TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX stake_events_by_node ON stake_events (node_id);
";

const STAKE_EVENTS_POSTGRES: &str = "
CREATE TABLE stake_events (
    seq BIGSERIAL PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes (id),
    job_id TEXT,
    delta BIGINT NOT NULL,
    reason TEXT NOT NULL,
    at BIGINT NOT NULL
);
CREATE INDEX stake_events_by_node ON stake_events (node_id);
";

/// Who answers for a node's stake (the admin names the operator when bonding: replicas of one
/// job never share an operator), and the limits the node advertises (the coordinator sends a
/// job only to nodes whose limits its certificate fits).
const NODE_OPERATOR_LIMITS: &str = "
ALTER TABLE nodes ADD COLUMN operator TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN memory_limit BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN max_flops BIGINT NOT NULL DEFAULT 0
";

/// The device a node runs jobs on, as it advertises it (`gpu opencl:0`), and whether that
/// device passed its determinism check: only such nodes get exact-tier jobs.
const NODE_DEVICE: &str = "
ALTER TABLE nodes ADD COLUMN device TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN exact BIGINT NOT NULL DEFAULT 1
";

/// A job's stake events found by the job (what a job's answer lists as slashed) without
/// reading every node's history; and idempotency keys: a caller's key for a submission, the
/// job it made, so a retried call (to this coordinator or another on the same ledger) finds
/// the job instead of making a second.
const JOB_EVENTS_IDEMPOTENCY: &str = "
CREATE INDEX stake_events_by_job ON stake_events (job_id);
CREATE TABLE idempotency (
    key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    created_at BIGINT NOT NULL
)
";

/// Scale-out: several coordinators on one ledger. A job's lease (who drives it, until when on
/// the ledger's clock, in ms): a coordinator writes to a job only while it holds the lease,
/// and claims jobs whose lease lapsed. The coordinators that share the ledger (their signing
/// keys and where they listen); deployed tasks, so any coordinator can run any of them; and
/// small blobs — job inputs that travel inside run requests — so a job outlives the
/// coordinator that admitted it.
const SCALE_OUT: &str = "
ALTER TABLE jobs ADD COLUMN lease_holder TEXT;
ALTER TABLE jobs ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
CREATE TABLE coordinators (
    holder TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    url TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL
)
";

const SCALE_OUT_BLOBS_SQLITE: &str = "
CREATE TABLE tasks (id TEXT PRIMARY KEY, body BLOB NOT NULL, deployed_at BIGINT NOT NULL);
CREATE TABLE blobs (hash TEXT PRIMARY KEY, body BLOB NOT NULL)
";

const SCALE_OUT_BLOBS_POSTGRES: &str = "
CREATE TABLE tasks (id TEXT PRIMARY KEY, body BYTEA NOT NULL, deployed_at BIGINT NOT NULL);
CREATE TABLE blobs (hash TEXT PRIMARY KEY, body BYTEA NOT NULL)
";

/// Migrations in order: (version, statements for SQLite, statements for PostgreSQL).
pub fn migrations(d: Dialect) -> Vec<(i64, Vec<&'static str>)> {
    let (stake, blobs) = match d {
        Dialect::Sqlite => (STAKE_EVENTS_SQLITE, SCALE_OUT_BLOBS_SQLITE),
        Dialect::Postgres => (STAKE_EVENTS_POSTGRES, SCALE_OUT_BLOBS_POSTGRES),
    };
    vec![
        (1, statements(NODES_JOBS).chain(statements(stake)).collect()),
        (2, statements(NODE_OPERATOR_LIMITS).collect()),
        (3, statements(NODE_DEVICE).collect()),
        (4, statements(JOB_EVENTS_IDEMPOTENCY).collect()),
        (5, statements(SCALE_OUT).chain(statements(blobs)).collect()),
    ]
}

fn statements(sql: &'static str) -> impl Iterator<Item = &'static str> {
    sql.split(';').map(str::trim).filter(|s| !s.is_empty())
}
