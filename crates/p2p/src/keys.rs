//! A peer's identity is its node key: the same Ed25519 key signs node API requests,
//! commitments and receipts, and is the libp2p identity its peer id is made from. So a peer
//! id names a tenet public key and back, with no table in between.

use libp2p::PeerId;
use libp2p::identity::{Keypair, PublicKey as Libp2pKey, ed25519};
use tenet_proto::auth::{KeyPair, PublicKey};

/// The libp2p key pair of a tenet key.
pub fn keypair(key: &KeyPair) -> Keypair {
    // (ed25519_from_bytes wipes the seed it is given.)
    let mut seed = key.secret_seed();
    Keypair::ed25519_from_bytes(&mut seed)
        .expect("an Ed25519 seed is 32 bytes, which is all ed25519_from_bytes asks")
}

/// The peer id of a tenet public key.
pub fn peer_id(key: &PublicKey) -> Option<PeerId> {
    let public = ed25519::PublicKey::try_from_bytes(&key.0).ok()?;
    Some(Libp2pKey::from(public).to_peer_id())
}

/// The tenet public key a peer id names: Ed25519 peer ids carry their key inline (an
/// identity multihash of the protobuf-encoded key). Any other kind of peer id is not a
/// tenet peer.
pub fn public_key(peer: &PeerId) -> Option<PublicKey> {
    let hash = peer.as_ref();
    // 0x00: the identity multihash.
    if hash.code() != 0 {
        return None;
    }
    let key = Libp2pKey::try_decode_protobuf(hash.digest()).ok()?;
    let ed = key.try_into_ed25519().ok()?;
    Some(PublicKey(ed.to_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_id_is_the_node_key_and_back() {
        let key = KeyPair::from_seed([7; 32]);
        let from_pair = keypair(&key).public().to_peer_id();
        assert_eq!(peer_id(&key.public()), Some(from_pair));
        assert_eq!(public_key(&from_pair), Some(key.public()));
        // Another key, another peer.
        let other = KeyPair::from_seed([8; 32]);
        assert_ne!(peer_id(&other.public()), Some(from_pair));
        // A peer id that is a hash of its key (not Ed25519's inline form) names no tenet key.
        assert_eq!(public_key(&PeerId::random()), None);
    }
}
