//! Pipeline tasks: a split model (`tenet split`) deployed as one task and called as one.
//!
//! Each stage is deployed first as an ordinary task (its graph and weights); deploying the
//! pipeline stores its manifest after checking it against them: the manifest chains
//! (`tenet_pipeline::Manifest::parse`), each stage's task is here and is exactly the graph the
//! manifest lists (id, inputs, outputs, certificate) with the weights it lists. A call runs
//! the stages one after another, each as a verified job of its own — its own replicas, chosen
//! among the nodes whose advertised limits take that stage, commit-reveal, comparison, more
//! nodes or the referee on disagreement, liars slashed — whose inputs are the model's inputs
//! that stage reads and the boundary tensors the stage before agreed on. The answer is the
//! model's outputs with a [`PipelineReceipt`] that chains the stages' receipts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tenet_ir::HostTensor;
use tenet_ledger::Ledger;
use tenet_pipeline::Manifest;
use tenet_proto::Hash;
use tenet_proto::commit::Tier;
use tenet_proto::grant::PullGrant;
use tenet_proto::pipeline_receipt::PipelineReceipt;
use tenet_proto::wire::{PullFrom, StageLabel};

use crate::dispatch::{Coordinator, DispatchError, JobRequest, StageJob, lock};

/// One stage of a decided pipeline call.
#[derive(Clone, Debug)]
pub struct StageOutcome {
    pub job_id: String,
    pub task: Hash,
    /// Nodes asked and nodes that agreed.
    pub replicas: u32,
    pub agreeing: usize,
    pub slashed: Vec<(String, i64)>,
    pub refereed: bool,
    /// Wall time of the stage's job, in milliseconds.
    pub ms: f64,
    /// Bytes of the boundary tensors it passed to the next stage.
    pub boundary_bytes: u64,
}

/// A decided pipeline call.
#[derive(Clone, Debug)]
pub struct PipelineOutcome {
    pub outputs: Vec<(String, HostTensor)>,
    pub receipt: PipelineReceipt,
    pub stages: Vec<StageOutcome>,
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Check a manifest against the deployed stage tasks and store it; its hash is the
    /// pipeline's id.
    pub fn deploy_pipeline(
        &self,
        manifest_bytes: &[u8],
    ) -> Result<(Hash, Manifest), DispatchError> {
        let manifest = Manifest::parse(manifest_bytes)
            .map_err(|e| DispatchError::BadRequest(format!("manifest: {e}")))?;
        self.check_stages(&manifest)?;
        let id = self
            .store
            .put_bytes(manifest_bytes)
            .map_err(|e| DispatchError::Internal(e.to_string()))?;
        lock(&self.pipelines).insert(id, Arc::new(manifest.clone()));
        Ok((id, manifest))
    }

    /// Each stage's task is deployed here and is exactly what the manifest lists: its id,
    /// inputs, outputs, certificate and weights file.
    fn check_stages(&self, manifest: &Manifest) -> Result<(), DispatchError> {
        for (k, s) in manifest.stages.iter().enumerate() {
            let task = Hash::parse(&s.graph)
                .map_err(|e| DispatchError::BadRequest(format!("stage {k}: {e}")))?;
            let bytes = self.store.get(&task).map_err(|_| {
                DispatchError::BadRequest(format!(
                    "stage {k}'s task {} is not deployed: deploy each stage's graph (and weights) first with POST /v1/tasks",
                    task.short()
                ))
            })?;
            let graph = tenet_ir::codec::decode(&bytes)
                .map_err(|e| DispatchError::BadRequest(format!("stage {k}'s task: {e}")))?;
            manifest
                .check_stage(k, &graph)
                .map_err(|e| DispatchError::BadRequest(e.to_string()))?;
            let refs: std::collections::BTreeSet<String> = graph
                .weights()
                .filter_map(|(_, op, _)| match op {
                    tenet_ir::Op::Weight { file, .. } => Some(file.to_hex()),
                    _ => None,
                })
                .collect();
            let listed: std::collections::BTreeSet<String> =
                s.weights.iter().map(|w| w.id.clone()).collect();
            if refs != listed {
                return Err(DispatchError::BadRequest(format!(
                    "stage {k}'s graph reads weights files {refs:?}, the manifest lists {listed:?}"
                )));
            }
            if refs.len() > 1 {
                return Err(DispatchError::BadRequest(format!(
                    "stage {k} reads {} weights files; a stage may read one",
                    refs.len()
                )));
            }
            self.check_deployable(graph.cost())?;
        }
        Ok(())
    }

    /// A deployed pipeline's manifest. One this process has not checked (deployed before a
    /// restart, or uploaded as a plain blob) has its stages checked against their tasks first.
    pub fn pipeline(&self, id: &Hash) -> Result<Arc<Manifest>, DispatchError> {
        if let Some(m) = lock(&self.pipelines).get(id) {
            return Ok(m.clone());
        }
        let bytes = self.store.get(id).map_err(|_| {
            DispatchError::NotFound(format!(
                "no pipeline {id}: deploy it with POST /v1/pipelines"
            ))
        })?;
        let manifest = Manifest::parse(&bytes).map_err(|e| {
            DispatchError::NotFound(format!("{} is not a pipeline: {e}", id.short()))
        })?;
        self.check_stages(&manifest)?;
        let manifest = Arc::new(manifest);
        lock(&self.pipelines).insert(*id, manifest.clone());
        Ok(manifest)
    }

    /// Run a pipeline call: every stage as a verified job, in order.
    pub async fn run_pipeline(
        self: &Arc<Self>,
        id: Hash,
        manifest: &Manifest,
        inputs: BTreeMap<String, HostTensor>,
        tier: Tier,
        seed: u64,
    ) -> Result<PipelineOutcome, DispatchError> {
        let mut carried: BTreeMap<String, HostTensor> = BTreeMap::new();
        let mut results: BTreeMap<String, HostTensor> = BTreeMap::new();
        let mut receipts = Vec::new();
        let mut stages = Vec::new();
        let mut pulls = BTreeMap::new();
        for (k, s) in manifest.stages.iter().enumerate() {
            let task = Hash::parse(&s.graph).map_err(|e| DispatchError::Internal(e.to_string()))?;
            let weights = s
                .weights
                .first()
                .map(|w| Hash::parse(&w.id))
                .transpose()
                .map_err(|e| DispatchError::Internal(e.to_string()))?;
            let mut stage_inputs = std::mem::take(&mut carried);
            for name in &s.inputs {
                let t = inputs.get(name).ok_or_else(|| {
                    DispatchError::BadRequest(format!("input {name:?} is missing"))
                })?;
                stage_inputs.insert(name.clone(), t.clone());
            }
            let started = Instant::now();
            let label = StageLabel {
                pipeline: id,
                stage: k as u32 + 1,
                stages: manifest.stages.len() as u32,
            };
            let out = self
                .run_stage(
                    JobRequest {
                        task,
                        weights,
                        inputs: stage_inputs,
                        tier,
                        seed,
                    },
                    StageJob {
                        pulls: std::mem::take(&mut pulls),
                        label: Some(label),
                    },
                )
                .await
                .map_err(|e| match e {
                    DispatchError::BadRequest(m) => {
                        DispatchError::BadRequest(format!("stage {}: {m}", k + 1))
                    }
                    e => e,
                })?;
            let mut boundary_bytes = 0;
            for (name, t) in out.outputs {
                if s.boundary_out.iter().any(|p| p.name == name) {
                    boundary_bytes += t.bytes().len() as u64;
                    carried.insert(name, t);
                } else {
                    results.insert(name, t);
                }
            }
            // The next stage's nodes fetch these from the nodes that agreed on them.
            let mut peers = Vec::new();
            for a in &out.receipt.nodes {
                if let Some(n) = self.ledger.node(&a.commitment.node.to_hex()).await? {
                    peers.push(n.url);
                }
            }
            for o in &out.receipt.outputs {
                if s.boundary_out.iter().any(|p| p.name == o.name) {
                    pulls.insert(
                        o.hash,
                        PullFrom {
                            peers: peers.clone(),
                            grant: PullGrant::sign(o.hash, tenet_proto::unix_now(), &self.key),
                        },
                    );
                }
            }
            stages.push(StageOutcome {
                job_id: out.job_id,
                task,
                replicas: out.receipt.replicas,
                agreeing: out.receipt.nodes.len(),
                slashed: out.slashed,
                refereed: out.refereed,
                ms: started.elapsed().as_secs_f64() * 1e3,
                boundary_bytes,
            });
            receipts.push(out.receipt);
        }
        let outputs = manifest
            .outputs
            .iter()
            .map(|p| {
                results
                    .remove(&p.name)
                    .map(|t| (p.name.clone(), t))
                    .ok_or_else(|| {
                        DispatchError::Internal(format!("output {} was not produced", p.name))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(PipelineOutcome {
            outputs,
            receipt: PipelineReceipt::sign(id, receipts, &self.key),
            stages,
        })
    }
}
