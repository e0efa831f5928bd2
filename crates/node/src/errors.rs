//! The one place where the node's internal errors become wire errors (and so HTTP statuses,
//! through `ErrorCode::http_status`).

use tenet_exec::ExecError;
use tenet_proto::{ApiError, ErrorCode};
use tenet_store::StoreError;

/// A store failure as the client sees it.
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

/// An execution failure as the client sees it (`Stopped` is told apart by the caller, which
/// knows whether a timeout or a cancellation stopped it).
pub fn exec_error(e: ExecError) -> ApiError {
    let code = match &e {
        ExecError::Run(_) => ErrorCode::BadInputs,
        ExecError::TooLarge { .. } => ErrorCode::ExceedsLimits,
        ExecError::Stopped => ErrorCode::Cancelled,
        ExecError::Kernel { .. } | ExecError::Device(_) => ErrorCode::Internal,
    };
    ApiError::new(code, e.to_string())
}

pub fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, message)
}

pub fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::NotFound, message)
}

pub fn internal(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Internal, message)
}
