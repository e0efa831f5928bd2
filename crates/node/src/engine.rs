//! Turning blobs into runnable work: tasks (graphs) decoded under the node's limits, checked
//! against its cost limits and planned once; weights files indexed once; both cached in memory
//! by content address, so a repeated job pays for neither.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenet_exec::{Buffer, Device, Program, RunStats};
use tenet_ir::{Graph, HostTensor, Limits, WeightSource, WeightsId};
use tenet_models::generation::Arithmetic;
use tenet_models::smollm2::{Batcher, SmolLm2};
use tenet_models::{WeightsError, WeightsFile, check_bindings};
use tenet_proto::{ApiError, ErrorCode, Hash};
use tenet_store::Store;

use crate::errors::{exec_error, store_error};
use crate::lru::Lru;

/// What one job may cost, checked against its certificate before it runs.
#[derive(Clone, Copy, Debug)]
pub struct JobLimits {
    pub memory_bytes: u64,
    pub flops: u64,
}

/// A graph ready to run.
pub struct Task {
    pub graph: Graph,
    pub prepared: Box<dyn Program>,
}

/// Graphs and weights by address, and the backend that runs them.
pub struct Engine {
    store: Arc<Store>,
    device: Arc<dyn Device>,
    /// Cores' worth of speed the device has, for the time check (`check_time`).
    speed_cores: u64,
    limits: JobLimits,
    tasks: Mutex<Lru<Task>>,
    weights: Mutex<Lru<WeightsFile>>,
    /// Decoded input tensors by blob address, weighed in bytes.
    tensors: Mutex<Lru<HostTensor>>,
    /// LLMs loaded for generation jobs, by their GGUF file's address and arithmetic
    /// (`llm_key`), each with the batcher that decodes its requests together.
    llms: Mutex<Lru<Llm>>,
}

/// A model loaded for generation jobs: its weights quantised as in its file, and the
/// continuous batch every generation job on it joins.
pub struct Llm {
    pub model: Arc<SmolLm2>,
    pub batcher: Batcher,
}

/// LLMs kept loaded at once (each holds its file mapped and a worker thread).
const LLMS_KEPT: u64 = 2;

/// Where the LLM of GGUF file `hash` computing with `arithmetic` is kept: the file's own
/// address for `exact`, a hash of it and the arithmetic's name otherwise.
fn llm_key(hash: &Hash, arithmetic: Arithmetic) -> Hash {
    match arithmetic {
        Arithmetic::Exact => *hash,
        other => Hash::of(&[&hash.0[..], other.name().as_bytes()].concat()),
    }
}

/// Requests one LLM decodes together at most.
pub const MAX_BATCH: usize = 8;

/// Bytes of decoded input tensors kept for reuse.
const TENSOR_CACHE_BYTES: u64 = 512 << 20;

/// Weights files kept for reuse, in jobs' memory limits: a file weighs its bytes plus what
/// it holds once loaded (dequantised or copied tensors, its index), so a node holds at most
/// this many limits' worth of weights however many files its clients name.
const WEIGHTS_CACHE_JOBS: u64 = 2;

/// Nodes of planned tasks kept for reuse (a task weighs its node count: its graph and plan
/// take a few hundred bytes a node, so a cache counted in tasks could hold 256 graphs of a
/// million ops each).
const TASK_CACHE_NODES: u64 = 1 << 21;

/// Work units (`tenet_exec::work`) one core does per millisecond at the very most: above any
/// core's FMA peak (a unit is a flop, a byte moved, or 1/1024 of a node's fixed cost). A job
/// whose work exceeds its time limit times this speed times the cores cannot finish in time,
/// and is refused before it runs.
pub const WORK_PER_MS_PER_CORE: u64 = 500_000_000;

/// A weights file refused: over the memory limit is `exceeds_limits`, anything else (not a
/// weights file, tensors that share bytes, an amplifying header) `bad_inputs`; both 422.
fn weights_error(e: WeightsError) -> ApiError {
    let code = match e {
        WeightsError::OverBudget { .. } => ErrorCode::ExceedsLimits,
        _ => ErrorCode::BadInputs,
    };
    ApiError::new(code, e.to_string())
}

/// The weights a job binds: at most one file.
pub(crate) struct Bound<'a>(pub(crate) Option<&'a WeightsFile>);

impl WeightSource for Bound<'_> {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        self.0.filter(|w| w.id == *file)?.tensor(tensor)
    }
}

impl Engine {
    /// An engine running on `device`, which should refuse graphs over `limits.memory_bytes`
    /// (open it with that memory limit).
    pub fn new(store: Arc<Store>, device: Arc<dyn Device>, limits: JobLimits) -> Engine {
        // A CPU device works at most as fast as its threads; any other device is given
        // thousands of cores' worth, so the time check never refuses what a GPU could do (the
        // job's own deadline still stops it).
        let info = device.info();
        let speed_cores = match info.class {
            tenet_exec::DeviceClass::Cpu => info.compute_units.max(1) as u64,
            _ => 4096,
        };
        Engine {
            store,
            device,
            speed_cores,
            limits,
            tasks: Mutex::new(Lru::new(TASK_CACHE_NODES)),
            weights: Mutex::new(Lru::new(
                limits.memory_bytes.saturating_mul(WEIGHTS_CACHE_JOBS),
            )),
            tensors: Mutex::new(Lru::new(TENSOR_CACHE_BYTES)),
            llms: Mutex::new(Lru::new(LLMS_KEPT)),
        }
    }

    /// The LLM whose GGUF file is the blob `hash`, loaded with its weights quantised (the
    /// file's blocks, mapped) to compute with `arithmetic`, and its batcher started; kept for
    /// the next job.
    pub fn llm(&self, hash: &Hash, arithmetic: Arithmetic) -> Result<Arc<Llm>, ApiError> {
        let key = llm_key(hash, arithmetic);
        if let Some(l) = self.llms.lock().ok().and_then(|mut c| c.get(&key)) {
            return Ok(l);
        }
        if self.store.contains(hash).is_none() {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "weights {hash} are not on this node: upload the model's GGUF file with PUT /v1/blobs/{hash} first"
                ),
            ));
        }
        let path = self.store.path(hash);
        // What loading copies or dequantises (quantised matrices stay views of the file) is
        // refused over the job memory limit before anything is allocated.
        let mode = arithmetic.weights_mode();
        let model = SmolLm2::load_within(&path, mode, self.limits.memory_bytes).map_err(|e| {
            let code = match e {
                tenet_models::gguf::GgufError::OverBudget { .. } => ErrorCode::ExceedsLimits,
                _ => ErrorCode::BadInputs,
            };
            ApiError::new(
                code,
                format!("weights {hash} are not a Llama GGUF model this node can run: {e}"),
            )
        })?;
        if model.weights.id.0 != hash.0 {
            return Err(ApiError::new(
                ErrorCode::Internal,
                format!("the stored blob {hash} no longer hashes to its address"),
            ));
        }
        let model = Arc::new(model);
        let llm = Arc::new(Llm {
            batcher: Batcher::start(model.clone(), self.device.clone(), MAX_BATCH),
            model,
        });
        if let Ok(mut c) = self.llms.lock() {
            c.insert(key, llm.clone(), 1);
        }
        Ok(llm)
    }

    /// Refuse a generation of `max_tokens` after `prompt` tokens that would not fit this
    /// node's limits: its KV cache (at the capacity bucket holding every position) over the
    /// job memory limit, or its work (two operations per weight per position) over the job
    /// operation limit. The bytes of its KV cache.
    pub fn check_generation(
        &self,
        model: &SmolLm2,
        prompt: u64,
        max_tokens: u64,
    ) -> Result<u64, ApiError> {
        let c = &model.config;
        let positions = (prompt + max_tokens).min(c.context);
        let capacity = model.capacity_for(positions).unwrap_or(c.context);
        let head_dim = c.hidden / c.heads;
        let cache = 2 * c.layers * capacity * c.kv_heads * head_dim * 4;
        if cache > self.limits.memory_bytes {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "a generation of {positions} positions keeps {cache} bytes of keys and values; this node runs jobs of up to {} bytes",
                    self.limits.memory_bytes
                ),
            ));
        }
        // Parameters: a quantised matrix [rows, blocks, block bytes] holds 32 a block.
        let params: u64 = model
            .weights
            .tensors
            .iter()
            .map(
                |(name, t)| match (c.quantized.contains_key(name), t.shape()) {
                    (true, [rows, blocks, _]) => rows.saturating_mul(*blocks).saturating_mul(32),
                    _ => t.ty().numel().unwrap_or(u64::MAX),
                },
            )
            .fold(0u64, u64::saturating_add);
        let flops = params.saturating_mul(2).saturating_mul(positions);
        if flops > self.limits.flops {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "a generation of {positions} positions takes about {flops} operations; this node runs jobs of up to {}",
                    self.limits.flops
                ),
            ));
        }
        Ok(cache)
    }

    pub fn backend_name(&self) -> String {
        self.device.name()
    }

    /// Move a host tensor to the device tasks run on, where sessions keep their tensors (no
    /// copy where the device is the host).
    pub fn upload(&self, tensor: HostTensor) -> Result<Buffer, ApiError> {
        self.device.upload_owned(tensor).map_err(exec_error)
    }

    /// Write `src` into `dst` from byte `offset`, on the device (`dst` copied first if shared).
    pub fn write(&self, dst: &mut Buffer, offset: u64, src: &Buffer) -> Result<(), ApiError> {
        self.device.write(dst, offset, src).map_err(exec_error)
    }

    /// A buffer's tensor on the host, to hash or send: read in place where the device is the
    /// host (the buffer's handle is then the host tensor itself), downloaded otherwise.
    pub fn host<'b>(&self, buffer: &'b Buffer) -> Result<Cow<'b, HostTensor>, ApiError> {
        if buffer.device() == self.device.id()
            && let Some(t) = buffer.handle::<HostTensor>()
        {
            return Ok(Cow::Borrowed(t));
        }
        self.device
            .download(buffer)
            .map(Cow::Owned)
            .map_err(exec_error)
    }

    /// The task `hash`: from the cache, or decoded from the store, checked and planned.
    pub fn task(&self, hash: &Hash) -> Result<Arc<Task>, ApiError> {
        if let Some(t) = self.tasks.lock().ok().and_then(|mut c| c.get(hash)) {
            return Ok(t);
        }
        let bytes = self.blob(hash, "task")?;
        let graph =
            tenet_ir::codec::decode_with_limits(&bytes, &Limits::default()).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidGraph,
                    format!("task {hash} is not a tenet graph in canonical binary form: {e}"),
                )
            })?;
        self.check_cost(&graph)?;
        let prepared = self.device.compile(&graph).map_err(exec_error)?;
        let task = Arc::new(Task { graph, prepared });
        if let Ok(mut c) = self.tasks.lock() {
            c.insert(*hash, task.clone(), task.graph.nodes().len() as u64);
        }
        Ok(task)
    }

    /// A blob a job needs, or a not-found error that says how to provide it.
    fn blob(&self, hash: &Hash, what: &str) -> Result<Vec<u8>, ApiError> {
        self.store.get(hash).map_err(|e| match e {
            tenet_store::StoreError::NotFound(_) => ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "{what} {hash} is not on this node: upload it with PUT /v1/blobs/{hash} first"
                ),
            ),
            e => store_error(e),
        })
    }

    /// Whether blob `hash` can be had here without an upload: in the store, or already decoded
    /// in one of the caches (which outlive an evicted blob).
    pub fn holds(&self, hash: &Hash) -> bool {
        fn kept<V>(c: &Mutex<Lru<V>>, hash: &Hash) -> bool {
            c.lock().is_ok_and(|c| c.contains(hash))
        }
        self.store.contains(hash).is_some()
            || kept(&self.tasks, hash)
            || kept(&self.weights, hash)
            || kept(&self.tensors, hash)
            || Arithmetic::ALL
                .into_iter()
                .any(|a| kept(&self.llms, &llm_key(hash, a)))
    }

    /// The task `hash` if it is already decoded and planned.
    pub fn cached_task(&self, hash: &Hash) -> Option<Arc<Task>> {
        self.tasks.lock().ok().and_then(|mut c| c.get(hash))
    }

    /// The tensor blob `hash`: carried `inline` with the request, cached, or from the store.
    pub fn tensor(
        &self,
        hash: &Hash,
        inline: Option<&[u8]>,
        what: &str,
    ) -> Result<Arc<HostTensor>, ApiError> {
        if let Some(t) = self.tensors.lock().ok().and_then(|mut c| c.get(hash)) {
            return Ok(t);
        }
        let stored;
        let bytes = match inline {
            Some(b) => b,
            None => {
                stored = self.store.get(hash).map_err(|e| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("{what}: {e}; upload it or send it inline"),
                    )
                })?;
                &stored
            }
        };
        // Shared bytes: every job that names this tensor gets a handle, not a copy.
        let t = Arc::new(
            tenet_proto::tensor::decode(bytes)
                .map_err(|e| ApiError::new(ErrorCode::BadInputs, format!("{what}: {e}")))?
                .into_shared(),
        );
        if let Ok(mut c) = self.tensors.lock() {
            c.insert(*hash, t.clone(), t.bytes().len() as u64);
        }
        Ok(t)
    }

    /// Refuse a job whose work (`tenet_exec::work` of its task's certificate) could not be
    /// done within `limit` even at this node's top speed ([`WORK_PER_MS_PER_CORE`] per core).
    pub fn check_time(&self, task: &Task, limit: std::time::Duration) -> Result<(), ApiError> {
        let work = tenet_exec::work(task.graph.cost(), task.graph.nodes().len());
        let speed = WORK_PER_MS_PER_CORE.saturating_mul(self.speed_cores);
        let ms = limit.as_millis().min(u64::MAX as u128) as u64;
        if work > ms.saturating_mul(speed) {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "the job's work is {work} units (flops + bytes + 1024 per op), at least {} ms at this node's top speed of {speed} units a millisecond; its time limit is {ms} ms: raise timeout_ms or split the graph",
                    work / speed.max(1)
                ),
            ));
        }
        Ok(())
    }

    /// Refuse a graph whose certificate does not fit this node.
    fn check_cost(&self, graph: &Graph) -> Result<(), ApiError> {
        let cost = graph.cost();
        if cost.peak_bytes > self.limits.memory_bytes {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "the graph's cost certificate needs {} bytes of tensor memory; this node runs jobs of up to {}",
                    cost.peak_bytes, self.limits.memory_bytes
                ),
            ));
        }
        if cost.flops > self.limits.flops {
            return Err(ApiError::new(
                ErrorCode::ExceedsLimits,
                format!(
                    "the graph's cost certificate needs {} operations; this node runs jobs of up to {}",
                    cost.flops, self.limits.flops
                ),
            ));
        }
        Ok(())
    }

    /// The weights file `hash`, indexed. Loading it (GGUF tensors dequantised to f32, copies
    /// of misaligned tensors, the index) may take at most the job memory limit beyond the
    /// file's bytes: a file that would take more is refused as exceeding the node's limits
    /// before anything is dequantised.
    pub fn weights(&self, hash: &Hash) -> Result<Arc<WeightsFile>, ApiError> {
        if let Some(w) = self.weights.lock().ok().and_then(|mut c| c.get(hash)) {
            return Ok(w);
        }
        let bytes = self.blob(hash, "weights")?;
        let file_bytes = bytes.len() as u64;
        let file = WeightsFile::from_bytes_within(bytes, &hash.short(), self.limits.memory_bytes)
            .map_err(weights_error)?;
        let file = Arc::new(file);
        if let Ok(mut c) = self.weights.lock() {
            let weight = file_bytes.saturating_add(file.resident_bytes());
            c.insert(*hash, file.clone(), weight);
        }
        Ok(file)
    }

    /// Run `task` on `inputs`, asking `stop` between steps.
    pub fn run(
        &self,
        task: &Task,
        weights: Option<&WeightsFile>,
        inputs: &HashMap<String, HostTensor>,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, HostTensor)>, RunStats), ApiError> {
        check_bindings(
            &task.graph,
            weights.map(std::slice::from_ref).unwrap_or(&[]),
        )
        .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
        task.prepared
            .run_stoppable(inputs, &Bound(weights), seed, stop)
            .map_err(exec_error)
    }

    /// Run `task` on buffers already on the device (a session's resident tensors), asking
    /// `stop` between steps: the outputs stay on the device.
    pub fn run_buffers(
        &self,
        task: &Task,
        weights: Option<&WeightsFile>,
        inputs: &HashMap<String, Buffer>,
        seed: u64,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(String, Buffer)>, RunStats), ApiError> {
        check_bindings(
            &task.graph,
            weights.map(std::slice::from_ref).unwrap_or(&[]),
        )
        .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
        task.prepared
            .run_buffers(inputs, &Bound(weights), seed, stop)
            .map_err(exec_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights files are kept by what they weigh, not by how many they are: a node whose
    /// clients name many large files holds at most two jobs' memory of them (it held four
    /// files of any size).
    #[test]
    fn the_weights_cache_holds_at_most_two_memory_limits() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tenet_store::StoreConfig::default()).unwrap();
        let limit = 1 << 20;
        let engine = Engine::new(
            store.clone(),
            tenet_devices::open(
                "cpu",
                &tenet_devices::Options {
                    memory_limit: Some(limit),
                    ..Default::default()
                },
            )
            .unwrap(),
            JobLimits {
                memory_bytes: limit,
                flops: 1 << 30,
            },
        );
        let mut hashes = Vec::new();
        for i in 0..6u8 {
            // 900 KB each, every one within a job's memory limit on its own.
            let data = vec![i; 900_000];
            let file =
                tenet_models::write_safetensors(&[("w", tenet_ir::DType::U8, vec![900_000], data)])
                    .unwrap();
            let hash = store.put_bytes(&file).unwrap();
            let loaded = engine.weights(&hash).unwrap();
            assert!(loaded.tensor("w").is_some());
            hashes.push(hash);
        }
        let mut cache = engine.weights.lock().unwrap();
        let kept = hashes.iter().filter(|h| cache.get(h).is_some()).count();
        assert!(kept >= 1, "the last file is kept");
        assert!(
            kept as u64 * 900_000 <= 2 * limit,
            "{kept} files of 900 KB kept against a 1 MiB job limit"
        );
    }

    /// Session tensors live on the device: a run reads its input buffers where they lie and
    /// leaves its outputs there, and on the CPU reading one back for a hash or a fetch copies
    /// nothing.
    #[test]
    fn runs_on_buffers_keep_outputs_on_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tenet_store::StoreConfig::default()).unwrap();
        let engine = Engine::new(
            store.clone(),
            tenet_devices::open("cpu", &tenet_devices::Options::default()).unwrap(),
            JobLimits {
                memory_bytes: 1 << 30,
                flops: 1 << 30,
            },
        );
        let g = tenet_ir::GraphBuilder::new();
        let x = g.input("x", tenet_ir::DType::F32, &[4]);
        let y = &x * 2.0;
        let graph = g.finish(&[("y", &y)]).unwrap();
        let task = engine
            .task(&store.put_bytes(&graph.to_bytes()).unwrap())
            .unwrap();
        let x = engine
            .upload(HostTensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap())
            .unwrap();
        let in_place = engine.host(&x).unwrap();
        assert!(matches!(in_place, Cow::Borrowed(_)), "read in place");
        let inputs = HashMap::from([("x".to_string(), x.clone())]);
        let (outputs, _) = engine
            .run_buffers(&task, None, &inputs, 0, &|| false)
            .unwrap();
        let (name, y) = &outputs[0];
        assert_eq!(name, "y");
        assert_eq!(y.device(), engine.device.id());
        assert_eq!(
            engine.host(y).unwrap().to_f32_vec(),
            vec![2.0, 4.0, 6.0, 8.0]
        );
    }
}
