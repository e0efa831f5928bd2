//! Every op of the op set on the OpenCL device, for every dtype its rules accept, against the
//! reference bit for bit: small shapes (PoCL is slow), hostile values (NaN payloads, ±inf, ±0,
//! denormals, integer extremes), broadcasting, and empty tensors.

mod support;

use tenet_ir::testing::Rng;
use tenet_ir::{
    BinaryOp, DType, Distribution, NoWeights, NodeId, NormOp, Op, PoolKind, ReduceOp, SliceRange,
    TensorType, UnaryOp, Window2d,
};

use support::{G, assert_matches, device, hostile_inputs};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Build a graph of `inputs` and one op over them (if its rules accept it) and compare.
fn check_op(
    what: &str,
    inputs: &[(DType, &[u64])],
    op: impl FnOnce(&[NodeId]) -> Op,
    declared: Option<TensorType>,
    seed: u64,
) -> bool {
    let Some(dev) = device() else {
        return false;
    };
    let mut g = G::default();
    let ids: Vec<NodeId> = inputs
        .iter()
        .enumerate()
        .map(|(i, (d, s))| g.input(&format!("x{i}"), *d, s))
        .collect();
    let Some(out) = g.push(op(&ids), declared) else {
        return false;
    };
    let graph = g.finish(&[out]);
    for s in 0..2 {
        let inputs = hostile_inputs(&graph, seed.wrapping_mul(31).wrapping_add(s));
        assert_matches(dev, &graph, &inputs, &NoWeights, seed, what);
    }
    true
}

#[test]
fn unary_ops() {
    let mut ran = 0;
    for &op in UnaryOp::ALL {
        for dtype in DType::ALL {
            for shape in [&[3u64, 7][..], &[], &[0, 3]] {
                let what = format!("{} {dtype}{shape:?}", op.name());
                ran += check_op(
                    &what,
                    &[(dtype, shape)],
                    |x| Op::Unary { op, x: x[0] },
                    None,
                    1,
                ) as u32;
            }
        }
    }
    if device().is_some() {
        assert!(ran > 50, "{ran}");
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    for &op in BinaryOp::ALL {
        for dtype in DType::ALL {
            let shapes: [(&[u64], &[u64]); 4] = [
                (&[2, 1, 4], &[3, 1]),
                (&[5], &[5]),
                (&[], &[2, 3]),
                (&[0, 2], &[2]),
            ];
            for (i, (sa, sb)) in shapes.into_iter().enumerate() {
                let what = format!("{} {dtype} {sa:?} {sb:?}", op.name());
                check_op(
                    &what,
                    &[(dtype, sa), (dtype, sb)],
                    |x| Op::Binary {
                        op,
                        a: x[0],
                        b: x[1],
                    },
                    None,
                    i as u64,
                );
            }
        }
    }
}

#[test]
fn where_selects_bits() {
    for dtype in DType::ALL {
        let what = format!("where {dtype}");
        check_op(
            &what,
            &[(DType::Bool, &[2, 1, 3]), (dtype, &[4, 1]), (dtype, &[3])],
            |x| Op::Where {
                cond: x[0],
                a: x[1],
                b: x[2],
            },
            None,
            3,
        );
    }
}

#[test]
fn casts_between_every_pair() {
    for from in DType::ALL {
        for to in DType::ALL {
            let what = format!("cast {from} -> {to}");
            let ty = TensorType::new(to, [4, 6]);
            check_op(
                &what,
                &[(from, &[4, 6])],
                |x| Op::Cast { x: x[0] },
                Some(ty),
                5,
            );
        }
    }
}

#[test]
fn reductions_over_any_axes() {
    for &op in ReduceOp::ALL {
        for dtype in DType::ALL {
            for axes in [&[0u32][..], &[1], &[0, 2], &[0, 1, 2], &[2]] {
                for keepdim in [false, true] {
                    for shape in [&[3u64, 5, 4][..], &[2, 0, 3], &[1, 40, 1]] {
                        let what = format!("{} {dtype}{shape:?} {axes:?} {keepdim}", op.name());
                        check_op(
                            &what,
                            &[(dtype, shape)],
                            |x| Op::Reduce {
                                op,
                                x: x[0],
                                axes: axes.to_vec(),
                                keepdim,
                            },
                            None,
                            7,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_with_batch_broadcasting() {
    for dtype in DType::ALL {
        let cases: [(&[u64], &[u64]); 4] = [
            (&[3, 4], &[4, 5]),
            (&[2, 1, 3, 37], &[3, 37, 2]),
            (&[2, 3, 0], &[0, 4]),
            (&[1, 0, 3], &[2, 3, 2]),
        ];
        for (a, b) in cases {
            let what = format!("matmul {dtype} {a:?} {b:?}");
            check_op(
                &what,
                &[(dtype, a), (dtype, b)],
                |x| Op::MatMul { a: x[0], b: x[1] },
                None,
                9,
            );
        }
    }
}

#[test]
fn softmax_and_log_softmax_on_every_axis() {
    for &op in NormOp::ALL {
        for dtype in FLOATS {
            for axis in 0..3 {
                for shape in [&[2u64, 19, 3][..], &[3, 0, 2]] {
                    let what = format!("{} {dtype}{shape:?} axis {axis}", op.name());
                    check_op(
                        &what,
                        &[(dtype, shape)],
                        |x| Op::Normalize { op, x: x[0], axis },
                        None,
                        11,
                    );
                }
            }
        }
    }
}

#[test]
fn layer_and_rms_norms() {
    for dtype in FLOATS {
        for (g, b) in [(false, false), (true, false), (false, true), (true, true)] {
            for n in [1u64, 5, 37] {
                let what = format!("layer_norm {dtype} n={n} gamma={g} beta={b}");
                let (xs, shape) = ([3, n], [n]);
                let mut ins: Vec<(DType, &[u64])> = vec![(dtype, &xs[..])];
                if g {
                    ins.push((dtype, &shape));
                }
                if b {
                    ins.push((dtype, &shape));
                }
                check_op(
                    &what,
                    &ins,
                    |x| Op::LayerNorm {
                        x: x[0],
                        gamma: g.then(|| x[1]),
                        beta: b.then(|| x[if g { 2 } else { 1 }]),
                        eps_bits: 1e-5f32.to_bits(),
                    },
                    None,
                    13,
                );
                if !b {
                    let what = format!("rms_norm {dtype} n={n} gamma={g}");
                    check_op(
                        &what,
                        &ins,
                        |x| Op::RmsNorm {
                            x: x[0],
                            gamma: g.then(|| x[1]),
                            eps_bits: 1e-6f32.to_bits(),
                        },
                        None,
                        13,
                    );
                }
            }
        }
        check_op(
            "layer_norm of an empty tensor",
            &[(dtype, &[0, 4])],
            |x| Op::LayerNorm {
                x: x[0],
                gamma: None,
                beta: None,
                eps_bits: 0,
            },
            None,
            1,
        );
    }
}

#[test]
fn movement_ops_copy_bits() {
    for dtype in DType::ALL {
        let s: &[u64] = &[2, 3, 4];
        check_op(
            &format!("reshape {dtype}"),
            &[(dtype, s)],
            |x| Op::Reshape { x: x[0] },
            Some(TensorType::new(dtype, [4, 6])),
            1,
        );
        check_op(
            &format!("permute {dtype}"),
            &[(dtype, s)],
            |x| Op::Permute {
                x: x[0],
                perm: vec![2, 0, 1],
            },
            None,
            1,
        );
        check_op(
            &format!("expand {dtype}"),
            &[(dtype, &[3, 1])],
            |x| Op::Expand { x: x[0] },
            Some(TensorType::new(dtype, [2, 3, 4])),
            1,
        );
        check_op(
            &format!("slice {dtype}"),
            &[(dtype, &[5, 7])],
            |x| Op::Slice {
                x: x[0],
                ranges: vec![
                    SliceRange {
                        start: 1,
                        end: 5,
                        step: 2,
                    },
                    SliceRange {
                        start: 0,
                        end: 7,
                        step: 3,
                    },
                ],
            },
            None,
            1,
        );
        check_op(
            &format!("empty slice {dtype}"),
            &[(dtype, &[5, 7])],
            |x| Op::Slice {
                x: x[0],
                ranges: vec![
                    SliceRange {
                        start: 2,
                        end: 2,
                        step: 1,
                    },
                    SliceRange {
                        start: 0,
                        end: 7,
                        step: 1,
                    },
                ],
            },
            None,
            1,
        );
        let value = match dtype {
            DType::F32 => 0xffc0_1234,
            DType::Bool => 1,
            d => 0x8123_4567_89ab_cdefu64 & ((1u128 << (8 * d.size())) - 1) as u64,
        };
        check_op(
            &format!("pad {dtype}"),
            &[(dtype, &[2, 3])],
            |x| Op::Pad {
                x: x[0],
                pads: vec![(1, 0), (2, 1)],
                value,
            },
            None,
            1,
        );
        check_op(
            &format!("pad of empty {dtype}"),
            &[(dtype, &[0, 3])],
            |x| Op::Pad {
                x: x[0],
                pads: vec![(1, 1), (0, 1)],
                value,
            },
            None,
            1,
        );
        for axis in 0..2 {
            check_op(
                &format!("concat {dtype} axis {axis}"),
                &[(dtype, &[2, 3]), (dtype, &[2, 3]), (dtype, &[2, 3])],
                |x| Op::Concat {
                    xs: x.to_vec(),
                    axis,
                },
                None,
                1,
            );
        }
        check_op(
            &format!("concat with an empty part {dtype}"),
            &[(dtype, &[2, 3]), (dtype, &[0, 3]), (dtype, &[1, 3])],
            |x| Op::Concat {
                xs: x.to_vec(),
                axis: 0,
            },
            None,
            1,
        );
    }
}

#[test]
fn gather_with_negative_and_wide_indices() {
    let Some(dev) = device() else {
        return;
    };
    for dtype in DType::ALL {
        for idt in [DType::I32, DType::I64] {
            for axis in 0..3u32 {
                let mut g = G::default();
                let x = g.input("x", dtype, &[3, 4, 5]);
                let i = g.input("i", idt, &[2, 3]);
                let out = g
                    .push(
                        Op::Gather {
                            x,
                            indices: i,
                            axis,
                        },
                        None,
                    )
                    .expect("valid");
                let graph = g.finish(&[out]);
                let mut inputs = hostile_inputs(&graph, 3);
                let size = [3i64, 4, 5][axis as usize];
                let vals: Vec<i64> = (0..6).map(|k| (k * 7) % (2 * size) - size).collect();
                let t = match idt {
                    DType::I32 => tenet_ir::HostTensor::from_i32(
                        &[2, 3],
                        &vals.iter().map(|&v| v as i32).collect::<Vec<_>>(),
                    ),
                    _ => tenet_ir::HostTensor::from_i64(&[2, 3], &vals),
                }
                .unwrap();
                inputs.insert("i".into(), t);
                let what = format!("gather {dtype} by {idt} axis {axis}");
                assert_matches(dev, &graph, &inputs, &NoWeights, 0, &what);
            }
        }
    }
}

#[test]
fn generated_sources() {
    for dtype in DType::ALL {
        for axis in 0..3 {
            check_op(
                &format!("iota {dtype} axis {axis}"),
                &[],
                |_| Op::Iota { axis },
                Some(TensorType::new(dtype, [3, 2, 70000])),
                1,
            );
        }
    }
    for upper in [false, true] {
        for diagonal in [-3i64, -1, 0, 2, i64::MAX, i64::MIN] {
            check_op(
                &format!("tri_mask upper={upper} d={diagonal}"),
                &[],
                |_| Op::TriMask { upper, diagonal },
                Some(TensorType::new(DType::Bool, [2, 4, 5])),
                1,
            );
        }
    }
    for &dist in Distribution::ALL {
        for dtype in FLOATS {
            for key in [0u64, 7, u64::MAX] {
                let Some(dev) = device() else {
                    return;
                };
                let mut g = G::default();
                let r = g
                    .push(
                        Op::Random { dist, key },
                        Some(TensorType::new(dtype, [3, 50])),
                    )
                    .unwrap();
                let graph = g.finish(&[r]);
                for seed in [0u64, 1, 0xdead_beef_0123_4567] {
                    let what = format!("{} {dtype} key {key} seed {seed}", dist.name());
                    assert_matches(dev, &graph, &Default::default(), &NoWeights, seed, &what);
                }
            }
        }
    }
    for dtype in DType::ALL {
        let Some(dev) = device() else {
            return;
        };
        let mut rng = Rng(5);
        let ty = TensorType::new(dtype, [2, 3]);
        let data = support::hostile(&mut rng, &ty).bytes().to_vec();
        let mut g = G::default();
        let c = g.push(Op::Constant { data }, Some(ty)).unwrap();
        let x = g.input("x", dtype, &[2, 3]);
        let both = g
            .push(
                Op::Concat {
                    xs: vec![c, x],
                    axis: 0,
                },
                None,
            )
            .unwrap();
        let graph = g.finish(&[both, c]);
        let inputs = hostile_inputs(&graph, 1);
        assert_matches(
            dev,
            &graph,
            &inputs,
            &NoWeights,
            0,
            &format!("constant {dtype}"),
        );
    }
}

#[test]
fn conv2d_every_geometry() {
    for dtype in FLOATS {
        for groups in [1u32, 2] {
            for bias in [false, true] {
                for (stride, padding, dilation) in [
                    ([1u32, 1], [0u32, 0, 0, 0], [1u32, 1]),
                    ([2, 1], [1, 0, 1, 2], [1, 2]),
                    ([1, 2], [2, 1, 0, 1], [2, 1]),
                ] {
                    let what = format!(
                        "conv2d {dtype} g={groups} bias={bias} s={stride:?} p={padding:?} d={dilation:?}"
                    );
                    let ws = [4, 4 / groups as u64, 3, 2];
                    let mut ins: Vec<(DType, &[u64])> = vec![(dtype, &[2, 4, 6, 5]), (dtype, &ws)];
                    if bias {
                        ins.push((dtype, &[4]));
                    }
                    check_op(
                        &what,
                        &ins,
                        |x| Op::Conv2d {
                            x: x[0],
                            w: x[1],
                            bias: bias.then(|| x[2]),
                            window: Window2d {
                                stride,
                                padding,
                                dilation,
                            },
                            groups,
                        },
                        None,
                        17,
                    );
                }
            }
        }
    }
}

#[test]
fn pooling_every_kind() {
    for &kind in PoolKind::ALL {
        for dtype in DType::ALL {
            for (kernel, stride, padding, dilation) in [
                ([2u32, 2], [2u32, 2], [0u32, 0, 0, 0], [1u32, 1]),
                ([3, 2], [1, 2], [1, 1, 1, 0], [1, 1]),
                ([2, 3], [2, 1], [1, 0, 0, 1], [2, 1]),
            ] {
                let what = format!(
                    "{} {dtype} k={kernel:?} s={stride:?} p={padding:?} d={dilation:?}",
                    kind.name()
                );
                check_op(
                    &what,
                    &[(dtype, &[2, 3, 6, 5])],
                    |x| Op::Pool2d {
                        kind,
                        x: x[0],
                        kernel,
                        window: Window2d {
                            stride,
                            padding,
                            dilation,
                        },
                    },
                    None,
                    19,
                );
            }
        }
    }
}

#[test]
fn quantised_ops() {
    use tenet_ir::QuantFormat;
    if device().is_none() {
        return;
    }
    let mut ran = 0;
    for &format in QuantFormat::ALL {
        let bb = format.block_bytes();
        // Several blocks per row, rows of several batches, more outputs than a work group.
        for (a, w) in [
            (&[3u64, 128][..], [70u64, 4, bb]),
            (&[2, 5, 64][..], [9, 2, bb]),
            (&[1, 32][..], [1, 1, bb]),
            (&[0, 32][..], [3, 1, bb]),
            (&[2, 32][..], [0, 1, bb]),
        ] {
            for dot in tenet_ir::QDot::ALL.iter().copied() {
                let what = format!("{} {} f32{a:?} u8{w:?}", dot.name(), format.name());
                ran += check_op(
                    &what,
                    &[(DType::F32, a), (DType::U8, &w)],
                    |x| Op::QMatMul {
                        a: x[0],
                        w: x[1],
                        format,
                        dot,
                    },
                    None,
                    7,
                ) as u32;
            }
        }
        for shape in [&[5u64, 3, bb][..], &[2, bb], &[0, 2, bb], &[4, 0, bb]] {
            let what = format!("dequantize {} u8{shape:?}", format.name());
            ran += check_op(
                &what,
                &[(DType::U8, shape)],
                |x| Op::Dequantize { x: x[0], format },
                None,
                8,
            ) as u32;
        }
    }
    assert_eq!(ran, 3 * (5 * 2 + 4));
}
