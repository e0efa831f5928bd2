//! `tenet-models`: weights, tensor files, and model builders.
//!
//! Weights live in safetensors files named by the blake3 hash of their bytes (`WeightsId`); a
//! graph refers to a tensor as (file hash, tensor name). This crate reads such files without
//! trusting them, checks that a graph's weight references match the files at hand, reads and
//! writes tensors as `.npy`, `.safetensors` and JSON, and builds example models as graphs.

pub mod bert;
pub mod examples;
pub mod fetch;
pub mod generation;
pub mod gguf;
pub mod minilm;
mod safetensors_io;
pub mod smollm2;
mod tensor_io;

pub use safetensors_io::{
    BindError, SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE, TensorInfo, WeightSet, WeightsError,
    WeightsFile, check_bindings, default_max_resident_bytes, write_safetensors,
};
pub use tensor_io::{
    MAX_TENSOR_FILE_BYTES, TensorIoError, npy_bytes, outputs_json, read_tensor, tensor_from_json,
    write_atomically, write_outputs,
};
