//! `tenet-pipeline`: a model larger than one node, as stages that run one after another.
//!
//! [`tenet_ir::split`] cuts a graph into stage graphs; this crate makes that a thing a user
//! keeps and ships: a folder with one binary graph and one weights file per stage (holding only
//! the tensors that stage reads, so a stage node downloads only its share) and a manifest
//! (`manifest.json`) that lists the stages in order with their ids, weights, certificates and
//! the boundary tensors that pass between them ([`manifest`]); loading such a folder checks
//! every file against the manifest and the chain of stages ([`folder`]); running one runs the
//! stages in order, each stage's boundary outputs becoming the next one's inputs, with the
//! same outputs, bit for bit, as the whole graph ([`run`]).

pub mod folder;
pub mod run;

/// The manifest is a wire format too (a pipeline's deploy body): it lives in `tenet-proto`.
pub use tenet_proto::manifest;

pub use folder::{SplitModel, StageFiles, is_split_dir, load, manifest_of, write_split};
pub use manifest::{Manifest, ManifestError, Port, StageEntry, WeightsEntry};
pub use run::{run_stages, run_stages_with};

/// Why a split could not be written, loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Split(#[from] tenet_ir::split::SplitError),
    #[error("manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("weights: {0}")]
    Weights(String),
    #[error("stage {stage}: {message}")]
    Stage { stage: usize, message: String },
}
