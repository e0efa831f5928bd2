//! Ad-hoc GEMM timing for tuning (not part of the test suite): cargo run --release --example gemm_speed
use std::time::Instant;
use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm};
fn main() {
    for &n in &[1024usize, 2048] {
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 % 11) as f32) * 0.1).collect();
        let mut c = vec![0.0f32; n * n];
        for threads in [1, 2] {
            let mut times = vec![];
            for _ in 0..9 {
                let t = Instant::now();
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
                .unwrap();
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "n={n} threads={threads}: {:.1} GFLOP/s",
                2.0 * (n as f64).powi(3) / times[4] / 1e9
            );
        }
    }
    println!(
        "peak 2T: {:.0}",
        tenet_kernels::fma_peak_gflops(SimdLevel::Avx512, 2, 300)
    );
}
