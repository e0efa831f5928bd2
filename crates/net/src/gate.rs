//! Who may ask: every request but `info` and `metrics` must be signed by a key the node trusts
//! (or by any key in open mode), within the clock window, with a nonce never seen in that
//! window. The checks run before the body is read, cheapest first: parse, trust, clock,
//! signature, and only then is the nonce remembered — so only trusted parties can fill the
//! nonce table, and a forged request cannot burn a real client's nonce. A request proven by a
//! MAC instead of a signature is checked under the key this server shares with its sender
//! (derived once per sender and kept), so a gate that takes MACs knows its own key.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tenet_proto::auth::{AuthHeaders, KeyPair, Proof, PublicKey, SessionKey, Verifier};
use tenet_proto::{ApiError, ErrorCode};

/// Nonces remembered at most; beyond it (a trusted client sending faster than this per clock
/// window) requests are refused as busy rather than letting the table grow without bound.
const MAX_NONCES: usize = 4_000_000;

/// Session keys kept at most (one per sender that proves with a MAC): past it the table starts
/// afresh, and each sender's next request derives its key again.
const MAX_SESSIONS: usize = 4096;

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
    /// This server's key, for the keys it shares with senders that prove with a MAC.
    own: Option<KeyPair>,
    sessions: Mutex<HashMap<PublicKey, SessionKey>>,
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
            own: None,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Take requests proven by a MAC under the key `own` shares with their sender, as well as
    /// signed ones.
    pub fn with_key(mut self, own: KeyPair) -> Gate {
        self.own = Some(own);
        self
    }

    /// The key this server shares with `sender`, derived on its first MAC and kept.
    fn session(&self, sender: &PublicKey) -> Result<SessionKey, ApiError> {
        let Some(own) = &self.own else {
            return Err(ApiError::new(
                ErrorCode::Unauthenticated,
                "this server takes signed requests only: send x-tenet-signature, not x-tenet-mac",
            ));
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sessions.get(sender) {
            return Ok(s.clone());
        }
        let s = own.session_key(sender).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthenticated,
                format!("key {sender} shares no key with this server: sign the request instead"),
            )
        })?;
        if sessions.len() >= MAX_SESSIONS {
            sessions.clear();
        }
        sessions.insert(*sender, s.clone());
        Ok(s)
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
        match auth.proof {
            Proof::Signature(_) => {
                auth.verify_by(verifier, method, path_and_query, now, self.max_skew_secs)?
            }
            Proof::Mac(_) => auth.verify_mac(
                &self.session(&auth.key)?,
                method,
                path_and_query,
                now,
                self.max_skew_secs,
            )?,
        }
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

    #[test]
    fn mac_requests_pass_at_their_server_only_once_and_only_from_trusted_keys() {
        let client = KeyPair::from_seed([1; 32]);
        let server = KeyPair::from_seed([5; 32]);
        let elsewhere = KeyPair::from_seed([6; 32]);
        let gate = Gate::new(vec![client.public()], false, 30).with_key(server.clone());
        let body = Hash::of(b"");
        let session = client.session_key(&server.public()).unwrap();
        let h = client.mac_request(&session, "GET", "/v1/jobs/a", &body, 1000, [1; 16]);
        admit(&gate, &h, "/v1/jobs/a", 1000).unwrap();
        let again = admit(&gate, &h, "/v1/jobs/a", 1001).unwrap_err();
        assert_eq!(again.code, ErrorCode::ReplayedNonce);
        // Made for another server: refused here.
        let wrong = client.session_key(&elsewhere.public()).unwrap();
        let h = client.mac_request(&wrong, "GET", "/v1/jobs/a", &body, 1000, [2; 16]);
        let e = admit(&gate, &h, "/v1/jobs/a", 1000).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadSignature);
        // An untrusted key is refused before any key is derived for it.
        let stranger = KeyPair::from_seed([2; 32]);
        let theirs = stranger.session_key(&server.public()).unwrap();
        let h = stranger.mac_request(&theirs, "GET", "/v1/jobs/a", &body, 1000, [3; 16]);
        let e = admit(&gate, &h, "/v1/jobs/a", 1000).unwrap_err();
        assert_eq!(e.code, ErrorCode::UntrustedKey);
        assert_eq!(gate.sessions.lock().unwrap().len(), 1);
        // A gate that does not know its own key takes signatures only, and says so.
        let keyless = Gate::new(vec![client.public()], false, 30);
        let h = client.mac_request(&session, "GET", "/v1/jobs/a", &body, 1000, [4; 16]);
        let e = admit(&keyless, &h, "/v1/jobs/a", 1000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated);
        assert!(e.message.contains("x-tenet-signature"), "{}", e.message);
    }
}
