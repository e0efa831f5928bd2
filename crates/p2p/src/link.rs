//! The node API over libp2p: a [`tenet_net::Link`] that carries each signed request to one
//! peer on `/tenet/node/1`, so a [`tenet_net::NodeClient`] drives a peer exactly as it drives a
//! node over HTTP — the same calls, signatures, deadlines and answer limits.

use std::sync::atomic::Ordering;

use libp2p::PeerId;
use tenet_net::client::{Exchange, Link, LinkFuture};
use tenet_net::{ClientError, NodeClient, RawRequest, RawResponse};
use tenet_proto::auth::KeyPair;

use crate::swarm::Network;
use crate::wire;

/// A link to one peer through this process's swarm.
pub struct P2pLink {
    net: Network,
    peer: PeerId,
}

impl P2pLink {
    pub fn new(net: Network, peer: PeerId) -> P2pLink {
        P2pLink { net, peer }
    }

    /// A client for `peer`'s node API, signing as `key`.
    pub fn client(net: &Network, peer: PeerId, key: KeyPair) -> NodeClient {
        NodeClient::over(Box::new(P2pLink::new(net.clone(), peer)), key)
    }

    async fn send(&self, raw: RawRequest, how: Exchange<'_>) -> Result<RawResponse, ClientError> {
        let size = raw.body.len() as u64;
        let answer = self
            .net
            .request(self.peer, wire::Request::from_raw(raw))
            .await
            .map_err(|e| ClientError::Transport {
                addr: self.url(),
                message: e.to_string(),
            })?;
        if let Some(taken) = how.taken {
            taken.fetch_add(size, Ordering::Relaxed);
        }
        let got = answer.body.0.len() as u64;
        if got > how.limit || !(how.admit)(got) {
            return Err(ClientError::TooLarge {
                addr: self.url(),
                limit: how.limit,
                size: got,
            });
        }
        Ok(RawResponse {
            status: answer.status,
            body: answer.body.0,
        })
    }
}

impl Link for P2pLink {
    fn url(&self) -> String {
        format!("p2p:{}", self.peer)
    }

    fn exchange<'a>(&'a self, raw: RawRequest, how: Exchange<'a>) -> LinkFuture<'a> {
        Box::pin(self.send(raw, how))
    }
}
