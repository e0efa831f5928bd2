//! `tenet-proto`: what travels between tenet's parties, and nothing that moves it.
//!
//! Content addresses ([`Hash`]), the tensor blob encoding ([`tensor`]), signed requests
//! ([`auth`]), commitments to results ([`commit`]), receipts ([`receipt`]), the JSON bodies of the node API ([`wire`]), the
//! coordinator's call body, decoded against the task's inputs ([`run_body`]), the JSON bodies
//! of the coordinator's REST API that its clients read ([`api`]),
//! and the one table that maps an error to an HTTP status ([`error`]). This crate does no I/O: it
//! knows the bytes, not the sockets. Only this crate knows the wire format.

pub mod api;
pub mod auth;
pub mod commit;
pub mod compare;
pub mod error;
pub mod grant;
mod hash;
pub mod manifest;
mod nonces;
pub mod pipeline_receipt;
pub mod receipt;
pub mod run_body;
pub mod staged_receipt;
pub mod tensor;
pub mod trace;
pub mod training_receipt;
pub mod wire;

pub use error::{ApiError, ErrorCode};
pub use hash::{Hash, HashParseError};

/// Seconds since the Unix epoch, from the system clock (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Bytes from hex (either case); `None` on an odd length or a non-hex character.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| {
            let hi = (p[0] as char).to_digit(16)?;
            let lo = (p[1] as char).to_digit(16)?;
            Some((hi * 16 + lo) as u8)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::from_hex(&super::to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(super::from_hex("ABcd").unwrap(), vec![0xab, 0xcd]);
        assert!(super::from_hex("abc").is_none());
        assert!(super::from_hex("zz").is_none());
    }
}
