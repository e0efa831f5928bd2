//! `tenet split`: cut a graph into stages whose certificates each fit a memory limit (or into
//! a number of stages), and write them as a folder that `tenet run DIR` runs.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use tenet_ir::split::SplitTarget;
use tenet_models::{WeightSet, WeightsFile};

/// The arguments of `tenet split`.
#[derive(clap::Args)]
pub struct SplitArgs {
    /// The graph: text form (.tg) or binary (.tnt).
    pub graph: PathBuf,
    /// The most tensor memory one stage may need (its certificate's peak bytes, what a node
    /// checks against its --memory-limit): 300M, 2G, 123456.
    #[arg(
        long,
        value_name = "BYTES",
        conflicts_with = "stages",
        required_unless_present = "stages"
    )]
    pub memory: Option<String>,
    /// This many stages, as even in memory as the places to cut allow.
    #[arg(long, value_name = "N")]
    pub stages: Option<usize>,
    /// Weights files the graph refers to by hash (repeatable); each stage gets a file of its
    /// own with only the tensors it reads.
    #[arg(long, value_name = "FILE")]
    pub weights: Vec<PathBuf>,
    /// The folder to write: manifest.json, stage-K.tnt and stage-K.safetensors per stage.
    #[arg(short, long, value_name = "DIR")]
    pub output: PathBuf,
    /// Print the manifest as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

pub fn split(o: &SplitArgs) -> Result<()> {
    let graph = crate::load_graph(&o.graph)?;
    let target = match (&o.memory, o.stages) {
        (Some(m), _) => {
            SplitTarget::Memory(tenet_node::config::parse_size(m).with_context(|| {
                format!("--memory {m:?} is not a size such as 300M, 2G or 123456")
            })?)
        }
        (None, Some(0)) => bail!("--stages must be at least 1"),
        (None, Some(n)) => SplitTarget::Stages(n),
        (None, None) => bail!("give --memory BYTES or --stages N"),
    };
    let weights = WeightSet(
        o.weights
            .iter()
            .map(|p| {
                let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                let label = format!("loading {}", p.display());
                crate::progress::loading(&label, size, |n| WeightsFile::open_counting(p, n))
                    .with_context(|| format!("loading weights {}", p.display()))
            })
            .collect::<Result<_>>()?,
    );
    let manifest = tenet_pipeline::write_split(&graph, &weights, target, &o.output, |k, n| {
        if !o.json {
            eprintln!("writing stage {} of {n}", k + 1);
        }
    })
    .with_context(|| format!("splitting graph {}", graph.id().short()))?;
    if o.json {
        println!("{}", manifest.to_json());
        return Ok(());
    }
    println!(
        "split graph {} (peak {}) into {} stages -> {}",
        graph.id().short(),
        mib(graph.cost().peak_bytes),
        manifest.stages.len(),
        o.output.display()
    );
    print_stages(&manifest);
    let inputs: Vec<String> = manifest
        .inputs
        .iter()
        .map(|p| format!("-i {}=...", p.name))
        .collect();
    println!(
        "run it: tenet run {} {}",
        o.output.display(),
        inputs.join(" ")
    );
    Ok(())
}

/// The stages of a split as a table: id, peak, weights, nodes, and what crosses to the next.
pub fn print_stages(manifest: &tenet_pipeline::Manifest) {
    println!(
        "{:<6} {:<14} {:>11} {:>11} {:>12}  boundary to the next stage",
        "stage", "id", "peak", "weights", "nodes"
    );
    for (k, s) in manifest.stages.iter().enumerate() {
        let weights: u64 = s.weights.iter().map(|w| w.bytes).sum();
        let boundary: Vec<String> = s
            .boundary_out
            .iter()
            .map(|p| {
                let dims: Vec<String> = p.shape.iter().map(u64::to_string).collect();
                format!("{} {}[{}]", p.name, p.dtype, dims.join(","))
            })
            .collect();
        println!(
            "{:<6} {:<14} {:>11} {:>11} {:>12}  {}",
            k + 1,
            &s.graph[..12],
            mib(s.peak_bytes),
            mib(weights),
            format!("{}..{}", s.nodes[0], s.nodes[1]),
            if boundary.is_empty() {
                "(outputs)".to_string()
            } else {
                boundary.join(", ")
            }
        );
    }
}

/// `tenet inspect DIR`: a split's folder, loaded and checked file by file.
pub fn inspect(dir: &std::path::Path, json: bool) -> Result<()> {
    let model = tenet_pipeline::load(dir)
        .with_context(|| format!("loading the split in {}", dir.display()))?;
    let m = &model.manifest;
    if json {
        println!("{}", m.to_json());
        return Ok(());
    }
    let io = |ports: &[tenet_pipeline::Port]| {
        ports
            .iter()
            .map(|p| {
                let dims: Vec<String> = p.shape.iter().map(u64::to_string).collect();
                format!("{} {}[{}]", p.name, p.dtype, dims.join(","))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "split of graph {} in {} stages ({}): every stage graph and weights file matches the manifest, and the stages chain",
        &m.whole[..12],
        m.stages.len(),
        dir.display()
    );
    println!("inputs:  {}", io(&m.inputs));
    println!("outputs: {}", io(&m.outputs));
    print_stages(m);
    Ok(())
}
