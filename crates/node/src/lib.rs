//! `tenet-node`: the worker a node operator runs. It accepts signed requests from the keys it
//! trusts, stores content-addressed blobs, runs tenet graphs (never code) within limits checked
//! against each graph's cost certificate before it runs, commits to each result before
//! revealing it, keeps tensors resident in sessions, and reports itself through an event log
//! and Prometheus metrics.
//!
//! Layers: [`service`] holds the operations with no HTTP in them; [`http`] is the only module
//! that knows routes and statuses; [`client`] is the other side of the same wire. The wire
//! format itself lives in `tenet-proto`, the blob store in `tenet-store`.

pub mod cheat;
pub mod client;
pub mod config;
mod engine;
mod errors;
pub mod gate;
pub mod http;
pub mod identity;
mod lru;
mod observe;
mod pool;
pub mod service;

use std::sync::Arc;

pub use bytes::Bytes;
pub use client::{ClientError, NodeClient, RawRequest, RawResponse};
pub use config::NodeConfig;
pub use hyper::Method;
pub use service::{Node, StartError};

/// Start a node from `config` and serve until Ctrl-C or SIGTERM. `ready` is told the address
/// it listens on (useful with port 0) and the node's identity before the first request.
pub fn run_blocking(
    config: NodeConfig,
    ready: impl FnOnce(std::net::SocketAddr, &Arc<Node>),
) -> Result<(), StartError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tenet-node")
        .build()
        .map_err(|source| StartError::Listen {
            addr: config.listen.to_string(),
            source,
        })?;
    runtime.block_on(async move {
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
        ready(bound, &node);
        http::serve(node, listener, shutdown_signal()).await;
        Ok(())
    })
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
