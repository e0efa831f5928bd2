//! Receipts of data-parallel training on the network: every step's jobs, each a verified job
//! with its own signed receipt, chained by the hashes of what passed between them. A
//! [`TrainingReceipt`] holds the initialisation job's receipt and, for each step, the receipts
//! of the shards' gradient jobs and of the update job. Offline, [`TrainingReceipt::verify_from`]
//! checks every signature and that the steps chain: each job read exactly the parameters the
//! previous update (or the initialisation) wrote, the update read exactly the gradients its
//! shards agreed on and the state it wrote the step before (zeros at first), and the step
//! counter counts. In pipeline-parallel training a shard is a pipeline call: its
//! [`PipelineReceipt`] chains the stages, and each stage read the parameters of the step. What it cannot know — which graphs and which batches — the caller checks
//! against its own: [`TrainingReceipt::tasks`] and [`TrainingReceipt::shard_inputs`].

use std::collections::BTreeMap;

use tenet_ir::{DType, HostTensor, TensorType};

use crate::Hash;
use crate::auth::PublicKey;
use crate::pipeline_receipt::{PipelineReceipt, PipelineReceiptError};
use crate::receipt::{Receipt, ReceiptError};

/// One step's jobs: each shard's gradients as one job (`shards`) or, in pipeline-parallel
/// training, as a pipeline call whose stages each ran as a job (`pipelined`); then the update.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainingStep {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<Receipt>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pipelined: Vec<PipelineReceipt>,
    pub update: Receipt,
}

impl TrainingStep {
    /// Each shard's job receipts: its one job, or its pipeline's stages in order.
    pub fn shard_jobs(&self) -> Vec<Vec<&Receipt>> {
        if self.pipelined.is_empty() {
            self.shards.iter().map(|r| vec![r]).collect()
        } else {
            self.pipelined
                .iter()
                .map(|p| p.stages.iter().collect())
                .collect()
        }
    }
}

/// The jobs of a training run, in order.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainingReceipt {
    pub version: u32,
    pub init: Receipt,
    pub steps: Vec<TrainingStep>,
}

/// Why a training receipt does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrainingReceiptError {
    #[error("unsupported training receipt version {0} (this tenet reads version 1)")]
    Version(u32),
    #[error("{job}: {source}")]
    Job { job: String, source: ReceiptError },
    #[error("{job}: {source}")]
    Pipeline {
        job: String,
        source: PipelineReceiptError,
    },
    #[error("{job} read {input} with hash {got}, but the job before wrote {want}")]
    Chain {
        job: String,
        input: String,
        got: String,
        want: String,
    },
    #[error("{job}: {what}")]
    Shape { job: String, what: String },
}

fn zeros_hash(ty: &str) -> Option<Hash> {
    let ty = parse_type(ty)?;
    Some(crate::tensor::hash(&HostTensor::zeros(ty).ok()?))
}

/// `f32[2,3]` → the type (only f32 tensors pass between training jobs).
fn parse_type(text: &str) -> Option<TensorType> {
    let dims = text.strip_prefix("f32[")?.strip_suffix(']')?;
    let shape = if dims.is_empty() {
        Vec::new()
    } else {
        dims.split(',')
            .map(|d| d.trim().parse().ok())
            .collect::<Option<Vec<u64>>>()?
    };
    Some(TensorType::new(DType::F32, shape))
}

fn step_hash(t: u64) -> Hash {
    crate::tensor::hash(&HostTensor::from_f32(&[], &[t as f32]).expect("a scalar"))
}

impl TrainingReceipt {
    pub const VERSION: u32 = 1;

    /// Every job's receipt is signed by `coordinator` and checks out, and the jobs chain.
    pub fn verify_from(&self, coordinator: &PublicKey) -> Result<(), TrainingReceiptError> {
        if self.version != Self::VERSION {
            return Err(TrainingReceiptError::Version(self.version));
        }
        let check = |r: &Receipt, job: &str| {
            r.verify_from(coordinator)
                .map_err(|source| TrainingReceiptError::Job {
                    job: job.to_string(),
                    source,
                })
        };
        check(&self.init, "the initialisation")?;
        // What the next step must read: parameters and state by input name, with types.
        let mut params: BTreeMap<String, (Hash, String)> = BTreeMap::new();
        for o in &self.init.outputs {
            if o.name.starts_with("param/") {
                params.insert(o.name.clone(), (o.hash, o.ty.clone()));
            }
        }
        if params.is_empty() {
            return Err(TrainingReceiptError::Shape {
                job: "the initialisation".into(),
                what: "wrote no parameters".into(),
            });
        }
        let mut state: Option<BTreeMap<String, Hash>> = None;
        let chain = |job: &str, r: &Receipt, input: &str, want: &Hash| match r.job.inputs.get(input)
        {
            Some(got) if got == want => Ok(()),
            got => Err(TrainingReceiptError::Chain {
                job: job.to_string(),
                input: input.to_string(),
                got: got.map_or("nothing".into(), |h| h.to_hex()),
                want: want.to_hex(),
            }),
        };
        for (k, step) in self.steps.iter().enumerate() {
            let n = k + 1;
            if step.shards.is_empty() == step.pipelined.is_empty() {
                return Err(TrainingReceiptError::Shape {
                    job: format!("step {n}"),
                    what: "needs its shards as jobs or as pipelines (one of the two)".into(),
                });
            }
            for (s, shard) in step.shards.iter().enumerate() {
                let job = format!("step {n}, shard {s}");
                check(shard, &job)?;
                for (name, (hash, _)) in &params {
                    chain(&job, shard, name, hash)?;
                }
            }
            for (s, pipeline) in step.pipelined.iter().enumerate() {
                // Signatures, and the stages chained by their boundary tensors.
                pipeline.verify_from(coordinator).map_err(|source| {
                    TrainingReceiptError::Pipeline {
                        job: format!("step {n}, shard {s}"),
                        source,
                    }
                })?;
                // Every stage read the parameters the step before wrote, and only those.
                for (i, stage) in pipeline.stages.iter().enumerate() {
                    let job = format!("step {n}, shard {s}, stage {}", i + 1);
                    for name in stage.job.inputs.keys() {
                        if !name.starts_with("param/") {
                            continue;
                        }
                        let Some((hash, _)) = params.get(name) else {
                            return Err(TrainingReceiptError::Shape {
                                job,
                                what: format!("read {name}, which the model does not have"),
                            });
                        };
                        chain(&job, stage, name, hash)?;
                    }
                }
            }
            let job = format!("step {n}, update");
            check(&step.update, &job)?;
            let u = &step.update;
            for (name, (hash, _)) in &params {
                chain(&job, u, name, hash)?;
            }
            chain(&job, u, "step", &step_hash(n as u64))?;
            for (s, jobs) in step.shard_jobs().iter().enumerate() {
                for o in jobs.iter().flat_map(|r| &r.outputs) {
                    if let Some(p) = o.name.strip_prefix("grad/") {
                        chain(&job, u, &format!("grad{s}/{p}"), &o.hash)?;
                    }
                }
            }
            // State: zeros of each slot's type at the first step, the last update's after.
            for (name, hash) in &u.job.inputs {
                if !name.starts_with("state/") {
                    continue;
                }
                let want = match &state {
                    Some(st) => st.get(name).copied(),
                    None => {
                        let param = name
                            .strip_prefix("state/")
                            .and_then(|r| r.rsplit_once('/'))
                            .map(|(p, _)| format!("param/{p}"));
                        param
                            .and_then(|p| params.get(&p))
                            .and_then(|(_, ty)| zeros_hash(ty))
                    }
                };
                match want {
                    Some(w) if w == *hash => {}
                    w => {
                        return Err(TrainingReceiptError::Chain {
                            job: job.clone(),
                            input: name.clone(),
                            got: hash.to_hex(),
                            want: w.map_or("no such state".into(), |h| h.to_hex()),
                        });
                    }
                }
            }
            let mut next_params = BTreeMap::new();
            let mut next_state = BTreeMap::new();
            for o in &u.outputs {
                if o.name.starts_with("param/") {
                    next_params.insert(o.name.clone(), (o.hash, o.ty.clone()));
                } else if o.name.starts_with("state/") {
                    next_state.insert(o.name.clone(), o.hash);
                }
            }
            if next_params.keys().ne(params.keys()) {
                return Err(TrainingReceiptError::Shape {
                    job,
                    what: "wrote other parameters than it read".into(),
                });
            }
            params = next_params;
            state = Some(next_state);
        }
        Ok(())
    }

    /// [`TrainingReceipt::verify_from`] the key the initialisation's receipt names (every other
    /// job must be signed by the same one). Anyone can sign with a key of their own: pin the
    /// coordinator's key where you know it.
    pub fn verify(&self) -> Result<(), TrainingReceiptError> {
        self.verify_from(&self.init.coordinator)
    }

    /// The final parameters' blob hashes by parameter name (`param/` stripped).
    pub fn final_params(&self) -> BTreeMap<String, Hash> {
        let last = self.steps.last().map_or(&self.init, |s| &s.update);
        last.outputs
            .iter()
            .filter_map(|o| Some((o.name.strip_prefix("param/")?.to_string(), o.hash)))
            .collect()
    }

    /// The graphs the jobs ran: the initialisation's task id, the shards' (one, or a pipeline's
    /// stages in order) and the update's; `None` when the steps do not all run the same ones.
    pub fn tasks(&self) -> Option<(Hash, Vec<Hash>, Hash)> {
        let shard_tasks = |s: &TrainingStep| -> Vec<Vec<Hash>> {
            s.shard_jobs()
                .iter()
                .map(|jobs| jobs.iter().map(|r| r.job.task).collect())
                .collect()
        };
        let first = self.steps.first()?;
        let shard = shard_tasks(first).first()?.clone();
        let update = first.update.job.task;
        let same = self
            .steps
            .iter()
            .all(|s| s.update.job.task == update && shard_tasks(s).iter().all(|t| *t == shard));
        same.then_some((self.init.job.task, shard, update))
    }

    /// Each step's shards' `x` and `y` input hashes, to compare with the batches the caller
    /// cuts from its own copy of the dataset.
    pub fn shard_inputs(&self) -> Vec<Vec<(Option<Hash>, Option<Hash>)>> {
        self.steps
            .iter()
            .map(|s| {
                // In a pipeline, the stages that read `x` or `y` read the same tensor (the
                // pipeline receipt checks that): the first one's.
                let read = |jobs: &[&Receipt], name: &str| {
                    jobs.iter().find_map(|r| r.job.inputs.get(name).copied())
                };
                s.shard_jobs()
                    .iter()
                    .map(|jobs| (read(jobs, "x"), read(jobs, "y")))
                    .collect()
            })
            .collect()
    }
}
