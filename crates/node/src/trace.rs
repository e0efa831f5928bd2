//! A job's trace, for disputes by bisection (`tenet_proto::trace`): the job re-run on the
//! reference interpreter with every node's value hashed in node order, the Merkle tree over
//! those hashes kept to answer the coordinator's questions, and any node's value recomputed on
//! demand (a node keeps hashes, not values). A node told to lie at one op (`--cheat op=K`) lies
//! the same way here as when it ran the job, so its trace follows from its lie.

use std::collections::HashMap;
use std::sync::Arc;

use tenet_ir::HostTensor;
use tenet_models::WeightsFile;
use tenet_proto::trace::{Proof, TraceTree};

use crate::engine::{Bound, Task};
use tenet_proto::{ApiError, ErrorCode};

/// A computed trace and what it takes to recompute a value.
pub struct JobTrace {
    task: Arc<Task>,
    weights: Option<Arc<WeightsFile>>,
    inputs: HashMap<String, HostTensor>,
    seed: u64,
    lie_at: Option<u32>,
    tree: TraceTree,
}

/// Flip the lowest bit of a value's first byte (the one-op lie of `--cheat op=K`).
pub fn flip(t: &mut HostTensor) {
    if let Some(b) = t.bytes_mut()
        && !b.is_empty()
    {
        b[0] ^= 1;
    }
}

/// Run `task` on the reference interpreter, lying at node `lie_at` when set; `observe` sees
/// every node's value (after the lie). The outputs.
pub fn run_reference(
    task: &Task,
    weights: Option<&WeightsFile>,
    inputs: &HashMap<String, HostTensor>,
    seed: u64,
    lie_at: Option<u32>,
    observe: &mut dyn FnMut(u32, &HostTensor) -> bool,
) -> Result<Vec<(String, HostTensor)>, ApiError> {
    tenet_reference::run_observed(&task.graph, inputs, &Bound(weights), seed, &mut |id, v| {
        if lie_at == Some(id.0) {
            flip(v);
        }
        observe(id.0, v)
    })
    .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))
}

impl JobTrace {
    pub fn compute(
        task: Arc<Task>,
        weights: Option<Arc<WeightsFile>>,
        inputs: HashMap<String, HostTensor>,
        seed: u64,
        lie_at: Option<u32>,
    ) -> Result<JobTrace, ApiError> {
        let mut leaves = Vec::with_capacity(task.graph.nodes().len());
        run_reference(
            &task,
            weights.as_deref(),
            &inputs,
            seed,
            lie_at,
            &mut |_, v| {
                leaves.push(tenet_proto::tensor::hash(v));
                true
            },
        )?;
        Ok(JobTrace {
            task,
            weights,
            inputs,
            seed,
            lie_at,
            tree: TraceTree::new(leaves),
        })
    }

    pub fn tree(&self) -> &TraceTree {
        &self.tree
    }

    /// Leaf `i`'s proof and value.
    pub fn leaf(&self, i: u64) -> Result<(Proof, HostTensor), ApiError> {
        let proof = self
            .tree
            .proof(i)
            .filter(|_| i < self.tree.count())
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("the trace has {} leaves, no leaf {i}", self.tree.count()),
                )
            })?;
        let mut found = None;
        run_reference(
            &self.task,
            self.weights.as_deref(),
            &self.inputs,
            self.seed,
            self.lie_at,
            &mut |id, v| {
                if u64::from(id) == i {
                    found = Some(v.clone());
                    return false;
                }
                true
            },
        )?;
        let value = found.ok_or_else(|| {
            ApiError::new(ErrorCode::Internal, format!("leaf {i} was not computed"))
        })?;
        Ok((proof, value))
    }
}
