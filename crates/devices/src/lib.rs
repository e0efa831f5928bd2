//! `tenet-devices`: the one place a device is opened from a spec.
//!
//! A spec names a backend and, where there are several devices of it, which: `cpu`, `opencl`
//! (the first OpenCL device), `opencl:1`. [`open`] returns the device behind the
//! `tenet_exec::Device` trait, so nothing above this crate names a backend; [`list`] opens
//! every device there is and reports what each says about itself, including its determinism
//! check (what `tenet devices` prints).

use std::sync::Arc;

pub use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_exec::{Device, DeviceInfo};

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device {0:?}: expected cpu, opencl or opencl:N")]
    BadSpec(String),
    #[error("{0}: this build of tenet has no OpenCL backend (build with the `opencl` feature)")]
    NotBuilt(String),
    #[error("cannot open {spec}: {reason}")]
    Open { spec: String, reason: String },
}

/// A parsed device spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    Cpu,
    OpenCl(usize),
}

impl Spec {
    pub fn parse(text: &str) -> Result<Spec, DeviceError> {
        let text = text.trim();
        let bad = || DeviceError::BadSpec(text.to_string());
        match text.split_once(':') {
            None if text == "cpu" => Ok(Spec::Cpu),
            None if text == "opencl" => Ok(Spec::OpenCl(0)),
            Some(("opencl", n)) => n.parse().map(Spec::OpenCl).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spec::Cpu => write!(f, "cpu"),
            Spec::OpenCl(n) => write!(f, "opencl:{n}"),
        }
    }
}

impl std::str::FromStr for Spec {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Spec, DeviceError> {
        Spec::parse(s)
    }
}

/// How to open a device; every field has a default.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// CPU worker threads (default: one per core).
    pub threads: Option<usize>,
    /// CPU SIMD level (default: `TENET_SIMD` if set, else the best the CPU has).
    pub simd: Option<SimdLevel>,
    /// Refuse graphs whose memory bound exceeds this many bytes (default: the device's memory).
    pub memory_limit: Option<u64>,
}

/// Open the CPU device with `options` (for callers that need its thread count or level).
pub fn cpu(options: &Options) -> CpuDevice {
    let level = options
        .simd
        .unwrap_or_else(|| SimdLevel::from_env().unwrap_or_else(|_| SimdLevel::detect()));
    let threads = options.threads.unwrap_or_else(CpuDevice::default_threads);
    let device = CpuDevice::new(threads.max(1), level);
    match options.memory_limit {
        Some(limit) => device.with_memory_limit(limit),
        None => device,
    }
}

/// Open the device `spec` names.
pub fn open(spec: &str, options: &Options) -> Result<Arc<dyn Device>, DeviceError> {
    open_spec(Spec::parse(spec)?, options)
}

/// Open a parsed spec.
pub fn open_spec(spec: Spec, options: &Options) -> Result<Arc<dyn Device>, DeviceError> {
    match spec {
        Spec::Cpu => Ok(Arc::new(cpu(options))),
        Spec::OpenCl(index) => open_opencl(index, options),
    }
}

#[cfg(feature = "opencl")]
fn open_opencl(index: usize, options: &Options) -> Result<Arc<dyn Device>, DeviceError> {
    let device = tenet_opencl::OpenClDevice::open_with_memory_limit(
        index,
        tenet_opencl::Quirks::default(),
        options.memory_limit,
    )
    .map_err(|e| DeviceError::Open {
        spec: Spec::OpenCl(index).to_string(),
        reason: e.to_string(),
    })?;
    Ok(Arc::new(device))
}

#[cfg(not(feature = "opencl"))]
fn open_opencl(index: usize, _: &Options) -> Result<Arc<dyn Device>, DeviceError> {
    Err(DeviceError::NotBuilt(Spec::OpenCl(index).to_string()))
}

/// Every device this build can open, in spec order: the CPU, then each OpenCL device. A device
/// that fails to open is listed with why.
pub fn list(options: &Options) -> Vec<(Spec, Result<DeviceInfo, DeviceError>)> {
    #[cfg_attr(not(feature = "opencl"), allow(unused_mut))]
    let mut out = vec![(Spec::Cpu, Ok(cpu(options).info()))];
    #[cfg(feature = "opencl")]
    for (index, _) in tenet_opencl::OpenClDevice::list().unwrap_or_default() {
        let spec = Spec::OpenCl(index);
        out.push((spec, open_spec(spec, options).map(|d| d.info())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print() {
        assert_eq!(Spec::parse("cpu").unwrap(), Spec::Cpu);
        assert_eq!(Spec::parse("opencl").unwrap(), Spec::OpenCl(0));
        assert_eq!(Spec::parse("opencl:3").unwrap(), Spec::OpenCl(3));
        assert_eq!(Spec::OpenCl(3).to_string(), "opencl:3");
        for bad in ["", "gpu", "opencl:", "opencl:x", "cpu:1", "cuda"] {
            assert!(Spec::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn the_cpu_opens_and_serves_exact() {
        let d = open("cpu", &Options::default()).unwrap();
        let info = d.info();
        assert_eq!(info.spec, "cpu");
        assert!(info.exact.passed());
        assert_eq!(info.tiers(), ["exact", "tolerant"]);
    }
}
