//! Where `tenet top`'s data comes from: the coordinator's nodes and jobs polled through the
//! CLI's [`Client`], and its event stream (`GET /v1/events`, server-sent events) read as it
//! arrives over a connection of its own. Both run as one future on the feed's thread and write
//! into the [`Shared`] state the screen draws from; when the stream cannot be opened, jobs are
//! polled every second instead and the stream is tried again now and then.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tenet_net::Method;

use super::state::Model;
use crate::coord_cmd::Client;

/// Jobs read at start: enough to count the recent past (more than this and the totals are
/// shown as at least).
pub const FIRST_JOBS: usize = 1000;
/// Jobs read on each poll while the stream is live (it tells the rest).
const POLL_JOBS: usize = 50;
/// Jobs read on each poll without the stream.
const POLL_JOBS_ALONE: usize = 200;
/// How long one API call may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// The stream sends a comment at least every 15 s; silence longer than this is a dead stream.
const STREAM_SILENCE: Duration = Duration::from_secs(45);
/// The longest event (or line) read from the stream.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// A job without news for this long is asked about by its id.
const STALE_US: u64 = 15_000_000;

/// How the screen is fed.
#[derive(Clone, Debug, PartialEq)]
pub enum Conn {
    Connecting,
    /// The event stream is open.
    Live,
    /// The stream ended; opening it again.
    Reconnecting(String),
    /// No stream (why): jobs are polled.
    Polling(String),
}

impl Conn {
    pub fn label(&self) -> &'static str {
        match self {
            Conn::Connecting => "connecting",
            Conn::Live => "live",
            Conn::Reconnecting(_) => "reconnecting",
            Conn::Polling(_) => "polling",
        }
    }
}

/// What the feed and the screen share.
#[derive(Debug)]
pub struct Shared {
    pub model: Model,
    pub conn: Conn,
    /// The latest problem worth a line on the screen (cleared when things work again).
    pub note: Option<String>,
    /// The end, with the message to leave on the terminal (access refused).
    pub fatal: Option<String>,
    /// A signal asked to quit.
    pub quit: bool,
    /// Something changed since the last draw.
    pub dirty: bool,
}

impl Shared {
    pub fn new(model: Model) -> Shared {
        Shared {
            model,
            conn: Conn::Connecting,
            note: None,
            fatal: None,
            quit: false,
            dirty: true,
        }
    }
}

pub fn lock(s: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Microseconds since the Unix epoch, by this machine's clock.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The HTTP status a [`Client`] call was refused with, read from its message (the client
/// reports it only there).
pub fn refused_status(e: &anyhow::Error) -> Option<u16> {
    let text = e.to_string();
    for marker in ["refused (", "answered "] {
        if let Some(at) = text.find(marker) {
            let digits: String = text[at + marker.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(s) = digits.parse() {
                return Some(s);
            }
        }
    }
    None
}

/// The message for a refusal of access: how to pass a key.
pub fn access_message(url: &str, status: u16, detail: &str, had_key: bool) -> String {
    let what = if had_key {
        "refused the API key given"
    } else {
        "asks for an API key"
    };
    format!(
        "the coordinator at {url} {what} ({status}: {detail}); pass --api-key KEY (or set TENET_API_KEY)"
    )
}

/// One JSON call, bounded in time; a refusal of access becomes its message.
pub async fn get(client: &Client, url: &str, path: &str, had_key: bool) -> Result<Value> {
    let call = client.call(Method::GET, path, Vec::new(), "application/json");
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => match refused_status(&e) {
            Some(s @ (401 | 403)) => {
                // "the coordinator refused (401): WHY" → WHY.
                let text = e.to_string();
                let why = text.split_once("): ").map_or(text.as_str(), |(_, w)| w);
                Err(anyhow!(Refused(access_message(url, s, why, had_key))))
            }
            _ => Err(e),
        },
        Err(_) => bail!(
            "the coordinator at {url} did not answer GET {path} within {} s",
            CALL_LIMIT.as_secs()
        ),
    }
}

/// Access was refused: no point in trying again.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn is_refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some()
}

/// What the first look found: the coordinator's info, its nodes and its recent jobs; an error
/// when it cannot be reached or refuses access.
pub async fn first_look(
    client: &Client,
    url: &str,
    had_key: bool,
    model: &mut Model,
) -> Result<()> {
    let info = get(client, url, "/v1/info", had_key).await?;
    if info.get("coordinator").and_then(Value::as_str).is_none() {
        bail!("{url} does not answer like a tenet coordinator (GET /v1/info: {info})");
    }
    model.set_info(&info);
    model.set_nodes(&get(client, url, "/v1/nodes", had_key).await?);
    let jobs = get(
        client,
        url,
        &format!("/v1/jobs?limit={FIRST_JOBS}"),
        had_key,
    )
    .await?;
    model.apply_jobs(&jobs, Some(FIRST_JOBS));
    Ok(())
}

/// Keep `shared` fed until the screen stops reading it: poll nodes (and jobs) every
/// `interval`, and read the event stream.
pub async fn run(shared: Arc<Mutex<Shared>>, url: String, key: Option<String>, interval: Duration) {
    let key = key.as_deref();
    tokio::join!(
        poll(&shared, &url, key, interval),
        stream(&shared, &url, key),
        signals(&shared),
    );
}

async fn poll(shared: &Mutex<Shared>, url: &str, key: Option<&str>, interval: Duration) {
    let client = match Client::with_optional_key(url, key) {
        Ok(c) => c,
        Err(e) => {
            lock(shared).fatal = Some(e.to_string());
            return;
        }
    };
    let had_key = key.is_some();
    loop {
        let alone = matches!(lock(shared).conn, Conn::Polling(_) | Conn::Connecting);
        let result: Result<()> = async {
            let nodes = get(&client, url, "/v1/nodes", had_key).await?;
            let limit = if alone { POLL_JOBS_ALONE } else { POLL_JOBS };
            let jobs = get(&client, url, &format!("/v1/jobs?limit={limit}"), had_key).await?;
            let stale = {
                let mut s = lock(shared);
                s.model.set_nodes(&nodes);
                s.model.apply_jobs(&jobs, None);
                s.dirty = true;
                let now = s.model.now(now_us());
                s.model.stale_jobs(now, STALE_US, 8)
            };
            for id in stale {
                let job = get(&client, url, &format!("/v1/jobs/{id}"), had_key).await?;
                let mut s = lock(shared);
                s.model.apply_job(&job);
                s.dirty = true;
            }
            if lock(shared).model.info.is_none() {
                let info = get(&client, url, "/v1/info", had_key).await?;
                lock(shared).model.set_info(&info);
            }
            Ok(())
        }
        .await;
        {
            let mut s = lock(shared);
            match result {
                Ok(()) => {
                    if s.note.as_deref().is_some_and(|n| n.starts_with("poll: ")) {
                        s.note = None;
                    }
                }
                Err(e) if is_refused(&e) => {
                    s.fatal = Some(e.to_string());
                    return;
                }
                // The client speaks of nodes; here the peer is the coordinator.
                Err(e) => {
                    s.note = Some(format!("poll: {e}").replace("the node at", "the coordinator at"))
                }
            }
            s.dirty = true;
            let now = s.model.now(now_us());
            s.model.prune(now);
        }
        let alone = matches!(lock(shared).conn, Conn::Polling(_));
        let wait = if alone {
            interval.min(Duration::from_secs(1))
        } else {
            interval
        };
        tokio::time::sleep(wait).await;
    }
}

/// Read the event stream into the model, opening it again when it ends.
async fn stream(shared: &Mutex<Shared>, url: &str, key: Option<&str>) {
    let mut failures = 0u32;
    loop {
        match EventStream::open(url, key).await {
            Ok(mut events) => {
                failures = 0;
                {
                    let mut s = lock(shared);
                    s.conn = Conn::Live;
                    s.dirty = true;
                }
                let why = loop {
                    match events.next().await {
                        Ok(Some(Sse::Message { event, data })) => {
                            if event.as_deref() == Some("dropped") {
                                break "the coordinator dropped this reader (it fell behind)"
                                    .to_string();
                            }
                            if let Ok(v) = serde_json::from_str::<Value>(&data) {
                                let mut s = lock(shared);
                                s.model.apply_json(&v);
                                s.dirty = true;
                            }
                        }
                        Ok(Some(Sse::Comment)) => {}
                        Ok(None) => break "the stream ended".to_string(),
                        Err(e) => break e.to_string(),
                    }
                };
                {
                    let mut s = lock(shared);
                    s.conn = Conn::Reconnecting(why);
                    s.dirty = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(OpenError::Refused(msg)) => {
                lock(shared).fatal = Some(msg);
                return;
            }
            Err(OpenError::Other(e)) => {
                failures += 1;
                {
                    let mut s = lock(shared);
                    s.conn = Conn::Polling(e);
                    s.dirty = true;
                }
                // Try the stream again, less often the longer it fails.
                let secs = (2u64 << failures.min(4)).min(30);
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
        }
    }
}

/// SIGINT, SIGTERM or SIGHUP: quit as `q` does, restoring the terminal.
async fn signals(shared: &Mutex<Shared>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
    lock(shared).quit = true;
}

/// Read the stream's backlog (what arrives before it goes quiet for `quiet`, for at most
/// `limit`) into `model`; for a one-off snapshot. How the model was fed: [`Conn::Live`], or
/// [`Conn::Polling`] with why the stream could not be opened.
pub async fn read_backlog(
    model: &mut Model,
    url: &str,
    key: Option<&str>,
    quiet: Duration,
    limit: Duration,
) -> Result<Conn> {
    let mut events = match EventStream::open(url, key).await {
        Ok(s) => s,
        Err(OpenError::Refused(m)) => return Err(anyhow!(Refused(m))),
        Err(OpenError::Other(why)) => return Ok(Conn::Polling(why)),
    };
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let wait = quiet.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, events.next()).await {
            Ok(Ok(Some(Sse::Message { data, .. }))) => {
                if let Ok(v) = serde_json::from_str::<Value>(&data) {
                    model.apply_json(&v);
                }
            }
            Ok(Ok(Some(Sse::Comment))) => {}
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return Ok(Conn::Live),
        }
    }
}

/// Why the stream did not open.
#[derive(Debug)]
pub enum OpenError {
    /// 401 or 403: the message says how to pass a key.
    Refused(String),
    Other(String),
}

/// One server-sent event, or a comment (a keep-alive).
#[derive(Clone, Debug, PartialEq)]
pub enum Sse {
    Comment,
    Message { event: Option<String>, data: String },
}

/// Server-sent events from bytes as they arrive: lines ending in `\n` (or `\r\n`), events
/// ending at an empty line, `data:` lines joined by newlines, `event:` naming one, `:` lines
/// comments. Every line and event is bounded by [`MAX_EVENT_BYTES`].
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
    out: std::collections::VecDeque<Sse>,
}

impl SseParser {
    /// Take `bytes`; an error when a line or an event grows past the bound.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(n) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + n;
            let mut line = &self.buf[start..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.line(&line)?;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_EVENT_BYTES {
            return Err(format!(
                "a line of the event stream is longer than {MAX_EVENT_BYTES} bytes"
            ));
        }
        Ok(())
    }

    fn line(&mut self, line: &str) -> Result<(), String> {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                self.out.push_back(Sse::Message {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return Ok(());
        }
        if line.starts_with(':') {
            self.out.push_back(Sse::Comment);
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                let d = match &mut self.data {
                    Some(d) => {
                        d.push('\n');
                        d
                    }
                    None => self.data.insert(String::new()),
                };
                d.push_str(value);
                if d.len() > MAX_EVENT_BYTES {
                    return Err(format!(
                        "an event of the stream is longer than {MAX_EVENT_BYTES} bytes"
                    ));
                }
            }
            "event" => self.event = Some(value.to_string()),
            // `id` and `retry` are not used here; unknown fields are ignored, as the
            // format says.
            _ => {}
        }
        Ok(())
    }

    /// The next complete event or comment.
    pub fn next(&mut self) -> Option<Sse> {
        self.out.pop_front()
    }
}

/// `http://HOST:PORT` (a trailing `/` allowed) → `HOST:PORT`.
fn authority(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("`{url}` is not an http:// URL"))?
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
        return Err(format!(
            "`{url}` is not a coordinator URL: expected http://HOST:PORT"
        ));
    }
    Ok(rest.to_string())
}

/// An open `GET /v1/events`.
pub struct EventStream {
    body: Incoming,
    parser: SseParser,
    conn: tokio::task::AbortHandle,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl EventStream {
    pub async fn open(url: &str, key: Option<&str>) -> Result<EventStream, OpenError> {
        let other = |e: &dyn std::fmt::Display| OpenError::Other(format!("event stream: {e}"));
        let addr = authority(url).map_err(|e| other(&e))?;
        let connect = tokio::net::TcpStream::connect(&addr);
        let tcp = match tokio::time::timeout(CALL_LIMIT, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(other(&e)),
            Err(_) => return Err(other(&"no connection within 10 s")),
        };
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
                .await
                .map_err(|e| other(&e))?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        })
        .abort_handle();
        let mut req = hyper::Request::get("/v1/events")
            .header("host", &addr)
            .header("accept", "text/event-stream");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let req = req.body(Empty::new()).map_err(|e| other(&e))?;
        let resp = match tokio::time::timeout(CALL_LIMIT, sender.send_request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                conn.abort();
                return Err(other(&e));
            }
            Err(_) => {
                conn.abort();
                return Err(other(&"no answer within 10 s"));
            }
        };
        let status = resp.status().as_u16();
        if status != 200 {
            // The error's text, briefly (an error body is small JSON).
            let mut text = Vec::new();
            let mut body = resp.into_body();
            while text.len() < 4096 {
                match tokio::time::timeout(Duration::from_secs(2), body.frame()).await {
                    Ok(Some(Ok(f))) => {
                        if let Ok(d) = f.into_data() {
                            text.extend_from_slice(&d);
                        }
                    }
                    _ => break,
                }
            }
            conn.abort();
            text.truncate(4096);
            let detail = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&text).trim().to_string());
            return Err(match status {
                401 | 403 => {
                    OpenError::Refused(access_message(url, status, &detail, key.is_some()))
                }
                _ => OpenError::Other(format!("event stream: answered {status}: {detail}")),
            });
        }
        Ok(EventStream {
            body: resp.into_body(),
            parser: SseParser::default(),
            conn,
        })
    }

    /// The next event or comment; `None` when the stream ended. Silence past
    /// [`STREAM_SILENCE`] is an error: the stream is dead.
    pub async fn next(&mut self) -> Result<Option<Sse>> {
        loop {
            if let Some(e) = self.parser.next() {
                return Ok(Some(e));
            }
            let frame = match tokio::time::timeout(STREAM_SILENCE, self.body.frame()).await {
                Ok(Some(Ok(f))) => f,
                Ok(Some(Err(e))) => bail!("the event stream broke: {e}"),
                Ok(None) => return Ok(None),
                Err(_) => bail!(
                    "the event stream was silent for {} s",
                    STREAM_SILENCE.as_secs()
                ),
            };
            if let Ok(data) = frame.into_data() {
                self.parser.push(&data).map_err(|e| anyhow!(e))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(p: &mut SseParser) -> Vec<Sse> {
        std::iter::from_fn(|| p.next()).collect()
    }

    fn msg(event: Option<&str>, data: &str) -> Sse {
        Sse::Message {
            event: event.map(str::to_string),
            data: data.to_string(),
        }
    }

    #[test]
    fn server_sent_events_are_read_across_any_split() {
        let text = ": tenet events\n\ndata: {\"a\":1}\n\nevent: dropped\r\ndata: {\"missed\":3}\r\n\r\n\
            : keep-alive\n\ndata: one\ndata:two\nid: 7\nretry: 5\nfoo\n\ndata: {\"b\":2}\n\n";
        let want = vec![
            Sse::Comment,
            msg(None, "{\"a\":1}"),
            msg(Some("dropped"), "{\"missed\":3}"),
            Sse::Comment,
            msg(None, "one\ntwo"),
            msg(None, "{\"b\":2}"),
        ];
        // Whole, and cut at every byte.
        let mut p = SseParser::default();
        p.push(text.as_bytes()).unwrap();
        assert_eq!(all(&mut p), want);
        for cut in 0..text.len() {
            let mut p = SseParser::default();
            p.push(&text.as_bytes()[..cut]).unwrap();
            let mut got = all(&mut p);
            p.push(&text.as_bytes()[cut..]).unwrap();
            got.extend(all(&mut p));
            assert_eq!(got, want, "cut at {cut}");
        }
        // An event not yet ended by its empty line is not given out.
        let mut p = SseParser::default();
        p.push(b"data: half\n").unwrap();
        assert_eq!(p.next(), None);
        // An empty line alone, or an `event:` without data, dispatches nothing.
        p.push(b"\n\nevent: x\n\n").unwrap();
        assert_eq!(all(&mut p), [msg(None, "half")]);
    }

    #[test]
    fn an_endless_line_or_event_is_refused() {
        let mut p = SseParser::default();
        let chunk = vec![b'x'; 64 << 10];
        let mut failed = false;
        for _ in 0..20 {
            if p.push(&chunk).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "a 1.25 MiB line without a newline");
        let mut p = SseParser::default();
        let line = format!("data: {}\n", "y".repeat(64 << 10));
        let mut failed = false;
        for _ in 0..20 {
            if p.push(line.as_bytes()).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an event of 20 data lines of 64 KiB");
    }

    #[test]
    fn refusals_are_told_apart_and_explained() {
        let e = anyhow!("the coordinator refused (401): unauthenticated: no key");
        assert_eq!(refused_status(&e), Some(401));
        let e = anyhow!("the coordinator answered 403: nope");
        assert_eq!(refused_status(&e), Some(403));
        assert_eq!(refused_status(&anyhow!("cannot reach the node")), None);
        let m = access_message("http://h:1", 401, "no key", false);
        assert!(
            m.contains("--api-key KEY") && m.contains("TENET_API_KEY"),
            "{m}"
        );
        assert!(access_message("u", 403, "x", true).contains("refused the API key given"));
        assert_eq!(
            authority("http://127.0.0.1:7080/").unwrap(),
            "127.0.0.1:7080"
        );
        assert!(authority("https://h:1").is_err());
        assert!(authority("http://h").is_err());
        assert!(authority("http://h:1/x").is_err());
    }
}
