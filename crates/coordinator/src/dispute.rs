//! Disputes settled by bisection: when two replicas of a job disagree, walk down their trace
//! trees (`tenet_proto::trace`) to the first node whose value they disagree on, take that
//! node's operands (agreed by both, proven against a root), re-run that one op with the
//! reference interpreter, and name whoever computed it otherwise. The referee's work is one op,
//! not the job; rounds are the trees' depth plus one for the operands.
//!
//! A party is anything that answers for a trace ([`TraceParty`]): a node over the network
//! ([`NodeParty`], what the coordinator's job phases use when replicas disagree without a
//! majority), or [`ReferenceParty`], which computes its trace with the reference interpreter,
//! optionally corrupting one node's value as a liar would (tests and the cost program).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tenet_ir::{Graph, HostTensor, NodeId, Op, WeightSource};
use tenet_proto::Hash;
use tenet_proto::trace::{Bisection, Proof, Step, TraceTree, Transcript, Verdict};

/// One side of a dispute: what it committed to, and its answers (a node over the network,
/// [`NodeParty`], or a computation here, [`ReferenceParty`]). An answer of `None` is a party
/// that did not answer (in time): it loses by rule.
pub trait TraceParty: Sync {
    /// The root of the party's trace tree.
    fn root(&self) -> Hash;
    /// The two children of tree node `index` at `depth`.
    fn children(
        &self,
        depth: u32,
        index: u64,
    ) -> impl std::future::Future<Output = Option<(Hash, Hash)>> + Send;
    /// Leaf `leaf` with its proof, and the node's value (an operand the referee needs).
    fn leaf(
        &self,
        leaf: u64,
    ) -> impl std::future::Future<Output = Option<(Proof, HostTensor)>> + Send;
}

/// A lie told at one node: the node, and what is done to its value.
pub type Corruption<'a> = (u32, &'a (dyn Fn(&mut HostTensor) + Sync));

/// A party whose trace is the reference interpreter's, with `corrupt` (node, what to do to its
/// value) applied as it runs when set: every later value follows from the corrupted one, as a
/// node that lies at one op computes them.
pub struct ReferenceParty<'a> {
    graph: &'a Graph,
    inputs: &'a HashMap<String, HostTensor>,
    weights: &'a (dyn WeightSource + Sync),
    seed: u64,
    corrupt: Option<Corruption<'a>>,
    tree: TraceTree,
}

impl<'a> ReferenceParty<'a> {
    pub fn new(
        graph: &'a Graph,
        inputs: &'a HashMap<String, HostTensor>,
        weights: &'a (dyn WeightSource + Sync),
        seed: u64,
        corrupt: Option<Corruption<'a>>,
    ) -> Result<ReferenceParty<'a>, tenet_reference::RunError> {
        let mut leaves = Vec::with_capacity(graph.nodes().len());
        tenet_reference::run_observed(graph, inputs, weights, seed, &mut |id, v| {
            if let Some((k, f)) = &corrupt
                && id.0 == *k
            {
                f(v);
            }
            leaves.push(tenet_proto::tensor::hash(v));
            true
        })?;
        Ok(ReferenceParty {
            graph,
            inputs,
            weights,
            seed,
            corrupt,
            tree: TraceTree::new(leaves),
        })
    }

    pub fn tree(&self) -> &TraceTree {
        &self.tree
    }
}

impl TraceParty for ReferenceParty<'_> {
    fn root(&self) -> Hash {
        self.tree.root()
    }

    async fn children(&self, depth: u32, index: u64) -> Option<(Hash, Hash)> {
        self.tree.children(depth, index)
    }

    async fn leaf(&self, leaf: u64) -> Option<(Proof, HostTensor)> {
        let proof = self.tree.proof(leaf)?;
        // Recomputed up to the node: a party keeps hashes, not values.
        let mut found = None;
        tenet_reference::run_observed(
            self.graph,
            self.inputs,
            self.weights,
            self.seed,
            &mut |id, v| {
                if let Some((k, f)) = &self.corrupt
                    && id.0 == *k
                {
                    f(v);
                }
                if u64::from(id.0) == leaf {
                    found = Some(v.clone());
                    return false;
                }
                true
            },
        )
        .ok()?;
        Some((proof, found?))
    }
}

/// A node answering for its trace of job `job_id` over the network (`POST
/// /v1/jobs/{id}/trace` and the routes under it); every answer awaited at most `timeout`.
pub struct NodeParty {
    pub client: std::sync::Arc<tenet_net::client::NodeClient>,
    pub job_id: String,
    pub root: Hash,
    /// The most bytes a leaf's value may have (the graph's largest node).
    pub max_leaf_bytes: u64,
    /// How long an answer may take (the coordinator's node timeout).
    pub timeout: Duration,
}

impl TraceParty for NodeParty {
    fn root(&self) -> Hash {
        self.root
    }

    async fn children(&self, depth: u32, index: u64) -> Option<(Hash, Hash)> {
        let ask = self.client.trace_children(&self.job_id, depth, index);
        tokio::time::timeout(self.timeout, ask).await.ok()?.ok()
    }

    async fn leaf(&self, leaf: u64) -> Option<(Proof, HostTensor)> {
        let ask = self
            .client
            .trace_leaf(&self.job_id, leaf, self.max_leaf_bytes);
        tokio::time::timeout(self.timeout, ask).await.ok()?.ok()
    }
}

/// A settled dispute and what it cost.
#[derive(Debug)]
pub struct Settled {
    pub transcript: Transcript,
    /// Question-and-answer rounds with the parties (the walk, then the operands).
    pub rounds: u32,
    /// Bytes the parties sent (hashes, proofs, operand values).
    pub bytes: u64,
    /// The referee's own work: checking the operands and re-running the one op.
    pub referee: Duration,
}

/// Why a dispute could not be settled by bisection (then the whole-job referee decides).
#[derive(Debug, thiserror::Error)]
pub enum DisputeError {
    /// A party did not hand over an operand (recomputing a value may take long: no verdict).
    #[error("party {party} did not answer {what}")]
    Silent { party: usize, what: String },
    #[error("the referee could not run the op: {0}")]
    Referee(String),
}

/// Walk both parties' traces of `graph` (run on `inputs` with `seed`) to the first node they
/// disagree on and decide it.
pub async fn settle<A: TraceParty, B: TraceParty>(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &(dyn WeightSource + Sync),
    seed: u64,
    a: &A,
    b: &B,
) -> Result<Settled, DisputeError> {
    settle_bound(graph, inputs, weights, seed, a, b, None).await
}

/// [`settle`], each party bound to the outputs it committed to (`committed`: per party, the
/// hash of each of the graph's outputs, in order). Traces that agree then still decide: a
/// party whose committed outputs are not its trace's output leaves — a node that computed
/// honestly and reported something else — loses, the output leaves' proofs in the transcript.
pub async fn settle_bound<A: TraceParty, B: TraceParty>(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &(dyn WeightSource + Sync),
    seed: u64,
    a: &A,
    b: &B,
    committed: Option<[Vec<Hash>; 2]>,
) -> Result<Settled, DisputeError> {
    let count = graph.nodes().len() as u64;
    let roots = [a.root(), b.root()];
    let mut walk = Bisection::new(count, roots);
    let mut rounds = 0u32;
    let mut bytes = 64u64;
    let silent = |party: usize, what: String| DisputeError::Silent { party, what };
    let done = |walk: &Bisection, leaf, operands, from, bad, referee, lost| Transcript {
        count,
        roots,
        rounds: walk.rounds().to_vec(),
        leaf,
        operands,
        operands_from: from,
        bad_operands: bad,
        referee,
        verdict: Verdict::Lost(lost),
        stalled: None,
        committed: None,
        outputs: Vec::new(),
    };
    loop {
        match walk.next() {
            Step::Ask { depth, index } => {
                rounds += 1;
                bytes += 128;
                // Each answer is a lookup in a tree the party has built: silence (past the
                // client's timeout) is stalling, and the party loses by rule.
                let answers = [
                    a.children(depth, index).await,
                    b.children(depth, index).await,
                ];
                if let Some(p) = answers.iter().position(Option::is_none) {
                    let mut t = done(&walk, None, Vec::new(), 0, Vec::new(), None, vec![p]);
                    t.stalled = Some(p);
                    return Ok(Settled {
                        transcript: t,
                        rounds,
                        bytes,
                        referee: Duration::ZERO,
                    });
                }
                walk.answer([answers[0].expect("answered"), answers[1].expect("answered")]);
            }
            Step::Agree => {
                let mut t = done(&walk, None, Vec::new(), 0, Vec::new(), None, Vec::new());
                if let Some(committed) = committed {
                    // One trace, two results: the output leaves say whose result it computed.
                    // Either party may prove them (the roots are the same).
                    let mut proofs = Vec::new();
                    for o in graph.outputs() {
                        let i = u64::from(o.node.0);
                        rounds += 1;
                        let mut proof = None;
                        for p in 0..2 {
                            let answer = match p {
                                0 => a.leaf(i).await,
                                _ => b.leaf(i).await,
                            };
                            if let Some((pr, value)) = answer
                                && pr.index == i
                                && pr.verifies(&roots[0], walk.depth())
                                && pr.leaf == tenet_proto::tensor::hash(&value)
                            {
                                bytes += 32 * (pr.siblings.len() as u64 + 1)
                                    + value.bytes().len() as u64;
                                proof = Some(pr);
                                break;
                            }
                        }
                        proofs.push(proof.ok_or_else(|| silent(0, format!("output leaf {i}")))?);
                    }
                    let leaves: Vec<Hash> = proofs.iter().map(|p| p.leaf).collect();
                    let lost: Vec<usize> = (0..2).filter(|&p| committed[p] != leaves).collect();
                    t.verdict = Verdict::Lost(lost);
                    t.committed = Some(committed);
                    t.outputs = proofs;
                }
                return Ok(Settled {
                    transcript: t,
                    rounds,
                    bytes,
                    referee: Duration::ZERO,
                });
            }
            Step::Inconsistent { parties: lost } => {
                return Ok(Settled {
                    transcript: done(&walk, None, Vec::new(), 0, Vec::new(), None, lost),
                    rounds,
                    bytes,
                    referee: Duration::ZERO,
                });
            }
            Step::Found { leaf, hashes } => {
                // The operands, from party 0, or from party 1 when party 0's do not check out
                // (the leaves before this one are equal in both trees).
                let node = graph.node(NodeId(leaf as u32));
                let mut bad = Vec::new();
                let mut referee = None;
                let mut took = Duration::ZERO;
                let mut kept = (Vec::new(), 0);
                for (p, root) in roots.iter().enumerate() {
                    rounds += 1;
                    let mut proofs = Vec::new();
                    let mut values = Vec::new();
                    for o in node.op.operands() {
                        let i = u64::from(o.0);
                        let answer = match p {
                            0 => a.leaf(i).await,
                            _ => b.leaf(i).await,
                        };
                        let (proof, value) =
                            answer.ok_or_else(|| silent(p, format!("leaf {i} and its proof")))?;
                        bytes +=
                            32 * (proof.siblings.len() as u64 + 1) + value.bytes().len() as u64;
                        proofs.push(proof);
                        values.push(value);
                    }
                    let started = Instant::now();
                    let hash = referee_leaf(
                        graph,
                        leaf,
                        &proofs,
                        &values,
                        root,
                        walk.depth(),
                        inputs,
                        weights,
                        seed,
                    )?;
                    took += started.elapsed();
                    kept = (proofs, p);
                    match hash {
                        Some(h) => {
                            referee = Some(h);
                            break;
                        }
                        None => bad.push(p),
                    }
                }
                let lost = match referee {
                    Some(h) => (0..2)
                        .filter(|&p| hashes[p] != h || bad.contains(&p))
                        .collect(),
                    None => vec![0, 1],
                };
                return Ok(Settled {
                    transcript: done(&walk, Some(leaf), kept.0, kept.1, bad, referee, lost),
                    rounds,
                    bytes,
                    referee: took,
                });
            }
        }
    }
}

/// The referee's hash of node `leaf`: its operands checked against party 0's root (`None`
/// when party 0's proofs or values do not check out), then the one op run by the reference.
#[allow(clippy::too_many_arguments)]
fn referee_leaf(
    graph: &Graph,
    leaf: u64,
    proofs: &[Proof],
    values: &[HostTensor],
    root: &Hash,
    depth: u32,
    inputs: &HashMap<String, HostTensor>,
    weights: &(dyn WeightSource + Sync),
    seed: u64,
) -> Result<Option<Hash>, DisputeError> {
    for (p, v) in proofs.iter().zip(values) {
        if !p.verifies(root, depth) || p.leaf != tenet_proto::tensor::hash(v) {
            return Ok(None);
        }
    }
    let id = NodeId(leaf as u32);
    let node = graph.node(id);
    let value = match &node.op {
        Op::Input { name } => inputs
            .get(name)
            .cloned()
            .ok_or_else(|| DisputeError::Referee(format!("the job has no input {name}")))?,
        Op::Weight { file, tensor } => weights
            .weight(file, tensor)
            .cloned()
            .ok_or_else(|| DisputeError::Referee(format!("no weight {tensor}")))?,
        op => run_one_op(op, &node.ty, values, seed)?,
    };
    Ok(Some(tenet_proto::tensor::hash(&value)))
}

/// One op on its operand values, as a one-op graph on this machine's CPU (the device every
/// other device's exact bits are checked against, and the reference's bits by its own tests):
/// a product deep in a model costs the referee what it costs the job, not the reference's
/// plain loops.
fn run_one_op(
    op: &Op,
    ty: &tenet_ir::TensorType,
    values: &[HostTensor],
    seed: u64,
) -> Result<HostTensor, DisputeError> {
    let fail = |e: String| DisputeError::Referee(e);
    let b = tenet_ir::GraphBuilder::new();
    let mut inputs = HashMap::new();
    let mut slots = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let name = format!("operand{i}");
        slots.push(b.input(&name, v.dtype(), v.shape()).id());
        inputs.insert(name, v.clone());
    }
    // The values come in `operands()` order; a node read twice (`x * x`) reads its first.
    let mut remap = HashMap::new();
    for (i, n) in op.operands().into_iter().enumerate() {
        remap.entry(n).or_insert(slots[i]);
    }
    let one = b.node(op.map_operands(|n| remap[&n]), Some(ty.clone()));
    let graph = b
        .finish(&[("out", &one)])
        .map_err(|e| fail(e.to_string()))?;
    let device =
        tenet_devices::open("cpu", &Default::default()).map_err(|e| fail(e.to_string()))?;
    let mut out = device
        .compile(&graph)
        .and_then(|p| p.run(&inputs, &tenet_ir::NoWeights, seed))
        .map_err(|e| fail(e.to_string()))?;
    Ok(out.remove(0).1)
}
