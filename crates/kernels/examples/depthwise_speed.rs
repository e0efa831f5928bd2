//! Ad-hoc timing of one depthwise plane (not part of the test suite), fastest of many runs:
//! `cargo run --release -p tenet-kernels --example depthwise_speed H W K STRIDE`.
use std::time::Instant;
use tenet_kernels::SimdLevel;
use tenet_kernels::depthwise::{DepthwisePlane, depthwise_plane};
fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let (h, w, k, s) = (a[0], a[1], a[2], a[3]);
    let pad = k / 2;
    let (oh, ow) = ((h + 2 * pad - k) / s + 1, (w + 2 * pad - k) / s + 1);
    let plane: Vec<f32> = (0..h * w).map(|i| (i % 7) as f32 * 0.1).collect();
    let taps: Vec<f32> = (0..k * k).map(|i| i as f32 * 0.01).collect();
    let mut out = vec![0f32; oh * ow];
    let p = DepthwisePlane {
        h,
        w,
        kh: k,
        kw: k,
        row0: 0,
        oh,
        ow,
        stride: [s, s],
        pad: [pad, pad],
        dilation: [1, 1],
    };
    let mut best = f64::MAX;
    for _ in 0..5000 {
        let t = Instant::now();
        depthwise_plane(SimdLevel::detect(), &p, &plane, &taps, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let flops = 2.0 * (oh * ow * k * k) as f64;
    println!(
        "{h}x{w} k{k} s{s}: {:.1} µs, {:.1} GF/s",
        best * 1e6,
        flops / best / 1e9
    );
}
