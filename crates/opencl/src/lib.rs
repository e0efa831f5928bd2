//! `tenet-opencl`: the OpenCL backend (work in progress).

#![allow(dead_code)]

mod check;
mod source;

pub use source::Quirks;
