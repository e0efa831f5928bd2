//! `tenet train --coordinator URL`: ask the coordinator to run the training on its nodes
//! (`POST /v1/trainings`), follow it, then check the training receipt that comes back against
//! this machine's own copy of the dataset before reporting anything.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenet_exec::Device;
use tenet_ir::{DType, TensorType};
use tenet_net::Method;
use tenet_proto::training_receipt::TrainingReceipt;
use tenet_train::{Dataset, StepSpec};

use super::Settings;
use crate::coord_cmd::{Client, runtime};

#[allow(clippy::too_many_arguments)]
pub(super) fn train(
    args: &super::TrainArgs,
    s: &Settings,
    url: &str,
    data: &Dataset,
    epochs: u32,
    device: &dyn Device,
    spec: &StepSpec,
    stage_starts: &[usize],
    stages: &[tenet_ir::split::Stage],
) -> Result<()> {
    let client = Client::with_optional_key(url, args.api_key.as_deref())?;
    let model = spec.model.clone();
    let started = Instant::now();
    let (result, key) = runtime()?.block_on(async {
        let key = client.info().await?.coordinator;
        let mut body = json!({
            "dataset": s.dataset, "model": s.model, "optimizer": s.optimizer_name,
            "seed": s.seed, "epochs": epochs, "batch": s.batch, "data_parallel": s.shards,
        });
        if !s.stage_boundaries.is_empty() {
            body["stage_boundaries"] = json!(s.stage_boundaries);
        }
        if let Some(lr) = s.lr {
            body["lr"] = json!(lr);
        }
        let run = client
            .call(
                Method::POST,
                "/v1/trainings",
                serde_json::to_vec(&body)?,
                "application/json",
            )
            .await?;
        let id = run["training_id"]
            .as_str()
            .context("the coordinator did not say the training's id")?
            .to_string();
        let terminal = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let mut last_step = u64::MAX;
        loop {
            let v = client
                .call(
                    Method::GET,
                    &format!("/v1/trainings/{id}?wait=20"),
                    Vec::new(),
                    "application/json",
                )
                .await?;
            match v["state"].as_str() {
                Some("running") => {
                    let (step, steps) = (
                        v["step"].as_u64().unwrap_or(0),
                        v["steps"].as_u64().unwrap_or(0),
                    );
                    if !args.json && step != last_step {
                        let line = format!("training {id} on the network: step {step}/{steps}");
                        if terminal {
                            eprint!("\r{line}   ");
                        } else if step == 0
                            || steps > 0 && step * 10 / steps != last_step * 10 / steps.max(1)
                        {
                            eprintln!("{line}");
                        }
                        last_step = step;
                    }
                }
                Some("done") => {
                    if terminal {
                        eprintln!();
                    }
                    return Ok::<_, anyhow::Error>((v["result"].clone(), key));
                }
                Some("failed") => bail!(
                    "the training failed on the coordinator: {}",
                    v["error"].as_str().unwrap_or("no reason given")
                ),
                _ => bail!("the coordinator answered something else: {v}"),
            }
        }
    })?;
    let seconds = started.elapsed().as_secs_f64();

    let receipt: TrainingReceipt = serde_json::from_value(result["receipt"].clone())
        .context("the answer has no training receipt")?;
    let mut params = Vec::new();
    for p in model.params() {
        let ty = TensorType::new(DType::F32, p.shape.clone());
        let t = tenet_models::tensor_from_json(&result["params"][&p.name], &ty)
            .map_err(|e| anyhow::anyhow!("parameter {}: {e}", p.name))?;
        params.push((p.name, t));
    }
    tenet_train::verify::check_run(
        &receipt,
        &key,
        spec,
        stage_starts,
        data,
        s.seed,
        epochs,
        &params,
    )?;

    // Verified: the weights, their hash, and the test set on this machine.
    let weights_file = tenet_train::checkpoint::weights_file(&params)?;
    let weights_hash = tenet_proto::Hash::of(&weights_file).to_hex();
    std::fs::create_dir_all(&s.out)?;
    let weights = s.out.join("weights.safetensors");
    std::fs::write(&weights, &weights_file)?;
    let receipt_path = s.out.join("training-receipt.json");
    tenet_models::write_atomically(&receipt_path, serde_json::to_string(&receipt)?.as_bytes())?;
    let mut state = HashMap::new();
    for (name, t) in &params {
        state.insert(format!("param/{name}"), device.upload(t)?);
    }
    let (test_accuracy, test_loss) =
        tenet_train::trainer::evaluate(device, &model, &state, data, 500)?;
    let final_loss = result["losses"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN);
    let slashed = result["slashed"].clone();
    // Jobs decided by a dispute: where in the training, and the op the walk ended at.
    let shard_graphs: Vec<tenet_ir::Graph> = if stages.is_empty() {
        vec![spec.shard()?]
    } else {
        stages.iter().map(|st| st.graph.clone()).collect()
    };
    let update_graph = spec.update()?;
    let mut disputes = Vec::new();
    for (k, step) in receipt.steps.iter().enumerate() {
        let shard_jobs = step.shard_jobs();
        let jobs = shard_jobs
            .iter()
            .enumerate()
            .flat_map(|(s, stages)| {
                let several = stages.len() > 1;
                stages
                    .iter()
                    .zip(&shard_graphs)
                    .enumerate()
                    .map(move |(i, (r, g))| {
                        let job = if several {
                            format!("shard {s}, stage {}", i + 1)
                        } else {
                            format!("shard {s}")
                        };
                        (job, *r, g)
                    })
            })
            .chain(std::iter::once((
                "update".to_string(),
                &step.update,
                &update_graph,
            )));
        for (job, r, graph) in jobs {
            if let Some(d) = &r.dispute {
                let leaf = d.leaf.unwrap_or(u64::MAX);
                let op = graph
                    .nodes()
                    .get(leaf as usize)
                    .map_or("?", |n| n.op.name());
                disputes.push(json!({
                    "step": k + 1, "job": job, "node": leaf, "op": op,
                    "rounds": d.rounds.len(),
                }));
            }
        }
    }
    let jobs = 1 + receipt
        .steps
        .iter()
        .map(|s| s.shard_jobs().iter().map(Vec::len).sum::<usize>() + 1)
        .sum::<usize>();
    let pipeline_stages = shard_graphs.len();
    if args.json {
        println!(
            "{}",
            json!({
                "dataset": data.name, "model": model.label(), "optimizer": s.optimizer.describe(),
                "seed": s.seed, "steps": receipt.steps.len(), "epochs": epochs,
                "data_parallel": s.shards, "pipeline_stages": pipeline_stages,
                "stage_boundaries": s.stage_boundaries, "final_loss": final_loss,
                "test_accuracy": test_accuracy, "test_loss": test_loss,
                "weights_hash": weights_hash, "weights": weights, "receipt": receipt_path,
                "jobs": jobs, "slashed": slashed, "disputes": disputes,
                "verified": true, "seconds": seconds,
                "coordinator": key.to_hex(),
            })
        );
    } else {
        let layout = if pipeline_stages > 1 {
            format!(
                "{} shards a step, each a pipeline of {pipeline_stages} stages",
                s.shards
            )
        } else {
            format!("{} shards a step", s.shards)
        };
        println!(
            "{} on {} across the network ({layout}), seed {}: {} steps, {jobs} verified jobs in {seconds:.1} s",
            model.label(),
            data.name,
            s.seed,
            receipt.steps.len()
        );
        println!(
            "training receipt verified: every job signed by {}, chained step to step, the graphs and batches this run's",
            &key.to_hex()[..12]
        );
        for d in &disputes {
            println!(
                "  step {}, {}: replicas disagreed; bisection in {} rounds found %{} ({}) and the coordinator re-ran it",
                d["step"],
                d["job"].as_str().unwrap_or("?"),
                d["rounds"],
                d["node"],
                d["op"].as_str().unwrap_or("?")
            );
        }
        for x in slashed.as_array().into_iter().flatten() {
            let node: String = x["node"].as_str().unwrap_or("?").chars().take(12).collect();
            println!(
                "  node {node} disagreed at step {} and was slashed {}",
                x["step"], x["amount"]
            );
        }
        println!(
            "test accuracy {:.2}%  test loss {test_loss:.4}  final step loss {final_loss:.4}",
            test_accuracy * 100.0
        );
        println!("weights hash  {weights_hash}");
        println!("weights       {}", weights.display());
        println!("receipt       {}", receipt_path.display());
    }
    Ok(())
}
