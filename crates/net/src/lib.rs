//! `tenet-net`: how tenet's services reach each other, and the serving code they share. The
//! node API's client ([`client::NodeClient`]) signs every request and carries it over a
//! [`client::Link`] — HTTP/1.1 here ([`client::HttpLink`]), a libp2p stream in `tenet-p2p` —
//! within a deadline and an answer limit; the node's gate ([`gate::Gate`]) checks what
//! arrives (trust, clock, signature, nonces) whatever carried it. The accept loop, paced body
//! reads and replies ([`serve`]), identities ([`identity`]), the event log ([`events`]) and
//! parallel blake3 ([`digest`]) are shared by the node, the coordinator and the peers, so the
//! node and the coordinator meet only over the wire. Generation across nodes
//! ([`stages`]) is a client-side driver of the node API.

mod body;
pub mod busy;
pub mod client;
pub mod digest;
pub mod errors;
pub mod events;
pub mod gate;
pub mod identity;
pub mod serve;
pub mod stages;

pub use bytes::Bytes;
pub use client::{ClientError, Link, NodeClient, RawRequest, RawResponse};
pub use hyper::Method;
