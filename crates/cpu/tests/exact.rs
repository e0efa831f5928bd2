//! The CPU backend against the reference: the same bits for every graph, SIMD level and thread
//! count.

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_exec::Device;
use tenet_ir::testing::{RandomWeights as Weights, random_graph, random_io};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};

fn backends() -> Vec<CpuDevice> {
    let mut v = Vec::new();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        for threads in [1, 2, 3] {
            v.push(CpuDevice::new(threads, level));
        }
    }
    v
}

fn assert_same_everywhere(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &Weights,
    seed: u64,
) {
    let want = tenet_reference::run(graph, inputs, weights, seed);
    for b in backends() {
        let got = b
            .compile(graph)
            .unwrap()
            .run_with_stats(inputs, weights, seed)
            .map(|(o, stats)| {
                assert!(
                    stats.peak_bytes <= graph.cost().peak_bytes,
                    "{}: peak {} above the certificate's {}",
                    b.name(),
                    stats.peak_bytes,
                    graph.cost().peak_bytes
                );
                o
            });
        match (&want, &got) {
            (Ok(w), Ok(g)) => {
                for ((name, wt), (_, gt)) in w.iter().zip(g) {
                    assert_eq!(wt.ty(), gt.ty(), "{} output {name}", b.name());
                    assert!(
                        wt.bytes() == gt.bytes(),
                        "{}: output {name} differs from the reference",
                        b.name()
                    );
                }
            }
            (Err(w), Err(g)) => assert_eq!(w.to_string(), g.to_string()),
            _ => panic!(
                "{}: reference {:?} vs backend {:?}",
                b.name(),
                want.as_ref().err(),
                got.as_ref().err()
            ),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn random_graphs_match_the_reference(seed in any::<u64>()) {
        let graph = random_graph(seed, 25);
        let (inputs, weights) = random_io(&graph, seed ^ 0xabc);
        assert_same_everywhere(&graph, &inputs, &weights, seed);
    }
}

#[test]
fn large_fused_chains_with_broadcasting() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[3, 5000]);
    let y = g.input("y", DType::F32, &[3, 5000]);
    let z = g.input("z", DType::F32, &[5000]);
    let s = g.input("s", DType::F32, &[3, 1]);
    let out = (((&x * &y) + &z).relu() * &s).neg().exp() / 3.0;
    let graph = g.finish(&[("out", &out)]).unwrap();
    let (inputs, weights) = random_io(&graph, 7);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn results_written_around_the_caches_keep_the_bits() {
    // Above `fused::STREAM_MIN_BYTES` (16 MiB), so the last op of each group stores
    // non-temporally; the odd width leaves unaligned heads and tails in every thread's range.
    let g = GraphBuilder::new();
    let [x, y, z] = ["x", "y", "z"].map(|n| g.input(n, DType::F32, &[4100, 1031]));
    let graph = g
        .finish(&[("fma", &(&x * &y + &z)), ("ratio", &((&x - &z) / &y))])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 11);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn batched_matmul_softmax_and_norms() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2, 1, 37, 300]);
    let b = g.input("b", DType::F32, &[3, 300, 41]);
    let gamma = g.input("gamma", DType::F32, &[41]);
    let c = a.matmul(&b);
    let p = c.softmax(-1);
    let l = c.layer_norm(Some(&gamma), None, 1e-5);
    let r = c.rms_norm(Some(&gamma), 1e-6).log_softmax(-1);
    let graph = g
        .finish(&[("c", &c), ("p", &p), ("l", &l), ("r", &r)])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 11);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn errors_match_the_reference() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4]);
    let i = g.input("i", DType::I64, &[2]);
    let y = x.gather(&i, 0);
    let graph = g.finish(&[("y", &y)]).unwrap();
    let inputs = HashMap::from([
        (
            "x".to_string(),
            HostTensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap(),
        ),
        (
            "i".to_string(),
            HostTensor::from_i64(&[2], &[0, 9]).unwrap(),
        ),
    ]);
    assert_same_everywhere(&graph, &inputs, &HashMap::new(), 0);
    let e = CpuDevice::new(1, SimdLevel::Portable)
        .compile(&graph)
        .unwrap()
        .run(&HashMap::new(), &HashMap::new(), 0)
        .unwrap_err();
    assert!(e.to_string().contains("missing input"), "{e}");
}

#[test]
fn graphs_above_the_memory_limit_are_refused_before_running() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 20]);
    let graph = g.finish(&[("y", &x.exp())]).unwrap();
    let needed = graph.cost().peak_bytes;
    assert_eq!(needed, 8 << 20);
    let tight = CpuDevice::new(1, SimdLevel::Portable).with_memory_limit(needed - 1);
    let e = tight.compile(&graph).err().expect("refused");
    assert_eq!(
        e,
        tenet_exec::ExecError::TooLarge {
            needed,
            limit: needed - 1
        }
    );
    // Within the certificate but not its scratch: refused, saying what it needs in all.
    let bound = CpuDevice::new(1, SimdLevel::Portable)
        .compile(&graph)
        .unwrap()
        .memory_bound();
    assert!(bound > needed);
    let e = CpuDevice::new(1, SimdLevel::Portable)
        .with_memory_limit(needed)
        .compile(&graph)
        .err()
        .expect("refused");
    assert_eq!(
        e,
        tenet_exec::ExecError::TooLarge {
            needed: bound,
            limit: needed
        }
    );
    let roomy = CpuDevice::new(1, SimdLevel::Portable).with_memory_limit(bound);
    assert!(roomy.compile(&graph).is_ok());
}

#[test]
fn a_run_stops_between_steps_when_asked() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[64, 64]);
    let y = x.matmul(&x).exp().matmul(&x).tanh();
    let graph = g.finish(&[("y", &y)]).unwrap();
    let prepared = CpuDevice::new(1, SimdLevel::Portable)
        .compile(&graph)
        .unwrap();
    let inputs = HashMap::from([(
        "x".to_string(),
        HostTensor::from_f32(&[64, 64], &vec![0.01; 64 * 64]).unwrap(),
    )]);
    let asked = AtomicUsize::new(0);
    let stop_at_third = || asked.fetch_add(1, Ordering::Relaxed) >= 2;
    let r = prepared.run_stoppable(&inputs, &tenet_ir::NoWeights, 0, &stop_at_third);
    assert_eq!(r.err(), Some(tenet_exec::ExecError::Stopped));
    assert_eq!(
        asked.load(Ordering::Relaxed),
        3,
        "asked once per step until told to stop"
    );
    let (outs, _) = prepared
        .run_stoppable(&inputs, &tenet_ir::NoWeights, 0, &|| false)
        .unwrap();
    assert_eq!(outs.len(), 1);
}

#[test]
fn transposes_folded_into_gemm_keep_the_bits() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 37, 300]);
    let w = g.input("w", DType::F32, &[41, 300]); // [out, in], as PyTorch stores Linear weights
    let wb = g.input("wb", DType::F32, &[2, 41, 300]);
    let shared = g.input("s", DType::F32, &[41, 300]);
    let y1 = x.matmul(&w.transpose(0, 1)); // folded
    let y2 = x.matmul(&wb.transpose(1, 2)); // folded, batched
    let st = shared.transpose(0, 1); // also used by exp: stays a copy
    let y3 = x.matmul(&st);
    let y4 = st.exp();
    let graph = g
        .finish(&[("y1", &y1), ("y2", &y2), ("y3", &y3), ("y4", &y4)])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 21);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn permutations_folded_into_gemm_keep_the_bits() {
    // Attention's head-major views: Q and V as [b, heads, s, d], K as [b, heads, d, s].
    let g = GraphBuilder::new();
    let (b, s, h, d) = (2, 37, 3, 20);
    let q = g.input("q", DType::F32, &[b, s, h, d]);
    let k = g.input("k", DType::F32, &[b, s, h, d]);
    let v = g.input("v", DType::F32, &[b, s, h, d]);
    let scores = q.permute(&[0, 2, 1, 3]).matmul(&k.permute(&[0, 2, 3, 1]));
    let ctx = scores.matmul(&v.permute(&[0, 2, 1, 3]));
    // A left operand read down its columns (column stride ≠ 1), broadcast over a batch axis
    // that the permutation moved.
    let t = g.input("t", DType::F32, &[300, 1, 41]);
    let u = g.input("u", DType::F32, &[4, 300, 33]);
    let y = t.permute(&[1, 2, 0]).matmul(&u);
    let graph = g
        .finish(&[("scores", &scores), ("ctx", &ctx), ("y", &y)])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 23);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn elementwise_prologues_folded_into_norms_keep_the_bits() {
    // Rows long enough that a thread's share spans several prologue blocks.
    let g = GraphBuilder::new();
    let scores = g.input("scores", DType::F32, &[2, 3, 300, 130]);
    let mask = g.input("mask", DType::F32, &[2, 1, 1, 130]);
    let x = g.input("x", DType::F32, &[700, 96]);
    let r = g.input("r", DType::F32, &[700, 96]);
    let gamma = g.input("gamma", DType::F32, &[96]);
    let p = (&scores / 8.0 + &mask).softmax(-1); // scale and mask fold into the softmax
    let sum = &x + &r;
    let l = sum.layer_norm(Some(&gamma), None, 1e-5); // the residual add folds into the norm
    let shared = (&x * &r).exp(); // read twice: computed once, not folded
    let n = shared.rms_norm(Some(&gamma), 1e-6);
    let m = (&shared + 1.0).log_softmax(-1);
    let graph = g
        .finish(&[("p", &p), ("l", &l), ("n", &n), ("m", &m)])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 29);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn sums_and_means_over_every_axis_set_keep_the_bits() {
    // Inner dims of 37 and 40 give both the side-by-side path (16 outputs at a time) and the
    // one-output tail; 1 and 0 give degenerate runs.
    for shape in [[3i64, 50, 37], [2, 17, 40], [4, 1, 33], [2, 0, 5]] {
        let axis_sets: [&[i64]; 7] = [&[0], &[1], &[2], &[0, 1], &[1, 2], &[0, 2], &[0, 1, 2]];
        for axes in axis_sets {
            let g = GraphBuilder::new();
            let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            let x = g.input("x", DType::F32, &dims);
            let s = x.sum(axes, false);
            let m = x.mean(axes, true);
            let graph = g.finish(&[("s", &s), ("m", &m)]).unwrap();
            let (inputs, weights) = random_io(&graph, 5 + axes.len() as u64);
            assert_same_everywhere(&graph, &inputs, &weights, 0);
        }
    }
}

#[test]
fn attention_folded_into_one_step_keeps_the_bits() {
    let g = GraphBuilder::new();
    let (b, s, h, d) = (2, 37, 3, 20);
    let q = g.input("q", DType::F32, &[b, s, h, d]);
    let k = g.input("k", DType::F32, &[b, s, h, d]);
    let v = g.input("v", DType::F32, &[b, s, h, d]);
    let mask = g.input("mask", DType::F32, &[b, 1, 1, s]);
    let heads = |t: &tenet_ir::Tensor| t.permute(&[0, 2, 1, 3]);
    let kt = k.permute(&[0, 2, 3, 1]);
    // Scale and mask before the softmax (MiniLM), as a prologue over each entry's scores.
    let scores = heads(&q).matmul(&kt);
    let ctx = ((&scores / 4.5 + &mask).softmax(-1)).matmul(&heads(&v));
    // No prologue, a log-softmax, V broadcast over the heads (grouped-query attention), and
    // one query row per entry (a decoding step).
    let kv = g.input("kv", DType::F32, &[b, 1, s, d]);
    let one = g.input("one", DType::F32, &[b, h, 1, d]);
    let dec = one
        .matmul(&kv.permute(&[0, 1, 3, 2]))
        .log_softmax(-1)
        .matmul(&kv);
    // Scores that are also an output: not folded, and still the same bits.
    let seen = heads(&q).matmul(&kt);
    let ctx2 = seen.softmax(-1).matmul(&heads(&v));
    let graph = g
        .finish(&[
            ("ctx", &ctx),
            ("dec", &dec),
            ("seen", &seen),
            ("ctx2", &ctx2),
        ])
        .unwrap();
    let profile = CpuDevice::new(2, SimdLevel::detect())
        .compile(&graph)
        .unwrap()
        .run_with_stats(&random_io(&graph, 31).0, &Weights::new(), 0)
        .unwrap()
        .1;
    assert!(
        profile.time_by_kind.iter().any(|t| t.kind == "attention"),
        "the attention steps were folded: {:?}",
        profile.time_by_kind
    );
    for seed in [31, 37] {
        let (mut inputs, weights) = random_io(&graph, seed);
        if seed == 37 {
            // A fully masked row (all -inf: NaN out), and NaN and inf among the queries.
            let mut m = inputs["mask"].to_f32_vec();
            m[..s as usize].fill(f32::NEG_INFINITY);
            inputs.insert(
                "mask".into(),
                HostTensor::from_f32(&[b, 1, 1, s], &m).unwrap(),
            );
            let mut x = inputs["q"].to_f32_vec();
            x[5] = f32::NAN;
            x[77] = f32::INFINITY;
            inputs.insert("q".into(), HostTensor::from_f32(&[b, s, h, d], &x).unwrap());
        }
        assert_same_everywhere(&graph, &inputs, &weights, 0);
    }
}

/// The graph's elementwise groups all ran as GEMM or convolution epilogues (no step of their own).
fn assert_every_group_folded(
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &Weights,
) {
    let profile = CpuDevice::new(2, SimdLevel::detect())
        .compile(graph)
        .unwrap()
        .run_with_stats(inputs, weights, 0)
        .unwrap()
        .1;
    assert!(
        profile.time_by_kind.iter().all(|t| t.kind != "fused"),
        "every elementwise group ran inside its GEMM or convolution: {:?}",
        profile.time_by_kind
    );
}

#[test]
fn epilogues_rewriting_the_product_in_place_keep_the_bits() {
    // Epilogues whose last op reads the product once are computed where it lies: the other
    // operand on either side, a single value, a row broadcast walked in runs (wide rows) or
    // copied (narrow ones), a column broadcast, and a product read twice (copied aside).
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[70, 48]);
    let w = g.input("w", DType::F32, &[48, 130]);
    let narrow = g.input("narrow", DType::F32, &[48, 9]);
    let bias = g.input("bias", DType::F32, &[130]);
    let nbias = g.input("nbias", DType::F32, &[9]);
    let col = g.input("col", DType::F32, &[70, 1]);
    let full = g.input("full", DType::F32, &[70, 130]);
    let p = || x.matmul(&w);
    let outs = [
        ("right", p() - &bias),
        ("left", &bias / p()),
        ("scalar_left", 3.0 - p()),
        ("scalar_right", p() / 0.0),
        ("column", &col - p()),
        ("full_left", &full / p()),
        ("narrow_rows", &nbias - x.matmul(&narrow)),
        ("twice", {
            let q = p();
            &q * &q
        }),
        ("chain", (p() * 0.5 - &bias) / &col),
    ];
    let named: Vec<(&str, &tenet_ir::Tensor)> = outs.iter().map(|(n, t)| (*n, t)).collect();
    let graph = g.finish(&named).unwrap();
    let (mut inputs, weights) = random_io(&graph, 43);
    // Zeros and infinities in the divisors' paths.
    let mut c = inputs["col"].to_f32_vec();
    c[3] = 0.0;
    c[4] = f32::INFINITY;
    c[5] = f32::NAN;
    inputs.insert("col".into(), HostTensor::from_f32(&[70, 1], &c).unwrap());
    assert_every_group_folded(&graph, &inputs, &weights);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

#[test]
fn epilogues_folded_into_gemm_keep_the_bits() {
    let g = GraphBuilder::new();
    // A linear layer with bias and GELU (MiniLM's FFN), a batched product with a bias, a
    // few-row product, a product over k = 0, and one wide enough over k for several column
    // chunks of packed B.
    let x = g.input("x", DType::F32, &[70, 48]);
    let w = g.input("w", DType::F32, &[48, 130]);
    let bias = g.input("bias", DType::F32, &[130]);
    let resid = g.input("resid", DType::F32, &[70, 130]);
    let ffn = (x.matmul(&w) + &bias).gelu() + &resid;
    let bx = g.input("bx", DType::F32, &[3, 20, 16]);
    let bw = g.input("bw", DType::F32, &[16, 24]);
    let bb = g.input("bb", DType::F32, &[3, 1, 24]);
    let batched = (bx.matmul(&bw) * &bb).tanh();
    let row = g.input("row", DType::F32, &[2, 48]);
    let few = row.matmul(&w) - &bias;
    let e = g.input("e", DType::F32, &[9, 0]);
    let f = g.input("f", DType::F32, &[0, 7]);
    let empty_k = e.matmul(&f) + 1.0;
    let tall = g.input("tall", DType::F32, &[6, 4096]);
    let wide = g.input("wide", DType::F32, &[4096, 520]);
    let chunks = tall.matmul(&wide).relu();
    let graph = g
        .finish(&[
            ("ffn", &ffn),
            ("batched", &batched),
            ("few", &few),
            ("empty_k", &empty_k),
            ("chunks", &chunks),
        ])
        .unwrap();
    let (inputs, weights) = random_io(&graph, 41);
    assert_every_group_folded(&graph, &inputs, &weights);
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

/// f32 convolutions run on the GEMM (conv.rs) with the reference's bits: padding whose taps
/// the reference skips (classes of border positions, a position with no tap in bounds),
/// strides, dilations, groups, depthwise and pointwise, with and without bias, on inputs and
/// weights holding −0, infinities and NaN, where a zero from the padding would differ.
#[test]
fn convolutions_on_the_gemm_keep_the_bits() {
    // (n, c, h, w), (o, kh, kw), stride, padding [t, l, b, r], dilation, groups, bias
    type Case = ([u64; 4], [u64; 3], [u32; 2], [u32; 4], [u32; 2], u32, bool);
    let cases: [Case; 21] = [
        (
            [1, 4, 4, 3],
            [4, 3, 5],
            [1, 1],
            [1, 2, 1, 2],
            [1, 1],
            4,
            true,
        ), // depthwise, no common run
        (
            [1, 6, 11, 13],
            [6, 3, 5],
            [2, 3],
            [1, 2, 0, 1],
            [2, 1],
            6,
            true,
        ), // depthwise, strided
        (
            [1, 64, 100, 100],
            [32, 1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            true,
        ), // chunked
        (
            [1, 3, 9, 11],
            [8, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        (
            [2, 4, 10, 7],
            [6, 3, 2],
            [2, 1],
            [2, 0, 1, 1],
            [1, 2],
            2,
            false,
        ),
        (
            [1, 8, 12, 12],
            [8, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            8,
            true,
        ), // depthwise
        (
            [1, 16, 5, 6],
            [24, 1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            true,
        ), // pointwise
        (
            [1, 16, 5, 6],
            [24, 1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            2,
            false,
        ), // pointwise, groups
        (
            [1, 2, 4, 4],
            [3, 5, 5],
            [1, 1],
            [2, 2, 2, 2],
            [1, 1],
            1,
            true,
        ),
        (
            [1, 1, 3, 3],
            [2, 1, 1],
            [2, 2],
            [2, 2, 2, 2],
            [1, 1],
            1,
            true,
        ), // taps wholly in pads
        (
            [1, 5, 40, 33],
            [7, 3, 3],
            [2, 2],
            [1, 0, 1, 2],
            [1, 1],
            1,
            true,
        ),
        (
            [1, 300, 9, 9],
            [5, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            false,
        ), // long chains
        (
            [1, 6, 12, 70],
            [24, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ), // rows wider than a packed panel, panels across rows
        (
            [1, 4, 9, 75],
            [4, 3, 3],
            [2, 2],
            [1, 1, 1, 1],
            [1, 1],
            4,
            true,
        ), // depthwise, stride 2: blocks of columns in registers
        (
            [1, 3, 7, 80],
            [3, 5, 5],
            [1, 3],
            [2, 2, 2, 2],
            [1, 2],
            3,
            false,
        ), // depthwise, stride 3 and dilation 2
        (
            [1, 3, 10, 40],
            [3, 5, 5],
            [1, 1],
            [4, 4, 4, 4],
            [2, 2],
            3,
            true,
        ), // depthwise, rows as wide as the input: one run per tap, row ends kept
        (
            [2, 4, 3, 33],
            [4, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            4,
            false,
        ), // the same, 3×3 on a plane of three rows
        (
            [1, 2, 5, 90],
            [2, 3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            2,
            true,
        ), // depthwise, blocks of 64 and 16 columns in registers, edges tap by tap
        (
            [1, 3, 20, 70],
            [8, 3, 3],
            [2, 2],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ), // a stem: stride 2, the interior read in place from the input split by phase
        (
            [1, 2, 12, 110],
            [5, 3, 3],
            [1, 3],
            [2, 2, 2, 2],
            [2, 2],
            1,
            false,
        ), // column stride 3 and dilation 2 from three phases
        (
            [1, 24, 10, 30],
            [4, 1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            true,
        ), // pointwise to a few channels: the few-rows path, the bias after
    ];
    for ((i, (xs, [o, kh, kw], stride, padding, dilation, groups, bias)), activated) in cases
        .into_iter()
        .enumerate()
        .flat_map(|case| [(case, 0), (case, 1), (case, 2)])
    {
        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, &xs);
        let w = g.input("w", DType::F32, &[o, xs[1] / groups as u64, kh, kw]);
        let b = bias.then(|| g.input("b", DType::F32, &[o]));
        let y = x.conv2d(&w, b.as_ref(), stride, padding, dilation, groups);
        // With an activation that alone reads the output, computed as each part of the output
        // is final (`Step::Conv`): HardSwish (the output read twice), or a per-channel scale.
        let (zero, six) = (g.scalar(DType::F32, 0.0), g.scalar(DType::F32, 6.0));
        let y = match activated {
            1 => &y * &(&y + 3.0).maximum(&zero).minimum(&six) / 6.0,
            2 => &y * &g.input("s", DType::F32, &[1, o, 1, 1]),
            _ => y,
        };
        let graph = g.finish(&[("y", &y)]).unwrap();
        let (mut inputs, weights) = random_io(&graph, 31 + i as u64);
        // Special values: −0 inputs and weights, an infinite weight, a NaN input.
        for (name, specials) in [
            ("x", &[-0.0f32, f32::NAN][..]),
            ("w", &[-0.0f32, f32::INFINITY, -0.0][..]),
        ] {
            let t = &inputs[name];
            let mut v = t.to_f32_vec();
            for (j, s) in specials.iter().enumerate() {
                let at = (j * 7919 + i * 13) % v.len();
                v[at] = *s;
            }
            inputs.insert(name.into(), HostTensor::from_f32(t.shape(), &v).unwrap());
        }
        if activated > 0 {
            assert_every_group_folded(&graph, &inputs, &weights);
        }
        assert_same_everywhere(&graph, &inputs, &weights, 0);
    }
}

/// Fused chains with the vectorised max, min, relu and sigmoid (HardSwish, clipping, gates) keep
/// the reference's bits on special values: NaN, ±0, ±inf, denormals.
#[test]
fn fused_max_min_relu_sigmoid_keep_the_bits() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[3, 1000]);
    let y = g.input("y", DType::F32, &[3, 1000]);
    let six = g.scalar(DType::F32, 6.0);
    let zero = g.scalar(DType::F32, 0.0);
    let hs = &x * &(&x + 3.0).maximum(&zero).minimum(&six);
    let mixed = hs.maximum(&y).minimum(&(&y * 2.0)).relu() + x.sigmoid() + y.minimum(&x).sigmoid();
    let pairs = (&x + 0.0).maximum(&y) * 2.0;
    let pairs_min = (&x + 0.0).minimum(&y) * 2.0;
    let graph = g
        .finish(&[("out", &mixed), ("max", &pairs), ("min", &pairs_min)])
        .unwrap();
    let (mut inputs, weights) = random_io(&graph, 77);
    let specials = [
        f32::NAN,
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        -1e-40,
        89.0,
        -104.0,
    ];
    for name in ["x", "y"] {
        let t = &inputs[name];
        let mut v = t.to_f32_vec();
        let n = v.len();
        for (i, s) in specials.iter().enumerate() {
            v[i * 37 % n] = *s;
        }
        // Every pair of special values side by side in x and y.
        for (i, a) in specials.iter().enumerate() {
            for (j, b) in specials.iter().enumerate() {
                v[500 + i * specials.len() + j] = if name == "x" { *a } else { *b };
            }
        }
        inputs.insert(name.into(), HostTensor::from_f32(t.shape(), &v).unwrap());
    }
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}

/// f32 pooling on its own loops (pool.rs) keeps the reference's bits: every kind, padding
/// (including windows with few or no taps in bounds), strides and dilation, on NaN, ±0, ±inf.
#[test]
fn pooling_keeps_the_bits() {
    use tenet_ir::{PoolKind, Window2d};
    let cases: [([u32; 2], Window2d); 4] = [
        (
            [2, 2],
            Window2d {
                stride: [2, 2],
                padding: [0, 0, 0, 0],
                dilation: [1, 1],
            },
        ),
        (
            [3, 3],
            Window2d {
                stride: [1, 1],
                padding: [1, 1, 1, 1],
                dilation: [1, 1],
            },
        ),
        (
            [3, 2],
            Window2d {
                stride: [2, 1],
                padding: [1, 0, 1, 1],
                dilation: [2, 1],
            },
        ),
        (
            [5, 5],
            Window2d {
                stride: [3, 2],
                padding: [2, 2, 2, 2],
                dilation: [1, 1],
            },
        ),
    ];
    for (i, (kernel, window)) in cases.into_iter().enumerate() {
        for kind in PoolKind::ALL {
            let g = GraphBuilder::new();
            let x = g.input("x", DType::F32, &[2, 3, 11, 9]);
            let y = x.pool2d(*kind, kernel, window);
            let graph = g.finish(&[("y", &y)]).unwrap();
            let (mut inputs, weights) = random_io(&graph, 90 + i as u64);
            let t = &inputs["x"];
            let mut v = t.to_f32_vec();
            let n = v.len();
            for (j, s) in [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40]
                .iter()
                .enumerate()
            {
                v[(j * 53 + i) % n] = *s;
                v[(j * 17 + 9) % n] = *s;
            }
            // A plane of ±0 only: max must pick +0, the average +0.
            for k in 0..99 {
                v[99 + k] = if k % 2 == 0 { -0.0 } else { 0.0 };
            }
            inputs.insert("x".into(), HostTensor::from_f32(t.shape(), &v).unwrap());
            assert_same_everywhere(&graph, &inputs, &weights, 0);
        }
    }
}

/// Copies whose innermost axis is short and strided (an interleave of phases, a ×2 nearest
/// upsampling by expand) walk blocks of the last two axes: the same bytes, for 4- and 2-byte
/// elements, small and large enough to split across threads.
#[test]
fn interleaves_and_upsamplings_keep_the_bits() {
    for (dtype, [c, h, w]) in [
        (DType::F32, [3u64, 5, 7]),
        (DType::F16, [3, 5, 7]),
        (DType::F32, [24, 60, 80]),
        (DType::BF16, [24, 60, 80]),
        (DType::I64, [2, 3, 4]),
    ] {
        let g = GraphBuilder::new();
        let x = g.input("x", dtype, &[1, 2, 2, c, h, w]);
        let interleaved = x.permute(&[0, 3, 4, 1, 5, 2]);
        let y = g.input("y", dtype, &[1, c, h, w]);
        let up = y
            .reshape(&[1, c as i64, h as i64, 1, w as i64, 1])
            .expand(&[1, c, h, 2, w, 2])
            .reshape(&[1, c as i64, 2 * h as i64, 2 * w as i64]);
        let strided = x.permute(&[0, 3, 5, 4, 2, 1]);
        let graph = g
            .finish(&[("i", &interleaved), ("u", &up), ("s", &strided)])
            .unwrap();
        let (inputs, weights) = random_io(&graph, 5);
        assert_same_everywhere(&graph, &inputs, &weights, 0);
    }
}

/// Comparisons of f32 tensors and the logical ops on their own loops (select.rs) keep the
/// reference's bits: every comparison on every pair of special values, operands of the
/// result's shape or single values, and a broadcast the loops leave to the reference.
#[test]
fn comparisons_and_logic_keep_the_bits() {
    let specials = [
        f32::NAN,
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        -1e-40,
        1.0,
        -2.5,
    ];
    let n = specials.len();
    // Every pair side by side, then a long tail that crosses the threads' pieces.
    let mut xs: Vec<f32> = Vec::new();
    let mut ys: Vec<f32> = Vec::new();
    for a in specials {
        for b in specials {
            xs.push(a);
            ys.push(b);
        }
    }
    let len = 70_000;
    for i in xs.len()..len {
        xs.push(specials[i % n] * (i % 7) as f32);
        ys.push(specials[(i / 3) % n]);
    }
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[len as u64]);
    let y = g.input("y", DType::F32, &[len as u64]);
    let row = g.input("row", DType::F32, &[1, len as u64]);
    let col = g.input("col", DType::F32, &[3, 1]);
    let zero = g.scalar(DType::F32, 0.0);
    let mut outs = vec![
        ("eq", x.eq(&y)),
        ("ne", x.ne(&y)),
        ("lt", x.lt(&y)),
        ("le", x.le(&y)),
        ("gt", x.gt(&zero)),
        ("ge", zero.ge(&x)),
    ];
    let (a, b) = (x.gt(&y), x.eq(&zero));
    outs.push(("and", a.and(&b)));
    outs.push(("or", a.or(&b)));
    outs.push(("not", a.not()));
    outs.push(("and_scalar", a.and(&zero.eq(&zero))));
    outs.push(("broadcast", row.lt(&col)));
    let named: Vec<(&str, &tenet_ir::Tensor)> = outs.iter().map(|(n, t)| (*n, t)).collect();
    let graph = g.finish(&named).unwrap();
    let (mut inputs, weights) = random_io(&graph, 5);
    inputs.insert(
        "x".into(),
        HostTensor::from_f32(&[len as u64], &xs).unwrap(),
    );
    inputs.insert(
        "y".into(),
        HostTensor::from_f32(&[len as u64], &ys).unwrap(),
    );
    inputs.insert(
        "row".into(),
        HostTensor::from_f32(&[1, len as u64], &ys).unwrap(),
    );
    assert_same_everywhere(&graph, &inputs, &weights, 0);
}
