//! `tenet-node`: the worker a node operator runs. It accepts signed requests from the keys it
//! trusts, stores content-addressed blobs, runs tenet graphs (never code) within limits checked
//! against each graph's cost certificate before it runs, commits to each result before
//! revealing it, keeps tensors resident in sessions, and reports itself through an event log
//! and Prometheus metrics.
//!
//! Layers: [`service`] holds the operations with no HTTP in them; [`http`] is the only module
//! that knows routes and statuses, and answers requests whatever carried them (a TCP
//! connection, or a libp2p stream handed over whole: [`http::answer`]). The other side of the
//! wire — the client, the request gate, the shared serving code — is `tenet-net`; the wire
//! format itself lives in `tenet-proto`, the blob store in `tenet-store`.

pub mod cheat;
pub mod config;
mod engine;
mod errors;
pub mod http;
mod lru;
pub mod membership;
pub mod observe;
mod pool;
pub mod service;
pub mod trace;

use std::sync::Arc;

pub use config::NodeConfig;
pub use service::{Node, StartError};

/// Start a node from `config` and serve until Ctrl-C or SIGTERM. `ready` is told the address
/// it listens on (useful with port 0) and the node's identity before the first request.
pub fn run_blocking(
    config: NodeConfig,
    ready: impl FnOnce(std::net::SocketAddr, &Arc<Node>),
) -> Result<(), StartError> {
    // A busy-polling worker sees its sockets only if no other worker sleeps holding the I/O
    // driver; jobs run on their own threads anyway, so one event-loop thread is enough, and
    // the single-threaded scheduler turns around a spin faster than a pool of one.
    let mut runtime = if config.busy_poll_us > 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = runtime
        .enable_all()
        .thread_name("tenet-node")
        .build()
        .map_err(|source| StartError::Listen {
            addr: config.listen.to_string(),
            source,
        })?;
    runtime.block_on(async move {
        let mut config = config;
        let membership = config.membership.clone();
        if let Some(m) = &membership {
            let key = membership::Link::coordinator_key(m, &tenet_net::identity::generate()).await?;
            config.trusted_keys.push(key.to_hex());
        }
        let node = Node::start(config)?;
        let addr = node.config().listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen {
                addr: addr.to_string(),
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| StartError::Listen {
            addr: addr.to_string(),
            source,
        })?;
        // The address file lets scripts find a node started on port 0.
        let _ = std::fs::write(node.config().data_dir.join("addr"), format!("{bound}\n"));
        node.events.emit(
            "start",
            serde_json::json!({"addr": bound.to_string(), "node_id": node.info().node_id, "open": node.gate.is_open()}),
        );
        // Serve first: the coordinator probes the node while it registers it.
        let link_slot: Arc<std::sync::OnceLock<Arc<membership::Link>>> = Arc::default();
        let (abort, mut aborted) = tokio::sync::watch::channel(false);
        let (slot, events) = (link_slot.clone(), node.clone());
        // On shutdown, leave the coordinator first, so no new job arrives while in-flight ones
        // drain.
        let shutdown = async move {
            tokio::select! {
                _ = tenet_net::serve::shutdown_signal() => {}
                _ = aborted.wait_for(|a| *a) => {}
            }
            if let Some(link) = slot.get() {
                let left = link.leave().await;
                events.events.emit(
                    "left",
                    serde_json::json!({"ok": left.is_ok(), "error": left.err().map(|e| e.to_string())}),
                );
            }
        };
        let server = tokio::spawn(http::serve(node.clone(), listener, shutdown));
        if let Some(m) = membership {
            let here = format!("http://{bound}");
            let link = match membership::Link::join(m.clone(), node.key(), &here).await {
                Ok(link) => Arc::new(link),
                Err(e) => {
                    let _ = abort.send(true);
                    let _ = server.await;
                    return Err(e.into());
                }
            };
            let _ = link_slot.set(link.clone());
            node.events.emit(
                "joined",
                serde_json::json!({"coordinator": m.coordinator, "stake": m.stake}),
            );
            let events = node.clone();
            tokio::spawn(async move {
                link.heartbeats(|e| {
                    events.events.emit(
                        "heartbeat_failed",
                        serde_json::json!({"error": e.to_string()}),
                    );
                    eprintln!("tenet node: heartbeat failed: {e}");
                })
                .await
            });
        }
        ready(bound, &node);
        let _ = server.await;
        drop(abort);
        Ok(())
    })
}
