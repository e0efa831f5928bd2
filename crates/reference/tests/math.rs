//! The project's transcendentals against float64 oracles. The bounds asserted here are the
//! ones documented in docs/OPS.md; `cargo test -p tenet-reference --test math -- --nocapture`
//! prints the measured maxima.

use tenet_reference::math;

/// Distance in units of the last place of the f32 nearest to `exact`.
fn ulps(got: f32, exact: f64) -> f64 {
    if got.is_nan() || exact.is_nan() {
        return if got.is_nan() && exact.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if got.is_infinite() || exact.is_infinite() || (exact as f32).is_infinite() {
        return if got as f64 == exact
            || (got.is_infinite()
                && (exact as f32).is_infinite()
                && got.signum() as f64 == exact.signum())
        {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let r = exact as f32;
    let ulp = if r == 0.0 {
        f32::from_bits(1) as f64
    } else {
        let next = f32::from_bits(r.abs().to_bits() + 1) as f64;
        next - r.abs() as f64
    };
    ((got as f64 - exact) / ulp.max(f32::from_bits(1) as f64)).abs()
}

/// A deterministic sweep: a dense grid over `[lo, hi]` plus random points.
fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=n)
        .map(|i| lo + (hi - lo) * (i as f32 / n as f32))
        .collect();
    let mut s = 0x1234_5678u64;
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32));
    }
    v
}

fn max_ulps(xs: &[f32], f: fn(f32) -> f32, oracle: fn(f64) -> f64) -> (f64, f32) {
    xs.iter()
        .map(|&x| (ulps(f(x), oracle(x as f64)), x))
        .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
}

fn erf64(x: f64) -> f64 {
    // erf(x) = 2/√π · e^{−x²} · Σ 2^n x^{2n+1} / (1·3·…·(2n+1)): every term positive.
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-18 * sum.abs() {
        n += 1.0;
        term *= 2.0 * x * x / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum
}

#[test]
fn exp_within_2_ulps() {
    let xs = sweep(-103.0, 88.7, 200_000);
    let (e, at) = max_ulps(&xs, math::exp, f64::exp);
    println!("exp: max {e:.3} ulp at {at}");
    assert!(e <= 2.0, "exp: {e} ulp at {at}");
    assert_eq!(math::exp(f32::INFINITY), f32::INFINITY);
    assert_eq!(math::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(math::exp(89.0), f32::INFINITY);
    assert_eq!(math::exp(0.0), 1.0);
    assert!(math::exp(f32::NAN).is_nan());
    // Subnormal results are rounded once.
    assert!(ulps(math::exp(-100.0), (-100.0f64).exp()) <= 1.0);
}

#[test]
fn log_within_2_ulps() {
    let mut xs = sweep(1e-6, 10.0, 100_000);
    xs.extend(sweep(10.0, 1e30, 50_000));
    xs.extend([
        f32::from_bits(1),
        f32::from_bits(0x0040_0000),
        f32::MIN_POSITIVE,
        f32::MAX,
        1.0,
    ]);
    let (e, at) = max_ulps(&xs, math::log, f64::ln);
    println!("log: max {e:.3} ulp at {at}");
    assert!(e <= 2.0, "log: {e} ulp at {at}");
    assert_eq!(math::log(0.0), f32::NEG_INFINITY);
    assert_eq!(math::log(-0.0), f32::NEG_INFINITY);
    assert!(math::log(-1.0).is_nan());
    assert_eq!(math::log(f32::INFINITY), f32::INFINITY);
    assert_eq!(math::log(1.0), 0.0);
}

#[test]
fn sin_cos_within_2_ulps_for_moderate_arguments() {
    let xs = sweep(-1e5, 1e5, 200_000);
    let small = sweep(-10.0, 10.0, 100_000);
    for (name, f, o) in [
        (
            "sin",
            math::sin as fn(f32) -> f32,
            f64::sin as fn(f64) -> f64,
        ),
        ("cos", math::cos, f64::cos),
    ] {
        let (e1, a1) = max_ulps(&small, f, o);
        println!("{name} on [-10, 10]: max {e1:.3} ulp at {a1}");
        assert!(e1 <= 2.0, "{name}: {e1} ulp at {a1}");
        // Far from zero the result can be tiny while the reduction error is absolute:
        // bound the absolute error instead.
        let worst = xs
            .iter()
            .map(|&x| (f(x) as f64 - o(x as f64)).abs())
            .fold(0.0, f64::max);
        println!("{name} on [-1e5, 1e5]: max abs error {worst:.3e}");
        assert!(worst < 1e-6, "{name}: abs error {worst}");
    }
    assert!(math::sin(f32::INFINITY).is_nan());
    assert_eq!(math::sin(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(math::cos(0.0), 1.0);
}

#[test]
fn tanh_within_2_ulps() {
    let mut xs = sweep(-10.0, 10.0, 200_000);
    xs.extend(sweep(-0.6, 0.6, 50_000));
    xs.extend([1e-30, -1e-30, f32::from_bits(1)]);
    let (e, at) = max_ulps(&xs, math::tanh, f64::tanh);
    println!("tanh: max {e:.3} ulp at {at}");
    assert!(e <= 2.0, "tanh: {e} ulp at {at}");
    assert_eq!(math::tanh(f32::INFINITY), 1.0);
    assert_eq!(math::tanh(-20.0), -1.0);
}

#[test]
fn erf_within_2_ulps() {
    let mut xs = sweep(-5.0, 5.0, 200_000);
    xs.extend([1e-30, 0.999_999_9, 1.0, 3.999_999_8, 4.0]);
    let (e, at) = max_ulps(&xs, math::erf, erf64);
    println!("erf: max {e:.3} ulp at {at}");
    assert!(e <= 2.0, "erf: {e} ulp at {at}");
    assert_eq!(math::erf(f32::INFINITY), 1.0);
    assert_eq!(math::erf(-0.0).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn pow_is_nearly_correctly_rounded_and_follows_ieee_special_cases() {
    let bases = sweep(1e-3, 100.0, 2_000);
    let exps = sweep(-8.0, 8.0, 200);
    let mut worst = 0.0f64;
    for &x in &bases {
        for &y in &exps {
            worst = worst.max(ulps(math::pow(x, y), (x as f64).powf(y as f64)));
        }
    }
    println!("pow: max {worst:.3} ulp");
    assert!(worst <= 1.0, "pow: {worst} ulp");
    assert_eq!(math::pow(-2.0, 3.0), -8.0);
    assert!(math::pow(-2.0, 0.5).is_nan());
    assert_eq!(math::pow(0.0, -1.0), f32::INFINITY);
    assert_eq!(math::pow(-0.0, -1.0), f32::NEG_INFINITY);
    assert_eq!(math::pow(f32::NAN, 0.0), 1.0);
    assert_eq!(math::pow(1.0, f32::NAN), 1.0);
    assert_eq!(math::pow(0.5, f32::INFINITY), 0.0);
    assert_eq!(math::pow(-1.0, f32::INFINITY), 1.0);
    assert_eq!(math::pow(f32::NEG_INFINITY, 3.0), f32::NEG_INFINITY);
}
