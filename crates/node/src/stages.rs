//! Generation across nodes: a Llama cut into stages (`tenet_models::smollm2::stage`), each
//! stage a session on its own node whose KV caches stay resident between tokens, driven from
//! here over the ordinary session API — graphs and tensors, never code.
//!
//! Per token and stage, one `batch` round trip: put the stage's input row (and its position),
//! grow the caches if the capacity bucket moved (a pad graph), run the stage's decode graph,
//! `write` its new key and value rows into the caches at that position, get its output row
//! (or the last stage's token). So a decode step moves one hidden row (`hidden` f32) across
//! each boundary. The prompt is one prefill batch per stage.
//!
//! The driver keeps every row it has given each stage. When a stage's node stops answering
//! (or has lost the session: restarted), the next spare node takes the stage: it receives the
//! stage's weights file and graphs, and one prefill of every row the stage was given so far
//! rebuilds its caches; its last output row is exactly the lost node's (a prefill computes each
//! row with the operations a cached decode does, see the model's tests), so the text does not
//! change. The other stages keep their sessions.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tenet_ir::{Graph, HostTensor, WeightsId};
use tenet_models::smollm2::stage::{
    Stage, StageInput, capacity_for, stage_decode_graph, stage_grow_graph, stage_prefill_graph,
    stage_weights,
};
use tenet_models::smollm2::{EOS, Sampling, SmolLm2, sample};
use tenet_proto::wire::{Batch, OpResult, SessionOp};
use tenet_proto::{ErrorCode, Hash, tensor};

use crate::client::{ClientError, NodeClient};

/// Why a generation across nodes failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("stage {stage} on {url}: {source}")]
    Node {
        stage: usize,
        url: String,
        source: ClientError,
    },
    #[error("stage {stage} on {url}: {message}")]
    Answer {
        stage: usize,
        url: String,
        message: String,
    },
    #[error(
        "stage {stage}'s node {url} failed ({reason}) and no spare node is left; list more with --nodes"
    )]
    NoSpare {
        stage: usize,
        url: String,
        reason: String,
    },
    #[error("{0}")]
    Model(String),
}

/// What a generation across nodes measured.
#[derive(Clone, Debug, Default)]
pub struct StageStats {
    /// Per stage: wall time of its round trips, and bytes of rows sent to it.
    pub stage_time: Vec<Duration>,
    pub rows_sent: Vec<u64>,
    /// Decode steps (tokens after the first).
    pub steps: u64,
    /// Stages rebuilt on a spare node, as (stage, failed node, new node).
    pub replaced: Vec<(usize, String, String)>,
}

/// A stage graph: (stage, kind, rows or old capacity, capacity).
type GraphKey = (usize, &'static str, u64, u64);

/// A stage's node: its client, its session, and which graphs it holds.
struct Attached {
    client: NodeClient,
    session: String,
    tasks: HashSet<Hash>,
    /// Rows its caches hold room for.
    held: u64,
}

/// A model's stages on nodes, driving one generation at a time.
pub struct StagePipeline<'m> {
    model: &'m SmolLm2,
    stages: Vec<Stage>,
    /// Per stage: its weights file (bytes), their id and their blob hash.
    files: Vec<(Vec<u8>, WeightsId, Hash)>,
    nodes: Vec<Attached>,
    spares: Vec<NodeClient>,
    /// Every row each stage was given, in order.
    history: Vec<StageInput>,
    graphs: HashMap<GraphKey, (Hash, Vec<u8>)>,
    capacity: u64,
    len: u64,
    stats: StageStats,
}

fn hex_tensor(t: &HostTensor) -> String {
    tenet_proto::to_hex(&tensor::encode(t))
}

/// Whether a failure means the node (or its session) is gone, so that another should take the
/// stage, rather than a request the node refused on its merits.
fn is_lost(e: &ClientError) -> bool {
    match e {
        ClientError::Transport { .. } | ClientError::Timeout { .. } => true,
        ClientError::Api { error, .. } => error.code == ErrorCode::NotFound,
        _ => false,
    }
}

impl<'m> StagePipeline<'m> {
    /// `model` cut into `stages`, stage k on `nodes[k]`; `spares` take over failed stages.
    /// Each node receives its stage's weights file (only that stage's tensors) and opens a
    /// session.
    pub async fn new(
        model: &'m SmolLm2,
        stages: Vec<Stage>,
        nodes: Vec<NodeClient>,
        spares: Vec<NodeClient>,
    ) -> Result<StagePipeline<'m>, StageError> {
        if nodes.len() != stages.len() {
            return Err(StageError::Model(format!(
                "{} stages need {} nodes, not {}",
                stages.len(),
                stages.len(),
                nodes.len()
            )));
        }
        let mut files = Vec::new();
        for s in &stages {
            s.check(&model.config).map_err(StageError::Model)?;
            let bytes = stage_weights(model, *s).map_err(StageError::Model)?;
            let (id, hash) = (WeightsId::of_bytes(&bytes), Hash::of(&bytes));
            files.push((bytes, id, hash));
        }
        let n = stages.len();
        let mut p = StagePipeline {
            model,
            stages,
            files,
            nodes: Vec::new(),
            spares: spares.into_iter().rev().collect(),
            history: Vec::new(),
            graphs: HashMap::new(),
            capacity: 0,
            len: 0,
            stats: StageStats {
                stage_time: vec![Duration::ZERO; n],
                rows_sent: vec![0; n],
                ..StageStats::default()
            },
        };
        for (k, client) in nodes.into_iter().enumerate() {
            let a = p.attach(k, client).await?;
            p.nodes.push(a);
        }
        Ok(p)
    }

    pub fn stats(&self) -> &StageStats {
        &self.stats
    }

    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Give `client` stage `k`'s weights and open a session there.
    async fn attach(&self, k: usize, client: NodeClient) -> Result<Attached, StageError> {
        let err = |source| StageError::Node {
            stage: k,
            url: client.url(),
            source,
        };
        let (bytes, _, hash) = &self.files[k];
        if client.has_blob(hash).await.map_err(err)?.is_none() {
            client.put_blob(bytes.clone()).await.map_err(err)?;
        }
        let session = client.create_session().await.map_err(err)?;
        Ok(Attached {
            client,
            session,
            tasks: HashSet::new(),
            held: 0,
        })
    }

    /// A stage graph's blob hash, building it once.
    fn graph(
        &mut self,
        k: usize,
        kind: &'static str,
        a: u64,
        b: u64,
    ) -> Result<(Hash, Vec<u8>), StageError> {
        if let Some(g) = self.graphs.get(&(k, kind, a, b)) {
            return Ok(g.clone());
        }
        let (cfg, id, stage) = (&self.model.config, self.files[k].1, self.stages[k]);
        let graph: Graph = match kind {
            "prefill" => stage_prefill_graph(cfg, id, stage, a, b),
            "decode" => stage_decode_graph(cfg, id, stage, b),
            _ => stage_grow_graph(cfg, stage, a, b),
        }
        .map_err(StageError::Model)?;
        let bytes = graph.to_bytes();
        let g = (Hash::of(&bytes), bytes);
        // Prefill graphs are one per prompt length: keep a bounded number.
        if self.graphs.len() >= 256 {
            self.graphs.clear();
        }
        self.graphs.insert((k, kind, a, b), g.clone());
        Ok(g)
    }

    /// Generate after `prompt` (greedy, or with `sampling`): at most `max_tokens` tokens,
    /// ending at `<|im_end|>` or the context; each token given to `on_token` as it comes.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: Option<Sampling>,
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, StageError> {
        if prompt.is_empty() {
            return Err(StageError::Model("the prompt has no tokens".into()));
        }
        self.history = vec![StageInput::Ids(Vec::new()); self.stages.len()];
        for (k, s) in self.stages.iter().enumerate() {
            if !s.embeds() {
                self.history[k] = StageInput::Rows(Vec::new());
            }
        }
        self.len = 0;
        self.capacity = 0;
        for a in &mut self.nodes {
            a.held = 0;
        }
        let mut out = Vec::new();
        let mut input = prompt.to_vec();
        while out.len() < max_tokens {
            let token = self.feed(&input, sampling, out.len() as u64).await?;
            out.push(token);
            on_token(token);
            if token == EOS || self.len >= self.model.config.context {
                break;
            }
            input = vec![token];
        }
        Ok(out)
    }

    /// Feed `ids` through every stage; the next token.
    async fn feed(
        &mut self,
        ids: &[u32],
        sampling: Option<Sampling>,
        step: u64,
    ) -> Result<u32, StageError> {
        let cfg = &self.model.config;
        let prefill = self.len == 0;
        let positions = self.len + ids.len() as u64;
        if positions > self.capacity {
            self.capacity = capacity_for(cfg, (positions + u64::from(prefill)).min(cfg.context))
                .map_err(StageError::Model)?;
        }
        if !prefill {
            self.stats.steps += 1;
        }
        let mut input = StageInput::Ids(ids.to_vec());
        let last = self.stages.len() - 1;
        for k in 0..self.stages.len() {
            self.history[k].extend(&input);
            let start = Instant::now();
            let answer = loop {
                match self.run_stage(k, &input, prefill, sampling, step).await {
                    Ok(a) => break a,
                    Err((lost, reason)) if lost => self.replace(k, reason).await?,
                    Err((_, reason)) => {
                        return Err(StageError::Answer {
                            stage: k,
                            url: self.nodes[k].client.url(),
                            message: reason,
                        });
                    }
                }
            };
            self.stats.stage_time[k] += start.elapsed();
            self.stats.rows_sent[k] += input.rows(cfg.hidden);
            if k == last {
                self.len = positions;
                return match answer {
                    Answer::Token(t) => Ok(t),
                    Answer::Rows(_) => Err(StageError::Model("the last stage gave rows".into())),
                };
            }
            input = match answer {
                Answer::Rows(rows) => StageInput::Rows(rows),
                Answer::Token(_) => {
                    return Err(StageError::Model("a middle stage gave a token".into()));
                }
            };
        }
        Err(StageError::Model("no stages".into()))
    }

    /// Stage `k`'s node failed: the next spare takes the stage and is prefilled with every row
    /// the stage was given so far (this step's included), which rebuilds its caches.
    async fn replace(&mut self, k: usize, reason: String) -> Result<(), StageError> {
        let old = self.nodes[k].client.url();
        let Some(client) = self.spares.pop() else {
            return Err(StageError::NoSpare {
                stage: k,
                url: old,
                reason,
            });
        };
        let a = self.attach(k, client).await?;
        self.stats.replaced.push((k, old, a.client.url()));
        self.nodes[k] = a;
        Ok(())
    }

    /// One batch on stage `k`'s node: a prefill (of the prompt, or of the whole history when
    /// the node is new), or one decode step. `Err((lost, why))`: `lost` when the node or its
    /// session is gone.
    async fn run_stage(
        &mut self,
        k: usize,
        input: &StageInput,
        prefill: bool,
        sampling: Option<Sampling>,
        step: u64,
    ) -> Result<Answer, (bool, String)> {
        let cfg = &self.model.config;
        let stage = self.stages[k];
        let capacity = self.capacity;
        let fresh = self.nodes[k].held == 0;
        let name = stage.input_name();
        let last = stage.is_last(cfg);
        let model = |e: StageError| (false, e.to_string());
        let mut ops = Vec::new();
        let mut tasks = Vec::new();
        let rows;
        if prefill || fresh {
            // A new node (or the prompt): every row the stage has been given.
            let all = &self.history[k];
            rows = all.rows(cfg.hidden);
            let t = all.tensor(cfg.hidden).map_err(|e| (false, e))?;
            ops.push(SessionOp::Put {
                name: name.into(),
                blob: hex_tensor(&t),
            });
            let (task, bytes) = self.graph(k, "prefill", rows, capacity).map_err(model)?;
            tasks.push((task, bytes));
            let mut outputs: std::collections::BTreeMap<String, String> = stage
                .row_names()
                .into_iter()
                .zip(stage.cache_names())
                .collect();
            outputs.extend(head_outputs(last, sampling.is_some()));
            ops.push(SessionOp::Run {
                task,
                weights: Some(self.files[k].2),
                inputs: [(name.to_string(), name.to_string())].into(),
                outputs,
                seed: 0,
            });
        } else {
            rows = 1;
            let pos = self.len;
            let t = input.tensor(cfg.hidden).map_err(|e| (false, e))?;
            ops.push(SessionOp::Put {
                name: name.into(),
                blob: hex_tensor(&t),
            });
            let pos_t =
                HostTensor::from_i64(&[1], &[pos as i64]).map_err(|e| (false, e.to_string()))?;
            ops.push(SessionOp::Put {
                name: "pos".into(),
                blob: hex_tensor(&pos_t),
            });
            let held = self.nodes[k].held;
            if held < capacity {
                let (task, bytes) = self.graph(k, "grow", held, capacity).map_err(model)?;
                tasks.push((task, bytes));
                ops.push(SessionOp::Run {
                    task,
                    weights: None,
                    inputs: stage
                        .cache_names()
                        .into_iter()
                        .map(|c| (c.clone(), c))
                        .collect(),
                    outputs: stage
                        .row_names()
                        .into_iter()
                        .zip(stage.cache_names())
                        .collect(),
                    seed: 0,
                });
            }
            let (task, bytes) = self.graph(k, "decode", 1, capacity).map_err(model)?;
            tasks.push((task, bytes));
            let mut inputs: std::collections::BTreeMap<String, String> = stage
                .cache_names()
                .into_iter()
                .map(|c| (c.clone(), c))
                .collect();
            inputs.insert(name.into(), name.into());
            inputs.insert("pos".into(), "pos".into());
            let mut outputs: std::collections::BTreeMap<String, String> = stage
                .row_names()
                .into_iter()
                .map(|r| (r.clone(), format!("new_{r}")))
                .collect();
            outputs.extend(head_outputs(last, sampling.is_some()));
            ops.push(SessionOp::Run {
                task,
                weights: Some(self.files[k].2),
                inputs,
                outputs,
                seed: 0,
            });
            for (cache, row) in stage.cache_names().into_iter().zip(stage.row_names()) {
                ops.push(SessionOp::Write {
                    name: cache,
                    from: format!("new_{row}"),
                    row: pos,
                });
            }
        }
        let want = match (last, sampling) {
            (false, _) => "y",
            (true, None) => "token",
            (true, Some(_)) => "logits",
        };
        ops.push(SessionOp::Get { name: want.into() });
        let node = &mut self.nodes[k];
        let lost = |e: ClientError| (is_lost(&e), e.to_string());
        for (task, bytes) in tasks {
            if node.tasks.insert(task) {
                node.client.put_blob(bytes).await.map_err(lost)?;
            }
        }
        let results = node
            .client
            .batch(&node.session, &Batch { ops })
            .await
            .map_err(lost)?;
        if let Some(e) = results.error {
            return Err((e.error.code == ErrorCode::NotFound, e.error.message));
        }
        node.held = capacity;
        let Some(OpResult::Blob(hex)) = results.results.last() else {
            return Err((false, "the batch gave no tensor back".into()));
        };
        let t = tenet_proto::from_hex(hex)
            .ok_or("the tensor is not hex")
            .and_then(|b| tensor::decode(&b).map_err(|_| "the tensor does not decode"))
            .map_err(|e| (false, e.to_string()))?;
        Ok(match (want, sampling) {
            ("y", _) => {
                let v = t.to_f32_vec();
                // After a prefill, the next stage needs this step's rows: all of them for the
                // prompt, the last one when a new node was rebuilt mid-generation.
                let keep = if prefill { rows } else { 1 } as usize * cfg.hidden as usize;
                Answer::Rows(v[v.len().saturating_sub(keep)..].to_vec())
            }
            ("logits", Some(s)) => Answer::Token(sample(&t.to_f32_vec(), s, step)),
            _ => Answer::Token(t.to_i64_vec().first().map_or(0, |&x| x as u32)),
        })
    }
}

/// What a stage's batch gave back.
enum Answer {
    Rows(Vec<f32>),
    Token(u32),
}

/// The outputs a stage's run keeps under their own names: `y`; or the last stage's `token`
/// (greedy) or `logits` (sampled on this side) — not both: a kept tensor is hashed, and the
/// logits are 49152 floats a token.
fn head_outputs(last: bool, sampled: bool) -> Vec<(String, String)> {
    let names: &[&str] = match (last, sampled) {
        (false, _) => &["y"],
        (true, false) => &["token"],
        (true, true) => &["logits"],
    };
    names
        .iter()
        .map(|n| (n.to_string(), n.to_string()))
        .collect()
}
