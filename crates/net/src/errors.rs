//! The API errors every service makes the same way: a blob store failure, a bad request, a
//! missing thing. (Their HTTP statuses come from `ErrorCode::http_status`, in one table.)

use tenet_proto::{ApiError, ErrorCode};
use tenet_store::StoreError;

/// A blob store failure as the client sees it: the node and the coordinator map it the same
/// way.
pub fn store_error(e: StoreError) -> ApiError {
    let code = match &e {
        StoreError::NotFound(_) => ErrorCode::NotFound,
        StoreError::HashMismatch { .. } => ErrorCode::HashMismatch,
        StoreError::TooLarge { .. } => ErrorCode::TooLarge,
        StoreError::Truncated { .. } => ErrorCode::TruncatedBody,
        StoreError::Full { .. } => ErrorCode::StorageFull,
        StoreError::Busy { .. } => ErrorCode::Busy,
        StoreError::Io { .. } => ErrorCode::Internal,
    };
    ApiError::new(code, e.to_string())
}

pub fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

pub fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::NotFound, message)
}
