//! The conformance suite, written once and run against every device this build can open: the
//! CPU at every SIMD level the machine has and at 1, 2 and 3 threads, and every OpenCL device
//! (PoCL here). Each must give the reference interpreter's bits for random graphs over the
//! whole op set (NaN, ±inf, -0.0, denormals and empty tensors among the values), the same
//! errors, and device-resident runs (buffers in, buffers out) equal to host runs.
//!
//! OpenCL devices are found through `tenet_devices::list`; when none is present the suite
//! says so and runs on the CPU alone, unless `TENET_REQUIRE_OPENCL=1` (set by `.ci/run`, which
//! installs PoCL), in which case a missing OpenCL device fails the suite.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tenet_devices::{Options, SimdLevel, Spec};
use tenet_exec::{Device, ExecError};
use tenet_ir::testing::{
    RandomWeights as Weights, every_op_name, op_names, random_graph, random_io,
};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, TensorType};

/// A device under test and how many random graphs it gets (PoCL is slow; it checks bits).
struct UnderTest {
    device: Arc<dyn Device>,
    label: String,
    cases: u64,
}

/// Every device, opened once for the whole suite (an OpenCL device runs its determinism check
/// when it opens).
fn devices() -> &'static [UnderTest] {
    static DEVICES: std::sync::OnceLock<Vec<UnderTest>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(open_all)
}

fn open_all() -> Vec<UnderTest> {
    let mut out = Vec::new();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        for threads in [1, 2, 3] {
            let device = tenet_devices::cpu(&Options {
                threads: Some(threads),
                simd: Some(level),
                ..Default::default()
            });
            out.push(UnderTest {
                label: device.name(),
                device: Arc::new(device),
                cases: 150,
            });
        }
    }
    let mut opencl = 0;
    for (spec, opened) in tenet_devices::list(&Options::default()) {
        if spec == Spec::Cpu {
            continue;
        }
        let device = tenet_devices::open_spec(spec, &Options::default())
            .unwrap_or_else(|e| panic!("{spec} was listed but does not open: {e}"));
        let info = opened.expect("listed devices open");
        assert!(
            info.exact.passed(),
            "{spec} ({}) failed its determinism check: {:?}",
            info.name,
            info.exact
        );
        opencl += 1;
        out.push(UnderTest {
            label: format!("{spec} ({})", info.name),
            device,
            cases: 150,
        });
    }
    if opencl == 0 {
        let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TENET_REQUIRE_OPENCL=1 but no OpenCL device was found (install pocl-opencl-icd)"
        );
        eprintln!("conformance: no OpenCL device here; the CPU levels alone are checked");
    }
    out
}

/// Run `graph` on `device` from host tensors and compare with the reference: the same bits,
/// or the same error.
fn check(
    t: &UnderTest,
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &Weights,
    seed: u64,
    what: &str,
) {
    let want = tenet_reference::run(graph, inputs, weights, seed);
    let got = t
        .device
        .compile(graph)
        .and_then(|p| p.run(inputs, weights, seed));
    match (&want, &got) {
        (Ok(w), Ok(g)) => {
            assert_eq!(w.len(), g.len(), "{}: {what}: output count", t.label);
            for ((name, wt), (gname, gt)) in w.iter().zip(g) {
                assert_eq!(name, gname, "{}: {what}: output order", t.label);
                assert_eq!(
                    wt.ty(),
                    gt.ty(),
                    "{}: {what}: output {name}'s type",
                    t.label
                );
                if wt.bytes() != gt.bytes() {
                    let at = wt
                        .bytes()
                        .iter()
                        .zip(gt.bytes())
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    panic!(
                        "{}: {what}: output {name} ({}) differs from the reference from byte {at}\n{}",
                        t.label,
                        wt.ty(),
                        tenet_ir::text::print(graph)
                    );
                }
            }
        }
        (Err(w), Err(ExecError::Run(g))) => {
            assert_eq!(w.to_string(), g.to_string(), "{}: {what}", t.label)
        }
        _ => panic!(
            "{}: {what}: the reference gave {:?}, the device {:?}\n{}",
            t.label,
            want.as_ref().err(),
            got.as_ref().err(),
            tenet_ir::text::print(graph)
        ),
    }
}

#[test]
fn random_graphs_over_the_op_set_match_the_reference_on_every_device() {
    for t in devices() {
        let mut seen = BTreeSet::new();
        for case in 0..t.cases {
            let seed = 0x5eed_0000 + case;
            let graph = random_graph(seed, 25);
            seen.extend(op_names(&graph));
            let (inputs, weights) = random_io(&graph, seed ^ 0xabc);
            check(
                t,
                &graph,
                &inputs,
                &weights,
                seed,
                &format!("graph seed {seed}"),
            );
        }
        // The random graphs reach the whole op set (what they miss by chance at this count is
        // run by `the_rarest_ops_run_too`).
        let missing: Vec<&str> = every_op_name()
            .into_iter()
            .filter(|n| !seen.contains(n) && !RARE.contains(n))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: no random graph used {missing:?}",
            t.label
        );
    }
}

/// Ops the random graphs may miss at this case count; a directed test runs them.
const RARE: [&str; 2] = ["or", "avg_pool2d_include_pad"];

#[test]
fn the_rarest_ops_run_too() {
    let text = "tenet graph v1
%0 = input(\"b\") : bool[3,5]
%1 = input(\"c\") : bool[3,5]
%2 = or(%0, %1) : bool[3,5]
%3 = input(\"x\") : f32[1,2,5,5]
%4 = avg_pool2d_include_pad(%3, kernel=[3,3], stride=[2,2], padding=[1,1,1,1], dilation=[1,1]) : f32[1,2,3,3]
output \"or\" = %2
output \"pool\" = %4
";
    let graph = tenet_ir::text::parse(text).unwrap();
    let got: BTreeSet<&str> = op_names(&graph);
    assert!(RARE.iter().all(|r| got.contains(r)), "{got:?}");
    for seed in 0..4 {
        let (inputs, weights) = random_io(&graph, seed);
        for t in devices() {
            check(t, &graph, &inputs, &weights, 0, "the rarest ops");
        }
    }
}

/// Values chosen to break kernels that are merely close: every special f32 class.
fn special_values(n: usize) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(1),           // smallest denormal
        f32::from_bits(0x807f_ffff), // largest negative denormal
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        0.5,
        88.72284,
        -103.97208,
        1e-30,
        3.4e38,
    ];
    (0..n)
        .map(|i| specials[i % specials.len()] * if i % 7 == 3 { -1.0 } else { 1.0 })
        .collect()
}

#[test]
fn special_values_through_every_elementwise_op() {
    use tenet_ir::{BinaryOp, UnaryOp};
    let n = 18 * 7;
    // Written in the text form, one node per op: every f32 unary and arithmetic binary op.
    let mut text =
        format!("tenet graph v1\n%0 = input(\"x\") : f32[{n}]\n%1 = input(\"y\") : f32[{n}]\n");
    let mut outputs = String::new();
    let mut k = 2;
    for op in UnaryOp::ALL.iter().filter(|o| **o != UnaryOp::Not) {
        text.push_str(&format!("%{k} = {}(%0) : f32[{n}]\n", op.name()));
        outputs.push_str(&format!("output \"{}\" = %{k}\n", op.name()));
        k += 1;
    }
    for op in BinaryOp::ALL
        .iter()
        .filter(|o| !o.is_logical() && !o.is_comparison())
    {
        text.push_str(&format!("%{k} = {}(%0, %1) : f32[{n}]\n", op.name()));
        outputs.push_str(&format!("output \"{}\" = %{k}\n", op.name()));
        k += 1;
    }
    text.push_str(&outputs);
    let graph = tenet_ir::text::parse(&text).unwrap();
    let xs = special_values(n);
    let mut ys = special_values(n);
    ys.rotate_left(5);
    let inputs = HashMap::from([
        (
            "x".to_string(),
            HostTensor::from_f32(&[n as u64], &xs).unwrap(),
        ),
        (
            "y".to_string(),
            HostTensor::from_f32(&[n as u64], &ys).unwrap(),
        ),
    ]);
    for t in devices() {
        check(t, &graph, &inputs, &Weights::new(), 0, "special values");
    }
}

#[test]
fn empty_tensors_run_everywhere() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[0, 5]);
    let w = g.input("w", DType::F32, &[5, 3]);
    let y = x.matmul(&w).relu();
    let s = x.sum(&[0], false);
    let graph = g.finish(&[("y", &y), ("s", &s)]).unwrap();
    let inputs = HashMap::from([
        (
            "x".to_string(),
            HostTensor::zeros(TensorType::new(DType::F32, [0, 5])).unwrap(),
        ),
        (
            "w".to_string(),
            HostTensor::from_f32(&[5, 3], &[0.5; 15]).unwrap(),
        ),
    ]);
    for t in devices() {
        check(t, &graph, &inputs, &Weights::new(), 0, "empty tensors");
    }
}

#[test]
fn out_of_range_gather_is_a_job_error_on_every_device() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4, 3]);
    let i = g.input("i", DType::I64, &[3]);
    let graph = g.finish(&[("y", &x.gather(&i, 0))]).unwrap();
    for bad in [9i64, -5, i64::MAX, i64::MIN] {
        let inputs = HashMap::from([
            (
                "x".to_string(),
                HostTensor::from_f32(&[4, 3], &[1.0; 12]).unwrap(),
            ),
            (
                "i".to_string(),
                HostTensor::from_i64(&[3], &[0, bad, 1]).unwrap(),
            ),
        ]);
        for t in devices() {
            let e = t
                .device
                .compile(&graph)
                .unwrap()
                .run(&inputs, &Weights::new(), 0)
                .expect_err("an out-of-range index");
            assert!(matches!(e, ExecError::Run(_)), "{}: {e}", t.label);
            check(
                t,
                &graph,
                &inputs,
                &Weights::new(),
                0,
                "gather out of range",
            );
        }
    }
}

#[test]
fn a_graph_over_the_device_memory_is_refused_before_anything_is_allocated() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 16]);
    let graph = g.finish(&[("y", &x.exp())]).unwrap();
    let needed = graph.cost().peak_bytes;
    for (spec, _) in tenet_devices::list(&Options::default()) {
        let tight = tenet_devices::open_spec(
            spec,
            &Options {
                memory_limit: Some(needed - 1),
                ..Default::default()
            },
        )
        .unwrap();
        match tight.compile(&graph) {
            Err(ExecError::TooLarge { needed: n, limit }) => {
                assert!(n >= needed, "{spec}: needed {n}");
                assert_eq!(limit, needed - 1, "{spec}");
            }
            other => panic!("{spec}: expected TooLarge, got {:?}", other.err()),
        }
    }
}

/// Device-resident runs: inputs uploaded once, outputs kept on the device and fed to a second
/// run, downloaded only at the end, equal to the host runs; a weight uploaded once.
#[test]
fn buffers_stay_on_the_device_between_runs() {
    let file = tenet_ir::WeightsId([7; 32]);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[8, 16]);
    let w = g.weight(file, "w", DType::F32, &[16, 16]);
    let y = x.matmul(&w).tanh();
    let graph = g.finish(&[("y", &y)]).unwrap();
    let (inputs, _) = random_io(&graph, 3);
    let weights: Weights = HashMap::from([(
        (file, "w".to_string()),
        HostTensor::from_f32(
            &[16, 16],
            &(0..256)
                .map(|i| (i as f32 - 128.0) / 256.0)
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    )]);
    let once = tenet_reference::run(&graph, &inputs, &weights, 0).unwrap();
    let twice = {
        let again = HashMap::from([("x".to_string(), {
            let y = once[0].1.clone();
            HostTensor::new(TensorType::new(DType::F32, [8, 16]), y.bytes().to_vec()).unwrap()
        })]);
        tenet_reference::run(&graph, &again, &weights, 0).unwrap()
    };
    for t in devices() {
        let program = t.device.compile(&graph).unwrap();
        let x = t.device.upload(&inputs["x"]).unwrap();
        let (first, _) = program
            .run_buffers(&HashMap::from([("x".to_string(), x)]), &weights, 0, &|| {
                false
            })
            .unwrap();
        let y = first[0]
            .1
            .retyped(TensorType::new(DType::F32, [8, 16]))
            .unwrap();
        let (second, _) = program
            .run_buffers(&HashMap::from([("x".to_string(), y)]), &weights, 0, &|| {
                false
            })
            .unwrap();
        let got1 = t.device.download(&first[0].1).unwrap();
        let got2 = t.device.download(&second[0].1).unwrap();
        assert_eq!(got1.bytes(), once[0].1.bytes(), "{}: first run", t.label);
        assert_eq!(got2.bytes(), twice[0].1.bytes(), "{}: second run", t.label);
        // Writing into a buffer in place (how a KV cache grows by a token).
        let mut cache = t
            .device
            .zeros(&TensorType::new(DType::F32, [4, 16]))
            .unwrap();
        let row = t
            .device
            .upload(&HostTensor::from_f32(&[16], &[1.5; 16]).unwrap())
            .unwrap();
        t.device.write(&mut cache, 2 * 64, &row).unwrap();
        let host = t.device.download(&cache).unwrap().to_f32_vec();
        assert!(host[..32].iter().all(|v| *v == 0.0), "{}", t.label);
        assert!(host[32..48].iter().all(|v| *v == 1.5), "{}", t.label);
        assert!(host[48..].iter().all(|v| *v == 0.0), "{}", t.label);
        assert!(
            t.device.write(&mut cache, 4 * 64 - 4, &row).is_err(),
            "{}: a write past the end is refused",
            t.label
        );
    }
}
