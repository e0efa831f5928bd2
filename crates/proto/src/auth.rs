//! Signed requests. Every request to a node carries five headers: the signer's Ed25519 public
//! key, a Unix timestamp, a random nonce, the blake3 hash of the body, and a signature over
//! [`signing_message`] — method, path with query, body hash, timestamp and nonce. Verifying
//! checks the clock window and the signature (strict Ed25519, no malleable encodings); the
//! receiver also remembers nonces for the window so a captured request cannot be replayed.
//!
//! A client that knows the server's key may prove the same statement with a MAC instead of a
//! signature (`x-tenet-mac`): a keyed blake3 hash under the key the two share
//! ([`KeyPair::session_key`]: X25519 between their Ed25519 keys, as libsodium converts them),
//! which only those two can make. It authenticates the request to that server and to no
//! other, at a microsecond a side instead of an Ed25519 signature and check (a coordinator
//! sends a node two requests per job). It proves nothing to a third party: requests are
//! access control, never evidence (what is evidence — commitments, receipts, grants — is
//! signed).

use std::sync::Arc;

use curve25519_dalek::Scalar;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use zeroize::Zeroize;

use crate::nonces::Pool;
use crate::{ApiError, ErrorCode, Hash};

pub const KEY_HEADER: &str = "x-tenet-key";
pub const TIMESTAMP_HEADER: &str = "x-tenet-timestamp";
pub const NONCE_HEADER: &str = "x-tenet-nonce";
pub const BODY_HASH_HEADER: &str = "x-tenet-body-hash";
pub const SIGNATURE_HEADER: &str = "x-tenet-signature";
/// Where a request proven by a MAC carries it, in place of [`SIGNATURE_HEADER`].
pub const MAC_HEADER: &str = "x-tenet-mac";

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
        let key = PublicKey::parse_bytes(s)?;
        key.verifier()?;
        Some(key)
    }

    /// Parse 64 hex characters without checking that they encode a curve point: the check
    /// costs a square root, which [`PublicKey::verifier`] pays once per key.
    fn parse_bytes(s: &str) -> Option<PublicKey> {
        let v = crate::from_hex(s.trim())?;
        Some(PublicKey(v.try_into().ok()?))
    }

    /// The key decompressed for checking signatures, or `None` if the bytes are not a point.
    /// Keep it for a key that signs often: decompressing costs about a tenth of a check.
    pub fn verifier(&self) -> Option<Verifier> {
        Some(Verifier(VerifyingKey::from_bytes(&self.0).ok()?))
    }

    /// Check `signature` over `message` (strict: refuses small-order keys and non-canonical
    /// signatures).
    pub fn verify(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        self.verifier()
            .is_some_and(|v| v.verify(message, signature))
    }
}

/// A public key ready to check signatures (its curve point decompressed once).
#[derive(Clone, Debug)]
pub struct Verifier(VerifyingKey);

impl Verifier {
    /// Check `signature` over `message`, strictly (as [`PublicKey::verify`]).
    pub fn verify(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        self.0
            .verify_strict(message, &Signature::from_bytes(signature))
            .is_ok()
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.to_bytes())
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

/// A secret signing key and its public half. Signing uses a nonce made ahead of time when one
/// is ready ([`KeyPair::refill_nonce`]; see `nonces.rs`), RFC 8032's deterministic one when not:
/// either way an ordinary Ed25519 signature.
#[derive(Clone)]
pub struct KeyPair {
    secret: SigningKey,
    public: PublicKey,
    fast: Arc<FastSigning>,
}

/// What signing with a ready nonce needs: the secret scalar, and the nonces (shared by clones).
struct FastSigning {
    scalar: Scalar,
    nonces: Pool,
}

impl Drop for FastSigning {
    fn drop(&mut self) {
        self.scalar.zeroize();
    }
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
        let fast = Arc::new(FastSigning {
            scalar: secret.to_scalar(),
            nonces: Pool::default(),
        });
        KeyPair {
            secret,
            public,
            fast,
        }
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// An Ed25519 signature over `message`: about 1 µs with a ready nonce, 16 µs without.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        let fast = &self.fast;
        fast.nonces
            .sign(&fast.scalar, &self.public.0, message)
            .unwrap_or_else(|| self.secret.sign(message).to_bytes())
    }

    /// Make one signing nonce ahead of time (about 15 µs) if fewer than a few are ready;
    /// whether one was made. `random` must be fresh bytes from the operating system's random
    /// source. Call it when there is nothing better to do.
    pub fn refill_nonce(&self, random: [u8; 32]) -> bool {
        self.fast.nonces.refill_one(self.secret.as_bytes(), &random)
    }

    /// Nonces ready for signing now.
    pub fn nonces_ready(&self) -> usize {
        self.fast.nonces.len()
    }

    /// The secret seed: for deriving the same identity elsewhere (a peer's libp2p key is its
    /// node key). Keep it as secret as the key file.
    pub fn secret_seed(&self) -> [u8; 32] {
        self.secret.to_bytes()
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

    /// The key this key pair shares with `peer` for MACs over requests between the two (either
    /// side computes the same one); `None` for a peer key that is no usable curve point.
    pub fn session_key(&self, peer: &PublicKey) -> Option<SessionKey> {
        let peer_key = VerifyingKey::from_bytes(&peer.0).ok()?;
        if peer_key.is_weak() {
            return None;
        }
        // X25519 with the clamped secret scalar (a multiple of the cofactor: a peer key with a
        // small-order part cannot learn anything of ours through it).
        let shared = peer_key
            .to_montgomery()
            .mul_clamped(self.secret.to_scalar_bytes());
        if shared.0 == [0; 32] {
            return None;
        }
        let (low, high) = if self.public <= *peer {
            (self.public, *peer)
        } else {
            (*peer, self.public)
        };
        let mut h = blake3::Hasher::new_derive_key("tenet request MAC v1");
        h.update(&shared.0);
        h.update(&low.0);
        h.update(&high.0);
        Some(SessionKey {
            key: *h.finalize().as_bytes(),
            mine: self.public,
            peer: *peer,
        })
    }

    /// The five headers that prove a request with a MAC under `session` (made by this key pair
    /// for the server it is sent to).
    pub fn mac_request(
        &self,
        session: &SessionKey,
        method: &str,
        path_and_query: &str,
        body_hash: &Hash,
        timestamp: u64,
        nonce: [u8; 16],
    ) -> AuthHeaders {
        debug_assert_eq!(session.mine, self.public);
        let msg = signing_message(method, path_and_query, body_hash, timestamp, &nonce);
        AuthHeaders {
            key: self.public,
            timestamp,
            nonce,
            body_hash: *body_hash,
            proof: Proof::Mac(session.mac(&msg)),
        }
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
            proof: Proof::Signature(self.sign(&msg)),
        }
    }
}

/// A key two parties share for MACs over requests between them ([`KeyPair::session_key`]).
#[derive(Clone)]
pub struct SessionKey {
    key: [u8; 32],
    mine: PublicKey,
    peer: PublicKey,
}

impl SessionKey {
    /// The other party.
    pub fn peer(&self) -> PublicKey {
        self.peer
    }

    fn mac(&self, message: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.key, message).as_bytes()
    }
}

impl Drop for SessionKey {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKey({:?} with {:?})", self.mine, self.peer)
    }
}

/// What proves a request: a signature anyone can check, or a MAC only its server can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    Signature([u8; 64]),
    Mac([u8; 32]),
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
    pub proof: Proof,
}

fn unauth(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Unauthenticated,
        format!(
            "{what}: every request must be signed with {KEY_HEADER}, {TIMESTAMP_HEADER}, {NONCE_HEADER}, {BODY_HASH_HEADER} and {SIGNATURE_HEADER} (or {MAC_HEADER}) (tenet's clients do this for you)"
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
            match &self.proof {
                Proof::Signature(s) => (SIGNATURE_HEADER, crate::to_hex(s)),
                Proof::Mac(m) => (MAC_HEADER, crate::to_hex(m)),
            },
        ]
    }

    /// Parse from a header lookup.
    pub fn from_headers<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<AuthHeaders, ApiError> {
        let need = |name: &str| get(name).ok_or_else(|| unauth(&format!("missing header {name}")));
        let bad = |name: &str| unauth(&format!("malformed header {name}"));
        // Whether the key is a curve point is checked when the signature is (by a verifier
        // kept for a trusted key, or decompressed then).
        let key = PublicKey::parse_bytes(need(KEY_HEADER)?).ok_or_else(|| bad(KEY_HEADER))?;
        let timestamp = need(TIMESTAMP_HEADER)?
            .parse()
            .map_err(|_| bad(TIMESTAMP_HEADER))?;
        let nonce = crate::from_hex(need(NONCE_HEADER)?)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| bad(NONCE_HEADER))?;
        let body_hash = Hash::parse(need(BODY_HASH_HEADER)?).map_err(|_| bad(BODY_HASH_HEADER))?;
        let proof = match (get(SIGNATURE_HEADER), get(MAC_HEADER)) {
            (Some(sig), None) => Proof::Signature(
                crate::from_hex(sig)
                    .and_then(|v| v.try_into().ok())
                    .ok_or_else(|| bad(SIGNATURE_HEADER))?,
            ),
            (None, Some(mac)) => Proof::Mac(
                crate::from_hex(mac)
                    .and_then(|v| v.try_into().ok())
                    .ok_or_else(|| bad(MAC_HEADER))?,
            ),
            (Some(_), Some(_)) => {
                return Err(unauth(&format!(
                    "both {SIGNATURE_HEADER} and {MAC_HEADER} given"
                )));
            }
            (None, None) => return Err(unauth(&format!("missing header {SIGNATURE_HEADER}"))),
        };
        Ok(AuthHeaders {
            key,
            timestamp,
            nonce,
            body_hash,
            proof,
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
        self.verify_by(None, method, path_and_query, now, max_skew_secs)
    }

    /// [`AuthHeaders::verify`] with the signer's key already decompressed (`None`: decompress
    /// it now). `verifier` must be for `self.key`. A request proven by a MAC is refused here:
    /// only its server can check it ([`AuthHeaders::verify_mac`]).
    pub fn verify_by(
        &self,
        verifier: Option<&Verifier>,
        method: &str,
        path_and_query: &str,
        now: u64,
        max_skew_secs: u64,
    ) -> Result<(), ApiError> {
        self.check_clock(now, max_skew_secs)?;
        let Proof::Signature(signature) = &self.proof else {
            return Err(unauth(&format!(
                "{MAC_HEADER} is taken only by a server that knows its own key; sign the request with {SIGNATURE_HEADER}"
            )));
        };
        let msg = self.statement(method, path_and_query);
        let fresh;
        let verifier = match verifier {
            Some(v) => v,
            None => {
                fresh = self.key.verifier().ok_or_else(|| {
                    unauth(&format!(
                        "malformed header {KEY_HEADER}: not an Ed25519 public key"
                    ))
                })?;
                &fresh
            }
        };
        debug_assert_eq!(verifier.public(), self.key);
        if !verifier.verify(&msg, signature) {
            return Err(self.forged(method, path_and_query));
        }
        Ok(())
    }

    /// Check the clock window and the MAC over this request, under `session`: the key this
    /// server shares with `self.key` ([`KeyPair::session_key`]). A signed request is checked
    /// as [`AuthHeaders::verify_by`] does.
    pub fn verify_mac(
        &self,
        session: &SessionKey,
        method: &str,
        path_and_query: &str,
        now: u64,
        max_skew_secs: u64,
    ) -> Result<(), ApiError> {
        let Proof::Mac(mac) = &self.proof else {
            return self.verify_by(None, method, path_and_query, now, max_skew_secs);
        };
        self.check_clock(now, max_skew_secs)?;
        let msg = self.statement(method, path_and_query);
        // Constant time: a MAC compared byte by byte would leak how much of a guess was right.
        let expected = blake3::Hash::from(session.mac(&msg));
        if session.peer != self.key || expected != blake3::Hash::from(*mac) {
            return Err(self.forged(method, path_and_query));
        }
        Ok(())
    }

    /// What this request's signature or MAC covers ([`signing_message`]).
    fn statement(&self, method: &str, path_and_query: &str) -> Vec<u8> {
        signing_message(
            method,
            path_and_query,
            &self.body_hash,
            self.timestamp,
            &self.nonce,
        )
    }

    fn check_clock(&self, now: u64, max_skew_secs: u64) -> Result<(), ApiError> {
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
        Ok(())
    }

    fn forged(&self, method: &str, path_and_query: &str) -> ApiError {
        let what = match self.proof {
            Proof::Signature(_) => "signature",
            Proof::Mac(_) => "MAC",
        };
        ApiError::new(
            ErrorCode::BadSignature,
            format!(
                "the {what} does not verify for key {} over {method} {path_and_query}",
                self.key
            ),
        )
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
        // A kept verifier gives the same answers as decompressing the key each time.
        let v = k.public().verifier().unwrap();
        parsed
            .verify_by(Some(&v), "POST", "/v1/jobs", 1010, 30)
            .unwrap();
        assert_eq!(
            code(parsed.verify_by(Some(&v), "POST", "/v1/job", 1000, 30)),
            ErrorCode::BadSignature
        );
    }

    #[test]
    fn a_key_header_that_is_no_curve_point_is_refused_as_malformed() {
        // y = 2 has no x on the curve: 32 bytes of hex, but not a public key.
        let mut bytes = [0u8; 32];
        bytes[0] = 2;
        assert!(PublicKey(bytes).verifier().is_none());
        assert_eq!(PublicKey::parse(&crate::to_hex(&bytes)), None);
        let mut h = pair(1).sign_request("GET", "/v1/jobs/x", &Hash::of(b""), 1000, [1; 16]);
        h.key = PublicKey(bytes);
        let e = h.verify("GET", "/v1/jobs/x", 1000, 30).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated);
        assert!(
            e.message.contains("malformed header x-tenet-key"),
            "{}",
            e.message
        );
    }

    #[test]
    fn signatures_with_ready_nonces_verify_strictly_and_each_nonce_signs_once() {
        let k = pair(3);
        let msg = b"tenet-request-v1\nPOST\n/v1/jobs";
        // No nonce ready: RFC 8032's deterministic signature.
        let deterministic = k.sign(msg);
        assert_eq!(deterministic, k.secret.sign(msg).to_bytes());
        assert!(k.public().verify(msg, &deterministic));
        for i in 0..crate::nonces::POOL_TARGET {
            assert!(k.refill_nonce([i as u8; 32]), "room for nonce {i}");
        }
        assert!(!k.refill_nonce([9; 32]), "the pool stops at its target");
        let clone = k.clone();
        let mut seen = std::collections::HashSet::new();
        for n in 0..crate::nonces::POOL_TARGET {
            // Clones share the pool: every signature takes a different nonce.
            let signer = if n % 2 == 0 { &k } else { &clone };
            let sig = signer.sign(msg);
            assert!(k.public().verify(msg, &sig), "signature {n} verifies");
            assert_ne!(sig, deterministic);
            assert!(
                seen.insert(sig[..32].to_vec()),
                "R of signature {n} is fresh"
            );
            // Any other message or key fails, as for any signature.
            assert!(!k.public().verify(b"other", &sig));
            assert!(!pair(4).public().verify(msg, &sig));
        }
        assert_eq!(k.nonces_ready(), 0);
        assert_eq!(k.sign(msg), deterministic, "drained: deterministic again");
        // The same random bytes twice still give two different nonces (the counter differs).
        k.refill_nonce([7; 32]);
        k.refill_nonce([7; 32]);
        let (a, b) = (k.sign(msg), k.sign(msg));
        assert_ne!(a[..32], b[..32]);
        assert!(k.public().verify(msg, &a) && k.public().verify(msg, &b));
    }

    #[test]
    fn mac_requests_verify_only_at_their_server_and_any_change_breaks_them() {
        let (client, server, other) = (pair(1), pair(2), pair(3));
        let to_server = client.session_key(&server.public()).unwrap();
        let at_server = server.session_key(&client.public()).unwrap();
        assert_eq!(to_server.key, at_server.key, "both sides derive one key");
        assert_ne!(
            to_server.key,
            client.session_key(&other.public()).unwrap().key,
            "another server, another key"
        );
        let body = Hash::of(b"body");
        let h = client.mac_request(&to_server, "POST", "/v1/jobs", &body, 1000, [7; 16]);
        let pairs = h.to_pairs();
        assert_eq!(pairs[4].0, MAC_HEADER);
        let parsed = AuthHeaders::from_headers(|n| {
            pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
        })
        .unwrap();
        assert_eq!(parsed, h);
        parsed
            .verify_mac(&at_server, "POST", "/v1/jobs", 1010, 30)
            .unwrap();
        let code = |r: Result<(), ApiError>| r.unwrap_err().code;
        for (method, path) in [("PUT", "/v1/jobs"), ("POST", "/v1/job")] {
            assert_eq!(
                code(parsed.verify_mac(&at_server, method, path, 1000, 30)),
                ErrorCode::BadSignature
            );
        }
        assert_eq!(
            code(parsed.verify_mac(&at_server, "POST", "/v1/jobs", 1031, 30)),
            ErrorCode::StaleTimestamp
        );
        let mut changed = parsed.clone();
        changed.body_hash = Hash::of(b"other");
        assert_eq!(
            code(changed.verify_mac(&at_server, "POST", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        // Another server (its key with the client) cannot be fooled into it, nor can a third
        // party that claims the client's key with its own session.
        let at_other = other.session_key(&client.public()).unwrap();
        assert_eq!(
            code(parsed.verify_mac(&at_other, "POST", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        let impostor = other.session_key(&server.public()).unwrap();
        let mut claimed = other.mac_request(&impostor, "POST", "/v1/jobs", &body, 1000, [8; 16]);
        claimed.key = client.public();
        assert_eq!(
            code(claimed.verify_mac(&at_server, "POST", "/v1/jobs", 1000, 30)),
            ErrorCode::BadSignature
        );
        // A MAC means nothing to anyone who checks signatures.
        assert_eq!(
            code(parsed.verify("POST", "/v1/jobs", 1000, 30)),
            ErrorCode::Unauthenticated
        );
        // A signed request is still checked as a signature on the MAC path.
        let signed = client.sign_request("POST", "/v1/jobs", &body, 1000, [9; 16]);
        signed
            .verify_mac(&at_server, "POST", "/v1/jobs", 1000, 30)
            .unwrap();
        // Both proofs at once, or a MAC that is not 32 bytes, are refused as malformed.
        let mut both: Vec<(&str, String)> = signed.to_pairs().to_vec();
        both.push((MAC_HEADER, crate::to_hex(&[0; 32])));
        let lookup = |pairs: &[(&'static str, String)]| {
            AuthHeaders::from_headers(|n| {
                pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str())
            })
        };
        let e = lookup(&both).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated);
        let mut short: Vec<(&str, String)> = pairs.to_vec();
        short[4].1.truncate(62);
        let e = lookup(&short).unwrap_err();
        assert!(
            e.message.contains("malformed header x-tenet-mac"),
            "{}",
            e.message
        );
    }

    #[test]
    fn no_session_key_with_a_small_order_key() {
        // The identity point (y = 1): small order, so no shared secret with anyone.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(pair(1).session_key(&PublicKey(identity)).is_none());
        let mut bytes = [0u8; 32];
        bytes[0] = 2; // no point at all
        assert!(pair(1).session_key(&PublicKey(bytes)).is_none());
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
