//! A validator: each epoch it challenges every hoster it knows of (from the gossiped adverts)
//! with random inputs to the tasks they host, drawn from a seed it committed to the epoch
//! before; scores each hoster by how often it answered as the majority of that task's hosters
//! did (the exact tier: the same output hash; the tolerant tier, when the spec sets a
//! tolerance: within it of the element-wise median); commits to its scores in the commit phase and reveals them in the reveal phase, both
//! as signed DHT records; and, once an epoch is over, settles it from every validator's
//! records ([`crate::epoch::settle`]) into its own ledger — a slash for each hoster in bad
//! standing, a credit for each in good — with the signed records kept as evidence.
//!
//! Seeds and what is left to reveal are kept in the data directory, so a validator restarted
//! within an epoch still reveals what it committed to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::PeerId;
use tenet_ir::{DType, Graph, HostTensor};
use tenet_ledger::{Ledger, NodeRecord, NodeState, SqlLedger};
use tenet_proto::Hash;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::Tier;

use crate::call::{CallSpec, Found, Hoster};
use crate::epoch::{
    NetworkSpec, Phase, Score, ScoreCommit, ScoreRecord, ScoreReveal, Settled, scores_commitment,
    seed_commitment, settle,
};
use crate::swarm::{Network, now_ms};

/// A gossiped advert older than this is taken to be from a hoster that has left.
pub const ADVERT_STALE_SECS: u64 = 600;

/// How a validator runs.
#[derive(Clone, Debug)]
pub struct ValidatorOptions {
    pub spec: Arc<NetworkSpec>,
    /// Where seeds, evidence and the ledger live.
    pub data_dir: PathBuf,
    /// Reveal scores other than those committed to (every hoster scored 1): for showing that
    /// such a validator is ignored. Never set it on a real network.
    pub cheat_scores: bool,
}

/// Why a validator could not start.
#[derive(Debug, thiserror::Error)]
pub enum ValidatorError {
    #[error(
        "this peer's key is not one of the network's validators: add it to the spec's `validators` (key {0})"
    )]
    NotValidator(String),
    #[error("the validator's ledger: {0}")]
    Ledger(#[from] tenet_ledger::LedgerError),
    #[error("the validator's data directory {path}: {message}")]
    Io { path: String, message: String },
}

/// What a validator has done, for `tenet peer status`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ValidatorState {
    /// The last epoch it scored, and the scores.
    pub scored_epoch: Option<u64>,
    pub scores: Vec<Score>,
    /// Challenges sent, and answered as the majority did, over its life.
    pub challenges_sent: u64,
    pub challenges_agreed: u64,
    /// Epochs it committed and revealed scores for.
    pub committed: u64,
    pub revealed: u64,
    /// The epochs it settled, newest last (the last few).
    pub settled: Vec<Settled>,
}

/// A running validator.
pub struct Validator {
    pub state: Arc<Mutex<ValidatorState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Validator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the validator keeps on disk between restarts.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Kept {
    /// Seeds by epoch (hex): the next epoch's, committed already.
    seeds: BTreeMap<u64, String>,
    /// A commitment made and not yet revealed: the epoch, scores and salt.
    pending: Option<(u64, Vec<Score>, String)>,
    /// Epochs settled into the ledger.
    settled: Vec<u64>,
}

struct Run {
    net: Network,
    key: KeyPair,
    spec: Arc<NetworkSpec>,
    dir: PathBuf,
    cheat: bool,
    ledger: SqlLedger,
    kept: Kept,
    state: Arc<Mutex<ValidatorState>>,
    graphs: BTreeMap<Hash, Graph>,
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> ValidatorError {
    ValidatorError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Write `bytes` to `path` so that a crash leaves the old file or the new, never half of one.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl Validator {
    /// Start validating on `net` with the node's `key`.
    pub async fn start(
        net: Network,
        key: KeyPair,
        options: ValidatorOptions,
    ) -> Result<Validator, ValidatorError> {
        if options.spec.stake_of(&key.public()).is_none() {
            return Err(ValidatorError::NotValidator(key.public().to_hex()));
        }
        let dir = options.data_dir.join("validator");
        std::fs::create_dir_all(dir.join("evidence")).map_err(|e| io_error(&dir, e))?;
        let ledger =
            SqlLedger::connect(&format!("sqlite://{}", dir.join("ledger.db").display())).await?;
        let kept_path = dir.join("kept.json");
        let kept: Kept = match std::fs::read(&kept_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| io_error(&kept_path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Kept::default(),
            Err(e) => return Err(io_error(&kept_path, e)),
        };
        let state = Arc::new(Mutex::new(ValidatorState::default()));
        let run = Run {
            net,
            key,
            spec: options.spec,
            dir,
            cheat: options.cheat_scores,
            ledger,
            kept,
            state: state.clone(),
            graphs: BTreeMap::new(),
        };
        let task = tokio::spawn(run.run());
        Ok(Validator { state, task })
    }
}

impl Run {
    fn save(&self) {
        let path = self.dir.join("kept.json");
        if let Ok(bytes) = serde_json::to_vec(&self.kept) {
            let _ = write_atomic(&path, &bytes);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ValidatorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, event: &str, fields: serde_json::Value) {
        self.net.events().emit(event, fields);
    }

    async fn run(mut self) {
        let tick = Duration::from_millis((self.spec.epoch_ms / 20).clamp(50, 1000));
        let mut scored: Option<u64> = None;
        loop {
            let now = now_ms();
            let Some((epoch, phase)) = self.spec.phase_at(now) else {
                tokio::time::sleep(tick).await;
                continue;
            };
            // Settle the epoch before this one once its reveals have had time to spread.
            if epoch >= 1
                && !self.kept.settled.contains(&(epoch - 1))
                && now >= self.spec.start_ms(epoch) + self.spec.epoch_ms / 8
            {
                self.settle_epoch(epoch - 1).await;
            }
            match phase {
                Phase::Commit if scored != Some(epoch) => {
                    scored = Some(epoch);
                    if self.kept.pending.as_ref().is_none_or(|p| p.0 != epoch) {
                        self.score_and_commit(epoch).await;
                    }
                }
                Phase::Reveal if self.kept.pending.as_ref().is_some_and(|p| p.0 == epoch) => {
                    self.reveal(epoch).await;
                }
                _ => {}
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// This epoch's seed: the one committed the epoch before, or a fresh one (uncommitted:
    /// a validator's first epoch).
    fn seed(&mut self, epoch: u64) -> [u8; 32] {
        let kept = self
            .kept
            .seeds
            .get(&epoch)
            .and_then(|h| tenet_proto::from_hex(h))
            .and_then(|v| <[u8; 32]>::try_from(v).ok());
        kept.unwrap_or_else(|| {
            let s = tenet_net::identity::random_bytes::<32>();
            self.kept.seeds.insert(epoch, tenet_proto::to_hex(&s));
            s
        })
    }

    async fn score_and_commit(&mut self, epoch: u64) {
        let seed = self.seed(epoch);
        let deadline = self
            .spec
            .mid_ms(epoch)
            .saturating_sub(self.spec.epoch_ms / 10);
        let scores = self.challenge(epoch, &seed, deadline).await;
        let next = tenet_net::identity::random_bytes::<32>();
        self.kept
            .seeds
            .insert(epoch + 1, tenet_proto::to_hex(&next));
        self.kept.seeds.retain(|e, _| *e + 2 >= epoch);
        let salt = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<32>());
        let commit = ScoreCommit::sign(
            &self.key,
            epoch,
            scores_commitment(epoch, &scores, &salt),
            seed_commitment(&next),
            now_ms(),
        );
        // Kept before it is published: a restart must be able to reveal what others saw.
        self.kept.pending = Some((epoch, scores.clone(), salt));
        self.save();
        if now_ms() >= self.spec.mid_ms(epoch) {
            self.emit(
                "p2p.commit_late",
                serde_json::json!({"epoch": epoch, "why": "challenges outlasted the commit phase"}),
            );
            return;
        }
        let published = self.publish(ScoreRecord::Commit(commit)).await;
        self.emit(
            "p2p.commit",
            serde_json::json!({"epoch": epoch, "hosters": scores.len(), "published": published}),
        );
        let mut st = self.state();
        st.scored_epoch = Some(epoch);
        st.scores = scores;
        if published {
            st.committed += 1;
        }
    }

    async fn reveal(&mut self, epoch: u64) {
        let Some((_, mut scores, salt)) = self.kept.pending.take() else {
            return;
        };
        if self.cheat {
            for s in &mut scores {
                s.score = 1.0;
            }
        }
        let seed = tenet_proto::to_hex(&self.seed(epoch));
        let reveal = ScoreReveal::sign(&self.key, epoch, scores, salt, seed, now_ms());
        let published = self.publish(ScoreRecord::Reveal(reveal)).await;
        self.save();
        self.emit(
            "p2p.reveal",
            serde_json::json!({"epoch": epoch, "published": published}),
        );
        if published {
            self.state().revealed += 1;
        }
    }

    /// Put a record, trying again for a while: a peer that has just joined may not yet have
    /// anyone to store it with.
    async fn publish(&self, record: ScoreRecord) -> bool {
        let Some(r) = record.record(&self.spec, now_ms()) else {
            return false;
        };
        for _ in 0..5 {
            if self.net.put_record(r.clone()).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Challenge every known hoster; its score is the share of its challenges it answered as
    /// the strict majority of its task's hosters did.
    async fn challenge(&mut self, epoch: u64, seed: &[u8; 32], deadline_ms: u64) -> Vec<Score> {
        let me = self.net.peer_id();
        let mut groups: BTreeMap<(Hash, Option<Hash>), Vec<Hoster>> = BTreeMap::new();
        let now_s = now_ms() / 1000;
        for advert in self.net.directory() {
            // A hoster that stopped gossiping has left: it is not challenged (nor scored).
            if advert.issued_at + ADVERT_STALE_SECS < now_s {
                continue;
            }
            let Some(peer) = crate::keys::peer_id(&advert.key) else {
                continue;
            };
            if peer == me {
                continue;
            }
            for h in &advert.tasks {
                groups.entry((h.task, h.weights)).or_default().push(Hoster {
                    peer,
                    advert: advert.clone(),
                });
            }
        }
        // One hoster alone cannot be checked against anyone.
        groups.retain(|_, hosters| hosters.len() >= 2);
        if groups.is_empty() {
            return Vec::new();
        }
        // Challenges go out under a key and a peer id made for this epoch, through a client
        // swarm of their own: to a hoster they look like any stranger's jobs, so it cannot
        // answer validators honestly and callers not.
        let key = tenet_net::identity::generate();
        let mut config = crate::swarm::Config::new(key.clone());
        config.transport = self.net.transport();
        config.bootstrap = self.net.listen_addrs().await.unwrap_or_default();
        config.spec = Some(self.spec.clone());
        let caller = match Network::start(config, None).await {
            Ok(n) => n,
            Err(_) => self.net.clone(),
        };
        for hosters in groups.values() {
            for h in hosters {
                for addr in h.advert.addrs.iter().filter_map(|a| a.parse().ok()) {
                    let _ = caller.add_address(h.peer, addr).await;
                }
            }
        }
        let mut tally: BTreeMap<PeerId, (u32, u32)> = BTreeMap::new();
        for ((task, weights), hosters) in groups {
            let found = Found {
                task,
                weights,
                hosters: hosters.into_iter().take(crate::epoch::MAX_SCORES).collect(),
            };
            let graph = match self.graphs.get(&task) {
                Some(g) => g.clone(),
                None => match crate::call::graph(&caller, &key, &found).await {
                    Ok(g) => {
                        self.graphs.insert(task, g.clone());
                        g
                    }
                    Err(_) => continue,
                },
            };
            for j in 0..self.spec.challenges {
                let left = deadline_ms.saturating_sub(now_ms());
                if left < 200 {
                    break;
                }
                let inputs = challenge_inputs(&graph, seed, &task, j);
                let spec = CallSpec {
                    inputs,
                    replicas: found.hosters.len(),
                    seed: u64::from(j),
                    timeout: Duration::from_millis(left.min(30_000)),
                    tier: if self.spec.tolerance.is_some() {
                        Tier::Tolerant
                    } else {
                        Tier::Exact
                    },
                    tolerance: self.spec.tolerance.unwrap_or(0.0),
                };
                self.emit(
                    "p2p.challenge",
                    serde_json::json!({"epoch": epoch, "task": task.to_hex(), "n": j,
                        "hosters": found.hosters.len()}),
                );
                let outcome = crate::call::call(&caller, &key, &found, spec).await;
                let parts = match outcome {
                    Ok(o) => o.parts,
                    // No majority: nothing to score against.
                    Err(_) => continue,
                };
                let mut st = self.state();
                for p in parts {
                    let Ok(peer) = p.peer.parse::<PeerId>() else {
                        continue;
                    };
                    let t = tally.entry(peer).or_default();
                    t.0 += 1;
                    st.challenges_sent += 1;
                    if p.verdict == "agreed" {
                        t.1 += 1;
                        st.challenges_agreed += 1;
                    }
                }
            }
        }
        tally
            .into_iter()
            .take(crate::epoch::MAX_SCORES)
            .map(|(peer, (sent, agreed))| Score {
                peer: peer.to_string(),
                score: f64::from(agreed) / f64::from(sent.max(1)),
                challenges: sent,
            })
            .collect()
    }

    /// Settle `epoch` from every validator's records into the ledger, once.
    async fn settle_epoch(&mut self, epoch: u64) {
        let (commits, reveals, previous) = epoch_records(&self.net, &self.spec, epoch).await;
        let settled = settle(&self.spec, epoch, &commits, &reveals, &previous);
        let evidence = serde_json::json!({
            "epoch": epoch, "settled": settled, "commits": commits, "reveals": reveals,
            "previous_commits": previous,
        });
        let bytes = serde_json::to_vec_pretty(&evidence).unwrap_or_default();
        let evidence_hash = Hash::of(&bytes);
        let path = self
            .dir
            .join("evidence")
            .join(format!("epoch-{epoch}.json"));
        if let Err(e) = write_atomic(&path, &bytes) {
            self.emit(
                "p2p.settle_failed",
                serde_json::json!({"epoch": epoch, "why": e.to_string()}),
            );
            return;
        }
        if let Err(e) = self.record(epoch, &settled, &evidence_hash).await {
            self.emit(
                "p2p.settle_failed",
                serde_json::json!({"epoch": epoch, "why": e.to_string()}),
            );
            return;
        }
        self.emit(
            "p2p.settled",
            serde_json::json!({"epoch": epoch, "validators_counted": settled.counted.len(),
                "validators_ignored": settled.ignored.len(),
                "bad": settled.standings.iter().filter(|s| s.decided && !s.good).count(),
                "evidence": evidence_hash.to_hex()}),
        );
        self.kept.settled.push(epoch);
        let len = self.kept.settled.len();
        if len > 16 {
            self.kept.settled.drain(..len - 16);
        }
        self.save();
        let mut st = self.state();
        st.settled.push(settled);
        let len = st.settled.len();
        if len > 4 {
            st.settled.drain(..len - 4);
        }
    }

    /// Slash or credit each decided hoster, once per epoch (a restart midway redoes only the
    /// hosters not yet recorded).
    async fn record(
        &self,
        epoch: u64,
        settled: &Settled,
        evidence: &Hash,
    ) -> Result<(), tenet_ledger::LedgerError> {
        let at = (now_ms() / 1000) as i64;
        let job = format!("epoch-{epoch}");
        let recorded = self.ledger.job_stake_events(&job).await?;
        for s in settled.standings.iter().filter(|s| s.decided) {
            let Some(key) = s
                .peer
                .parse::<PeerId>()
                .ok()
                .and_then(|p| crate::keys::public_key(&p))
            else {
                continue;
            };
            let id = key.to_hex();
            if self.ledger.node(&id).await?.is_none() {
                self.ledger
                    .register_node(&NodeRecord {
                        id: id.clone(),
                        url: format!("p2p:{}", s.peer),
                        stake: self.spec.hoster_stake,
                        state: NodeState::Active,
                        registered_at: at,
                        last_heartbeat: at,
                        agreed: 0,
                        disagreed: 0,
                        score_sum: 0.0,
                        operator: String::new(),
                        memory_limit: 0,
                        max_flops: 0,
                        device: String::new(),
                        exact: true,
                    })
                    .await?;
            }
            let done = recorded.iter().any(|e| e.node_id == id);
            if done {
                continue;
            }
            if s.good {
                self.ledger
                    .credit(&id, &job, self.spec.epoch_reward, at)
                    .await?;
            } else {
                let reason = format!(
                    "epoch {epoch}: stake-weighted score {:.2} below {:.2} (evidence {})",
                    s.score,
                    self.spec.min_score,
                    evidence.to_hex()
                );
                self.ledger
                    .slash(&id, &job, self.spec.slash_fraction, &reason, at)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The standings of the last epoch whose reveals are all in (the one before the current), as
/// any peer can compute them from the DHT: what a caller uses to pass over hosters in bad
/// standing.
pub async fn last_settled(net: &Network, spec: &NetworkSpec) -> Option<Settled> {
    let epoch = spec.epoch_at(now_ms())?.checked_sub(1)?;
    let (commits, reveals, previous) = epoch_records(net, spec, epoch).await;
    Some(settle(spec, epoch, &commits, &reveals, &previous))
}

/// What settling `epoch` reads from the DHT: every validator's commitments and reveals of the
/// epoch, and its commitments of the epoch before (for the seeds). A lookup that fails reads
/// as no records.
async fn epoch_records(
    net: &Network,
    spec: &NetworkSpec,
    epoch: u64,
) -> (Vec<ScoreCommit>, Vec<ScoreReveal>, Vec<ScoreCommit>) {
    let mut commits = Vec::new();
    let mut reveals = Vec::new();
    let mut previous = Vec::new();
    for v in &spec.validators {
        let Some(peer) = crate::keys::peer_id(&v.key) else {
            continue;
        };
        let lookups = [
            (Some(epoch), Phase::Commit),
            (Some(epoch), Phase::Reveal),
            (epoch.checked_sub(1), Phase::Commit),
        ];
        for (e, kind) in lookups {
            let Some(e) = e else { continue };
            for r in net.score_records(e, &peer, kind).await.unwrap_or_default() {
                match r {
                    ScoreRecord::Commit(c) if c.epoch == epoch => commits.push(c),
                    ScoreRecord::Commit(c) => previous.push(c),
                    ScoreRecord::Reveal(r) => reveals.push(r),
                }
            }
        }
    }
    (commits, reveals, previous)
}

/// Random inputs to `graph` for challenge `n` of `task`, drawn from the epoch's `seed`: anyone
/// holding the seed can draw them again. Floats are uniform in [-1, 1); bools 0 or 1; integers
/// index-like: uniform over the rows of what they gather from (a language model's token ids
/// over its vocabulary: a random prompt), otherwise in [0, 9).
pub fn challenge_inputs(
    graph: &Graph,
    seed: &[u8; 32],
    task: &Hash,
    n: u32,
) -> Vec<(String, HostTensor)> {
    let mut hasher = blake3::Hasher::new_keyed(seed);
    hasher.update(b"tenet-challenge-v1");
    hasher.update(&task.0);
    hasher.update(&n.to_le_bytes());
    let mut stream = hasher.finalize_xof();
    let mut out = Vec::new();
    for (id, name, ty) in graph.inputs() {
        let range = index_range(graph, id).unwrap_or(9).max(1);
        let count = ty.numel().unwrap_or(0) as usize;
        let size = ty.dtype.size() as usize;
        let mut data = Vec::with_capacity(count * size);
        let mut word = [0u8; 4];
        for _ in 0..count {
            stream.fill(&mut word);
            let r = u32::from_le_bytes(word);
            let unit = (r >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            match ty.dtype {
                DType::F32 => data.extend_from_slice(&unit.to_le_bytes()),
                DType::F16 => {
                    data.extend_from_slice(&half::f16::from_f32(unit).to_bits().to_le_bytes())
                }
                DType::BF16 => {
                    data.extend_from_slice(&half::bf16::from_f32(unit).to_bits().to_le_bytes())
                }
                DType::Bool => data.push((r & 1) as u8),
                _ => {
                    let v = (u64::from(r) % range) as i64;
                    data.extend_from_slice(&v.to_le_bytes()[..size]);
                }
            }
        }
        if let Ok(t) = HostTensor::new(ty.clone(), data) {
            out.push((name.to_string(), t));
        }
    }
    out
}

/// How many rows an input indexes when it is used directly as a gather's indices (the least,
/// if it indexes several tables).
fn index_range(graph: &Graph, input: tenet_ir::NodeId) -> Option<u64> {
    graph
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            tenet_ir::Op::Gather { x, indices, axis } if *indices == input => {
                graph.node(*x).ty.shape.get(*axis as usize).copied()
            }
            _ => None,
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_ir::GraphBuilder;

    #[test]
    fn challenges_are_drawn_from_the_seed_and_token_ids_span_the_vocabulary() {
        // A toy language model: token ids gather rows of a 50-word embedding.
        let g = GraphBuilder::new();
        let ids = g.input("ids", DType::I64, &[64]);
        let table = g.input("embedding", DType::F32, &[50, 4]);
        let x = g.input("x", DType::F32, &[3]);
        let y = table.gather(&ids, 0);
        let graph = g.finish(&[("y", &y), ("x", &x.tanh())]).unwrap();
        let task = Hash::of(b"lm");
        let a = challenge_inputs(&graph, &[1; 32], &task, 0);
        assert_eq!(
            a,
            challenge_inputs(&graph, &[1; 32], &task, 0),
            "drawn again"
        );
        assert_ne!(
            a,
            challenge_inputs(&graph, &[2; 32], &task, 0),
            "another seed"
        );
        assert_ne!(
            a,
            challenge_inputs(&graph, &[1; 32], &task, 1),
            "another challenge"
        );
        let ids = a.iter().find(|(n, _)| n == "ids").unwrap().1.to_i64_vec();
        assert!(ids.iter().all(|&i| (0..50).contains(&i)), "{ids:?}");
        assert!(
            ids.iter().any(|&i| i >= 25),
            "the whole vocabulary: {ids:?}"
        );
        let floats = a.iter().find(|(n, _)| n == "x").unwrap().1.to_f32_vec();
        assert!(floats.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
