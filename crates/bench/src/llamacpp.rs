//! The llama.cpp peer: llama-cpp-python, run through `python3` (or `TENET_PYTHON`) like the
//! numpy peer, loading the same GGUF file tenet decodes (SmolLM2-135M-Instruct, Q4_1) and
//! timing the same work: a prefill of the same prompt's token ids, and decode steps that feed
//! the same tokens tenet's greedy decoding produced, at each thread count.
//!
//! Both read the Q4_1 and Q8_0 weights as they are in the file (tenet's `qmatmul` decodes the
//! blocks inside the product; llama.cpp also quantises the activations to 8 bits):
//! docs/PERFORMANCE.md, "SmolLM2 decoding".

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// What the peer is asked to run.
pub struct Spec<'a> {
    /// The GGUF file tenet loaded.
    pub model: &'a Path,
    /// Thread counts, each one measured with a fresh `Llama`.
    pub threads: Vec<usize>,
    /// The prompt of the prefill rows, as token ids.
    pub prefill: &'a [u32],
    /// Timed prefills (after one untimed).
    pub prefill_reps: usize,
    /// The short prompt before the decode steps.
    pub prompt: &'a [u32],
    /// The tokens fed one by one after `prompt`; the first step is untimed, like tenet's.
    pub decode: &'a [u32],
}

/// llama.cpp's medians at one thread count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// One prefill of [`Spec::prefill`].
    pub prefill_ms: f64,
    /// One decode step.
    pub decode_ms: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// `llama-cpp-python 0.3.x`.
    pub version: String,
    pub by_threads: BTreeMap<usize, Timing>,
}

const SCRIPT: &str = r#"
import json, sys, time
spec = json.loads(sys.argv[1])
try:
    import llama_cpp
    from llama_cpp import Llama
except ImportError as e:
    print(json.dumps({"unavailable": str(e)}))
    sys.exit(0)

def median(v):
    v = sorted(v)
    return v[len(v) // 2]

out = {"version": "llama-cpp-python " + getattr(llama_cpp, "__version__", "?"), "threads": {}}
for t in spec["threads"]:
    llm = Llama(model_path=spec["model"], n_threads=t, n_threads_batch=t, n_ctx=512,
                verbose=False, logits_all=False)
    times = []
    for i in range(spec["prefill_reps"] + 1):
        llm.reset()
        s = time.perf_counter()
        llm.eval(spec["prefill"])
        e = time.perf_counter()
        if i:
            times.append((e - s) * 1e3)
    llm.reset()
    llm.eval(spec["prompt"])
    steps = []
    for i, tok in enumerate(spec["decode"]):
        s = time.perf_counter()
        llm.eval([tok])
        e = time.perf_counter()
        if i:
            steps.append((e - s) * 1e3)
    out["threads"][str(t)] = {"prefill_ms": median(times), "decode_ms": median(steps)}
    del llm
print(json.dumps(out))
"#;

/// Run the peer through `python`; `Err` says why llama.cpp could not be measured.
pub fn measure(python: &str, spec: &Spec<'_>) -> Result<Measured, String> {
    let arg = serde_json::json!({
        "model": spec.model.to_string_lossy(),
        "threads": spec.threads,
        "prefill": spec.prefill,
        "prefill_reps": spec.prefill_reps,
        "prompt": spec.prompt,
        "decode": spec.decode,
    });
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(arg.to_string())
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    parse(python, out.status.success(), &out.stdout, &out.stderr)
}

/// Read the peer's output: its last line holds one JSON object.
pub(crate) fn parse(
    python: &str,
    success: bool,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<Measured, String> {
    let v = crate::peer::result(
        "llama-cpp-python",
        "pip install llama-cpp-python, or set TENET_PYTHON",
        python,
        success,
        stdout,
        stderr,
    )?;
    let threads = v["threads"]
        .as_object()
        .ok_or_else(|| "llama-cpp-python output has no \"threads\"".to_string())?;
    let mut by_threads = BTreeMap::new();
    for (t, m) in threads {
        let t: usize = t
            .parse()
            .map_err(|_| format!("llama-cpp-python output: bad thread count {t:?}"))?;
        let ms = |key: &str| {
            m[key]
                .as_f64()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("llama-cpp-python output: no {key} at {t} threads"))
        };
        by_threads.insert(
            t,
            Timing {
                prefill_ms: ms("prefill_ms")?,
                decode_ms: ms("decode_ms")?,
            },
        );
    }
    Ok(Measured {
        version: v["version"]
            .as_str()
            .unwrap_or("llama-cpp-python")
            .to_string(),
        by_threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_peers_json_after_any_chatter() {
        let out = b"llama_model_loader: something\n{\"version\": \"llama-cpp-python 0.3.16\", \"threads\": {\"1\": {\"prefill_ms\": 210.5, \"decode_ms\": 9.25}, \"2\": {\"prefill_ms\": 120.0, \"decode_ms\": 6.5}}}\n";
        let m = parse("python3", true, out, b"").unwrap();
        assert_eq!(m.version, "llama-cpp-python 0.3.16");
        assert_eq!(
            m.by_threads[&1],
            Timing {
                prefill_ms: 210.5,
                decode_ms: 9.25
            }
        );
        assert_eq!(m.by_threads[&2].decode_ms, 6.5);
        assert_eq!(m.by_threads.len(), 2);
    }

    #[test]
    fn says_why_when_the_module_is_missing() {
        let out = b"{\"unavailable\": \"No module named 'llama_cpp'\"}\n";
        let e = parse("/usr/bin/python3", true, out, b"").unwrap_err();
        assert!(
            e.contains("llama-cpp-python is not importable by /usr/bin/python3")
                && e.contains("No module named 'llama_cpp'")
                && e.contains("pip install llama-cpp-python, or set TENET_PYTHON"),
            "{e}"
        );
    }

    #[test]
    fn says_why_when_the_peer_fails_or_prints_nonsense() {
        let e = parse(
            "python3",
            false,
            b"",
            b"Traceback (most recent call last):\nValueError: Failed to load model from file\n\n",
        )
        .unwrap_err();
        assert_eq!(
            e,
            "llama-cpp-python failed under python3: ValueError: Failed to load model from file"
        );
        let e = parse("python3", true, b"", b"").unwrap_err();
        assert!(e.contains("printed no result"), "{e}");
        let e = parse("python3", true, b"{\"threads\": 3}", b"").unwrap_err();
        assert!(e.contains("no \"threads\""), "{e}");
        let e = parse(
            "python3",
            true,
            b"{\"threads\": {\"2\": {\"prefill_ms\": 1.0, \"decode_ms\": null}}}",
            b"",
        )
        .unwrap_err();
        assert!(e.contains("no decode_ms at 2 threads"), "{e}");
    }

    #[test]
    fn a_missing_interpreter_is_a_note_not_a_panic() {
        let model = Path::new("/nonexistent.gguf");
        let e = measure(
            "/nonexistent/python-for-tenet-bench",
            &Spec {
                model,
                threads: vec![1],
                prefill: &[1, 2],
                prefill_reps: 1,
                prompt: &[1],
                decode: &[2, 3],
            },
        )
        .unwrap_err();
        assert!(
            e.starts_with("cannot run /nonexistent/python-for-tenet-bench"),
            "{e}"
        );
    }
}
