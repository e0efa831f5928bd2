//! The OpenCL C every program is built from: the pragma that keeps the compiler from fusing
//! `a*b+c`, the project's own library (dtype conversions, the reference's math and elementwise
//! ops, Philox), and the build options that make `/` and `sqrt` correctly rounded.
//!
//! The library is a port of `tenet_reference` (`math.rs`, `philox.rs`, the float parts of
//! `interp.rs`) and of the `half` crate's conversions; `tests/math.rs` checks every function
//! bit for bit against them. Every name it defines starts with `tn_` (macros `TN_`), and it
//! defines no kernels: programs append their own.

/// Deliberate defects, for proving that the determinism check catches a broken device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// Build with floating-point contraction allowed (`a*b+c` may fuse).
    pub contract: bool,
    /// Build with denormals flushed to zero.
    pub flush_denormals: bool,
}

/// `f16`/`bf16` ⇄ `f32` by bit manipulation, exactly as `half` converts.
pub const CONVERT_CL: &str = include_str!("cl/convert.cl");
/// The reference's transcendentals, `pow` (f64 core), and every float unary/binary op.
pub const MATH_CL: &str = include_str!("cl/math.cl");
/// Philox-4x32-10 and the random ops' element values.
pub const PHILOX_CL: &str = include_str!("cl/philox.cl");

/// The source every program starts with: the contraction pragma (absent only under the
/// `contract` quirk), then the library. Kernels are appended after it.
pub fn preamble(quirks: &Quirks) -> String {
    let mut s = String::with_capacity(CONVERT_CL.len() + MATH_CL.len() + PHILOX_CL.len() + 256);
    if !quirks.contract {
        // OpenCL C lets a compiler fuse `a*b+c` within an expression by default; the reference
        // rounds the product and the sum separately wherever it does not call fma.
        s.push_str("#pragma OPENCL FP_CONTRACT OFF\n");
    }
    for part in [CONVERT_CL, MATH_CL, PHILOX_CL] {
        s.push_str(part);
        s.push('\n');
    }
    s
}

/// The options every program is built with.
pub fn build_options(quirks: &Quirks) -> String {
    // Without this option OpenCL allows 2.5 ulp for float division and 3 ulp for sqrt.
    let mut s = String::from("-cl-fp32-correctly-rounded-divide-sqrt");
    if quirks.contract {
        s.push_str(" -cl-mad-enable");
    }
    if quirks.flush_denormals {
        // Honoured by PoCL (its CPU code then runs with denormals flushed), so the check's
        // refusal of such a device can be tested on a CPU.
        s.push_str(" -cl-denorms-are-zero");
    }
    s
}
