//! Vectorised elementwise math with the reference's bits: each function evaluates the scalar
//! definition in `tenet_reference::math` operation for operation, in SIMD lanes.

use tenet_reference::math;

use crate::SimdLevel;
use crate::simd::canonical as canon;

/// `out[i] = exp(x[i])`, bit-identical to `tenet_reference::math::exp`.
pub fn exp_slice(level: SimdLevel, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::exp_slice_avx512(x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::exp_slice_avx2(x, out) },
        _ => out.iter_mut().zip(x).for_each(|(o, &v)| *o = math::exp(v)),
    }
}

/// `out[i] = gelu_erf(x[i])` = `(x·0.5)·(1 + erf(x·(1/√2)))`, bit-identical to the reference,
/// with computed NaNs canonical.
pub fn gelu_erf_slice(level: SimdLevel, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::gelu_slice_avx512(x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::gelu_slice_avx2(x, out) },
        _ => out
            .iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = scalar_gelu(v)),
    }
}

/// The four arithmetic operations, each correctly rounded (IEEE), so every level gives the bits
/// of the reference's scalar operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// `out[i] = a[i] op b[i]`, computed NaNs made canonical (`math::NAN`), as the reference does.
pub fn arith_slice(level: SimdLevel, op: Arith, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "operands and output differ in length"
    );
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::arith_avx512(op, a, b, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::arith_avx2(op, a, b, out) },
        _ => arith_lanes(op, a, b, out),
    }
}

/// One operand of [`arith_scalar_slice`] is a single value: `Left` computes `s op a[i]`,
/// `Right` computes `a[i] op s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarSide {
    Left,
    Right,
}

/// [`arith_slice`] with one operand a single value broadcast over `a` (a scale, a constant
/// offset), without a buffer filled with copies of it.
pub fn arith_scalar_slice(
    level: SimdLevel,
    op: Arith,
    a: &[f32],
    s: f32,
    side: ScalarSide,
    out: &mut [f32],
) {
    assert_eq!(a.len(), out.len(), "operand and output differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::arith_scalar_avx512(op, a, s, side, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::arith_scalar_avx2(op, a, s, side, out) },
        _ => arith_scalar_lanes(op, a, s, side, out),
    }
}

/// In-place [`arith_slice`]: `acc[i] = acc[i] op b[i]` with `b` on the `Right`, or
/// `b[i] op acc[i]` with it on the `Left` — for a result rewritten where it lies (a GEMM's
/// bias), with no copy of it aside.
pub fn arith_assign(level: SimdLevel, op: Arith, acc: &mut [f32], b: &[f32], b_side: ScalarSide) {
    assert_eq!(acc.len(), b.len(), "operands differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::assign_avx512(op, acc, b, b_side) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::assign_avx2(op, acc, b, b_side) },
        _ => assign_lanes(op, acc, b, b_side),
    }
}

/// In-place [`arith_scalar_slice`]: `acc[i] = acc[i] op s` (`Right`) or `s op acc[i]` (`Left`).
pub fn arith_scalar_assign(level: SimdLevel, op: Arith, acc: &mut [f32], s: f32, side: ScalarSide) {
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::scalar_assign_avx512(op, acc, s, side) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::scalar_assign_avx2(op, acc, s, side) },
        _ => scalar_assign_lanes(op, acc, s, side),
    }
}

/// `out[i] = max(a[i], b[i])` (`min` when `max` is false) with the reference's rules: NaN if
/// either is NaN (the canonical NaN), `max(−0, +0) = +0`, `min(−0, +0) = −0`.
pub fn minmax_slice(level: SimdLevel, max: bool, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(
        a.len() == out.len() && b.len() == out.len(),
        "operands and output differ in length"
    );
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::minmax_avx512(max, a, b, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::minmax_avx2(max, a, b, out) },
        _ => minmax_lanes(max, a, b, out),
    }
}

/// [`minmax_slice`] with one operand a single value: `out[i] = max(a[i], s)` (`min` when `max`
/// is false), the same rules (both are symmetric in their operands). A clip (HardSwish's
/// `max(x + 3, 0)`, `min(·, 6)`) no longer fills a buffer with the value first.
pub fn minmax_scalar_slice(level: SimdLevel, max: bool, a: &[f32], s: f32, out: &mut [f32]) {
    assert!(a.len() == out.len(), "operand and output differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::minmax_scalar_avx512(max, a, s, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::minmax_scalar_avx2(max, a, s, out) },
        _ => minmax_scalar_lanes(max, a, s, out),
    }
}

/// One element of [`minmax_slice`]: equal operands (±0 included) combine their bits — AND
/// keeps +0 for max, OR keeps −0 for min, and equal non-zero values are the same bits either
/// way.
#[inline(always)]
fn minmax_one<const MAX: bool>(p: f32, q: f32) -> f32 {
    let (pick, eq) = if MAX {
        (
            if p > q { p } else { q },
            f32::from_bits(p.to_bits() & q.to_bits()),
        )
    } else {
        (
            if p < q { p } else { q },
            f32::from_bits(p.to_bits() | q.to_bits()),
        )
    };
    let r = if p == q { eq } else { pick };
    if p.is_nan() || q.is_nan() {
        math::NAN
    } else {
        r
    }
}

/// [`minmax_slice`]'s loop.
#[inline(always)]
fn minmax_lanes(max: bool, a: &[f32], b: &[f32], out: &mut [f32]) {
    let it = out.iter_mut().zip(a.iter().zip(b));
    if max {
        it.for_each(|(o, (&p, &q))| *o = minmax_one::<true>(p, q));
    } else {
        it.for_each(|(o, (&p, &q))| *o = minmax_one::<false>(p, q));
    }
}

/// [`minmax_scalar_slice`]'s loop.
#[inline(always)]
fn minmax_scalar_lanes(max: bool, a: &[f32], s: f32, out: &mut [f32]) {
    let it = out.iter_mut().zip(a);
    if max {
        it.for_each(|(o, &p)| *o = minmax_one::<true>(p, s));
    } else {
        it.for_each(|(o, &p)| *o = minmax_one::<false>(p, s));
    }
}

/// `out[i] = relu(x[i])`: `x` when above 0, else +0; NaN stays NaN (canonical).
pub fn relu_slice(level: SimdLevel, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "input and output differ in length");
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has.
        SimdLevel::Avx512 => unsafe { x86::relu_avx512(x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx2 => unsafe { x86::relu_avx2(x, out) },
        _ => relu_lanes(x, out),
    }
}

#[inline(always)]
fn relu_lanes(x: &[f32], out: &mut [f32]) {
    out.iter_mut().zip(x).for_each(|(o, &v)| {
        let r = if v > 0.0 { v } else { 0.0 };
        *o = if v.is_nan() { math::NAN } else { r };
    });
}

/// `dst[i] = src[first + i·stride]` for every `i` of `dst`: one phase of a strided row (a
/// stride-2 convolution's input columns under one kernel column), stride 2 in AVX2 shuffles.
pub fn gather_strided(level: SimdLevel, src: &[f32], first: usize, stride: usize, dst: &mut [f32]) {
    if let Some(last) = dst.len().checked_sub(1) {
        let end = last.checked_mul(stride).and_then(|v| v.checked_add(first));
        assert!(
            end.is_some_and(|e| e < src.len()),
            "strided gather past its source"
        );
    }
    match level.or_supported() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `or_supported` returned a level this CPU has; both x86 levels include AVX2.
        SimdLevel::Avx512 | SimdLevel::Avx2 => unsafe {
            x86::gather_strided_avx2(src, first, stride, dst)
        },
        _ => dst
            .iter_mut()
            .enumerate()
            .for_each(|(i, d)| *d = src[first + i * stride]),
    }
}

/// The loop every level compiles: plain Rust the compiler vectorises for the enabled features.
#[inline(always)]
fn arith_lanes(op: Arith, a: &[f32], b: &[f32], out: &mut [f32]) {
    let it = out.iter_mut().zip(a.iter().zip(b));
    match op {
        Arith::Add => it.for_each(|(o, (&p, &q))| *o = canon(p + q)),
        Arith::Sub => it.for_each(|(o, (&p, &q))| *o = canon(p - q)),
        Arith::Mul => it.for_each(|(o, (&p, &q))| *o = canon(p * q)),
        Arith::Div => it.for_each(|(o, (&p, &q))| *o = canon(p / q)),
    }
}

/// [`arith_lanes`] with one operand a single value. (Zipping with `iter::repeat` instead
/// compiles to scalar code.)
#[inline(always)]
fn arith_scalar_lanes(op: Arith, a: &[f32], s: f32, side: ScalarSide, out: &mut [f32]) {
    let it = out.iter_mut().zip(a);
    match (op, side) {
        (Arith::Add, _) => it.for_each(|(o, &x)| *o = canon(x + s)),
        (Arith::Sub, ScalarSide::Left) => it.for_each(|(o, &x)| *o = canon(s - x)),
        (Arith::Sub, ScalarSide::Right) => it.for_each(|(o, &x)| *o = canon(x - s)),
        (Arith::Mul, _) => it.for_each(|(o, &x)| *o = canon(x * s)),
        (Arith::Div, ScalarSide::Left) => it.for_each(|(o, &x)| *o = canon(s / x)),
        (Arith::Div, ScalarSide::Right) => it.for_each(|(o, &x)| *o = canon(x / s)),
    }
}

/// [`arith_lanes`] in place (IEEE addition and multiplication commute, NaN payloads aside,
/// and computed NaNs are made canonical: only subtraction and division care about the side).
#[inline(always)]
fn assign_lanes(op: Arith, acc: &mut [f32], b: &[f32], side: ScalarSide) {
    let it = acc.iter_mut().zip(b);
    match (op, side) {
        (Arith::Add, _) => it.for_each(|(o, &q)| *o = canon(*o + q)),
        (Arith::Sub, ScalarSide::Left) => it.for_each(|(o, &q)| *o = canon(q - *o)),
        (Arith::Sub, ScalarSide::Right) => it.for_each(|(o, &q)| *o = canon(*o - q)),
        (Arith::Mul, _) => it.for_each(|(o, &q)| *o = canon(*o * q)),
        (Arith::Div, ScalarSide::Left) => it.for_each(|(o, &q)| *o = canon(q / *o)),
        (Arith::Div, ScalarSide::Right) => it.for_each(|(o, &q)| *o = canon(*o / q)),
    }
}

/// [`arith_scalar_lanes`] in place.
#[inline(always)]
fn scalar_assign_lanes(op: Arith, acc: &mut [f32], s: f32, side: ScalarSide) {
    let it = acc.iter_mut();
    match (op, side) {
        (Arith::Add, _) => it.for_each(|o| *o = canon(*o + s)),
        (Arith::Sub, ScalarSide::Left) => it.for_each(|o| *o = canon(s - *o)),
        (Arith::Sub, ScalarSide::Right) => it.for_each(|o| *o = canon(*o - s)),
        (Arith::Mul, _) => it.for_each(|o| *o = canon(*o * s)),
        (Arith::Div, ScalarSide::Left) => it.for_each(|o| *o = canon(s / *o)),
        (Arith::Div, ScalarSide::Right) => it.for_each(|o| *o = canon(*o / s)),
    }
}

/// The reference's gelu_erf, made canonical.
fn scalar_gelu(v: f32) -> f32 {
    canon(math::gelu_erf(v))
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// `$avx512` and `$avx2`: the portable loop `$lanes` compiled with each level's features
    /// enabled, which is all the vectorising these loops need.
    macro_rules! compiled_per_level {
        ($lanes:ident => $avx512:ident, $avx2:ident ($($arg:ident: $ty:ty),*)) => {
            #[doc = concat!("`", stringify!($lanes), "` compiled with AVX-512 enabled.")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            pub(crate) fn $avx512($($arg: $ty),*) {
                super::$lanes($($arg),*)
            }

            #[doc = concat!("`", stringify!($lanes), "` compiled with AVX2 enabled.")]
            #[target_feature(enable = "avx2,fma")]
            pub(crate) fn $avx2($($arg: $ty),*) {
                super::$lanes($($arg),*)
            }
        };
    }

    use super::{Arith, ScalarSide};
    compiled_per_level!(arith_lanes => arith_avx512, arith_avx2
        (op: Arith, a: &[f32], b: &[f32], out: &mut [f32]));
    compiled_per_level!(arith_scalar_lanes => arith_scalar_avx512, arith_scalar_avx2
        (op: Arith, a: &[f32], s: f32, side: ScalarSide, out: &mut [f32]));
    compiled_per_level!(assign_lanes => assign_avx512, assign_avx2
        (op: Arith, acc: &mut [f32], b: &[f32], side: ScalarSide));
    compiled_per_level!(scalar_assign_lanes => scalar_assign_avx512, scalar_assign_avx2
        (op: Arith, acc: &mut [f32], s: f32, side: ScalarSide));
    compiled_per_level!(minmax_lanes => minmax_avx512, minmax_avx2
        (max: bool, a: &[f32], b: &[f32], out: &mut [f32]));
    compiled_per_level!(minmax_scalar_lanes => minmax_scalar_avx512, minmax_scalar_avx2
        (max: bool, a: &[f32], s: f32, out: &mut [f32]));
    compiled_per_level!(relu_lanes => relu_avx512, relu_avx2 (x: &[f32], out: &mut [f32]));

    use tenet_reference::math::{EXP_CLAMP, EXP_TAYLOR, LN2_HI, LN2_LO, LOG2E, NAN, ROUND_SHIFT};

    /// e^x in 16 lanes: the same operations as `tenet_reference::math::exp`, in the same order.
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp16(x: __m512) -> __m512 {
        let nan_mask = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        let xc = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_CLAMP.0)),
            _mm512_set1_ps(EXP_CLAMP.1),
        );
        let shift = _mm512_set1_ps(ROUND_SHIFT);
        let k = _mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)), shift),
            shift,
        );
        let r = _mm512_fmadd_ps(k, _mm512_set1_ps(-LN2_HI), xc);
        let r = _mm512_fmadd_ps(k, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        // The reference scales by 2^k in two exact-power steps, p·2^⌊k/2⌋ then ·2^⌈k/2⌉. With
        // k ∈ [−150, 128] (the clamp) and p ∈ (0.7, 1.5) the first product is a normal number,
        // hence exact, so the result is p·2^k rounded once — which is what vscalefps computes.
        // At or below the clamp the reference's result is +0 (exp(−104) underflows whole). Those
        // lanes are not scaled but zeroed: a scaling that underflows takes a microcode assist
        // on Intel cores (~150 cycles an instruction), and attention's masked scores, −∞, made
        // a softmax over mostly masked rows 11× slower.
        let zero = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, _mm512_set1_ps(EXP_CLAMP.0));
        let y = _mm512_maskz_scalef_ps(!zero, p, k);
        _mm512_mask_blend_ps(nan_mask, y, _mm512_set1_ps(NAN))
    }

    /// e^x in 8 lanes (AVX2+FMA): the same operations as `tenet_reference::math::exp`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let nan_mask = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let xc = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_CLAMP.0)),
            _mm256_set1_ps(EXP_CLAMP.1),
        );
        let shift = _mm256_set1_ps(ROUND_SHIFT);
        let k = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), shift),
            shift,
        );
        let r = _mm256_fmadd_ps(k, _mm256_set1_ps(-LN2_HI), xc);
        let r = _mm256_fmadd_ps(k, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let ki = _mm256_cvtps_epi32(k);
        let k1 = _mm256_srai_epi32::<1>(ki);
        let k2 = _mm256_sub_epi32(ki, k1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k1, bias)));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k2, bias)));
        // At or below the clamp the result is +0 (see `exp16`): those lanes skip the second,
        // underflowing scaling (a microcode assist on Intel cores) and are zeroed after.
        let zero = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(EXP_CLAMP.0));
        let s2 = _mm256_blendv_ps(s2, _mm256_set1_ps(1.0), zero);
        let y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
        let y = _mm256_andnot_ps(zero, y);
        _mm256_blendv_ps(y, _mm256_set1_ps(NAN), nan_mask)
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA; `x` and `out` have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_slice_avx2(x: &[f32], out: &mut [f32]) {
        let n = x.len();
        let mut j = 0;
        while j + 8 <= n {
            // SAFETY: j + 8 <= n for both slices.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr().add(j),
                    exp8(_mm256_loadu_ps(x.as_ptr().add(j))),
                )
            };
            j += 8;
        }
        for (o, &v) in out[j..].iter_mut().zip(&x[j..]) {
            *o = tenet_reference::math::exp(v);
        }
    }

    /// # Safety
    /// The CPU supports AVX-512F; `x` and `out` have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_slice_avx512(x: &[f32], out: &mut [f32]) {
        let n = x.len();
        for j in (0..n).step_by(16) {
            let len = (n - j).min(16);
            let lanes = crate::simd::mask16(len);
            // SAFETY: the mask enables only lanes j..j+len, inside both slices.
            unsafe {
                let v = _mm512_maskz_loadu_ps(lanes, x.as_ptr().add(j));
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(j), lanes, exp16(v));
            }
        }
    }

    /// `tenet_reference::math::erf` below 1 in magnitude: `x + x·P(x²)` (one fma).
    #[target_feature(enable = "avx512f")]
    fn erf16_small(x: __m512) -> __m512 {
        use tenet_reference::math::ERF_P;
        let z = _mm512_mul_ps(x, x);
        let mut p = _mm512_set1_ps(ERF_P[6]);
        for &c in ERF_P[..6].iter().rev() {
            p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(c));
        }
        _mm512_fmadd_ps(x, p, x)
    }

    /// `tenet_reference::math::erf` for 1 ≤ |x| < 4: `1 − e^{−a²}·Q(1/a)` with the sign of x.
    #[target_feature(enable = "avx512f")]
    fn erf16_mid(x: __m512) -> __m512 {
        use tenet_reference::math::ERFC_Q;
        let a = _mm512_abs_ps(x);
        let u = _mm512_div_ps(_mm512_set1_ps(1.0), a);
        let mut q = _mm512_set1_ps(ERFC_Q[9]);
        for &c in ERFC_Q[..9].iter().rev() {
            q = _mm512_fmadd_ps(q, u, _mm512_set1_ps(c));
        }
        let neg_a2 = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(_mm512_mul_ps(a, a)),
            _mm512_set1_epi32(i32::MIN),
        ));
        let y = _mm512_sub_ps(_mm512_set1_ps(1.0), _mm512_mul_ps(exp16(neg_a2), q));
        copysign16(y, x)
    }

    /// `y` (non-negative) with the sign bit of `x`.
    #[target_feature(enable = "avx512f")]
    fn copysign16(y: __m512, x: __m512) -> __m512 {
        let sign = _mm512_set1_epi32(i32::MIN);
        _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_andnot_si512(sign, _mm512_castps_si512(y)),
            _mm512_and_si512(sign, _mm512_castps_si512(x)),
        ))
    }

    /// GELU of `v` given `erf(v·(1/√2))`: `(v·0.5)·(1 + erf)`.
    #[target_feature(enable = "avx512f")]
    fn gelu_finish(v: __m512, erf: __m512) -> __m512 {
        _mm512_mul_ps(
            _mm512_mul_ps(v, _mm512_set1_ps(0.5)),
            _mm512_add_ps(_mm512_set1_ps(1.0), erf),
        )
    }

    /// Elements per block of [`gelu_slice_avx512`]: its buffers stay in L1.
    const GELU_BLOCK: usize = 2048;

    /// GELU with erf's middle branch (1 ≤ |x/√2| < 4: a division, ten multiply-adds and an
    /// exponential) computed only for the lanes that take it — about a fifth of a transformer
    /// FFN's activations — instead of for every lane and then discarded. Per block: every lane
    /// is finished as if small (or ±1, or NaN) while the middle-branch inputs and their
    /// positions are compressed into dense buffers; those are then computed sixteen at a time
    /// and scattered back over their lanes. Each lane's operations are the reference's.
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `x` and `out` have the same length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu_slice_avx512(x: &[f32], out: &mut [f32]) {
        let rs2 = _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2);
        let (one, four) = (_mm512_set1_ps(1.0), _mm512_set1_ps(4.0));
        // Whole registers are stored at the compressed count: 16 floats (and indices) of slack.
        let mut mid = [0.0f32; GELU_BLOCK + 16];
        let mut at = [0i32; GELU_BLOCK + 16];
        let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (xb, ob) in x.chunks(GELU_BLOCK).zip(out.chunks_mut(GELU_BLOCK)) {
            let n = xb.len();
            let mut count = 0;
            for j in (0..n).step_by(16) {
                let lanes = crate::simd::mask16(n - j);
                // SAFETY: the mask enables only lanes j..min(j + 16, n), inside both blocks;
                // `count + 16 ≤ GELU_BLOCK + 16` elements of `mid` and `at` are written.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(lanes, xb.as_ptr().add(j));
                    let t = _mm512_mul_ps(v, rs2);
                    let a = _mm512_abs_ps(t);
                    let lt1 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, one);
                    let m = _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(lanes & !lt1, a, four);
                    // Small lanes, ±1 beyond 4 (NaN lanes come out NaN either way).
                    let erf = _mm512_mask_blend_ps(lt1, copysign16(one, t), erf16_small(t));
                    let y = crate::simd::canonical16(gelu_finish(v, erf));
                    _mm512_mask_storeu_ps(ob.as_mut_ptr().add(j), lanes, y);
                    _mm512_storeu_ps(mid.as_mut_ptr().add(count), _mm512_maskz_compress_ps(m, v));
                    let idx = _mm512_add_epi32(iota, _mm512_set1_epi32(j as i32));
                    _mm512_storeu_si512(
                        at.as_mut_ptr().add(count).cast(),
                        _mm512_maskz_compress_epi32(m, idx),
                    );
                    count += m.count_ones() as usize;
                }
            }
            for k in (0..count).step_by(16) {
                let valid = crate::simd::mask16(count - k);
                // SAFETY: `k + 16 ≤ GELU_BLOCK + 16`; the valid lanes' indices are positions
                // inside `ob` written by the first pass.
                unsafe {
                    let v = _mm512_loadu_ps(mid.as_ptr().add(k));
                    let y = gelu_finish(v, erf16_mid(_mm512_mul_ps(v, rs2)));
                    let idx = _mm512_loadu_si512(at.as_ptr().add(k).cast());
                    _mm512_mask_i32scatter_ps::<4>(ob.as_mut_ptr().cast(), valid, idx, y);
                }
            }
        }
    }

    /// `y` (non-negative) with the sign bit of `x`, in 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    fn copysign8(y: __m256, x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        _mm256_or_ps(_mm256_andnot_ps(sign, y), _mm256_and_ps(sign, x))
    }

    /// GELU in 8 lanes (AVX2+FMA): erf's small branch for every lane, its middle branch (1 ≤
    /// |x/√2| < 4: a division, ten multiply-adds and an exponential) only for registers with a
    /// lane that takes it, ±1 beyond; each lane's operations are the reference's. AVX2 has no
    /// compress, so a register with one middle lane computes the branch for all eight.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `x` and `out` have the same length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu_slice_avx2(x: &[f32], out: &mut [f32]) {
        use tenet_reference::math::{ERF_P, ERFC_Q};
        let rs2 = _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2);
        let (one, four, half) = (
            _mm256_set1_ps(1.0),
            _mm256_set1_ps(4.0),
            _mm256_set1_ps(0.5),
        );
        let abs = |v: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
        let n = x.len();
        let mut j = 0;
        while j + 8 <= n {
            // SAFETY: j + 8 <= n for both slices.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(j)) };
            let t = _mm256_mul_ps(v, rs2);
            let a = abs(t);
            let lt1 = _mm256_cmp_ps::<_CMP_LT_OQ>(a, one);
            // Small lanes: x + x·P(x²).
            let z = _mm256_mul_ps(t, t);
            let mut p = _mm256_set1_ps(ERF_P[6]);
            for &c in ERF_P[..6].iter().rev() {
                p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c));
            }
            let mut erf = _mm256_blendv_ps(copysign8(one, t), _mm256_fmadd_ps(t, p, t), lt1);
            let mid = _mm256_andnot_ps(lt1, _mm256_cmp_ps::<_CMP_LT_OQ>(a, four));
            if _mm256_movemask_ps(mid) != 0 {
                // 1 − e^{−a²}·Q(1/a) with the sign of t.
                let u = _mm256_div_ps(one, a);
                let mut q = _mm256_set1_ps(ERFC_Q[9]);
                for &c in ERFC_Q[..9].iter().rev() {
                    q = _mm256_fmadd_ps(q, u, _mm256_set1_ps(c));
                }
                let neg_a2 = _mm256_xor_ps(_mm256_mul_ps(a, a), _mm256_set1_ps(-0.0));
                let y = _mm256_sub_ps(one, _mm256_mul_ps(exp8(neg_a2), q));
                erf = _mm256_blendv_ps(erf, copysign8(y, t), mid);
            }
            let y = _mm256_mul_ps(_mm256_mul_ps(v, half), _mm256_add_ps(one, erf));
            let y = crate::simd::canonical8(y);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), y) };
            j += 8;
        }
        for (o, &v) in out[j..].iter_mut().zip(&x[j..]) {
            *o = super::scalar_gelu(v);
        }
    }
    /// [`super::gather_strided`] (its bounds checked by the caller).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn gather_strided_avx2(src: &[f32], first: usize, stride: usize, dst: &mut [f32]) {
        const L: usize = 8;
        if stride == 1 {
            dst.copy_from_slice(&src[first..first + dst.len()]);
            return;
        }
        let mut i = 0;
        if stride == 2 {
            // Eight values from sixteen: the even ones.
            while i + L <= dst.len() && first + 2 * i + 2 * L <= src.len() {
                let from = &src[first + 2 * i..][..2 * L];
                // SAFETY: `from` holds 16 values and `dst[i..]` at least 8.
                unsafe {
                    let a = _mm256_loadu_ps(from.as_ptr());
                    let b = _mm256_loadu_ps(from.as_ptr().add(L));
                    // a0 a2 b0 b2 | a4 a6 b4 b6, then the middle halves swapped.
                    let e = _mm256_shuffle_ps::<0x88>(a, b);
                    let e = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(e)));
                    _mm256_storeu_ps(dst.as_mut_ptr().add(i), e);
                }
                i += L;
            }
        }
        for (k, d) in dst.iter_mut().enumerate().skip(i) {
            *d = src[first + k * stride];
        }
    }
}
