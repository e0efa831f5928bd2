//! Joining a coordinator: a node started with `--coordinator URL` learns the coordinator's
//! key (and trusts it), registers itself with its stake once it listens, sends heartbeats,
//! and deregisters before it drains on shutdown. The node's side of the coordinator's registry
//! routes (`PUT /v1/nodes/{id}`, `POST /v1/nodes/{id}/heartbeat`, `DELETE /v1/nodes/{id}`).

use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use tenet_proto::auth::{KeyPair, PublicKey};

use tenet_net::client::{ClientError, NodeClient, RawRequest};

/// How a node joins a coordinator.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// The coordinator's URL.
    pub coordinator: String,
    /// Stake to bond at the first registration: only the coordinator's admin may, so
    /// `api_key` must then be the admin key. Without it the node registers with none (or,
    /// coming back, with what it had) and gets jobs once the admin bonds some.
    #[serde(default)]
    pub stake: Option<i64>,
    /// An API key of the coordinator's, if it does not accept the node's own signature for
    /// registration (it does when it trusts the node's key or runs open).
    #[serde(default)]
    pub api_key: Option<String>,
    /// The URL the coordinator reaches this node at [default: http:// and the listen address].
    #[serde(default)]
    pub advertise: Option<String>,
    /// Seconds between heartbeats.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_secs: f64,
}

fn default_heartbeat() -> f64 {
    10.0
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("cannot reach the coordinator at {url}: {source}")]
    Unreachable { url: String, source: ClientError },
    #[error("the coordinator at {0} did not say its key in /v1/info")]
    NoKey(String),
    #[error("the coordinator at {url} refused to register this node: {source}")]
    Refused { url: String, source: ClientError },
}

/// A node's link to its coordinator.
pub struct Link {
    client: NodeClient,
    membership: Membership,
    node_id: PublicKey,
}

impl Link {
    /// Ask the coordinator at `m.coordinator` for its key, to trust it.
    pub async fn coordinator_key(m: &Membership, key: &KeyPair) -> Result<PublicKey, JoinError> {
        let unreachable = |source| JoinError::Unreachable {
            url: m.coordinator.clone(),
            source,
        };
        let client = NodeClient::new(&m.coordinator, key.clone()).map_err(unreachable)?;
        let r = client
            .send(RawRequest {
                method: Method::GET,
                path: "/v1/info".into(),
                headers: Vec::new(),
                body: Bytes::new(),
            })
            .await
            .map_err(unreachable)?;
        serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["coordinator"].as_str().and_then(PublicKey::parse))
            .ok_or_else(|| JoinError::NoKey(m.coordinator.clone()))
    }

    /// Register this node (listening at `listen_url` unless `advertise` says otherwise).
    pub async fn join(m: Membership, key: &KeyPair, listen_url: &str) -> Result<Link, JoinError> {
        let client = NodeClient::new(&m.coordinator, key.clone()).map_err(|source| {
            JoinError::Unreachable {
                url: m.coordinator.clone(),
                source,
            }
        })?;
        let link = Link {
            client,
            node_id: key.public(),
            membership: m,
        };
        let url = link
            .membership
            .advertise
            .clone()
            .unwrap_or_else(|| listen_url.to_string());
        let body = serde_json::json!({"url": url, "stake": link.membership.stake}).to_string();
        let path = format!("/v1/nodes/{}", link.node_id);
        link.send(Method::PUT, &path, body, true)
            .await
            .map_err(|source| JoinError::Refused {
                url: link.membership.coordinator.clone(),
                source,
            })?;
        Ok(link)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: String,
        with_api_key: bool,
    ) -> Result<(), ClientError> {
        let mut req = match &self.membership.api_key {
            // A bearer key takes the place of the signature.
            Some(k) if with_api_key => RawRequest {
                method,
                path: path.to_string(),
                headers: vec![("authorization".into(), format!("Bearer {k}"))],
                body: Bytes::from(body),
            },
            _ => self.client.signed(method, path, Bytes::from(body)),
        };
        req.headers
            .push(("content-type".into(), "application/json".into()));
        self.client.send(req).await?.into_result().map(|_| ())
    }

    /// Say "alive" every `heartbeat_secs`, forever; `report` hears each failure.
    pub async fn heartbeats(&self, report: impl Fn(&ClientError)) {
        let every = Duration::from_secs_f64(self.membership.heartbeat_secs.max(0.05));
        let path = format!("/v1/nodes/{}/heartbeat", self.node_id);
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = self.send(Method::POST, &path, String::new(), false).await {
                report(&e);
            }
        }
    }

    /// Deregister: the coordinator sends no new jobs.
    pub async fn leave(&self) -> Result<(), ClientError> {
        let path = format!("/v1/nodes/{}", self.node_id);
        self.send(Method::DELETE, &path, String::new(), false).await
    }
}
