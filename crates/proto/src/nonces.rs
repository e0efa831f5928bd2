//! Ed25519 signing nonces made ahead of time, so that signing a message takes a microsecond.
//!
//! A signature is `(R, s)` with `R = [r]B` and `s = r + H(R ‖ A ‖ M)·a`. RFC 8032 derives `r`
//! from the message, so `[r]B` (most of the 16 µs a signature costs on this project's VM) has
//! to wait for the message. The verification equation never sees how `r` was chosen: any `r`
//! that is secret, uniform and used for one message only gives a signature that every
//! verifier accepts. So a party computes `(r, R)` pairs while it would otherwise idle — a
//! node spinning between requests, a client spinning for its answer — and signs with one when
//! the message comes.
//!
//! What keeps this safe is what RFC 8032's determinism was for: never reuse `r`, never let it
//! be guessed. `r = SHA-512(domain ‖ seed ‖ counter ‖ clock ‖ random)` reduced mod ℓ: secret
//! through the key's seed, distinct within a process through a global counter even if the
//! random source repeated itself, and across processes through the clock and 32 fresh random
//! bytes the caller brings (this crate does no I/O). A pair leaves the pool by value, is used
//! once and is wiped when dropped. With the pool empty, signing is RFC 8032's own.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use curve25519_dalek::{EdwardsPoint, Scalar};
use sha2::{Digest, Sha512};
use zeroize::Zeroize;

/// Nonces a key keeps ready: a node signs one commitment per job, a client one request per
/// round trip, and each refills between messages; a few cover a short burst.
pub const POOL_TARGET: usize = 4;

/// Distinct for every nonce this process makes, whichever key or pool it is for.
static MADE: AtomicU64 = AtomicU64::new(0);

/// One precomputed nonce: the secret `r` and the encoding of `R = [r]B`.
pub(crate) struct Nonce {
    r: Scalar,
    big_r: [u8; 32],
}

impl Drop for Nonce {
    fn drop(&mut self) {
        self.r.zeroize();
    }
}

impl Nonce {
    /// A fresh nonce for the key whose secret seed is `seed`; `random` must come from the
    /// operating system's random source.
    fn new(seed: &[u8; 32], random: &[u8; 32]) -> Nonce {
        let count = MADE.fetch_add(1, Ordering::Relaxed);
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut h = Sha512::new();
        h.update(b"tenet-presigned-nonce-v1");
        h.update(seed);
        h.update(count.to_le_bytes());
        h.update(clock.to_le_bytes());
        h.update(random);
        let mut wide: [u8; 64] = h.finalize().into();
        let r = Scalar::from_bytes_mod_order_wide(&wide);
        wide.zeroize();
        let big_r = EdwardsPoint::mul_base(&r).compress().to_bytes();
        Nonce { r, big_r }
    }

    /// The signature over `message` by the key with secret scalar `a` and public key `public`.
    fn sign(self, a: &Scalar, public: &[u8; 32], message: &[u8]) -> [u8; 64] {
        let mut h = Sha512::new();
        h.update(self.big_r);
        h.update(public);
        h.update(message);
        let k = Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let s = k * a + self.r;
        let mut sig = [0u8; 64];
        sig[..32].copy_from_slice(&self.big_r);
        sig[32..].copy_from_slice(s.as_bytes());
        sig
    }
}

/// A key's ready nonces. Shared by the clones of a key pair; each nonce is taken out under the
/// lock, so no two signatures ever get the same one.
#[derive(Default)]
pub(crate) struct Pool {
    ready: Mutex<Vec<Nonce>>,
}

impl Pool {
    pub(crate) fn len(&self) -> usize {
        self.ready.lock().map_or(0, |v| v.len())
    }

    /// Make one nonce if fewer than [`POOL_TARGET`] are ready; whether one was made.
    pub(crate) fn refill_one(&self, seed: &[u8; 32], random: &[u8; 32]) -> bool {
        if self.len() >= POOL_TARGET {
            return false;
        }
        // Made outside the lock: a signer never waits 15 µs behind a refill.
        let nonce = Nonce::new(seed, random);
        if let Ok(mut v) = self.ready.lock() {
            v.push(nonce);
        }
        true
    }

    /// Sign `message` with a ready nonce, or `None` if there is none.
    pub(crate) fn sign(&self, a: &Scalar, public: &[u8; 32], message: &[u8]) -> Option<[u8; 64]> {
        let nonce = self.ready.lock().ok()?.pop()?;
        Some(nonce.sign(a, public, message))
    }
}
