//! The GEMM against the reference interpreter: bit for bit, at every SIMD level and thread
//! count, over random shapes (including empty ones and k spanning several blocks) and values
//! (including NaN, infinities, signed zeros and denormals), with strided operands.

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, TensorType};
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm, sgemm_packing_b};

fn reference(m: u64, n: u64, k: u64, a: &HostTensor, b: &HostTensor) -> Vec<u32> {
    let g = GraphBuilder::new();
    let (x, y) = (
        g.input("a", DType::F32, &[m, k]),
        g.input("b", DType::F32, &[k, n]),
    );
    let graph = g.finish(&[("c", &x.matmul(&y))]).unwrap();
    let inputs = HashMap::from([("a".to_string(), a.clone()), ("b".to_string(), b.clone())]);
    let out = tenet_reference::run(&graph, &inputs, &NoWeights, 0).unwrap();
    out[0].1.to_f32_vec().iter().map(|v| v.to_bits()).collect()
}

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| l.supported())
        .collect()
}

/// Finite values with full mantissas. With a fifth of the values special, as `random_tensor`
/// makes them, nearly every dot product over more than a few steps is NaN or infinite, and a
/// kernel that summed in the wrong order would still match.
fn finite_tensor(rng: &mut Rng, rows: usize, cols: usize) -> HostTensor {
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0)
        .collect();
    HostTensor::from_f32(&[rows as u64, cols as u64], &values).unwrap()
}

fn check(m: usize, n: usize, k: usize, seed: u64) {
    let mut rng = Rng(seed);
    let specials = (
        random_tensor(&mut rng, &TensorType::new(DType::F32, [m as u64, k as u64])),
        random_tensor(&mut rng, &TensorType::new(DType::F32, [k as u64, n as u64])),
    );
    let finite = (finite_tensor(&mut rng, m, k), finite_tensor(&mut rng, k, n));
    for (a, b) in [specials, finite] {
        check_values(m, n, k, &a, &b);
    }
}

fn check_values(m: usize, n: usize, k: usize, a: &HostTensor, b: &HostTensor) {
    let want = reference(m as u64, n as u64, k as u64, a, b);
    let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
    // B also as a column-major copy, to exercise strided packing.
    let mut bt = vec![0.0f32; k * n];
    for p in 0..k {
        for j in 0..n {
            bt[j * k + p] = bv[p * n + j];
        }
    }
    // A also with rows 5 apart beyond their length (a view into a wider tensor, read in place
    // by the kernels that can) and column-major (packed from strided columns).
    let a_padded: Vec<f32> = (0..m * (k + 5))
        .map(|x| {
            let (i, p) = (x / (k + 5), x % (k + 5));
            if p < k { av[i * k + p] } else { f32::NAN }
        })
        .collect();
    let mut at = vec![0.0f32; m * k];
    for i in 0..m {
        for p in 0..k {
            at[p * m + i] = av[i * k + p];
        }
    }
    let a_layouts = [
        Strided::row_major(&av, k),
        Strided {
            data: &a_padded,
            rs: k + 5,
            cs: 1,
        },
        Strided {
            data: &at,
            rs: 1,
            cs: m,
        },
    ];
    for level in levels() {
        for (threads, a) in [1, 2, 3]
            .into_iter()
            .flat_map(|t| a_layouts.map(|a| (t, a)))
        {
            for transposed in [false, true] {
                let bs = if transposed {
                    Strided {
                        data: &bt,
                        rs: 1,
                        cs: k,
                    }
                } else {
                    Strided::row_major(&bv, n)
                };
                // C with a wider row stride and garbage in it: every element must be written.
                let c_rs = n + 3;
                let mut c = vec![f32::from_bits(0x7f80_0001); m.max(1) * c_rs];
                sgemm(level, threads, m, n, k, a, bs, &mut c, c_rs).unwrap();
                let got: Vec<u32> = (0..m)
                    .flat_map(|i| c[i * c_rs..i * c_rs + n].to_vec())
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(
                    got,
                    want,
                    "{level:?} threads={threads} a={:?} transposed={transposed} m={m} n={n} k={k}",
                    (a.rs, a.cs)
                );
            }
            // B written panel by panel by a callback (a convolution's im2col).
            let pack = |first: usize, cols: usize, nr: usize, dst: &mut [f32]| {
                assert!(cols <= nr && first + cols <= n, "panel inside B");
                for p in 0..k {
                    dst[p * nr..p * nr + cols].copy_from_slice(&bv[p * n + first..][..cols]);
                }
            };
            let c_rs = n + 3;
            let mut c = vec![f32::from_bits(0x7f80_0001); m.max(1) * c_rs];
            // Every finished part of a row is handed over once: count what it sees, and mark
            // it (the bits are checked after undoing the mark).
            let seen = std::sync::Mutex::new(vec![0u8; m * n]);
            let then = |i: usize, first: usize, values: &mut [f32]| {
                let mut seen = seen.lock().unwrap();
                for (j, v) in values.iter_mut().enumerate() {
                    seen[i * n + first + j] += 1;
                    *v = -*v;
                }
            };
            sgemm_packing_b(
                level,
                threads,
                m,
                n,
                k,
                a,
                &pack,
                &|| false,
                &mut c,
                c_rs,
                Some(&then),
            )
            .unwrap();
            assert!(seen.into_inner().unwrap().iter().all(|&s| s == 1));
            let got: Vec<u32> = (0..m)
                .flat_map(|i| c[i * c_rs..i * c_rs + n].to_vec())
                .map(|v| (-v).to_bits())
                .collect();
            assert_eq!(
                got,
                want,
                "packing B: {level:?} threads={threads} a={:?} m={m} n={n} k={k}",
                (a.rs, a.cs)
            );
        }
    }
}

#[test]
fn edges_and_blocks() {
    for (m, n, k) in [
        (1, 1, 1),
        (0, 5, 3),
        (5, 0, 3),
        (4, 4, 0),
        (13, 33, 7),
        (25, 70, 300),
        (12, 32, 256),
        (37, 65, 513),
        // More rows than one block of C the driver keeps in L2 (96 at AVX-512, 60 at AVX2).
        (100, 40, 20),
        // Two full k-blocks at AVX2 (512) and a tail of 6 steps, a partial block of rows.
        (70, 40, 1030),
        // k long enough that B is packed in several chunks of columns (24 MiB of packed B
        // is 314 columns at k = 20000).
        (5, 600, 20000),
        // A few rows (decoding): column blocks and 16-step blocks with tails, several parts.
        (1, 600, 37),
        (2, 513, 16),
        (3, 17, 15),
        (4, 129, 64),
        (1, 1, 577),
    ] {
        check(m, n, k, (m * 1000 + n * 10 + k) as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_shapes(m in 0usize..40, n in 0usize..80, k in 0usize..600, seed in any::<u64>()) {
        check(m, n, k, seed);
    }
}

#[test]
fn rejects_bad_extents_and_levels() {
    let a = vec![0.0f32; 6];
    let mut c = vec![0.0f32; 4];
    let e = sgemm(
        SimdLevel::Portable,
        1,
        2,
        2,
        3,
        Strided::row_major(&a, 3),
        Strided::row_major(&a[..5], 2),
        &mut c,
        2,
    );
    assert!(e.unwrap_err().to_string().contains("B needs at least 6"));
    let e = sgemm(
        SimdLevel::Portable,
        1,
        2,
        2,
        3,
        Strided::row_major(&a, 3),
        Strided::row_major(&a, 2),
        &mut c,
        1,
    );
    assert!(e.is_err());
}

#[test]
fn epilogues_see_every_finished_row_once() {
    use std::sync::Mutex;
    use tenet_kernels::gemm::sgemm_then;
    // Shapes for the few-row path, one chunk of columns, and several chunks (k = 12000 packs
    // 524 columns of B at a time), with a row stride wider than n.
    for (m, n, k) in [
        (3, 40, 17),
        (0, 5, 5),
        (70, 130, 0),
        (200, 300, 40),
        (13, 1100, 12000),
    ] {
        let mut rng = Rng(m as u64 * 31 + n as u64);
        let (a, b) = (finite_tensor(&mut rng, m, k), finite_tensor(&mut rng, k, n));
        let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
        let c_rs = n + 3;
        for level in levels() {
            // More threads than cores: the late owners' rows are mostly stolen.
            for threads in [1, 2, 3, 7] {
                let (sa, sb) = (Strided::row_major(&av, k), Strided::row_major(&bv, n));
                let mut plain = vec![0.0f32; m * c_rs];
                sgemm(level, threads, m, n, k, sa, sb, &mut plain, c_rs).unwrap();
                // The epilogue adds its row's index to every value and counts the rows.
                let seen = Mutex::new(vec![0u32; m]);
                let add_row = |first: usize, rows: &mut [f32]| {
                    assert!(
                        rows.len() % c_rs == n || n == 0,
                        "whole rows: {}",
                        rows.len()
                    );
                    for (i, row) in rows.chunks_mut(c_rs).enumerate() {
                        row[..n].iter_mut().for_each(|v| *v += (first + i) as f32);
                        seen.lock().unwrap()[first + i] += 1;
                    }
                };
                let mut then = vec![0.0f32; m * c_rs];
                sgemm_then(
                    level,
                    threads,
                    m,
                    n,
                    k,
                    sa,
                    sb,
                    &mut then,
                    c_rs,
                    Some(&add_row),
                )
                .unwrap();
                let counts = seen.into_inner().unwrap();
                let what = format!("{m}×{n}×{k} {} {threads} threads", level.name());
                assert!(
                    counts.iter().all(|&c| c == 1),
                    "{what}: rows seen {counts:?}"
                );
                for i in 0..m {
                    for j in 0..n {
                        let want = plain[i * c_rs + j] + i as f32;
                        let got = then[i * c_rs + j];
                        assert_eq!(got.to_bits(), want.to_bits(), "{what}: C[{i}, {j}]");
                    }
                }
            }
        }
    }
}

/// Products reading B in place through a table of offsets (a convolution's taps): the same
/// bits as the product over B gathered out, for 48- and 16-column panels (overlapping ones
/// too), rows not a multiple of the tile's, and depths past one k-block; with a bias, the
/// product's value plus the row's bias, made canonical.
#[test]
fn offsets_products_keep_the_bits() {
    use tenet_kernels::gemm::{GroupEpilogue, OffsetPanel, sgemm_offsets};
    for (case, &(m, k, width)) in [(24, 27, 70), (13, 1100, 64), (5, 300, 33), (8, 9, 16)]
        .iter()
        .enumerate()
    {
        let mut rng = Rng(case as u64 + 7);
        let x: Vec<f32> = finite_tensor(&mut rng, 1, width * (k + 2)).to_f32_vec();
        let a = finite_tensor(&mut rng, m, k).to_f32_vec();
        // Tap p reads `width`-wide rows of x, at a stride that makes taps overlap.
        let offsets: Vec<usize> = (0..k).map(|p| p * width / 2 + p % 3).collect();
        let mut panels = Vec::new();
        let mut col = 0;
        while col + 48 <= width {
            panels.push(OffsetPanel {
                start: col,
                c_col: col,
                width: 48,
            });
            col += 48;
        }
        while col < width {
            let at = col.min(width - 16);
            panels.push(OffsetPanel {
                start: at,
                c_col: at,
                width: 16,
            });
            col += 16;
        }
        // The gathered B, and the ordinary product over it.
        let mut b = vec![0.0f32; k * width];
        for p in 0..k {
            b[p * width..(p + 1) * width].copy_from_slice(&x[offsets[p]..offsets[p] + width]);
        }
        let mut want = vec![0.0f32; m * width];
        sgemm(
            SimdLevel::Portable,
            1,
            m,
            width,
            k,
            Strided::row_major(&a, k),
            Strided::row_major(&b, width),
            &mut want,
            width,
        )
        .unwrap();
        // A bias with the values where a wrong order or a missed canonicalisation shows.
        let bias: Vec<f32> = (0..m)
            .map(|i| [0.5, -0.0, f32::INFINITY, f32::NAN, -3.25][i % 5])
            .collect();
        let with_bias: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(at, &v)| {
                let s = v + bias[at / width];
                if s.is_nan() {
                    f32::from_bits(0x7fc0_0000)
                } else {
                    s
                }
            })
            .collect();
        // An epilogue whose result shows a misplaced or repeated call: each value doubled
        // plus its own index in C.
        let epilogue = |i: usize, col: usize, values: &mut [f32]| {
            for (j, v) in values.iter_mut().enumerate() {
                *v = *v * 2.0 + (i * width + col + j) as f32;
            }
        };
        let after = |c: &[f32]| -> Vec<f32> {
            let mut c = c.to_vec();
            for (i, row) in c.chunks_mut(width).enumerate() {
                epilogue(i, 0, row);
            }
            c
        };
        for level in levels() {
            for (threads, biased, then) in [
                (1, false, false),
                (2, false, false),
                (1, true, false),
                (2, true, false),
                (1, false, true),
                (2, true, true),
            ] {
                let mut c = vec![f32::NAN; m * width];
                let done = sgemm_offsets(
                    level,
                    threads,
                    m,
                    k,
                    Strided::row_major(&a, k),
                    &x,
                    &offsets,
                    std::slice::from_ref(&panels),
                    &mut c,
                    width,
                    biased.then_some(&bias[..]),
                    // The group's span: its panels' columns, all of C's row.
                    then.then_some(GroupEpilogue {
                        spans: &[(0, width)],
                        f: &epilogue,
                    }),
                    &|| false,
                )
                .unwrap();
                assert_eq!(
                    done,
                    matches!(level, SimdLevel::Avx512 | SimdLevel::Avx2),
                    "{level:?}"
                );
                if done {
                    let want = if biased { &with_bias } else { &want };
                    let want = if then { after(want) } else { want.clone() };
                    let same = c.iter().zip(&want).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(
                        same,
                        "{level:?} threads={threads} bias={biased} epilogue={then} m={m} k={k} \
                         width={width}"
                    );
                }
            }
        }
        // A panel reaching past x is refused before anything runs.
        let too_far = [OffsetPanel {
            start: x.len(),
            c_col: 0,
            width: 16,
        }];
        let mut c = vec![0.0f32; m * width];
        for level in [SimdLevel::Avx512, SimdLevel::Avx2] {
            if !level.supported() {
                continue;
            }
            assert!(
                sgemm_offsets(
                    level,
                    1,
                    m,
                    k,
                    Strided::row_major(&a, k),
                    &x,
                    &offsets,
                    &[too_far.to_vec()],
                    &mut c,
                    width,
                    None,
                    None,
                    &|| false,
                )
                .is_err()
            );
        }
    }
}
