//! `tenet-models`: weights and model builders.
//!
//! Weights live in safetensors files named by the blake3 hash of their bytes (`WeightsId`); a
//! graph refers to a tensor as (file hash, tensor name). This crate reads such files without
//! trusting them, checks that a graph's weight references match the files at hand, and builds
//! example models as graphs.

pub mod examples;
mod safetensors_io;

pub use safetensors_io::{
    BindError, TensorInfo, WeightsError, WeightsFile, check_bindings, write_safetensors,
};
