//! The machine's own FMA peak, measured the way `tenet bench` reports ratios against it:
//! independent register-only fused multiply-add chains, no memory traffic.

use std::time::Instant;

use crate::SimdLevel;

/// GFLOP/s of `threads` threads each running FMA chains for about `millis` milliseconds at the
/// widest width `level` offers.
pub fn fma_peak_gflops(level: SimdLevel, threads: usize, millis: u64) -> f64 {
    let level = level.or_supported();
    let (lanes, iters_per_ms) = match level {
        SimdLevel::Avx512 => (16, 100_000),
        SimdLevel::Avx2 => (8, 100_000),
        SimdLevel::Portable => (1, 20_000),
    };
    let iters = iters_per_ms * millis as usize;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(move || std::hint::black_box(chains(level, iters)));
        }
    });
    let secs = start.elapsed().as_secs_f64();
    (threads.max(1) * iters * CHAINS * lanes * 2) as f64 / secs / 1e9
}

/// Independent accumulators per thread: enough to cover FMA latency on two pipes.
const CHAINS: usize = 16;

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

    use super::CHAINS;

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
        let mut acc = [_mm256_set1_ps(0.0); CHAINS];
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
