//! Depthwise convolution planes at every SIMD level against the chain written out plainly:
//! each output the fma chain, from +0, over its in-bounds taps in order, bit for bit — over
//! random geometry (strides, padding wider than the kernel, dilation, bands of rows starting
//! part way down, planes narrower than one vector) and values holding −0, infinities, NaN
//! and denormals, where a tap wrongly taken from the padding would change the bits.

use proptest::prelude::*;
use tenet_ir::testing::Rng;
use tenet_kernels::SimdLevel;
use tenet_kernels::depthwise::{DepthwisePlane, depthwise_plane};

/// The plane computed the obvious way.
fn plain(p: &DepthwisePlane, plane: &[f32], taps: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; p.oh * p.ow];
    for r in 0..p.oh {
        for c in 0..p.ow {
            let mut acc = 0.0f32;
            for i in 0..p.kh {
                for j in 0..p.kw {
                    let y = (p.row0 + r) * p.stride[0] + i * p.dilation[0];
                    let x = c * p.stride[1] + j * p.dilation[1];
                    if y < p.pad[0] || y - p.pad[0] >= p.h || x < p.pad[1] || x - p.pad[1] >= p.w {
                        continue;
                    }
                    let v = plane[(y - p.pad[0]) * p.w + x - p.pad[1]];
                    acc = v.mul_add(taps[i * p.kw + j], acc);
                }
            }
            out[r * p.ow + c] = acc;
        }
    }
    out
}

/// Bits, with every NaN the same (the caller makes NaNs canonical afterwards).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() })
        .collect()
}

fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    const SPECIAL: [f32; 6] = [-0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40];
    (0..n)
        .map(|_| {
            if rng.chance(10) {
                *rng.pick(&SPECIAL)
            } else {
                (rng.below(2001) as f32 - 1000.0) / 250.0
            }
        })
        .collect()
}

fn check(seed: u64) {
    let mut rng = Rng(seed);
    let u = |rng: &mut Rng, lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let (kh, kw) = (u(&mut rng, 1, 5), u(&mut rng, 1, 7));
    let (h, w) = (u(&mut rng, 1, 24), u(&mut rng, 1, 70));
    let stride = [u(&mut rng, 1, 3), u(&mut rng, 1, 3)];
    let dilation = [u(&mut rng, 1, 2), u(&mut rng, 1, 2)];
    let pad = [u(&mut rng, 0, kh + 1), u(&mut rng, 0, kw + 1)];
    let span = |size: usize, k: usize, s: usize, d: usize, pad: usize| {
        (size + 2 * pad)
            .checked_sub((k - 1) * d + 1)
            .map(|n| n / s + 1)
    };
    let (Some(full_oh), Some(ow)) = (
        span(h, kh, stride[0], dilation[0], pad[0]),
        span(w, kw, stride[1], dilation[1], pad[1]),
    ) else {
        return;
    };
    let row0 = u(&mut rng, 0, full_oh - 1);
    let oh = u(&mut rng, 1, full_oh - row0);
    let p = DepthwisePlane {
        h,
        w,
        kh,
        kw,
        row0,
        oh,
        ow,
        stride,
        pad,
        dilation,
    };
    let plane = values(&mut rng, h * w);
    let taps = values(&mut rng, kh * kw);
    let want = bits(&plain(&p, &plane, &taps));
    for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
        let mut got = vec![f32::NAN; oh * ow];
        depthwise_plane(level, &p, &plane, &taps, &mut got);
        assert_eq!(bits(&got), want, "{level:?} {p:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn depthwise_planes_keep_the_bits(seed in any::<u64>()) {
        check(seed);
    }
}

/// The shapes of a real detector (RapidOCR's), whole planes and bands.
#[test]
fn detector_shapes_keep_the_bits() {
    for (i, &(h, w, k, s)) in [
        (30, 40, 5, 1),
        (15, 20, 5, 1),
        (120, 160, 3, 1),
        (240, 320, 3, 2),
        (30, 40, 5, 2),
    ]
    .iter()
    .enumerate()
    {
        let pad = k / 2;
        let p = DepthwisePlane {
            h,
            w,
            kh: k,
            kw: k,
            row0: 0,
            oh: (h + 2 * pad - k) / s + 1,
            ow: (w + 2 * pad - k) / s + 1,
            stride: [s, s],
            pad: [pad, pad],
            dilation: [1, 1],
        };
        let mut rng = Rng(7 + i as u64);
        let plane = values(&mut rng, h * w);
        let taps = values(&mut rng, k * k);
        let want = bits(&plain(&p, &plane, &taps));
        for level in SimdLevel::ALL.into_iter().filter(|l| l.supported()) {
            let mut got = vec![f32::NAN; p.oh * p.ow];
            depthwise_plane(level, &p, &plane, &taps, &mut got);
            assert_eq!(bits(&got), want, "{level:?} {p:?}");
        }
    }
}
