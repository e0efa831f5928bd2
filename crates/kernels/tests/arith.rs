//! Vectorised arithmetic against the reference's scalar operations, bit for bit, on hostile
//! values (NaN payloads, infinities, signed zeros, denormals) and every length around the
//! vector widths; the streaming (non-temporal) stores at every alignment as well.

use proptest::prelude::*;
use tenet_ir::BinaryOp;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, TensorType};
use tenet_kernels::vmath::{
    Arith, ScalarSide, arith_assign, arith_scalar_assign, arith_scalar_slice, arith_slice,
    minmax_scalar_slice, minmax_slice, relu_slice,
};
use tenet_kernels::{SimdLevel, streaming};

const OPS: [(Arith, BinaryOp); 4] = [
    (Arith::Add, BinaryOp::Add),
    (Arith::Sub, BinaryOp::Sub),
    (Arith::Mul, BinaryOp::Mul),
    (Arith::Div, BinaryOp::Div),
];

/// Max and min, and relu, against the reference's scalar definitions (NaN canonical, signed
/// zeros ordered).
fn check_minmax_relu(a: &[f32], b: &[f32]) {
    let bits = |v: f32| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() };
    for (max, op) in [(true, BinaryOp::Max), (false, BinaryOp::Min)] {
        let want: Vec<u32> = a
            .iter()
            .zip(b)
            .map(|(&p, &q)| bits(tenet_reference::binary_f32(op, p, q)))
            .collect();
        for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
            let mut got = vec![0.0f32; a.len()];
            minmax_slice(level, max, a, b, &mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{level:?} {op:?} len {}", a.len());
        }
        // One side a single value, on either side of the reference's op (the kernel is the
        // same for both: the definition is symmetric).
        let singles = [0.0, -0.0, 6.0, -3.5, f32::INFINITY, f32::NAN, 1e-40];
        for s in b.first().copied().into_iter().chain(singles) {
            for scalar_left in [false, true] {
                let want: Vec<u32> = a
                    .iter()
                    .map(|&p| {
                        let (x, y) = if scalar_left { (s, p) } else { (p, s) };
                        bits(tenet_reference::binary_f32(op, x, y))
                    })
                    .collect();
                for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
                    let mut got = vec![0.0f32; a.len()];
                    minmax_scalar_slice(level, max, a, s, &mut got);
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{level:?} {op:?} with {s:e} len {}", a.len());
                }
            }
        }
    }
    let want: Vec<u32> = a
        .iter()
        .map(|&v| bits(tenet_reference::unary_f32(tenet_ir::UnaryOp::Relu, v)))
        .collect();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        let mut got = vec![0.0f32; a.len()];
        relu_slice(level, a, &mut got);
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{level:?} relu len {}", a.len());
    }
}

fn check(a: &[f32], b: &[f32]) {
    check_minmax_relu(a, b);
    for (arith, op) in OPS {
        let want: Vec<u32> = a
            .iter()
            .zip(b)
            .map(|(&p, &q)| {
                let v = tenet_reference::binary_f32(op, p, q);
                if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() }
            })
            .collect();
        for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
            let mut got = vec![0.0f32; a.len()];
            arith_slice(level, arith, a, b, &mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{level:?} {arith:?} len {}", a.len());
            // With non-temporal stores, the output starting at every alignment a vector
            // register can meet; the floats around it untouched.
            for off in 0..16 {
                let mut buf = vec![f32::from_bits(0x7f80_0bad); a.len() + 32];
                streaming::arith_slice(level, arith, a, b, &mut buf[off..off + a.len()]);
                let got: Vec<u32> = buf[off..off + a.len()]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(
                    got,
                    want,
                    "streaming {level:?} {arith:?} len {} at +{off}",
                    a.len()
                );
                let around = buf[..off].iter().chain(&buf[off + a.len()..]);
                assert!(around.into_iter().all(|v| v.to_bits() == 0x7f80_0bad));
            }
            // In place, over either operand.
            for (over, acc, other, side) in [
                ("a", a, b, ScalarSide::Right),
                ("b", b, a, ScalarSide::Left),
            ] {
                let mut acc = acc.to_vec();
                arith_assign(level, arith, &mut acc, other, side);
                let got: Vec<u32> = acc.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    got,
                    want,
                    "{level:?} {arith:?} in place over {over}, len {}",
                    a.len()
                );
            }
        }
    }
    // Each value of `b` broadcast over `a`, on either side.
    for (arith, op) in OPS {
        for &s in b.iter().take(13) {
            for side in [ScalarSide::Left, ScalarSide::Right] {
                let want: Vec<u32> = a
                    .iter()
                    .map(|&x| {
                        let (p, q) = if side == ScalarSide::Left {
                            (s, x)
                        } else {
                            (x, s)
                        };
                        let v = tenet_reference::binary_f32(op, p, q);
                        if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() }
                    })
                    .collect();
                for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
                    let mut got = vec![0.0f32; a.len()];
                    arith_scalar_slice(level, arith, a, s, side, &mut got);
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        got,
                        want,
                        "{level:?} {arith:?} {side:?} {s} len {}",
                        a.len()
                    );
                    let mut acc = a.to_vec();
                    arith_scalar_assign(level, arith, &mut acc, s, side);
                    let got: Vec<u32> = acc.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "in place {level:?} {arith:?} {side:?} {s}");
                }
            }
        }
    }
}

#[test]
fn special_values_pairwise() {
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xffc0_1234),
        f32::from_bits(0x0000_0001),
        f32::from_bits(0x8000_0003),
        f32::MIN_POSITIVE,
        f32::MAX,
        3.0e-39,
    ];
    let (a, b): (Vec<f32>, Vec<f32>) = specials
        .iter()
        .flat_map(|&p| specials.iter().map(move |&q| (p, q)))
        .unzip();
    check(&a, &b);
    check(&[], &[]);
}

proptest! {
    #[test]
    fn random_slices(len in 0usize..300, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let ty = TensorType::new(DType::F32, [len as u64]);
        let a = random_tensor(&mut rng, &ty).to_f32_vec();
        let b = random_tensor(&mut rng, &ty).to_f32_vec();
        check(&a, &b);
    }
}
