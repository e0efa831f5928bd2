//! Serving HTTP the way every tenet service does: the accept loop that bounds what
//! connections may hold before they authenticate (how many, how long a request head may take),
//! request bodies read under a size limit and a pace, and replies (whole, or streamed as
//! server-sent events). The node and the coordinator each keep their own route table on top.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tenet_ir::recycle::{self, Recycled};
use tenet_proto::{ApiError, ErrorCode};
use tokio::net::TcpListener;

use crate::errors::bad_request;

pub type Payload = bytes::buf::Chain<Bytes, Bytes>;

/// What every handler answers.
pub type Reply = Response<ReplyBody>;

/// A reply's body: whole, or streamed as its parts arrive from a channel (server-sent
/// events); the stream ends when the sender is dropped.
pub enum ReplyBody {
    Whole(Full<Payload>),
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
}

impl From<Full<Payload>> for ReplyBody {
    fn from(f: Full<Payload>) -> ReplyBody {
        ReplyBody::Whole(f)
    }
}

impl hyper::body::Body for ReplyBody {
    type Data = Payload;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Payload>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Whole(f) => std::pin::Pin::new(f).poll_frame(cx),
            ReplyBody::Stream(rx) => rx
                .poll_recv(cx)
                .map(|part| part.map(|b| Ok(hyper::body::Frame::data(payload(b))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Whole(f) => f.is_end_stream(),
            ReplyBody::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            ReplyBody::Whole(f) => f.size_hint(),
            ReplyBody::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// A request body as the routes read it: hyper's from a connection, or a whole buffer another
/// transport handed over (a libp2p request).
pub trait RequestBody:
    hyper::body::Body<Data = Bytes, Error: std::fmt::Display> + Unpin + Send + 'static
{
}

impl<T> RequestBody for T where
    T: hyper::body::Body<Data = Bytes, Error: std::fmt::Display> + Unpin + Send + 'static
{
}

/// A payload of one buffer.
pub fn payload(bytes: impl Into<Bytes>) -> Payload {
    bytes.into().chain(Bytes::new())
}

/// A reply body of one buffer.
pub fn body(bytes: impl Into<Bytes>) -> ReplyBody {
    ReplyBody::Whole(Full::new(payload(bytes)))
}

/// The largest read buffer per connection: big bodies arrive in big reads (hyper's default of
/// about 400 KiB makes a 4 MiB upload take several times as long on loopback).
pub const READ_BUFFER_MAX: usize = 4 << 20;

/// How long in-flight requests get to finish once shutdown starts.
const DRAIN: Duration = Duration::from_secs(10);

/// What a connection may hold before and while it sends a request.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Connections served at once. At the cap the connection idle longest (no request in
    /// flight) is asked to close, and the new one waits (in the listen backlog before it is
    /// accepted, then here) until a slot is free.
    pub max_connections: usize,
    /// A connection with no request in flight must start one (send its whole request head)
    /// within this long of opening or of its previous answer, or it is closed: the slow-head
    /// and the keep-alive idle timeout in one; zero: never (not for a server strangers can
    /// reach).
    pub header_timeout: Duration,
    /// How slowly a request body may arrive.
    pub body: BodyPace,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(30),
            body: BodyPace::default(),
        }
    }
}

/// How slowly a request body may arrive before it is dropped.
#[derive(Clone, Copy, Debug)]
pub struct BodyPace {
    /// Longest wait for the next piece of the body (zero: no limit).
    pub idle: Duration,
    /// The fewest bytes a second the body must average, counted from `idle` after it began
    /// (zero: no floor).
    pub min_rate: u64,
}

impl Default for BodyPace {
    fn default() -> BodyPace {
        BodyPace {
            idle: Duration::from_secs(30),
            min_rate: 64 << 10,
        }
    }
}

/// Reads a request body's frames at a pace: one that stalls for `idle`, or falls below
/// `min_rate` once its grace is over, is cut off with an error. For routes that stream a body
/// somewhere instead of collecting it (blob uploads, on the node and the coordinator).
pub struct Paced {
    pace: BodyPace,
    started: tokio::time::Instant,
    /// When the last piece came.
    last: tokio::time::Instant,
    received: u64,
    /// Armed the first time the body makes the reader wait, and moved on only when it goes
    /// off early (the body kept its pace meanwhile): not a timer per piece, which cost a
    /// 4 MiB upload ~1 ms of the node's time.
    alarm: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Paced {
    pub fn new(pace: BodyPace) -> Paced {
        let now = tokio::time::Instant::now();
        Paced {
            pace,
            started: now,
            last: now,
            received: 0,
            alarm: None,
        }
    }

    /// The next piece of data, `None` at the end of the body.
    pub async fn next<B: RequestBody>(&mut self, body: &mut B) -> Result<Option<Bytes>, ApiError> {
        loop {
            let frame = std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(frame) =
                    hyper::body::Body::poll_frame(std::pin::Pin::new(&mut *body), cx)
                {
                    return std::task::Poll::Ready(Ok(frame));
                }
                let Some(due) = self.deadline() else {
                    return std::task::Poll::Pending;
                };
                let alarm = self
                    .alarm
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                while alarm.as_mut().poll(cx).is_ready() {
                    // Gone off: too slow if the deadline as of now has passed too.
                    if tokio::time::Instant::now() >= due {
                        return std::task::Poll::Ready(Err(()));
                    }
                    alarm.as_mut().reset(due);
                }
                std::task::Poll::Pending
            })
            .await
            .map_err(|()| self.too_slow())?;
            let Some(frame) = frame else {
                return Ok(None);
            };
            if let Ok(data) = frame.map_err(truncated)?.into_data() {
                self.received += data.len() as u64;
                self.last = tokio::time::Instant::now();
                return Ok(Some(data));
            }
        }
    }

    /// When the next piece must have come: `idle` after the last one, and no later than the
    /// moment the bytes received so far fall below the floor. `None`: no limit.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        if self.pace.idle.is_zero() {
            return None;
        }
        let mut deadline = self.last.checked_add(self.pace.idle)?;
        if self.pace.min_rate > 0 {
            let ahead = self.received as f64 / self.pace.min_rate as f64;
            let ahead = Duration::try_from_secs_f64(ahead).unwrap_or(Duration::MAX);
            if let Some(due) =
                (self.started.checked_add(self.pace.idle)).and_then(|t| t.checked_add(ahead))
            {
                deadline = deadline.min(due);
            }
        }
        Some(deadline)
    }

    fn too_slow(&self) -> ApiError {
        let secs = self.started.elapsed().as_secs_f64();
        ApiError::new(
            ErrorCode::TruncatedBody,
            format!(
                "the body stalled or arrived too slowly ({} bytes in {secs:.1} s); this server drops a body that sends nothing for {} s or averages under {} bytes/s: send it faster",
                self.received,
                self.pace.idle.as_secs_f64(),
                self.pace.min_rate
            ),
        )
    }
}

/// Serve `listener` until `shutdown` resolves, then stop accepting, let in-flight requests
/// The accept loop every tenet service uses, with the default [`ConnLimits`]: see
/// [`serve_connections_with`].
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    serve_connections_with(listener, ConnLimits::default(), shutdown, handler).await
}

/// One connection's standing: whether a request is in flight on it and when it last did
/// anything, for its idle timeout and for choosing which connection to close at the cap.
struct Slot {
    /// Requests on it from their head's arrival until their answer's body is written.
    in_flight: AtomicU32,
    /// When a request last started or ended on it (or it opened), ns after `epoch`.
    last: AtomicU64,
    epoch: Instant,
    /// Asked to close already: at the cap (gracefully), or idle too long (at once).
    evicted: AtomicBool,
    expired: AtomicBool,
    /// Told when either happens.
    evict: tokio::sync::Notify,
}

impl Slot {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn touch(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }
}

/// The connections being served.
struct Slots {
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    epoch: Instant,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn open(&self) -> (u64, Arc<Slot>) {
        let slot = Arc::new(Slot {
            in_flight: AtomicU32::new(0),
            last: AtomicU64::new(0),
            epoch: self.epoch,
            evicted: AtomicBool::new(false),
            expired: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
        });
        slot.touch();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(id, slot.clone());
        (id, slot)
    }

    fn close(&self, id: u64) {
        lock(&self.open).remove(&id);
    }

    /// Tell every connection that has had no request in flight, nor a request start or end,
    /// for `timeout` to close: it is sending no request head, or one too slowly.
    fn expire_idle(&self, timeout: Duration) {
        let timeout = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let now = self.epoch.elapsed().as_nanos() as u64;
        for s in lock(&self.open).values() {
            if s.in_flight.load(Ordering::Relaxed) == 0
                && now.saturating_sub(s.last.load(Ordering::Relaxed)) >= timeout
                && !s.expired.swap(true, Ordering::Relaxed)
            {
                s.evict.notify_one();
            }
        }
    }

    /// Ask the connection idle longest (no request in flight) to close; false if every
    /// connection is in the middle of a request.
    fn evict_idlest(&self) -> bool {
        let open = lock(&self.open);
        let victim = open
            .values()
            .filter(|s| {
                s.in_flight.load(Ordering::Relaxed) == 0 && !s.evicted.load(Ordering::Relaxed)
            })
            .min_by_key(|s| s.last.load(Ordering::Relaxed));
        match victim {
            Some(s) => {
                s.evicted.store(true, Ordering::Relaxed);
                s.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks a request in flight on its connection while it lives: from its head's arrival until
/// its answer's body has been handed to the connection (or the request is abandoned).
struct InFlight(Arc<Slot>);

impl InFlight {
    fn start(slot: Arc<Slot>) -> InFlight {
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        slot.touch();
        InFlight(slot)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body, keeping its request in flight until hyper has taken all of it.
struct Answer {
    body: ReplyBody,
    _in_flight: InFlight,
}

impl hyper::body::Body for Answer {
    type Data = Payload;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Payload>, Infallible>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The accept loop every tenet service uses: HTTP/1.1 keep-alive connections with large read
/// buffers, each request answered by `handler`, until `shutdown` resolves; then no new
/// connections, and in-flight requests get up to ten seconds. At most
/// `limits.max_connections` are served at once (beyond it the idlest is asked to close and the
/// new one waits for its slot), and a connection with no request in flight that has not
/// started one within `limits.header_timeout` of opening or of its last answer — idle, or
/// sending its request head too slowly — is closed. (Request bodies are paced where they are
/// read: [`collect_body_paced`].)
pub async fn serve_connections_with<F, Fut>(
    listener: TcpListener,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    let cap = limits
        .max_connections
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    let permits = Arc::new(tokio::sync::Semaphore::new(cap));
    let slots = Arc::new(Slots::new());
    let (stop, stopping) = tokio::sync::watch::channel(false);
    if !limits.header_timeout.is_zero() {
        sweep_idle(&slots, limits.header_timeout);
    }
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the cap: make room by closing the idlest connection, and wait for a
                // slot (the listen backlog holds further connections meanwhile).
                slots.evict_idlest();
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = &mut shutdown => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let (id, slot) = slots.open();
        let handler = handler.clone();
        let in_slot = slot.clone();
        let service = hyper::service::service_fn(move |req| {
            let in_flight = InFlight::start(in_slot.clone());
            let reply = handler(req);
            async move {
                let reply = reply.await;
                Ok::<_, Infallible>(reply.map(|body| Answer {
                    body,
                    _in_flight: in_flight,
                }))
            }
        });
        let mut stopping = stopping.clone();
        let slots = slots.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .max_buf_size(READ_BUFFER_MAX)
                .writev(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            // Once asked to close: the request in flight (if any) gets up to `DRAIN`.
            let mut closing: Option<tokio::time::Instant> = None;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = slot.evict.notified() => {
                        if slot.expired.load(Ordering::Relaxed) {
                            // Nothing in flight for the whole timeout: nothing is lost by
                            // dropping it (a request head sent too slowly included).
                            if slot.in_flight.load(Ordering::Relaxed) == 0 {
                                break;
                            }
                            // A request started since the sweep: not idle after all.
                            slot.expired.store(false, Ordering::Relaxed);
                        }
                        if slot.evicted.load(Ordering::Relaxed) && closing.is_none() {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(tokio::time::Instant::now() + DRAIN);
                        }
                    }
                    _ = stopping.wait_for(|s| *s), if closing.is_none() => {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(tokio::time::Instant::now() + DRAIN);
                    }
                    _ = tokio::time::sleep_until(closing.unwrap_or_else(tokio::time::Instant::now)),
                        if closing.is_some() => break,
                }
            }
            slots.close(id);
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let _ = tokio::time::timeout(DRAIN, permits.acquire_many(cap as u32)).await;
}

/// Close the connections idle for `timeout`, sweeping over them a few times per timeout
/// from a thread of its own, which ends once the server has. Not a timer on the runtime: a
/// pending timer makes every sleep of the event loop dearer (~0.5 µs a request measured with
/// one per connection, and still ~0.4 µs with one for all).
fn sweep_idle(slots: &Arc<Slots>, timeout: Duration) {
    let every = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let weak = Arc::downgrade(slots);
    let sweep = move || {
        while let Some(slots) = weak.upgrade() {
            slots.expire_idle(timeout);
            drop(slots);
            std::thread::sleep(every);
        }
    };
    if std::thread::Builder::new()
        .name("tenet-idle-sweep".into())
        .spawn(sweep.clone())
        .is_err()
    {
        // No thread to be had: sweep from the runtime instead.
        tokio::task::spawn_blocking(sweep);
    }
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

/// The request's Content-Length, if it declares one.
pub fn declared_length<B>(req: &Request<B>) -> Result<Option<u64>, ApiError> {
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

/// Read a whole body of at most `limit` bytes at the node's pace, each piece first shown to
/// Read a whole body of at most `limit` bytes (413 beyond it; 400 if it ends early, stalls
/// or trickles: the default [`BodyPace`]).
pub async fn collect_body<B: RequestBody>(req: Request<B>, limit: u64) -> Result<Bytes, ApiError> {
    collect_body_paced(req, limit, BodyPace::default()).await
}

/// [`collect_body`] at `pace`.
pub async fn collect_body_paced<B: RequestBody>(
    req: Request<B>,
    limit: u64,
    pace: BodyPace,
) -> Result<Bytes, ApiError> {
    collect_body_with(req, limit, pace, |_| None, |_| Ok(())).await
}

/// [`collect_body`], showing each frame to `each` as it arrives. A large body is copied into
/// a buffer from the recycle cache, which it returns to when dropped: a fresh 4 MiB buffer
/// per upload is 1,024 pages to fault in, each slow on a VM. Where `align_at` finds an offset
/// in the first frame, the body is placed so that this offset falls on a 64-byte boundary.
pub async fn collect_body_with<B: RequestBody>(
    req: Request<B>,
    limit: u64,
    pace: BodyPace,
    align_at: fn(&[u8]) -> Option<usize>,
    mut each: impl FnMut(&[u8]) -> Result<(), ApiError>,
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
    let mut paced = Paced::new(pace);
    while let Some(data) = paced.next(&mut body).await? {
        let data = &data[..];
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
        each(data)?;
        buf.extend_from_slice(data);
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

fn truncated(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::TruncatedBody,
        format!("the body ended before its declared length: {e}"),
    )
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
