//! The node registry: a node is registered (by an operator, or by the node for itself),
//! becomes active once it answers `/v1/info` as the key it claims — its advertised memory and
//! flop limits, its device and whether that device may serve the exact tier recorded — sends heartbeats, and deregisters when it leaves. Stake is never
//! what a registrant claims: only the admin bonds it ([`Coordinator::bond`], or a first
//! registration the admin makes), and a node coming back keeps the stake it had. A health
//! monitor probes nodes whose heartbeats stopped and marks them unhealthy (no new jobs), and
//! brings back unhealthy nodes that answer again.

use std::sync::Arc;
use std::time::Duration;

use tenet_ledger::{Ledger, LedgerError, NodeLimits, NodeRecord, NodeState};
use tenet_net::NodeClient;
use tenet_proto::auth::PublicKey;
use tenet_proto::commit::Tier;
use tenet_proto::wire::NodeInfo;

use crate::dispatch::{Coordinator, DispatchError, now};

/// How long a probe of a node may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The most a node's `/v1/info` answer may be (it is a few hundred bytes).
const PROBE_ANSWER_BYTES: u64 = 64 << 10;

/// The most of a node's device description the ledger keeps.
const DEVICE_TEXT_BYTES: usize = 96;

/// What a node's `/v1/info` says it can run: its limits, its device, and whether that device
/// may serve the exact tier (it passed its determinism check; a node that lists no devices is
/// from before devices and serves what its tiers say).
fn advertised(info: &NodeInfo) -> NodeLimits {
    // What the node says is kept in the ledger and shown by the API: at most
    // DEVICE_TEXT_BYTES of it (the whole answer may be 64 KiB).
    let mut device = info
        .devices
        .first()
        .map(|d| format!("{} {}", d.class, d.spec))
        .unwrap_or_default();
    if device.len() > DEVICE_TEXT_BYTES {
        let mut end = DEVICE_TEXT_BYTES;
        while !device.is_char_boundary(end) {
            end -= 1;
        }
        device.truncate(end);
    }
    NodeLimits {
        memory_limit: clamp_i64(info.memory_limit_bytes),
        max_flops: clamp_i64(info.max_job_flops),
        device,
        exact: info.tiers.contains(&Tier::Exact)
            && info.devices.iter().all(|d| d.tiers.contains(&Tier::Exact)),
    }
}

impl<L: Ledger + 'static> Coordinator<L> {
    /// Ask the node at `url` who it is and what it takes.
    async fn probe(&self, url: &str) -> Result<NodeInfo, DispatchError> {
        // Anyone may name a URL to register, so its answer is read only up to what a node's
        // info can be.
        let client = NodeClient::new(url, self.key.clone())
            .map_err(|e| DispatchError::BadRequest(e.to_string()))?
            .with_timeout(PROBE_TIMEOUT)
            .with_answer_limits(PROBE_ANSWER_BYTES, PROBE_ANSWER_BYTES);
        tokio::time::timeout(PROBE_TIMEOUT, client.info())
            .await
            .map_err(|_| DispatchError::Nodes(format!("{url} did not answer /v1/info in time")))?
            .map_err(|e| DispatchError::Nodes(format!("{url}: {e}")))
    }

    /// Register the node at `url` and activate it. Its id is what it says in `/v1/info`; when
    /// `expect` is given (a node registering itself) it must say that. `stake` is bonded only
    /// to a node the ledger has never seen, and only the admin may ask for it (the HTTP layer
    /// checks); a node coming back keeps the stake it had. Jobs reach it only if it has stake
    /// and trusts this coordinator's key.
    pub async fn register_node(
        &self,
        url: &str,
        stake: i64,
        expect: Option<&PublicKey>,
    ) -> Result<NodeRecord, DispatchError> {
        if stake < 0 {
            return Err(DispatchError::BadRequest(
                "a node's stake cannot be negative".into(),
            ));
        }
        let info = self.probe(url).await?;
        let id = info.node_id;
        if let Some(expected) = expect
            && *expected != id
        {
            return Err(DispatchError::BadRequest(format!(
                "the node at {url} answers as {id}, not as {expected}"
            )));
        }
        let record = NodeRecord {
            id: id.to_hex(),
            url: url.to_string(),
            stake,
            state: NodeState::Registered,
            registered_at: now(),
            last_heartbeat: now(),
            agreed: 0,
            disagreed: 0,
            score_sum: 0.0,
            operator: String::new(),
            memory_limit: 0,
            max_flops: 0,
            device: String::new(),
            exact: true,
        };
        let facts = advertised(&info);
        let record = NodeRecord {
            memory_limit: facts.memory_limit,
            max_flops: facts.max_flops,
            device: facts.device,
            exact: facts.exact,
            ..record
        };
        self.ledger.register_node(&record).await?;
        self.ledger
            .set_node_state(&record.id, NodeState::Active)
            .await?;
        self.forget_registry();
        let node = self.registered(&record.id).await?;
        self.events.emit(
            "node",
            serde_json::json!({"node": node.id, "phase": "joined", "url": node.url, "stake": node.stake, "device": node.device}),
        );
        Ok(node)
    }

    /// The admin bonds `delta` more stake to node `id` (negative: takes it back, never below
    /// zero) and, when given, names the operator who answers for it: no job's replicas share
    /// an operator.
    pub async fn bond(
        &self,
        id: &str,
        delta: i64,
        operator: Option<&str>,
    ) -> Result<NodeRecord, DispatchError> {
        if operator.is_some_and(|o| o.is_empty() || o.len() > 200) {
            return Err(DispatchError::BadRequest(
                "an operator is a name of 1 to 200 bytes".into(),
            ));
        }
        let node = self.ledger.bond(id, delta, operator, now()).await?;
        self.forget_registry();
        Ok(node)
    }

    /// A registered node is alive: note the time, and bring it back if it was unhealthy.
    pub async fn heartbeat(&self, id: &str) -> Result<NodeRecord, DispatchError> {
        let mut node = self.registered(id).await?;
        node.last_heartbeat = now();
        self.ledger.heartbeat(id, node.last_heartbeat).await?;
        if node.state != NodeState::Active {
            self.ledger.set_node_state(id, NodeState::Active).await?;
            self.forget_registry();
            node.state = NodeState::Active;
            self.events
                .emit("node", serde_json::json!({"node": id, "phase": "healthy"}));
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
        self.forget_registry();
        node.state = NodeState::Deregistered;
        self.events
            .emit("node", serde_json::json!({"node": id, "phase": "left"}));
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
            let info = self
                .probe(&node.url)
                .await
                .ok()
                .filter(|i| i.node_id.to_hex() == node.id);
            let alive = info.is_some();
            if let Some(info) = info {
                self.ledger.heartbeat(&node.id, now()).await?;
                let facts = advertised(&info);
                let known = NodeLimits {
                    memory_limit: node.memory_limit,
                    max_flops: node.max_flops,
                    device: node.device.clone(),
                    exact: node.exact,
                };
                if facts != known {
                    self.ledger.set_node_limits(&node.id, &facts).await?;
                    self.forget_registry();
                }
            }
            let to = if alive {
                NodeState::Active
            } else {
                NodeState::Unhealthy
            };
            if to != node.state {
                self.ledger.set_node_state(&node.id, to).await?;
                self.forget_registry();
                let phase = if alive { "healthy" } else { "offline" };
                self.events
                    .emit("node", serde_json::json!({"node": node.id, "phase": phase}));
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

/// A limit as the ledger stores it.
fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_proto::wire::DeviceAd;

    /// A node naming its device with kilobytes of text gets DEVICE_TEXT_BYTES of it kept.
    #[test]
    fn a_long_device_claim_is_cut_to_a_bound() {
        let info = NodeInfo {
            node_id: tenet_proto::auth::KeyPair::from_seed([1; 32]).public(),
            version: String::new(),
            backend: String::new(),
            cores: 1,
            memory_limit_bytes: 1,
            max_job_flops: 1,
            tiers: vec![Tier::Exact],
            price_per_gflop: 0.0,
            open: false,
            devices: vec![DeviceAd {
                spec: "é".repeat(20_000),
                name: String::new(),
                class: "gpu".into(),
                memory_bytes: 1,
                tiers: vec![Tier::Exact],
                exact_refused: None,
            }],
        };
        let facts = advertised(&info);
        assert!(facts.device.len() <= DEVICE_TEXT_BYTES);
        assert!(facts.device.starts_with("gpu é"));
        assert!(facts.exact);
    }
}
