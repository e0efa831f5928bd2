//! The coordinator's REST API for clients: deploy a task, call it, read jobs and receipts;
//! register nodes; bond stake. The only module of this crate that knows routes and statuses.
//! Clients authenticate with an API key (`authorization: Bearer KEY`) or by signing requests as
//! nodes require (a trusted Ed25519 key); the admin with an admin key, which alone may bond
//! stake; `--open` accepts anyone as admin, for local use.
//!
//! A body is read only after its sender is authenticated, and only up to what its route can
//! need: a call to a task may send at most what the task's declared inputs take (as JSON or
//! safetensors), every other body at most `max_request_bytes`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response};
use serde_json::{Value, json};
use tenet_ir::{Graph, Op};
use tenet_ledger::{AssignmentState, JobRecord, JobState, Ledger, NodeRecord, NodeState};
use tenet_net::errors::store_error;
use tenet_net::gate::Gate;
use tenet_net::serve::{Reply, body, collect_body_paced, error_reply, json_reply};
use tenet_proto::api;
use tenet_proto::auth::PublicKey;
use tenet_proto::commit::Tier;
use tenet_proto::{ApiError, ErrorCode, Hash};
use tokio::net::TcpListener;

use crate::dispatch::{Admitted, Coordinator, DispatchError, JobRequest};

/// The OpenAPI document served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Who may call, and how much they may send.
pub struct Access {
    /// Callers' bearer keys: deploy, call, read, register nodes without stake.
    pub api_keys: Vec<String>,
    /// The admin's bearer keys: everything a caller may do, and bond stake.
    pub admin_keys: Vec<String>,
    pub gate: Gate,
    pub open: bool,
    pub max_request_bytes: u64,
    /// Connections, request heads and bodies: the accept loop's limits, shared with nodes.
    pub conn: tenet_net::serve::ConnLimits,
    /// The dashboard's read-only views (nodes, jobs, the event stream) without a key
    /// (`--public-dashboard`): the operator's choice, off by default.
    pub public_reads: bool,
}

/// The reads the dashboard makes: public with [`Access::public_reads`].
fn dashboard_read(method: &str, path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    method == "GET"
        && matches!(
            parts.as_slice(),
            ["v1", "nodes"]
                | ["v1", "nodes", _]
                | ["v1", "nodes", _, "stake"]
                | ["v1", "jobs"]
                | ["v1", "jobs", _]
                | ["v1", "events"]
                | ["v1", "coordinators"]
        )
}

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    /// An admin key (or anyone, on an open coordinator).
    Admin,
    /// An API key or a trusted signing key.
    Client,
    /// A registered node signing for itself (its heartbeats and leaving).
    Node,
    /// Another coordinator on the same ledger, signing with its key (fetching a blob).
    Peer,
}

impl Caller {
    /// A node acts only for itself (the gate admits its own key only on its own routes); a
    /// caller may not speak for a node: deregistering the network's nodes, or keeping a dead
    /// one alive, is not a caller's to do.
    fn require_node_or_admin(self, what: &str) -> Result<(), ApiError> {
        if matches!(self, Caller::Node | Caller::Admin) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("{what} is for the node itself (signed with its key) or the admin"),
        ))
    }

    /// Only the admin may do `what`; `why` says what else the caller can do.
    fn require_admin_because(self, what: &str, why: &str) -> Result<(), ApiError> {
        if self == Caller::Admin {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("{what} takes the coordinator's admin key (--admin-key){why}"),
        ))
    }

    fn require_admin(self, what: &str) -> Result<(), ApiError> {
        self.require_admin_because(
            what,
            ": stake is bonded by the admin, never claimed by a registrant; register without stake and ask the admin to run `tenet stake bond`",
        )
    }
}

/// The largest graph a deploy may send (its decoder bounds it further by `Limits`).
const MAX_GRAPH_BODY_BYTES: u64 = 256 << 20;

/// The largest body of any other route (registrations, bonds).
const MAX_SMALL_BODY_BYTES: u64 = 64 << 10;

/// Room for a safetensors call body beyond its tensors' bytes: its JSON header.
const SAFETENSORS_SLACK_BYTES: u64 = 64 << 10;

/// The service: the core plus access rules.
pub struct Service<L: Ledger> {
    pub core: Arc<Coordinator<L>>,
    /// The LLMs deployed here, served over the OpenAI-compatible routes.
    pub llms: Arc<crate::openai::Llms>,
    pub access: Access,
}

/// The OpenAI-compatible routes, whose errors have OpenAI's shape.
fn openai_path(path: &str) -> bool {
    matches!(
        path,
        "/v1/models" | "/v1/chat/completions" | "/v1/completions"
    )
}

/// The largest body of a completion request (a long chat fits many times over).
const MAX_COMPLETION_BODY_BYTES: u64 = 1 << 20;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

/// The body of `POST /v1/llms/{name}/staged`: `prompt` (text, or `ids`), `max_tokens` (32),
/// `stages` (3), `replicas` (the coordinator's), and `seed` with `temperature` (> 0) and
/// `top_p` for sampling; unknown fields refused.
fn staged_request(
    body: &[u8],
    model: &tenet_models::smollm2::SmolLm2,
) -> Result<crate::staged::StagedRequest, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        prompt: Option<String>,
        ids: Option<Vec<u32>>,
        #[serde(default = "default_tokens")]
        max_tokens: u64,
        #[serde(default = "default_stages")]
        stages: u64,
        #[serde(default)]
        replicas: usize,
        seed: Option<u64>,
        temperature: Option<f32>,
        #[serde(default = "one")]
        top_p: f32,
    }
    fn default_tokens() -> u64 {
        32
    }
    fn default_stages() -> u64 {
        3
    }
    fn one() -> f32 {
        1.0
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "expected {{\"prompt\" or \"ids\", \"max_tokens\", \"stages\", \"replicas\", \"seed\", \"temperature\", \"top_p\"}}: {e}"
        ))
    })?;
    let prompt = match (b.prompt, b.ids) {
        (Some(text), None) => model.encode(&text).map_err(bad)?,
        (None, Some(ids)) => {
            if let Some(id) = ids.iter().find(|&&i| u64::from(i) >= model.config.vocab) {
                return Err(bad(format!(
                    "token id {id} is outside the vocabulary of {}",
                    model.config.vocab
                )));
            }
            ids
        }
        _ => {
            return Err(bad(
                "give the prompt as \"prompt\" (text) or \"ids\", not both",
            ));
        }
    };
    let most = tenet_models::generation::MAX_NEW_TOKENS;
    if b.max_tokens == 0 || b.max_tokens > most {
        return Err(bad(format!(
            "max_tokens must be 1 to {most}, not {}",
            b.max_tokens
        )));
    }
    if b.replicas > 16 {
        return Err(bad(format!(
            "replicas must be at most 16, not {}",
            b.replicas
        )));
    }
    if !(b.top_p > 0.0 && b.top_p <= 1.0) {
        return Err(bad(format!("top_p must be in (0, 1], not {}", b.top_p)));
    }
    let sampling = match (b.seed, b.temperature) {
        (_, None) => None,
        (Some(seed), Some(t)) if t.is_finite() && t > 0.0 => {
            Some(tenet_models::smollm2::Sampling {
                seed,
                temperature: t,
                top_p: b.top_p,
            })
        }
        (None, Some(_)) => return Err(bad("temperature needs a seed")),
        (_, Some(t)) => return Err(bad(format!("temperature must be above 0, not {t}"))),
    };
    Ok(crate::staged::StagedRequest {
        prompt,
        max_tokens: b.max_tokens as usize,
        stages: b.stages,
        replicas: b.replicas,
        sampling,
    })
}

/// A weights file (or safetensors body) refused: `exceeds_limits` (422) when loading it would
/// take more memory than this machine has available
/// ([`tenet_models::default_max_resident_bytes`]), else `otherwise`.
fn weights_error(e: tenet_models::WeightsError, otherwise: ErrorCode) -> ApiError {
    let code = match e {
        tenet_models::WeightsError::OverBudget { .. } => ErrorCode::ExceedsLimits,
        _ => otherwise,
    };
    ApiError::new(code, e.to_string())
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::NotFound, message)
}

/// A dispatch failure as the client sees it.
fn dispatch_error(e: DispatchError) -> ApiError {
    if let DispatchError::Ledger(l) = e {
        return ledger_error(l);
    }
    if let DispatchError::NotFound(m) = e {
        return not_found(m);
    }
    let code = match &e {
        DispatchError::BadRequest(_) => ErrorCode::BadInputs,
        DispatchError::NotFound(_) => unreachable!("answered above"),
        DispatchError::NotEnoughNodes { .. } | DispatchError::Nodes(_) | DispatchError::Busy(_) => {
            ErrorCode::Busy
        }
        DispatchError::Undecided(_) => ErrorCode::Conflict,
        DispatchError::ExceedsLimits(_) => ErrorCode::ExceedsLimits,
        DispatchError::Ledger(_)
        | DispatchError::Store(_)
        | DispatchError::Referee(_)
        | DispatchError::Internal(_) => ErrorCode::Internal,
    };
    ApiError::new(code, e.to_string())
}

fn ledger_error(e: tenet_ledger::LedgerError) -> ApiError {
    match e {
        tenet_ledger::LedgerError::NotFound(m) => not_found(m),
        tenet_ledger::LedgerError::Conflict(m) => ApiError::new(ErrorCode::Conflict, m),
        e => ApiError::new(ErrorCode::Internal, e.to_string()),
    }
}

/// An answer, written as the API has always written it: every object's keys sorted
/// ([`api::to_value`]).
fn api_reply<T: serde::Serialize>(answer: &T) -> Result<Reply, ApiError> {
    let v = api::to_value(answer).map_err(|e| internal(format!("encoding the answer: {e}")))?;
    json_reply(&v)
}

fn node_view(n: &NodeRecord) -> api::Node {
    api::Node {
        id: n.id.clone(),
        url: n.url.clone(),
        stake: n.stake,
        state: n.state.as_str().to_string(),
        operator: n.party().to_string(),
        memory_limit: n.memory_limit,
        max_flops: n.max_flops,
        device: n.device.clone(),
        exact: n.exact,
        agreed: n.agreed,
        disagreed: n.disagreed,
        score: n.score(),
        last_heartbeat: n.last_heartbeat,
    }
}

fn job_summary(j: &JobRecord) -> api::Job {
    api::Job {
        job_id: j.id.clone(),
        task: j.task.clone(),
        weights: j.weights.clone(),
        tier: j.tier.clone(),
        seed: j.seed,
        replicas: j.replicas,
        state: j.state.as_str().to_string(),
        created_at: j.created_at,
        updated_at: j.updated_at,
        output_hash: j.output_hash.clone(),
        error: j.error.clone(),
        receipt: j
            .receipt
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok()),
    }
}

/// The nodes slashed for a job, with the amount taken from each.
fn slashes(slashed: &[(String, i64)]) -> Vec<api::Slash> {
    slashed
        .iter()
        .map(|(node, amount)| api::Slash {
            node: node.clone(),
            amount: *amount,
        })
        .collect()
}

/// Outputs as JSON tensors by name.
fn json_outputs(outputs: &[(String, tenet_ir::HostTensor)]) -> Result<api::JsonTensors, ApiError> {
    serde_json::from_str(&tenet_models::outputs_json(outputs))
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
}

/// A deployed task as clients see it.
fn task_view(id: &Hash, g: &Graph) -> api::Task {
    api::Task {
        id: *id,
        endpoint: format!("/v1/tasks/{id}/run"),
        inputs: g
            .inputs()
            .map(|(_, n, t)| api::TensorSpec::new(n, t))
            .collect(),
        outputs: g
            .outputs()
            .iter()
            .map(|o| api::TensorSpec::new(&o.name, &g.node(o.node).ty))
            .collect(),
        weights: weights_of(g),
        flops: g.cost().flops,
        peak_bytes: g.cost().peak_bytes,
    }
}

/// The weights files a graph references.
fn weight_files(g: &Graph) -> std::collections::BTreeSet<Hash> {
    g.weights()
        .filter_map(|(_, op, _)| match op {
            Op::Weight { file, .. } => Some(Hash(file.0)),
            _ => None,
        })
        .collect()
}

/// The one weights file a deployed task references, if any.
fn weights_of(g: &Graph) -> Option<Hash> {
    weight_files(g).first().copied()
}

impl<L: Ledger + 'static> Service<L> {
    /// A deployed task, from this coordinator's store or, deployed by a peer, the ledger.
    async fn load_task(&self, id: &Hash) -> Result<Graph, ApiError> {
        self.core.ensure_task(id).await.map_err(dispatch_error)?;
        let bytes = self
            .core
            .store()
            .get(id)
            .map_err(|_| not_found(format!("no task {id}: deploy it with POST /v1/tasks")))?;
        tenet_ir::codec::decode(&bytes)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("stored task {id}: {e}")))
    }

    /// Who is calling, from the headers alone; with the body hash they signed, if they did.
    async fn authorize(&self, req: &Request<Incoming>) -> Result<(Caller, Option<Hash>), ApiError> {
        let bearer = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(key) = bearer {
            return if self.access.admin_keys.iter().any(|k| k == key) {
                Ok((Caller::Admin, None))
            } else if self.access.api_keys.iter().any(|k| k == key) {
                Ok((Caller::Client, None))
            } else if self.access.open {
                // Open mode takes anyone; clients that always send a key (OpenAI's) too.
                Ok((Caller::Admin, None))
            } else {
                Err(ApiError::new(ErrorCode::Unauthenticated, "unknown API key"))
            };
        }
        let signed = req.headers().contains_key(tenet_proto::auth::KEY_HEADER);
        if !signed && self.access.open {
            return Ok((Caller::Admin, None));
        }
        if !signed
            && self.access.public_reads
            && dashboard_read(req.method().as_str(), req.uri().path())
        {
            return Ok((Caller::Client, None));
        }
        let (itself, speaker) = if signed {
            match self.node_speaking_for_itself(req.uri().path()).await {
                Some(key) => (Some(key), Caller::Node),
                None => (self.peer_speaking(req).await, Caller::Peer),
            }
        } else {
            (None, Caller::Client)
        };
        let path_q = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
        let h = req.headers();
        let auth = self.access.gate.admit_also(
            |n| h.get(n).and_then(|v| v.to_str().ok()),
            req.method().as_str(),
            &path_q,
            tenet_proto::unix_now(),
            itself.as_ref(),
        )?;
        let caller = if self.access.open {
            Caller::Admin
        } else if itself == Some(auth.key) {
            speaker
        } else {
            Caller::Client
        };
        Ok((caller, Some(auth.body_hash)))
    }

    /// On `/v1/nodes/{id}` and `/v1/nodes/{id}/heartbeat`, a registered node may sign with
    /// its own key (to send heartbeats and to deregister) without being a trusted client.
    async fn node_speaking_for_itself(&self, path: &str) -> Option<PublicKey> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let id = match parts.as_slice() {
            ["v1", "nodes", id] | ["v1", "nodes", id, "heartbeat"] => *id,
            _ => return None,
        };
        let key = PublicKey::parse(id)?;
        let node = self.core.ledger.node(id).await.ok()??;
        (node.state != NodeState::Deregistered).then_some(key)
    }

    /// On `/v1/blobs/{hash}/data`, another coordinator on the same ledger may sign with its
    /// own key (the key it announced there) without being a trusted client.
    async fn peer_speaking(&self, req: &Request<Incoming>) -> Option<PublicKey> {
        let parts: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
        if !matches!(parts.as_slice(), ["v1", "blobs", _, "data"]) {
            return None;
        }
        let key = req
            .headers()
            .get(tenet_proto::auth::KEY_HEADER)?
            .to_str()
            .ok()?;
        let key = PublicKey::parse(key)?;
        let peers = self.core.ledger.coordinators().await.ok()?;
        peers.iter().any(|c| c.key == key.to_hex()).then_some(key)
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Reply {
        // The dashboard's page holds no data (it reads the API like any caller), so it is
        // served to anyone; what it shows still takes a key unless the reads are public.
        let public = matches!(
            (req.method().as_str(), req.uri().path()),
            ("GET", "/v1/info")
                | ("GET", "/openapi.json")
                | ("GET", "/")
                | ("GET", "/dashboard")
                | ("GET", "/dashboard/verify.js")
        );
        let openai = openai_path(req.uri().path());
        let result = if public {
            self.public(req.uri().path())
        } else {
            self.serve(req).await
        };
        result.unwrap_or_else(|e| {
            if openai {
                crate::openai::OpenAiError::from(e).reply()
            } else {
                error_reply(&e)
            }
        })
    }

    /// Authenticate, find out how large a body the route may take, read it (no more), check
    /// it against its signature, and route.
    async fn serve(&self, req: Request<Incoming>) -> Result<Reply, ApiError> {
        let (caller, signed_hash) = self.authorize(&req).await?;
        let method = req.method().clone();
        let path_q = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let idempotency_key = idempotency_key(req.headers())?;
        let (path, query) = path_q.split_once('?').unwrap_or((&path_q, ""));
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if let ("PUT", ["v1", "blobs", h]) = (method.as_str(), parts.as_slice()) {
            let hash = Hash::parse(h).map_err(|e| bad(e.to_string()))?;
            if signed_hash.is_some_and(|signed| signed != hash) {
                return Err(bad(format!(
                    "a blob upload's signed body hash must be its address {hash}"
                )));
            }
            return self.put_blob(req, hash).await;
        }
        // A call's task is loaded before its body is read: the body may be no larger than
        // the task's inputs need, and a call to a task that is not here reads nothing.
        let task = match (method.as_str(), parts.as_slice()) {
            ("POST", ["v1", "tasks", id, "run"]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                Some((id, self.load_task(&id).await?))
            }
            _ => None,
        };
        let pipeline = match (method.as_str(), parts.as_slice()) {
            ("POST", ["v1", "pipelines", id, "run"]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                Some((
                    id,
                    self.core
                        .shared_pipeline(&id)
                        .await
                        .map_err(dispatch_error)?,
                ))
            }
            _ => None,
        };
        let declared: Option<Vec<tenet_ir::TensorType>> = match (&task, &pipeline) {
            (Some((_, graph)), _) => Some(graph.inputs().map(|(_, _, t)| t.clone()).collect()),
            (_, Some((_, m))) => Some(m.inputs.iter().filter_map(|p| p.ty()).collect()),
            _ => None,
        };
        let limit = match &declared {
            Some(types) => {
                let need = if content_type.as_deref() == Some("application/octet-stream") {
                    types
                        .iter()
                        .map(|t| t.bytes().unwrap_or(u64::MAX))
                        .fold(SAFETENSORS_SLACK_BYTES, u64::saturating_add)
                } else {
                    tenet_proto::run_body::max_json_body(types.iter())
                };
                need.min(self.access.max_request_bytes)
            }
            None => match (method.as_str(), parts.as_slice()) {
                ("POST", ["v1", "tasks"]) => MAX_GRAPH_BODY_BYTES,
                ("POST", ["v1", "pipelines"]) => tenet_pipeline::manifest::MAX_MANIFEST_BYTES,
                ("POST", ["v1", "chat", "completions"] | ["v1", "completions"]) => {
                    MAX_COMPLETION_BODY_BYTES
                }
                _ => MAX_SMALL_BODY_BYTES,
            }
            .min(self.access.max_request_bytes),
        };
        let body = collect_body_paced(req, limit, self.access.conn.body).await?;
        if let Some(signed) = signed_hash
            && tenet_net::digest::hash(&body) != signed
        {
            return Err(ApiError::new(
                ErrorCode::BadSignature,
                "the body does not hash to the signed x-tenet-body-hash",
            ));
        }
        let request = Routed {
            caller,
            method: &method,
            path,
            query,
            body,
            content_type: content_type.as_deref(),
            idempotency_key: idempotency_key.as_deref(),
            task,
            pipeline,
        };
        self.route(request).await
    }

    fn public(&self, path: &str) -> Result<Reply, ApiError> {
        if path == "/" || path.starts_with("/dashboard") {
            return Ok(crate::dashboard::page(path));
        }
        if path == "/openapi.json" {
            let mut r = Response::new(body(Bytes::from_static(OPENAPI.as_bytes())));
            r.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            return Ok(r);
        }
        let c = self.core.config();
        api_reply(&api::Info {
            coordinator: self.core.key().public(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            replicas: c.replicas,
            tolerance: c.tolerance,
            slash_fraction: c.slash_fraction,
            reward: c.reward,
            spot_check: c.spot_check,
            open: self.access.open,
            public_dashboard: self.access.public_reads || self.access.open,
        })
    }

    async fn route(&self, r: Routed<'_>) -> Result<Reply, ApiError> {
        let Routed {
            caller,
            method,
            path,
            query,
            body,
            content_type,
            idempotency_key,
            task,
            pipeline,
        } = r;
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let ledger = &self.core.ledger;
        match (method.as_str(), parts.as_slice()) {
            ("POST", ["v1", "nodes"]) => {
                let api::Register { url, stake } = registration(&body)?;
                let stake = stake.unwrap_or(0);
                if stake > 0 {
                    caller.require_admin("registering a node with stake")?;
                }
                let n = self
                    .core
                    .register_node(&url, stake, None)
                    .await
                    .map_err(dispatch_error)?;
                api_reply(&node_view(&n))
            }
            ("PUT", ["v1", "nodes", id]) => {
                let key = PublicKey::parse(id)
                    .ok_or_else(|| bad(format!("`{id}` is not a node id (64 hex characters)")))?;
                let api::Register { url, stake } = registration(&body)?;
                let stake = stake.unwrap_or(0);
                if stake > 0 {
                    caller.require_admin("registering a node with stake")?;
                }
                let n = self
                    .core
                    .register_node(&url, stake, Some(&key))
                    .await
                    .map_err(dispatch_error)?;
                api_reply(&node_view(&n))
            }
            ("GET", ["v1", "nodes", id]) => {
                let n = ledger
                    .node(id)
                    .await
                    .map_err(ledger_error)?
                    .ok_or_else(|| not_found(format!("no node {id}")))?;
                api_reply(&node_view(&n))
            }
            ("POST", ["v1", "nodes", id, "stake"]) => {
                caller.require_admin("bonding stake")?;
                let api::Bond { amount, operator } = bond_request(&body)?;
                let n = self
                    .core
                    .bond(id, amount, operator.as_deref())
                    .await
                    .map_err(dispatch_error)?;
                api_reply(&node_view(&n))
            }
            ("POST", ["v1", "nodes", id, "heartbeat"]) => {
                caller.require_node_or_admin("a heartbeat")?;
                api_reply(&node_view(
                    &self.core.heartbeat(id).await.map_err(dispatch_error)?,
                ))
            }
            ("DELETE", ["v1", "nodes", id]) => {
                caller.require_node_or_admin("deregistering a node")?;
                api_reply(&node_view(
                    &self.core.deregister(id).await.map_err(dispatch_error)?,
                ))
            }
            ("GET", ["v1", "nodes", id, "stake"]) => {
                // Newest last; each with the stake it left, counted back from the stake now.
                let limit = query_param(query, "limit")
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(200)
                    .clamp(1, 5000);
                let node = ledger
                    .node(id)
                    .await
                    .map_err(ledger_error)?
                    .ok_or_else(|| not_found(format!("no node {id}")))?;
                let events = ledger.stake_events(id).await.map_err(ledger_error)?;
                let mut after = node.stake;
                let mut out = Vec::with_capacity(limit.min(events.len()));
                for e in events.iter().rev().take(limit) {
                    out.push(api::StakeChange {
                        at: e.at,
                        delta: e.delta,
                        reason: e.reason.clone(),
                        job: e.job_id.clone(),
                        stake: after,
                    });
                    after -= e.delta;
                }
                out.reverse();
                api_reply(&api::StakeHistory {
                    node: id.to_string(),
                    stake: node.stake,
                    events: out,
                })
            }
            ("GET", ["v1", "nodes"]) => {
                let nodes = ledger.nodes().await.map_err(ledger_error)?;
                api_reply(&nodes.iter().map(node_view).collect::<Vec<_>>())
            }
            ("GET" | "HEAD", ["v1", "blobs", h]) => {
                let hash = Hash::parse(h).map_err(|e| bad(e.to_string()))?;
                let size = self
                    .core
                    .store()
                    .contains(&hash)
                    .ok_or_else(|| not_found(format!("no blob {hash}")))?;
                json_reply(&json!({"hash": hash, "size": size}))
            }
            ("GET", ["v1", "blobs", h, "data"]) => {
                if !matches!(caller, Caller::Peer | Caller::Admin) {
                    return Err(ApiError::new(
                        ErrorCode::Forbidden,
                        "a blob's bytes are for the coordinators sharing this one's ledger (signed with a key announced there) and the admin",
                    ));
                }
                let hash = Hash::parse(h).map_err(|e| bad(e.to_string()))?;
                let bytes = self
                    .core
                    .store()
                    .get(&hash)
                    .map_err(|_| not_found(format!("no blob {hash}")))?;
                let mut r = Response::new(tenet_net::serve::body(Bytes::from(bytes)));
                r.headers_mut().insert(
                    "content-type",
                    HeaderValue::from_static("application/octet-stream"),
                );
                Ok(r)
            }
            ("GET", ["v1", "coordinators"]) => {
                let peers = ledger.coordinators().await.map_err(ledger_error)?;
                let live = (3 * self.core.config().lease).as_millis() as i64;
                api_reply(&api::Coordinators {
                    coordinators: peers
                        .iter()
                        .filter_map(|c| {
                            Some(api::CoordinatorPeer {
                                key: PublicKey::parse(&c.key)?,
                                url: c.url.clone(),
                                started_at: c.started_at,
                                live: c.silent_ms <= live,
                            })
                        })
                        .collect(),
                })
            }
            ("POST", ["v1", "tasks"]) => {
                let graph = tenet_ir::decode_any(&body)
                    .map_err(|e| ApiError::new(ErrorCode::InvalidGraph, e.to_string()))?;
                self.core
                    .check_deployable(graph.cost())
                    .map_err(dispatch_error)?;
                let files = weight_files(&graph);
                if files.len() > 1 {
                    return Err(ApiError::new(
                        ErrorCode::InvalidGraph,
                        "a task may reference one weights file",
                    ));
                }
                if let Some(w) = files.first() {
                    let bytes = self.core.store().get(w).map_err(|_| {
                        ApiError::new(
                            ErrorCode::Conflict,
                            format!("the task's weights {w} are not here: upload them first with PUT /v1/blobs/{w}"),
                        )
                    })?;
                    let _turn = self.core.heavy_turn().await.map_err(dispatch_error)?;
                    let file = tenet_models::WeightsFile::from_bytes_within(
                        bytes,
                        &w.short(),
                        self.core.task_memory(),
                    )
                    .map_err(|e| weights_error(e, ErrorCode::BadInputs))?;
                    tenet_models::check_bindings(&graph, std::slice::from_ref(&file))
                        .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
                }
                let bytes = graph.to_bytes();
                let id = self
                    .core
                    .store()
                    .put_bytes(&bytes)
                    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
                // Every coordinator on the ledger can run it from now on.
                ledger
                    .put_task(&id.to_hex(), &bytes, crate::dispatch::now())
                    .await
                    .map_err(ledger_error)?;
                api_reply(&api::TaskDeployed {
                    task: task_view(&id, &graph),
                    nodes_able: self
                        .core
                        .nodes_able(graph.cost())
                        .await
                        .map_err(dispatch_error)?,
                })
            }
            ("GET", ["v1", "tasks", id]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                api_reply(&task_view(&id, &self.load_task(&id).await?))
            }
            ("POST", ["v1", "tasks", _, "run"]) => {
                let (id, graph) = task.ok_or_else(|| internal("the call's task was not loaded"))?;
                let req = self.job_request(&id, &graph, &body, content_type, query)?;
                if query_param(query, "async") == Some("true") {
                    let admitted = self
                        .core
                        .submit_keyed(req, idempotency_key)
                        .await
                        .map_err(dispatch_error)?;
                    let (job_id, state) = match admitted {
                        Admitted::New(id) => (id, "pending".to_string()),
                        Admitted::Existing(id) => {
                            let view = self.job_view(&id).await?;
                            (id, view.job.state)
                        }
                    };
                    let mut r = api_reply(&api::Submitted {
                        status: format!("/v1/jobs/{job_id}"),
                        job_id,
                        state,
                    })?;
                    *r.status_mut() = hyper::StatusCode::ACCEPTED;
                    return Ok(r);
                }
                let job_id = match self
                    .core
                    .admit_keyed(req, idempotency_key)
                    .await
                    .map_err(dispatch_error)?
                {
                    Admitted::New(id) => id,
                    // The call was made before (a retry, perhaps to another coordinator): its
                    // job's answer, once it ends.
                    Admitted::Existing(id) => return self.answer_of(&id).await,
                };
                let out = match self
                    .core
                    .start(job_id.clone())
                    .await
                    .map_err(|e| internal(format!("the job's task failed: {e}")))?
                {
                    Ok(out) => out,
                    // Its lease passed to another coordinator (this one stalled): the answer
                    // is whatever that one decides.
                    Err(e) if crate::scale::lease_lost(&e) => return self.answer_of(&job_id).await,
                    Err(e) => return Err(dispatch_error(e)),
                };
                api_reply(&api::RunAnswer {
                    outputs: json_outputs(&out.outputs)?,
                    slashed: slashes(&out.slashed),
                    job_id: out.job_id,
                    state: "decided".to_string(),
                    receipt: out.receipt,
                    refereed: out.refereed,
                })
            }
            ("POST", ["v1", "pipelines"]) => {
                let (id, m) = self
                    .core
                    .deploy_pipeline_shared(&body)
                    .await
                    .map_err(dispatch_error)?;
                let pipeline = pipeline_view(&id, &m);
                let mut able = Vec::new();
                for s in &m.stages {
                    let cost = tenet_ir::Cost {
                        peak_bytes: s.peak_bytes,
                        flops: s.flops,
                        ..Default::default()
                    };
                    able.push(self.core.nodes_able(&cost).await.map_err(dispatch_error)?);
                }
                api_reply(&api::PipelineDeployed {
                    pipeline,
                    nodes_able: able,
                })
            }
            ("GET", ["v1", "pipelines", id]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                let m = self
                    .core
                    .shared_pipeline(&id)
                    .await
                    .map_err(dispatch_error)?;
                api_reply(&pipeline_view(&id, &m))
            }
            ("POST", ["v1", "pipelines", _, "run"]) => {
                let (id, m) =
                    pipeline.ok_or_else(|| internal("the call's pipeline was not loaded"))?;
                let declared: Vec<(String, tenet_ir::TensorType)> = m
                    .inputs
                    .iter()
                    .filter_map(|p| Some((p.name.clone(), p.ty()?)))
                    .collect();
                let (inputs, tier, seed) = run_inputs(&declared, &body, content_type, query)?;
                let out = self
                    .core
                    .run_pipeline(id, &m, inputs, tier, seed)
                    .await
                    .map_err(dispatch_error)?;
                let stages = out
                    .stages
                    .iter()
                    .map(|s| api::StageRun {
                        job_id: s.job_id.clone(),
                        task: s.task,
                        replicas: s.replicas,
                        agreeing: s.agreeing,
                        slashed: slashes(&s.slashed),
                        refereed: s.refereed,
                        ms: s.ms,
                        boundary_bytes: s.boundary_bytes,
                    })
                    .collect();
                api_reply(&api::PipelineAnswer {
                    pipeline: id,
                    state: "decided".to_string(),
                    outputs: json_outputs(&out.outputs)?,
                    stages,
                    receipt: out.receipt,
                })
            }
            ("GET", ["v1", "models"]) => crate::openai::models(&self.llms),
            ("POST", ["v1", "chat", "completions"]) => {
                Ok(
                    crate::openai::complete(self.core.clone(), &self.llms, &body, true)
                        .await
                        .unwrap_or_else(|e| e.reply()),
                )
            }
            ("POST", ["v1", "completions"]) => {
                Ok(
                    crate::openai::complete(self.core.clone(), &self.llms, &body, false)
                        .await
                        .unwrap_or_else(|e| e.reply()),
                )
            }
            ("POST", ["v1", "llms", name, "staged"]) => {
                let llm = self.llms.get(name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("no LLM {name} is deployed here (GET /v1/models lists them)"),
                    )
                })?;
                let req = staged_request(&body, &llm.model)?;
                let out = self
                    .core
                    .generate_staged(&llm, req)
                    .await
                    .map_err(dispatch_error)?;
                api_reply(&api::StagedAnswer {
                    generation: out.receipt.generation.clone(),
                    text: llm.model.decode(&out.tokens).map_err(internal)?,
                    tokens: out.tokens,
                    replaced: out
                        .replaced
                        .into_iter()
                        .map(|(stage, node, reason)| api::Replaced {
                            stage,
                            node,
                            reason,
                        })
                        .collect(),
                    slashed: slashes(&out.slashed),
                    receipt: out.receipt,
                })
            }
            ("POST", ["v1", "llms"]) => {
                caller.require_admin_because(
                    "deploying an LLM",
                    ": ask the admin to run `tenet deploy --model NAME --admin-key KEY`",
                )?;
                let d: api::DeployLlm = serde_json::from_slice(&body).map_err(|e| {
                    bad(format!(
                        "expected {{\"name\", \"weights\", optional \"arithmetic\"}}: {e}"
                    ))
                })?;
                let arithmetic = match &d.arithmetic {
                    None => tenet_models::generation::Arithmetic::default(),
                    Some(a) => a.parse().map_err(bad)?,
                };
                let _turn = self.core.heavy_turn().await.map_err(dispatch_error)?;
                let llm = self
                    .llms
                    .register(&d.name, d.weights, arithmetic, self.core.store())?;
                api_reply(&api::LlmDeployed {
                    name: llm.name.clone(),
                    weights: llm.weights,
                    context_length: llm.model.config.context,
                    arithmetic: llm.arithmetic.name().to_string(),
                    task: Hash(llm.arithmetic.task_id()),
                    endpoint: "/v1/chat/completions".to_string(),
                    nodes_able: self
                        .core
                        .nodes_able(&tenet_ir::Cost::default())
                        .await
                        .map_err(dispatch_error)?,
                })
            }
            ("GET", ["v1", "jobs", id]) => {
                if let Some(wait) = query_param(query, "wait") {
                    let secs = wait
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| {
                            bad(format!(
                                "wait={wait}: say how many seconds to wait, from 0 to {MAX_WAIT_SECS}"
                            ))
                        })?;
                    let limit = std::time::Duration::from_secs_f64(secs.min(MAX_WAIT_SECS));
                    self.core
                        .wait_ended(id, limit)
                        .await
                        .map_err(dispatch_error)?;
                }
                api_reply(&self.job_view(id).await?)
            }
            ("POST", ["v1", "trainings"]) => {
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|e| bad(format!("the body is not JSON: {e}")))?;
                let req =
                    crate::training::TrainingRequest::from_json(&v).map_err(dispatch_error)?;
                let id = self.core.start_training(req).map_err(dispatch_error)?;
                let mut r = json_reply(&json!({
                    "training_id": id,
                    "state": "running",
                    "status": format!("/v1/trainings/{id}"),
                }))?;
                *r.status_mut() = hyper::StatusCode::ACCEPTED;
                Ok(r)
            }
            ("GET", ["v1", "trainings", id]) => {
                let secs = match query_param(query, "wait") {
                    Some(wait) => wait
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| {
                            bad(format!(
                                "wait={wait}: say how many seconds to wait, from 0 to {MAX_WAIT_SECS}"
                            ))
                        })?,
                    None => 0.0,
                };
                let limit = std::time::Duration::from_secs_f64(secs.min(MAX_WAIT_SECS));
                let view = self
                    .core
                    .training_view(id, limit)
                    .await
                    .ok_or_else(|| not_found(format!("no training {id}")))?;
                json_reply(&view)
            }
            ("GET", ["v1", "events"]) => crate::dashboard::event_stream(&self.core.events),
            ("GET", ["v1", "jobs"]) => {
                let limit = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("limit="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(100i64)
                    .clamp(1, 10_000);
                let jobs = ledger.jobs(limit).await.map_err(ledger_error)?;
                api_reply(&jobs.iter().map(job_summary).collect::<Vec<_>>())
            }
            _ => Err(not_found(format!(
                "no route {method} {path}; see /openapi.json"
            ))),
        }
    }

    /// Stream a blob (a weights file) into the store as it arrives, hashed on the way: it is
    /// never whole in memory, and becomes visible only if it hashes to its address.
    async fn put_blob(&self, req: Request<Incoming>, hash: Hash) -> Result<Reply, ApiError> {
        let store = self.core.store().clone();
        if let Some(size) = store.contains(&hash) {
            // Already here: the body need not be read at all.
            return json_reply(&json!({"hash": hash, "size": size, "existed": true}));
        }
        let declared = tenet_net::serve::declared_length(&req)?;
        let mut writer = store.writer(hash, declared).map_err(store_error)?;
        let mut body = req.into_body();
        // At the pace every body must keep: one that stalls or trickles is dropped, and its
        // temporary file and room in the store with it.
        let mut paced = tenet_net::serve::Paced::new(self.access.conn.body);
        while let Some(data) = paced.next(&mut body).await? {
            writer.write(&data).map_err(store_error)?;
        }
        let size = writer.written();
        let existed = tokio::task::spawn_blocking(move || writer.finish())
            .await
            .map_err(|e| internal(e.to_string()))?
            .map_err(store_error)?;
        json_reply(&json!({"hash": hash, "size": size, "existed": existed}))
    }

    /// The answer a call gets for the job `id` an earlier submission with the same key made:
    /// its result once it is decided (waiting for it as a `?wait=` does), its failure, or —
    /// still running past the wait — where to find it, as an async call is answered.
    async fn answer_of(&self, id: &str) -> Result<Reply, ApiError> {
        let limit = std::time::Duration::from_secs_f64(MAX_WAIT_SECS);
        // Here, the job's own task says when it ends; driven elsewhere, the ledger does.
        self.core
            .wait_ended(id, limit)
            .await
            .map_err(dispatch_error)?;
        let view = self.job_view(id).await?;
        match view.job.state.as_str() {
            "decided" => api_reply(&api::RunAnswer {
                receipt: view
                    .job
                    .receipt
                    .ok_or_else(|| internal(format!("decided job {id} has no readable receipt")))?,
                outputs: view.outputs.unwrap_or_default(),
                slashed: view.slashed.unwrap_or_default(),
                job_id: view.job.job_id,
                state: "decided".to_string(),
                // A referee's run is not recorded apart from the receipt.
                refereed: false,
            }),
            "failed" => Err(dispatch_error(DispatchError::Nodes(
                view.job.error.unwrap_or_else(|| "the job failed".into()),
            ))),
            _ => {
                let mut r = api_reply(&api::Submitted {
                    status: format!("/v1/jobs/{id}"),
                    job_id: view.job.job_id,
                    state: view.job.state,
                })?;
                *r.status_mut() = hyper::StatusCode::ACCEPTED;
                Ok(r)
            }
        }
    }

    /// A job as clients see it: its record and replicas, and once decided its outputs, its
    /// receipt and who was slashed for it.
    async fn job_view(&self, id: &str) -> Result<api::JobView, ApiError> {
        let ledger = &self.core.ledger;
        let j = ledger
            .job(id)
            .await
            .map_err(ledger_error)?
            .ok_or_else(|| not_found(format!("no job {id}")))?;
        let asg = ledger.assignments(id).await.map_err(ledger_error)?;
        let mut v = api::JobView {
            job: job_summary(&j),
            assignments: asg
                .iter()
                .map(|a| api::Assignment {
                    node: a.node_id.clone(),
                    state: a.state.as_str().to_string(),
                    output_hash: a.output_hash.clone(),
                })
                .collect(),
            outputs: None,
            slashed: None,
        };
        if j.state != JobState::Decided {
            return Ok(v);
        }
        let receipt: tenet_proto::receipt::Receipt = j
            .receipt
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
            .ok_or_else(|| internal(format!("decided job {id} has no readable receipt")))?;
        let mut outputs = Vec::new();
        for o in &receipt.outputs {
            if self.core.store().contains(&o.hash).is_none() {
                // Decided by another coordinator: from it, or from the nodes that agreed.
                let mut agreeing = Vec::new();
                for a in &receipt.nodes {
                    if let Some(n) = ledger
                        .node(&a.commitment.node.to_hex())
                        .await
                        .map_err(ledger_error)?
                    {
                        agreeing.push(n);
                    }
                }
                self.core
                    .ensure_blob(&o.hash, &agreeing)
                    .await
                    .map_err(dispatch_error)?;
            }
            let bytes = self
                .core
                .store()
                .get(&o.hash)
                .map_err(|e| internal(format!("output {} of job {id}: {e}", o.name)))?;
            let t = tenet_proto::tensor::decode(&bytes)
                .map_err(|e| internal(format!("output {} of job {id}: {e}", o.name)))?;
            outputs.push((o.name.clone(), t));
        }
        v.outputs = Some(json_outputs(&outputs)?);
        let mut slashed = Vec::new();
        let events = ledger.job_stake_events(id).await.map_err(ledger_error)?;
        for a in asg.iter().filter(|a| a.state == AssignmentState::Disagreed) {
            let taken: i64 = events
                .iter()
                .filter(|e| e.node_id == a.node_id && e.delta < 0)
                .map(|e| -e.delta)
                .sum();
            slashed.push(api::Slash {
                node: a.node_id.clone(),
                amount: taken,
            });
        }
        v.slashed = Some(slashed);
        Ok(v)
    }

    /// Inputs from a JSON body (`{"inputs": {name: tensor}, "tier", "seed"}`) or a safetensors
    /// body (tier and seed in the query).
    fn job_request(
        &self,
        task: &Hash,
        graph: &Graph,
        body: &[u8],
        content_type: Option<&str>,
        query: &str,
    ) -> Result<JobRequest, ApiError> {
        let declared: Vec<(String, tenet_ir::TensorType)> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), t.clone()))
            .collect();
        let (inputs, tier, seed) = run_inputs(&declared, body, content_type, query)?;
        Ok(JobRequest {
            task: *task,
            weights: weights_of(graph),
            inputs,
            tier,
            seed,
        })
    }
}

type RunInputs = (BTreeMap<String, tenet_ir::HostTensor>, Tier, u64);

/// A call's inputs (each declared one, with its declared type), tier and seed: from a JSON
/// body, or from a safetensors body with the tier and seed in the query.
fn run_inputs(
    declared: &[(String, tenet_ir::TensorType)],
    body: &[u8],
    content_type: Option<&str>,
    query: &str,
) -> Result<RunInputs, ApiError> {
    let param = |k: &str| query_param(query, k);
    let parse_tier =
        |t: &str| Tier::parse(t).ok_or_else(|| bad(format!("tier `{t}` is not exact or tolerant")));
    let (inputs, tier, seed) = if content_type == Some("application/octet-stream") {
        let file = tenet_models::WeightsFile::from_bytes(body.to_vec(), "request body")
            .map_err(|e| weights_error(e, ErrorCode::BadRequest))?;
        let mut inputs = BTreeMap::new();
        for (name, ty) in declared {
            let t = file.tensor(name).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::BadInputs,
                    format!("the safetensors body has no tensor {name}"),
                )
            })?;
            if t.ty() != ty {
                return Err(ApiError::new(
                    ErrorCode::BadInputs,
                    format!("input {name} is {}, the task needs {ty}", t.ty()),
                ));
            }
            inputs.insert(name.to_string(), t.clone());
        }
        let seed = param("seed")
            .map(|s| {
                s.parse::<u64>().map_err(|_| {
                    bad(format!(
                        "seed={s}: a seed is a whole number from 0 to 18446744073709551615"
                    ))
                })
            })
            .transpose()?;
        let tier = param("tier").map(parse_tier).transpose()?;
        (inputs, tier, seed)
    } else {
        let declared: Vec<(&str, &tenet_ir::TensorType)> =
            declared.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let run = tenet_proto::run_body::decode_run_json(body, &declared).map_err(|e| {
            let code = match e {
                tenet_proto::run_body::RunBodyError::TooLarge { .. } => ErrorCode::TooLarge,
                tenet_proto::run_body::RunBodyError::Invalid(_) => ErrorCode::BadInputs,
            };
            ApiError::new(code, e.to_string())
        })?;
        (run.inputs, run.tier, run.seed)
    };
    Ok((inputs, tier.unwrap_or_default(), seed.unwrap_or(0)))
}

/// A deployed pipeline as its API describes it.
fn pipeline_view(id: &Hash, m: &tenet_pipeline::Manifest) -> api::Pipeline {
    api::Pipeline {
        id: *id,
        endpoint: format!("/v1/pipelines/{id}/run"),
        inputs: m.inputs.clone(),
        outputs: m.outputs.clone(),
        stages: m
            .stages
            .iter()
            .map(|s| api::PipelineStage {
                task: s.graph.clone(),
                weights: s.weights.first().map(|w| w.id.clone()),
                peak_bytes: s.peak_bytes,
                flops: s.flops,
                boundary_out: s.boundary_out.clone(),
            })
            .collect(),
    }
}

/// The longest a `GET /v1/jobs/{id}?wait=` holds the request.
const MAX_WAIT_SECS: f64 = 60.0;

fn internal(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Internal, message)
}

/// `key`'s value in a query string.
/// The longest idempotency key taken.
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

/// A call's `Idempotency-Key` header: printable ASCII, at most [`MAX_IDEMPOTENCY_KEY`].
fn idempotency_key(headers: &hyper::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let text = v.to_str().ok().filter(|t| {
        !t.is_empty() && t.len() <= MAX_IDEMPOTENCY_KEY && t.bytes().all(|b| b.is_ascii_graphic())
    });
    match text {
        Some(t) => Ok(Some(t.to_string())),
        None => Err(bad(format!(
            "the Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        ))),
    }
}

fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// `{"url", "stake"?}` of a node registration (stake 0 when absent: only the admin bonds).
/// Read field by field rather than by serde, so each mistake is named as it always was.
fn registration(body: &[u8]) -> Result<api::Register, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("expected {{\"url\", \"stake\"}}: {e}")))?;
    let url = v["url"]
        .as_str()
        .ok_or_else(|| bad("\"url\" is required"))?;
    let stake = match &v["stake"] {
        Value::Null => None,
        s => Some(
            s.as_i64()
                .filter(|s| *s >= 0)
                .ok_or_else(|| bad("\"stake\" must be a whole number, 0 or more"))?,
        ),
    };
    Ok(api::Register {
        url: url.to_string(),
        stake,
    })
}

/// `{"amount", "operator"?}` of a bond: stake to add (negative: to take back) and who answers
/// for the node. Read field by field, as [`registration`] is.
fn bond_request(body: &[u8]) -> Result<api::Bond, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("expected {{\"amount\", \"operator\"}}: {e}")))?;
    let amount = v["amount"]
        .as_i64()
        .ok_or_else(|| bad("\"amount\" must be a whole number (negative to unbond)"))?;
    let operator = match &v["operator"] {
        Value::Null => None,
        Value::String(o) => Some(o.clone()),
        _ => return Err(bad("\"operator\" must be a string")),
    };
    Ok(api::Bond { amount, operator })
}

/// A request once authenticated and read.
struct Routed<'a> {
    caller: Caller,
    method: &'a Method,
    path: &'a str,
    query: &'a str,
    body: Bytes,
    content_type: Option<&'a str>,
    /// The caller's `Idempotency-Key`, if it sent one.
    idempotency_key: Option<&'a str>,
    /// The task a call names, loaded before its body was read.
    task: Option<(Hash, Graph)>,
    /// The pipeline a call names, loaded before its body was read.
    pipeline: Option<(Hash, std::sync::Arc<tenet_pipeline::Manifest>)>,
}

/// Serve until `shutdown` resolves; in-flight calls get ten seconds to finish.
pub async fn serve<L: Ledger + 'static>(
    service: Arc<Service<L>>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let limits = service.access.conn;
    tenet_net::serve::serve_connections_with(listener, limits, shutdown, move |req| {
        service.clone().handle(req)
    })
    .await;
}

#[cfg(test)]
mod staged_body_tests {
    use super::staged_request;

    /// A staged generation's body from a stranger: every field bounded, unknown ones refused,
    /// the prompt given one way only. (Needs SmolLM2 in the model cache for its vocabulary.)
    #[test]
    fn staged_bodies_are_checked_before_anything_runs() {
        use tenet_models::fetch::{SMOLLM2, cached, find_file};
        use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode};
        let Ok(dir) = cached(&SMOLLM2) else {
            eprintln!("SKIPPED: SmolLM2 is not in the model cache");
            return;
        };
        let model =
            SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized)
                .unwrap();
        let ok =
            staged_request(br#"{"prompt": "Hi", "max_tokens": 5, "stages": 2}"#, &model).unwrap();
        assert_eq!((ok.max_tokens, ok.stages, ok.replicas), (5, 2, 0));
        assert!(ok.sampling.is_none() && !ok.prompt.is_empty());
        let sampled = staged_request(
            br#"{"ids": [1, 2], "seed": 3, "temperature": 0.5, "top_p": 0.9}"#,
            &model,
        )
        .unwrap();
        assert_eq!(sampled.prompt, [1, 2]);
        assert!(sampled.sampling.is_some());
        for bad in [
            &br#"{"prompt": "Hi", "ids": [1]}"#[..],
            br#"{}"#,
            br#"{"prompt": "Hi", "max_tokens": 0}"#,
            br#"{"prompt": "Hi", "max_tokens": 100000}"#,
            br#"{"prompt": "Hi", "replicas": 17}"#,
            br#"{"prompt": "Hi", "top_p": 0}"#,
            br#"{"prompt": "Hi", "top_p": 1.5}"#,
            br#"{"prompt": "Hi", "temperature": 0.5}"#,
            br#"{"prompt": "Hi", "seed": 1, "temperature": -1}"#,
            br#"{"ids": [4294967295]}"#,
            br#"{"prompt": "Hi", "layers": 3}"#,
            br#"{"prompt": 5}"#,
            b"not json",
        ] {
            let e = staged_request(bad, &model).err();
            assert!(e.is_some(), "{}", String::from_utf8_lossy(bad));
        }
        // Mutated at random, a body is refused or accepted within its bounds, never a panic.
        let seed = br#"{"prompt": "Hi there", "ids": null, "max_tokens": 7, "stages": 3, "replicas": 2, "seed": 9, "temperature": 0.5, "top_p": 0.9}"#;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..5000 {
            let mut v = seed.to_vec();
            for _ in 0..1 + next() % 4 {
                let i = (next() % v.len() as u64) as usize;
                match next() % 3 {
                    0 => {
                        let alphabet = b"{}[]\",:0123456789e-.nul";
                        v[i] = alphabet[(next() % alphabet.len() as u64) as usize];
                    }
                    1 => v.truncate(i),
                    _ => v.insert(i, b"9"[0]),
                }
                if v.is_empty() {
                    break;
                }
            }
            if let Ok(r) = staged_request(&v, &model) {
                assert!(r.max_tokens >= 1 && r.max_tokens <= 4096 && r.replicas <= 16);
                assert!(r.prompt.iter().all(|&t| u64::from(t) < model.config.vocab));
            }
        }
    }
}
