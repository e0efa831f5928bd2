//! The executor's real memory and its polling against the cost certificate, measured with a
//! counting global allocator (`tenet_sys::memory::Counting`, this test binary only).
//!
//! Every run here must allocate at most `Program::memory_bound()` beyond what was live before
//! it: the certificate's `peak_bytes` plus the CPU backend's documented scratch
//! (`tenet_cpu::{RUN_FIXED, PER_THREAD, PER_VALUE, ...}`, crates/cpu/src/bound.rs). Inputs and
//! weights are allocated before the measurement starts (the caller's memory; the certificate
//! counts them too, so the bound is only looser for it). For long elementwise chains and every
//! axis of every normalisation, the scratch itself must stay under a constant that does not
//! grow with the chain or the tensor ([`SCRATCH_CONSTANT`]).
//!
//! Two process-wide caches sit outside any run: `tenet_ir::recycle` keeps dropped buffers of
//! 1 MiB or more, and the GEMM keeps its packing buffers per thread. Every tensor here is
//! under 1 MiB, so the recycle cache never holds or lends one (a lent buffer would hide an
//! allocation; a kept one would look like the run's); the GEMM's packing is part of the
//! bound. The measurements share one allocator, so they run one at a time (`SERIAL`).
//! Nothing here reads a clock: run time is checked through how often a run asks its stop
//! function, which is what lets a node's deadline hold inside one long step.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_exec::{Device, Program};
use tenet_ir::testing::{RandomWeights as Weights, random_graph, random_io};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, QuantFormat, Tensor};
use tenet_sys::memory::Counting;

#[global_allocator]
static ALLOC: Counting = Counting::new();

static SERIAL: Mutex<()> = Mutex::new(());

/// Hold while a test allocates at all: the allocator counts every thread, so a graph built by
/// another test during a measurement would count as the run's.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most a long chain or a normalisation of any size may allocate beyond its certificate
/// on up to three threads: the run's tables, the per-thread allowance and a fused group's
/// chunk buffers (`RUN_FIXED + 3 × PER_THREAD + 3 × 259 chunks of 8 KiB`, rounded up).
const SCRATCH_CONSTANT: u64 = 8 << 20;

/// What one run allocated beyond what was live when it started, and its poll count.
struct Measured {
    growth: u64,
    allocations: u64,
}

fn measure(
    prepared: &dyn Program,
    inputs: &HashMap<String, HostTensor>,
    weights: &Weights,
) -> Measured {
    let before = ALLOC.allocations();
    let base = ALLOC.reset_peak();
    let result = prepared.run_with_stats(inputs, weights, 7);
    let peak = ALLOC.peak();
    let allocations = ALLOC.allocations() - before;
    drop(result);
    Measured {
        growth: (peak - base) as u64,
        allocations,
    }
}

/// Run `graph` on 1–3 threads and check the memory bound; returns the largest scratch seen
/// (bound minus certificate) and the largest growth beyond the certificate.
fn check_bound(graph: &Graph, seed: u64, what: &str) -> (u64, u64) {
    let (inputs, weights) = random_io(graph, seed);
    let peak = graph.cost().peak_bytes;
    let (mut scratch, mut over) = (0, 0);
    for threads in [1, 2, 3] {
        let backend = CpuDevice::new(threads, SimdLevel::detect());
        let prepared = backend.compile(graph).unwrap();
        let bound = prepared.memory_bound();
        let m = measure(&*prepared, &inputs, &weights);
        assert!(
            m.growth <= bound,
            "{what} on {threads} threads: allocated {} bytes, above its bound {bound} \
             (certificate {peak})",
            m.growth
        );
        scratch = scratch.max(bound - peak);
        over = over.max(m.growth.saturating_sub(peak));
    }
    (scratch, over)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_graphs_stay_within_the_bound(seed in any::<u64>()) {
        let _serial = serial();
        let graph = random_graph(seed, 25);
        check_bound(&graph, seed ^ 0x5eed, &format!("random graph {seed}"));
    }
}

/// `x` through `len` elementwise ops (tanh, neg, add x), as a client would send a hostile
/// job: no constants, which would each be a step of their own and cut the chain into short
/// fused groups.
fn chain(len: usize, shape: &[u64]) -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, shape);
    let mut y = x.clone();
    for i in 0..len {
        y = match i % 3 {
            0 => y.tanh(),
            1 => y.neg(),
            _ => &y + &x,
        };
    }
    g.finish(&[("y", &y)]).unwrap()
}

/// The same with a scalar constant every fourth op (each its own step).
fn chain_with_constants(len: usize, shape: &[u64]) -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, shape);
    let mut y = x.clone();
    for i in 0..len {
        y = match i % 4 {
            0 => &y * 0.5,
            1 => y.exp(),
            2 => y.neg(),
            _ => &y + &x,
        };
    }
    g.finish(&[("y", &y)]).unwrap()
}

#[test]
fn long_chains_allocate_a_constant_beyond_their_certificate() {
    // Certified at a few bytes; before the fix the fused evaluator took 8 KiB a member
    // (80 MB for 10,000 ops) and planning was quadratic in the chain.
    let _serial = serial();
    let mut per_node = Vec::new();
    for len in [1, 10, 1_000, 10_000, 30_000] {
        let graph = chain(len, &[4]);
        let (scratch, over) = check_bound(&graph, 1, &format!("chain of {len}"));
        assert!(
            scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT,
            "chain of {len}: scratch bound {scratch}, measured {over} beyond the certificate"
        );
        // Allocations per op stay flat as the chain grows: nothing is redone per member.
        let prepared = CpuDevice::new(2, SimdLevel::detect())
            .compile(&graph)
            .unwrap();
        let (inputs, weights) = random_io(&graph, 1);
        let m = measure(&*prepared, &inputs, &weights);
        per_node.push(m.allocations as f64 / graph.nodes().len() as f64);
    }
    assert!(
        per_node[4] <= 4.0 * per_node[3].max(1.0),
        "allocations per op grow with the chain: {per_node:?}"
    );
    // A wide tensor too: chunks of 2,048 floats, not a buffer per member; and a chain whose
    // every fourth op reads a scalar constant (thousands of tiny values, each freed after use).
    let (scratch, over) = check_bound(&chain(600, &[3, 20_000]), 2, "wide chain");
    assert!(scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT);
    let (scratch, over) = check_bound(&chain_with_constants(30_000, &[4]), 2, "with constants");
    assert!(scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT);
}

/// Every axis of softmax and log-softmax (f32, f16, bf16), layer and RMS norms (with and
/// without gamma and beta), and every reduction over every single axis and all axes.
#[test]
fn every_axis_of_every_normalisation_fits_its_certificate() {
    let _serial = serial();
    // 983,040 bytes in f32: big enough that a copy shows above the per-thread allowance,
    // under the 1 MiB at which the recycle cache would keep or lend buffers.
    let shape = [64u64, 48, 80];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for axis in 0..3i64 {
            for log in [false, true] {
                let g = GraphBuilder::new();
                let x = g.input("x", dtype, &shape);
                let y = if log {
                    x.log_softmax(axis)
                } else {
                    x.softmax(axis)
                };
                let graph = g.finish(&[("y", &y)]).unwrap();
                let what = format!(
                    "{} {dtype} axis {axis}",
                    if log { "log_softmax" } else { "softmax" }
                );
                let (scratch, over) = check_bound(&graph, 3, &what);
                assert!(
                    scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT,
                    "{what}: scratch bound {scratch}, measured {over} beyond the certificate"
                );
            }
        }
        for (gamma, beta) in [(false, false), (true, false), (true, true)] {
            let g = GraphBuilder::new();
            let x = g.input("x", dtype, &shape);
            let gm = gamma.then(|| g.input("g", dtype, &[80]));
            let bt = beta.then(|| g.input("b", dtype, &[80]));
            let l = x.layer_norm(gm.as_ref(), bt.as_ref(), 1e-5);
            let r = x.rms_norm(gm.as_ref(), 1e-6);
            for (name, y) in [("layer_norm", &l), ("rms_norm", &r)] {
                let graph = g.finish(&[("y", y)]).unwrap();
                let what = format!("{name} {dtype} gamma {gamma} beta {beta}");
                let (scratch, over) = check_bound(&graph, 4, &what);
                assert!(
                    scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT,
                    "{what}: scratch bound {scratch}, measured {over} beyond the certificate"
                );
            }
        }
    }
    // Reductions: f32 sums and means run on the kernels (a constant beyond the certificate);
    // the rest on the reference's code, within the bound's per-element allowance.
    type Reduce = fn(&Tensor, &[i64], bool) -> Tensor;
    let ops: [(&str, Reduce); 6] = [
        ("sum", Tensor::sum),
        ("mean", Tensor::mean),
        ("max", Tensor::max),
        ("min", Tensor::min),
        ("argmax", Tensor::argmax),
        ("argmin", Tensor::argmin),
    ];
    for (name, op) in ops {
        for axes in [&[0i64][..], &[1], &[2], &[0, 2], &[0, 1, 2]] {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &shape);
            let graph = g.finish(&[("y", &op(&x, axes, false))]).unwrap();
            let what = format!("{name} over {axes:?}");
            let (scratch, over) = check_bound(&graph, 5, &what);
            if matches!(name, "sum" | "mean") {
                assert!(
                    scratch <= SCRATCH_CONSTANT && over <= SCRATCH_CONSTANT,
                    "{what}: scratch bound {scratch}, measured {over} beyond the certificate"
                );
            }
        }
    }
}

/// Ops without a fast path run on the reference's code; the bound counts their working memory.
#[test]
fn ops_on_the_reference_path_stay_within_the_bound() {
    let _serial = serial();
    let g = GraphBuilder::new();
    let h = g.input("h", DType::F16, &[64, 96]);
    let i = g.input("i", DType::I64, &[64, 96]);
    let f = g.input("f", DType::F32, &[2, 8, 24, 24]);
    let w = g.input("w", DType::F32, &[4, 8, 3, 3]);
    let a = g.input("a", DType::F32, &[64, 96]);
    let q = g.input("q", DType::U8, &[80, 3, 20]);
    let outs = [
        ("qmatmul", a.qmatmul(&q, QuantFormat::Q4_1)),
        ("qmatmul_q8", a.qmatmul_q8(&q, QuantFormat::Q4_1)),
        ("dequantize", q.dequantize(QuantFormat::Q4_1)),
        ("add_f16", &h + &h),
        ("mul_i64", &i * &i),
        ("lt", h.lt(&h)),
        ("cast", h.cast(DType::F32)),
        ("matmul_f16", h.matmul(&h.transpose(0, 1))),
        ("conv", f.conv2d(&w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1)),
        ("pool", f.max_pool2d([2, 2], [2, 2], [0, 0, 0, 0])),
    ];
    for (name, y) in &outs {
        let graph = g.finish(&[(name, y)]).unwrap();
        check_bound(&graph, 6, name);
    }
}

/// The quantised product's scratch (a step-major copy of A, a padded last tile; for many rows a
/// chunk of dequantised weight and the GEMM's packing) is in the bound, on both of its paths
/// and at every thread count.
#[test]
fn quantised_products_stay_within_the_bound() {
    let _serial = serial();
    for (m, n, k, format) in [
        (1, 200, 576, QuantFormat::Q4_1),
        (5, 77, 96, QuantFormat::Q4_0),
        (16, 130, 256, QuantFormat::Q8_0),
        (40, 300, 160, QuantFormat::Q4_1),
        (200, 2000, 320, QuantFormat::Q8_0),
    ] {
        let g = GraphBuilder::new();
        let a = g.input("a", DType::F32, &[m, k]);
        let w = g.input("w", DType::U8, &[n, k / 32, format.block_bytes()]);
        let graph = g.finish(&[("y", &a.qmatmul(&w, format))]).unwrap();
        check_bound(&graph, 9, &format!("qmatmul {m}×{k} by {n}×{k}"));
    }
    // Sibling quantised products (one A, file weights): the first step makes the others'
    // results before their own steps, which the bound counts.
    for (q8, m, widths) in [
        (true, 1u64, [576u64, 192, 192]),
        (true, 40, [300, 2000, 64]),
        (false, 3, [576, 192, 192]),
        (false, 40, [300, 2000, 64]),
    ] {
        let k = 256;
        let g = GraphBuilder::new();
        let a = g.input("a", DType::F32, &[m, k]);
        let file = tenet_ir::WeightsId([3; 32]);
        let outs: Vec<_> = widths
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let w = g.weight(file, &format!("w{i}"), DType::U8, &[n, k / 32, 20]);
                let y = if q8 {
                    a.qmatmul_q8(&w, QuantFormat::Q4_1)
                } else {
                    a.qmatmul(&w, QuantFormat::Q4_1)
                };
                (format!("y{i}"), y)
            })
            .collect();
        let named: Vec<(&str, &_)> = outs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let graph = g.finish(&named).unwrap();
        check_bound(
            &graph,
            10,
            &format!("sibling products (q8 {q8}) of {m} rows"),
        );
    }
}

/// A long step asks its stop function as it goes, so a deadline holds inside it: a run told
/// to stop at the third question stops there, inside its one computing step.
#[test]
fn long_steps_ask_to_stop_as_they_go() {
    let _serial = serial();
    let cases: Vec<(&str, Graph)> = vec![
        ("fused chain", {
            // No constants (each would be a step of its own): one computing step.
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[1 << 16]);
            let mut y = x.clone();
            for i in 0..200 {
                y = if i % 2 == 0 { y.tanh() } else { &y + &x };
            }
            g.finish(&[("y", &y)]).unwrap()
        }),
        ("softmax over axis 0", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[256, 8192]);
            g.finish(&[("y", &x.softmax(0))]).unwrap()
        }),
        ("softmax rows", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[2048, 1024]);
            g.finish(&[("y", &x.softmax(-1))]).unwrap()
        }),
        ("batched matmul", {
            let g = GraphBuilder::new();
            let a = g.input("a", DType::F32, &[16, 64, 64]);
            g.finish(&[("y", &a.matmul(&a))]).unwrap()
        }),
        // Ops on the reference's code ask every POLL_WORK multiply-adds or taps.
        ("i32 matmul (the reference's code)", {
            let g = GraphBuilder::new();
            let a = g.input("a", DType::I32, &[256, 256]);
            g.finish(&[("y", &a.matmul(&a))]).unwrap()
        }),
        ("conv2d (im2col chunks on the GEMM)", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[1, 16, 256, 256]);
            let w = g.input("w", DType::F32, &[16, 16, 3, 3]);
            let y = x.conv2d(&w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1);
            g.finish(&[("y", &y)]).unwrap()
        }),
        ("depthwise conv2d (rows of fused multiply-adds)", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[1, 8, 1024, 64]);
            let w = g.input("w", DType::F32, &[8, 1, 3, 3]);
            let y = x.conv2d(&w, None, [1, 1], [1, 1, 1, 1], [1, 1], 8);
            g.finish(&[("y", &y)]).unwrap()
        }),
        ("conv2d of f16 (the reference's code)", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F16, &[1, 16, 64, 64]);
            let w = g.input("w", DType::F16, &[16, 16, 3, 3]);
            let y = x.conv2d(&w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1);
            g.finish(&[("y", &y)]).unwrap()
        }),
        ("qmatmul (the quantised kernel)", {
            let g = GraphBuilder::new();
            let a = g.input("a", DType::F32, &[16, 1024]);
            let w = g.input("w", DType::U8, &[256, 32, 34]);
            g.finish(&[("y", &a.qmatmul(&w, QuantFormat::Q8_0))])
                .unwrap()
        }),
        ("dequantize (block decoding)", {
            let g = GraphBuilder::new();
            let w = g.input("w", DType::U8, &[4096, 32, 18]);
            g.finish(&[("y", &w.dequantize(QuantFormat::Q4_0))])
                .unwrap()
        }),
        ("max_pool2d (the reference's code)", {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::I32, &[1, 8, 256, 256]);
            g.finish(&[("y", &x.max_pool2d([5, 5], [1, 1], [2, 2, 2, 2]))])
                .unwrap()
        }),
    ];
    for (what, graph) in cases {
        let (inputs, weights) = random_io(&graph, 8);
        let prepared = CpuDevice::new(1, SimdLevel::detect())
            .compile(&graph)
            .unwrap();
        // Run to the end: the one or two computing steps ask at least once per
        // POLL_ELEMENTS element operations (the certificate's elements written), far more
        // often than once per step.
        let (_, stats) = prepared.run_with_stats(&inputs, &weights, 0).unwrap();
        let elements = graph.cost().bytes_written / 4;
        assert!(
            stats.polls >= (elements / tenet_cpu::POLL_ELEMENTS as u64).max(8),
            "{what}: {} polls for {} nodes, {elements} elements written",
            stats.polls,
            graph.nodes().len()
        );
        // Stop at the third question: the run gives up there.
        let asked = AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, Ordering::Relaxed) >= 2;
        let r = prepared.run_stoppable(&inputs, &weights, 0, &stop);
        assert_eq!(r.err(), Some(tenet_exec::ExecError::Stopped), "{what}");
        assert_eq!(asked.load(Ordering::Relaxed), 3, "{what}");
    }
}

/// The work figure the node admits jobs by grows with the op count, not only with flops and
/// bytes: a long chain on a tiny tensor is not "tiny".
#[test]
fn work_counts_every_op() {
    let _serial = serial();
    let short = chain(3, &[4]);
    let long = chain(30_000, &[4]);
    let w = |g: &Graph| tenet_exec::work(g.cost(), g.nodes().len());
    assert!(w(&long) >= 30_000 * tenet_exec::WORK_PER_NODE);
    assert!(w(&short) < 16 * tenet_exec::WORK_PER_NODE);
}
