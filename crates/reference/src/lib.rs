//! `tenet-reference`: the reference interpreter, which defines the bits of every op in the
//! `exact` tier.
//!
//! It is deliberately plain: one loop per op, written to be read next to docs/OPS.md, no
//! threads, no SIMD, no cleverness. Fast executors are tested bit for bit against it. Its own
//! transcendental functions are in `math`; the counter-based generator in `philox`.

mod interp;
pub mod math;
pub mod philox;
pub mod quant;

pub use interp::{
    POLL_WORK, RunError, binary_f32, check_inputs, eval_op, eval_op_polled, fmax, fmin, fold_lanes,
    layer_norm_row, rms_norm_row, run, run_observed, softmax_or_log_row, softmax_row, sum_ordered,
    unary_f32,
};
