//! `tenet-onnx`: ONNX models imported as tenet graphs.
//!
//! [`import_file`] reads an `.onnx` file (bounded before anything is allocated: the file's
//! size, every tensor's claimed elements against the bytes present, external data only from
//! inside the model's folder), fixes dynamic dimensions from the caller's shapes, folds
//! everything computable at import time, maps each ONNX op onto tenet's op set, and returns the
//! graph plus a safetensors file holding the large initializers, which the graph references by
//! hash. Whatever tenet cannot express is one [`ImportError`] naming the node, its op type and
//! what is unsupported. Supported ops and their limits: docs/ONNX.md.

mod convert;
#[allow(clippy::all, clippy::pedantic)]
pub mod onnx_proto;
mod ops;
mod tensor;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use prost::Message;
use tenet_ir::{DType, Graph, HostTensor, WeightsId};

use crate::convert::{Cx, NodeIn, Value, WeightSink};
use crate::onnx_proto::{ModelProto, TensorProto};
use crate::tensor::External;

pub use crate::ops::supported_ops;
pub use crate::tensor::to_proto;

/// How deep `If` branches may nest.
const MAX_BRANCH_DEPTH: usize = 16;

/// The newest ONNX opset imported (that of onnx 1.23).
pub const MAX_OPSET: i64 = 28;

/// What the caller fixes and bounds.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Shapes of graph inputs, replacing the model's (required for dynamic dimensions).
    pub shapes: HashMap<String, Vec<u64>>,
    /// Graph inputs whose values are fixed at import time: they become constants (an axes or
    /// sizes input, say), and the graph no longer has them as inputs.
    pub fixed: HashMap<String, HostTensor>,
    /// The largest `.onnx` file read.
    pub max_model_bytes: u64,
    /// The largest single tensor (initializer, constant, external data).
    pub max_tensor_bytes: u64,
    /// All known values together: initializers and the results folded at import.
    pub max_total_bytes: u64,
    /// The largest result one node may fold into at import (larger ones run in the graph).
    pub max_fold_bytes: u64,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            shapes: HashMap::new(),
            fixed: HashMap::new(),
            max_model_bytes: 2 << 30,
            max_tensor_bytes: 4 << 30,
            max_total_bytes: 16 << 30,
            max_fold_bytes: 64 << 20,
        }
    }
}

/// Small limits for the fuzz target and its corpus test: any amplification passes them.
pub fn fuzz_limits() -> ImportOptions {
    ImportOptions {
        max_model_bytes: 1 << 20,
        max_tensor_bytes: 1 << 20,
        max_total_bytes: 4 << 20,
        max_fold_bytes: 1 << 20,
        ..ImportOptions::default()
    }
}

/// An imported model.
pub struct Imported {
    pub graph: Graph,
    /// The safetensors file the graph's weights refer to, `None` when it has none.
    pub weights: Option<Vec<u8>>,
    pub report: Report,
}

/// What the import did, for the user.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub producer: String,
    pub opset: i64,
    pub onnx_nodes: usize,
    /// ONNX nodes evaluated at import time (shape arithmetic, constant subgraphs).
    pub folded_nodes: usize,
    /// ONNX op types and how many nodes of each the model has.
    pub op_counts: BTreeMap<String, usize>,
    pub weight_tensors: usize,
}

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, more than the {limit}-byte limit for a model")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("not an ONNX model: {0}")]
    Decode(String),
    #[error("the model {0}")]
    Model(String),
    #[error("graph input {name:?}: {message}")]
    Input { name: String, message: String },
    #[error("initializer {name:?} {message}")]
    Initializer { name: String, message: String },
    #[error("node {node:?} ({op_type}): {message}")]
    Node {
        node: String,
        op_type: String,
        message: String,
    },
    #[error("the imported graph is invalid: {0}")]
    Graph(String),
}

/// Import the `.onnx` file at `path`; external data is read from its folder.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Imported, ImportError> {
    let bytes = read_model(path, opts)?;
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    import_bytes(&bytes, dir, opts)
}

/// A model file's bytes, its size checked against the limit before it is read.
fn read_model(path: &Path, opts: &ImportOptions) -> Result<Vec<u8>, ImportError> {
    let io = |source| ImportError::Io {
        path: path.display().to_string(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > opts.max_model_bytes {
        return Err(ImportError::TooLarge {
            path: path.display().to_string(),
            size,
            limit: opts.max_model_bytes,
        });
    }
    std::fs::read(path).map_err(io)
}

/// Import a model from its bytes; `dir` is where external data may be read from (`None`:
/// a model with external data is refused).
pub fn import_bytes(
    bytes: &[u8],
    dir: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Imported, ImportError> {
    if bytes.len() as u64 > opts.max_model_bytes {
        return Err(ImportError::TooLarge {
            path: "the model".into(),
            size: bytes.len() as u64,
            limit: opts.max_model_bytes,
        });
    }
    let model = ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    let external = External { dir };
    Importer::new(&model, &external, opts)?.run()
}

/// Read a `TensorProto` file (the ONNX backend tests' `input_0.pb`): its name and tensor.
pub fn read_tensor_pb(bytes: &[u8]) -> Result<(String, HostTensor), String> {
    let t = TensorProto::decode(bytes).map_err(|e| format!("not a TensorProto: {e}"))?;
    let host = tensor::to_host(&t, &External { dir: None }, 4 << 30)?;
    Ok((t.name.clone().unwrap_or_default(), host))
}

struct Importer<'m> {
    model: &'m ModelProto,
    external: &'m External<'m>,
    opts: &'m ImportOptions,
    opset: i64,
}

impl<'m> Importer<'m> {
    fn new(
        model: &'m ModelProto,
        external: &'m External<'m>,
        opts: &'m ImportOptions,
    ) -> Result<Importer<'m>, ImportError> {
        let opset = model
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
            .and_then(|o| o.version)
            .ok_or_else(|| ImportError::Model("declares no version of the ONNX opset".into()))?;
        if !(1..=MAX_OPSET).contains(&opset) {
            return Err(ImportError::Model(format!(
                "uses opset {opset}; tenet imports opsets 1 to {MAX_OPSET}"
            )));
        }
        if model.graph.is_none() {
            return Err(ImportError::Model("has no graph".into()));
        }
        Ok(Importer {
            model,
            external,
            opts,
            opset,
        })
    }

    fn run(self) -> Result<Imported, ImportError> {
        let graph = self.model.graph.as_ref().expect("checked in new");
        let limits = tenet_ir::Limits::default();
        if graph.node.len() > limits.max_nodes {
            return Err(ImportError::Model(format!(
                "has {} nodes, more than tenet's {}",
                graph.node.len(),
                limits.max_nodes
            )));
        }
        let mut report = Report {
            producer: format!(
                "{} {}",
                self.model.producer_name.as_deref().unwrap_or(""),
                self.model.producer_version.as_deref().unwrap_or("")
            )
            .trim()
            .to_string(),
            opset: self.opset,
            onnx_nodes: graph.node.len(),
            ..Report::default()
        };
        let mut values: HashMap<String, Value> = HashMap::new();
        let mut total = 0u64;
        for init in &graph.initializer {
            let name = init.name.clone().unwrap_or_default();
            let t = tensor::to_host(init, self.external, self.opts.max_tensor_bytes).map_err(
                |message| ImportError::Initializer {
                    name: name.clone(),
                    message,
                },
            )?;
            total += t.bytes().len() as u64;
            if total > self.opts.max_total_bytes {
                return Err(ImportError::Model(format!(
                    "has more than {} bytes of initializers",
                    self.opts.max_total_bytes
                )));
            }
            values.insert(name.clone(), Value::known(&name, t));
        }
        if !graph.sparse_initializer.is_empty() {
            return Err(ImportError::Model(
                "has sparse initializers, which tenet does not import".into(),
            ));
        }
        let mut sink = WeightSink::default();
        let mut cx = Cx::main(&mut sink);
        for name in graph
            .node
            .iter()
            .flat_map(|n| &n.input)
            .chain(graph.output.iter().filter_map(|o| o.name.as_ref()))
        {
            *cx.readers.entry(name.clone()).or_default() += 1;
        }
        for input in &graph.input {
            let name = input.name.clone().unwrap_or_default();
            if values.contains_key(&name) {
                continue; // an initializer listed as an input (IR version < 4)
            }
            let fail = |message: String| ImportError::Input {
                name: name.clone(),
                message,
            };
            tenet_ir::check_name("input", &name).map_err(fail)?;
            if let Some(value) = self.opts.fixed.get(&name) {
                let (dtype, _) = self
                    .input_type(input, &name)
                    .unwrap_or((value.dtype(), vec![]));
                if dtype != value.dtype() {
                    return Err(fail(format!(
                        "is {dtype} in the model, but the value fixed for it is {}",
                        value.ty()
                    )));
                }
                values.insert(name.clone(), Value::known(&name, value.clone()));
                continue;
            }
            let (dtype, shape) = self.input_type(input, &name).map_err(fail)?;
            let t = cx.g.input(&name, dtype, &shape);
            values.insert(name, Value::Sym(t));
        }
        for unknown in self.opts.shapes.keys().chain(self.opts.fixed.keys()) {
            if !graph
                .input
                .iter()
                .any(|i| i.name.as_deref() == Some(unknown))
            {
                return Err(ImportError::Input {
                    name: unknown.clone(),
                    message: "was given a shape or value, but the model has no such input".into(),
                });
            }
        }
        self.convert_nodes(
            &graph.node,
            &mut values,
            &mut cx,
            &mut report,
            &mut total,
            0,
        )?;
        let mut outputs = Vec::new();
        let mut seen = HashSet::new();
        for out in &graph.output {
            let name = out.name.clone().unwrap_or_default();
            let bad = |message: String| ImportError::Graph(format!("output {name:?} {message}"));
            tenet_ir::check_name("output", &name).map_err(bad)?;
            if !seen.insert(name.clone()) {
                return Err(bad("is named twice".into()));
            }
            let v = values
                .get(&name)
                .ok_or_else(|| bad("is produced by no node".into()))?;
            let t = cx.tensor(v);
            outputs.push((name, t));
        }
        let pairs: Vec<(&str, &tenet_ir::Tensor)> =
            outputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let built =
            cx.g.finish(&pairs)
                .map_err(|e| ImportError::Graph(convert::build_message(&e)))?;
        let built = convert::hoist_constants(built).map_err(ImportError::Graph)?;
        drop(cx);
        // Only the tensors the finished graph still uses go into the file.
        let used: HashSet<&str> = built
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                tenet_ir::Op::Weight { tensor, .. } => Some(tensor.as_str()),
                _ => None,
            })
            .collect();
        let kept: Vec<_> = sink
            .tensors
            .iter()
            .filter(|(name, _)| used.contains(name.as_str()))
            .collect();
        report.weight_tensors = kept.len();
        if kept.is_empty() {
            return Ok(Imported {
                graph: built,
                weights: None,
                report,
            });
        }
        let file: Vec<(&str, DType, Vec<u64>, Vec<u8>)> = kept
            .iter()
            .map(|(name, t)| {
                (
                    name.as_str(),
                    t.dtype(),
                    t.shape().to_vec(),
                    t.bytes().to_vec(),
                )
            })
            .collect();
        let weights = tenet_models::write_safetensors(&file)
            .map_err(|e| ImportError::Graph(format!("writing the weights: {e}")))?;
        let graph = convert::patch_weights_id(built, WeightsId::of_bytes(&weights))
            .map_err(ImportError::Graph)?;
        Ok(Imported {
            graph,
            weights: Some(weights),
            report,
        })
    }

    /// Convert `nodes` in order into `values`: each one folded or built by its converter; an
    /// `If` whose condition is known at import is replaced by the nodes of the branch it
    /// takes (`depth` counts the branches entered).
    fn convert_nodes(
        &self,
        nodes: &[crate::onnx_proto::NodeProto],
        values: &mut HashMap<String, Value>,
        cx: &mut Cx,
        report: &mut Report,
        total: &mut u64,
        depth: usize,
    ) -> Result<(), ImportError> {
        for (index, node) in nodes.iter().enumerate() {
            let op_type = node.op_type.clone().unwrap_or_default();
            *report.op_counts.entry(op_type.clone()).or_default() += 1;
            let fail = |message: String| ImportError::Node {
                node: match node.name.as_deref() {
                    Some(n) if !n.is_empty() => n.to_string(),
                    _ => format!("#{index}"),
                },
                op_type: op_type.clone(),
                message,
            };
            if !matches!(node.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
                return Err(fail(format!(
                    "is in the domain {:?}; tenet imports only the standard ONNX domain",
                    node.domain.as_deref().unwrap_or("")
                )));
            }
            if op_type == "If" {
                let branch = self.taken_branch(node, values, depth).map_err(fail)?;
                for init in &branch.initializer {
                    let name = init.name.clone().unwrap_or_default();
                    let t = tensor::to_host(init, self.external, self.opts.max_tensor_bytes)
                        .map_err(|message| ImportError::Initializer {
                            name: name.clone(),
                            message,
                        })?;
                    *total += t.bytes().len() as u64;
                    if *total > self.opts.max_total_bytes {
                        return Err(ImportError::Model(format!(
                            "has more than {} bytes of known values",
                            self.opts.max_total_bytes
                        )));
                    }
                    values.insert(name.clone(), Value::known(&name, t));
                }
                self.convert_nodes(&branch.node, values, cx, report, total, depth + 1)?;
                if branch.output.len() < node.output.len() {
                    return Err(fail("its branch has fewer outputs than the node".into()));
                }
                for (out, inner) in node.output.iter().zip(&branch.output) {
                    let inner = inner.name.clone().unwrap_or_default();
                    let v = values.get(&inner).cloned().ok_or_else(|| {
                        fail(format!(
                            "its branch's output {inner:?} is produced by nothing"
                        ))
                    })?;
                    if !out.is_empty() {
                        values.insert(out.clone(), v);
                    }
                }
                continue;
            }
            let Some(convert) = ops::converter(&op_type) else {
                return Err(fail(format!(
                    "tenet has no mapping for the op type {op_type:?} (supported: docs/ONNX.md)"
                )));
            };
            let mut inputs = Vec::with_capacity(node.input.len());
            for name in &node.input {
                if name.is_empty() {
                    inputs.push(None);
                    continue;
                }
                let v = values.get(name).ok_or_else(|| {
                    fail(format!(
                        "reads {name:?}, which no earlier node, input or initializer produces (the graph is not in topological order, or has a cycle)"
                    ))
                })?;
                inputs.push(Some(v.clone()));
            }
            let all_known = inputs.iter().all(|v| !matches!(v, Some(Value::Sym(_))));
            let n = NodeIn::new(
                node,
                inputs,
                self.opset,
                self.external,
                self.opts.max_tensor_bytes,
                self.opts.max_fold_bytes,
                self.opts.max_total_bytes.saturating_sub(*total),
            );
            let outs = convert::convert_node(cx, &n, convert).map_err(fail)?;
            *total = self.opts.max_total_bytes - n.fold_budget.get();
            if all_known && outs.iter().all(|v| matches!(v, Value::Known(_))) {
                report.folded_nodes += 1;
            }
            for (name, v) in node.output.iter().zip(outs) {
                if !name.is_empty() {
                    values.insert(name.clone(), v);
                }
            }
        }
        Ok(())
    }

    /// The branch an `If` takes: its condition must be known at import.
    fn taken_branch<'n>(
        &self,
        node: &'n crate::onnx_proto::NodeProto,
        values: &HashMap<String, Value>,
        depth: usize,
    ) -> Result<&'n crate::onnx_proto::GraphProto, String> {
        if depth >= MAX_BRANCH_DEPTH {
            return Err(format!("nests branches deeper than {MAX_BRANCH_DEPTH}"));
        }
        if let Some(a) = node
            .attribute
            .iter()
            .find(|a| !matches!(a.name.as_deref(), Some("then_branch") | Some("else_branch")))
        {
            return Err(format!(
                "attribute {:?} is not supported",
                a.name.as_deref().unwrap_or("")
            ));
        }
        let cond_name = node.input.first().ok_or("has no condition")?;
        let cond = match values.get(cond_name) {
            Some(Value::Known(k)) if k.t.numel() == 1 => k.t.bytes().iter().any(|&b| b != 0),
            Some(Value::Known(k)) => {
                return Err(format!("has a condition of {} elements", k.t.numel()));
            }
            Some(Value::Sym(_)) => {
                return Err(format!(
                    "branches on {cond_name:?}, which is computed from the graph's inputs: tenet imports an If only when its condition is known when the model is imported; fix it with --fix {cond_name:?}=VALUE if it is an input, or the input it depends on"
                ));
            }
            None => return Err(format!("reads {cond_name:?}, which nothing produces")),
        };
        let which = if cond { "then_branch" } else { "else_branch" };
        node.attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(which))
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| format!("has no {which}"))
    }

    /// A graph input's declared dtype and dimensions (`None` where dynamic).
    fn declared(
        &self,
        input: &crate::onnx_proto::ValueInfoProto,
    ) -> (Result<DType, String>, Vec<Option<u64>>) {
        use crate::onnx_proto::tensor_shape_proto::dimension;
        use crate::onnx_proto::type_proto;
        let Some(type_proto::Value::TensorType(tt)) =
            input.r#type.as_ref().and_then(|t| t.value.as_ref())
        else {
            return (Err("not a tensor".into()), Vec::new());
        };
        let dims = tt
            .shape
            .as_ref()
            .map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(dimension::Value::DimValue(v)) => u64::try_from(*v).ok(),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        (tensor::dtype_of(tt.elem_type.unwrap_or(0)), dims)
    }

    /// A graph input's dtype and shape: the caller's shape if given, else the model's, whose
    /// every dimension must then be fixed.
    fn input_type(
        &self,
        input: &crate::onnx_proto::ValueInfoProto,
        name: &str,
    ) -> Result<(DType, Vec<u64>), String> {
        use crate::onnx_proto::tensor_shape_proto::dimension;
        use crate::onnx_proto::type_proto;
        let Some(type_proto::Value::TensorType(tt)) =
            input.r#type.as_ref().and_then(|t| t.value.as_ref())
        else {
            return Err("is not a tensor (sequences, maps and optionals are not supported)".into());
        };
        let dtype = tensor::dtype_of(tt.elem_type.unwrap_or(0))?;
        let model_dims: Option<Vec<Option<u64>>> = tt.shape.as_ref().map(|s| {
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(dimension::Value::DimValue(v)) => u64::try_from(*v).ok(),
                    _ => None,
                })
                .collect()
        });
        let symbol = |i: usize| -> String {
            tt.shape
                .as_ref()
                .and_then(|s| s.dim.get(i))
                .and_then(|d| match &d.value {
                    Some(dimension::Value::DimParam(p)) => Some(format!(" ({p:?})")),
                    _ => None,
                })
                .unwrap_or_default()
        };
        if let Some(given) = self.opts.shapes.get(name) {
            if let Some(dims) = &model_dims {
                if dims.len() != given.len() {
                    return Err(format!(
                        "has rank {} in the model, but the shape given has {} dimensions",
                        dims.len(),
                        given.len()
                    ));
                }
                for (i, (m, g)) in dims.iter().zip(given).enumerate() {
                    if let Some(m) = m
                        && m != g
                    {
                        return Err(format!(
                            "has dimension {i} fixed to {m} in the model, but the shape given says {g}"
                        ));
                    }
                }
            }
            return Ok((dtype, given.clone()));
        }
        let Some(dims) = model_dims else {
            return Err(format!(
                "has no shape in the model; give one with --shape {name}=D0,D1,..."
            ));
        };
        let mut shape = Vec::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            match d {
                Some(d) => shape.push(*d),
                None => {
                    return Err(format!(
                        "has a dynamic dimension {i}{}; fix its shape with --shape {name}=D0,D1,... ({} dimensions)",
                        symbol(i),
                        dims.len()
                    ));
                }
            }
        }
        Ok((dtype, shape))
    }
}

/// A graph input as the model declares it: name, dtype (or why tenet has none), dimensions
/// (`None` where dynamic).
pub type DeclaredInput = (String, Result<DType, String>, Vec<Option<u64>>);

/// A model's interface and op types, read without importing it.
#[derive(Clone, Debug)]
pub struct Description {
    pub opset: i64,
    /// Graph inputs (initializers excluded): name, dtype (or why tenet has none), dimensions
    /// (`None` where dynamic).
    pub inputs: Vec<DeclaredInput>,
    /// ONNX op types and how many nodes of each; `supported` says whether tenet maps the type.
    pub op_counts: BTreeMap<String, usize>,
}

/// Read a model's inputs and op types (bounded as `import_file` is).
pub fn describe_file(path: &Path, opts: &ImportOptions) -> Result<Description, ImportError> {
    let bytes = read_model(path, opts)?;
    let model = ModelProto::decode(&bytes[..]).map_err(|e| ImportError::Decode(e.to_string()))?;
    let external = External { dir: None };
    let importer = Importer::new(&model, &external, opts)?;
    let graph = model.graph.as_ref().expect("checked in new");
    let initializers: HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|i| i.name.as_deref())
        .collect();
    let mut inputs = Vec::new();
    for input in &graph.input {
        let name = input.name.clone().unwrap_or_default();
        if initializers.contains(name.as_str()) {
            continue;
        }
        let (dtype, dims) = importer.declared(input);
        inputs.push((name, dtype, dims));
    }
    let mut op_counts = BTreeMap::new();
    for node in &graph.node {
        *op_counts
            .entry(node.op_type.clone().unwrap_or_default())
            .or_default() += 1;
    }
    Ok(Description {
        opset: importer.opset,
        inputs,
        op_counts,
    })
}

/// Whether the importer maps an ONNX op type.
pub fn is_supported(op_type: &str) -> bool {
    ops::converter(op_type).is_some()
}
