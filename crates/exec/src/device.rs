//! The device layer: where tensors live and graphs run.
//!
//! A [`Device`] allocates, uploads and downloads buffers, compiles graphs into [`Program`]s,
//! and says how much memory it has and whether it may serve the `exact` tier. A [`Buffer`] is
//! an opaque handle to a tensor on one device; a program runs on buffers and returns buffers,
//! so state that stays between runs (a KV cache, a session's tensors, weights) never crosses
//! to the host. Programs also keep the host-tensor calls (`run`, `run_with_stats`,
//! `run_stoppable`) so a caller that only wants numbers stays simple.
//!
//! Weights are cached on the device by (weights file hash, tensor name) in a [`WeightCache`],
//! so a second job on the same weights uploads nothing.
//!
//! This module knows no backend: the CPU backend (`tenet-cpu`), OpenCL (`tenet-opencl`) and
//! any later one (CUDA) implement these two traits in crates of their own, and `tenet-devices`
//! opens one from a spec such as `cpu`, `opencl` or `opencl:1`.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenet_ir::{Graph, HostTensor, TensorType, WeightSource, WeightsId};

use crate::{ExecError, RunStats};

/// What kind of processor a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    Cpu,
    Gpu,
    Accelerator,
    Other,
}

impl DeviceClass {
    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Cpu => "cpu",
            DeviceClass::Gpu => "gpu",
            DeviceClass::Accelerator => "accelerator",
            DeviceClass::Other => "other",
        }
    }
}

/// Whether a device passed its determinism check, and so may serve the `exact` tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExactCheck {
    /// The self-test passed: this device gives the reference's bits.
    Passed,
    /// The self-test failed: the device serves the `tolerant` tier only, for this reason.
    Failed(String),
}

impl ExactCheck {
    pub fn passed(&self) -> bool {
        matches!(self, ExactCheck::Passed)
    }
}

/// What a device says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The spec that opens this device again (`cpu`, `opencl:0`).
    pub spec: String,
    /// A human description (`cpu avx512 × 2 threads`, `pthread-AMD EPYC… (PoCL 3.1)`).
    pub name: String,
    pub class: DeviceClass,
    /// Threads (CPU) or compute units (OpenCL) a run uses.
    pub compute_units: usize,
    /// Bytes of memory tensors may use on this device.
    pub memory: u64,
    /// The determinism check's result.
    pub exact: ExactCheck,
}

impl DeviceInfo {
    /// The tiers this device may serve, by name.
    pub fn tiers(&self) -> Vec<&'static str> {
        if self.exact.passed() {
            vec!["exact", "tolerant"]
        } else {
            vec!["tolerant"]
        }
    }
}

/// A tensor on a device: its type and an opaque handle only the device that made it reads.
/// Cloning a buffer clones the handle, not the data. A buffer is a value: the only way to
/// change one in place is [`Device::write`], which copies first when the handle is shared.
#[derive(Clone)]
pub struct Buffer {
    ty: TensorType,
    device: u64,
    handle: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} on device #{})", self.ty, self.device)
    }
}

impl Buffer {
    /// A buffer of type `ty` made by the device whose [`Device::id`] is `device`.
    pub fn new<T: Any + Send + Sync>(ty: TensorType, device: u64, handle: T) -> Buffer {
        Buffer {
            ty,
            device,
            handle: Arc::new(handle),
        }
    }

    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The size of the tensor in bytes.
    pub fn bytes(&self) -> u64 {
        self.ty.bytes().unwrap_or(0)
    }

    /// The id of the device that owns this buffer.
    pub fn device(&self) -> u64 {
        self.device
    }

    /// The handle, if it is a `T` (for the device that made it).
    pub fn handle<T: Any>(&self) -> Option<&T> {
        self.handle.downcast_ref()
    }

    /// The handle for writing, if it is a `T` and no clone of this buffer shares it.
    pub fn handle_mut<T: Any>(&mut self) -> Option<&mut T> {
        Arc::get_mut(&mut self.handle)?.downcast_mut()
    }

    /// The same handle under a new type of the same size (a reshape).
    pub fn retyped(&self, ty: TensorType) -> Option<Buffer> {
        (ty.bytes() == self.ty.bytes()).then(|| Buffer {
            ty,
            device: self.device,
            handle: self.handle.clone(),
        })
    }
}

/// A new process-wide device id, for [`Device::id`].
pub fn next_device_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A place graphs run: the CPU, a GPU.
pub trait Device: Send + Sync {
    /// This device instance's process-wide id (from [`next_device_id`]); buffers carry it.
    fn id(&self) -> u64;

    /// What the device is, its memory, and its determinism check.
    fn info(&self) -> DeviceInfo;

    /// A short description, such as `cpu avx512 × 2 threads`.
    fn name(&self) -> String {
        self.info().name
    }

    /// Plan (and, for a GPU, build kernels for) `graph` for repeated runs. A graph whose
    /// certificate exceeds the device's memory is refused here, before anything is allocated.
    fn compile(&self, graph: &Graph) -> Result<Box<dyn Program>, ExecError>;

    /// Copy a host tensor to the device.
    fn upload(&self, tensor: &HostTensor) -> Result<Buffer, ExecError>;

    /// Move a host tensor to the device (no copy where the device is the host).
    fn upload_owned(&self, tensor: HostTensor) -> Result<Buffer, ExecError> {
        self.upload(&tensor)
    }

    /// A zero-filled buffer of type `ty` (false for bool).
    fn zeros(&self, ty: &TensorType) -> Result<Buffer, ExecError> {
        let t = HostTensor::zeros(ty.clone()).map_err(|e| ExecError::Device(e.to_string()))?;
        self.upload_owned(t)
    }

    /// Copy a buffer back to the host.
    fn download(&self, buffer: &Buffer) -> Result<HostTensor, ExecError>;

    /// Write `src`'s bytes into `dst` starting at byte `offset`, on the device (how a KV cache
    /// grows by one token without crossing to the host). `dst` is copied first if shared.
    fn write(&self, dst: &mut Buffer, offset: u64, src: &Buffer) -> Result<(), ExecError>;

    /// Weight tensors cached on this device (count, bytes).
    fn cached_weights(&self) -> (usize, u64) {
        (0, 0)
    }
}

/// A graph compiled for one device.
pub trait Program: Send + Sync {
    /// The most memory one run may allocate: the certificate's `peak_bytes` plus the backend's
    /// documented scratch.
    fn memory_bound(&self) -> u64;

    /// Run on named input buffers (of this program's device) with weights from `weights`
    /// (uploaded once and cached on the device); `seed` feeds the random ops; `stop` is asked
    /// between steps. Outputs come back as buffers on the device, in the graph's output order.
    fn run_buffers(
        &self,
        inputs: &HashMap<String, Buffer>,
        weights: &dyn WeightSource,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, Buffer)>, RunStats), ExecError>;

    /// The device this program runs on.
    fn device(&self) -> &dyn Device;

    /// Run on host tensors: upload, run, download. Outputs come back in the graph's output
    /// order.
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
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ExecError> {
        let device = self.device();
        let mut on_device = HashMap::with_capacity(inputs.len());
        for (name, t) in inputs {
            on_device.insert(name.clone(), device.upload(t)?);
        }
        let (outs, stats) = self.run_buffers(&on_device, weights, seed, stop)?;
        let mut host = Vec::with_capacity(outs.len());
        for (name, b) in outs {
            host.push((name, device.download(&b)?));
        }
        Ok((host, stats))
    }
}

/// Weight tensors on a device, by (weights file hash, tensor name), up to a byte budget; the
/// least recently used go first when a new one would not fit. Backends that keep weights off
/// the host share this.
pub struct WeightCache {
    budget: u64,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<(WeightsId, String), (Buffer, u64)>,
    bytes: u64,
    clock: u64,
}

impl WeightCache {
    pub fn new(budget: u64) -> WeightCache {
        WeightCache {
            budget,
            inner: Mutex::new(CacheInner::default()),
        }
    }

    /// The cached buffer for `(file, tensor)`, or `upload(host)` of the source's tensor, kept.
    /// A weight the source lacks is a [`tenet_reference::RunError::MissingWeight`].
    pub fn get_or_upload(
        &self,
        file: &WeightsId,
        tensor: &str,
        source: &dyn WeightSource,
        upload: impl FnOnce(&HostTensor) -> Result<Buffer, ExecError>,
    ) -> Result<Buffer, ExecError> {
        let key = (*file, tensor.to_string());
        {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.clock += 1;
            let now = inner.clock;
            if let Some((b, used)) = inner.entries.get_mut(&key) {
                *used = now;
                return Ok(b.clone());
            }
        }
        let host = source.weight(file, tensor).ok_or_else(|| {
            ExecError::Run(tenet_reference::RunError::MissingWeight {
                file: file.to_string(),
                tensor: tensor.to_string(),
            })
        })?;
        let buffer = upload(host)?;
        let size = buffer.bytes();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while inner.bytes + size > self.budget && !inner.entries.is_empty() {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
                .expect("not empty");
            if let Some((b, _)) = inner.entries.remove(&oldest) {
                inner.bytes -= b.bytes();
            }
        }
        if size <= self.budget {
            inner.clock += 1;
            let now = inner.clock;
            inner.bytes += size;
            inner.entries.insert(key, (buffer.clone(), now));
        }
        Ok(buffer)
    }

    /// (count, bytes) cached now.
    pub fn usage(&self) -> (usize, u64) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (inner.entries.len(), inner.bytes)
    }
}
