//! Running one job on several nodes, verified.
//!
//! 1. Pick `replicas` distinct active nodes at random, weighted by stake × score.
//! 2. **Commit:** each runs the job and returns a signed commitment; a node that fails or
//!    times out is marked unhealthy and replaced by another. No reveal is asked until every
//!    replica has committed, so no node can copy another's answer.
//! 3. **Reveal:** each shows its outputs and salt; a reveal that does not open its commitment,
//!    or outputs that do not hash to what it revealed, make that node a liar.
//! 4. **Compare** per tier ([`crate::compare`]). In `exact`, without a strict majority the
//!    coordinator's own executor referees.
//! 5. Record the decision, slash the nodes that disagreed, credit those that agreed, and sign a
//!    receipt listing the agreeing nodes' commitments.
//!
//! Every step is written to the ledger as it happens.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenet_exec::Backend;
use tenet_ir::HostTensor;
use tenet_ledger::{JobRecord, JobState, Ledger, LedgerError, NodeRecord, NodeState, Verdict};
use tenet_node::{ClientError, NodeClient};
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{Commitment, JobSpec, Sig, Tier, output_hash, output_refs};
use tenet_proto::receipt::{Attestation, Receipt};
use tenet_proto::wire::RunJob;
use tenet_proto::{Hash, tensor};
use tenet_store::Store;

use crate::compare::{self, Replica};

/// How the coordinator runs jobs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Nodes each job runs on.
    pub replicas: usize,
    /// Per-element bound against the median in the tolerant tier.
    pub tolerance: f64,
    /// Fraction of stake a node loses when it disagrees with the decided result.
    pub slash_fraction: f64,
    /// Credited to each agreeing node per job.
    pub reward: i64,
    /// How long a node may take to commit or reveal.
    pub node_timeout: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            replicas: 3,
            tolerance: 1e-4,
            slash_fraction: 0.1,
            reward: 1,
            node_timeout: Duration::from_secs(60),
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
    #[error("only {have} healthy node(s) are registered; the job needs {need}")]
    NotEnoughNodes { have: usize, need: usize },
    #[error("the job failed on the nodes: {0}")]
    Nodes(String),
    #[error("the refereeing run failed: {0}")]
    Referee(String),
    #[error("no result: {0}")]
    Undecided(String),
    #[error("{0}")]
    BadRequest(String),
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
    key: KeyPair,
    store: Arc<Store>,
    config: CoordinatorConfig,
    clients: Mutex<HashMap<String, Arc<NodeClient>>>,
}

fn now() -> i64 {
    tenet_proto::unix_now() as i64
}

/// A replica that committed.
struct Committed {
    node: String,
    client: Arc<NodeClient>,
    commitment: Commitment,
}

impl<L: Ledger + 'static> Coordinator<L> {
    pub fn new(ledger: L, key: KeyPair, store: Arc<Store>, config: CoordinatorConfig) -> Self {
        Coordinator {
            ledger,
            key,
            store,
            config,
            clients: Mutex::new(HashMap::new()),
        }
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

    fn client(&self, node: &NodeRecord) -> Result<Arc<NodeClient>, DispatchError> {
        let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = c.get(&node.id) {
            return Ok(existing.clone());
        }
        let client = Arc::new(
            NodeClient::new(&node.url, self.key.clone())
                .map_err(|e| DispatchError::BadRequest(e.to_string()))?,
        );
        c.insert(node.id.clone(), client.clone());
        Ok(client)
    }

    /// Register the node at `url` with `stake`: its id is what it says in `/v1/info` (it must
    /// trust this coordinator's key for jobs to run).
    pub async fn register_node(&self, url: &str, stake: i64) -> Result<NodeRecord, DispatchError> {
        let probe = NodeClient::new(url, self.key.clone())
            .map_err(|e| DispatchError::BadRequest(e.to_string()))?;
        let info = probe
            .info()
            .await
            .map_err(|e| DispatchError::Nodes(format!("{url}: {e}")))?;
        let record = NodeRecord {
            id: info.node_id.to_hex(),
            url: url.to_string(),
            stake,
            state: NodeState::Active,
            registered_at: now(),
            last_heartbeat: now(),
            agreed: 0,
            disagreed: 0,
            score_sum: 0.0,
        };
        self.ledger.register_node(&record).await?;
        Ok(record)
    }

    /// Pick up to `n` distinct active nodes not in `exclude`, weighted by stake × score.
    async fn pick(
        &self,
        n: usize,
        exclude: &HashSet<String>,
    ) -> Result<Vec<NodeRecord>, DispatchError> {
        let mut pool: Vec<NodeRecord> = self
            .ledger
            .nodes()
            .await?
            .into_iter()
            .filter(|r| r.state == NodeState::Active && r.stake > 0 && !exclude.contains(&r.id))
            .collect();
        let mut chosen = Vec::new();
        while chosen.len() < n && !pool.is_empty() {
            let weights: Vec<f64> = pool
                .iter()
                .map(|r| r.stake as f64 * r.score().max(0.01))
                .collect();
            let total: f64 = weights.iter().sum();
            let bytes = tenet_node::identity::random_bytes::<8>();
            let mut x = u64::from_le_bytes(bytes) as f64 / u64::MAX as f64 * total;
            let mut i = 0;
            while i + 1 < pool.len() && x >= weights[i] {
                x -= weights[i];
                i += 1;
            }
            chosen.push(pool.swap_remove(i));
        }
        Ok(chosen)
    }

    /// Make sure `node` has every blob the job needs and does not get inline (skipping what
    /// it has).
    async fn ship(&self, client: &NodeClient, run: &RunJob) -> Result<(), ClientError> {
        let spec = &run.job;
        let mut hashes = vec![spec.task];
        hashes.extend(spec.weights);
        hashes.extend(spec.inputs.values().filter(|h| !run.blobs.contains_key(h)));
        for h in hashes {
            if client.has_blob(&h).await?.is_none() {
                let bytes = self.store.get(&h).map_err(|e| ClientError::Unexpected {
                    status: 0,
                    message: e.to_string(),
                })?;
                client.put_blob(bytes).await?;
            }
        }
        Ok(())
    }

    /// Run `req` on the configured number of replicas, verified.
    pub async fn run(self: &Arc<Self>, req: JobRequest) -> Result<JobOutcome, DispatchError> {
        if self.store.contains(&req.task).is_none() {
            return Err(DispatchError::BadRequest(format!(
                "task {} is not deployed on this coordinator",
                req.task
            )));
        }
        // Inputs are stored too: a restarted coordinator, and replays, need them.
        let mut inputs = BTreeMap::new();
        let mut inline = BTreeMap::new();
        for (name, t) in &req.inputs {
            let blob = tensor::encode(t);
            let h = self.store.put_bytes(&blob)?;
            inputs.insert(name.clone(), h);
            if blob.len() <= 256 << 10 {
                inline.insert(h, tenet_proto::to_hex(&blob));
            }
        }
        let job_id = tenet_proto::to_hex(&tenet_node::identity::random_bytes::<12>());
        let spec = JobSpec {
            job_id: job_id.clone(),
            task: req.task,
            weights: req.weights,
            inputs,
            tier: req.tier,
            seed: req.seed,
        };
        let want = self.config.replicas.max(1);
        let chosen = self.pick(want, &HashSet::new()).await?;
        if chosen.len() < want {
            return Err(DispatchError::NotEnoughNodes {
                have: chosen.len(),
                need: want,
            });
        }
        let record = JobRecord {
            id: job_id.clone(),
            task: spec.task.to_hex(),
            weights: spec.weights.map(|w| w.to_hex()),
            inputs: serde_json::to_string(&spec.inputs).unwrap_or_default(),
            tier: spec.tier.as_str().to_string(),
            seed: spec.seed as i64,
            replicas: want as i64,
            state: JobState::Pending,
            created_at: now(),
            updated_at: now(),
            output_hash: None,
            receipt: None,
            error: None,
        };
        let ids: Vec<String> = chosen.iter().map(|n| n.id.clone()).collect();
        self.ledger.create_job(&record, &ids).await?;
        self.ledger
            .advance_job(&job_id, JobState::Pending, JobState::Committing, now())
            .await?;
        let result = self.drive(spec, inline, chosen).await;
        if let Err(e) = &result {
            let _ = self.ledger.fail_job(&job_id, &e.to_string(), now()).await;
        }
        result
    }

    /// Commit, reveal, compare, judge.
    async fn drive(
        self: &Arc<Self>,
        spec: JobSpec,
        inline: BTreeMap<Hash, String>,
        chosen: Vec<NodeRecord>,
    ) -> Result<JobOutcome, DispatchError> {
        let job_id = spec.job_id.clone();
        let run = RunJob {
            job: spec.clone(),
            timeout_ms: Some(self.config.node_timeout.as_millis() as u64),
            blobs: inline,
        };
        // Commit phase: all replicas, concurrently; failed nodes replaced.
        let mut tried: HashSet<String> = chosen.iter().map(|n| n.id.clone()).collect();
        let mut pending = chosen;
        let mut committed: Vec<Committed> = Vec::new();
        let mut failures = Vec::new();
        while !pending.is_empty() {
            let mut set = tokio::task::JoinSet::new();
            for node in pending.drain(..) {
                let me = self.clone();
                let run = run.clone();
                set.spawn(async move {
                    let r = me.commit_on(&node, &run).await;
                    (node, r)
                });
            }
            let mut lost = 0;
            while let Some(joined) = set.join_next().await {
                let Ok((node, r)) = joined else {
                    lost += 1;
                    continue;
                };
                match r {
                    Ok(c) => {
                        self.ledger
                            .record_commitment(
                                &job_id,
                                &node.id,
                                &serde_json::to_string(&c.commitment).unwrap_or_default(),
                            )
                            .await?;
                        committed.push(c);
                    }
                    Err(e) => {
                        failures.push(format!("{}: {e}", &node.id[..12]));
                        let _ = self.ledger.fail_assignment(&job_id, &node.id).await;
                        // A node that cannot run a job it was given is not healthy.
                        let _ = self
                            .ledger
                            .set_node_state(&node.id, NodeState::Unhealthy)
                            .await;
                        lost += 1;
                    }
                }
            }
            if lost > 0 {
                let replacements = self.pick(lost, &tried).await?;
                if replacements.is_empty() {
                    break;
                }
                for r in &replacements {
                    tried.insert(r.id.clone());
                    self.ledger.assign(&job_id, &r.id).await?;
                }
                pending = replacements;
            }
        }
        if committed.len() < self.config.replicas.max(1) {
            return Err(DispatchError::Nodes(format!(
                "only {} of {} replicas committed ({})",
                committed.len(),
                self.config.replicas,
                failures.join("; ")
            )));
        }
        self.ledger
            .advance_job(&job_id, JobState::Committing, JobState::Revealing, now())
            .await?;

        // Reveal phase: only now, with every commitment in.
        let mut replicas: Vec<Replica> = Vec::new();
        let mut attest: Vec<Attestation> = Vec::new();
        let mut liars: Vec<String> = Vec::new();
        for c in &committed {
            match self.reveal_from(c).await {
                Ok((replica, salt)) => {
                    self.ledger
                        .record_reveal(
                            &job_id,
                            &c.node,
                            &replica.output_hash.to_hex(),
                            &salt.to_hex(),
                        )
                        .await?;
                    attest.push(Attestation {
                        commitment: c.commitment.clone(),
                        output_hash: replica.output_hash,
                        salt,
                    });
                    replicas.push(replica);
                }
                Err(RevealError::Lied(why)) => {
                    failures.push(format!("{}: {why}", &c.node[..12]));
                    liars.push(c.node.clone());
                }
                Err(RevealError::Failed(why)) => {
                    failures.push(format!("{}: {why}", &c.node[..12]));
                    let _ = self.ledger.fail_assignment(&job_id, &c.node).await;
                    let _ = self
                        .ledger
                        .set_node_state(&c.node, NodeState::Unhealthy)
                        .await;
                }
            }
        }

        // Compare.
        let mut refereed = false;
        let mut decision = match spec.tier {
            Tier::Exact => compare::exact(&replicas),
            Tier::Tolerant => compare::tolerant(&replicas, self.config.tolerance),
        };
        if decision.result.is_none() && spec.tier == Tier::Exact && !replicas.is_empty() {
            let local = self.referee(&spec).await?;
            refereed = true;
            decision = compare::decide_by_hash(&replicas, Some(local), None);
        }
        let Some(result) = decision.result else {
            return Err(DispatchError::Undecided(format!(
                "the {} replicas that revealed do not agree ({})",
                replicas.len(),
                failures.join("; ")
            )));
        };

        // Judge: verdicts, slashes, credits, receipt.
        let mut verdicts = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            verdicts.push(Verdict {
                node_id: r.node.clone(),
                agreed: decision.agreed[i],
                score: decision.scores[i],
            });
        }
        for l in &liars {
            verdicts.push(Verdict {
                node_id: l.clone(),
                agreed: false,
                score: 0.0,
            });
        }
        let agreeing: Vec<Attestation> = attest
            .iter()
            .zip(&decision.agreed)
            .filter(|(_, a)| **a)
            .map(|(t, _)| t.clone())
            .collect();
        let chosen = &replicas[result];
        let outputs_refs = output_refs(&chosen.outputs);
        let receipt = Receipt {
            version: 1,
            job: spec.clone(),
            output_hash: output_hash(&outputs_refs),
            outputs: outputs_refs,
            replicas: (replicas.len() + liars.len()) as u32,
            tolerance: if spec.tier == Tier::Tolerant {
                self.config.tolerance
            } else {
                0.0
            },
            nodes: agreeing,
            coordinator: self.key.public(),
            issued_at: tenet_proto::unix_now(),
            signature: Sig([0; 64]),
        }
        .sign(&self.key);
        let receipt_json = serde_json::to_string(&receipt).unwrap_or_default();
        self.ledger
            .decide_job(
                &job_id,
                &receipt.output_hash.to_hex(),
                &receipt_json,
                &verdicts,
                now(),
            )
            .await?;
        let mut slashed = Vec::new();
        for v in &verdicts {
            if v.agreed {
                self.ledger
                    .credit(&v.node_id, &job_id, self.config.reward, now())
                    .await?;
            } else {
                let amount = self
                    .ledger
                    .slash(
                        &v.node_id,
                        &job_id,
                        self.config.slash_fraction,
                        "its committed result disagreed with the decided result",
                        now(),
                    )
                    .await?;
                slashed.push((v.node_id.clone(), amount));
            }
        }
        for (_, t) in &chosen.outputs {
            self.store.put_bytes(&tensor::encode(t))?;
        }
        Ok(JobOutcome {
            job_id,
            outputs: chosen.outputs.clone(),
            receipt,
            slashed,
            refereed,
        })
    }

    /// One replica's commit step.
    async fn commit_on(&self, node: &NodeRecord, run: &RunJob) -> Result<Committed, String> {
        let client = self.client(node).map_err(|e| e.to_string())?;
        let work = async {
            self.ship(&client, run).await.map_err(|e| e.to_string())?;
            client.run_job(run).await.map_err(|e| e.to_string())
        };
        let committed = tokio::time::timeout(self.config.node_timeout, work)
            .await
            .map_err(|_| "timed out".to_string())??;
        let c = committed.commitment;
        if !c.verify() || c.node.to_hex() != node.id || c.job != run.job {
            return Err("its commitment is not signed by it for this job".into());
        }
        Ok(Committed {
            node: node.id.clone(),
            client,
            commitment: c,
        })
    }

    /// One replica's reveal, checked against its commitment.
    async fn reveal_from(&self, c: &Committed) -> Result<(Replica, Hash), RevealError> {
        let revealed = tokio::time::timeout(
            self.config.node_timeout,
            c.client.reveal(&c.commitment.job.job_id),
        )
        .await
        .map_err(|_| RevealError::Failed("reveal timed out".into()))?
        .map_err(|e| RevealError::Failed(e.to_string()))?;
        if !revealed.reveal.opens(&c.commitment) {
            return Err(RevealError::Lied(
                "its reveal does not open its commitment".into(),
            ));
        }
        let mut outputs = Vec::new();
        for o in &revealed.reveal.outputs {
            let bytes = match revealed.blobs.get(&o.hash) {
                Some(hex) => {
                    tenet_proto::from_hex(hex).ok_or_else(|| RevealError::Lied("bad hex".into()))?
                }
                None => c
                    .client
                    .get_blob(&o.hash)
                    .await
                    .map_err(|e| RevealError::Failed(e.to_string()))?
                    .to_vec(),
            };
            if Hash::of(&bytes) != o.hash {
                return Err(RevealError::Lied(format!(
                    "output {} does not hash to what it revealed",
                    o.name
                )));
            }
            let t = tensor::decode(&bytes).map_err(|e| RevealError::Lied(e.to_string()))?;
            outputs.push((o.name.clone(), t));
        }
        Ok((
            Replica {
                node: c.node.clone(),
                output_hash: revealed.reveal.output_hash,
                outputs,
            },
            revealed.reveal.salt,
        ))
    }

    /// Run the job on the coordinator's own executor: its output hash decides an exact-tier
    /// disagreement.
    async fn referee(&self, spec: &JobSpec) -> Result<Hash, DispatchError> {
        let store = self.store.clone();
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || -> Result<Hash, String> {
            let graph = tenet_ir::codec::decode(&store.get(&spec.task).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            let weights = match spec.weights {
                Some(w) => vec![
                    tenet_models::WeightsFile::from_bytes(
                        store.get(&w).map_err(|e| e.to_string())?,
                        &w.short(),
                    )
                    .map_err(|e| e.to_string())?,
                ],
                None => Vec::new(),
            };
            let mut inputs = HashMap::new();
            for (name, h) in &spec.inputs {
                let t = tensor::decode(&store.get(h).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
                inputs.insert(name.clone(), t);
            }
            let outs = tenet_exec::CpuBackend::auto()
                .prepare(&graph)
                .map_err(|e| e.to_string())?
                .run(&inputs, &tenet_models::WeightSet(weights), spec.seed)
                .map_err(|e| e.to_string())?;
            Ok(output_hash(&output_refs(&outs)))
        })
        .await
        .map_err(|e| DispatchError::Referee(e.to_string()))?
        .map_err(DispatchError::Referee)
    }
}

enum RevealError {
    /// The node showed something that contradicts its own commitment.
    Lied(String),
    /// The node could not be asked (down, timed out).
    Failed(String),
}
