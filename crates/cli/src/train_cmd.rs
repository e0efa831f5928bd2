//! `tenet train`: parse, open the dataset and the device, run `tenet_train::train`, and show
//! its progress (a bar redrawn in place on a terminal, a line per epoch otherwise) and report.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tenet_train::{Arch, Checkpoint, Event, Optimizer, TrainConfig};

use crate::device_args::DeviceArgs;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The dataset: `digits` (scikit-learn's 8×8 digits) or `mnist` (28×28); fetch it first
    /// with `tenet models fetch digits|mnist`.
    #[arg(long, value_name = "NAME")]
    dataset: String,
    /// The model: `mlp` (one hidden layer of 256) or `cnn` (two 3×3 conv + pool blocks).
    #[arg(long, value_name = "NAME", default_value = "mlp")]
    model: String,
    /// The seed: the starting weights and the order of the samples. The same seed gives the
    /// same final weights, bit for bit, on every machine, thread count and SIMD level.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Passes over the training set [default: 40 for digits, 2 for mnist].
    #[arg(long)]
    epochs: Option<u32>,
    /// Samples per step.
    #[arg(long, default_value_t = 32)]
    batch: u64,
    /// Shards each batch is cut into, each shard's gradient computed on its own and the
    /// gradients added in order (what data-parallel training spreads across nodes); part of
    /// what the result is.
    #[arg(long, default_value_t = 1)]
    shards: u64,
    /// `adamw` or `sgd` (with momentum 0.9).
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    /// Learning rate [default: adamw 0.0005 on digits and 0.001 on mnist; sgd 0.05].
    #[arg(long)]
    lr: Option<f32>,
    /// Where checkpoints, `weights.safetensors`, `loss.csv` and `loss.svg` go.
    #[arg(long, value_name = "DIR", default_value = "tenet-train")]
    out: PathBuf,
    /// Continue from a checkpoint: its file, or its hash (or first 8+ characters) in
    /// OUT/checkpoints. The settings must match the checkpoint's; --epochs may grow.
    #[arg(long, value_name = "CHECKPOINT")]
    resume: Option<String>,
    /// Print one JSON object at the end (test_accuracy, final_loss, steps, weights_hash, ...)
    /// and no progress.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn train(args: &TrainArgs) -> Result<()> {
    let arch = Arch::from_name(&args.model)
        .with_context(|| format!("--model {:?}: choose mlp or cnn", args.model))?;
    let mnist = args.dataset == "mnist";
    let optimizer = match args.optimizer.as_str() {
        "adamw" => Optimizer::adamw(args.lr.unwrap_or(if mnist { 1e-3 } else { 5e-4 })),
        "sgd" => Optimizer::sgd(args.lr.unwrap_or(0.05)),
        other => bail!("--optimizer {other:?}: choose adamw or sgd"),
    };
    if let Some(lr) = args.lr
        && !(lr.is_finite() && lr > 0.0)
    {
        bail!("--lr must be a positive number, got {lr}");
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.shards == 0 || !args.batch.is_multiple_of(args.shards) {
        bail!(
            "--shards {} must divide --batch {} (each shard takes the same number of rows)",
            args.shards,
            args.batch
        );
    }
    let data = tenet_train::data::load(&args.dataset)?;
    let epochs = args
        .epochs
        .unwrap_or(if data.name == "mnist" { 2 } else { 40 });
    let device = args.device.open()?;
    let config = TrainConfig {
        arch,
        optimizer,
        seed: args.seed,
        epochs,
        batch: args.batch,
        shards: args.shards,
        eval_rows: 500,
        out_dir: args.out.clone(),
    };
    let resume = match &args.resume {
        Some(spec) => {
            let path = Checkpoint::find(spec, &args.out.join("checkpoints"))?;
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
