//! The coordinator's event stream: what happens to jobs and nodes, as it happens — a job
//! accepted and assigned, each node's commitment and reveal, the decision with who agreed and
//! who did not, slashes, nodes joining and leaving. Each event is one JSON object (`ts_us`,
//! `event`, fields), the shape of a node's event log, so `tenet timeline` reads both.
//!
//! Events go three ways: to the optional event log (`--event-log FILE`, written by a background
//! thread), to the live subscribers of `GET /v1/events` (the dashboard, `tenet top`), and into a
//! short backlog a new subscriber starts from. Nothing here waits for a reader: subscribers
//! read from a bounded broadcast ring, and one that falls a whole ring behind is dropped (told
//! so, then its stream ends) instead of holding events for it. Subscribers are bounded too.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tenet_net::events::{EventLog, now_us};
use tokio::sync::broadcast;

/// Events a subscriber may fall behind before it is dropped.
pub const RING: usize = 1024;
/// Recent events a new subscriber receives first.
pub const BACKLOG: usize = 256;
/// The most subscribers at once; more are refused (busy).
pub const MAX_SUBSCRIBERS: usize = 64;

/// Where the coordinator's events go.
pub struct Events {
    tx: broadcast::Sender<Arc<str>>,
    /// Turns true when the coordinator stops: live streams end (after the `shutdown` event)
    /// so that no reader holds the shutdown's connection drain.
    ending: tokio::sync::watch::Sender<bool>,
    backlog: std::sync::Mutex<VecDeque<Arc<str>>>,
    log: EventLog,
    subscribers: Arc<AtomicUsize>,
}

impl Default for Events {
    fn default() -> Events {
        Events::new(EventLog::off())
    }
}

/// A live subscription: the backlog it starts from, then the ring. Dropping it frees its slot.
pub struct Subscription {
    pub backlog: Vec<Arc<str>>,
    pub live: broadcast::Receiver<Arc<str>>,
    /// True once the coordinator stops.
    pub ending: tokio::sync::watch::Receiver<bool>,
    slots: Arc<AtomicUsize>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.slots.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Events {
    /// Events to `log` (which may be off) and to subscribers.
    pub fn new(log: EventLog) -> Events {
        let (tx, _) = broadcast::channel(RING);
        Events {
            tx,
            ending: tokio::sync::watch::channel(false).0,
            backlog: std::sync::Mutex::new(VecDeque::with_capacity(BACKLOG)),
            log,
            subscribers: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Record one event: `event` names it, `fields` (a JSON object) add to it.
    pub fn emit(&self, event: &str, fields: Value) {
        let mut obj = serde_json::Map::new();
        obj.insert("ts_us".into(), now_us().into());
        obj.insert("event".into(), event.into());
        if let Value::Object(f) = fields {
            obj.extend(f);
        }
        let line: Arc<str> = Value::Object(obj).to_string().into();
        if self.log.enabled() {
            self.log.emit_line(line.to_string());
        }
        {
            let mut b = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
            if b.len() == BACKLOG {
                b.pop_front();
            }
            b.push_back(line.clone());
        }
        // No subscriber is not an error: the event is in the log and the backlog.
        let _ = self.tx.send(line);
    }

    /// A job's phase (`accepted`, `assigned`, `committed`, `revealed`, `decided`, `failed`).
    pub fn job(&self, job: &str, phase: &str, extra: Value) {
        let mut fields = serde_json::json!({"job": job, "phase": phase});
        if let (Some(f), Value::Object(e)) = (fields.as_object_mut(), extra) {
            f.extend(e);
        }
        self.emit("job", fields);
    }

    /// Subscribe, or `None` when [`MAX_SUBSCRIBERS`] are subscribed already.
    pub fn subscribe(&self) -> Option<Subscription> {
        let slots = self.subscribers.clone();
        let taken = slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_SUBSCRIBERS).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            return None;
        }
        // The backlog and the receiver under one lock, so no event falls between them.
        let b = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
        let live = self.tx.subscribe();
        Some(Subscription {
            backlog: b.iter().cloned().collect(),
            live,
            ending: self.ending.subscribe(),
            slots,
        })
    }

    /// The coordinator is stopping: say so, and end every live stream once it has been sent.
    pub fn end(&self) {
        self.emit("shutdown", Value::Null);
        let _ = self.ending.send(true);
    }

    /// Write out the event log and stop its writer (at shutdown).
    pub fn close(&self) {
        self.log.close();
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_get_the_backlog_then_live_events_and_laggards_are_told() {
        let e = Events::default();
        for i in 0..(BACKLOG + 10) {
            e.job(&format!("j{i}"), "accepted", Value::Null);
        }
        let mut s = e.subscribe().unwrap();
        assert_eq!(s.backlog.len(), BACKLOG);
        assert!(s.backlog[0].contains("\"job\":\"j10\""), "{}", s.backlog[0]);
        e.emit("slashed", serde_json::json!({"node": "n1", "amount": 100}));
        let v: Value = serde_json::from_str(&s.live.recv().await.unwrap()).unwrap();
        assert_eq!(v["event"], "slashed");
        assert_eq!(v["amount"], 100);
        assert!(v["ts_us"].as_u64().unwrap() > 0);
        // A subscriber that falls a whole ring behind learns it lagged: it is then dropped.
        for i in 0..(RING + 5) {
            e.job(&format!("k{i}"), "decided", Value::Null);
        }
        assert!(matches!(
            s.live.recv().await,
            Err(broadcast::error::RecvError::Lagged(_))
        ));
        // Subscribers are bounded; a dropped one frees its slot.
        let many: Vec<Subscription> = (1..MAX_SUBSCRIBERS)
            .map(|_| e.subscribe().unwrap())
            .collect();
        assert!(e.subscribe().is_none());
        drop(s);
        assert_eq!(e.subscribers(), MAX_SUBSCRIBERS - 1);
        assert!(e.subscribe().is_some());
        drop(many);
    }
}
