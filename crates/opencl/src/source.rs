//! The OpenCL C every program is built from: the pragmas, the project's own math, dtype
//! conversions and Philox, and the build options (placeholder until the library lands).

/// Deliberate defects, for proving that the determinism check catches a broken device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// Build with floating-point contraction allowed (`a*b+c` may fuse).
    pub contract: bool,
    /// Build with denormals flushed to zero.
    pub flush_denormals: bool,
}

/// The source every program starts with.
pub(crate) fn preamble(quirks: &Quirks) -> String {
    let mut s = String::new();
    if !quirks.contract {
        s.push_str("#pragma OPENCL FP_CONTRACT OFF\n");
    }
    s
}

/// The options every program is built with.
pub(crate) fn build_options(quirks: &Quirks) -> String {
    let mut s = String::from("-cl-fp32-correctly-rounded-divide-sqrt");
    if quirks.contract {
        s.push_str(" -cl-mad-enable");
    }
    if quirks.flush_denormals {
        s.push_str(" -cl-denorms-are-zero");
    }
    s
}
