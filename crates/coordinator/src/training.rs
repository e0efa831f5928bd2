//! Data-parallel training on the network: each step's batch cut into shards, each shard's
//! gradients computed as a verified job (its replicas compared exactly, a liar outvoted and
//! slashed like in any job), then the update from the agreed gradients as one more verified job.
//! The graphs are `tenet_train`'s (`StepSpec::shard`, `StepSpec::update`, `init_graph`), so the
//! parameters after every step are bit for bit those of training on one machine with the same
//! shards (`tenet train --shards S`). The answer is a [`TrainingReceipt`]: every job's receipt,
//! chained by the hashes of what passed between them.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::try_join_all;
use tenet_ir::{DType, Graph, HostTensor, TensorType};
use tenet_ledger::Ledger;
use tenet_proto::Hash;
use tenet_proto::commit::Tier;
use tenet_proto::pipeline_receipt::PipelineReceipt;
use tenet_proto::receipt::Receipt;
use tenet_proto::training_receipt::{TrainingReceipt, TrainingStep};
use tenet_train::{Arch, Optimizer, StepSpec};

use crate::dispatch::{Coordinator, DispatchError, JobRequest};

/// The most steps one training request may run (a bound on the work and on the receipt).
pub const MAX_STEPS: u64 = 20_000;
/// The most stage boundaries a training request may name (a pipeline of `2n + 1` stages).
pub const MAX_STAGE_BOUNDARIES: usize = 8;

/// What to train: a dataset this coordinator has fetched (`tenet models fetch`), a bundled
/// model, and the settings of `tenet train`.
#[derive(Clone, Debug)]
pub struct TrainingRequest {
    pub dataset: String,
    pub arch: Arch,
    pub optimizer: Optimizer,
    pub seed: u64,
    pub epochs: u32,
    pub batch: u64,
    /// Shards per step, each a job of its own (`data_parallel`).
    pub shards: u64,
    /// The layers (names or 0-based positions) where pipeline stages begin; empty: each shard
    /// is one job (`stage_boundaries`).
    pub stage_boundaries: Vec<String>,
}

/// A finished training run.
#[derive(Debug)]
pub struct TrainingOutcome {
    /// The final parameters by name (without `param/`).
    pub params: Vec<(String, HostTensor)>,
    pub receipt: TrainingReceipt,
    /// Nodes slashed on the way: (step, 0 for the initialisation; node; amount).
    pub slashed: Vec<(u64, String, i64)>,
    /// Each step's mean loss.
    pub losses: Vec<f32>,
}

fn bad(message: impl std::fmt::Display) -> DispatchError {
    DispatchError::BadRequest(message.to_string())
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Store `graph` as a task (as `POST /v1/tasks` does); its id.
    fn deploy_graph(&self, graph: &Graph) -> Result<Hash, DispatchError> {
        self.check_deployable(graph.cost())?;
        self.store
            .put_bytes(&graph.to_bytes())
            .map_err(|e| DispatchError::Internal(e.to_string()))
    }

    /// Run a training request to its end; `progress(step, steps)` after each step.
    pub async fn train(
        self: &Arc<Self>,
        req: &TrainingRequest,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<TrainingOutcome, DispatchError> {
        let data = tenet_train::data::load(&req.dataset).map_err(bad)?;
        let model = tenet_train::ModelSpec::Bundled(req.arch)
            .fit(&data.sample_shape, data.classes as u64)
            .map_err(bad)?;
        let spec = StepSpec {
            model: model.clone(),
            optimizer: req.optimizer,
            batch: req.batch,
            shards: req.shards,
        };
        if req.batch == 0 || data.train_len() < req.batch as usize {
            return Err(bad(format!(
                "a batch of {} does not fit the {} training samples",
                req.batch,
                data.train_len()
            )));
        }
        let per_epoch = data.train_len() as u64 / req.batch;
        let total = per_epoch * u64::from(req.epochs);
        if total > MAX_STEPS {
            return Err(bad(format!(
                "{total} steps asked for; a training request runs at most {MAX_STEPS}"
            )));
        }
        let starts = spec.stage_starts(&req.stage_boundaries).map_err(bad)?;
        let init_task = self.deploy_graph(&tenet_train::step::init_graph(&model).map_err(bad)?)?;
        let shard_graph = spec.shard().map_err(bad)?;
        let shard_run = if starts.is_empty() {
            ShardRun::Job(self.deploy_graph(&shard_graph)?)
        } else {
            // Each stage a task of its own, the manifest chaining them a pipeline.
            let stages = spec.shard_stages(&starts).map_err(bad)?;
            for stage in &stages {
                self.deploy_graph(&stage.graph)?;
            }
            let manifest = tenet_pipeline::manifest_of(&shard_graph, &stages).map_err(bad)?;
            let (id, manifest) = self.deploy_pipeline(manifest.to_json().as_bytes())?;
            ShardRun::Pipeline(id, Arc::new(manifest))
        };
        let update_task = self.deploy_graph(&spec.update().map_err(bad)?)?;
        let job = |task: Hash, inputs: BTreeMap<String, HostTensor>, seed: u64| JobRequest {
            task,
            weights: None,
            inputs,
            tier: Tier::Exact,
            seed,
        };
        let mut slashed = Vec::new();
        let note = |slashed: &mut Vec<(u64, String, i64)>, step: u64, by: &[(String, i64)]| {
            for (node, amount) in by {
                slashed.push((step, node.clone(), *amount));
            }
        };

        let init = self.run(job(init_task, BTreeMap::new(), req.seed)).await?;
        note(&mut slashed, 0, &init.slashed);
        let mut params: BTreeMap<String, HostTensor> = init.outputs.iter().cloned().collect();
        let mut state: BTreeMap<String, HostTensor> = BTreeMap::new();
        for p in model.params() {
            for slot in req.optimizer.slots() {
                let ty = TensorType::new(DType::F32, p.shape.clone());
                let zeros = HostTensor::zeros(ty).map_err(bad)?;
                state.insert(format!("state/{}/{slot}", p.name), zeros);
            }
        }
        let mut steps = Vec::with_capacity(total as usize);
        let mut losses = Vec::with_capacity(total as usize);
        let rows_per_shard = (req.batch / req.shards) as usize;
        let mut order = Vec::new();
        for done in 0..total {
            if done % per_epoch == 0 {
                let epoch = (done / per_epoch) as u32;
                order = tenet_train::trainer::epoch_order(req.seed, epoch, data.train_len());
            }
            let k = (done % per_epoch) as usize;
            let rows = &order[k * req.batch as usize..(k + 1) * req.batch as usize];
            let shard_jobs = rows.chunks(rows_per_shard).map(|part| {
                let (x, y) = tenet_train::trainer::train_batch(&data, part);
                let mut inputs = params.clone();
                inputs.insert("x".into(), x);
                inputs.insert("y".into(), y);
                self.run_shard(&shard_run, inputs)
            });
            let shards = try_join_all(shard_jobs).await?;
            let mut inputs = params.clone();
            inputs.extend(state.clone());
            let mut loss = 0f32;
            for (s, out) in shards.iter().enumerate() {
                note(&mut slashed, done + 1, &out.slashed);
                for (name, t) in &out.outputs {
                    if let Some(p) = name.strip_prefix("grad/") {
                        inputs.insert(format!("grad{s}/{p}"), t.clone());
                    } else if name == "loss" {
                        // The same order as the one-graph step's sum of the shards' terms.
                        loss = if s == 0 {
                            t.get_f32(0)
                        } else {
                            loss + t.get_f32(0)
                        };
                    }
                }
            }
            let t = HostTensor::from_f32(&[], &[(done + 1) as f32]).map_err(bad)?;
            inputs.insert("step".into(), t);
            let update = self.run(job(update_task, inputs, 0)).await?;
            note(&mut slashed, done + 1, &update.slashed);
            for (name, t) in &update.outputs {
                if name.starts_with("param/") {
                    params.insert(name.clone(), t.clone());
                } else if name.starts_with("state/") {
                    state.insert(name.clone(), t.clone());
                }
            }
            losses.push(loss);
            let mut step = TrainingStep {
                shards: Vec::new(),
                pipelined: Vec::new(),
                update: update.receipt,
            };
            for out in shards {
                match out.receipt {
                    ShardReceipt::Job(r) => step.shards.push(*r),
                    ShardReceipt::Pipeline(r) => step.pipelined.push(r),
                }
            }
            steps.push(step);
            progress(done + 1, total);
        }
        let receipt = TrainingReceipt {
            version: TrainingReceipt::VERSION,
            init: init.receipt,
            steps,
        };
        let params = params
            .into_iter()
            .filter_map(|(n, t)| Some((n.strip_prefix("param/")?.to_string(), t)))
            .collect();
        Ok(TrainingOutcome {
            params,
            receipt,
            slashed,
            losses,
        })
    }
}

/// How a step's shard runs: one job of this task, or a call of this pipeline.
enum ShardRun {
    Job(Hash),
    Pipeline(Hash, Arc<tenet_pipeline::Manifest>),
}

enum ShardReceipt {
    Job(Box<Receipt>),
    Pipeline(PipelineReceipt),
}

/// A shard's agreed outputs, its receipt, and the nodes slashed on its way.
struct ShardOutcome {
    outputs: Vec<(String, HostTensor)>,
    receipt: ShardReceipt,
    slashed: Vec<(String, i64)>,
}

impl<L: Ledger + 'static> Coordinator<L> {
    async fn run_shard(
        self: &Arc<Self>,
        how: &ShardRun,
        inputs: BTreeMap<String, HostTensor>,
    ) -> Result<ShardOutcome, DispatchError> {
        match how {
            ShardRun::Job(task) => {
                let out = self
                    .run(JobRequest {
                        task: *task,
                        weights: None,
                        inputs,
                        tier: Tier::Exact,
                        seed: 0,
                    })
                    .await?;
                Ok(ShardOutcome {
                    outputs: out.outputs,
                    receipt: ShardReceipt::Job(Box::new(out.receipt)),
                    slashed: out.slashed,
                })
            }
            ShardRun::Pipeline(id, manifest) => {
                let out = self
                    .run_pipeline(*id, manifest, inputs, Tier::Exact, 0)
                    .await?;
                Ok(ShardOutcome {
                    outputs: out.outputs,
                    receipt: ShardReceipt::Pipeline(out.receipt),
                    slashed: out.stages.into_iter().flat_map(|s| s.slashed).collect(),
                })
            }
        }
    }
}

/// At most this many trainings run at once on a coordinator; more are refused (busy).
pub const MAX_RUNNING: usize = 2;
/// Finished trainings whose results are kept for `GET /v1/trainings/{id}` (oldest dropped).
pub const MAX_KEPT: usize = 16;

impl TrainingRequest {
    /// The body of `POST /v1/trainings`: `{dataset, model, optimizer, lr, seed, epochs, batch,
    /// data_parallel, stage_boundaries}`; unknown fields and out-of-range values are refused by
    /// name.
    pub fn from_json(v: &serde_json::Value) -> Result<TrainingRequest, DispatchError> {
        const FIELDS: [&str; 9] = [
            "dataset",
            "model",
            "optimizer",
            "lr",
            "seed",
            "epochs",
            "batch",
            "data_parallel",
            "stage_boundaries",
        ];
        let obj = v
            .as_object()
            .ok_or_else(|| bad("the body must be a JSON object"))?;
        if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown field {k:?} (known: {})",
                FIELDS.join(", ")
            )));
        }
        let dataset = v["dataset"]
            .as_str()
            .filter(|d| tenet_train::data::DATASETS.contains(d))
            .ok_or_else(|| bad("dataset: digits or mnist"))?
            .to_string();
        let int = |key: &str, default: u64, max: u64| -> Result<u64, DispatchError> {
            match &v[key] {
                serde_json::Value::Null => Ok(default),
                x => x
                    .as_u64()
                    .filter(|n| (1..=max).contains(n) || (key == "seed" && *n == 0))
                    .ok_or_else(|| bad(format!("{key}: a whole number from 1 to {max}"))),
            }
        };
        let arch = Arch::from_name(v["model"].as_str().unwrap_or("mlp"))
            .ok_or_else(|| bad("model: mlp or cnn"))?;
        let lr = match &v["lr"] {
            serde_json::Value::Null => None,
            x => Some(
                x.as_f64()
                    .filter(|l| l.is_finite() && *l > 0.0 && *l <= 10.0)
                    .ok_or_else(|| bad("lr: a positive number"))? as f32,
            ),
        };
        let optimizer =
            Optimizer::by_name(v["optimizer"].as_str().unwrap_or("adamw"), lr, &dataset)
                .ok_or_else(|| bad("optimizer: adamw or sgd"))?;
        let batch = int("batch", 32, 4096)?;
        let shards = int("data_parallel", 1, 64)?;
        let epochs = int(
            "epochs",
            u64::from(tenet_train::data::default_epochs(&dataset)),
            1000,
        )? as u32;
        if !batch.is_multiple_of(shards) {
            return Err(bad(format!(
                "data_parallel {shards} must divide batch {batch}"
            )));
        }
        let stage_boundaries = match &v["stage_boundaries"] {
            serde_json::Value::Null => Vec::new(),
            serde_json::Value::Array(list) if list.len() <= MAX_STAGE_BOUNDARIES => list
                .iter()
                .map(|b| match b {
                    serde_json::Value::String(s) if !s.is_empty() && s.len() <= 64 => Ok(s.clone()),
                    serde_json::Value::Number(n) if n.is_u64() => Ok(n.to_string()),
                    _ => Err(()),
                })
                .collect::<Result<_, ()>>()
                .map_err(|()| {
                    bad("stage_boundaries: layer names (\"fc2\") or 0-based positions (3)")
                })?,
            _ => {
                return Err(bad(format!(
                    "stage_boundaries: a list of at most {MAX_STAGE_BOUNDARIES} layers"
                )));
            }
        };
        Ok(TrainingRequest {
            dataset,
            arch,
            optimizer,
            seed: int("seed", 0, u64::MAX)?,
            epochs,
            batch,
            shards,
            stage_boundaries,
        })
    }
}

/// One training started through the API.
pub struct TrainingRun {
    progress: std::sync::Mutex<(u64, u64)>,
    result: std::sync::Mutex<Option<Result<serde_json::Value, String>>>,
    done: tokio::sync::watch::Sender<bool>,
}

/// Trainings started through the API, kept in memory (a restarted coordinator forgets them).
#[derive(Default)]
pub struct Trainings {
    runs: std::sync::Mutex<Vec<(String, Arc<TrainingRun>)>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TrainingOutcome {
    /// The answer of `GET /v1/trainings/{id}` once done.
    pub fn to_json(&self) -> serde_json::Value {
        let params: serde_json::Value =
            serde_json::from_str(&tenet_models::outputs_json(&self.params))
                .unwrap_or(serde_json::Value::Null);
        serde_json::json!({
            "steps": self.receipt.steps.len(),
            "losses": self.losses,
            "params": params,
            "receipt": self.receipt,
            "slashed": self.slashed.iter().map(|(step, node, amount)| {
                serde_json::json!({"step": step, "node": node, "amount": amount})
            }).collect::<Vec<_>>(),
        })
    }
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Start `req` in a task of its own; its id. Refused while [`MAX_RUNNING`] run.
    pub fn start_training(self: &Arc<Self>, req: TrainingRequest) -> Result<String, DispatchError> {
        let (done, _) = tokio::sync::watch::channel(false);
        let run = Arc::new(TrainingRun {
            progress: std::sync::Mutex::new((0, 0)),
            result: std::sync::Mutex::new(None),
            done,
        });
        let id = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>());
        {
            let mut runs = lock(&self.trainings.runs);
            let running = runs
                .iter()
                .filter(|(_, r)| lock(&r.result).is_none())
                .count();
            if running >= MAX_RUNNING {
                return Err(DispatchError::Busy(format!(
                    "{running} trainings are running on this coordinator; try again when one ends"
                )));
            }
            // Forget the oldest finished runs beyond what is kept.
            while runs.len() >= MAX_KEPT + MAX_RUNNING {
                match runs.iter().position(|(_, r)| lock(&r.result).is_some()) {
                    Some(i) => {
                        runs.remove(i);
                    }
                    None => break,
                }
            }
            runs.push((id.clone(), run.clone()));
        }
        let me = self.clone();
        tokio::spawn(async move {
            let report = |step: u64, total: u64| *lock(&run.progress) = (step, total);
            let result = me
                .train(&req, &report)
                .await
                .map(|out| out.to_json())
                .map_err(|e| e.to_string());
            *lock(&run.result) = Some(result);
            let _ = run.done.send(true);
        });
        Ok(id)
    }

    /// What `GET /v1/trainings/{id}` answers, after waiting up to `wait` for the end; `None`
    /// for an unknown id.
    pub async fn training_view(
        &self,
        id: &str,
        wait: std::time::Duration,
    ) -> Option<serde_json::Value> {
        let run = lock(&self.trainings.runs)
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())?;
        let mut done = run.done.subscribe();
        if !*done.borrow() {
            let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        }
        let (step, steps) = *lock(&run.progress);
        Some(match &*lock(&run.result) {
            None => {
                serde_json::json!({"training_id": id, "state": "running", "step": step, "steps": steps})
            }
            Some(Ok(result)) => {
                serde_json::json!({"training_id": id, "state": "done", "result": result})
            }
            Some(Err(e)) => serde_json::json!({"training_id": id, "state": "failed", "error": e}),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::TrainingRequest;

    #[test]
    fn requests_are_read_strictly() {
        let r =
            TrainingRequest::from_json(&json!({"dataset": "digits", "data_parallel": 4})).unwrap();
        assert_eq!((r.batch, r.shards, r.epochs, r.seed), (32, 4, 40, 0));
        let r = TrainingRequest::from_json(
            &json!({"dataset": "mnist", "model": "cnn", "optimizer": "sgd", "lr": 0.1, "seed": 7}),
        )
        .unwrap();
        assert_eq!((r.epochs, r.seed), (2, 7));
        assert!(r.stage_boundaries.is_empty());
        let r = TrainingRequest::from_json(
            &json!({"dataset": "mnist", "model": "cnn", "stage_boundaries": ["conv2", 7]}),
        )
        .unwrap();
        assert_eq!(r.stage_boundaries, ["conv2", "7"]);
        for (body, want) in [
            (json!([1]), "a JSON object"),
            (json!({"dataset": "cifar"}), "dataset: digits or mnist"),
            (
                json!({"dataset": "digits", "shards": 2}),
                "unknown field \"shards\"",
            ),
            (
                json!({"dataset": "digits", "batch": 0}),
                "batch: a whole number",
            ),
            (
                json!({"dataset": "digits", "batch": 10, "data_parallel": 3}),
                "must divide",
            ),
            (
                json!({"dataset": "digits", "lr": -1}),
                "lr: a positive number",
            ),
            (json!({"dataset": "digits", "epochs": 1e9}), "epochs"),
            (
                json!({"dataset": "digits", "model": "gpt"}),
                "model: mlp or cnn",
            ),
            (
                json!({"dataset": "digits", "optimizer": "lion"}),
                "optimizer: adamw or sgd",
            ),
            (
                json!({"dataset": "digits", "stage_boundaries": "fc2"}),
                "stage_boundaries: a list of at most 8",
            ),
            (
                json!({"dataset": "digits", "stage_boundaries": vec![1; 9]}),
                "stage_boundaries: a list of at most 8",
            ),
            (
                json!({"dataset": "digits", "stage_boundaries": [{"layer": 3}]}),
                "layer names",
            ),
            (
                json!({"dataset": "digits", "stage_boundaries": [-1]}),
                "layer names",
            ),
        ] {
            let e = TrainingRequest::from_json(&body).unwrap_err().to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
    }
}
