//! Ad-hoc timing of the in-place convolution product (`sgemm_offsets`) against the packing-B
//! form on a 3×3 stride-1 convolution's interior (not part of the test suite): `cargo run
//! --release -p tenet-kernels --example offsets_speed [CIxCOxHxW ...]` (default 96x24x120x160,
//! the RapidOCR detector's slowest layers); best of 20 runs each, alternated.
use std::time::Instant;
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{OffsetPanel, Strided, sgemm_offsets, sgemm_packing_b};

fn main() {
    let mut shapes: Vec<[usize; 4]> = std::env::args()
        .skip(1)
        .map(|s| {
            let v: Vec<usize> = s.split('x').map(|d| d.parse().unwrap()).collect();
            [v[0], v[1], v[2], v[3]]
        })
        .collect();
    if shapes.is_empty() {
        shapes.push([96, 24, 120, 160]);
    }
    let level = SimdLevel::detect();
    let peak2 = tenet_kernels::fma_peak_gflops(level, 2, 300);
    println!("{level:?}, peak at 2 threads {peak2:.0} GFLOP/s");
    for [ci, co, h, w] in shapes {
        let x: Vec<f32> = (0..ci * h * w).map(|i| ((i % 23) as f32) * 0.01).collect();
        let k = ci * 9;
        let a: Vec<f32> = (0..co * k).map(|i| ((i % 17) as f32) * 0.01).collect();
        let offsets: Vec<usize> = (0..k)
            .map(|p| (p / 9) * h * w + (p % 9 / 3) * w + p % 3)
            .collect();
        // The interior: output rows 1..h-1, columns 1..w-1, one group of panels per row.
        let nw = w - 2;
        let groups: Vec<Vec<OffsetPanel>> = (0..h - 2)
            .map(|r| {
                let mut panels = Vec::new();
                let mut col = 0;
                while col + 48 <= nw {
                    panels.push(OffsetPanel {
                        start: r * w + col,
                        c_col: r * nw + col,
                        width: 48,
                    });
                    col += 48;
                }
                while col < nw {
                    let at = col.min(nw - 16);
                    panels.push(OffsetPanel {
                        start: r * w + at,
                        c_col: r * nw + at,
                        width: 16,
                    });
                    col += 16;
                }
                panels
            })
            .collect();
        let n = (h - 2) * nw;
        let pack = |first: usize, cols: usize, nr: usize, dst: &mut [f32]| {
            for (p, &off) in offsets.iter().enumerate() {
                for j in 0..cols {
                    let (r, c) = ((first + j) / nw, (first + j) % nw);
                    dst[p * nr + j] = x[off + r * w + c];
                }
            }
        };
        let mut c = vec![0f32; co * n];
        let flops = 2.0 * (co * n * k) as f64;
        for threads in [1usize, 2] {
            let mut best = [f64::MAX; 2];
            for rep in 0..20 {
                tenet_sys::parallel::on_workers(|| {
                    let t = Instant::now();
                    let done = sgemm_offsets(
                        level,
                        threads,
                        co,
                        k,
                        Strided::row_major(&a, k),
                        &x,
                        &offsets,
                        &groups,
                        &mut c,
                        n,
                        None,
                        None,
                        &|| false,
                    )
                    .unwrap();
                    assert!(done, "no in-place kernel at {level:?}");
                    best[0] = best[0].min(t.elapsed().as_secs_f64());
                    if rep < 3 {
                        let t = Instant::now();
                        sgemm_packing_b(
                            level,
                            threads,
                            co,
                            n,
                            k,
                            Strided::row_major(&a, k),
                            &pack,
                            &|| false,
                            &mut c,
                            n,
                            None,
                        )
                        .unwrap();
                        best[1] = best[1].min(t.elapsed().as_secs_f64());
                    }
                });
            }
            println!(
                "{ci}->{co} {h}x{w} {threads}t: in place {:.3} ms ({:.0} GF/s), packing {:.3} ms ({:.0} GF/s)",
                best[0] * 1e3,
                flops / best[0] / 1e9,
                best[1] * 1e3,
                flops / best[1] / 1e9
            );
        }
    }
}
