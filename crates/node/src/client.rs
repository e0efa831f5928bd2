//! A client for the node API: signs every request with its key and keeps one HTTP/1.1
//! connection open (reconnecting when the node closed it). One client carries one request at
//! a time; open several for concurrency. Used by the CLI, the tests, the benchmark, and nodes
//! pulling tensors from peers.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tenet_ir::recycle::{self, Recycled};
use tenet_proto::auth::KeyPair;
use tenet_proto::wire::{
    Batch, BatchResults, BlobStored, Committed, JobStatus, NodeInfo, Resident, Revealed, RunJob,
    SessionCreated,
};
use tenet_proto::{ApiError, Hash};
use tokio::sync::Mutex;

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

/// A signed connection to one node.
pub struct NodeClient {
    addr: String,
    key: KeyPair,
    conn: Mutex<Option<SendRequest<Tracked>>>,
    busy_poll: Duration,
}

/// How long a client spins waiting for an answer before sleeping (`busy`): a tiny job's
/// answer comes back well within it.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(200);

/// `http://host:port` or `host:port` → `host:port`.
fn authority(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    (!rest.is_empty() && !rest.contains('/') && rest.contains(':')).then(|| rest.to_string())
}

impl NodeClient {
    /// A client for the node at `url`, signing as `key`. Connects on first use.
    pub fn new(url: &str, key: KeyPair) -> Result<NodeClient, ClientError> {
        let addr = authority(url).ok_or_else(|| ClientError::BadUrl(url.to_string()))?;
        Ok(NodeClient {
            addr,
            key,
            conn: Mutex::new(None),
            busy_poll: DEFAULT_BUSY_POLL,
        })
    }

    /// Spin at most `window` waiting for each answer before sleeping (zero: sleep at once).
    pub fn with_busy_poll(mut self, window: Duration) -> NodeClient {
        self.busy_poll = window;
        self
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn key(&self) -> &KeyPair {
        &self.key
    }

    fn transport(&self, message: impl ToString) -> ClientError {
        ClientError::Transport {
            addr: self.addr.clone(),
            message: message.to_string(),
        }
    }

    async fn connect(&self) -> Result<SendRequest<Tracked>, ClientError> {
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.transport(e))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(crate::http::READ_BUFFER_MAX)
            .writev(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport(e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
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
        self.key
            .sign_request(
                method.as_str(),
                path,
                body_hash,
                tenet_proto::unix_now(),
                random_bytes(),
            )
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

    /// Send a request as it is.
    pub async fn send(&self, raw: RawRequest) -> Result<RawResponse, ClientError> {
        self.send_counting(raw, None).await
    }

    /// Send a request as it is, adding to `taken` the body bytes as the connection takes them.
    pub async fn send_counting(
        &self,
        raw: RawRequest,
        taken: Option<Arc<AtomicU64>>,
    ) -> Result<RawResponse, ClientError> {
        let mut guard = self.conn.lock().await;
        let mut sender = match guard.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        sender.ready().await.map_err(|e| self.transport(e))?;
        let mut req = Request::builder()
            .method(raw.method)
            .uri(&raw.path)
            .header("host", &self.addr);
        for (k, v) in &raw.headers {
            req = req.header(k, v);
        }
        let body = match taken {
            Some(t) => Tracked::counted(raw.body, t),
            None => Tracked::whole(raw.body),
        };
        let req = req.body(body).map_err(|e| self.transport(e))?;
        // While the answer is on its way, make the nonce for the next request's signature.
        let key = &self.key;
        let refill = || {
            key.refill_nonce(random_bytes());
        };
        let resp = crate::busy::spin_wait(sender.send_request(req), self.busy_poll, refill)
            .await
            .map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        let declared = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let body = read_body(resp.into_body(), declared, self.busy_poll)
            .await
            .map_err(|e| self.transport(e))?;
        *guard = Some(sender);
        Ok(RawResponse { status, body })
    }

    /// Sign and send; a 2xx answer's body, or the node's error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<Bytes, ClientError> {
        self.send(self.signed(method, path, body))
            .await?
            .into_result()
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<T, ClientError> {
        parse_answer(&self.call(method, path, body).await?)
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
        parse_answer(&self.send(raw).await?.into_result()?)
    }

    /// Keep blob `hash` through evictions and restarts (`false`: let it be evicted again).
    pub async fn pin(&self, hash: &Hash, pinned: bool) -> Result<(), ClientError> {
        let method = if pinned { Method::PUT } else { Method::DELETE };
        self.call(method, &format!("/v1/pins/{hash}"), Bytes::new())
            .await
            .map(|_| ())
    }

    pub async fn get_blob(&self, hash: &Hash) -> Result<Bytes, ClientError> {
        self.call(Method::GET, &format!("/v1/blobs/{hash}"), Bytes::new())
            .await
    }

    pub async fn run_job(&self, job: &RunJob) -> Result<Committed, ClientError> {
        self.call_json(Method::POST, "/v1/jobs", Self::json(job))
            .await
    }

    pub async fn job_status(&self, id: &str) -> Result<JobStatus, ClientError> {
        self.call_json(Method::GET, &format!("/v1/jobs/{id}"), Bytes::new())
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

    pub async fn batch(&self, sid: &str, batch: &Batch) -> Result<BatchResults, ClientError> {
        self.call_json(
            Method::POST,
            &format!("/v1/sessions/{sid}/batch"),
            Self::json(batch),
        )
        .await
    }

    /// A resident tensor's (or stored blob's) bytes by hash.
    pub async fn tensor_by_hash(&self, hash: &Hash) -> Result<Bytes, ClientError> {
        self.call(Method::GET, &format!("/v1/tensors/{hash}"), Bytes::new())
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

/// A response body as one buffer. A large one (a blob) is copied frame by frame into a buffer
/// from the recycle cache, which it returns to when the caller drops it: collecting the frames
/// first would make hyper allocate, and fault in, fresh memory for every frame and then again
/// for the joined copy.
async fn read_body(
    body: hyper::body::Incoming,
    declared: Option<usize>,
    window: Duration,
) -> Result<Bytes, hyper::Error> {
    // A declared length sizes the buffer only up to a bound: a lying header must not make the
    // client reserve without limit (a body longer than declared is an HTTP error in hyper).
    let Some(len) = declared.filter(|n| (recycle::MIN_BYTES..=MAX_RESERVE).contains(n)) else {
        return Ok(body.collect().await?.to_bytes());
    };
    let mut out = recycle::take(len).unwrap_or_default();
    out.clear();
    out.reserve_exact(len);
    let mut body = body;
    // A large body arrives in a few hundred socket reads: sleeping between them costs a
    // wake-up each (1024² f32 output: 1.7 ms to fetch instead of 2.1 on this project's VM).
    while let Some(frame) = crate::busy::spin_wait(body.frame(), window, || {}).await {
        if let Ok(data) = frame?.into_data() {
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from_owner(Recycled(out)))
}

/// The most a declared Content-Length reserves up front.
const MAX_RESERVE: usize = 1 << 30;
