//! A verified job with no coordinator: the caller finds the peers hosting a task through the
//! DHT (provider records, then each provider's signed advert for its weights and addresses),
//! sends the job to r of them directly, collects every commitment before asking for any
//! reveal, checks each reveal opens its commitment and each commitment is signed by the key
//! its peer id names, and takes the result a strict majority committed to (the exact tier).
//! The receipt is the one a coordinator writes — the agreeing hosters' signed commitments and
//! openings — issued and signed by the caller itself, so `tenet receipt verify` checks it
//! offline the same way.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use tenet_ir::{Graph, HostTensor};
use tenet_net::NodeClient;
use tenet_proto::Hash;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{Commitment, JobSpec, OutputRef, Reveal, Sig, Tier, output_hash};
use tenet_proto::receipt::{Attestation, Receipt};
use tenet_proto::wire::{Revealed, RunJob};

use crate::advert::{Advert, task_key};
use crate::link::P2pLink;
use crate::swarm::Network;

/// Inputs up to this many bytes in all travel inline with the job; larger ones are uploaded
/// to each hoster first.
const INLINE_INPUT_BYTES: usize = 4 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(
        "no peer hosts task {task} (asked the DHT for {waited_ms} ms): is a hoster running and joined to the same bootstrap peer?"
    )]
    NoHosters { task: Hash, waited_ms: u64 },
    #[error(
        "{found} peer(s) host task {task}; {wanted} are needed for this call (lower --replicas, or start more hosters)"
    )]
    TooFew {
        task: Hash,
        found: usize,
        wanted: usize,
    },
    #[error("the network: {0}")]
    Network(#[from] crate::swarm::P2pError),
    #[error("the task's graph from {peer} is not task {task}: {message}")]
    Graph {
        peer: PeerId,
        task: Hash,
        message: String,
    },
    #[error("no result had a majority: {0}")]
    NoMajority(String),
    #[error("{0}")]
    Node(String),
}

/// A peer that hosts the task, and what it says of itself.
#[derive(Clone, Debug)]
pub struct Hoster {
    pub peer: PeerId,
    pub advert: Advert,
}

/// The hosters of a task found on the DHT.
#[derive(Clone, Debug)]
pub struct Found {
    pub task: Hash,
    /// The weights the job runs with: the caller's, or those most hosters name.
    pub weights: Option<Hash>,
    /// Hosters running `task` with `weights`, in the DHT's order.
    pub hosters: Vec<Hoster>,
}

/// Find the peers hosting `task` (with `weights`, or the weights most of them advertise),
/// asking again until at least `want` are found or `wait` has passed.
pub async fn find(
    net: &Network,
    task: Hash,
    weights: Option<Hash>,
    want: usize,
    wait: Duration,
) -> Result<Found, CallError> {
    let started = Instant::now();
    let mut adverts: HashMap<PeerId, Advert> = HashMap::new();
    loop {
        for peer in net.providers(task_key(&task)).await? {
            if adverts.contains_key(&peer) || peer == net.peer_id() {
                continue;
            }
            for advert in net.adverts(&peer).await? {
                if crate::keys::peer_id(&advert.key) != Some(peer) {
                    continue;
                }
                for addr in advert.addrs.iter().filter_map(|a| a.parse().ok()) {
                    net.add_address(peer, addr).await?;
                }
                adverts.insert(peer, advert);
            }
        }
        let matching = select(&adverts, task, weights);
        if matching.hosters.len() >= want || started.elapsed() >= wait {
            if matching.hosters.is_empty() {
                return Err(CallError::NoHosters {
                    task,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            return Ok(matching);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pass over the hosters the last settled epoch put in bad standing (stake-weighted scores
/// of the network's validators, read from the DHT); the ones passed over.
pub async fn drop_bad(
    net: &Network,
    spec: &crate::epoch::NetworkSpec,
    found: &mut Found,
) -> Vec<PeerId> {
    let Some(settled) = crate::validator::last_settled(net, spec).await else {
        return Vec::new();
    };
    let (bad, good): (Vec<Hoster>, Vec<Hoster>) = found
        .hosters
        .drain(..)
        .partition(|h| settled.is_bad(&h.peer));
    found.hosters = good;
    bad.into_iter().map(|h| h.peer).collect()
}

/// The hosters of `task` with `weights` (or with the weights most adverts name).
fn select(adverts: &HashMap<PeerId, Advert>, task: Hash, weights: Option<Hash>) -> Found {
    let named: Vec<(PeerId, &Advert, Option<Hash>)> = adverts
        .iter()
        .filter_map(|(p, a)| {
            a.tasks
                .iter()
                .find(|h| h.task == task)
                .map(|h| (*p, a, h.weights))
        })
        .collect();
    let weights = weights.or_else(|| {
        let mut counts: BTreeMap<Option<Hash>, usize> = BTreeMap::new();
        for (_, _, w) in &named {
            *counts.entry(*w).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .and_then(|(w, _)| w)
    });
    let mut hosters: Vec<Hoster> = named
        .into_iter()
        .filter(|(_, _, w)| *w == weights)
        .map(|(peer, advert, _)| Hoster {
            peer,
            advert: advert.clone(),
        })
        .collect();
    hosters.sort_by_key(|h| h.peer);
    Found {
        task,
        weights,
        hosters,
    }
}

/// The task's graph, fetched from a hoster and checked against its id.
pub async fn graph(net: &Network, key: &KeyPair, found: &Found) -> Result<Graph, CallError> {
    let mut last = None;
    for h in &found.hosters {
        let client =
            P2pLink::client(net, h.peer, key.clone()).with_timeout(Duration::from_secs(30));
        match client.get_blob(&found.task).await {
            Ok(bytes) => {
                let fail = |message: String| CallError::Graph {
                    peer: h.peer,
                    task: found.task,
                    message,
                };
                let graph = tenet_ir::codec::decode(&bytes).map_err(|e| fail(e.to_string()))?;
                if Hash(graph.id().0) != found.task {
                    return Err(fail("it hashes to another id".into()));
                }
                return Ok(graph);
            }
            Err(e) => last = Some(e.to_string()),
        }
    }
    Err(CallError::Node(format!(
        "no hoster handed over the graph of task {}: {}",
        found.task,
        last.unwrap_or_default()
    )))
}

/// What a call asks.
#[derive(Clone, Debug)]
pub struct CallSpec {
    pub inputs: Vec<(String, HostTensor)>,
    pub replicas: usize,
    pub seed: u64,
    /// How long each hoster may take to commit, and to reveal.
    pub timeout: Duration,
    /// Exact (a strict majority of identical output hashes) or tolerant (a strict majority
    /// within `tolerance` of the element-wise median).
    pub tier: Tier,
    pub tolerance: f64,
}

impl CallSpec {
    /// An exact-tier call.
    pub fn exact(inputs: Vec<(String, HostTensor)>, replicas: usize, timeout: Duration) -> Self {
        CallSpec {
            inputs,
            replicas,
            seed: 0,
            timeout,
            tier: Tier::Exact,
            tolerance: 0.0,
        }
    }
}

/// A hoster's part in one call.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Part {
    pub peer: String,
    /// `agreed`, `dissented` (committed to another result), or `failed`.
    pub verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub commit_us: u64,
    /// Tolerant tier: its largest distance from the element-wise median.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distance: Option<f64>,
}

/// A verified result.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub outputs: Vec<(String, HostTensor)>,
    pub receipt: Receipt,
    pub parts: Vec<Part>,
}

impl Outcome {
    /// Hosters that committed to a result other than the agreed one.
    pub fn dissenters(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().filter(|p| p.verdict == "dissented")
    }
}

/// One hoster's way through a call.
struct Replica {
    hoster: usize,
    client: NodeClient,
    commit: Result<(Commitment, u64), String>,
    reveal: Result<Revealed, String>,
}

/// Run one job on `spec.replicas` of `found`'s hosters and verify it. A hoster that fails
/// to commit (gone, busy, timed out, a bad commitment) is replaced by the next unused one,
/// so a job survives hosters leaving mid-call as long as enough remain.
pub async fn call(
    net: &Network,
    key: &KeyPair,
    found: &Found,
    spec: CallSpec,
) -> Result<Outcome, CallError> {
    let r = spec.replicas.max(1);
    if found.hosters.len() < r {
        return Err(CallError::TooFew {
            task: found.task,
            found: found.hosters.len(),
            wanted: r,
        });
    }
    // The inputs as tensor blobs.
    let mut inputs = BTreeMap::new();
    let mut blobs: Vec<(Hash, Vec<u8>)> = Vec::new();
    for (name, t) in &spec.inputs {
        let blob = tenet_proto::tensor::encode(t);
        let hash = Hash::of(&blob);
        inputs.insert(name.clone(), hash);
        blobs.push((hash, blob));
    }
    let inline = blobs.iter().map(|(_, b)| b.len()).sum::<usize>() <= INLINE_INPUT_BYTES;
    let job_id = format!(
        "p2p-{}",
        tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>())
    );
    let job = JobSpec {
        job_id: job_id.clone(),
        task: found.task,
        weights: found.weights,
        inputs,
        tier: spec.tier,
        seed: spec.seed,
    };
    let run = RunJob {
        job: job.clone(),
        timeout_ms: Some(spec.timeout.as_millis() as u64),
        blobs: if inline {
            blobs
                .iter()
                .map(|(h, b)| (*h, tenet_proto::to_hex(b)))
                .collect()
        } else {
            BTreeMap::new()
        },
        pulls: BTreeMap::new(),
        stage: None,
    };
    let commit_on = |i: usize| {
        let h = &found.hosters[i];
        let client = P2pLink::client(net, h.peer, key.clone()).with_timeout(spec.timeout);
        let (run, blobs, job) = (&run, &blobs, &job);
        async move {
            let started = Instant::now();
            let commit = async {
                if !inline {
                    for (_, b) in blobs {
                        client
                            .put_blob(b.clone())
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
                let committed = client.run_job(run).await.map_err(|e| e.to_string())?;
                check_commitment(&committed.commitment, job, h.peer)?;
                Ok::<_, String>((committed.commitment, started.elapsed().as_micros() as u64))
            }
            .await;
            Replica {
                hoster: i,
                client,
                commit,
                reveal: Err("not asked to reveal".into()),
            }
        }
    };

    // Every commitment first, then the reveals. A hoster that fails to commit or to reveal
    // is replaced by the next unused one (which commits, then reveals, having seen nothing
    // of the others' results), round by round, until r have revealed or none is left.
    let mut next = 0;
    let mut replicas: Vec<Replica> = Vec::new();
    let mut asked_to_reveal = 0;
    loop {
        let standing = replicas
            .iter()
            .enumerate()
            .filter(|(i, x)| x.reveal.is_ok() || (*i >= asked_to_reveal && x.commit.is_ok()))
            .count();
        let need = r.saturating_sub(standing);
        if need > 0 && next < found.hosters.len() {
            let take = need.min(found.hosters.len() - next);
            let more = futures_util::future::join_all((next..next + take).map(&commit_on)).await;
            next += take;
            replicas.extend(more);
            continue;
        }
        if asked_to_reveal < replicas.len() {
            let reveals = futures_util::future::join_all(
                replicas[asked_to_reveal..]
                    .iter()
                    .map(|x| reveal_one(x, &job_id)),
            )
            .await;
            for (x, rv) in replicas[asked_to_reveal..].iter_mut().zip(reveals) {
                x.reveal = rv;
            }
            asked_to_reveal = replicas.len();
            continue;
        }
        break;
    }

    // Who agreed: the exact tier by output hash, the tolerant tier by distance from the
    // element-wise median of every revealed result (so each is fetched).
    let revealed: Vec<usize> = (0..replicas.len())
        .filter(|&i| replicas[i].reveal.is_ok())
        .collect();
    let mut agreed = vec![false; replicas.len()];
    let mut distance: Vec<Option<f64>> = vec![None; replicas.len()];
    let mut fetched: Vec<Option<Vec<(String, HostTensor)>>> = vec![None; replicas.len()];
    let result: Option<usize> = match spec.tier {
        Tier::Exact => {
            let mut tally: BTreeMap<Hash, usize> = BTreeMap::new();
            for &i in &revealed {
                if let Ok(rv) = &replicas[i].reveal {
                    *tally.entry(rv.reveal.output_hash).or_default() += 1;
                }
            }
            let winner = tally
                .iter()
                .max_by_key(|(_, n)| **n)
                .filter(|(_, n)| **n * 2 > r)
                .map(|(h, _)| *h);
            for &i in &revealed {
                if let (Ok(rv), Some(w)) = (&replicas[i].reveal, winner) {
                    agreed[i] = rv.reveal.output_hash == w;
                }
            }
            (0..replicas.len()).find(|&i| agreed[i])
        }
        Tier::Tolerant => {
            let mut compared = Vec::new();
            let mut index = Vec::new();
            for &i in &revealed {
                let Ok(rv) = &replicas[i].reveal else {
                    continue;
                };
                match fetch_outputs(&replicas[i].client, &rv.reveal, &rv.blobs).await {
                    Ok(outputs) => {
                        compared.push(tenet_proto::compare::Replica {
                            node: found.hosters[replicas[i].hoster].peer.to_string(),
                            output_hash: rv.reveal.output_hash,
                            outputs: outputs.clone(),
                        });
                        fetched[i] = Some(outputs);
                        index.push(i);
                    }
                    Err(e) => replicas[i].reveal = Err(e.to_string()),
                }
            }
            let decision = tenet_proto::compare::tolerant(&compared, spec.tolerance);
            for (k, &i) in index.iter().enumerate() {
                agreed[i] = decision.agreed[k];
                distance[i] = Some(1.0 / decision.scores[k] - 1.0);
            }
            // A strict majority of the r asked, not just of those that answered.
            let count = agreed.iter().filter(|a| **a).count();
            decision.result.map(|k| index[k]).filter(|_| count * 2 > r)
        }
    };

    let mut parts = Vec::new();
    let mut nodes = Vec::new();
    for (i, x) in replicas.iter().enumerate() {
        let commit_us = x.commit.as_ref().map_or(0, |(_, us)| *us);
        let (verdict, error) = match (&x.commit, &x.reveal) {
            (Ok((commitment, _)), Ok(rv)) if agreed[i] && result.is_some() => {
                nodes.push(Attestation {
                    commitment: commitment.clone(),
                    output_hash: rv.reveal.output_hash,
                    salt: rv.reveal.salt,
                });
                ("agreed", None)
            }
            (_, Ok(_)) => ("dissented", None),
            (Err(e), _) | (_, Err(e)) => ("failed", Some(e.clone())),
        };
        parts.push(Part {
            peer: found.hosters[x.hoster].peer.to_string(),
            verdict,
            error,
            commit_us,
            distance: distance[i],
        });
    }
    let Some(source) = result else {
        let said: Vec<String> = parts
            .iter()
            .map(|p| {
                format!(
                    "{} {}{}",
                    p.peer,
                    p.verdict,
                    p.error
                        .as_ref()
                        .map_or(String::new(), |e| format!(" ({e})"))
                )
            })
            .collect();
        return Err(CallError::NoMajority(said.join("; ")));
    };
    let Ok(revealed) = &replicas[source].reveal else {
        return Err(CallError::NoMajority("the result was not revealed".into()));
    };
    let outputs = match fetched[source].take() {
        Some(o) => o,
        None => fetch_outputs(&replicas[source].client, &revealed.reveal, &revealed.blobs).await?,
    };
    let receipt = Receipt {
        version: 1,
        job,
        outputs: revealed.reveal.outputs.clone(),
        output_hash: output_hash(&revealed.reveal.outputs),
        replicas: r as u32,
        tolerance: if spec.tier == Tier::Tolerant {
            spec.tolerance
        } else {
            0.0
        },
        nodes,
        coordinator: key.public(),
        issued_at: tenet_proto::unix_now(),
        dispute: None,
        signature: Sig([0; 64]),
    }
    .sign(key);
    Ok(Outcome {
        outputs,
        receipt,
        parts,
    })
}

/// Ask a hoster that committed for its reveal, and check it opens the commitment.
async fn reveal_one(x: &Replica, job_id: &str) -> Result<Revealed, String> {
    let (commitment, _) = x.commit.as_ref().map_err(|e| e.clone())?;
    let revealed: Revealed = x.client.reveal(job_id).await.map_err(|e| e.to_string())?;
    if !revealed.reveal.opens(commitment) {
        return Err("its reveal does not open its commitment".to_string());
    }
    Ok(revealed)
}

/// A commitment must be for this job, signed, and by the key the peer id names.
fn check_commitment(c: &Commitment, job: &JobSpec, peer: PeerId) -> Result<(), String> {
    if c.job != *job {
        return Err("its commitment is for another job".into());
    }
    if crate::keys::peer_id(&c.node) != Some(peer) {
        return Err("its commitment is signed by a key other than its peer id's".into());
    }
    if !c.verify() {
        return Err("its commitment's signature does not verify".into());
    }
    Ok(())
}

/// The agreed outputs: inline in the reveal, or fetched as blobs; each checked against its
/// reference.
async fn fetch_outputs(
    client: &NodeClient,
    reveal: &Reveal,
    inline: &BTreeMap<Hash, String>,
) -> Result<Vec<(String, HostTensor)>, CallError> {
    let mut out = Vec::new();
    for OutputRef { name, hash, .. } in &reveal.outputs {
        let bytes = match inline.get(hash).and_then(|h| tenet_proto::from_hex(h)) {
            Some(b) => b,
            None => client
                .get_blob(hash)
                .await
                .map_err(|e| CallError::Node(format!("fetching output {name}: {e}")))?
                .to_vec(),
        };
        if Hash::of(&bytes) != *hash {
            return Err(CallError::Node(format!(
                "output {name} does not hash to the address its hosters committed to"
            )));
        }
        let t = tenet_proto::tensor::decode(&bytes)
            .map_err(|e| CallError::Node(format!("output {name}: {e}")))?;
        out.push((name.clone(), t));
    }
    Ok(out)
}
