//! The training loop: the step graph compiled once, parameters and optimizer state kept as
//! device buffers from step to step (only the batch travels), the test set evaluated after each
//! epoch, checkpoints at each epoch's end, and a report.
//!
//! Everything that decides the result is a function of the configuration and the seed: the
//! starting parameters (the init graph, run with the seed as its job seed), the order of the
//! samples (each epoch a Fisher–Yates shuffle driven by splitmix64 from the seed and the epoch
//! number), and every step's bits (the graph's). Resuming from a checkpoint continues the same
//! trajectory: the step counter says where in which epoch's order to go on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tenet_exec::{Buffer, Device, ExecError, Program};
use tenet_ir::{HostTensor, NoWeights, TensorType};

use crate::checkpoint::{Checkpoint, CheckpointError, Meta};
use crate::curve;
use crate::data::Dataset;
use crate::nn::{LayerError, Model, ModelSpec};
use crate::optim::Optimizer;
use crate::step::{StepError, StepSpec, eval_graph, init_graph};

/// What to train and how.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelSpec,
    pub optimizer: Optimizer,
    pub seed: u64,
    /// Train until this many epochs are done (counting those of a resumed checkpoint).
    pub epochs: u32,
    /// Rows per step (the global batch).
    pub batch: u64,
    /// Shards each batch is cut into (see `step.rs`): the result depends on it, the number of
    /// machines running the shards does not.
    pub shards: u64,
    /// Test rows per evaluation run.
    pub eval_rows: u64,
    /// Where checkpoints, the loss curve (CSV and SVG) and the final weights go.
    pub out_dir: PathBuf,
}

/// What the loop tells its caller as it goes.
#[derive(Clone, Debug)]
pub enum Event {
    /// A step ran: its mean loss and the fraction of its rows predicted right.
    Step {
        step: u64,
        total: u64,
        epoch: u32,
        loss: f32,
        accuracy: f32,
    },
    /// An epoch ended and the test set was evaluated.
    Epoch {
        epoch: u32,
        test_accuracy: f64,
        test_loss: f64,
    },
    /// A checkpoint was written.
    Checkpoint { path: PathBuf },
}

/// The result of a training run.
#[derive(Clone, Debug)]
pub struct TrainReport {
    pub dataset: String,
    pub model: String,
    pub optimizer: String,
    pub seed: u64,
    pub steps: u64,
    pub epochs: u32,
    /// The last step's mean loss.
    pub final_loss: f32,
    pub test_accuracy: f64,
    pub test_loss: f64,
    /// blake3 of the final parameters as a canonical safetensors file (`weights.safetensors`).
    pub weights_hash: String,
    pub weights: PathBuf,
    pub checkpoint: PathBuf,
    pub curve_csv: PathBuf,
    pub curve_svg: PathBuf,
    /// Wall time of the steps run in this process (not counting evaluation).
    pub train_seconds: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("the model's layers do not fit the dataset: {0}")]
    Layers(#[from] LayerError),
    #[error("{0}")]
    Step(#[from] StepError),
    #[error("running on the device: {0}")]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "the training set has {rows} samples, fewer than one batch of {batch}: use a smaller --batch"
    )]
    TooFewSamples { rows: usize, batch: u64 },
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// splitmix64: the stream the shuffle draws from.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The order of the training samples in `epoch` (0-based): Fisher–Yates from the last
/// position down, position `i` swapped with `next() % (i + 1)`.
pub fn epoch_order(seed: u64, epoch: u32, rows: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..rows).collect();
    let mut rng = SplitMix(seed ^ (u64::from(epoch) + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
    for i in (1..rows).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Training samples `rows` of `data` as one batch: `x` (`f32[rows, C, H, W]`) and `y`.
pub fn train_batch(data: &Dataset, rows: &[usize]) -> (HostTensor, HostTensor) {
    batch(
        &data.train_x,
        &data.train_y,
        rows,
        data.sample_len(),
        &data.sample_shape,
    )
}

/// Rows `rows` of `x` (each `sample` values) and `y` as one batch.
fn batch(
    x: &[f32],
    y: &[i64],
    rows: &[usize],
    sample: usize,
    shape: &[u64],
) -> (HostTensor, HostTensor) {
    let mut xs = Vec::with_capacity(rows.len() * sample);
    let mut ys = Vec::with_capacity(rows.len());
    for &r in rows {
        xs.extend_from_slice(&x[r * sample..(r + 1) * sample]);
        ys.push(y[r]);
    }
    let mut dims = vec![rows.len() as u64];
    dims.extend(shape);
    (
        HostTensor::from_f32(&dims, &xs).expect("batch shape"),
        HostTensor::from_i64(&[rows.len() as u64], &ys).expect("label shape"),
    )
}

fn scalar(device: &dyn Device, b: &Buffer) -> Result<f32, ExecError> {
    Ok(device.download(b)?.get_f32(0))
}

/// Train on `data` with `device`, from `resume` if given; `on_event` hears each step, epoch
/// and checkpoint.
pub fn train(
    config: &TrainConfig,
    data: &Dataset,
    device: &dyn Device,
    resume: Option<&Checkpoint>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<TrainReport, TrainError> {
    let model = config.model.fit(&data.sample_shape, data.classes as u64)?;
    let spec = StepSpec {
        model: model.clone(),
        optimizer: config.optimizer,
        batch: config.batch,
        shards: config.shards,
    };
    if data.train_len() < config.batch as usize {
        return Err(TrainError::TooFewSamples {
            rows: data.train_len(),
            batch: config.batch,
        });
    }
    let meta = Meta {
        dataset: data.name.to_string(),
        model: model.label(),
        optimizer: config.optimizer.describe(),
        seed: config.seed,
        batch: config.batch,
        shards: config.shards,
        step: 0,
    };
    std::fs::create_dir_all(&config.out_dir).map_err(io(&config.out_dir))?;
    let step_program = device.compile(&spec.step()?)?;
    let steps_per_epoch = (data.train_len() as u64) / config.batch;
    let total = steps_per_epoch * u64::from(config.epochs);

    // Parameters and optimizer state, as device buffers keyed by their input names.
    let mut state: HashMap<String, Buffer> = HashMap::new();
    let mut history = curve::History::default();
    let mut done = 0u64;
    match resume {
        Some(ck) => {
            ck.meta.matches(&meta)?;
            for (name, t) in ck.tensors(&model, &config.optimizer)? {
                state.insert(name, device.upload(&t)?);
            }
            history = ck.history.clone();
            done = ck.meta.step;
        }
        None => {
            let init = device.compile(&init_graph(&model)?)?;
            let (outs, _) =
                init.run_buffers(&HashMap::new(), &NoWeights, config.seed, &|| false)?;
            for (name, b) in outs {
                state.insert(name, b);
            }
            for p in model.params() {
                for slot in config.optimizer.slots() {
                    let ty = TensorType::new(tenet_ir::DType::F32, p.shape.clone());
                    state.insert(format!("state/{}/{slot}", p.name), device.zeros(&ty)?);
                }
            }
        }
    }

    let sample = data.sample_len();
    let mut final_loss = history.loss.last().copied().unwrap_or(f32::NAN);
    let mut test = history.test.last().copied();
    let started = Instant::now();
    let mut last_checkpoint = None;
    while done < total {
        let epoch = (done / steps_per_epoch) as u32;
        let order = epoch_order(config.seed, epoch, data.train_len());
        let first = done % steps_per_epoch;
        for k in first..steps_per_epoch {
            let rows = &order[(k * config.batch) as usize..((k + 1) * config.batch) as usize];
            let (x, y) = batch(
                &data.train_x,
                &data.train_y,
                rows,
                sample,
                &data.sample_shape,
            );
            let mut inputs = state.clone();
            inputs.insert("x".into(), device.upload_owned(x)?);
            inputs.insert("y".into(), device.upload_owned(y)?);
            let t = HostTensor::from_f32(&[], &[(done + 1) as f32]).expect("scalar");
            inputs.insert("step".into(), device.upload_owned(t)?);
            let (outs, _) =
                step_program.run_buffers(&inputs, &NoWeights, config.seed, &|| false)?;
            let mut loss = f32::NAN;
            let mut right = 0.0;
            for (name, b) in outs {
                match name.as_str() {
                    "loss" => loss = scalar(device, &b)?,
                    "correct" => right = scalar(device, &b)?,
                    _ => {
                        state.insert(name, b);
                    }
                }
            }
            done += 1;
            final_loss = loss;
            let accuracy = right / config.batch as f32;
            history.loss.push(loss);
            history.accuracy.push(accuracy);
            on_event(&Event::Step {
                step: done,
                total,
                epoch: epoch + 1,
                loss,
                accuracy,
            });
        }
        let (test_accuracy, test_loss) = evaluate(device, &model, &state, data, config.eval_rows)?;
        history.test.push((done, test_accuracy, test_loss));
        test = Some((done, test_accuracy, test_loss));
        on_event(&Event::Epoch {
            epoch: epoch + 1,
            test_accuracy,
            test_loss,
        });
        let ck = save_checkpoint(device, config, &model, &state, &meta, done, &history)?;
        on_event(&Event::Checkpoint { path: ck.clone() });
        last_checkpoint = Some(ck);
    }
    let train_seconds = started.elapsed().as_secs_f64();
    let (test_accuracy, test_loss) = match test {
        Some((_, a, l)) => (a, l),
        None => evaluate(device, &model, &state, data, config.eval_rows)?,
    };
    let checkpoint = match last_checkpoint {
        Some(p) => p,
        None => save_checkpoint(device, config, &model, &state, &meta, done, &history)?,
    };
    let params = download_params(device, &model, &state)?;
    let weights_file = crate::checkpoint::weights_file(&params)?;
    let weights_hash = blake3::hash(&weights_file).to_hex().to_string();
    let weights = config.out_dir.join("weights.safetensors");
    std::fs::write(&weights, &weights_file).map_err(io(&weights))?;
    let curve_csv = config.out_dir.join("loss.csv");
    std::fs::write(&curve_csv, history.csv()).map_err(io(&curve_csv))?;
    let curve_svg = config.out_dir.join("loss.svg");
    let title = format!("{} on {}, seed {}", model.label(), data.name, config.seed);
    std::fs::write(&curve_svg, history.svg(&title)).map_err(io(&curve_svg))?;
    Ok(TrainReport {
        dataset: data.name.to_string(),
        model: model.label(),
        optimizer: config.optimizer.describe(),
        seed: config.seed,
        steps: done,
        epochs: (done / steps_per_epoch) as u32,
        final_loss,
        test_accuracy,
        test_loss,
        weights_hash,
        weights,
        checkpoint,
        curve_csv,
        curve_svg,
        train_seconds,
    })
}

/// The parameters as host tensors, keyed by parameter name.
fn download_params(
    device: &dyn Device,
    model: &Model,
    state: &HashMap<String, Buffer>,
) -> Result<Vec<(String, HostTensor)>, ExecError> {
    model
        .params()
        .into_iter()
        .map(|p| {
            let b = &state[&format!("param/{}", p.name)];
            Ok((p.name, device.download(b)?))
        })
        .collect()
}

fn save_checkpoint(
    device: &dyn Device,
    config: &TrainConfig,
    model: &Model,
    state: &HashMap<String, Buffer>,
    meta: &Meta,
    step: u64,
    history: &curve::History,
) -> Result<PathBuf, TrainError> {
    let mut tensors = Vec::new();
    let mut names: Vec<&String> = state.keys().collect();
    names.sort();
    for name in names {
        tensors.push((name.clone(), device.download(&state[name])?));
    }
    let ck = Checkpoint {
        meta: Meta {
            step,
            ..meta.clone()
        },
        tensors,
        history: history.clone(),
    };
    let _ = model;
    Ok(ck.save(&config.out_dir.join("checkpoints"))?)
}

/// Accuracy and mean loss over the whole test set, `rows` samples a run (and one run of the
/// remainder).
pub fn evaluate(
    device: &dyn Device,
    model: &Model,
    state: &HashMap<String, Buffer>,
    data: &Dataset,
    rows: u64,
) -> Result<(f64, f64), TrainError> {
    let n = data.test_len();
    let rows = rows.max(1).min(n.max(1) as u64) as usize;
    let mut programs: HashMap<usize, Box<dyn Program>> = HashMap::new();
    let (mut right, mut loss) = (0f64, 0f64);
    let sample = data.sample_len();
    let mut start = 0;
    while start < n {
        let take = rows.min(n - start);
        if let std::collections::hash_map::Entry::Vacant(slot) = programs.entry(take) {
            slot.insert(device.compile(&eval_graph(model, take as u64)?)?);
        }
        let idx: Vec<usize> = (start..start + take).collect();
        let (x, y) = batch(&data.test_x, &data.test_y, &idx, sample, &data.sample_shape);
        let mut inputs: HashMap<String, Buffer> = state
            .iter()
            .filter(|(k, _)| k.starts_with("param/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        inputs.insert("x".into(), device.upload_owned(x)?);
        inputs.insert("y".into(), device.upload_owned(y)?);
        let (outs, _) = programs[&take].run_buffers(&inputs, &NoWeights, 0, &|| false)?;
        for (name, b) in outs {
            let v = f64::from(scalar(device, &b)?);
            match name.as_str() {
                "loss" => loss += v,
                _ => right += v,
            }
        }
        start += take;
    }
    Ok((right / n.max(1) as f64, loss / n.max(1) as f64))
}
