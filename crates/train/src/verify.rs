//! Checking a training run the network did, from the caller's side: the training receipt's
//! signatures and chain (`tenet_proto::training_receipt`), that its jobs ran exactly the graphs
//! this configuration builds, on exactly the batches this seed cuts from the caller's own copy
//! of the dataset, and that the parameters handed back are the ones the last job agreed on.
//! What passes is the same training as `tenet train` with the same settings on this machine.

use tenet_ir::HostTensor;
use tenet_proto::Hash;
use tenet_proto::auth::PublicKey;
use tenet_proto::training_receipt::{TrainingReceipt, TrainingReceiptError};

use crate::data::Dataset;
use crate::step::{StepSpec, init_graph};
use crate::trainer::{epoch_order, train_batch};

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("the training receipt does not check out: {0}")]
    Receipt(#[from] TrainingReceiptError),
    #[error("the receipt's {which} jobs ran graph {got}, not this configuration's {want}")]
    Task {
        which: &'static str,
        got: String,
        want: String,
    },
    #[error("the receipt holds {got} steps; {want} were asked for")]
    Steps { got: usize, want: u64 },
    #[error("the initialisation ran with seed {got}, not {want}")]
    Seed { got: u64, want: u64 },
    #[error(
        "step {step}, shard {shard}: its {input} is not the batch the seed cuts from the dataset"
    )]
    Batch {
        step: usize,
        shard: usize,
        input: &'static str,
    },
    #[error("parameter {0}: what came back is not what the last job agreed on")]
    Param(String),
    #[error("building the graphs to compare: {0}")]
    Graph(String),
}

fn graph_hash(g: &tenet_ir::Graph) -> Hash {
    Hash::of(&g.to_bytes())
}

/// Check `receipt` (signed by `coordinator`) as the run of `spec` on `data` with `seed` for
/// `epochs` — each shard cut into pipeline stages at the layers `stage_starts` where that is
/// not empty ([`StepSpec::shard_stages`]) — ending with `params` (by parameter name).
#[allow(clippy::too_many_arguments)]
pub fn check_run(
    receipt: &TrainingReceipt,
    coordinator: &PublicKey,
    spec: &StepSpec,
    stage_starts: &[usize],
    data: &Dataset,
    seed: u64,
    epochs: u32,
    params: &[(String, HostTensor)],
) -> Result<(), VerifyError> {
    receipt.verify_from(coordinator)?;
    let graph = |r: Result<tenet_ir::Graph, crate::step::StepError>| {
        r.map(|g| graph_hash(&g))
            .map_err(|e| VerifyError::Graph(e.to_string()))
    };
    let shard_tasks = if stage_starts.is_empty() {
        vec![graph(spec.shard())?]
    } else {
        spec.shard_stages(stage_starts)
            .map_err(|e| VerifyError::Graph(e.to_string()))?
            .iter()
            .map(|s| graph_hash(&s.graph))
            .collect()
    };
    let want = (
        graph(init_graph(&spec.model))?,
        shard_tasks,
        graph(spec.update())?,
    );
    let hexes = |tasks: &[Hash]| {
        let hex: Vec<String> = tasks.iter().map(Hash::to_hex).collect();
        hex.join(", ")
    };
    let per_epoch = data.train_len() as u64 / spec.batch;
    let total = per_epoch * u64::from(epochs);
    if receipt.steps.len() as u64 != total {
        return Err(VerifyError::Steps {
            got: receipt.steps.len(),
            want: total,
        });
    }
    if receipt.init.job.task != want.0 {
        return Err(VerifyError::Task {
            which: "initialisation",
            got: receipt.init.job.task.to_hex(),
            want: want.0.to_hex(),
        });
    }
    if receipt.init.job.seed != seed {
        return Err(VerifyError::Seed {
            got: receipt.init.job.seed,
            want: seed,
        });
    }
    if total > 0 {
        let (_, shard, update) = receipt.tasks().ok_or_else(|| VerifyError::Task {
            which: "step",
            got: "several graphs".into(),
            want: hexes(&want.1),
        })?;
        if shard != want.1 {
            return Err(VerifyError::Task {
                which: "shard",
                got: hexes(&shard),
                want: hexes(&want.1),
            });
        }
        if update != want.2 {
            return Err(VerifyError::Task {
                which: "update",
                got: update.to_hex(),
                want: want.2.to_hex(),
            });
        }
    }
    let rows_per_shard = (spec.batch / spec.shards) as usize;
    let inputs = receipt.shard_inputs();
    let mut order = Vec::new();
    for (k, shards) in inputs.iter().enumerate() {
        let epoch = (k as u64 / per_epoch) as u32;
        if (k as u64).is_multiple_of(per_epoch) {
            order = epoch_order(seed, epoch, data.train_len());
        }
        let at = (k as u64 % per_epoch * spec.batch) as usize;
        let rows = &order[at..at + spec.batch as usize];
        if shards.len() != rows.len() / rows_per_shard {
            return Err(VerifyError::Batch {
                step: k + 1,
                shard: shards.len(),
                input: "shard count",
            });
        }
        for (s, (part, (x, y))) in rows.chunks(rows_per_shard).zip(shards).enumerate() {
            let (bx, by) = train_batch(data, part);
            if *x != Some(tenet_proto::tensor::hash(&bx)) {
                return Err(VerifyError::Batch {
                    step: k + 1,
                    shard: s,
                    input: "x",
                });
            }
            if *y != Some(tenet_proto::tensor::hash(&by)) {
                return Err(VerifyError::Batch {
                    step: k + 1,
                    shard: s,
                    input: "y",
                });
            }
        }
    }
    let agreed = receipt.final_params();
    if agreed.len() != params.len() {
        return Err(VerifyError::Param(format!(
            "{} came back, the receipt names {}",
            params.len(),
            agreed.len()
        )));
    }
    for (name, t) in params {
        if agreed.get(name) != Some(&tenet_proto::tensor::hash(t)) {
            return Err(VerifyError::Param(name.clone()));
        }
    }
    Ok(())
}
