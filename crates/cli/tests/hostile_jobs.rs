//! Jobs that are cheap by flops and bytes but costly by op count, time or scratch, sent to a
//! real `tenet node` process on 127.0.0.1 (issue 29, "the certificate does not bound memory or
//! time"): a long chain must not stall the node's event loop, its timeout must hold while the
//! task is planned and inside a step, and admission must use the executor's bounds.
//! Nothing here reads a clock: what is asserted is an order of events or an error code.

use std::path::PathBuf;

use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_net::{NodeClient, identity};
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::{JobState, RunJob};
use tenet_proto::{ErrorCode, Hash, tensor};

mod common;

use common::{Proc, spawn_tenet, url_of};

/// A node process (one worker, one thread per job) trusting `key`, killed when dropped.
struct NodeProc {
    _child: Proc,
    addr: String,
}

fn start_node(name: &str, key: &KeyPair, extra: &[&str]) -> NodeProc {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "tenet-hostile-jobs-{}-{name}-{}",
        std::process::id(),
        identity::random_bytes::<4>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let pk = key.public().to_hex();
    let dir_arg = dir.to_str().expect("a UTF-8 temporary path");
    let mut args = vec![
        "node",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir_arg,
        "--threads",
        "1",
        "--workers",
        "1",
        "--trust",
        pk.as_str(),
    ];
    args.extend_from_slice(extra);
    let (child, line) = spawn_tenet(args);
    NodeProc {
        addr: url_of(&line).trim_start_matches("http://").to_string(),
        _child: child,
    }
}

fn client(node: &NodeProc, key: &KeyPair) -> NodeClient {
    NodeClient::new(&node.addr, key.clone()).unwrap()
}

/// `x` through `len` elementwise ops (exp, neg, add x) with no constants: on a 4-element
/// tensor, 250,000 ops are certified at 10⁶ flops and 48 bytes — "tiny" by flops and bytes,
/// which is how such a job used to run on the node's event loop.
fn chain(len: usize, width: u64) -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[width]);
    let mut y = x.clone();
    for i in 0..len {
        y = match i % 3 {
            0 => y.exp(),
            1 => y.neg(),
            _ => &y + &x,
        };
    }
    g.finish(&[("y", &y)]).unwrap()
}

fn job(id: &str, task: Hash, inputs: &[(&str, &HostTensor)], timeout_ms: Option<u64>) -> RunJob {
    RunJob {
        job: JobSpec {
            job_id: id.to_string(),
            task,
            weights: None,
            inputs: inputs
                .iter()
                .map(|(n, t)| (n.to_string(), tensor::hash(t)))
                .collect(),
            tier: Tier::Exact,
            seed: 0,
        },
        timeout_ms,
        pulls: Default::default(),
        stage: None,
        blobs: inputs
            .iter()
            .map(|(_, t)| (tensor::hash(t), tenet_proto::to_hex(&tensor::encode(t))))
            .collect(),
    }
}

fn small_input(width: u64) -> HostTensor {
    let v: Vec<f32> = (0..width).map(|i| i as f32 / width as f32).collect();
    HostTensor::from_f32(&[width], &v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_chain_runs_off_the_event_loop() {
    let key = identity::generate();
    let node = start_node("chain", &key, &[]);
    let c = client(&node, &key);
    let graph = chain(250_000, 4);
    assert!(graph.cost().flops <= 1 << 20 && graph.cost().peak_bytes <= 1 << 20);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let x = small_input(4);
    // The first job decodes and plans the task, which the node then keeps: later jobs of it
    // are what the node used to run inline, as "tiny".
    c.run_job(&job("warm", task, &[("x", &x)], None))
        .await
        .unwrap();
    // While a job of the cached chain runs, /v1/info answers and the job is still running
    // after that answer: the answer came first. (On the event loop, no answer could come
    // before the job had finished.) A job can end between two requests, so try a few.
    let mut seen = false;
    for attempt in 0..20 {
        let id = format!("chain-{attempt}");
        let runner = client(&node, &key);
        let req = job(&id, task, &[("x", &x)], None);
        let running = tokio::spawn(async move { runner.run_job(&req).await });
        while c.job_status(&id).await.ok().map(|s| s.state) != Some(JobState::Running) {
            if running.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let info = c.info().await;
        let still_running =
            c.job_status(&id).await.ok().map(|s| s.state) == Some(JobState::Running);
        assert!(info.is_ok(), "{info:?}");
        let done = running.await.unwrap();
        assert!(done.is_ok(), "the chain job failed: {done:?}");
        if still_running {
            seen = true;
            break;
        }
    }
    assert!(
        seen,
        "/v1/info never answered while a chain job was running: the job blocked the node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_holds_while_planning_and_inside_a_step() {
    let key = identity::generate();
    let node = start_node("timeout", &key, &[]);
    let c = client(&node, &key);

    // Planning: a fresh 250,000-op task takes far longer than 1 ms to decode and plan, and
    // the deadline now starts before that, not at the first step.
    let graph = chain(250_000, 4);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let x = small_input(4);
    let e = c
        .run_job(&job("plan", task, &[("x", &x)], Some(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");

    // Inside steps: 120,000 ops over 2¹⁸ elements are 3·10¹⁰ element operations, seconds of
    // work; its work figure still fits a 1 s limit at the admission's top speed, so it is
    // admitted, runs, and is stopped there (504 timeout), and the node keeps serving.
    let wide = chain(120_000, 1 << 18);
    let work = tenet_exec::work(wide.cost(), wide.nodes().len());
    assert!(work < 1000 * 500_000_000, "{work}");
    let task = c.put_blob(wide.to_bytes()).await.unwrap().hash;
    let x = small_input(1 << 18);
    c.put_blob(tensor::encode(&x)).await.unwrap();
    let mut req = job("wide", task, &[("x", &x)], Some(1000));
    req.blobs.clear();
    let e = c.run_job(&req).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert_eq!(
        c.job_status("wide").await.unwrap().state,
        JobState::Failed,
        "the timed-out job is recorded as failed"
    );
    assert!(c.info().await.is_ok());
    let metrics = c.metrics().await.unwrap();
    assert!(
        metrics.contains("tenet_jobs_total{outcome=\"timeout\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_uses_the_work_and_memory_bounds() {
    let key = identity::generate();
    let node = start_node("admission", &key, &["--memory-limit", "64M"]);
    let c = client(&node, &key);

    // Work: 2.7·10⁹ flops cannot be done in 1 ms on one core at any speed: refused before it
    // runs (422), not started and timed out.
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[1024, 256]);
    let b = g.input("b", DType::F32, &[256, 1024]);
    let ab = a.matmul(&b);
    let graph = g.finish(&[("y", &ab.matmul(&ab))]).unwrap();
    let work = tenet_exec::work(graph.cost(), graph.nodes().len());
    assert!(work > 500_000_000, "{work}");
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let shaped = |shape: [u64; 2]| {
        let t = small_input(shape[0] * shape[1]);
        HostTensor::new(
            tenet_ir::TensorType::new(DType::F32, shape),
            t.bytes().to_vec(),
        )
        .unwrap()
    };
    let (ta, tb) = (shaped([1024, 256]), shaped([256, 1024]));
    let e = c
        .run_job(&job("fast", task, &[("a", &ta), ("b", &tb)], Some(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ExceedsLimits), "{e}");
    assert!(e.to_string().contains("time limit"), "{e}");

    // Memory: an f16 sum is certified at 6 MiB, under the node's 64 MiB, but the executor
    // computes it on the reference's code, whose working memory the certificate does not
    // count: the node refuses it by the executor's bound, before running it.
    let g = GraphBuilder::new();
    let h = g.input("h", DType::F16, &[1 << 20]);
    let graph = g.finish(&[("y", &(&h + &h))]).unwrap();
    assert!(graph.cost().peak_bytes < 64 << 20);
    let task = c.put_blob(graph.to_bytes()).await.unwrap().hash;
    let th = HostTensor::zeros(tenet_ir::TensorType::new(DType::F16, [1 << 20])).unwrap();
    c.put_blob(tensor::encode(&th)).await.unwrap();
    let mut req = job("f16", task, &[("h", &th)], None);
    req.blobs.clear();
    let e = c.run_job(&req).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ExceedsLimits), "{e}");
    assert!(e.to_string().contains("scratch"), "says why: {e}");
    assert!(c.info().await.is_ok());
}
