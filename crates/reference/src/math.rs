//! The project's own transcendental functions, built only from IEEE-754 basic operations
//! (+, −, ×, ÷, fused multiply-add, square root, and exact bit manipulation), never the
//! platform's libm. Their code is their definition: the SIMD kernels evaluate the same
//! operations in the same order and so produce the same bits on every machine.
//!
//! Every function is branch-light so that a SIMD loop can follow it with selects. Polynomial
//! coefficients are Taylor coefficients or least-squares fits made for this project (the fitting
//! script's method is described in docs/OPS.md); errors against float64 are tested in
//! `tests/math.rs` and documented in docs/OPS.md.

/// The canonical quiet NaN every computing op produces.
pub const NAN: f32 = f32::from_bits(0x7fc0_0000);

/// `v`, or [`NAN`] if `v` is any NaN: how computing ops store their results (docs/OPS.md).
#[inline(always)]
pub fn canonical(v: f32) -> f32 {
    if v.is_nan() { NAN } else { v }
}

pub const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `k * LN2_HI` is exact for |k| < 2^8.
pub const LN2_HI: f32 = f32::from_bits(0x3f31_7180); // 0.69313812 (low bits zero)
pub const LN2_LO: f32 = f32::from_bits(0x3717_f7d1); // 9.058e-6 = ln 2 − LN2_HI
/// Adding and subtracting 1.5 × 2^23 rounds an f32 of magnitude below 2^22 to an integer,
/// ties to even.
pub const ROUND_SHIFT: f32 = 12_582_912.0;

fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// 2^k for −254 ≤ k ≤ 254, as two normal factors whose product is applied in two steps, so that
/// `x * s1 * s2` rounds once even when the result is subnormal or overflows.
fn pow2_split(k: i32) -> (f32, f32) {
    let k1 = k >> 1;
    let k2 = k - k1;
    (
        f32::from_bits(((k1 + 127) as u32) << 23),
        f32::from_bits(((k2 + 127) as u32) << 23),
    )
}

/// Input range of `exp` before reduction: below it the result is 0, above it infinity.
pub const EXP_CLAMP: (f32, f32) = (-104.0, 89.0);

/// Taylor coefficients of e^r in Horner order (1/7!, 1/6!, …, 1/1!, 1/0!).
pub const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// e^x.
///
/// `k = round(x·log2 e)`; `r = x − k·ln2` by Cody–Waite with fma, `|r| ≤ 0.35`; `e^r` by its
/// Taylor polynomial to degree 7 (Horner, fma); scaled by 2^k in two exact steps.
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return NAN;
    }
    let xc = x.clamp(EXP_CLAMP.0, EXP_CLAMP.1);
    let k = (xc * LOG2E + ROUND_SHIFT) - ROUND_SHIFT;
    let r = fma(k, -LN2_HI, xc);
    let r = fma(k, -LN2_LO, r);
    let mut p = EXP_TAYLOR[0];
    for &c in &EXP_TAYLOR[1..] {
        p = fma(p, r, c);
    }
    let (s1, s2) = pow2_split(k as i32);
    p * s1 * s2
}

/// Natural logarithm.
///
/// `x = m·2^e` with `m ∈ [√½, √2)`; `f = m − 1`, `s = f/(2+f)`; `log(1+f) = 2·atanh(s)`
/// evaluated as `f − (f²/2 − s·(f²/2 + R))` with `R` the atanh series in `s²` to degree 4; then
/// `e·ln2` added in two parts.
pub fn log(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    // Subnormals: scale into the normal range first.
    let (x, e_adj) = if x < f32::MIN_POSITIVE {
        (x * 8_388_608.0, -23)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32) - 127 + e_adj;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut r = 2.0 / 9.0;
    r = fma(r, z, 2.0 / 7.0);
    r = fma(r, z, 2.0 / 5.0);
    r = fma(r, z, 2.0 / 3.0);
    r *= z;
    let hfsq = 0.5 * f * f;
    let ef = e as f32;
    (((s * (hfsq + r) + ef * LN2_LO) - hfsq) + f) + ef * LN2_HI
}

/// π/2 in three parts for Cody–Waite reduction with fma.
const PIO2_1: f32 = f32::from_bits(0x3fc9_0fdb); // f32(π/2)
const PIO2_2: f32 = f32::from_bits(0xb33b_bd2e); // f32(π/2 − PIO2_1)
const PIO2_3: f32 = f32::from_bits(0xa6f7_2ced); // f32(π/2 − PIO2_1 − PIO2_2)
const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;

/// Reduce `x` to `r ∈ [−π/4, π/4]` and the quadrant `q ∈ 0..4` with `x ≈ q·π/2 + r`.
/// Accurate for |x| up to about 10^5; beyond that still deterministic, no longer accurate.
fn reduce_quadrant(x: f32) -> (f32, u32) {
    let t = x * TWO_OVER_PI;
    let j = if t.abs() < 4_194_304.0 {
        (t + ROUND_SHIFT) - ROUND_SHIFT
    } else {
        t
    };
    let r = fma(-j, PIO2_1, x);
    let r = fma(-j, PIO2_2, r);
    let r = fma(-j, PIO2_3, r);
    // j mod 4, exactly: j is an integer-valued f32.
    let q = j - 4.0 * (j * 0.25).floor();
    (r, q as u32)
}

/// Below this, sin x rounds to x and cos x to 1.
const TINY: f32 = 1.0 / 4096.0;

/// sin on [−π/4, π/4]: Taylor to degree 9.
fn sin_kernel(r: f32) -> f32 {
    let z = r * r;
    let mut p = 1.0 / 362_880.0;
    p = fma(p, z, -1.0 / 5040.0);
    p = fma(p, z, 1.0 / 120.0);
    p = fma(p, z, -1.0 / 6.0);
    fma(r * z, p, r)
}

/// cos on [−π/4, π/4]: Taylor to degree 10, with `1 − z/2` split to keep its low bits.
fn cos_kernel(r: f32) -> f32 {
    let z = r * r;
    let mut p = -1.0 / 3_628_800.0;
    p = fma(p, z, 1.0 / 40_320.0);
    p = fma(p, z, -1.0 / 720.0);
    p = fma(p, z, 1.0 / 24.0);
    let hz = 0.5 * z;
    let w = 1.0 - hz;
    w + (((1.0 - w) - hz) + z * z * p)
}

/// Sine. Quadrant reduction, then the sin or cos kernel with a sign.
pub fn sin(x: f32) -> f32 {
    if !x.is_finite() {
        return NAN;
    }
    // sin x rounds to x below 2^-12 (and this keeps the sign of −0).
    if x.abs() < TINY {
        return x;
    }
    let (r, q) = reduce_quadrant(x);
    match q {
        0 => sin_kernel(r),
        1 => cos_kernel(r),
        2 => -sin_kernel(r),
        _ => -cos_kernel(r),
    }
}

/// Cosine. Quadrant reduction, then the cos or sin kernel with a sign.
pub fn cos(x: f32) -> f32 {
    if !x.is_finite() {
        return NAN;
    }
    if x.abs() < TINY {
        return 1.0;
    }
    let (r, q) = reduce_quadrant(x);
    match q {
        0 => cos_kernel(r),
        1 => -sin_kernel(r),
        2 => -cos_kernel(r),
        _ => sin_kernel(r),
    }
}

/// tanh(x) − x over x³, fitted in x² on [0, 0.55].
const TANH_P: [f32; 5] = [
    -0.333_333_2,
    0.133_326_17,
    -0.053_855_125,
    0.021_082_072,
    -0.006_287_678_6,
];

/// Hyperbolic tangent: `x + x³·P(x²)` below 0.55; `1 − 2/(e^{2|x|} + 1)` with the sign of `x`
/// up to 9.01; ±1 beyond.
pub fn tanh(x: f32) -> f32 {
    if x.is_nan() {
        return NAN;
    }
    let a = x.abs();
    if a < 0.55 {
        let z = x * x;
        let mut p = TANH_P[4];
        for &c in TANH_P[..4].iter().rev() {
            p = fma(p, z, c);
        }
        return fma(x * z, p, x);
    }
    let t = if a > 9.01 {
        1.0
    } else {
        1.0 - 2.0 / (exp(2.0 * a) + 1.0)
    };
    t.copysign(x)
}

/// erf(x)/x − 1, fitted in x² on [0, 1] (Lawson-weighted least squares for relative error).
pub const ERF_P: [f32; 7] = [
    0.128_379_17,
    -0.376_126_26,
    0.112_835_854,
    -0.026_853_817,
    0.005_188_336,
    -0.000_801_025_9,
    7.854_061_6e-5,
];

/// erfc(a)·e^{a²}, fitted in 1/a on [1, 4].
pub const ERFC_Q: [f32; 10] = [
    0.000_114_669_296,
    0.561_885_7,
    0.019_603_916,
    -0.371_693_6,
    0.218_765_48,
    0.259_326_6,
    -0.561_503_9,
    0.456_214,
    -0.187_195_15,
    0.032_065_835,
];

/// The error function: `x + x·P(x²)` (one fma) below 1; `1 − e^{−a²}·Q(1/a)` with the sign of `x` up to 4;
/// ±1 beyond.
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return NAN;
    }
    let a = x.abs();
    if a < 1.0 {
        let z = x * x;
        let mut p = ERF_P[6];
        for &c in ERF_P[..6].iter().rev() {
            p = fma(p, z, c);
        }
        return fma(x, p, x);
    }
    let y = if a >= 4.0 {
        1.0
    } else {
        let u = 1.0 / a;
        let mut q = ERFC_Q[9];
        for &c in ERFC_Q[..9].iter().rev() {
            q = fma(q, u, c);
        }
        1.0 - exp(-(a * a)) * q
    };
    y.copysign(x)
}

/// GELU with the exact error function: `(x·½)·(1 + erf(x·(1/√2)))` (docs/OPS.md, "Elementwise";
/// the `gelu_erf` op).
pub fn gelu_erf(x: f32) -> f32 {
    (x * 0.5) * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// ln 2 split for f64 Cody–Waite reduction.
const LN2_HI64: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO64: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// 1/n! for n = 0..=13.
const INV_FACT: [f64; 14] = {
    let mut c = [1.0f64; 14];
    let mut n = 1;
    while n < 14 {
        c[n] = c[n - 1] / n as f64;
        n += 1;
    }
    c
};

/// e^x in f64 (Taylor to degree 13 after reduction to |r| ≤ 0.35), for `pow`. Public so that
/// a device's port of pow's f64 core can be checked before its rounding to f32 hides errors.
pub fn exp64(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let xc = x.clamp(-1100.0, 1100.0);
    let k = (xc * std::f64::consts::LOG2_E).round_ties_even();
    let r = (-k).mul_add(LN2_HI64, xc);
    let r = (-k).mul_add(LN2_LO64, r);
    let mut p = INV_FACT[13];
    for &c in INV_FACT[..13].iter().rev() {
        p = p.mul_add(r, c);
    }
    let ki = k as i32;
    let (k1, k2) = (ki >> 1, ki - (ki >> 1));
    let s1 = f64::from_bits(((k1 + 1023) as u64) << 52);
    let s2 = f64::from_bits(((k2 + 1023) as u64) << 52);
    p * s1 * s2
}

/// ln x in f64 for positive, finite, normal x (atanh series to degree 8 in s²), for `pow`.
pub fn log64(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) as i64) - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut r: f64 = 2.0 / 17.0;
    for n in (1..8).rev() {
        r = r.mul_add(z, 2.0 / (2 * n + 1) as f64);
    }
    r *= z;
    let hfsq = 0.5 * f * f;
    let ef = e as f64;
    (((s * (hfsq + r) + ef * LN2_LO64) - hfsq) + f) + ef * LN2_HI64
}

/// x^y with the IEEE-754 special cases; the finite core is `exp(y·ln|x|)` in f64 (the project's
/// own exp64/log64), rounded once to f32.
pub fn pow(x: f32, y: f32) -> f32 {
    if y == 0.0 || x == 1.0 {
        return 1.0;
    }
    if x.is_nan() || y.is_nan() {
        return NAN;
    }
    let y_int = y.floor() == y;
    let y_odd = y_int && y.abs() < 16_777_216.0 && (y as i64) % 2 != 0;
    if x == 0.0 {
        let mag = if y < 0.0 { f32::INFINITY } else { 0.0 };
        return if y_odd { mag.copysign(x) } else { mag };
    }
    if x.is_infinite() {
        let mag = if y < 0.0 { 0.0 } else { f32::INFINITY };
        return if x < 0.0 && y_odd { -mag } else { mag };
    }
    if y.is_infinite() {
        let a = x.abs();
        return if a == 1.0 {
            1.0
        } else if (a < 1.0) == (y < 0.0) {
            f32::INFINITY
        } else {
            0.0
        };
    }
    if x < 0.0 && !y_int {
        return NAN;
    }
    let mag = exp64(y as f64 * log64(x.abs() as f64)) as f32;
    if x < 0.0 && y_odd { -mag } else { mag }
}
