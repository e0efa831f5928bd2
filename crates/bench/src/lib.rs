//! `tenet bench`: workloads timed on the executor, on numpy (run through `python3` in the same
//! invocation), and against the FMA peak measured in the same run; SmolLM2 also on llama.cpp
//! (llama-cpp-python, through the same `python3`). Medians over repeats; the
//! machine is shared and noisy, so only ratios from one run mean much.

pub mod hostile;
mod llamacpp;
pub mod load;
pub mod node;
mod numpy;
pub mod onnx;
pub mod p2p;
mod peer;
pub mod pipeline;
pub mod scale;
pub mod watch;

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};
use tenet_devices::CpuDevice;
use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, NoWeights};

/// One measured workload.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub tenet_ms: f64,
    pub numpy_ms: Option<f64>,
    /// numpy again with OpenBLAS made to use its AVX-512 kernels, for the matmul rows: on AMD
    /// Zen, numpy's default OpenBLAS picks its AVX2 kernels; on Intel with AVX-512 it already
    /// picks these, and the column measures the same BLAS again.
    pub numpy_avx512_ms: Option<f64>,
    pub flops: Option<f64>,
    pub peak_gflops: f64,
    /// Items per run (sentences or tokens, for model workloads), to report a rate.
    pub items: Option<u64>,
    /// What the items are ("sentences", "tokens").
    pub unit: &'static str,
    /// Bytes a run must read from memory, for workloads bound by it (a decoding step reads
    /// every weight), and the read bandwidth measured in the same run.
    pub bytes: Option<(f64, f64)>,
    /// Why the numpy column is empty, when the reason is particular to this row.
    pub note: Option<String>,
    /// The share of the run's FMA peak this row may use (a 1-thread row of a 2-thread run:
    /// 0.5); `None` for all of it.
    pub peak_share: Option<f64>,
    /// For the rows llama.cpp runs too: its median time for the same work, or why it could
    /// not be measured; `None` for the other rows.
    pub llamacpp: Option<Result<f64, String>>,
    /// Bytes of weights llama.cpp reads a run (the Q4_1 tensors), for its decode rows.
    pub llamacpp_bytes: Option<f64>,
}

impl Row {
    pub fn gflops(&self) -> Option<f64> {
        self.flops.map(|f| f / (self.tenet_ms * 1e6))
    }

    /// GFLOP/s as a share of the peak this row may use.
    pub fn ratio_to_peak(&self) -> Option<f64> {
        self.gflops()
            .map(|g| g / (self.peak_gflops * self.peak_share.unwrap_or(1.0)))
    }

    /// llama.cpp's median time, when it ran.
    pub fn llamacpp_ms(&self) -> Option<f64> {
        self.llamacpp
            .as_ref()
            .and_then(|r| r.as_ref().ok().copied())
    }

    /// llama.cpp's read rate against the same bandwidth, for its decode rows.
    pub fn llamacpp_ratio_to_bandwidth(&self) -> Option<f64> {
        let (ms, bytes, (_, bw)) = (self.llamacpp_ms()?, self.llamacpp_bytes?, self.bytes?);
        Some(bytes / (ms * 1e6) / bw)
    }

    /// GB/s read, for memory-bound rows.
    pub fn bytes_rate(&self) -> Option<f64> {
        self.bytes.map(|(b, _)| b / (self.tenet_ms * 1e6))
    }

    pub fn json(&self, numpy_note: &Option<String>) -> Value {
        let numpy_note = self.note.as_ref().or(numpy_note.as_ref());
        let mut v = json!({
            format!("{}_per_s", self.unit): self.items.map(|n| round(n as f64 / (self.tenet_ms / 1e3))),
            "gbytes_per_s": self.bytes_rate().map(round),
            "ratio_to_bandwidth": self.bytes.and_then(|(_, bw)| self.bytes_rate().map(|r| round(r / bw))),
            "name": self.name,
            "tenet_ms": round(self.tenet_ms),
            "numpy_ms": self.numpy_ms.map(round),
            "numpy_note": numpy_note,
            "tenet_over_numpy": self.numpy_ms.map(|n| round(self.tenet_ms / n)),
            "numpy_avx512_ms": self.numpy_avx512_ms.map(round),
            "tenet_over_numpy_avx512": self.numpy_avx512_ms.map(|n| round(self.tenet_ms / n)),
            "gflops": self.gflops().map(round),
            "ratio_to_peak": self.ratio_to_peak().map(round),
        });
        if let (Some(peer), Some(o)) = (&self.llamacpp, v.as_object_mut()) {
            let ms = peer.as_ref().ok().copied();
            let rate = |ms: f64| round(self.items.unwrap_or(1) as f64 / (ms / 1e3));
            o.insert("llamacpp_ms".into(), json!(ms.map(round)));
            o.insert("llamacpp_tokens_per_s".into(), json!(ms.map(rate)));
            o.insert("llamacpp_note".into(), json!(peer.as_ref().err()));
            o.insert(
                "tenet_over_llamacpp".into(),
                json!(ms.map(|l| round(self.tenet_ms / l))),
            );
            if self.llamacpp_bytes.is_some() {
                o.insert(
                    "llamacpp_ratio_to_bandwidth".into(),
                    json!(self.llamacpp_ratio_to_bandwidth().map(round)),
                );
            }
        }
        v
    }

    /// The table's words for the llama.cpp peer of this row (empty for the other rows).
    fn llamacpp_text(&self) -> String {
        match &self.llamacpp {
            None => String::new(),
            Some(Err(_)) => "; llama.cpp —".into(),
            Some(Ok(ms)) => format!(
                "; llama.cpp {ms:.2} ms ({:.1} {}/s{}): tenet {:.2}× its time",
                self.items.unwrap_or(1) as f64 / (ms / 1e3),
                self.unit,
                self.llamacpp_ratio_to_bandwidth()
                    .map_or(String::new(), |r| format!(", {r:.2} of the bandwidth")),
                self.tenet_ms / ms
            ),
        }
    }
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A workload: a graph and how to make its inputs; `numpy` is the expression the peer times.
struct Workload {
    name: &'static str,
    graph: Graph,
    flops: Option<f64>,
    numpy: &'static str,
    shapes: Vec<(&'static str, Vec<u64>)>,
}

/// The numpy expression of the matmul workloads.
const MATMUL: &str = "a @ b";

fn workloads(quick: bool) -> Vec<Workload> {
    let mut w = Vec::new();
    let sizes: &[u64] = if quick { &[256, 512] } else { &[1024, 2048] };
    for &n in sizes {
        let g = GraphBuilder::new();
        let (a, b) = (
            g.input("a", DType::F32, &[n, n]),
            g.input("b", DType::F32, &[n, n]),
        );
        let graph = g.finish(&[("c", &a.matmul(&b))]).expect("valid");
        w.push(Workload {
            name: if n == 1024 {
                "matmul f32 1024²"
            } else if n == 2048 {
                "matmul f32 2048²"
            } else if n == 256 {
                "matmul f32 256²"
            } else {
                "matmul f32 512²"
            },
            graph,
            flops: Some(2.0 * (n as f64).powi(3)),
            numpy: MATMUL,
            shapes: vec![("a", vec![n, n]), ("b", vec![n, n])],
        });
    }
    let len: u64 = if quick { 1 << 20 } else { 1 << 24 };
    let g = GraphBuilder::new();
    let (x, y, z) = (
        g.input("x", DType::F32, &[len]),
        g.input("y", DType::F32, &[len]),
        g.input("z", DType::F32, &[len]),
    );
    w.push(Workload {
        name: if quick {
            "x*y+z over 1M f32"
        } else {
            "x*y+z over 16M f32"
        },
        graph: g.finish(&[("o", &(x * y + z))]).expect("valid"),
        flops: None,
        numpy: "x * y + z",
        shapes: vec![("x", vec![len]), ("y", vec![len]), ("z", vec![len])],
    });
    let side: u64 = if quick { 1024 } else { 4096 };
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[side, side]);
    w.push(Workload {
        name: if quick { "softmax (1024, 1024)" } else { "softmax (4096, 4096)" },
        graph: g.finish(&[("p", &x.softmax(-1))]).expect("valid"),
        flops: None,
        numpy: "(lambda e: e / e.sum(axis=-1, keepdims=True))(np.exp(x - x.max(axis=-1, keepdims=True)))",
        shapes: vec![("x", vec![side, side])],
    });
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[side, side]);
    w.push(Workload {
        name: if quick { "layer_norm (1024, 1024)" } else { "layer_norm (4096, 4096)" },
        graph: g.finish(&[("l", &x.layer_norm(None, None, 1e-5))]).expect("valid"),
        flops: None,
        numpy: "(lambda d: d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5))(x - x.mean(axis=-1, keepdims=True))",
        shapes: vec![("x", vec![side, side])],
    });
    w
}

/// Deterministic values in [-1, 1).
fn input(shape: &[u64], salt: u64) -> HostTensor {
    let n: u64 = shape.iter().product();
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ salt;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    HostTensor::from_f32(shape, &v).expect("sized")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Everything one run measured.
pub struct Report {
    /// Workloads that could not run, and why.
    pub notes: Vec<String>,
    pub backend: String,
    pub peak_gflops: f64,
    pub numpy: Result<String, String>,
    /// llama.cpp's version, or why it could not run; `None` without SmolLM2 rows.
    pub llamacpp: Option<Result<String, String>>,
    pub rows: Vec<Row>,
}

/// Run every workload on `device`; `cpu` (the machine's cores as the device would use them)
/// measures the FMA peak and read bandwidth and sets numpy's threads. `progress` hears what is
/// being measured.
pub fn run(
    device: &dyn Device,
    backend: &CpuDevice,
    python: &str,
    quick: bool,
    mut progress: impl FnMut(&str),
) -> Report {
    // The peak is what the machine can do, and noise only ever slows a probe down, so the
    // fastest of three probes before the workloads and three after is kept: on a shared
    // machine a probe, or even a median of three, can land in a slow spell, which would
    // flatter every ratio (one run here measured 390 GFLOP/s against the usual 420–425).
    // Probes are not interleaved with a workload's repeats: a probe just after the product
    // has run hard reads up to 25% low here, which would flatter the ratio the same way
    // (docs/PERFORMANCE.md, "How `tenet bench` measures").
    let measure_peak = || {
        (0..3)
            .map(|_| tenet_kernels::fma_peak_gflops(backend.level(), backend.threads(), 200))
            .fold(0.0, f64::max)
    };
    progress("measuring the FMA peak");
    let mut peak = measure_peak();
    let work = workloads(quick);
    progress("running the numpy side");
    let specs = |only_matmul: bool| -> Vec<numpy::Spec<'_>> {
        work.iter()
            .filter(|w| !only_matmul || w.numpy == MATMUL)
            .map(|w| (w.name, w.numpy, w.shapes.clone()))
            .collect()
    };
    let numpy = numpy::measure(python, backend.threads(), &[], &specs(false));
    // OpenBLAS reads this variable to pick its kernels; other BLAS builds ignore it, and the
    // column then repeats the default figure.
    let numpy_avx512 = match (&numpy, backend.level()) {
        (Ok(_), tenet_kernels::SimdLevel::Avx512) => {
            progress("running numpy's matmul with OpenBLAS's AVX-512 kernels");
            numpy::measure(
                python,
                backend.threads(),
                &[("OPENBLAS_CORETYPE", "SkylakeX")],
                &specs(true),
            )
            .ok()
        }
        _ => None,
    };
    let mut rows = Vec::new();
    for w in &work {
        progress(&format!("running {} on tenet", w.name));
        let prepared = device.compile(&w.graph).expect("bench graphs are valid");
        let inputs: HashMap<String, HostTensor> = w
            .shapes
            .iter()
            .enumerate()
            .map(|(i, (n, s))| (n.to_string(), input(s, i as u64)))
            .collect();
        let reps = if quick { 5 } else { 9 };
        let times = (0..reps)
            .map(|_| {
                let t = Instant::now();
                let out = prepared
                    .run(&inputs, &NoWeights, 0)
                    .expect("bench graphs run");
                std::hint::black_box(out);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        rows.push(Row {
            name: w.name.to_string(),
            tenet_ms: median(times),
            numpy_ms: numpy
                .as_ref()
                .ok()
                .and_then(|m| m.times.get(w.name).copied()),
            numpy_avx512_ms: numpy_avx512
                .as_ref()
                .and_then(|m| m.times.get(w.name).copied()),
            flops: w.flops,
            peak_gflops: peak,
            items: None,
            unit: "items",
            bytes: None,
            note: None,
            peak_share: None,
            llamacpp: None,
            llamacpp_bytes: None,
        });
    }
    let mut notes = Vec::new();
    match model_rows(device, peak, quick, &mut progress) {
        Ok(r) => rows.extend(r),
        Err(why) => notes.push(why),
    }
    let llamacpp = match smollm2_rows(device, backend, python, peak, quick, &mut progress) {
        Ok((r, peer)) => {
            rows.extend(r);
            Some(peer)
        }
        Err(why) => {
            notes.push(why);
            None
        }
    };
    progress("measuring the FMA peak again");
    peak = peak.max(measure_peak());
    for r in &mut rows {
        r.peak_gflops = peak;
    }
    Report {
        notes,
        backend: device.name(),
        peak_gflops: peak,
        numpy: numpy.map(|m| m.version),
        llamacpp,
        rows,
    }
}

impl Report {
    pub fn json(&self) -> Value {
        let note = self.numpy.as_ref().err().cloned();
        Value::Array(self.rows.iter().map(|r| r.json(&note)).collect())
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "tenet bench — {}; FMA peak {:.0} GFLOP/s measured in this run; numpy: {}\n\n",
            self.backend,
            self.peak_gflops,
            match &self.numpy {
                Ok(v) => v.clone(),
                Err(e) => format!("not measured ({e})"),
            }
        );
        match &self.llamacpp {
            Some(Ok(v)) => s.push_str(&format!(
                "llama.cpp: {v}, on the same GGUF file (its Q4_1 weights as stored), same tokens and threads\n\n"
            )),
            Some(Err(e)) => s.push_str(&format!("llama.cpp: not measured ({e})\n\n")),
            None => {}
        }
        s.push_str(&format!(
            "{:<34} {:>10} {:>10} {:>12} {:>9} {:>8} {:>22}\n",
            "workload",
            "tenet ms",
            "numpy ms",
            "tenet/numpy",
            "GFLOP/s",
            "of peak",
            "numpy AVX-512 BLAS ms"
        ));
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        for r in &self.rows {
            let opt =
                |v: Option<f64>, p: usize| v.map_or("—".to_string(), |v| format!("{v:.p$}"));
            if let (Some(rate), Some((_, bw))) = (r.bytes_rate(), r.bytes) {
                // A memory-bound row: read rate against the bandwidth measured in this run.
                s.push_str(&format!(
                    "{:<34} {:>10.2} {:>10} {:>12} {:>9} {:>8}   {:.1} GB/s read = {:.2} of the {:.1} GB/s measured{}\n",
                    format!("{} ({:.1} {}/s)", r.name, r.items.unwrap_or(1) as f64 / (r.tenet_ms / 1e3), r.unit),
                    r.tenet_ms,
                    "—",
                    "—",
                    "—",
                    "—",
                    rate,
                    rate / bw,
                    bw,
                    r.llamacpp_text(),
                ));
                continue;
            }
            s.push_str(&format!(
                "{:<34} {:>10.2} {:>10} {:>12} {:>9} {:>8} {:>22}{}\n",
                match r.items {
                    Some(n) => format!("{} ({:.1}/s)", r.name, n as f64 / (r.tenet_ms / 1e3)),
                    None => r.name.clone(),
                },
                r.tenet_ms,
                opt(r.numpy_ms, 2),
                opt(r.numpy_ms.map(|n| r.tenet_ms / n), 2),
                opt(r.gflops(), 0),
                opt(r.ratio_to_peak(), 2),
                r.numpy_avx512_ms.map_or("—".to_string(), |n| format!(
                    "{n:.2} (tenet {:.2}×)",
                    r.tenet_ms / n
                )),
                r.llamacpp_text(),
            ));
        }
        s
    }
}

/// MiniLM sentence embeddings at batch 1 and 32 (128 tokens each; smaller with `quick`), if the
/// model has been fetched.
fn model_rows(
    backend: &dyn Device,
    peak: f64,
    quick: bool,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Row>, String> {
    use tenet_models::fetch::{MINILM, cached};
    use tenet_models::minilm::{Batch, MiniLm};
    let dir = cached(&MINILM).map_err(|e| format!("MiniLM workloads skipped: {e}"))?;
    let model = MiniLm::load(&dir).map_err(|e| format!("MiniLM workloads skipped: {e}"))?;
    let seq = if quick { 32 } else { 128 };
    let mut rows = Vec::new();
    for batch in [1usize, if quick { 4 } else { 32 }] {
        let name = format!("minilm batch {batch}×{seq}");
        progress(&format!("running {name} on tenet"));
        let graph = model.graph(batch, seq).map_err(|e| e.to_string())?;
        let ids = Batch {
            ids: (0..batch)
                .map(|b| (0..seq).map(|t| (1000 + 31 * b + t) as u32).collect())
                .collect(),
            seq,
        };
        let inputs = MiniLm::inputs(&ids);
        let prepared = backend.compile(&graph).map_err(|e| e.to_string())?;
        let reps = if quick { 3 } else { 7 };
        let times = (0..reps)
            .map(|_| {
                let t = Instant::now();
                let out = prepared
                    .run(&inputs, &model.weights, 0)
                    .expect("the model runs");
                std::hint::black_box(out);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        rows.push(Row {
            name,
            tenet_ms: median(times),
            numpy_ms: None,
            numpy_avx512_ms: None,
            flops: Some(graph.cost().flops as f64),
            peak_gflops: peak,
            items: Some(batch as u64),
            unit: "sentences",
            bytes: None,
            note: Some("no numpy peer for model workloads".into()),
            peak_share: None,
            llamacpp: None,
            llamacpp_bytes: None,
        });
    }
    Ok(rows)
}

/// The prompt of the prefill rows: this text's first [`PREFILL_TOKENS`] tokens.
const PREFILL_TEXT: &str = "A verifiable computation lets anyone check that a result came from \
    the program and the inputs it claims, without trusting the machine that produced it. ";

/// Tokens in the prefill rows' prompt.
const PREFILL_TOKENS: usize = 128;

/// SmolLM2 rows, against llama.cpp run in the same invocation, if the model has been fetched.
///
/// Decoding with the KV cache: the median time of one decode step after a short prompt (a
/// [`tenet_models::smollm2::DecodeSession`]: the cache resident on the device, the decode
/// program compiled once, before the timed steps), the bytes of weights each step reads (all
/// of them, as f32: the weight format chosen, see ARCHITECTURE.md), and the machine's read
/// bandwidth measured now with the same threads, for the fraction of the memory limit
/// reached. Prefill: the median time of [`PREFILL_TOKENS`] tokens into a new session (which
/// includes compiling the prefill graph, as every prefill does).
///
/// On the CPU, at 1 and 2 threads and the device's own count (that count alone with `quick`);
/// on another device, on it alone. llama.cpp loads the same GGUF file (its Q4_1 weights as they
/// are), prefills the same token ids and decodes the same tokens at the same thread counts
/// (the device's CPU threads for another device). The second value is llama.cpp's version, or
/// why it could not run.
fn smollm2_rows(
    device: &dyn Device,
    backend: &CpuDevice,
    python: &str,
    peak: f64,
    quick: bool,
    progress: &mut impl FnMut(&str),
) -> Result<(Vec<Row>, Result<String, String>), String> {
    use tenet_models::fetch::{SMOLLM2, cached};
    use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode, argmax, llama_graph};
    let skipped = |e: String| format!("SmolLM2 rows skipped: {e}");
    let dir = cached(&SMOLLM2).map_err(|e| skipped(e.to_string()))?;
    progress("loading SmolLM2");
    let gguf = tenet_models::fetch::find_file(&dir, GGUF_FILE)
        .ok_or_else(|| skipped(format!("no {GGUF_FILE} under {}", dir.display())))?;
    // The GGUF's blocks as they are: products read them directly, as llama.cpp's do.
    let mode = WeightsMode::Quantized;
    let model =
        std::sync::Arc::new(SmolLm2::load_with(&gguf, mode).map_err(|e| skipped(e.to_string()))?);
    // The same blocks with `qmatmul_q8` products (llama.cpp's arithmetic): decode rows of its
    // own beside the f32-exact ones.
    let q8 = std::sync::Arc::new(
        SmolLm2::load_with(&gguf, WeightsMode::Q8).map_err(|e| skipped(e.to_string()))?,
    );
    let weight_bytes: f64 = model
        .weights
        .tensors
        .values()
        .map(|t| t.bytes().len() as f64)
        .sum();
    // What llama.cpp reads a step: every tensor as stored (the embedding table is the output
    // projection too, so all of it).
    let quantized_bytes: f64 = tenet_models::gguf::GgufFile::open(&gguf)
        .map_err(|e| skipped(e.to_string()))?
        .tensors
        .iter()
        .map(|t| t.range.len() as f64)
        .sum();
    let on_cpu = device.info().spec == "cpu";
    let threads: Vec<usize> = if !on_cpu || quick {
        vec![backend.threads()]
    } else {
        let mut t = vec![1, 2, backend.threads()];
        t.sort_unstable();
        t.dedup();
        t
    };
    let prompt = model.encode("The capital of France is").map_err(skipped)?;
    let long = model
        .encode(&PREFILL_TEXT.repeat(8))
        .map_err(skipped)?
        .into_iter()
        .take(PREFILL_TOKENS)
        .collect::<Vec<_>>();
    if long.len() < PREFILL_TOKENS {
        return Err(skipped(format!(
            "the prefill text gives {} tokens, not {PREFILL_TOKENS}",
            long.len()
        )));
    }
    let prefill_flops = llama_graph(
        &model.config,
        model.weights.id,
        0,
        PREFILL_TOKENS as u64,
        true,
    )
    .map_err(skipped)?
    .cost()
    .flops as f64;
    let (steps, prefills) = if quick { (4, 2) } else { (24, 5) };
    // The tokens fed to the decode steps (the untimed first one included), for llama.cpp.
    let mut fed = Vec::new();
    // (threads, decode ms, bandwidth, prefill ms) per thread count.
    let mut measured = Vec::new();
    for &t in &threads {
        let own = on_cpu.then(|| {
            tenet_devices::cpu(&tenet_devices::Options {
                threads: Some(t),
                simd: Some(backend.level()),
                memory_limit: None,
            })
        });
        let dev: &dyn Device = match &own {
            Some(cpu) => cpu,
            None => device,
        };
        let label = if on_cpu {
            format!(", {t} thread{}", if t == 1 { "" } else { "s" })
        } else {
            String::new()
        };
        progress(&format!("measuring the read bandwidth with {t} threads"));
        let bandwidth = tenet_kernels::read_bandwidth_gbs(t, 512 << 20, 5);
        progress(&format!("running smollm2 decode{label} on tenet"));
        // Greedy decode steps after the prompt: the tokens fed and each step's time.
        let decode = |model: &SmolLm2| -> Result<(Vec<u32>, f64), String> {
            let mut session = model.session(dev);
            let mut logits = session.prefill(&prompt)?;
            let mut tokens = Vec::new();
            // The first step compiles the decode program; the timed ones only run it.
            tokens.push(argmax(&logits));
            logits = session.step(tokens[0])?;
            let mut times = Vec::new();
            for _ in 0..steps {
                let next = argmax(&logits);
                tokens.push(next);
                let start = Instant::now();
                logits = session.step(next)?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            Ok((tokens, median(times)))
        };
        let (tokens, decode_ms) = decode(&model).map_err(skipped)?;
        if fed.is_empty() {
            fed = tokens;
        }
        progress(&format!(
            "running smollm2 decode{label}, q8 weights, on tenet"
        ));
        let (_, q8_ms) = decode(&q8).map_err(skipped)?;
        progress(&format!(
            "running smollm2 prefill of {PREFILL_TOKENS} tokens{label} on tenet"
        ));
        let mut prefill_times = Vec::new();
        // One untimed prefill first, like llama.cpp's.
        for i in 0..=prefills {
            let mut session = model.session(dev);
            let start = Instant::now();
            std::hint::black_box(session.prefill(&long).map_err(skipped)?);
            if i > 0 {
                prefill_times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        measured.push((label, t, decode_ms, q8_ms, bandwidth, median(prefill_times)));
    }
    progress(&format!(
        "running {BATCH_REQUESTS} smollm2 requests one after another, then batched"
    ));
    // A device of the run's kind that the batcher's thread can own.
    let shared = tenet_devices::open(
        &device.info().spec,
        &tenet_devices::Options {
            threads: Some(backend.threads()),
            simd: Some(backend.level()),
            memory_limit: None,
        },
    )
    .map_err(|e| skipped(e.to_string()))?;
    let tokens = if quick { 8 } else { 32 };
    // Prompts of prose (the prefill text's first 16 to 23 tokens), which a model continues
    // rather than ends.
    // In both arithmetics a node can serve (`exact` is the `quantized` model's).
    let mut batching =
        batching_rows(&model, shared.clone(), &long, tokens, peak).map_err(skipped)?;
    batching.extend(batching_rows(&q8, shared, &long, tokens, peak).map_err(skipped)?);
    progress("running smollm2 on llama.cpp");
    let peer = llamacpp::measure(
        python,
        &llamacpp::Spec {
            model: &gguf,
            threads: threads.clone(),
            prefill: &long,
            prefill_reps: prefills,
            prompt: &prompt,
            decode: &fed,
        },
    );
    let peer_ms = |t: usize, pick: fn(&llamacpp::Timing) -> f64| -> Result<f64, String> {
        match &peer {
            Ok(m) => m
                .by_threads
                .get(&t)
                .map(pick)
                .ok_or_else(|| format!("llama-cpp-python gave no figure at {t} threads")),
            Err(e) => Err(e.clone()),
        }
    };
    let mut rows = Vec::new();
    for (label, t, decode_ms, q8_ms, bandwidth, prefill_ms) in measured {
        let row = |name: String, ms: f64| Row {
            name,
            tenet_ms: ms,
            numpy_ms: None,
            numpy_avx512_ms: None,
            flops: None,
            peak_gflops: peak,
            items: Some(1),
            unit: "tokens",
            bytes: None,
            note: Some("no numpy peer for model workloads".into()),
            peak_share: None,
            llamacpp: None,
            llamacpp_bytes: None,
        };
        rows.push(Row {
            bytes: Some((weight_bytes, bandwidth)),
            llamacpp: Some(peer_ms(t, |m| m.decode_ms)),
            llamacpp_bytes: Some(quantized_bytes),
            ..row(format!("smollm2 decode, {mode} weights{label}"), decode_ms)
        });
        rows.push(Row {
            bytes: Some((weight_bytes, bandwidth)),
            llamacpp: Some(peer_ms(t, |m| m.decode_ms)),
            llamacpp_bytes: Some(quantized_bytes),
            ..row(
                format!("smollm2 decode, {} weights{label}", WeightsMode::Q8),
                q8_ms,
            )
        });
        rows.push(Row {
            items: Some(PREFILL_TOKENS as u64),
            flops: Some(prefill_flops),
            peak_share: on_cpu.then(|| t as f64 / backend.threads() as f64),
            llamacpp: Some(peer_ms(t, |m| m.prefill_ms)),
            ..row(
                format!("smollm2 prefill {PREFILL_TOKENS} tokens, {mode} weights{label}"),
                prefill_ms,
            )
        });
    }
    rows.extend(batching);
    Ok((rows, peer.map(|m| m.version)))
}

/// Concurrent requests in the batching rows.
const BATCH_REQUESTS: usize = 8;

/// [`BATCH_REQUESTS`] greedy generations of `tokens` tokens each after prompts of different
/// lengths: first one after another (each alone, as a node without batching serves them),
/// then submitted together to one continuous batch; the second row's note gives its aggregate
/// tokens/s against the first's, and every request's tokens must be the same both times.
fn batching_rows(
    model: &std::sync::Arc<tenet_models::smollm2::SmolLm2>,
    device: std::sync::Arc<dyn Device>,
    prompt: &[u32],
    tokens: usize,
    peak: f64,
) -> Result<Vec<Row>, String> {
    use tenet_models::smollm2::{Batcher, GenerationEvent, GenerationRequest};
    let requests: Vec<GenerationRequest> = (0..BATCH_REQUESTS)
        .map(|i| GenerationRequest {
            // Different prompts: the text's first 16 + i tokens.
            prompt: prompt[..(16 + i).min(prompt.len())].to_vec(),
            max_tokens: tokens,
            sampling: None,
            first_step: 0,
            stop: vec![],
        })
        .collect();
    let start = Instant::now();
    let mut alone = Vec::new();
    for r in &requests {
        // Each alone, as `tenet generate` runs it (ending at the end-of-sequence token, as
        // the batch does).
        alone.push(model.generate(&r.prompt, r.max_tokens, None, &*device, |_| {})?);
    }
    let sequential_ms = start.elapsed().as_secs_f64() * 1e3;
    let batcher = Batcher::start(model.clone(), device, BATCH_REQUESTS);
    // One untimed request first, as the sequential run had its programs compiled by then.
    let warm = batcher.submit(GenerationRequest {
        max_tokens: 2,
        ..requests[0].clone()
    });
    for _ in warm {}
    let start = Instant::now();
    let receivers: Vec<_> = requests.iter().map(|r| batcher.submit(r.clone())).collect();
    let mut batched = Vec::new();
    for rx in receivers {
        let mut out = Vec::new();
        for e in rx {
            match e {
                GenerationEvent::Token(t) => out.push(t),
                GenerationEvent::Done(_) => break,
                GenerationEvent::Failed(e) => return Err(e),
            }
        }
        batched.push(out);
    }
    let batched_ms = start.elapsed().as_secs_f64() * 1e3;
    if batched != alone {
        return Err("batched requests gave other tokens than the same requests alone".into());
    }
    let total: usize = alone.iter().map(Vec::len).sum();
    let row = |name: String, ms: f64, note: String| Row {
        name,
        tenet_ms: ms,
        numpy_ms: None,
        numpy_avx512_ms: None,
        flops: None,
        peak_gflops: peak,
        items: Some(total as u64),
        unit: "tokens",
        bytes: None,
        note: Some(note),
        peak_share: None,
        llamacpp: None,
        llamacpp_bytes: None,
    };
    let n = BATCH_REQUESTS;
    let mode = model.mode();
    let note = || "no numpy peer for model workloads".to_string();
    Ok(vec![
        row(
            format!("smollm2 {n} requests × {tokens} tokens, {mode} weights, one after another"),
            sequential_ms,
            note(),
        ),
        row(
            format!(
                "smollm2 {n} requests × {tokens} tokens, {mode} weights, batched ({:.2}× one after another, peak batch {})",
                sequential_ms / batched_ms,
                batcher.stats().peak_batch
            ),
            batched_ms,
            note(),
        ),
    ])
}
