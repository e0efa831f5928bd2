//! The CPU backend.

use std::borrow::Cow;
use std::collections::HashMap;

use tenet_ir::{Graph, HostTensor, NodeId, NormOp, Op, WeightSource};
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm};
use tenet_kernels::norm::{self, Affine};
use tenet_reference::{RunError, check_inputs, eval_op};

use crate::plan::{Plan, Step, plan};
use crate::view::{Pool, f32s, make_f32, par_chunks};
use crate::{Backend, ExecError, Prepared, RunStats};
use crate::{fused, movement, reduce};

/// Runs graphs on this machine's cores at a chosen SIMD level.
#[derive(Clone, Debug)]
pub struct CpuBackend {
    threads: usize,
    level: SimdLevel,
    memory_limit: Option<u64>,
}

impl CpuBackend {
    /// `threads` worker threads (at least 1) at `level` (downgraded if the CPU lacks it).
    pub fn new(threads: usize, level: SimdLevel) -> CpuBackend {
        CpuBackend {
            threads: threads.max(1),
            level: level.or_supported(),
            memory_limit: None,
        }
    }

    /// Refuse, before running anything, graphs whose certificate's peak exceeds `bytes`.
    pub fn with_memory_limit(mut self, bytes: u64) -> CpuBackend {
        self.memory_limit = Some(bytes);
        self
    }

    /// All cores, the best SIMD level (or `TENET_SIMD`'s, if set and supported).
    pub fn auto() -> CpuBackend {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuBackend::new(
            threads,
            SimdLevel::from_env().unwrap_or_else(|_| SimdLevel::detect()),
        )
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn level(&self) -> SimdLevel {
        self.level
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!(
            "cpu {} × {} thread{}",
            self.level.name(),
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        )
    }

    fn prepare(&self, graph: &Graph) -> Result<Box<dyn Prepared>, ExecError> {
        let cost = graph.cost();
        let needed = cost.peak_bytes;
        if let Some(limit) = self.memory_limit.filter(|&l| needed > l) {
            return Err(ExecError::TooLarge { needed, limit });
        }
        let min = tenet_kernels::parallel::MIN_PARALLEL_ELEMS as u64;
        Ok(Box::new(CpuPrepared {
            graph: graph.clone(),
            plan: plan(graph),
            backend: self.clone(),
            parallel: self.threads > 1 && (cost.flops >= min || cost.bytes_written >= 4 * min),
        }))
    }
}

struct CpuPrepared {
    graph: Graph,
    plan: Plan,
    backend: CpuBackend,
    /// Whether any step may be big enough to share out. A graph too small for that runs without
    /// waking the pool's helpers: each would spin on a core for nothing, which on a 2-core node
    /// serving tiny jobs costs every request a core.
    parallel: bool,
}

/// A node's value: borrowed from the caller (inputs) or owned.
enum Val<'a> {
    Borrowed(&'a HostTensor),
    Owned(HostTensor),
}

impl Val<'_> {
    fn get(&self) -> &HostTensor {
        match self {
            Val::Borrowed(t) => t,
            Val::Owned(t) => t,
        }
    }
}

impl Prepared for CpuPrepared {
    fn run_stoppable(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        // The steps run on a pool worker, so the parts each step hands out are waited for by
        // working instead of by sleeping (tenet_kernels::parallel::on_workers).
        if self.parallel {
            tenet_kernels::parallel::on_workers(|| self.run_steps(inputs, weights, seed, stop))
        } else {
            self.run_steps(inputs, weights, seed, stop)
        }
    }
}

impl CpuPrepared {
    fn run_steps(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        check_inputs(&self.graph, inputs)?;
        let g = &self.graph;
        let bytes = |v: &Option<Val<'_>>| v.as_ref().map_or(0, |v| v.get().bytes().len() as u64);
        // Inputs count from the start, as in the certificate.
        let mut live: u64 = g
            .inputs()
            .map(|(_, name, _)| inputs[name].bytes().len() as u64)
            .sum();
        let mut peak = live;
        let mut values: Vec<Option<Val<'_>>> = (0..g.nodes().len()).map(|_| None).collect();
        let pool = Pool::default();
        let mut stats = RunStats::default();
        for (s, step) in self.plan.steps.iter().enumerate() {
            if stop() {
                return Err(ExecError::Stopped);
            }
            let started = std::time::Instant::now();
            pool.set_budget(g.cost().peak_bytes.saturating_sub(live));
            // A reshape of a value that dies here re-types its buffer instead of copying it
            // (the moved bytes stop counting under the old node and count under the new one).
            let (id, value) = match self.reshape_in_place(s, step, &mut values) {
                Some((id, t)) => {
                    live -= t.bytes().len() as u64;
                    (id, Val::Owned(t))
                }
                None => self.step(step, &values, inputs, weights, seed, &pool)?,
            };
            stats.add_time(self.step_kind(step), started.elapsed().as_nanos() as u64);
            let is_input = matches!(g.node(id).op, Op::Input { .. });
            values[id.index()] = Some(value);
            if !is_input {
                live += bytes(&values[id.index()]);
            }
            peak = peak.max(live);
            for r in &self.plan.release[s] {
                if !matches!(g.node(*r).op, Op::Input { .. }) {
                    live -= bytes(&values[r.index()]);
                }
                if let Some(Val::Owned(t)) = values[r.index()].take()
                    && !t.is_shared()
                {
                    pool.give(t.into_bytes());
                }
            }
            for r in &self.plan.input_release[s] {
                live -= g.node(*r).ty.bytes().unwrap_or(0);
            }
        }
        // Move each output out of the table; copy only an input returned as an output, or a
        // node named by two outputs.
        let mut outs = Vec::with_capacity(g.outputs().len());
        for (i, o) in g.outputs().iter().enumerate() {
            let again = g.outputs()[i + 1..]
                .iter()
                .any(|later| later.node == o.node);
            let slot = &mut values[o.node.index()];
            let t = match (again, slot.take()) {
                (false, Some(Val::Owned(t))) => t,
                (_, Some(v)) => {
                    let t = v.get().clone();
                    *slot = Some(v);
                    t
                }
                (_, None) => unreachable!("outputs are kept until the end"),
            };
            outs.push((o.name.clone(), t));
        }
        stats.peak_bytes = peak;
        Ok((outs, stats))
    }

    fn step_kind(&self, step: &Step) -> &'static str {
        match step {
            Step::Source(_) => "source",
            Step::Gemm { .. } => "gemm",
            Step::Fused(_) => "fused",
            Step::Rows { .. } => "rows",
            Step::Generic(id) => self.graph.node(*id).op.name(),
        }
    }

    /// If `step` reshapes an owned value whose last use it is, take that value re-typed.
    fn reshape_in_place(
        &self,
        s: usize,
        step: &Step,
        values: &mut [Option<Val<'_>>],
    ) -> Option<(NodeId, HostTensor)> {
        let Step::Generic(id) = step else { return None };
        let node = self.graph.node(*id);
        let Op::Reshape { x } = node.op else {
            return None;
        };
        if !self.plan.release[s].contains(&x) || !matches!(values[x.index()], Some(Val::Owned(_))) {
            return None;
        }
        let Some(Val::Owned(t)) = values[x.index()].take() else {
            return None;
        };
        match t.reshaped(node.ty.clone()) {
            Ok(t) => Some((*id, t)),
            Err(t) => {
                values[x.index()] = Some(Val::Owned(t));
                None
            }
        }
    }

    fn step<'a>(
        &self,
        step: &Step,
        values: &[Option<Val<'a>>],
        inputs: &'a HashMap<String, HostTensor>,
        weights: &'a dyn WeightSource,
        seed: u64,
        pool: &Pool,
    ) -> Result<(NodeId, Val<'a>), ExecError> {
        let g = &self.graph;
        let val = |id: NodeId| {
            values[id.index()]
                .as_ref()
                .expect("operands are computed before use")
                .get()
        };
        let threads = self.backend.threads;
        Ok(match step {
            Step::Source(id) => {
                let node = g.node(*id);
                let v = match &node.op {
                    Op::Input { name } => Val::Borrowed(&inputs[name]),
                    Op::Weight { file, tensor } => {
                        let w = weights.weight(file, tensor).ok_or_else(|| {
                            RunError::MissingWeight {
                                file: file.to_hex(),
                                tensor: tensor.clone(),
                            }
                        })?;
                        if w.ty() != &node.ty {
                            return Err(RunError::WeightType {
                                tensor: tensor.clone(),
                                expected: node.ty.clone(),
                                actual: w.ty().clone(),
                            }
                            .into());
                        }
                        Val::Borrowed(w)
                    }
                    op => Val::Owned(eval_op(*id, op, &node.ty, &[], seed)?),
                };
                (*id, v)
            }
            Step::Generic(id) => {
                let node = g.node(*id);
                let operands: Vec<&HostTensor> =
                    node.op.operands().iter().map(|&o| val(o)).collect();
                // Movement ops are strided copies, f32 sums and means the kernels' ordered
                // sums; everything else is the reference's code.
                let value =
                    if let Some(moved) = movement::eval(pool, *id, &node.op, &node.ty, &operands) {
                        moved?
                    } else if let Some(sums) =
                        reduce::eval(pool, &node.op, &node.ty, &operands, threads)
                    {
                        sums
                    } else {
                        eval_op(*id, &node.op, &node.ty, &operands, seed)?
                    };
                (*id, Val::Owned(value))
            }
            Step::Gemm {
                node: id,
                a_permuted,
                b_permuted,
            } => {
                let t = self.gemm(*id, [*a_permuted, *b_permuted], val, pool)?;
                (*id, Val::Owned(t))
            }
            Step::Rows { node: id, prologue } => {
                let node = g.node(*id);
                let n = *node.ty.shape.last().unwrap_or(&1) as usize;
                let level = self.backend.level;
                // The input: a tensor, or the prologue group computed block by block.
                let externals = externals(g, prologue, &val);
                let members = (!prologue.is_empty())
                    .then(|| fused::members(g, prologue, &|o| &externals[&o][..]));
                let dims: Vec<usize> = node.ty.shape.iter().map(|&d| d as usize).collect();
                let x = match &members {
                    None => RowsInput::Tensor(f32s(val(node.op.operands()[0]))),
                    Some(members) => RowsInput::Fused {
                        level,
                        members,
                        dims: &dims,
                    },
                };
                let t = match &node.op {
                    Op::Normalize { op, .. } => {
                        let log = *op == NormOp::LogSoftmax;
                        rows(pool, &node.ty, &x, n, threads, |row, out| {
                            tenet_kernels::softmax::softmax_rows(level, log, row, row.len(), out)
                        })
                    }
                    Op::LayerNorm {
                        gamma,
                        beta,
                        eps_bits,
                        ..
                    } => {
                        let gm = gamma.map(|o| f32s(val(o)));
                        let bt = beta.map(|o| f32s(val(o)));
                        let eps = f32::from_bits(*eps_bits);
                        let affine = Affine {
                            gamma: gm.as_deref(),
                            beta: bt.as_deref(),
                        };
                        rows(pool, &node.ty, &x, n, threads, |row, out| {
                            norm::layer_norm_row(level, row, affine, eps, out);
                            canonical_nans(out)
                        })
                    }
                    Op::RmsNorm {
                        gamma, eps_bits, ..
                    } => {
                        let gm = gamma.map(|o| f32s(val(o)));
                        let eps = f32::from_bits(*eps_bits);
                        rows(pool, &node.ty, &x, n, threads, |row, out| {
                            norm::rms_norm_row(level, row, gm.as_deref(), eps, out);
                            canonical_nans(out)
                        })
                    }
                    _ => unreachable!("the planner only marks normalisations as rows"),
                };
                (*id, Val::Owned(t))
            }
            Step::Fused(ids) => {
                let last = *ids.last().expect("groups are non-empty");
                let ty = &g.node(last).ty;
                let externals = externals(g, ids, &val);
                let members = fused::members(g, ids, &|o| &externals[&o][..]);
                let dims: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
                let t = make_f32(pool, ty, |out| {
                    let level = self.backend.level;
                    par_chunks(out, threads, fused::CHUNK, |range, chunk| {
                        fused::eval_range(level, &members, &dims, range, chunk)
                    })
                });
                (last, Val::Owned(t))
            }
        })
    }

    fn gemm<'v>(
        &self,
        id: NodeId,
        permuted: [Option<NodeId>; 2],
        val: impl Fn(NodeId) -> &'v HostTensor,
        pool: &Pool,
    ) -> Result<HostTensor, ExecError> {
        let node = self.graph.node(id);
        let Op::MatMul { a, b } = node.op else {
            unreachable!("gemm steps are matmuls")
        };
        let r = node.ty.rank();
        let batch: Vec<u64> = node.ty.shape[..r - 2].to_vec();
        let (ta, a_strides) = self.operand(a, permuted[0], &val);
        let (tb, b_strides) = self.operand(b, permuted[1], &val);
        let (av, bv) = (f32s(ta), f32s(tb));
        let (a_shape, b_shape) = (&self.graph.node(a).ty.shape, &self.graph.node(b).ty.shape);
        let ra = a_shape.len();
        let (m, k, n) = (
            a_shape[ra - 2] as usize,
            a_shape[ra - 1] as usize,
            node.ty.shape[r - 1] as usize,
        );
        // Flat offset of each output batch's matrix within an operand, by broadcasting.
        let offsets = |shape: &[u64], strides: &[usize]| -> Vec<usize> {
            let own = &shape[..shape.len() - 2];
            let pad = batch.len() - own.len();
            let count: usize = batch.iter().product::<u64>() as usize;
            (0..count)
                .map(|flat| {
                    let (mut rem, mut off) = (flat, 0usize);
                    for d in (0..batch.len()).rev() {
                        let idx = rem % batch[d] as usize;
                        rem /= batch[d] as usize;
                        if d >= pad && own[d - pad] != 1 {
                            off += idx * strides[d - pad];
                        }
                    }
                    off
                })
                .collect()
        };
        let (oa, ob) = (offsets(a_shape, &a_strides), offsets(b_shape, &b_strides));
        let (a_rs, a_cs) = (a_strides[ra - 2], a_strides[ra - 1]);
        let rb = b_shape.len();
        let (b_rs, b_cs) = (b_strides[rb - 2], b_strides[rb - 1]);
        // Many small products (attention heads): one thread per group of batches. Few large
        // ones: every thread inside each product. Either way each element has one fma chain.
        let batches = oa.len();
        let (outer, inner) = if batches >= self.backend.threads {
            (self.backend.threads, 1)
        } else {
            (1, self.backend.threads)
        };
        let level = self.backend.level;
        let failed = std::sync::Mutex::new(None);
        let t = make_f32(pool, &node.ty, |out| {
            par_chunks(out, outer, m * n, |range, chunk| {
                let first = range.start / (m * n).max(1);
                for (bi, c) in chunk.chunks_mut((m * n).max(1)).enumerate() {
                    let (x, y) = (oa[first + bi], ob[first + bi]);
                    let a = Strided {
                        data: &av[x..],
                        rs: a_rs,
                        cs: a_cs,
                    };
                    let b = Strided {
                        data: &bv[y..],
                        rs: b_rs,
                        cs: b_cs,
                    };
                    if let Err(e) = sgemm(level, inner, m, n, k, a, b, c, n) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    }
                }
            })
        });
        let result = match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(message) => Err(ExecError::Kernel { node: id, message }),
            None => Ok(()),
        };
        result.map(|()| t)
    }

    /// A matmul operand as a tensor and the stride, in elements, of each of the operand's axes:
    /// its own row-major layout, or for a folded permutation its source's layout permuted.
    fn operand<'v>(
        &self,
        id: NodeId,
        permuted: Option<NodeId>,
        val: &impl Fn(NodeId) -> &'v HostTensor,
    ) -> (&'v HostTensor, Vec<usize>) {
        match permuted.map(|p| &self.graph.node(p).op) {
            Some(Op::Permute { x, perm }) => {
                let source = val(*x);
                (source, movement::permuted_strides(source.shape(), perm))
            }
            _ => {
                let t = val(id);
                (t, movement::strides(t.shape()))
            }
        }
    }
}

/// Make computed NaNs canonical (docs/OPS.md), as the reference encodes them.
fn canonical_nans(o: &mut [f32]) {
    o.iter_mut()
        .filter(|v| v.is_nan())
        .for_each(|v| *v = tenet_reference::math::NAN);
}

/// f32 views of the operands a fused group reads from outside itself, kept alive for its pass.
fn externals<'v>(
    g: &Graph,
    ids: &[NodeId],
    val: &impl Fn(NodeId) -> &'v HostTensor,
) -> HashMap<NodeId, Cow<'v, [f32]>> {
    ids.iter()
        .flat_map(|&id| g.node(id).op.operands())
        .filter(|o| !ids.contains(o))
        .map(|o| (o, f32s(val(o))))
        .collect()
}

/// The input of a rows step.
enum RowsInput<'a> {
    Tensor(Cow<'a, [f32]>),
    /// A fused group of the output's shape, evaluated a block of rows at a time.
    Fused {
        level: SimdLevel,
        members: &'a [fused::Member<'a>],
        dims: &'a [usize],
    },
}

/// Elements of a fused prologue computed at once: a block of rows that stays in L2.
const PROLOGUE_BLOCK: usize = 8 * fused::CHUNK;

/// Apply a row function over the last axis (`n` elements per row) on several threads. The
/// function must leave computed NaNs canonical.
fn rows(
    pool: &Pool,
    ty: &tenet_ir::TensorType,
    x: &RowsInput<'_>,
    n: usize,
    threads: usize,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) -> HostTensor {
    make_f32(pool, ty, |out| {
        if n == 0 {
            return;
        }
        par_chunks(out, threads, n, |range, chunk| match x {
            RowsInput::Tensor(x) => {
                for (row, o) in x[range].chunks(n).zip(chunk.chunks_mut(n)) {
                    f(row, o);
                }
            }
            RowsInput::Fused {
                level,
                members,
                dims,
            } => {
                let block = PROLOGUE_BLOCK.max(n) / n * n;
                let mut input = vec![0.0f32; block.min(range.len())];
                for (b, o) in chunk.chunks_mut(block).enumerate() {
                    let start = range.start + b * block;
                    let input = &mut input[..o.len()];
                    fused::eval_range(*level, members, dims, start..start + o.len(), input);
                    for (row, o) in input.chunks(n).zip(o.chunks_mut(n)) {
                        f(row, o);
                    }
                }
            }
        })
    })
}
