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

use tenet_autodiff::{GradError, gradients_marked};
use tenet_ir::split::{Stage, split_at};
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
    #[error("stage boundaries: {0}")]
    Stages(String),
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
    let (terms, _) = shard_terms_cut(spec, names, params, x, y, &[])?;
    Ok(terms)
}

/// Where a pipeline may cut a shard's graph around the layers `starts` (each the first layer
/// of a stage): the node where each such layer's forward begins, and the builder positions
/// where the backward pass has finished the layers from it on (in layer order).
struct Cuts {
    forward: Vec<usize>,
    backward: Vec<usize>,
}

type Terms = (Tensor, Tensor, Vec<Tensor>);

/// [`shard_terms`], noting where the layers `starts` begin in the forward pass and end in the
/// backward. The count of rows predicted right is computed before the gradients, so that the
/// forward pass and the loss stay together, ahead of the whole backward pass.
fn shard_terms_cut(
    spec: &StepSpec,
    names: &[String],
    params: &HashMap<String, Tensor>,
    x: &Tensor,
    y: &Tensor,
    starts: &[usize],
) -> Result<(Terms, Cuts), StepError> {
    let (logits, layer_inputs) = spec.model.forward_layers(params, x);
    let loss = cross_entropy(&logits, y, 1.0 / spec.batch as f64);
    let right = correct(&logits, y);
    let wrt: Vec<&Tensor> = names.iter().map(|n| &params[n]).collect();
    let marks: Vec<&Tensor> = starts.iter().map(|&l| &layer_inputs[l]).collect();
    let (grads, backward) = gradients_marked(&loss, &wrt, &marks)?;
    let forward = marks.iter().map(|m| m.id().index() + 1).collect();
    Ok(((loss, right, grads), Cuts { forward, backward }))
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
        Ok(self.shard_cut(&[])?.0)
    }

    fn shard_cut(&self, starts: &[usize]) -> Result<(Graph, Cuts), StepError> {
        let rows = self.shard_rows()?;
        let b = GraphBuilder::new();
        let (names, params) = param_inputs(&b, &self.model);
        let (x, y) = batch_inputs(&b, &self.model, rows);
        let ((l, c, g), cuts) = shard_terms_cut(self, &names, &params, &x, &y, starts)?;
        let mut outputs = vec![("loss".to_string(), l), ("correct".to_string(), c)];
        for (name, g) in names.iter().zip(g) {
            outputs.push((format!("grad/{name}"), g));
        }
        Ok((finish(&b, &outputs)?, cuts))
    }

    /// The layers (by name or 0-based position, see [`Model::layer_position`]) where pipeline
    /// stages begin, as positions: strictly increasing, none the first layer.
    pub fn stage_starts(&self, boundaries: &[String]) -> Result<Vec<usize>, StepError> {
        let mut starts: Vec<usize> = Vec::with_capacity(boundaries.len());
        for b in boundaries {
            let at = self.model.layer_position(b.trim()).ok_or_else(|| {
                StepError::Stages(format!(
                    "{b:?} is not a layer of {} (layers: {})",
                    self.model.label(),
                    self.model.describe_layers()
                ))
            })?;
            if at == 0 {
                return Err(StepError::Stages(format!(
                    "{b:?} is the first layer: the first stage begins there already; name the layers where later stages begin"
                )));
            }
            if starts.last().is_some_and(|&last| at <= last) {
                return Err(StepError::Stages(format!(
                    "{b:?} comes before or at the boundary named ahead of it: list the layers in order, each once"
                )));
            }
            starts.push(at);
        }
        Ok(starts)
    }

    /// A shard's graph ([`StepSpec::shard`], the same graph) cut into pipeline stages around
    /// the layer groups that begin at `starts` (positions, [`StepSpec::stage_starts`]): with
    /// `G` groups, `2G − 1` stages — each group's forward pass in turn, the last group's forward,
    /// the loss and its backward together, then each earlier group's backward in reverse — so
    /// that no stage holds the whole model's work and each group's gradients leave the pipeline
    /// at the stage that computes them. What a later stage reads of an earlier one (activations,
    /// the gradient flowing back) crosses as boundary tensors; running the stages in order gives
    /// every output bit for bit as the shard's graph does (`tenet_ir::split`).
    pub fn shard_stages(&self, starts: &[usize]) -> Result<Vec<Stage>, StepError> {
        let (graph, cuts) = self.shard_cut(starts)?;
        let allowed = tenet_ir::split::cut_points(&graph);
        let n = graph.nodes().len();
        let mut at = Vec::new();
        let wanted = cuts
            .forward
            .iter()
            .zip(starts)
            .chain(cuts.backward.iter().zip(starts).rev());
        for (&c, &layer) in wanted {
            // A cut goes before a computed node: past any constants the pass appended there.
            let snapped = allowed.iter().copied().find(|&a| a >= c).unwrap_or(n);
            if snapped >= n || at.last().is_some_and(|&last| snapped <= last) {
                return Err(StepError::Stages(format!(
                    "a stage beginning at layer {layer} ({}) would compute nothing: put the boundaries between layers that compute something",
                    self.model.describe_layers()
                )));
            }
            at.push(snapped);
        }
        split_at(&graph, &at).map_err(|e| StepError::Stages(e.to_string()))
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
