//! The HTTP face of the node: one route table, authentication before any body is read, bodies
//! read under size limits and a pace (blob uploads streamed to disk while hashed), every
//! answer timed, counted and — when enabled — logged. Errors become responses only here, with
//! the status their code carries. The accept loop (`tenet_net::serve`, shared with the
//! coordinator) bounds what connections may hold before they authenticate: how many, how long
//! a request head may take, and how slowly a body may arrive. A request another transport
//! carried whole (a libp2p stream) is answered by the same routes through [`answer`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response};
use tenet_net::busy::BusyPoll;
use tenet_net::serve::{
    Paced, Payload, Reply, ReplyBody, RequestBody, body, collect_body_with, declared_length,
    error_reply, json_reply, payload, serve_connections_with,
};
use tenet_net::{RawRequest, RawResponse};
use tenet_proto::auth::{AuthHeaders, PublicKey};
use tenet_proto::wire::{Batch, BlobStored, RunJob};
use tenet_proto::{ApiError, ErrorCode, Hash, tensor};
use tokio::net::TcpListener;

use crate::errors::{bad_request, not_found, store_error};
use crate::service::Node;

/// Serve `listener` until `shutdown` resolves, then stop accepting, let in-flight requests
/// finish (up to ten seconds), and flush the event log.
pub async fn serve(node: Arc<Node>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let limits = node.config().conn_limits();
    let handler_node = node.clone();
    let busy = BusyPoll::new(Duration::from_micros(node.config().busy_poll_us));
    // Between requests the spinner makes the nonces for the next commitment signatures.
    let key = node.key().clone();
    let spinner = tokio::spawn(
        busy.clone()
            .run(move || key.refill_nonce(tenet_net::identity::random_bytes())),
    );
    serve_connections_with(listener, limits, shutdown, move |req| {
        let (node, busy) = (handler_node.clone(), busy.clone());
        busy.touch();
        async move {
            let reply = handle(node, req).await;
            busy.touch();
            reply
        }
    })
    .await;
    spinner.abort();
    node.events.emit("shutdown", serde_json::Value::Null);
    node.events.close();
}

/// Answer a request another transport carried here whole (a libp2p stream): the same gate,
/// routes, limits, metrics and event log as a request over HTTP, the answer read into one
/// buffer of at most `max_answer` bytes (a longer one becomes a `too_large` error).
pub async fn answer(node: Arc<Node>, raw: RawRequest, max_answer: u64) -> RawResponse {
    let mut req = Request::builder()
        .method(raw.method)
        .uri(raw.path.as_str())
        .header("content-length", raw.body.len());
    for (k, v) in &raw.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let reply = match req.body(Full::new(raw.body)) {
        Ok(req) => handle(node, req).await,
        Err(e) => error_reply(&bad_request(format!("the request is not well formed: {e}"))),
    };
    let status = reply.status().as_u16();
    let mut body = reply.into_body();
    let mut out = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(mut data) = frame.into_data() {
            if (out.len() + data.remaining()) as u64 > max_answer {
                let e = ApiError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "the answer is larger than the {max_answer} bytes this transport carries; fetch it over HTTP"
                    ),
                );
                return RawResponse {
                    status: e.http_status(),
                    body: Bytes::from(e.to_json()),
                };
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    RawResponse {
        status,
        body: Bytes::from(out),
    }
}

/// The node's own dashboard page (`GET /`): its info and metrics, refreshed in the browser.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The routes, named for metrics.
fn route_name(method: &Method, parts: &[&str]) -> &'static str {
    match (method.as_str(), parts) {
        ("GET", ["v1", "info"]) => "info",
        ("GET", ["metrics"]) => "metrics",
        ("GET", [""]) => "dashboard",
        ("PUT", ["v1", "blobs", _]) => "blob_put",
        ("GET" | "HEAD", ["v1", "blobs", _]) => "blob_get",
        ("PUT" | "DELETE", ["v1", "pins", _]) => "pin",
        ("POST", ["v1", "jobs"]) => "job_run",
        ("GET", ["v1", "jobs", _]) => "job_status",
        ("DELETE", ["v1", "jobs", _]) => "job_cancel",
        ("POST", ["v1", "jobs", _, "reveal"]) => "job_reveal",
        ("POST", ["v1", "jobs", _, "trace"]) => "job_trace",
        ("GET", ["v1", "jobs", _, "trace", "leaf", _]) => "job_trace_leaf",
        ("GET", ["v1", "jobs", _, "trace", _, _]) => "job_trace_node",
        ("POST", ["v1", "sessions"]) => "session_create",
        ("DELETE", ["v1", "sessions", _]) => "session_delete",
        ("PUT" | "GET" | "DELETE", ["v1", "sessions", _, "tensors", _]) => "session_tensor",
        ("POST", ["v1", "sessions", _, "batch"]) => "session_batch",
        ("GET", ["v1", "tensors", _]) => "tensor_by_hash",
        _ => "unknown",
    }
}

async fn handle<B: RequestBody>(node: Arc<Node>, req: Request<B>) -> Reply {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let route = route_name(&method, &parts);
    let mut key = None;
    let reply = match dispatch(&node, route, req, &parts, &mut key).await {
        Ok(r) => r,
        Err(e) => error_reply(&e),
    };
    let status = reply.status().as_u16();
    let us = started.elapsed().as_micros() as u64;
    node.metrics.request(route, status, us);
    if node.events.enabled() {
        node.events.emit(
            "request",
            serde_json::json!({
                "method": method.as_str(), "path": path, "route": route,
                "status": status, "us": us, "key": key.map(|k: tenet_proto::auth::PublicKey| k.to_hex()),
            }),
        );
    }
    reply
}

fn bytes_reply(node: &Node, payload: Payload) -> Reply {
    node.metrics
        .bytes_out
        .fetch_add(payload.remaining() as u64, Ordering::Relaxed);
    let mut r = Response::new(ReplyBody::Whole(Full::new(payload)));
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/octet-stream"),
    );
    r
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("the JSON body does not parse: {e}")))
}

fn parse_hash(text: &str) -> Result<Hash, ApiError> {
    Hash::parse(text).map_err(|e| bad_request(e.to_string()))
}

/// `admit` (which may refuse it), and check it is the one that was signed.
async fn read_body<B: RequestBody>(
    node: &Node,
    req: Request<B>,
    auth: &AuthHeaders,
    limit: u64,
    align_at: fn(&[u8]) -> Option<usize>,
    mut admit: impl FnMut(usize) -> Result<(), ApiError>,
) -> Result<Bytes, ApiError> {
    // Hashed frame by frame as they arrive, while the sender is still writing the rest: a
    // 4 MiB tensor upload spent ~0.7 ms hashing after its last byte when hashed whole.
    let mut hasher = blake3::Hasher::new();
    let pace = node.config().conn_limits().body;
    let buf = collect_body_with(req, limit, pace, align_at, |frame| {
        admit(frame.len())?;
        hasher.update(frame);
        Ok(())
    })
    .await?;
    let hash = Hash(*hasher.finalize().as_bytes());
    node.metrics
        .bytes_in
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    if hash != auth.body_hash {
        return Err(ApiError::new(
            ErrorCode::BadSignature,
            "the body does not hash to the signed x-tenet-body-hash: it was altered or cut short",
        ));
    }
    Ok(buf)
}

async fn dispatch<B: RequestBody>(
    node: &Arc<Node>,
    route: &'static str,
    req: Request<B>,
    parts: &[&str],
    key: &mut Option<tenet_proto::auth::PublicKey>,
) -> Result<Reply, ApiError> {
    match route {
        "info" => return json_reply(node.info()),
        // The node's page shows what `info` and `metrics` say to anyone already.
        "dashboard" => {
            let mut r = Response::new(body(Bytes::from_static(DASHBOARD.as_bytes())));
            let h = r.headers_mut();
            h.insert(
                "content-type",
                hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.insert(
                "content-security-policy",
                hyper::header::HeaderValue::from_static(
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                ),
            );
            return Ok(r);
        }
        "metrics" => {
            let mut r = Response::new(body(node.metrics_text()));
            r.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            return Ok(r);
        }
        "unknown" => {
            return Err(not_found(format!(
                "no route {} {}; see the node API in docs/NODE.md",
                req.method(),
                req.uri().path()
            )));
        }
        _ => {}
    }
    let path_q = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let headers = req.headers();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let now = tenet_proto::unix_now();
    // A peer the node does not know may fetch one tensor with a grant for it from a
    // coordinator the node trusts (a pipeline's next stage pulling a boundary tensor).
    let granted = match (route, parts) {
        ("tensor_by_hash", [_, _, h]) => {
            let grant = header(tenet_proto::grant::GRANT_HEADER)
                .and_then(tenet_proto::grant::PullGrant::from_header);
            match (grant, Hash::parse(h)) {
                // Cheapest first: the signature is checked only for a grant of a coordinator
                // this node trusts, for this tensor, not expired.
                (Some(g), Ok(hash)) if node.gate.trusts(&g.coordinator) && g.allows(&hash, now) => {
                    header(tenet_proto::auth::KEY_HEADER).and_then(PublicKey::parse)
                }
                _ => None,
            }
        }
        _ => None,
    };
    let auth = node.gate.admit_also(
        header,
        req.method().as_str(),
        &path_q,
        now,
        granted.as_ref(),
    )?;
    *key = Some(auth.key);
    let max = node.config().max_request_bytes;
    match (route, parts) {
        ("blob_put", [_, _, h]) => put_blob(node, req, &auth, parse_hash(h)?).await,
        ("blob_get", [_, _, h]) => {
            let hash = parse_hash(h)?;
            if req.method() == Method::HEAD {
                let size = node
                    .store()
                    .contains(&hash)
                    .ok_or_else(|| not_found(format!("no blob {hash}")))?;
                let mut r = Response::new(body(Bytes::new()));
                r.headers_mut().insert("content-length", size.into());
                Ok(r)
            } else {
                Ok(bytes_reply(node, node.blob(&hash)?))
            }
        }
        ("pin", [_, _, h]) => {
            let hash = parse_hash(h)?;
            let pinned = *req.method() == Method::PUT;
            if pinned {
                node.store().pin(&hash).map_err(store_error)?;
            } else {
                node.store().unpin(&hash).map_err(store_error)?;
            }
            json_reply(&serde_json::json!({"hash": hash, "pinned": pinned}))
        }
        ("job_run", _) => {
            let body = read_body(node, req, &auth, max, |_| None, |_| Ok(())).await?;
            let job: RunJob = parse_json(&body)?;
            json_reply(&node.run_job(job).await?)
        }
        ("job_status", [_, _, id]) => json_reply(&node.job_status(id)?),
        ("job_cancel", [_, _, id]) => json_reply(&node.cancel_job(id)?),
        ("job_reveal", [_, _, id, _]) => {
            if node.withholds_reveals() {
                // A stalling node, for tests: the reveal never comes.
                std::future::pending::<()>().await;
            }
            json_reply(&node.reveal(id)?)
        }
        ("job_trace_node", _) if node.stalls_disputes() => {
            // A node stalling a dispute, for tests: the walk's answer never comes.
            std::future::pending::<()>().await;
            unreachable!("a pending future never ends")
        }
        ("job_trace" | "job_trace_node" | "job_trace_leaf", [_, _, id, ..]) => {
            // Traces run on the reference interpreter: off the event loop.
            let (me, id) = (node.clone(), id.to_string());
            let numbers: Vec<Option<u64>> = parts[4..].iter().map(|p| p.parse().ok()).collect();
            let answer =
                tokio::task::spawn_blocking(move || -> Result<serde_json::Value, ApiError> {
                    let trace = me.job_trace(&id)?;
                    let tree = trace.tree();
                    Ok(match (route, numbers.as_slice()) {
                        ("job_trace", _) => serde_json::json!({
                            "root": tree.root(), "count": tree.count(), "depth": tree.depth(),
                        }),
                        ("job_trace_node", [Some(depth), Some(index)]) => {
                            let (left, right) = u32::try_from(*depth)
                                .ok()
                                .and_then(|d| tree.children(d, *index))
                                .ok_or_else(|| not_found("no such node in the trace tree"))?;
                            serde_json::json!({"left": left, "right": right})
                        }
                        ("job_trace_leaf", [_, Some(i)]) => {
                            let (proof, value) = trace.leaf(*i)?;
                            serde_json::json!({
                                "proof": proof,
                                "value": tenet_proto::to_hex(&tensor::encode(&value)),
                            })
                        }
                        _ => return Err(bad_request("a trace path ends in numbers")),
                    })
                })
                .await
                .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))??;
            json_reply(&answer)
        }
        ("session_create", _) => json_reply(&node.create_session()?),
        ("session_delete", [_, _, sid]) => {
            node.delete_session(sid)?;
            json_reply(&serde_json::json!({"deleted": sid}))
        }
        ("session_tensor", [_, _, sid, _, name]) => match *req.method() {
            Method::PUT => {
                // The session, the name and the room are checked before any of the body is
                // read, and its bytes count against the sessions' memory as they arrive.
                let mut inbound = node.tensor_upload(sid, name, declared_length(&req)?)?;
                let limit = node.config().max_blob_bytes;
                // Received with the elements on a 64-byte boundary, so the resident tensor
                // is a view of the request's buffer.
                let body = read_body(node, req, &auth, limit, tensor::data_offset, |n| {
                    inbound.take(n as u64)
                })
                .await?;
                // The body hashed to the signed hash: the tensor's address, not hashed again.
                json_reply(&node.put_tensor(sid, name, body, auth.body_hash, inbound)?)
            }
            Method::GET => Ok(bytes_reply(node, payload(node.get_tensor(sid, name)?))),
            _ => {
                node.free_tensor(sid, name)?;
                json_reply(&serde_json::json!({"freed": name}))
            }
        },
        ("session_batch", [_, _, sid, _]) => {
            let body = read_body(node, req, &auth, max, |_| None, |_| Ok(())).await?;
            let batch: Batch = parse_json(&body)?;
            json_reply(&node.batch(sid, batch).await?)
        }
        ("tensor_by_hash", [_, _, h]) => {
            Ok(bytes_reply(node, node.tensor_by_hash(&parse_hash(h)?)?))
        }
        _ => Err(not_found("no such route")),
    }
}

/// Stream a blob to disk, hashing as it arrives; it becomes visible only if it is whole and
/// hashes to its address.
async fn put_blob<B: RequestBody>(
    node: &Arc<Node>,
    req: Request<B>,
    auth: &AuthHeaders,
    hash: Hash,
) -> Result<Reply, ApiError> {
    if auth.body_hash != hash {
        return Err(bad_request(format!(
            "a blob upload's signed body hash must be its address {hash}"
        )));
    }
    let declared = declared_length(&req)?;
    let store = node.store().clone();
    if let Some(size) = store.contains(&hash) {
        // Already here: the body need not be read (or trusted) at all.
        return json_reply(&BlobStored {
            hash,
            size,
            existed: true,
        });
    }
    // Room on disk is taken as the bytes arrive, not for the declared length; a body that
    // stalls or trickles is dropped, and its temporary file and room with it.
    let mut writer = store.writer(hash, declared).map_err(store_error)?;
    let mut body = req.into_body();
    let mut paced = Paced::new(node.config().conn_limits().body);
    while let Some(data) = paced.next(&mut body).await? {
        writer.write(&data).map_err(store_error)?;
    }
    let size = writer.written();
    node.metrics.bytes_in.fetch_add(size, Ordering::Relaxed);
    // Hash check, fsync and rename: off the async threads.
    let existed = tokio::task::spawn_blocking(move || writer.finish())
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
        .map_err(store_error)?;
    json_reply(&BlobStored {
        hash,
        size,
        existed,
    })
}
