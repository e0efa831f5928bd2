//! Content addresses: every blob, graph, weights file and tensor is named by the blake3 hash of
//! its bytes, written as 64 lowercase hex characters on the wire.

use std::fmt;

/// A blake3 hash naming some bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

/// A string that is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a hash: expected 64 hex characters")]
pub struct HashParseError(pub String);

impl Hash {
    /// The blake3 hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Hash {
        Hash(*blake3::hash(bytes).as_bytes())
    }

    /// Full 64-character lowercase hex.
    pub fn to_hex(&self) -> String {
        crate::to_hex(&self.0)
    }

    /// The first 12 hex characters, for people.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }

    /// Parse exactly 64 hex characters.
    pub fn parse(s: &str) -> Result<Hash, HashParseError> {
        let err = || HashParseError(s.chars().take(80).collect());
        if s.len() != 64 {
            return Err(err());
        }
        let v = crate::from_hex(s).ok_or_else(err)?;
        let mut out = [0u8; 32];
        out.copy_from_slice(&v);
        Ok(Hash(out))
    }
}

impl From<blake3::Hash> for Hash {
    fn from(h: blake3::Hash) -> Hash {
        Hash(*h.as_bytes())
    }
}

impl From<tenet_ir::GraphId> for Hash {
    fn from(id: tenet_ir::GraphId) -> Hash {
        Hash(id.0)
    }
}

impl From<tenet_ir::WeightsId> for Hash {
    fn from(id: tenet_ir::WeightsId) -> Hash {
        Hash(id.0)
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.short())
    }
}

impl std::str::FromStr for Hash {
    type Err = HashParseError;
    fn from_str(s: &str) -> Result<Hash, HashParseError> {
        Hash::parse(s)
    }
}

impl serde::Serialize for Hash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Hash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Hash::parse(&s).map_err(serde::de::Error::custom)
    }
}
