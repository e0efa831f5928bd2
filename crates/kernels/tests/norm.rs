//! Vectorised layer and RMS norms against the reference, bit for bit, on hostile values.

use proptest::prelude::*;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, TensorType};
use tenet_kernels::SimdLevel;
use tenet_kernels::norm::{Affine, layer_norm_row, rms_norm_row};

fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    random_tensor(rng, &TensorType::new(DType::F32, [n as u64]))
        .to_f32_vec()
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

/// The reference's bits with every NaN canonical, as the kernels store them (docs/OPS.md).
fn canonical_bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() })
        .collect()
}

fn raw(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

fn check_row(row: &[f32], gamma: &[f32], beta: &[f32]) {
    let n = row.len();
    for eps in [1e-5f32, 1e-12, 0.0] {
        for (g, b) in [(None, None), (Some(gamma), None), (Some(gamma), Some(beta))] {
            let mut want = vec![0.0f32; n];
            tenet_reference::layer_norm_row(row, g, b, eps, &mut want);
            let mut want_rms = vec![0.0f32; n];
            tenet_reference::rms_norm_row(row, g, eps, &mut want_rms);
            for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
                let mut got = vec![0.0f32; n];
                let affine = Affine { gamma: g, beta: b };
                layer_norm_row(level, row, affine, eps, &mut got);
                assert_eq!(
                    raw(&got),
                    canonical_bits(&want),
                    "layer norm {level:?} n={n} eps={eps}"
                );
                rms_norm_row(level, row, g, eps, &mut got);
                assert_eq!(
                    raw(&got),
                    canonical_bits(&want_rms),
                    "rms norm {level:?} n={n} eps={eps}"
                );
            }
        }
    }
}

#[test]
fn special_rows() {
    let nan = f32::from_bits(0x7fc0_0000);
    for row in [
        vec![],
        vec![-0.0f32],
        vec![-0.0f32; 17],
        vec![1.0f32; 33],
        vec![f32::INFINITY, 1.0, 2.0],
        vec![1.0, nan, 2.0],
        vec![1.0, f32::from_bits(0xffc0_1234), 2.0, 3.0],
        vec![f32::from_bits(0x7f80_0001); 20],
        vec![1e-40f32, -1e-41, 3e-39, 0.0],
        vec![3e38f32, -3e38, 3e38, 1.0, 2.0],
    ] {
        let n = row.len();
        let gamma: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
        let beta: Vec<f32> = (0..n)
            .map(|j| if j % 2 == 0 { -0.0 } else { 0.5 })
            .collect();
        check_row(&row, &gamma, &beta);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_rows(n in 0usize..300, seed in any::<u64>(), scale in prop::sample::select(vec![1.0f32, 1e-3, 1e30, 1e-38])) {
        let mut rng = Rng(seed);
        let row = random(&mut rng, n, scale);
        let gamma = random(&mut rng, n, 1.0);
        let beta = random(&mut rng, n, 1.0);
        check_row(&row, &gamma, &beta);
    }
}
