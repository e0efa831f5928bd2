//! Receipts of pipeline calls: one verified job per stage, chained. A [`PipelineReceipt`]
//! holds each stage's own [`Receipt`] (its nodes' signed commitments and openings, signed by
//! the coordinator) in order, and the coordinator signs the whole. Anyone can check offline
//! that every stage receipt verifies, that each stage's boundary inputs (inputs named `%N`)
//! are exactly the tensors the stage before agreed on (same name, same hash), and that the
//! model's inputs are the same tensors wherever a stage reads them — so the chain of stages
//! computed the call's outputs from the call's inputs, each stage vouched for by its nodes.

use std::collections::BTreeMap;

use crate::Hash;
use crate::auth::{KeyPair, PublicKey};
use crate::commit::{OutputRef, Sig};
use crate::receipt::{Receipt, ReceiptError};

/// The prefix of a boundary tensor's name (`%N`, after the node that computes it).
pub const BOUNDARY_PREFIX: char = '%';

/// A signed statement of a verified pipeline call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineReceipt {
    pub version: u32,
    /// The pipeline: the hash of its manifest.
    pub pipeline: Hash,
    /// Each stage's receipt, in order.
    pub stages: Vec<Receipt>,
    pub coordinator: PublicKey,
    /// Unix seconds.
    pub issued_at: u64,
    pub signature: Sig,
}

/// Why a pipeline receipt does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineReceiptError {
    #[error("unsupported pipeline receipt version {0} (this tenet reads version 1)")]
    Version(u32),
    #[error("a pipeline receipt needs at least one stage")]
    Empty,
    #[error("stage {stage}: {source}")]
    Stage { stage: usize, source: ReceiptError },
    #[error("stage {stage}'s receipt is signed by {actual}, not by the pipeline's coordinator")]
    OtherCoordinator { stage: usize, actual: String },
    #[error(
        "stage {stage} read boundary tensor {name} as {read}, but stage {prev} agreed on {agreed}: the chain is broken"
    )]
    Chain {
        stage: usize,
        prev: usize,
        name: String,
        read: String,
        agreed: String,
    },
    #[error("input {name} is {a} in stage {first} but {b} in stage {stage}")]
    Inputs {
        name: String,
        first: usize,
        a: String,
        stage: usize,
        b: String,
    },
    #[error("the coordinator's signature does not verify: the receipt was altered or forged")]
    CoordinatorSignature,
    #[error("the receipt is signed by {actual}, not by the expected coordinator {expected}")]
    WrongCoordinator { expected: String, actual: String },
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field);
}

impl PipelineReceipt {
    /// Sign the stages' receipts as one statement.
    pub fn sign(pipeline: Hash, stages: Vec<Receipt>, key: &KeyPair) -> PipelineReceipt {
        let mut r = PipelineReceipt {
            version: 1,
            pipeline,
            stages,
            coordinator: key.public(),
            issued_at: crate::unix_now(),
            signature: Sig([0; 64]),
        };
        r.signature = Sig(key.sign(&r.statement()));
        r
    }

    /// The bytes the coordinator signs: every field but the signature; each stage by its own
    /// signed statement and signature.
    pub fn statement(&self) -> Vec<u8> {
        let mut out = b"tenet-pipeline-receipt-v1".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        put(&mut out, &self.pipeline.0);
        out.extend_from_slice(&(self.stages.len() as u64).to_le_bytes());
        for s in &self.stages {
            put(&mut out, &s.statement());
            put(&mut out, &s.signature.0);
        }
        put(&mut out, &self.coordinator.0);
        out.extend_from_slice(&self.issued_at.to_le_bytes());
        out
    }

    /// The call's outputs: every stage output that is not a boundary tensor, in stage order.
    pub fn outputs(&self) -> Vec<&OutputRef> {
        self.stages
            .iter()
            .flat_map(|s| &s.outputs)
            .filter(|o| !o.name.starts_with(BOUNDARY_PREFIX))
            .collect()
    }

    /// Check everything that can be checked without the tensors (see the module doc).
    pub fn verify(&self) -> Result<(), PipelineReceiptError> {
        if self.version != 1 {
            return Err(PipelineReceiptError::Version(self.version));
        }
        if self.stages.is_empty() {
            return Err(PipelineReceiptError::Empty);
        }
        if !self
            .coordinator
            .verify(&self.statement(), &self.signature.0)
        {
            return Err(PipelineReceiptError::CoordinatorSignature);
        }
        let mut inputs: BTreeMap<&str, (usize, Hash)> = BTreeMap::new();
        for (k, s) in self.stages.iter().enumerate() {
            s.verify()
                .map_err(|source| PipelineReceiptError::Stage { stage: k, source })?;
            if s.coordinator != self.coordinator {
                return Err(PipelineReceiptError::OtherCoordinator {
                    stage: k,
                    actual: s.coordinator.to_hex(),
                });
            }
            for (name, hash) in &s.job.inputs {
                if name.starts_with(BOUNDARY_PREFIX) {
                    let agreed = k
                        .checked_sub(1)
                        .and_then(|p| self.stages[p].outputs.iter().find(|o| o.name == *name));
                    if agreed.is_none_or(|o| o.hash != *hash) {
                        return Err(PipelineReceiptError::Chain {
                            stage: k,
                            prev: k.saturating_sub(1),
                            name: name.clone(),
                            read: hash.short(),
                            agreed: agreed.map_or("nothing".into(), |o| o.hash.short()),
                        });
                    }
                } else if let Some((first, h)) = inputs.get(name.as_str()) {
                    if h != hash {
                        return Err(PipelineReceiptError::Inputs {
                            name: name.clone(),
                            first: *first,
                            a: h.short(),
                            stage: k,
                            b: hash.short(),
                        });
                    }
                } else {
                    inputs.insert(name, (k, *hash));
                }
            }
        }
        Ok(())
    }

    /// `verify`, and require a particular coordinator.
    pub fn verify_from(&self, coordinator: &PublicKey) -> Result<(), PipelineReceiptError> {
        self.verify()?;
        if self.coordinator != *coordinator {
            return Err(PipelineReceiptError::WrongCoordinator {
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
    use crate::commit::{Commitment, JobSpec, Tier, output_hash};
    use crate::receipt::Attestation;

    fn stage(
        k: usize,
        inputs: &[(&str, Hash)],
        outputs: &[(&str, Hash)],
        key: &KeyPair,
    ) -> Receipt {
        let job = JobSpec {
            job_id: format!("j{k}"),
            task: Hash::of(format!("stage{k}").as_bytes()),
            weights: None,
            inputs: inputs.iter().map(|(n, h)| (n.to_string(), *h)).collect(),
            tier: Tier::Exact,
            seed: 0,
        };
        let outputs: Vec<OutputRef> = outputs
            .iter()
            .map(|(n, h)| OutputRef {
                name: n.to_string(),
                hash: *h,
                ty: "f32[2]".into(),
            })
            .collect();
        let oh = output_hash(&outputs);
        let nodes = (0..2)
            .map(|i| {
                let node = KeyPair::from_seed([10 * k as u8 + i + 1; 32]);
                let salt = Hash([i; 32]);
                Attestation {
                    commitment: Commitment::sign(job.clone(), &node, &oh, &salt),
                    output_hash: oh,
                    salt,
                }
            })
            .collect();
        Receipt {
            version: 1,
            job,
            outputs,
            output_hash: oh,
            replicas: 2,
            tolerance: 0.0,
            nodes,
            coordinator: key.public(),
            issued_at: 1,
            dispute: None,
            signature: Sig([0; 64]),
        }
        .sign(key)
    }

    fn chain(key: &KeyPair, b: Hash) -> PipelineReceipt {
        let x = Hash::of(b"x");
        let stages = vec![
            stage(0, &[("x", x)], &[("%4", Hash::of(b"h"))], key),
            stage(1, &[("%4", Hash::of(b"h")), ("x", x)], &[("%9", b)], key),
            stage(2, &[("%9", b)], &[("y", Hash::of(b"y"))], key),
        ];
        PipelineReceipt::sign(Hash::of(b"manifest"), stages, key)
    }

    #[test]
    fn a_chain_verifies_and_survives_json() {
        let key = KeyPair::from_seed([99; 32]);
        let r = chain(&key, Hash::of(b"b"));
        r.verify_from(&key.public()).unwrap();
        let back: PipelineReceipt =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.outputs().len(), 1);
        assert_eq!(back.outputs()[0].name, "y");
    }

    #[test]
    fn a_broken_chain_is_caught_even_when_re_signed() {
        let key = KeyPair::from_seed([99; 32]);
        let honest = chain(&key, Hash::of(b"b"));
        // The last stage read another tensor than the middle one agreed on; every stage
        // receipt and the whole re-signed by the coordinator itself: still caught.
        let mut stages = honest.stages.clone();
        stages[2] = stage(
            2,
            &[("%9", Hash::of(b"other"))],
            &[("y", Hash::of(b"y"))],
            &key,
        );
        let forged = PipelineReceipt::sign(honest.pipeline, stages, &key);
        assert!(matches!(
            forged.verify(),
            Err(PipelineReceiptError::Chain { stage: 2, .. })
        ));
        // A model input that differs between stages.
        let mut stages = honest.stages.clone();
        stages[1] = stage(
            1,
            &[("%4", Hash::of(b"h")), ("x", Hash::of(b"x2"))],
            &[("%9", Hash::of(b"b"))],
            &key,
        );
        assert!(matches!(
            PipelineReceipt::sign(honest.pipeline, stages, &key).verify(),
            Err(PipelineReceiptError::Inputs { .. })
        ));
        // A stage dropped.
        let mut stages = honest.stages.clone();
        stages.remove(1);
        assert!(matches!(
            PipelineReceipt::sign(honest.pipeline, stages, &key).verify(),
            Err(PipelineReceiptError::Chain { .. })
        ));
        // An altered field without re-signing; a stage from another coordinator.
        let mut t = honest.clone();
        t.stages[0].outputs[0].hash = Hash::of(b"z");
        assert_eq!(t.verify(), Err(PipelineReceiptError::CoordinatorSignature));
        let other = KeyPair::from_seed([7; 32]);
        let mut stages = honest.stages.clone();
        stages[0] = stage(
            0,
            &[("x", Hash::of(b"x"))],
            &[("%4", Hash::of(b"h"))],
            &other,
        );
        assert!(matches!(
            PipelineReceipt::sign(honest.pipeline, stages, &key).verify(),
            Err(PipelineReceiptError::OtherCoordinator { stage: 0, .. })
        ));
        assert!(matches!(
            honest.verify_from(&other.public()),
            Err(PipelineReceiptError::WrongCoordinator { .. })
        ));
    }
}
