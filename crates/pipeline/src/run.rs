//! Running a split model on this machine: the stages in order, each with the whole graph's
//! inputs it declares, the boundary tensors of the stage before and the same seed; the whole
//! graph's outputs gathered from the stages that produce them, in the whole graph's order.

use std::collections::HashMap;

use tenet_exec::Device;
use tenet_ir::{Graph, HostTensor};
use tenet_models::WeightSet;

use crate::PipelineError;
use crate::folder::SplitModel;

/// Run every stage with `run_stage(k, graph, inputs, weights)` (a device, the reference
/// interpreter, a remote node): the outputs of the whole graph.
pub fn run_stages_with(
    model: &SplitModel,
    inputs: &HashMap<String, HostTensor>,
    mut run_stage: impl FnMut(
        usize,
        &Graph,
        &HashMap<String, HostTensor>,
        &WeightSet,
    ) -> Result<Vec<(String, HostTensor)>, String>,
) -> Result<Vec<(String, HostTensor)>, PipelineError> {
    let mut carried: HashMap<String, HostTensor> = HashMap::new();
    let mut results: HashMap<String, HostTensor> = HashMap::new();
    for (k, (entry, stage)) in model.manifest.stages.iter().zip(&model.stages).enumerate() {
        let mut stage_inputs = std::mem::take(&mut carried);
        for name in &entry.inputs {
            let t = inputs.get(name).ok_or_else(|| PipelineError::Stage {
                stage: k,
                message: format!("input {name:?} is missing"),
            })?;
            stage_inputs.insert(name.clone(), t.clone());
        }
        let outputs = run_stage(k, &stage.graph, &stage_inputs, &stage.weights)
            .map_err(|message| PipelineError::Stage { stage: k, message })?;
        drop(stage_inputs);
        for (name, t) in outputs {
            if entry.boundary_out.iter().any(|p| p.name == name) {
                carried.insert(name, t);
            } else {
                results.insert(name, t);
            }
        }
    }
    model
        .manifest
        .outputs
        .iter()
        .map(|p| {
            let t = results
                .remove(&p.name)
                .ok_or_else(|| PipelineError::Stage {
                    stage: p.stage.unwrap_or(0),
                    message: format!("output {:?} was not produced", p.name),
                })?;
            Ok((p.name.clone(), t))
        })
        .collect()
}

/// Run every stage on `device`, compiling each as it comes.
pub fn run_stages(
    model: &SplitModel,
    device: &dyn Device,
    inputs: &HashMap<String, HostTensor>,
    seed: u64,
) -> Result<Vec<(String, HostTensor)>, PipelineError> {
    run_stages_with(model, inputs, |_, graph, inputs, weights| {
        let program = device.compile(graph).map_err(|e| e.to_string())?;
        program
            .run(inputs, weights, seed)
            .map_err(|e| e.to_string())
    })
}
