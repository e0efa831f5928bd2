//! Receipts: what a caller keeps. A receipt names the job (task, weights, inputs, tier, seed),
//! the agreed outputs, and for every node that agreed its signed commitment with the output
//! hash and salt that open it; the coordinator signs all of it. Anyone can check a receipt
//! offline with [`Receipt::verify`] — every node signature, every commitment opening, the
//! outputs' hash, the coordinator's signature — and re-run the job to compare (`tenet receipt
//! verify --replay`).

use crate::Hash;
use crate::auth::{KeyPair, PublicKey};
use crate::commit::{Commitment, JobSpec, OutputRef, Sig, Tier, commitment_digest, output_hash};
use crate::trace::Transcript;

/// One node's part in the agreement.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attestation {
    /// The node's signed commitment (it names the node).
    pub commitment: Commitment,
    /// The output hash the node revealed.
    pub output_hash: Hash,
    /// The salt that opens its commitment.
    pub salt: Hash,
}

/// A signed statement of a verified result.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub version: u32,
    pub job: JobSpec,
    /// The agreed outputs, in graph order.
    pub outputs: Vec<OutputRef>,
    pub output_hash: Hash,
    /// How many nodes were asked.
    pub replicas: u32,
    /// In the tolerant tier, the per-element bound each agreeing node met against the
    /// element-wise median (0 in the exact tier).
    pub tolerance: f64,
    pub nodes: Vec<Attestation>,
    pub coordinator: PublicKey,
    /// Unix seconds.
    pub issued_at: u64,
    /// When two replicas disagreed without a majority and a bisection between them decided
    /// the result: its transcript (`tenet_proto::trace`), signed with the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispute: Option<Transcript>,
    pub signature: Sig,
}

/// Why a receipt does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("the dispute that decided the job does not check out: {0}")]
    Dispute(String),
    #[error("unsupported receipt version {0} (this tenet reads version 1)")]
    Version(u32),
    #[error("the coordinator's signature does not verify: the receipt was altered or forged")]
    CoordinatorSignature,
    #[error("the outputs listed do not hash to the receipt's output hash")]
    Outputs,
    #[error("node {node}: its commitment's signature does not verify")]
    NodeSignature { node: String },
    #[error("node {node}: its commitment is for another job")]
    OtherJob { node: String },
    #[error("node {node}: the revealed output hash and salt do not open its commitment")]
    Opening { node: String },
    #[error("node {node}: in the exact tier it must have revealed the agreed output hash")]
    Disagrees { node: String },
    #[error("node {node} is listed twice")]
    Duplicate { node: String },
    #[error("{agreeing} agreeing node(s) is not a majority of the {replicas} asked")]
    NoMajority { agreeing: usize, replicas: u32 },
    #[error("the receipt is signed by {actual}, not by the expected coordinator {expected}")]
    WrongCoordinator { expected: String, actual: String },
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field);
}

impl Receipt {
    /// The bytes the coordinator signs: every field but the signature, length-prefixed.
    pub fn statement(&self) -> Vec<u8> {
        let mut out = b"tenet-receipt-v1".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        put(
            &mut out,
            &Commitment::statement(&self.job, &self.coordinator, &self.output_hash),
        );
        out.extend_from_slice(&(self.outputs.len() as u64).to_le_bytes());
        for o in &self.outputs {
            put(&mut out, o.name.as_bytes());
            put(&mut out, &o.hash.0);
            put(&mut out, o.ty.as_bytes());
        }
        out.extend_from_slice(&self.replicas.to_le_bytes());
        out.extend_from_slice(&self.tolerance.to_bits().to_le_bytes());
        out.extend_from_slice(&(self.nodes.len() as u64).to_le_bytes());
        for n in &self.nodes {
            put(
                &mut out,
                &Commitment::statement(
                    &n.commitment.job,
                    &n.commitment.node,
                    &n.commitment.commitment,
                ),
            );
            put(&mut out, &n.commitment.signature.0);
            put(&mut out, &n.output_hash.0);
            put(&mut out, &n.salt.0);
        }
        put(&mut out, &self.coordinator.0);
        out.extend_from_slice(&self.issued_at.to_le_bytes());
        if let Some(d) = &self.dispute {
            // Receipts without a dispute sign what they always signed.
            put(&mut out, b"dispute");
            let json = serde_json::to_vec(d).unwrap_or_default();
            put(&mut out, blake3::hash(&json).as_bytes());
        }
        out
    }

    /// Sign as the coordinator `key` (sets `coordinator` and `signature`).
    pub fn sign(mut self, key: &KeyPair) -> Receipt {
        self.coordinator = key.public();
        self.signature = Sig(key.sign(&self.statement()));
        self
    }

    /// Check everything that can be checked without the tensors.
    pub fn verify(&self) -> Result<(), ReceiptError> {
        if self.version != 1 {
            return Err(ReceiptError::Version(self.version));
        }
        if !self
            .coordinator
            .verify(&self.statement(), &self.signature.0)
        {
            return Err(ReceiptError::CoordinatorSignature);
        }
        if output_hash(&self.outputs) != self.output_hash {
            return Err(ReceiptError::Outputs);
        }
        let mut seen = Vec::new();
        for n in &self.nodes {
            let node = n.commitment.node.to_hex();
            if seen.contains(&n.commitment.node) {
                return Err(ReceiptError::Duplicate { node });
            }
            seen.push(n.commitment.node);
            if !n.commitment.verify() {
                return Err(ReceiptError::NodeSignature { node });
            }
            if n.commitment.job != self.job {
                return Err(ReceiptError::OtherJob { node });
            }
            if commitment_digest(&n.output_hash, &n.salt) != n.commitment.commitment {
                return Err(ReceiptError::Opening { node });
            }
            if self.job.tier == Tier::Exact && n.output_hash != self.output_hash {
                return Err(ReceiptError::Disagrees { node });
            }
        }
        if let Some(d) = &self.dispute {
            // Decided by a dispute: its walk and verdict must hold, and one side lost.
            d.check(None)
                .map_err(|e| ReceiptError::Dispute(e.to_string()))?;
            let crate::trace::Verdict::Lost(lost) = &d.verdict;
            if lost.len() != 1 || self.nodes.is_empty() {
                return Err(ReceiptError::Dispute(format!(
                    "the dispute's verdict names {lost:?}: it decided nothing"
                )));
            }
            // Decided by the outputs each side committed to: the winner's are the receipt's.
            if let Some(committed) = &d.committed {
                let outputs: Vec<crate::Hash> = self.outputs.iter().map(|o| o.hash).collect();
                if committed[1 - lost[0]] != outputs {
                    return Err(ReceiptError::Dispute(
                        "the dispute's winner committed to other outputs than the receipt's".into(),
                    ));
                }
            }
        } else if (self.nodes.len() as u64) * 2 <= self.replicas as u64 {
            return Err(ReceiptError::NoMajority {
                agreeing: self.nodes.len(),
                replicas: self.replicas,
            });
        }
        Ok(())
    }

    /// `verify`, and require a particular coordinator.
    pub fn verify_from(&self, coordinator: &PublicKey) -> Result<(), ReceiptError> {
        self.verify()?;
        if self.coordinator != *coordinator {
            return Err(ReceiptError::WrongCoordinator {
                expected: coordinator.to_hex(),
                actual: self.coordinator.to_hex(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobSpec {
        JobSpec {
            job_id: "j".into(),
            task: Hash::of(b"t"),
            weights: None,
            inputs: [("x".to_string(), Hash::of(b"x"))].into(),
            tier: Tier::Exact,
            seed: 0,
        }
    }

    fn receipt(nodes: usize, replicas: u32) -> Receipt {
        let outputs = vec![OutputRef {
            name: "y".into(),
            hash: Hash::of(b"y"),
            ty: "f32[1]".into(),
        }];
        let oh = output_hash(&outputs);
        let attest = (0..nodes)
            .map(|i| {
                let key = KeyPair::from_seed([i as u8 + 1; 32]);
                let salt = Hash([i as u8; 32]);
                Attestation {
                    commitment: Commitment::sign(job(), &key, &oh, &salt),
                    output_hash: oh,
                    salt,
                }
            })
            .collect();
        Receipt {
            version: 1,
            job: job(),
            outputs,
            output_hash: oh,
            replicas,
            tolerance: 0.0,
            nodes: attest,
            coordinator: KeyPair::from_seed([99; 32]).public(),
            issued_at: 1,
            dispute: None,
            signature: Sig([0; 64]),
        }
        .sign(&KeyPair::from_seed([99; 32]))
    }

    #[test]
    fn honest_receipts_verify_and_survive_json() {
        let r = receipt(2, 3);
        r.verify().unwrap();
        let back: Receipt = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        back.verify_from(&KeyPair::from_seed([99; 32]).public())
            .unwrap();
        assert!(matches!(
            back.verify_from(&KeyPair::from_seed([98; 32]).public()),
            Err(ReceiptError::WrongCoordinator { .. })
        ));
    }

    #[test]
    fn every_alteration_is_caught() {
        let r = receipt(2, 3);
        let mut t = r.clone();
        t.outputs[0].hash = Hash::of(b"other");
        assert_eq!(t.verify(), Err(ReceiptError::CoordinatorSignature));
        // Re-signed by a forger, altered outputs are still caught.
        let forged = KeyPair::from_seed([7; 32]);
        assert_eq!(t.clone().sign(&forged).verify(), Err(ReceiptError::Outputs));
        let mut t = r.clone();
        t.nodes[1].salt = Hash([42; 32]);
        assert!(matches!(
            t.sign(&forged).verify(),
            Err(ReceiptError::Opening { .. })
        ));
        let mut t = r.clone();
        t.nodes[0].commitment.job.seed = 5;
        assert!(matches!(
            t.sign(&forged).verify(),
            Err(ReceiptError::NodeSignature { .. })
        ));
        let mut t = r.clone();
        t.nodes.push(t.nodes[0].clone());
        assert!(matches!(
            t.sign(&forged).verify(),
            Err(ReceiptError::Duplicate { .. })
        ));
        let mut t = r.clone();
        t.replicas = 4;
        assert!(matches!(
            t.sign(&forged).verify(),
            Err(ReceiptError::NoMajority { .. })
        ));
        let mut t = r.clone();
        t.issued_at += 1;
        assert_eq!(t.verify(), Err(ReceiptError::CoordinatorSignature));
        let mut t = r;
        t.version = 2;
        assert_eq!(t.verify(), Err(ReceiptError::Version(2)));
    }
}
