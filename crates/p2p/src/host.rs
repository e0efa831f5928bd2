//! A hoster: a tenet node whose API is reached over libp2p instead of (or besides) HTTP. It
//! keeps the tasks it hosts — graph and weights — pinned in its store, announces each as a
//! provider record, publishes its signed advert (tasks, device, memory, price, addresses)
//! and renews it, and answers every request from a peer with the node's own routes
//! (`tenet_node::http::answer`): the same gate, limits and commit-reveal as over HTTP. It is
//! open to any caller — peers are strangers — and bounded per peer by the swarm.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tenet_node::{Node, NodeConfig};
use tenet_proto::Hash;
use tokio::sync::mpsc;

use crate::advert::{Advert, Hosted, task_key};
use crate::swarm::{Config, Inbound, Network, P2pError};
use crate::wire::MAX_ANSWER_BYTES;

/// How often a hoster renews its advert.
pub const ADVERT_EVERY: Duration = Duration::from_secs(300);

/// A task to host: a graph file (binary or text form) and its weights, if any.
#[derive(Clone, Debug)]
pub struct TaskFiles {
    pub graph: PathBuf,
    pub weights: Option<PathBuf>,
    /// What to call it in the advert (default: the graph file's stem).
    pub name: Option<String>,
}

/// How to start a hoster.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub node: NodeConfig,
    /// The swarm (its key is replaced by the node's).
    pub net: Config,
    pub tasks: Vec<TaskFiles>,
}

/// Why a hoster could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Node(#[from] tenet_node::StartError),
    #[error(transparent)]
    Network(#[from] P2pError),
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} is not a tenet graph: {message}")]
    Graph { path: String, message: String },
    #[error("cannot keep {what} in the node's store: {message}")]
    Store { what: String, message: String },
}

/// A running hoster.
pub struct Hoster {
    pub node: Arc<Node>,
    pub net: Network,
    pub hosted: Vec<Hosted>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Hoster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Put a file into the node's store, pinned; its address.
fn keep(node: &Node, bytes: &[u8], what: &str) -> Result<Hash, HostError> {
    let fail = |e: &dyn std::fmt::Display| HostError::Store {
        what: what.to_string(),
        message: e.to_string(),
    };
    let hash = node.store().put_bytes(bytes).map_err(|e| fail(&e))?;
    node.store().pin(&hash).map_err(|e| fail(&e))?;
    Ok(hash)
}

fn read(path: &PathBuf) -> Result<Vec<u8>, HostError> {
    std::fs::read(path).map_err(|e| HostError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

impl Hoster {
    /// Start the node and the swarm, store and announce the tasks, and answer peers.
    pub async fn start(config: HostConfig) -> Result<Hoster, HostError> {
        let mut node_config = config.node;
        // Strangers call a hoster; its gate still checks every signature, clock and nonce.
        node_config.open = true;
        let node = Node::start(node_config)?;
        let mut hosted = Vec::new();
        for t in &config.tasks {
            let bytes = read(&t.graph)?;
            let graph = tenet_ir::decode_any(&bytes).map_err(|e| HostError::Graph {
                path: t.graph.display().to_string(),
                message: e.to_string(),
            })?;
            let task = keep(&node, &graph.to_bytes(), "the graph")?;
            let weights = match &t.weights {
                Some(w) => Some(keep(&node, &read(w)?, "the weights")?),
                None => None,
            };
            let name = t.name.clone().unwrap_or_else(|| {
                t.graph
                    .file_stem()
                    .map_or_else(|| "task".into(), |s| s.to_string_lossy().into_owned())
            });
            let mut name = name;
            name.truncate(64);
            hosted.push(Hosted {
                task,
                weights,
                name,
            });
        }
        let (tx, mut rx) = mpsc::channel::<Inbound>(256);
        let mut net_config = config.net;
        net_config.key = node.key().clone();
        let net = Network::start(net_config, Some(tx)).await?;
        let mut tasks = Vec::new();
        let answering = node.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(inbound) = rx.recv().await {
                let node = answering.clone();
                tokio::spawn(async move {
                    // Room for the CBOR around the body.
                    let limit = MAX_ANSWER_BYTES - (64 << 10);
                    let answer = tenet_node::http::answer(node, inbound.request, limit).await;
                    let _ = inbound.reply.send(answer);
                });
            }
        }));
        let hoster = Hoster {
            node,
            net,
            hosted,
            tasks,
        };
        hoster.announce().await?;
        let (net, node, hosted) = (
            hoster.net.clone(),
            hoster.node.clone(),
            hoster.hosted.clone(),
        );
        let mut hoster = hoster;
        hoster.tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(ADVERT_EVERY).await;
                let _ = publish(&net, &node, &hosted).await;
            }
        }));
        Ok(hoster)
    }

    /// Provide every hosted task and publish the advert.
    pub async fn announce(&self) -> Result<(), P2pError> {
        for h in &self.hosted {
            self.net.provide(task_key(&h.task)).await?;
        }
        publish(&self.net, &self.node, &self.hosted).await
    }
}

async fn publish(net: &Network, node: &Node, hosted: &[Hosted]) -> Result<(), P2pError> {
    let info = node.info();
    let addrs = net
        .listen_addrs()
        .await?
        .into_iter()
        .take(crate::advert::MAX_ADDRS)
        .map(|a| a.to_string())
        .collect();
    let device = info
        .devices
        .first()
        .map(|d| format!("{} {}", d.class, d.spec))
        .unwrap_or_default();
    let advert = Advert::sign(
        node.key(),
        addrs,
        hosted.to_vec(),
        device.chars().take(96).collect(),
        info.memory_limit_bytes,
        info.price_per_gflop,
        tenet_proto::unix_now(),
    );
    match advert.record() {
        Some(record) => net.put_record(record).await,
        None => Ok(()),
    }
}
