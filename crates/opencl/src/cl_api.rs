//! The only module that calls OpenCL's `unsafe` entry points: device buffers, transfers,
//! copies, fills and kernel launches, behind safe functions that check the extents they are
//! given. Everything else in the crate speaks in [`Mem`], [`KernelArg`] and `ExecError`.
//!
//! Why these are sound: an OpenCL buffer is an opaque handle owned by the driver. Reading or
//! writing host memory through one is sound when the host slice is as long as the transfer
//! (checked here) and stays alive until the transfer ends (every host transfer here is
//! blocking). Device-side copies and fills are range-checked here against both buffers' sizes.
//! Kernel launches are the one place where soundness rests on the caller: the kernels in
//! `cl/*.cl` index only within the extents the planner passes them, and the planner derives
//! those extents from the very types the buffers were allocated for (`plan.rs`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opencl3::command_queue::{self as cq, CommandQueue};
use opencl3::context::Context;
use opencl3::error_codes::ClError;
use opencl3::event::Event;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer as ClBuffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::types::{CL_BLOCKING, cl_mem};
use tenet_exec::ExecError;

/// A new buffer of `bytes` (> 0), contents undefined.
fn create(context: &Context, bytes: u64) -> Result<ClBuffer<u8>, ExecError> {
    if bytes == 0 {
        return Err(ExecError::Device("cannot allocate an empty buffer".into()));
    }
    let size = usize::try_from(bytes)
        .map_err(|_| ExecError::Device(format!("{bytes} bytes do not fit an address")))?;
    // SAFETY: no host pointer is passed (null with no USE/COPY_HOST_PTR flag), so the driver
    // only allocates; the returned handle is owned by `ClBuffer`, released on drop.
    unsafe {
        ClBuffer::<u8>::create(context, CL_MEM_READ_WRITE, size, ptr::null_mut())
            .map_err(|e| cl_err(&format!("allocating {bytes} bytes"), e))
    }
}

/// A driver error as the crate's error, saying what was being done.
pub(crate) fn cl_err(what: &str, e: impl std::fmt::Display) -> ExecError {
    ExecError::Device(format!("OpenCL {what}: {e}"))
}

/// One device allocation of at least one byte (OpenCL has no empty buffers: empty tensors
/// carry no `Mem` at all). One taken from a [`MemPool`] goes back to it when dropped.
#[derive(Debug)]
pub(crate) struct Mem {
    buf: ManuallyDrop<ClBuffer<u8>>,
    bytes: u64,
    pool: Option<Arc<MemPool>>,
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken once, here, and `self` is not used afterwards.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        match &self.pool {
            Some(pool) => pool.put(self.bytes, buf),
            None => drop(buf),
        }
    }
}

/// Device buffers of finished runs kept for the next runs of the same shapes: creating and
/// releasing a buffer costs tens of microseconds in some drivers (NVIDIA's), and a model's
/// run allocates one per computed tensor. Buffers are matched by exact size; the pool holds
/// at most `limit` bytes, and is emptied before an allocation the driver refuses is retried.
///
/// Reuse is safe on the device's one in-order queue: a buffer returned while a queued
/// command still uses it is handed out only to commands enqueued after that one.
#[derive(Debug)]
pub(crate) struct MemPool {
    free: Mutex<HashMap<u64, Vec<ClBuffer<u8>>>>,
    held: AtomicU64,
    limit: u64,
}

impl MemPool {
    pub(crate) fn new(limit: u64) -> Arc<MemPool> {
        Arc::new(MemPool {
            free: Mutex::default(),
            held: AtomicU64::new(0),
            limit,
        })
    }

    fn put(&self, bytes: u64, buf: ClBuffer<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if self.held.load(Ordering::Relaxed) + bytes <= self.limit {
            self.held.fetch_add(bytes, Ordering::Relaxed);
            free.entry(bytes).or_default().push(buf);
        }
    }

    fn take(&self, bytes: u64) -> Option<ClBuffer<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let buf = free.get_mut(&bytes)?.pop()?;
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        Some(buf)
    }

    /// Release every pooled buffer to the driver.
    pub(crate) fn drain(&self) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.clear();
        self.held.store(0, Ordering::Relaxed);
    }

    /// Bytes held for reuse.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

impl Mem {
    /// Allocate `bytes` (> 0) of device memory, contents undefined.
    pub(crate) fn alloc(context: &Context, bytes: u64) -> Result<Mem, ExecError> {
        Ok(Mem {
            buf: ManuallyDrop::new(create(context, bytes)?),
            bytes,
            pool: None,
        })
    }

    /// As [`Mem::alloc`], reusing a buffer of `pool` when it holds one of this size, and
    /// returning the buffer to `pool` when dropped.
    pub(crate) fn alloc_pooled(
        context: &Context,
        pool: &Arc<MemPool>,
        bytes: u64,
    ) -> Result<Mem, ExecError> {
        let buf = match pool.take(bytes) {
            Some(buf) => buf,
            None => create(context, bytes).or_else(|_| {
                pool.drain();
                create(context, bytes)
            })?,
        };
        Ok(Mem {
            buf: ManuallyDrop::new(buf),
            bytes,
            pool: Some(pool.clone()),
        })
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn raw(&self) -> cl_mem {
        self.buf.get()
    }

    /// Copy `data` into this buffer at byte `offset`, waiting until it is done.
    pub(crate) fn write(
        &self,
        queue: &CommandQueue,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ExecError> {
        check_range("write", offset, data.len() as u64, self.bytes)?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside the buffer (checked above); the write is blocking, so
        // `data` outlives the transfer; the driver only reads from the host pointer.
        let ev = unsafe {
            cq::enqueue_write_buffer(
                queue.get(),
                self.raw(),
                CL_BLOCKING,
                offset as usize,
                data.len(),
                data.as_ptr() as *const c_void,
                0,
                ptr::null(),
            )
        }
        .map_err(|e| cl_err("writing a buffer", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
    }

    /// Read `out.len()` bytes from byte `offset`, waiting until they have arrived.
    pub(crate) fn read(
        &self,
        queue: &CommandQueue,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), ExecError> {
        check_range("read", offset, out.len() as u64, self.bytes)?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the range lies inside the buffer and `out` is exactly as long as the
        // transfer; the read is blocking, so `out` is written only while borrowed here.
        let ev = unsafe {
            cq::enqueue_read_buffer(
                queue.get(),
                self.raw(),
                CL_BLOCKING,
                offset as usize,
                out.len(),
                out.as_mut_ptr() as *mut c_void,
                0,
                ptr::null(),
            )
        }
        .map_err(|e| cl_err("reading a buffer", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
    }

    /// Enqueue a device-side copy of `size` bytes from `src` at `src_offset` into this buffer
    /// at `dst_offset` (in queue order with every other command).
    pub(crate) fn copy_from(
        &self,
        queue: &CommandQueue,
        dst_offset: u64,
        src: &Mem,
        src_offset: u64,
        size: u64,
    ) -> Result<(), ExecError> {
        check_range("copy source", src_offset, size, src.bytes)?;
        check_range("copy destination", dst_offset, size, self.bytes)?;
        if size == 0 {
            return Ok(());
        }
        if std::ptr::eq(self, src) {
            return Err(ExecError::Device("copy of a buffer onto itself".into()));
        }
        // SAFETY: both ranges lie inside their buffers (checked above) and the buffers are
        // distinct objects, so the regions cannot overlap; no host memory is involved.
        let ev = unsafe {
            cq::enqueue_copy_buffer(
                queue.get(),
                src.raw(),
                self.raw(),
                src_offset as usize,
                dst_offset as usize,
                size as usize,
                0,
                ptr::null(),
            )
        }
        .map_err(|e| cl_err("copying a buffer", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
    }

    /// Enqueue filling `size` bytes from `offset` with repetitions of `pattern` (1, 2, 4 or 8
    /// bytes; offset and size multiples of its length).
    pub(crate) fn fill(
        &self,
        queue: &CommandQueue,
        pattern: &[u8],
        offset: u64,
        size: u64,
    ) -> Result<(), ExecError> {
        check_range("fill", offset, size, self.bytes)?;
        let p = pattern.len() as u64;
        if !matches!(p, 1 | 2 | 4 | 8) || !offset.is_multiple_of(p) || !size.is_multiple_of(p) {
            return Err(ExecError::Device(format!(
                "fill pattern of {p} bytes does not tile {size} bytes at {offset}"
            )));
        }
        if size == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside the buffer (checked above); the pattern is copied by
        // the driver when the command is enqueued (OpenCL: "the memory associated with
        // pattern can be reused or freed after the function returns").
        let ev = unsafe {
            cq::enqueue_fill_buffer(
                queue.get(),
                self.raw(),
                pattern.as_ptr() as *const c_void,
                pattern.len(),
                offset as usize,
                size as usize,
                0,
                ptr::null(),
            )
        }
        .map_err(|e| cl_err("filling a buffer", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
    }
}

fn check_range(what: &str, offset: u64, len: u64, size: u64) -> Result<(), ExecError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(ExecError::Device(format!(
            "{what} of {len} bytes at {offset} is outside a buffer of {size} bytes"
        ))),
    }
}

/// One argument of a kernel launch, matching the kernel's parameter in `cl/*.cl`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KernelArg<'a> {
    /// A `global` pointer parameter.
    Mem(&'a Mem),
    /// `ulong`.
    U64(u64),
    /// `long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `uint`.
    U32(u32),
}

/// The index space of a launch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Range {
    /// `n` work items in one dimension; the driver picks the work-group size.
    Linear(usize),
    /// A 3-D space of `global` items in work groups of `local` (each `global` a multiple).
    Groups {
        global: [usize; 3],
        local: [usize; 3],
    },
}

/// Launch `kernel` over `global` work items (one dimension, work groups the driver picks)
/// with `args`, in queue order. See [`launch_range`].
pub(crate) fn launch(
    queue: &CommandQueue,
    kernel: &Kernel,
    args: &[KernelArg<'_>],
    global: usize,
) -> Result<(), ExecError> {
    launch_range(queue, kernel, args, Range::Linear(global)).map(drop)
}

/// Launch `kernel` over `range` with `args`, in queue order.
///
/// The kernel's body must stay inside the buffers it is given for the extents passed in the
/// scalar arguments: the planner guarantees this, as described in the module docs.
pub(crate) fn launch_range(
    queue: &CommandQueue,
    kernel: &Kernel,
    args: &[KernelArg<'_>],
    range: Range,
) -> Result<Event, ExecError> {
    for (i, a) in args.iter().enumerate() {
        let i = i as u32;
        // SAFETY: each value is passed with its own size, and clSetKernelArg checks it against
        // the parameter's (CL_INVALID_ARG_SIZE otherwise); a `Mem` passes its live handle,
        // which outlives the launch because the caller holds it until the queue finishes
        // (and OpenCL keeps a released buffer alive until the commands using it complete).
        let r = unsafe {
            match *a {
                KernelArg::Mem(m) => kernel.set_arg(i, &m.raw()),
                KernelArg::U64(v) => kernel.set_arg(i, &v),
                KernelArg::I64(v) => kernel.set_arg(i, &v),
                KernelArg::I32(v) => kernel.set_arg(i, &v),
                KernelArg::U32(v) => kernel.set_arg(i, &v),
            }
        };
        r.map_err(|e| cl_err(&format!("setting argument {i}"), e))?;
    }
    let (dims, global, local) = match range {
        Range::Linear(n) => (1, [n, 1, 1], None),
        Range::Groups { global, local } => {
            if global
                .iter()
                .zip(&local)
                .any(|(g, l)| *l == 0 || g % l != 0)
            {
                return Err(ExecError::Device(format!(
                    "launch of {global:?} items in groups of {local:?}"
                )));
            }
            (3, global, Some(local))
        }
    };
    // SAFETY: every argument has been set above; the sizes are arrays of `dims` elements that
    // live across the call (the driver copies them); what the kernel touches is bounded by
    // the arguments, which the planner derived from the buffers' own types.
    let ev = unsafe {
        queue.enqueue_nd_range_kernel(
            kernel.get(),
            dims,
            ptr::null(),
            global.as_ptr(),
            local.as_ref().map_or(ptr::null(), |l| l.as_ptr()),
            &[],
        )
    }
    .map_err(|e| cl_err("launching a kernel", e))?;
    Ok(ev)
}

/// Nanoseconds the command of `event` ran on the device (its queue records profiling
/// information), once it has completed.
pub(crate) fn device_nanos(event: &Event) -> Result<u64, ExecError> {
    let start = event
        .profiling_command_start()
        .map_err(|e| cl_err("reading a kernel's start time", e))?;
    let end = event
        .profiling_command_end()
        .map_err(|e| cl_err("reading a kernel's end time", e))?;
    Ok(end.saturating_sub(start))
}
