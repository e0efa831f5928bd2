//! Checkpoints: the parameters, the optimizer state and the training so far, as one safetensors
//! file named by its own blake3 hash (`checkpoints/<hash>.safetensors`), so a checkpoint is
//! addressed by content like everything else tenet stores. The configuration and the loss
//! history ride in the file's metadata, under the one key `tenet.train` (one key, so the header
//! — and the hash — do not depend on a map's order).

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::{Value, json};
use tenet_ir::{DType, HostTensor, TensorType};

use crate::curve::History;
use crate::nn::Model;
use crate::optim::Optimizer;

/// Checkpoints larger than this are refused before they are read (a 4 GiB model's state is
/// far beyond what `tenet train` builds).
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 30;

/// What a checkpoint was trained with and how far it got. Everything but `step` must match to
/// resume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub dataset: String,
    pub model: String,
    pub optimizer: String,
    pub seed: u64,
    pub batch: u64,
    pub shards: u64,
    pub step: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write checkpoint {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("checkpoint {path} is not one `tenet train` wrote: {reason}")]
    Malformed { path: String, reason: String },
    #[error(
        "checkpoint {path} does not hash to its name (blake3 {actual}): the file was changed or damaged"
    )]
    Tampered { path: String, actual: String },
    #[error(
        "the checkpoint was trained with {field} {theirs}, this run asks for {ours}: pass the same settings to resume (or start afresh without --resume)"
    )]
    Mismatch {
        field: &'static str,
        theirs: String,
        ours: String,
    },
    #[error(
        "no checkpoint {spec:?}: give a checkpoint file, or a hash (or its first 8+ characters) of one in {dir}"
    )]
    NotFound { spec: String, dir: String },
}

impl Meta {
    /// Ok when a run configured as `ours` may continue this checkpoint.
    pub fn matches(&self, ours: &Meta) -> Result<(), CheckpointError> {
        let fields: [(&'static str, String, String); 6] = [
            ("dataset", self.dataset.clone(), ours.dataset.clone()),
            ("model", self.model.clone(), ours.model.clone()),
            ("optimizer", self.optimizer.clone(), ours.optimizer.clone()),
            ("seed", self.seed.to_string(), ours.seed.to_string()),
            ("batch", self.batch.to_string(), ours.batch.to_string()),
            ("shards", self.shards.to_string(), ours.shards.to_string()),
        ];
        for (field, theirs, ours) in fields {
            if theirs != ours {
                return Err(CheckpointError::Mismatch {
                    field,
                    theirs,
                    ours,
                });
            }
        }
        Ok(())
    }

    fn to_json(&self) -> Value {
        json!({
            "dataset": self.dataset, "model": self.model, "optimizer": self.optimizer,
            "seed": self.seed, "batch": self.batch, "shards": self.shards, "step": self.step,
        })
    }

    fn from_json(v: &Value) -> Option<Meta> {
        Some(Meta {
            dataset: v["dataset"].as_str()?.to_string(),
            model: v["model"].as_str()?.to_string(),
            optimizer: v["optimizer"].as_str()?.to_string(),
            seed: v["seed"].as_u64()?,
            batch: v["batch"].as_u64()?,
            shards: v["shards"].as_u64()?,
            step: v["step"].as_u64()?,
        })
    }
}

/// A checkpoint in memory: its tensors keyed by the step graph's input names
/// (`param/<name>`, `state/<name>/<slot>`).
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub meta: Meta,
    pub tensors: Vec<(String, HostTensor)>,
    pub history: History,
}

fn f32_views(tensors: &[(String, HostTensor)]) -> Result<Vec<(String, TensorView<'_>)>, String> {
    tensors
        .iter()
        .map(|(name, t)| {
            let shape = t.shape().iter().map(|&d| d as usize).collect();
            TensorView::new(Dtype::F32, shape, t.bytes())
                .map(|v| (name.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// The parameters as a safetensors file without metadata, names sorted: its blake3 is the
/// weights hash a training run reports.
pub fn weights_file(params: &[(String, HostTensor)]) -> Result<Vec<u8>, CheckpointError> {
    let malformed = |reason: String| CheckpointError::Malformed {
        path: "weights.safetensors".into(),
        reason,
    };
    let views = f32_views(params).map_err(malformed)?;
    safetensors::serialize(views, None).map_err(|e| malformed(e.to_string()))
}

impl Checkpoint {
    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let malformed = |reason: String| CheckpointError::Malformed {
            path: "<new checkpoint>".into(),
            reason,
        };
        let header = json!({"meta": self.meta.to_json(), "history": self.history.to_json()});
        let metadata =
            std::collections::HashMap::from([("tenet.train".to_string(), header.to_string())]);
        let views = f32_views(&self.tensors).map_err(malformed)?;
        safetensors::serialize(views, Some(metadata)).map_err(|e| malformed(e.to_string()))
    }

    /// Write into `dir` as `<blake3>.safetensors` (through a temporary file and a rename, so a
    /// crash leaves no half checkpoint); returns the path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, CheckpointError> {
        let write = |path: &Path| {
            let path = path.display().to_string();
            move |source| CheckpointError::Write { path, source }
        };
        std::fs::create_dir_all(dir).map_err(write(dir))?;
        let bytes = self.to_bytes()?;
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let path = dir.join(format!("{hash}.safetensors"));
        let tmp = dir.join(format!(".{hash}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes).map_err(write(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(write(&path))?;
        Ok(path)
    }

    /// The checkpoint `spec` names: a file, or a hash or hash prefix (8+ hex characters) of a
    /// checkpoint in `dir`.
    pub fn find(spec: &str, dir: &Path) -> Result<PathBuf, CheckpointError> {
        let path = PathBuf::from(spec);
        if path.is_file() {
            return Ok(path);
        }
        let not_found = || CheckpointError::NotFound {
            spec: spec.to_string(),
            dir: dir.display().to_string(),
        };
        if spec.len() < 8 || !spec.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_found());
        }
        let spec = spec.to_ascii_lowercase();
        let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|_| not_found())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&spec) && n.ends_with(".safetensors"))
            })
            .collect();
        hits.sort();
        match hits.len() {
            1 => Ok(hits.remove(0)),
            _ => Err(not_found()),
        }
    }

    /// Read and check a checkpoint file; one named by a hash must hash to its name.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let shown = path.display().to_string();
        let read = |source| CheckpointError::Read {
            path: shown.clone(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read)?.len();
        let malformed = |reason: String| CheckpointError::Malformed {
            path: shown.clone(),
            reason,
        };
        if size > MAX_CHECKPOINT_BYTES {
            return Err(malformed(format!(
                "{size} bytes, more than the {MAX_CHECKPOINT_BYTES} a checkpoint may have"
            )));
        }
        let bytes = std::fs::read(path).map_err(read)?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit()) {
            let actual = blake3::hash(&bytes).to_hex().to_string();
            if actual != stem.to_ascii_lowercase() {
                return Err(CheckpointError::Tampered {
                    path: shown,
                    actual,
                });
            }
        }
        Checkpoint::from_bytes(&bytes, &shown)
    }

    /// Decode a checkpoint's bytes (`name` for messages): a stranger's file is refused, never
    /// trusted — safetensors' own bounds, one JSON header, f32 tensors only.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Checkpoint, CheckpointError> {
        let malformed = |reason: String| CheckpointError::Malformed {
            path: name.to_string(),
            reason,
        };
        if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(malformed(format!(
                "{} bytes, more than the {MAX_CHECKPOINT_BYTES} a checkpoint may have",
                bytes.len()
            )));
        }
        let st = SafeTensors::deserialize(bytes).map_err(|e| malformed(e.to_string()))?;
        let (_, header) =
            SafeTensors::read_metadata(bytes).map_err(|e| malformed(e.to_string()))?;
        let text = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("tenet.train"))
            .ok_or_else(|| malformed("no `tenet.train` metadata".into()))?;
        let v: Value = serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        let meta =
            Meta::from_json(&v["meta"]).ok_or_else(|| malformed("incomplete `meta`".into()))?;
        let history = History::from_json(&v["history"])
            .ok_or_else(|| malformed("incomplete `history`".into()))?;
        let mut names = st.names();
        names.sort();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let view = st.tensor(name).map_err(|e| malformed(e.to_string()))?;
            if view.dtype() != Dtype::F32 {
                return Err(malformed(format!("{name} is {:?}, not F32", view.dtype())));
            }
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            let t = HostTensor::new(
                TensorType::new(DType::F32, shape.clone()),
                view.data().to_vec(),
            )
            .map_err(|e| malformed(format!("{name}: {e}")))?;
            tensors.push((name.to_string(), t));
        }
        Ok(Checkpoint {
            meta,
            tensors,
            history,
        })
    }

    /// The tensors a run of `model` with `optimizer` needs, each checked to be there with the
    /// right shape.
    pub fn tensors(
        &self,
        model: &Model,
        optimizer: &Optimizer,
    ) -> Result<Vec<(String, HostTensor)>, CheckpointError> {
        let mut out = Vec::new();
        for p in model.params() {
            let mut names = vec![format!("param/{}", p.name)];
            for slot in optimizer.slots() {
                names.push(format!("state/{}/{slot}", p.name));
            }
            for name in names {
                let t = self
                    .tensors
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| t)
                    .ok_or_else(|| CheckpointError::Malformed {
                        path: "checkpoint".into(),
                        reason: format!("{name} is missing"),
                    })?;
                if t.shape() != p.shape.as_slice() {
                    return Err(CheckpointError::Malformed {
                        path: "checkpoint".into(),
                        reason: format!("{name} is {:?}, the model needs {:?}", t.shape(), p.shape),
                    });
                }
                out.push((name, t.clone()));
            }
        }
        Ok(out)
    }
}
