//! `--device` and `--threads`, shared by every command that computes, and `tenet devices`.

use std::sync::Arc;

use anyhow::{Result, bail};
use tenet_exec::{Device, ExactCheck};

/// Where a command computes.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Where to compute: `cpu`, `opencl` (the first OpenCL device) or `opencl:N`
    /// (`tenet devices` lists them).
    #[arg(long, value_name = "SPEC", default_value = "cpu", env = "TENET_DEVICE")]
    pub device: String,
    /// Worker threads on the CPU [default: all cores].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

impl DeviceArgs {
    pub fn options(&self) -> Result<tenet_devices::Options> {
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        Ok(tenet_devices::Options {
            threads: self.threads,
            ..Default::default()
        })
    }

    /// Open the device, saying which flag was wrong if it cannot be.
    pub fn open(&self) -> Result<Arc<dyn Device>> {
        tenet_devices::open(&self.device, &self.options()?)
            .map_err(|e| anyhow::anyhow!("--device {}: {e}", self.device))
    }
}

/// `tenet devices`: every device this build can open, its memory, class and whether it may
/// serve the exact tier.
pub fn list(json: bool) -> Result<()> {
    let listed = tenet_devices::list(&tenet_devices::Options::default());
    if json {
        let rows: Vec<serde_json::Value> = listed
            .iter()
            .map(|(spec, r)| match r {
                Ok(info) => serde_json::json!({
                    "spec": spec.to_string(),
                    "name": info.name,
                    "class": info.class.name(),
                    "memory_bytes": info.memory,
                    "compute_units": info.compute_units,
                    "tiers": info.tiers(),
                    "exact_check": match &info.exact {
                        ExactCheck::Passed => "passed".to_string(),
                        ExactCheck::Failed(why) => format!("failed: {why}"),
                    },
                }),
                Err(e) => serde_json::json!({ "spec": spec.to_string(), "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<10} {:<6} {:>10} {:<17} name",
        "spec", "class", "memory", "determinism check"
    );
    for (spec, r) in &listed {
        match r {
            Ok(info) => {
                let check = match &info.exact {
                    ExactCheck::Passed => "passed: exact".to_string(),
                    ExactCheck::Failed(_) => "FAILED: tolerant".to_string(),
                };
                println!(
                    "{:<10} {:<6} {:>10} {:<17} {}",
                    spec.to_string(),
                    info.class.name(),
                    crate::report::bytes(info.memory),
                    check,
                    info.name
                );
                if let ExactCheck::Failed(why) = &info.exact {
                    println!("           why: {why}");
                }
            }
            Err(e) => println!("{:<10} cannot open: {e}", spec.to_string()),
        }
    }
    if listed.len() == 1 {
        println!(
            "(no OpenCL device found: install an OpenCL driver, e.g. Debian's pocl-opencl-icd for the CPU)"
        );
    }
    Ok(())
}
