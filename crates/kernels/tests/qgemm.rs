//! The quantised product and dequantisation against the reference interpreter: bit for bit, at
//! every SIMD level and thread count, over random shapes (n not a multiple of 16, empty
//! products, k over several blocks, both the quantised path and the GEMM path) and random
//! blocks with hostile scales (±inf, NaNs with payloads, denormals, ±0, ±max) beside ordinary
//! ones, with NaNs, infinities and denormals in A.

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_ir::testing::Rng;
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, QDot, QuantFormat as IrFormat};
use tenet_kernels::SimdLevel;
use tenet_kernels::qgemm::{
    GEMM_MIN_ROWS, QWeight, QuantFormat, dequantize, q8, qgemm, qgemm_polled, qgemm_siblings,
};

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| l.supported())
        .collect()
}

fn ir(format: QuantFormat) -> IrFormat {
    match format {
        QuantFormat::Q4_0 => IrFormat::Q4_0,
        QuantFormat::Q4_1 => IrFormat::Q4_1,
        QuantFormat::Q8_0 => IrFormat::Q8_0,
    }
}

/// An f16 scale: mostly ordinary (2⁻⁸ … 2), sometimes hostile when `hostile`.
fn scale(rng: &mut Rng, hostile: bool) -> u16 {
    const SPECIAL: [u16; 12] = [
        0x7c00, 0xfc00, // ±inf
        0x7e00, 0x7c01, 0xfe3f, 0x7fff, // NaNs, quiet and signalling, with payloads
        0x0001, 0x83ff, 0x0200, // denormals
        0x0000, 0x8000, // ±0
        0x7bff, // max
    ];
    if hostile && rng.chance(15) {
        return *rng.pick(&SPECIAL);
    }
    if hostile && rng.chance(5) {
        return 0xfbff; // -max
    }
    // Exponent 7..=16 (2⁻⁸ … 2), random sign and mantissa.
    let sign = (rng.next_u64() as u16 & 1) << 15;
    let exp = 7 + rng.below(10) as u16;
    sign | exp << 10 | (rng.next_u64() as u16 & 0x3ff)
}

/// `n` rows of `k / 32` random blocks.
fn blocks(rng: &mut Rng, format: QuantFormat, count: usize, hostile: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * format.block_bytes());
    for _ in 0..count {
        let heads = if format == QuantFormat::Q4_1 { 2 } else { 1 };
        for _ in 0..heads {
            out.extend_from_slice(&scale(rng, hostile).to_le_bytes());
        }
        for _ in heads * 2..format.block_bytes() {
            out.push(rng.next_u64() as u8);
        }
    }
    out
}

/// A's values: full-mantissa finite values, and with `hostile` some NaNs (with payloads),
/// infinities, signed zeros and denormals.
fn activations(rng: &mut Rng, len: usize, hostile: bool) -> Vec<f32> {
    (0..len)
        .map(|_| {
            if hostile && rng.chance(3) {
                f32::from_bits(*rng.pick(&[
                    0x7fc0_0000,
                    0xffc0_1234,
                    0x7f80_0001,
                    0x7f80_0000,
                    0xff80_0000,
                    0x0000_0001,
                    0x807f_ffff,
                    0x8000_0000,
                    0x0000_0000,
                ]))
            } else {
                ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            }
        })
        .collect()
}

/// The reference interpreter's `qmatmul` of `a` (`m × k`) and `w` (`[n, k/32, bb]`), as bits.
fn reference(format: QuantFormat, m: usize, n: usize, k: usize, a: &[f32], w: &[u8]) -> Vec<u32> {
    reference_of(QDot::F32, format, m, n, k, a, w)
}

/// The reference interpreter's `qmatmul` (`dot` F32) or `qmatmul_q8` (Q8), as bits.
fn reference_of(
    dot: QDot,
    format: QuantFormat,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    w: &[u8],
) -> Vec<u32> {
    let g = GraphBuilder::new();
    let bb = format.block_bytes() as u64;
    let x = g.input("a", DType::F32, &[m as u64, k as u64]);
    let q = g.input("w", DType::U8, &[n as u64, k as u64 / 32, bb]);
    let c = match dot {
        QDot::F32 => x.qmatmul(&q, ir(format)),
        QDot::Q8 => x.qmatmul_q8(&q, ir(format)),
    };
    let graph = g.finish(&[("c", &c)]).unwrap();
    let inputs = HashMap::from([
        (
            "a".to_string(),
            HostTensor::from_f32(&[m as u64, k as u64], a).unwrap(),
        ),
        (
            "w".to_string(),
            HostTensor::new(
                tenet_ir::TensorType::new(DType::U8, [n as u64, k as u64 / 32, bb]),
                w.to_vec(),
            )
            .unwrap(),
        ),
    ]);
    let out = tenet_reference::run(&graph, &inputs, &NoWeights, 0).unwrap();
    out[0].1.to_f32_vec().iter().map(|v| v.to_bits()).collect()
}

/// Every level and thread count against the reference, with A's rows wider than k (a view) and
/// C's rows wider than n, filled with a signalling NaN: every element must be written.
fn check(format: QuantFormat, m: usize, n: usize, k: usize, seed: u64, hostile: bool) {
    check_dot(QDot::F32, format, m, n, k, seed, hostile);
}

/// [`check`] for `qmatmul` (`dot` F32, `qgemm`) or `qmatmul_q8` (Q8, `q8::qgemm_q8`).
fn check_dot(
    dot: QDot,
    format: QuantFormat,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
    hostile: bool,
) {
    let mut rng = Rng(seed);
    let w = blocks(&mut rng, format, n * k / 32, hostile);
    let a = activations(&mut rng, m * k, hostile);
    let want = reference_of(dot, format, m, n, k, &a, &w);
    let a_rs = k + 3;
    let padded: Vec<f32> = (0..m * a_rs)
        .map(|x| {
            let (i, p) = (x / a_rs, x % a_rs);
            if p < k { a[i * k + p] } else { f32::NAN }
        })
        .collect();
    let qw = QWeight::new(format, n, k, &w).unwrap();
    for level in levels() {
        for threads in [1, 2, 3] {
            let c_rs = n + 5;
            let mut c = vec![f32::from_bits(0x7f80_0001); m * c_rs];
            match dot {
                QDot::F32 => qgemm(level, threads, m, &padded, a_rs, qw, &mut c, c_rs),
                QDot::Q8 => q8::qgemm_q8(level, threads, m, &padded, a_rs, qw, &mut c, c_rs),
            }
            .unwrap();
            let got: Vec<u32> = (0..m)
                .flat_map(|i| c[i * c_rs..i * c_rs + n].to_vec())
                .map(|v| v.to_bits())
                .collect();
            if got != want {
                let bad = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
                panic!(
                    "{dot:?} {format:?} {level:?} threads={threads} m={m} n={n} k={k} hostile={hostile}: \
                     element {bad} (row {}, column {}) is {:#010x}, the reference {:#010x}",
                    bad / n.max(1),
                    bad % n.max(1),
                    got[bad],
                    want[bad]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_products_match_the_reference(
        format in prop::sample::select(QuantFormat::ALL.to_vec()),
        m in 1usize..=20,
        n in 1usize..=70,
        blocks in 1usize..=10,
        seed in any::<u64>(),
        hostile in any::<bool>(),
    ) {
        check(format, m, n, blocks * 32, seed, hostile);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_q8_products_match_the_reference(
        format in prop::sample::select(QuantFormat::ALL.to_vec()),
        m in 1usize..=20,
        n in 1usize..=70,
        blocks in 1usize..=10,
        seed in any::<u64>(),
        hostile in any::<bool>(),
    ) {
        check_dot(QDot::Q8, format, m, n, blocks * 32, seed, hostile);
    }
}

/// `qmatmul_q8` at the shapes that matter: SmolLM2's decode and a prefill's rows, a weight
/// split across threads with a partial tile, rows past a pass of the kernel, and a tile's
/// last rows (not a multiple of 8) in scalar code.
#[test]
fn q8_edges() {
    for format in QuantFormat::ALL {
        for (m, n, k) in [
            (1, 1, 32),
            (1, 7, 64),
            (1, 8, 32),
            (1, 129, 576),
            (3, 17, 32),
            (8, 64, 64),
            (9, 70, 128),
            (7, 24, 96),
            (15, 40, 64),
            (17, 31, 64),
            (1, 700, 576),
            (20, 260, 1024),
        ] {
            for hostile in [false, true] {
                check_dot(
                    QDot::Q8,
                    format,
                    m,
                    n,
                    k,
                    (m * 1000 + n * 10 + k) as u64,
                    hostile,
                );
            }
        }
    }
}

/// Sibling products (one A, several weights: attention's q, k and v) computed together give
/// each product's own bits, for both definitions, whatever the widths (partial tiles, an
/// empty weight), rows (the f32 one's GEMM path from `GEMM_MIN_ROWS`) and threads; weights of
/// different k are refused.
#[test]
fn siblings_give_each_product_its_own_bits() {
    let mut rng = Rng(7);
    for (dot, format) in [QDot::F32, QDot::Q8]
        .into_iter()
        .flat_map(|d| QuantFormat::ALL.map(|f| (d, f)))
    {
        for (m, widths) in [
            (1, vec![576, 192, 192]),
            (3, vec![70, 0, 9, 130]),
            (5, vec![8]),
            (GEMM_MIN_ROWS + 1, vec![40, 70]),
        ] {
            let k = 96;
            let a = activations(&mut rng, m * k, false);
            let ws: Vec<Vec<u8>> = widths
                .iter()
                .map(|&n| blocks(&mut rng, format, n * k / 32, false))
                .collect();
            for level in levels() {
                for threads in [1, 2, 3] {
                    let mut outs: Vec<Vec<f32>> =
                        widths.iter().map(|&n| vec![f32::NAN; m * n]).collect();
                    let mut products: Vec<_> = ws
                        .iter()
                        .zip(&widths)
                        .zip(outs.iter_mut())
                        .map(|((w, &n), c)| {
                            (QWeight::new(format, n, k, w).unwrap(), c.as_mut_slice(), n)
                        })
                        .collect();
                    let never = || false;
                    match dot {
                        QDot::F32 => {
                            qgemm_siblings(level, threads, m, &a, k, &mut products, &never)
                        }
                        QDot::Q8 => {
                            q8::qgemm_q8_siblings(level, threads, m, &a, k, &mut products, &never)
                        }
                    }
                    .unwrap();
                    for ((w, &n), got) in ws.iter().zip(&widths).zip(&outs) {
                        let mut alone = vec![0.0f32; m * n];
                        let qw = QWeight::new(format, n, k, w).unwrap();
                        match dot {
                            QDot::F32 => qgemm(level, 1, m, &a, k, qw, &mut alone, n),
                            QDot::Q8 => q8::qgemm_q8(level, 1, m, &a, k, qw, &mut alone, n),
                        }
                        .unwrap();
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(got),
                            bits(&alone),
                            "{dot:?} {format:?} {level:?} n={n}"
                        );
                    }
                }
            }
        }
    }
    let (w1, w2) = (vec![0u8; 2 * 18], vec![0u8; 4 * 18]);
    let (mut c1, mut c2) = (vec![0.0f32; 2], vec![0.0f32; 2]);
    let a = vec![0.0f32; 64];
    let mut products = [
        (
            QWeight::new(QuantFormat::Q4_0, 2, 32, &w1).unwrap(),
            c1.as_mut_slice(),
            2,
        ),
        (
            QWeight::new(QuantFormat::Q4_0, 2, 64, &w2).unwrap(),
            c2.as_mut_slice(),
            2,
        ),
    ];
    let refused =
        q8::qgemm_q8_siblings(SimdLevel::Portable, 1, 1, &a, 64, &mut products, &|| false);
    assert!(refused.is_err(), "{refused:?}");
    let refused = qgemm_siblings(SimdLevel::Portable, 1, 1, &a, 64, &mut products, &|| false);
    assert!(refused.is_err(), "{refused:?}");
}

/// The largest integer sums the kernels can meet: every weight integer at its extreme (nibbles
/// of 15, Q8_0 bytes of −128 and 127) times activations that all round to ±127, in every row
/// and block; the AVX2 kernel adds a 4-bit block's byte products in 16 bits, which must hold
/// them exactly.
#[test]
fn q8_extreme_integers() {
    let (m, n, k) = (3, 16, 128);
    for format in QuantFormat::ALL {
        let fills: &[u8] = if format == QuantFormat::Q8_0 {
            &[0x80, 0x7f]
        } else {
            &[0xff]
        };
        for &fill in fills {
            let mut w = vec![fill; n * k / 32 * format.block_bytes()];
            for blk in w.chunks_mut(format.block_bytes()) {
                blk[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
                if format == QuantFormat::Q4_1 {
                    blk[2..4].copy_from_slice(&0x3c00u16.to_le_bytes());
                }
            }
            // Row 0 all +1, row 1 all −1, row 2 alternating: every rounded byte is ±127.
            let a: Vec<f32> = (0..m * k)
                .map(|x| match x / k {
                    0 => 1.0,
                    1 => -1.0,
                    _ => {
                        if x % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        }
                    }
                })
                .collect();
            let want = reference_of(QDot::Q8, format, m, n, k, &a, &w);
            let qw = QWeight::new(format, n, k, &w).unwrap();
            for level in levels() {
                let mut c = vec![0.0f32; m * n];
                q8::qgemm_q8(level, 1, m, &a, k, qw, &mut c, n).unwrap();
                let got: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{format:?} fill {fill:#x} {level:?}");
            }
        }
    }
}

/// The kernels' rounding of activations ([`q8::quantize_rows`]) at every level is the
/// reference's, block by block: ordinary values, exact ties (a block whose largest magnitude is
/// 127, so `1 / d` is 1 and `n + 0.5` must go to even), infinities without NaN (their products
/// with `1 / d = 0` are NaN and round to 0), denormals, signed zeros, and NaN blocks.
#[test]
fn activation_rounding_matches_the_reference() {
    let mut rng = Rng(41);
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
        f32::from_bits(0x807f_ffff),
        -0.0,
        0.0,
        f32::MAX,
        -f32::MIN_POSITIVE,
    ];
    for round in 0..400 {
        let blocks = 1 + round % 5;
        let k = blocks * 32;
        let a: Vec<f32> = (0..k)
            .map(|e| {
                let kind = (round + e / 32) % 6;
                let ordinary = ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
                match kind {
                    0 => ordinary,
                    1 if e % 32 == 0 => 127.0,
                    1 => (rng.next_u64() % 254) as f32 / 2.0 - 63.5,
                    2 if rng.chance(4) => *rng.pick(&specials),
                    2 => ordinary,
                    3 => *rng.pick(&specials[2..6]),
                    4 if rng.chance(8) => {
                        f32::from_bits(0x7fc0_0000 | rng.next_u64() as u32 & 0xff)
                    }
                    4 => ordinary,
                    _ => ordinary * 1e-30,
                }
            })
            .collect();
        let want: Vec<_> = a
            .chunks_exact(32)
            .map(tenet_reference::quant::quantize_activations)
            .collect();
        for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
            let got = q8::quantize_rows(level, 1, k, &a, k);
            for (b, w) in want.iter().enumerate() {
                let g = got.at(0, b);
                assert_eq!(
                    (g.d.to_bits(), g.q, g.sum),
                    (w.d.to_bits(), w.q, w.sum),
                    "{level:?} round {round} block {b}"
                );
            }
        }
    }
}

/// The rounding of activations on its own: ties go to even, values past ±127 (a rounded
/// `1 / d` a little large) clamp, NaN rounds to 0 and makes the block's scale NaN, an
/// all-zero block has scale 0.
#[test]
fn activations_round_as_defined() {
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = -2.5;
    let direct = tenet_reference::quant::quantize_activations(&x);
    assert_eq!(direct.d, 1.0);
    assert_eq!(&direct.q[..4], &[127, 0, 2, -2]);
    assert_eq!(direct.sum, 127);
    let mut c = [0.0f32; 1];
    // A Q8_0 weight of ones, scale 1: the dot product is the rounded row's sum times d.
    let mut w = vec![0x00, 0x3c];
    w.extend([1u8; 32]);
    let qw = QWeight::new(QuantFormat::Q8_0, 1, 32, &w).unwrap();
    q8::qgemm_q8(SimdLevel::Portable, 1, 1, &x, 32, qw, &mut c, 1).unwrap();
    assert_eq!(c[0], 127.0);
    let zeros = tenet_reference::quant::quantize_activations(&[0.0; 32]);
    assert_eq!((zeros.d, zeros.sum), (0.0, 0));
    let mut nan = [1.0f32; 32];
    nan[5] = f32::NAN;
    let n = tenet_reference::quant::quantize_activations(&nan);
    assert!(n.d.is_nan() && n.q.iter().all(|&q| q == 0));
}

#[test]
fn edges() {
    for format in QuantFormat::ALL {
        for (m, n, k) in [
            (1, 1, 32),
            (1, 16, 32),
            (1, 64, 64),
            (1, 65, 96),
            (1, 129, 576),
            (2, 33, 64),
            (3, 17, 32),
            (5, 70, 128),
            (16, 48, 64),
            (17, 31, 64),
            // Big enough to be split across threads (by weight bytes, or by work), with a
            // partial last tile.
            (1, 700, 576),
            (3, 1000, 320),
            (20, 260, 1024),
            // The GEMM path (several rows of A, a partial 48-column panel).
            (GEMM_MIN_ROWS, 50, 64),
            (GEMM_MIN_ROWS + 7, 97, 160),
        ] {
            for hostile in [false, true] {
                check(format, m, n, k, (m * 1000 + n * 10 + k) as u64, hostile);
            }
        }
    }
}

/// Hostile scales in every block: NaN, infinite and zero weights everywhere, and chains that
/// meet inf − inf, must still give the reference's NaNs (canonical) and infinities.
#[test]
fn all_hostile_scales() {
    for format in QuantFormat::ALL {
        let (m, n, k) = (3, 40, 64);
        for seed in 0..8u64 {
            let mut rng = Rng(seed);
            let mut w = blocks(&mut rng, format, n * k / 32, false);
            let specials = [0x7c00u16, 0xfc00, 0x7e01, 0x0001, 0x8000, 0x7bff, 0xfbff];
            for blk in w.chunks_mut(format.block_bytes()) {
                let s = *rng.pick(&specials);
                blk[..2].copy_from_slice(&s.to_le_bytes());
                if format == QuantFormat::Q4_1 {
                    let s = *rng.pick(&specials);
                    blk[2..4].copy_from_slice(&s.to_le_bytes());
                }
            }
            let a = activations(&mut rng, m * k, seed % 2 == 0);
            let want = reference(format, m, n, k, &a, &w);
            let qw = QWeight::new(format, n, k, &w).unwrap();
            for level in levels() {
                for threads in [1, 2, 3] {
                    let mut c = vec![0.0f32; m * n];
                    qgemm(level, threads, m, &a, k, qw, &mut c, n).unwrap();
                    let got: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        got, want,
                        "{format:?} {level:?} threads={threads} seed={seed}"
                    );
                }
            }
        }
    }
}

#[test]
fn empty_products_write_nothing() {
    for format in QuantFormat::ALL {
        for level in levels() {
            for threads in [1, 2, 3] {
                // n = 0: no weight rows, nothing to write.
                let w = QWeight::new(format, 0, 64, &[]).unwrap();
                let a = vec![1.0f32; 3 * 64];
                let mut c = vec![7.0f32; 4];
                qgemm(level, threads, 3, &a, 64, w, &mut c, 0).unwrap();
                assert_eq!(c, vec![7.0; 4]);
                // m = 0: no rows of A.
                let bytes = vec![0u8; 5 * 2 * format.block_bytes()];
                let w = QWeight::new(format, 5, 64, &bytes).unwrap();
                qgemm(level, threads, 0, &[], 64, w, &mut [], 5).unwrap();
                // k = 0: every chain is empty, +0.
                let w = QWeight::new(format, 5, 0, &[]).unwrap();
                let mut c = vec![7.0f32; 10];
                qgemm(level, threads, 2, &[], 0, w, &mut c, 5).unwrap();
                assert!(c.iter().all(|v| v.to_bits() == 0));
            }
        }
    }
}

#[test]
fn bad_extents_are_errors_not_panics() {
    let format = QuantFormat::Q8_0;
    let w = vec![0u8; 3 * 2 * 34];
    assert!(QWeight::new(format, 4, 64, &w).is_err());
    assert!(QWeight::new(format, 3, 48, &w).is_err());
    let qw = QWeight::new(format, 3, 64, &w).unwrap();
    let a = vec![0.0f32; 2 * 64];
    let mut c = vec![0.0f32; 6];
    for level in levels() {
        assert!(qgemm(level, 1, 2, &a[..127], 64, qw, &mut c, 3).is_err());
        assert!(qgemm(level, 1, 2, &a, 64, qw, &mut c[..5], 3).is_err());
        assert!(qgemm(level, 1, 2, &a, 64, qw, &mut c, 2).is_err());
        assert!(qgemm(level, 1, 2, &a, usize::MAX, qw, &mut c, 3).is_err());
        assert!(qgemm(level, 1, 2, &a, 64, qw, &mut c, 3).is_ok());
    }
    for level in SimdLevel::ALL.into_iter().filter(|l| !l.supported()) {
        assert!(qgemm(level, 1, 2, &a, 64, qw, &mut c, 3).is_err());
        let mut out = vec![0.0f32; 32];
        assert!(dequantize(level, format, &w[..34], &mut out).is_err());
    }
}

/// A stop function that says yes ends the product early, on either path.
#[test]
fn stopping() {
    let format = QuantFormat::Q4_1;
    let (n, k) = (4096, 256);
    let mut rng = Rng(3);
    let w = blocks(&mut rng, format, n * k / 32, false);
    let qw = QWeight::new(format, n, k, &w).unwrap();
    for m in [1, GEMM_MIN_ROWS] {
        let a = activations(&mut rng, m * k, false);
        let mut c = vec![0.0f32; m * n];
        for level in levels() {
            for threads in [1, 2] {
                let asked = std::sync::atomic::AtomicUsize::new(0);
                let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 1;
                let done = qgemm_polled(level, threads, m, &a, k, qw, &mut c, n, &stop).unwrap();
                assert!(!done, "m={m} {level:?} threads={threads}");
                let never = || false;
                let done = qgemm_polled(level, threads, m, &a, k, qw, &mut c, n, &never).unwrap();
                assert!(done);
            }
        }
    }
}

fn check_dequantize(format: QuantFormat, count: usize, seed: u64, hostile: bool) {
    let mut rng = Rng(seed);
    let w = blocks(&mut rng, format, count, hostile);
    let mut want = Vec::new();
    tenet_reference::quant::dequantize_into(ir(format), &w, &mut want);
    let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    for level in levels() {
        let mut out = vec![f32::from_bits(0x7f80_0001); count * 32];
        dequantize(level, format, &w, &mut out).unwrap();
        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            got, want,
            "{format:?} {level:?} {count} blocks, seed {seed}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn dequantize_matches_the_reference(
        format in prop::sample::select(QuantFormat::ALL.to_vec()),
        count in 0usize..40,
        seed in any::<u64>(),
        hostile in any::<bool>(),
    ) {
        check_dequantize(format, count, seed, hostile);
    }
}

/// Every scale bit pattern (all 65,536 f16 values as `d`, and as Q4_1's `m`) with every nibble
/// and byte value: the whole input space of a block's arithmetic.
#[test]
fn dequantize_every_scale() {
    for format in QuantFormat::ALL {
        let bb = format.block_bytes();
        let mut w = Vec::with_capacity(65536 * bb);
        for s in 0..=u16::MAX {
            let mut blk = vec![0u8; bb];
            blk[..2].copy_from_slice(&s.to_le_bytes());
            if format == QuantFormat::Q4_1 {
                // m: a rotating partner value, sometimes the same special.
                blk[2..4].copy_from_slice(&s.rotate_left(5).to_le_bytes());
            }
            let head = if format == QuantFormat::Q4_1 { 4 } else { 2 };
            for (i, b) in blk[head..].iter_mut().enumerate() {
                // Nibbles 0..15 low and 15..0 high; bytes covering -128..127 across blocks.
                *b = if format == QuantFormat::Q8_0 {
                    (i as u8).wrapping_mul(8).wrapping_add(s as u8)
                } else {
                    (i as u8) | (15 - i as u8) << 4
                };
            }
            w.extend_from_slice(&blk);
        }
        let mut want = Vec::new();
        tenet_reference::quant::dequantize_into(ir(format), &w, &mut want);
        for level in levels() {
            let mut out = vec![0.0f32; 65536 * 32];
            dequantize(level, format, &w, &mut out).unwrap();
            let same = out
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{format:?} {level:?}");
        }
    }
}
