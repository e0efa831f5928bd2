//! LLM generation as a job: what a node runs when a job names the generation task, and how
//! its inputs and outputs travel as tensors — so a generation is committed, revealed,
//! compared, disputed and receipted exactly like any graph job.
//!
//! A generation job names a generation task (the blake3 hash of a fixed document, not a graph:
//! nodes recognise the id and never need the blob), the model's GGUF file as its weights, and
//! three inputs. The task names the arithmetic of the model's linear layers ([`Arithmetic`]):
//! `exact` ([`TASK_BYTES`], every product the f32 chain of the dequantised weights, the
//! logits of the f32 model) or `q8` ([`TASK_BYTES_Q8`], activations rounded to 8-bit blocks
//! and integer block products, llama.cpp's arithmetic, about twice as fast on a CPU). Both are
//! bit-exact on every node, so either is verified the same way; they give different logits,
//! which is why the arithmetic is part of what a receipt binds.
//!
//! | input | type | meaning |
//! |---|---|---|
//! | `ids` | `i64[n]`, 1 ≤ n | the prompt's token ids, followed by the tokens agreed so far |
//! | `params` | `i64[4]` | `max_tokens` (1 ≤ · ≤ [`MAX_NEW_TOKENS`]), `first_step` (the sampler's step index of the first new token: the tokens generated before this job), the temperature and `top_p` as f32 bit patterns (temperature 0: greedy) |
//! | `stop` | `i64[s]`, s ≤ [`MAX_STOP_TOKENS`] | tokens that end the generation besides the model's end-of-sequence token |
//!
//! The job's seed is the sampler's seed. Its outputs are `tokens` (`i64[k]`, the new tokens,
//! 1 ≤ k ≤ max_tokens) and `finish` (`i64[1]`: 0 the length limit or the context, 1 a stop
//! token). A long generation can run as several jobs, each continuing from the tokens the
//! previous ones agreed on with `first_step` advanced, and gives exactly the tokens of one
//! job: the sampler draws by step index, and the model's logits depend only on the tokens.

use std::collections::HashMap;

use tenet_ir::{DType, HostTensor};

use crate::smollm2::{FinishReason, Sampling, WeightsMode};

/// The document whose hash names the generation task with `exact` arithmetic.
pub const TASK_BYTES: &[u8] = b"tenet-task:generate-v1:llama-gguf\n";

/// The document whose hash names the generation task with `q8` arithmetic.
pub const TASK_BYTES_Q8: &[u8] = b"tenet-task:generate-v1:llama-gguf:qmatmul_q8\n";

/// The most tokens one generation job may ask for.
pub const MAX_NEW_TOKENS: u64 = 4096;

/// The most stop tokens a job may list.
pub const MAX_STOP_TOKENS: u64 = 16;

/// The generation task's id with `exact` arithmetic: blake3 of [`TASK_BYTES`].
pub fn task_id() -> [u8; 32] {
    Arithmetic::Exact.task_id()
}

/// How a generation task computes the model's linear layers: what its id names, and so what
/// every node that runs it must reproduce bit for bit.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Arithmetic {
    /// `qmatmul`: each weight dequantised exactly, then the f32 fma chain along `k` — the
    /// logits of the f32 model.
    #[default]
    Exact,
    /// `qmatmul_q8`: activations rounded to 8-bit blocks, exact integer block products, f32
    /// accumulation across blocks (llama.cpp's arithmetic).
    Q8,
}

impl Arithmetic {
    pub const ALL: [Arithmetic; 2] = [Arithmetic::Exact, Arithmetic::Q8];

    /// `exact` or `q8`.
    pub fn name(self) -> &'static str {
        match self {
            Arithmetic::Exact => "exact",
            Arithmetic::Q8 => "q8",
        }
    }

    /// The document whose hash names the generation task of this arithmetic.
    pub fn task_bytes(self) -> &'static [u8] {
        match self {
            Arithmetic::Exact => TASK_BYTES,
            Arithmetic::Q8 => TASK_BYTES_Q8,
        }
    }

    /// The id of the generation task of this arithmetic.
    pub fn task_id(self) -> [u8; 32] {
        *blake3::hash(self.task_bytes()).as_bytes()
    }

    /// The arithmetic of the generation task `task`, or `None` when `task` is not one.
    pub fn of_task(task: &[u8; 32]) -> Option<Arithmetic> {
        Arithmetic::ALL.into_iter().find(|a| &a.task_id() == task)
    }

    /// How a model is loaded to compute with this arithmetic (weights kept as blocks).
    pub fn weights_mode(self) -> WeightsMode {
        match self {
            Arithmetic::Exact => WeightsMode::Quantized,
            Arithmetic::Q8 => WeightsMode::Q8,
        }
    }
}

impl std::fmt::Display for Arithmetic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arithmetic {
    type Err = String;

    /// `exact` or `q8`, in any case.
    fn from_str(s: &str) -> Result<Arithmetic, String> {
        match s.to_ascii_lowercase().as_str() {
            "exact" => Ok(Arithmetic::Exact),
            "q8" => Ok(Arithmetic::Q8),
            _ => Err(format!(
                "unknown arithmetic {s:?}: exact (the f32 model's logits) or q8 (8-bit activations, llama.cpp's arithmetic, faster)"
            )),
        }
    }
}

/// How one generation job continues its `ids`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    pub max_tokens: u64,
    /// The sampler's step index of the first new token.
    pub first_step: u64,
    /// `None`: greedy.
    pub sampling: Option<(f32, f32)>,
    pub stop: Vec<u32>,
}

impl GenerationParams {
    /// The sampler of a job whose seed is `seed`.
    pub fn sampler(&self, seed: u64) -> Option<Sampling> {
        self.sampling.map(|(temperature, top_p)| Sampling {
            seed,
            temperature,
            top_p,
        })
    }
}

/// A generation job's inputs, by name.
pub fn inputs(ids: &[u32], params: &GenerationParams) -> Vec<(String, HostTensor)> {
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let (t, p) = params.sampling.unwrap_or((0.0, 1.0));
    let p = [
        params.max_tokens as i64,
        params.first_step as i64,
        t.to_bits() as i64,
        p.to_bits() as i64,
    ];
    let stop: Vec<i64> = params.stop.iter().map(|&t| t as i64).collect();
    let tensor = |v: &[i64]| HostTensor::from_i64(&[v.len() as u64], v).expect("a vector");
    vec![
        ("ids".into(), tensor(&ids)),
        ("params".into(), tensor(&p)),
        ("stop".into(), tensor(&stop)),
    ]
}

/// A vector of i64 named `name`, at most `most` long.
fn vector(inputs: &HashMap<String, HostTensor>, name: &str, most: u64) -> Result<Vec<i64>, String> {
    let t = inputs
        .get(name)
        .ok_or_else(|| format!("a generation job needs the input {name:?}"))?;
    if t.dtype() != DType::I64 || t.shape().len() != 1 {
        return Err(format!("input {name:?} must be i64[n], not {}", t.ty()));
    }
    if t.shape()[0] > most {
        return Err(format!(
            "input {name:?} holds {} values; at most {most}",
            t.shape()[0]
        ));
    }
    Ok(t.to_i64_vec())
}

/// Token ids from i64 values, each below `vocab`.
fn token_ids(values: &[i64], vocab: u64, what: &str) -> Result<Vec<u32>, String> {
    values
        .iter()
        .map(|&v| {
            u32::try_from(v)
                .ok()
                .filter(|&t| (t as u64) < vocab)
                .ok_or_else(|| format!("{what}: {v} is not a token id of this model (0..{vocab})"))
        })
        .collect()
}

/// A generation job's prompt and parameters, checked against a model of `vocab` tokens and
/// `context` positions (the prompt and the new tokens must fit it).
pub fn parse_inputs(
    inputs: &HashMap<String, HostTensor>,
    vocab: u64,
    context: u64,
) -> Result<(Vec<u32>, GenerationParams), String> {
    if let Some(extra) = inputs
        .keys()
        .find(|k| !matches!(k.as_str(), "ids" | "params" | "stop"))
    {
        return Err(format!(
            "a generation job's inputs are ids, params and stop, not {extra:?}"
        ));
    }
    let ids = token_ids(&vector(inputs, "ids", context)?, vocab, "ids")?;
    if ids.is_empty() {
        return Err("a generation job needs at least one token in ids".into());
    }
    let p = vector(inputs, "params", 4)?;
    let [max_tokens, first_step, t, top_p] = p[..] else {
        return Err("input \"params\" must be i64[4]".into());
    };
    if !(1..=MAX_NEW_TOKENS as i64).contains(&max_tokens) {
        return Err(format!(
            "max_tokens must be 1..={MAX_NEW_TOKENS}, not {max_tokens}"
        ));
    }
    let first_step =
        u64::try_from(first_step).map_err(|_| "first_step must not be negative".to_string())?;
    let bits = |v: i64, what: &str| {
        u32::try_from(v)
            .map(f32::from_bits)
            .map_err(|_| format!("{what} must be an f32 bit pattern"))
    };
    let (t, top_p) = (bits(t, "temperature")?, bits(top_p, "top_p")?);
    if !(t.is_finite() && t >= 0.0) {
        return Err(format!(
            "temperature must be finite and at least 0, not {t}"
        ));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("top_p must be in (0, 1], not {top_p}"));
    }
    let stop = match inputs.get("stop") {
        Some(_) => token_ids(&vector(inputs, "stop", MAX_STOP_TOKENS)?, vocab, "stop")?,
        None => Vec::new(),
    };
    let room = context - ids.len() as u64;
    if room == 0 {
        return Err(format!(
            "the {} tokens of ids fill the model's context of {context}: nothing can follow",
            ids.len()
        ));
    }
    Ok((
        ids,
        GenerationParams {
            max_tokens: max_tokens as u64,
            first_step,
            sampling: (t > 0.0).then_some((t, top_p)),
            stop,
        },
    ))
}

/// A generation job's outputs: the new tokens and why they ended.
pub fn outputs(tokens: &[u32], finish: FinishReason) -> Vec<(String, HostTensor)> {
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let code = match finish {
        FinishReason::Length => 0,
        FinishReason::Stop => 1,
    };
    vec![
        (
            "tokens".into(),
            HostTensor::from_i64(&[ids.len() as u64], &ids).expect("a vector"),
        ),
        (
            "finish".into(),
            HostTensor::from_i64(&[1], &[code]).expect("a vector"),
        ),
    ]
}

/// The tokens and finish reason of a generation job's revealed outputs.
pub fn parse_outputs(outputs: &[(String, HostTensor)]) -> Result<(Vec<u32>, FinishReason), String> {
    let get = |name: &str| {
        outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .filter(|t| t.dtype() == DType::I64 && t.shape().len() == 1)
            .ok_or_else(|| format!("a generation's outputs hold an i64 vector {name:?}"))
    };
    let tokens = token_ids(&get("tokens")?.to_i64_vec(), u32::MAX as u64, "tokens")?;
    let finish = match get("finish")?.to_i64_vec()[..] {
        [0] => FinishReason::Length,
        [1] => FinishReason::Stop,
        _ => return Err("finish must be [0] or [1]".into()),
    };
    Ok((tokens, finish))
}

/// What the `decode_generation` fuzz target checks of one input, shared with the corpus test:
/// bytes 0–2 are the lengths of `ids`, `params` and `stop` (`stop` absent when its byte is
/// 255), the rest their little-endian i64 values (zeros past the end). Nothing may panic;
/// accepted inputs are within every limit and re-encode to the same parse. Whether they were
/// accepted.
#[doc(hidden)]
pub fn fuzz_one(data: &[u8]) -> bool {
    let (vocab, context) = (49_152, 8_192);
    let len = |i: usize| data.get(i).copied().unwrap_or(0) as usize;
    let mut words = data.get(3..).unwrap_or_default().chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        i64::from_le_bytes(b)
    });
    let mut take = |n: usize| -> Vec<i64> { (0..n).map(|_| words.next().unwrap_or(0)).collect() };
    let ids = take(len(0));
    let params = take(len(1) % 8);
    let mut inputs = HashMap::new();
    let vector = |v: &[i64]| HostTensor::from_i64(&[v.len() as u64], v).expect("a vector");
    inputs.insert("ids".to_string(), vector(&ids));
    inputs.insert("params".to_string(), vector(&params));
    if len(2) != 255 {
        let stop = take(len(2) % 24);
        inputs.insert("stop".to_string(), vector(&stop));
    }
    if let Ok((ids, p)) = parse_inputs(&inputs, vocab, context) {
        assert!(!ids.is_empty() && (ids.len() as u64) < context);
        assert!(ids.iter().chain(&p.stop).all(|&t| (t as u64) < vocab));
        assert!((1..=MAX_NEW_TOKENS).contains(&p.max_tokens));
        assert!(p.stop.len() as u64 <= MAX_STOP_TOKENS);
        if let Some((t, top_p)) = p.sampling {
            assert!(t.is_finite() && t > 0.0 && top_p > 0.0 && top_p <= 1.0);
        }
        let again: HashMap<String, HostTensor> = self::inputs(&ids, &p).into_iter().collect();
        assert_eq!(parse_inputs(&again, vocab, context), Ok((ids, p)));
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Vec<(String, HostTensor)>) -> HashMap<String, HostTensor> {
        v.into_iter().collect()
    }

    #[test]
    fn inputs_and_outputs_round_trip() {
        let params = GenerationParams {
            max_tokens: 7,
            first_step: 3,
            sampling: Some((0.7, 0.9)),
            stop: vec![5, 9],
        };
        let ins = map(inputs(&[1, 2, 3], &params));
        assert_eq!(
            parse_inputs(&ins, 100, 64).unwrap(),
            (vec![1, 2, 3], params)
        );
        let greedy = GenerationParams {
            max_tokens: 1,
            first_step: 0,
            sampling: None,
            stop: vec![],
        };
        let ins = map(inputs(&[4], &greedy));
        assert_eq!(parse_inputs(&ins, 100, 64).unwrap().1, greedy);
        let outs = outputs(&[8, 2], FinishReason::Stop);
        assert_eq!(
            parse_outputs(&outs).unwrap(),
            (vec![8, 2], FinishReason::Stop)
        );
        assert_eq!(hex(task_id()).len(), 64);
    }

    fn hex(b: [u8; 32]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Task ids are stored in ledgers and receipts: they never change.
    #[test]
    fn the_task_ids_are_pinned() {
        assert_eq!(
            hex(task_id()),
            hex(*blake3::hash(b"tenet-task:generate-v1:llama-gguf\n").as_bytes())
        );
        let pinned = [
            (
                Arithmetic::Exact,
                "3c16cea5ca21172e4054279023d5d06d512f3dff01df9ea7b66a69da08e8580a",
            ),
            (
                Arithmetic::Q8,
                "6a9999b6bf92ed5d95b2d968201f779f0a89b1b446b55bcae3d5f72257ac12bf",
            ),
        ];
        for (a, id) in pinned {
            assert_eq!(hex(a.task_id()), id, "{a}");
            assert_eq!(Arithmetic::of_task(&a.task_id()), Some(a));
            assert_eq!(a.name().parse::<Arithmetic>(), Ok(a));
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(json, format!("\"{a}\""));
            assert_eq!(serde_json::from_str::<Arithmetic>(&json).unwrap(), a);
        }
        assert_eq!(Arithmetic::of_task(&[0; 32]), None);
        let err = "q4".parse::<Arithmetic>().unwrap_err();
        assert!(err.contains("exact") && err.contains("q8"), "{err}");
        assert!(serde_json::from_str::<Arithmetic>("\"fast\"").is_err());
    }

    #[test]
    fn bad_inputs_are_refused_with_what_is_wrong() {
        let ok = GenerationParams {
            max_tokens: 4,
            first_step: 0,
            sampling: None,
            stop: vec![],
        };
        let refuse = |ids: &[u32], p: &GenerationParams, vocab: u64, ctx: u64, want: &str| {
            let err = parse_inputs(&map(inputs(ids, p)), vocab, ctx).unwrap_err();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        };
        refuse(&[], &ok, 100, 64, "at least one token");
        refuse(&[100], &ok, 100, 64, "not a token id");
        refuse(&[1; 64], &ok, 100, 64, "fill the model's context");
        refuse(&[1; 65], &ok, 100, 64, "at most 64");
        let many = GenerationParams {
            max_tokens: MAX_NEW_TOKENS + 1,
            ..ok.clone()
        };
        refuse(&[1], &many, 100, 64, "max_tokens");
        let hot = GenerationParams {
            sampling: Some((f32::INFINITY, 1.0)),
            ..ok.clone()
        };
        refuse(&[1], &hot, 100, 64, "temperature");
        let nucleus = GenerationParams {
            sampling: Some((1.0, 0.0)),
            ..ok.clone()
        };
        refuse(&[1], &nucleus, 100, 64, "top_p");
        let stops = GenerationParams {
            stop: vec![1; 17],
            ..ok.clone()
        };
        refuse(&[1], &stops, 100, 64, "at most 16");
        let mut extra = map(inputs(&[1], &ok));
        extra.insert("x".into(), HostTensor::from_i64(&[1], &[0]).unwrap());
        assert!(parse_inputs(&extra, 100, 64).unwrap_err().contains("\"x\""));
        let mut wrong = map(inputs(&[1], &ok));
        wrong.insert("ids".into(), HostTensor::from_f32(&[1], &[0.0]).unwrap());
        assert!(
            parse_inputs(&wrong, 100, 64)
                .unwrap_err()
                .contains("i64[n]")
        );
    }
}
