//! Who may ask: every request but `info` and `metrics` must be signed by a key the node trusts
//! (or by any key in open mode), within the clock window, with a nonce never seen in that
//! window. The checks run before the body is read, cheapest first: parse, trust, clock,
//! signature, and only then is the nonce remembered — so only trusted parties can fill the
//! nonce table, and a forged request cannot burn a real client's nonce.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tenet_proto::auth::{AuthHeaders, PublicKey, Verifier};
use tenet_proto::{ApiError, ErrorCode};

/// Nonces remembered at most; beyond it (a trusted client sending faster than this per clock
/// window) requests are refused as busy rather than letting the table grow without bound.
const MAX_NONCES: usize = 4_000_000;

#[derive(Default)]
struct Nonces {
    seen: HashMap<(PublicKey, [u8; 16]), u64>,
    by_expiry: VecDeque<(u64, PublicKey, [u8; 16])>,
}

/// The node's door.
pub struct Gate {
    /// Each trusted key, decompressed once: that saves two square roots per request.
    trusted: HashMap<PublicKey, Verifier>,
    open: bool,
    max_skew_secs: u64,
    nonces: Mutex<Nonces>,
}

impl Gate {
    pub fn new(trusted: Vec<PublicKey>, open: bool, max_skew_secs: u64) -> Gate {
        Gate {
            // A trusted key that is no curve point could never sign anything: drop it.
            trusted: trusted
                .into_iter()
                .filter_map(|k| Some((k, k.verifier()?)))
                .collect(),
            open,
            max_skew_secs,
            nonces: Mutex::new(Nonces::default()),
        }
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether `key` is one the node trusts (in open mode, any).
    pub fn trusts(&self, key: &PublicKey) -> bool {
        self.open || self.trusted.contains_key(key)
    }

    /// Check a request's signature headers (`get` looks one up by name) over `method` and
    /// `path_and_query`. The caller still checks the body against `body_hash`.
    pub fn admit<'a>(
        &self,
        get: impl Fn(&str) -> Option<&'a str>,
        method: &str,
        path_and_query: &str,
        now: u64,
    ) -> Result<AuthHeaders, ApiError> {
        self.admit_also(get, method, path_and_query, now, None)
    }

    /// [`Gate::admit`], accepting `also` for this one request as if it were trusted (a
    /// coordinator lets a registered node speak for itself).
    pub fn admit_also<'a>(
        &self,
        get: impl Fn(&str) -> Option<&'a str>,
        method: &str,
        path_and_query: &str,
        now: u64,
        also: Option<&PublicKey>,
    ) -> Result<AuthHeaders, ApiError> {
        let auth = AuthHeaders::from_headers(get)?;
        let verifier = self.trusted.get(&auth.key);
        if !self.open && verifier.is_none() && also != Some(&auth.key) {
            return Err(ApiError::new(
                ErrorCode::UntrustedKey,
                format!(
                    "key {} is not trusted by this node; the operator adds coordinators with --trust",
                    auth.key
                ),
            ));
        }
        auth.verify_by(verifier, method, path_and_query, now, self.max_skew_secs)?;
        let mut n = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&(expiry, key, nonce)) = n.by_expiry.front() {
            if expiry >= now {
                break;
            }
            n.by_expiry.pop_front();
            n.seen.remove(&(key, nonce));
        }
        if n.seen.contains_key(&(auth.key, auth.nonce)) {
            return Err(ApiError::new(
                ErrorCode::ReplayedNonce,
                "this nonce was already used: a replayed request is refused; sign every request afresh",
            ));
        }
        if n.seen.len() >= MAX_NONCES {
            return Err(ApiError::new(
                ErrorCode::Busy,
                "too many requests in the clock window; slow down",
            ));
        }
        // A nonce must be remembered for as long as its timestamp would be accepted.
        let expiry = auth.timestamp + self.max_skew_secs;
        n.seen.insert((auth.key, auth.nonce), expiry);
        let at = n.by_expiry.partition_point(|(e, _, _)| *e <= expiry);
        n.by_expiry.insert(at, (expiry, auth.key, auth.nonce));
        Ok(auth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenet_proto::Hash;
    use tenet_proto::auth::KeyPair;

    fn admit(gate: &Gate, h: &AuthHeaders, path: &str, now: u64) -> Result<(), ApiError> {
        let pairs = h.to_pairs();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.as_str())
        };
        gate.admit(get, "GET", path, now).map(|_| ())
    }

    #[test]
    fn trusted_fresh_unique_requests_pass_and_others_do_not() {
        let client = KeyPair::from_seed([1; 32]);
        let stranger = KeyPair::from_seed([2; 32]);
        let gate = Gate::new(vec![client.public()], false, 30);
        let body = Hash::of(b"");
        let h = client.sign_request("GET", "/v1/jobs/a", &body, 1000, [1; 16]);
        admit(&gate, &h, "/v1/jobs/a", 1000).unwrap();
        let again = admit(&gate, &h, "/v1/jobs/a", 1001).unwrap_err();
        assert_eq!(again.code, ErrorCode::ReplayedNonce);
        let h2 = client.sign_request("GET", "/v1/jobs/a", &body, 900, [2; 16]);
        let stale = admit(&gate, &h2, "/v1/jobs/a", 1000).unwrap_err();
        assert_eq!(stale.code, ErrorCode::StaleTimestamp);
        let s = stranger.sign_request("GET", "/v1/jobs/a", &body, 1000, [3; 16]);
        let e = admit(&gate, &s, "/v1/jobs/a", 1000).unwrap_err();
        assert_eq!(e.code, ErrorCode::UntrustedKey);
        let open = Gate::new(vec![], true, 30);
        admit(&open, &s, "/v1/jobs/a", 1000).unwrap();
        // Nonces are forgotten once their timestamps could no longer be accepted.
        let h3 = client.sign_request("GET", "/v1/x", &body, 1000, [9; 16]);
        admit(&gate, &h3, "/v1/x", 1000).unwrap();
        let later = client.sign_request("GET", "/v1/x", &body, 1040, [8; 16]);
        admit(&gate, &later, "/v1/x", 1040).unwrap();
        assert_eq!(gate.nonces.lock().unwrap().seen.len(), 1);
    }
}
