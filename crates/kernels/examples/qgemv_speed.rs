//! Ad-hoc timing of the quantised product for tuning (not part of the test suite): SmolLM2-135M's
//! decode shapes (30 layers of Q4_1 projections, the 49152 × 576 output projection in Q8_0 and
//! Q4_1) at m = 1, 4, 8 rows, 1 and 2 threads, each against the f32 GEMM on the same weights
//! dequantised beforehand (what the CPU backend ran before), in the same run. Every product
//! reads weights that are not in cache (30 distinct layers' copies, or enough copies of the
//! output projection to pass 64 MB), as a decode step does. Then whole decode steps' products
//! (all layers and the output projection, m = 1).
//!
//! `cargo run --release -p tenet-kernels --example qgemv_speed [reps]` (`TENET_SIMD` picks the
//! level).
use std::time::Instant;

use tenet_kernels::SimdLevel;
use tenet_kernels::gemm::{Strided, sgemm};
use tenet_kernels::qgemm::{QWeight, QuantFormat, dequantize, q8, qgemm};

/// A weight of `n` rows of `k / 32` blocks: ordinary f16 scales, random nibbles/bytes.
fn weight(format: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let bb = format.block_bytes();
    let mut out = vec![0u8; n * k / 32 * bb];
    for blk in out.chunks_mut(bb) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        // d and m: 2⁻⁸ … 2⁻¹, either sign.
        let scale = |r: u64| ((r & 1) << 15 | (7 + (r >> 1) % 8) << 10 | (r >> 5) & 0x3ff) as u16;
        blk[..2].copy_from_slice(&scale(next()).to_le_bytes());
        if format == QuantFormat::Q4_1 {
            blk[2..4].copy_from_slice(&scale(next()).to_le_bytes());
        }
    }
    out
}

/// The median and the fastest of some timings: the host's slow spells only add time, so the
/// fastest says what the code can do, the median what a run is likely to see.
fn median_best(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0])
}

struct Shape {
    name: &'static str,
    format: QuantFormat,
    n: usize,
    k: usize,
    copies: usize,
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(7);
    let level = SimdLevel::from_env().unwrap_or_else(|_| SimdLevel::detect());
    let bw1 = tenet_kernels::read_bandwidth_gbs(1, 256 << 20, 5);
    let bw2 = tenet_kernels::read_bandwidth_gbs(2, 256 << 20, 5);
    println!(
        "level {}, read bandwidth {bw1:.1} GB/s (1 thread), {bw2:.1} GB/s (2 threads)",
        level.name()
    );
    let layer = |name, n, k| Shape {
        name,
        format: QuantFormat::Q4_1,
        n,
        k,
        copies: 30,
    };
    let out = |name, format: QuantFormat| {
        let bytes = 49152 * 576 / 32 * format.block_bytes();
        Shape {
            name,
            format,
            n: 49152,
            k: 576,
            copies: (64usize << 20).div_ceil(bytes),
        }
    };
    // HOT=M: one 576 x 576 Q4_1 weight (207 KB, in L2) many times, both products, M rows of
    // A (HOT=1: one).
    if let Some(hot) = std::env::var_os("HOT") {
        let m: usize = hot
            .to_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1)
            .max(1);
        let w = weight(QuantFormat::Q4_1, 576, 576, 7);
        let x: Vec<f32> = (0..576 * m)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        let mut c = vec![0.0f32; 576 * m];
        let qw = QWeight::new(QuantFormat::Q4_1, 576, 576, &w).unwrap();
        for round in 0..3 {
            let t = Instant::now();
            for _ in 0..2000 {
                qgemm(level, 1, m, &x, 576, qw, &mut c, 576).unwrap();
            }
            let f = t.elapsed().as_secs_f64() / 2000.0;
            let t = Instant::now();
            for _ in 0..2000 {
                q8::qgemm_q8(level, 1, m, &x, 576, qw, &mut c, 576).unwrap();
            }
            let q = t.elapsed().as_secs_f64() / 2000.0;
            let cyc = |s: f64| s * 3.0e9 / (576.0 * 576.0 / 16.0);
            println!(
                "hot 576x576 Q4_1 m={m} round {round}: qmatmul {:.1} us ({:.2} cycles/16 weights at 3 GHz), qmatmul_q8 {:.1} us ({:.2})",
                f * 1e6,
                cyc(f),
                q * 1e6,
                cyc(q)
            );
        }
        return;
    }
    // STEP_ONLY=1 skips the per-shape table for the whole-step comparison.
    let per_shape = std::env::var_os("STEP_ONLY").is_none();
    let shapes = [
        layer("q, o 576x576", 576, 576),
        layer("k, v 192x576", 192, 576),
        layer("gate, up 1536x576", 1536, 576),
        layer("down 576x1536", 576, 1536),
        out("out Q8_0 49152x576", QuantFormat::Q8_0),
        out("out Q4_1 49152x576", QuantFormat::Q4_1),
    ];
    let shapes = if per_shape { &shapes[..] } else { &[] };
    let a: Vec<f32> = (0..8 * 1536)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    println!("ms: median (fastest) of {reps}; GB/s of weight bytes at the median; ratio: the f32");
    println!("GEMM's median time on the same weights dequantised, over the quantised product's");
    println!(
        "{:<22} {:>2} {:>2} {:>17} {:>6} {:>17} {:>6}",
        "shape", "m", "t", "ms", "GB/s", "f32 sgemm ms", "ratio"
    );
    for (si, s) in shapes.iter().enumerate() {
        let ws: Vec<Vec<u8>> = (0..s.copies)
            .map(|c| weight(s.format, s.n, s.k, (si * 100 + c) as u64))
            .collect();
        let wf: Vec<Vec<f32>> = ws
            .iter()
            .map(|w| {
                let mut f = vec![0.0f32; s.n * s.k];
                dequantize(level, s.format, w, &mut f).unwrap();
                f
            })
            .collect();
        let bytes = ws[0].len() as f64;
        let mut c = vec![0.0f32; 8 * s.n];
        for m in [1usize, 4, 8] {
            for threads in [1usize, 2] {
                let (mut tq, mut tf) = (Vec::new(), Vec::new());
                tenet_sys::parallel::on_workers(|| {
                    for _ in 0..reps {
                        let t = Instant::now();
                        for w in &ws {
                            let qw = QWeight::new(s.format, s.n, s.k, w).unwrap();
                            qgemm(level, threads, m, &a, s.k, qw, &mut c, s.n).unwrap();
                        }
                        tq.push(t.elapsed().as_secs_f64() / ws.len() as f64);
                        let t = Instant::now();
                        for w in &wf {
                            let b = Strided {
                                data: w,
                                rs: 1,
                                cs: s.k,
                            };
                            let a = Strided::row_major(&a[..m * s.k], s.k);
                            sgemm(level, threads, m, s.n, s.k, a, b, &mut c, s.n).unwrap();
                        }
                        tf.push(t.elapsed().as_secs_f64() / wf.len() as f64);
                    }
                });
                let ((q, qb), (f, fb)) = (median_best(tq), median_best(tf));
                println!(
                    "{:<22} {m:>2} {threads:>2} {:>8.4} ({:>6.4}) {:>6.1} {:>8.4} ({:>6.4}) {:>6.2}",
                    s.name,
                    q * 1e3,
                    qb * 1e3,
                    bytes / q / 1e9,
                    f * 1e3,
                    fb * 1e3,
                    f / q
                );
            }
        }
    }
    // A decode step's products (m = 1): per layer q, k, v, o, gate, up, down (each its own
    // weight), then the output projection.
    let mut all_q: Vec<(QuantFormat, usize, usize, Vec<u8>)> = Vec::new();
    for l in 0..30u64 {
        for (i, (n, k)) in [
            (576, 576),
            (192, 576),
            (192, 576),
            (576, 576),
            (1536, 576),
            (1536, 576),
            (576, 1536),
        ]
        .into_iter()
        .enumerate()
        {
            let w = weight(QuantFormat::Q4_1, n, k, 10_000 + l * 10 + i as u64);
            all_q.push((QuantFormat::Q4_1, n, k, w));
        }
    }
    let w = weight(QuantFormat::Q8_0, 49152, 576, 99);
    all_q.push((QuantFormat::Q8_0, 49152, 576, w));
    let step_bytes: usize = all_q.iter().map(|w| w.3.len()).sum();
    for m in [1usize, 8] {
        for threads in [1usize, 2] {
            // `qmatmul` (qgemm) and `qmatmul_q8` (q8::qgemm_q8) alternating, the same weights.
            let (mut times, mut times_q8) = (Vec::new(), Vec::new());
            let mut c = vec![0.0f32; 8 * 49152];
            tenet_sys::parallel::on_workers(|| {
                for _ in 0..(3 * reps).max(15) {
                    let t = Instant::now();
                    for (format, n, k, w) in &all_q {
                        let qw = QWeight::new(*format, *n, *k, w).unwrap();
                        qgemm(level, threads, m, &a, *k, qw, &mut c, *n).unwrap();
                    }
                    times.push(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    for (format, n, k, w) in &all_q {
                        let qw = QWeight::new(*format, *n, *k, w).unwrap();
                        q8::qgemm_q8(level, threads, m, &a, *k, qw, &mut c, *n).unwrap();
                    }
                    times_q8.push(t.elapsed().as_secs_f64());
                }
            });
            let ((t, best), (t8, best8)) = (median_best(times), median_best(times_q8));
            println!(
                "decode step's products (30 Q4_1 layers + Q8_0 output, {:.1} MB), m={m}, \
                 {threads} thread(s): qmatmul {:.2} ms (fastest {:.2}), {:.1} GB/s; \
                 qmatmul_q8 {:.2} ms (fastest {:.2}), {:.1} GB/s",
                step_bytes as f64 / 1e6,
                t * 1e3,
                best * 1e3,
                step_bytes as f64 / t / 1e9,
                t8 * 1e3,
                best8 * 1e3,
                step_bytes as f64 / t8 / 1e9
            );
        }
    }
}
