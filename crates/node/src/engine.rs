//! Turning blobs into runnable work: tasks (graphs) decoded under the node's limits, checked
//! against its cost limits and planned once; weights files indexed once; both cached in memory
//! by content address, so a repeated job pays for neither.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenet_exec::{Backend, CpuBackend, Prepared, RunStats};
use tenet_ir::{Graph, HostTensor, Limits, WeightSource, WeightsId};
use tenet_models::{WeightsFile, check_bindings};
use tenet_proto::{ApiError, ErrorCode, Hash};
use tenet_store::Store;

use crate::errors::{exec_error, store_error};

/// What one job may cost, checked against its certificate before it runs.
#[derive(Clone, Copy, Debug)]
pub struct JobLimits {
    pub memory_bytes: u64,
    pub flops: u64,
}

/// A graph ready to run.
pub struct Task {
    pub graph: Graph,
    pub prepared: Box<dyn Prepared>,
}

/// A small map that forgets its least recently used entry beyond `capacity`.
struct Lru<V> {
    map: HashMap<Hash, (u64, Arc<V>)>,
    clock: u64,
    capacity: usize,
}

impl<V> Lru<V> {
    fn new(capacity: usize) -> Lru<V> {
        Lru {
            map: HashMap::new(),
            clock: 0,
            capacity,
        }
    }

    fn get(&mut self, k: &Hash) -> Option<Arc<V>> {
        self.clock += 1;
        let now = self.clock;
        self.map.get_mut(k).map(|(t, v)| {
            *t = now;
            v.clone()
        })
    }

    fn insert(&mut self, k: Hash, v: Arc<V>) {
        while self.map.len() >= self.capacity {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.map.remove(&oldest);
        }
        self.clock += 1;
        self.map.insert(k, (self.clock, v));
    }
}

/// Graphs and weights by address, and the backend that runs them.
pub struct Engine {
    store: Arc<Store>,
    backend: CpuBackend,
    limits: JobLimits,
    tasks: Mutex<Lru<Task>>,
    weights: Mutex<Lru<WeightsFile>>,
}

/// The weights a job binds: at most one file.
struct Bound<'a>(Option<&'a WeightsFile>);

impl WeightSource for Bound<'_> {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        self.0.filter(|w| w.id == *file)?.tensor(tensor)
    }
}

impl Engine {
    pub fn new(store: Arc<Store>, backend: CpuBackend, limits: JobLimits) -> Engine {
        Engine {
            store,
            backend: backend.with_memory_limit(limits.memory_bytes),
            limits,
            tasks: Mutex::new(Lru::new(256)),
            weights: Mutex::new(Lru::new(4)),
        }
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    /// The task `hash`: from the cache, or decoded from the store, checked and planned.
    pub fn task(&self, hash: &Hash) -> Result<Arc<Task>, ApiError> {
        if let Some(t) = self.tasks.lock().ok().and_then(|mut c| c.get(hash)) {
            return Ok(t);
        }
        let bytes = self.store.get(hash).map_err(|e| match e {
            tenet_store::StoreError::NotFound(_) => ApiError::new(
                ErrorCode::NotFound,
                format!("task {hash} is not on this node: upload the graph with PUT /v1/blobs/{hash} first"),
            ),
            e => store_error(e),
        })?;
        let graph =
            tenet_ir::codec::decode_with_limits(&bytes, &Limits::default()).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidGraph,
                    format!("task {hash} is not a tenet graph in canonical binary form: {e}"),
                )
            })?;
        self.check_cost(&graph)?;
        let prepared = self.backend.prepare(&graph).map_err(exec_error)?;
        let task = Arc::new(Task { graph, prepared });
        if let Ok(mut c) = self.tasks.lock() {
            c.insert(*hash, task.clone());
        }
        Ok(task)
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

    /// The weights file `hash`, indexed.
    pub fn weights(&self, hash: &Hash) -> Result<Arc<WeightsFile>, ApiError> {
        if let Some(w) = self.weights.lock().ok().and_then(|mut c| c.get(hash)) {
            return Ok(w);
        }
        let bytes = self.store.get(hash).map_err(|e| match e {
            tenet_store::StoreError::NotFound(_) => ApiError::new(
                ErrorCode::NotFound,
                format!("weights {hash} are not on this node: upload them with PUT /v1/blobs/{hash} first"),
            ),
            e => store_error(e),
        })?;
        let file = WeightsFile::from_bytes(bytes, &hash.short())
            .map_err(|e| ApiError::new(ErrorCode::BadInputs, e.to_string()))?;
        let file = Arc::new(file);
        if let Ok(mut c) = self.weights.lock() {
            c.insert(*hash, file.clone());
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
}
