//! Commit-reveal. A node that finishes a job does not return its result: it returns a signed
//! [`Commitment`] to `H(output hash ‖ salt)`, bound to the job, the task, the weights, the
//! inputs, the tier and the seed. Only when asked later does it [`Reveal`] the outputs and the
//! salt; anyone can check that the reveal opens the commitment and that the node signed it. A
//! node that sees other nodes' reveals before committing could copy them; one that has
//! committed cannot change its answer, and its signature makes the answer its own.

use std::collections::BTreeMap;

use crate::Hash;
use crate::auth::{KeyPair, PublicKey};

/// How replicas' results are compared.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Output hashes must be equal: tenet's executors are bit-reproducible.
    #[default]
    Exact,
    /// Outputs are compared element-wise within a bound.
    Tolerant,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Exact => "exact",
            Tier::Tolerant => "tolerant",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        match s {
            "exact" => Some(Tier::Exact),
            "tolerant" => Some(Tier::Tolerant),
            _ => None,
        }
    }
}

/// One output tensor of a job: its graph output name, blob address and type text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputRef {
    pub name: String,
    pub hash: Hash,
    #[serde(rename = "type")]
    pub ty: String,
}

impl OutputRef {
    /// The reference to output `name` holding `t`.
    pub fn of(name: &str, t: &tenet_ir::HostTensor) -> OutputRef {
        OutputRef {
            name: name.to_string(),
            hash: crate::tensor::hash(t),
            ty: t.ty().to_string(),
        }
    }
}

/// References to a run's outputs, in order.
pub fn output_refs(outputs: &[(String, tenet_ir::HostTensor)]) -> Vec<OutputRef> {
    outputs.iter().map(|(n, t)| OutputRef::of(n, t)).collect()
}

/// The hash of a job's outputs: their names and tensor hashes in graph output order.
pub fn output_hash(outputs: &[OutputRef]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"tenet-outputs-v1");
    for o in outputs {
        h.update(&(o.name.len() as u64).to_le_bytes());
        h.update(o.name.as_bytes());
        h.update(&o.hash.0);
    }
    h.finalize().into()
}

/// `H(output hash ‖ salt)`: what a node commits to.
pub fn commitment_digest(output_hash: &Hash, salt: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"tenet-commit-v1");
    h.update(&output_hash.0);
    h.update(&salt.0);
    h.finalize().into()
}

/// A 64-byte Ed25519 signature, hex on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sig(pub [u8; 64]);

impl std::fmt::Debug for Sig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sig({}…)", &crate::to_hex(&self.0)[..12])
    }
}

impl serde::Serialize for Sig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::to_hex(&self.0))
    }
}

impl<'de> serde::Deserialize<'de> for Sig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sig, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        crate::from_hex(&s)
            .and_then(|v| v.try_into().ok())
            .map(Sig)
            .ok_or_else(|| serde::de::Error::custom("expected a 128-hex-character signature"))
    }
}

/// What a job is: everything a commitment binds besides the result.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    /// Chosen by the caller; 1–64 characters of `[A-Za-z0-9_.-]`.
    pub job_id: String,
    /// The graph's id (its blob address).
    pub task: Hash,
    /// The safetensors weights file, if the graph references one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Hash>,
    /// Graph input name → tensor blob address.
    pub inputs: BTreeMap<String, Hash>,
    #[serde(default)]
    pub tier: Tier,
    #[serde(default)]
    pub seed: u64,
}

/// Whether `id` is a usable job id.
pub fn valid_job_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// A node's signed promise of a result it has not shown yet.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Commitment {
    #[serde(flatten)]
    pub job: JobSpec,
    /// The committing node.
    pub node: PublicKey,
    /// `H(output hash ‖ salt)`.
    pub commitment: Hash,
    /// The node's signature over [`Commitment::statement`].
    pub signature: Sig,
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u64).to_le_bytes());
    out.extend_from_slice(field);
}

impl Commitment {
    /// The bytes the node signs: every field but the signature, length-prefixed.
    pub fn statement(job: &JobSpec, node: &PublicKey, commitment: &Hash) -> Vec<u8> {
        let mut out = b"tenet-commitment-v1".to_vec();
        put(&mut out, job.job_id.as_bytes());
        put(&mut out, &node.0);
        put(&mut out, &job.task.0);
        put(&mut out, job.weights.as_ref().map_or(&[][..], |w| &w.0[..]));
        out.extend_from_slice(&(job.inputs.len() as u64).to_le_bytes());
        for (name, hash) in &job.inputs {
            put(&mut out, name.as_bytes());
            put(&mut out, &hash.0);
        }
        put(&mut out, job.tier.as_str().as_bytes());
        out.extend_from_slice(&job.seed.to_le_bytes());
        put(&mut out, &commitment.0);
        out
    }

    /// Commit to `outputs` with `salt`, signing as `key`.
    pub fn sign(job: JobSpec, key: &KeyPair, output_hash: &Hash, salt: &Hash) -> Commitment {
        let commitment = commitment_digest(output_hash, salt);
        let node = key.public();
        let signature = Sig(key.sign(&Commitment::statement(&job, &node, &commitment)));
        Commitment {
            job,
            node,
            commitment,
            signature,
        }
    }

    /// Whether `node` really signed this.
    pub fn verify(&self) -> bool {
        let msg = Commitment::statement(&self.job, &self.node, &self.commitment);
        self.node.verify(&msg, &self.signature.0)
    }
}

/// A job's result, shown after the commitment.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reveal {
    pub job_id: String,
    /// In graph output order.
    pub outputs: Vec<OutputRef>,
    pub output_hash: Hash,
    /// The 32 random bytes mixed into the commitment.
    pub salt: Hash,
}

impl Reveal {
    /// Whether this reveal opens `c`: same job, outputs hash to `output_hash`, and
    /// `H(output_hash ‖ salt)` is what was committed.
    pub fn opens(&self, c: &Commitment) -> bool {
        self.job_id == c.job.job_id
            && output_hash(&self.outputs) == self.output_hash
            && commitment_digest(&self.output_hash, &self.salt) == c.commitment
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            job_id: "job-1".into(),
            task: Hash::of(b"graph"),
            weights: None,
            inputs: [("x".to_string(), Hash::of(b"x"))].into(),
            tier: Tier::Exact,
            seed: 3,
        }
    }

    #[test]
    fn commitments_verify_open_and_bind_every_field() {
        let key = KeyPair::from_seed([5; 32]);
        let outs = vec![OutputRef {
            name: "y".into(),
            hash: Hash::of(b"y"),
            ty: "f32[1]".into(),
        }];
        let oh = output_hash(&outs);
        let salt = Hash([9; 32]);
        let c = Commitment::sign(spec(), &key, &oh, &salt);
        assert!(c.verify());
        let json = serde_json::to_string(&c).unwrap();
        let back: Commitment = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        let r = Reveal {
            job_id: "job-1".into(),
            outputs: outs.clone(),
            output_hash: oh,
            salt,
        };
        assert!(r.opens(&c));
        let mut lie = r.clone();
        lie.outputs[0].hash = Hash::of(b"other");
        assert!(!lie.opens(&c), "changed outputs do not open the commitment");
        let mut lie = r.clone();
        lie.salt = Hash([8; 32]);
        assert!(!lie.opens(&c));
        for change in 0..5 {
            let mut t = c.clone();
            match change {
                0 => t.job.job_id = "job-2".into(),
                1 => t.job.seed = 4,
                2 => t.job.tier = Tier::Tolerant,
                3 => t.job.weights = Some(Hash::of(b"w")),
                _ => t.commitment = Hash::of(b"c"),
            }
            assert!(!t.verify(), "change {change} must break the signature");
        }
    }

    #[test]
    fn job_ids_are_bounded_and_plain() {
        assert!(valid_job_id("a-b_c.9"));
        assert!(!valid_job_id(""));
        assert!(!valid_job_id("a/b"));
        assert!(!valid_job_id(&"x".repeat(65)));
    }
}
