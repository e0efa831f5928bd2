//! Fused elementwise chains, bit for bit against the reference: chains of every f32 unary and
//! binary op, long chains (cut into several kernels), broadcast operands, the same input read
//! twice, an intermediate that is also an output (the chain must end there), chains of one,
//! and NaN payloads through `neg` and `abs` (kept by them, made canonical by every other op).

mod support;

use std::collections::HashMap;

use tenet_ir::testing::Rng;
use tenet_ir::{BinaryOp, DType, HostTensor, NoWeights, NodeId, Op, UnaryOp};

use support::{G, assert_matches, device, hostile_inputs};

fn unary(g: &mut G, op: UnaryOp, x: NodeId) -> NodeId {
    g.push(Op::Unary { op, x }, None).unwrap()
}

fn binary(g: &mut G, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.push(Op::Binary { op, a, b }, None).unwrap()
}

fn float_binaries() -> Vec<BinaryOp> {
    BinaryOp::ALL
        .iter()
        .copied()
        .filter(|o| !o.is_comparison() && !o.is_logical())
        .collect()
}

fn float_unaries() -> Vec<UnaryOp> {
    UnaryOp::ALL
        .iter()
        .copied()
        .filter(|&o| o != UnaryOp::Not)
        .collect()
}

fn fused_launches(kernels: &[String]) -> usize {
    kernels.iter().filter(|k| k.starts_with("k_fused_")).count()
}

/// Random chains over every op, with operands broadcast from `[3, 1, 7]`, `[7]` and `[]`
/// against `[3, 5, 7]`, inputs read more than once, and hostile values.
#[test]
fn random_chains_match_the_reference() {
    if device().is_none() {
        return;
    }
    // A device of this test's own: each chain is a program, and a device builds a bounded
    // number of them (past it, chains run unfused).
    let dev = &tenet_opencl::OpenClDevice::open(0, tenet_opencl::Quirks::default()).unwrap();
    let (unaries, binaries) = (float_unaries(), float_binaries());
    let mut rng = Rng(11);
    for case in 0..48u64 {
        let mut g = G::default();
        let shapes: [&[u64]; 4] = [&[3, 5, 7], &[3, 1, 7], &[7], &[]];
        let inputs: Vec<NodeId> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| g.input(&format!("x{i}"), DType::F32, s))
            .collect();
        // The first member reads the full-shape input, so every member has its shape.
        let mut cur = binary(&mut g, *rng.pick(&binaries), inputs[0], *rng.pick(&inputs));
        let len = 2 + rng.below(10);
        for _ in 1..len {
            cur = if rng.chance(40) {
                unary(&mut g, *rng.pick(&unaries), cur)
            } else if rng.chance(50) {
                binary(&mut g, *rng.pick(&binaries), cur, *rng.pick(&inputs))
            } else {
                binary(&mut g, *rng.pick(&binaries), *rng.pick(&inputs), cur)
            };
        }
        let graph = g.finish(&[cur]);
        let kernels = dev.planned_kernels(&graph);
        assert_eq!(kernels.len(), 1, "case {case}: {kernels:?}");
        assert_eq!(fused_launches(&kernels), 1, "case {case}: {kernels:?}");
        for s in 0..2 {
            let inputs = hostile_inputs(&graph, case * 7 + s);
            assert_matches(
                dev,
                &graph,
                &inputs,
                &NoWeights,
                0,
                &format!("chain {case}"),
            );
        }
    }
}

/// Every unary op after a product (a NaN-making op) and before an add: each in a chain of
/// three.
#[test]
fn every_op_inside_a_chain() {
    let Some(dev) = device() else {
        return;
    };
    for (i, op) in float_unaries().into_iter().enumerate() {
        let mut g = G::default();
        let x = g.input("x", DType::F32, &[4, 33]);
        let y = g.input("y", DType::F32, &[33]);
        let t = binary(&mut g, BinaryOp::Mul, x, y);
        let u = unary(&mut g, op, t);
        let v = binary(&mut g, BinaryOp::Add, u, x);
        let graph = g.finish(&[v]);
        assert_eq!(fused_launches(&dev.planned_kernels(&graph)), 1);
        let inputs = hostile_inputs(&graph, i as u64);
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, op.name());
    }
    for (i, op) in float_binaries().into_iter().enumerate() {
        let mut g = G::default();
        let x = g.input("x", DType::F32, &[4, 33]);
        let y = g.input("y", DType::F32, &[4, 1]);
        let t = unary(&mut g, UnaryOp::Exp, x);
        let u = binary(&mut g, op, t, y);
        let v = binary(&mut g, op, y, u);
        let graph = g.finish(&[v]);
        assert_eq!(fused_launches(&dev.planned_kernels(&graph)), 1);
        let inputs = hostile_inputs(&graph, 50 + i as u64);
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, op.name());
    }
}

/// NaN payloads: neg and abs keep them (sign bit only), every other op makes them canonical,
/// and a fused chain must do exactly the same between its members.
#[test]
fn nan_payloads_through_neg_and_abs() {
    let Some(dev) = device() else {
        return;
    };
    let payloads = [
        0x7fc0_0000u32,
        0xffc0_1234,
        0x7f80_0001,
        0xff80_0001,
        0x7fff_ffff,
        0x8000_0000,
        0x0000_0001,
        0xff80_0000,
    ];
    let x: Vec<f32> = payloads.iter().map(|&b| f32::from_bits(b)).collect();
    let inputs: HashMap<String, HostTensor> =
        [("x".to_string(), HostTensor::from_f32(&[8], &x).unwrap())].into();
    let chains: [&[UnaryOp]; 5] = [
        &[UnaryOp::Neg, UnaryOp::Abs],
        &[UnaryOp::Abs, UnaryOp::Neg, UnaryOp::Neg],
        &[UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Neg],
        &[UnaryOp::Relu, UnaryOp::Neg],
        &[UnaryOp::Sqrt, UnaryOp::Abs, UnaryOp::Floor],
    ];
    for ops in chains {
        let mut g = G::default();
        let mut cur = g.input("x", DType::F32, &[8]);
        for &op in ops {
            cur = unary(&mut g, op, cur);
        }
        let graph = g.finish(&[cur]);
        assert_eq!(fused_launches(&dev.planned_kernels(&graph)), 1);
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, &format!("{ops:?}"));
    }
}

/// A chain longer than one kernel takes is cut into several, each materialising its end.
#[test]
fn long_chains_are_cut() {
    let Some(dev) = device() else {
        return;
    };
    let mut g = G::default();
    let x = g.input("x", DType::F32, &[2, 50]);
    let y = g.input("y", DType::F32, &[50]);
    let mut cur = x;
    let ops = [BinaryOp::Mul, BinaryOp::Add, BinaryOp::Sub, BinaryOp::Max];
    for i in 0..100 {
        cur = if i % 5 == 4 {
            unary(&mut g, UnaryOp::Tanh, cur)
        } else {
            binary(&mut g, ops[i % 4], cur, y)
        };
    }
    let graph = g.finish(&[cur]);
    let kernels = dev.planned_kernels(&graph);
    assert!(
        kernels.len() >= 4 && fused_launches(&kernels) == kernels.len(),
        "{kernels:?}"
    );
    assert_matches(
        dev,
        &graph,
        &hostile_inputs(&graph, 3),
        &NoWeights,
        0,
        "long chain",
    );
}

/// An intermediate that is also an output, or read after the chain, ends a chain there; a
/// chain of one runs the ordinary kernel; the same input twice is one operand.
#[test]
fn chains_end_where_values_escape() {
    let Some(dev) = device() else {
        return;
    };
    // t = x*x (output), u = t+y, v = exp(u), w = v*t: t is an output, so the chain from it
    // ends at t, and u, v, w fuse (reading t and y).
    let mut g = G::default();
    let x = g.input("x", DType::F32, &[5, 6]);
    let y = g.input("y", DType::F32, &[6]);
    let t = binary(&mut g, BinaryOp::Mul, x, x);
    let u = binary(&mut g, BinaryOp::Add, t, y);
    let v = unary(&mut g, UnaryOp::Exp, u);
    let w = binary(&mut g, BinaryOp::Mul, v, t);
    let graph = g.finish(&[w, t]);
    let kernels = dev.planned_kernels(&graph);
    assert_eq!(kernels, ["k_binary", "k_fused_0"], "{kernels:?}");
    assert_matches(
        dev,
        &graph,
        &hostile_inputs(&graph, 1),
        &NoWeights,
        0,
        "escaping",
    );

    // u is read by a reduction after the chain: the chain ends at u.
    let mut g = G::default();
    let x = g.input("x", DType::F32, &[5, 6]);
    let t = unary(&mut g, UnaryOp::Neg, x);
    let u = binary(&mut g, BinaryOp::Mul, t, x);
    let v = unary(&mut g, UnaryOp::Sigmoid, u);
    let r = g
        .push(
            Op::Reduce {
                op: tenet_ir::ReduceOp::Sum,
                x: u,
                axes: vec![1],
                keepdim: true,
            },
            None,
        )
        .unwrap();
    let s = binary(&mut g, BinaryOp::Sub, v, r);
    let graph = g.finish(&[s]);
    let kernels = dev.planned_kernels(&graph);
    assert_eq!(kernels[0], "k_fused_0", "{kernels:?}");
    assert_matches(
        dev,
        &graph,
        &hostile_inputs(&graph, 2),
        &NoWeights,
        0,
        "read later",
    );

    // A chain of one.
    let mut g = G::default();
    let x = g.input("x", DType::F32, &[9]);
    let t = unary(&mut g, UnaryOp::Abs, x);
    let graph = g.finish(&[t]);
    assert_eq!(dev.planned_kernels(&graph), ["k_unary"]);
    assert_matches(
        dev,
        &graph,
        &hostile_inputs(&graph, 4),
        &NoWeights,
        0,
        "one",
    );

    // The same chain at another shape reuses the program (the shapes are arguments).
    let build = |shape: &[u64]| {
        let mut g = G::default();
        let x = g.input("x", DType::F32, shape);
        let t = binary(&mut g, BinaryOp::Mul, x, x);
        let u = unary(&mut g, UnaryOp::Exp, t);
        g.finish(&[u])
    };
    let (a, b) = (build(&[4, 4]), build(&[1000]));
    // A device of its own: other tests build programs on the shared one meanwhile.
    let dev = &tenet_opencl::OpenClDevice::open(0, tenet_opencl::Quirks::default()).unwrap();
    assert_matches(dev, &a, &hostile_inputs(&a, 5), &NoWeights, 0, "reuse a");
    let built = dev.program_builds();
    assert_matches(dev, &b, &hostile_inputs(&b, 6), &NoWeights, 0, "reuse b");
    assert_eq!(dev.program_builds(), built);
}
