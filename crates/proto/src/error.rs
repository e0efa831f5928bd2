//! Errors as every party sees them: a stable machine-readable code, a message that says what
//! was wrong and what to do, and — in this one table — the HTTP status each code travels with.

use std::fmt;

/// What went wrong, in words a client can branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed: bad JSON, a bad hash, a missing field.
    BadRequest,
    /// The request carries no signature headers, or they do not parse.
    Unauthenticated,
    /// The signature does not verify over this request.
    BadSignature,
    /// The request's timestamp is outside the node's clock window.
    StaleTimestamp,
    /// This nonce was already used within the clock window.
    ReplayedNonce,
    /// The key is valid but not one this node trusts.
    UntrustedKey,
    /// The caller is known but may not do this (bonding stake takes the admin's key).
    Forbidden,
    /// No such blob, job, session or tensor.
    NotFound,
    /// The uploaded bytes do not hash to the address they were sent to.
    HashMismatch,
    /// The body ended before its declared length.
    TruncatedBody,
    /// The body is larger than this node accepts.
    TooLarge,
    /// The task is not a valid tenet graph, or a tensor blob is malformed.
    InvalidGraph,
    /// Inputs or weights do not fit the graph (names, types, missing tensors).
    BadInputs,
    /// The job's cost certificate exceeds this node's limits; it was not run.
    ExceedsLimits,
    /// The request conflicts with the state: a reveal before the commit, a reused job id.
    Conflict,
    /// The job ran past its time limit and was stopped.
    Timeout,
    /// The job was cancelled.
    Cancelled,
    /// The node has no free worker or queue slot, or is shutting down; try again later.
    Busy,
    /// The blob store is full of pinned blobs.
    StorageFull,
    /// A peer node could not be reached or sent wrong bytes.
    PeerFailed,
    /// A bug or an I/O failure on the node.
    Internal,
}

impl ErrorCode {
    /// The HTTP status this code travels with.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            BadRequest | HashMismatch | TruncatedBody => 400,
            Unauthenticated | BadSignature | StaleTimestamp | ReplayedNonce => 401,
            UntrustedKey | Forbidden => 403,
            NotFound => 404,
            Conflict | Cancelled => 409,
            TooLarge => 413,
            InvalidGraph | BadInputs | ExceedsLimits => 422,
            Internal => 500,
            PeerFailed => 502,
            Busy => 503,
            Timeout => 504,
            StorageFull => 507,
        }
    }

    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "bad_request",
            Unauthenticated => "unauthenticated",
            BadSignature => "bad_signature",
            StaleTimestamp => "stale_timestamp",
            ReplayedNonce => "replayed_nonce",
            UntrustedKey => "untrusted_key",
            Forbidden => "forbidden",
            NotFound => "not_found",
            HashMismatch => "hash_mismatch",
            TruncatedBody => "truncated_body",
            TooLarge => "too_large",
            InvalidGraph => "invalid_graph",
            BadInputs => "bad_inputs",
            ExceedsLimits => "exceeds_limits",
            Conflict => "conflict",
            Timeout => "timeout",
            Cancelled => "cancelled",
            Busy => "busy",
            StorageFull => "storage_full",
            PeerFailed => "peer_failed",
            Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as it travels: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    error: ApiError,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&Envelope {
            error: self.clone(),
        })
        .unwrap_or_default()
    }

    /// Read an error body; `None` if `body` is not one.
    pub fn from_json(body: &[u8]) -> Option<ApiError> {
        serde_json::from_slice::<Envelope>(body)
            .ok()
            .map(|e| e.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_a_client_or_server_error_and_round_trips() {
        use ErrorCode::*;
        let all = [
            BadRequest,
            Unauthenticated,
            BadSignature,
            StaleTimestamp,
            ReplayedNonce,
            UntrustedKey,
            Forbidden,
            NotFound,
            HashMismatch,
            TruncatedBody,
            TooLarge,
            InvalidGraph,
            BadInputs,
            ExceedsLimits,
            Conflict,
            Timeout,
            Cancelled,
            Busy,
            StorageFull,
            PeerFailed,
            Internal,
        ];
        for c in all {
            assert!((400..600).contains(&c.http_status()));
            let e = ApiError::new(c, "why");
            assert_eq!(ApiError::from_json(&e.to_json()), Some(e));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
    }
}
