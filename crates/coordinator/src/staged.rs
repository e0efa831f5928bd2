//! Generation across nodes run by the coordinator: a deployed LLM cut into stages of its
//! layers (`tenet_models::smollm2::stage`), each stage on `replicas` staked nodes picked like
//! any job's replicas (by stake × score, one per operator, among nodes whose advertised memory
//! takes that stage's graphs), driven with the coordinator's own key through
//! `tenet_net::stages` — each stage's KV cache resident in its nodes' sessions, every token's
//! rows going on only when a strict majority of the stage's nodes gave the same bits. A node
//! outvoted is slashed and replaced by a spare (prefilled with the stage's rows so far, so the
//! text does not change); a node that stops answering is replaced the same way. The answer
//! carries a [`StagedReceipt`] the coordinator signs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use tenet_ledger::Ledger;
use tenet_models::smollm2::stage::{Stage, capacity_for, stage_decode_graph, stage_prefill_graph};
use tenet_models::smollm2::{Sampling, SmolLm2};
use tenet_net::NodeClient;
use tenet_net::stages::{StageError, StageFiles, StagePipeline};
use tenet_proto::auth::PublicKey;
use tenet_proto::staged_receipt::{StagedReceipt, StagedSampling, StagedStage};

use crate::dispatch::{Coordinator, DispatchError, Need, now};
use crate::openai::Llm;

/// Stage files an LLM keeps built (each set is about the model's size).
const STAGE_FILES_KEPT: usize = 2;

/// `llm`'s weights files for `stages` (`n` of them), built on first use and kept (at most
/// [`STAGE_FILES_KEPT`] sets, the oldest dropped), so a generation does not copy and hash the
/// model again.
fn stage_files(
    llm: &Llm,
    n: u64,
    stages: &[Stage],
) -> Result<std::sync::Arc<StageFiles>, DispatchError> {
    let mut kept = crate::dispatch::lock(&llm.staged);
    if let Some((_, f)) = kept.iter().find(|(k, _)| *k == n) {
        return Ok(f.clone());
    }
    let files =
        std::sync::Arc::new(StageFiles::new(&llm.model, stages.to_vec()).map_err(stage_error)?);
    if kept.len() >= STAGE_FILES_KEPT {
        kept.remove(0);
    }
    kept.push((n, files.clone()));
    Ok(files)
}

/// Spare nodes picked beside a staged generation's replicas, when there are that many.
const SPARES: usize = 2;

/// The most stages a generation may ask for.
pub const MAX_STAGES: u64 = 64;

/// Staged generations one coordinator process drives at once (each holds sessions, and their
/// KV caches, on its nodes for as long as it runs); more are refused as busy.
pub const MAX_RUNNING: usize = 8;

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_RUNNING`] slots, given back when dropped.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        RUNNING
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_RUNNING).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A failure of the nodes as the coordinator reports it: they failed (busy, 503) or disagreed
/// beyond a majority (conflict); anything else is this side's.
fn stage_error(e: StageError) -> DispatchError {
    match e {
        StageError::NoMajority { .. } => DispatchError::Undecided(e.to_string()),
        StageError::Node { .. } | StageError::Answer { .. } | StageError::NoSpare { .. } => {
            DispatchError::Nodes(e.to_string())
        }
        StageError::Model(m) => DispatchError::Internal(m),
    }
}

/// What a caller asks.
pub struct StagedRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stages: u64,
    /// Nodes per stage (0: the coordinator's configured replicas).
    pub replicas: usize,
    pub sampling: Option<Sampling>,
}

/// A staged generation's result.
pub struct StagedOutcome {
    pub tokens: Vec<u32>,
    /// Nodes slashed, with the amount taken.
    pub slashed: Vec<(String, i64)>,
    /// Nodes replaced: (stage, node, why).
    pub replaced: Vec<(usize, String, String)>,
    pub receipt: StagedReceipt,
}

fn key_of(id: &str) -> Result<PublicKey, DispatchError> {
    PublicKey::parse(id)
        .ok_or_else(|| DispatchError::Internal(format!("node id {id} is not a public key")))
}

/// What stage `s` needs of a node to run `positions` positions: its prefill of the prompt
/// and its decode step at the largest capacity, by their certificates.
fn stage_need(model: &SmolLm2, s: Stage, prompt: u64, positions: u64) -> Result<Need, String> {
    let (cfg, id) = (&model.config, model.weights.id);
    let capacity = capacity_for(cfg, positions.min(cfg.context))?;
    let prefill = stage_prefill_graph(cfg, id, s, prompt, capacity)?;
    let decode = stage_decode_graph(cfg, id, s, capacity)?;
    Ok(Need {
        peak_bytes: prefill.cost().peak_bytes.max(decode.cost().peak_bytes),
        flops: prefill.cost().flops.max(decode.cost().flops),
        exact: true,
    })
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Run `req` on `llm` across nodes (see the module's header).
    pub async fn generate_staged(
        &self,
        llm: &Llm,
        req: StagedRequest,
    ) -> Result<StagedOutcome, DispatchError> {
        let model = &*llm.model;
        let cfg = &model.config;
        let _slot = Slot::take().ok_or_else(|| {
            DispatchError::Nodes(format!(
                "{MAX_RUNNING} staged generations are running; try again shortly"
            ))
        })?;
        if req.prompt.is_empty() || req.prompt.len() as u64 >= cfg.context {
            return Err(DispatchError::BadRequest(format!(
                "the prompt has {} tokens; it needs 1 to {} (the model's context)",
                req.prompt.len(),
                cfg.context - 1
            )));
        }
        if req.stages == 0 || req.stages > MAX_STAGES.min(cfg.layers) {
            return Err(DispatchError::BadRequest(format!(
                "{} stages: the model's {} layers make 1 to {} stages",
                req.stages,
                cfg.layers,
                MAX_STAGES.min(cfg.layers)
            )));
        }
        let replicas = if req.replicas == 0 {
            self.config().replicas.max(1)
        } else {
            req.replicas
        };
        let stages = Stage::even(cfg, req.stages).map_err(DispatchError::BadRequest)?;
        let positions = req.prompt.len() as u64 + req.max_tokens as u64 + 1;
        let mut chosen: HashSet<String> = HashSet::new();
        let mut urls: HashMap<String, String> = HashMap::new();
        let mut clients = Vec::new();
        let mut largest = Need {
            peak_bytes: 0,
            flops: 0,
            exact: true,
        };
        for s in &stages {
            let need = stage_need(model, *s, req.prompt.len() as u64, positions)
                .map_err(DispatchError::BadRequest)?;
            largest.peak_bytes = largest.peak_bytes.max(need.peak_bytes);
            largest.flops = largest.flops.max(need.flops);
            let picked = self.pick(replicas, &chosen, need).await?;
            if picked.len() < replicas {
                return Err(self.shortfall(picked.len(), replicas, need).await);
            }
            for n in picked {
                chosen.insert(n.id.clone());
                let c = client(&n.url, self)?;
                // Keyed by the client's own form of the address, which is what the driver
                // reports nodes by.
                urls.insert(c.url(), n.id.clone());
                clients.push(c);
            }
        }
        let mut spares = Vec::new();
        for n in self.pick(SPARES, &chosen, largest).await? {
            let c = client(&n.url, self)?;
            urls.insert(c.url(), n.id.clone());
            spares.push(c);
        }
        let generation = format!(
            "staged-{}",
            tenet_proto::to_hex(&tenet_net::identity::random_bytes::<8>())
        );
        let mut pipeline = StagePipeline::new(
            model,
            stage_files(llm, req.stages, &stages)?,
            replicas,
            clients,
            spares,
            Box::new(|_: &str| {}),
        )
        .await
        .map_err(stage_error)?;
        let tokens = pipeline
            .generate(&req.prompt, req.max_tokens, req.sampling, |_| {})
            .await;
        let stats = pipeline.stats().clone();
        let ended: Vec<Vec<String>> = pipeline.nodes();
        pipeline.close().await;
        // Outvoted nodes are slashed whether or not the generation went on to the end.
        let mut slashed = Vec::new();
        let mut outvoted = Vec::new();
        let mut replaced = Vec::new();
        for r in &stats.replaced {
            let id = urls
                .get(&r.failed)
                .cloned()
                .unwrap_or_else(|| r.failed.clone());
            replaced.push((r.stage, id.clone(), r.reason.clone()));
            if r.outvoted {
                let amount = self
                    .ledger
                    .slash(
                        &id,
                        &generation,
                        self.config().slash_fraction,
                        "outvoted by its stage in a staged generation",
                        now(),
                    )
                    .await?;
                slashed.push((id.clone(), amount));
                outvoted.push(key_of(&id)?);
            }
        }
        let tokens = tokens.map_err(stage_error)?;
        let mut receipt_stages = Vec::new();
        for (s, nodes) in stages.iter().zip(&ended) {
            let nodes = nodes
                .iter()
                .map(|u| key_of(urls.get(u).map_or(u.as_str(), String::as_str)))
                .collect::<Result<Vec<_>, _>>()?;
            receipt_stages.push(StagedStage {
                first: s.first,
                end: s.end,
                nodes,
            });
        }
        let receipt = StagedReceipt::sign(
            generation,
            llm.weights,
            req.prompt,
            req.sampling.map(|s| StagedSampling {
                seed: s.seed,
                temperature: s.temperature,
                top_p: s.top_p,
            }),
            tokens.clone(),
            replicas as u32,
            receipt_stages,
            outvoted,
            self.key(),
        );
        Ok(StagedOutcome {
            tokens,
            slashed,
            replaced,
            receipt,
        })
    }
}

fn client<L: Ledger + 'static>(url: &str, c: &Coordinator<L>) -> Result<NodeClient, DispatchError> {
    NodeClient::new(url, c.key().clone())
        .map(|n| n.with_timeout(std::time::Duration::from_secs(120)))
        .map_err(|e| DispatchError::Internal(e.to_string()))
}
