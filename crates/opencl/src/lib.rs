//! `tenet-opencl`: the OpenCL backend. Runs every op of a tenet graph on an OpenCL device
//! (GPUs through their vendors' drivers, CPUs through PoCL) with exactly the reference
//! interpreter's bits: kernels in OpenCL C built without contraction and with correctly
//! rounded division and square root, the project's own math library instead of the
//! built-in transcendentals, and every reduction and fma chain in the reference's order.
//!
//! The library is loaded at run time (`libOpenCL.so.1`), so this crate builds anywhere;
//! [`OpenClDevice::available`] says whether a device can be opened here.
//!
//! Map: `device.rs` (opening devices, buffers, the `Device` trait), `program.rs` (compile
//! and run), `plan.rs` (each node as launches with their shapes and strides: which product
//! kernel, which chains fuse, which permutations are read in place), `kernels.rs` and
//! `cl/*.cl` (the OpenCL C), `fused.rs` (the kernels generated for fused elementwise
//! chains), `cl_api.rs` (every `unsafe` call into OpenCL),
//! `source.rs` and `check.rs` (the preamble, math library and the determinism check).

mod check;
mod cl_api;
mod device;
mod fused;
mod kernels;
mod plan;
mod program;
mod source;

pub use device::OpenClDevice;
pub use program::{PER_GATHER, RUN_FIXED};
pub use source::Quirks;
