//! `tenet receipt verify`: check a receipt offline, and optionally re-run its job locally.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tenet_proto::auth::PublicKey;
use tenet_proto::commit::{Tier, output_hash, output_refs};
use tenet_proto::pipeline_receipt::PipelineReceipt;
use tenet_proto::receipt::Receipt;
use tenet_proto::{Hash, tensor};

/// Blob `hash` from `dir`: a file named by the hash, or a blob store's `blobs/xx/hash`.
fn blob(dir: &Path, hash: &Hash, what: &str) -> Result<Vec<u8>> {
    let hex = hash.to_hex();
    let candidates = [
        dir.join(&hex),
        dir.join("blobs").join(&hex[..2]).join(&hex),
        dir.join("store").join("blobs").join(&hex[..2]).join(&hex),
    ];
    let path = candidates.iter().find(|p| p.exists()).with_context(|| {
        format!(
            "{what} {hash} is not in {} (a file named by its hash, or a blob store)",
            dir.display()
        )
    })?;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if Hash::of(&bytes) != *hash {
        bail!("{} does not hash to {hash}", path.display());
    }
    Ok(bytes)
}

pub struct VerifyArgs<'a> {
    pub file: &'a Path,
    pub coordinator: Option<&'a str>,
    pub replay: Option<&'a PathBuf>,
    pub json: bool,
}

pub fn verify(a: VerifyArgs<'_>) -> Result<()> {
    let text = std::fs::read_to_string(a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let value = serde_json::from_str::<serde_json::Value>(&text).ok();
    if value
        .as_ref()
        .is_some_and(|v| v.get("init").is_some() && v.get("steps").is_some())
    {
        return verify_training(&a, &text);
    }
    if value
        .as_ref()
        .is_some_and(|v| v.get("generation").is_some())
    {
        return verify_staged(&a, &text);
    }
    if value.is_some_and(|v| v.get("stages").is_some()) {
        return verify_pipeline(&a, &text);
    }
    let receipt: Receipt = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a tenet receipt", a.file.display()))?;
    check(&a, |k| match k {
        Some(k) => receipt.verify_from(k),
        None => receipt.verify(),
    })?;
    let replayed = match a.replay {
        Some(dir) => Some(replay(&receipt, dir)?),
        None => None,
    };
    // Without --coordinator the signature is checked against the key the receipt itself
    // names: anyone can make such a receipt with a key of their own, so say so.
    let pinned = a.coordinator.is_some();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "verified": true, "job_id": receipt.job.job_id, "task": receipt.job.task,
                "output_hash": receipt.output_hash, "nodes": receipt.nodes.len(),
                "replicas": receipt.replicas, "coordinator": receipt.coordinator,
                "coordinator_pinned": pinned, "replayed": replayed.is_some(),
            })
        );
    } else {
        let signer = if pinned {
            format!(
                "signed by coordinator {}, the key you gave",
                receipt.coordinator
            )
        } else {
            format!(
                "signed by {}, the key the receipt names: UNPINNED — anyone can sign a receipt with a key of their own; pass --coordinator KEY to check it is the coordinator you trust",
                receipt.coordinator
            )
        };
        println!(
            "receipt verified: job {} on task {}\n  output hash {}\n  {} of {} node(s) agreed, each signature and commitment opening checked\n  {signer}",
            receipt.job.job_id,
            receipt.job.task.short(),
            receipt.output_hash,
            receipt.nodes.len(),
            receipt.replicas,
        );
        if let Some(d) = &receipt.dispute {
            let tenet_proto::trace::Verdict::Lost(lost) = &d.verdict;
            match (d.leaf, d.stalled, &d.committed) {
                (Some(leaf), _, _) => println!(
                    "  decided by a dispute: {} round(s) down two trace trees of {} nodes to %{leaf}, that one op re-run by the coordinator; party {lost:?} lost (walk and verdict checked)",
                    d.rounds.len(),
                    d.count,
                ),
                (None, Some(p), _) => println!(
                    "  decided by a dispute: party {p} stalled the walk after {} round(s) and lost by rule (walk and verdict checked)",
                    d.rounds.len()
                ),
                (None, None, Some(_)) => println!(
                    "  decided by a dispute: the two traces of {} nodes are the same; party {lost:?} committed to other outputs than its trace's (output proofs and verdict checked)",
                    d.count
                ),
                _ => println!("  decided by a dispute; party {lost:?} lost"),
            }
        }
        if let Some(msg) = replayed {
            println!("  {msg}");
        }
    }
    Ok(())
}

/// A pipeline call's receipt: every stage's receipt, the chain between them, the signature.
fn verify_pipeline(a: &VerifyArgs<'_>, text: &str) -> Result<()> {
    let receipt: PipelineReceipt = serde_json::from_str(text)
        .with_context(|| format!("{} is not a tenet pipeline receipt", a.file.display()))?;
    if a.replay.is_some() {
        bail!(
            "--replay replays one job's receipt; replay a pipeline's stages from their own receipts"
        );
    }
    check(a, |k| match k {
        Some(k) => receipt.verify_from(k),
        None => receipt.verify(),
    })?;
    let pinned = a.coordinator.is_some();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "verified": true, "pipeline": receipt.pipeline, "stages": receipt.stages.len(),
                "jobs": receipt.stages.iter().map(|s| &s.job.job_id).collect::<Vec<_>>(),
                "outputs": receipt.outputs(),
                "coordinator": receipt.coordinator, "coordinator_pinned": pinned,
            })
        );
        return Ok(());
    }
    println!(
        "pipeline receipt verified: pipeline {}, {} stage(s) chained",
        receipt.pipeline.short(),
        receipt.stages.len()
    );
    for (k, s) in receipt.stages.iter().enumerate() {
        let boundary: Vec<String> = s
            .outputs
            .iter()
            .filter(|o| o.name.starts_with('%'))
            .map(|o| format!("{} {}", o.name, o.hash.short()))
            .collect();
        println!(
            "  stage {}: job {} on task {}, {} of {} node(s) agreed{}",
            k + 1,
            s.job.job_id,
            s.job.task.short(),
            s.nodes.len(),
            s.replicas,
            if boundary.is_empty() {
                String::new()
            } else {
                format!("; passed on {}", boundary.join(", "))
            }
        );
    }
    println!(
        "  each stage read exactly what the stage before agreed on; {}",
        if pinned {
            format!(
                "signed by coordinator {}, the key you gave",
                receipt.coordinator
            )
        } else {
            format!(
                "signed by {}, the key the receipt names: UNPINNED — pass --coordinator KEY to check it is the coordinator you trust",
                receipt.coordinator
            )
        }
    );
    Ok(())
}

/// Re-run the job on this machine from blobs in `dir` and compare with the receipt.
fn replay(r: &Receipt, dir: &Path) -> Result<String> {
    let graph = tenet_ir::codec::decode(&blob(dir, &r.job.task, "task")?)
        .context("the task blob is not a canonical tenet graph")?;
    let weights = match &r.job.weights {
        Some(w) => vec![tenet_models::WeightsFile::from_bytes(
            blob(dir, w, "weights")?,
            &w.short(),
        )?],
        None => Vec::new(),
    };
    let mut inputs = HashMap::new();
    for (name, hash) in &r.job.inputs {
        let t = tensor::decode(&blob(dir, hash, &format!("input {name}"))?)
            .with_context(|| format!("input {name}"))?;
        inputs.insert(name.clone(), t);
    }
    // Replayed on this machine's CPU, whose bits every exact-tier device must give.
    let device = tenet_devices::open("cpu", &Default::default())?;
    let outputs =
        device
            .compile(&graph)?
            .run(&inputs, &tenet_models::WeightSet(weights), r.job.seed)?;
    let refs = output_refs(&outputs);
    if output_hash(&refs) == r.output_hash {
        return Ok("replayed locally: bit-identical outputs".into());
    }
    if r.job.tier == Tier::Exact {
        bail!(
            "replayed locally: the outputs differ from the receipt's (local output hash {}, receipt {})",
            output_hash(&refs),
            r.output_hash
        );
    }
    // Tolerant tier: compare element-wise with the receipt's outputs, if their blobs are here.
    let mut worst = 0f64;
    for ((name, mine), theirs) in outputs.iter().zip(&r.outputs) {
        let t = tensor::decode(&blob(dir, &theirs.hash, &format!("output {name}"))?)?;
        if t.ty() != mine.ty() {
            bail!(
                "output {name}: the receipt says {}, the replay gives {}",
                t.ty(),
                mine.ty()
            );
        }
        for (a, b) in mine.to_f32_vec().iter().zip(t.to_f32_vec()) {
            let d = (a - b).abs() as f64;
            if d.is_nan() || d > r.tolerance {
                bail!(
                    "output {name}: an element differs by {d}, above the receipt's bound {}",
                    r.tolerance
                );
            }
            worst = worst.max(d);
        }
    }
    Ok(format!(
        "replayed locally: within the tolerant bound {} (largest difference {worst})",
        r.tolerance
    ))
}

/// A staged generation's receipt (`tenet generate --coordinator`): the stages chain, the
/// coordinator's signature.
fn verify_staged(a: &VerifyArgs<'_>, text: &str) -> Result<()> {
    use tenet_proto::staged_receipt::StagedReceipt;
    let receipt: StagedReceipt = serde_json::from_str(text)
        .with_context(|| format!("{} is not a tenet staged receipt", a.file.display()))?;
    if a.replay.is_some() {
        bail!(
            "--replay replays one job's receipt; re-run `tenet generate` with the receipt's prompt and sampling to compare its tokens"
        );
    }
    check(a, |k| match k {
        Some(k) => receipt.verify_from(k),
        None => receipt.verify(),
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "verified": true, "generation": receipt.generation, "tokens": receipt.tokens,
                "stages": receipt.stages.len(), "replicas": receipt.replicas,
                "outvoted": receipt.outvoted, "coordinator": receipt.coordinator,
                "coordinator_pinned": a.coordinator.is_some(),
            })
        );
    } else {
        println!(
            "verified: staged generation {} — {} tokens, {} stages × {} nodes, {} outvoted, signed by coordinator {}",
            receipt.generation,
            receipt.tokens.len(),
            receipt.stages.len(),
            receipt.replicas,
            receipt.outvoted.len(),
            receipt.coordinator.to_hex()
        );
    }
    Ok(())
}

fn verify_training(a: &VerifyArgs<'_>, text: &str) -> Result<()> {
    use tenet_proto::training_receipt::TrainingReceipt;
    let receipt: TrainingReceipt = serde_json::from_str(text)
        .with_context(|| format!("{} is not a tenet training receipt", a.file.display()))?;
    if a.replay.is_some() {
        bail!(
            "--replay replays one job's receipt; `tenet train` with the run's settings (local, or --coordinator) checks a whole training"
        );
    }
    check(a, |k| match k {
        Some(k) => receipt.verify_from(k),
        None => receipt.verify(),
    })?;
    let jobs = 1 + receipt
        .steps
        .iter()
        .map(|s| s.shard_jobs().iter().map(Vec::len).sum::<usize>() + 1)
        .sum::<usize>();
    let first = receipt.steps.first().map(|s| s.shard_jobs());
    let shards = first.as_ref().map_or(0, Vec::len);
    // Pipeline-parallel training: each shard a pipeline of this many stages.
    let stages = first.as_ref().and_then(|f| f.first()).map_or(1, Vec::len);
    let disputes: usize = receipt
        .steps
        .iter()
        .flat_map(|s| s.shard_jobs().into_iter().flatten().chain([&s.update]))
        .filter(|r| r.dispute.is_some())
        .count();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "verified": true, "steps": receipt.steps.len(), "shards": shards,
                "pipeline_stages": stages, "jobs": jobs, "disputes": disputes,
                "seed": receipt.init.job.seed, "coordinator": receipt.init.coordinator,
                "coordinator_pinned": a.coordinator.is_some(),
                "final_params": receipt.final_params(),
            })
        );
    } else {
        let layout = if stages > 1 {
            format!("{shards} shards, each a pipeline of {stages} stages")
        } else {
            format!("{shards} shards")
        };
        println!(
            "verified: training of {} steps × {layout} ({} jobs, seed {}), chained from the initialisation to the final parameters, signed by coordinator {}",
            receipt.steps.len(),
            jobs,
            receipt.init.job.seed,
            receipt.init.coordinator.to_hex()
        );
        if disputes > 0 {
            println!(
                "{disputes} job(s) decided by a dispute, each transcript checked with its receipt"
            );
        }
    }
    Ok(())
}

/// Run `verify` with the coordinator key `--coordinator` pins (parsed here) — or, given a key
/// set file, with each key of the set until one verifies — or none; an error says the file
/// does not verify.
fn check<E: std::error::Error + Send + Sync + 'static>(
    a: &VerifyArgs<'_>,
    verify: impl Fn(Option<&PublicKey>) -> Result<(), E>,
) -> Result<()> {
    let Some(pinned) = a.coordinator else {
        return verify(None).with_context(|| format!("{} does NOT verify", a.file.display()));
    };
    let keys = coordinator_keys(pinned)?;
    let mut last = None;
    for k in &keys {
        match verify(Some(k)) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    let why = last.map_or_else(|| "the key set is empty".to_string(), |e| e.to_string());
    Err(anyhow::anyhow!(
        "{} does NOT verify against {} coordinator key(s) of {pinned}: {why}",
        a.file.display(),
        keys.len()
    ))
}

/// The largest key set file `--coordinator FILE` reads (thousands of coordinators' entries).
const MAX_KEY_SET_BYTES: u64 = 1 << 20;

/// `--coordinator`: one public key (64 hex characters), or a file holding a deployment's key
/// set — as `GET /v1/coordinators` answers (`{"coordinators": [{"key": …}, …]}`), a JSON
/// list of keys, or one key a line.
pub fn coordinator_keys(arg: &str) -> Result<Vec<PublicKey>> {
    if let Some(k) = PublicKey::parse(arg) {
        return Ok(vec![k]);
    }
    let path = Path::new(arg);
    if !path.exists() {
        bail!(
            "--coordinator `{arg}` is neither a 64-hex-character public key nor a key set file (save one with: curl -H 'authorization: Bearer KEY' URL/v1/coordinators > keys.json)"
        );
    }
    // A key set is a few keys; a file far larger is not one (and may come from anywhere).
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > MAX_KEY_SET_BYTES {
        bail!(
            "{} is {size} bytes: a key set file holds at most {MAX_KEY_SET_BYTES}",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let parse = |k: &str| {
        PublicKey::parse(k.trim()).with_context(|| {
            format!(
                "{}: `{}` is not a 64-hex-character public key",
                path.display(),
                k.trim()
            )
        })
    };
    let keys: Vec<PublicKey> = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(o)) => o
            .get("coordinators")
            .and_then(|c| c.as_array())
            .with_context(|| format!("{}: expected {{\"coordinators\": [...]}}", path.display()))?
            .iter()
            .map(|c| parse(c.get("key").and_then(|k| k.as_str()).unwrap_or("")))
            .collect::<Result<_>>()?,
        Ok(serde_json::Value::Array(list)) => list
            .iter()
            .map(|k| parse(k.as_str().unwrap_or("")))
            .collect::<Result<_>>()?,
        _ => text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(parse)
            .collect::<Result<_>>()?,
    };
    if keys.is_empty() {
        bail!("{} holds no coordinator keys", path.display());
    }
    Ok(keys)
}
