//! The machine's own FMA peak, measured the way `tenet bench` reports ratios against it:
//! independent register-only fused multiply-add chains, no memory traffic.

use std::time::Instant;

use crate::SimdLevel;

/// GFLOP/s of `threads` threads each running FMA chains for about `millis` milliseconds at the
/// widest width `level` offers.
pub fn fma_peak_gflops(level: SimdLevel, threads: usize, millis: u64) -> f64 {
    let level = level.or_supported();
    let (lanes, accumulators, iters_per_ms) = match level {
        SimdLevel::Avx512 => (16, CHAINS, 100_000),
        SimdLevel::Avx2 => (8, AVX2_CHAINS, 100_000),
        SimdLevel::Portable => (1, CHAINS, 20_000),
    };
    let iters = iters_per_ms * millis as usize;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(move || std::hint::black_box(chains(level, iters)));
        }
    });
    let secs = start.elapsed().as_secs_f64();
    (threads.max(1) * iters * accumulators * lanes * 2) as f64 / secs / 1e9
}

/// GB/s of `threads` threads each summing its share of a buffer of `bytes` bytes, the best of
/// `reps` passes: the rate at which the machine streams data it only reads (model weights, in
/// a decoding step). The buffer is touched once before timing, so page faults are not counted.
pub fn read_bandwidth_gbs(threads: usize, bytes: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let data = vec![1.0f32; bytes / 4];
    let per = data.len().div_ceil(threads).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        std::thread::scope(|s| {
            for part in data.chunks(per) {
                s.spawn(move || std::hint::black_box(sum_lanes(part)));
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (data.len() * 4) as f64 / best / 1e9
}

/// A sum in 64 independent lanes, which the compiler vectorises: memory, not adds, sets the pace.
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 64];
    let mut chunks = x.chunks_exact(64);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Independent accumulators per thread: enough to cover FMA latency on two pipes.
const CHAINS: usize = 16;

/// The AVX2 loop's accumulators: AVX2 has 16 vector registers, and the chains and their two
/// constants must all fit. With 16 chains the compiler spilled and shuffled registers every
/// iteration and the probe read low (one core here: 87–90 GFLOP/s, 108–120 with 12 chains;
/// on another VM tenet's AVX2 matmul measured 1.1 of that "peak").
const AVX2_CHAINS: usize = 12;
const _: () = assert!(AVX2_CHAINS + 2 <= 16 && AVX2_CHAINS >= 8);

fn chains(level: SimdLevel, iters: usize) -> f32 {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level was downgraded to one this CPU supports.
        SimdLevel::Avx512 => unsafe { x86::avx512(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::avx2(iters) },
        _ => {
            let mut acc = [0.0f32; CHAINS];
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = std::hint::black_box(*x).mul_add(0.999_999, 1e-7);
                }
            }
            acc.iter().sum()
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{AVX2_CHAINS, CHAINS};

    #[target_feature(enable = "avx512f")]
    pub(super) fn avx512(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); CHAINS];
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().fold(0.0, |s, &x| s + _mm512_reduce_add_ps(x))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(0.0); AVX2_CHAINS];
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut out = [0.0f32; 8];
        let sum = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
        out.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_lane_and_the_tail() {
        let x: Vec<f32> = (0..200).map(|i| i as f32).collect();
        assert_eq!(super::sum_lanes(&x), (0..200).sum::<i32>() as f32);
        assert!(super::read_bandwidth_gbs(2, 1 << 20, 2) > 0.0);
    }
}
