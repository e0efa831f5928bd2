//! The ledger on SQL: SQLite or PostgreSQL through sqlx's `Any` driver, one set of queries
//! (numbered `$n` parameters, which both accept).

use std::sync::Once;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::schema::{Dialect, migrations, now_ms};
use crate::{
    Assignment, AssignmentState, BONDED, CoordinatorRecord, DISAGREED, JobRecord, JobState, Ledger,
    LedgerError, NodeLimits, NodeRecord, NodeState, Result, Settlement, StakeEvent, UNBONDED,
    Verdict, WITHHELD,
};

/// A query assembled only from this file's constant column lists, fixed words and parameter
/// numbers (never from data, which is always bound as a parameter).
macro_rules! sql {
    ($($t:tt)*) => {
        sqlx::AssertSqlSafe(format!($($t)*))
    };
}

mod one_trip;

/// A ledger in SQLite or PostgreSQL.
#[derive(Clone)]
pub struct SqlLedger {
    pool: AnyPool,
    dialect: Dialect,
    /// Who this handle drives jobs as, and for how long a lease lasts unrenewed: every write to
    /// a job through a leasing handle holds only while the handle holds the job's lease.
    lease: Option<Lease>,
}

#[derive(Clone, Debug)]
struct Lease {
    holder: String,
    ttl_ms: i64,
}

/// `($a, $a+1, …), (…)`: `count` rows of `width` parameters numbered from `first`, for a
/// multi-row insert or a `VALUES` list.
fn rows_from(first: usize, count: usize, width: usize) -> String {
    (0..count)
        .map(|r| {
            let cols: Vec<String> = (0..width)
                .map(|c| format!("${}", first + r * width + c))
                .collect();
            format!("({})", cols.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A job's small blobs, each hash once (a multi-row insert may not name a key twice).
fn distinct_blobs(blobs: &[(String, Vec<u8>)]) -> Vec<&(String, Vec<u8>)> {
    let mut distinct: Vec<&(String, Vec<u8>)> = blobs.iter().collect();
    distinct.sort_by(|a, b| a.0.cmp(&b.0));
    distinct.dedup_by(|a, b| a.0 == b.0);
    distinct
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Binds a fence's holder (the last parameter of a fenced statement) when the handle leases:
/// a statement without a fence has no parameter for it.
trait BindHolder {
    fn bind_holder(self, ledger: &SqlLedger) -> Self;
}

impl BindHolder for AnyQuery<'_> {
    fn bind_holder(self, ledger: &SqlLedger) -> Self {
        match &ledger.lease {
            Some(l) => self.bind(l.holder.clone()),
            None => self,
        }
    }
}

/// Binds a new job's row as `$1 … $15`: its columns in [`JOB_COLS`] order, then its lease
/// holder and the lease's length (none and 0 for a handle that does not lease), as both ways
/// of recording a job insert it.
trait BindNewJob<'q> {
    fn bind_new_job(self, ledger: &SqlLedger, j: &'q JobRecord) -> Self;
}

impl<'q> BindNewJob<'q> for AnyQuery<'q> {
    fn bind_new_job(self, ledger: &SqlLedger, j: &'q JobRecord) -> Self {
        let (holder, ttl) = match &ledger.lease {
            Some(l) => (Some(l.holder.clone()), l.ttl_ms),
            None => (None, 0),
        };
        self.bind(&j.id)
            .bind(&j.task)
            .bind(j.weights.clone())
            .bind(&j.inputs)
            .bind(&j.tier)
            .bind(j.seed)
            .bind(j.replicas)
            .bind(j.state.as_str())
            .bind(j.created_at)
            .bind(j.updated_at)
            .bind(j.output_hash.clone())
            .bind(j.receipt.clone())
            .bind(j.error.clone())
            .bind(holder)
            .bind(ttl)
    }
}

/// An insert of job `j` that failed: a conflict when its id is taken.
fn job_taken(j: &JobRecord, e: sqlx::Error) -> LedgerError {
    match e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            LedgerError::Conflict(format!("job {} exists", j.id))
        }
        e => e.into(),
    }
}

/// The states of a job someone must still drive, as SQL.
const UNFINISHED: &str = "('pending', 'committing', 'revealing')";

static DRIVERS: Once = Once::new();

/// How long a pooled connection may sit idle before it is checked again on its next use.
const IDLE_CHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

impl SqlLedger {
    /// Connect to `url` (`sqlite://PATH`, created if missing, or `postgres://…`) and bring the
    /// schema up to date.
    pub async fn connect(url: &str) -> Result<SqlLedger> {
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let (dialect, url) = if let Some(path) = url.strip_prefix("sqlite://") {
            let sep = if path.contains('?') { '&' } else { '?' };
            (Dialect::Sqlite, format!("sqlite://{path}{sep}mode=rwc"))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Dialect::Postgres, url.to_string())
        } else {
            return Err(LedgerError::BadUrl(url.to_string()));
        };
        // A connection is checked (a round trip) only when it has been idle a while — a server
        // restart or timeout may have closed it — not before every statement, which doubled
        // the round trips of a coordinator under load.
        let mut options = AnyPoolOptions::new()
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > IDLE_CHECK_AFTER {
                        use sqlx::Connection;
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            });
        if dialect == Dialect::Sqlite {
            // Every connection waits for the writer instead of failing, and commits reach the
            // disk before they return: an acknowledged job is never lost.
            options = options.max_connections(4).after_connect(|conn, _| {
                Box::pin(async move {
                    for pragma in [
                        "PRAGMA busy_timeout = 10000",
                        "PRAGMA foreign_keys = ON",
                        "PRAGMA synchronous = FULL",
                    ] {
                        sqlx::query(pragma).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            });
        } else {
            options = options.max_connections(8);
        }
        let pool = options.connect(&url).await?;
        if dialect == Dialect::Sqlite {
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        let ledger = SqlLedger {
            pool,
            dialect,
            lease: None,
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// This handle drives jobs as `holder` (unique to one process: two processes must never
    /// share one), its leases lasting `ttl` unless renewed. Jobs it creates are leased to it;
    /// every later write to a job — its replicas, commitments, reveals, settlement or failure —
    /// takes effect only while `holder` holds the job's unexpired lease, and is otherwise
    /// refused with [`LedgerError::LeaseLost`].
    pub fn leasing(mut self, holder: &str, ttl: std::time::Duration) -> SqlLedger {
        self.lease = Some(Lease {
            holder: holder.to_string(),
            ttl_ms: ttl.as_millis().clamp(1, i64::MAX as u128) as i64,
        });
        self
    }

    /// The ledger's clock expression.
    fn now_ms(&self) -> &'static str {
        now_ms(self.dialect)
    }

    /// The condition that the job in `jobs` (its row in scope) is leased to this handle now,
    /// with the holder bound as parameter `$n`: empty for a handle that does not lease.
    fn fence(&self, n: usize) -> String {
        match &self.lease {
            None => String::new(),
            Some(_) => format!(
                " AND lease_holder = ${n} AND lease_until > {}",
                self.now_ms()
            ),
        }
    }

    /// The same condition for a statement on `assignments`, whose job is `job_id` (`$j`).
    fn fence_job(&self, j: usize, n: usize) -> String {
        match &self.lease {
            None => String::new(),
            Some(_) => format!(
                " AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = ${j} AND jobs.lease_holder = ${n} AND jobs.lease_until > {})",
                self.now_ms()
            ),
        }
    }

    /// Why a fenced write to `job_id` touched nothing: the lease is not this handle's (or
    /// lapsed), or — when it is — `otherwise`.
    async fn refused(&self, job_id: &str, otherwise: LedgerError) -> LedgerError {
        let Some(lease) = &self.lease else {
            return otherwise;
        };
        let held = sqlx::query(sql!(
            "SELECT lease_holder, lease_until > {} AS live FROM jobs WHERE id = $1",
            self.now_ms()
        ))
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await;
        match held {
            Ok(Some(row)) => {
                let holder: Option<String> = row.try_get("lease_holder").ok().flatten();
                let live = row
                    .try_get::<bool, _>("live")
                    .or_else(|_| row.try_get::<i64, _>("live").map(|v| v != 0))
                    .unwrap_or(false);
                if holder.as_deref() == Some(lease.holder.as_str()) && live {
                    otherwise
                } else {
                    LedgerError::LeaseLost {
                        job: job_id.to_string(),
                        holder: holder.unwrap_or_default(),
                    }
                }
            }
            Ok(None) => LedgerError::NotFound(format!("job {job_id}")),
            Err(e) => e.into(),
        }
    }

    async fn migrate(&self) -> Result<()> {
        // Coordinators that start together on one PostgreSQL ledger take turns: each
        // migration's transaction holds an advisory lock, so one applies it and the others
        // find it applied.
        let lock = match self.dialect {
            Dialect::Postgres => Some("SELECT pg_advisory_xact_lock(7283710511)"),
            Dialect::Sqlite => None,
        };
        {
            let mut tx = self.pool.begin().await?;
            if let Some(lock) = lock {
                sqlx::query(lock).execute(&mut *tx).await?;
            }
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS ledger_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
            )
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        }
        for (version, statements) in migrations(self.dialect) {
            let mut tx = self.pool.begin().await?;
            match lock {
                Some(lock) => {
                    sqlx::query(lock).execute(&mut *tx).await?;
                }
                None => {
                    // Write first, so this transaction waits for the writer lock instead of
                    // failing as busy when another process migrates at the same moment.
                    sqlx::query(
                        "UPDATE ledger_migrations SET applied_at = applied_at WHERE version = -1",
                    )
                    .execute(&mut *tx)
                    .await?;
                }
            }
            let done: Option<i64> =
                sqlx::query_scalar("SELECT version FROM ledger_migrations WHERE version = $1")
                    .bind(version)
                    .fetch_optional(&mut *tx)
                    .await?;
            if done.is_some() {
                continue;
            }
            for s in statements {
                sqlx::query(s).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO ledger_migrations (version, applied_at) VALUES ($1, $2)")
                .bind(version)
                .bind(now())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(())
    }

    /// The schema version in force.
    pub async fn schema_version(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM ledger_migrations")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// SQLite's journal mode (`wal` for a ledger this crate opened).
    pub async fn journal_mode(&self) -> Result<String> {
        Ok(sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Run one administrative statement (such as `CREATE DATABASE`) on a server URL; for
    /// tests and setup tools.
    pub async fn admin_execute(url: &str, statement: &str) -> Result<()> {
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(&pool)
            .await?;
        pool.close().await;
        Ok(())
    }

    /// Create a fresh, uniquely named database `{prefix}_{pid}_{nanos}` on the server that
    /// `admin_url` points at, and return its URL; for tests.
    pub async fn create_scratch_database(admin_url: &str, prefix: &str) -> Result<String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{prefix}_{}_{}", std::process::id(), nanos % 1_000_000_000);
        Self::admin_execute(admin_url, &format!("CREATE DATABASE {name}")).await?;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(b, _)| b);
        Ok(format!("{base}/{name}"))
    }

    /// Close every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub fn dialect_name(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn node_row(r: &AnyRow) -> Result<NodeRecord> {
    Ok(NodeRecord {
        id: r.try_get("id")?,
        url: r.try_get("url")?,
        stake: r.try_get("stake")?,
        state: NodeState::parse(&r.try_get::<String, _>("state")?)?,
        registered_at: r.try_get("registered_at")?,
        last_heartbeat: r.try_get("last_heartbeat")?,
        agreed: r.try_get("agreed")?,
        disagreed: r.try_get("disagreed")?,
        score_sum: r.try_get("score_sum")?,
        operator: r.try_get("operator")?,
        memory_limit: r.try_get("memory_limit")?,
        max_flops: r.try_get("max_flops")?,
        device: r.try_get("device")?,
        exact: r.try_get::<i64, _>("exact")? != 0,
    })
}

fn job_row(r: &AnyRow) -> Result<JobRecord> {
    Ok(JobRecord {
        id: r.try_get("id")?,
        task: r.try_get("task")?,
        weights: r.try_get("weights")?,
        inputs: r.try_get("inputs")?,
        tier: r.try_get("tier")?,
        seed: r.try_get("seed")?,
        replicas: r.try_get("replicas")?,
        state: JobState::parse(&r.try_get::<String, _>("state")?)?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        output_hash: r.try_get("output_hash")?,
        receipt: r.try_get("receipt")?,
        error: r.try_get("error")?,
    })
}

fn assignment_row(r: &AnyRow) -> Result<Assignment> {
    Ok(Assignment {
        job_id: r.try_get("job_id")?,
        node_id: r.try_get("node_id")?,
        state: AssignmentState::parse(&r.try_get::<String, _>("state")?)?,
        commitment: r.try_get("commitment")?,
        output_hash: r.try_get("output_hash")?,
        salt: r.try_get("salt")?,
    })
}

const NODE_COLS: &str = "id, url, stake, state, registered_at, last_heartbeat, agreed, disagreed, score_sum, operator, memory_limit, max_flops, device, exact";
const JOB_COLS: &str = "id, task, weights, inputs, tier, seed, replicas, state, created_at, updated_at, output_hash, receipt, error";

impl SqlLedger {
    /// Update one assignment from `from` to `to` (with extra columns), or say why not.
    async fn move_assignment(
        &self,
        job_id: &str,
        node_id: &str,
        from: AssignmentState,
        to: AssignmentState,
        commitment: Option<&str>,
        reveal: Option<(&str, &str)>,
    ) -> Result<()> {
        let done = sqlx::query(sql!(
            "UPDATE assignments SET state = $1,
                commitment = COALESCE($2, commitment),
                output_hash = COALESCE($3, output_hash),
                salt = COALESCE($4, salt)
             WHERE job_id = $5 AND node_id = $6 AND state = $7{}",
            self.fence_job(5, 8)
        ))
        .bind(to.as_str())
        .bind(commitment.map(str::to_string))
        .bind(reveal.map(|r| r.0.to_string()))
        .bind(reveal.map(|r| r.1.to_string()))
        .bind(job_id)
        .bind(node_id)
        .bind(from.as_str())
        .bind_holder(self)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM assignments WHERE job_id = $1 AND node_id = $2")
                .bind(job_id)
                .bind(node_id)
                .fetch_optional(&self.pool)
                .await?;
        match state {
            None => Err(LedgerError::NotFound(format!(
                "assignment of job {job_id} to node {node_id}"
            ))),
            Some(s) if s != from.as_str() => Err(LedgerError::Conflict(format!(
                "job {job_id} on node {node_id} is {s}, not {}",
                from.as_str()
            ))),
            Some(_) => Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} on node {node_id} did not move")),
                )
                .await),
        }
    }
}

fn check_fraction(fraction: f64) -> Result<()> {
    if (0.0..=1.0).contains(&fraction) {
        Ok(())
    } else {
        Err(LedgerError::Conflict(format!(
            "a slash takes a fraction in [0, 1], not {fraction}"
        )))
    }
}

type Tx<'c> = sqlx::Transaction<'c, sqlx::Any>;

/// Take `fraction` of a node's stake (rounded down) inside `tx`; returns the amount.
async fn slash_in(
    tx: &mut Tx<'_>,
    node_id: &str,
    job_id: &str,
    fraction: f64,
    reason: &str,
    at: i64,
) -> Result<i64> {
    // Write first, so the transaction holds the writer lock before it reads the stake.
    sqlx::query("UPDATE nodes SET stake = stake WHERE id = $1")
        .bind(node_id)
        .execute(&mut **tx)
        .await?;
    let stake: Option<i64> = sqlx::query_scalar("SELECT stake FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(&mut **tx)
        .await?;
    let stake = stake.ok_or_else(|| LedgerError::NotFound(format!("node {node_id}")))?;
    let amount = (stake as f64 * fraction).floor() as i64;
    move_stake(tx, node_id, Some(job_id), -amount, reason, at).await?;
    Ok(amount)
}

/// Add `delta` to a node's stake inside `tx`, with its stake event (for a job, or none).
async fn move_stake(
    tx: &mut Tx<'_>,
    node_id: &str,
    job_id: Option<&str>,
    delta: i64,
    reason: &str,
    at: i64,
) -> Result<()> {
    let r = sqlx::query("UPDATE nodes SET stake = stake + $1 WHERE id = $2")
        .bind(delta)
        .bind(node_id)
        .execute(&mut **tx)
        .await?;
    if r.rows_affected() == 0 {
        return Err(LedgerError::NotFound(format!("node {node_id}")));
    }
    sqlx::query(
        "INSERT INTO stake_events (node_id, job_id, delta, reason, at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(node_id)
    .bind(job_id.map(str::to_string))
    .bind(delta)
    .bind(reason)
    .bind(at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl SqlLedger {
    /// [`Ledger::create_keyed_job`] in a transaction, a statement per table (SQLite).
    async fn create_job_stepwise(
        &self,
        j: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
        key: Option<&str>,
    ) -> Result<Option<String>> {
        // Write first: a SQLite transaction that reads before it writes cannot wait for the
        // writer lock (it fails at once as busy when another writer got in between).
        let mut tx = self.pool.begin().await?;
        if let Some(key) = key {
            let tied: Option<String> = sqlx::query_scalar(
                "INSERT INTO idempotency (key, job_id, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING RETURNING job_id",
            )
            .bind(key)
            .bind(&j.id)
            .bind(j.created_at)
            .fetch_optional(&mut *tx)
            .await?;
            if tied.is_none() {
                drop(tx);
                return self.key_holder(key).await.map(Some);
            }
        }
        sqlx::query(sql!(
            "INSERT INTO jobs ({JOB_COLS}, lease_holder, lease_until) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, {} + $15)",
            self.now_ms()
        ))
        .bind_new_job(self, j)
        .execute(&mut *tx)
        .await
        .map_err(|e| job_taken(j, e))?;
        // One statement for all the replicas, one for all the blobs: every statement is a round
        // trip to the database, and a job's admission is on every call's path.
        if !nodes.is_empty() {
            let mut q = sqlx::query(sql!(
                "INSERT INTO assignments (job_id, node_id, state) VALUES {}",
                rows_from(1, nodes.len(), 3)
            ));
            for n in nodes {
                q = q
                    .bind(&j.id)
                    .bind(n)
                    .bind(AssignmentState::Assigned.as_str());
            }
            q.execute(&mut *tx).await?;
        }
        let distinct = distinct_blobs(blobs);
        if !distinct.is_empty() {
            let mut q = sqlx::query(sql!(
                "INSERT INTO blobs (hash, body) VALUES {} ON CONFLICT (hash) DO NOTHING",
                rows_from(1, distinct.len(), 2)
            ));
            for (hash, body) in distinct {
                q = q.bind(hash).bind(body.clone());
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(None)
    }

    /// The job idempotency `key` names.
    async fn key_holder(&self, key: &str) -> Result<String> {
        Ok(
            sqlx::query_scalar("SELECT job_id FROM idempotency WHERE key = $1")
                .bind(key)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}

impl Ledger for SqlLedger {
    fn lease_holder(&self) -> Option<&str> {
        self.lease.as_ref().map(|l| l.holder.as_str())
    }

    async fn register_node(&self, n: &NodeRecord) -> Result<()> {
        if n.stake < 0 {
            return Err(LedgerError::Conflict(format!(
                "node {} cannot start with a negative stake",
                n.id
            )));
        }
        let mut tx = self.pool.begin().await?;
        // Write first, so the transaction holds the writer lock before it reads the node.
        sqlx::query("UPDATE nodes SET url = url WHERE id = $1")
            .bind(&n.id)
            .execute(&mut *tx)
            .await?;
        let existing: Option<String> = sqlx::query_scalar("SELECT state FROM nodes WHERE id = $1")
            .bind(&n.id)
            .fetch_optional(&mut *tx)
            .await?;
        match existing.as_deref().map(NodeState::parse).transpose()? {
            Some(NodeState::Deregistered) => {
                // Coming back keeps the stake it had: leaving and rejoining must not undo a
                // slash or raise a stake that only the admin bonds.
                sqlx::query(
                    "UPDATE nodes SET url = $2, state = $3, registered_at = $4, last_heartbeat = $5, memory_limit = $6, max_flops = $7, device = $8, exact = $9 WHERE id = $1",
                )
                .bind(&n.id)
                .bind(&n.url)
                .bind(n.state.as_str())
                .bind(n.registered_at)
                .bind(n.last_heartbeat)
                .bind(n.memory_limit)
                .bind(n.max_flops)
                .bind(&n.device)
                .bind(n.exact as i64)
                .execute(&mut *tx)
                .await?;
            }
            Some(_) => {
                return Err(LedgerError::Conflict(format!(
                    "node {} is already registered",
                    n.id
                )));
            }
            None => {
                sqlx::query(
                    "INSERT INTO nodes (id, url, stake, state, registered_at, last_heartbeat, operator, memory_limit, max_flops, device, exact) VALUES ($1, $2, 0, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&n.id)
                .bind(&n.url)
                .bind(n.state.as_str())
                .bind(n.registered_at)
                .bind(n.last_heartbeat)
                .bind(&n.operator)
                .bind(n.memory_limit)
                .bind(n.max_flops)
                .bind(&n.device)
                .bind(n.exact as i64)
                .execute(&mut *tx)
                .await?;
                if n.stake > 0 {
                    move_stake(&mut tx, &n.id, None, n.stake, BONDED, n.registered_at).await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn bond(
        &self,
        id: &str,
        delta: i64,
        operator: Option<&str>,
        at: i64,
    ) -> Result<NodeRecord> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query("UPDATE nodes SET operator = COALESCE($1, operator) WHERE id = $2")
            .bind(operator.map(str::to_string))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() == 0 {
            return Err(LedgerError::NotFound(format!("node {id}")));
        }
        let stake: i64 = sqlx::query_scalar("SELECT stake FROM nodes WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let after = stake.checked_add(delta).filter(|s| *s >= 0).ok_or_else(|| {
            LedgerError::Conflict(format!(
                "node {id} has a stake of {stake}: {delta} would take it below zero or past the largest stake"
            ))
        })?;
        if delta != 0 {
            let reason = if delta > 0 { BONDED } else { UNBONDED };
            move_stake(&mut tx, id, None, delta, reason, at).await?;
        }
        let node = sqlx::query(sql!("SELECT {NODE_COLS} FROM nodes WHERE id = $1"))
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let node = node_row(&node)?;
        debug_assert_eq!(node.stake, after);
        Ok(node)
    }

    async fn set_node_limits(&self, id: &str, limits: &NodeLimits) -> Result<()> {
        let r = sqlx::query(
            "UPDATE nodes SET memory_limit = $1, max_flops = $2, device = $3, exact = $4 WHERE id = $5",
        )
        .bind(limits.memory_limit)
        .bind(limits.max_flops)
        .bind(&limits.device)
        .bind(limits.exact as i64)
        .bind(id)
            .execute(&self.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(LedgerError::NotFound(format!("node {id}")));
        }
        Ok(())
    }

    async fn set_node_state(&self, id: &str, state: NodeState) -> Result<()> {
        let r = sqlx::query("UPDATE nodes SET state = $1 WHERE id = $2")
            .bind(state.as_str())
            .bind(id)
            .execute(&self.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(LedgerError::NotFound(format!("node {id}")));
        }
        Ok(())
    }

    async fn heartbeat(&self, id: &str, at: i64) -> Result<()> {
        let r = sqlx::query("UPDATE nodes SET last_heartbeat = $1 WHERE id = $2")
            .bind(at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(LedgerError::NotFound(format!("node {id}")));
        }
        Ok(())
    }

    async fn node(&self, id: &str) -> Result<Option<NodeRecord>> {
        sqlx::query(sql!("SELECT {NODE_COLS} FROM nodes WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(node_row)
            .transpose()
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        sqlx::query(sql!(
            "SELECT {NODE_COLS} FROM nodes ORDER BY registered_at, id"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(node_row)
        .collect()
    }

    async fn create_job(
        &self,
        j: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
    ) -> Result<()> {
        match self.dialect {
            Dialect::Postgres => self.create_job_at_once(j, nodes, blobs, None).await?,
            Dialect::Sqlite => self.create_job_stepwise(j, nodes, blobs, None).await?,
        };
        Ok(())
    }

    async fn create_keyed_job(
        &self,
        j: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
        key: &str,
    ) -> Result<Option<String>> {
        match self.dialect {
            Dialect::Postgres => self.create_job_at_once(j, nodes, blobs, Some(key)).await,
            Dialect::Sqlite => self.create_job_stepwise(j, nodes, blobs, Some(key)).await,
        }
    }

    async fn assign(&self, job_id: &str, node_id: &str) -> Result<()> {
        let r = sqlx::query(sql!(
            "INSERT INTO assignments (job_id, node_id, state) SELECT $1, $2, $3 WHERE 1 = 1{}",
            self.fence_job(1, 4)
        ))
        .bind(job_id)
        .bind(node_id)
        .bind(AssignmentState::Assigned.as_str())
        .bind_holder(self)
        .execute(&self.pool)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.is_unique_violation() => LedgerError::Conflict(format!(
                "job {job_id} is already assigned to node {node_id}"
            )),
            e => e.into(),
        })?;
        if r.rows_affected() != 1 {
            return Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} cannot take node {node_id}")),
                )
                .await);
        }
        Ok(())
    }

    async fn advance_job(&self, job_id: &str, from: JobState, to: JobState, at: i64) -> Result<()> {
        let r = sqlx::query(sql!(
            "UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3 AND state = $4{}",
            self.fence(5)
        ))
        .bind(to.as_str())
        .bind(at)
        .bind(job_id)
        .bind(from.as_str())
        .bind_holder(self)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 1 {
            return Ok(());
        }
        match self.job(job_id).await? {
            None => Err(LedgerError::NotFound(format!("job {job_id}"))),
            Some(j) if j.state != from => Err(LedgerError::Conflict(format!(
                "job {job_id} is {}, not {}",
                j.state.as_str(),
                from.as_str()
            ))),
            Some(_) => Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} did not move")),
                )
                .await),
        }
    }

    async fn record_commitment(&self, job_id: &str, node_id: &str, commitment: &str) -> Result<()> {
        self.move_assignment(
            job_id,
            node_id,
            AssignmentState::Assigned,
            AssignmentState::Committed,
            Some(commitment),
            None,
        )
        .await
    }

    async fn record_commitments(
        &self,
        job_id: &str,
        commitments: &[(String, String)],
        at: i64,
    ) -> Result<()> {
        if self.dialect == Dialect::Postgres
            && !commitments.is_empty()
            && self
                .record_commitments_at_once(job_id, commitments, at)
                .await?
        {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(sql!(
            "UPDATE jobs SET state = $1, updated_at = $2 WHERE id = $3 AND state IN ('pending', 'committing'){}",
            self.fence(4)
        ))
        .bind(JobState::Revealing.as_str())
        .bind(at)
        .bind(job_id)
        .bind_holder(self)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            drop(tx);
            return Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} is unknown or not committing")),
                )
                .await);
        }
        // All the replicas' commitments in one statement (one round trip, not one each).
        if !commitments.is_empty() {
            let values: Vec<String> = (0..commitments.len())
                .map(|i| format!("(${}, ${})", 4 + 2 * i, 5 + 2 * i))
                .collect();
            let mut q = sqlx::query(sql!(
                "UPDATE assignments SET state = $1, commitment = v.column2 FROM (VALUES {}) AS v
                 WHERE assignments.job_id = $2 AND assignments.node_id = v.column1 AND assignments.state = $3",
                values.join(", ")
            ))
            .bind(AssignmentState::Committed.as_str())
            .bind(job_id)
            .bind(AssignmentState::Assigned.as_str());
            for (node_id, commitment) in commitments {
                q = q.bind(node_id).bind(commitment);
            }
            let r = q.execute(&mut *tx).await?;
            if r.rows_affected() != commitments.len() as u64 {
                drop(tx);
                let asg = self.assignments(job_id).await?;
                let node = commitments
                    .iter()
                    .map(|(n, _)| n)
                    .find(|n| {
                        !asg.iter()
                            .any(|a| &a.node_id == *n && a.state == AssignmentState::Assigned)
                    })
                    .map_or("?", |n| n.as_str());
                return Err(LedgerError::Conflict(format!(
                    "job {job_id} has no assigned replica on node {node}"
                )));
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_reveal(
        &self,
        job_id: &str,
        node_id: &str,
        output_hash: &str,
        salt: &str,
    ) -> Result<()> {
        self.move_assignment(
            job_id,
            node_id,
            AssignmentState::Committed,
            AssignmentState::Revealed,
            None,
            Some((output_hash, salt)),
        )
        .await
    }

    async fn fail_assignment(&self, job_id: &str, node_id: &str) -> Result<()> {
        let r = sqlx::query(sql!(
            "UPDATE assignments SET state = $1 WHERE job_id = $2 AND node_id = $3 AND state IN ('assigned', 'committed', 'revealed'){}",
            self.fence_job(2, 4)
        ))
        .bind(AssignmentState::Failed.as_str())
        .bind(job_id)
        .bind(node_id)
        .bind_holder(self)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() == 0 {
            return Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!(
                        "job {job_id} on node {node_id} cannot fail now (unknown, failed or judged)"
                    )),
                )
                .await);
        }
        Ok(())
    }

    async fn decide_job(&self, job_id: &str, s: &Settlement<'_>) -> Result<Vec<(String, i64)>> {
        check_fraction(s.slash_fraction)?;
        let all_agreed =
            !s.verdicts.is_empty() && s.verdicts.iter().all(|v| v.agreed && v.score.is_finite());
        if self.dialect == Dialect::Postgres
            && all_agreed
            && self.settle_agreed_at_once(job_id, s).await?
        {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        // The lease is checked in the same statement that decides: a coordinator whose lease
        // lapsed (another may be driving the job now) cannot settle it, and of two that race,
        // the one whose update lands second finds the job decided.
        let r = sqlx::query(sql!(
            "UPDATE jobs SET state = $1, output_hash = $2, receipt = $3, updated_at = $4
             WHERE id = $5 AND state IN {UNFINISHED}{}",
            self.fence(6)
        ))
        .bind(JobState::Decided.as_str())
        .bind(s.output_hash)
        .bind(s.receipt)
        .bind(s.at)
        .bind(job_id)
        .bind_holder(self)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            drop(tx);
            return Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} is unknown or already finished")),
                )
                .await);
        }
        // Each judged replica in one statement: its reveal (when not recorded yet) and verdict.
        let reveal_of: std::collections::HashMap<&str, (&str, &str)> = s
            .reveals
            .iter()
            .map(|(n, h, salt)| (n.as_str(), (h.as_str(), salt.as_str())))
            .collect();
        for (node_id, output_hash, salt) in s.reveals {
            if !s.verdicts.iter().any(|v| &v.node_id == node_id) {
                sqlx::query(
                    "UPDATE assignments SET state = $1, output_hash = $2, salt = $3 WHERE job_id = $4 AND node_id = $5 AND state = $6",
                )
                .bind(AssignmentState::Revealed.as_str())
                .bind(output_hash)
                .bind(salt)
                .bind(job_id)
                .bind(node_id)
                .bind(AssignmentState::Committed.as_str())
                .execute(&mut *tx)
                .await?;
            }
        }
        for v in s.verdicts {
            let state = if v.agreed {
                AssignmentState::Agreed
            } else {
                AssignmentState::Disagreed
            };
            let reveal = reveal_of.get(v.node_id.as_str());
            sqlx::query(
                "UPDATE assignments SET state = $1, output_hash = COALESCE($2, output_hash), salt = COALESCE($3, salt) WHERE job_id = $4 AND node_id = $5",
            )
            .bind(state.as_str())
            .bind(reveal.map(|r| r.0.to_string()))
            .bind(reveal.map(|r| r.1.to_string()))
            .bind(job_id)
            .bind(&v.node_id)
            .execute(&mut *tx)
            .await?;
        }
        // The credits' stake events in one statement, before any node row is touched: every
        // settlement updates the same few nodes' rows, so they are locked last, for as short a
        // time as can be, and in one order (by id) so that settlements never deadlock.
        let credited: Vec<&Verdict> = s.verdicts.iter().filter(|v| v.agreed).collect();
        if !credited.is_empty() {
            let mut q = sqlx::query(sql!(
                "INSERT INTO stake_events (node_id, job_id, delta, reason, at) VALUES {}",
                rows_from(1, credited.len(), 5)
            ));
            for v in &credited {
                q = q
                    .bind(&v.node_id)
                    .bind(job_id)
                    .bind(s.reward)
                    .bind("credit")
                    .bind(s.at);
            }
            q.execute(&mut *tx).await?;
        }
        let mut by_id: Vec<&Verdict> = s.verdicts.iter().collect();
        by_id.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let mut slashed = Vec::new();
        for v in by_id {
            if v.agreed {
                let r = sqlx::query(
                    "UPDATE nodes SET agreed = agreed + 1, score_sum = score_sum + $1, stake = stake + $2 WHERE id = $3",
                )
                .bind(v.score)
                .bind(s.reward)
                .bind(&v.node_id)
                .execute(&mut *tx)
                .await?;
                if r.rows_affected() == 0 {
                    return Err(LedgerError::NotFound(format!("node {}", v.node_id)));
                }
            } else {
                sqlx::query(
                    "UPDATE nodes SET disagreed = disagreed + 1, score_sum = score_sum + $1 WHERE id = $2",
                )
                .bind(v.score)
                .bind(&v.node_id)
                .execute(&mut *tx)
                .await?;
                let reason = if v.withheld { WITHHELD } else { DISAGREED };
                let amount =
                    slash_in(&mut tx, &v.node_id, job_id, s.slash_fraction, reason, s.at).await?;
                slashed.push((v.node_id.clone(), amount));
            }
        }
        tx.commit().await?;
        Ok(slashed)
    }

    async fn fail_job(&self, job_id: &str, error: &str, at: i64) -> Result<()> {
        let r = sqlx::query(sql!(
            "UPDATE jobs SET state = $1, error = $2, updated_at = $3
             WHERE id = $4 AND state IN {UNFINISHED}{}",
            self.fence(5)
        ))
        .bind(JobState::Failed.as_str())
        .bind(error)
        .bind(at)
        .bind(job_id)
        .bind_holder(self)
        .execute(&self.pool)
        .await?;
        if r.rows_affected() != 1 {
            return Err(self
                .refused(
                    job_id,
                    LedgerError::Conflict(format!("job {job_id} is unknown or already finished")),
                )
                .await);
        }
        Ok(())
    }

    async fn slash(
        &self,
        node_id: &str,
        job_id: &str,
        fraction: f64,
        reason: &str,
        at: i64,
    ) -> Result<i64> {
        check_fraction(fraction)?;
        let mut tx = self.pool.begin().await?;
        let amount = slash_in(&mut tx, node_id, job_id, fraction, reason, at).await?;
        tx.commit().await?;
        Ok(amount)
    }

    async fn credit(&self, node_id: &str, job_id: &str, amount: i64, at: i64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        move_stake(&mut tx, node_id, Some(job_id), amount, "credit", at).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn job(&self, id: &str) -> Result<Option<JobRecord>> {
        sqlx::query(sql!("SELECT {JOB_COLS} FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(job_row)
            .transpose()
    }

    async fn jobs(&self, limit: i64) -> Result<Vec<JobRecord>> {
        sqlx::query(sql!(
            "SELECT {JOB_COLS} FROM jobs ORDER BY created_at DESC, id DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_row)
        .collect()
    }

    async fn unfinished_jobs(&self) -> Result<Vec<JobRecord>> {
        sqlx::query(sql!(
            "SELECT {JOB_COLS} FROM jobs WHERE state IN {UNFINISHED} ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_row)
        .collect()
    }

    async fn assignments(&self, job_id: &str) -> Result<Vec<Assignment>> {
        sqlx::query(
            "SELECT job_id, node_id, state, commitment, output_hash, salt FROM assignments WHERE job_id = $1 ORDER BY node_id",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(assignment_row)
        .collect()
    }

    async fn stake_events(&self, node_id: &str) -> Result<Vec<StakeEvent>> {
        sqlx::query(
            "SELECT node_id, job_id, delta, reason, at FROM stake_events WHERE node_id = $1 ORDER BY seq",
        )
        .bind(node_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(stake_event)
        .collect()
    }

    async fn job_stake_events(&self, job_id: &str) -> Result<Vec<StakeEvent>> {
        sqlx::query(
            "SELECT node_id, job_id, delta, reason, at FROM stake_events WHERE job_id = $1 ORDER BY seq",
        )
        .bind(job_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(stake_event)
        .collect()
    }

    async fn claim_idempotency_key(&self, key: &str, job_id: &str, at: i64) -> Result<String> {
        // Both dialects take ON CONFLICT DO NOTHING: the first insert wins, and everyone reads
        // the winner back.
        let tied: Option<String> = sqlx::query_scalar(
            "INSERT INTO idempotency (key, job_id, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING RETURNING job_id",
        )
        .bind(key)
        .bind(job_id)
        .bind(at)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(tied) = tied {
            return Ok(tied);
        }
        self.key_holder(key).await
    }

    async fn take_over_idempotency_key(&self, key: &str, from: &str, to: &str) -> Result<bool> {
        let r = sqlx::query("UPDATE idempotency SET job_id = $1 WHERE key = $2 AND job_id = $3")
            .bind(to)
            .bind(key)
            .bind(from)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn claim_jobs(&self, limit: i64, own: bool) -> Result<Vec<JobRecord>> {
        let Some(lease) = &self.lease else {
            // The ledger's only driver: every unfinished job is its own.
            let mut jobs = self.unfinished_jobs().await?;
            jobs.truncate(limit.max(0) as usize);
            return Ok(jobs);
        };
        let now = self.now_ms();
        let mine = if own { " OR lease_holder = $1" } else { "" };
        // PostgreSQL: claimers skip the rows another is claiming (or settling) instead of
        // waiting for them. SQLite has one writer at a time: the statement is atomic as it is.
        let skip = match self.dialect {
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let claimable = format!(
            "state IN {UNFINISHED} AND (lease_holder IS NULL OR lease_until <= {now}{mine})"
        );
        sqlx::query(sql!(
            "UPDATE jobs SET lease_holder = $1, lease_until = {now} + $2
             WHERE id IN (SELECT id FROM jobs WHERE {claimable} ORDER BY created_at, id LIMIT $3{skip})
               AND {claimable}
             RETURNING {JOB_COLS}"
        ))
        .bind(lease.holder.clone())
        .bind(lease.ttl_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_row)
        .collect()
    }

    async fn renew_leases(&self) -> Result<u64> {
        let Some(lease) = &self.lease else {
            return Ok(0);
        };
        let now = self.now_ms();
        let r = sqlx::query(sql!(
            "UPDATE jobs SET lease_until = {now} + $2
             WHERE state IN {UNFINISHED} AND lease_holder = $1 AND lease_until > {now}"
        ))
        .bind(lease.holder.clone())
        .bind(lease.ttl_ms)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn announce_coordinator(&self, c: &CoordinatorRecord) -> Result<()> {
        sqlx::query(sql!(
            "INSERT INTO coordinators (holder, key, url, started_at, seen_at) VALUES ($1, $2, $3, $4, {now})
             ON CONFLICT (holder) DO UPDATE SET key = $2, url = $3, seen_at = {now}",
            now = self.now_ms()
        ))
        .bind(&c.holder)
        .bind(&c.key)
        .bind(&c.url)
        .bind(c.started_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn coordinators(&self) -> Result<Vec<CoordinatorRecord>> {
        let rows = sqlx::query(sql!(
            "SELECT holder, key, url, started_at, {} - seen_at AS silent_ms FROM coordinators ORDER BY started_at, holder",
            self.now_ms()
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(CoordinatorRecord {
                    holder: r.try_get("holder")?,
                    key: r.try_get("key")?,
                    url: r.try_get("url")?,
                    started_at: r.try_get("started_at")?,
                    silent_ms: r.try_get("silent_ms")?,
                })
            })
            .collect()
    }

    async fn put_task(&self, id: &str, body: &[u8], at: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO tasks (id, body, deployed_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
        )
        .bind(id)
        .bind(body.to_vec())
        .bind(at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn task(&self, id: &str) -> Result<Option<Vec<u8>>> {
        Ok(sqlx::query_scalar("SELECT body FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>> {
        Ok(sqlx::query_scalar("SELECT body FROM blobs WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?)
    }
}

fn stake_event(r: &sqlx::any::AnyRow) -> Result<StakeEvent> {
    Ok(StakeEvent {
        node_id: r.try_get("node_id")?,
        job_id: r.try_get("job_id")?,
        delta: r.try_get("delta")?,
        reason: r.try_get("reason")?,
        at: r.try_get("at")?,
    })
}
