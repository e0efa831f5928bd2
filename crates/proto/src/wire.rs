//! The JSON bodies of the node API. Routes (all under `/v1`, all signed except `info`):
//!
//! | route | body → answer |
//! |---|---|
//! | `GET /info` | → [`NodeInfo`] |
//! | `PUT /blobs/{hash}` | raw bytes → [`BlobStored`]; `HEAD`, `GET` |
//! | `PUT /pins/{hash}` | → keeps the blob through evictions and restarts; `DELETE` unpins |
//! | `POST /jobs` | [`RunJob`] → [`Committed`] |
//! | `GET /jobs/{id}` | → [`JobStatus`]; `DELETE` cancels |
//! | `POST /jobs/{id}/reveal` | → [`Revealed`] |
//! | `POST /sessions` | → [`SessionCreated`]; `DELETE /sessions/{id}` frees it |
//! | `PUT /sessions/{id}/tensors/{name}` | tensor blob → [`Resident`]; `GET`, `DELETE` |
//! | `POST /sessions/{id}/batch` | [`Batch`] → [`BatchResults`] |
//! | `GET /tensors/{hash}` | → a resident tensor's or stored blob, for peer nodes (an untrusted key with a coordinator's pull grant for that hash, too) |
//! | `GET /metrics` | → Prometheus text |

use std::collections::BTreeMap;

use crate::auth::PublicKey;
use crate::commit::{Commitment, JobSpec, Reveal, Tier};
use crate::{ApiError, Hash};

/// Outputs up to this many bytes in all travel inline in the reveal; larger ones are stored as
/// blobs and fetched with `GET /v1/blobs/{hash}`.
pub const INLINE_OUTPUT_BYTES: usize = 256 << 10;

/// What a node says about itself.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// The node's Ed25519 public key: its identity.
    pub node_id: PublicKey,
    pub version: String,
    /// Backend description, such as `cpu avx512 × 2 threads`.
    pub backend: String,
    pub cores: usize,
    /// The most tensor memory one job may need (by its cost certificate).
    pub memory_limit_bytes: u64,
    /// The most floating-point operations one job may need.
    pub max_job_flops: u64,
    pub tiers: Vec<Tier>,
    pub price_per_gflop: f64,
    /// Whether the node accepts unsigned-by-trusted-key requests (local use only).
    pub open: bool,
    /// The devices jobs run on (today one), with what each may serve.
    #[serde(default)]
    pub devices: Vec<DeviceAd>,
}

/// A device a node runs jobs on, as it advertises it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceAd {
    /// The spec the node opened it by (`cpu`, `opencl:0`).
    pub spec: String,
    /// A human description.
    pub name: String,
    /// `cpu`, `gpu`, `accelerator` or `other`.
    pub class: String,
    /// Bytes of memory tensors may use on it.
    pub memory_bytes: u64,
    /// The tiers it may serve: `exact` only if it passed its determinism check.
    pub tiers: Vec<Tier>,
    /// Why it failed the determinism check, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_refused: Option<String>,
}

/// The answer to a blob upload.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobStored {
    pub hash: Hash,
    pub size: u64,
    /// True when the node already had it.
    pub existed: bool,
}

/// A job to run once: `POST /v1/jobs`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunJob {
    #[serde(flatten)]
    pub job: JobSpec,
    /// Stop the job after this long (capped by the node's own limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Small blobs carried inline (hex), stored as if uploaded: saves a round trip per input.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blobs: BTreeMap<Hash, String>,
    /// Inputs to fetch from other nodes (a pipeline's boundary tensors, from the nodes of the
    /// stage before that agreed on them) when the node does not have them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pulls: BTreeMap<Hash, PullFrom>,
    /// The pipeline stage this job is, for the node's event log and metrics (not part of the
    /// job: a commitment does not bind it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageLabel>,
}

/// Which stage of which pipeline a job runs (1-based `stage` of `stages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageLabel {
    pub pipeline: Hash,
    pub stage: u32,
    pub stages: u32,
}

/// Where to fetch one input: the peers to try, in order, and the coordinator's grant that
/// lets this node fetch it from them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PullFrom {
    pub peers: Vec<String>,
    pub grant: crate::grant::PullGrant,
}

/// A finished job's commitment and what the run measured.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Committed {
    #[serde(flatten)]
    pub commitment: Commitment,
    /// Microseconds spent executing the graph.
    pub exec_us: u64,
    /// Peak tensor bytes the run measured.
    pub peak_bytes: u64,
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Running,
    Committed,
    Revealed,
    Failed,
    Cancelled,
}

/// `GET /v1/jobs/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobStatus {
    pub job_id: String,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
    /// The signed commitment, once the job has committed: a coordinator that lost the answer
    /// to its run request (it restarted) picks the commitment up here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commitment: Option<Commitment>,
}

/// The answer to a reveal: the outputs, the salt, and small outputs' blobs inline (hex).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Revealed {
    #[serde(flatten)]
    pub reveal: Reveal,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blobs: BTreeMap<Hash, String>,
}

/// `POST /v1/sessions`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionCreated {
    pub session: String,
}

/// A tensor now resident in a session.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resident {
    pub name: String,
    pub hash: Hash,
    #[serde(rename = "type")]
    pub ty: String,
}

/// One operation on a session's resident tensors.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SessionOp {
    /// Make a tensor resident from its blob (hex).
    Put { name: String, blob: String },
    /// Run a graph over resident tensors, leaving its outputs resident.
    Run {
        task: Hash,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weights: Option<Hash>,
        /// Graph input name → resident tensor name.
        inputs: BTreeMap<String, String>,
        /// Graph output name → resident tensor name to create or replace.
        outputs: BTreeMap<String, String>,
        #[serde(default)]
        seed: u64,
    },
    /// Return a resident tensor's blob.
    Get { name: String },
    /// Forget a resident tensor.
    Free { name: String },
    /// Copy resident tensor `from` into resident tensor `name` from row `row` of its first
    /// axis (the same dtype and the same shape past the first axis; the rows must fit): how
    /// a stage's KV cache takes one token's key and value rows without crossing the network.
    Write {
        name: String,
        from: String,
        row: u64,
    },
    /// Fetch a tensor by hash from a peer node (`http://host:port`) and make it resident.
    Pull {
        name: String,
        hash: Hash,
        peer: String,
    },
}

/// Many session operations in one round trip, run in order; the first failure stops the rest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Batch {
    pub ops: Vec<SessionOp>,
}

/// What one session operation produced.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpResult {
    /// Tensors made resident (by put, run or pull).
    Resident(Vec<Resident>),
    /// A tensor's blob (hex), for get.
    Blob(String),
    /// Done, nothing to report (free).
    Done,
}

/// The answer to a batch: one result per operation run, and the error that stopped it, if any.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchResults {
    pub results: Vec<OpResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BatchError>,
}

/// The operation a batch stopped at.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchError {
    pub index: usize,
    #[serde(flatten)]
    pub error: ApiError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ops_have_a_readable_json_form() {
        let op: SessionOp = serde_json::from_str(
            r#"{"op":"run","task":"0000000000000000000000000000000000000000000000000000000000000000","inputs":{"x":"a"},"outputs":{"y":"b"}}"#,
        )
        .unwrap();
        assert!(matches!(
            op,
            SessionOp::Run {
                seed: 0,
                weights: None,
                ..
            }
        ));
        let free = serde_json::to_string(&SessionOp::Free { name: "a".into() }).unwrap();
        assert_eq!(free, r#"{"op":"free","name":"a"}"#);
        assert!(serde_json::from_str::<SessionOp>(r#"{"op":"exec","code":"rm -rf /"}"#).is_err());
    }
}
