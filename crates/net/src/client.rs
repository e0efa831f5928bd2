//! A client for the node API: signs every request with its key and keeps its HTTP/1.1
//! connections open (reconnecting when the node closed one). A client carries one request at
//! a time unless made with a pool ([`NodeClient::pooled`]): then up to that many at once, each
//! on a kept connection of its own. Used by the CLI, the tests, the benchmark, and nodes
//! pulling tensors from peers.
//!
//! Every call is bounded in time and in the size of its answer: by the client's defaults
//! ([`NodeClient::with_timeout`], [`NodeClient::with_answer_limits`]) or by the caller's own
//! [`Bounds`] (the `*_within` methods), so a node that never answers, or answers without end,
//! costs its caller a deadline and at most the limit in memory. A call past its deadline
//! drops its connection.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tenet_ir::recycle::{self, Recycled};
use tenet_proto::auth::{KeyPair, PublicKey};
use tenet_proto::wire::{
    Batch, BatchResults, BlobStored, Committed, JobStatus, NodeInfo, Resident, Revealed, RunJob,
    SessionCreated,
};
use tenet_proto::{ApiError, Hash};
use tokio::sync::Semaphore;

use crate::body::Tracked;
use crate::identity::random_bytes;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the node refused the request ({status}): {error}")]
    Api { status: u16, error: ApiError },
    #[error("cannot reach the node at {addr}: {message}")]
    Transport { addr: String, message: String },
    #[error("unexpected answer ({status}): {message}")]
    Unexpected { status: u16, message: String },
    #[error("`{0}` is not a node address: expected http://HOST:PORT")]
    BadUrl(String),
    #[error("the node at {addr} did not answer within {limit_ms} ms; the connection was dropped")]
    Timeout { addr: String, limit_ms: u64 },
    #[error(
        "the answer from {addr} is larger than the {limit} bytes this call accepts ({size} bytes declared or received when reading stopped)"
    )]
    TooLarge { addr: String, limit: u64, size: u64 },
}

impl ClientError {
    /// The node's error code, if the node answered with one.
    pub fn code(&self) -> Option<tenet_proto::ErrorCode> {
        match self {
            ClientError::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// A request as it will be sent (tests alter these to play an attacker).
#[derive(Clone, Debug)]
pub struct RawRequest {
    pub method: Method,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// What came back.
#[derive(Clone, Debug)]
pub struct RawResponse {
    pub status: u16,
    pub body: Bytes,
}

impl RawResponse {
    /// A 2xx answer's body, or the error it carries.
    pub fn into_result(self) -> Result<Bytes, ClientError> {
        if (200..300).contains(&self.status) {
            return Ok(self.body);
        }
        Err(match self.error() {
            Some(error) => ClientError::Api {
                status: self.status,
                error,
            },
            None => ClientError::Unexpected {
                status: self.status,
                message: String::from_utf8_lossy(&self.body[..self.body.len().min(200)]).into(),
            },
        })
    }

    /// The node's error, if this is one.
    pub fn error(&self) -> Option<ApiError> {
        ApiError::from_json(&self.body)
    }
}

/// How long one call may take and how large its answer may be.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// The call fails with [`ClientError::Timeout`] (and its connection is dropped) if its
    /// answer has not been read whole by then: connecting, sending, waiting and reading.
    pub deadline: Instant,
    /// The most bytes the answer's body may have ([`ClientError::TooLarge`] beyond it; a
    /// declared length beyond it fails before any of the body is read).
    pub max_answer_bytes: u64,
}

impl Bounds {
    /// `timeout` from now, answers up to `max_answer_bytes`.
    pub fn new(timeout: Duration, max_answer_bytes: u64) -> Bounds {
        let now = Instant::now();
        // A timeout past what an instant can hold: a century, as good as none.
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        Bounds {
            deadline,
            max_answer_bytes,
        }
    }
}

/// What one exchange over a [`Link`] may take and do besides sending.
pub struct Exchange<'a> {
    /// Adds the request body's bytes as the link takes them (a caller's upload progress).
    pub taken: Option<Arc<AtomicU64>>,
    /// The most bytes the answer's body may have.
    pub limit: u64,
    /// Asked about each piece of the answer's body (its length) before it is kept; saying no
    /// stops the read ([`ClientError::TooLarge`]).
    pub admit: &'a mut (dyn FnMut(u64) -> bool + Send),
    /// How long to spin for the answer before sleeping.
    pub spin: Duration,
    /// Work to do while the answer is on its way (the signing nonce for the next request).
    pub idle: &'a (dyn Fn() + Sync),
}

/// A future a [`Link`] returns.
pub type LinkFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<RawResponse, ClientError>> + Send + 'a>,
>;

/// How the node API's signed requests reach one node: HTTP/1.1 over TCP ([`HttpLink`]) or a
/// libp2p stream (`tenet-p2p`). The request is signed before it reaches the link and checked
/// by the node's gate after it leaves it, so a link carries bytes and is trusted with nothing.
/// A link has no deadline of its own: [`NodeClient`] drops the exchange at the call's.
pub trait Link: Send + Sync + 'static {
    /// Where the node is, as messages and receipts name it (`http://host:port`, or
    /// `p2p:PEER_ID`).
    fn url(&self) -> String;
    /// Send `raw` and read its whole answer within `how`.
    fn exchange<'a>(&'a self, raw: RawRequest, how: Exchange<'a>) -> LinkFuture<'a>;
}

/// A connection: the sender, and the task driving the socket, stopped when this is dropped
/// (so a call abandoned at its deadline closes its socket at once).
struct Conn {
    sender: SendRequest<Tracked>,
    task: tokio::task::AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The node API over HTTP/1.1: kept-alive connections, reopened when the node closed them; at
/// most `slots` requests at once, each on a connection of its own.
pub struct HttpLink {
    addr: String,
    /// Connections between requests.
    idle: std::sync::Mutex<Vec<Conn>>,
    slots: Semaphore,
}

impl HttpLink {
    /// A link to the node at `url` (`http://host:port` or `host:port`), one request at a time.
    /// Connects on first use.
    pub fn new(url: &str) -> Result<HttpLink, ClientError> {
        HttpLink::pooled(url, 1)
    }

    /// A link carrying up to `connections` requests at once (at least one).
    pub fn pooled(url: &str, connections: usize) -> Result<HttpLink, ClientError> {
        let addr = authority(url).ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
        Ok(HttpLink {
            addr,
            idle: std::sync::Mutex::new(Vec::new()),
            slots: Semaphore::new(connections.max(1)),
        })
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(c) = idle.pop() {
            if !c.sender.is_closed() {
                return Some(c);
            }
        }
        None
    }

    fn keep(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
    }

    fn transport(&self, message: impl ToString) -> ClientError {
        ClientError::Transport {
            addr: self.addr.clone(),
            message: message.to_string(),
        }
    }

    async fn connect(&self) -> Result<Conn, ClientError> {
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.transport(e))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(crate::serve::READ_BUFFER_MAX)
            .writev(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport(e))?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        })
        .abort_handle();
        Ok(Conn { sender, task })
    }

    async fn send(&self, raw: RawRequest, how: Exchange<'_>) -> Result<RawResponse, ClientError> {
        // A request abandoned at its deadline drops its connection (held here, not in the
        // pool) and with it the socket; its slot comes back with the permit.
        let _slot = self.slots.acquire().await.map_err(|e| self.transport(e))?;
        let (mut conn, mut reused) = match self.take_idle() {
            Some(c) => (c, true),
            None => (self.connect().await?, false),
        };
        let mut req = Request::builder()
            .method(raw.method)
            .uri(&raw.path)
            .header("host", &self.addr);
        for (k, v) in &raw.headers {
            req = req.header(k, v);
        }
        let body = match how.taken {
            Some(t) => Tracked::counted(raw.body, t),
            None => Tracked::whole(raw.body),
        };
        let mut req = req.body(body).map_err(|e| self.transport(e))?;
        let resp = loop {
            if let Err(e) = conn.sender.ready().await {
                // A kept connection the node has closed since (its idle timeout).
                if reused {
                    conn = self.connect().await?;
                    reused = false;
                    continue;
                }
                return Err(self.transport(e));
            }
            let sent = conn.sender.try_send_request(req);
            match crate::busy::spin_wait(sent, how.spin, how.idle).await {
                Ok(resp) => break resp,
                // A kept connection the node closed (its idle timeout) just as this request
                // went out, before any of it was written: once more on a new connection.
                Err(mut e) => match reused.then(|| e.take_message()).flatten() {
                    Some(unsent) => {
                        req = unsent;
                        conn = self.connect().await?;
                        reused = false;
                    }
                    None => return Err(self.transport(e.into_error())),
                },
            }
        };
        let status = resp.status().as_u16();
        let declared = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let limit = how.limit;
        let body = read_body(resp.into_body(), declared, how.spin, limit, how.admit)
            .await
            .map_err(|e| match e {
                ReadError::Http(e) => self.transport(e),
                ReadError::TooLarge(size) => ClientError::TooLarge {
                    addr: self.addr.clone(),
                    limit,
                    size,
                },
            })?;
        self.keep(conn);
        Ok(RawResponse { status, body })
    }
}

impl Link for HttpLink {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn exchange<'a>(&'a self, raw: RawRequest, how: Exchange<'a>) -> LinkFuture<'a> {
        Box::pin(self.send(raw, how))
    }
}

/// A signed connection to one node, over any [`Link`].
pub struct NodeClient {
    link: Box<dyn Link>,
    key: KeyPair,
    /// The key shared with the node, when its key is known: requests then carry a MAC, not a
    /// signature ([`NodeClient::with_node_key`]).
    session: Option<tenet_proto::auth::SessionKey>,
    busy_poll: Duration,
    timeout: Duration,
    json_limit: u64,
    blob_limit: u64,
}

/// How long a client spins waiting for an answer before sleeping (`busy`): a tiny job's
/// answer comes back well within it.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(200);

/// How long a call may take unless the client or the call says otherwise: a backstop for
/// large uploads on slow links; callers that know better pass [`Bounds`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The largest JSON answer read by default (a node's own default request limit).
pub const DEFAULT_JSON_ANSWER_BYTES: u64 = 64 << 20;

/// The largest blob or tensor answer read by default: a node's default largest blob and a
/// tensor blob's longest header.
pub const DEFAULT_BLOB_ANSWER_BYTES: u64 =
    (2 << 30) + tenet_proto::tensor::MAX_TYPE_TEXT as u64 + 1;

/// The most a reveal's answer can be for a graph with `outputs` outputs: its inline outputs
/// (at most [`tenet_proto::wire::INLINE_OUTPUT_BYTES`] in all, hex-encoded, each keyed by its
/// hash) and, per output, a name, a hash and a type, with room for the JSON around them. What
/// a coordinator passes as [`Bounds::max_answer_bytes`] to [`NodeClient::reveal_within`].
pub fn reveal_answer_limit(outputs: usize) -> u64 {
    // A name, a type, and an inline blob's header in hex; a hash is 64 hex digits, twice per
    // output (its reference and its blob's key).
    let ty = tenet_proto::tensor::MAX_TYPE_TEXT;
    let per_output = (tenet_ir::MAX_NAME_LEN + ty + 2 * (ty + 1) + 2 * 64 + 128) as u64;
    2 * tenet_proto::wire::INLINE_OUTPUT_BYTES as u64
        + (64 << 10)
        + per_output.saturating_mul(outputs as u64)
}

/// `http://host:port` or `host:port` → `host:port`.
pub fn authority(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    (!rest.is_empty() && !rest.contains('/') && rest.contains(':')).then(|| rest.to_string())
}

impl NodeClient {
    /// A client for the node at `url` over HTTP, signing as `key`. Connects on first use.
    pub fn new(url: &str, key: KeyPair) -> Result<NodeClient, ClientError> {
        Ok(NodeClient::over(Box::new(HttpLink::new(url)?), key))
    }

    /// [`NodeClient::new`] carrying up to `connections` requests at once, each on a kept
    /// connection of its own (a coordinator's client for a node it sends many jobs).
    pub fn pooled(url: &str, key: KeyPair, connections: usize) -> Result<NodeClient, ClientError> {
        Ok(NodeClient::over(
            Box::new(HttpLink::pooled(url, connections)?),
            key,
        ))
    }

    /// A client for the node at the other end of `link`, signing as `key`.
    pub fn over(link: Box<dyn Link>, key: KeyPair) -> NodeClient {
        NodeClient {
            link,
            key,
            session: None,
            busy_poll: DEFAULT_BUSY_POLL,
            timeout: DEFAULT_TIMEOUT,
            json_limit: DEFAULT_JSON_ANSWER_BYTES,
            blob_limit: DEFAULT_BLOB_ANSWER_BYTES,
        }
    }

    /// Prove requests to the node whose key is `node` with a MAC under the key the two share
    /// (a microsecond each side) instead of an Ed25519 signature (~20 µs to make, ~40 µs to
    /// check). A node whose key is not `node` refuses them. Unchanged for a key that is no
    /// usable curve point.
    pub fn with_node_key(mut self, node: &PublicKey) -> NodeClient {
        self.session = self.key.session_key(node);
        self
    }

    /// Give every call without its own [`Bounds`] at most `timeout` [default: 600 s].
    pub fn with_timeout(mut self, timeout: Duration) -> NodeClient {
        self.timeout = timeout;
        self
    }

    /// Read JSON answers of at most `json` bytes and blob/tensor answers (and those of raw
    /// `send`s) of at most `blob` bytes, unless a call passes its own [`Bounds`]
    /// [default: 64 MiB and 2 GiB plus a tensor header].
    pub fn with_answer_limits(mut self, json: u64, blob: u64) -> NodeClient {
        self.json_limit = json;
        self.blob_limit = blob;
        self
    }

    /// The bounds of a call with the client's defaults and answers up to `limit` bytes.
    fn bounds(&self, limit: u64) -> Bounds {
        Bounds::new(self.timeout, limit)
    }

    /// Spin at most `window` waiting for each answer before sleeping (zero: sleep at once).
    pub fn with_busy_poll(mut self, window: Duration) -> NodeClient {
        self.busy_poll = window;
        self
    }

    /// Where the node is: `http://host:port`, or `p2p:PEER_ID` over libp2p.
    pub fn url(&self) -> String {
        self.link.url()
    }

    pub fn key(&self) -> &KeyPair {
        &self.key
    }

    /// The signature headers for a request.
    pub fn auth_headers(&self, method: &Method, path: &str, body: &[u8]) -> Vec<(String, String)> {
        self.auth_headers_hashed(method, path, &crate::digest::hash(body))
    }

    /// [`NodeClient::auth_headers`] for a body whose hash is already known.
    fn auth_headers_hashed(
        &self,
        method: &Method,
        path: &str,
        body_hash: &Hash,
    ) -> Vec<(String, String)> {
        let (now, nonce) = (tenet_proto::unix_now(), random_bytes());
        match &self.session {
            Some(session) => {
                self.key
                    .mac_request(session, method.as_str(), path, body_hash, now, nonce)
            }
            None => self
                .key
                .sign_request(method.as_str(), path, body_hash, now, nonce),
        }
        .to_pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A signed request, ready to send.
    pub fn signed(&self, method: Method, path: &str, body: impl Into<Bytes>) -> RawRequest {
        let body = body.into();
        RawRequest {
            headers: self.auth_headers(&method, path, &body),
            method,
            path: path.to_string(),
            body,
        }
    }

    /// Send a request as it is (the client's default timeout and blob answer limit).
    pub async fn send(&self, raw: RawRequest) -> Result<RawResponse, ClientError> {
        self.send_counting(raw, None).await
    }

    /// Send a request as it is, adding to `taken` the body bytes as the connection takes them.
    pub async fn send_counting(
        &self,
        raw: RawRequest,
        taken: Option<Arc<AtomicU64>>,
    ) -> Result<RawResponse, ClientError> {
        self.exchange(raw, taken, self.bounds(self.blob_limit), &mut |_| true)
            .await
    }

    /// Send a request as it is, within `bounds`.
    pub async fn send_within(
        &self,
        raw: RawRequest,
        bounds: Bounds,
    ) -> Result<RawResponse, ClientError> {
        self.exchange(raw, None, bounds, &mut |_| true).await
    }

    /// One request and its answer, within `bounds`; `admit` is asked about each piece of the
    /// answer's body (its length) before it is kept, and stops the read by saying no.
    pub async fn exchange(
        &self,
        raw: RawRequest,
        taken: Option<Arc<AtomicU64>>,
        bounds: Bounds,
        admit: &mut (dyn FnMut(u64) -> bool + Send),
    ) -> Result<RawResponse, ClientError> {
        let deadline = tokio::time::Instant::from_std(bounds.deadline);
        let limit_ms = bounds
            .deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        // While the answer is on its way, make the nonce for the next request's signature
        // (none is needed when requests carry MACs).
        let key = (self.session.is_none()).then_some(&self.key);
        let idle = move || {
            if let Some(key) = key {
                key.refill_nonce(random_bytes());
            }
        };
        let how = Exchange {
            taken,
            limit: bounds.max_answer_bytes,
            admit,
            spin: self.busy_poll,
            idle: &idle,
        };
        match tokio::time::timeout_at(deadline, self.link.exchange(raw, how)).await {
            Ok(answer) => answer,
            // The connection was taken out of the slot for this call: dropping the call
            // dropped it, and with it the socket.
            Err(_) => Err(ClientError::Timeout {
                addr: self.link.url(),
                limit_ms,
            }),
        }
    }

    /// Sign and send; a 2xx answer's body, or the node's error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Bytes, ClientError> {
        self.call_within(method, path, body, self.bounds(self.blob_limit))
            .await
    }

    /// [`NodeClient::call`] within `bounds`.
    pub async fn call_within(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
        bounds: Bounds,
    ) -> Result<Bytes, ClientError> {
        self.send_within(self.signed(method, path, body), bounds)
            .await?
            .into_result()
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<T, ClientError> {
        let bounds = self.bounds(self.json_limit);
        parse_answer(&self.call_within(method, path, body, bounds).await?)
    }

    async fn call_json_within<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
        bounds: Bounds,
    ) -> Result<T, ClientError> {
        parse_answer(&self.call_within(method, path, body, bounds).await?)
    }

    fn json<T: serde::Serialize>(value: &T) -> Bytes {
        Bytes::from(serde_json::to_vec(value).unwrap_or_default())
    }

    pub async fn info(&self) -> Result<NodeInfo, ClientError> {
        self.call_json(Method::GET, "/v1/info", Bytes::new()).await
    }

    /// Whether the node has blob `hash` (its size if so).
    pub async fn has_blob(&self, hash: &Hash) -> Result<Option<u64>, ClientError> {
        let r = self
            .send(self.signed(Method::HEAD, &format!("/v1/blobs/{hash}"), Bytes::new()))
            .await?;
        Ok((r.status == 200).then_some(0))
    }

    /// Upload `bytes` as a blob unless the node already has it.
    pub async fn put_blob(&self, bytes: impl Into<Bytes>) -> Result<BlobStored, ClientError> {
        let bytes = bytes.into();
        let hash = crate::digest::hash(&bytes);
        if self.has_blob(&hash).await?.is_some() {
            return Ok(BlobStored {
                hash,
                size: bytes.len() as u64,
                existed: true,
            });
        }
        self.put_hashed(bytes, &hash).await
    }

    /// Upload `bytes` as a blob without asking first whether the node has it.
    pub async fn upload_blob(&self, bytes: impl Into<Bytes>) -> Result<BlobStored, ClientError> {
        let bytes = bytes.into();
        let hash = crate::digest::hash(&bytes);
        self.put_hashed(bytes, &hash).await
    }

    /// PUT a blob whose hash is known: its address is also the signed body hash, so the bytes
    /// are hashed once, not twice.
    async fn put_hashed(&self, bytes: Bytes, hash: &Hash) -> Result<BlobStored, ClientError> {
        let path = format!("/v1/blobs/{hash}");
        let raw = RawRequest {
            headers: self.auth_headers_hashed(&Method::PUT, &path, hash),
            method: Method::PUT,
            path,
            body: bytes,
        };
        let bounds = self.bounds(self.json_limit);
        parse_answer(&self.send_within(raw, bounds).await?.into_result()?)
    }

    /// Keep blob `hash` through evictions and restarts (`false`: let it be evicted again).
    pub async fn pin(&self, hash: &Hash, pinned: bool) -> Result<(), ClientError> {
        let method = if pinned { Method::PUT } else { Method::DELETE };
        self.call(method, &format!("/v1/pins/{hash}"), Bytes::new())
            .await
            .map(|_| ())
    }

    pub async fn get_blob(&self, hash: &Hash) -> Result<Bytes, ClientError> {
        self.get_blob_within(hash, self.bounds(self.blob_limit))
            .await
    }

    /// A blob, read whole by `bounds.deadline` and refused beyond `bounds.max_answer_bytes`
    /// (for a job output: `tenet_proto::tensor::blob_size` of the graph's output type).
    pub async fn get_blob_within(&self, hash: &Hash, bounds: Bounds) -> Result<Bytes, ClientError> {
        self.call_within(
            Method::GET,
            &format!("/v1/blobs/{hash}"),
            Bytes::new(),
            bounds,
        )
        .await
    }

    pub async fn run_job(&self, job: &RunJob) -> Result<Committed, ClientError> {
        self.call_json(Method::POST, "/v1/jobs", Self::json(job))
            .await
    }

    /// [`NodeClient::run_job`] (which answers once the job has committed) within `bounds`.
    pub async fn run_job_within(
        &self,
        job: &RunJob,
        bounds: Bounds,
    ) -> Result<Committed, ClientError> {
        self.call_json_within(Method::POST, "/v1/jobs", Self::json(job), bounds)
            .await
    }

    pub async fn job_status(&self, id: &str) -> Result<JobStatus, ClientError> {
        self.call_json(Method::GET, &format!("/v1/jobs/{id}"), Bytes::new())
            .await
    }

    /// [`NodeClient::job_status`] within `bounds`.
    pub async fn job_status_within(
        &self,
        id: &str,
        bounds: Bounds,
    ) -> Result<JobStatus, ClientError> {
        self.call_json_within(Method::GET, &format!("/v1/jobs/{id}"), Bytes::new(), bounds)
            .await
    }

    pub async fn cancel_job(&self, id: &str) -> Result<JobStatus, ClientError> {
        self.call_json(Method::DELETE, &format!("/v1/jobs/{id}"), Bytes::new())
            .await
    }

    pub async fn reveal(&self, id: &str) -> Result<Revealed, ClientError> {
        self.call_json(Method::POST, &format!("/v1/jobs/{id}/reveal"), Bytes::new())
            .await
    }

    /// A job's reveal within `bounds` (answer limit: [`reveal_answer_limit`] of the graph's
    /// output count).
    pub async fn reveal_within(&self, id: &str, bounds: Bounds) -> Result<Revealed, ClientError> {
        self.call_json_within(
            Method::POST,
            &format!("/v1/jobs/{id}/reveal"),
            Bytes::new(),
            bounds,
        )
        .await
    }

    /// Job `id`'s trace root (the node computes its trace if it has not yet), for a dispute.
    pub async fn trace_root(&self, id: &str) -> Result<TraceRoot, ClientError> {
        self.call_json(Method::POST, &format!("/v1/jobs/{id}/trace"), Bytes::new())
            .await
    }

    /// The children of tree node `index` at `depth` in job `id`'s trace tree.
    pub async fn trace_children(
        &self,
        id: &str,
        depth: u32,
        index: u64,
    ) -> Result<(Hash, Hash), ClientError> {
        let c: TraceChildren = self
            .call_json(
                Method::GET,
                &format!("/v1/jobs/{id}/trace/{depth}/{index}"),
                Bytes::new(),
            )
            .await?;
        Ok((c.left, c.right))
    }

    /// Leaf `leaf` of job `id`'s trace: its proof, and the node's value (at most `max_bytes`).
    pub async fn trace_leaf(
        &self,
        id: &str,
        leaf: u64,
        max_bytes: u64,
    ) -> Result<(tenet_proto::trace::Proof, tenet_ir::HostTensor), ClientError> {
        let bounds = self.bounds(max_bytes.saturating_mul(2).saturating_add(64 << 10));
        let l: TraceLeaf = self
            .call_json_within(
                Method::GET,
                &format!("/v1/jobs/{id}/trace/leaf/{leaf}"),
                Bytes::new(),
                bounds,
            )
            .await?;
        let bad = |message: String| ClientError::Unexpected {
            status: 200,
            message,
        };
        let blob = tenet_proto::from_hex(&l.value)
            .ok_or_else(|| bad("a trace leaf's value is not hex".into()))?;
        let value = tenet_proto::tensor::decode(&blob).map_err(|e| bad(e.to_string()))?;
        Ok((l.proof, value))
    }

    pub async fn create_session(&self) -> Result<String, ClientError> {
        let s: SessionCreated = self
            .call_json(Method::POST, "/v1/sessions", Bytes::new())
            .await?;
        Ok(s.session)
    }

    pub async fn delete_session(&self, sid: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/v1/sessions/{sid}"), Bytes::new())
            .await
            .map(|_| ())
    }

    /// Upload a tensor blob into a session under `name`.
    pub async fn put_tensor(
        &self,
        sid: &str,
        name: &str,
        blob: impl Into<Bytes>,
    ) -> Result<Resident, ClientError> {
        self.call_json(
            Method::PUT,
            &format!("/v1/sessions/{sid}/tensors/{name}"),
            blob,
        )
        .await
    }

    pub async fn get_tensor(&self, sid: &str, name: &str) -> Result<Bytes, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/sessions/{sid}/tensors/{name}"),
            Bytes::new(),
        )
        .await
    }

    pub async fn free_tensor(&self, sid: &str, name: &str) -> Result<(), ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/sessions/{sid}/tensors/{name}"),
            Bytes::new(),
        )
        .await
        .map(|_| ())
    }

    /// Run a batch (its answer may carry tensors, so it is read under the blob limit).
    pub async fn batch(&self, sid: &str, batch: &Batch) -> Result<BatchResults, ClientError> {
        self.batch_within(sid, batch, self.bounds(self.blob_limit))
            .await
    }

    /// [`NodeClient::batch`] within `bounds` (a caller that knows how large the answer can
    /// be, and how long it should take).
    pub async fn batch_within(
        &self,
        sid: &str,
        batch: &Batch,
        bounds: Bounds,
    ) -> Result<BatchResults, ClientError> {
        self.call_json_within(
            Method::POST,
            &format!("/v1/sessions/{sid}/batch"),
            Self::json(batch),
            bounds,
        )
        .await
    }

    /// A resident tensor's (or stored blob's) bytes by hash.
    pub async fn tensor_by_hash(&self, hash: &Hash) -> Result<Bytes, ClientError> {
        self.tensor_by_hash_within(hash, self.bounds(self.blob_limit))
            .await
    }

    /// [`NodeClient::tensor_by_hash`] within `bounds`.
    pub async fn tensor_by_hash_within(
        &self,
        hash: &Hash,
        bounds: Bounds,
    ) -> Result<Bytes, ClientError> {
        self.call_within(
            Method::GET,
            &format!("/v1/tensors/{hash}"),
            Bytes::new(),
            bounds,
        )
        .await
    }

    /// Prometheus text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let b = self.call(Method::GET, "/metrics", Bytes::new()).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}

/// A successful answer's JSON body.
fn parse_answer<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Unexpected {
        status: 200,
        message: format!("the answer does not parse: {e}"),
    })
}

/// Why an answer's body was not read whole.
enum ReadError {
    Http(hyper::Error),
    /// Longer than the call's limit (or than its caller would take): the size declared or
    /// received when reading stopped.
    TooLarge(u64),
}

impl From<hyper::Error> for ReadError {
    fn from(e: hyper::Error) -> ReadError {
        ReadError::Http(e)
    }
}

/// A response body as one buffer, of at most `limit` bytes, each piece first shown to
/// `admit`. A large one (a blob) is copied frame by frame into a buffer from the recycle
/// cache, which it returns to when the caller drops it: collecting the frames first would make
/// hyper allocate, and fault in, fresh memory for every frame and then again for the joined
/// copy. A body in one frame (most JSON answers) is kept as it came.
async fn read_body(
    body: hyper::body::Incoming,
    declared: Option<u64>,
    window: Duration,
    limit: u64,
    admit: &mut (dyn FnMut(u64) -> bool + Send),
) -> Result<Bytes, ReadError> {
    if let Some(n) = declared.filter(|&n| n > limit) {
        return Err(ReadError::TooLarge(n));
    }
    let mut body = body;
    let mut received = 0u64;
    let mut take = |n: usize| {
        received += n as u64;
        if received > limit || !admit(n as u64) {
            return Err(ReadError::TooLarge(received));
        }
        Ok(())
    };
    // A declared length sizes the buffer only up to a bound (and never past the limit).
    let Some(len) = declared
        .map(|n| n as usize)
        .filter(|n| (recycle::MIN_BYTES..=MAX_RESERVE).contains(n))
    else {
        let mut first: Option<Bytes> = None;
        let mut joined: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            take(data.len())?;
            match first.take() {
                None if joined.is_empty() => first = Some(data),
                earlier => {
                    if let Some(e) = earlier {
                        joined.extend_from_slice(&e);
                    }
                    joined.extend_from_slice(&data);
                }
            }
        }
        return Ok(first.unwrap_or_else(|| Bytes::from(joined)));
    };
    let mut out = recycle::take(len).unwrap_or_default();
    out.clear();
    out.reserve_exact(len);
    // A large body arrives in a few hundred socket reads: sleeping between them costs a
    // wake-up each (1024² f32 output: 1.7 ms to fetch instead of 2.1 on this project's VM).
    while let Some(frame) = crate::busy::spin_wait(body.frame(), window, || {}).await {
        if let Ok(data) = frame?.into_data() {
            take(data.len())?;
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from_owner(Recycled(out)))
}

/// The most a declared Content-Length reserves up front.
const MAX_RESERVE: usize = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_proto::commit::{OutputRef, Reveal};

    /// The largest reveal a node can send fits the limit a coordinator passes for it.
    #[test]
    fn the_largest_reveal_fits_its_answer_limit() {
        for outputs in [1usize, 3, 64] {
            let refs: Vec<OutputRef> = (0..outputs)
                .map(|i| OutputRef {
                    name: format!("{i:x<width$}", width = tenet_ir::MAX_NAME_LEN),
                    hash: Hash::of(&i.to_le_bytes()),
                    ty: "f".repeat(tenet_proto::tensor::MAX_TYPE_TEXT),
                })
                .collect();
            // All of the inline budget, split over the outputs, each with the longest header.
            let data = tenet_proto::wire::INLINE_OUTPUT_BYTES / outputs;
            let blobs = refs
                .iter()
                .map(|r| {
                    let blob = vec![0xab; data + tenet_proto::tensor::MAX_TYPE_TEXT + 1];
                    (r.hash, tenet_proto::to_hex(&blob))
                })
                .collect();
            let revealed = Revealed {
                reveal: Reveal {
                    job_id: "j".repeat(64),
                    outputs: refs,
                    output_hash: Hash::of(b"o"),
                    salt: Hash::of(b"s"),
                },
                blobs,
            };
            let size = serde_json::to_vec(&revealed).unwrap().len() as u64;
            assert!(size <= reveal_answer_limit(outputs), "{outputs}: {size}");
        }
    }
}

/// A node's answer to `POST /v1/jobs/{id}/trace`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct TraceRoot {
    pub root: Hash,
    pub count: u64,
    pub depth: u32,
}

#[derive(serde::Deserialize)]
struct TraceChildren {
    left: Hash,
    right: Hash,
}

#[derive(serde::Deserialize)]
struct TraceLeaf {
    proof: tenet_proto::trace::Proof,
    value: String,
}
