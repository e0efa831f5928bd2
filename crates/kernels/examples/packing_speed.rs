//! Ad-hoc timing of the GEMM against its packing-B form on convolution-like shapes (not part of
//! the test suite): `cargo run --release -p tenet-kernels --example packing_speed [MxNxK ...]`.
use std::time::Instant;
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm, sgemm_packing_b};
fn main() {
    let shapes: Vec<[usize; 3]> = std::env::args()
        .skip(1)
        .map(|s| {
            let v: Vec<usize> = s.split('x').map(|d| d.parse().unwrap()).collect();
            [v[0], v[1], v[2]]
        })
        .collect();
    let level = SimdLevel::detect();
    let peak2 = tenet_kernels::fma_peak_gflops(level, 2, 300);
    println!("peak 2t {peak2:.0} GFLOP/s");
    for [m, n, k] in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32) * 0.01).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i % 13) as f32) * 0.01).collect();
        let mut c = vec![0f32; m * n];
        let pack = |first: usize, cols: usize, nr: usize, dst: &mut [f32]| {
            for p in 0..k {
                dst[p * nr..p * nr + cols].copy_from_slice(&b[p * n + first..][..cols]);
            }
        };
        let flops = 2.0 * (m * n * k) as f64;
        for threads in [1usize, 2] {
            let mut best = [f64::MAX; 2];
            for _ in 0..20 {
                tenet_sys::parallel::on_workers(|| {
                    let t = Instant::now();
                    sgemm(
                        level,
                        threads,
                        m,
                        n,
                        k,
                        Strided::row_major(&a, k),
                        Strided::row_major(&b, n),
                        &mut c,
                        n,
                    )
                    .unwrap();
                    best[0] = best[0].min(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    sgemm_packing_b(
                        level,
                        threads,
                        m,
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
                });
            }
            println!(
                "{m}x{n}x{k} {threads}t: sgemm {:.3} ms ({:.0} GF/s), packing {:.3} ms ({:.0} GF/s)",
                best[0] * 1e3,
                flops / best[0] / 1e9,
                best[1] * 1e3,
                flops / best[1] / 1e9
            );
        }
    }
}
