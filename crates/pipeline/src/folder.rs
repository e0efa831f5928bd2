//! A split model on disk: `manifest.json`, `stage-K.tnt` and `stage-K.safetensors` per stage
//! (K from 1). Each stage's weights file holds only the tensors that stage reads, copied from
//! the original files (a GGUF's tensors as the f32 the graph reads), and the stage graph refers
//! to it by its own hash. Every file is written atomically, the manifest last, so a folder with
//! a manifest is complete.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tenet_ir::split::{SplitTarget, Stage};
use tenet_ir::{Graph, Node, Op, WeightsId};
use tenet_models::{WeightSet, WeightsFile, check_bindings, write_atomically, write_safetensors};

use crate::PipelineError;
use tenet_proto::manifest::{FORMAT, MAX_MANIFEST_BYTES, Manifest, Port, StageEntry, WeightsEntry};

/// The manifest's file name in a split's folder.
pub const MANIFEST: &str = "manifest.json";

/// Whether `path` is a split's folder (a directory with a manifest).
pub fn is_split_dir(path: &Path) -> bool {
    path.is_dir() && path.join(MANIFEST).is_file()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PipelineError + '_ {
    move |source| PipelineError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// One stage loaded: its graph and its weights.
pub struct StageFiles {
    pub graph: Graph,
    pub weights: WeightSet,
}

/// A split model: the manifest and every stage, checked.
pub struct SplitModel {
    pub manifest: Manifest,
    pub stages: Vec<StageFiles>,
}

/// Split `graph` (reading its weights from `weights`) for `target` and write the folder `dir`
/// (created if absent). `progress(k, n)` is called as stage `k` of `n` is written.
pub fn write_split(
    graph: &Graph,
    weights: &WeightSet,
    target: SplitTarget,
    dir: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<Manifest, PipelineError> {
    check_bindings(graph, &weights.0).map_err(|e| PipelineError::Weights(e.to_string()))?;
    let stages = tenet_ir::split::split(graph, target)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut entries = Vec::new();
    for (k, stage) in stages.iter().enumerate() {
        progress(k, stages.len());
        let (graph, files) = stage_weights(stage, weights, k + 1)?;
        let mut entry_weights = Vec::new();
        for (name, bytes) in &files {
            let path = dir.join(name);
            write_atomically(&path, bytes).map_err(io(&path))?;
            entry_weights.push(WeightsEntry {
                id: WeightsId::of_bytes(bytes).to_hex(),
                file: name.clone(),
                bytes: bytes.len() as u64,
            });
        }
        let entry = stage_entry(stage, &graph, k, entry_weights);
        let path = dir.join(&entry.file);
        write_atomically(&path, &graph.to_bytes()).map_err(io(&path))?;
        entries.push(entry);
    }
    let manifest = assemble(graph, &stages, entries)?;
    let path = dir.join(MANIFEST);
    write_atomically(&path, manifest.to_json().as_bytes()).map_err(io(&path))?;
    Ok(manifest)
}

/// The manifest of `stages`, a split of `graph` that reads no weights (a training step's
/// graph: its parameters are inputs), each stage's graph as the split built it. What a
/// coordinator deploys to run such a graph as a pipeline, without a folder.
pub fn manifest_of(graph: &Graph, stages: &[Stage]) -> Result<Manifest, PipelineError> {
    if let Some((_, op, _)) = graph.weights().next() {
        return Err(PipelineError::Weights(format!(
            "the graph reads weights ({}): write it as a split's folder (`write_split`) instead",
            op.name()
        )));
    }
    let entries = stages
        .iter()
        .enumerate()
        .map(|(k, stage)| stage_entry(stage, &stage.graph, k, Vec::new()))
        .collect();
    assemble(graph, stages, entries)
}

/// Stage `k`'s (0-based) entry: `graph` is the stage's graph as it is stored.
fn stage_entry(stage: &Stage, graph: &Graph, k: usize, weights: Vec<WeightsEntry>) -> StageEntry {
    // A boundary tensor's type: an input of this stage or an output of it.
    let port = |name: &String| {
        let ty = graph
            .inputs()
            .find(|(_, n, _)| n == name)
            .map(|(_, _, t)| t.clone())
            .or_else(|| {
                let o = graph.outputs().iter().find(|o| &o.name == name)?;
                Some(graph.node(o.node).ty.clone())
            })
            .expect("a boundary tensor is an input or an output of its stage");
        Port::new(name, &ty)
    };
    StageEntry {
        graph: graph.id().to_hex(),
        file: format!("stage-{}.tnt", k + 1),
        weights,
        peak_bytes: graph.cost().peak_bytes,
        flops: graph.cost().flops,
        nodes: [stage.nodes.start, stage.nodes.end],
        inputs: stage.inputs.clone(),
        boundary_in: stage.boundary_in.iter().map(&port).collect(),
        boundary_out: stage.boundary_out.iter().map(&port).collect(),
        outputs: stage.outputs.clone(),
    }
}

/// The whole manifest from the stages' entries, checked.
fn assemble(
    graph: &Graph,
    stages: &[Stage],
    entries: Vec<StageEntry>,
) -> Result<Manifest, PipelineError> {
    let mut output_stage = HashMap::new();
    for (k, stage) in stages.iter().enumerate() {
        for name in &stage.outputs {
            output_stage.insert(name.clone(), k);
        }
    }
    let manifest = Manifest {
        format: FORMAT.to_string(),
        whole: graph.id().to_hex(),
        inputs: graph.inputs().map(|(_, n, t)| Port::new(n, t)).collect(),
        outputs: graph
            .outputs()
            .iter()
            .map(|o| Port {
                stage: output_stage.get(&o.name).copied(),
                ..Port::new(&o.name, &graph.node(o.node).ty)
            })
            .collect(),
        stages: entries,
    };
    manifest.check()?;
    Ok(manifest)
}

/// A file to write: its name in the folder and its bytes.
type NamedFile = (String, Vec<u8>);

/// The stage graph with its weight references moved to the stage's own files, and those files'
/// names and bytes: one per original file the stage reads (`stage-K.safetensors`, or
/// `stage-K.J.safetensors` when it reads several).
fn stage_weights(
    stage: &Stage,
    weights: &WeightSet,
    k: usize,
) -> Result<(Graph, Vec<NamedFile>), PipelineError> {
    // Tensors by original file, in order of first reference.
    let mut by_file: Vec<(WeightsId, Vec<String>)> = Vec::new();
    for (_, op, _) in stage.graph.weights() {
        if let Op::Weight { file, tensor } = op {
            match by_file.iter_mut().find(|(f, _)| f == file) {
                Some((_, list)) => list.push(tensor.clone()),
                None => by_file.push((*file, vec![tensor.clone()])),
            }
        }
    }
    let several = by_file.len() > 1;
    let mut files = Vec::new();
    let mut new_id = HashMap::new();
    for (j, (file, tensors)) in by_file.iter().enumerate() {
        let mut list = Vec::new();
        for name in tensors {
            let t = weights
                .0
                .iter()
                .find(|f| f.id == *file)
                .and_then(|f| f.tensor(name));
            let t = t.ok_or_else(|| {
                PipelineError::Weights(format!(
                    "tensor {name:?} of file {} is missing",
                    file.short()
                ))
            })?;
            list.push((
                name.as_str(),
                t.dtype(),
                t.shape().to_vec(),
                t.bytes().to_vec(),
            ));
        }
        let bytes = write_safetensors(&list).map_err(|e| PipelineError::Weights(e.to_string()))?;
        new_id.insert(*file, WeightsId::of_bytes(&bytes));
        let name = if several {
            format!("stage-{k}.{}.safetensors", j + 1)
        } else {
            format!("stage-{k}.safetensors")
        };
        files.push((name, bytes));
    }
    let (nodes, outputs) = stage.graph.clone().into_parts();
    let nodes = nodes
        .into_iter()
        .map(|n| match n.op {
            Op::Weight { file, tensor } => Node {
                op: Op::Weight {
                    file: new_id[&file],
                    tensor,
                },
                ty: n.ty,
            },
            _ => n,
        })
        .collect();
    let graph = Graph::new(nodes, outputs).map_err(|e| PipelineError::Stage {
        stage: k - 1,
        message: e.to_string(),
    })?;
    Ok((graph, files))
}

/// Read a file of at most `limit` bytes.
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, PipelineError> {
    let size = std::fs::metadata(path).map_err(io(path))?.len();
    if size > limit {
        return Err(PipelineError::File {
            path: path.display().to_string(),
            message: format!("{size} bytes, above the limit of {limit}"),
        });
    }
    std::fs::read(path).map_err(io(path))
}

/// Load a split's folder: the manifest (checked), every stage graph (checked against its
/// entry) and its weights (hashes and bindings checked).
pub fn load(dir: &Path) -> Result<SplitModel, PipelineError> {
    let manifest = Manifest::parse(&read_bounded(&dir.join(MANIFEST), MAX_MANIFEST_BYTES)?)?;
    let mut stages = Vec::new();
    for (k, entry) in manifest.stages.iter().enumerate() {
        let path: PathBuf = dir.join(&entry.file);
        let bytes = read_bounded(&path, 1 << 30)?;
        let graph = tenet_ir::decode_any(&bytes).map_err(|e| PipelineError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        manifest.check_stage(k, &graph)?;
        let mut files = Vec::new();
        for w in &entry.weights {
            let path = dir.join(&w.file);
            let f = WeightsFile::open(&path).map_err(|e| PipelineError::File {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            if f.id.to_hex() != w.id {
                return Err(PipelineError::File {
                    path: path.display().to_string(),
                    message: format!("its hash is {}, the manifest says {}", f.id, w.id),
                });
            }
            files.push(f);
        }
        check_bindings(&graph, &files).map_err(|e| PipelineError::Stage {
            stage: k,
            message: e.to_string(),
        })?;
        stages.push(StageFiles {
            graph,
            weights: WeightSet(files),
        });
    }
    Ok(SplitModel { manifest, stages })
}
