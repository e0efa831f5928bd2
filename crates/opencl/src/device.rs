//! `OpenClDevice`: one OpenCL device opened for tenet: its context and queue, its kernel
//! tuning (from its largest work group and local memory), the programs built for it (by
//! source text, so a kernel family is built once per device), its weight cache, and the
//! `tenet_exec::Device` operations on its buffers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{
    CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
    Device as ClDevice,
};
use opencl3::error_codes::{CL_DEVICE_NOT_FOUND, CL_PLATFORM_NOT_FOUND_KHR};
use opencl3::kernel::Kernel;
use opencl3::platform::{Platform, get_platforms};
use opencl3::program::Program as ClProgram;
use tenet_exec::{
    Buffer, Device, DeviceClass, DeviceInfo, ExecError, Program, WeightCache, next_device_id,
};
use tenet_ir::{Graph, HostTensor, TensorType};

use crate::cl_api::{Mem, MemPool, cl_err};
use crate::kernels::{Family, GEMV_T, GemmTile, Tuning};
use crate::plan::{Caps, Gemv};
use crate::source::{self, Quirks};

/// What a [`Buffer`] made by an OpenCL device holds: its device memory, or nothing for an
/// empty tensor (OpenCL has no empty buffers). Clones share the memory: buffers are values,
/// and [`Device::write`] copies a shared one before writing.
#[derive(Clone, Debug)]
pub(crate) struct Handle(pub(crate) Option<Arc<Mem>>);

/// The most programs of fused elementwise chains a device builds (one per distinct set of a
/// graph's chains); graphs with new chains past it run unfused.
const MAX_FUSED_PROGRAMS: u64 = 64;

/// Set to `1`, runs print how long each kernel took on the device (see [`Inner::profile`]).
pub const PROFILE_ENV: &str = "TENET_OPENCL_PROFILE";

/// The share of device memory that buffers kept for reuse may hold.
const POOL_SHARE_DIVISOR: u64 = 8;

/// The share of device memory the weight cache may hold.
const WEIGHT_SHARE_DIVISOR: u64 = 2;

/// An OpenCL device opened for tenet. Cheap to clone (clones share the device).
#[derive(Clone)]
pub struct OpenClDevice {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) info: DeviceInfo,
    pub(crate) quirks: Quirks,
    pub(crate) context: Context,
    /// One in-order queue: commands of every run and transfer execute in the order enqueued.
    pub(crate) queue: CommandQueue,
    /// `TENET_OPENCL_PROFILE=1`: the queue records each command's device time and every run
    /// prints its kernels' totals to stderr.
    pub(crate) profile: bool,
    /// Buffers of finished runs, for the next (see [`MemPool`]).
    pub(crate) pool: Arc<MemPool>,
    pub(crate) device: ClDevice,
    /// The largest single allocation the driver allows.
    pub(crate) max_alloc: u64,
    /// What the kernels' sources take from the device's limits.
    pub(crate) tuning: Tuning,
    /// The SGEMM tiles whose kernels the built program can run in their whole work group
    /// (asked once, after the first build of the Linalg family).
    gemm_usable: Mutex<Option<Vec<GemmTile>>>,
    /// Whether the built program runs `k_gemv` in its whole work group (asked with the tiles).
    gemv_usable: Mutex<Option<bool>>,
    /// Programs of fused chains built (or refused by the driver) so far.
    fused_programs: AtomicU64,
    /// For tests and timings: graphs compiled from now on run every node unfused.
    unfused: AtomicBool,
    /// For tests: products compiled from now on use only this SGEMM kernel (`k_matmul`: none;
    /// `k_gemv`: the few-row kernel for every float product).
    forced_gemm: Mutex<Option<&'static str>>,
    /// The Linalg family failed to build with the SGEMM tiles and is built without them.
    linalg_plain: AtomicBool,
    /// Built programs by their full source text.
    programs: Mutex<HashMap<String, Arc<ClProgram>>>,
    builds: AtomicU64,
    pub(crate) weights: WeightCache,
    /// A small buffer passed where a kernel's operand is an empty tensor (never read).
    pub(crate) dummy: Mem,
}

/// Held while devices are discovered and described: PoCL sets a device up on the first
/// `clGetDeviceIDs`, and a second thread asking at the same time was seen to get no devices,
/// or a device whose name query crashed.
static DISCOVERY: Mutex<()> = Mutex::new(());

fn discovery() -> std::sync::MutexGuard<'static, ()> {
    DISCOVERY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every OpenCL device of every platform, in a stable order: platforms as the ICD loader lists
/// them, each platform's devices in its own order. Callers hold [`discovery`].
fn all_devices() -> Result<Vec<(Platform, ClDevice)>, ExecError> {
    let platforms = match get_platforms() {
        Ok(p) => p,
        Err(e) if e.0 == CL_PLATFORM_NOT_FOUND_KHR => Vec::new(),
        Err(e) => return Err(cl_err("listing platforms", e)),
    };
    let mut out = Vec::new();
    for p in platforms {
        let ids = match p.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(e) if e.0 == CL_DEVICE_NOT_FOUND => Vec::new(),
            Err(e) => return Err(cl_err("listing devices", e)),
        };
        out.extend(ids.into_iter().map(|id| (p, ClDevice::new(id))));
    }
    Ok(out)
}

fn describe(platform: &Platform, device: &ClDevice) -> String {
    let name = device.name().unwrap_or_else(|_| "unnamed device".into());
    let platform = platform
        .name()
        .unwrap_or_else(|_| "unknown platform".into());
    let version = device.version().unwrap_or_default();
    format!("{} ({platform}, {version})", name.trim())
}

impl OpenClDevice {
    /// Every OpenCL device across all platforms, as (index, description), in the order
    /// `open(index)` and the spec `opencl:index` use. No device is opened and no check is run.
    /// An error means the OpenCL library is missing or failed; no platforms give an empty list.
    pub fn list() -> Result<Vec<(usize, String)>, ExecError> {
        let _held = discovery();
        Ok(all_devices()?
            .iter()
            .enumerate()
            .map(|(i, (p, d))| (i, describe(p, d)))
            .collect())
    }

    /// The device index a spec names: `opencl` is device 0, `opencl:N` device N; `None` for
    /// anything else.
    pub fn parse_spec(spec: &str) -> Option<usize> {
        match spec.strip_prefix("opencl")? {
            "" => Some(0),
            rest => rest.strip_prefix(':')?.parse().ok(),
        }
    }

    /// Whether an OpenCL device can be opened here: the library loads and lists at least one
    /// device. Never panics.
    pub fn available() -> bool {
        let _held = discovery();
        all_devices().is_ok_and(|d| !d.is_empty())
    }

    /// Open device `index` of [`OpenClDevice::list`], with its whole global memory for tensors,
    /// and run the determinism check.
    pub fn open(index: usize, quirks: Quirks) -> Result<OpenClDevice, ExecError> {
        Self::open_with_memory_limit(index, quirks, None)
    }

    /// [`OpenClDevice::open`], with tensor memory limited to `limit` bytes (when smaller than
    /// the device's global memory): graphs whose bound exceeds it are refused at compile.
    pub fn open_with_memory_limit(
        index: usize,
        quirks: Quirks,
        limit: Option<u64>,
    ) -> Result<OpenClDevice, ExecError> {
        let held = discovery();
        let devices = all_devices()?;
        let count = devices.len();
        let (platform, device) = devices.into_iter().nth(index).ok_or_else(|| {
            ExecError::Device(format!(
                "no OpenCL device {index} (this machine has {count})"
            ))
        })?;
        let global = device
            .global_mem_size()
            .map_err(|e| cl_err("querying memory", e))?;
        let max_alloc = device
            .max_mem_alloc_size()
            .map_err(|e| cl_err("querying memory", e))?;
        let max_group = device.max_work_group_size().unwrap_or(1);
        let local_mem = device.local_mem_size().unwrap_or(0);
        let memory = limit.map_or(global, |l| l.min(global));
        let class = match device.dev_type().map_err(|e| cl_err("querying type", e))? {
            t if t & CL_DEVICE_TYPE_GPU != 0 => DeviceClass::Gpu,
            t if t & CL_DEVICE_TYPE_CPU != 0 => DeviceClass::Cpu,
            t if t & CL_DEVICE_TYPE_ACCELERATOR != 0 => DeviceClass::Accelerator,
            _ => DeviceClass::Other,
        };
        let compute_units = device.max_compute_units().unwrap_or(1) as usize;
        let name = describe(&platform, &device);
        drop(held);
        let context = Context::from_device(&device).map_err(|e| cl_err("creating a context", e))?;
        let profile = std::env::var_os(PROFILE_ENV).is_some_and(|v| v == "1");
        let properties = if profile {
            opencl3::command_queue::CL_QUEUE_PROFILING_ENABLE
        } else {
            0
        };
        #[allow(deprecated)] // clCreateCommandQueue: the one call every OpenCL version has
        let queue = CommandQueue::create_default(&context, properties)
            .map_err(|e| cl_err("creating a queue", e))?;
        let exact = crate::check::self_test(&context, &queue, &quirks);
        let dummy = Mem::alloc(&context, 64)?;
        let info = DeviceInfo {
            spec: format!("opencl:{index}"),
            name,
            class,
            compute_units,
            memory,
            exact,
        };
        Ok(OpenClDevice {
            inner: Arc::new(Inner {
                id: next_device_id(),
                info,
                quirks,
                context,
                queue,
                profile,
                pool: MemPool::new(memory / POOL_SHARE_DIVISOR),
                device,
                max_alloc,
                tuning: Tuning::for_limits(max_group, local_mem),
                gemm_usable: Mutex::new(None),
                gemv_usable: Mutex::new(None),
                fused_programs: AtomicU64::new(0),
                unfused: AtomicBool::new(false),
                forced_gemm: Mutex::new(None),
                linalg_plain: AtomicBool::new(false),
                programs: Mutex::new(HashMap::new()),
                builds: AtomicU64::new(0),
                weights: WeightCache::new(memory / WEIGHT_SHARE_DIVISOR),
                dummy,
            }),
        })
    }

    /// How many OpenCL programs this device has built (each `clBuildProgram` call): graphs
    /// whose kernels were built before add none.
    pub fn program_builds(&self) -> u64 {
        self.inner.builds.load(Ordering::Relaxed)
    }

    /// The product kernels float products may use on this device, largest SGEMM tile first,
    /// then `k_gemv` (each computes the same bits; which one runs depends on the product's
    /// shape): those its work-group and local-memory limits allow, less any that the first
    /// build of the kernels showed it cannot run.
    #[doc(hidden)]
    pub fn gemm_kernels(&self) -> Vec<&'static str> {
        let usable = self
            .inner
            .gemm_usable
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&'static str> = usable
            .as_ref()
            .unwrap_or(&self.inner.tuning.gemm)
            .iter()
            .map(|t| t.name)
            .collect();
        drop(usable);
        if self.gemv_usable() {
            names.push("k_gemv");
        }
        names
    }

    fn gemv_usable(&self) -> bool {
        let inner = &self.inner;
        inner
            .gemv_usable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(inner.tuning.gemv)
            && !inner.linalg_plain.load(Ordering::Relaxed)
    }

    /// For tests: the kernels a compile of `graph` would launch now, in order (one name per
    /// launch; fused chains as `k_fused_N`, folded nodes launch nothing).
    #[doc(hidden)]
    pub fn planned_kernels(&self, graph: &Graph) -> Vec<String> {
        crate::plan::plan(graph, &self.caps())
            .nodes
            .iter()
            .flat_map(|n| n.launches.iter().map(|l| l.kernel.to_string()))
            .collect()
    }

    /// For tests and timings: whether graphs compiled from now on may fuse elementwise
    /// chains (the default) or run every node as its own kernel.
    #[doc(hidden)]
    pub fn set_fusion(&self, on: bool) {
        self.inner.unfused.store(!on, Ordering::Relaxed);
    }

    /// For tests: make float products compiled from now on use only the SGEMM kernel `name`
    /// (one of [`OpenClDevice::gemm_kernels`]), or `k_matmul` (one item per output) for
    /// `"k_matmul"`; `None` restores the choice by shape. False for an unknown name.
    #[doc(hidden)]
    pub fn force_gemm(&self, name: Option<&str>) -> bool {
        let forced = match name {
            None => None,
            Some("k_matmul") => Some("k_matmul"),
            Some("k_gemv") if self.inner.tuning.gemv => Some("k_gemv"),
            Some(n) => match self.inner.tuning.gemm.iter().find(|t| t.name == n) {
                Some(t) => Some(t.name),
                None => return false,
            },
        };
        *self
            .inner
            .forced_gemm
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = forced;
        true
    }

    /// What the planner may use: every SGEMM tile of the tuning (or only the forced one)
    /// unless a build has shown a kernel cannot run its whole work group here.
    pub(crate) fn caps(&self) -> Caps {
        let inner = &self.inner;
        let usable = inner
            .gemm_usable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut gemm = usable.unwrap_or_else(|| inner.tuning.gemm.clone());
        let mut gemv = if self.gemv_usable() {
            Gemv::FewRows
        } else {
            Gemv::Off
        };
        if let Some(f) = *inner.forced_gemm.lock().unwrap_or_else(|e| e.into_inner()) {
            gemm.retain(|t| t.name == f);
            gemv = match (gemv, f) {
                (Gemv::Off, _) => Gemv::Off,
                (_, "k_gemv") => Gemv::All,
                _ => Gemv::Off,
            };
        }
        Caps {
            gemm,
            compute_units: inner.info.compute_units.max(1) as u64,
            rows: inner.tuning.rows,
            gemv,
            fuse: inner.fused_programs.load(Ordering::Relaxed) < MAX_FUSED_PROGRAMS
                && !inner.unfused.load(Ordering::Relaxed),
        }
    }

    /// Ask the built Linalg program which SGEMM kernels run in their whole work group (a
    /// driver may allow fewer items for a kernel that needs many registers); remembered.
    /// True if that removed a tile the planner could have chosen.
    pub(crate) fn check_gemm(&self, linalg: &ClProgram) -> bool {
        let inner = &self.inner;
        let mut usable = inner.gemm_usable.lock().unwrap_or_else(|e| e.into_inner());
        if usable.is_some() {
            return false;
        }
        let fits = |t: &GemmTile| {
            Kernel::create(linalg, t.name)
                .and_then(|k| k.get_work_group_size(inner.device.id()))
                .is_ok_and(|g| g >= t.threads() as usize)
        };
        let ok: Vec<GemmTile> = inner
            .tuning
            .gemm
            .iter()
            .filter(|t| fits(t))
            .copied()
            .collect();
        let gemv = inner.tuning.gemv
            && ["k_gemv", "k_qgemv"].iter().all(|name| {
                Kernel::create(linalg, name)
                    .and_then(|k| k.get_work_group_size(inner.device.id()))
                    .is_ok_and(|g| g >= GEMV_T as usize)
            });
        let removed = ok.len() != inner.tuning.gemm.len() || gemv != inner.tuning.gemv;
        *usable = Some(ok);
        *inner.gemv_usable.lock().unwrap_or_else(|e| e.into_inner()) = Some(gemv);
        removed
    }

    /// The built program of a graph's fused chains (`kernels`: their generated source),
    /// building it on first use; `None` once the device has built `MAX_FUSED_PROGRAMS` of
    /// them, or if the driver refuses it (the graph then runs unfused).
    pub(crate) fn fused_program(&self, kernels: &str) -> Option<Arc<ClProgram>> {
        let inner = &self.inner;
        let src = crate::kernels::fused_source(&inner.quirks, kernels);
        let mut programs = inner.programs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = programs.get(&src) {
            return Some(p.clone());
        }
        if inner.fused_programs.fetch_add(1, Ordering::Relaxed) >= MAX_FUSED_PROGRAMS {
            return None;
        }
        inner.builds.fetch_add(1, Ordering::Relaxed);
        let options = source::build_options(&inner.quirks);
        let program =
            Arc::new(ClProgram::create_and_build_from_source(&inner.context, &src, &options).ok()?);
        programs.insert(src, program.clone());
        Some(program)
    }

    /// The built program of a kernel family, building it on first use. Should the Linalg
    /// family fail to build with its SGEMM tiles (a driver refusing one), it is built without
    /// them, and products fall back to `k_matmul` (`check_gemm` then finds no tile kernels).
    pub(crate) fn program(&self, family: Family) -> Result<Arc<ClProgram>, ExecError> {
        let inner = &self.inner;
        let plain = family == Family::Linalg && inner.linalg_plain.load(Ordering::Relaxed);
        let tuning = Tuning {
            rows: inner.tuning.rows,
            gemm: if plain {
                vec![]
            } else {
                inner.tuning.gemm.clone()
            },
            gemv: !plain && inner.tuning.gemv,
        };
        let src = family.source(&inner.quirks, &tuning);
        let mut programs = inner.programs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = programs.get(&src) {
            return Ok(p.clone());
        }
        inner.builds.fetch_add(1, Ordering::Relaxed);
        let options = source::build_options(&inner.quirks);
        match ClProgram::create_and_build_from_source(&inner.context, &src, &options) {
            Ok(program) => {
                let program = Arc::new(program);
                programs.insert(src, program.clone());
                Ok(program)
            }
            Err(_) if family == Family::Linalg && !tuning.gemm.is_empty() => {
                inner.linalg_plain.store(true, Ordering::Relaxed);
                drop(programs);
                self.program(family)
            }
            Err(log) => Err(ExecError::Device(format!(
                "building the {family:?} kernels: {log}"
            ))),
        }
    }

    /// The handle of a buffer this device made.
    pub(crate) fn handle<'a>(&self, b: &'a Buffer) -> Result<&'a Handle, ExecError> {
        if b.device() != self.inner.id {
            return Err(ExecError::Device(format!(
                "{b:?} belongs to another device, not {}",
                self.inner.info.spec
            )));
        }
        b.handle::<Handle>()
            .ok_or_else(|| ExecError::Device(format!("{b:?} is not an OpenCL buffer")))
    }

    /// New device memory for `bytes` (nothing for 0).
    pub(crate) fn alloc(&self, bytes: u64) -> Result<Handle, ExecError> {
        if bytes == 0 {
            return Ok(Handle(None));
        }
        Ok(Handle(Some(Arc::new(Mem::alloc_pooled(
            &self.inner.context,
            &self.inner.pool,
            bytes,
        )?))))
    }

    pub(crate) fn buffer(&self, ty: TensorType, handle: Handle) -> Buffer {
        Buffer::new(ty, self.inner.id, handle)
    }

    /// A copy of `src` in new memory.
    fn duplicate(&self, src: &Handle) -> Result<Handle, ExecError> {
        let Some(m) = &src.0 else {
            return Ok(Handle(None));
        };
        let copy = Mem::alloc(&self.inner.context, m.bytes())?;
        copy.copy_from(&self.inner.queue, 0, m, 0, m.bytes())?;
        Ok(Handle(Some(Arc::new(copy))))
    }
}

impl std::fmt::Debug for OpenClDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpenClDevice({})", self.inner.info.spec)
    }
}

impl Device for OpenClDevice {
    fn id(&self) -> u64 {
        self.inner.id
    }

    fn info(&self) -> DeviceInfo {
        self.inner.info.clone()
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Program>, ExecError> {
        Ok(Box::new(crate::program::GraphProgram::compile(
            self, graph,
        )?))
    }

    fn upload(&self, tensor: &HostTensor) -> Result<Buffer, ExecError> {
        let h = self.alloc(tensor.bytes().len() as u64)?;
        if let Some(m) = &h.0 {
            m.write(&self.inner.queue, 0, tensor.bytes())?;
        }
        Ok(self.buffer(tensor.ty().clone(), h))
    }

    fn zeros(&self, ty: &TensorType) -> Result<Buffer, ExecError> {
        let bytes = ty
            .bytes()
            .ok_or_else(|| ExecError::Device(format!("{ty} is too large")))?;
        let h = self.alloc(bytes)?;
        if let Some(m) = &h.0 {
            m.fill(&self.inner.queue, &[0], 0, bytes)?;
        }
        Ok(self.buffer(ty.clone(), h))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostTensor, ExecError> {
        let h = self.handle(buffer)?;
        let mut data = vec![0u8; buffer.bytes() as usize];
        if let Some(m) = &h.0 {
            m.read(&self.inner.queue, 0, &mut data)?;
        }
        HostTensor::new(buffer.ty().clone(), data).map_err(|e| ExecError::Device(e.to_string()))
    }

    fn write(&self, dst: &mut Buffer, offset: u64, src: &Buffer) -> Result<(), ExecError> {
        let src_h = self.handle(src)?.clone();
        self.handle(dst)?;
        let (size, dst_bytes) = (src.bytes(), dst.bytes());
        if offset.checked_add(size).is_none_or(|end| end > dst_bytes) {
            return Err(ExecError::Device(format!(
                "writing {size} bytes at {offset} into {dst:?} of {dst_bytes} bytes"
            )));
        }
        if size == 0 {
            return Ok(());
        }
        // Copy-on-write: the memory must be this buffer's alone, through both the Buffer's
        // handle and the Arc inside it (a reshape or an earlier clone shares it).
        let unique = dst
            .handle_mut::<Handle>()
            .is_some_and(|h| h.0.as_mut().is_some_and(|m| Arc::get_mut(m).is_some()));
        if !unique {
            let copy = self.duplicate(self.handle(dst)?)?;
            *dst = self.buffer(dst.ty().clone(), copy);
        }
        let (Some(d), Some(s)) = (&self.handle(dst)?.0, &src_h.0) else {
            return Err(ExecError::Device(
                "empty buffer in a non-empty write".into(),
            ));
        };
        d.copy_from(&self.inner.queue, offset, s, 0, size)
    }

    fn cached_weights(&self) -> (usize, u64) {
        self.inner.weights.usage()
    }
}
