//! `dequantize` and `qmatmul` in the reference: a quantised product is bit for bit the product
//! with the dequantised, transposed weight, on random blocks whose scales include infinities,
//! NaNs and denormals; the op's values are `quant::dequantize_block`'s.

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, QuantFormat, TensorType};
use tenet_reference::{quant, run};

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Blocks of `format` whose scales are ordinary values most of the time (so products stay
/// finite and their order shows), random bits otherwise.
fn random_blocks(rng: &mut Rng, format: QuantFormat, blocks: usize) -> Vec<u8> {
    let bb = format.block_bytes() as usize;
    let mut out = random_bytes(rng, blocks * bb);
    for b in out.chunks_exact_mut(bb) {
        if rng.chance(70) {
            let scales = if format == QuantFormat::Q4_1 { 2 } else { 1 };
            for s in 0..scales {
                let v = (rng.below(2001) as f32 - 1000.0) / 4000.0;
                b[2 * s..2 * s + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
    }
    out
}

fn check_identity(seed: u64) {
    let mut rng = Rng(seed);
    let format = *rng.pick(QuantFormat::ALL);
    let (nb, n, m) = (
        1 + rng.below(3) as usize,
        rng.below(5) as usize,
        rng.below(4) as usize,
    );
    let batch = if rng.chance(50) { vec![] } else { vec![2] };
    let k = nb * 32;
    let bb = format.block_bytes() as usize;
    let mut a_shape = batch.clone();
    a_shape.extend([m as u64, k as u64]);
    let w_shape = [n as u64, nb as u64, bb as u64];

    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &a_shape);
    let w = g.input("w", DType::U8, &w_shape);
    let q = a.qmatmul(&w, format);
    let d = w
        .dequantize(format)
        .reshape(&[n as i64, k as i64])
        .permute(&[1, 0]);
    let p = a.matmul(&d);
    let graph = g.finish(&[("q", &q), ("p", &p)]).unwrap();

    let a_val = random_tensor(&mut rng, &TensorType::new(DType::F32, a_shape));
    let w_val = HostTensor::new(
        TensorType::new(DType::U8, w_shape),
        random_blocks(&mut rng, format, n * nb),
    )
    .unwrap();
    let inputs: HashMap<String, HostTensor> =
        [("a".to_string(), a_val), ("w".to_string(), w_val.clone())].into();
    let out = run(&graph, &inputs, &NoWeights, 0).unwrap();
    assert_eq!(out[0].1.ty(), out[1].1.ty());
    assert_eq!(out[0].1.bytes(), out[1].1.bytes(), "seed {seed} {format:?}");

    // The op's values are the shared definition's, block by block.
    let g = GraphBuilder::new();
    let x = g.input("w", DType::U8, &w_shape);
    let graph = g.finish(&[("d", &x.dequantize(format))]).unwrap();
    let inputs: HashMap<String, HostTensor> = [("w".to_string(), w_val.clone())].into();
    let got = run(&graph, &inputs, &NoWeights, 0).unwrap().remove(0).1;
    let mut want = Vec::new();
    quant::dequantize_into(format, w_val.bytes(), &mut want);
    let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    let got: Vec<u32> = got.to_f32_vec().iter().map(|v| v.to_bits()).collect();
    assert_eq!(got, want, "seed {seed}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn qmatmul_is_matmul_by_the_dequantised_transposed_weight(seed in any::<u64>()) {
        check_identity(seed);
    }
}

#[test]
fn a_small_product_by_hand() {
    // One Q8_0 block of ones scaled by 0.5 against a row of 1, 2, …, 32:
    // 0.5 · (1 + … + 32) = 264, and a second row with -1 for every byte: -264.
    let mut w = Vec::new();
    for q in [1u8, 0xff] {
        w.extend(half::f16::from_f32(0.5).to_le_bytes());
        w.extend([q; 32]);
    }
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[1, 32]);
    let wt = g.input("w", DType::U8, &[2, 1, 34]);
    let y = a.qmatmul(&wt, QuantFormat::Q8_0);
    let graph = g.finish(&[("y", &y)]).unwrap();
    let xs: Vec<f32> = (1..=32).map(|v| v as f32).collect();
    let inputs: HashMap<String, HostTensor> = [
        (
            "a".to_string(),
            HostTensor::from_f32(&[1, 32], &xs).unwrap(),
        ),
        (
            "w".to_string(),
            HostTensor::new(TensorType::new(DType::U8, [2, 1, 34]), w).unwrap(),
        ),
    ]
    .into();
    let y = run(&graph, &inputs, &NoWeights, 0).unwrap().remove(0).1;
    assert_eq!(y.to_f32_vec(), [264.0, -264.0]);
}
