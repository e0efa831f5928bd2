//! Ad-hoc GEMM timing for tuning (not part of the test suite): square products, fastest of
//! several runs, against this machine's FMA peak measured first.
//! `cargo run --release -p tenet-kernels --example gemm_speed [N ...]`
use std::time::Instant;
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm};
fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1024, 2048]
    } else {
        sizes
    };
    let peak2 = tenet_kernels::fma_peak_gflops(SimdLevel::Avx512, 2, 300);
    let peak1 = tenet_kernels::fma_peak_gflops(SimdLevel::Avx512, 1, 300);
    println!("peak 1t {peak1:.0} 2t {peak2:.0}");
    for &n in &sizes {
        let a: Vec<f32> = (0..n * n).map(|i| ((i % 17) as f32) * 0.01).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i % 13) as f32) * 0.01).collect();
        let mut c = vec![0f32; n * n];
        let reps = (4e10 / (n as f64).powi(3)).clamp(5.0, 200.0) as usize;
        for threads in [1usize, 2] {
            let mut times = vec![];
            for _ in 0..reps {
                let t = Instant::now();
                tenet_sys::parallel::on_workers(|| {
                    sgemm(
                        SimdLevel::Avx512,
                        threads,
                        n,
                        n,
                        n,
                        Strided::row_major(&a, n),
                        Strided::row_major(&b, n),
                        &mut c,
                        n,
                    )
                    .unwrap()
                });
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(|x, y| x.partial_cmp(y).unwrap());
            let med = times[0];
            let gf = 2.0 * (n as f64).powi(3) / med / 1e9;
            let peak = if threads == 1 { peak1 } else { peak2 };
            println!(
                "n={n} t={threads} {:.2} ms {gf:.0} GFLOP/s ratio {:.2}",
                med * 1e3,
                gf / peak
            );
        }
    }
}
