//! A job's three writes on every call's path — its admission, its replicas' commitments, and
//! a settlement in which every judged replica agreed — each as one PostgreSQL statement
//! (data-modifying `WITH` clauses), so one round trip and one implicit transaction instead of
//! `BEGIN`, a statement per table and `COMMIT`. Every client round trip costs the coordinator
//! a send, a wake-up and a parse; at hundreds of jobs a second they were most of its work.
//!
//! Each statement does all of its work or none: its parts hang off the one that checks the
//! job (its state, its lease), and the counts it returns say whether that one matched. When it
//! did not, nothing was written, and the caller goes the step-by-step way, which says exactly
//! why (or, had the job moved on meanwhile, does what is right then). SQLite keeps the
//! step-by-step writes: its round trips are function calls.

use sqlx::Row;

use super::{BindHolder, BindNewJob, JOB_COLS, SqlLedger, distinct_blobs, rows_from};
use crate::{AssignmentState, JobRecord, JobState, Result, Settlement};

/// The class of the transaction-scoped advisory locks a one-statement settlement takes on its
/// nodes, one per node (`hashtext` of its id), in the order of their ids, before it updates
/// any node row: within one statement the planner decides when each row is locked, so two
/// settlements crediting the same nodes could lock them in opposite orders (seen: 4 deadlocks
/// in ~20,000 under `tenet bench load`). The advisory locks queue them in one order instead.
/// (The two-key form shares no key space with the migrations' one-key lock.)
const NODE_LOCKS: i32 = 0x7465_6e74;

/// PostgreSQL's SQLSTATE for a transaction rolled back to break a deadlock.
const DEADLOCK: &str = "40P01";

impl SqlLedger {
    /// The job, its replicas, its small inputs and the caller's idempotency key in one
    /// statement: the job is recorded only if the key was free (`None`); else the job the key
    /// names. A job id already taken is a conflict, as in the step-by-step way.
    pub(super) async fn create_job_at_once(
        &self,
        j: &JobRecord,
        nodes: &[String],
        blobs: &[(String, Vec<u8>)],
        key: Option<&str>,
    ) -> Result<Option<String>> {
        let distinct = distinct_blobs(blobs);
        // $1 … $15: the job; $16: the key (when there is one); then the replicas and blobs.
        let mut parts = Vec::new();
        let mut next = 16;
        let tied = if key.is_some() {
            parts.push(
                "k AS (INSERT INTO idempotency (key, job_id, created_at) VALUES ($16, $1, $9) ON CONFLICT (key) DO NOTHING RETURNING 1)"
                    .to_string(),
            );
            next += 1;
            " WHERE EXISTS (SELECT 1 FROM k)"
        } else {
            ""
        };
        parts.push(format!(
            "j AS (INSERT INTO jobs ({JOB_COLS}, lease_holder, lease_until) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, {} + $15{tied} RETURNING id)",
            self.now_ms()
        ));
        if !nodes.is_empty() {
            parts.push(format!(
                "a AS (INSERT INTO assignments (job_id, node_id, state) SELECT j.id, v.column1, '{}' FROM j, (VALUES {}) AS v RETURNING 1)",
                AssignmentState::Assigned.as_str(),
                rows_from(next, nodes.len(), 1)
            ));
            next += nodes.len();
        }
        if !distinct.is_empty() {
            parts.push(format!(
                "b AS (INSERT INTO blobs (hash, body) SELECT v.column1, v.column2 FROM j, (VALUES {}) AS v ON CONFLICT (hash) DO NOTHING RETURNING 1)",
                rows_from(next, distinct.len(), 2)
            ));
        }
        let mut q = sqlx::query(sql!(
            "WITH {} SELECT count(*) AS made FROM j",
            parts.join(",\n")
        ))
        .bind_new_job(self, j);
        if let Some(key) = key {
            q = q.bind(key);
        }
        for n in nodes {
            q = q.bind(n);
        }
        for (hash, body) in distinct {
            q = q.bind(hash).bind(body.clone());
        }
        let row = q
            .fetch_one(&self.pool)
            .await
            .map_err(|e| super::job_taken(j, e))?;
        match key {
            Some(key) if row.try_get::<i64, _>("made")? == 0 => {
                self.key_holder(key).await.map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The replicas' commitments and the job's move to revealing in one statement: the job
    /// moves only if it is committing (and leased here) and every named replica is still
    /// assigned; the commitments are written only if it moved. False when nothing was written.
    pub(super) async fn record_commitments_at_once(
        &self,
        job_id: &str,
        commitments: &[(String, String)],
        at: i64,
    ) -> Result<bool> {
        let fence = self.fence(5);
        let first = if self.lease.is_some() { 6 } else { 5 };
        let sql = format!(
            "WITH v (node_id, commitment) AS (VALUES {values}),
             j AS (UPDATE jobs SET state = '{revealing}', updated_at = $1
                   WHERE id = $2 AND state IN ('pending', 'committing'){fence}
                     AND (SELECT count(*) FROM assignments JOIN v ON assignments.node_id = v.node_id
                          WHERE assignments.job_id = $2 AND assignments.state = $3) = $4
                   RETURNING 1),
             a AS (UPDATE assignments SET state = '{committed}', commitment = v.commitment FROM v, j
                   WHERE assignments.job_id = $2 AND assignments.node_id = v.node_id AND assignments.state = $3
                   RETURNING 1)
             SELECT (SELECT count(*) FROM j) AS moved, (SELECT count(*) FROM a) AS recorded",
            values = rows_from(first, commitments.len(), 2),
            revealing = JobState::Revealing.as_str(),
            committed = AssignmentState::Committed.as_str(),
        );
        let mut q = sqlx::query(sql!("{sql}"))
            .bind(at)
            .bind(job_id)
            .bind(AssignmentState::Assigned.as_str())
            .bind(commitments.len() as i64)
            .bind_holder(self);
        for (node_id, commitment) in commitments {
            q = q.bind(node_id).bind(commitment);
        }
        let row = q.fetch_one(&self.pool).await?;
        Ok(row.try_get::<i64, _>("moved")? == 1)
    }

    /// A settlement in which every judged replica agreed, in one statement: the decision (only
    /// while the job is unfinished, leased here, and every judged node is registered), then the
    /// replicas' reveals and verdicts, the credits' stake events, and last the nodes' counters
    /// and stakes, taken in the order of their ids ([`NODE_LOCKS`]). False when nothing was
    /// written (and when the statement lost a deadlock all the same).
    pub(super) async fn settle_agreed_at_once(
        &self,
        job_id: &str,
        s: &Settlement<'_>,
    ) -> Result<bool> {
        let judged = s.verdicts.len();
        // $1 … $6 (and the lease holder, $7): the decision; then the verdicts, four parameters
        // each; then the reveals of replicas that were not judged, three each.
        let fence = self.fence(7);
        let mut next = if self.lease.is_some() { 8 } else { 7 };
        let verdict_rows = rows_from(next, judged, 4);
        next += judged * 4;
        let unjudged: Vec<&(String, String, String)> = s
            .reveals
            .iter()
            .filter(|(n, _, _)| !s.verdicts.iter().any(|v| &v.node_id == n))
            .collect();
        let revealed = if unjudged.is_empty() {
            String::new()
        } else {
            format!(
                "r AS (UPDATE assignments SET state = '{}', output_hash = w.column2, salt = w.column3
                       FROM (VALUES {}) AS w, d
                       WHERE assignments.job_id = $4 AND assignments.node_id = w.column1 AND assignments.state = '{}'
                       RETURNING 1),",
                AssignmentState::Revealed.as_str(),
                rows_from(next, unjudged.len(), 3),
                AssignmentState::Committed.as_str(),
            )
        };
        let sql = format!(
            "WITH v (node_id, output_hash, salt, score) AS (VALUES {verdict_rows}),
             d AS (UPDATE jobs SET state = '{decided}', output_hash = $1, receipt = $2, updated_at = $3
                   WHERE id = $4 AND state IN {unfinished}{fence}
                     AND (SELECT count(*) FROM nodes JOIN v ON nodes.id = v.node_id) = $6
                   RETURNING 1),
             a AS (UPDATE assignments SET state = '{agreed}',
                          output_hash = COALESCE(v.output_hash, assignments.output_hash),
                          salt = COALESCE(v.salt, assignments.salt)
                   FROM v, d
                   WHERE assignments.job_id = $4 AND assignments.node_id = v.node_id
                   RETURNING 1),
             {revealed}
             e AS (INSERT INTO stake_events (node_id, job_id, delta, reason, at)
                   SELECT v.node_id, $4, $5, '{credit}', $3 FROM v, d
                   RETURNING 1),
             l AS MATERIALIZED (SELECT s.node_id, pg_advisory_xact_lock({node_locks}, hashtext(s.node_id))
                   FROM (SELECT v.node_id FROM v, d ORDER BY v.node_id OFFSET 0) AS s),
             n AS (UPDATE nodes SET agreed = agreed + 1, score_sum = score_sum + v.score, stake = stake + $5
                   FROM v, l
                   WHERE nodes.id = v.node_id AND l.node_id = v.node_id
                   RETURNING 1)
             SELECT (SELECT count(*) FROM d) AS decided, (SELECT count(*) FROM n) AS credited",
            decided = JobState::Decided.as_str(),
            unfinished = super::UNFINISHED,
            agreed = AssignmentState::Agreed.as_str(),
            credit = "credit",
            node_locks = NODE_LOCKS,
        );
        let mut q = sqlx::query(sql!("{sql}"))
            .bind(s.output_hash)
            .bind(s.receipt)
            .bind(s.at)
            .bind(job_id)
            .bind(s.reward)
            .bind(judged as i64)
            .bind_holder(self);
        for v in s.verdicts {
            let reveal = s.reveals.iter().find(|(n, _, _)| *n == v.node_id);
            q = q
                .bind(&v.node_id)
                .bind(reveal.map(|r| r.1.clone()))
                .bind(reveal.map(|r| r.2.clone()))
                .bind(v.score);
        }
        for (node, hash, salt) in unjudged {
            q = q.bind(node).bind(hash).bind(salt);
        }
        let row = match q.fetch_one(&self.pool).await {
            Ok(row) => row,
            // With a step-by-step settlement (a dissent) locking node rows in id order while
            // this statement locks them in the planner's, a deadlock stays possible: the victim
            // wrote nothing and goes the step-by-step way too.
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some(DEADLOCK) => {
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(row.try_get::<i64, _>("decided")? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::rows_from;

    #[test]
    fn parameters_are_numbered_from_the_first_given() {
        assert_eq!(rows_from(5, 2, 2), "($5, $6), ($7, $8)");
        assert_eq!(rows_from(3, 1, 1), "($3)");
        assert_eq!(rows_from(9, 0, 4), "");
        assert_eq!(rows_from(1, 2, 3), "($1, $2, $3), ($4, $5, $6)");
    }
}
