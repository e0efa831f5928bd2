//! `tenet-exec`: running graphs fast, with exactly the reference's bits.
//!
//! A `Backend` prepares a graph once (`prepare`) into something that runs many times (`run`).
//! The CPU backend plans the graph in its own order (graph order, the order the cost
//! certificate assumes), releases every buffer after its last use, runs f32 matrix products on
//! the deterministic GEMM of `tenet-kernels`, fuses chains of elementwise ops into single passes
//! over memory, parallelises rows of normalisations, and hands every other op to the reference
//! interpreter's own code. Threads only ever split independent output elements, so the thread
//! count never changes a bit. A GPU backend implements the same two traits.

mod bound;
mod cpu;
mod device;
mod fused;
mod movement;
mod norms;
mod plan;
mod reduce;
mod view;

use std::collections::HashMap;

use tenet_ir::{Graph, HostTensor, WeightSource};

pub use bound::{
    PER_THREAD, PER_VALUE, REFERENCE_BYTES_PER_ELEMENT, RUN_FIXED, WORK_PER_NODE, work,
};
pub use cpu::CpuBackend;
pub use device::{
    Buffer, Device, DeviceClass, DeviceInfo, ExactCheck, Program, WeightCache, next_device_id,
};
pub use fused::POLL_ELEMENTS;
pub use tenet_kernels::SimdLevel;

/// Why a graph could not be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Inputs, weights or a run-time condition (such as a gather index) rejected by the op rules.
    #[error(transparent)]
    Run(#[from] tenet_reference::RunError),
    /// The graph needs more memory than this backend may use: its certificate's peak, or
    /// that plus the backend's scratch ([`Prepared::memory_bound`]).
    #[error(
        "the graph needs up to {needed} bytes of memory (its cost certificate's peak, plus this backend's scratch) but this backend is limited to {limit}"
    )]
    TooLarge { needed: u64, limit: u64 },
    /// The caller asked the run to stop (a timeout or a cancellation); nothing was returned.
    #[error("the run was stopped before it finished")]
    Stopped,
    /// The device failed or refused an operation (out of device memory, a driver error, a
    /// buffer from another device).
    #[error("device error: {0}")]
    Device(String),
    /// A kernel refused its arguments; this is a bug in the planner.
    #[error("kernel error in node {node}: {message}")]
    Kernel {
        node: tenet_ir::NodeId,
        message: String,
    },
}

/// Memory the OS says is available now (Linux `MemAvailable`), if it says: what limits on
/// graph size are checked against by default.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A way of executing graphs: the CPU today, a GPU behind a feature later.
pub trait Backend: Send + Sync {
    /// A short description, such as `cpu avx512 × 2 threads`.
    fn name(&self) -> String;
    /// Plan `graph` for repeated runs.
    fn prepare(&self, graph: &Graph) -> Result<Box<dyn Prepared>, ExecError>;
}

/// What one run measured about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// The most tensor bytes live at once, counted as the cost certificate counts them
    /// (operands and result of the running step; inputs until their last use). Kernel scratch
    /// (GEMM packing, a few MiB per thread) is not tensor memory and is not included.
    pub peak_bytes: u64,
    /// Wall time per kind of step, in the order each kind first ran (`tenet run --profile`).
    pub time_by_kind: Vec<StepTime>,
    /// How many times the run asked its `stop` function: between steps, and inside a long
    /// step every [`POLL_ELEMENTS`] element operations (or block of rows, batch entry, slab
    /// of a product).
    pub polls: u64,
}

/// The steps of one kind in a run: how many and how long they took together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTime {
    /// `gemm`, `fused`, `rows` (softmax and norms), `attention` (a product, softmax and product
    /// one batch entry at a time), `source` (inputs, weights, constants), or
    /// the op's name for ops run one by one (`concat`, `permute`, …).
    pub kind: &'static str,
    pub steps: u32,
    pub nanos: u64,
}

impl RunStats {
    pub(crate) fn add_time(&mut self, kind: &'static str, nanos: u64) {
        match self.time_by_kind.iter_mut().find(|t| t.kind == kind) {
            Some(t) => {
                t.steps += 1;
                t.nanos += nanos;
            }
            None => self.time_by_kind.push(StepTime {
                kind,
                steps: 1,
                nanos,
            }),
        }
    }
}

/// A graph planned by a backend.
pub trait Prepared: Send + Sync {
    /// The most memory one run may allocate: the certificate's `peak_bytes` plus the backend's
    /// documented scratch (for the CPU backend, see `bound.rs`: per thread, per live value,
    /// and the largest step's own).
    fn memory_bound(&self) -> u64;

    /// Run on named inputs with weights from `weights`; `seed` feeds the random ops. Outputs
    /// come back in the graph's output order.
    fn run(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
    ) -> Result<Vec<(String, HostTensor)>, ExecError> {
        self.run_with_stats(inputs, weights, seed)
            .map(|(outputs, _)| outputs)
    }

    /// `run`, also reporting what the run measured.
    fn run_with_stats(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        self.run_stoppable(inputs, weights, seed, &|| false)
    }

    /// `run_with_stats`, asking `stop` between steps and giving up with
    /// [`ExecError::Stopped`] once it says yes (how timeouts and cancellation reach a run).
    fn run_stoppable(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError>;
}
