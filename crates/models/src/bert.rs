//! BERT sentence encoders as tenet graphs (all-MiniLM-L6-v2's architecture): token, position
//! and type embeddings, post-LayerNorm encoder layers with GELU (erf form), then mean pooling
//! over the real tokens and L2 normalisation — the operations of
//! shared/models/reference/minilm_numpy.py, in the same order.

use tenet_ir::{DType, Graph, GraphBuilder, Tensor, WeightsId};

/// The fields of a Hugging Face `config.json` the encoder needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub hidden: u64,
    pub heads: u64,
    pub layers: u64,
    pub intermediate: u64,
    pub layer_norm_eps: f32,
    pub max_positions: u64,
    pub vocab: u64,
    pub type_vocab: u64,
}

impl BertConfig {
    /// Parse `config.json`; a missing or mistyped field is an error naming it.
    pub fn from_json(text: &str) -> Result<BertConfig, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("config.json: {e}"))?;
        let int = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("config.json: {k:?} must be a positive integer"))
        };
        let cfg = BertConfig {
            hidden: int("hidden_size")?,
            heads: int("num_attention_heads")?,
            layers: int("num_hidden_layers")?,
            intermediate: int("intermediate_size")?,
            layer_norm_eps: v["layer_norm_eps"]
                .as_f64()
                .ok_or("config.json: \"layer_norm_eps\" must be a number")?
                as f32,
            max_positions: int("max_position_embeddings")?,
            vocab: int("vocab_size")?,
            type_vocab: int("type_vocab_size")?,
        };
        if cfg.heads == 0 || !cfg.hidden.is_multiple_of(cfg.heads) {
            return Err(format!(
                "config.json: hidden_size {} is not divisible by {} heads",
                cfg.hidden, cfg.heads
            ));
        }
        Ok(cfg)
    }
}

/// The encoder for `batch` sentences of `seq` tokens (padded), with weights from the file
/// `weights`. Inputs: `input_ids` and `token_type_ids` (i64 [batch, seq]) and `attention_mask`
/// (f32 [batch, seq], 1 for real tokens, 0 for padding). Output: `embedding` (f32 [batch, hidden]).
pub fn sentence_encoder(
    cfg: &BertConfig,
    weights: WeightsId,
    batch: u64,
    seq: u64,
) -> Result<Graph, String> {
    if seq == 0 || seq > cfg.max_positions {
        return Err(format!(
            "sequence length {seq} must be between 1 and {}",
            cfg.max_positions
        ));
    }
    let (h, nh) = (cfg.hidden, cfg.heads);
    let hd = h / nh;
    let g = GraphBuilder::new();
    let w = |name: &str, shape: &[u64]| g.weight(weights, name, DType::F32, shape);
    let ln = |x: &Tensor, p: &str| {
        x.layer_norm(
            Some(&w(&format!("{p}.weight"), &[h])),
            Some(&w(&format!("{p}.bias"), &[h])),
            cfg.layer_norm_eps,
        )
    };
    // x [batch·seq, in] @ Wᵀ + b, with W stored [out, in] as in PyTorch.
    let linear = |x: &Tensor, p: &str, out: u64, inp: u64| {
        x.matmul(&w(&format!("{p}.weight"), &[out, inp]).transpose(0, 1))
            + w(&format!("{p}.bias"), &[out])
    };
    let ids = g.input("input_ids", DType::I64, &[batch, seq]);
    let types = g.input("token_type_ids", DType::I64, &[batch, seq]);
    let mask = g.input("attention_mask", DType::F32, &[batch, seq]);

    let word = w("embeddings.word_embeddings.weight", &[cfg.vocab, h]).gather(&ids, 0);
    let pos = w(
        "embeddings.position_embeddings.weight",
        &[cfg.max_positions, h],
    )
    .slice(0, 0, seq, 1);
    let typ = w(
        "embeddings.token_type_embeddings.weight",
        &[cfg.type_vocab, h],
    )
    .gather(&types, 0);
    let mut x = ln(&((word + pos) + typ), "embeddings.LayerNorm")
        .reshape(&[(batch * seq) as i64, h as i64]);

    // Additive mask as Hugging Face builds it: (1 − mask) · f32::MIN, broadcast over heads and
    // query positions.
    let neg = (1.0 - mask.reshape(&[batch as i64, 1, 1, seq as i64])) * f32::MIN as f64;
    let heads = |t: Tensor| t.reshape(&[batch as i64, seq as i64, nh as i64, hd as i64]);
    for i in 0..cfg.layers {
        let p = format!("encoder.layer.{i}");
        let q =
            heads(linear(&x, &format!("{p}.attention.self.query"), h, h)).permute(&[0, 2, 1, 3]);
        let k = heads(linear(&x, &format!("{p}.attention.self.key"), h, h)).permute(&[0, 2, 3, 1]);
        let v =
            heads(linear(&x, &format!("{p}.attention.self.value"), h, h)).permute(&[0, 2, 1, 3]);
        let scores = q.matmul(&k) / (hd as f64).sqrt() + &neg;
        let ctx = scores
            .softmax(-1)
            .matmul(&v)
            .permute(&[0, 2, 1, 3])
            .reshape(&[(batch * seq) as i64, h as i64]);
        x = ln(
            &(&x + linear(&ctx, &format!("{p}.attention.output.dense"), h, h)),
            &format!("{p}.attention.output.LayerNorm"),
        );
        let inner = linear(&x, &format!("{p}.intermediate.dense"), cfg.intermediate, h).gelu();
        x = ln(
            &(&x + linear(&inner, &format!("{p}.output.dense"), h, cfg.intermediate)),
            &format!("{p}.output.LayerNorm"),
        );
    }
    // Mean over real tokens, then unit length.
    let x = x.reshape(&[batch as i64, seq as i64, h as i64]);
    let m = mask.reshape(&[batch as i64, seq as i64, 1]);
    let pooled = (&x * &m).sum(&[1], false) / m.sum(&[1], false);
    let norm = (&pooled * &pooled).sum(&[-1], true).sqrt();
    let embedding = &pooled / &norm;
    g.finish(&[("embedding", &embedding)])
        .map_err(|e| e.to_string())
}
