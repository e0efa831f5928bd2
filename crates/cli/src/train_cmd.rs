//! `tenet train`: parse, open the dataset and the device, run `tenet_train::train`, and show
//! its progress (a bar redrawn in place on a terminal, a line per epoch otherwise) and report.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tenet_train::{Arch, Checkpoint, Event, Optimizer, TrainConfig};

use crate::device_args::DeviceArgs;

mod network;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The dataset: `digits` (scikit-learn's 8×8 digits) or `mnist` (28×28); fetch it first
    /// with `tenet models fetch digits|mnist`.
    #[arg(long, value_name = "NAME")]
    dataset: Option<String>,
    /// The model: `mlp` (one hidden layer of 512) or `cnn` (two 3×3 conv + pool blocks)
    /// [default: mlp].
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// The seed: the starting weights and the order of the samples. The same seed gives the
    /// same final weights, bit for bit, on every machine, thread count and SIMD level
    /// [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// Passes over the training set [default: 40 for digits, 2 for mnist].
    #[arg(long)]
    epochs: Option<u32>,
    /// Samples per step [default: 32].
    #[arg(long)]
    batch: Option<u64>,
    /// Shards each batch is cut into, each shard's gradient computed on its own and the
    /// gradients added in order; part of what the result is. With --coordinator each shard is
    /// a verified job of its own (data-parallel training) [default: 1].
    #[arg(long, visible_alias = "data-parallel")]
    shards: Option<u64>,
    /// Pipeline-parallel training: the layers where pipeline stages begin, by name (`fc2`,
    /// `conv2`) or 0-based position, comma-separated. With --coordinator each shard's step runs
    /// as a pipeline of 2n+1 stages (each group of layers' forward pass, then the last group's
    /// forward, loss and backward together, then each earlier group's backward), every stage a
    /// verified job on nodes whose limits take it; the result is the same bits as without.
    /// Locally the step runs whole.
    #[arg(long, value_name = "LAYERS", value_delimiter = ',')]
    stage_boundaries: Vec<String>,
    /// `adamw` or `sgd` (with momentum 0.9) [default: adamw].
    #[arg(long)]
    optimizer: Option<String>,
    /// Learning rate [default: adamw 0.0005 on digits and 0.001 on mnist; sgd 0.05].
    #[arg(long)]
    lr: Option<f32>,
    /// Where checkpoints, `weights.safetensors`, `loss.csv` and `loss.svg` (or, on the
    /// network, `training-receipt.json`) go [default: tenet-train].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Continue from a checkpoint: its file, or its hash (or first 8+ characters) in
    /// OUT/checkpoints. The settings must match the checkpoint's; --epochs may grow.
    #[arg(long, value_name = "CHECKPOINT")]
    resume: Option<String>,
    /// Settings from a YAML file of flat `key: value` lines (dataset, model, seed, epochs,
    /// batch, data_parallel, stage_boundaries, optimizer, lr, coordinator, out); flags given as
    /// well win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Train on the network: the coordinator at this URL runs every step's shards as
    /// verified jobs on its nodes, then the update; the training receipt that comes back is
    /// checked here (every job's signature, the chain between them, the graphs, the batches
    /// this seed cuts from the local copy of the dataset, the weights) before anything is
    /// reported.
    #[arg(long, value_name = "URL")]
    coordinator: Option<String>,
    /// The API key for --coordinator (none for an `--open` one).
    #[arg(long, value_name = "KEY", env = "TENET_API_KEY")]
    api_key: Option<String>,
    /// Print one JSON object at the end (test_accuracy, final_loss, steps, weights_hash, ...)
    /// and no progress.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// The settings of a run: flags, over a config file, over defaults.
struct Settings {
    dataset: String,
    model: String,
    arch: Arch,
    optimizer_name: String,
    optimizer: Optimizer,
    lr: Option<f32>,
    seed: u64,
    epochs: Option<u32>,
    batch: u64,
    shards: u64,
    /// Layers where pipeline stages begin (names or positions), checked against the model.
    stage_boundaries: Vec<String>,
    out: PathBuf,
    coordinator: Option<String>,
}

fn settings(args: &TrainArgs) -> Result<Settings> {
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --config {}", path.display()))?;
            tenet_train::config::parse(&text)
                .with_context(|| format!("--config {}", path.display()))?
        }
        None => Default::default(),
    };
    fn pick<T: std::str::FromStr>(
        flag: Option<T>,
        file: &std::collections::BTreeMap<String, String>,
        key: &str,
    ) -> Result<Option<T>> {
        match flag {
            Some(v) => Ok(Some(v)),
            None => file
                .get(key)
                .map(|v| {
                    v.parse()
                        .map_err(|_| anyhow::anyhow!("--config: {key}: {v:?} is not valid"))
                })
                .transpose(),
        }
    }
    let dataset: String = pick(args.dataset.clone(), &file, "dataset")?
        .context("say which dataset: --dataset digits|mnist (or `dataset:` in --config)")?;
    let model: String = pick(args.model.clone(), &file, "model")?.unwrap_or("mlp".into());
    let arch =
        Arch::from_name(&model).with_context(|| format!("--model {model:?}: choose mlp or cnn"))?;
    let lr: Option<f32> = pick(args.lr, &file, "lr")?;
    if let Some(lr) = lr
        && !(lr.is_finite() && lr > 0.0)
    {
        bail!("--lr must be a positive number, got {lr}");
    }
    let optimizer_name: String =
        pick(args.optimizer.clone(), &file, "optimizer")?.unwrap_or("adamw".into());
    let optimizer = Optimizer::by_name(&optimizer_name, lr, &dataset)
        .with_context(|| format!("--optimizer {optimizer_name:?}: choose adamw or sgd"))?;
    let batch = pick(args.batch, &file, "batch")?.unwrap_or(32);
    if batch == 0 {
        bail!("--batch must be at least 1");
    }
    let shards = pick(args.shards, &file, "data_parallel")?.unwrap_or(1);
    if shards == 0 || !batch.is_multiple_of(shards) {
        bail!(
            "--shards {shards} must divide --batch {batch} (each shard takes the same number of rows)"
        );
    }
    let stage_boundaries = if !args.stage_boundaries.is_empty() {
        args.stage_boundaries
            .iter()
            .map(|b| b.trim().to_string())
            .collect()
    } else {
        file.get("stage_boundaries")
            .map(|v| tenet_train::config::list(v))
            .unwrap_or_default()
    };
    Ok(Settings {
        dataset,
        model,
        arch,
        optimizer_name,
        optimizer,
        lr,
        seed: pick(args.seed, &file, "seed")?.unwrap_or(0),
        epochs: pick(args.epochs, &file, "epochs")?,
        batch,
        shards,
        stage_boundaries,
        out: pick(args.out.clone(), &file, "out")?.unwrap_or("tenet-train".into()),
        coordinator: pick(args.coordinator.clone(), &file, "coordinator")?,
    })
}

pub fn train(args: &TrainArgs) -> Result<()> {
    let s = settings(args)?;
    let data = tenet_train::data::load(&s.dataset)?;
    let epochs = s
        .epochs
        .unwrap_or_else(|| tenet_train::data::default_epochs(data.name));
    let device = args.device.open()?;
    // Boundaries that do not fit the model are refused here, before anything runs.
    let model =
        tenet_train::ModelSpec::Bundled(s.arch).fit(&data.sample_shape, data.classes as u64)?;
    let spec = tenet_train::StepSpec {
        model,
        optimizer: s.optimizer,
        batch: s.batch,
        shards: s.shards,
    };
    let stage_starts = spec.stage_starts(&s.stage_boundaries)?;
    // The cut, made once: boundaries that leave a stage empty are refused here.
    let stages = if stage_starts.is_empty() {
        Vec::new()
    } else {
        spec.shard_stages(&stage_starts)?
    };
    if let Some(url) = &s.coordinator {
        if args.resume.is_some() {
            bail!("--resume continues a local run; a run on the network starts from its seed");
        }
        return network::train(
            args,
            &s,
            url,
            &data,
            epochs,
            device.as_ref(),
            &spec,
            &stage_starts,
            &stages,
        );
    }
    let config = TrainConfig {
        model: s.arch.into(),
        optimizer: s.optimizer,
        seed: s.seed,
        epochs,
        batch: s.batch,
        shards: s.shards,
        eval_rows: 500,
        out_dir: s.out.clone(),
    };
    let resume = match &args.resume {
        Some(spec) => {
            let path = Checkpoint::find(spec, &s.out.join("checkpoints"))?;
            Some(Checkpoint::load(&path)?)
        }
        None => None,
    };
    let mut bar = Bar::new(!args.json);
    let report = tenet_train::train(&config, &data, device.as_ref(), resume.as_ref(), &mut |e| {
        bar.show(e)
    })?;
    bar.finish();
    if args.json {
        let v = serde_json::json!({
            "dataset": report.dataset,
            "model": report.model,
            "optimizer": report.optimizer,
            "seed": report.seed,
            "steps": report.steps,
            "epochs": report.epochs,
            "final_loss": report.final_loss,
            "test_accuracy": report.test_accuracy,
            "test_loss": report.test_loss,
            "weights_hash": report.weights_hash,
            "weights": report.weights,
            "checkpoint": report.checkpoint,
            "loss_csv": report.curve_csv,
            "loss_svg": report.curve_svg,
            "train_seconds": report.train_seconds,
            "device": device.name(),
        });
        println!("{v}");
    } else {
        println!(
            "{} on {} ({}), seed {}: {} steps, {} epochs in {:.1} s",
            report.model,
            report.dataset,
            report.optimizer,
            report.seed,
            report.steps,
            report.epochs,
            report.train_seconds
        );
        println!(
            "test accuracy {:.2}%  test loss {:.4}  final step loss {:.4}",
            report.test_accuracy * 100.0,
            report.test_loss,
            report.final_loss
        );
        println!("weights hash  {}", report.weights_hash);
        println!("weights       {}", report.weights.display());
        println!("checkpoint    {}", report.checkpoint.display());
        println!(
            "loss curve    {} and {}",
            report.curve_csv.display(),
            report.curve_svg.display()
        );
    }
    Ok(())
}

/// Progress on standard error: on a terminal one line redrawn at most ten times a second; in a
/// log one line per epoch.
struct Bar {
    show: bool,
    terminal: bool,
    last: Option<Instant>,
    drawn: bool,
}

impl Bar {
    fn new(show: bool) -> Bar {
        Bar {
            show,
            terminal: std::io::stderr().is_terminal(),
            last: None,
            drawn: false,
        }
    }

    fn show(&mut self, event: &Event) {
        if !self.show {
            return;
        }
        let mut err = std::io::stderr().lock();
        match event {
            Event::Step {
                step,
                total,
                epoch,
                loss,
                accuracy,
            } if self.terminal => {
                let due = self
                    .last
                    .is_none_or(|t| t.elapsed().as_millis() >= 100 || step == total);
                if due {
                    let width = 30;
                    let filled = (*step as usize * width) / (*total).max(1) as usize;
                    let _ = write!(
                        err,
                        "\r[{}{}] step {step}/{total} epoch {epoch} loss {loss:.4} acc {:.1}%   ",
                        "#".repeat(filled),
                        "-".repeat(width - filled),
                        accuracy * 100.0
                    );
                    self.last = Some(Instant::now());
                    self.drawn = true;
                }
            }
            Event::Epoch {
                epoch,
                test_accuracy,
                test_loss,
            } => {
                if self.drawn {
                    let _ = writeln!(err);
                    self.drawn = false;
                }
                let _ = writeln!(
                    err,
                    "epoch {epoch}: test accuracy {:.2}%, test loss {test_loss:.4}",
                    test_accuracy * 100.0
                );
            }
            _ => {}
        }
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}
