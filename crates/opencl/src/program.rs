//! A graph compiled for an OpenCL device: its plan, the kernel programs it needs (built, or
//! found already built, at compile), its constants and meta buffer uploaded once; and a run,
//! which enqueues every launch in graph order on the device's queue, releases each value
//! after its last reader (a reader folded into a later launch reads at that launch), and
//! reads the gather flags once at the end. A graph with fused chains has one more program,
//! its chains' generated kernels (`Family::Fused`), built at compile or found by its text;
//! a device that refuses it (past its bound of such programs) gets the graph planned unfused.
//!
//! Folded nodes hold no memory, and the values they read are held until the launch that
//! computes them: at a fused chain's launch exactly the values the certificate counts live at
//! its first member's step are live (the chain's operands all precede it), with its result in
//! place of the first member's, of the same size; a folded permutation's source is held in
//! place of the permutation, of the same size. So the run's peak stays within the certificate's.
//!
//! Memory bound: the certificate's `peak_bytes`, plus what this program keeps on the device
//! beside the tensors the certificate counts: its constants for the program's whole life (the
//! certificate frees them after their last use), its meta buffer, 12 bytes per gather for the
//! index check, and a fixed 64-byte placeholder. Weights live in the device's weight cache,
//! inside the certificate's count while a run uses them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use opencl3::kernel::Kernel;
use opencl3::program::Program as ClProgram;
use tenet_exec::{Buffer, Device, ExecError, Program, RunStats};
use tenet_ir::{Graph, NodeId, TensorType, WeightSource};
use tenet_reference::RunError;

use crate::cl_api::{KernelArg, Mem, Range, cl_err, launch_range};
use crate::device::{Handle, OpenClDevice};
use crate::kernels::Family;
use crate::plan::{self, Arg, Grid, Plan, Source};

/// Fixed bytes of a run beside its tensors (the placeholder buffer).
pub const RUN_FIXED: u64 = 64;
/// Bytes per gather for the run's index check (an `int` position and a `long` value).
pub const PER_GATHER: u64 = 12;
/// The most work items one launch asks for; kernels walk larger index spaces in
/// grid-stride loops.
const MAX_ITEMS: u64 = 1 << 20;
/// Element operations a run enqueues before it waits for the device, so that its `stop`
/// function, asked between steps, is asked as the device progresses rather than only as
/// commands are enqueued.
const SYNC_WORK: u64 = 1 << 26;

pub(crate) struct GraphProgram {
    device: OpenClDevice,
    graph: Graph,
    plan: Plan,
    programs: HashMap<Family, Arc<ClProgram>>,
    meta: Option<Mem>,
    constants: Vec<Handle>,
    /// For each step, the values (by node) that are dead after it, as the certificate counts.
    release: Vec<Vec<NodeId>>,
    memory_bound: u64,
    /// The kernel objects of earlier runs with their work-group sizes, by name: creating
    /// them costs a driver call each, and kernel arguments are set per launch, so a run
    /// holds this lock throughout (runs share the device's one queue anyway).
    kernels: Mutex<HashMap<String, (Kernel, usize)>>,
}

impl GraphProgram {
    pub(crate) fn compile(device: &OpenClDevice, graph: &Graph) -> Result<GraphProgram, ExecError> {
        let inner = &device.inner;
        let mut plan = plan::plan(graph, &device.caps());
        let constant_bytes: u64 = plan.constants.iter().map(|(_, d)| d.len() as u64).sum();
        let scratch = constant_bytes
            .saturating_add(8 * plan.meta.len() as u64)
            .saturating_add(PER_GATHER * plan.gathers.len() as u64)
            .saturating_add(RUN_FIXED);
        let memory_bound = graph.cost().peak_bytes.saturating_add(scratch);
        let limit = inner.info.memory;
        if memory_bound > limit {
            return Err(ExecError::TooLarge {
                needed: memory_bound,
                limit,
            });
        }
        if let Some(big) = graph
            .nodes()
            .iter()
            .map(|n| n.ty.bytes().unwrap_or(u64::MAX))
            .find(|&b| b > inner.max_alloc)
        {
            return Err(ExecError::Device(format!(
                "a tensor of {big} bytes exceeds the device's largest allocation ({} bytes)",
                inner.max_alloc
            )));
        }
        if plan
            .gathers
            .iter()
            .any(|g| index_count(graph, *g) > i32::MAX as u64)
            || plan.gathers.len() > i32::MAX as usize
        {
            return Err(ExecError::Device(
                "a gather with more than 2^31 indices is not supported on OpenCL".into(),
            ));
        }
        // An SGEMM tile (or `k_gemv`) needs its whole work group: a device that cannot run
        // one (too few registers for its items, say) gets the graph planned again without it.
        let uses_gemm = plan.nodes.iter().any(|n| {
            n.launches
                .iter()
                .any(|l| l.family == Family::Linalg && l.grid != Grid::Items)
        });
        if uses_gemm && device.check_gemm(&*device.program(Family::Linalg)?) {
            // Every product kernel is in the Linalg program already built.
            plan = plan::plan(graph, &device.caps());
        }
        // The graph's fused chains, built as one program; a device that builds no more of
        // them (or fails to) runs the graph unfused.
        let mut fused = None;
        if !plan.fused.is_empty() {
            fused = device.fused_program(&plan.fused);
            if fused.is_none() {
                let mut caps = device.caps();
                caps.fuse = false;
                plan = plan::plan(graph, &caps);
            }
        }
        let mut programs = HashMap::new();
        for n in &plan.nodes {
            for l in &n.launches {
                if let std::collections::hash_map::Entry::Vacant(e) = programs.entry(l.family) {
                    e.insert(match (l.family, &fused) {
                        (Family::Fused, Some(f)) => f.clone(),
                        (family, _) => device.program(family)?,
                    });
                }
            }
        }
        let meta = if plan.meta.is_empty() {
            None
        } else {
            let bytes: Vec<u8> = plan.meta.iter().flat_map(|v| v.to_le_bytes()).collect();
            let m = Mem::alloc(&inner.context, bytes.len() as u64)?;
            m.write(&inner.queue, 0, &bytes)?;
            Some(m)
        };
        let mut constants = Vec::with_capacity(plan.constants.len());
        for (_, data) in &plan.constants {
            let h = device.alloc(data.len() as u64)?;
            if let Some(m) = &h.0 {
                m.write(&inner.queue, 0, data)?;
            }
            constants.push(h);
        }
        let release = release_schedule(graph, &plan);
        Ok(GraphProgram {
            device: device.clone(),
            graph: graph.clone(),
            plan,
            programs,
            meta,
            constants,
            release,
            memory_bound,
            kernels: Mutex::default(),
        })
    }

    /// The first failed gather among slots `..upto` (in graph order), as the reference reports
    /// it. Waits for the queue.
    fn gather_error(
        &self,
        flags: &Option<Mem>,
        values: &Option<Mem>,
        upto: usize,
    ) -> Result<Option<ExecError>, ExecError> {
        let (Some(flags), Some(values)) = (flags, values) else {
            return Ok(None);
        };
        if upto == 0 {
            return Ok(None);
        }
        let queue = &self.device.inner.queue;
        let mut pos = vec![0u8; 4 * upto];
        flags.read(queue, 0, &mut pos)?;
        for slot in 0..upto {
            let p = i32::from_le_bytes(pos[4 * slot..4 * slot + 4].try_into().expect("4 bytes"));
            if p == i32::MAX {
                continue;
            }
            let mut v = [0u8; 8];
            values.read(queue, 8 * slot as u64, &mut v)?;
            let node = self.plan.gathers[slot];
            let size = match &self.graph.node(node).op {
                tenet_ir::Op::Gather { x, axis, .. } => {
                    self.graph.node(*x).ty.shape[*axis as usize]
                }
                _ => 0,
            };
            return Ok(Some(ExecError::Run(RunError::IndexOutOfRange {
                node,
                index: i64::from_le_bytes(v),
                size,
            })));
        }
        Ok(None)
    }

    /// Check the named inputs against the graph's, as the reference does (same errors).
    fn check_inputs(&self, inputs: &HashMap<String, Buffer>) -> Result<(), ExecError> {
        for (_, name, ty) in self.graph.inputs() {
            match inputs.get(name) {
                None => {
                    return Err(RunError::MissingInput {
                        name: name.to_string(),
                        expected: ty.clone(),
                    }
                    .into());
                }
                Some(b) if b.ty() != ty => {
                    return Err(RunError::InputType {
                        name: name.to_string(),
                        expected: ty.clone(),
                        actual: b.ty().clone(),
                    }
                    .into());
                }
                Some(b) => {
                    self.device.handle(b)?;
                }
            }
        }
        let known: Vec<&str> = self.graph.inputs().map(|(_, n, _)| n).collect();
        let mut given: Vec<&String> = inputs.keys().collect();
        given.sort();
        if let Some(extra) = given.into_iter().find(|n| !known.contains(&n.as_str())) {
            return Err(RunError::UnknownInput {
                name: extra.clone(),
                known: known.join(", "),
            }
            .into());
        }
        Ok(())
    }
}

fn index_count(graph: &Graph, gather: NodeId) -> u64 {
    match &graph.node(gather).op {
        tenet_ir::Op::Gather { indices, .. } => graph.node(*indices).ty.numel().unwrap_or(0),
        _ => 0,
    }
}

/// After which step each value stops counting, as the certificate counts (a source from the
/// start, any other node from its step, each to its last reader; outputs never). A reader
/// folded into a later launch (a fused chain's member, a permutation a product reads through
/// strides) reads at that launch's step; folded nodes hold no memory and are never released.
fn release_schedule(graph: &Graph, plan: &Plan) -> Vec<Vec<NodeId>> {
    let n = graph.nodes().len();
    let mut last = vec![0usize; n];
    for (i, node) in graph.nodes().iter().enumerate() {
        for o in node.op.operands() {
            last[o.index()] = last[o.index()].max(plan.step_of[i]);
        }
    }
    let mut output = vec![false; n];
    for o in graph.outputs() {
        output[o.node.index()] = true;
    }
    let mut release = vec![Vec::new(); n];
    for (j, node) in graph.nodes().iter().enumerate() {
        if output[j] || matches!(plan.nodes[j].source, Source::Folded) {
            continue;
        }
        let start = if node.op.is_source() { 0 } else { j };
        release[last[j].max(start)].push(NodeId(j as u32));
    }
    release
}

fn bytes(ty: &TensorType) -> u64 {
    ty.bytes().unwrap_or(0)
}

impl Program for GraphProgram {
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
        let started = Instant::now();
        self.check_inputs(inputs)?;
        let dev = &self.device;
        let inner = &dev.inner;
        // Buffers kept for reuse count against the device's memory too: a run that could
        // need their room gets it back first.
        if self.memory_bound.saturating_add(inner.pool.held()) > inner.info.memory {
            inner.pool.drain();
        }
        let queue = &inner.queue;
        let nodes = self.graph.nodes();
        let mut stats = RunStats::default();

        // Per-run gather flags: the first bad position (i32::MAX: none) and its index value.
        let slots = self.plan.gathers.len() as u64;
        let (flags, flag_values) = if slots > 0 {
            let f = Mem::alloc(&inner.context, 4 * slots)?;
            f.fill(queue, &i32::MAX.to_le_bytes(), 0, 4 * slots)?;
            let v = Mem::alloc(&inner.context, 8 * slots)?;
            (Some(f), Some(v))
        } else {
            (None, None)
        };

        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        // With profiling on, each launch's kernel and event, for the report after the run.
        let mut timed: Vec<(String, opencl3::event::Event)> = Vec::new();
        let mut values: Vec<Option<Handle>> = vec![None; nodes.len()];
        // Live tensor bytes as the certificate counts them: sources from the start.
        let mut live: u64 = nodes
            .iter()
            .filter(|n| n.op.is_source())
            .map(|n| bytes(&n.ty))
            .sum();
        let mut peak = live;
        let mut pending = 0u64;
        for (i, (node, np)) in nodes.iter().zip(&self.plan.nodes).enumerate() {
            if pending >= SYNC_WORK {
                queue.finish().map_err(|e| cl_err("running the graph", e))?;
                pending = 0;
            }
            stats.polls += 1;
            if stop() {
                return Err(ExecError::Stopped);
            }
            if !np.launches.is_empty() {
                pending = pending.saturating_add(np.work);
            }
            let value = match &np.source {
                Source::Input(name) => dev.handle(&inputs[name])?.clone(),
                Source::Weight(file, tensor) => {
                    // A tensor of the wrong type is refused before it takes device memory.
                    let got = inner.weights.get_or_upload(file, tensor, weights, |t| {
                        if t.ty() != &node.ty {
                            return Err(RunError::WeightType {
                                tensor: tensor.clone(),
                                expected: node.ty.clone(),
                                actual: t.ty().clone(),
                            }
                            .into());
                        }
                        dev.upload(t)
                    });
                    let slot = self.plan.gathers.partition_point(|g| g.index() < i);
                    let fail = |e: ExecError| -> ExecError {
                        match self.gather_error(&flags, &flag_values, slot) {
                            Ok(Some(g)) => g,
                            Ok(None) => e,
                            Err(d) => d,
                        }
                    };
                    let b = got.map_err(fail)?;
                    if b.ty() != &node.ty {
                        return Err(fail(
                            RunError::WeightType {
                                tensor: tensor.clone(),
                                expected: node.ty.clone(),
                                actual: b.ty().clone(),
                            }
                            .into(),
                        ));
                    }
                    dev.handle(&b)?.clone()
                }
                Source::Constant(k) => self.constants[*k].clone(),
                Source::Alias(x) => values[x.index()].clone().expect("operands precede users"),
                Source::Folded => Handle(None),
                Source::Computed => {
                    let h = dev.alloc(bytes(&node.ty))?;
                    live += bytes(&node.ty);
                    peak = peak.max(live);
                    h
                }
            };
            if matches!(np.source, Source::Alias(_)) {
                live += bytes(&node.ty);
                peak = peak.max(live);
            }
            if let (Some(pattern), Some(m)) = (&np.fill, &value.0) {
                m.fill(queue, pattern, 0, m.bytes())?;
            }
            for l in &np.launches {
                if l.items == 0 {
                    continue;
                }
                let name: &str = &l.kernel;
                if !kernels.contains_key(name) {
                    let k = Kernel::create(&self.programs[&l.family], name)
                        .map_err(|e| cl_err(&format!("creating kernel {}", l.kernel), e))?;
                    // A fixed group size: drivers that specialise a kernel per group size
                    // (PoCL compiles each one, ~0.3 s) then do so once per kernel.
                    let most = k.get_work_group_size(inner.device.id()).unwrap_or(1);
                    if let Grid::Groups { group, .. } = l.grid
                        && most < group as usize
                    {
                        return Err(ExecError::Device(format!(
                            "{} needs work groups of {group} items; this device runs {most}",
                            l.kernel
                        )));
                    }
                    kernels.insert(name.to_string(), (k, most.clamp(1, 64)));
                }
                let (kernel, group) = &kernels[name];
                fn mem<'a>(h: &'a Handle, dummy: &'a Mem) -> KernelArg<'a> {
                    KernelArg::Mem(h.0.as_deref().unwrap_or(dummy))
                }
                let dummy = &inner.dummy;
                let value_of = |x: &NodeId| values[x.index()].as_ref().expect("operands precede");
                let args: Vec<KernelArg<'_>> = l
                    .args
                    .iter()
                    .map(|a| match *a {
                        Arg::Out => mem(&value, dummy),
                        Arg::Value(x) => mem(value_of(&x), dummy),
                        Arg::MaybeValue(Some(x)) => mem(value_of(&x), dummy),
                        Arg::MaybeValue(None) => KernelArg::Mem(&inner.dummy),
                        Arg::Meta => KernelArg::Mem(self.meta.as_ref().unwrap_or(&inner.dummy)),
                        Arg::GatherFlags => KernelArg::Mem(flags.as_ref().unwrap_or(&inner.dummy)),
                        Arg::GatherValues => {
                            KernelArg::Mem(flag_values.as_ref().unwrap_or(&inner.dummy))
                        }
                        Arg::GatherSlot => KernelArg::I32(np.gather_slot.unwrap_or(0) as i32),
                        Arg::Seed => KernelArg::U64(seed),
                        Arg::U64(v) => KernelArg::U64(v),
                        Arg::I64(v) => KernelArg::I64(v),
                        Arg::I32(v) => KernelArg::I32(v),
                        Arg::U32(v) => KernelArg::U32(v),
                    })
                    .collect();
                let range = match l.grid {
                    Grid::Groups { group, groups } => Range::Groups {
                        global: [groups[0] as usize * group as usize, groups[1] as usize, 1],
                        local: [group as usize, 1, 1],
                    },
                    Grid::Items => {
                        let g = *group as u64;
                        let n = l.items.min(MAX_ITEMS).div_ceil(g) * g;
                        Range::Groups {
                            global: [n as usize, 1, 1],
                            local: [g as usize, 1, 1],
                        }
                    }
                };
                let event = launch_range(queue, kernel, &args, range)?;
                if inner.profile {
                    timed.push((l.kernel.to_string(), event));
                }
            }
            values[i] = Some(value);
            for &r in &self.release[i] {
                values[r.index()] = None;
                live = live.saturating_sub(bytes(&nodes[r.index()].ty));
            }
        }
        let enqueued = started.elapsed();
        queue.finish().map_err(|e| cl_err("running the graph", e))?;
        if inner.profile {
            let times = (enqueued, started.elapsed());
            report_profile(&self.graph, &timed, times, inner.pool.held())?;
        }
        if let Some(e) = self.gather_error(&flags, &flag_values, self.plan.gathers.len())? {
            return Err(e);
        }
        let outputs = self
            .graph
            .outputs()
            .iter()
            .map(|o| {
                let h = values[o.node.index()].clone().expect("outputs are kept");
                (
                    o.name.clone(),
                    dev.buffer(nodes[o.node.index()].ty.clone(), h),
                )
            })
            .collect();
        stats.peak_bytes = peak;
        stats.add_time("opencl", started.elapsed().as_nanos() as u64);
        Ok((outputs, stats))
    }
}

/// `TENET_OPENCL_PROFILE=1`: the device time of a run's kernels, summed by kernel and printed
/// to stderr, longest first, beside the run's wall time (which adds launch and host costs) and
/// the time its commands took to enqueue.
fn report_profile(
    graph: &Graph,
    timed: &[(String, opencl3::event::Event)],
    (enqueued, wall): (std::time::Duration, std::time::Duration),
    pooled: u64,
) -> Result<(), ExecError> {
    let mut by_kernel: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut total = 0u64;
    for (name, event) in timed {
        let ns = crate::cl_api::device_nanos(event)?;
        let e = by_kernel.entry(name).or_default();
        e.0 += 1;
        e.1 += ns;
        total += ns;
    }
    let mut rows: Vec<_> = by_kernel.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let mut out = format!(
        "opencl profile: {} nodes, {} launches, {:.3} ms on the device, {:.3} ms wall \
         (all enqueued after {:.3} ms), {:.1} MB of buffers pooled\n",
        graph.nodes().len(),
        timed.len(),
        total as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        enqueued.as_secs_f64() * 1e3,
        pooled as f64 / 1e6
    );
    for (name, (count, ns)) in rows {
        out.push_str(&format!(
            "  {name:<28} {count:>6} launches {:>10.3} ms\n",
            ns as f64 / 1e6
        ));
    }
    eprint!("{out}");
    Ok(())
}
