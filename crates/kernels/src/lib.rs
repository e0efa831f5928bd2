//! `tenet-kernels`: compute only. Every SIMD intrinsic of the project and the `unsafe` blocks
//! they need, behind safe functions; the thread pool its parallel kernels run on, like the
//! machine's other parts, is `tenet-sys`'s.
//!
//! Each kernel reproduces the bits of the reference interpreter (`tenet-reference`) exactly, at
//! every SIMD level and any thread count: the arithmetic order is fixed by docs/OPS.md, and the
//! kernels only change how that order is scheduled, never the order itself. The CPU's features
//! are detected at run time; `TENET_SIMD=avx512|avx2|portable` forces a level (see `SimdLevel`).

pub mod depthwise;
pub mod gemm;
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
mod gemm_direct;
pub mod norm;
mod peak;
pub mod qgemm;
pub mod reduce;
mod simd;
pub mod softmax;
pub mod streaming;
pub mod vmath;

pub use peak::{fma_peak_gflops, read_bandwidth_gbs};
pub use simd::{SimdError, SimdLevel};
