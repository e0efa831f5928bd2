//! What travels on `/tenet/node/1`, the request-response protocol that carries the node API
//! between peers: a node API request as it would go over HTTP — method, path, the signature
//! headers, the body — and the answer's status and body, in CBOR. The signature covers the
//! method, the path and the body, exactly as over HTTP, so the hosting node's gate checks a
//! request the same whichever way it came. Everything here is bounded before it is used.

use bytes::Bytes;
use libp2p::StreamProtocol;
use tenet_net::{Method, RawRequest, RawResponse};

/// The node API over libp2p.
pub const NODE_PROTOCOL: StreamProtocol = StreamProtocol::new("/tenet/node/1");

/// The most a request may be on the wire (a node's default request limit and room for the
/// headers): larger inputs go as blobs in pieces of at most this.
pub const MAX_REQUEST_BYTES: u64 = (64 << 20) + (64 << 10);

/// The most an answer may be on the wire (a job's outputs beyond it are fetched as blobs).
pub const MAX_ANSWER_BYTES: u64 = (64 << 20) + (64 << 10);

/// Headers a request may carry (the signature needs five).
pub const MAX_HEADERS: usize = 16;

/// A header's name and value, each at most this long.
pub const MAX_HEADER_BYTES: usize = 512;

/// A path at most this long.
pub const MAX_PATH_BYTES: usize = 2048;

/// Bytes that serialize as one CBOR byte string (not an array of numbers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blob(pub Bytes);

impl serde::Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Blob, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(Bytes::from(v)))
            }
        }
        d.deserialize_bytes(Visit)
    }
}

/// A node API request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Blob,
}

/// Its answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Answer {
    pub status: u16,
    pub body: Blob,
}

/// Why a request from a peer was refused before it reached the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("`{0}` is not a method of the node API")]
    Method(String),
    #[error("the path is {0} bytes; at most {MAX_PATH_BYTES}")]
    Path(usize),
    #[error("{0} headers; at most {MAX_HEADERS}")]
    Headers(usize),
    #[error("a header is longer than {MAX_HEADER_BYTES} bytes")]
    Header,
}

impl Request {
    /// The request as it goes out.
    pub fn from_raw(raw: RawRequest) -> Request {
        Request {
            method: raw.method.as_str().to_string(),
            path: raw.path,
            headers: raw.headers,
            body: Blob(raw.body),
        }
    }

    /// The request as the node answers it, checked against the bounds first.
    pub fn into_raw(self) -> Result<RawRequest, WireError> {
        let method = match self.method.as_str() {
            "GET" => Method::GET,
            "PUT" => Method::PUT,
            "POST" => Method::POST,
            "DELETE" => Method::DELETE,
            "HEAD" => Method::HEAD,
            _ => {
                let mut m = self.method;
                m.truncate(16);
                return Err(WireError::Method(m));
            }
        };
        if self.path.len() > MAX_PATH_BYTES || !self.path.starts_with('/') {
            return Err(WireError::Path(self.path.len()));
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(WireError::Headers(self.headers.len()));
        }
        if self
            .headers
            .iter()
            .any(|(k, v)| k.len() > MAX_HEADER_BYTES || v.len() > MAX_HEADER_BYTES)
        {
            return Err(WireError::Header);
        }
        Ok(RawRequest {
            method,
            path: self.path,
            headers: self.headers,
            body: self.body.0,
        })
    }
}

impl Answer {
    pub fn from_raw(raw: RawResponse) -> Answer {
        Answer {
            status: raw.status,
            body: Blob(raw.body),
        }
    }

    /// An error answer made here (refused before the node saw the request).
    pub fn error(e: &tenet_proto::ApiError) -> Answer {
        Answer {
            status: e.http_status(),
            body: Blob(Bytes::from(e.to_json())),
        }
    }
}

/// Bytes of inbound requests one peer reads at once, over every stream from every peer: a
/// flood of large requests waits for nothing and holds no more than this.
pub const READ_BUDGET_BYTES: u64 = 256 << 20;

type Cbor = libp2p::request_response::cbor::codec::Codec<Request, Answer>;

/// The codec both sides use on `/tenet/node/1`: CBOR within the size limits, and inbound
/// requests read against a budget shared by every stream ([`READ_BUDGET_BYTES`]); a request
/// that would overdraw it is cut off (its stream fails) rather than buffered.
#[derive(Clone)]
pub struct NodeCodec {
    inner: Cbor,
    reading: std::sync::Arc<std::sync::atomic::AtomicU64>,
    budget: u64,
}

impl Default for NodeCodec {
    fn default() -> Self {
        NodeCodec {
            inner: Cbor::default()
                .set_request_size_maximum(MAX_REQUEST_BYTES)
                .set_response_size_maximum(MAX_ANSWER_BYTES),
            reading: Default::default(),
            budget: READ_BUDGET_BYTES,
        }
    }
}

impl NodeCodec {
    /// A codec with a smaller read budget (for tests).
    pub fn with_budget(budget: u64) -> Self {
        NodeCodec {
            budget,
            ..NodeCodec::default()
        }
    }

    /// Bytes of requests being read now.
    pub fn reading(&self) -> u64 {
        self.reading.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Bytes taken from a read budget, given back when dropped.
struct Reserved<'a> {
    from: &'a std::sync::atomic::AtomicU64,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.from
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl libp2p::request_response::Codec for NodeCodec {
    type Protocol = StreamProtocol;
    type Request = Request;
    type Response = Answer;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Request>
    where
        T: libp2p::futures::AsyncRead + Unpin + Send,
    {
        use libp2p::futures::AsyncReadExt as _;
        use std::sync::atomic::Ordering;
        let mut reserved = Reserved {
            from: &self.reading,
            bytes: 0,
        };
        let mut frame = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = io.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            let now = self.reading.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
            reserved.bytes += n as u64;
            if now > self.budget {
                return Err(std::io::Error::other(
                    "this peer is reading as many request bytes as it will hold: try again later",
                ));
            }
            if frame.len() + n > MAX_REQUEST_BYTES as usize {
                return Err(std::io::Error::other(format!(
                    "a request may be at most {MAX_REQUEST_BYTES} bytes"
                )));
            }
            frame.extend_from_slice(&chunk[..n]);
        }
        // Decoded in place: the bytes counted against the budget are the only copy.
        cbor4ii::serde::from_slice(&frame)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
    }

    async fn read_response<T>(
        &mut self,
        protocol: &StreamProtocol,
        io: &mut T,
    ) -> std::io::Result<Answer>
    where
        T: libp2p::futures::AsyncRead + Unpin + Send,
    {
        self.inner.read_response(protocol, io).await
    }

    async fn write_request<T>(
        &mut self,
        protocol: &StreamProtocol,
        io: &mut T,
        req: Request,
    ) -> std::io::Result<()>
    where
        T: libp2p::futures::AsyncWrite + Unpin + Send,
    {
        self.inner.write_request(protocol, io, req).await
    }

    async fn write_response<T>(
        &mut self,
        protocol: &StreamProtocol,
        io: &mut T,
        res: Answer,
    ) -> std::io::Result<()>
    where
        T: libp2p::futures::AsyncWrite + Unpin + Send,
    {
        self.inner.write_response(protocol, io, res).await
    }
}

/// The codec both sides use on `/tenet/node/1`.
pub fn codec() -> NodeCodec {
    NodeCodec::default()
}

/// Decode one request as a hosting peer does — a whole substream's bytes through the codec
/// with its limit, then the bounds of [`Request::into_raw`]. What the `p2p_frames` fuzz target
/// and its corpus test drive; never panics.
pub fn decode_request_frame(frame: &[u8]) -> Result<RawRequest, String> {
    use libp2p::request_response::Codec as _;
    use std::future::Future as _;
    let mut codec = codec();
    let mut io = libp2p::futures::io::Cursor::new(frame);
    let protocol = NODE_PROTOCOL;
    let read = codec.read_request(&protocol, &mut io);
    let mut read = std::pin::pin!(read);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match read.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(request)) => request.into_raw().map_err(|e| e.to_string()),
        std::task::Poll::Ready(Err(e)) => Err(e.to_string()),
        // Reading from memory never waits.
        std::task::Poll::Pending => Err("the frame did not decode at once".into()),
    }
}

/// A request as it goes on the wire (for tests and the fuzz corpus).
pub fn encode_request_frame(request: Request) -> Vec<u8> {
    use libp2p::request_response::Codec as _;
    use std::future::Future as _;
    let mut codec = codec();
    let mut io = libp2p::futures::io::Cursor::new(Vec::new());
    let protocol = NODE_PROTOCOL;
    {
        let write = codec.write_request(&protocol, &mut io, request);
        let mut write = std::pin::pin!(write);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = write.as_mut().poll(&mut cx);
    }
    io.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::request_response::Codec as _;

    fn read(codec: &mut NodeCodec, frame: Vec<u8>) -> std::io::Result<Request> {
        let mut io = libp2p::futures::io::Cursor::new(frame);
        libp2p::futures::executor::block_on(codec.read_request(&NODE_PROTOCOL, &mut io))
    }

    #[test]
    fn requests_are_read_against_a_shared_budget() {
        let request = |n: usize| Request {
            method: "PUT".into(),
            path: "/v1/blobs".into(),
            headers: Vec::new(),
            body: Blob(vec![7u8; n].into()),
        };
        let mut codec = NodeCodec::with_budget(1 << 20);
        // Within the budget: read whole, and the budget is given back.
        let got = read(&mut codec, encode_request_frame(request(512 << 10))).unwrap();
        assert_eq!(got.body.0.len(), 512 << 10);
        assert_eq!(codec.reading(), 0);
        // Over it: cut off, and given back all the same.
        let err = read(&mut codec, encode_request_frame(request(2 << 20))).unwrap_err();
        assert!(err.to_string().contains("request bytes"), "{err}");
        assert_eq!(codec.reading(), 0);
        // Another stream's read in progress counts against the same budget.
        let other = codec.clone();
        other
            .reading
            .fetch_add(900 << 10, std::sync::atomic::Ordering::Relaxed);
        assert!(read(&mut codec, encode_request_frame(request(200 << 10))).is_err());
        other
            .reading
            .fetch_sub(900 << 10, std::sync::atomic::Ordering::Relaxed);
        assert!(read(&mut codec, encode_request_frame(request(200 << 10))).is_ok());
    }
}
