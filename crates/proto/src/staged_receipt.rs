//! Receipts of generations across nodes run by a coordinator: an LLM cut into stages of its
//! layers, each stage on several staked nodes at once, every token's rows agreed by a strict
//! majority of a stage's nodes before they went on. A [`StagedReceipt`] names the model (its
//! GGUF file), the prompt's token ids, the sampling, the tokens, each stage's layers and the
//! nodes that ended it in agreement, and the nodes outvoted (and slashed) on the way; the
//! coordinator signs all of it. Offline, anyone checks the signature and that the stages chain
//! (layer 0 to the last, no gap or overlap), and can re-run the model on the prompt with the
//! same sampling to compare the tokens.

use crate::Hash;
use crate::auth::{KeyPair, PublicKey};
use crate::commit::Sig;

/// The sampling a generation used (`None` in the receipt: greedy).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StagedSampling {
    pub seed: u64,
    pub temperature: f32,
    pub top_p: f32,
}

/// One stage: its layers and the nodes whose answers it went on with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagedStage {
    pub first: u64,
    pub end: u64,
    pub nodes: Vec<PublicKey>,
}

/// A signed statement of a generation across nodes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StagedReceipt {
    pub version: u32,
    pub generation: String,
    /// The model's weights file (its GGUF, by hash).
    pub model: Hash,
    pub prompt: Vec<u32>,
    pub sampling: Option<StagedSampling>,
    pub tokens: Vec<u32>,
    /// Nodes each stage ran on at once.
    pub replicas: u32,
    pub stages: Vec<StagedStage>,
    /// Nodes whose answers differed from their stage's majority.
    pub outvoted: Vec<PublicKey>,
    pub coordinator: PublicKey,
    /// Unix seconds.
    pub issued_at: u64,
    pub signature: Sig,
}

/// Why a staged receipt does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagedReceiptError {
    #[error("unsupported staged receipt version {0} (this tenet reads version 1)")]
    Version(u32),
    #[error(
        "the stages do not chain: stage {stage} holds layers {first}..{end}, expected to start at layer {expected}"
    )]
    Chain {
        stage: usize,
        first: u64,
        end: u64,
        expected: u64,
    },
    #[error("stage {0} names no node")]
    NoNodes(usize),
    #[error("the coordinator's signature does not verify: the receipt was altered or forged")]
    CoordinatorSignature,
    #[error("the receipt is signed by {actual}, not by the expected coordinator {expected}")]
    WrongCoordinator { expected: String, actual: String },
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field);
}

fn put_ids(out: &mut Vec<u8>, ids: &[u32]) {
    out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

impl StagedReceipt {
    /// Sign a generation's facts as one statement.
    #[allow(clippy::too_many_arguments)]
    pub fn sign(
        generation: String,
        model: Hash,
        prompt: Vec<u32>,
        sampling: Option<StagedSampling>,
        tokens: Vec<u32>,
        replicas: u32,
        stages: Vec<StagedStage>,
        outvoted: Vec<PublicKey>,
        key: &KeyPair,
    ) -> StagedReceipt {
        let mut r = StagedReceipt {
            version: 1,
            generation,
            model,
            prompt,
            sampling,
            tokens,
            replicas,
            stages,
            outvoted,
            coordinator: key.public(),
            issued_at: crate::unix_now(),
            signature: Sig([0; 64]),
        };
        r.signature = Sig(key.sign(&r.statement()));
        r
    }

    /// The bytes the coordinator signs: every field but the signature.
    pub fn statement(&self) -> Vec<u8> {
        let mut out = b"tenet-staged-generation-receipt-v1".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        put(&mut out, self.generation.as_bytes());
        put(&mut out, &self.model.0);
        put_ids(&mut out, &self.prompt);
        match &self.sampling {
            None => out.push(0),
            Some(s) => {
                out.push(1);
                out.extend_from_slice(&s.seed.to_le_bytes());
                out.extend_from_slice(&s.temperature.to_bits().to_le_bytes());
                out.extend_from_slice(&s.top_p.to_bits().to_le_bytes());
            }
        }
        put_ids(&mut out, &self.tokens);
        out.extend_from_slice(&self.replicas.to_le_bytes());
        out.extend_from_slice(&(self.stages.len() as u64).to_le_bytes());
        for s in &self.stages {
            out.extend_from_slice(&s.first.to_le_bytes());
            out.extend_from_slice(&s.end.to_le_bytes());
            out.extend_from_slice(&(s.nodes.len() as u64).to_le_bytes());
            for n in &s.nodes {
                put(&mut out, &n.0);
            }
        }
        out.extend_from_slice(&(self.outvoted.len() as u64).to_le_bytes());
        for n in &self.outvoted {
            put(&mut out, &n.0);
        }
        put(&mut out, &self.coordinator.0);
        out.extend_from_slice(&self.issued_at.to_le_bytes());
        out
    }

    /// Check everything that can be checked without the model (see the module doc).
    pub fn verify(&self) -> Result<(), StagedReceiptError> {
        if self.version != 1 {
            return Err(StagedReceiptError::Version(self.version));
        }
        let mut expected = 0;
        for (k, s) in self.stages.iter().enumerate() {
            if s.first != expected || s.end <= s.first {
                return Err(StagedReceiptError::Chain {
                    stage: k,
                    first: s.first,
                    end: s.end,
                    expected,
                });
            }
            if s.nodes.is_empty() {
                return Err(StagedReceiptError::NoNodes(k));
            }
            expected = s.end;
        }
        if self.stages.is_empty() {
            return Err(StagedReceiptError::Chain {
                stage: 0,
                first: 0,
                end: 0,
                expected: 0,
            });
        }
        if !self
            .coordinator
            .verify(&self.statement(), &self.signature.0)
        {
            return Err(StagedReceiptError::CoordinatorSignature);
        }
        Ok(())
    }

    /// `verify`, and require a particular coordinator.
    pub fn verify_from(&self, coordinator: &PublicKey) -> Result<(), StagedReceiptError> {
        self.verify()?;
        if self.coordinator != *coordinator {
            return Err(StagedReceiptError::WrongCoordinator {
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

    fn receipt(key: &KeyPair) -> StagedReceipt {
        let node = KeyPair::from_seed([9; 32]).public();
        StagedReceipt::sign(
            "g1".into(),
            Hash::of(b"model"),
            vec![1, 2, 3],
            None,
            vec![4, 5],
            3,
            vec![
                StagedStage {
                    first: 0,
                    end: 15,
                    nodes: vec![node],
                },
                StagedStage {
                    first: 15,
                    end: 30,
                    nodes: vec![node],
                },
            ],
            vec![],
            key,
        )
    }

    #[test]
    fn a_signed_receipt_verifies_and_any_change_breaks_it() {
        let key = KeyPair::from_seed([1; 32]);
        let r = receipt(&key);
        r.verify_from(&key.public()).unwrap();
        let mut t = r.clone();
        t.tokens[0] = 7;
        assert_eq!(t.verify(), Err(StagedReceiptError::CoordinatorSignature));
        let mut t = r.clone();
        t.sampling = Some(StagedSampling {
            seed: 1,
            temperature: 0.5,
            top_p: 1.0,
        });
        assert_eq!(t.verify(), Err(StagedReceiptError::CoordinatorSignature));
        let mut t = r.clone();
        t.stages[1].first = 14;
        assert!(matches!(t.verify(), Err(StagedReceiptError::Chain { .. })));
        let other = KeyPair::from_seed([2; 32]).public();
        assert!(matches!(
            r.verify_from(&other),
            Err(StagedReceiptError::WrongCoordinator { .. })
        ));
        let json = serde_json::to_string(&r).unwrap();
        let back: StagedReceipt = serde_json::from_str(&json).unwrap();
        back.verify().unwrap();
    }

    /// A receipt comes from a coordinator the client does not control: mutated at random, it
    /// parses or not and verifies or not, and anything changed after signing fails.
    #[test]
    fn mutated_receipts_never_panic_and_never_verify() {
        let key = KeyPair::from_seed([1; 32]);
        let json = serde_json::to_vec(&receipt(&key)).unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let mut v = json.clone();
            for _ in 0..1 + next() % 3 {
                let i = (next() % v.len() as u64) as usize;
                let alphabet = b"0123456789abcdef[]{},:\"-";
                v[i] = alphabet[(next() % alphabet.len() as u64) as usize];
            }
            if v == json {
                continue;
            }
            if let Ok(r) = serde_json::from_slice::<StagedReceipt>(&v)
                && r != receipt_like(&json)
            {
                assert!(r.verify().is_err(), "{}", String::from_utf8_lossy(&v));
            }
        }
    }

    fn receipt_like(json: &[u8]) -> StagedReceipt {
        serde_json::from_slice(json).unwrap()
    }
}
