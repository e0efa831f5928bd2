//! The web dashboard: one page embedded in the binary (`dashboard/index.html`, its script and
//! styles inline, nothing fetched from elsewhere), and the live event stream it reads
//! (`GET /v1/events`, server-sent events over [`crate::events`]).
//!
//! The page is served to anyone at `/` because it holds no data: it reads the same API as any
//! caller — `/v1/info`, `/v1/nodes`, `/v1/jobs`, `/v1/jobs/{id}`, `/v1/events` — with the API
//! key the viewer types in (kept in the tab's session storage), or without one where the
//! operator made the reads public (`--public-dashboard`). Receipts are verified in the page
//! itself: Ed25519 through the browser's WebCrypto and blake3 in a few lines of script, over
//! the same bytes `tenet_proto::receipt` signs, so the check does not trust this server.

use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use hyper::header::HeaderValue;
use tenet_net::serve::{Reply, ReplyBody, body};
use tenet_proto::error::{ApiError, ErrorCode};
use tokio::sync::broadcast::error::RecvError;

use crate::events::{Events, MAX_SUBSCRIBERS};

const PAGE: &str = include_str!("dashboard/index.html");
/// The receipt checks, a file of its own so that tests run the same script under node.js.
pub const VERIFY_JS: &str = include_str!("dashboard/verify.js");

/// How long a subscriber may leave an event unread before it is dropped.
pub const SLOW_CONSUMER: Duration = Duration::from_secs(10);
/// A comment line this often keeps idle connections (and proxies) open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events buffered per subscriber between the ring and its socket.
const BUFFERED: usize = 64;

/// `GET /` (and `/dashboard`), or `GET /dashboard/verify.js`.
pub fn page(path: &str) -> Reply {
    let (text, kind) = if path.ends_with(".js") {
        (VERIFY_JS, "text/javascript; charset=utf-8")
    } else {
        (PAGE, "text/html; charset=utf-8")
    };
    let mut r = Response::new(body(Bytes::from_static(text.as_bytes())));
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static(kind));
    // Everything the page needs is in it: nothing else may load or run.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

fn sse(line: &str) -> Bytes {
    Bytes::from(format!("data: {line}\n\n"))
}

/// `GET /v1/events`: the backlog, then every event as it happens, as server-sent events. A
/// subscriber that leaves events unread falls behind the ring or past [`SLOW_CONSUMER`]: it is
/// told (`event: dropped`) and its stream ends, so no reader holds the coordinator's memory.
pub fn event_stream(events: &Events) -> Result<Reply, ApiError> {
    let mut sub = events.subscribe().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Busy,
            format!("{MAX_SUBSCRIBERS} event subscribers are connected; try again later"),
        )
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(BUFFERED);
    tokio::spawn(async move {
        let send = |b: Bytes| {
            let tx = tx.clone();
            async move {
                matches!(
                    tokio::time::timeout(SLOW_CONSUMER, tx.send(b)).await,
                    Ok(Ok(()))
                )
            }
        };
        if !send(Bytes::from_static(b": tenet events\n\n")).await {
            return;
        }
        for line in std::mem::take(&mut sub.backlog) {
            if !send(sse(&line)).await {
                return;
            }
        }
        loop {
            if *sub.ending.borrow() {
                // Whatever is queued first (the `shutdown` event among it), then the end.
                while let Ok(line) = sub.live.try_recv() {
                    if !send(sse(&line)).await {
                        return;
                    }
                }
                return;
            }
            let next = tokio::select! {
                next = tokio::time::timeout(KEEP_ALIVE, sub.live.recv()) => next,
                _ = sub.ending.changed() => continue,
            };
            let sent = match next {
                Ok(Ok(line)) => send(sse(&line)).await,
                Ok(Err(RecvError::Lagged(missed))) => {
                    let note = format!(
                        "event: dropped\ndata: {{\"missed\":{missed},\"why\":\"this reader fell behind; reconnect\"}}\n\n"
                    );
                    let _ = send(Bytes::from(note)).await;
                    return;
                }
                Ok(Err(RecvError::Closed)) => return,
                Err(_) => send(Bytes::from_static(b": keep-alive\n\n")).await,
            };
            if !sent {
                return;
            }
        }
    });
    let mut r = Response::new(ReplyBody::Stream(rx));
    let h = r.headers_mut();
    h.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(r)
}
