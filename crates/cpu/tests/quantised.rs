//! `qmatmul` and `dequantize` on the CPU backend against the reference interpreter: the same
//! bits at every SIMD level and thread count, for decode-sized and prefill-sized products (the
//! quantised kernel and the GEMM path), batched activations, weights as graph weights, and
//! the ops inside larger graphs.

use std::collections::HashMap;

use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_exec::Device;
use tenet_ir::testing::Rng;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, QuantFormat, TensorType, WeightsId};

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
    weights: &HashMap<(WeightsId, String), HostTensor>,
) {
    let want = tenet_reference::run(graph, inputs, weights, 0).unwrap();
    for b in backends() {
        let got = b
            .compile(graph)
            .unwrap()
            .run_with_stats(inputs, weights, 0)
            .unwrap();
        assert!(got.1.peak_bytes <= graph.cost().peak_bytes, "{}", b.name());
        for ((name, w), (_, g)) in want.iter().zip(&got.0) {
            assert_eq!(w.ty(), g.ty(), "{} output {name}", b.name());
            if w.bytes() != g.bytes() {
                let (wv, gv) = (w.to_f32_vec(), g.to_f32_vec());
                let i = wv
                    .iter()
                    .zip(&gv)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
                    .unwrap();
                panic!(
                    "{}: output {name} element {i} is {:#010x}, the reference's {:#010x}",
                    b.name(),
                    gv[i].to_bits(),
                    wv[i].to_bits()
                );
            }
        }
    }
}

/// Random blocks: ordinary f16 scales (2⁻⁸ … 2), and with `hostile` a share of infinities,
/// NaNs with payloads, denormals and zeros.
fn blocks(rng: &mut Rng, format: QuantFormat, count: usize, hostile: bool) -> Vec<u8> {
    let bb = format.block_bytes() as usize;
    let heads = if format == QuantFormat::Q4_1 { 2 } else { 1 };
    let mut out = Vec::with_capacity(count * bb);
    for _ in 0..count {
        for _ in 0..heads {
            let s = if hostile && rng.chance(10) {
                *rng.pick(&[
                    0x7c00u16, 0xfc00, 0x7e01, 0xfd00, 0x0001, 0x8200, 0x0000, 0x7bff,
                ])
            } else {
                (rng.next_u64() as u16 & 0x83ff) | (7 + rng.below(10) as u16) << 10
            };
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend((heads * 2..bb).map(|_| rng.next_u64() as u8));
    }
    out
}

fn activations(rng: &mut Rng, shape: &[u64], hostile: bool) -> HostTensor {
    let n: u64 = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            if hostile && rng.chance(2) {
                f32::from_bits(*rng.pick(&[
                    0x7fc0_0000u32,
                    0xff80_0001,
                    0x7f80_0000,
                    1,
                    0x8000_0000,
                ]))
            } else {
                ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            }
        })
        .collect();
    HostTensor::from_f32(shape, &v).unwrap()
}

fn quantised(rng: &mut Rng, format: QuantFormat, n: u64, k: u64, hostile: bool) -> HostTensor {
    let bb = format.block_bytes();
    let ty = TensorType::new(DType::U8, [n, k / 32, bb]);
    HostTensor::new(ty, blocks(rng, format, (n * k / 32) as usize, hostile)).unwrap()
}

/// `a [.., k] · transpose(dequantize(w [n, k]))` with `a` and `w` inputs, plus `w`'s
/// dequantisation as a second output.
fn check(format: QuantFormat, a_shape: &[u64], n: u64, seed: u64, hostile: bool) {
    let k = *a_shape.last().unwrap();
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, a_shape);
    let w = g.input("w", DType::U8, &[n, k / 32, format.block_bytes()]);
    let graph = g
        .finish(&[("y", &a.qmatmul(&w, format)), ("d", &w.dequantize(format))])
        .unwrap();
    let mut rng = Rng(seed);
    let inputs = HashMap::from([
        ("a".to_string(), activations(&mut rng, a_shape, hostile)),
        ("w".to_string(), quantised(&mut rng, format, n, k, hostile)),
    ]);
    assert_same_everywhere(&graph, &inputs, &HashMap::new());
}

#[test]
fn products_and_dequantisation_match_the_reference() {
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        for (a_shape, n) in [
            // Decoding: one row, a few rows, widths not a multiple of 16.
            (&[1u64, 576][..], 200),
            (&[1, 576], 700),
            (&[1, 64], 1),
            (&[3, 96], 77),
            (&[2, 3, 64], 45),
            (&[17, 128], 70),
            // A prefill: the GEMM path (a bounded chunk of dequantised rows at a time).
            (&[70, 160], 100),
            (&[2, 40, 64], 33),
        ] {
            for hostile in [false, true] {
                check(
                    format,
                    a_shape,
                    n,
                    a_shape.iter().sum::<u64>() * 7 + n,
                    hostile,
                );
            }
        }
    }
}

/// A decode step's shape of use: the weight is a graph weight, the product feeds a residual
/// add and a norm, and a batched `a [2, 3, k]` flattens into six rows.
#[test]
fn quantised_layers_inside_a_graph() {
    let format = QuantFormat::Q4_1;
    let file = WeightsId([7; 32]);
    let (k, n) = (256u64, 256u64);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 3, k]);
    let w1 = g.weight(file, "w1", DType::U8, &[n, k / 32, format.block_bytes()]);
    let w2 = g.weight(file, "w2", DType::U8, &[n, n / 32, 34]);
    let h = (&x.qmatmul(&w1, format) + &x).rms_norm(None, 1e-6);
    let y = h.qmatmul(&w2, QuantFormat::Q8_0).softmax(-1);
    let graph = g.finish(&[("y", &y), ("h", &h)]).unwrap();
    let mut rng = Rng(5);
    let inputs = HashMap::from([("x".to_string(), activations(&mut rng, &[2, 3, k], false))]);
    let weights = HashMap::from([
        (
            (file, "w1".to_string()),
            quantised(&mut rng, format, n, k, false),
        ),
        (
            (file, "w2".to_string()),
            quantised(&mut rng, QuantFormat::Q8_0, n, n, false),
        ),
    ]);
    assert_same_everywhere(&graph, &inputs, &weights);
}

/// Attention's q, k and v shape: quantised products (`qmatmul` or `qmatmul_q8`) of one A with
/// file weights of different widths and formats, next to each other in the graph, which the
/// CPU runs as one step (sibling products); a fourth product of another A after them, and a
/// weight that is missing, must still be the reference's bits and the reference's error.
#[test]
fn sibling_products_keep_their_bits() {
    for q8 in [false, true] {
        siblings_case(q8);
    }
}

fn siblings_case(q8: bool) {
    let product = |x: &tenet_ir::Tensor, w: &tenet_ir::Tensor, f: QuantFormat| {
        if q8 {
            x.qmatmul_q8(w, f)
        } else {
            x.qmatmul(w, f)
        }
    };
    let file = WeightsId([9; 32]);
    let k = 128u64;
    let shapes = [
        ("wq", QuantFormat::Q4_1, 70u64),
        ("wk", QuantFormat::Q4_0, 9),
        ("wv", QuantFormat::Q8_0, 130),
    ];
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 3, k]);
    let h = x.rms_norm(None, 1e-6);
    let products: Vec<_> = shapes
        .iter()
        .map(|&(name, format, n)| {
            let w = g.weight(file, name, DType::U8, &[n, k / 32, format.block_bytes()]);
            product(&h, &w, format)
        })
        .collect();
    let w4 = g.weight(file, "w4", DType::U8, &[64, 2, 20]);
    let tail = product(&products[0].slice(2, 0, 64, 1), &w4, QuantFormat::Q4_1);
    let graph = g
        .finish(&[
            ("q", &products[0]),
            ("k", &(&products[1] * 2.0)),
            ("v", &products[2].softmax(-1)),
            ("t", &tail),
        ])
        .unwrap();
    let mut rng = Rng(21);
    let inputs = HashMap::from([("x".to_string(), activations(&mut rng, &[2, 3, k], true))]);
    let mut weights: HashMap<(WeightsId, String), HostTensor> = shapes
        .iter()
        .map(|&(name, format, n)| {
            (
                (file, name.to_string()),
                quantised(&mut rng, format, n, k, false),
            )
        })
        .collect();
    weights.insert(
        (file, "w4".to_string()),
        quantised(&mut rng, QuantFormat::Q4_1, 64, 64, false),
    );
    assert_same_everywhere(&graph, &inputs, &weights);
    // A sibling's weight missing: the run fails as the reference's does, naming it.
    weights.remove(&(file, "wv".to_string()));
    let err = CpuDevice::new(2, SimdLevel::detect())
        .compile(&graph)
        .unwrap()
        .run(&inputs, &weights, 0)
        .unwrap_err();
    assert!(err.to_string().contains("wv"), "{err}");
}
