//! The graphs of training: one step as one graph, its two halves for data-parallel training,
//! evaluation, and initialisation.
//!
//! A step's global batch of `B` rows is cut into `S` shards of `B / S` rows; each shard's
//! gradient is the gradient of its rows' summed loss divided by `B`, and the step's gradient is
//! the shards' gradients added in shard order. That definition is what makes data-parallel
//! training bit-identical to training on one machine: the one-graph step (`step`) holds each
//! shard's gradient subgraph exactly as the shard graph (`shard`) holds it, and the update
//! graph (`update`) adds them in the same order. Names:
//! - inputs `param/<name>`, `state/<name>/<slot>`, `x` (`f32[rows, C, H, W]`), `y`
//!   (`i64[rows]`), `step` (`f32[]`, the 1-based step number), `grad<s>/<name>` (update only);
//! - outputs `param/<name>` and `state/<name>/<slot>` (the new values), `loss` (the step's
//!   mean loss), `correct` (rows predicted right), `grad/<name>` (shard only).

use std::collections::HashMap;

use tenet_autodiff::{GradError, gradients};
use tenet_ir::{BuildError, DType, Graph, GraphBuilder, Tensor};

use crate::loss::{correct, cross_entropy};
use crate::nn::{Init, Model};
use crate::optim::Optimizer;

/// Why a training graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("a batch of {batch} rows cannot be cut into {shards} equal shards")]
    Shards { batch: u64, shards: u64 },
    #[error("{0}")]
    Grad(#[from] GradError),
    #[error("{0}")]
    Build(#[from] BuildError),
}

/// What one training step is: the model, the optimizer, and the batch and its cut.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSpec {
    pub model: Model,
    pub optimizer: Optimizer,
    pub batch: u64,
    pub shards: u64,
}

fn param_inputs(b: &GraphBuilder, model: &Model) -> (Vec<String>, HashMap<String, Tensor>) {
    let mut names = Vec::new();
    let mut map = HashMap::new();
    for spec in model.params() {
        let t = b.input(&format!("param/{}", spec.name), DType::F32, &spec.shape);
        names.push(spec.name.clone());
        map.insert(spec.name, t);
    }
    (names, map)
}

fn batch_inputs(b: &GraphBuilder, model: &Model, rows: u64) -> (Tensor, Tensor) {
    let mut shape = vec![rows];
    shape.extend(&model.input);
    (
        b.input("x", DType::F32, &shape),
        b.input("y", DType::I64, &[rows]),
    )
}

/// One shard's loss term, correct count and gradients (in `names` order).
fn shard_terms(
    spec: &StepSpec,
    names: &[String],
    params: &HashMap<String, Tensor>,
    x: &Tensor,
    y: &Tensor,
) -> Result<(Tensor, Tensor, Vec<Tensor>), StepError> {
    let logits = spec.model.forward(params, x);
    let loss = cross_entropy(&logits, y, 1.0 / spec.batch as f64);
    let wrt: Vec<&Tensor> = names.iter().map(|n| &params[n]).collect();
    let grads = gradients(&loss, &wrt)?;
    Ok((loss, correct(&logits, y), grads))
}

/// The optimizer's update of every parameter from the shards' gradients, added in shard
/// order; returns the named outputs.
fn update_outputs(
    spec: &StepSpec,
    b: &GraphBuilder,
    names: &[String],
    params: &HashMap<String, Tensor>,
    shard_grads: &[Vec<Tensor>],
) -> Vec<(String, Tensor)> {
    let t = b.input("step", DType::F32, &[]);
    let mut outputs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut g = shard_grads[0][i].clone();
        for shard in &shard_grads[1..] {
            g = g + &shard[i];
        }
        let state: Vec<Tensor> = spec
            .optimizer
            .slots()
            .iter()
            .map(|slot| {
                b.input(
                    &format!("state/{name}/{slot}"),
                    DType::F32,
                    params[name].shape(),
                )
            })
            .collect();
        let (p, s) = spec.optimizer.update(&params[name], &g, &state, &t);
        outputs.push((format!("param/{name}"), p));
        for (slot, s) in spec.optimizer.slots().iter().zip(s) {
            outputs.push((format!("state/{name}/{slot}"), s));
        }
    }
    outputs
}

fn finish(b: &GraphBuilder, outputs: &[(String, Tensor)]) -> Result<Graph, StepError> {
    let refs: Vec<(&str, &Tensor)> = outputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Ok(b.finish(&refs)?)
}

impl StepSpec {
    fn shard_rows(&self) -> Result<u64, StepError> {
        if self.shards == 0 || self.batch == 0 || !self.batch.is_multiple_of(self.shards) {
            return Err(StepError::Shards {
                batch: self.batch,
                shards: self.shards,
            });
        }
        Ok(self.batch / self.shards)
    }

    /// The whole step as one graph.
    pub fn step(&self) -> Result<Graph, StepError> {
        let rows = self.shard_rows()?;
        let b = GraphBuilder::new();
        let (names, params) = param_inputs(&b, &self.model);
        let (x, y) = batch_inputs(&b, &self.model, self.batch);
        let mut losses = Vec::new();
        let mut counts = Vec::new();
        let mut grads = Vec::new();
        for s in 0..self.shards {
            let xs = x.slice(0, s * rows, (s + 1) * rows, 1);
            let ys = y.slice(0, s * rows, (s + 1) * rows, 1);
            let (l, c, g) = shard_terms(self, &names, &params, &xs, &ys)?;
            losses.push(l);
            counts.push(c);
            grads.push(g);
        }
        let mut outputs = update_outputs(self, &b, &names, &params, &grads);
        outputs.push(("loss".into(), sum_in_order(&losses)));
        outputs.push(("correct".into(), sum_in_order(&counts)));
        finish(&b, &outputs)
    }

    /// One shard's half of a step (what a data-parallel worker runs): the shard's loss term,
    /// correct count and gradients.
    pub fn shard(&self) -> Result<Graph, StepError> {
        let rows = self.shard_rows()?;
        let b = GraphBuilder::new();
        let (names, params) = param_inputs(&b, &self.model);
        let (x, y) = batch_inputs(&b, &self.model, rows);
        let (l, c, g) = shard_terms(self, &names, &params, &x, &y)?;
        let mut outputs = vec![("loss".to_string(), l), ("correct".to_string(), c)];
        for (name, g) in names.iter().zip(g) {
            outputs.push((format!("grad/{name}"), g));
        }
        finish(&b, &outputs)
    }

    /// The other half: the update from every shard's gradients (`grad<s>/<name>`).
    pub fn update(&self) -> Result<Graph, StepError> {
        self.shard_rows()?;
        let b = GraphBuilder::new();
        let (names, params) = param_inputs(&b, &self.model);
        let grads: Vec<Vec<Tensor>> = (0..self.shards)
            .map(|s| {
                names
                    .iter()
                    .map(|n| b.input(&format!("grad{s}/{n}"), DType::F32, params[n].shape()))
                    .collect()
            })
            .collect();
        let outputs = update_outputs(self, &b, &names, &params, &grads);
        finish(&b, &outputs)
    }
}

fn sum_in_order(terms: &[Tensor]) -> Tensor {
    let mut acc = terms[0].clone();
    for t in &terms[1..] {
        acc = acc + t;
    }
    acc
}

/// Evaluation of `rows` samples: `loss` (the rows' summed cross-entropy) and `correct`.
pub fn eval_graph(model: &Model, rows: u64) -> Result<Graph, StepError> {
    let b = GraphBuilder::new();
    let (_, params) = param_inputs(&b, model);
    let (x, y) = batch_inputs(&b, model, rows);
    let logits = model.forward(&params, &x);
    let outputs = vec![
        ("loss".to_string(), cross_entropy(&logits, &y, 1.0)),
        ("correct".to_string(), correct(&logits, &y)),
    ];
    finish(&b, &outputs)
}

/// The parameters' starting values as a graph of `random_normal` ops (key = the parameter's
/// position + 1), run with the training seed as the job seed: the same seed gives the same
/// bits on every machine. Outputs `param/<name>`.
pub fn init_graph(model: &Model) -> Result<Graph, StepError> {
    let b = GraphBuilder::new();
    let mut outputs = Vec::new();
    for (i, spec) in model.params().into_iter().enumerate() {
        let t = match spec.init {
            Init::HeNormal { fan_in } => {
                b.random_normal(DType::F32, &spec.shape, i as u64 + 1)
                    * (2.0 / fan_in as f64).sqrt()
            }
            Init::Zeros => b.scalar(DType::F32, 0.0).expand(&spec.shape),
        };
        outputs.push((format!("param/{}", spec.name), t));
    }
    finish(&b, &outputs)
}
