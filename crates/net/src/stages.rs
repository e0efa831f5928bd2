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
//!
//! A node that stops answering without closing its connection (hung, or stopped) is given up on
//! once a decode step has taken [`STEP_SLOWDOWN`] times the stage's mean step so far (at least
//! [`MIN_STEP_TIMEOUT`]), and replaced the same way.
//!
//! With `replicas` r > 1, every stage runs on r nodes at once, each answering this driver
//! alone (no node sees another's answer before giving its own), and the rows go on only when a
//! strict majority gave the same bits; a node that answered otherwise is replaced by a spare
//! (or dropped when none is left) and reported.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tenet_ir::{DType, Graph, HostTensor, TensorType, WeightsId};
use tenet_models::smollm2::stage::{
    Stage, StageInput, capacity_for, stage_decode_graph, stage_grow_graph, stage_prefill_graph,
    stage_weights,
};
use tenet_models::smollm2::{EOS, Sampling, SmolLm2, sample};
use tenet_proto::wire::{Batch, BatchResults, OpResult, SessionOp};
use tenet_proto::{ErrorCode, Hash, tensor};

use crate::client::{Bounds, ClientError, NodeClient};
use bytes::Bytes;

/// How many times its stage's mean decode step a step may take before its node is given up.
pub const STEP_SLOWDOWN: u32 = 20;

/// The least time a decode step is given (a busy machine is not a dead one).
pub const MIN_STEP_TIMEOUT: Duration = Duration::from_secs(2);

/// Prefills are given this long (a long prompt on a slow node, its graphs compiling).
pub const PREFILL_TIMEOUT: Duration = Duration::from_secs(120);

/// A stage's first decode steps (its decode graph compiling) are given this long.
pub const FIRST_STEPS_TIMEOUT: Duration = Duration::from_secs(30);

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
    #[error("stage {stage}: no majority among its {replicas} nodes' answers")]
    NoMajority { stage: usize, replicas: usize },
    #[error("{0}")]
    Model(String),
}

/// A stage's node that was replaced (or dropped) during a generation.
#[derive(Clone, Debug)]
pub struct Replaced {
    pub stage: usize,
    pub failed: String,
    /// The spare that took its place; `None` when none was left and the stage went on with
    /// its other replicas.
    pub now: Option<String>,
    pub reason: String,
    /// It answered otherwise than its stage's majority (rather than stopping answering).
    pub outvoted: bool,
}

/// What a generation across nodes measured.
#[derive(Clone, Debug, Default)]
pub struct StageStats {
    /// Per stage: wall time of its round trips, and bytes of rows sent to it.
    pub stage_time: Vec<Duration>,
    pub rows_sent: Vec<u64>,
    /// Decode steps (tokens after the first).
    pub steps: u64,
    /// Nodes replaced: lost, or outvoted.
    pub replaced: Vec<Replaced>,
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

/// A model's stages and each one's weights file: built once (each file copies and hashes tens
/// of MB), then shared by every generation over those stages.
pub struct StageFiles {
    stages: Vec<Stage>,
    /// Per stage: its weights file's bytes, its id as the graphs name it, and its blob hash
    /// (the same blake3 hash).
    files: Vec<(Bytes, WeightsId, Hash)>,
}

impl StageFiles {
    pub fn new(model: &SmolLm2, stages: Vec<Stage>) -> Result<StageFiles, StageError> {
        let mut files = Vec::new();
        for s in &stages {
            s.check(&model.config).map_err(StageError::Model)?;
            let bytes = stage_weights(model, *s).map_err(StageError::Model)?;
            let hash = Hash::of(&bytes);
            files.push((Bytes::from(bytes), WeightsId(hash.0), hash));
        }
        Ok(StageFiles { stages, files })
    }
}

/// A model's stages on nodes, driving one generation at a time.
pub struct StagePipeline<'m> {
    model: &'m SmolLm2,
    files: Arc<StageFiles>,
    /// Per stage: its replicas.
    nodes: Vec<Vec<Attached>>,
    spares: Vec<NodeClient>,
    /// Every row each stage was given, in order.
    history: Vec<StageInput>,
    graphs: HashMap<GraphKey, (Hash, Vec<u8>)>,
    capacity: u64,
    len: u64,
    stats: StageStats,
    /// Per stage: decode steps timed so far (after the first, which compiles), and their time.
    step_count: Vec<u64>,
    step_time: Vec<Duration>,
    /// Told what is being sent where (weights files are tens of MB).
    progress: Box<dyn Fn(&str) + Send + Sync + 'm>,
}

fn hex_tensor(t: &HostTensor) -> String {
    tenet_proto::to_hex(&tensor::encode(t))
}

/// Whether a failure means the node (or its session) is gone or no longer answers as a node
/// does (an answer too large or not the API's), so that another should take the stage, rather
/// than a request the node refused on its merits.
fn is_lost(e: &ClientError) -> bool {
    match e {
        ClientError::Transport { .. }
        | ClientError::Timeout { .. }
        | ClientError::TooLarge { .. }
        | ClientError::Unexpected { .. } => true,
        ClientError::Api { error, .. } => error.code == ErrorCode::NotFound,
        _ => false,
    }
}

impl<'m> StagePipeline<'m> {
    /// `model` cut into `files`' stages, each on `replicas` nodes: stage k on `nodes[k *
    /// replicas..(k + 1) * replicas]`; `spares` take over failed or outvoted nodes. Each node
    /// receives its stage's weights file (only that stage's tensors) and opens a session;
    /// `progress` hears each file sent.
    pub async fn new(
        model: &'m SmolLm2,
        files: Arc<StageFiles>,
        replicas: usize,
        nodes: Vec<NodeClient>,
        spares: Vec<NodeClient>,
        progress: Box<dyn Fn(&str) + Send + Sync + 'm>,
    ) -> Result<StagePipeline<'m>, StageError> {
        let n = files.stages.len();
        if replicas == 0 || nodes.len() != n * replicas {
            return Err(StageError::Model(format!(
                "{n} stages on {replicas} replicas need {} nodes, not {}",
                n * replicas,
                nodes.len()
            )));
        }
        let mut p = StagePipeline {
            model,
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
            step_count: vec![0; n],
            step_time: vec![Duration::ZERO; n],
            progress,
        };
        p.nodes = (0..n).map(|_| Vec::new()).collect();
        for (i, client) in nodes.into_iter().enumerate() {
            match p.attach(i / replicas, client).await {
                Ok(a) => p.nodes[i / replicas].push(a),
                Err(e) => {
                    // The sessions opened so far would hold memory on their nodes for nothing.
                    p.close().await;
                    return Err(e);
                }
            }
        }
        Ok(p)
    }

    /// Free every stage's session on its node (best effort: a node that is gone holds
    /// nothing). Sessions hold their caches until freed, within the node's session memory.
    pub async fn close(self) {
        for a in self.nodes.into_iter().flatten() {
            let _ = a.client.delete_session(&a.session).await;
        }
    }

    /// Each stage's nodes now (their URLs), replacements included.
    pub fn nodes(&self) -> Vec<Vec<String>> {
        self.nodes
            .iter()
            .map(|r| r.iter().map(|a| a.client.url()).collect())
            .collect()
    }

    pub fn stats(&self) -> &StageStats {
        &self.stats
    }

    /// Give `client` stage `k`'s weights and open a session there.
    async fn attach(&self, k: usize, client: NodeClient) -> Result<Attached, StageError> {
        let err = |source| StageError::Node {
            stage: k,
            url: client.url(),
            source,
        };
        let (bytes, _, hash) = &self.files.files[k];
        if client.has_blob(hash).await.map_err(err)?.is_none() {
            let s = self.files.stages[k];
            (self.progress)(&format!(
                "sending stage layers {}..{}'s weights ({:.1} MB) to {}",
                s.first,
                s.end,
                bytes.len() as f64 / 1e6,
                client.url()
            ));
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
        let (cfg, id, stage) = (
            &self.model.config,
            self.files.files[k].1,
            self.files.stages[k],
        );
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
        self.history = vec![StageInput::Ids(Vec::new()); self.files.stages.len()];
        for (k, s) in self.files.stages.iter().enumerate() {
            if !s.embeds() {
                self.history[k] = StageInput::Rows(Vec::new());
            }
        }
        self.len = 0;
        self.capacity = 0;
        for a in self.nodes.iter_mut().flatten() {
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
        let last = self.files.stages.len() - 1;
        for k in 0..self.files.stages.len() {
            self.history[k].extend(&input);
            let start = Instant::now();
            let replaced = self.stats.replaced.len();
            let answer = self
                .run_replicas(k, &input, prefill, sampling, step)
                .await?;
            let took = start.elapsed();
            self.stats.stage_time[k] += took;
            // A step that rebuilt a node says nothing of the stage's pace.
            if !prefill && self.stats.steps > 1 && self.stats.replaced.len() == replaced {
                self.step_count[k] += 1;
                self.step_time[k] += took;
            }
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

    /// Replica `i` of stage `k` failed or was outvoted: the next spare takes its place, to be
    /// prefilled with every row the stage was given so far (this step's included) when it
    /// next runs. Without a spare: an error, unless `may_drop` and other replicas remain.
    async fn replace(
        &mut self,
        k: usize,
        i: usize,
        reason: String,
        may_drop: bool,
    ) -> Result<(), StageError> {
        let failed = self.nodes[k][i].client.url();
        if may_drop {
            // Outvoted, not gone: its session is of no further use.
            let a = &self.nodes[k][i];
            let _ = a.client.delete_session(&a.session).await;
        }
        let Some(client) = self.spares.pop() else {
            if may_drop && self.nodes[k].len() > 1 {
                self.nodes[k].remove(i);
                self.stats.replaced.push(Replaced {
                    stage: k,
                    failed,
                    now: None,
                    reason,
                    outvoted: may_drop,
                });
                return Ok(());
            }
            return Err(StageError::NoSpare {
                stage: k,
                url: failed,
                reason,
            });
        };
        let a = self.attach(k, client).await?;
        self.stats.replaced.push(Replaced {
            stage: k,
            failed,
            now: Some(a.client.url()),
            reason,
            outvoted: may_drop,
        });
        self.nodes[k][i] = a;
        Ok(())
    }

    /// How long stage `k`'s nodes get for this step: a prefill's time for a prefill, the first
    /// steps' until the stage has a few decode steps behind it, then [`STEP_SLOWDOWN`] times
    /// its mean step.
    fn step_timeout(&self, k: usize, prefill: bool) -> Duration {
        let steps = self.step_count[k];
        if prefill {
            return PREFILL_TIMEOUT;
        }
        if steps < 3 {
            return FIRST_STEPS_TIMEOUT;
        }
        let mean = self.step_time[k] / steps as u32;
        (mean * STEP_SLOWDOWN).clamp(MIN_STEP_TIMEOUT, PREFILL_TIMEOUT)
    }

    /// Stage `k`'s step on all its replicas at once; the majority's answer. Replicas that are
    /// lost are replaced and run the step again; those that answered otherwise than the
    /// majority are replaced afterwards.
    async fn run_replicas(
        &mut self,
        k: usize,
        input: &StageInput,
        prefill: bool,
        sampling: Option<Sampling>,
        step: u64,
    ) -> Result<Answer, StageError> {
        let mut answers: Vec<Option<Answer>> = (0..self.nodes[k].len()).map(|_| None).collect();
        loop {
            let pending: Vec<usize> = (0..answers.len())
                .filter(|&i| answers[i].is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            let mut work = Vec::new();
            for &i in &pending {
                let (batch, tasks, expect) = self.batch_for(k, i, input, prefill, sampling)?;
                let a = &mut self.nodes[k][i];
                let tasks: Vec<(Hash, Vec<u8>)> = tasks
                    .into_iter()
                    .filter(|(h, _)| a.tasks.insert(*h))
                    .collect();
                work.push((batch, tasks, expect));
            }
            let timeout = self.step_timeout(k, prefill);
            let replicas = &self.nodes[k];
            let calls = pending
                .iter()
                .zip(work)
                .map(|(&i, (batch, tasks, expect))| {
                    let a = &replicas[i];
                    // A node being rebuilt prefills: it gets a prefill's time.
                    let timeout = if a.held == 0 {
                        PREFILL_TIMEOUT
                    } else {
                        timeout
                    };
                    async move {
                        for (_, bytes) in tasks {
                            a.client.put_blob(bytes).await?;
                        }
                        let bounds = Bounds::new(timeout, expect.answer_bytes());
                        let r = a.client.batch_within(&a.session, &batch, bounds).await?;
                        Ok::<_, ClientError>((r, expect))
                    }
                });
            let results = join_all(calls.collect()).await;
            for (&i, result) in pending.iter().zip(results) {
                let outcome = match result {
                    Ok((r, expect)) => answer_of(r, &expect, sampling, step),
                    Err(e) => Err((is_lost(&e), e.to_string())),
                };
                match outcome {
                    Ok(a) => {
                        self.nodes[k][i].held = self.capacity;
                        answers[i] = Some(a);
                    }
                    Err((true, reason)) => self.replace(k, i, reason, false).await?,
                    Err((false, message)) => {
                        return Err(StageError::Answer {
                            stage: k,
                            url: self.nodes[k][i].client.url(),
                            message,
                        });
                    }
                }
            }
        }
        let answers: Vec<Answer> = answers.into_iter().flatten().collect();
        let r = answers.len();
        let winner =
            (0..r).find(|&i| 2 * answers.iter().filter(|a| a.same(&answers[i])).count() > r);
        let Some(w) = winner else {
            return Err(StageError::NoMajority {
                stage: k,
                replicas: r,
            });
        };
        // Outvoted replicas go, from the last so the indices stay right.
        for i in (0..r).rev() {
            if !answers[i].same(&answers[w]) {
                let reason = "its answer differed from the majority's".to_string();
                self.replace(k, i, reason, true).await?;
            }
        }
        Ok(answers[w].clone())
    }

    /// Replica `i` of stage `k`'s batch: a prefill (of the prompt, or of the whole history
    /// when the node is new), or one decode step; the graphs it needs; and what to keep of
    /// its answer.
    #[allow(clippy::type_complexity)]
    fn batch_for(
        &mut self,
        k: usize,
        i: usize,
        input: &StageInput,
        prefill: bool,
        sampling: Option<Sampling>,
    ) -> Result<(Batch, Vec<(Hash, Vec<u8>)>, Expect), StageError> {
        let cfg = &self.model.config;
        let stage = self.files.stages[k];
        let capacity = self.capacity;
        let fresh = self.nodes[k][i].held == 0;
        let name = stage.input_name();
        let last = stage.is_last(cfg);
        let mut ops = Vec::new();
        let mut tasks = Vec::new();
        let rows;
        if prefill || fresh {
            // A new node (or the prompt): every row the stage has been given.
            let all = &self.history[k];
            rows = all.rows(cfg.hidden);
            let t = all.tensor(cfg.hidden).map_err(StageError::Model)?;
            ops.push(SessionOp::Put {
                name: name.into(),
                blob: hex_tensor(&t),
            });
            let (task, bytes) = self.graph(k, "prefill", rows, capacity)?;
            tasks.push((task, bytes));
            let mut outputs: std::collections::BTreeMap<String, String> = stage
                .row_names()
                .into_iter()
                .zip(stage.cache_names())
                .collect();
            outputs.extend(head_outputs(last, sampling.is_some()));
            ops.push(SessionOp::Run {
                task,
                weights: Some(self.files.files[k].2),
                inputs: [(name.to_string(), name.to_string())].into(),
                outputs,
                seed: 0,
            });
        } else {
            rows = 1;
            let pos = self.len;
            let t = input.tensor(cfg.hidden).map_err(StageError::Model)?;
            ops.push(SessionOp::Put {
                name: name.into(),
                blob: hex_tensor(&t),
            });
            let pos_t = HostTensor::from_i64(&[1], &[pos as i64])
                .map_err(|e| StageError::Model(e.to_string()))?;
            ops.push(SessionOp::Put {
                name: "pos".into(),
                blob: hex_tensor(&pos_t),
            });
            let held = self.nodes[k][i].held;
            if held < capacity {
                let (task, bytes) = self.graph(k, "grow", held, capacity)?;
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
            let (task, bytes) = self.graph(k, "decode", 1, capacity)?;
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
                weights: Some(self.files.files[k].2),
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
        // After a prefill, the next stage needs this step's rows: all of them for the prompt,
        // the last one when a new node was rebuilt mid-generation.
        let (ty, keep) = match (last, sampling) {
            (false, _) => {
                let out_rows = if prefill || fresh { rows } else { 1 };
                let keep = if prefill { rows } else { 1 };
                (
                    TensorType::new(DType::F32, vec![out_rows, cfg.hidden]),
                    keep * cfg.hidden,
                )
            }
            (true, None) => (TensorType::new(DType::I64, vec![1]), 0),
            (true, Some(_)) => (TensorType::new(DType::F32, vec![cfg.vocab]), 0),
        };
        Ok((Batch { ops }, tasks, Expect { ty, keep }))
    }
}

/// What a stage's answer must be (the exact type of the tensor it gets back) and what of it to
/// keep: its last `keep` floats (0: the last stage's token or logits).
#[derive(Clone)]
struct Expect {
    ty: TensorType,
    keep: u64,
}

impl Expect {
    /// The most bytes the batch's answer may have: the tensor as hex, and room for the other
    /// operations' short results.
    fn answer_bytes(&self) -> u64 {
        2 * (self.ty.bytes().unwrap_or(u64::MAX / 4) + tensor::MAX_TYPE_TEXT as u64 + 64)
            + (256 << 10)
    }
}

/// A batch's answer as the stage's output, or `Err((lost, why))`. A tensor of another type
/// than the stage's output counts as lost: another node should take the stage.
fn answer_of(
    results: BatchResults,
    expect: &Expect,
    sampling: Option<Sampling>,
    step: u64,
) -> Result<Answer, (bool, String)> {
    if let Some(e) = results.error {
        return Err((e.error.code == ErrorCode::NotFound, e.error.message));
    }
    let Some(OpResult::Blob(hex)) = results.results.last() else {
        return Err((true, "its batch gave no tensor back".into()));
    };
    let t = tenet_proto::from_hex(hex)
        .ok_or("the tensor it gave is not hex")
        .and_then(|b| tensor::decode(&b).map_err(|_| "the tensor it gave does not decode"))
        .map_err(|e| (true, e.to_string()))?;
    if *t.ty() != expect.ty {
        return Err((
            true,
            format!(
                "it answered a {} where the stage gives {}",
                t.ty(),
                expect.ty
            ),
        ));
    }
    Ok(match (expect.keep, sampling) {
        (0, None) => Answer::Token(t.get_i64(0) as u32),
        (0, Some(s)) => Answer::Token(sample(&t.to_f32_vec(), s, step)),
        (n, _) => {
            let v = t.to_f32_vec();
            Answer::Rows(v[v.len().saturating_sub(n as usize)..].to_vec())
        }
    })
}

/// Poll every future until all are done; their outputs in order (the replicas of a stage
/// answer concurrently on one thread).
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// What a stage's batch gave back.
#[derive(Clone)]
enum Answer {
    Rows(Vec<f32>),
    Token(u32),
}

impl Answer {
    /// The same bits.
    fn same(&self, other: &Answer) -> bool {
        match (self, other) {
            (Answer::Token(a), Answer::Token(b)) => a == b,
            (Answer::Rows(a), Answer::Rows(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => false,
        }
    }
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
