//! `tenet-p2p`: tenet without a coordinator. Peers find each other over libp2p — TCP or QUIC
//! with Noise and Yamux, identify, a Kademlia DHT whose every record is checked before it is
//! stored — and carry the node API between them on a request-response protocol, so a node
//! needs no HTTP port and a caller no coordinator.
//!
//! - [`keys`]: a peer's libp2p identity is its node key; peer ids and tenet keys convert
//!   both ways.
//! - [`wire`]: the node API on `/tenet/node/1`, bounded.
//! - [`advert`]: the DHT's keys and records — signed peer adverts, task provider records —
//!   and their checks.
//! - [`epoch`]: the network spec, epochs and their phases, the validators' score records
//!   (commit, then reveal) and how an epoch settles.
//! - [`swarm`]: the swarm and the task driving it; [`swarm::Network`] is the handle.
//! - [`validator`]: a validator — challenges, scores by commit-reveal, settlement into
//!   its ledger.
//! - [`link`]: a `tenet_net::Link` over the swarm, so `NodeClient` drives a peer.
//! - [`host`]: a hoster — a node announced on the DHT and answering peers.
//! - [`local`]: a whole network in one process (validators, hosters, liars) for the demo,
//!   tests and benchmarks.
//! - [`call`]: a verified job without a coordinator — find hosters, commit, reveal, agree,
//!   receipt.

pub mod advert;
pub mod call;
pub mod epoch;
pub mod host;
pub mod keys;
pub mod link;
pub mod local;
pub mod swarm;
pub mod validator;
pub mod wire;

pub use libp2p::{Multiaddr, PeerId};
pub use swarm::{Config, Network, P2pError, Transport};
