//! `tenet-cpu`: the CPU backend, running graphs fast with exactly the reference's bits.
//!
//! [`CpuDevice`] compiles a graph into a plan in graph order (the order the cost certificate
//! assumes), releases every buffer after its last use, runs f32 matrix products on the
//! deterministic GEMM of `tenet-kernels` and products with block-quantised weights (`qmatmul`,
//! and `dequantize`) on its quantised kernels, f32 convolutions on the same GEMM over im2col
//! chunks (`conv.rs`) and f32 pooling on loops of its own (`pool.rs`), fuses chains of elementwise ops into single
//! passes over memory, parallelises rows of normalisations, and hands every other op to the
//! reference interpreter's own code. Threads only ever split independent output elements, so the thread
//! count never changes a bit. Its buffers are host tensors, so uploads and downloads are
//! handles, not copies.

mod bound;
mod conv;
mod cpu;
mod fused;
mod movement;
mod norms;
mod plan;
mod pool;
mod quant;
mod reduce;
mod select;
mod view;

pub use bound::{PER_THREAD, PER_VALUE, REFERENCE_BYTES_PER_ELEMENT, RUN_FIXED};
pub use cpu::CpuDevice;
pub use fused::POLL_ELEMENTS;
pub use tenet_kernels::SimdLevel;
