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
//! - [`swarm`]: the swarm and the task driving it; [`swarm::Network`] is the handle.
//! - [`link`]: a `tenet_net::Link` over the swarm, so `NodeClient` drives a peer.
//! - [`host`]: a hoster — a node announced on the DHT and answering peers.
//! - [`call`]: a verified job without a coordinator — find hosters, commit, reveal, agree,
//!   receipt.

pub mod advert;
pub mod call;
pub mod host;
pub mod keys;
pub mod link;
pub mod swarm;
pub mod wire;

pub use libp2p::{Multiaddr, PeerId};
pub use swarm::{Config, Network, P2pError, Transport};
