//! The CPU backend.

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tenet_ir::{Graph, HostTensor, NodeId, NormOp, Op, QDot, WeightSource};
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Epilogue, Strided, sgemm, sgemm_then};
use tenet_kernels::norm::{self, Affine};
use tenet_reference::{RunError, check_inputs, eval_op, eval_op_polled};

/// The values live in a run, by node. A node id is a small integer, hashed by one multiply:
/// std's SipHash is made for keys an attacker picks, and these are the plan's own.
type Values<'a> = HashMap<NodeId, Val<'a>, std::hash::BuildHasherDefault<NodeIdHash>>;

/// Hashes a node id (a `u32`) by a Fibonacci multiply, which spreads it to the high bits the
/// table's probing reads.
#[derive(Default)]
struct NodeIdHash(u64);

impl std::hash::Hasher for NodeIdHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

use crate::fused::Poll;
use crate::plan::{Plan, Step, plan};
use crate::view::{Pool, f32s, make_f32, par_chunks};
use crate::{conv, fused, movement, norms, pool, quant, reduce, select};
use tenet_exec::{
    Buffer, Device, DeviceClass, DeviceInfo, ExactCheck, ExecError, Program, RunStats,
    next_device_id,
};

/// Runs graphs on this machine's cores at a chosen SIMD level. Its buffers are host tensors.
#[derive(Clone, Debug)]
pub struct CpuDevice {
    id: u64,
    threads: usize,
    level: SimdLevel,
    memory_limit: Option<u64>,
}

impl CpuDevice {
    /// `threads` worker threads (at least 1) at `level` (downgraded if the CPU lacks it).
    pub fn new(threads: usize, level: SimdLevel) -> CpuDevice {
        CpuDevice {
            id: next_device_id(),
            threads: threads.max(1),
            level: level.or_supported(),
            memory_limit: None,
        }
    }

    /// Refuse, before running anything, graphs whose certificate's peak exceeds `bytes`.
    pub fn with_memory_limit(mut self, bytes: u64) -> CpuDevice {
        self.memory_limit = Some(bytes);
        self
    }

    /// All cores, the best SIMD level (or `TENET_SIMD`'s, if set and supported).
    pub fn auto() -> CpuDevice {
        CpuDevice::new(
            Self::default_threads(),
            SimdLevel::from_env().unwrap_or_else(|_| SimdLevel::detect()),
        )
    }

    /// One thread per core the OS gives this process.
    pub fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// The concrete program, for callers that hold a `CpuDevice` (no boxing).
    fn compile_cpu(&self, graph: &Graph) -> Result<CpuProgram, ExecError> {
        let cost = graph.cost();
        if let Some(limit) = self.memory_limit.filter(|&l| cost.peak_bytes > l) {
            return Err(ExecError::TooLarge {
                needed: cost.peak_bytes,
                limit,
            });
        }
        let plan = plan(graph);
        // The certificate plus what this backend needs beside the tensors (bound.rs).
        let memory_bound = crate::bound::memory(graph, &plan, self.threads);
        if let Some(limit) = self.memory_limit.filter(|&l| memory_bound > l) {
            return Err(ExecError::TooLarge {
                needed: memory_bound,
                limit,
            });
        }
        let min = tenet_sys::parallel::MIN_PARALLEL_ELEMS as u64;
        Ok(CpuProgram {
            graph: graph.clone(),
            plan,
            device: self.clone(),
            parallel: self.threads > 1 && (cost.flops >= min || cost.bytes_written >= 4 * min),
            memory_bound,
        })
    }

    fn tensor<'b>(&self, b: &'b Buffer) -> Result<&'b HostTensor, ExecError> {
        b.handle::<HostTensor>()
            .ok_or_else(|| ExecError::Device(format!("{b:?} is not a CPU buffer")))
    }
}

impl Device for CpuDevice {
    fn id(&self) -> u64 {
        self.id
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            spec: "cpu".into(),
            name: self.name(),
            class: DeviceClass::Cpu,
            compute_units: self.threads,
            memory: self
                .memory_limit
                .or_else(tenet_exec::available_memory)
                .unwrap_or(0),
            // The CPU's kernels are the reference's bits by construction and by test (every
            // fast path is checked against the interpreter at every SIMD level).
            exact: ExactCheck::Passed,
        }
    }

    // Without reading the memory figure (`/proc/meminfo`) that `info` reports.
    fn name(&self) -> String {
        format!(
            "cpu {} × {} thread{}",
            self.level.name(),
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        )
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Program>, ExecError> {
        Ok(Box::new(self.compile_cpu(graph)?))
    }

    fn upload(&self, tensor: &HostTensor) -> Result<Buffer, ExecError> {
        // A shared tensor's clone is a handle; an owned one is copied once. Runs on the
        // buffer borrow it; `upload_owned` moves a tensor in without the copy.
        self.upload_owned(tensor.clone())
    }

    fn upload_owned(&self, tensor: HostTensor) -> Result<Buffer, ExecError> {
        Ok(Buffer::new(tensor.ty().clone(), self.id, tensor))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostTensor, ExecError> {
        Ok(self.tensor(buffer)?.clone())
    }

    fn write(&self, dst: &mut Buffer, offset: u64, src: &Buffer) -> Result<(), ExecError> {
        let src = self.tensor(src)?.bytes();
        let end = offset
            .checked_add(src.len() as u64)
            .filter(|&e| e <= dst.bytes())
            .ok_or_else(|| {
                ExecError::Device(format!(
                    "a write of {} bytes at {offset} does not fit {dst:?}",
                    src.len()
                ))
            })? as usize;
        let offset = offset as usize;
        if let Some(bytes) = dst.handle_mut::<HostTensor>().and_then(|t| t.bytes_mut()) {
            bytes[offset..end].copy_from_slice(src);
            return Ok(());
        }
        // Shared with a clone (or a view of a file): copy, then write.
        let old = self.tensor(dst)?;
        let mut bytes = old.bytes().to_vec();
        bytes[offset..end].copy_from_slice(src);
        let t = HostTensor::new(old.ty().clone(), bytes)
            .map_err(|e| ExecError::Device(e.to_string()))?;
        *dst = Buffer::new(t.ty().clone(), self.id, t);
        Ok(())
    }
}

struct CpuProgram {
    graph: Graph,
    plan: Plan,
    device: CpuDevice,
    /// Whether any step may be big enough to share out. A graph too small for that runs without
    /// waking the pool's helpers: each would spin on a core for nothing, which on a 2-core node
    /// serving tiny jobs costs every request a core.
    parallel: bool,
    /// The most memory a run may take (bound.rs).
    memory_bound: u64,
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

impl Program for CpuProgram {
    fn memory_bound(&self) -> u64 {
        self.memory_bound
    }

    fn device(&self) -> &dyn Device {
        &self.device
    }

    fn run_buffers(
        &self,
        inputs: &HashMap<String, Buffer>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, Buffer)>, RunStats), ExecError> {
        let mut host: HashMap<String, &HostTensor> = HashMap::with_capacity(inputs.len());
        for (name, b) in inputs {
            host.insert(name.clone(), self.device.tensor(b)?);
        }
        let (outs, stats) = self.run_any(&host, weights, seed, stop)?;
        let id = self.device.id;
        let outs = outs
            .into_iter()
            .map(|(name, t)| (name, Buffer::new(t.ty().clone(), id, t)))
            .collect();
        Ok((outs, stats))
    }

    fn run_stoppable(
        &self,
        inputs: &HashMap<String, HostTensor>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        self.run_any(inputs, weights, seed, stop)
    }
}

impl CpuProgram {
    /// A run on inputs held by value or by reference (host calls and device buffers).
    fn run_any<T: Borrow<HostTensor> + Sync>(
        &self,
        inputs: &HashMap<String, T>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        // The steps run on a pool worker, so the parts each step hands out are waited for by
        // working instead of by sleeping (tenet_sys::parallel::on_workers).
        if self.parallel {
            tenet_sys::parallel::on_workers(|| self.run_steps(inputs, weights, seed, stop))
        } else {
            self.run_steps(inputs, weights, seed, stop)
        }
    }
}

impl CpuProgram {
    fn run_steps<T: Borrow<HostTensor>>(
        &self,
        inputs: &HashMap<String, T>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        check_inputs(&self.graph, inputs)?;
        let g = &self.graph;
        let bytes = |v: Option<&Val<'_>>| v.map_or(0, |v| v.get().bytes().len() as u64);
        // Inputs count from the start, as in the certificate.
        let mut live: u64 = g
            .inputs()
            .map(|(_, name, _)| inputs[name].borrow().bytes().len() as u64)
            .sum();
        let mut peak = live;
        // Only the values live now, by node: a table of every node would cost ~60 bytes a node
        // for a chain of a million ops certified at a few bytes.
        let mut values = Values::default();
        // Sibling products' results made by the first of them, until their own steps.
        let mut early: HashMap<NodeId, HostTensor> = HashMap::new();
        let pool = Pool::default();
        let mut stats = RunStats::default();
        // `stop` is asked between steps and, inside a long step, every few hundred thousand
        // element operations (or every block of rows, batch entry or slab of a product): once
        // it says yes, every part of the step returns early and the run gives up.
        let (polls, stopped) = (AtomicU64::new(0), AtomicBool::new(false));
        let poll = || {
            if stopped.load(Ordering::Relaxed) {
                return true;
            }
            polls.fetch_add(1, Ordering::Relaxed);
            let yes = stop();
            if yes {
                stopped.store(true, Ordering::Relaxed);
            }
            yes
        };
        for (s, step) in self.plan.steps.iter().enumerate() {
            if poll() {
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
                None => match step {
                    Step::QMatMul(id) if early.contains_key(id) => {
                        (*id, Val::Owned(early.remove(id).expect("just seen")))
                    }
                    Step::QMatMul(id) if self.plan.siblings.contains_key(id) => {
                        let mut made = self.siblings(*id, &values, weights, &pool, &poll)?;
                        let first = made.remove(0);
                        early.extend(made);
                        (first.0, Val::Owned(first.1))
                    }
                    _ => self.step(step, &values, inputs, weights, seed, &pool, &poll)?,
                },
            };
            if stopped.load(Ordering::Relaxed) {
                return Err(ExecError::Stopped);
            }
            stats.add_step(
                id,
                self.step_kind(step),
                started.elapsed().as_nanos() as u64,
            );
            let is_input = matches!(g.node(id).op, Op::Input { .. });
            values.insert(id, value);
            if !is_input {
                live += bytes(values.get(&id));
            }
            peak = peak.max(live);
            for r in &self.plan.release[s] {
                if !matches!(g.node(*r).op, Op::Input { .. }) {
                    live -= bytes(values.get(r));
                }
                if let Some(Val::Owned(t)) = values.remove(r)
                    && !t.is_shared()
                {
                    pool.give(t.into_bytes());
                }
            }
            for r in &self.plan.input_release[s] {
                live -= g.node(*r).ty.bytes().unwrap_or(0);
            }
        }
        // Move each output out of the table. A node named by several outputs is made shared
        // once, and each output gets a handle: the certificate counts it once, and up to 4,096
        // names must not make 4,096 copies. An input returned as an output is cloned (a
        // handle when the caller's tensor is shared, as a node's are).
        let mut named = vec![0u32; g.nodes().len()];
        for o in g.outputs() {
            named[o.node.index()] += 1;
        }
        let mut outs = Vec::with_capacity(g.outputs().len());
        for o in g.outputs() {
            let i = o.node.index();
            named[i] -= 1;
            let t = match values.remove(&o.node) {
                Some(Val::Owned(t)) if named[i] == 0 => t,
                Some(Val::Owned(t)) => {
                    let t = t.into_shared();
                    values.insert(o.node, Val::Owned(t.clone()));
                    t
                }
                Some(Val::Borrowed(t)) => {
                    values.insert(o.node, Val::Borrowed(t));
                    t.clone()
                }
                None => unreachable!("outputs are kept until the end"),
            };
            outs.push((o.name.clone(), t));
        }
        stats.peak_bytes = peak;
        stats.polls = polls.load(Ordering::Relaxed);
        Ok((outs, stats))
    }

    /// The quantised product `leader` and its later siblings (`Plan::siblings`: the same A and
    /// definition, weights from the weight files) computed at once, leader first. The siblings' weights
    /// are fetched here, checked as their own source steps check them.
    fn siblings(
        &self,
        leader: NodeId,
        values: &Values<'_>,
        weights: &dyn WeightSource,
        pool: &Pool,
        poll: Poll<'_>,
    ) -> Result<Vec<(NodeId, HostTensor)>, ExecError> {
        let g = &self.graph;
        let ids: Vec<NodeId> = std::iter::once(leader)
            .chain(self.plan.siblings[&leader].iter().copied())
            .collect();
        let (mut a, mut dot) = (None, QDot::F32);
        let mut products = Vec::with_capacity(ids.len());
        for &id in &ids {
            let node = g.node(id);
            let Op::QMatMul {
                a: x,
                w,
                format,
                dot: d,
            } = node.op
            else {
                unreachable!("the planner groups only quantised products")
            };
            (a, dot) = (Some(x), d);
            let weight = match values.get(&w) {
                Some(v) => v.get(),
                None => {
                    let Op::Weight { file, tensor } = &g.node(w).op else {
                        unreachable!("the planner groups only products of file weights")
                    };
                    file_weight(weights, file, tensor, &g.node(w).ty)?
                }
            };
            products.push((&node.ty, weight, format));
        }
        let a = values
            .get(&a.expect("at least the leader"))
            .expect("operands are computed before use")
            .get();
        let made = quant::qmatmul_siblings(
            pool,
            self.device.level,
            self.device.threads,
            a,
            &products,
            dot,
            poll,
        )
        .map_err(|message| ExecError::Kernel {
            node: leader,
            message,
        })?;
        Ok(ids.into_iter().zip(made).collect())
    }

    fn step_kind(&self, step: &Step) -> &'static str {
        match step {
            Step::Source(_) => "source",
            Step::Gemm { .. } => "gemm",
            Step::Conv { .. } => "conv2d",
            Step::Fused(_) => "fused",
            Step::Rows { .. } => "rows",
            Step::Attention { .. } => "attention",
            Step::QMatMul(_) => "qmatmul",
            Step::Dequantize(_) => "dequantize",
            Step::Generic(id) => self.graph.node(*id).op.name(),
        }
    }

    /// If `step` reshapes an owned value whose last use it is, take that value re-typed.
    fn reshape_in_place(
        &self,
        s: usize,
        step: &Step,
        values: &mut Values<'_>,
    ) -> Option<(NodeId, HostTensor)> {
        let Step::Generic(id) = step else { return None };
        let node = self.graph.node(*id);
        let Op::Reshape { x } = node.op else {
            return None;
        };
        if !self.plan.release[s].contains(&x) || !matches!(values.get(&x), Some(Val::Owned(_))) {
            return None;
        }
        let Some(Val::Owned(t)) = values.remove(&x) else {
            return None;
        };
        match t.reshaped(node.ty.clone()) {
            Ok(t) => Some((*id, t)),
            Err(t) => {
                values.insert(x, Val::Owned(t));
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step<'a, T: Borrow<HostTensor>>(
        &self,
        step: &Step,
        values: &Values<'a>,
        inputs: &'a HashMap<String, T>,
        weights: &'a dyn WeightSource,
        seed: u64,
        pool: &Pool,
        poll: Poll<'_>,
    ) -> Result<(NodeId, Val<'a>), ExecError> {
        let g = &self.graph;
        let val = |id: NodeId| {
            values
                .get(&id)
                .expect("operands are computed before use")
                .get()
        };
        let threads = self.device.threads;
        Ok(match step {
            Step::Source(id) => {
                let node = g.node(*id);
                let v = match &node.op {
                    Op::Input { name } => Val::Borrowed(inputs[name].borrow()),
                    Op::Weight { file, tensor } => {
                        Val::Borrowed(file_weight(weights, file, tensor, &node.ty)?)
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
                // sums, f32 convolutions the kernels' GEMM, f32 pooling its own loops; everything else
                // is the reference's code.
                let value = if let Some(moved) =
                    movement::eval(pool, threads, *id, &node.op, &node.ty, &operands)
                {
                    moved?
                } else if let Some(selected) =
                    select::eval(pool, &node.op, &node.ty, &operands, threads)
                {
                    selected
                } else if let Some(sums) =
                    reduce::eval(pool, &node.op, &node.ty, &operands, threads, poll)
                {
                    sums
                } else if let Some(normalized) =
                    norms::eval(pool, &node.op, &node.ty, &operands, threads, poll)
                {
                    normalized
                } else if let Some(pooled) =
                    pool::eval(pool, &node.op, &node.ty, &operands, threads, poll)
                {
                    pooled
                } else if let Some(convolved) = conv::eval(
                    pool,
                    self.device.level,
                    &node.op,
                    &node.ty,
                    &operands,
                    threads,
                    poll,
                    None,
                ) {
                    convolved.map_err(|message| ExecError::Kernel { node: *id, message })?
                } else {
                    // The reference's code, asking `poll` as a long product, convolution or
                    // pooling goes.
                    eval_op_polled(*id, &node.op, &node.ty, &operands, seed, &poll).map_err(
                        |e| match e {
                            RunError::Stopped => ExecError::Stopped,
                            e => e.into(),
                        },
                    )?
                };
                (*id, Val::Owned(value))
            }
            Step::QMatMul(id) | Step::Dequantize(id) => {
                let node = g.node(*id);
                let level = self.device.level;
                let t = match node.op {
                    Op::QMatMul { a, w, format, dot } => {
                        let (a, w) = (val(a), val(w));
                        quant::qmatmul(pool, level, threads, &node.ty, a, w, format, dot, poll)
                    }
                    Op::Dequantize { x, format } => {
                        quant::dequantize(pool, level, threads, &node.ty, val(x), format, poll)
                    }
                    _ => unreachable!("the planner marks only qmatmul and dequantize so"),
                }
                .map_err(|message| ExecError::Kernel { node: *id, message })?;
                (*id, Val::Owned(t))
            }
            Step::Gemm {
                node: id,
                a_permuted,
                b_permuted,
                epilogue,
            } => {
                let t = self.gemm(*id, [*a_permuted, *b_permuted], epilogue, val, pool, poll)?;
                (*epilogue.last().unwrap_or(id), Val::Owned(t))
            }
            Step::Conv { node: id, epilogue } => {
                let node = g.node(*id);
                let operands: Vec<&HostTensor> =
                    node.op.operands().iter().map(|&o| val(o)).collect();
                // The epilogue's other operands (a scale, a shift); the output is in place.
                let externals =
                    externals(g, epilogue, &|o| if o == *id { None } else { Some(val(o)) });
                let group = fused::members_in_place(g, epilogue, &|o| &externals[&o][..], *id);
                let level = self.device.level;
                let then = |range: std::ops::Range<usize>, values: &mut [f32]| {
                    fused::eval_in_place(level, &group, range, values)
                };
                let t = conv::eval(
                    pool,
                    level,
                    &node.op,
                    &node.ty,
                    &operands,
                    threads,
                    poll,
                    Some(&then),
                )
                .expect("the planner folds only f32 convolutions")
                .map_err(|message| ExecError::Kernel { node: *id, message })?;
                (*epilogue.last().unwrap_or(id), Val::Owned(t))
            }
            Step::Attention {
                scores,
                softmax,
                out,
            } => {
                let gemm = |step: &Step| match *step {
                    Step::Gemm {
                        node,
                        a_permuted,
                        b_permuted,
                        ..
                    } => (node, [a_permuted, b_permuted]),
                    _ => unreachable!("the planner folds two GEMM steps into attention"),
                };
                let Step::Rows { node, prologue } = &**softmax else {
                    unreachable!("the planner folds a rows step into attention")
                };
                let (s, o) = (gemm(scores), gemm(out));
                let t = self.attention(s, (*node, prologue), o, val, pool, poll)?;
                (o.0, Val::Owned(t))
            }
            Step::Rows { node: id, prologue } => {
                let node = g.node(*id);
                let n = *node.ty.shape.last().unwrap_or(&1) as usize;
                let level = self.device.level;
                // The input: a tensor, or the prologue group computed block by block.
                let externals = externals(g, prologue, &|o| Some(val(o)));
                let group = (!prologue.is_empty())
                    .then(|| fused::members(g, prologue, &|o| &externals[&o][..]));
                let x = match &group {
                    None => RowsInput::Tensor(f32s(val(node.op.operands()[0]))),
                    Some(group) => RowsInput::Fused { level, group },
                };
                let t = match &node.op {
                    Op::Normalize { op, .. } => {
                        let log = *op == NormOp::LogSoftmax;
                        rows(pool, &node.ty, &x, n, threads, poll, |x, out| {
                            tenet_kernels::softmax::softmax_rows(level, log, x, n, out)
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
                        rows(pool, &node.ty, &x, n, threads, poll, |x, out| {
                            for (row, out) in x.chunks(n).zip(out.chunks_mut(n)) {
                                norm::layer_norm_row(level, row, affine, eps, out);
                            }
                        })
                    }
                    Op::RmsNorm {
                        gamma, eps_bits, ..
                    } => {
                        let gm = gamma.map(|o| f32s(val(o)));
                        let eps = f32::from_bits(*eps_bits);
                        rows(pool, &node.ty, &x, n, threads, poll, |x, out| {
                            for (row, out) in x.chunks(n).zip(out.chunks_mut(n)) {
                                norm::rms_norm_row(level, row, gm.as_deref(), eps, out);
                            }
                        })
                    }
                    _ => unreachable!("the planner only marks normalisations as rows"),
                };
                (*id, Val::Owned(t))
            }
            Step::Fused(ids) => {
                let last = *ids.last().expect("groups are non-empty");
                let ty = &g.node(last).ty;
                let externals = externals(g, ids, &|o| Some(val(o)));
                let group = fused::members(g, ids, &|o| &externals[&o][..]);
                let t = make_f32(pool, ty, |out| {
                    let level = self.device.level;
                    let stores = fused::Stores::for_result(std::mem::size_of_val(out));
                    par_chunks(out, threads, fused::CHUNK, |range, chunk| {
                        // An unfinished pass has asked `poll`, which marked the run stopped.
                        let _ = fused::eval_range(level, &group, range, chunk, stores, poll);
                    })
                });
                (last, Val::Owned(t))
            }
        })
    }

    /// A batched matmul's operands, addressed per batch entry. With `a_elsewhere` the left
    /// operand is not looked up (attention's probabilities live in scratch): its row-major
    /// layout is assumed and `Batched::a` must not be called.
    fn batched<'v>(
        &self,
        id: NodeId,
        permuted: [Option<NodeId>; 2],
        val: &impl Fn(NodeId) -> &'v HostTensor,
        a_elsewhere: bool,
    ) -> Batched<'v> {
        let node = self.graph.node(id);
        let Op::MatMul { a, b } = node.op else {
            unreachable!("gemm steps are matmuls")
        };
        let r = node.ty.rank();
        let batch: Vec<u64> = node.ty.shape[..r - 2].to_vec();
        let (a_shape, b_shape) = (&self.graph.node(a).ty.shape, &self.graph.node(b).ty.shape);
        let (av, a_strides) = if a_elsewhere {
            (Cow::Borrowed(&[][..]), movement::strides(a_shape))
        } else {
            let (ta, strides) = self.operand(a, permuted[0], val);
            (f32s(ta), strides)
        };
        let (tb, b_strides) = self.operand(b, permuted[1], val);
        let ra = a_shape.len();
        // Each operand's step per output batch axis (0 where it broadcasts): an entry's
        // offset is computed when it runs, not listed (a list is 16 bytes per entry, more
        // than the certificate counts for a batch of 1 × 1 products).
        let steps = |shape: &[u64], strides: &[usize]| -> Vec<usize> {
            let own = &shape[..shape.len() - 2];
            let pad = batch.len() - own.len();
            (0..batch.len())
                .map(|d| {
                    if d >= pad && own[d - pad] != 1 {
                        strides[d - pad]
                    } else {
                        0
                    }
                })
                .collect()
        };
        let rb = b_shape.len();
        Batched {
            m: a_shape[ra - 2] as usize,
            k: a_shape[ra - 1] as usize,
            n: node.ty.shape[r - 1] as usize,
            a_steps: steps(a_shape, &a_strides),
            b_steps: steps(b_shape, &b_strides),
            batch: batch.iter().map(|&d| d as usize).collect(),
            a_strides: (a_strides[ra - 2], a_strides[ra - 1]),
            b_strides: (b_strides[rb - 2], b_strides[rb - 1]),
            av,
            bv: f32s(tb),
        }
    }

    /// A GEMM step: the batched product, then `epilogue` (an elementwise group that alone
    /// reads it) in place over each block of rows as the GEMM finishes it.
    #[allow(clippy::too_many_arguments)]
    fn gemm<'v>(
        &self,
        id: NodeId,
        permuted: [Option<NodeId>; 2],
        epilogue: &[NodeId],
        val: impl Fn(NodeId) -> &'v HostTensor,
        pool: &Pool,
        poll: Poll<'_>,
    ) -> Result<HostTensor, ExecError> {
        let g = &self.graph;
        let node = g.node(id);
        let op = self.batched(id, permuted, &val, false);
        // The epilogue's other operands (a bias, a residual); the product is in C.
        let externals = externals(g, epilogue, &|o| if o == id { None } else { Some(val(o)) });
        let group = fused::members_in_place(g, epilogue, &|o| &externals[&o][..], id);
        let (m, n, k) = (op.m, op.n, op.k);
        // Many small products (attention heads): one thread per group of batches. Few large
        // ones: every thread inside each product. Either way each element has one fma chain.
        let batches = op.batches();
        let work = batches
            .saturating_mul(m)
            .saturating_mul(n)
            .saturating_mul(k);
        let (outer, inner) = if work < MIN_SHARED_GEMM_WORK {
            (1, 1)
        } else if batches >= self.device.threads {
            (self.device.threads, 1)
        } else {
            (1, self.device.threads)
        };
        let slab = slab_rows(m, n, k);
        let level = self.device.level;
        let failed = std::sync::Mutex::new(None);
        let t = make_f32(pool, &node.ty, |out| {
            par_chunks(out, outer, m * n, |range, chunk| {
                let first = range.start / (m * n).max(1);
                for (bi, c) in chunk.chunks_mut((m * n).max(1)).enumerate() {
                    if poll() {
                        return;
                    }
                    let at = first + bi;
                    let (a, b) = (op.a(at), op.b(at));
                    // A large product runs a slab of rows at a time, asking `poll` between
                    // slabs; each row's chains are the same whichever slab computes it.
                    for r0 in (0..m).step_by(slab) {
                        if r0 > 0 && poll() {
                            return;
                        }
                        let rows = slab.min(m - r0);
                        let a = Strided {
                            data: &a.data[(r0 * a.rs).min(a.data.len())..],
                            ..a
                        };
                        let then = |row: usize, rows: &mut [f32]| {
                            let origin = at * m * n + (r0 + row) * n;
                            let range = origin..origin + rows.len();
                            fused::eval_in_place(level, &group, range, rows);
                        };
                        let then = (!epilogue.is_empty()).then_some(&then as Epilogue<'_>);
                        let c = &mut c[r0 * n..(r0 + rows) * n];
                        if let Err(e) = sgemm_then(level, inner, rows, n, k, a, b, c, n, then) {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        }
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

    /// [`Step::Attention`]: for each batch entry, on the thread that owns it, the scores into
    /// a scratch matrix, the prologue and softmax row by row into a second one, then the
    /// product with V into the output. Every part is the kernel its unfused step runs.
    fn attention<'v>(
        &self,
        scores: (NodeId, [Option<NodeId>; 2]),
        softmax: (NodeId, &[NodeId]),
        out: (NodeId, [Option<NodeId>; 2]),
        val: impl Fn(NodeId) -> &'v HostTensor,
        pool: &Pool,
        poll: Poll<'_>,
    ) -> Result<HostTensor, ExecError> {
        let g = &self.graph;
        let (s_id, (p_id, prologue), o_id) = (scores.0, softmax, out.0);
        let qk = self.batched(s_id, scores.1, &val, false);
        let pv = self.batched(o_id, out.1, &val, true);
        let (m, n1, n2) = (qk.m, qk.n, pv.n);
        debug_assert_eq!((pv.m, pv.k), (m, n1));
        let log = matches!(
            g.node(p_id).op,
            Op::Normalize {
                op: NormOp::LogSoftmax,
                ..
            }
        );
        // The prologue's other operands (the mask, the scale); the scores come from scratch.
        let externals: HashMap<NodeId, Cow<'v, [f32]>> = externals(g, prologue, &|o| {
            if o == s_id { None } else { Some(val(o)) }
        });
        let group = fused::members_in_place(g, prologue, &|o| &externals[&o][..], s_id);
        let level = self.device.level;
        let batches = qk.batches();
        let outer = self.device.threads.clamp(1, batches.max(1));
        let failed = std::sync::Mutex::new(None);
        let fail = |id: NodeId, e: tenet_kernels::gemm::GemmError| {
            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some((id, e.to_string()));
        };
        let t = make_f32(pool, &g.node(o_id).ty, |o| {
            par_chunks(o, outer, m * n2, |range, chunk| {
                let first = range.start / (m * n2).max(1);
                let (mut s, mut p) = (vec![0.0; m * n1], vec![0.0; m * n1]);
                for (bi, c) in chunk.chunks_mut((m * n2).max(1)).enumerate() {
                    if poll() {
                        return;
                    }
                    let at = first + bi;
                    if let Err(e) = sgemm(level, 1, m, n1, qk.k, qk.a(at), qk.b(at), &mut s, n1) {
                        return fail(s_id, e);
                    }
                    // The softmax's input: the scores, or the prologue over them (in place).
                    if !prologue.is_empty() {
                        let origin = at * m * n1;
                        fused::eval_in_place(level, &group, origin..origin + m * n1, &mut s);
                    }
                    tenet_kernels::softmax::softmax_rows(level, log, &s, n1, &mut p);
                    let probs = Strided::row_major(&p, n1);
                    if let Err(e) = sgemm(level, 1, m, n2, n1, probs, pv.b(at), c, n2) {
                        return fail(o_id, e);
                    }
                }
            })
        });
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((node, message)) => Err(ExecError::Kernel { node, message }),
            None => Ok(t),
        }
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

/// f32 views of the operands a fused group reads from outside itself, kept alive for its pass,
/// where `val` has them (`None`: supplied some other way).
/// Weight `tensor` of `file` from `weights`, of type `ty` as the graph says: a missing one or
/// one of another type is the reference's error.
fn file_weight<'w>(
    weights: &'w dyn WeightSource,
    file: &tenet_ir::WeightsId,
    tensor: &str,
    ty: &tenet_ir::TensorType,
) -> Result<&'w HostTensor, ExecError> {
    let w = weights
        .weight(file, tensor)
        .ok_or_else(|| RunError::MissingWeight {
            file: file.to_hex(),
            tensor: tensor.to_string(),
        })?;
    if w.ty() != ty {
        return Err(RunError::WeightType {
            tensor: tensor.to_string(),
            expected: ty.clone(),
            actual: w.ty().clone(),
        }
        .into());
    }
    Ok(w)
}

fn externals<'v>(
    g: &Graph,
    ids: &[NodeId],
    val: &impl Fn(NodeId) -> Option<&'v HostTensor>,
) -> HashMap<NodeId, Cow<'v, [f32]>> {
    let inside: std::collections::HashSet<NodeId> = ids.iter().copied().collect();
    ids.iter()
        .flat_map(|&id| g.node(id).op.operands())
        .filter(|o| !inside.contains(o))
        .filter_map(|o| Some((o, f32s(val(o)?))))
        .collect()
}

/// A batched matmul's operands: entry `i` multiplies A from `offset(i, a_steps)` by B from
/// `offset(i, b_steps)`.
struct Batched<'v> {
    av: Cow<'v, [f32]>,
    bv: Cow<'v, [f32]>,
    /// The output's batch axes, and each operand's element step along them.
    batch: Vec<usize>,
    a_steps: Vec<usize>,
    b_steps: Vec<usize>,
    /// (row, column) strides of A and of B.
    a_strides: (usize, usize),
    b_strides: (usize, usize),
    m: usize,
    n: usize,
    k: usize,
}

impl Batched<'_> {
    fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// Flat offset of batch entry `flat` in an operand with `steps`.
    fn offset(&self, flat: usize, steps: &[usize]) -> usize {
        let (mut rem, mut off) = (flat, 0usize);
        for d in (0..self.batch.len()).rev() {
            off += rem % self.batch[d] * steps[d];
            rem /= self.batch[d];
        }
        off
    }

    // An empty operand (a permuted view of a tensor with a zero dimension can still have
    // nonzero steps) is read nowhere: its offset is clamped to its end.
    fn a(&self, i: usize) -> Strided<'_> {
        Strided {
            data: &self.av[self.offset(i, &self.a_steps).min(self.av.len())..],
            rs: self.a_strides.0,
            cs: self.a_strides.1,
        }
    }

    fn b(&self, i: usize) -> Strided<'_> {
        Strided {
            data: &self.bv[self.offset(i, &self.b_steps).min(self.bv.len())..],
            rs: self.b_strides.0,
            cs: self.b_strides.1,
        }
    }
}

/// The input of a rows step.
enum RowsInput<'a> {
    Tensor(Cow<'a, [f32]>),
    /// A fused group of the output's shape, evaluated a block of rows at a time.
    Fused {
        level: SimdLevel,
        group: &'a fused::Group<'a>,
    },
}

/// Elements of a fused prologue computed at once: a block of rows that stays in L2.
const PROLOGUE_BLOCK: usize = 8 * fused::CHUNK;

/// Apply a row function over the last axis (`n` elements per row) on several threads: `f`
/// gets blocks of whole rows and their outputs, and must leave computed NaNs canonical.
/// `poll` is asked between blocks of about [`fused::POLL_ELEMENTS`] elements.
fn rows(
    pool: &Pool,
    ty: &tenet_ir::TensorType,
    x: &RowsInput<'_>,
    n: usize,
    threads: usize,
    poll: Poll<'_>,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) -> HostTensor {
    make_f32(pool, ty, |out| {
        if n == 0 {
            return;
        }
        par_chunks(out, threads, n, |range, chunk| match x {
            RowsInput::Tensor(x) => {
                let block = fused::POLL_ELEMENTS.max(n) / n * n;
                for (b, o) in chunk.chunks_mut(block).enumerate() {
                    if b > 0 && poll() {
                        return;
                    }
                    let start = range.start + b * block;
                    f(&x[start..start + o.len()], o);
                }
            }
            RowsInput::Fused { level, group } => {
                let block = PROLOGUE_BLOCK.max(n) / n * n;
                let mut input = vec![0.0f32; block.min(range.len())];
                for (b, o) in chunk.chunks_mut(block).enumerate() {
                    if b > 0 && b % (fused::POLL_ELEMENTS / PROLOGUE_BLOCK).max(1) == 0 && poll() {
                        return;
                    }
                    let start = range.start + b * block;
                    let input = &mut input[..o.len()];
                    // A prologue's values are read at once by the row kernel: keep them cached.
                    let (range, stores) = (start..start + o.len(), fused::Stores::Cached);
                    if !fused::eval_range(*level, group, range, input, stores, poll) {
                        return;
                    }
                    f(input, o);
                }
            }
        })
    })
}

/// Multiply-adds below which a product (all its batch entries) runs on the calling thread:
/// handing a few microseconds of work to a second thread costs about as much as it saves (a
/// decode step's attention products, `[3, 3, 64] · [3, 64, 64]`, ran 0.79 ms a token on one
/// thread and 0.93 shared between two).
const MIN_SHARED_GEMM_WORK: usize = 1 << 18;

/// Rows of one product computed between two polls of the stop flag: about `SLAB_FLOPS`
/// operations (a few hundred ms), and never fewer than 1,024 rows, so that packing B again
/// for each slab costs little. Products up to `SLAB_FLOPS` run whole, as before.
const SLAB_FLOPS: usize = 1 << 34;

/// Beyond this `k`, one packed panel of B (48 columns × k) would outgrow the GEMM's 24 MiB
/// packing budget by a factor the certificate does not count; such products run four rows at
/// a time on the unpacked few-rows kernel instead (same chains, same bits).
pub(crate) const BIG_K: usize = 1 << 17;

fn slab_rows(m: usize, n: usize, k: usize) -> usize {
    if k > BIG_K {
        return 4;
    }
    let per_row = 2usize.saturating_mul(n).saturating_mul(k).max(1);
    (SLAB_FLOPS / per_row).max(1024).min(m.max(1))
}
