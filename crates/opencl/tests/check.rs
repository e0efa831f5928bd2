//! The determinism check (`src/check.rs`) on the first OpenCL device: the real device passes,
//! and deliberately broken builds of the same device (`Quirks`) are refused, naming what broke.
//!
//! Skips (prints a line and passes) when no OpenCL platform or device is present, unless
//! `TENET_REQUIRE_OPENCL=1`.

// The check and the library, compiled into this test from the crate's own files (the modules
// are private to the crate).
#[allow(dead_code)]
#[path = "../src/source.rs"]
mod source;

#[allow(dead_code)]
#[path = "../src/cl_api.rs"]
mod cl_api;

#[allow(dead_code)]
#[path = "../src/check.rs"]
mod check;

use std::sync::OnceLock;
use std::time::Instant;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device};
use opencl3::platform::get_platforms;
use tenet_exec::ExactCheck;

use source::Quirks;

/// The first OpenCL device, found once per process: PoCL's first device query is not
/// thread-safe (a second thread asking while the first initialises gets no device, or a
/// device whose name is not yet set: a crash in clGetDeviceInfo), and tests run in threads.
fn first_device() -> &'static Result<Device, String> {
    static DEVICE: OnceLock<Result<Device, String>> = OnceLock::new();
    DEVICE.get_or_init(|| {
        let platforms = get_platforms().map_err(|e| format!("no OpenCL runtime ({e})"))?;
        platforms
            .iter()
            .find_map(|p| p.get_devices(CL_DEVICE_TYPE_ALL).ok()?.first().copied())
            .map(Device::new)
            .ok_or_else(|| format!("no OpenCL device ({} platforms)", platforms.len()))
    })
}

/// A context and queue on the first OpenCL device, or `None` (after saying so).
fn open() -> Option<(Context, CommandQueue, String)> {
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    let device = match first_device() {
        Ok(d) => d,
        Err(why) => {
            assert!(!required, "TENET_REQUIRE_OPENCL=1 but {why}");
            eprintln!("skipping the determinism check tests: {why}");
            return None;
        }
    };
    let name = device.name().unwrap_or_default();
    let context = Context::from_device(device).expect("an OpenCL context");
    #[allow(deprecated)] // clCreateCommandQueue: present on OpenCL 1.2 devices too
    let queue = CommandQueue::create_default(&context, 0).expect("a command queue");
    Some((context, queue, name))
}

#[test]
fn the_real_device_passes() {
    let Some((context, queue, name)) = open() else {
        return;
    };
    let q = Quirks::default();
    let first = check::self_test(&context, &queue, &q);
    assert_eq!(first, ExactCheck::Passed, "on {name}");
    // Again, with the device's program cache warm: this is what opening a device costs.
    let t = Instant::now();
    assert_eq!(check::self_test(&context, &queue, &q), ExactCheck::Passed);
    eprintln!("determinism check on {name}: {:?} (warm)", t.elapsed());
}

#[test]
fn contraction_is_refused() {
    let Some((context, queue, name)) = open() else {
        return;
    };
    let q = Quirks {
        contract: true,
        ..Quirks::default()
    };
    match check::self_test(&context, &queue, &q) {
        ExactCheck::Failed(reason) => {
            eprintln!("{name}, contraction on: {reason}");
            assert!(reason.contains("contraction"), "{reason}");
        }
        ExactCheck::Passed => panic!("{name}: a build that fuses a*b+c passed the check"),
    }
}

#[test]
fn flushed_denormals_are_refused() {
    let Some((context, queue, name)) = open() else {
        return;
    };
    let q = Quirks {
        flush_denormals: true,
        ..Quirks::default()
    };
    match check::self_test(&context, &queue, &q) {
        ExactCheck::Failed(reason) => {
            eprintln!("{name}, denormals flushed: {reason}");
            assert!(reason.contains("denormals"), "{reason}");
        }
        ExactCheck::Passed => panic!("{name}: a build that flushes denormals passed the check"),
    }
    // The broken program must not leave the device flushing for the next one (PoCL sets the
    // CPU's flush mode for a kernel's run).
    assert_eq!(
        check::self_test(&context, &queue, &Quirks::default()),
        ExactCheck::Passed,
        "{name}: a correct program after a flushing one"
    );
}
