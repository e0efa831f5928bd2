//! Several coordinators on one ledger. Each drives a job only while it holds the job's lease
//! (renewed here every third of the lease time); a coordinator that stops renewing — dead,
//! stalled, cut off — has its jobs claimed by the others, which resume them from the ledger as
//! a restarted coordinator does. What one coordinator knows that another may need comes from
//! the ledger (deployed tasks, small inputs, the coordinators themselves) or, for large blobs,
//! from a peer coordinator or the job's nodes by hash on a miss.
//!
//! Every write to a job is fenced by its lease in the ledger ([`tenet_ledger::SqlLedger::leasing`]),
//! so a coordinator that lost a lease cannot change the job, least of all settle it: its
//! attempt ends in [`LedgerError::LeaseLost`] and the job is left to its new holder.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use tenet_ledger::{CoordinatorRecord, JobRecord, JobState, Ledger, LedgerError, NodeRecord};
use tenet_net::NodeClient;
use tenet_net::client::Bounds;
use tenet_proto::Hash;

use crate::dispatch::{Coordinator, DispatchError, lock, now};

/// Jobs claimed at most per round: a coordinator taking over a dead one's work does it in
/// bites, leaving the rest to its peers' next rounds.
const CLAIM_BATCH: i64 = 64;

/// How a coordinator's peer is asked for a blob it holds: the coordinator's route for peers.
pub fn peer_blob_path(hash: &Hash) -> String {
    format!("/v1/blobs/{hash}/data")
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Whether this coordinator shares its ledger with others (drives jobs under leases).
    pub fn leasing(&self) -> bool {
        self.ledger.lease_holder().is_some()
    }

    /// Keep this coordinator's leases alive and pick up jobs whose coordinator stopped
    /// renewing theirs, announcing it (its key, `url`) to its peers, until the task is
    /// aborted. Only for a leasing ledger; returns at once otherwise.
    pub async fn keep_leases(self: Arc<Self>, url: String) {
        let Some(holder) = self.ledger.lease_holder().map(str::to_string) else {
            return;
        };
        let me = CoordinatorRecord {
            holder,
            key: self.key.public().to_hex(),
            url,
            started_at: now(),
            silent_ms: 0,
        };
        let mut tick =
            tokio::time::interval((self.config.lease / 3).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.frozen() {
                continue;
            }
            if let Err(e) = self.ledger.renew_leases().await {
                self.events
                    .emit("lease-error", serde_json::json!({"error": e.to_string()}));
            }
            let _ = self.ledger.announce_coordinator(&me).await;
            match self.ledger.claim_jobs(CLAIM_BATCH, false).await {
                Ok(jobs) => self.take_over(jobs),
                Err(e) => self
                    .events
                    .emit("lease-error", serde_json::json!({"error": e.to_string()})),
            }
        }
    }

    /// Start driving jobs just claimed (those not already running here).
    fn take_over(self: &Arc<Self>, jobs: Vec<JobRecord>) {
        for job in jobs {
            if lock(&self.running).contains_key(&job.id) {
                continue;
            }
            self.events.job(
                &job.id,
                "taken-over",
                serde_json::json!({"state": job.state.as_str()}),
            );
            drop(self.start(job.id));
        }
    }

    /// Wait up to `limit` for job `id` to end, wherever it is driven: here, by its own task;
    /// elsewhere, by reading the ledger. The job's record as it stands at the end of the wait.
    pub async fn wait_ended(&self, id: &str, limit: Duration) -> Result<JobRecord, DispatchError> {
        let started = tokio::time::Instant::now();
        self.wait(id, limit).await;
        // Read again soon, then less and less often: many callers waiting on jobs driven
        // elsewhere must not become a flood of reads on the shared ledger.
        let mut pause = Duration::from_millis(25);
        loop {
            let job = self
                .ledger
                .job(id)
                .await?
                .ok_or_else(|| DispatchError::NotFound(format!("no job {id}")))?;
            if matches!(job.state, JobState::Decided | JobState::Failed)
                || started.elapsed() >= limit
            {
                return Ok(job);
            }
            // Claimed here since (its driver died): its own task says when it ends.
            if lock(&self.running).contains_key(id) {
                self.wait(id, limit.saturating_sub(started.elapsed())).await;
                continue;
            }
            tokio::time::sleep(pause.min(limit.saturating_sub(started.elapsed()))).await;
            pause = (pause * 2).min(Duration::from_millis(400));
        }
    }

    /// Make sure the task `id` is in this coordinator's store: deployed here, or by any
    /// coordinator on the ledger.
    pub async fn ensure_task(&self, id: &Hash) -> Result<(), DispatchError> {
        if self.store.contains(id).is_some() {
            return Ok(());
        }
        if let Some(arithmetic) = tenet_models::generation::Arithmetic::of_task(&id.0) {
            // A generation task is one fixed document, deployed wherever it is first used.
            self.store
                .put_bytes(arithmetic.task_bytes())
                .map_err(|e| DispatchError::Internal(e.to_string()))?;
            return Ok(());
        }
        let Some(body) = self.ledger.task(&id.to_hex()).await? else {
            return Err(DispatchError::NotFound(format!(
                "no task {id}: deploy it with POST /v1/tasks"
            )));
        };
        let stored = self.store.put_bytes(&body)?;
        if stored != *id {
            return Err(DispatchError::Internal(format!(
                "the ledger's copy of task {id} hashes to {stored}"
            )));
        }
        Ok(())
    }

    /// Make sure blob `hash` is in this coordinator's store, fetching it on a miss from the
    /// ledger (small job inputs), from a live peer coordinator, or from one of `nodes` (a
    /// job's replicas hold its inputs and their outputs); checked against its hash.
    pub async fn ensure_blob(
        &self,
        hash: &Hash,
        nodes: &[NodeRecord],
    ) -> Result<(), DispatchError> {
        if self.store.contains(hash).is_some() {
            return Ok(());
        }
        if let Some(body) = self.ledger.blob(&hash.to_hex()).await? {
            return self.keep_fetched(hash, &body).map(|_| ());
        }
        let bounds = || {
            Bounds::new(
                self.config.node_timeout,
                tenet_net::client::DEFAULT_BLOB_ANSWER_BYTES,
            )
        };
        let mut tried = Vec::new();
        let holder = self.ledger.lease_holder().unwrap_or_default().to_string();
        let silent_limit = (3 * self.config.lease).as_millis() as i64;
        for peer in self.ledger.coordinators().await? {
            if peer.holder == holder || peer.silent_ms > silent_limit {
                continue;
            }
            let Ok(client) = NodeClient::new(&peer.url, self.key.clone()) else {
                continue;
            };
            match client
                .call_within(Method::GET, &peer_blob_path(hash), Vec::new(), bounds())
                .await
            {
                Ok(body) if self.keep_fetched(hash, &body).is_ok() => return Ok(()),
                Ok(_) => tried.push(format!("{}: not the blob", peer.url)),
                Err(e) => tried.push(format!("{}: {e}", peer.url)),
            }
        }
        for node in nodes {
            let Ok(client) = self.client(node) else {
                continue;
            };
            match client.get_blob_within(hash, bounds()).await {
                Ok(body) if self.keep_fetched(hash, &body).is_ok() => return Ok(()),
                Ok(_) => tried.push(format!("{}: not the blob", node.url)),
                Err(e) => tried.push(format!("{}: {e}", node.url)),
            }
        }
        Err(DispatchError::NotFound(format!(
            "blob {hash} is not here, nor in the ledger, nor with any live coordinator or node asked ({})",
            if tried.is_empty() {
                "none to ask".to_string()
            } else {
                tried.join("; ")
            }
        )))
    }

    fn keep_fetched(&self, hash: &Hash, body: &[u8]) -> Result<Hash, DispatchError> {
        if tenet_net::digest::hash(body) != *hash {
            return Err(DispatchError::Internal(format!(
                "a copy of blob {hash} does not hash to it"
            )));
        }
        Ok(self.store.put_bytes(body)?)
    }

    /// Everything a job needs here before it is driven — its task, weights and inputs — for a
    /// job admitted by another coordinator.
    pub(crate) async fn gather_job(&self, job: &JobRecord) -> Result<(), DispatchError> {
        let spec = self.spec_of(job)?;
        self.ensure_task(&spec.task).await?;
        let missing: Vec<Hash> = spec
            .weights
            .iter()
            .chain(spec.inputs.values())
            .filter(|h| self.store.contains(h).is_none())
            .copied()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut nodes = Vec::new();
        for a in self.ledger.assignments(&job.id).await? {
            if let Some(n) = self.ledger.node(&a.node_id).await? {
                nodes.push(n);
            }
        }
        for h in &missing {
            self.ensure_blob(h, &nodes).await?;
        }
        Ok(())
    }
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Deploy a pipeline ([`Coordinator::deploy_pipeline`]) for every coordinator on the
    /// ledger: its manifest is kept there too.
    pub async fn deploy_pipeline_shared(
        &self,
        manifest_bytes: &[u8],
    ) -> Result<(Hash, tenet_pipeline::Manifest), DispatchError> {
        let (id, manifest) = self.deploy_pipeline(manifest_bytes)?;
        self.ledger
            .put_task(&id.to_hex(), manifest_bytes, now())
            .await?;
        Ok((id, manifest))
    }

    /// A pipeline deployed here or by any coordinator on the ledger (its manifest and its
    /// stages' tasks fetched from the ledger first), checked against its stages.
    pub async fn shared_pipeline(
        &self,
        id: &Hash,
    ) -> Result<Arc<tenet_pipeline::Manifest>, DispatchError> {
        if let Some(m) = lock(&self.pipelines).get(id) {
            return Ok(m.clone());
        }
        self.ensure_task(id).await.map_err(|e| match e {
            DispatchError::NotFound(_) => DispatchError::NotFound(format!(
                "no pipeline {id}: deploy it with POST /v1/pipelines"
            )),
            e => e,
        })?;
        if let Ok(manifest) = tenet_pipeline::Manifest::parse(&self.store.get(id)?) {
            for stage in &manifest.stages {
                if let Ok(task) = Hash::parse(&stage.graph) {
                    // A stage not deployed anywhere is refused by the check below.
                    let _ = self.ensure_task(&task).await;
                }
            }
        }
        self.pipeline(id)
    }
}

/// Whether a job's driver stopped because its lease passed to another coordinator.
pub fn lease_lost(e: &DispatchError) -> bool {
    matches!(e, DispatchError::Ledger(LedgerError::LeaseLost { .. }))
}
