//! A whole peer-to-peer network in one process — validators, hosters (some told to lie), a
//! network spec starting a moment from now — for `tenet demo --p2p`, tests and benchmarks.
//! Peers listen on 127.0.0.1 (TCP, real sockets) or on libp2p's in-memory transport.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use libp2p::{Multiaddr, PeerId};
use tenet_node::NodeConfig;

use crate::epoch::NetworkSpec;
use crate::host::{HostConfig, HostError, Hoster, TaskFiles};
use crate::swarm::{Config, Events, Network, P2pError, Transport, now_ms};
use crate::validator::ValidatorOptions;

/// What to start.
#[derive(Clone, Debug)]
pub struct LocalPeersOptions {
    pub validators: usize,
    /// Validators that reveal scores other than those they committed to (by index).
    pub lying_validators: Vec<usize>,
    pub hosters: usize,
    /// Hosters that commit to wrong results (by index), and how (`flip`, `noise=A`).
    pub lying_hosters: Vec<usize>,
    pub cheat: String,
    pub tasks: Vec<TaskFiles>,
    pub epoch_ms: u64,
    /// Epoch 0 begins this long after the peers are started.
    pub genesis_in_ms: u64,
    pub transport: Transport,
    /// Each peer's event logs go to DIR/PEER.jsonl (its node) and DIR/PEER-p2p.jsonl (its
    /// swarm and validator: records, gossip, challenges, settlements).
    pub event_logs: Option<PathBuf>,
}

/// A running local network.
pub struct LocalPeers {
    pub spec: Arc<NetworkSpec>,
    pub hosters: Vec<Hoster>,
    pub validators: Vec<Hoster>,
    /// Where a new peer joins.
    pub bootstrap: Vec<Multiaddr>,
    pub lying_hosters: Vec<PeerId>,
    pub lying_validators: Vec<PeerId>,
    transport: Transport,
}

fn listen(transport: Transport) -> Multiaddr {
    match transport {
        Transport::Tcp => "/ip4/127.0.0.1/tcp/0",
        Transport::Memory => "/memory/0",
    }
    .parse()
    .expect("a valid multiaddr")
}

impl LocalPeers {
    /// Start every peer under `dir` and wait until each hoster's advert has been gossiped to
    /// every validator (bounded: 20 s).
    pub async fn start(dir: &Path, o: &LocalPeersOptions) -> Result<LocalPeers, HostError> {
        let mut vkeys = Vec::new();
        for i in 0..o.validators {
            let d = dir.join(format!("validator{i}"));
            std::fs::create_dir_all(&d).map_err(|e| HostError::Read {
                path: d.display().to_string(),
                message: e.to_string(),
            })?;
            let key = tenet_net::identity::load_or_create(&d).map_err(|e| HostError::Read {
                path: d.display().to_string(),
                message: e.to_string(),
            })?;
            vkeys.push(key.public());
        }
        let spec = Arc::new(NetworkSpec::local(
            "local",
            now_ms() + o.genesis_in_ms,
            o.epoch_ms,
            &vkeys,
        ));
        let mut bootstrap: Vec<Multiaddr> = Vec::new();
        let mut hosters = Vec::new();
        for i in 0..o.hosters {
            let cheat = o.lying_hosters.contains(&i).then(|| o.cheat.clone());
            let name = format!("hoster{i}");
            let h = start_peer(
                dir,
                &name,
                o,
                &spec,
                &bootstrap,
                o.tasks.clone(),
                cheat,
                None,
            )
            .await?;
            if bootstrap.is_empty() {
                bootstrap = h.net.listen_addrs().await?;
            }
            hosters.push(h);
        }
        let mut validators = Vec::new();
        for i in 0..o.validators {
            let lies = o.lying_validators.contains(&i);
            let name = format!("validator{i}");
            let v = start_peer(
                dir,
                &name,
                o,
                &spec,
                &bootstrap,
                Vec::new(),
                None,
                Some(lies),
            )
            .await?;
            if bootstrap.is_empty() {
                bootstrap = v.net.listen_addrs().await?;
            }
            validators.push(v);
        }
        let lying_hosters = o
            .lying_hosters
            .iter()
            .filter_map(|i| hosters.get(*i).map(|h: &Hoster| h.net.peer_id()))
            .collect();
        let lying_validators = o
            .lying_validators
            .iter()
            .filter_map(|i| validators.get(*i).map(|h: &Hoster| h.net.peer_id()))
            .collect();
        let peers = LocalPeers {
            spec,
            hosters,
            validators,
            bootstrap,
            lying_hosters,
            lying_validators,
            transport: o.transport,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline
            && !peers
                .validators
                .iter()
                .all(|v| v.net.directory().len() >= peers.hosters.len())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(peers)
    }

    /// A client joined to the network (it hosts nothing and listens nowhere).
    pub async fn client(&self, key: tenet_proto::auth::KeyPair) -> Result<Network, P2pError> {
        let mut c = Config::new(key);
        c.transport = self.transport;
        c.bootstrap = self.bootstrap.clone();
        c.spec = Some(self.spec.clone());
        Network::start(c, None).await
    }

    /// Epochs every honest validator has settled.
    pub fn settled_epochs(&self) -> Vec<u64> {
        let honest: Vec<&Hoster> = self
            .validators
            .iter()
            .filter(|v| !self.lying_validators.contains(&v.net.peer_id()))
            .collect();
        let mut epochs: Option<Vec<u64>> = None;
        for v in honest {
            let Some(state) = &v.validator else { continue };
            let st = state.state.lock().unwrap_or_else(|e| e.into_inner());
            let mine: Vec<u64> = st.settled.iter().map(|s| s.epoch).collect();
            epochs = Some(match epochs {
                None => mine,
                Some(e) => e.into_iter().filter(|x| mine.contains(x)).collect(),
            });
        }
        epochs.unwrap_or_default()
    }
}

/// One peer of a local network.
#[allow(clippy::too_many_arguments)]
async fn start_peer(
    dir: &Path,
    name: &str,
    o: &LocalPeersOptions,
    spec: &Arc<NetworkSpec>,
    bootstrap: &[Multiaddr],
    tasks: Vec<TaskFiles>,
    cheat: Option<String>,
    validate: Option<bool>,
) -> Result<Hoster, HostError> {
    let data_dir = dir.join(name);
    let mut net = Config::new(tenet_net::identity::generate());
    net.transport = o.transport;
    net.listen = vec![listen(o.transport)];
    net.bootstrap = bootstrap.to_vec();
    net.spec = Some(spec.clone());
    // The node's log and the swarm's (records, gossip, challenges) side by side.
    let event_log = o
        .event_logs
        .as_ref()
        .map(|d| d.join(format!("{name}.jsonl")));
    let swarm_log = o
        .event_logs
        .as_ref()
        .map(|d| d.join(format!("{name}-p2p.jsonl")));
    if let Some(path) = &swarm_log {
        let log = tenet_net::events::EventLog::open(path).map_err(|e| HostError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        net.events = Events(Arc::new(log));
    }
    let node = NodeConfig {
        data_dir: data_dir.clone(),
        cheat,
        busy_poll_us: 0,
        durable: false,
        event_log,
        ..NodeConfig::default()
    };
    let validator = validate.map(|cheat_scores| ValidatorOptions {
        spec: spec.clone(),
        data_dir,
        cheat_scores,
    });
    Hoster::start(HostConfig {
        node,
        net,
        tasks,
        gossip_every: Duration::from_secs(1),
        validator,
    })
    .await
}
