//! The work-group-shaped kernels at their edges, bit for bit against the reference: every
//! SGEMM tile the device runs (each forced in turn, and `k_matmul`) on products whose m, n and
//! k are not multiples of the tile, k = 0 and 1, broadcast batches, and the -0 chains that a
//! zero-padded k-loop would turn into +0; the 16-lane row kernels (reductions, softmax, the
//! norms) on rows shorter than 16 and not a multiple of 16, empty rows, more rows than their
//! groups cover at once, along contiguous and strided axes, with NaN payloads, ±inf, ±0,
//! denormals and ties.

mod support;

use std::collections::HashMap;

use tenet_exec::Device;
use tenet_ir::testing::Rng;
use tenet_ir::{DType, HostTensor, NoWeights, NodeId, NormOp, Op, ReduceOp, TensorType};
use tenet_opencl::{OpenClDevice, Quirks};

use support::{G, assert_matches, device, hostile_inputs};

/// A graph of `inputs` and one op over them (if its rules accept it), compared on two hostile
/// draws and on `extra` inputs, if given.
fn check(
    dev: &OpenClDevice,
    what: &str,
    inputs: &[(DType, &[u64])],
    op: impl FnOnce(&[NodeId]) -> Op,
    seed: u64,
    extra: Option<&HashMap<String, HostTensor>>,
) {
    let mut g = G::default();
    let ids: Vec<NodeId> = inputs
        .iter()
        .enumerate()
        .map(|(i, (d, s))| g.input(&format!("x{i}"), *d, s))
        .collect();
    let Some(out) = g.push(op(&ids), None) else {
        return;
    };
    let graph = g.finish(&[out]);
    for s in 0..2 {
        let inputs = hostile_inputs(&graph, seed.wrapping_mul(31).wrapping_add(s));
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, what);
    }
    if let Some(inputs) = extra {
        assert_matches(dev, &graph, inputs, &NoWeights, 0, &format!("{what}, ties"));
    }
}

/// Values full of ties: ±0, ±1, ±inf, a denormal, and NaN in some tensors.
fn ties(rng: &mut Rng, ty: &TensorType) -> HostTensor {
    let n = ty.numel().unwrap() as usize;
    let nan = rng.chance(50);
    if !ty.dtype.is_float() {
        let v: Vec<i64> = (0..n).map(|_| rng.below(3) as i64 - 1).collect();
        let t = HostTensor::from_i64(&ty.shape, &v).unwrap();
        return match ty.dtype {
            DType::I64 => t,
            _ => HostTensor::from_i32(&ty.shape, &v.iter().map(|&x| x as i32).collect::<Vec<_>>())
                .unwrap(),
        };
    }
    let pool = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
    ];
    let v: Vec<f32> = (0..n)
        .map(|_| {
            if nan && rng.chance(10) {
                f32::NAN
            } else {
                *rng.pick(&pool)
            }
        })
        .collect();
    let t = HostTensor::from_f32(&ty.shape, &v).unwrap();
    match ty.dtype {
        DType::F32 => t,
        d => {
            let bytes: Vec<u8> = v
                .iter()
                .flat_map(|&x| match d {
                    DType::F16 => half::f16::from_f32(x).to_bits().to_le_bytes(),
                    _ => half::bf16::from_f32(x).to_bits().to_le_bytes(),
                })
                .collect();
            HostTensor::new(ty.clone(), bytes).unwrap()
        }
    }
}

const PRODUCTS: [(&[u64], &[u64]); 12] = [
    (&[1, 1], &[1, 1]),
    (&[3, 0], &[0, 5]),
    (&[5, 1], &[1, 3]),
    (&[2, 4], &[4, 4]),
    (&[37, 33], &[33, 67]),
    (&[64, 20], &[20, 36]),
    (&[129, 17], &[17, 130]),
    (&[128, 32], &[32, 128]),
    (&[33, 16], &[16, 31]),
    (&[2, 1, 7, 19], &[3, 19, 9]),
    (&[1, 16], &[2, 16, 5]),
    (&[2, 65, 3], &[3, 66]),
];

/// Every SGEMM kernel and `k_matmul` on edge tiles, in every float dtype.
#[test]
fn every_gemm_tile_on_edges() {
    if device().is_none() {
        return;
    }
    // A device of this test's own: forcing a kernel affects only the graphs compiled on it.
    let dev = OpenClDevice::open(0, Quirks::default()).unwrap();
    let mut kernels = dev.gemm_kernels();
    assert!(!kernels.is_empty(), "no SGEMM tile fits this device");
    kernels.push("k_matmul");
    for kernel in kernels {
        assert!(dev.force_gemm(Some(kernel)), "{kernel}");
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (i, (a, b)) in PRODUCTS.into_iter().enumerate() {
                let what = format!("{kernel} {dtype} {a:?} x {b:?}");
                check(
                    &dev,
                    &what,
                    &[(dtype, a), (dtype, b)],
                    |x| Op::MatMul { a: x[0], b: x[1] },
                    i as u64,
                    None,
                );
            }
        }
    }
    assert!(!dev.force_gemm(Some("k_no_such_kernel")));
}

/// Products of tiny opposite-signed values underflow to -0, and the chain stays -0 through
/// every later fma of the same kind. A kernel padding a partial k-slice with zeros would add
/// fma(0, 0, -0) = +0 and lose the sign.
#[test]
fn negative_zero_chains_survive_partial_k_slices() {
    if device().is_none() {
        return;
    }
    let dev = OpenClDevice::open(0, Quirks::default()).unwrap();
    let mut kernels = dev.gemm_kernels();
    kernels.push("k_matmul");
    for kernel in kernels {
        assert!(dev.force_gemm(Some(kernel)));
        for (m, k, n) in [(3u64, 1u64, 5u64), (3, 17, 5), (20, 33, 9), (5, 16, 4)] {
            let mut g = G::default();
            let a = g.input("a", DType::F32, &[m, k]);
            let b = g.input("b", DType::F32, &[k, n]);
            let c = g.push(Op::MatMul { a, b }, None).unwrap();
            let graph = g.finish(&[c]);
            let inputs: HashMap<String, HostTensor> = [
                (
                    "a".to_string(),
                    HostTensor::from_f32(&[m, k], &vec![-1e-30; (m * k) as usize]).unwrap(),
                ),
                (
                    "b".to_string(),
                    HostTensor::from_f32(&[k, n], &vec![1e-30; (k * n) as usize]).unwrap(),
                ),
            ]
            .into();
            let what = format!("{kernel} -0 chain {m}x{k}x{n}");
            assert_matches(&dev, &graph, &inputs, &NoWeights, 0, &what);
            let got = dev
                .compile(&graph)
                .unwrap()
                .run(&inputs, &NoWeights, 0)
                .unwrap();
            assert!(
                got[0]
                    .1
                    .to_f32_vec()
                    .iter()
                    .all(|v| v.to_bits() == 0x8000_0000),
                "{what}: not all -0"
            );
        }
    }
}

const LENS: [u64; 9] = [1, 2, 15, 16, 17, 31, 33, 48, 100];
const ROW_COUNTS: [u64; 3] = [1, 17, 37];

/// Every reduction along a contiguous axis (lanes adjacent) and a strided one (rows
/// adjacent), rows of every length around 16, on hostile values and on ties.
#[test]
fn reductions_on_rows_of_every_length() {
    let Some(dev) = device() else {
        return;
    };
    let mut rng = Rng(3);
    for &op in ReduceOp::ALL {
        for dtype in [DType::F32, DType::BF16, DType::I64, DType::I32] {
            for len in LENS {
                for rows in ROW_COUNTS {
                    for (shape, axis) in [([rows, len], 1u32), ([len, rows], 0)] {
                        let what = format!("{} {dtype}{shape:?} axis {axis}", op.name());
                        let ty = TensorType::new(dtype, shape);
                        let extra: HashMap<String, HostTensor> =
                            [("x0".to_string(), ties(&mut rng, &ty))].into();
                        check(
                            dev,
                            &what,
                            &[(dtype, &shape)],
                            |x| Op::Reduce {
                                op,
                                x: x[0],
                                axes: vec![axis],
                                keepdim: false,
                            },
                            len * 100 + rows,
                            Some(&extra),
                        );
                    }
                }
            }
        }
    }
}

/// Reductions over several axes at once (merged where contiguous, odometer offsets where not),
/// over empty extents (sum and mean only), and over more rows than the launch's groups cover
/// in one sweep.
#[test]
fn reductions_over_axis_sets_empty_rows_and_many_rows() {
    let Some(dev) = device() else {
        return;
    };
    for (op, shape, axes) in [
        (ReduceOp::Sum, &[3u64, 5, 7, 2][..], &[1u32, 2][..]),
        (ReduceOp::Mean, &[3, 5, 7, 2], &[0, 2]),
        (ReduceOp::ArgMax, &[3, 5, 7, 2], &[0, 1, 3]),
        (ReduceOp::Max, &[4, 1, 9, 1], &[1, 2, 3]),
        (ReduceOp::Sum, &[17, 0], &[1]),
        (ReduceOp::Mean, &[17, 0], &[1]),
        (ReduceOp::Sum, &[0, 5], &[1]),
        (ReduceOp::Sum, &[70_000, 3], &[1]),
        (ReduceOp::ArgMin, &[3, 70_000], &[0]),
    ] {
        for dtype in [DType::F32, DType::I32] {
            let what = format!("{} {dtype}{shape:?} {axes:?}", op.name());
            check(
                dev,
                &what,
                &[(dtype, shape)],
                |x| Op::Reduce {
                    op,
                    x: x[0],
                    axes: axes.to_vec(),
                    keepdim: true,
                },
                5,
                None,
            );
        }
    }
}

/// Softmax and log-softmax along the last axis (lanes adjacent), the first and a middle one
/// (rows adjacent), rows of every length around 16, and more rows than one sweep.
#[test]
fn softmax_on_rows_of_every_length() {
    let Some(dev) = device() else {
        return;
    };
    let mut rng = Rng(5);
    for &op in NormOp::ALL {
        for dtype in [DType::F32, DType::BF16] {
            for len in LENS {
                for rows in ROW_COUNTS {
                    for (shape, axis) in [
                        (vec![rows, len], 1u32),
                        (vec![len, rows], 0),
                        (vec![2, len, rows], 1),
                    ] {
                        let what = format!("{} {dtype}{shape:?} axis {axis}", op.name());
                        let ty = TensorType::new(dtype, shape.clone());
                        let extra: HashMap<String, HostTensor> =
                            [("x0".to_string(), ties(&mut rng, &ty))].into();
                        check(
                            dev,
                            &what,
                            &[(dtype, &shape)],
                            |x| Op::Normalize { op, x: x[0], axis },
                            len + rows,
                            Some(&extra),
                        );
                    }
                }
            }
        }
        check(
            dev,
            &format!("{} over many rows", op.name()),
            &[(DType::F32, &[70_000, 2])],
            |x| Op::Normalize {
                op,
                x: x[0],
                axis: 1,
            },
            1,
            None,
        );
    }
}

/// Layer and RMS norms on rows of every length around 16, with and without gamma and beta,
/// and more rows than one sweep.
#[test]
fn norms_on_rows_of_every_length() {
    let Some(dev) = device() else {
        return;
    };
    for dtype in [DType::F32, DType::F16] {
        for len in LENS.into_iter().chain([70_000 / 3]) {
            let rows_list: &[u64] = if len > 1000 { &[3] } else { &ROW_COUNTS };
            for &rows in rows_list {
                for (g, b) in [(false, false), (true, true), (true, false)] {
                    let xs = [rows, len];
                    let v = [len];
                    let mut ins: Vec<(DType, &[u64])> = vec![(dtype, &xs)];
                    if g {
                        ins.push((dtype, &v));
                    }
                    if b {
                        ins.push((dtype, &v));
                    }
                    let what = format!("layer_norm {dtype}{xs:?} gamma={g} beta={b}");
                    check(
                        dev,
                        &what,
                        &ins,
                        |x| Op::LayerNorm {
                            x: x[0],
                            gamma: g.then(|| x[1]),
                            beta: b.then(|| x[if g { 2 } else { 1 }]),
                            eps_bits: 1e-5f32.to_bits(),
                        },
                        len,
                        None,
                    );
                    if !b {
                        let what = format!("rms_norm {dtype}{xs:?} gamma={g}");
                        check(
                            dev,
                            &what,
                            &ins,
                            |x| Op::RmsNorm {
                                x: x[0],
                                gamma: g.then(|| x[1]),
                                eps_bits: 1e-6f32.to_bits(),
                            },
                            len,
                            None,
                        );
                    }
                }
            }
        }
    }
    check(
        dev,
        "layer_norm over many rows",
        &[(DType::F32, &[70_000, 2])],
        |x| Op::LayerNorm {
            x: x[0],
            gamma: None,
            beta: None,
            eps_bits: 0,
        },
        1,
        None,
    );
    check(
        dev,
        "rms_norm over many rows",
        &[(DType::F32, &[70_000, 2])],
        |x| Op::RmsNorm {
            x: x[0],
            gamma: None,
            eps_bits: 0,
        },
        1,
        None,
    );
}
