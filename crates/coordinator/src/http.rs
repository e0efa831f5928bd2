//! The coordinator's REST API for clients: deploy a task, call it, read jobs and receipts;
//! register nodes. The only module of this crate that knows routes and statuses. Clients
//! authenticate with an API key (`authorization: Bearer KEY`) or by signing requests as nodes
//! require (a trusted Ed25519 key); `--open` accepts anyone, for local use.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response};
use serde_json::{Value, json};
use tenet_ir::{Graph, HostTensor, Op};
use tenet_ledger::{AssignmentState, JobRecord, JobState, Ledger, NodeRecord, NodeState};
use tenet_node::gate::Gate;
use tenet_node::http::{Reply, body, collect_body, error_reply, json_reply};
use tenet_proto::auth::PublicKey;
use tenet_proto::commit::Tier;
use tenet_proto::{ApiError, ErrorCode, Hash};
use tokio::net::TcpListener;

use crate::dispatch::{Coordinator, DispatchError, JobRequest};

/// The OpenAPI document served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Who may call, and how much they may send.
pub struct Access {
    pub api_keys: Vec<String>,
    pub gate: Gate,
    pub open: bool,
    pub max_request_bytes: u64,
}

/// The service: the core plus access rules.
pub struct Service<L: Ledger> {
    pub core: Arc<Coordinator<L>>,
    pub access: Access,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::NotFound, message)
}

/// A dispatch failure as the client sees it.
fn dispatch_error(e: DispatchError) -> ApiError {
    if let DispatchError::Ledger(l) = e {
        return ledger_error(l);
    }
    let code = match &e {
        DispatchError::BadRequest(_) => ErrorCode::BadInputs,
        DispatchError::NotEnoughNodes { .. } | DispatchError::Nodes(_) => ErrorCode::Busy,
        DispatchError::Undecided(_) => ErrorCode::Conflict,
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

fn node_json(n: &NodeRecord) -> Value {
    json!({
        "id": n.id, "url": n.url, "stake": n.stake, "state": n.state.as_str(),
        "agreed": n.agreed, "disagreed": n.disagreed, "score": n.score(),
        "last_heartbeat": n.last_heartbeat,
    })
}

fn job_json(j: &JobRecord) -> Value {
    json!({
        "job_id": j.id, "task": j.task, "weights": j.weights, "tier": j.tier, "seed": j.seed,
        "replicas": j.replicas, "state": j.state.as_str(), "created_at": j.created_at,
        "updated_at": j.updated_at, "output_hash": j.output_hash, "error": j.error,
        "receipt": j.receipt.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok()),
    })
}

/// A deployed task as clients see it.
fn task_json(id: &Hash, g: &Graph) -> Value {
    let io = |name: &str, ty: &tenet_ir::TensorType| json!({"name": name, "dtype": ty.dtype.name(), "shape": ty.shape});
    json!({
        "id": id,
        "endpoint": format!("/v1/tasks/{id}/run"),
        "inputs": g.inputs().map(|(_, n, t)| io(n, t)).collect::<Vec<_>>(),
        "outputs": g.outputs().iter().map(|o| io(&o.name, &g.node(o.node).ty)).collect::<Vec<_>>(),
        "weights": weights_of(g),
        "flops": g.cost().flops,
        "peak_bytes": g.cost().peak_bytes,
    })
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
    fn load_task(&self, id: &Hash) -> Result<Graph, ApiError> {
        let bytes = self
            .core
            .store()
            .get(id)
            .map_err(|_| not_found(format!("no task {id}: deploy it with POST /v1/tasks")))?;
        tenet_ir::codec::decode(&bytes)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("stored task {id}: {e}")))
    }

    async fn authorize(
        &self,
        req: Request<Incoming>,
    ) -> Result<(Method, String, Bytes, Option<String>), ApiError> {
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
        let bearer = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        let signed = req.headers().contains_key(tenet_proto::auth::KEY_HEADER);
        let itself = if signed {
            self.node_speaking_for_itself(req.uri().path()).await
        } else {
            None
        };
        let auth = if let Some(key) = bearer {
            if !self.access.api_keys.contains(&key) {
                return Err(ApiError::new(ErrorCode::Unauthenticated, "unknown API key"));
            }
            None
        } else if signed || !self.access.open {
            let h = req.headers();
            Some(self.access.gate.admit_also(
                |n| h.get(n).and_then(|v| v.to_str().ok()),
                method.as_str(),
                &path_q,
                tenet_proto::unix_now(),
                itself.as_ref(),
            )?)
        } else {
            None
        };
        let body = collect_body(req, self.access.max_request_bytes).await?;
        if let Some(a) = auth
            && tenet_node::digest::hash(&body) != a.body_hash
        {
            return Err(ApiError::new(
                ErrorCode::BadSignature,
                "the body does not hash to the signed x-tenet-body-hash",
            ));
        }
        Ok((method, path_q, body, content_type))
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

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Reply {
        let public = matches!(
            (req.method().as_str(), req.uri().path()),
            ("GET", "/v1/info") | ("GET", "/openapi.json")
        );
        let result = if public {
            self.public(req.uri().path())
        } else {
            match self.authorize(req).await {
                Ok((method, path, body, ct)) => self.route(&method, &path, body, ct).await,
                Err(e) => Err(e),
            }
        };
        result.unwrap_or_else(|e| error_reply(&e))
    }

    fn public(&self, path: &str) -> Result<Reply, ApiError> {
        if path == "/openapi.json" {
            let mut r = Response::new(body(Bytes::from_static(OPENAPI.as_bytes())));
            r.headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            return Ok(r);
        }
        let c = self.core.config();
        json_reply(&json!({
            "coordinator": self.core.key().public(),
            "version": env!("CARGO_PKG_VERSION"),
            "replicas": c.replicas,
            "tolerance": c.tolerance,
            "slash_fraction": c.slash_fraction,
            "open": self.access.open,
        }))
    }

    async fn route(
        &self,
        method: &Method,
        path_q: &str,
        body: Bytes,
        content_type: Option<String>,
    ) -> Result<Reply, ApiError> {
        let (path, query) = path_q.split_once('?').unwrap_or((path_q, ""));
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let ledger = &self.core.ledger;
        match (method.as_str(), parts.as_slice()) {
            ("POST", ["v1", "nodes"]) => {
                let (url, stake) = registration(&body)?;
                let n = self
                    .core
                    .register_node(&url, stake, None)
                    .await
                    .map_err(dispatch_error)?;
                json_reply(&node_json(&n))
            }
            ("PUT", ["v1", "nodes", id]) => {
                let key = PublicKey::parse(id)
                    .ok_or_else(|| bad(format!("`{id}` is not a node id (64 hex characters)")))?;
                let (url, stake) = registration(&body)?;
                let n = self
                    .core
                    .register_node(&url, stake, Some(&key))
                    .await
                    .map_err(dispatch_error)?;
                json_reply(&node_json(&n))
            }
            ("GET", ["v1", "nodes", id]) => {
                let n = ledger
                    .node(id)
                    .await
                    .map_err(ledger_error)?
                    .ok_or_else(|| not_found(format!("no node {id}")))?;
                json_reply(&node_json(&n))
            }
            ("POST", ["v1", "nodes", id, "heartbeat"]) => json_reply(&node_json(
                &self.core.heartbeat(id).await.map_err(dispatch_error)?,
            )),
            ("DELETE", ["v1", "nodes", id]) => json_reply(&node_json(
                &self.core.deregister(id).await.map_err(dispatch_error)?,
            )),
            ("GET", ["v1", "nodes"]) => {
                let nodes = ledger.nodes().await.map_err(ledger_error)?;
                json_reply(&nodes.iter().map(node_json).collect::<Vec<_>>())
            }
            ("PUT", ["v1", "blobs", h]) => {
                let hash = Hash::parse(h).map_err(|e| bad(e.to_string()))?;
                let existed = self
                    .core
                    .store()
                    .put(&hash, &body)
                    .map_err(|e| ApiError::new(ErrorCode::HashMismatch, e.to_string()))?;
                json_reply(&json!({"hash": hash, "size": body.len(), "existed": existed}))
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
            ("POST", ["v1", "tasks"]) => {
                let graph = tenet_ir::decode_any(&body)
                    .map_err(|e| ApiError::new(ErrorCode::InvalidGraph, e.to_string()))?;
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
                    let file = tenet_models::WeightsFile::from_bytes(bytes, &w.short())
                        .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
                    tenet_models::check_bindings(&graph, std::slice::from_ref(&file))
                        .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
                }
                let id = self
                    .core
                    .store()
                    .put_bytes(&graph.to_bytes())
                    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
                json_reply(&task_json(&id, &graph))
            }
            ("GET", ["v1", "tasks", id]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                json_reply(&task_json(&id, &self.load_task(&id)?))
            }
            ("POST", ["v1", "tasks", id, "run"]) => {
                let id = Hash::parse(id).map_err(|e| bad(e.to_string()))?;
                let graph = self.load_task(&id)?;
                let req = self.job_request(&id, &graph, &body, content_type.as_deref(), query)?;
                if query_param(query, "async") == Some("true") {
                    let job_id = self.core.submit(req).await.map_err(dispatch_error)?;
                    let mut r = json_reply(&json!({
                        "job_id": job_id,
                        "state": "pending",
                        "status": format!("/v1/jobs/{job_id}"),
                    }))?;
                    *r.status_mut() = hyper::StatusCode::ACCEPTED;
                    return Ok(r);
                }
                let out = self.core.run(req).await.map_err(dispatch_error)?;
                let outputs: Value =
                    serde_json::from_str(&tenet_models::outputs_json(&out.outputs))
                        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
                json_reply(&json!({
                    "job_id": out.job_id,
                    "state": "decided",
                    "outputs": outputs,
                    "receipt": out.receipt,
                    "slashed": out.slashed.iter().map(|(n, a)| json!({"node": n, "amount": a})).collect::<Vec<_>>(),
                    "refereed": out.refereed,
                }))
            }
            ("GET", ["v1", "jobs", id]) => {
                if let Some(secs) = query_param(query, "wait").and_then(|s| s.parse::<f64>().ok()) {
                    let limit = std::time::Duration::from_secs_f64(secs.clamp(0.0, MAX_WAIT_SECS));
                    self.core.wait(id, limit).await;
                }
                json_reply(&self.job_view(id).await?)
            }
            ("GET", ["v1", "jobs"]) => {
                let limit = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("limit="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(100i64)
                    .clamp(1, 10_000);
                let jobs = ledger.jobs(limit).await.map_err(ledger_error)?;
                json_reply(&jobs.iter().map(job_json).collect::<Vec<_>>())
            }
            _ => Err(not_found(format!(
                "no route {method} {path}; see /openapi.json"
            ))),
        }
    }

    /// A job as clients see it: its record and replicas, and once decided its outputs, its
    /// receipt and who was slashed for it.
    async fn job_view(&self, id: &str) -> Result<Value, ApiError> {
        let ledger = &self.core.ledger;
        let j = ledger
            .job(id)
            .await
            .map_err(ledger_error)?
            .ok_or_else(|| not_found(format!("no job {id}")))?;
        let mut v = job_json(&j);
        let asg = ledger.assignments(id).await.map_err(ledger_error)?;
        v["assignments"] = json!(asg.iter().map(|a| json!({"node": a.node_id, "state": a.state.as_str(), "output_hash": a.output_hash})).collect::<Vec<_>>());
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
            let bytes = self
                .core
                .store()
                .get(&o.hash)
                .map_err(|e| internal(format!("output {} of job {id}: {e}", o.name)))?;
            let t = tenet_proto::tensor::decode(&bytes)
                .map_err(|e| internal(format!("output {} of job {id}: {e}", o.name)))?;
            outputs.push((o.name.clone(), t));
        }
        v["outputs"] = serde_json::from_str(&tenet_models::outputs_json(&outputs))
            .map_err(|e| internal(e.to_string()))?;
        let mut slashed = Vec::new();
        for a in asg.iter().filter(|a| a.state == AssignmentState::Disagreed) {
            let taken: i64 = ledger
                .stake_events(&a.node_id)
                .await
                .map_err(ledger_error)?
                .iter()
                .filter(|e| e.job_id.as_deref() == Some(id) && e.delta < 0)
                .map(|e| -e.delta)
                .sum();
            slashed.push(json!({"node": a.node_id, "amount": taken}));
        }
        v["slashed"] = json!(slashed);
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
        let param = |k: &str| query_param(query, k);
        let parse_tier = |t: &str| {
            Tier::parse(t).ok_or_else(|| bad(format!("tier `{t}` is not exact or tolerant")))
        };
        let mut inputs = BTreeMap::new();
        let (tier, seed) = if content_type == Some("application/octet-stream") {
            let file = tenet_models::WeightsFile::from_bytes(body.to_vec(), "request body")
                .map_err(|e| bad(e.to_string()))?;
            for (_, name, _) in graph.inputs() {
                let t = file.tensor(name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::BadInputs,
                        format!("the safetensors body has no tensor {name}"),
                    )
                })?;
                inputs.insert(name.to_string(), t.clone());
            }
            (
                param("tier")
                    .map(parse_tier)
                    .transpose()?
                    .unwrap_or_default(),
                param("seed").and_then(|s| s.parse().ok()).unwrap_or(0),
            )
        } else {
            let v: Value = serde_json::from_slice(body).map_err(|e| {
                bad(format!(
                    "expected {{\"inputs\": {{name: tensor}}}} as JSON: {e}"
                ))
            })?;
            let given = v["inputs"]
                .as_object()
                .ok_or_else(|| bad("\"inputs\" must be an object"))?;
            for (_, name, ty) in graph.inputs() {
                let t = given.get(name).ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::BadInputs,
                        format!("input {name} ({ty}) is missing"),
                    )
                })?;
                let t: HostTensor = tenet_models::tensor_from_json(t, ty).map_err(|e| {
                    ApiError::new(ErrorCode::BadInputs, format!("input {name}: {e}"))
                })?;
                inputs.insert(name.to_string(), t);
            }
            if let Some(extra) = given.keys().find(|k| !inputs.contains_key(*k)) {
                return Err(ApiError::new(
                    ErrorCode::BadInputs,
                    format!("the task has no input {extra}"),
                ));
            }
            (
                v["tier"]
                    .as_str()
                    .map(parse_tier)
                    .transpose()?
                    .unwrap_or_default(),
                v["seed"].as_u64().unwrap_or(0),
            )
        };
        for (_, name, ty) in graph.inputs() {
            if inputs[name].ty() != ty {
                return Err(ApiError::new(
                    ErrorCode::BadInputs,
                    format!("input {name} is {}, the task needs {ty}", inputs[name].ty()),
                ));
            }
        }
        Ok(JobRequest {
            task: *task,
            weights: weights_of(graph),
            inputs,
            tier,
            seed,
        })
    }
}

/// The longest a `GET /v1/jobs/{id}?wait=` holds the request.
const MAX_WAIT_SECS: f64 = 60.0;

fn internal(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Internal, message)
}

/// `key`'s value in a query string.
fn query_param<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// `{"url", "stake"}` of a node registration.
fn registration(body: &[u8]) -> Result<(String, i64), ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("expected {{\"url\", \"stake\"}}: {e}")))?;
    let url = v["url"]
        .as_str()
        .ok_or_else(|| bad("\"url\" is required"))?;
    let stake = v["stake"]
        .as_i64()
        .filter(|s| *s > 0)
        .ok_or_else(|| bad("\"stake\" must be a positive integer"))?;
    Ok((url.to_string(), stake))
}

/// Serve until `shutdown` resolves; in-flight calls get ten seconds to finish.
pub async fn serve<L: Ledger + 'static>(
    service: Arc<Service<L>>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    tenet_node::http::serve_connections(listener, shutdown, move |req| service.clone().handle(req))
        .await;
}
