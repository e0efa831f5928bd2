//! The JSON bodies of the coordinator's REST API for clients, so that the coordinator that
//! writes them and the clients that read them (the CLI, the benchmarks, `tenet demo`) share one
//! definition instead of each spelling field names. Routes (all under `/v1`):
//!
//! | route | body → answer |
//! |---|---|
//! | `GET /info` | → [`Info`] |
//! | `POST /tasks` | a graph → [`TaskDeployed`] |
//! | `GET /tasks/{id}` | → [`Task`] |
//! | `POST /tasks/{id}/run` | [`RunRequest`] (or safetensors) → [`RunAnswer`]; with `?async=true`, [`Submitted`] |
//! | `GET /jobs/{id}` | → [`JobView`] (`?wait=SECS` holds it until the job ends) |
//! | `GET /jobs` | → a list of [`Job`] |
//! | `POST /nodes`, `PUT /nodes/{id}` | [`Register`] → [`Node`] |
//! | `GET /nodes` | → a list of [`Node`]; `GET`, `DELETE /nodes/{id}` and its heartbeat → [`Node`] |
//! | `POST /nodes/{id}/stake` | [`Bond`] → [`Node`] |
//! | `GET /nodes/{id}/stake` | → [`StakeHistory`] |
//! | `POST /pipelines` | a manifest → [`PipelineDeployed`]; `GET /pipelines/{id}` → [`Pipeline`] |
//! | `POST /pipelines/{id}/run` | [`RunRequest`] → [`PipelineAnswer`] |
//! | `POST /llms` | [`DeployLlm`] (the admin's) → [`LlmDeployed`] |
//! | `POST /llms/{name}/staged` | its own body (`tenet generate --coordinator` writes it) → [`StagedAnswer`] |
//!
//! The coordinator writes every answer with [`to_value`]: each object's keys in sorted order,
//! as it wrote them before these types existed (a `serde_json::Value` map is ordered by key),
//! so the bytes on the wire did not change when they were typed; the tests pin each body's
//! text. Clients read them with serde, ignoring fields they do not know.
//!
//! Outputs travel as JSON tensors (`{"dtype", "shape", "data"}`, the form `tenet_models`
//! writes and reads), which this crate leaves as [`serde_json::Value`]s by output name. What
//! the coordinator's ledger holds as text (node and job ids, states, hashes it stored as hex)
//! stays text here: these types describe the wire, not the ledger.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tenet_ir::{DType, TensorType};

use crate::Hash;
use crate::auth::PublicKey;
use crate::commit::Tier;
use crate::manifest::Port;
use crate::pipeline_receipt::PipelineReceipt;
use crate::receipt::Receipt;
use crate::staged_receipt::StagedReceipt;

/// `value` as the coordinator writes an answer: through a [`Value`], so that every object's
/// keys come out sorted, whatever order a type declares its fields in.
pub fn to_value<T: Serialize>(value: &T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(value)
}

/// The compact JSON text of [`to_value`] (request bodies too: a client's body reads as it did
/// when it was a `json!` literal).
pub fn to_vec<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&to_value(value)?)
}

/// An answer read from the [`Value`] a client parsed it into (fields it does not know are
/// ignored).
pub fn from_value<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(value)
}

/// Tensors by name, each as a JSON tensor (`{"dtype", "shape", "data"}`).
pub type JsonTensors = BTreeMap<String, Value>;

/// `GET /v1/info`: who the coordinator is and the rules it runs by. The one answer read
/// without a key: a client takes the coordinator's key from it to check receipts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// The key that signs every receipt.
    pub coordinator: PublicKey,
    pub version: String,
    /// Nodes each job runs on.
    pub replicas: usize,
    /// Per-element bound against the median in the tolerant tier.
    pub tolerance: f64,
    /// Fraction of stake a disagreeing node loses.
    pub slash_fraction: f64,
    /// Credited to each agreeing node per job.
    pub reward: i64,
    /// Spot-check mode's probability of replicating a job; `null` when every job is.
    pub spot_check: Option<f64>,
    /// Anyone may call (local use).
    pub open: bool,
    /// The dashboard's read-only views need no key.
    pub public_dashboard: bool,
}

/// The coordinators sharing one ledger (`GET /v1/coordinators`): the deployment's set of
/// receipt-signing keys, and where each listens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coordinators {
    pub coordinators: Vec<CoordinatorPeer>,
}

/// One coordinator on the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorPeer {
    /// The key its receipts are signed with.
    pub key: PublicKey,
    pub url: String,
    pub started_at: i64,
    /// It renewed its leases lately (within three lease times).
    pub live: bool,
}

/// A task's input or output: its name and type, as the graph declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// The dtype's name (`f32`, `i64`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, ty: &TensorType) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            dtype: ty.dtype.name().to_string(),
            shape: ty.shape.clone(),
        }
    }

    /// Its type; `None` when the dtype is not one this tenet knows.
    pub fn ty(&self) -> Option<TensorType> {
        Some(TensorType::new(
            DType::from_name(&self.dtype)?,
            self.shape.clone(),
        ))
    }
}

impl From<&Port> for TensorSpec {
    /// A pipeline's input or output as a task's: what a caller needs to write its body.
    fn from(p: &Port) -> TensorSpec {
        TensorSpec {
            name: p.name.clone(),
            dtype: p.dtype.clone(),
            shape: p.shape.clone(),
        }
    }
}

/// A deployed task as clients see it: `GET /v1/tasks/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The graph's id: its blob address.
    pub id: Hash,
    /// Where to call it: `/v1/tasks/{id}/run`.
    pub endpoint: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// The weights file it references; `null` when none.
    pub weights: Option<Hash>,
    /// Its cost certificate's flops and peak tensor bytes.
    pub flops: u64,
    pub peak_bytes: u64,
}

/// The answer to a deploy (`POST /v1/tasks`): the task, and how many registered nodes'
/// advertised limits take it (0 warns that no call can run yet).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDeployed {
    #[serde(flatten)]
    pub task: Task,
    pub nodes_able: usize,
}

/// The JSON body of a call (`POST /v1/tasks/{id}/run`, `POST /v1/pipelines/{id}/run`) as a
/// client writes it. The coordinator does not read it with this type: it decodes the body
/// against the task's declared inputs as it streams ([`crate::run_body`]), bounded by their
/// size; a test checks that what this writes, that reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Every declared input, by name.
    pub inputs: JsonTensors,
    /// `exact` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// 0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The answer to an asynchronous call (`?async=true`, status 202): the job is in the ledger
/// and runs on; `status` is where to ask for it ([`JobView`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    pub job_id: String,
    /// `pending`.
    pub state: String,
    /// `/v1/jobs/{job_id}`.
    pub status: String,
}

/// A node that disagreed with a decided result, and the stake it lost for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slash {
    /// The node's id (hex of its public key).
    pub node: String,
    pub amount: i64,
}

/// The answer to a call once decided: the outputs, the receipt that proves them, who was
/// slashed, and whether the coordinator had to referee.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunAnswer {
    pub job_id: String,
    /// `decided`.
    pub state: String,
    pub outputs: JsonTensors,
    pub receipt: Receipt,
    pub slashed: Vec<Slash>,
    pub refereed: bool,
}

/// A job as the ledger records it: `GET /v1/jobs` lists these, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: String,
    /// The task's id (hex).
    pub task: String,
    /// The weights file's id (hex), if the task has one.
    pub weights: Option<String>,
    /// `exact` or `tolerant`.
    pub tier: String,
    pub seed: i64,
    /// Nodes asked.
    pub replicas: i64,
    /// `pending`, `committing`, `revealing`, `decided` or `failed`.
    pub state: String,
    /// Unix seconds.
    pub created_at: i64,
    pub updated_at: i64,
    /// The agreed outputs' hash (hex), once decided.
    pub output_hash: Option<String>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// The signed receipt, once decided (`null` before, or if the ledger's copy does not
    /// read as one).
    pub receipt: Option<Receipt>,
}

/// One replica of a job: the node drawn, where its replica is, what it revealed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub node: String,
    /// `assigned`, `committed`, `revealed`, `failed`, `agreed` or `disagreed`.
    pub state: String,
    pub output_hash: Option<String>,
}

/// `GET /v1/jobs/{id}`: the job's record and replicas and, once it is decided, its outputs
/// and who was slashed for it (absent before).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    #[serde(flatten)]
    pub job: Job,
    pub assignments: Vec<Assignment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<JsonTensors>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slashed: Option<Vec<Slash>>,
}

/// A registered node as the coordinator's ledger knows it (`GET /v1/nodes` lists these; a
/// registration, a bond, a heartbeat and leaving answer one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Hex of the node's public key.
    pub id: String,
    pub url: String,
    /// Bonded stake, in the smallest unit: 0 gets no jobs.
    pub stake: i64,
    /// `registered`, `active`, `unhealthy` or `deregistered`.
    pub state: String,
    /// Who answers for its stake: the operator the admin named, else the node itself.
    pub operator: String,
    /// The most tensor memory and flops one job may need on it, as it advertises them (0:
    /// not known).
    pub memory_limit: i64,
    pub max_flops: i64,
    /// Its device, as it advertises it (`cpu cpu`; empty: not known).
    pub device: String,
    /// Whether that device passed its determinism check and may serve the exact tier.
    pub exact: bool,
    /// Decided jobs where it agreed and where it did not, and its mean score.
    pub agreed: i64,
    pub disagreed: i64,
    pub score: f64,
    /// Unix seconds.
    pub last_heartbeat: i64,
}

/// The body of a node registration (`POST /v1/nodes`, `PUT /v1/nodes/{id}`). A stake above 0
/// takes the admin's key; `null` or absent is 0.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    pub url: String,
    #[serde(default)]
    pub stake: Option<i64>,
}

/// The body of a bond (`POST /v1/nodes/{id}/stake`, the admin's): stake to add (negative to
/// take back), and who answers for the node (`null`: unchanged).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bond {
    pub amount: i64,
    #[serde(default)]
    pub operator: Option<String>,
}

/// `GET /v1/nodes/{id}/stake`: a node's stake now and how it got there, newest last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StakeHistory {
    pub node: String,
    pub stake: i64,
    pub events: Vec<StakeChange>,
}

/// One change of a node's stake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StakeChange {
    /// Unix seconds.
    pub at: i64,
    /// Negative for a slash.
    pub delta: i64,
    pub reason: String,
    /// The job it was for, if any.
    pub job: Option<String>,
    /// The stake it left.
    pub stake: i64,
}

/// A deployed pipeline (`GET /v1/pipelines/{id}`): its stages in order, each a deployed task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    /// The manifest's hash.
    pub id: Hash,
    /// Where to call it: `/v1/pipelines/{id}/run`.
    pub endpoint: String,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
    pub stages: Vec<PipelineStage>,
}

/// One stage of a deployed pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineStage {
    /// The stage graph's task id (hex).
    pub task: String,
    /// Its weights file's id (hex), if it has one.
    pub weights: Option<String>,
    pub peak_bytes: u64,
    pub flops: u64,
    /// The boundary tensors it hands the next stage.
    pub boundary_out: Vec<Port>,
}

/// The answer to a pipeline's deploy (`POST /v1/pipelines`): the pipeline, and for each
/// stage how many nodes' limits take it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineDeployed {
    #[serde(flatten)]
    pub pipeline: Pipeline,
    pub nodes_able: Vec<usize>,
}

/// The answer to a pipeline call once decided: the last stages' outputs, what each stage's
/// job did, and the pipeline receipt that chains the stages' receipts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineAnswer {
    pub pipeline: Hash,
    /// `decided`.
    pub state: String,
    pub outputs: JsonTensors,
    pub stages: Vec<StageRun>,
    pub receipt: PipelineReceipt,
}

/// One stage's job in a pipeline call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageRun {
    pub job_id: String,
    pub task: Hash,
    /// Nodes asked, and nodes that agreed.
    pub replicas: u32,
    pub agreeing: usize,
    pub slashed: Vec<Slash>,
    pub refereed: bool,
    /// Wall time of the stage's job.
    pub ms: f64,
    /// Bytes of the boundary tensors it passed to the next stage.
    pub boundary_bytes: u64,
}

/// The body of an LLM's deploy (`POST /v1/llms`): the name it is served under and its GGUF
/// file, uploaded first as a blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployLlm {
    pub name: String,
    pub weights: Hash,
    /// How its linear layers compute, which names its generation task: `exact` (the f32
    /// model's logits; the default) or `q8` (8-bit activations, llama.cpp's arithmetic,
    /// faster on CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arithmetic: Option<String>,
}

/// The answer to an LLM's deploy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmDeployed {
    pub name: String,
    pub weights: Hash,
    /// The most positions (prompt and generated tokens) one generation may take.
    pub context_length: u64,
    /// `exact` or `q8` (see [`DeployLlm`]).
    pub arithmetic: String,
    /// The generation task its completions run as (and their receipts name).
    pub task: Hash,
    /// Where to call it: the OpenAI-compatible `/v1/chat/completions`.
    pub endpoint: String,
    pub nodes_able: usize,
}

/// The answer to a generation across nodes (`POST /v1/llms/{name}/staged`): the tokens, their
/// text, the nodes replaced and slashed on the way, and the staged receipt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StagedAnswer {
    /// The generation's id, as its receipt names it.
    pub generation: String,
    pub tokens: Vec<u32>,
    pub text: String,
    pub replaced: Vec<Replaced>,
    pub slashed: Vec<Slash>,
    pub receipt: StagedReceipt,
}

/// A node a staged generation stopped relying on, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaced {
    /// The stage it served (0-based).
    pub stage: usize,
    pub node: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::auth::KeyPair;
    use crate::commit::{Commitment, JobSpec, OutputRef, Sig, output_hash};
    use crate::receipt::Attestation;

    /// `value` must write exactly `text` — the bytes the coordinator wrote before the type
    /// existed — equal `old` (the `json!` the coordinator built, field for field), and read
    /// back to itself.
    #[track_caller]
    fn pinned<T>(value: &T, old: Value, text: &str)
    where
        T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let written = String::from_utf8(to_vec(value).unwrap()).unwrap();
        assert_eq!(written, text, "the wire text drifted");
        assert_eq!(old.to_string(), text, "the old json! wrote something else");
        assert_eq!(to_value(value).unwrap(), old);
        let back: T = serde_json::from_str(&written).unwrap();
        assert_eq!(&back, value, "did not round-trip");
        // Clients read answers from a parsed `Value` too.
        assert_eq!(&T::deserialize(&old).unwrap(), value);
    }

    fn h(tag: &[u8]) -> Hash {
        Hash::of(tag)
    }

    fn receipt() -> Receipt {
        let job = JobSpec {
            job_id: "j1".into(),
            task: h(b"t"),
            weights: None,
            inputs: [("x".to_string(), h(b"x"))].into(),
            tier: Tier::Exact,
            seed: 0,
        };
        let outputs = vec![OutputRef {
            name: "y".into(),
            hash: h(b"y"),
            ty: "f32[1]".into(),
        }];
        let oh = output_hash(&outputs);
        let node = KeyPair::from_seed([1; 32]);
        let salt = Hash([2; 32]);
        let coordinator = KeyPair::from_seed([99; 32]);
        Receipt {
            version: 1,
            job: job.clone(),
            outputs,
            output_hash: oh,
            replicas: 1,
            tolerance: 0.0,
            nodes: vec![Attestation {
                commitment: Commitment::sign(job, &node, &oh, &salt),
                output_hash: oh,
                salt,
            }],
            coordinator: coordinator.public(),
            issued_at: 1_700_000_000,
            dispute: None,
            signature: Sig([0; 64]),
        }
        .sign(&coordinator)
    }

    fn receipt_text(r: &impl Serialize) -> String {
        String::from_utf8(to_vec(r).unwrap()).unwrap()
    }

    fn tensors() -> JsonTensors {
        [(
            "y".to_string(),
            json!({"dtype": "f32", "shape": [2], "data": [0.5, -1.0]}),
        )]
        .into()
    }

    fn spec(name: &str, dtype: &str, shape: &[u64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }

    fn task() -> Task {
        Task {
            id: h(b"task"),
            endpoint: format!("/v1/tasks/{}/run", h(b"task")),
            inputs: vec![spec("x", "f32", &[1, 16])],
            outputs: vec![spec("y", "f32", &[1, 32])],
            weights: None,
            flops: 1024,
            peak_bytes: 4096,
        }
    }

    /// The `json!` of the coordinator's `task_json`, before these types.
    fn old_task(t: &Task) -> Value {
        let io = |s: &TensorSpec| json!({"name": s.name, "dtype": s.dtype, "shape": s.shape});
        json!({
            "id": t.id,
            "endpoint": format!("/v1/tasks/{}/run", t.id),
            "inputs": t.inputs.iter().map(io).collect::<Vec<_>>(),
            "outputs": t.outputs.iter().map(io).collect::<Vec<_>>(),
            "weights": t.weights,
            "flops": t.flops,
            "peak_bytes": t.peak_bytes,
        })
    }

    /// The text of [`task`], with `extra` (fields of its own, in their sorted place) before
    /// `peak_bytes` and `weights` as given.
    fn task_text(between: &str, weights: &str) -> String {
        let id = h(b"task");
        format!(
            concat!(
                r#"{{"endpoint":"/v1/tasks/{id}/run","flops":1024,"id":"{id}","#,
                r#""inputs":[{{"dtype":"f32","name":"x","shape":[1,16]}}],{between}"#,
                r#""outputs":[{{"dtype":"f32","name":"y","shape":[1,32]}}],"peak_bytes":4096,"weights":{weights}}}"#
            ),
            id = id,
            between = between,
            weights = weights,
        )
    }

    #[test]
    fn tasks_read_as_the_coordinator_wrote_them() {
        let t = task();
        pinned(&t, old_task(&t), &task_text("", "null"));
        assert_eq!(
            t.inputs[0].ty(),
            Some(TensorType::new(DType::F32, vec![1, 16]))
        );
        assert_eq!(spec("x", "f99", &[1]).ty(), None);
        assert_eq!(
            TensorSpec::new("x", &TensorType::new(DType::F32, vec![1, 16])),
            t.inputs[0]
        );
        // With weights, as deployed: `nodes_able` beside the task's fields.
        let mut w = t.clone();
        w.weights = Some(h(b"weights"));
        let deployed = TaskDeployed {
            task: w.clone(),
            nodes_able: 3,
        };
        let mut old = old_task(&w);
        old["nodes_able"] = json!(3);
        let text = task_text(r#""nodes_able":3,"#, &format!(r#""{}""#, h(b"weights")));
        pinned(&deployed, old, &text);
    }

    #[test]
    fn calls_and_their_answers_read_as_the_coordinator_wrote_them() {
        // The body clients send: each field only when given, as the `json!` bodies were.
        let bare = RunRequest {
            inputs: tensors(),
            tier: None,
            seed: None,
        };
        let inputs = json!({"y": {"dtype": "f32", "shape": [2], "data": [0.5, -1.0]}});
        pinned(
            &bare,
            json!({"inputs": inputs}),
            r#"{"inputs":{"y":{"data":[0.5,-1.0],"dtype":"f32","shape":[2]}}}"#,
        );
        let full = RunRequest {
            tier: Some(Tier::Tolerant),
            seed: Some(7),
            ..bare.clone()
        };
        pinned(
            &full,
            json!({"inputs": inputs, "tier": "tolerant", "seed": 7}),
            r#"{"inputs":{"y":{"data":[0.5,-1.0],"dtype":"f32","shape":[2]}},"seed":7,"tier":"tolerant"}"#,
        );
        // What a client writes, the coordinator's decoder reads.
        let ty = TensorType::new(DType::F32, vec![2]);
        let run = crate::run_body::decode_run_json(&to_vec(&full).unwrap(), &[("y", &ty)]).unwrap();
        assert_eq!((run.tier, run.seed), (Some(Tier::Tolerant), Some(7)));
        assert_eq!(run.inputs["y"].to_f32_vec(), [0.5, -1.0]);

        let submitted = Submitted {
            job_id: "j1".into(),
            state: "pending".into(),
            status: "/v1/jobs/j1".into(),
        };
        pinned(
            &submitted,
            json!({"job_id": "j1", "state": "pending", "status": format!("/v1/jobs/{}", "j1")}),
            r#"{"job_id":"j1","state":"pending","status":"/v1/jobs/j1"}"#,
        );

        let r = receipt();
        let answer = RunAnswer {
            job_id: "j1".into(),
            state: "decided".into(),
            outputs: tensors(),
            receipt: r.clone(),
            slashed: vec![Slash {
                node: "ab".repeat(32),
                amount: 100,
            }],
            refereed: false,
        };
        let slashed = [("ab".repeat(32), 100i64)];
        let old = json!({
            "job_id": "j1",
            "state": "decided",
            "outputs": inputs,
            "receipt": r,
            "slashed": slashed.iter().map(|(n, a)| json!({"node": n, "amount": a})).collect::<Vec<_>>(),
            "refereed": false,
        });
        let text = format!(
            r#"{{"job_id":"j1","outputs":{{"y":{{"data":[0.5,-1.0],"dtype":"f32","shape":[2]}}}},"receipt":{},"refereed":false,"slashed":[{{"amount":100,"node":"{}"}}],"state":"decided"}}"#,
            receipt_text(&r),
            "ab".repeat(32)
        );
        pinned(&answer, old, &text);
        assert!(answer.receipt.verify().is_ok());
    }

    fn job(receipt: Option<Receipt>) -> Job {
        Job {
            job_id: "j1".into(),
            task: h(b"t").to_hex(),
            weights: None,
            tier: "exact".into(),
            seed: 7,
            replicas: 3,
            state: if receipt.is_some() {
                "decided"
            } else {
                "pending"
            }
            .into(),
            created_at: 1_700_000_000,
            updated_at: 1_700_000_001,
            output_hash: receipt.as_ref().map(|r| r.output_hash.to_hex()),
            error: None,
            receipt,
        }
    }

    /// The `json!` of the coordinator's `job_json`, before these types.
    fn old_job(j: &Job) -> Value {
        json!({
            "job_id": j.job_id, "task": j.task, "weights": j.weights, "tier": j.tier, "seed": j.seed,
            "replicas": j.replicas, "state": j.state, "created_at": j.created_at,
            "updated_at": j.updated_at, "output_hash": j.output_hash, "error": j.error,
            "receipt": j.receipt,
        })
    }

    #[test]
    fn jobs_read_as_the_coordinator_wrote_them() {
        let task = h(b"t");
        let pending = job(None);
        pinned(
            &pending,
            old_job(&pending),
            &format!(
                r#"{{"created_at":1700000000,"error":null,"job_id":"j1","output_hash":null,"receipt":null,"replicas":3,"seed":7,"state":"pending","task":"{task}","tier":"exact","updated_at":1700000001,"weights":null}}"#
            ),
        );

        // Not decided: the record and its replicas, no outputs, no slashes.
        let view = JobView {
            job: pending.clone(),
            assignments: vec![Assignment {
                node: "cd".repeat(32),
                state: "assigned".into(),
                output_hash: None,
            }],
            outputs: None,
            slashed: None,
        };
        let mut old = old_job(&pending);
        old["assignments"] =
            json!([{"node": "cd".repeat(32), "state": "assigned", "output_hash": null}]);
        let text = format!(
            r#"{{"assignments":[{{"node":"{}","output_hash":null,"state":"assigned"}}],"created_at":1700000000,"error":null,"job_id":"j1","output_hash":null,"receipt":null,"replicas":3,"seed":7,"state":"pending","task":"{task}","tier":"exact","updated_at":1700000001,"weights":null}}"#,
            "cd".repeat(32)
        );
        pinned(&view, old, &text);

        // Decided: outputs and slashes too.
        let r = receipt();
        let oh = r.output_hash.to_hex();
        let decided = JobView {
            job: job(Some(r.clone())),
            assignments: vec![
                Assignment {
                    node: "cd".repeat(32),
                    state: "agreed".into(),
                    output_hash: Some(oh.clone()),
                },
                Assignment {
                    node: "ef".repeat(32),
                    state: "disagreed".into(),
                    output_hash: Some(h(b"lie").to_hex()),
                },
            ],
            outputs: Some(tensors()),
            slashed: Some(vec![Slash {
                node: "ef".repeat(32),
                amount: 100,
            }]),
        };
        let mut old = old_job(&decided.job);
        old["assignments"] = json!([
            {"node": "cd".repeat(32), "state": "agreed", "output_hash": oh},
            {"node": "ef".repeat(32), "state": "disagreed", "output_hash": h(b"lie").to_hex()},
        ]);
        old["outputs"] = json!({"y": {"dtype": "f32", "shape": [2], "data": [0.5, -1.0]}});
        old["slashed"] = json!([{"node": "ef".repeat(32), "amount": 100}]);
        let text = format!(
            concat!(
                r#"{{"assignments":[{{"node":"{cd}","output_hash":"{oh}","state":"agreed"}},"#,
                r#"{{"node":"{ef}","output_hash":"{lie}","state":"disagreed"}}],"#,
                r#""created_at":1700000000,"error":null,"job_id":"j1","#,
                r#""output_hash":"{oh}","outputs":{{"y":{{"data":[0.5,-1.0],"dtype":"f32","shape":[2]}}}},"#,
                r#""receipt":{receipt},"replicas":3,"seed":7,"#,
                r#""slashed":[{{"amount":100,"node":"{ef}"}}],"state":"decided","task":"{task}","#,
                r#""tier":"exact","updated_at":1700000001,"weights":null}}"#
            ),
            cd = "cd".repeat(32),
            ef = "ef".repeat(32),
            oh = oh,
            lie = h(b"lie"),
            receipt = receipt_text(&r),
            task = task,
        );
        pinned(&decided, old, &text);
        assert!(decided.job.receipt.unwrap().verify().is_ok());
    }

    fn node() -> Node {
        Node {
            id: "ab".repeat(32),
            url: "http://127.0.0.1:7070".into(),
            stake: 1000,
            state: "active".into(),
            operator: "op-1".into(),
            memory_limit: 1 << 30,
            max_flops: 0,
            device: "cpu cpu".into(),
            exact: true,
            agreed: 3,
            disagreed: 1,
            score: 0.75,
            last_heartbeat: 1_700_000_000,
        }
    }

    #[test]
    fn nodes_and_stake_read_as_the_coordinator_wrote_them() {
        let n = node();
        // The `json!` of the coordinator's `node_json`, before these types.
        let old = json!({
            "id": n.id, "url": n.url, "stake": n.stake, "state": n.state,
            "operator": n.operator, "memory_limit": n.memory_limit, "max_flops": n.max_flops,
            "device": n.device, "exact": n.exact,
            "agreed": n.agreed, "disagreed": n.disagreed, "score": n.score,
            "last_heartbeat": n.last_heartbeat,
        });
        let text = format!(
            r#"{{"agreed":3,"device":"cpu cpu","disagreed":1,"exact":true,"id":"{}","last_heartbeat":1700000000,"max_flops":0,"memory_limit":1073741824,"operator":"op-1","score":0.75,"stake":1000,"state":"active","url":"http://127.0.0.1:7070"}}"#,
            "ab".repeat(32)
        );
        pinned(&n, old, &text);
        // A fresh node's score is a whole 1.0, still a float on the wire.
        let fresh = Node {
            score: 1.0,
            ..node()
        };
        let text = String::from_utf8(to_vec(&fresh).unwrap()).unwrap();
        assert!(text.contains(r#""score":1.0,"#), "{text}");
        assert_eq!(serde_json::from_str::<Node>(&text).unwrap(), fresh);

        // The bodies the CLI sends: absent values as `null`, as its `json!` wrote them.
        pinned(
            &Register {
                url: "http://n:1".into(),
                stake: None,
            },
            json!({"url": "http://n:1", "stake": None::<i64>}),
            r#"{"stake":null,"url":"http://n:1"}"#,
        );
        pinned(
            &Register {
                url: "http://n:1".into(),
                stake: Some(5),
            },
            json!({"url": "http://n:1", "stake": Some(5)}),
            r#"{"stake":5,"url":"http://n:1"}"#,
        );
        pinned(
            &Bond {
                amount: -5,
                operator: None,
            },
            json!({"amount": -5, "operator": None::<&str>}),
            r#"{"amount":-5,"operator":null}"#,
        );
        pinned(
            &Bond {
                amount: 1000,
                operator: Some("op-0".into()),
            },
            json!({"amount": 1000, "operator": Some("op-0")}),
            r#"{"amount":1000,"operator":"op-0"}"#,
        );
        // Bodies other clients send (`{"url"}` alone) read too.
        let r: Register = serde_json::from_str(r#"{"url": "http://n:1"}"#).unwrap();
        assert_eq!(r.stake, None);

        let history = StakeHistory {
            node: "ab".repeat(32),
            stake: 900,
            events: vec![
                StakeChange {
                    at: 1,
                    delta: 1000,
                    reason: "bond".into(),
                    job: None,
                    stake: 1000,
                },
                StakeChange {
                    at: 2,
                    delta: -100,
                    reason: "slash".into(),
                    job: Some("j1".into()),
                    stake: 900,
                },
            ],
        };
        let events: Vec<Value> = history
            .events
            .iter()
            .map(|e| json!({"at": e.at, "delta": e.delta, "reason": e.reason, "job": e.job, "stake": e.stake}))
            .collect();
        pinned(
            &history,
            json!({"node": "ab".repeat(32), "stake": 900, "events": events}),
            &format!(
                r#"{{"events":[{{"at":1,"delta":1000,"job":null,"reason":"bond","stake":1000}},{{"at":2,"delta":-100,"job":"j1","reason":"slash","stake":900}}],"node":"{}","stake":900}}"#,
                "ab".repeat(32)
            ),
        );
    }

    #[test]
    fn info_reads_as_the_coordinator_wrote_it() {
        let key = KeyPair::from_seed([99; 32]).public();
        for spot_check in [None, Some(0.25)] {
            let info = Info {
                coordinator: key,
                version: "0.1.0".into(),
                replicas: 3,
                tolerance: 1e-4,
                slash_fraction: 0.1,
                reward: 1,
                spot_check,
                open: false,
                public_dashboard: true,
            };
            let old = json!({
                "coordinator": key,
                "version": "0.1.0",
                "replicas": 3usize,
                "tolerance": 1e-4,
                "slash_fraction": 0.1,
                "reward": 1i64,
                "spot_check": spot_check,
                "open": false,
                "public_dashboard": true,
            });
            let spot = spot_check.map_or("null".to_string(), |s| s.to_string());
            let text = format!(
                r#"{{"coordinator":"{key}","open":false,"public_dashboard":true,"replicas":3,"reward":1,"slash_fraction":0.1,"spot_check":{spot},"tolerance":0.0001,"version":"0.1.0"}}"#
            );
            pinned(&info, old, &text);
        }
    }

    #[test]
    fn llms_and_staged_generations_read_as_the_coordinator_wrote_them() {
        let w = h(b"gguf");
        let deploy = DeployLlm {
            name: "smollm2".into(),
            weights: w,
            arithmetic: None,
        };
        pinned(
            &deploy,
            json!({"name": "smollm2", "weights": w}),
            &format!(r#"{{"name":"smollm2","weights":"{w}"}}"#),
        );
        let deploy = DeployLlm {
            arithmetic: Some("q8".into()),
            ..deploy
        };
        pinned(
            &deploy,
            json!({"name": "smollm2", "weights": w, "arithmetic": "q8"}),
            &format!(r#"{{"arithmetic":"q8","name":"smollm2","weights":"{w}"}}"#),
        );
        let task = h(b"task");
        let deployed = LlmDeployed {
            name: "smollm2".into(),
            weights: w,
            context_length: 8192,
            arithmetic: "q8".into(),
            task,
            endpoint: "/v1/chat/completions".into(),
            nodes_able: 4,
        };
        pinned(
            &deployed,
            json!({
                "name": "smollm2", "weights": w,
                "context_length": 8192u64,
                "arithmetic": "q8",
                "task": task,
                "endpoint": "/v1/chat/completions",
                "nodes_able": 4usize,
            }),
            &format!(
                r#"{{"arithmetic":"q8","context_length":8192,"endpoint":"/v1/chat/completions","name":"smollm2","nodes_able":4,"task":"{task}","weights":"{w}"}}"#
            ),
        );

        let key = KeyPair::from_seed([99; 32]);
        let node = KeyPair::from_seed([9; 32]).public();
        let receipt = StagedReceipt::sign(
            "g1".into(),
            w,
            vec![1, 2, 3],
            Some(crate::staged_receipt::StagedSampling {
                seed: 3,
                temperature: 0.5,
                top_p: 0.9,
            }),
            vec![4, 5],
            3,
            vec![crate::staged_receipt::StagedStage {
                first: 0,
                end: 30,
                nodes: vec![node],
            }],
            vec![],
            &key,
        );
        let answer = StagedAnswer {
            generation: "g1".into(),
            tokens: vec![4, 5],
            text: " Hello".into(),
            replaced: vec![Replaced {
                stage: 0,
                node: "ab".repeat(32),
                reason: "timed out".into(),
            }],
            slashed: vec![Slash {
                node: "ef".repeat(32),
                amount: 100,
            }],
            receipt: receipt.clone(),
        };
        let (replaced, slashed) = (
            [(0usize, "ab".repeat(32), "timed out".to_string())],
            [("ef".repeat(32), 100i64)],
        );
        // The `json!` the coordinator answered with before these types.
        let old = json!({
            "generation": receipt.generation,
            "tokens": [4, 5],
            "text": " Hello",
            "replaced": replaced.iter().map(|(k, n, why)| json!({
                "stage": k, "node": n, "reason": why,
            })).collect::<Vec<_>>(),
            "slashed": slashed.iter().map(|(n, a)| json!({
                "node": n, "amount": a,
            })).collect::<Vec<_>>(),
            "receipt": receipt,
        });
        let text = format!(
            concat!(
                r#"{{"generation":"g1","receipt":{receipt},"#,
                r#""replaced":[{{"node":"{ab}","reason":"timed out","stage":0}}],"#,
                r#""slashed":[{{"amount":100,"node":"{ef}"}}],"text":" Hello","tokens":[4,5]}}"#
            ),
            receipt = receipt_text(&receipt),
            ab = "ab".repeat(32),
            ef = "ef".repeat(32),
        );
        pinned(&answer, old, &text);
        assert!(answer.receipt.verify_from(&key.public()).is_ok());
    }

    fn port(name: &str, stage: Option<usize>) -> Port {
        Port {
            name: name.into(),
            dtype: "f32".into(),
            shape: vec![1, 4],
            stage,
        }
    }

    #[test]
    fn pipelines_read_as_the_coordinator_wrote_them() {
        let id = h(b"manifest");
        let p = Pipeline {
            id,
            endpoint: format!("/v1/pipelines/{id}/run"),
            inputs: vec![port("x", Some(0))],
            outputs: vec![port("y", Some(1))],
            stages: vec![
                PipelineStage {
                    task: h(b"s0").to_hex(),
                    weights: Some(h(b"w0").to_hex()),
                    peak_bytes: 64,
                    flops: 8,
                    boundary_out: vec![port("%3", None)],
                },
                PipelineStage {
                    task: h(b"s1").to_hex(),
                    weights: None,
                    peak_bytes: 32,
                    flops: 4,
                    boundary_out: vec![],
                },
            ],
        };
        // The `json!` of the coordinator's `pipeline_json`, before these types.
        let old = json!({
            "id": id,
            "endpoint": format!("/v1/pipelines/{id}/run"),
            "inputs": p.inputs,
            "outputs": p.outputs,
            "stages": p.stages.iter().map(|s| json!({
                "task": s.task,
                "weights": s.weights,
                "peak_bytes": s.peak_bytes,
                "flops": s.flops,
                "boundary_out": s.boundary_out,
            })).collect::<Vec<_>>(),
        });
        let stages = format!(
            concat!(
                r#"[{{"boundary_out":[{{"dtype":"f32","name":"%3","shape":[1,4]}}],"flops":8,"peak_bytes":64,"task":"{s0}","weights":"{w0}"}},"#,
                r#"{{"boundary_out":[],"flops":4,"peak_bytes":32,"task":"{s1}","weights":null}}]"#
            ),
            s0 = h(b"s0"),
            w0 = h(b"w0"),
            s1 = h(b"s1"),
        );
        let text = format!(
            r#"{{"endpoint":"/v1/pipelines/{id}/run","id":"{id}","inputs":[{{"dtype":"f32","name":"x","shape":[1,4],"stage":0}}],"outputs":[{{"dtype":"f32","name":"y","shape":[1,4],"stage":1}}],"stages":{stages}}}"#
        );
        pinned(&p, old.clone(), &text);
        let deployed = PipelineDeployed {
            pipeline: p.clone(),
            nodes_able: vec![2, 0],
        };
        let mut old_deployed = old;
        old_deployed["nodes_able"] = json!([2, 0]);
        pinned(
            &deployed,
            old_deployed,
            &text.replace(r#","outputs""#, r#","nodes_able":[2,0],"outputs""#),
        );
        assert_eq!(TensorSpec::from(&p.inputs[0]), spec("x", "f32", &[1, 4]));

        let r = receipt();
        let receipt = PipelineReceipt::sign(id, vec![r], &KeyPair::from_seed([99; 32]));
        let run = StageRun {
            job_id: "j1".into(),
            task: h(b"s0"),
            replicas: 3,
            agreeing: 2,
            slashed: vec![Slash {
                node: "ef".repeat(32),
                amount: 100,
            }],
            refereed: true,
            ms: 12.5,
            boundary_bytes: 16,
        };
        let answer = PipelineAnswer {
            pipeline: id,
            state: "decided".into(),
            outputs: tensors(),
            stages: vec![run.clone()],
            receipt: receipt.clone(),
        };
        let slashed = [("ef".repeat(32), 100i64)];
        let old = json!({
            "pipeline": id,
            "state": "decided",
            "outputs": tensors(),
            "stages": [json!({
                "job_id": run.job_id,
                "task": run.task,
                "replicas": run.replicas,
                "agreeing": run.agreeing,
                "slashed": slashed.iter().map(|(n, a)| json!({"node": n, "amount": a})).collect::<Vec<_>>(),
                "refereed": run.refereed,
                "ms": run.ms,
                "boundary_bytes": run.boundary_bytes,
            })],
            "receipt": receipt,
        });
        let text = format!(
            concat!(
                r#"{{"outputs":{{"y":{{"data":[0.5,-1.0],"dtype":"f32","shape":[2]}}}},"pipeline":"{id}","receipt":{receipt},"#,
                r#""stages":[{{"agreeing":2,"boundary_bytes":16,"job_id":"j1","ms":12.5,"refereed":true,"replicas":3,"#,
                r#""slashed":[{{"amount":100,"node":"{ef}"}}],"task":"{s0}"}}],"state":"decided"}}"#
            ),
            id = id,
            receipt = receipt_text(&receipt),
            ef = "ef".repeat(32),
            s0 = h(b"s0"),
        );
        pinned(&answer, old, &text);
    }
}
