//! The one place where the node's internal errors become wire errors (and so HTTP statuses,
//! through `ErrorCode::http_status`).

use tenet_exec::ExecError;
use tenet_proto::{ApiError, ErrorCode};

pub use tenet_net::errors::{bad_request, not_found, store_error};

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

pub fn internal(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Internal, message)
}
