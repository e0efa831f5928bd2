//! Backend-neutral analyses of a graph that every backend's planner needs: who reads each
//! node, which nodes are outputs, how far a chain of elementwise nodes can be fused into one
//! pass with only its last result materialised, and when each value can be released once the
//! backend has decided which step computes each node.
//!
//! The CPU backend's plan (`tenet-cpu`'s `plan.rs`) and the OpenCL backend build on these; a
//! CUDA backend would too.

use tenet_ir::{Graph, NodeId, Op};

/// Readers and outputs of a graph, in graph order.
#[derive(Debug, Clone)]
pub struct Schedule {
    users: Vec<Vec<usize>>,
    is_output: Vec<bool>,
}

/// When each value may be dropped, given the step each node is computed in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Liveness {
    /// Computed values whose buffers can be dropped after each step (outputs never).
    pub release: Vec<Vec<NodeId>>,
    /// Graph inputs whose last reader is each step (unused inputs: the first step). Inputs
    /// are the caller's memory, but they stop counting as live there, as in the certificate.
    pub input_release: Vec<Vec<NodeId>>,
}

impl Schedule {
    pub fn new(graph: &Graph) -> Schedule {
        let n = graph.nodes().len();
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in graph.nodes().iter().enumerate() {
            for o in node.op.operands() {
                users[o.index()].push(i);
            }
        }
        let mut is_output = vec![false; n];
        for o in graph.outputs() {
            is_output[o.node.index()] = true;
        }
        Schedule { users, is_output }
    }

    /// The nodes (by index) that read node `m`, in graph order (a node reading it twice
    /// appears twice).
    pub fn users(&self, m: usize) -> &[usize] {
        &self.users[m]
    }

    /// Every node's readers, by node index.
    pub fn all_users(&self) -> &[Vec<usize>] {
        &self.users
    }

    pub fn is_output(&self, m: usize) -> bool {
        self.is_output[m]
    }

    /// Every node's output flag, by node index.
    pub fn outputs(&self) -> &[bool] {
        &self.is_output
    }

    /// The end (inclusive) of the longest fusable group starting at node `start`: consecutive
    /// nodes, each accepted by `fusable` and of `start`'s shape, at most `max` of them, whose
    /// members but the last are read only inside the group (an output is read by the caller,
    /// so it can only end a group). One pass, so planning stays linear however long a chain.
    pub fn elementwise_group(
        &self,
        graph: &Graph,
        start: usize,
        max: usize,
        fusable: impl Fn(usize) -> bool,
    ) -> usize {
        let nodes = graph.nodes();
        let limit = (start + max).min(nodes.len());
        let shape = &nodes[start].ty.shape;
        let (mut end, mut reach, mut e) = (start, 0usize, start);
        while e + 1 < limit && fusable(e + 1) && nodes[e + 1].ty.shape == *shape {
            let furthest = if self.is_output[e] {
                usize::MAX
            } else {
                self.users[e].iter().copied().max().unwrap_or(usize::MAX)
            };
            reach = reach.max(furthest);
            e += 1;
            if reach <= e {
                end = e;
            }
            if reach >= limit {
                break;
            }
        }
        end
    }

    /// Release lists for `steps` steps, where `step_of[m]` is the step that computes node `m`
    /// (or, for a node the backend folds into its readers, the step of its last reader).
    pub fn liveness(&self, graph: &Graph, step_of: &[usize], steps: usize) -> Liveness {
        let mut release = vec![Vec::new(); steps];
        for (m, us) in self.users.iter().enumerate() {
            if self.is_output[m] {
                continue;
            }
            let last = us.iter().map(|&u| step_of[u]).max().unwrap_or(step_of[m]);
            if last != step_of[m] || us.is_empty() {
                release[last].push(NodeId(m as u32));
            }
        }
        let mut input_release = vec![Vec::new(); steps];
        for (m, node) in graph.nodes().iter().enumerate() {
            if matches!(node.op, Op::Input { .. }) && !self.is_output[m] {
                let last = self.users[m].iter().map(|&u| step_of[u]).max().unwrap_or(0);
                input_release[last].push(NodeId(m as u32));
            }
        }
        Liveness {
            release,
            input_release,
        }
    }
}
