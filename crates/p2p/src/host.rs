//! A peer of the network: a tenet node whose API is reached over libp2p instead of (or
//! besides) HTTP, hosting tasks, validating, or both. It keeps the tasks it hosts — graph and
//! weights — pinned in its store, announces each as a provider record, publishes its signed
//! advert (tasks, device, memory, price, addresses) on the DHT and on the gossip topic and
//! renews both, answers every request from a peer with the node's own routes
//! (`tenet_node::http::answer`: the same gate, limits and commit-reveal as over HTTP), and
//! answers [`STATUS_PATH`] with what `tenet peer status` shows. It is open to any caller —
//! peers are strangers — and bounded per peer by the swarm.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tenet_node::{Node, NodeConfig};
use tenet_proto::Hash;
use tokio::sync::mpsc;

use crate::advert::{Advert, Hosted, task_key};
use crate::epoch::NetworkSpec;
use crate::swarm::{Config, Inbound, Network, P2pError};
use crate::validator::{Validator, ValidatorOptions, ValidatorState};
use crate::wire::MAX_ANSWER_BYTES;

/// How often a hoster renews its advert on the DHT.
pub const ADVERT_EVERY: Duration = Duration::from_secs(300);

/// The path a peer answers with its status (no signature needed: it is public).
pub const STATUS_PATH: &str = "/v1/peer/status";

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
    /// How often the advert is gossiped (until the first gossip succeeds: every half second).
    pub gossip_every: Duration,
    /// Validate too.
    pub validator: Option<ValidatorOptions>,
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
    #[error(transparent)]
    Validator(#[from] crate::validator::ValidatorError),
}

/// A running hoster.
pub struct Hoster {
    pub node: Arc<Node>,
    pub net: Network,
    pub hosted: Vec<Hosted>,
    pub validator: Option<Validator>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What `tenet peer status` shows of a peer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerStatus {
    pub network: Option<String>,
    /// The epoch under way and its phase (with a network spec).
    pub epoch: Option<u64>,
    pub phase: Option<crate::epoch::Phase>,
    pub swarm: crate::swarm::Status,
    pub hosted: Vec<Hosted>,
    pub validator: Option<ValidatorState>,
    /// Hosters in the last settled epoch's standings (any peer computes them from the DHT).
    pub standings: Option<crate::epoch::Settled>,
}

/// A peer's status, as answered on [`STATUS_PATH`].
pub async fn peer_status(
    net: &Network,
    spec: Option<&NetworkSpec>,
    hosted: &[Hosted],
    validator: Option<&Arc<std::sync::Mutex<ValidatorState>>>,
) -> Result<PeerStatus, P2pError> {
    let swarm = net.status().await?;
    let now = crate::swarm::now_ms();
    let phase = spec.and_then(|s| s.phase_at(now));
    let standings = match spec {
        Some(s) => crate::validator::last_settled(net, s).await,
        None => None,
    };
    Ok(PeerStatus {
        network: spec.map(|s| s.name.clone()),
        epoch: phase.map(|p| p.0),
        phase: phase.map(|p| p.1),
        swarm,
        hosted: hosted.to_vec(),
        validator: validator.map(|v| v.lock().unwrap_or_else(|e| e.into_inner()).clone()),
        standings,
    })
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
        // ...but a stranger's job may not make it fetch from this machine's own services.
        node_config.loopback_pulls = false;
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
        let spec = net_config.spec.clone();
        let net = Network::start(net_config, Some(tx)).await?;
        let validator = match config.validator {
            Some(options) => {
                Some(Validator::start(net.clone(), node.key().clone(), options).await?)
            }
            None => None,
        };
        let mut tasks = Vec::new();
        let answering = node.clone();
        let status_net = net.clone();
        let status_hosted = hosted.clone();
        let status_validator = validator.as_ref().map(|v| v.state.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(inbound) = rx.recv().await {
                let node = answering.clone();
                if inbound.request.path == STATUS_PATH {
                    let (net, spec, hosted, v) = (
                        status_net.clone(),
                        spec.clone(),
                        status_hosted.clone(),
                        status_validator.clone(),
                    );
                    tokio::spawn(async move {
                        let body =
                            match peer_status(&net, spec.as_deref(), &hosted, v.as_ref()).await {
                                Ok(s) => serde_json::to_vec(&s).unwrap_or_default(),
                                Err(_) => Vec::new(),
                            };
                        let _ = inbound.reply.send(tenet_net::RawResponse {
                            status: 200,
                            body: body.into(),
                        });
                    });
                    continue;
                }
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
            validator,
            tasks,
        };
        hoster.announce().await?;
        let (net, node, hosted) = (
            hoster.net.clone(),
            hoster.node.clone(),
            hoster.hosted.clone(),
        );
        let mut hoster = hoster;
        let (gnet, gnode, ghosted) = (net.clone(), node.clone(), hosted.clone());
        hoster.tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(ADVERT_EVERY).await;
                let _ = publish(&net, &node, &hosted).await;
            }
        }));
        // Gossip the advert: every half second until it first goes out (a new peer has no
        // gossip mesh yet), then at the configured pace. A peer hosting nothing stays quiet.
        let every = config.gossip_every.max(Duration::from_millis(100));
        if !ghosted.is_empty() {
            hoster.tasks.push(tokio::spawn(async move {
                let mut sent = false;
                loop {
                    let advert = advert(&gnet, &gnode, &ghosted).await;
                    if let Ok(a) = advert {
                        sent |= gnet.gossip_advert(&a).await.is_ok();
                    }
                    let pause = if sent {
                        every
                    } else {
                        Duration::from_millis(500)
                    };
                    tokio::time::sleep(pause).await;
                }
            }));
        }
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
    match advert(net, node, hosted).await?.record() {
        Some(record) => net.put_record(record).await,
        None => Ok(()),
    }
}

/// This peer's advert, signed now.
async fn advert(net: &Network, node: &Node, hosted: &[Hosted]) -> Result<Advert, P2pError> {
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
    Ok(Advert::sign(
        node.key(),
        addrs,
        hosted.to_vec(),
        device.chars().take(96).collect(),
        info.memory_limit_bytes,
        info.price_per_gflop,
        tenet_proto::unix_now(),
    ))
}
