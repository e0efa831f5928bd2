//! The HTTP face of the node: one route table, authentication before any body is read, bodies
//! read under size limits (blob uploads streamed to disk while hashed), every answer timed,
//! counted and — when enabled — logged. Errors become responses only here, with the status
//! their code carries.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tenet_ir::recycle::{self, Recycled};
use tenet_proto::auth::AuthHeaders;
use tenet_proto::wire::{Batch, BlobStored, RunJob};
use tenet_proto::{ApiError, ErrorCode, Hash, tensor};
use tokio::net::TcpListener;

use crate::busy::BusyPoll;
use crate::errors::{bad_request, not_found, store_error};
use crate::service::Node;

/// A reply's bytes: one buffer, or two sent back to back without being joined (a tensor
/// blob's header and the tensor's bytes, written with one `writev`).
pub type Payload = bytes::buf::Chain<Bytes, Bytes>;

/// What every handler answers.
pub type Reply = Response<Full<Payload>>;

/// A payload of one buffer.
pub fn payload(bytes: impl Into<Bytes>) -> Payload {
    bytes.into().chain(Bytes::new())
}

/// A reply body of one buffer.
pub fn body(bytes: impl Into<Bytes>) -> Full<Payload> {
    Full::new(payload(bytes))
}

/// The largest read buffer per connection: big bodies arrive in big reads (hyper's default of
/// about 400 KiB makes a 4 MiB upload take several times as long on loopback).
pub(crate) const READ_BUFFER_MAX: usize = 4 << 20;

/// How long in-flight requests get to finish once shutdown starts.
const DRAIN: Duration = Duration::from_secs(10);

/// Serve `listener` until `shutdown` resolves, then stop accepting, let in-flight requests
/// finish (up to ten seconds), and flush the event log.
pub async fn serve(node: Arc<Node>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let handler_node = node.clone();
    let busy = BusyPoll::new(Duration::from_micros(node.config().busy_poll_us));
    // Between requests the spinner makes the nonces for the next commitment signatures.
    let key = node.key().clone();
    let spinner = tokio::spawn(
        busy.clone()
            .run(move || key.refill_nonce(crate::identity::random_bytes())),
    );
    serve_connections(listener, shutdown, move |req| {
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

/// The accept loop every tenet service uses: HTTP/1.1 keep-alive connections with large read
/// buffers, each request answered by `handler`, until `shutdown` resolves; then no new
/// connections, and in-flight requests get up to ten seconds.
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // Out of file descriptors or similar: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let service = hyper::service::service_fn(move |req| {
                    let reply = handler(req);
                    async move { Ok::<_, Infallible>(reply.await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .max_buf_size(READ_BUFFER_MAX)
                    .writev(true)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// The routes, named for metrics.
fn route_name(method: &Method, parts: &[&str]) -> &'static str {
    match (method.as_str(), parts) {
        ("GET", ["v1", "info"]) => "info",
        ("GET", ["metrics"]) => "metrics",
        ("PUT", ["v1", "blobs", _]) => "blob_put",
        ("GET" | "HEAD", ["v1", "blobs", _]) => "blob_get",
        ("PUT" | "DELETE", ["v1", "pins", _]) => "pin",
        ("POST", ["v1", "jobs"]) => "job_run",
        ("GET", ["v1", "jobs", _]) => "job_status",
        ("DELETE", ["v1", "jobs", _]) => "job_cancel",
        ("POST", ["v1", "jobs", _, "reveal"]) => "job_reveal",
        ("POST", ["v1", "sessions"]) => "session_create",
        ("DELETE", ["v1", "sessions", _]) => "session_delete",
        ("PUT" | "GET" | "DELETE", ["v1", "sessions", _, "tensors", _]) => "session_tensor",
        ("POST", ["v1", "sessions", _, "batch"]) => "session_batch",
        ("GET", ["v1", "tensors", _]) => "tensor_by_hash",
        _ => "unknown",
    }
}

async fn handle(node: Arc<Node>, req: Request<Incoming>) -> Reply {
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

/// An error as a response, with the status its code carries.
pub fn error_reply(e: &ApiError) -> Reply {
    let mut r = Response::new(body(e.to_json()));
    *r.status_mut() =
        StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A JSON response.
pub fn json_reply<T: serde::Serialize>(value: &T) -> Result<Reply, ApiError> {
    let body = serde_json::to_vec(value)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("encoding the answer: {e}")))?;
    let mut r = Response::new(self::body(body));
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

fn bytes_reply(node: &Node, payload: Payload) -> Reply {
    node.metrics
        .bytes_out
        .fetch_add(payload.remaining() as u64, Ordering::Relaxed);
    let mut r = Response::new(Full::new(payload));
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

/// The request's Content-Length, if it declares one.
pub fn declared_length(req: &Request<Incoming>) -> Result<Option<u64>, ApiError> {
    req.headers()
        .get("content-length")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad_request("content-length is not a number"))
        })
        .transpose()
}

/// Read a whole body of at most `limit` bytes and check it is the one that was signed.
async fn read_body(
    node: &Node,
    req: Request<Incoming>,
    auth: &AuthHeaders,
    limit: u64,
    align_at: fn(&[u8]) -> Option<usize>,
) -> Result<Bytes, ApiError> {
    // Hashed frame by frame as they arrive, while the sender is still writing the rest: a
    // 4 MiB tensor upload spent ~0.7 ms hashing after its last byte when hashed whole.
    let mut hasher = blake3::Hasher::new();
    let buf = collect(req, limit, align_at, |frame| {
        hasher.update(frame);
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

/// Read a whole body of at most `limit` bytes (413 beyond it; 400 if it ends early).
pub async fn collect_body(req: Request<Incoming>, limit: u64) -> Result<Bytes, ApiError> {
    collect(req, limit, |_| None, |_| {}).await
}

/// [`collect_body`], showing each frame to `each` as it arrives. A large body is copied into
/// a buffer from the recycle cache, which it returns to when dropped: a fresh 4 MiB buffer
/// per upload is 1,024 pages to fault in, each slow on a VM. Where `align_at` finds an offset
/// in the first frame, the body is placed so that this offset falls on a 64-byte boundary.
async fn collect(
    req: Request<Incoming>,
    limit: u64,
    align_at: fn(&[u8]) -> Option<usize>,
    mut each: impl FnMut(&[u8]),
) -> Result<Bytes, ApiError> {
    const ALIGN: usize = 64;
    let declared = declared_length(&req)?;
    if let Some(n) = declared.filter(|&n| n > limit) {
        return Err(too_large(n, limit));
    }
    let mut body = req.into_body();
    // The declared length is at most `limit` here, and hyper ends the body there, so the
    // buffer never grows past `room` (which keeps the placement, and the data, where it is).
    let room = declared.map_or(0, |n| n as usize + ALIGN);
    let mut buf = match recycle::take(room) {
        Some(mut cached) => {
            cached.clear();
            cached
        }
        None => Vec::with_capacity(room),
    };
    // Where the body starts in `buf`, fixed by the first frame.
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(truncated)?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let start = *first.get_or_insert_with(|| {
            let pad = match align_at(data) {
                Some(offset) if room > 0 => {
                    (ALIGN - (buf.as_ptr() as usize + offset) % ALIGN) % ALIGN
                }
                _ => 0,
            };
            buf.resize(pad, 0);
            pad
        });
        let size = buf.len() - start + data.len();
        if size as u64 > limit {
            return Err(too_large(size as u64, limit));
        }
        buf.extend_from_slice(data);
        each(data);
    }
    let (start, end) = (first.unwrap_or(0), buf.len());
    // Back to the cache at the length the next body of this size asks for.
    if end < room {
        buf.resize(room, 0);
    }
    Ok(Bytes::from_owner(Recycled(buf)).slice(start..end))
}

fn too_large(size: u64, limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::TooLarge,
        format!("the body is {size} bytes; this node accepts at most {limit} here"),
    )
}

fn truncated(e: hyper::Error) -> ApiError {
    ApiError::new(
        ErrorCode::TruncatedBody,
        format!("the body ended before its declared length: {e}"),
    )
}

async fn dispatch(
    node: &Arc<Node>,
    route: &'static str,
    req: Request<Incoming>,
    parts: &[&str],
    key: &mut Option<tenet_proto::auth::PublicKey>,
) -> Result<Reply, ApiError> {
    match route {
        "info" => return json_reply(node.info()),
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
    let auth = node.gate.admit(
        |name| headers.get(name).and_then(|v| v.to_str().ok()),
        req.method().as_str(),
        &path_q,
        tenet_proto::unix_now(),
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
            let body = read_body(node, req, &auth, max, |_| None).await?;
            let job: RunJob = parse_json(&body)?;
            json_reply(&node.run_job(job).await?)
        }
        ("job_status", [_, _, id]) => json_reply(&node.job_status(id)?),
        ("job_cancel", [_, _, id]) => json_reply(&node.cancel_job(id)?),
        ("job_reveal", [_, _, id, _]) => json_reply(&node.reveal(id)?),
        ("session_create", _) => json_reply(&node.create_session()?),
        ("session_delete", [_, _, sid]) => {
            node.delete_session(sid)?;
            json_reply(&serde_json::json!({"deleted": sid}))
        }
        ("session_tensor", [_, _, sid, _, name]) => match *req.method() {
            Method::PUT => {
                let limit = node.config().max_blob_bytes;
                // Received with the elements on a 64-byte boundary, so the resident tensor
                // is a view of the request's buffer.
                let body = read_body(node, req, &auth, limit, tensor::data_offset).await?;
                // The body hashed to the signed hash: the tensor's address, not hashed again.
                json_reply(&node.put_tensor(sid, name, body, auth.body_hash)?)
            }
            Method::GET => Ok(bytes_reply(node, payload(node.get_tensor(sid, name)?))),
            _ => {
                node.free_tensor(sid, name)?;
                json_reply(&serde_json::json!({"freed": name}))
            }
        },
        ("session_batch", [_, _, sid, _]) => {
            let body = read_body(node, req, &auth, max, |_| None).await?;
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
async fn put_blob(
    node: &Arc<Node>,
    req: Request<Incoming>,
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
    let mut writer = store.writer(hash, declared).map_err(store_error)?;
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(truncated)?;
        if let Some(data) = frame.data_ref() {
            writer.write(data).map_err(store_error)?;
        }
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
