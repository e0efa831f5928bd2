//! The generation-across-nodes benchmark: SmolLM2 greedy decoding with its layers in stages on
//! `tenet node` processes on 127.0.0.1 (`tenet_net::stages`), each stage once (r = 1) and on
//! three nodes at once (r = 3), against decoding the same tokens locally in the same run. The
//! figure the issue sets a goal for is r = 1's decode rate over the local one (≥ 0.7); the
//! overhead is reported per stage hop (one round trip carrying one boundary row) per token.
//! Decode rates count the tokens after the first over the time after the first arrived, so
//! the prefill (and the nodes compiling their graphs, in a warm-up run before) stays out.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenet_exec::Device;
use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::smollm2::{GGUF_FILE, SmolLm2, Stage, WeightsMode};
use tenet_net::stages::{StageFiles, StagePipeline};
use tenet_net::{NodeClient, identity};

use crate::node::{Spawned, spawn_node};

/// How to run the benchmark.
pub struct PipelineBenchOptions {
    /// Tokens to generate (fewer if the model ends its answer first).
    pub tokens: usize,
    /// Stages the model is cut into.
    pub stages: u64,
    /// Threads per node, and for the local decode.
    pub threads: usize,
}

/// One way of decoding and what it measured.
pub struct PipelineRow {
    pub name: String,
    pub tokens: usize,
    pub decode_tokens_per_s: f64,
    /// Per stage: µs a token (its round trip and its compute).
    pub stage_us: Vec<f64>,
}

pub struct PipelineReport {
    pub stages: Vec<Stage>,
    pub threads: usize,
    pub local: PipelineRow,
    pub r1: PipelineRow,
    pub r3: Option<PipelineRow>,
    /// Whether every run gave the local tokens.
    pub same_tokens: bool,
}

const PROMPT: &str = "Write a story about a dragon who";

/// Tokens after the first over the time after the first.
fn decode_rate(times: &[Instant]) -> f64 {
    match (times.first(), times.last()) {
        (Some(a), Some(b)) if times.len() > 1 && b > a => {
            (times.len() - 1) as f64 / b.duration_since(*a).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// Start nodes, decode locally and across them, stop them. `progress` hears each step.
pub fn run(
    exe: &Path,
    options: &PipelineBenchOptions,
    mut progress: impl FnMut(&str),
) -> Result<PipelineReport, String> {
    let dir = cached(&SMOLLM2).map_err(|e| e.to_string())?;
    let gguf = find_file(&dir, GGUF_FILE)
        .ok_or_else(|| format!("{GGUF_FILE} is missing from {}", dir.display()))?;
    progress("loading SmolLM2");
    let model = SmolLm2::load_with(&gguf, WeightsMode::Quantized).map_err(|e| e.to_string())?;
    let ids = model.encode(PROMPT)?;
    let stages = Stage::even(&model.config, options.stages)?;
    let files =
        std::sync::Arc::new(StageFiles::new(&model, stages.clone()).map_err(|e| e.to_string())?);
    let threads = options.threads.max(1);

    progress("decoding locally");
    let device = tenet_devices::cpu(&tenet_devices::Options {
        threads: Some(threads),
        ..Default::default()
    });
    let local = |label: &str| -> Result<(Vec<u32>, PipelineRow), String> {
        let mut times = Vec::new();
        let tokens = model.generate(&ids, options.tokens, None, &device, |_| {
            times.push(Instant::now())
        })?;
        Ok((
            tokens.clone(),
            PipelineRow {
                name: label.to_string(),
                tokens: tokens.len(),
                decode_tokens_per_s: decode_rate(&times),
                stage_us: Vec::new(),
            },
        ))
    };
    local("warm-up")?;
    let (want, local_row) = local(&format!("local, {}", device.name()))?;

    let root = std::env::temp_dir().join(format!("tenet-bench-pipeline-{}", std::process::id()));
    let key = identity::generate();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut procs: Vec<Spawned> = Vec::new();
    let mut urls: Vec<String> = Vec::new();
    let spawn =
        |n: usize, procs: &mut Vec<Spawned>, urls: &mut Vec<String>| -> Result<(), String> {
            for _ in 0..n {
                let i = urls.len();
                let (p, addr) = spawn_node(
                    exe,
                    &root.join(format!("node{i}")),
                    &key,
                    threads,
                    &["--no-fsync"],
                )?;
                procs.push(p);
                urls.push(addr);
            }
            Ok(())
        };
    let across = |replicas: usize,
                  urls: &[String],
                  label: String|
     -> Result<(Vec<u32>, PipelineRow), String> {
        let clients = urls
            .iter()
            .map(|u| NodeClient::new(u, key.clone()).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        rt.block_on(async {
            let mut p = StagePipeline::new(
                &model,
                files.clone(),
                replicas,
                clients,
                Vec::new(),
                Box::new(|_: &str| {}),
            )
            .await
            .map_err(|e| e.to_string())?;
            // A warm-up generation: the nodes load the weights and compile the graphs.
            p.generate(&ids, options.tokens, None, |_| {})
                .await
                .map_err(|e| e.to_string())?;
            let before: Vec<Duration> = p.stats().stage_time.clone();
            let mut times = Vec::new();
            let tokens = p
                .generate(&ids, options.tokens, None, |_| times.push(Instant::now()))
                .await
                .map_err(|e| e.to_string())?;
            let stage_us = p
                .stats()
                .stage_time
                .iter()
                .zip(&before)
                .map(|(t, b)| (*t - *b).as_secs_f64() * 1e6 / tokens.len().max(1) as f64)
                .collect();
            p.close().await;
            Ok((
                tokens.clone(),
                PipelineRow {
                    name: label,
                    tokens: tokens.len(),
                    decode_tokens_per_s: decode_rate(&times),
                    stage_us,
                },
            ))
        })
    };
    let n = stages.len();
    progress(&format!("starting {n} nodes"));
    spawn(n, &mut procs, &mut urls)?;
    progress("decoding across nodes, r = 1");
    let (t1, r1) = across(1, &urls[..n], format!("{n} stages on {n} nodes, r = 1"))?;
    progress(&format!("starting {} more nodes", 2 * n));
    let r3 = match spawn(2 * n, &mut procs, &mut urls) {
        Ok(()) => {
            // Stage k on nodes k, n + k, 2n + k: one node of each replica set per group.
            let grouped: Vec<String> = (0..n)
                .flat_map(|k| {
                    [
                        urls[k].clone(),
                        urls[n + k].clone(),
                        urls[2 * n + k].clone(),
                    ]
                })
                .collect();
            progress("decoding across nodes, r = 3");
            Some(across(
                3,
                &grouped,
                format!("{n} stages on {} nodes, r = 3", 3 * n),
            )?)
        }
        Err(e) => {
            progress(&format!("r = 3 not measured: {e}"));
            None
        }
    };
    drop(procs);
    let _ = std::fs::remove_dir_all(&root);
    let same_tokens = t1 == want && r3.as_ref().is_none_or(|(t, _)| *t == want);
    Ok(PipelineReport {
        stages,
        threads,
        local: local_row,
        r1,
        r3: r3.map(|(_, r)| r),
        same_tokens,
    })
}

impl PipelineReport {
    /// µs each stage hop adds to a token at r = 1: the decode time per token over the local
    /// one, shared among the stages' round trips.
    pub fn hop_overhead_us(&self) -> f64 {
        let per = |r: &PipelineRow| 1e6 / r.decode_tokens_per_s.max(1e-9);
        (per(&self.r1) - per(&self.local)) / self.stages.len().max(1) as f64
    }

    pub fn ratio(&self, row: &PipelineRow) -> f64 {
        row.decode_tokens_per_s / self.local.decode_tokens_per_s.max(1e-9)
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "tenet bench pipeline — SmolLM2 greedy decode, stages of layers {}; nodes on 127.0.0.1, {} threads each\n\n",
            self.stages
                .iter()
                .map(|st| format!("{}..{}", st.first, st.end))
                .collect::<Vec<_>>()
                .join(", "),
            self.threads
        );
        s += &format!(
            "{:<36} {:>7} {:>14} {:>9}  per stage, µs a token\n",
            "run", "tokens", "decode tok/s", "vs local"
        );
        let rows = [Some(&self.local), Some(&self.r1), self.r3.as_ref()];
        for r in rows.into_iter().flatten() {
            s += &format!(
                "{:<36} {:>7} {:>14.1} {:>8.2}×  {}\n",
                r.name,
                r.tokens,
                r.decode_tokens_per_s,
                self.ratio(r),
                r.stage_us
                    .iter()
                    .map(|u| format!("{u:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        s += &format!(
            "\nr = 1: {:.2}× the local decode rate (goal ≥ 0.7×: {}); {:.0} µs per stage hop per token\n",
            self.ratio(&self.r1),
            if self.ratio(&self.r1) >= 0.7 {
                "met"
            } else {
                "not met"
            },
            self.hop_overhead_us()
        );
        if !self.same_tokens {
            s += "WARNING: a run across nodes gave other tokens than the local one\n";
        }
        s
    }

    pub fn json(&self) -> Value {
        let row = |r: &PipelineRow| {
            json!({
                "name": r.name,
                "tokens": r.tokens,
                "decode_tokens_per_s": r.decode_tokens_per_s,
                "ratio_to_local": self.ratio(r),
                "stage_us_per_token": r.stage_us,
            })
        };
        json!({
            "stages": self.stages.iter().map(|s| [s.first, s.end]).collect::<Vec<_>>(),
            "threads": self.threads,
            "local": row(&self.local),
            "r1": row(&self.r1),
            "r3": self.r3.as_ref().map(row),
            "hop_overhead_us": self.hop_overhead_us(),
            "same_tokens": self.same_tokens,
        })
    }
}
