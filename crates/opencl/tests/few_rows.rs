//! The few-row product `k_gemv` (m <= 4), bit for bit against the reference: every m from 1 to
//! 4, k around its 32-wide slices (0, 1, 15, 16, 17, 31, 33, 577), n not a multiple of its
//! 64-column blocks, broadcast batches, f16 and bf16 operands, B read in place through a
//! folded transposition (a weight `[n, k]` transposed, as a model's linear layers do), -0
//! chains, and NaN payloads, infinities and denormals. And its quantised twin `k_qgemv`:
//! every format, rows around its blocks of 4, block counts around its 4-block slices (word
//! and byte staging both; the IR refuses k = 0), weights with tame and with hostile scales; the plain `k_qmatmul`
//! it replaces still checked where `k_gemv` is off.

mod support;

use std::collections::HashMap;

use tenet_exec::Device;
use tenet_ir::testing::Rng;
use tenet_ir::{DType, HostTensor, NoWeights, NodeId, Op, QDot, QuantFormat, TensorType};
use tenet_opencl::{OpenClDevice, Quirks};

use support::{G, assert_matches, device, hostile, hostile_inputs};

/// `a [batch_a.., m, k] × b`, where b is an input `[batch_b.., k, n]`, or with `transposed`
/// an input `[batch_b.., n, k]` permuted to `[.., k, n]`.
fn product(
    dtype: DType,
    batch_a: &[u64],
    batch_b: &[u64],
    (m, k, n): (u64, u64, u64),
    transposed: bool,
) -> (tenet_ir::Graph, NodeId) {
    let mut g = G::default();
    let a = g.input("a", dtype, &[batch_a, &[m, k]].concat());
    let b = if transposed {
        let raw = g.input("b", dtype, &[batch_b, &[n, k]].concat());
        let r = batch_b.len() as u32;
        let mut perm: Vec<u32> = (0..r).collect();
        perm.extend([r + 1, r]);
        g.push(Op::Permute { x: raw, perm }, None).unwrap()
    } else {
        g.input("b", dtype, &[batch_b, &[k, n]].concat())
    };
    let c = g.push(Op::MatMul { a, b }, None).unwrap();
    (g.finish(&[c]), b)
}

#[test]
fn few_row_products_match_the_reference() {
    let Some(dev) = device() else {
        return;
    };
    if !dev.gemm_kernels().contains(&"k_gemv") {
        println!("skipped: k_gemv does not fit this device");
        return;
    }
    let mut seed = 0u64;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for m in 1..=4u64 {
            for k in [0u64, 1, 15, 16, 17, 31, 33, 577] {
                for n in [1u64, 63, 65, 130] {
                    for transposed in [false, true] {
                        let (graph, _) = product(dtype, &[], &[], (m, k, n), transposed);
                        let kernels = dev.planned_kernels(&graph);
                        assert_eq!(kernels, ["k_gemv"], "{m}x{k}x{n} {transposed}");
                        seed += 1;
                        let what = format!("{dtype} {m}x{k}x{n} transposed {transposed}");
                        assert_matches(
                            dev,
                            &graph,
                            &hostile_inputs(&graph, seed),
                            &NoWeights,
                            0,
                            &what,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn few_row_products_over_broadcast_batches() {
    let Some(dev) = device() else {
        return;
    };
    if !dev.gemm_kernels().contains(&"k_gemv") {
        return;
    }
    type Case = (&'static [u64], &'static [u64], (u64, u64, u64));
    let cases: [Case; 5] = [
        (&[2, 1], &[3], (1, 17, 70)),
        (&[3], &[], (4, 33, 65)),
        (&[], &[5], (2, 16, 7)),
        (&[2, 3], &[2, 1], (3, 40, 129)),
        (&[1], &[4], (1, 576, 96)),
    ];
    for (i, (ba, bb, dims)) in cases.into_iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            for transposed in [false, true] {
                let (graph, _) = product(dtype, ba, bb, dims, transposed);
                assert_eq!(dev.planned_kernels(&graph), ["k_gemv"]);
                let what = format!("{dtype} {ba:?} {bb:?} {dims:?} transposed {transposed}");
                assert_matches(
                    dev,
                    &graph,
                    &hostile_inputs(&graph, 100 + i as u64),
                    &NoWeights,
                    0,
                    &what,
                );
            }
        }
    }
}

/// Tiny products of opposite signs underflow to -0, and the chain stays -0 only if no fma
/// with padding zeros is ever added: across partial slices and with a transposed B.
#[test]
fn negative_zero_chains_on_few_rows() {
    let Some(dev) = device() else {
        return;
    };
    if !dev.gemm_kernels().contains(&"k_gemv") {
        return;
    }
    for (m, k, n) in [(1u64, 1u64, 5u64), (3, 17, 65), (4, 33, 9), (2, 32, 64)] {
        for transposed in [false, true] {
            let (graph, _) = product(DType::F32, &[], &[], (m, k, n), transposed);
            let bshape = if transposed { [n, k] } else { [k, n] };
            let inputs: HashMap<String, HostTensor> = [
                (
                    "a".to_string(),
                    HostTensor::from_f32(&[m, k], &vec![-1e-30; (m * k) as usize]).unwrap(),
                ),
                (
                    "b".to_string(),
                    HostTensor::from_f32(&bshape, &vec![1e-30; (k * n) as usize]).unwrap(),
                ),
            ]
            .into();
            let what = format!("-0 chain {m}x{k}x{n} transposed {transposed}");
            assert_matches(dev, &graph, &inputs, &NoWeights, 0, &what);
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

/// A transposition read by a product and by something else, or that is an output, is
/// computed (the product reads the copy); one read only by few-row products is folded.
#[test]
fn only_private_transpositions_are_folded() {
    let Some(dev) = device() else {
        return;
    };
    if !dev.gemm_kernels().contains(&"k_gemv") {
        return;
    }
    for shared in 0..3 {
        let mut g = G::default();
        let a = g.input("a", DType::F32, &[1, 20]);
        let w = g.input("w", DType::F32, &[30, 20]);
        let wt = g
            .push(
                Op::Permute {
                    x: w,
                    perm: vec![1, 0],
                },
                None,
            )
            .unwrap();
        let c = g.push(Op::MatMul { a, b: wt }, None).unwrap();
        let mut outs = vec![c];
        match shared {
            1 => outs.push(wt),
            2 => {
                let big = g.input("big", DType::F32, &[8, 20]);
                outs.push(g.push(Op::MatMul { a: big, b: wt }, None).unwrap());
            }
            _ => {}
        }
        let graph = g.finish(&outs);
        let kernels = dev.planned_kernels(&graph);
        assert_eq!(
            kernels.contains(&"k_copy".to_string()),
            shared != 0,
            "{shared}: {kernels:?}"
        );
        assert_matches(
            dev,
            &graph,
            &hostile_inputs(&graph, 7 + shared),
            &NoWeights,
            0,
            &format!("transposition shared {shared}"),
        );
    }
}

/// Weight blocks with random bytes; with `tame`, every block's scale (and Q4_1's minimum) a
/// small finite f16, so long chains stay finite and a wrong order shows.
fn quant_weights(rng: &mut Rng, format: QuantFormat, n: u64, nb: u64, tame: bool) -> HostTensor {
    let bb = format.block_bytes();
    let mut bytes: Vec<u8> = (0..n * nb * bb).map(|_| rng.next_u64() as u8).collect();
    if tame {
        for block in bytes.chunks_mut(bb as usize) {
            let halves = if format == QuantFormat::Q4_1 { 2 } else { 1 };
            for h in 0..halves {
                let v = half::f16::from_f32((rng.below(2001) as f32 - 1000.0) / 4096.0);
                block[2 * h..2 * h + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
    }
    HostTensor::new(TensorType::new(DType::U8, [n, nb, bb]), bytes).unwrap()
}

fn check_quantised(dev: &OpenClDevice, kernel: &str, dot: QDot, seed: &mut u64) {
    for &format in QuantFormat::ALL {
        let bb = format.block_bytes();
        for rows in [&[1u64][..], &[2], &[3], &[4], &[5], &[2, 9], &[0]] {
            for nb in [1u64, 3, 4, 5, 9, 18] {
                for n in [1u64, 63, 65, 130] {
                    *seed += 1;
                    let mut g = G::default();
                    let a_shape = [rows, &[nb * 32]].concat();
                    let a = g.input("a", DType::F32, &a_shape);
                    let w = g.input("w", DType::U8, &[n, nb, bb]);
                    let op = Op::QMatMul { a, w, format, dot };
                    let c = g.push(op, None).unwrap();
                    let graph = g.finish(&[c]);
                    if n * rows.iter().product::<u64>() > 0 {
                        assert_eq!(dev.planned_kernels(&graph), [kernel]);
                    }
                    let mut rng = Rng(*seed);
                    let tame = seed.is_multiple_of(2);
                    let inputs: HashMap<String, HostTensor> = [
                        (
                            "a".to_string(),
                            hostile(&mut rng, &TensorType::new(DType::F32, a_shape.clone())),
                        ),
                        (
                            "w".to_string(),
                            quant_weights(&mut rng, format, n, nb, tame),
                        ),
                    ]
                    .into();
                    let what = format!(
                        "{kernel} {} rows {rows:?} blocks {nb} n {n} tame {tame}",
                        format.name()
                    );
                    assert_matches(dev, &graph, &inputs, &NoWeights, 0, &what);
                }
            }
        }
    }
}

#[test]
fn quantised_few_row_products_match_the_reference() {
    let Some(dev) = device() else {
        return;
    };
    if !dev.gemm_kernels().contains(&"k_gemv") {
        println!("skipped: k_qgemv does not fit this device");
        return;
    }
    check_quantised(dev, "k_qgemv", QDot::F32, &mut 0);
}

/// With `k_gemv` forced off (a device too small for it), the plain kernel gives the same bits.
#[test]
fn quantised_products_on_the_plain_kernel() {
    if device().is_none() {
        return;
    }
    let dev = OpenClDevice::open(0, Quirks::default()).unwrap();
    assert!(dev.force_gemm(Some("k_matmul")));
    check_quantised(&dev, "k_qmatmul", QDot::F32, &mut 1000);
}

/// `qmatmul_q8` (activations rounded to 8-bit blocks, integer block products) on its own
/// kernel: the reference's bits, hostile activations and scales included.
#[test]
fn q8_products_match_the_reference() {
    let Some(dev) = device() else {
        return;
    };
    check_quantised(dev, "k_qmatmul_q8", QDot::Q8, &mut 2000);
}
