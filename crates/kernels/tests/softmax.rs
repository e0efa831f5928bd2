//! Vectorised softmax rows against the reference, bit for bit, on hostile values.

use proptest::prelude::*;
use tenet_ir::NormOp;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, TensorType};
use tenet_kernels::SimdLevel;
use tenet_kernels::softmax::softmax_rows;

fn check(rows: usize, n: usize, seed: u64, scale: f32) {
    let mut rng = Rng(seed);
    let x: Vec<f32> = random_tensor(&mut rng, &TensorType::new(DType::F32, [(rows * n) as u64]))
        .to_f32_vec()
        .into_iter()
        .map(|v| v * scale)
        .collect();
    check_rows(&x, n);
}

#[test]
fn edge_rows() {
    check(1, 1, 1, 1.0);
    check(3, 17, 2, 1.0);
    check(2, 0, 3, 1.0);
    check(4, 33, 4, 100.0); // large spread: exps underflow
    check(5, 64, 5, 1e-30); // tiny values around zero, signed zeros
}

#[test]
fn special_rows() {
    for row in [
        vec![-0.0f32, 0.0, -0.0],
        vec![-0.0f32; 5],
        vec![f32::NEG_INFINITY, 1.0, 2.0],
        vec![f32::INFINITY, 1.0],
        vec![f32::NEG_INFINITY; 20],
        vec![-5.0, -3.0, -7.0, -1.0],
        vec![1.0, f32::from_bits(0xffc0_1234), 2.0],
    ] {
        check_rows(&row, row.len());
    }
}

#[test]
fn special_rows_side_by_side() {
    // Rows with NaN, infinities and signed zeros next to ordinary ones in one call: a row's
    // maximum, sum or NaN must never leak into its neighbours'.
    let n = 19;
    let mut rng = Rng(21);
    let mut x: Vec<f32> = (0..n * 9)
        .map(|_| rng.next_u64() as i32 as f32 / 4e8)
        .collect();
    x[n + 3] = f32::NAN;
    x[3 * n..4 * n].fill(f32::NEG_INFINITY);
    x[5 * n + 18] = f32::INFINITY;
    x[6 * n..7 * n].fill(-0.0);
    x[8 * n] = f32::from_bits(0xffc0_1234);
    check_rows(&x, n);
}

fn check_rows(x: &[f32], n: usize) {
    for log in [false, true] {
        let op = if log {
            NormOp::LogSoftmax
        } else {
            NormOp::Softmax
        };
        let mut want = vec![0.0f32; x.len()];
        if n > 0 {
            for (r, o) in x.chunks(n).zip(want.chunks_mut(n)) {
                tenet_reference::softmax_row(op, r, o);
            }
        }
        let want: Vec<u32> = want
            .iter()
            .map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() })
            .collect();
        for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
            let mut got = vec![0.0f32; x.len()];
            softmax_rows(level, log, x, n, &mut got);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{level:?} log={log} rows of {n}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_rows(rows in 1usize..6, n in 1usize..300, seed in any::<u64>(), scale in prop::sample::select(vec![1.0f32, 10.0, 1e-3, 50.0])) {
        check(rows, n, seed, scale);
    }
}

#[test]
fn vector_exp_matches_the_scalar_definition_everywhere() {
    let mut xs: Vec<f32> = (0..200_000)
        .map(|i| -110.0 + 200.0 * (i as f32 / 200_000.0))
        .collect();
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xffc0_0001),
        88.72,
        88.73,
        -87.3,
        -103.9,
        // The clamp, where the kernels zero a lane instead of scaling it, and its neighbours.
        -104.0,
        f32::from_bits((-104.0f32).to_bits() - 1),
        f32::from_bits((-104.0f32).to_bits() + 1),
        -1e30,
        1e-40,
    ]);
    let mut rng = Rng(9);
    xs.extend((0..50_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        let mut out = vec![0.0f32; xs.len()];
        tenet_kernels::vmath::exp_slice(level, &xs, &mut out);
        for (&x, &y) in xs.iter().zip(&out) {
            assert_eq!(
                y.to_bits(),
                tenet_reference::math::exp(x).to_bits(),
                "{level:?} exp({x:e})"
            );
        }
    }
}

#[test]
fn vector_gelu_matches_the_scalar_definition_everywhere() {
    let mut xs: Vec<f32> = (0..400_000)
        .map(|i| -12.0 + 24.0 * (i as f32 / 400_000.0))
        .collect();
    xs.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        4.0,
        -4.0,
        5.6568,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -1e-40,
        3.999_999_8,
    ]);
    let mut rng = Rng(10);
    xs.extend((0..100_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        let mut out = vec![0.0f32; xs.len()];
        tenet_kernels::vmath::gelu_erf_slice(level, &xs, &mut out);
        for (&x, &y) in xs.iter().zip(&out) {
            let want = tenet_reference::unary_f32(tenet_ir::UnaryOp::GeluErf, x);
            let want = if want.is_nan() {
                0x7fc0_0000
            } else {
                want.to_bits()
            };
            assert_eq!(y.to_bits(), want, "{level:?} gelu({x:e})");
        }
    }
}
