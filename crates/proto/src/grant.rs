//! Pull grants: a coordinator's signed permission to fetch one tensor from its nodes. A node
//! serves `GET /v1/tensors/{hash}` only to keys it trusts; a grant lets the nodes of a
//! pipeline's next stage, which it does not know, fetch the boundary tensor the stage before
//! agreed on straight from a node of that stage (the coordinator does not relay it). It names
//! the one tensor and when it expires, and is signed by the coordinator the serving node
//! trusts; it opens nothing else. It travels as one header ([`GRANT_HEADER`]).

use crate::Hash;
use crate::auth::{KeyPair, PublicKey};
use crate::commit::Sig;

/// The header a pulling node sends its grant in.
pub const GRANT_HEADER: &str = "x-tenet-grant";

/// How long a grant lasts.
pub const GRANT_SECS: u64 = 600;

/// Permission to fetch the tensor `hash` until `expires` (unix seconds), from nodes that trust
/// `coordinator`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PullGrant {
    pub hash: Hash,
    pub expires: u64,
    pub coordinator: PublicKey,
    pub signature: Sig,
}

impl PullGrant {
    fn statement(hash: &Hash, expires: u64, coordinator: &PublicKey) -> Vec<u8> {
        let mut out = b"tenet-pull-grant-v1".to_vec();
        out.extend_from_slice(&hash.0);
        out.extend_from_slice(&expires.to_le_bytes());
        out.extend_from_slice(&coordinator.0);
        out
    }

    /// A grant for `hash`, valid for [`GRANT_SECS`] from `now`.
    pub fn sign(hash: Hash, now: u64, key: &KeyPair) -> PullGrant {
        let expires = now.saturating_add(GRANT_SECS);
        let coordinator = key.public();
        let signature = Sig(key.sign(&PullGrant::statement(&hash, expires, &coordinator)));
        PullGrant {
            hash,
            expires,
            coordinator,
            signature,
        }
    }

    /// Whether the grant is the coordinator's, for `hash`, and not expired at `now`.
    pub fn allows(&self, hash: &Hash, now: u64) -> bool {
        self.hash == *hash
            && now <= self.expires
            && self.coordinator.verify(
                &PullGrant::statement(&self.hash, self.expires, &self.coordinator),
                &self.signature.0,
            )
    }

    /// The header value: `hash.expires.coordinator.signature`, hex.
    pub fn to_header(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.hash.to_hex(),
            self.expires,
            self.coordinator.to_hex(),
            crate::to_hex(&self.signature.0)
        )
    }

    pub fn from_header(s: &str) -> Option<PullGrant> {
        let mut parts = s.split('.');
        let hash = Hash::parse(parts.next()?).ok()?;
        let expires = parts.next()?.parse().ok()?;
        let coordinator = PublicKey::parse(parts.next()?)?;
        let signature = Sig(crate::from_hex(parts.next()?)?.try_into().ok()?);
        parts.next().is_none().then_some(PullGrant {
            hash,
            expires,
            coordinator,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_opens_its_tensor_only_until_it_expires() {
        let key = KeyPair::from_seed([5; 32]);
        let h = Hash::of(b"boundary");
        let g = PullGrant::sign(h, 1000, &key);
        assert!(g.allows(&h, 1000 + GRANT_SECS));
        assert!(!g.allows(&h, 1001 + GRANT_SECS));
        assert!(!g.allows(&Hash::of(b"other"), 1000));
        let back = PullGrant::from_header(&g.to_header()).unwrap();
        assert_eq!(back, g);
        // A grant whose expiry or tensor was changed does not verify.
        let mut t = g.clone();
        t.expires += 1;
        assert!(!t.allows(&h, 1000));
        let mut t = g.clone();
        t.hash = Hash::of(b"other");
        assert!(!t.allows(&Hash::of(b"other"), 1000));
        assert!(PullGrant::from_header("nonsense").is_none());
        assert!(PullGrant::from_header(&format!("{}.x", g.to_header())).is_none());
    }
}
