//! What a peer says of itself on the DHT, and the keys records live under. A peer's advert —
//! the tasks it hosts (graph and weights), its device, memory and price, the addresses it
//! listens on — is a record under `/tenet/peer/PEER_ID`, signed by that peer's key; a
//! hosted task is a provider record under `/tenet/task/TASK` naming the peers that host it.
//! Kademlia records carry no authentication of their own, so every record a peer is asked
//! to store is checked here first ([`check_record`]): a record under a key this network does
//! not use, too large, unsigned, signed by a key other than the one its key names, or issued
//! in the future is refused and counted.

use libp2p::PeerId;
use libp2p::kad::{Record, RecordKey};
use tenet_proto::Hash;
use tenet_proto::auth::{KeyPair, PublicKey};
use tenet_proto::commit::Sig;

/// The most a record's value may be.
pub const MAX_RECORD_BYTES: usize = 16 << 10;

/// Tasks one advert may list.
pub const MAX_TASKS: usize = 64;

/// Addresses one advert may list.
pub const MAX_ADDRS: usize = 8;

/// How far in the future an advert's issue time may be (clocks differ).
pub const MAX_SKEW_SECS: u64 = 300;

/// The key of `peer`'s advert.
pub fn peer_key(peer: &PeerId) -> RecordKey {
    RecordKey::new(&format!("/tenet/peer/{peer}"))
}

/// The key whose providers host `task`.
pub fn task_key(task: &Hash) -> RecordKey {
    RecordKey::new(&format!("/tenet/task/{task}"))
}

/// A task a peer hosts: the graph's id and the weights file it runs with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hosted {
    pub task: Hash,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Hash>,
    /// What the operator calls it (at most 64 characters).
    pub name: String,
}

/// A peer's signed description of itself.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Advert {
    /// The peer's key (its peer id is made from it).
    pub key: PublicKey,
    pub addrs: Vec<String>,
    pub tasks: Vec<Hosted>,
    /// The device jobs run on, as `tenet devices` names it.
    pub device: String,
    pub memory_bytes: u64,
    /// What it asks per GFLOP.
    pub price_per_gflop: f64,
    /// Unix seconds.
    pub issued_at: u64,
    pub signature: Sig,
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the record's key is not one this network uses")]
    Key,
    #[error("the record is {0} bytes; at most {MAX_RECORD_BYTES}")]
    TooLarge(usize),
    #[error("the record does not parse as an advert: {0}")]
    Parse(String),
    #[error("the record lists too many entries, or overlong ones")]
    Bounds,
    #[error("the record's signature does not verify")]
    Signature,
    #[error("the record is signed by a key other than the one its key names")]
    WrongSigner,
    #[error("the advert is dated {0} s in the future")]
    Future(u64),
    #[error("score records are refused: this peer was started without a network spec")]
    NoNetwork,
    #[error("the score record is signed by a key that is not one of the network's validators")]
    NotValidator,
    #[error("the score record is outside its phase window")]
    Window,
    #[error("the score record's epoch is over two epochs old: it has expired")]
    Expired,
}

impl Advert {
    /// The bytes the peer signs: every field but the signature, as JSON in field order.
    fn statement(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "key": self.key, "addrs": self.addrs, "tasks": self.tasks, "device": self.device,
            "memory_bytes": self.memory_bytes, "price_per_gflop": self.price_per_gflop,
            "issued_at": self.issued_at,
        });
        let mut out = b"tenet-advert-v1\n".to_vec();
        out.extend_from_slice(body.to_string().as_bytes());
        out
    }

    /// A signed advert.
    pub fn sign(
        key: &KeyPair,
        addrs: Vec<String>,
        tasks: Vec<Hosted>,
        device: String,
        memory_bytes: u64,
        price_per_gflop: f64,
        issued_at: u64,
    ) -> Advert {
        let mut advert = Advert {
            key: key.public(),
            addrs,
            tasks,
            device,
            memory_bytes,
            price_per_gflop,
            issued_at,
            signature: Sig([0; 64]),
        };
        advert.signature = Sig(key.sign(&advert.statement()));
        advert
    }

    pub fn verify(&self) -> bool {
        self.key.verify(&self.statement(), &self.signature.0)
    }

    /// The DHT record of this advert.
    pub fn record(&self) -> Option<Record> {
        let peer = crate::keys::peer_id(&self.key)?;
        let mut record = Record::new(peer_key(&peer), serde_json::to_vec(self).ok()?);
        record.publisher = Some(peer);
        Some(record)
    }
}

/// A record from raw key and value bytes, as a peer offers it (for the fuzz target).
pub fn record_from_parts(key: &[u8], value: &[u8]) -> Record {
    Record::new(RecordKey::new(&key), value.to_vec())
}

/// Check a record a peer asks this one to store (or that a query returned): an advert under
/// its signer's key, within the bounds, not dated ahead of `now`. Provider records are
/// checked by [`check_provider`].
pub fn check_record(record: &Record, now: u64) -> Result<Advert, RecordError> {
    let key = std::str::from_utf8(record.key.as_ref()).map_err(|_| RecordError::Key)?;
    let peer: PeerId = key
        .strip_prefix("/tenet/peer/")
        .and_then(|p| p.parse().ok())
        .ok_or(RecordError::Key)?;
    if record.value.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge(record.value.len()));
    }
    let advert: Advert =
        serde_json::from_slice(&record.value).map_err(|e| RecordError::Parse(e.to_string()))?;
    if advert.tasks.len() > MAX_TASKS
        || advert.addrs.len() > MAX_ADDRS
        || advert.tasks.iter().any(|t| t.name.len() > 64)
        || advert.addrs.iter().any(|a| a.len() > 256)
        || advert.device.len() > 96
    {
        return Err(RecordError::Bounds);
    }
    if crate::keys::peer_id(&advert.key) != Some(peer) {
        return Err(RecordError::WrongSigner);
    }
    if !advert.verify() {
        return Err(RecordError::Signature);
    }
    if advert.issued_at > now + MAX_SKEW_SECS {
        return Err(RecordError::Future(advert.issued_at - now));
    }
    Ok(advert)
}

/// Check a provider record a peer asks this one to keep: it must be under a task key.
/// (Kademlia itself accepts a provider record only from the peer it names: a peer may say
/// only that it hosts a task itself.)
pub fn check_provider(key: &RecordKey) -> Result<Hash, RecordError> {
    let text = std::str::from_utf8(key.as_ref()).map_err(|_| RecordError::Key)?;
    text.strip_prefix("/tenet/task/")
        .and_then(|h| Hash::parse(h).ok())
        .ok_or(RecordError::Key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(key: &KeyPair, at: u64) -> Advert {
        Advert::sign(
            key,
            vec!["/ip4/127.0.0.1/tcp/4001".into()],
            vec![Hosted {
                task: Hash::of(b"g"),
                weights: None,
                name: "mm".into(),
            }],
            "cpu".into(),
            1 << 30,
            0.5,
            at,
        )
    }

    #[test]
    fn only_a_peer_signing_its_own_advert_is_stored() {
        let key = KeyPair::from_seed([1; 32]);
        let now = 1_000_000;
        let good = advert(&key, now).record().unwrap();
        assert_eq!(check_record(&good, now).unwrap().key, key.public());

        // Unsigned (a zero signature), or altered after signing.
        let mut unsigned = advert(&key, now);
        unsigned.signature = Sig([0; 64]);
        let mut r = good.clone();
        r.value = serde_json::to_vec(&unsigned).unwrap();
        assert_eq!(check_record(&r, now), Err(RecordError::Signature));
        let mut altered = advert(&key, now);
        altered.price_per_gflop = 0.0;
        r.value = serde_json::to_vec(&altered).unwrap();
        assert_eq!(check_record(&r, now), Err(RecordError::Signature));

        // Signed by someone else, under this peer's key.
        let other = KeyPair::from_seed([2; 32]);
        let mut r = good.clone();
        r.value = serde_json::to_vec(&advert(&other, now)).unwrap();
        assert_eq!(check_record(&r, now), Err(RecordError::WrongSigner));

        // Relayed by another peer: the signature, not the publisher, makes it the peer's.
        let mut r = good.clone();
        r.publisher = crate::keys::peer_id(&other.public());
        assert!(check_record(&r, now).is_ok());

        // Too large, a foreign key, dated ahead.
        let mut r = good.clone();
        r.value = vec![b' '; MAX_RECORD_BYTES + 1];
        assert_eq!(
            check_record(&r, now),
            Err(RecordError::TooLarge(MAX_RECORD_BYTES + 1))
        );
        let mut r = good.clone();
        r.key = RecordKey::new(&"/other/thing");
        assert_eq!(check_record(&r, now), Err(RecordError::Key));
        let ahead = advert(&key, now + 3600).record().unwrap();
        assert_eq!(check_record(&ahead, now), Err(RecordError::Future(3600)));
        // Garbage.
        let mut r = good.clone();
        r.value = b"\xff\x00not json".to_vec();
        assert!(matches!(check_record(&r, now), Err(RecordError::Parse(_))));
    }

    #[test]
    fn providers_only_under_task_keys() {
        let task = Hash::of(b"g");
        assert_eq!(check_provider(&task_key(&task)), Ok(task));
        assert_eq!(
            check_provider(&RecordKey::new(&"/x")),
            Err(RecordError::Key)
        );
        assert_eq!(
            check_provider(&RecordKey::new(&"/tenet/task/zz")),
            Err(RecordError::Key)
        );
    }
}
