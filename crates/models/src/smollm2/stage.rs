//! A Llama cut into pipeline stages for generation across machines: each stage a span of
//! the layers, run as ordinary graphs over tensors that stay resident between tokens (a
//! node's session, or buffers on a local device), so a decode step moves one token's hidden
//! row across each boundary.
//!
//! A stage holds, per layer of its span, a key and a value cache of one capacity (f32
//! `[capacity, kv_heads, head_dim]`, named `cache_k{l}` / `cache_v{l}` with `l` the layer's
//! index in the whole model), as a [`DecodeSession`](super::DecodeSession) does. Three graphs
//! drive it, all built from the same operations as the whole model's:
//!
//! - [`stage_prefill_graph`]: `n` rows in (`ids` i64 `[n]` for the stage that embeds, else `x`
//!   f32 `[n, hidden]`), out the stage's rows (`y` f32 `[n, hidden]`) or, for the last stage,
//!   `logits` (f32 `[vocab]`, the last row's) and `token` (i64 `[1]`, their argmax), and the
//!   caches already padded with zero rows to the capacity (`k{l}` / `v{l}`), which become the
//!   resident caches.
//! - [`stage_decode_graph`]: one row in at `pos` (i64 `[1]`) over the resident caches, out its
//!   row or logits and token, and the new key and value rows (`k{l}` / `v{l}` `[1, kv_heads,
//!   head_dim]`), which the driver writes into the caches at row `pos`.
//! - [`stage_grow_graph`]: the caches padded with zero rows to a larger capacity.
//!
//! Every stage's rows are exactly the whole model's hidden rows at that layer (the same ops on
//! the same values), so stages run one after another give the whole model's logits bit for
//! bit, and a stage whose state is lost is rebuilt exactly by prefilling it again with every
//! row it was given so far ([`LocalStages`] states the protocol a remote driver follows, and
//! is how the tests check it). Greedy decoding reads `token`; its argmax is the IR's (the
//! first maximum, a NaN counting as the maximum), which is [`argmax`](super::argmax)'s wherever
//! no logit is NaN.

use std::collections::HashMap;

use tenet_exec::{Buffer, Device, Program};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, Tensor, WeightSource, WeightsId};

use super::{LlamaConfig, SmolLm2};
use crate::safetensors_io::write_safetensors;

/// Layers `first..end` of a Llama, run as one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stage {
    pub first: u64,
    pub end: u64,
}

impl Stage {
    /// Every layer: one stage that embeds and gives logits.
    pub fn whole(cfg: &LlamaConfig) -> Stage {
        Stage {
            first: 0,
            end: cfg.layers,
        }
    }

    /// `n` stages of nearly equal spans (the first ones a layer longer).
    pub fn even(cfg: &LlamaConfig, n: u64) -> Result<Vec<Stage>, String> {
        if n == 0 || n > cfg.layers {
            return Err(format!(
                "{n} stages: the model's {} layers can make 1 to {} stages",
                cfg.layers, cfg.layers
            ));
        }
        let (base, extra) = (cfg.layers / n, cfg.layers % n);
        let mut first = 0;
        Ok((0..n)
            .map(|i| {
                let end = first + base + u64::from(i < extra);
                let s = Stage { first, end };
                first = end;
                s
            })
            .collect())
    }

    /// Whether this stage takes token ids (it holds layer 0).
    pub fn embeds(&self) -> bool {
        self.first == 0
    }

    /// Whether this stage gives logits (it holds the last layer).
    pub fn is_last(&self, cfg: &LlamaConfig) -> bool {
        self.end == cfg.layers
    }

    /// Refused unless `first < end <= layers`.
    pub fn check(&self, cfg: &LlamaConfig) -> Result<(), String> {
        if self.first < self.end && self.end <= cfg.layers {
            Ok(())
        } else {
            Err(format!(
                "layers {}..{} are not a span of the model's {} layers",
                self.first, self.end, cfg.layers
            ))
        }
    }

    /// The names of this stage's resident caches, in layer order (key then value).
    pub fn cache_names(&self) -> Vec<String> {
        (self.first..self.end)
            .flat_map(|l| [format!("cache_k{l}"), format!("cache_v{l}")])
            .collect()
    }

    /// The names of the graphs' new (or padded) cache outputs, in the same order.
    pub fn row_names(&self) -> Vec<String> {
        (self.first..self.end)
            .flat_map(|l| [format!("k{l}"), format!("v{l}")])
            .collect()
    }

    /// The name of the rows this stage reads: `ids` or `x`.
    pub fn input_name(&self) -> &'static str {
        if self.embeds() { "ids" } else { "x" }
    }
}

/// The prefill of `n` rows through `stage`, its caches padded to `capacity` (≥ `n`); see the
/// module's header for inputs and outputs.
pub fn stage_prefill_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    stage: Stage,
    n: u64,
    capacity: u64,
) -> Result<Graph, String> {
    stage.check(cfg)?;
    if n == 0 || capacity < n {
        return Err(format!("{n} rows do not fill a capacity of {capacity}"));
    }
    super::llama_span_graph(cfg, weights, stage, 0, n, Some(capacity), true)
}

/// One decode step of `stage` over caches of `capacity` rows; see the module's header.
pub fn stage_decode_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    stage: Stage,
    capacity: u64,
) -> Result<Graph, String> {
    stage.check(cfg)?;
    super::llama_span_decode_graph(cfg, weights, stage, capacity, true)
}

/// The caches of `stage` (`cache_k{l}` / `cache_v{l}`, `from` rows) padded with zero rows to
/// `to` rows, as outputs `k{l}` / `v{l}`.
pub fn stage_grow_graph(
    cfg: &LlamaConfig,
    stage: Stage,
    from: u64,
    to: u64,
) -> Result<Graph, String> {
    stage.check(cfg)?;
    if from == 0 || to < from {
        return Err(format!("cannot grow caches from {from} to {to} rows"));
    }
    let (nkv, hd) = (cfg.kv_heads, cfg.hidden / cfg.heads);
    let g = GraphBuilder::new();
    let outs: Vec<Tensor> = stage
        .cache_names()
        .iter()
        .map(|name| {
            g.input(name, DType::F32, &[from, nkv, hd])
                .pad(&[(0, to - from), (0, 0), (0, 0)], 0.0)
        })
        .collect();
    let names = stage.row_names();
    let outputs: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(&outs).collect();
    g.finish(&outputs).map_err(|e| e.to_string())
}

/// The tensors `stage` reads from `model`'s weights, as a safetensors file (bytes in a fixed
/// order, so its id is reproducible): what a stage's node downloads instead of the whole
/// model.
pub fn stage_weights(model: &SmolLm2, stage: Stage) -> Result<Vec<u8>, String> {
    let graph = stage_prefill_graph(&model.config, model.weights.id, stage, 1, 1)?;
    let mut list = Vec::new();
    for (_, op, _) in graph.weights() {
        if let tenet_ir::Op::Weight { tensor, .. } = op {
            let t = model
                .weights
                .tensors
                .get(tensor)
                .ok_or_else(|| format!("the model has no tensor {tensor}"))?;
            list.push((
                tensor.as_str(),
                t.dtype(),
                t.shape().to_vec(),
                t.bytes().to_vec(),
            ));
        }
    }
    write_safetensors(&list).map_err(|e| e.to_string())
}

/// What one stage step gives: the rows for the next stage, or the last stage's logits and
/// its argmax token.
#[derive(Clone, Debug, PartialEq)]
pub enum StageOutput {
    Rows(Vec<f32>),
    Logits { logits: Vec<f32>, token: u32 },
}

/// Rows into a stage: token ids (the embedding stage) or hidden rows (f32, `hidden` a row).
#[derive(Clone, Debug, PartialEq)]
pub enum StageInput {
    Ids(Vec<u32>),
    Rows(Vec<f32>),
}

impl StageInput {
    /// Rows held (`hidden` floats a row for hidden rows).
    pub fn rows(&self, hidden: u64) -> u64 {
        match self {
            StageInput::Ids(v) => v.len() as u64,
            StageInput::Rows(v) => v.len() as u64 / hidden.max(1),
        }
    }

    /// As the tensor a stage graph takes.
    pub fn tensor(&self, hidden: u64) -> Result<HostTensor, String> {
        match self {
            StageInput::Ids(v) => {
                let v: Vec<i64> = v.iter().map(|&t| i64::from(t)).collect();
                HostTensor::from_i64(&[v.len() as u64], &v)
            }
            StageInput::Rows(v) => HostTensor::from_f32(&[v.len() as u64 / hidden, hidden], v),
        }
        .map_err(|e| e.to_string())
    }

    /// This input's rows followed by `more`'s (of the same kind).
    pub fn extend(&mut self, more: &StageInput) {
        match (self, more) {
            (StageInput::Ids(a), StageInput::Ids(b)) => a.extend_from_slice(b),
            (StageInput::Rows(a), StageInput::Rows(b)) => a.extend_from_slice(b),
            _ => {}
        }
    }
}

/// The stages of a model run on one local device, each with its caches held as device
/// buffers between steps: the protocol a remote driver runs against nodes' sessions (prefill
/// with padded caches, decode steps whose new rows are written at `pos`, growth by a pad
/// graph), and the reference the tests compare it with.
pub struct LocalStages<'a> {
    cfg: &'a LlamaConfig,
    weights: &'a dyn WeightSource,
    id: WeightsId,
    device: &'a dyn Device,
    stages: Vec<Stage>,
    /// Per stage: its caches by name.
    caches: Vec<HashMap<String, Buffer>>,
    programs: HashMap<(usize, u64), Box<dyn Program>>,
    capacity: u64,
    len: u64,
}

impl<'a> LocalStages<'a> {
    pub fn new(model: &'a SmolLm2, device: &'a dyn Device, stages: Vec<Stage>) -> Self {
        LocalStages {
            cfg: &model.config,
            weights: &model.weights,
            id: model.weights.id,
            device,
            caches: vec![HashMap::new(); stages.len()],
            stages,
            programs: HashMap::new(),
            capacity: 0,
            len: 0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Feed `ids` (a prompt first, then one token a call) through every stage; the last
    /// stage's logits and token.
    pub fn feed(&mut self, ids: &[u32]) -> Result<(Vec<f32>, u32), String> {
        let mut input = StageInput::Ids(ids.to_vec());
        for k in 0..self.stages.len() {
            match self.step(k, &input)? {
                StageOutput::Rows(rows) => input = StageInput::Rows(rows),
                StageOutput::Logits { logits, token } => {
                    self.len += ids.len() as u64;
                    return Ok((logits, token));
                }
            }
        }
        Err("the last stage gave no logits".into())
    }

    fn run(
        &mut self,
        key: (usize, u64),
        build: impl FnOnce() -> Result<Graph, String>,
        inputs: &HashMap<String, Buffer>,
    ) -> Result<HashMap<String, Buffer>, String> {
        if !self.programs.contains_key(&key) {
            let program = self.device.compile(&build()?).map_err(|e| e.to_string())?;
            self.programs.insert(key, program);
        }
        let (outs, _) = self.programs[&key]
            .run_buffers(inputs, self.weights, 0, &|| false)
            .map_err(|e| e.to_string())?;
        Ok(outs.into_iter().collect())
    }

    /// Stage `k` on `input` (a prefill when it holds nothing yet, else one row).
    fn step(&mut self, k: usize, input: &StageInput) -> Result<StageOutput, String> {
        let (cfg, id, stage) = (self.cfg, self.id, self.stages[k]);
        let n = input.rows(cfg.hidden);
        let x = self
            .device
            .upload_owned(input.tensor(cfg.hidden)?)
            .map_err(|e| e.to_string())?;
        let mut inputs = HashMap::from([(stage.input_name().to_string(), x)]);
        let mut outs = if self.len == 0 {
            let capacity = capacity_for(cfg, n + 1)?;
            if k == 0 {
                self.capacity = capacity;
            }
            // Prefills are not kept: each prompt length is its own graph.
            let graph = stage_prefill_graph(cfg, id, stage, n, capacity)?;
            let program = self.device.compile(&graph).map_err(|e| e.to_string())?;
            let (outs, _) = program
                .run_buffers(&inputs, self.weights, 0, &|| false)
                .map_err(|e| e.to_string())?;
            let mut outs: HashMap<String, Buffer> = outs.into_iter().collect();
            for (cache, row) in stage.cache_names().into_iter().zip(stage.row_names()) {
                let b = outs.remove(&row).ok_or("a cache is missing")?;
                self.caches[k].insert(cache, b);
            }
            outs
        } else {
            if n != 1 {
                return Err("a decode step takes one row".into());
            }
            let pos = self.len;
            if pos + 1 > self.capacity && k == 0 {
                self.capacity = capacity_for(cfg, pos + 1)?;
            }
            let capacity = self.capacity;
            let held = self.caches[k]
                .values()
                .next()
                .map_or(0, |b| b.ty().shape[0]);
            if held < capacity {
                let grown = self.run(
                    (k, u64::MAX - capacity),
                    || stage_grow_graph(cfg, stage, held, capacity),
                    &self.caches[k].clone(),
                )?;
                for (cache, row) in stage.cache_names().into_iter().zip(stage.row_names()) {
                    self.caches[k].insert(cache, grown[&row].clone());
                }
            }
            let pos_t = HostTensor::from_i64(&[1], &[pos as i64]).map_err(|e| e.to_string())?;
            inputs.insert(
                "pos".into(),
                self.device.upload_owned(pos_t).map_err(|e| e.to_string())?,
            );
            for (name, b) in &self.caches[k] {
                inputs.insert(name.clone(), b.clone());
            }
            let mut outs = self.run(
                (k, capacity),
                || stage_decode_graph(cfg, id, stage, capacity),
                &inputs,
            )?;
            drop(inputs);
            let row_bytes = cfg.kv_heads * (cfg.hidden / cfg.heads) * 4;
            for (cache, row) in stage.cache_names().into_iter().zip(stage.row_names()) {
                let new = outs.remove(&row).ok_or("a new row is missing")?;
                let dst = self.caches[k].get_mut(&cache).ok_or("a cache is missing")?;
                self.device
                    .write(dst, pos * row_bytes, &new)
                    .map_err(|e| e.to_string())?;
            }
            outs
        };
        let host = |b: &Buffer| self.device.download(b).map_err(|e| e.to_string());
        if stage.is_last(cfg) {
            let logits = host(&outs.remove("logits").ok_or("no logits")?)?.to_f32_vec();
            let token = host(&outs.remove("token").ok_or("no token")?)?.to_i64_vec();
            Ok(StageOutput::Logits {
                logits,
                token: token.first().map_or(0, |&t| t as u32),
            })
        } else {
            Ok(StageOutput::Rows(
                host(&outs.remove("y").ok_or("no rows")?)?.to_f32_vec(),
            ))
        }
    }
}

/// The capacity bucket of `positions` ([`SmolLm2::capacity_for`]'s rule).
pub fn capacity_for(cfg: &LlamaConfig, positions: u64) -> Result<u64, String> {
    super::capacity_bucket(cfg.context, positions).ok_or_else(|| {
        format!(
            "the context of {} tokens is full: no room for token {positions}",
            cfg.context
        )
    })
}
