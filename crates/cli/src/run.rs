//! `tenet run`: read inputs from files, run the graph, write or print the outputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tenet_ir::{Graph, HostTensor, TensorType};
use tenet_models::{
    WeightSet, WeightsFile, check_bindings, outputs_json, read_tensor, write_outputs,
};

/// Split `NAME=PATH`.
fn split_assignment(arg: &str, what: &str) -> Result<(String, PathBuf)> {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => bail!("{what} {arg:?} must be NAME=PATH"),
    }
}

fn read_inputs(graph: &Graph, args: &[String]) -> Result<HashMap<String, HostTensor>> {
    let declared: Vec<(String, TensorType)> = graph
        .inputs()
        .map(|(_, n, t)| (n.to_string(), t.clone()))
        .collect();
    read_declared(&declared, args)
}

/// Read `--input` arguments for the inputs `declared`, each exactly once.
pub(crate) fn read_declared(
    declared: &[(String, TensorType)],
    args: &[String],
) -> Result<HashMap<String, HostTensor>> {
    let expected: HashMap<&str, &TensorType> =
        declared.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut inputs = HashMap::new();
    for arg in args {
        let (name, path) = split_assignment(arg, "--input")?;
        let Some(ty) = expected.get(name.as_str()) else {
            let known: Vec<String> = declared.iter().map(|(n, t)| format!("{n} ({t})")).collect();
            bail!(
                "the graph has no input {name:?}; its inputs are: {}",
                known.join(", ")
            );
        };
        if inputs.contains_key(&name) {
            bail!("input {name:?} is given twice");
        }
        inputs.insert(name.clone(), read_tensor(&path, &name, ty)?);
    }
    let missing: Vec<String> = declared
        .iter()
        .filter(|(n, _)| !inputs.contains_key(n))
        .map(|(n, t)| format!("{n} ({t})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "missing --input for: {} (give each as NAME=PATH)",
            missing.join(", ")
        );
    }
    Ok(inputs)
}

/// Write outputs as the `--output` arguments say.
fn write_requested(outputs: &[(String, HostTensor)], args: &[String]) -> Result<()> {
    for arg in args {
        let named = arg
            .split_once('=')
            .filter(|(n, _)| outputs.iter().any(|(o, _)| o == n));
        match named {
            Some((name, path)) => {
                let one: Vec<(String, HostTensor)> =
                    outputs.iter().filter(|(o, _)| o == name).cloned().collect();
                write_outputs(Path::new(path), &one)?;
            }
            None => write_outputs(Path::new(arg), outputs)?,
        }
    }
    Ok(())
}

pub(crate) fn summary(outputs: &[(String, HostTensor)]) -> String {
    let mut s = String::new();
    for (name, t) in outputs {
        let hash: String = t.hash()[..6].iter().map(|b| format!("{b:02x}")).collect();
        let n = t.numel().min(6);
        let head: Vec<String> = (0..n)
            .map(|i| {
                if t.dtype().is_float() {
                    format!("{}", t.get_f32(i))
                } else {
                    t.get_i64(i).to_string()
                }
            })
            .collect();
        let more = if t.numel() > n { ", ..." } else { "" };
        s.push_str(&format!(
            "{name:<16} {:<24} hash {hash}  [{}{more}]\n",
            t.ty().to_string(),
            head.join(", ")
        ));
    }
    s
}

/// The arguments of `tenet run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The graph: text form (.tg) or binary (.tnt), or a split's folder (`tenet split`), whose
    /// stages run one after another.
    pub graph: PathBuf,
    /// A graph input, NAME=PATH (.npy, .json, or .safetensors holding NAME or one tensor).
    #[arg(long = "input", short = 'i', value_name = "NAME=PATH")]
    pub inputs: Vec<String>,
    /// Weights files the graph refers to by hash (repeatable): safetensors, or GGUF (F32, F16,
    /// Q8_0 and Q4_1 tensors, dequantised to f32 as they load; `tenet export smollm2-*` graphs
    /// refer to SmolLM2's GGUF).
    #[arg(long, value_name = "FILE")]
    pub weights: Vec<PathBuf>,
    /// Where to write outputs: PATH (.npy for the only output; .json or .safetensors for all
    /// of them) or NAME=PATH for one output (repeatable). Without it, a summary is printed.
    #[arg(long = "output", short = 'o', value_name = "[NAME=]PATH")]
    pub outputs: Vec<String>,
    /// Seed of the job, for graphs with random ops.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print all outputs as one JSON object {name: {dtype, shape, data}}.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub device: crate::device_args::DeviceArgs,
    /// Run on the slow reference interpreter instead of the fast executor (same bits).
    #[arg(long)]
    pub reference: bool,
    /// Print where the time went to standard error: wall time per kind of step (gemm, fused
    /// elementwise passes, rows for softmax and norms, movement ops…) and peak tensor memory.
    #[arg(long, conflicts_with = "reference")]
    pub profile: bool,
}

/// `--profile`'s table: the run's time by kind of step, largest first.
fn profile(graph: &Graph, backend: &str, total_ms: f64, stats: &tenet_exec::RunStats) -> String {
    let mut s = format!(
        "profile of graph {} on {backend}: {total_ms:.2} ms (planning included), peak tensor memory {:.1} MiB\n",
        graph.id().short(),
        stats.peak_bytes as f64 / (1 << 20) as f64
    );
    s += &format!(
        "{:<12} {:>6} {:>10} {:>7}\n",
        "step kind", "steps", "ms", "share"
    );
    let mut kinds = stats.time_by_kind.clone();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.nanos));
    for k in &kinds {
        let ms = k.nanos as f64 / 1e6;
        s += &format!(
            "{:<12} {:>6} {:>10.3} {:>6.1}%\n",
            k.kind,
            k.steps,
            ms,
            100.0 * ms / total_ms.max(1e-9)
        );
    }
    if !stats.slowest.is_empty() {
        s += "slowest steps
";
        for (node, kind, nanos) in &stats.slowest {
            let n = graph.node(*node);
            s += &format!(
                "  {:<7} {:<10} {:>9.3} ms  {} -> {}\n",
                node.to_string(),
                kind,
                *nanos as f64 / 1e6,
                n.op.name(),
                n.ty
            );
        }
    }
    s
}

pub fn run(o: &RunArgs) -> Result<()> {
    if tenet_pipeline::is_split_dir(&o.graph) {
        return run_split(o);
    }
    if o.graph.is_dir() {
        bail!(
            "{} is a folder without a manifest.json: give a graph file, or a folder written by `tenet split`",
            o.graph.display()
        );
    }
    let graph = crate::load_graph(&o.graph)?;
    // A wrong `--device` is said before any file is read; the device compiles the graph
    // before inputs are read, so a graph over its memory is refused first too.
    let program = if o.reference {
        None
    } else {
        let device = o.device.open()?;
        let program = device.compile(&graph)?;
        Some((device, program))
    };
    let weights = WeightSet(
        o.weights
            .iter()
            .map(|p| {
                let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                let label = format!("loading {}", p.display());
                // Read, then index (GGUF: dequantise) — each pass counts the file's bytes.
                crate::progress::loading(&label, size, |n| WeightsFile::open_counting(p, n))
            })
            .collect::<Result<_, _>>()?,
    );
    // Running needs every weight: check before reading any input.
    check_bindings(&graph, &weights.0)?;
    // Refuse, before reading inputs, a graph this machine cannot hold.
    let needed = graph.cost().peak_bytes;
    if let Some(available) = tenet_exec::available_memory().filter(|&a| needed > a) {
        bail!(
            "graph {} needs up to {needed} bytes of tensor memory (its cost certificate) and this machine has {available} available",
            graph.id().short()
        );
    }
    let inputs = read_inputs(&graph, &o.inputs)?;
    let context = || format!("running graph {}", graph.id().short());
    let outputs = if let Some((device, program)) = &program {
        let started = std::time::Instant::now();
        let (outputs, stats) = program
            .run_with_stats(&inputs, &weights, o.seed)
            .with_context(context)?;
        if o.profile {
            let ms = started.elapsed().as_secs_f64() * 1e3;
            eprint!("{}", profile(&graph, &device.name(), ms, &stats));
        }
        outputs
    } else {
        tenet_reference::run(&graph, &inputs, &weights, o.seed).with_context(context)?
    };
    write_requested(&outputs, &o.outputs)?;
    if o.json {
        println!("{}", outputs_json(&outputs));
    } else if o.outputs.is_empty() {
        print!("{}", summary(&outputs));
    }
    Ok(())
}

/// `tenet run DIR`: a split's stages one after another, each stage's boundary tensors fed to
/// the next; `--profile` prints each stage's time and what crossed after it.
fn run_split(o: &RunArgs) -> Result<()> {
    if !o.weights.is_empty() {
        bail!(
            "{} is a split's folder, which carries each stage's weights: drop --weights",
            o.graph.display()
        );
    }
    let model = tenet_pipeline::load(&o.graph)
        .with_context(|| format!("loading the split in {}", o.graph.display()))?;
    let device = if o.reference {
        None
    } else {
        Some(o.device.open()?)
    };
    let declared: Vec<(String, TensorType)> = model
        .manifest
        .inputs
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.ty()?)))
        .collect();
    let inputs = read_declared(&declared, &o.inputs)?;
    let stages = model.stages.len();
    let outputs = tenet_pipeline::run_stages_with(&model, &inputs, |k, graph, inputs, weights| {
        let started = std::time::Instant::now();
        let outputs = match &device {
            Some(device) => device
                .compile(graph)
                .and_then(|p| p.run(inputs, weights, o.seed))
                .map_err(|e| e.to_string())?,
            None => {
                tenet_reference::run(graph, inputs, weights, o.seed).map_err(|e| e.to_string())?
            }
        };
        if o.profile {
            let crossing: u64 = outputs
                .iter()
                .filter(|(n, _)| n.starts_with('%'))
                .map(|(_, t)| t.bytes().len() as u64)
                .sum();
            eprintln!(
                "stage {}/{stages} (graph {}): {:.2} ms, {} bytes to the next stage",
                k + 1,
                graph.id().short(),
                started.elapsed().as_secs_f64() * 1e3,
                crossing
            );
        }
        Ok(outputs)
    })?;
    write_requested(&outputs, &o.outputs)?;
    if o.json {
        println!("{}", outputs_json(&outputs));
    } else if o.outputs.is_empty() {
        print!("{}", summary(&outputs));
    }
    Ok(())
}
