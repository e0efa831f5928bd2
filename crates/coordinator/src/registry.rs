//! The node registry: a node is registered with a stake (by an operator, or by the node for
//! itself), becomes active once it answers `/v1/info` as the key it claims, sends heartbeats,
//! and deregisters when it leaves. A health monitor probes nodes whose heartbeats stopped and
//! marks them unhealthy (no new jobs), and brings back unhealthy nodes that answer again.

use std::sync::Arc;
use std::time::Duration;

use tenet_ledger::{Ledger, LedgerError, NodeRecord, NodeState};
use tenet_node::NodeClient;
use tenet_proto::auth::PublicKey;

use crate::dispatch::{Coordinator, DispatchError, now};

/// How long a probe of a node may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

impl<L: Ledger + 'static> Coordinator<L> {
    /// Ask the node at `url` who it is.
    async fn probe(&self, url: &str) -> Result<PublicKey, DispatchError> {
        let client = NodeClient::new(url, self.key.clone())
            .map_err(|e| DispatchError::BadRequest(e.to_string()))?;
        let info = tokio::time::timeout(PROBE_TIMEOUT, client.info())
            .await
            .map_err(|_| DispatchError::Nodes(format!("{url} did not answer /v1/info in time")))?
            .map_err(|e| DispatchError::Nodes(format!("{url}: {e}")))?;
        Ok(info.node_id)
    }

    /// Register the node at `url` with `stake` and activate it. Its id is what it says in
    /// `/v1/info`; when `expect` is given (a node registering itself) it must say that.
    /// Jobs reach it only if it trusts this coordinator's key.
    pub async fn register_node(
        &self,
        url: &str,
        stake: i64,
        expect: Option<&PublicKey>,
    ) -> Result<NodeRecord, DispatchError> {
        if stake <= 0 {
            return Err(DispatchError::BadRequest(
                "a node's stake must be a positive integer".into(),
            ));
        }
        let id = self.probe(url).await?;
        if let Some(expected) = expect
            && *expected != id
        {
            return Err(DispatchError::BadRequest(format!(
                "the node at {url} answers as {id}, not as {expected}"
            )));
        }
        let mut record = NodeRecord {
            id: id.to_hex(),
            url: url.to_string(),
            stake,
            state: NodeState::Registered,
            registered_at: now(),
            last_heartbeat: now(),
            agreed: 0,
            disagreed: 0,
            score_sum: 0.0,
        };
        self.ledger.register_node(&record).await?;
        self.ledger
            .set_node_state(&record.id, NodeState::Active)
            .await?;
        record.state = NodeState::Active;
        Ok(record)
    }

    /// A registered node is alive: note the time, and bring it back if it was unhealthy.
    pub async fn heartbeat(&self, id: &str) -> Result<NodeRecord, DispatchError> {
        let mut node = self.registered(id).await?;
        node.last_heartbeat = now();
        self.ledger.heartbeat(id, node.last_heartbeat).await?;
        if node.state != NodeState::Active {
            self.ledger.set_node_state(id, NodeState::Active).await?;
            node.state = NodeState::Active;
        }
        Ok(node)
    }

    /// The node leaves: it gets no new jobs (jobs it already committed to still ask it to
    /// reveal). It may register again later.
    pub async fn deregister(&self, id: &str) -> Result<NodeRecord, DispatchError> {
        let mut node = self.registered(id).await?;
        self.ledger
            .set_node_state(id, NodeState::Deregistered)
            .await?;
        node.state = NodeState::Deregistered;
        Ok(node)
    }

    /// A node that is registered and has not left.
    async fn registered(&self, id: &str) -> Result<NodeRecord, DispatchError> {
        let node = self
            .ledger
            .node(id)
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("node {id}")))?;
        if node.state == NodeState::Deregistered {
            return Err(LedgerError::NotFound(format!(
                "node {id} has deregistered; register it again"
            ))
            .into());
        }
        Ok(node)
    }

    /// One round of the health monitor: probe every active node silent for longer than
    /// `silent_after` and every unhealthy node; mark each by whether it answers as itself.
    /// Returns how many nodes changed state.
    pub async fn check_health(&self, silent_after: Duration) -> Result<usize, DispatchError> {
        let cutoff = now() - silent_after.as_secs() as i64;
        let mut changed = 0;
        for node in self.ledger.nodes().await? {
            let due = match node.state {
                NodeState::Active => node.last_heartbeat <= cutoff,
                NodeState::Unhealthy | NodeState::Registered => true,
                NodeState::Deregistered => false,
            };
            if !due {
                continue;
            }
            let alive = self
                .probe(&node.url)
                .await
                .is_ok_and(|id| id.to_hex() == node.id);
            if alive {
                self.ledger.heartbeat(&node.id, now()).await?;
            }
            let to = if alive {
                NodeState::Active
            } else {
                NodeState::Unhealthy
            };
            if to != node.state {
                self.ledger.set_node_state(&node.id, to).await?;
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// Run [`Coordinator::check_health`] every `every`, treating nodes silent for three
    /// intervals as suspects, until the task is dropped.
    pub async fn monitor_health(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _ = self.check_health(every * 3).await;
        }
    }
}
