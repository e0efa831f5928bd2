//! The import driver: walks the ONNX graph in order, keeping each value either **known** (its
//! elements computed at import time: initializers, `Constant`s, shapes, and every node whose
//! operands are all known, evaluated on the reference interpreter) or **symbolic** (a tensor of
//! the tenet graph being built). Known values reach the graph only where an op needs them as a
//! tensor: small ones as constants, large ones as weights of the safetensors file written
//! beside the graph. Shape arithmetic (Shape → Gather → Concat → Reshape) therefore folds away
//! by itself. Every attribute and input of a node must be read by its op's converter, so one
//! the converter does not understand is refused instead of silently ignored.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use tenet_ir::{
    BuildError, DType, Graph, GraphBuilder, HostTensor, Limits, NoWeights, Op, Tensor, TensorType,
    WeightsId,
};

use crate::onnx_proto::{AttributeProto, NodeProto};
use crate::tensor::{External, to_host};

/// Known values above this many bytes become weights rather than graph constants.
pub(crate) const MAX_INLINE_CONSTANT_BYTES: u64 = 4096;
/// The fold builder's own constant limits: above anything `ImportOptions::max_fold_bytes` lets
/// through.
const MAX_FOLD_BYTES: u64 = 1 << 30;

/// A value of the ONNX graph.
#[derive(Clone)]
pub(crate) enum Value {
    Known(Known),
    Sym(Tensor),
}

/// A tensor whose elements are known at import time, with the ONNX name it first had.
#[derive(Clone)]
pub(crate) struct Known {
    pub name: Rc<str>,
    pub t: Rc<HostTensor>,
}

impl Value {
    pub fn ty(&self) -> TensorType {
        match self {
            Value::Known(k) => k.t.ty().clone(),
            Value::Sym(t) => t.ty().clone(),
        }
    }

    pub fn known(name: &str, t: HostTensor) -> Value {
        Value::Known(Known {
            name: name.into(),
            t: Rc::new(t),
        })
    }
}

/// Where known tensors go when the graph needs them as weights.
#[derive(Default)]
pub(crate) struct WeightSink {
    /// (tensor name in the file, tensor), in order of first use.
    pub tensors: Vec<(String, Rc<HostTensor>)>,
    by_ptr: HashMap<*const HostTensor, usize>,
    names: HashSet<String>,
}

impl WeightSink {
    fn add(&mut self, name: &str, t: &Rc<HostTensor>) -> String {
        if let Some(&i) = self.by_ptr.get(&Rc::as_ptr(t)) {
            return self.tensors[i].0.clone();
        }
        let base = if tenet_ir::check_name("weight", name).is_ok() && name.len() < 200 {
            name.to_string()
        } else {
            format!("w{}", self.tensors.len())
        };
        let mut unique = base.clone();
        let mut n = 1;
        while self.names.contains(&unique) {
            unique = format!("{base}.{n}");
            n += 1;
        }
        self.names.insert(unique.clone());
        self.by_ptr.insert(Rc::as_ptr(t), self.tensors.len());
        self.tensors.push((unique.clone(), t.clone()));
        unique
    }
}

/// The weights file's id while the graph is built; replaced by the real hash once the file is
/// written (`patch_weights_id`).
pub(crate) const PLACEHOLDER: WeightsId = WeightsId([0; 32]);

/// A builder and how known values enter it.
pub(crate) struct Cx<'s> {
    pub g: GraphBuilder,
    /// `None` while folding: every known value is then a constant.
    sink: Option<&'s mut WeightSink>,
    /// Known values already in the builder, by address; each entry holds its tensor alive so
    /// that the address cannot be reused by another value.
    materialized: HashMap<*const HostTensor, (Rc<HostTensor>, Tensor)>,
    /// How many nodes and graph outputs read each value, by name (the main graph's).
    pub readers: HashMap<String, usize>,
    /// 2-D convolutions with known weights whose output only one node reads, by output name:
    /// a BatchNormalization reading one rebuilds it with the normalisation folded into its
    /// weights and bias (the original is then read by nothing and dropped).
    pub convs: HashMap<String, ConvFold>,
}

/// What rebuilding a convolution takes.
#[derive(Clone)]
pub(crate) struct ConvFold {
    pub x: Tensor,
    pub w: Rc<HostTensor>,
    pub b: Option<Rc<HostTensor>>,
    pub strides: [u32; 2],
    pub pads: [u32; 4],
    pub dilations: [u32; 2],
    pub groups: u32,
}

impl<'s> Cx<'s> {
    pub(crate) fn main(sink: &'s mut WeightSink) -> Cx<'s> {
        Cx {
            g: GraphBuilder::new(),
            sink: Some(sink),
            materialized: HashMap::new(),
            readers: HashMap::new(),
            convs: HashMap::new(),
        }
    }

    fn fold() -> Cx<'static> {
        Cx {
            g: GraphBuilder::with_limits(Limits {
                max_constant_bytes: MAX_FOLD_BYTES * 4,
                max_total_constant_bytes: MAX_FOLD_BYTES * 16,
                ..Limits::default()
            }),
            sink: None,
            materialized: HashMap::new(),
            readers: HashMap::new(),
            convs: HashMap::new(),
        }
    }

    /// `v` as a tensor of this builder.
    pub fn tensor(&mut self, v: &Value) -> Tensor {
        match v {
            Value::Sym(t) => t.clone(),
            Value::Known(k) => {
                if let Some((_, t)) = self.materialized.get(&Rc::as_ptr(&k.t)) {
                    return t.clone();
                }
                let ty = k.t.ty();
                let t = match &mut self.sink {
                    Some(sink) if k.t.bytes().len() as u64 > MAX_INLINE_CONSTANT_BYTES => {
                        let name = sink.add(&k.name, &k.t);
                        self.g.weight(PLACEHOLDER, &name, ty.dtype, &ty.shape)
                    }
                    _ => self.g.constant(ty.dtype, &ty.shape, k.t.bytes().to_vec()),
                };
                self.materialized
                    .insert(Rc::as_ptr(&k.t), (k.t.clone(), t.clone()));
                t
            }
        }
    }

    /// The dimensions of a tensor this converter made — or the builder's mistake, since a
    /// failed op's tensor has no real shape to index.
    pub fn dims(&self, t: &Tensor) -> Result<Vec<u64>, String> {
        match self.g.error() {
            Some(e) => Err(build_message(&e)),
            None => Ok(t.shape().to_vec()),
        }
    }

    /// Evaluate `f` over known tensors now, on the reference interpreter.
    pub fn eval_known(
        &mut self,
        name: &str,
        xs: &[&HostTensor],
        f: impl FnOnce(&GraphBuilder, &[Tensor]) -> Tensor,
    ) -> Result<Value, String> {
        let fcx = Cx::fold();
        let ts: Vec<Tensor> = xs
            .iter()
            .map(|x| fcx.g.constant(x.dtype(), x.shape(), x.bytes().to_vec()))
            .collect();
        let out = f(&fcx.g, &ts);
        let mut outs = evaluate(&fcx.g, &[out])?;
        Ok(Value::known(name, outs.remove(0)))
    }
}

/// Run a folding builder's graph for the given results.
fn evaluate(g: &GraphBuilder, outs: &[Tensor]) -> Result<Vec<HostTensor>, String> {
    let names: Vec<String> = (0..outs.len()).map(|i| format!("o{i}")).collect();
    let pairs: Vec<(&str, &Tensor)> = names.iter().map(|n| n.as_str()).zip(outs).collect();
    let graph = g.finish(&pairs).map_err(|e| build_message(&e))?;
    let out = tenet_reference::run(&graph, &HashMap::new(), &NoWeights, 0)
        .map_err(|e| format!("evaluating it at import time failed: {e}"))?;
    Ok(out.into_iter().map(|(_, t)| t).collect())
}

/// A builder error's message without the importer's own source location.
pub(crate) fn build_message(e: &BuildError) -> String {
    match e {
        BuildError::Op { op, message, .. } => format!("{op}: {message}"),
        BuildError::Invalid(v) => v.to_string(),
    }
}

/// One ONNX node as its converter sees it: attributes, operands, and the opset in force.
pub(crate) struct NodeIn<'a> {
    pub proto: &'a NodeProto,
    pub inputs: Vec<Option<Value>>,
    pub opset: i64,
    pub external: &'a External<'a>,
    pub max_tensor_bytes: u64,
    /// The largest value a node's evaluation at import may produce, and what is left of the
    /// import's whole budget for known values (initializers and folded results together).
    pub max_fold_bytes: u64,
    pub fold_budget: std::cell::Cell<u64>,
    used_attrs: RefCell<HashSet<String>>,
    used_inputs: RefCell<HashSet<usize>>,
}

impl<'a> NodeIn<'a> {
    pub fn new(
        proto: &'a NodeProto,
        inputs: Vec<Option<Value>>,
        opset: i64,
        external: &'a External<'a>,
        max_tensor_bytes: u64,
        max_fold_bytes: u64,
        fold_budget: u64,
    ) -> NodeIn<'a> {
        NodeIn {
            proto,
            inputs,
            opset,
            external,
            max_tensor_bytes,
            max_fold_bytes,
            fold_budget: std::cell::Cell::new(fold_budget),
            used_attrs: RefCell::new(HashSet::new()),
            used_inputs: RefCell::new(HashSet::new()),
        }
    }

    pub fn op_type(&self) -> &str {
        self.proto.op_type.as_deref().unwrap_or("")
    }

    /// Whether a known result of `bytes` may be kept (it is then charged to the budget).
    pub fn may_keep(&self, bytes: u64) -> bool {
        let left = self.fold_budget.get();
        if bytes <= self.max_fold_bytes && bytes <= left {
            self.fold_budget.set(left - bytes);
            true
        } else {
            false
        }
    }

    /// The name of output `i` (for known results).
    pub fn out_name(&self, i: usize) -> &str {
        self.proto.output.get(i).map(|s| s.as_str()).unwrap_or("")
    }

    pub fn input_count(&self) -> usize {
        self.inputs.len()
    }

    /// Operand `i`, if present.
    pub fn opt(&self, i: usize) -> Option<&Value> {
        self.used_inputs.borrow_mut().insert(i);
        self.inputs.get(i).and_then(|v| v.as_ref())
    }

    /// Operand `i`, which must be present.
    pub fn get(&self, i: usize) -> Result<&Value, String> {
        self.opt(i)
            .ok_or_else(|| format!("needs input {i}, which is missing"))
    }

    /// Operand `i` as a tensor of `cx`'s builder.
    pub fn t(&self, cx: &mut Cx, i: usize) -> Result<Tensor, String> {
        Ok(cx.tensor(self.get(i)?))
    }

    pub fn opt_t(&self, cx: &mut Cx, i: usize) -> Option<Tensor> {
        self.opt(i).map(|v| cx.tensor(v))
    }

    /// Operand `i`'s elements, which must be known at import time.
    pub fn known(&self, i: usize, what: &str) -> Result<Option<Rc<HostTensor>>, String> {
        match self.opt(i) {
            None => Ok(None),
            Some(Value::Known(k)) => Ok(Some(k.t.clone())),
            Some(Value::Sym(_)) => Err(format!(
                "needs its input {i} ({what}) known when the model is imported, but it is computed from the graph's inputs: fix their shapes with --shape, or this value with --fix {:?}=FILE if it is an input",
                self.proto.input.get(i).map(|s| s.as_str()).unwrap_or("")
            )),
        }
    }

    /// Operand `i` as integers known at import time.
    pub fn known_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>, String> {
        let Some(t) = self.known(i, what)? else {
            return Ok(None);
        };
        Ok(Some(ints_of(&t, what)?))
    }

    /// Operand `i` as one float known at import time.
    pub fn known_f64(&self, i: usize, what: &str) -> Result<Option<f64>, String> {
        let Some(t) = self.known(i, what)? else {
            return Ok(None);
        };
        if t.numel() != 1 {
            return Err(format!("needs {what} to be one value, got {}", t.ty()));
        }
        Ok(Some(match t.dtype() {
            DType::I64 | DType::I32 | DType::U8 | DType::Bool => t.to_i64_vec()[0] as f64,
            _ => t.get_f32(0) as f64,
        }))
    }

    fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        self.used_attrs.borrow_mut().insert(name.to_string());
        self.proto
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64, String> {
        match self.attr(name) {
            None => Ok(default),
            Some(a) => {
                a.i.ok_or_else(|| format!("attribute {name:?} should be an integer"))
            }
        }
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self.attr(name).map(|a| a.ints.clone()))
    }

    pub fn float(&self, name: &str, default: f32) -> Result<f32, String> {
        match self.attr(name) {
            None => Ok(default),
            Some(a) => {
                a.f.ok_or_else(|| format!("attribute {name:?} should be a float"))
            }
        }
    }

    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, String> {
        Ok(self.attr(name).map(|a| a.floats.clone()))
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String, String> {
        match self.attr(name) {
            None => Ok(default.to_string()),
            Some(a) => {
                let s =
                    a.s.as_ref()
                        .ok_or_else(|| format!("attribute {name:?} should be a string"))?;
                String::from_utf8(s.clone()).map_err(|_| format!("attribute {name:?} is not UTF-8"))
            }
        }
    }

    /// A list-of-strings attribute.
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) => a
                .strings
                .iter()
                .map(|s| {
                    String::from_utf8(s.clone())
                        .map_err(|_| format!("attribute {name:?} is not UTF-8"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
        }
    }

    pub fn tensor_attr(&self, name: &str) -> Result<Option<HostTensor>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) => {
                let t =
                    a.t.as_ref()
                        .ok_or_else(|| format!("attribute {name:?} should be a tensor"))?;
                to_host(t, self.external, self.max_tensor_bytes)
                    .map(Some)
                    .map_err(|e| format!("attribute {name:?} {e}"))
            }
        }
    }

    /// The first attribute or present input the converter never looked at.
    fn unread(&self) -> Option<String> {
        let used = self.used_attrs.borrow();
        if let Some(a) = self
            .proto
            .attribute
            .iter()
            .find(|a| !used.contains(a.name.as_deref().unwrap_or("")))
        {
            return Some(format!(
                "attribute {:?} is not supported",
                a.name.as_deref().unwrap_or("")
            ));
        }
        let used = self.used_inputs.borrow();
        (0..self.inputs.len())
            .find(|i| self.inputs[*i].is_some() && !used.contains(i))
            .map(|i| format!("input {i} ({:?}) is not supported", self.proto.input[i]))
    }
}

/// Integers of a known tensor.
pub(crate) fn ints_of(t: &HostTensor, what: &str) -> Result<Vec<i64>, String> {
    match t.dtype() {
        DType::I64 | DType::I32 | DType::U8 => Ok(t.to_i64_vec()),
        other => Err(format!("needs {what} as integers, got {other}")),
    }
}

/// Convert one node: folded into known values when every operand is known and small, else
/// into ops of the main builder.
pub(crate) fn convert_node(
    cx: &mut Cx,
    n: &NodeIn,
    convert: fn(&mut Cx, &NodeIn) -> Result<Vec<Value>, String>,
) -> Result<Vec<Value>, String> {
    let foldable = !n.inputs.is_empty()
        && n.inputs.iter().all(|v| match v {
            None => true,
            Some(Value::Known(k)) => (k.t.bytes().len() as u64) <= n.max_fold_bytes,
            Some(Value::Sym(_)) => false,
        });
    if foldable && let Some(outs) = try_fold(n, convert)? {
        return Ok(outs);
    }
    let outs = convert(cx, n)?;
    if let Some(e) = cx.g.error() {
        return Err(build_message(&e));
    }
    finish_node(n, outs)
}

/// Fold a node whose operands are known: `Ok(None)` when its results would be too large to
/// keep at import time.
fn try_fold(
    n: &NodeIn,
    convert: fn(&mut Cx, &NodeIn) -> Result<Vec<Value>, String>,
) -> Result<Option<Vec<Value>>, String> {
    let mut fcx = Cx::fold();
    let outs = convert(&mut fcx, n)?;
    if let Some(e) = fcx.g.error() {
        return Err(build_message(&e));
    }
    let sym: Vec<Tensor> = outs
        .iter()
        .filter_map(|v| match v {
            Value::Sym(t) => Some(t.clone()),
            Value::Known(_) => None,
        })
        .collect();
    let bytes = sym.iter().try_fold(0u64, |acc, t| {
        t.ty().bytes().and_then(|b| acc.checked_add(b))
    });
    if !bytes.is_some_and(|b| n.may_keep(b)) {
        return Ok(None);
    }
    let mut computed = if sym.is_empty() {
        Vec::new()
    } else {
        evaluate(&fcx.g, &sym)?
    }
    .into_iter();
    let outs = outs
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Sym(_) => Value::known(n.out_name(i), computed.next().expect("one per symbol")),
            known => known,
        })
        .collect();
    finish_node(n, outs).map(Some)
}

/// Check that the converter read everything and produced every output the model uses.
fn finish_node(n: &NodeIn, outs: Vec<Value>) -> Result<Vec<Value>, String> {
    if let Some(problem) = n.unread() {
        return Err(problem);
    }
    if let Some(i) = (outs.len()..n.proto.output.len()).find(|&i| !n.proto.output[i].is_empty()) {
        return Err(format!(
            "output {i} ({:?}) is not supported",
            n.proto.output[i]
        ));
    }
    Ok(outs)
}

/// Replace the placeholder weights id with the written file's.
pub(crate) fn patch_weights_id(graph: Graph, id: WeightsId) -> Result<Graph, String> {
    let (mut nodes, outputs) = graph.into_parts();
    for node in &mut nodes {
        if let Op::Weight { file, .. } = &mut node.op {
            *file = id;
        }
    }
    Graph::new(nodes, outputs).map_err(|e| e.to_string())
}

/// Move every node that does not depend on a graph input (weights, constants, and their
/// reshapes or other preparation) ahead of the rest, keeping each part's order. Converters
/// make constants where they need them, so these would otherwise sit between the elementwise
/// ops of a chain and split what the CPU backend fuses into one pass.
pub(crate) fn hoist_constants(graph: Graph) -> Result<Graph, String> {
    let (nodes, outputs) = graph.into_parts();
    let mut constant = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        constant[i] = !matches!(n.op, Op::Input { .. })
            && n.op.operands().iter().all(|o| constant[o.index()]);
    }
    let order: Vec<usize> = (0..nodes.len())
        .filter(|&i| constant[i])
        .chain((0..nodes.len()).filter(|&i| !constant[i]))
        .collect();
    let mut at = vec![0u32; nodes.len()];
    for (new, &old) in order.iter().enumerate() {
        at[old] = new as u32;
    }
    let remap = |n: tenet_ir::NodeId| tenet_ir::NodeId(at[n.index()]);
    let moved = order
        .iter()
        .map(|&old| tenet_ir::Node {
            op: nodes[old].op.map_operands(remap),
            ty: nodes[old].ty.clone(),
        })
        .collect();
    let outputs = outputs
        .into_iter()
        .map(|o| tenet_ir::Output {
            node: remap(o.node),
            ..o
        })
        .collect();
    Graph::new(moved, outputs).map_err(|e| e.to_string())
}
