//! `tenet-exec`: the device layer every backend implements, and the analyses they share.
//!
//! A [`Device`] compiles a graph once into a [`Program`] that runs many times, on buffers that
//! live on the device (or, for simple callers, on host tensors). Backends live in crates of
//! their own (`tenet-cpu`, `tenet-opencl`) and are opened by spec through `tenet-devices`;
//! this crate holds the traits, the errors, what a run reports about itself, the
//! backend-neutral [`Schedule`] (users, liveness, elementwise groups) and the work figure
//! admission uses. It knows no kernel and no device.

mod device;
mod schedule;

use tenet_ir::Cost;

pub use device::{
    Buffer, Device, DeviceClass, DeviceInfo, ExactCheck, Program, WeightCache, next_device_id,
};
pub use schedule::{Liveness, Schedule};

/// Why a graph could not be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Inputs, weights or a run-time condition (such as a gather index) rejected by the op rules.
    #[error(transparent)]
    Run(#[from] tenet_reference::RunError),
    /// The graph needs more memory than this backend may use: its certificate's peak, or
    /// that plus the backend's scratch ([`Program::memory_bound`]).
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
    /// The slowest steps, slowest first (at most [`SLOWEST_KEPT`]): the node each step
    /// produced, its kind and its time.
    pub slowest: Vec<(tenet_ir::NodeId, &'static str, u64)>,
}

/// How many of the slowest steps a run keeps in [`RunStats::slowest`].
pub const SLOWEST_KEPT: usize = 12;

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
    /// Count a step that produced `node`: its kind's total, and the slowest steps.
    pub fn add_step(&mut self, node: tenet_ir::NodeId, kind: &'static str, nanos: u64) {
        self.add_time(kind, nanos);
        let at = self.slowest.partition_point(|s| s.2 >= nanos);
        if at < SLOWEST_KEPT {
            self.slowest.insert(at, (node, kind, nanos));
            self.slowest.truncate(SLOWEST_KEPT);
        }
    }

    pub fn add_time(&mut self, kind: &'static str, nanos: u64) {
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

/// Work units charged per node of the graph (decoding, planning, a step's setup).
pub const WORK_PER_NODE: u64 = 1024;

/// The work figure of a graph: `flops + bytes_read + bytes_written + WORK_PER_NODE × nodes`
/// from its certificate. A node refuses a job whose work exceeds what it can do before the
/// job's deadline (docs/NODE.md, "Limits"); every backend's run performs O(work) operations.
pub fn work(cost: &Cost, nodes: usize) -> u64 {
    cost.flops
        .saturating_add(cost.bytes_read)
        .saturating_add(cost.bytes_written)
        .saturating_add(WORK_PER_NODE.saturating_mul(nodes as u64))
}
