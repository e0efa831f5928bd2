//! One peer's libp2p swarm and the task that drives it. Transports: TCP (and QUIC with the
//! `quic` feature) with Noise and Yamux, or libp2p's in-memory transport for several peers in
//! one process. Behaviours: identify (peers learn each other's listen addresses), Kademlia in
//! server mode under tenet's own protocol name with every inbound record checked before it is
//! stored ([`crate::advert`]), and request-response on `/tenet/node/1` carrying the node API
//! ([`crate::wire`]). The rest of the program talks to the swarm through [`Network`]'s
//! methods, each a command to the driving task; requests from other peers go to the
//! [`Inbound`] channel given at start, at most [`Config::per_peer_inflight`] from one peer at
//! a time (beyond that the peer is answered `busy` at once and counted).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use libp2p::kad::store::{MemoryStore, MemoryStoreConfig, RecordStore};
use libp2p::kad::{self, GetProvidersOk, GetRecordOk, QueryResult, Record, RecordKey};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{
    Multiaddr, PeerId, StreamProtocol, Swarm, allow_block_list, gossipsub, identify, noise, yamux,
};
use tenet_net::{RawRequest, RawResponse};
use tenet_proto::auth::KeyPair;
use tenet_proto::{ApiError, ErrorCode};
use tokio::sync::{mpsc, oneshot};

use crate::advert::{Advert, MAX_RECORD_BYTES, RecordError, check_provider, check_record};
use crate::epoch::{NetworkSpec, Phase, ScoreRecord, Use, check_score_record, is_score_key};
use crate::wire::{self, Answer, NODE_PROTOCOL};

/// tenet's DHT, apart from any other Kademlia network.
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/tenet/kad/1");

/// Request bytes one peer may have in flight here at once (bodies held while the node works).
pub const PER_PEER_BYTES: u64 = 256 << 20;

/// Request bytes all peers together may have in flight here at once.
pub const INFLIGHT_BYTES: u64 = 1 << 30;

/// One author's adverts are taken at most this often; more are dropped unforwarded and
/// counted (a peer flooding the topic reaches no further than its neighbours).
pub const GOSSIP_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// The gossipsub topic peers announce their adverts on.
pub const ADVERT_TOPIC: &str = "/tenet/adverts/1";

/// What identify says this program is.
pub const AGENT: &str = concat!("tenet/", env!("CARGO_PKG_VERSION"));

/// How the swarm reaches other peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP, and QUIC when built with the `quic` feature (listen on `/udp/N/quic-v1`).
    Tcp,
    /// libp2p's in-memory transport (`/memory/N`): peers in one process, for tests.
    Memory,
}

/// How to start a peer's swarm.
#[derive(Clone, Debug)]
pub struct Config {
    pub key: KeyPair,
    pub transport: Transport,
    /// Addresses to listen on (none: a client that only dials).
    pub listen: Vec<Multiaddr>,
    /// Peers to join through, each `…/p2p/PEER_ID`.
    pub bootstrap: Vec<Multiaddr>,
    /// A connection with nothing on it is closed after this long.
    pub idle_timeout: Duration,
    /// How long a node API request may wait for its answer.
    pub request_timeout: Duration,
    /// Requests one peer may have in flight here at once.
    pub per_peer_inflight: usize,
    /// The network this peer belongs to: without one, score records are refused.
    pub spec: Option<Arc<NetworkSpec>>,
    /// Where to log every DHT record and gossip message taken or refused.
    pub events: Events,
    /// How often to dial the bootstrap peers not connected and refresh the routing table: how
    /// a peer finds its way back after its network was split or it lost its connections.
    pub rejoin_every: Duration,
}

/// A shared event log (off unless set).
#[derive(Clone)]
pub struct Events(pub Arc<tenet_net::events::EventLog>);

impl Default for Events {
    fn default() -> Self {
        Events(Arc::new(tenet_net::events::EventLog::off()))
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Events({})", if self.0.enabled() { "on" } else { "off" })
    }
}

impl Config {
    pub fn new(key: KeyPair) -> Config {
        Config {
            key,
            transport: Transport::Tcp,
            listen: Vec::new(),
            bootstrap: Vec::new(),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(120),
            per_peer_inflight: 32,
            spec: None,
            events: Events::default(),
            rejoin_every: Duration::from_secs(60),
        }
    }
}

/// Why the network could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum P2pError {
    #[error("cannot start the swarm: {0}")]
    Start(String),
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error("`{0}` is not a peer address: expected a multiaddr ending in /p2p/PEER_ID")]
    BadAddress(String),
    #[error("the swarm has stopped")]
    Stopped,
    #[error("the DHT query failed: {0}")]
    Query(String),
    #[error("the request to {peer} failed: {message}")]
    Request { peer: PeerId, message: String },
}

/// A request from another peer, to be answered on `reply`.
pub struct Inbound {
    pub peer: PeerId,
    pub request: RawRequest,
    pub reply: oneshot::Sender<RawResponse>,
}

/// What the swarm has counted.
#[derive(Debug, Default)]
pub struct Stats {
    pub inbound_requests: AtomicU64,
    /// Requests refused before the node saw them: malformed, or over a peer's share.
    pub refused_requests: AtomicU64,
    pub rate_limited: AtomicU64,
    /// Records and provider records refused (unsigned, wrong signer, too large, foreign key,
    /// out of their window).
    pub refused_records: AtomicU64,
    pub stored_records: AtomicU64,
    /// Gossip messages taken, and refused (not a signed advert of their author).
    pub gossip_accepted: AtomicU64,
    pub gossip_refused: AtomicU64,
    /// Gossip messages dropped because their author sent too many too fast.
    pub gossip_rate_limited: AtomicU64,
}

/// What a peer sees of the network now.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Status {
    pub peer_id: String,
    pub listen: Vec<String>,
    pub connected: Vec<String>,
    /// Peers in the Kademlia routing table.
    pub routing: usize,
    pub records: usize,
    pub inbound_requests: u64,
    pub refused_requests: u64,
    pub rate_limited: u64,
    pub refused_records: u64,
    pub stored_records: u64,
    pub gossip_accepted: u64,
    pub gossip_refused: u64,
    pub gossip_rate_limited: u64,
    /// Peers whose gossiped adverts this peer holds.
    pub known_adverts: usize,
}

/// A record that passed its checks.
#[derive(Clone, Debug, PartialEq)]
pub enum Checked {
    Advert(Advert),
    Score(ScoreRecord),
}

/// Check a DHT record: a score record against the network spec and its window (`usage`), any
/// other as an advert.
pub fn check_any(
    record: &Record,
    spec: Option<&NetworkSpec>,
    now_ms: u64,
    usage: Use,
) -> Result<Checked, RecordError> {
    if is_score_key(&record.key) {
        check_score_record(record, spec, now_ms, usage).map(Checked::Score)
    } else {
        check_record(record, now_ms / 1000).map(Checked::Advert)
    }
}

enum Command {
    Listeners(oneshot::Sender<Vec<Multiaddr>>),
    Dial(Multiaddr, oneshot::Sender<Result<(), P2pError>>),
    AddAddress(PeerId, Multiaddr),
    Provide(RecordKey, oneshot::Sender<Result<(), P2pError>>),
    Providers(RecordKey, oneshot::Sender<Result<Vec<PeerId>, P2pError>>),
    PutRecord(Record, oneshot::Sender<Result<(), P2pError>>),
    GetRecord(RecordKey, oneshot::Sender<Result<Vec<Checked>, P2pError>>),
    Gossip(Vec<u8>, oneshot::Sender<Result<(), P2pError>>),
    Request(
        PeerId,
        wire::Request,
        oneshot::Sender<Result<Answer, P2pError>>,
    ),
    Status(oneshot::Sender<Status>),
    Block(PeerId, bool),
}

/// A running peer's handle on its swarm. Dropping every handle stops the swarm.
#[derive(Clone)]
pub struct Network {
    tx: mpsc::Sender<Command>,
    peer: PeerId,
    pub stats: Arc<Stats>,
    directory: Directory,
    events: Arc<tenet_net::events::EventLog>,
    transport: Transport,
}

/// The adverts peers gossiped, newest per peer, checked.
pub type Directory = Arc<std::sync::Mutex<HashMap<PeerId, Advert>>>;

/// Peers whose gossiped adverts one peer keeps (the oldest beyond it are dropped).
pub const MAX_DIRECTORY: usize = 4096;

#[derive(NetworkBehaviour)]
struct Behaviour {
    identify: identify::Behaviour,
    kad: kad::Behaviour<MemoryStore>,
    rpc: request_response::Behaviour<wire::NodeCodec>,
    gossip: gossipsub::Behaviour,
    blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
}

fn behaviour(
    key: &libp2p::identity::Keypair,
    config: &Config,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let peer = key.public().to_peer_id();
    let mut kcfg = kad::Config::new(KAD_PROTOCOL);
    kcfg.set_record_filtering(kad::StoreInserts::FilterBoth);
    kcfg.set_query_timeout(Duration::from_secs(10));
    kcfg.set_max_packet_size(4 * MAX_RECORD_BYTES);
    let store = MemoryStore::with_config(
        peer,
        MemoryStoreConfig {
            max_records: 4096,
            max_value_bytes: MAX_RECORD_BYTES,
            max_providers_per_key: 64,
            max_provided_keys: 1024,
        },
    );
    let mut kad = kad::Behaviour::with_config(peer, store, kcfg);
    // A peer that only dials would otherwise stay a client until an address of its own is
    // confirmed, and records put to it would fail.
    kad.set_mode(Some(kad::Mode::Server));
    let rpc = request_response::Behaviour::with_codec(
        wire::codec(),
        [(NODE_PROTOCOL, ProtocolSupport::Full)],
        request_response::Config::default()
            .with_request_timeout(config.request_timeout)
            .with_max_concurrent_streams(256),
    );
    // Every message signed by its author and checked by tenet before it is forwarded.
    let gcfg = gossipsub::ConfigBuilder::default()
        .validation_mode(gossipsub::ValidationMode::Strict)
        .validate_messages()
        .max_transmit_size(2 * MAX_RECORD_BYTES)
        .heartbeat_interval(Duration::from_millis(500))
        .build()?;
    let mut gossip =
        gossipsub::Behaviour::new(gossipsub::MessageAuthenticity::Signed(key.clone()), gcfg)?;
    gossip.subscribe(&gossipsub::IdentTopic::new(ADVERT_TOPIC))?;
    Ok(Behaviour {
        identify: identify::Behaviour::new(
            identify::Config::new("/tenet/id/1".into(), key.public())
                .with_agent_version(AGENT.into()),
        ),
        kad,
        rpc,
        gossip,
        blocked: Default::default(),
    })
}

fn build(config: &Config) -> Result<Swarm<Behaviour>, P2pError> {
    let key = crate::keys::keypair(&config.key);
    let start = |e: &dyn std::fmt::Display| P2pError::Start(e.to_string());
    let idle = config.idle_timeout;
    let swarm = match config.transport {
        Transport::Tcp => {
            let b = libp2p::SwarmBuilder::with_existing_identity(key)
                .with_tokio()
                .with_tcp(
                    libp2p::tcp::Config::default().nodelay(true),
                    noise::Config::new,
                    yamux::Config::default,
                )
                .map_err(|e| start(&e))?;
            #[cfg(feature = "quic")]
            let b = b.with_quic();
            b.with_behaviour(|k| behaviour(k, config))
                .map_err(|e| start(&e))?
                .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
                .build()
        }
        Transport::Memory => libp2p::SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_other_transport(|k| {
                use libp2p::Transport as _;
                let noise: Box<dyn std::error::Error + Send + Sync> = match noise::Config::new(k) {
                    Ok(n) => {
                        return Ok(libp2p::core::transport::MemoryTransport::default()
                            .upgrade(libp2p::core::upgrade::Version::V1)
                            .authenticate(n)
                            .multiplex(yamux::Config::default())
                            .boxed());
                    }
                    Err(e) => Box::new(e),
                };
                Err(noise)
            })
            .map_err(|e| start(&e))?
            .with_behaviour(|k| behaviour(k, config))
            .map_err(|e| start(&e))?
            .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
            .build(),
    };
    Ok(swarm)
}

/// The peer id a bootstrap address ends in.
pub fn address_peer(addr: &Multiaddr) -> Option<PeerId> {
    match addr.iter().last() {
        Some(libp2p::multiaddr::Protocol::P2p(peer)) => Some(peer),
        _ => None,
    }
}

impl Network {
    /// Start the swarm: listen, dial the bootstrap peers, join the DHT. Requests from other
    /// peers go to `inbound` (none: every request is refused, as a client does).
    pub async fn start(
        config: Config,
        inbound: Option<mpsc::Sender<Inbound>>,
    ) -> Result<Network, P2pError> {
        let mut swarm = build(&config)?;
        for addr in &config.listen {
            swarm
                .listen_on(addr.clone())
                .map_err(|e| P2pError::Listen {
                    addr: addr.to_string(),
                    message: e.to_string(),
                })?;
        }
        for addr in &config.bootstrap {
            let peer = address_peer(addr).ok_or_else(|| P2pError::BadAddress(addr.to_string()))?;
            swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
            swarm.add_peer_address(peer, addr.clone());
            let _ = swarm.dial(addr.clone());
        }
        if !config.bootstrap.is_empty() {
            let _ = swarm.behaviour_mut().kad.bootstrap();
        }
        let peer = *swarm.local_peer_id();
        let stats = Arc::new(Stats::default());
        let directory = Directory::default();
        let (tx, rx) = mpsc::channel(256);
        let driver = Driver {
            swarm,
            rx,
            inbound,
            stats: stats.clone(),
            spec: config.spec.clone(),
            events: config.events.0.clone(),
            directory: directory.clone(),
            gossip_last: HashMap::new(),
            bootstrap: config.bootstrap.clone(),
            rejoin_every: config.rejoin_every.max(Duration::from_millis(100)),
            per_peer: config.per_peer_inflight.max(1),
            inflight: HashMap::new(),
            inflight_bytes: 0,
            answers: FuturesUnordered::new(),
            queries: HashMap::new(),
            requests: HashMap::new(),
            dials: Vec::new(),
        };
        tokio::spawn(driver.run());
        let net = Network {
            tx,
            peer,
            stats,
            directory,
            events: config.events.0.clone(),
            transport: config.transport,
        };
        // Wait for the listeners, so that `listen_addrs` has them.
        if !config.listen.is_empty() {
            for _ in 0..200 {
                if !net.listen_addrs().await?.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(net)
    }

    pub fn peer_id(&self) -> PeerId {
        self.peer
    }

    /// How this peer reaches others.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The event log this peer writes to (off unless configured).
    pub fn events(&self) -> &tenet_net::events::EventLog {
        &self.events
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, P2pError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| P2pError::Stopped)?;
        rx.await.map_err(|_| P2pError::Stopped)
    }

    /// Where this peer listens, each with its `/p2p/PEER_ID`.
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, P2pError> {
        let peer = self.peer;
        Ok(self
            .ask(Command::Listeners)
            .await?
            .into_iter()
            .map(|a| a.with(libp2p::multiaddr::Protocol::P2p(peer)))
            .collect())
    }

    /// Connect to the peer at `addr` (ending in `/p2p/PEER_ID`).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), P2pError> {
        self.ask(|tx| Command::Dial(addr, tx)).await?
    }

    /// Remember that `peer` listens at `addr` (from its advert).
    pub async fn add_address(&self, peer: PeerId, addr: Multiaddr) -> Result<(), P2pError> {
        self.tx
            .send(Command::AddAddress(peer, addr))
            .await
            .map_err(|_| P2pError::Stopped)
    }

    /// Announce that this peer provides `key`.
    pub async fn provide(&self, key: RecordKey) -> Result<(), P2pError> {
        self.ask(|tx| Command::Provide(key, tx)).await?
    }

    /// The peers providing `key`.
    pub async fn providers(&self, key: RecordKey) -> Result<Vec<PeerId>, P2pError> {
        self.ask(|tx| Command::Providers(key, tx)).await?
    }

    /// Store `record` on the peers closest to its key (and here).
    pub async fn put_record(&self, record: Record) -> Result<(), P2pError> {
        self.ask(|tx| Command::PutRecord(record, tx)).await?
    }

    /// The adverts stored under `peer`'s key, each checked as an inbound put would be.
    pub async fn adverts(&self, peer: &PeerId) -> Result<Vec<Advert>, P2pError> {
        let key = crate::advert::peer_key(peer);
        let found = self.ask(|tx| Command::GetRecord(key, tx)).await??;
        Ok(found
            .into_iter()
            .filter_map(|c| match c {
                Checked::Advert(a) => Some(a),
                Checked::Score(_) => None,
            })
            .collect())
    }

    /// A validator's score records of `kind` for `epoch`, each checked (every distinct one
    /// found: a validator that signed two is seen to have).
    pub async fn score_records(
        &self,
        epoch: u64,
        validator: &PeerId,
        kind: Phase,
    ) -> Result<Vec<ScoreRecord>, P2pError> {
        let key = crate::epoch::score_key(epoch, validator, kind);
        let found = self.ask(|tx| Command::GetRecord(key, tx)).await??;
        Ok(found
            .into_iter()
            .filter_map(|c| match c {
                Checked::Score(s) => Some(s),
                Checked::Advert(_) => None,
            })
            .collect())
    }

    /// Announce `advert` on the gossip topic (it fails while this peer has no gossip peers
    /// yet: call again later).
    pub async fn gossip_advert(&self, advert: &Advert) -> Result<(), P2pError> {
        let bytes = serde_json::to_vec(advert).map_err(|e| P2pError::Query(e.to_string()))?;
        self.ask(|tx| Command::Gossip(bytes, tx)).await?
    }

    /// The adverts gossiped to this peer, newest per peer.
    pub fn directory(&self) -> Vec<Advert> {
        let d = self.directory.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Advert> = d.values().cloned().collect();
        v.sort_by_key(|a| a.key);
        v
    }

    /// Send a node API request to `peer` and wait for its answer.
    pub async fn request(&self, peer: PeerId, request: wire::Request) -> Result<Answer, P2pError> {
        self.ask(|tx| Command::Request(peer, request, tx)).await?
    }

    pub async fn status(&self) -> Result<Status, P2pError> {
        self.ask(Command::Status).await
    }

    /// Refuse every connection to and from `peer`, closing those open (an operator's block
    /// list; the tests split a network with it).
    pub async fn block(&self, peer: PeerId) -> Result<(), P2pError> {
        self.tx
            .send(Command::Block(peer, true))
            .await
            .map_err(|_| P2pError::Stopped)
    }

    /// Take `peer` off the block list.
    pub async fn unblock(&self, peer: PeerId) -> Result<(), P2pError> {
        self.tx
            .send(Command::Block(peer, false))
            .await
            .map_err(|_| P2pError::Stopped)
    }
}

type Pending = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    PeerId,
                    u64,
                    request_response::ResponseChannel<Answer>,
                    Answer,
                ),
            > + Send,
    >,
>;

enum Query {
    Provide(oneshot::Sender<Result<(), P2pError>>),
    Providers(Vec<PeerId>, oneshot::Sender<Result<Vec<PeerId>, P2pError>>),
    Put(oneshot::Sender<Result<(), P2pError>>),
    Get(
        Vec<Checked>,
        oneshot::Sender<Result<Vec<Checked>, P2pError>>,
    ),
}

struct Driver {
    swarm: Swarm<Behaviour>,
    rx: mpsc::Receiver<Command>,
    inbound: Option<mpsc::Sender<Inbound>>,
    stats: Arc<Stats>,
    spec: Option<Arc<NetworkSpec>>,
    events: Arc<tenet_net::events::EventLog>,
    directory: Directory,
    /// When each author's last advert was taken (bounded like the directory).
    gossip_last: HashMap<PeerId, std::time::Instant>,
    bootstrap: Vec<Multiaddr>,
    rejoin_every: Duration,
    per_peer: usize,
    inflight: HashMap<PeerId, (usize, u64)>,
    inflight_bytes: u64,
    answers: FuturesUnordered<Pending>,
    queries: HashMap<kad::QueryId, Query>,
    requests:
        HashMap<request_response::OutboundRequestId, oneshot::Sender<Result<Answer, P2pError>>>,
    dials: Vec<(PeerId, oneshot::Sender<Result<(), P2pError>>)>,
}

/// Unix milliseconds.
pub fn now_ms() -> u64 {
    tenet_net::events::now_us() / 1000
}

impl Driver {
    async fn run(mut self) {
        let mut rejoin = tokio::time::interval(self.rejoin_every);
        rejoin.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rejoin.tick().await;
        loop {
            tokio::select! {
                _ = rejoin.tick() => self.rejoin(),
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => self.command(cmd),
                    // Every handle dropped: the peer is gone.
                    None => break,
                },
                Some((peer, bytes, channel, answer)) = self.answers.next(), if !self.answers.is_empty() => {
                    self.inflight_bytes = self.inflight_bytes.saturating_sub(bytes);
                    if let Some((n, b)) = self.inflight.get_mut(&peer) {
                        *n = n.saturating_sub(1);
                        *b = b.saturating_sub(bytes);
                        if *n == 0 {
                            self.inflight.remove(&peer);
                        }
                    }
                    let _ = self.swarm.behaviour_mut().rpc.send_response(channel, answer);
                }
                event = self.swarm.select_next_some() => self.event(event),
            }
        }
    }

    /// Dial the bootstrap peers this one is not connected to, and refresh the routing table.
    fn rejoin(&mut self) {
        if self.bootstrap.is_empty() {
            return;
        }
        for addr in self.bootstrap.clone() {
            if let Some(peer) = address_peer(&addr)
                && !self.swarm.is_connected(&peer)
            {
                self.swarm
                    .behaviour_mut()
                    .kad
                    .add_address(&peer, addr.clone());
                let _ = self.swarm.dial(addr);
            }
        }
        let _ = self.swarm.behaviour_mut().kad.bootstrap();
    }

    fn command(&mut self, cmd: Command) {
        let swarm = &mut self.swarm;
        match cmd {
            Command::Listeners(tx) => {
                let _ = tx.send(swarm.listeners().cloned().collect());
            }
            Command::Dial(addr, tx) => match address_peer(&addr) {
                Some(peer) => {
                    swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
                    swarm.add_peer_address(peer, addr.clone());
                    if swarm.is_connected(&peer) {
                        let _ = tx.send(Ok(()));
                    } else {
                        match swarm.dial(addr.clone()) {
                            Ok(()) => self.dials.push((peer, tx)),
                            Err(e) => {
                                let _ = tx.send(Err(P2pError::Request {
                                    peer,
                                    message: e.to_string(),
                                }));
                            }
                        }
                    }
                }
                None => {
                    let _ = tx.send(Err(P2pError::BadAddress(addr.to_string())));
                }
            },
            Command::AddAddress(peer, addr) => {
                swarm.add_peer_address(peer, addr.clone());
                swarm.behaviour_mut().kad.add_address(&peer, addr);
            }
            Command::Provide(key, tx) => match swarm.behaviour_mut().kad.start_providing(key) {
                Ok(id) => {
                    self.queries.insert(id, Query::Provide(tx));
                }
                Err(e) => {
                    let _ = tx.send(Err(P2pError::Query(e.to_string())));
                }
            },
            Command::Providers(key, tx) => {
                let id = swarm.behaviour_mut().kad.get_providers(key);
                self.queries.insert(id, Query::Providers(Vec::new(), tx));
            }
            Command::PutRecord(record, tx) => {
                match swarm
                    .behaviour_mut()
                    .kad
                    .put_record(record, kad::Quorum::One)
                {
                    Ok(id) => {
                        self.queries.insert(id, Query::Put(tx));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(P2pError::Query(e.to_string())));
                    }
                }
            }
            Command::GetRecord(key, tx) => {
                let id = swarm.behaviour_mut().kad.get_record(key);
                self.queries.insert(id, Query::Get(Vec::new(), tx));
            }
            Command::Gossip(bytes, tx) => {
                let topic = gossipsub::IdentTopic::new(ADVERT_TOPIC);
                let r = swarm.behaviour_mut().gossip.publish(topic, bytes);
                let _ = tx.send(match r {
                    Ok(_) | Err(gossipsub::PublishError::Duplicate) => Ok(()),
                    Err(e) => Err(P2pError::Query(format!("gossip: {e}"))),
                });
            }
            Command::Request(peer, request, tx) => {
                let id = swarm.behaviour_mut().rpc.send_request(&peer, request);
                self.requests.insert(id, tx);
            }
            Command::Block(peer, true) => {
                swarm.behaviour_mut().blocked.block_peer(peer);
            }
            Command::Block(peer, false) => {
                swarm.behaviour_mut().blocked.unblock_peer(peer);
            }
            Command::Status(tx) => {
                let routing = swarm
                    .behaviour_mut()
                    .kad
                    .kbuckets()
                    .map(|b| b.num_entries())
                    .sum();
                let records = swarm.behaviour_mut().kad.store_mut().records().count();
                let s = &self.stats;
                let _ = tx.send(Status {
                    peer_id: swarm.local_peer_id().to_string(),
                    listen: swarm.listeners().map(|a| a.to_string()).collect(),
                    connected: swarm.connected_peers().map(|p| p.to_string()).collect(),
                    routing,
                    records,
                    inbound_requests: s.inbound_requests.load(Ordering::Relaxed),
                    refused_requests: s.refused_requests.load(Ordering::Relaxed),
                    rate_limited: s.rate_limited.load(Ordering::Relaxed),
                    refused_records: s.refused_records.load(Ordering::Relaxed),
                    stored_records: s.stored_records.load(Ordering::Relaxed),
                    gossip_accepted: s.gossip_accepted.load(Ordering::Relaxed),
                    gossip_refused: s.gossip_refused.load(Ordering::Relaxed),
                    gossip_rate_limited: s.gossip_rate_limited.load(Ordering::Relaxed),
                    known_adverts: self.directory.lock().map_or(0, |d| d.len()),
                });
            }
        }
    }

    fn event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                let mut rest = Vec::new();
                for (p, tx) in self.dials.drain(..) {
                    if p == peer_id {
                        let _ = tx.send(Ok(()));
                    } else {
                        rest.push((p, tx));
                    }
                }
                self.dials = rest;
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                error,
                ..
            } => {
                let mut rest = Vec::new();
                for (p, tx) in self.dials.drain(..) {
                    if p == peer {
                        let _ = tx.send(Err(P2pError::Request {
                            peer,
                            message: error.to_string(),
                        }));
                    } else {
                        rest.push((p, tx));
                    }
                }
                self.dials = rest;
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                // Its listen addresses, so the DHT can hand them to others. Bounded: a peer
                // listing thousands is taken at its first few.
                for addr in info.listen_addrs.into_iter().take(8) {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => self.kad(e),
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            })) => self.gossiped(propagation_source, message_id, message),
            SwarmEvent::Behaviour(BehaviourEvent::Rpc(e)) => self.rpc(e),
            _ => {}
        }
    }

    fn kad(&mut self, event: kad::Event) {
        match event {
            kad::Event::InboundRequest { request } => match request {
                kad::InboundRequest::PutRecord {
                    record: Some(mut record),
                    source,
                    ..
                } => {
                    let now = now_ms();
                    // Named in the event log only: not made when nothing is logged.
                    let key = self.events.enabled().then(|| {
                        String::from_utf8_lossy(record.key.as_ref())
                            .chars()
                            .take(120)
                            .collect::<String>()
                    });
                    match check_any(&record, self.spec.as_deref(), now, Use::Store) {
                        Ok(checked) => {
                            if let (Checked::Score(s), Some(spec)) = (&checked, &self.spec) {
                                // Kept no longer than its epoch's records live.
                                let left = spec.expiry_ms(s.epoch()).saturating_sub(now);
                                record.expires =
                                    Some(std::time::Instant::now() + Duration::from_millis(left));
                            }
                            let stored = self
                                .swarm
                                .behaviour_mut()
                                .kad
                                .store_mut()
                                .put(record)
                                .is_ok();
                            if stored {
                                self.stats.stored_records.fetch_add(1, Ordering::Relaxed);
                            }
                            if let Some(key) = key {
                                self.events.emit(
                                    "p2p.record",
                                    serde_json::json!({"key": key, "from": source.to_string(),
                                        "stored": stored}),
                                );
                            }
                        }
                        Err(e) => {
                            self.stats.refused_records.fetch_add(1, Ordering::Relaxed);
                            if let Some(key) = key {
                                self.events.emit(
                                    "p2p.record_refused",
                                    serde_json::json!({"key": key, "from": source.to_string(),
                                        "why": e.to_string()}),
                                );
                            }
                        }
                    }
                }
                kad::InboundRequest::AddProvider {
                    record: Some(record),
                } => match check_provider(&record.key) {
                    Ok(_) => {
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .kad
                            .store_mut()
                            .add_provider(record);
                    }
                    Err(_) => {
                        self.stats.refused_records.fetch_add(1, Ordering::Relaxed);
                    }
                },
                _ => {}
            },
            kad::Event::OutboundQueryProgressed {
                id, result, step, ..
            } => self.query(id, result, step.last),
            _ => {}
        }
    }

    fn query(&mut self, id: kad::QueryId, result: QueryResult, last: bool) {
        let Some(query) = self.queries.remove(&id) else {
            return;
        };
        match (query, result) {
            (Query::Provide(tx), QueryResult::StartProviding(r)) => {
                // Provided here whatever the result: with no other peer yet, the record is
                // still kept locally and republished.
                let _ = tx.send(r.map(|_| ()).or(Ok(())));
            }
            (Query::Providers(mut found, tx), QueryResult::GetProviders(r)) => {
                if let Ok(GetProvidersOk::FoundProviders { providers, .. }) = r {
                    for p in providers {
                        if !found.contains(&p) {
                            found.push(p);
                        }
                    }
                }
                if last {
                    let _ = tx.send(Ok(found));
                } else {
                    self.queries.insert(id, Query::Providers(found, tx));
                }
            }
            (Query::Put(tx), QueryResult::PutRecord(r)) => {
                // Stored locally in any case; a network of one has nobody else to hold it.
                let _ = tx.send(r.map(|_| ()).or_else(|e| match e {
                    kad::PutRecordError::QuorumFailed { .. } => Ok(()),
                    e => Err(P2pError::Query(e.to_string())),
                }));
            }
            (Query::Get(mut found, tx), QueryResult::GetRecord(r)) => {
                if let Ok(GetRecordOk::FoundRecord(peer_record)) = r {
                    let record = peer_record.record;
                    // What a query returns is checked like what a peer stores here (but
                    // read outside its phase window: it was stored inside it).
                    match check_any(&record, self.spec.as_deref(), now_ms(), Use::Read) {
                        Ok(checked) => {
                            if !found.contains(&checked) {
                                found.push(checked);
                            }
                        }
                        Err(_) => {
                            self.stats.refused_records.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                if last {
                    let _ = tx.send(Ok(found));
                } else {
                    self.queries.insert(id, Query::Get(found, tx));
                }
            }
            (query, _) => {
                // A republish or a result of another kind under the same id: keep waiting.
                if !last {
                    self.queries.insert(id, query);
                }
            }
        }
    }

    /// A gossiped message: taken only if it is an advert signed by the peer that wrote the
    /// message; otherwise refused (gossipsub then scores the peer that forwarded it down).
    fn gossiped(&mut self, from: PeerId, id: gossipsub::MessageId, message: gossipsub::Message) {
        let checked = (|| {
            if message.data.len() > MAX_RECORD_BYTES {
                return Err(RecordError::TooLarge(message.data.len()));
            }
            let author = message.source.ok_or(RecordError::Signature)?;
            let record = crate::advert::record_from_parts(
                crate::advert::peer_key(&author).as_ref(),
                &message.data,
            );
            check_record(&record, now_ms() / 1000).map(|a| (author, a))
        })();
        let verdict = match checked {
            Ok((author, _))
                if self
                    .gossip_last
                    .get(&author)
                    .is_some_and(|t| t.elapsed() < GOSSIP_MIN_INTERVAL) =>
            {
                self.stats
                    .gossip_rate_limited
                    .fetch_add(1, Ordering::Relaxed);
                gossipsub::MessageAcceptance::Ignore
            }
            Ok((author, advert)) => {
                if self.gossip_last.len() >= MAX_DIRECTORY {
                    self.gossip_last
                        .retain(|_, t| t.elapsed() < GOSSIP_MIN_INTERVAL);
                    if self.gossip_last.len() >= MAX_DIRECTORY {
                        self.gossip_last.clear();
                    }
                }
                self.gossip_last.insert(author, std::time::Instant::now());
                self.stats.gossip_accepted.fetch_add(1, Ordering::Relaxed);
                let mut d = self.directory.lock().unwrap_or_else(|e| e.into_inner());
                let newer = d
                    .get(&author)
                    .is_none_or(|old| old.issued_at <= advert.issued_at);
                if d.len() >= MAX_DIRECTORY && !d.contains_key(&author) {
                    let oldest = d.iter().min_by_key(|(_, a)| a.issued_at).map(|(p, _)| *p);
                    if let Some(p) = oldest {
                        d.remove(&p);
                    }
                }
                if newer {
                    d.insert(author, advert);
                }
                gossipsub::MessageAcceptance::Accept
            }
            Err(e) => {
                self.stats.gossip_refused.fetch_add(1, Ordering::Relaxed);
                self.events.emit(
                    "p2p.gossip_refused",
                    serde_json::json!({"from": from.to_string(), "why": e.to_string()}),
                );
                gossipsub::MessageAcceptance::Reject
            }
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .gossip
            .report_message_validation_result(&id, &from, verdict);
    }

    fn rpc(&mut self, event: request_response::Event<wire::Request, wire::Answer>) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => self.inbound_request(peer, request, channel),
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(tx) = self.requests.remove(&request_id) {
                        let _ = tx.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                peer,
                request_id,
                error,
                ..
            } => {
                if let Some(tx) = self.requests.remove(&request_id) {
                    let _ = tx.send(Err(P2pError::Request {
                        peer,
                        message: error.to_string(),
                    }));
                }
            }
            _ => {}
        }
    }

    fn inbound_request(
        &mut self,
        peer: PeerId,
        request: wire::Request,
        channel: request_response::ResponseChannel<Answer>,
    ) {
        self.stats.inbound_requests.fetch_add(1, Ordering::Relaxed);
        let refuse = |this: &mut Driver, channel, e: ApiError| {
            let _ = this
                .swarm
                .behaviour_mut()
                .rpc
                .send_response(channel, Answer::error(&e));
        };
        let Some(inbound) = self.inbound.clone() else {
            self.stats.refused_requests.fetch_add(1, Ordering::Relaxed);
            return refuse(
                self,
                channel,
                ApiError::new(
                    ErrorCode::NotFound,
                    "this peer hosts nothing: it is a client",
                ),
            );
        };
        let bytes = request.body.0.len() as u64;
        let (n, held) = *self.inflight.entry(peer).or_default();
        let over = if n >= self.per_peer {
            Some(format!(
                "at most {} requests from one peer at a time; wait for an answer before sending more",
                self.per_peer
            ))
        } else if held + bytes > PER_PEER_BYTES {
            Some(format!(
                "at most {PER_PEER_BYTES} request bytes from one peer at a time; wait for an answer before sending more"
            ))
        } else if self.inflight_bytes + bytes > INFLIGHT_BYTES {
            Some("this peer holds as many request bytes as it will: try again later".into())
        } else {
            None
        };
        if let Some(message) = over {
            self.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
            return refuse(self, channel, ApiError::new(ErrorCode::Busy, message));
        }
        let raw = match request.into_raw() {
            Ok(raw) => raw,
            Err(e) => {
                self.stats.refused_requests.fetch_add(1, Ordering::Relaxed);
                return refuse(
                    self,
                    channel,
                    ApiError::new(ErrorCode::BadRequest, e.to_string()),
                );
            }
        };
        let entry = self.inflight.entry(peer).or_default();
        entry.0 += 1;
        entry.1 += bytes;
        self.inflight_bytes += bytes;
        self.answers.push(Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let sent = inbound
                .send(Inbound {
                    peer,
                    request: raw,
                    reply: tx,
                })
                .await;
            let answer = match (sent, rx.await) {
                (Ok(()), Ok(raw)) => Answer::from_raw(raw),
                _ => Answer::error(&ApiError::new(
                    ErrorCode::Internal,
                    "the peer is shutting down",
                )),
            };
            (peer, bytes, channel, answer)
        }));
    }
}
