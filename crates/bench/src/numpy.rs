//! The numpy peer: a short Python program run through `python3`, timing the same workloads on
//! arrays of the same shapes with the same thread count.

use std::collections::HashMap;
use std::process::Command;

pub struct Measured {
    pub version: String,
    pub times: HashMap<String, f64>,
}

const SCRIPT: &str = r#"
import json, sys, time
spec = json.loads(sys.argv[1])
import numpy as np
rng = np.random.default_rng(0)
out = {"version": "numpy " + np.__version__, "times": {}}
for w in spec:
    env = {"np": np}
    for name, shape in w["shapes"]:
        env[name] = rng.standard_normal(shape, dtype=np.float32)
    f = eval("lambda: " + w["expr"], env)
    f()
    times = []
    for _ in range(w["reps"]):
        t = time.perf_counter(); f(); times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    out["times"][w["name"]] = times[len(times) // 2]
print(json.dumps(out))
"#;

/// A workload for numpy: name, expression, and the name and shape of each input.
pub type Spec<'a> = (&'a str, &'a str, Vec<(&'a str, Vec<u64>)>);

/// Time `(name, numpy expression, input shapes)` workloads with `env` added to the peer's
/// environment; `Err` says why numpy could not run.
pub fn measure(
    python: &str,
    threads: usize,
    env: &[(&str, &str)],
    work: &[Spec<'_>],
) -> Result<Measured, String> {
    let spec: Vec<serde_json::Value> = work
        .iter()
        .map(|(name, expr, shapes)| serde_json::json!({"name": name, "expr": expr, "shapes": shapes, "reps": 9}))
        .collect();
    let t = threads.to_string();
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(serde_json::Value::Array(spec).to_string())
        .env("OPENBLAS_NUM_THREADS", &t)
        .env("OMP_NUM_THREADS", &t)
        .env("MKL_NUM_THREADS", &t)
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(if err.contains("No module named 'numpy'") {
            format!("numpy is not importable by {python} (pip install numpy, or set TENET_PYTHON)")
        } else {
            format!(
                "{python} failed: {}",
                err.lines().last().unwrap_or("").trim()
            )
        });
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("unreadable numpy output: {e}"))?;
    let times = v["times"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Measured {
        version: v["version"].as_str().unwrap_or("numpy").to_string(),
        times,
    })
}
