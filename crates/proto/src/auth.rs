//! Signed requests. Every request to a node carries five headers: the signer's Ed25519 public
//! key, a Unix timestamp, a random nonce, the blake3 hash of the body, and a signature over
//! [`signing_message`] — method, path with query, body hash, timestamp and nonce. Verifying
//! checks the clock window and the signature (strict Ed25519, no malleable encodings); the
//! receiver also remembers nonces for the window so a captured request cannot be replayed.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::{ApiError, ErrorCode, Hash};

pub const KEY_HEADER: &str = "x-tenet-key";
pub const TIMESTAMP_HEADER: &str = "x-tenet-timestamp";
pub const NONCE_HEADER: &str = "x-tenet-nonce";
pub const BODY_HASH_HEADER: &str = "x-tenet-body-hash";
pub const SIGNATURE_HEADER: &str = "x-tenet-signature";

/// The five signature headers, in the order `to_pairs` gives them.
pub const HEADER_NAMES: [&str; 5] = [
    KEY_HEADER,
    TIMESTAMP_HEADER,
    NONCE_HEADER,
    BODY_HASH_HEADER,
    SIGNATURE_HEADER,
];

/// How far a request's timestamp may be from the receiver's clock, either way.
pub const DEFAULT_MAX_SKEW_SECS: u64 = 30;

/// An Ed25519 public key: a node's id, a coordinator's or a client's identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    pub fn to_hex(&self) -> String {
        crate::to_hex(&self.0)
    }

    /// Parse 64 hex characters that encode a valid curve point.
    pub fn parse(s: &str) -> Option<PublicKey> {
        let v = crate::from_hex(s.trim())?;
        let bytes: [u8; 32] = v.try_into().ok()?;
        VerifyingKey::from_bytes(&bytes).ok()?;
        Some(PublicKey(bytes))
    }

    /// Check `signature` over `message` (strict: refuses small-order keys and non-canonical
    /// signatures).
    pub fn verify(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        let Ok(key) = VerifyingKey::from_bytes(&self.0) else {
            return false;
        };
        key.verify_strict(message, &Signature::from_bytes(signature))
            .is_ok()
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", &self.to_hex()[..12])
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PublicKey, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        PublicKey::parse(&s)
            .ok_or_else(|| serde::de::Error::custom("expected a 64-hex-character Ed25519 key"))
    }
}

/// A secret signing key and its public half.
#[derive(Clone)]
pub struct KeyPair {
    secret: SigningKey,
    public: PublicKey,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPair({:?})", self.public)
    }
}

impl KeyPair {
    /// The key pair whose secret is `seed` (32 random bytes, from the caller's randomness).
    pub fn from_seed(seed: [u8; 32]) -> KeyPair {
        let secret = SigningKey::from_bytes(&seed);
        let public = PublicKey(secret.verifying_key().to_bytes());
        KeyPair { secret, public }
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.secret.sign(message).to_bytes()
    }

    /// The key file's text: the secret seed in hex and a newline.
    pub fn to_file_text(&self) -> String {
        format!("{}\n", crate::to_hex(&self.secret.to_bytes()))
    }

    /// Read a key file's text.
    pub fn from_file_text(text: &str) -> Option<KeyPair> {
        let v = crate::from_hex(text.trim())?;
        Some(KeyPair::from_seed(v.try_into().ok()?))
    }

    /// The five headers that sign a request.
    pub fn sign_request(
        &self,
        method: &str,
        path_and_query: &str,
        body_hash: &Hash,
        timestamp: u64,
        nonce: [u8; 16],
    ) -> AuthHeaders {
        let msg = signing_message(method, path_and_query, body_hash, timestamp, &nonce);
        AuthHeaders {
            key: self.public,
            timestamp,
            nonce,
            body_hash: *body_hash,
            signature: self.sign(&msg),
        }
    }
}

/// The bytes a request signature covers.
pub fn signing_message(
    method: &str,
    path_and_query: &str,
    body_hash: &Hash,
    timestamp: u64,
    nonce: &[u8; 16],
) -> Vec<u8> {
    format!(
        "tenet-request-v1\n{method}\n{path_and_query}\n{body_hash}\n{timestamp}\n{}",
        crate::to_hex(nonce)
    )
    .into_bytes()
}

/// A request's signature headers, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthHeaders {
    pub key: PublicKey,
    pub timestamp: u64,
    pub nonce: [u8; 16],
    pub body_hash: Hash,
    pub signature: [u8; 64],
}

fn unauth(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Unauthenticated,
        format!(
            "{what}: every request must be signed with {KEY_HEADER}, {TIMESTAMP_HEADER}, {NONCE_HEADER}, {BODY_HASH_HEADER} and {SIGNATURE_HEADER} (tenet's clients do this for you)"
        ),
    )
}

impl AuthHeaders {
    /// `(name, value)` pairs to set on the request.
    pub fn to_pairs(&self) -> [(&'static str, String); 5] {
        [
            (KEY_HEADER, self.key.to_hex()),
            (TIMESTAMP_HEADER, self.timestamp.to_string()),
            (NONCE_HEADER, crate::to_hex(&self.nonce)),
            (BODY_HASH_HEADER, self.body_hash.to_hex()),
            (SIGNATURE_HEADER, crate::to_hex(&self.signature)),
        ]
    }

    /// Parse from a header lookup.
    pub fn from_headers<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<AuthHeaders, ApiError> {
        let need = |name: &str| get(name).ok_or_else(|| unauth(&format!("missing header {name}")));
        let bad = |name: &str| unauth(&format!("malformed header {name}"));
        let key = PublicKey::parse(need(KEY_HEADER)?).ok_or_else(|| bad(KEY_HEADER))?;
        let timestamp = need(TIMESTAMP_HEADER)?
            .parse()
            .map_err(|_| bad(TIMESTAMP_HEADER))?;
        let nonce = crate::from_hex(need(NONCE_HEADER)?)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| bad(NONCE_HEADER))?;
        let body_hash = Hash::parse(need(BODY_HASH_HEADER)?).map_err(|_| bad(BODY_HASH_HEADER))?;
        let signature = crate::from_hex(need(SIGNATURE_HEADER)?)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| bad(SIGNATURE_HEADER))?;
        Ok(AuthHeaders {
            key,
            timestamp,
            nonce,
            body_hash,
            signature,
        })
    }

    /// Check the clock window and the signature over this request. The caller still checks the
    /// nonce against the ones it has seen, the key against the ones it trusts, and that the
    /// body it receives hashes to `body_hash`.
    pub fn verify(
        &self,
        method: &str,
        path_and_query: &str,
        now: u64,
        max_skew_secs: u64,
    ) -> Result<(), ApiError> {
        if self.timestamp.abs_diff(now) > max_skew_secs {
            return Err(ApiError::new(
                ErrorCode::StaleTimestamp,
                format!(
                    "request timestamp {} is {} s from this node's clock {now} (the window is ±{max_skew_secs} s): check the clocks, and never resend an old request",
                    self.timestamp,
                    self.timestamp.abs_diff(now)
                ),
            ));
        }
        let msg = signing_message(
            method,
            path_and_query,
            &self.body_hash,
            self.timestamp,
            &self.nonce,
        );
        if !self.key.verify(&msg, &self.signature) {
            return Err(ApiError::new(
                ErrorCode::BadSignature,
                format!(
                    "the signature does not verify for key {} over {method} {path_and_query}",
                    self.key
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(n: u8) -> KeyPair {
        KeyPair::from_seed([n; 32])
    }

    #[test]
    fn signed_requests_verify_and_any_change_breaks_them() {
        let k = pair(1);
        let body = Hash::of(b"body");
        let h = k.sign_request("POST", "/v1/jobs", &body, 1000, [7; 16]);
        let pairs = h.to_pairs();
        let parsed = AuthHeaders::from_headers(|n| {
            pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
        })
        .unwrap();
        assert_eq!(parsed, h);
        parsed.verify("POST", "/v1/jobs", 1010, 30).unwrap();
        let code = |r: Result<(), ApiError>| r.unwrap_err().code;
        assert_eq!(
            code(parsed.verify("PUT", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        assert_eq!(
            code(parsed.verify("POST", "/v1/job", 1000, 30)),
            ErrorCode::BadSignature
        );
        assert_eq!(
            code(parsed.verify("POST", "/v1/jobs", 1031, 30)),
            ErrorCode::StaleTimestamp
        );
        let mut other = parsed.clone();
        other.body_hash = Hash::of(b"other");
        assert_eq!(
            code(other.verify("POST", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        let mut forged = parsed.clone();
        forged.key = pair(2).public();
        assert_eq!(
            code(forged.verify("POST", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        let missing = AuthHeaders::from_headers(|_| None).unwrap_err();
        assert_eq!(missing.code, ErrorCode::Unauthenticated);
    }

    #[test]
    fn key_files_round_trip() {
        let k = pair(9);
        let back = KeyPair::from_file_text(&k.to_file_text()).unwrap();
        assert_eq!(back.public(), k.public());
        assert!(KeyPair::from_file_text("nope").is_none());
        assert_eq!(PublicKey::parse(&k.public().to_hex()), Some(k.public()));
    }
}
