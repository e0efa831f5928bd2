//! Traces of a job and disputes settled by bisection over them.
//!
//! A job's **trace** is the blob hash of every node's value, in graph order (leaf `i` is node
//! `%i`'s value, hashed as `tensor::hash` hashes a job's inputs and outputs). A node commits to
//! a trace by the root of a Merkle tree over it: leaves padded with [`PAD`] to a power of two,
//! each parent the domain-separated blake3 of its two children.
//!
//! When two replicas disagree, [`Bisection`] walks down both trees from their roots: each
//! round both parties reveal the two children of the current node, each pair checked against
//! what that party revealed before (a party whose pair does not hash to it loses by rule); the
//! walk goes left when the left children differ, else right. After `depth` rounds it stands on
//! the **first** leaf where the traces differ: every leaf before it is equal in both, so the
//! node's operands are agreed, and a referee need only re-run that one op on them to decide
//! who computed it wrongly. [`Proof`] proves one leaf (an operand's hash) against a root.
//! [`Transcript`] records all of it for a receipt, and checks itself offline.

use crate::Hash;

/// The hash standing in for the leaves past the end of a trace.
pub const PAD: Hash = Hash([0u8; 32]);

/// The most leaves a trace may have (a graph's node limit is far below): a transcript naming
/// more is refused before anything is computed from its count.
pub const MAX_LEAVES: u64 = 1 << 32;

/// The parent of two tree nodes.
pub fn parent(left: &Hash, right: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"tenet-trace-node\0");
    h.update(&left.0);
    h.update(&right.0);
    Hash(*h.finalize().as_bytes())
}

/// Levels of a tree over `leaves` (a power of two, at least one): how many halvings to the root.
pub fn depth_for(leaves: u64) -> u32 {
    leaves.max(1).next_power_of_two().trailing_zeros()
}

/// A trace's Merkle tree, every level kept (what a node holds to answer a bisection).
#[derive(Clone, Debug)]
pub struct TraceTree {
    /// `levels[0]` the padded leaves, the last the root alone.
    levels: Vec<Vec<Hash>>,
    count: u64,
}

impl TraceTree {
    pub fn new(leaves: Vec<Hash>) -> TraceTree {
        let count = leaves.len() as u64;
        let mut level = leaves;
        level.resize(count.max(1).next_power_of_two() as usize, PAD);
        let mut levels = vec![level];
        while levels.last().expect("a level").len() > 1 {
            let up = levels
                .last()
                .expect("a level")
                .chunks(2)
                .map(|p| parent(&p[0], &p[1]))
                .collect();
            levels.push(up);
        }
        TraceTree { levels, count }
    }

    pub fn root(&self) -> Hash {
        self.levels.last().expect("a level")[0]
    }

    /// Leaves before padding (the graph's node count).
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn depth(&self) -> u32 {
        (self.levels.len() - 1) as u32
    }

    pub fn leaf(&self, i: u64) -> Option<Hash> {
        self.levels[0].get(i as usize).copied()
    }

    /// The two children of tree node `index` at `depth` from the root (the root is depth 0,
    /// index 0); `None` past the leaves.
    pub fn children(&self, depth: u32, index: u64) -> Option<(Hash, Hash)> {
        // Any numbers may come in a question: nothing here may overflow.
        let below = self.depth().checked_sub(depth.checked_add(1)?)? as usize;
        let level = &self.levels[below];
        let left = usize::try_from(index.checked_mul(2)?).ok()?;
        Some((*level.get(left)?, *level.get(left.checked_add(1)?)?))
    }

    /// The proof of leaf `i`.
    pub fn proof(&self, i: u64) -> Option<Proof> {
        let leaf = self.leaf(i)?;
        let mut siblings = Vec::with_capacity(self.levels.len() - 1);
        let mut at = i as usize;
        for level in &self.levels[..self.levels.len() - 1] {
            siblings.push(level[at ^ 1]);
            at /= 2;
        }
        Some(Proof {
            index: i,
            leaf,
            siblings,
        })
    }
}

/// Leaf `index` of a tree, with the sibling at each level from the leaves up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Proof {
    pub index: u64,
    pub leaf: Hash,
    pub siblings: Vec<Hash>,
}

impl Proof {
    /// True when the proof leads from its leaf to `root` in a tree of `depth` levels.
    pub fn verifies(&self, root: &Hash, depth: u32) -> bool {
        if self.siblings.len() != depth as usize || depth >= 64 || self.index >> depth != 0 {
            return false;
        }
        let mut h = self.leaf;
        for (level, s) in self.siblings.iter().enumerate() {
            h = if (self.index >> level) & 1 == 0 {
                parent(&h, s)
            } else {
                parent(s, &h)
            };
        }
        h == *root
    }
}

/// One round: the tree node asked about and both parties' revealed children.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Round {
    pub depth: u32,
    pub index: u64,
    pub answers: [(Hash, Hash); 2],
}

/// Where a bisection stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ask both parties for the children of this tree node.
    Ask { depth: u32, index: u64 },
    /// The first leaf the traces differ at, and each party's hash of it.
    Found { leaf: u64, hashes: [Hash; 2] },
    /// The roots are equal: there is nothing to dispute.
    Agree,
    /// These parties answered inconsistently with what they had committed to: they lose.
    Inconsistent { parties: Vec<usize> },
}

/// The walk down two trace trees to their first differing leaf.
#[derive(Clone, Debug)]
pub struct Bisection {
    count: u64,
    depth: u32,
    /// The tree node the walk stands on, and each party's hash of it.
    at: (u32, u64),
    expected: [Hash; 2],
    rounds: Vec<Round>,
    done: Option<Step>,
}

impl Bisection {
    /// Start from the two committed roots of traces of `count` leaves.
    pub fn new(count: u64, roots: [Hash; 2]) -> Bisection {
        let depth = depth_for(count);
        let done = (roots[0] == roots[1]).then_some(Step::Agree);
        let mut b = Bisection {
            count,
            depth,
            at: (0, 0),
            expected: roots,
            rounds: Vec::new(),
            done,
        };
        if b.done.is_none() && depth == 0 {
            b.done = Some(b.found());
        }
        b
    }

    fn found(&self) -> Step {
        let leaf = self.at.1;
        if leaf >= self.count {
            // Past the end every honest tree holds PAD: whoever holds something else lied.
            let parties = (0..2).filter(|&p| self.expected[p] != PAD).collect();
            return Step::Inconsistent { parties };
        }
        Step::Found {
            leaf,
            hashes: self.expected,
        }
    }

    /// What to do next.
    pub fn next(&self) -> Step {
        match &self.done {
            Some(s) => s.clone(),
            None => Step::Ask {
                depth: self.at.0,
                index: self.at.1,
            },
        }
    }

    /// Both parties' answers to the last [`Step::Ask`].
    pub fn answer(&mut self, answers: [(Hash, Hash); 2]) -> Step {
        if self.done.is_some() {
            return self.next();
        }
        let (depth, index) = self.at;
        self.rounds.push(Round {
            depth,
            index,
            answers,
        });
        let bad: Vec<usize> = (0..2)
            .filter(|&p| parent(&answers[p].0, &answers[p].1) != self.expected[p])
            .collect();
        if !bad.is_empty() {
            self.done = Some(Step::Inconsistent { parties: bad });
            return self.next();
        }
        let go_left = answers[0].0 != answers[1].0;
        self.at = (depth + 1, 2 * index + u64::from(!go_left));
        self.expected = if go_left {
            [answers[0].0, answers[1].0]
        } else {
            [answers[0].1, answers[1].1]
        };
        if self.at.0 == self.depth {
            self.done = Some(self.found());
        }
        self.next()
    }

    pub fn rounds(&self) -> &[Round] {
        &self.rounds
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }
}

/// Who the referee found wrong.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    /// These parties (0, 1) lost: computed the leaf wrongly, or answered inconsistently.
    Lost(Vec<usize>),
}

/// A dispute's record, for a receipt: the roots, the walk, the leaf found, the proofs of its
/// operands' hashes (against the root of the party that gave them, `operands_from`: the leaves
/// left of the found one are equal in both trees), the referee's hash of the leaf, and the
/// verdict. A party whose operands did not check out (`bad_operands`) lost for that alone.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Transcript {
    pub count: u64,
    pub roots: [Hash; 2],
    pub rounds: Vec<Round>,
    pub leaf: Option<u64>,
    pub operands: Vec<Proof>,
    #[serde(default)]
    pub operands_from: usize,
    #[serde(default)]
    pub bad_operands: Vec<usize>,
    pub referee: Option<Hash>,
    pub verdict: Verdict,
    /// The party that did not answer the walk's next question in time: it lost by rule (the
    /// walk stops there; the whole job was then refereed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<usize>,
    /// When the traces agree (equal roots) but the results do not: each party's committed
    /// output hashes, in the graph's output order...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<[Vec<Hash>; 2]>,
    /// ...and the proofs, against the (common) root, of the output nodes' leaves: a party
    /// whose committed outputs are not what its own trace computed lost by rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<Proof>,
}

/// Why a transcript does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscriptError {
    #[error("the walk does not follow from the roots and the answers: {0}")]
    Walk(String),
    #[error("operand proof for leaf {0} does not lead to party 0's root")]
    Operand(u64),
    #[error("the operands are not the leaf's operands (leaves {0:?})")]
    Operands(Vec<u64>),
    #[error("the verdict does not follow: {0}")]
    Verdict(String),
}

impl Transcript {
    /// Replay the walk from the roots and answers, check the operand proofs (`operands_of`
    /// gives the found leaf's operand leaves, from the graph), and that the verdict follows
    /// from the referee's hash. Re-running the op itself is the caller's (it needs the values).
    pub fn check(
        &self,
        operands_of: Option<&dyn Fn(u64) -> Vec<u64>>,
    ) -> Result<(), TranscriptError> {
        if self.count == 0 || self.count > MAX_LEAVES {
            return Err(TranscriptError::Walk(format!(
                "a trace of {} leaves (1 to {MAX_LEAVES})",
                self.count
            )));
        }
        let mut b = Bisection::new(self.count, self.roots);
        let mut step = b.next();
        for r in &self.rounds {
            match step {
                Step::Ask { depth, index } if (depth, index) == (r.depth, r.index) => {}
                other => {
                    return Err(TranscriptError::Walk(format!(
                        "round at ({}, {}) where the walk says {other:?}",
                        r.depth, r.index
                    )));
                }
            }
            step = b.answer(r.answers);
        }
        let Verdict::Lost(lost) = &self.verdict;
        if let Some(p) = self.stalled {
            // The walk stopped at a question the party did not answer.
            if !matches!(step, Step::Ask { .. }) || lost != &[p] {
                return Err(TranscriptError::Verdict(format!(
                    "party {p} stalled, but the walk is at {step:?} and the verdict names {lost:?}"
                )));
            }
            return Ok(());
        }
        match step {
            Step::Inconsistent { parties } => {
                if &parties != lost {
                    return Err(TranscriptError::Verdict(format!(
                        "parties {parties:?} answered inconsistently, the verdict names {lost:?}"
                    )));
                }
                Ok(())
            }
            Step::Found { leaf, hashes } => {
                if self.leaf != Some(leaf) {
                    return Err(TranscriptError::Walk(format!(
                        "the walk ends at leaf {leaf}, the transcript says {:?}",
                        self.leaf
                    )));
                }
                let got: Vec<u64> = self.operands.iter().map(|p| p.index).collect();
                if let Some(operands_of) = operands_of
                    && got != operands_of(leaf)
                {
                    return Err(TranscriptError::Operands(got));
                }
                let Some(referee) = self.referee else {
                    // Neither party's operands checked out: both lost.
                    if lost != &[0, 1] || self.bad_operands != [0, 1] {
                        return Err(TranscriptError::Verdict("no referee hash".into()));
                    }
                    return Ok(());
                };
                let root = self
                    .roots
                    .get(self.operands_from)
                    .ok_or_else(|| TranscriptError::Verdict("no such party".into()))?;
                for p in &self.operands {
                    if p.index >= leaf || !p.verifies(root, b.depth()) {
                        return Err(TranscriptError::Operand(p.index));
                    }
                }
                let wrong: Vec<usize> = (0..2)
                    .filter(|&p| hashes[p] != referee || self.bad_operands.contains(&p))
                    .collect();
                if &wrong != lost {
                    return Err(TranscriptError::Verdict(format!(
                        "the referee's hash makes {wrong:?} wrong, the verdict names {lost:?}"
                    )));
                }
                Ok(())
            }
            Step::Agree => {
                // Equal traces, different results: whoever committed to other outputs than
                // the trace's output leaves lost.
                let Some(committed) = &self.committed else {
                    return Err(TranscriptError::Walk(
                        "the traces agree and nothing says whose result departs from them".into(),
                    ));
                };
                for p in &self.outputs {
                    if !p.verifies(&self.roots[0], b.depth()) {
                        return Err(TranscriptError::Operand(p.index));
                    }
                }
                let leaves: Vec<Hash> = self.outputs.iter().map(|p| p.leaf).collect();
                let wrong: Vec<usize> = (0..2).filter(|&p| committed[p] != leaves).collect();
                if wrong.is_empty() || &wrong != lost {
                    return Err(TranscriptError::Verdict(format!(
                        "the committed outputs make {wrong:?} wrong, the verdict names {lost:?}"
                    )));
                }
                Ok(())
            }
            other => Err(TranscriptError::Walk(format!(
                "the walk stops early: {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A transcript is a stranger's file (a receipt anyone verifies): whatever it holds,
        /// checking it answers, never panics.
        #[test]
        fn any_transcript_is_checked_without_panicking(
            count in prop_oneof![Just(0u64), 1u64..5000, Just(u64::MAX), Just(MAX_LEAVES + 1)],
            rounds in proptest::collection::vec((0u32..70, any::<u64>(), any::<[u8; 4]>()), 0..20),
            leaf in proptest::option::of(any::<u64>()),
            index in any::<u64>(),
            siblings in 0usize..70,
            lost in proptest::collection::vec(0usize..3, 0..3),
            stalled in proptest::option::of(0usize..3),
            from in 0usize..3,
        ) {
            let h = |b: u8| Hash([b; 32]);
            let t = Transcript {
                count,
                roots: [h(1), h(2)],
                rounds: rounds
                    .into_iter()
                    .map(|(depth, index, b)| Round {
                        depth,
                        index,
                        answers: [(h(b[0]), h(b[1])), (h(b[2]), h(b[3]))],
                    })
                    .collect(),
                leaf,
                operands: vec![Proof { index, leaf: h(9), siblings: vec![h(3); siblings] }],
                operands_from: from,
                bad_operands: vec![],
                referee: Some(h(4)),
                verdict: Verdict::Lost(lost),
                stalled,
                committed: (from == 1).then(|| [vec![h(9)], vec![h(8)]]),
                outputs: vec![Proof { index, leaf: h(9), siblings: vec![h(3); siblings] }],
            };
            let _ = t.check(None);
            let _ = t.check(Some(&|l: u64| vec![l.wrapping_sub(1)]));
        }
    }

    fn h(i: u64) -> Hash {
        Hash::of(&i.to_le_bytes())
    }

    /// Run a bisection between two trees, each party answering from its own tree.
    fn dispute(a: &TraceTree, b: &TraceTree) -> (Step, usize) {
        let mut bis = Bisection::new(a.count(), [a.root(), b.root()]);
        let mut rounds = 0;
        loop {
            match bis.next() {
                Step::Ask { depth, index } => {
                    rounds += 1;
                    let ans = [
                        a.children(depth, index).unwrap(),
                        b.children(depth, index).unwrap(),
                    ];
                    bis.answer(ans);
                }
                other => return (other, rounds),
            }
        }
    }

    #[test]
    fn the_walk_finds_the_first_differing_leaf_in_depth_rounds() {
        for n in [1u64, 2, 3, 5, 8, 100, 1000, 2049] {
            let honest: Vec<Hash> = (0..n).map(h).collect();
            for k in [0, n / 3, n / 2, n - 1] {
                // From leaf k on the liar's values differ (everything downstream), some later
                // leaves equal again: the first difference is still found.
                let mut liar = honest.clone();
                for (i, x) in liar.iter_mut().enumerate().skip(k as usize) {
                    if i as u64 == k || i % 3 == 0 {
                        *x = h(i as u64 + 1_000_000);
                    }
                }
                let (a, b) = (TraceTree::new(honest.clone()), TraceTree::new(liar));
                let (step, rounds) = dispute(&a, &b);
                assert_eq!(rounds as u32, depth_for(n), "n={n}");
                assert_eq!(
                    step,
                    Step::Found {
                        leaf: k,
                        hashes: [honest[k as usize], h(k + 1_000_000)]
                    },
                    "n={n} k={k}"
                );
                // The operands' proofs lead to the root.
                for j in 0..k.min(5) {
                    let p = a.proof(j).unwrap();
                    assert!(p.verifies(&a.root(), a.depth()));
                    assert_eq!(b.leaf(j), Some(p.leaf), "leaves left of k agree");
                    let mut wrong = p.clone();
                    wrong.leaf = h(99);
                    assert!(!wrong.verifies(&a.root(), a.depth()));
                }
            }
            let same = TraceTree::new(honest.clone());
            assert_eq!(dispute(&same, &same.clone()).0, Step::Agree);
        }
    }

    #[test]
    fn questions_out_of_range_get_no_answer() {
        let t = TraceTree::new((0..10).map(h).collect());
        for (depth, index) in [(u32::MAX, 0), (0, u64::MAX), (3, 1 << 62), (t.depth(), 0)] {
            assert_eq!(t.children(depth, index), None, "({depth}, {index})");
        }
        assert!(t.children(0, 0).is_some());
        assert_eq!(t.proof(u64::MAX), None);
    }

    #[test]
    fn a_party_answering_against_its_root_loses() {
        let honest: Vec<Hash> = (0..64).map(h).collect();
        let mut other = honest.clone();
        other[40] = h(7777);
        let (a, b) = (TraceTree::new(honest), TraceTree::new(other));
        let mut bis = Bisection::new(64, [a.root(), b.root()]);
        let Step::Ask { depth, index } = bis.next() else {
            panic!()
        };
        // Party 1 makes up children that do not hash to its root.
        let made_up = (h(1), h(2));
        let step = bis.answer([a.children(depth, index).unwrap(), made_up]);
        assert_eq!(step, Step::Inconsistent { parties: vec![1] });
        // Padding that is not PAD is a lie too.
        let short: Vec<Hash> = (0..5).map(h).collect();
        let a = TraceTree::new(short.clone());
        let mut padded = short.clone();
        padded.push(h(5));
        let mut b = TraceTree::new(padded);
        b.count = 5;
        let (step, _) = dispute(&a, &b);
        assert_eq!(step, Step::Inconsistent { parties: vec![1] });
    }

    #[test]
    fn transcripts_replay_and_refuse_edits() {
        let honest: Vec<Hash> = (0..300).map(h).collect();
        let mut liar = honest.clone();
        for x in liar.iter_mut().skip(123) {
            *x = h(5);
        }
        let (a, b) = (TraceTree::new(honest.clone()), TraceTree::new(liar));
        let mut bis = Bisection::new(300, [a.root(), b.root()]);
        while let Step::Ask { depth, index } = bis.next() {
            bis.answer([
                a.children(depth, index).unwrap(),
                b.children(depth, index).unwrap(),
            ]);
        }
        let operands_of = |leaf: u64| vec![leaf - 2, leaf - 1];
        let t = Transcript {
            count: 300,
            roots: [a.root(), b.root()],
            rounds: bis.rounds().to_vec(),
            leaf: Some(123),
            operands: vec![a.proof(121).unwrap(), a.proof(122).unwrap()],
            operands_from: 0,
            bad_operands: vec![],
            stalled: None,
            referee: Some(honest[123]),
            verdict: Verdict::Lost(vec![1]),
            committed: None,
            outputs: vec![],
        };
        t.check(Some(&operands_of)).unwrap();
        let mut wrong = t.clone();
        wrong.verdict = Verdict::Lost(vec![0]);
        assert!(wrong.check(Some(&operands_of)).is_err());
        let mut wrong = t.clone();
        wrong.rounds[3].answers[1].0 = h(1);
        assert!(wrong.check(Some(&operands_of)).is_err());
        let mut wrong = t.clone();
        wrong.operands[0].leaf = h(1);
        assert!(wrong.check(Some(&operands_of)).is_err());
        let mut wrong = t.clone();
        wrong.rounds.pop();
        assert!(wrong.check(Some(&operands_of)).is_err());
        // A walk cut short by a stall: the staller, and only the staller, lost.
        let stalled = Transcript {
            rounds: t.rounds[..3].to_vec(),
            leaf: None,
            operands: vec![],
            referee: None,
            verdict: Verdict::Lost(vec![1]),
            stalled: Some(1),
            ..t.clone()
        };
        stalled.check(Some(&operands_of)).unwrap();
        let mut wrong = stalled.clone();
        wrong.verdict = Verdict::Lost(vec![0]);
        assert!(wrong.check(Some(&operands_of)).is_err());
        let mut wrong = stalled.clone();
        wrong.rounds = t.rounds.clone();
        assert!(
            wrong.check(Some(&operands_of)).is_err(),
            "a finished walk did not stall"
        );

        // Equal traces, different results: the party whose committed outputs are not its
        // trace's output leaves lost; nothing else decides an agreeing walk.
        let outputs = vec![a.proof(298).unwrap(), a.proof(299).unwrap()];
        let leaves: Vec<Hash> = outputs.iter().map(|p| p.leaf).collect();
        let agree = Transcript {
            roots: [a.root(), a.root()],
            rounds: vec![],
            leaf: None,
            operands: vec![],
            referee: None,
            verdict: Verdict::Lost(vec![1]),
            committed: Some([leaves.clone(), vec![leaves[0], h(5)]]),
            outputs,
            ..t.clone()
        };
        agree.check(None).unwrap();
        let mut wrong = agree.clone();
        wrong.verdict = Verdict::Lost(vec![0]);
        assert!(wrong.check(None).is_err());
        let mut wrong = agree.clone();
        wrong.outputs[1].leaf = h(5);
        assert!(
            wrong.check(None).is_err(),
            "a proof that does not lead to the root"
        );
        let mut wrong = agree.clone();
        wrong.committed = None;
        assert!(wrong.check(None).is_err());
        let mut wrong = agree.clone();
        wrong.committed = Some([leaves.clone(), leaves.clone()]);
        assert!(wrong.check(None).is_err(), "nobody departed from the trace");
        // Transcripts without these fields serialize as they always did.
        let text = serde_json::to_string(&t).unwrap();
        assert!(
            !text.contains("committed") && !text.contains("outputs"),
            "{text}"
        );
    }
}
