//! Running one job on several nodes, verified, as a sequence of phases that each start from
//! what the ledger holds — so a restarted coordinator picks a job up wherever it was.
//!
//! 1. **Commit:** every assigned replica runs the job and returns a signed commitment; a node
//!    that fails or times out is marked unhealthy and replaced by another. No reveal is asked
//!    until every replica has committed, so no node can copy another's answer. A node that
//!    already ran the job (the coordinator restarted before recording its commitment) refuses
//!    the reused job id; its commitment is read from its job status instead. The commitments
//!    are recorded together with the move to the reveal phase, in one transaction.
//! 2. **Reveal:** each shows its outputs and salt; a reveal that does not open its commitment,
//!    or outputs that do not hash to what it revealed, make that node a liar. The reveals are
//!    recorded with the decision (a reveal asked again after a restart gets the same answer).
//! 3. **Compare** per tier ([`crate::compare`]). Without agreement, more nodes are assigned
//!    (once) and the job goes back to the commit phase for them; in `exact`, if there is still
//!    no strict majority, the coordinator's own executor referees.
//! 4. **Settle:** store the agreed outputs, then record the decision, the slashes of the
//!    nodes that disagreed and the credits of those that agreed in one ledger transaction, and
//!    sign a receipt listing the agreeing nodes' commitments.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tenet_ledger::{
    Assignment, AssignmentState, JobState, Ledger, NodeRecord, NodeState, Settlement, Verdict,
};
use tenet_net::client::{Bounds, reveal_answer_limit};
use tenet_net::{ClientError, NodeClient};
use tenet_proto::commit::{Commitment, JobSpec, Sig, Tier, output_hash, output_refs};
use tenet_proto::receipt::{Attestation, Receipt};
use tenet_proto::wire::{JobState as NodeJobState, RunJob};
use tenet_proto::{ErrorCode, Hash, tensor};
use tenet_store::Store;

use crate::compare::{self, Decision, Replica};
use crate::dispatch::{Coordinator, DispatchError, JobOutcome, lock, now};

/// A replica that committed.
struct Committed {
    node: String,
    client: Arc<NodeClient>,
    commitment: Commitment,
}

/// What the reveal phase saw.
#[derive(Default)]
struct Revealed {
    replicas: Vec<Replica>,
    attestations: Vec<Attestation>,
    /// Nodes whose reveal contradicted their own commitment.
    liars: Vec<String>,
    /// Nodes that committed and then did not reveal in time.
    withheld: Vec<String>,
    failures: Vec<String>,
    /// Reveals to record with the decision: (node, output hash, salt).
    unrecorded: Vec<(String, String, String)>,
}

/// How a dispute between two replicas ended.
enum Disputed {
    /// The winner's output hash, and the transcript for the receipt.
    Decided(Hash, tenet_proto::trace::Transcript),
    /// This node stalled the walk: it loses by rule.
    Stalled(String, tenet_proto::trace::Transcript),
    /// Nothing was decided (a trace could not be had, both lost): the whole job decides.
    Undecided,
}

/// Why a replica did not commit.
struct Failure {
    message: String,
    /// The node answered, refusing this job on its merits (over its limits, an input it
    /// cannot take, no room now): no sign of ill health.
    refused: bool,
}

impl Failure {
    fn fault(message: String) -> Failure {
        Failure {
            message,
            refused: false,
        }
    }

    fn from_client(e: ClientError) -> Failure {
        let refused = matches!(
            e.code(),
            Some(
                ErrorCode::ExceedsLimits
                    | ErrorCode::InvalidGraph
                    | ErrorCode::BadInputs
                    | ErrorCode::TooLarge
                    | ErrorCode::Busy
                    | ErrorCode::StorageFull
                    | ErrorCode::Timeout
            )
        );
        Failure {
            message: e.to_string(),
            refused,
        }
    }
}

enum RevealError {
    /// The node showed something that contradicts its own commitment.
    Lied(String),
    /// The node could not be asked (down, timed out).
    Failed(String),
}

fn short(id: &str) -> &str {
    &id[..12.min(id.len())]
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Take an admitted or interrupted job from wherever the ledger says it is to its end.
    pub(crate) async fn drive(self: &Arc<Self>, job_id: &str) -> Result<JobOutcome, DispatchError> {
        // A job admitted here a moment ago is as it was recorded: no need to read it back.
        let fresh = lock(&self.admitted).remove(job_id);
        let (job, mut first_assignments) = match fresh {
            Some((job, asg)) => (job, Some(asg)),
            None => (
                self.ledger.job(job_id).await?.ok_or_else(|| {
                    DispatchError::Internal(format!("job {job_id} is not in the ledger"))
                })?,
                None,
            ),
        };
        // A job admitted by another coordinator: its task, weights and inputs come here first.
        self.gather_job(&job).await?;
        let spec = self.spec_of(&job)?;
        let stage = lock(&self.stage_jobs)
            .get(job_id)
            .cloned()
            .unwrap_or_default();
        let mut blobs = self.inline_inputs(&spec)?;
        blobs.retain(|h, _| !stage.pulls.contains_key(h));
        let run = RunJob {
            job: spec.clone(),
            timeout_ms: Some(self.config.node_timeout.as_millis() as u64),
            blobs,
            pulls: stage.pulls,
            stage: stage.label,
        };
        let replicas = job.replicas.max(1) as usize;
        let mut state = job.state;
        loop {
            // The replicas as the commit phase left them, when it ran here.
            let mut committed = None;
            if matches!(state, JobState::Pending | JobState::Committing) {
                // Ends by moving the job to revealing.
                committed = Some(
                    self.commit_phase(&run, replicas, first_assignments.take())
                        .await?,
                );
            } else if state != JobState::Revealing {
                return Err(DispatchError::Internal(format!(
                    "job {job_id} is {}: there is nothing left to do",
                    state.as_str()
                )));
            }
            self.stall_at(crate::dispatch::StallPoint::BeforeReveal)
                .await;
            let mut seen = self.reveal_phase(&spec, committed).await?;
            let mut decision = match spec.tier {
                Tier::Exact => compare::exact(&seen.replicas),
                Tier::Tolerant => compare::tolerant(&seen.replicas, self.config.tolerance),
            };
            let mut refereed = false;
            if decision.result.is_none() {
                if self.add_replicas(job_id, replicas).await? {
                    self.ledger
                        .advance_job(job_id, JobState::Revealing, JobState::Committing, now())
                        .await?;
                    state = JobState::Committing;
                    continue;
                }
                if spec.tier == Tier::Exact && !seen.replicas.is_empty() {
                    // First a dispute by bisection between two replicas that differ (one op
                    // re-run); the whole job on this machine when it decides nothing.
                    refereed = true;
                    match self.dispute(&spec, &seen.replicas).await {
                        Disputed::Decided(winner, transcript) => {
                            decision = compare::decide_by_hash(&seen.replicas, Some(winner), None);
                            return self
                                .settle(&spec, seen, decision, refereed, Some(transcript))
                                .await;
                        }
                        Disputed::Stalled(node, transcript) => {
                            // Lost by rule: slashed as a node that withholds; the whole job
                            // decides among the others, the stall on the receipt.
                            if let Some(i) = seen.replicas.iter().position(|r| r.node == node) {
                                seen.replicas.remove(i);
                                seen.attestations.remove(i);
                                seen.withheld.push(node);
                            }
                            let local = self.referee(&spec).await?;
                            decision = compare::decide_by_hash(&seen.replicas, Some(local), None);
                            return self
                                .settle(&spec, seen, decision, refereed, Some(transcript))
                                .await;
                        }
                        Disputed::Undecided => {}
                    }
                    let local = self.referee(&spec).await?;
                    decision = compare::decide_by_hash(&seen.replicas, Some(local), None);
                }
            }
            // A majority decided, and some replica differs: the bisection between the
            // majority's result and the first dissenter names the op the dissent began at (the
            // receipt's evidence); should the majority lose it, the whole job decides.
            let mut evidence = None;
            if let Some(chosen) = decision.result
                && spec.tier == Tier::Exact
                && let Some(dissent) = decision.agreed.iter().position(|a| !a)
            {
                let pair = [
                    seen.replicas[chosen].clone(),
                    seen.replicas[dissent].clone(),
                ];
                match self.dispute(&spec, &pair).await {
                    Disputed::Decided(winner, t) if winner == pair[0].output_hash => {
                        evidence = Some(t);
                    }
                    Disputed::Decided(..) => {
                        let local = self.referee(&spec).await?;
                        refereed = true;
                        decision = compare::decide_by_hash(&seen.replicas, Some(local), None);
                    }
                    Disputed::Stalled(..) | Disputed::Undecided => {}
                }
            }
            return self.settle(&spec, seen, decision, refereed, evidence).await;
        }
    }

    /// Disagreement: assign up to `replicas` more nodes, once per job. False when the job
    /// already had its extra nodes or none are free.
    async fn add_replicas(&self, job_id: &str, replicas: usize) -> Result<bool, DispatchError> {
        let asg = self.ledger.assignments(job_id).await?;
        let live = asg
            .iter()
            .filter(|a| a.state != AssignmentState::Failed)
            .count();
        if live > replicas {
            return Ok(false);
        }
        let tried: HashSet<String> = asg.into_iter().map(|a| a.node_id).collect();
        let job =
            self.ledger.job(job_id).await?.ok_or_else(|| {
                DispatchError::Internal(format!("job {job_id} is not in the ledger"))
            })?;
        let spec = self.spec_of(&job)?;
        let need = self.need(&spec.task, spec.tier)?;
        let extra = self.pick(replicas, &tried, need).await?;
        for n in &extra {
            self.ledger.assign(job_id, &n.id).await?;
            self.events.job(
                job_id,
                "assigned",
                serde_json::json!({"node": n.id, "extra": true}),
            );
        }
        Ok(!extra.is_empty())
    }

    /// Until every live replica has committed: run the job on the assigned ones, replace the
    /// ones that fail. At least `need` must commit. The commitments are recorded together,
    /// with the move to revealing, in one transaction (one fsync per job, not per replica): a
    /// coordinator that dies before that asks the nodes again, and they hand over what they
    /// committed to. The job's replicas as the ledger then holds them.
    async fn commit_phase(
        self: &Arc<Self>,
        run: &RunJob,
        need: usize,
        mut known: Option<Vec<Assignment>>,
    ) -> Result<Vec<Assignment>, DispatchError> {
        let job_id = &run.job.job_id;
        let mut failures = Vec::new();
        let mut fresh: Vec<(String, String)> = Vec::new();
        loop {
            let asg = match known.take() {
                Some(asg) => asg,
                None => self.ledger.assignments(job_id).await?,
            };
            let waiting: Vec<&Assignment> = asg
                .iter()
                .filter(|a| {
                    a.state == AssignmentState::Assigned
                        && !fresh.iter().any(|(n, _)| *n == a.node_id)
                })
                .collect();
            if waiting.is_empty() {
                let committed = fresh.len()
                    + asg
                        .iter()
                        .filter(|a| {
                            matches!(
                                a.state,
                                AssignmentState::Committed | AssignmentState::Revealed
                            )
                        })
                        .count();
                if committed < need {
                    return Err(DispatchError::Nodes(format!(
                        "only {committed} of {need} replicas committed ({})",
                        failures.join("; ")
                    )));
                }
                self.ledger
                    .record_commitments(job_id, &fresh, now())
                    .await?;
                // The replicas as the ledger now holds them.
                let mut now_held = asg;
                for a in &mut now_held {
                    if let Some((_, c)) = fresh.iter().find(|(n, _)| *n == a.node_id) {
                        a.state = AssignmentState::Committed;
                        a.commitment = Some(c.clone());
                    }
                }
                return Ok(now_held);
            }
            let mut set = tokio::task::JoinSet::new();
            for a in waiting {
                let node = self.node_record(&a.node_id).await?;
                let me = self.clone();
                let run = run.clone();
                set.spawn(async move {
                    let r = me.commit_on(&node, &run).await;
                    (node.id, r)
                });
            }
            let mut lost = 0;
            while let Some(joined) = set.join_next().await {
                let (node, r) =
                    joined.map_err(|e| DispatchError::Internal(format!("a commit task: {e}")))?;
                match r {
                    Ok(c) => {
                        let json = serde_json::to_string(&c)
                            .map_err(|e| DispatchError::Internal(e.to_string()))?;
                        self.events
                            .job(job_id, "committed", serde_json::json!({"node": node}));
                        fresh.push((node, json));
                    }
                    Err(e) => {
                        self.events.job(
                            job_id,
                            "node_failed",
                            serde_json::json!({"node": node, "error": e.message}),
                        );
                        failures.push(format!("{}: {}", short(&node), e.message));
                        self.ledger.fail_assignment(job_id, &node).await?;
                        // A node that cannot be reached, or answers wrongly, is not healthy;
                        // one that refuses this job on its merits (over its limits, busy) is.
                        if !e.refused {
                            self.ledger
                                .set_node_state(&node, NodeState::Unhealthy)
                                .await?;
                            self.forget_registry();
                        }
                        lost += 1;
                    }
                }
            }
            if lost > 0 {
                let tried: HashSet<String> = asg.iter().map(|a| a.node_id.clone()).collect();
                let need = self.need(&run.job.task, run.job.tier)?;
                for r in self.pick(lost, &tried, need).await? {
                    self.ledger.assign(job_id, &r.id).await?;
                    self.events.job(
                        job_id,
                        "assigned",
                        serde_json::json!({"node": r.id, "replacing": true}),
                    );
                }
            }
        }
    }

    async fn node_record(&self, id: &str) -> Result<NodeRecord, DispatchError> {
        if let Some(n) = self.registry().await?.iter().find(|n| n.id == id) {
            return Ok(n.clone());
        }
        self.ledger
            .node(id)
            .await?
            .ok_or_else(|| DispatchError::Internal(format!("node {id} is not in the ledger")))
    }

    /// Make sure `node` has every blob the job needs and does not get inline (skipping what
    /// it has).
    async fn ship(&self, client: &NodeClient, run: &RunJob) -> Result<(), ClientError> {
        let spec = &run.job;
        let mut hashes = vec![spec.task];
        hashes.extend(spec.weights);
        // Pulled inputs the node fetches from its peers itself.
        hashes.extend(
            spec.inputs
                .values()
                .filter(|h| !run.blobs.contains_key(h) && !run.pulls.contains_key(h)),
        );
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

    /// One replica's commit step, checked: signed by that node, for this job.
    async fn commit_on(&self, node: &NodeRecord, run: &RunJob) -> Result<Commitment, Failure> {
        let client = self
            .client(node)
            .map_err(|e| Failure::fault(e.to_string()))?;
        let work = async {
            // Asked first, uploaded to only when it says it lacks a blob (and then asked again:
            // a node answers that before it takes the job's id). A node that has the task, as
            // every node does after its first job of it, costs one exchange, not one per blob.
            let mut answer = client.run_job(run).await;
            if matches!(&answer, Err(e) if e.code() == Some(ErrorCode::NotFound)) {
                self.ship(&client, run)
                    .await
                    .map_err(Failure::from_client)?;
                answer = client.run_job(run).await;
            }
            match answer {
                Ok(c) => Ok(c.commitment),
                // The node already has this job: a coordinator before a restart sent it.
                Err(e) if e.code() == Some(ErrorCode::Conflict) => {
                    committed_earlier(&client, &run.job.job_id)
                        .await
                        .map_err(Failure::fault)
                }
                Err(e) => Err(Failure::from_client(e)),
            }
        };
        let c = tokio::time::timeout(self.config.node_timeout, work)
            .await
            .map_err(|_| Failure::fault("timed out".into()))??;
        if !c.verify() || c.node.to_hex() != node.id || c.job != run.job {
            return Err(Failure::fault(
                "its commitment is not signed by it for this job".into(),
            ));
        }
        Ok(c)
    }

    /// Ask every committed replica to reveal (again, after a restart: a reveal is repeatable)
    /// and check each against its commitment.
    async fn reveal_phase(
        &self,
        spec: &JobSpec,
        known: Option<Vec<Assignment>>,
    ) -> Result<Revealed, DispatchError> {
        let job_id = &spec.job_id;
        let mut asked = Vec::new();
        let asg = match known {
            Some(asg) => asg,
            None => self.ledger.assignments(job_id).await?,
        };
        for a in asg {
            if !matches!(
                a.state,
                AssignmentState::Committed | AssignmentState::Revealed
            ) {
                continue;
            }
            let commitment: Commitment = a
                .commitment
                .as_deref()
                .and_then(|c| serde_json::from_str(c).ok())
                .ok_or_else(|| {
                    DispatchError::Internal(format!(
                        "the ledger holds no readable commitment of node {} for job {job_id}",
                        a.node_id
                    ))
                })?;
            let client = self.client(&self.node_record(&a.node_id).await?)?;
            asked.push((
                a.state,
                Committed {
                    node: a.node_id,
                    client,
                    commitment,
                },
            ));
        }
        let answers = self
            .gather_reveals(spec.tier, asked.iter().map(|(_, c)| c).collect())
            .await;
        let mut seen = Revealed::default();
        for ((state, c), answer) in asked.iter().zip(answers) {
            let (phase, why) = match &answer {
                Ok(_) => ("revealed", None),
                Err(RevealError::Lied(why)) => ("lied", Some(why.clone())),
                Err(RevealError::Failed(why)) => ("withheld", Some(why.clone())),
            };
            self.events.job(
                job_id,
                phase,
                serde_json::json!({"node": c.node, "output": answer.as_ref().ok().map(|(r, _)| r.output_hash.to_hex()), "why": why}),
            );
            match answer {
                Ok((replica, salt)) => {
                    if *state == AssignmentState::Committed {
                        seen.unrecorded.push((
                            c.node.clone(),
                            replica.output_hash.to_hex(),
                            salt.to_hex(),
                        ));
                    }
                    seen.attestations.push(Attestation {
                        commitment: c.commitment.clone(),
                        output_hash: replica.output_hash,
                        salt,
                    });
                    seen.replicas.push(replica);
                }
                Err(RevealError::Lied(why)) => {
                    seen.failures.push(format!("{}: {why}", short(&c.node)));
                    seen.liars.push(c.node.clone());
                }
                Err(RevealError::Failed(why)) => {
                    // Committing binds a node to reveal: one that does not (down, stalling,
                    // an answer too large or too slow) is slashed when the job settles.
                    seen.failures.push(format!("{}: {why}", short(&c.node)));
                    seen.withheld.push(c.node.clone());
                    self.ledger.fail_assignment(job_id, &c.node).await?;
                    self.ledger
                        .set_node_state(&c.node, NodeState::Unhealthy)
                        .await?;
                    self.forget_registry();
                }
            }
        }
        Ok(seen)
    }

    /// Every replica's reveal, as they arrive. In the exact tier, once a strict majority of
    /// the committed replicas has revealed the same result, no later reveal can change the
    /// decision: the rest get a grace (twice the time the majority took, at least
    /// [`REVEAL_GRACE`]) and are then counted as withheld, so a node that commits and stalls
    /// costs a call a fraction of a second, not the node timeout.
    async fn gather_reveals(
        &self,
        tier: Tier,
        asked: Vec<&Committed>,
    ) -> Vec<Result<(Replica, Hash), RevealError>> {
        use futures_util::StreamExt;
        let total = asked.len();
        let started = tokio::time::Instant::now();
        let mut pending: futures_util::stream::FuturesUnordered<_> = asked
            .iter()
            .enumerate()
            .map(|(i, c)| async move { (i, self.reveal_from(c).await) })
            .collect();
        let mut answers: Vec<Option<Result<(Replica, Hash), RevealError>>> =
            (0..total).map(|_| None).collect();
        let mut cutoff = None;
        loop {
            let next = match cutoff {
                Some(at) => tokio::time::timeout_at(at, pending.next())
                    .await
                    .ok()
                    .flatten(),
                None => pending.next().await,
            };
            let Some((i, answer)) = next else { break };
            answers[i] = Some(answer);
            if tier == Tier::Exact && cutoff.is_none() && majority_revealed(&answers, total) {
                cutoff =
                    Some(tokio::time::Instant::now() + REVEAL_GRACE.max(started.elapsed() * 2));
            }
        }
        drop(pending);
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(RevealError::Failed(
                        "it had not revealed when a majority had, nor within the grace after"
                            .into(),
                    ))
                })
            })
            .collect()
    }

    /// One replica's reveal, checked against its commitment; the reveal and every output it
    /// makes us fetch together get the node timeout.
    async fn reveal_from(&self, c: &Committed) -> Result<(Replica, Hash), RevealError> {
        tokio::time::timeout(self.config.node_timeout, self.reveal_unbounded(c))
            .await
            .map_err(|_| {
                RevealError::Failed(format!(
                    "its reveal did not arrive within {:?}",
                    self.config.node_timeout
                ))
            })?
    }

    async fn reveal_unbounded(&self, c: &Committed) -> Result<(Replica, Hash), RevealError> {
        // No answer is read past what the task's outputs can weigh.
        let facts = self
            .facts(&c.commitment.job.task)
            .map_err(|e| RevealError::Failed(e.to_string()))?;
        // One deadline for the reveal and every output fetch it needs.
        let deadline = Bounds::new(self.config.node_timeout, 0).deadline;
        let bounds = |max_answer_bytes| Bounds {
            deadline,
            max_answer_bytes,
        };
        let revealed = c
            .client
            .reveal_within(
                &c.commitment.job.job_id,
                bounds(reveal_answer_limit(facts.outputs.len())),
            )
            .await
            .map_err(|e| RevealError::Failed(e.to_string()))?;
        if !revealed.reveal.opens(&c.commitment) {
            return Err(RevealError::Lied(
                "its reveal does not open its commitment".into(),
            ));
        }
        if revealed.reveal.outputs.len() != facts.outputs.len() {
            return Err(RevealError::Lied(format!(
                "it revealed {} outputs; the task has {}",
                revealed.reveal.outputs.len(),
                facts.outputs.len()
            )));
        }
        let mut outputs = Vec::new();
        for (o, (name, most)) in revealed.reveal.outputs.iter().zip(&facts.outputs) {
            if o.name != *name {
                return Err(RevealError::Lied(format!(
                    "it revealed an output {:?} where the task has {name:?}",
                    o.name
                )));
            }
            let bytes = match revealed.blobs.get(&o.hash) {
                Some(hex) => {
                    tenet_proto::from_hex(hex).ok_or_else(|| RevealError::Lied("bad hex".into()))?
                }
                None => c
                    .client
                    .get_blob_within(&o.hash, bounds(*most))
                    .await
                    .map_err(|e| RevealError::Failed(e.to_string()))?
                    .to_vec(),
            };
            if tenet_net::digest::hash(&bytes) != o.hash {
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

    /// Store the result, then decide, slash and credit in one ledger transaction, and sign
    /// the receipt.
    async fn settle(
        &self,
        spec: &JobSpec,
        seen: Revealed,
        decision: Decision,
        refereed: bool,
        dispute: Option<tenet_proto::trace::Transcript>,
    ) -> Result<JobOutcome, DispatchError> {
        let Some(result) = decision.result else {
            return Err(DispatchError::Undecided(format!(
                "the {} replicas that revealed do not agree ({})",
                seen.replicas.len(),
                seen.failures.join("; ")
            )));
        };
        let mut verdicts: Vec<Verdict> = seen
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| Verdict {
                node_id: r.node.clone(),
                agreed: decision.agreed[i],
                score: decision.scores[i],
                withheld: false,
            })
            .collect();
        verdicts.extend(seen.liars.iter().map(|l| Verdict {
            node_id: l.clone(),
            agreed: false,
            score: 0.0,
            withheld: false,
        }));
        verdicts.extend(seen.withheld.iter().map(|l| Verdict {
            node_id: l.clone(),
            agreed: false,
            score: 0.0,
            withheld: true,
        }));
        let agreeing: Vec<Attestation> = seen
            .attestations
            .iter()
            .zip(&decision.agreed)
            .filter(|(_, a)| **a)
            .map(|(t, _)| t.clone())
            .collect();
        let chosen = &seen.replicas[result];
        let outputs_refs = output_refs(&chosen.outputs);
        let receipt = Receipt {
            version: 1,
            job: spec.clone(),
            output_hash: output_hash(&outputs_refs),
            outputs: outputs_refs,
            replicas: (seen.replicas.len() + seen.liars.len() + seen.withheld.len()) as u32,
            tolerance: if spec.tier == Tier::Tolerant {
                self.config.tolerance
            } else {
                0.0
            },
            nodes: agreeing,
            coordinator: self.key.public(),
            issued_at: tenet_proto::unix_now(),
            dispute,
            signature: Sig([0; 64]),
        }
        .sign(&self.key);
        self.stall_at(crate::dispatch::StallPoint::BeforeSettle)
            .await;
        // The outputs first: a decided job's outputs must be readable after any crash.
        for (_, t) in &chosen.outputs {
            self.store.put_bytes(&tensor::encode(t))?;
        }
        let receipt_json =
            serde_json::to_string(&receipt).map_err(|e| DispatchError::Internal(e.to_string()))?;
        let slashed = self
            .ledger
            .decide_job(
                &spec.job_id,
                &Settlement {
                    output_hash: &receipt.output_hash.to_hex(),
                    receipt: &receipt_json,
                    reveals: &seen.unrecorded,
                    verdicts: &verdicts,
                    slash_fraction: self.config.slash_fraction,
                    reward: self.config.reward,
                    at: now(),
                },
            )
            .await?;
        Ok(JobOutcome {
            job_id: spec.job_id.clone(),
            outputs: chosen.outputs.clone(),
            receipt,
            slashed,
            refereed,
        })
    }

    /// Settle a disagreement by bisection (`dispute.rs`) between the first two replicas whose
    /// outputs differ: both compute their traces, the walk finds the first node they disagree
    /// on, and that one op re-run here names the loser. The winner's output hash and the
    /// transcript, or `None` when the dispute decides nothing (a node could not be asked, or
    /// both lost): then the whole job is refereed.
    async fn dispute(&self, spec: &JobSpec, replicas: &[crate::compare::Replica]) -> Disputed {
        match self.try_dispute(spec, replicas).await {
            Some(d) => d,
            None => Disputed::Undecided,
        }
    }

    async fn try_dispute(
        &self,
        spec: &JobSpec,
        replicas: &[crate::compare::Replica],
    ) -> Option<Disputed> {
        let first = replicas.first()?;
        let second = replicas
            .iter()
            .find(|r| r.output_hash != first.output_hash)?;
        let (graph, weights, inputs) = load_job(&self.store, spec, self.task_memory()).ok()?;
        let max_leaf_bytes = graph
            .nodes()
            .iter()
            .map(|n| n.ty.bytes().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let clients = [
            self.client(&self.node_record(&first.node).await.ok()?)
                .ok()?,
            self.client(&self.node_record(&second.node).await.ok()?)
                .ok()?,
        ];
        // Computing a trace takes a node a reference run (both at once): a node that cannot
        // within the node timeout leaves the decision to the whole-job referee, unpunished.
        let limit = self.config.node_timeout;
        let (a, b) = futures_util::future::join(
            tokio::time::timeout(limit, clients[0].trace_root(&spec.job_id)),
            tokio::time::timeout(limit, clients[1].trace_root(&spec.job_id)),
        )
        .await;
        let mut parties = Vec::new();
        for (client, root) in clients.into_iter().zip([a, b]) {
            let root = root.ok()?.ok()?;
            if root.count != graph.nodes().len() as u64 {
                return None;
            }
            parties.push(crate::dispute::NodeParty {
                client,
                job_id: spec.job_id.clone(),
                root: root.root,
                max_leaf_bytes,
                timeout: limit,
            });
        }
        // Each side bound to what it committed to: agreeing traces still decide.
        let committed = [first, second].map(|r| {
            r.outputs
                .iter()
                .map(|(_, t)| tenet_proto::tensor::hash(t))
                .collect::<Vec<Hash>>()
        });
        let settled = match crate::dispute::settle_bound(
            &graph,
            &inputs,
            &weights,
            spec.seed,
            &parties[0],
            &parties[1],
            Some(committed),
        )
        .await
        {
            Ok(s) => s,
            Err(_) => return None,
        };
        if let Some(p) = settled.transcript.stalled {
            return Some(Disputed::Stalled(
                [first, second][p].node.clone(),
                settled.transcript,
            ));
        }
        let tenet_proto::trace::Verdict::Lost(lost) = &settled.transcript.verdict;
        let winner = match lost.as_slice() {
            [1] => first.output_hash,
            [0] => second.output_hash,
            _ => return None,
        };
        Some(Disputed::Decided(winner, settled.transcript))
    }

    /// Run the job on the coordinator's own executor: its output hash decides an exact-tier
    /// disagreement.
    async fn referee(&self, spec: &JobSpec) -> Result<Hash, DispatchError> {
        let _turn = self.heavy_turn().await?;
        let store = self.store.clone();
        let spec = spec.clone();
        let memory = self.task_memory();
        tokio::task::spawn_blocking(move || -> Result<Hash, String> {
            if let Some(arithmetic) = tenet_models::generation::Arithmetic::of_task(&spec.task.0) {
                return referee_generation(&store, &spec, arithmetic, memory);
            }
            let (graph, weights, inputs) = load_job(&store, &spec, memory)?;
            // The referee runs on this machine's CPU, the device every other device's exact
            // bits are checked against.
            let device = tenet_devices::open(
                "cpu",
                &tenet_devices::Options {
                    memory_limit: Some(memory),
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?;
            let outs = device
                .compile(&graph)
                .map_err(|e| e.to_string())?
                .run(&inputs, &weights, spec.seed)
                .map_err(|e| e.to_string())?;
            Ok(output_hash(&output_refs(&outs)))
        })
        .await
        .map_err(|e| DispatchError::Referee(e.to_string()))?
        .map_err(DispatchError::Referee)
    }
}

/// Referee a generation job: the model loaded from the store with its weights quantised, as
/// A job's graph, weights and inputs from the store, as the referee and a dispute need them
/// (a weights file no larger than `memory`).
type LoadedJob = (
    tenet_ir::Graph,
    tenet_models::WeightSet,
    HashMap<String, tenet_ir::HostTensor>,
);

fn load_job(store: &Store, spec: &JobSpec, memory: u64) -> Result<LoadedJob, String> {
    let graph = tenet_ir::codec::decode(&store.get(&spec.task).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let weights = match spec.weights {
        Some(w) => vec![
            tenet_models::WeightsFile::from_bytes_within(
                store.get(&w).map_err(|e| e.to_string())?,
                &w.short(),
                memory,
            )
            .map_err(|e| e.to_string())?,
        ],
        None => Vec::new(),
    };
    let mut inputs = HashMap::new();
    for (name, h) in &spec.inputs {
        let t =
            tensor::decode(&store.get(h).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        inputs.insert(name.clone(), t);
    }
    Ok((graph, tenet_models::WeightSet(weights), inputs))
}

/// nodes load it, the request decoded on this machine's CPU; the output hash of its tokens.
fn referee_generation(
    store: &Store,
    spec: &JobSpec,
    arithmetic: tenet_models::generation::Arithmetic,
    memory: u64,
) -> Result<Hash, String> {
    use tenet_models::generation;
    use tenet_models::smollm2::SmolLm2;
    let weights = spec
        .weights
        .ok_or("a generation job names its model's GGUF file as its weights")?;
    if store.contains(&weights).is_none() {
        return Err(format!(
            "the model {weights} is not in the coordinator's store"
        ));
    }
    let model = SmolLm2::load_with(&store.path(&weights), arithmetic.weights_mode())
        .map_err(|e| e.to_string())?;
    let mut inputs = HashMap::new();
    for (name, h) in &spec.inputs {
        let t =
            tensor::decode(&store.get(h).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        inputs.insert(name.clone(), t);
    }
    let (ids, params) =
        generation::parse_inputs(&inputs, model.config.vocab, model.config.context)?;
    let device = tenet_devices::open(
        "cpu",
        &tenet_devices::Options {
            memory_limit: Some(memory),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let (tokens, finish) = model.generate_from(
        &ids,
        params.max_tokens as usize,
        params.sampler(spec.seed),
        params.first_step,
        &params.stop,
        &*device,
    )?;
    let outputs = generation::outputs(&tokens, finish);
    Ok(output_hash(&output_refs(&outputs)))
}

/// How long the last replicas of an exact job get to reveal once a majority has, at least.
const REVEAL_GRACE: Duration = Duration::from_secs(1);

/// Whether a strict majority of `total` replicas has revealed one output hash.
fn majority_revealed(
    answers: &[Option<Result<(Replica, Hash), RevealError>>],
    total: usize,
) -> bool {
    let hashes: Vec<Hash> = answers
        .iter()
        .filter_map(|a| match a {
            Some(Ok((r, _))) => Some(r.output_hash),
            _ => None,
        })
        .collect();
    hashes
        .iter()
        .any(|h| hashes.iter().filter(|x| *x == h).count() * 2 > total)
}

/// The commitment a node made for `job_id` before this coordinator restarted, waiting while
/// the job is still running there.
async fn committed_earlier(client: &NodeClient, job_id: &str) -> Result<Commitment, String> {
    let mut pause = Duration::from_millis(5);
    loop {
        let status = client.job_status(job_id).await.map_err(|e| e.to_string())?;
        match status.state {
            NodeJobState::Running => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            NodeJobState::Committed | NodeJobState::Revealed => {
                return status
                    .commitment
                    .ok_or_else(|| "its job status shows no commitment".to_string());
            }
            NodeJobState::Failed | NodeJobState::Cancelled => {
                return Err(status.error.map_or_else(
                    || "the job failed on the node".to_string(),
                    |e| e.to_string(),
                ));
            }
        }
    }
}
