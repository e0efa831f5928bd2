// tenet: the project's own transcendental functions and elementwise ops, ported from
// crates/reference/src/math.rs and crates/reference/src/interp.rs (`unary_f32`, `binary_f32`,
// `fmax`, `fmin`, comparisons). The Rust is the definition; this file evaluates the same IEEE
// operations in the same order, so it gives the same bits:
//   - explicit `fma()` exactly where the Rust calls `mul_add` (its `fma` helper);
//   - plain `a * b + c` where the Rust uses separate operations: the preamble's
//     `#pragma OPENCL FP_CONTRACT OFF` keeps the compiler from fusing them;
//   - `/` and `sqrt` correctly rounded (built with -cl-fp32-correctly-rounded-divide-sqrt);
//   - constants written as their bit patterns, so no decimal literal can round differently;
//   - NaN, infinity and sign tests done on the bits, so no compiler option can fold them away.
// No libm function is called except the exact ones (fma, sqrt, floor, ceil, rint), which the
// OpenCL specification requires to be correctly rounded.
//
// Results that are NaN may carry any payload (as the Rust ones do, following the hardware);
// what is stored is always `tn_canonical` of them, as in the reference's `floats_to`.

#define TN_F32(bits) as_float((uint)(bits))

// The canonical quiet NaN every computing op produces.
#define TN_NAN TN_F32(0x7fc00000u)
#define TN_INF TN_F32(0x7f800000u)

// Op tags: position in tenet_ir's UnaryOp / BinaryOp declarations (`tag()`).
#define TN_UNARY_NEG 0
#define TN_UNARY_ABS 1
#define TN_UNARY_EXP 2
#define TN_UNARY_LOG 3
#define TN_UNARY_SQRT 4
#define TN_UNARY_RSQRT 5
#define TN_UNARY_RECIPROCAL 6
#define TN_UNARY_SIN 7
#define TN_UNARY_COS 8
#define TN_UNARY_TANH 9
#define TN_UNARY_SIGMOID 10
#define TN_UNARY_RELU 11
#define TN_UNARY_GELU_ERF 12
#define TN_UNARY_GELU_TANH 13
#define TN_UNARY_ERF 14
#define TN_UNARY_FLOOR 15
#define TN_UNARY_CEIL 16
#define TN_UNARY_ROUND 17
#define TN_UNARY_SIGN 18
#define TN_UNARY_NOT 19

#define TN_BINARY_ADD 0
#define TN_BINARY_SUB 1
#define TN_BINARY_MUL 2
#define TN_BINARY_DIV 3
#define TN_BINARY_POW 4
#define TN_BINARY_MAX 5
#define TN_BINARY_MIN 6
#define TN_BINARY_EQ 7
#define TN_BINARY_NE 8
#define TN_BINARY_LT 9
#define TN_BINARY_LE 10
#define TN_BINARY_GT 11
#define TN_BINARY_GE 12
#define TN_BINARY_AND 13
#define TN_BINARY_OR 14

// ---------------------------------------------------------------------------------------------
// Bit-level predicates (as Rust's is_nan, is_infinite, is_finite, abs, copysign).

bool tn_is_nan(float x) {
    return (as_uint(x) & 0x7fffffffu) > 0x7f800000u;
}

bool tn_is_inf(float x) {
    return (as_uint(x) & 0x7fffffffu) == 0x7f800000u;
}

bool tn_is_finite(float x) {
    return (as_uint(x) & 0x7fffffffu) < 0x7f800000u;
}

bool tn_sign_negative(float x) {
    return (as_uint(x) & 0x80000000u) != 0u;
}

float tn_abs(float x) {
    return as_float(as_uint(x) & 0x7fffffffu);
}

float tn_copysign(float mag, float sign) {
    return as_float((as_uint(mag) & 0x7fffffffu) | (as_uint(sign) & 0x80000000u));
}

// `v`, or the canonical NaN if `v` is any NaN: how computing ops store their results.
float tn_canonical(float v) {
    return tn_is_nan(v) ? TN_NAN : v;
}

// Rust's f32::clamp for a non-NaN x: the lower bound first, then the upper.
float tn_clamp(float x, float lo, float hi) {
    if (x < lo) {
        x = lo;
    }
    if (x > hi) {
        x = hi;
    }
    return x;
}

// ---------------------------------------------------------------------------------------------
// exp, log.

#define TN_LOG2E TN_F32(0x3fb8aa3bu)
// ln 2 split so that k * LN2_HI is exact for |k| < 2^8.
#define TN_LN2_HI TN_F32(0x3f317180u)
#define TN_LN2_LO TN_F32(0x3717f7d1u)
// 1.5 * 2^23: adding and subtracting it rounds |v| < 2^22 to an integer, ties to even.
#define TN_ROUND_SHIFT TN_F32(0x4b400000u)

// 2^k for -254 <= k <= 254 as two normal factors, applied in two steps so that the product
// rounds once even when it is subnormal or overflows (math.rs `pow2_split`).
float tn_pow2_lo(int k) {
    int k1 = k >> 1;
    return as_float((uint)(k1 + 127) << 23);
}

float tn_pow2_hi(int k) {
    int k2 = k - (k >> 1);
    return as_float((uint)(k2 + 127) << 23);
}

// e^x: Cody-Waite reduction with fma, Taylor to degree 7 (Horner, fma), scaled by 2^k.
float tn_exp(float x) {
    if (tn_is_nan(x)) {
        return TN_NAN;
    }
    float xc = tn_clamp(x, -104.0f, 89.0f);
    float k = (xc * TN_LOG2E + TN_ROUND_SHIFT) - TN_ROUND_SHIFT;
    float r = fma(k, -TN_LN2_HI, xc);
    r = fma(k, -TN_LN2_LO, r);
    float p = TN_F32(0x39500d01u);        // 1/5040
    p = fma(p, r, TN_F32(0x3ab60b61u));   // 1/720
    p = fma(p, r, TN_F32(0x3c088889u));   // 1/120
    p = fma(p, r, TN_F32(0x3d2aaaabu));   // 1/24
    p = fma(p, r, TN_F32(0x3e2aaaabu));   // 1/6
    p = fma(p, r, 0.5f);
    p = fma(p, r, 1.0f);
    p = fma(p, r, 1.0f);
    int ki = (int)k;
    float s1 = tn_pow2_lo(ki);
    float s2 = tn_pow2_hi(ki);
    return p * s1 * s2;
}

// Natural logarithm: x = m * 2^e, m in [sqrt(1/2), sqrt(2)); log(1+f) = 2 atanh(s) with the
// atanh series in s^2 to degree 4; e * ln 2 added in two parts.
float tn_log(float x) {
    if (tn_is_nan(x) || x < 0.0f) {
        return TN_NAN;
    }
    if (x == 0.0f) {
        return -TN_INF;
    }
    if (x == TN_INF) {
        return x;
    }
    int e_adj = 0;
    // Subnormals (below f32::MIN_POSITIVE): scale into the normal range first.
    if (x < TN_F32(0x00800000u)) {
        x = x * 8388608.0f;
        e_adj = -23;
    }
    uint bits = as_uint(x);
    int e = (int)(bits >> 23) - 127 + e_adj;
    float m = as_float((bits & 0x007fffffu) | 0x3f800000u);
    if (m > TN_F32(0x3fb504f3u)) { // sqrt(2)
        m = m * 0.5f;
        e += 1;
    }
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float r = TN_F32(0x3e638e39u);        // 2/9
    r = fma(r, z, TN_F32(0x3e924925u));   // 2/7
    r = fma(r, z, TN_F32(0x3ecccccdu));   // 2/5
    r = fma(r, z, TN_F32(0x3f2aaaabu));   // 2/3
    r = r * z;
    float hfsq = 0.5f * f * f;
    float ef = (float)e;
    return (((s * (hfsq + r) + ef * TN_LN2_LO) - hfsq) + f) + ef * TN_LN2_HI;
}

// ---------------------------------------------------------------------------------------------
// sin, cos.

// pi/2 in three parts for Cody-Waite reduction with fma.
#define TN_PIO2_1 TN_F32(0x3fc90fdbu)
#define TN_PIO2_2 TN_F32(0xb33bbd2eu)
#define TN_PIO2_3 TN_F32(0xa6f72cedu)
#define TN_TWO_OVER_PI TN_F32(0x3f22f983u)
// Below 2^-12, sin x rounds to x and cos x to 1.
#define TN_TINY TN_F32(0x39800000u)

// Reduce x to r in [-pi/4, pi/4] and the quadrant q in 0..4 with x ~ q pi/2 + r; the
// quadrant is returned through `q`.
float tn_reduce_quadrant(float x, int *q) {
    float t = x * TN_TWO_OVER_PI;
    float j = tn_abs(t) < 4194304.0f ? (t + TN_ROUND_SHIFT) - TN_ROUND_SHIFT : t;
    float r = fma(-j, TN_PIO2_1, x);
    r = fma(-j, TN_PIO2_2, r);
    r = fma(-j, TN_PIO2_3, r);
    // j mod 4 as Rust computes it; in [0, 4), so the truncating conversion is defined (it is
    // Rust's `as u32` there; beyond 2^22, j may be a half-integer and this truncates it).
    float qf = j - 4.0f * floor(j * 0.25f);
    *q = (int)qf;
    return r;
}

// sin on [-pi/4, pi/4]: Taylor to degree 9.
float tn_sin_kernel(float r) {
    float z = r * r;
    float p = TN_F32(0x3638ef1du);        // 1/362880
    p = fma(p, z, TN_F32(0xb9500d01u));   // -1/5040
    p = fma(p, z, TN_F32(0x3c088889u));   // 1/120
    p = fma(p, z, TN_F32(0xbe2aaaabu));   // -1/6
    return fma(r * z, p, r);
}

// cos on [-pi/4, pi/4]: Taylor to degree 10, with 1 - z/2 split to keep its low bits.
float tn_cos_kernel(float r) {
    float z = r * r;
    float p = TN_F32(0xb493f27eu);        // -1/3628800
    p = fma(p, z, TN_F32(0x37d00d01u));   // 1/40320
    p = fma(p, z, TN_F32(0xbab60b61u));   // -1/720
    p = fma(p, z, TN_F32(0x3d2aaaabu));   // 1/24
    float hz = 0.5f * z;
    float w = 1.0f - hz;
    return w + (((1.0f - w) - hz) + z * z * p);
}

float tn_sin(float x) {
    if (!tn_is_finite(x)) {
        return TN_NAN;
    }
    // sin x rounds to x here (and this keeps the sign of -0).
    if (tn_abs(x) < TN_TINY) {
        return x;
    }
    int q;
    float r = tn_reduce_quadrant(x, &q);
    switch (q) {
    case 0:
        return tn_sin_kernel(r);
    case 1:
        return tn_cos_kernel(r);
    case 2:
        return -tn_sin_kernel(r);
    default:
        return -tn_cos_kernel(r);
    }
}

float tn_cos(float x) {
    if (!tn_is_finite(x)) {
        return TN_NAN;
    }
    if (tn_abs(x) < TN_TINY) {
        return 1.0f;
    }
    int q;
    float r = tn_reduce_quadrant(x, &q);
    switch (q) {
    case 0:
        return tn_cos_kernel(r);
    case 1:
        return -tn_sin_kernel(r);
    case 2:
        return -tn_cos_kernel(r);
    default:
        return tn_sin_kernel(r);
    }
}

// ---------------------------------------------------------------------------------------------
// tanh, erf.

// x + x^3 P(x^2) below 0.55; 1 - 2/(e^{2|x|} + 1) with the sign of x up to 9.01; +-1 beyond.
float tn_tanh(float x) {
    if (tn_is_nan(x)) {
        return TN_NAN;
    }
    float a = tn_abs(x);
    if (a < 0.55f) {
        float z = x * x;
        float p = TN_F32(0xbbce08dfu);        // TANH_P[4]
        p = fma(p, z, TN_F32(0x3cacb44fu));   // TANH_P[3]
        p = fma(p, z, TN_F32(0xbd5c9731u));   // TANH_P[2]
        p = fma(p, z, TN_F32(0x3e0886a8u));   // TANH_P[1]
        p = fma(p, z, TN_F32(0xbeaaaaa6u));   // TANH_P[0]
        return fma(x * z, p, x);
    }
    float t = a > 9.01f ? 1.0f : 1.0f - 2.0f / (tn_exp(2.0f * a) + 1.0f);
    return tn_copysign(t, x);
}

// x + x P(x^2) below 1; 1 - e^{-a^2} Q(1/a) with the sign of x up to 4; +-1 beyond.
float tn_erf(float x) {
    if (tn_is_nan(x)) {
        return TN_NAN;
    }
    float a = tn_abs(x);
    if (a < 1.0f) {
        float z = x * x;
        float p = TN_F32(0x38a4b62cu);        // ERF_P[6]
        p = fma(p, z, TN_F32(0xba51fbf0u));   // ERF_P[5]
        p = fma(p, z, TN_F32(0x3baa02ebu));   // ERF_P[4]
        p = fma(p, z, TN_F32(0xbcdbfc89u));   // ERF_P[3]
        p = fma(p, z, TN_F32(0x3de7167cu));   // ERF_P[2]
        p = fma(p, z, TN_F32(0xbec0939fu));   // ERF_P[1]
        p = fma(p, z, TN_F32(0x3e0375d4u));   // ERF_P[0]
        return fma(x, p, x);
    }
    float y;
    if (a >= 4.0f) {
        y = 1.0f;
    } else {
        float u = 1.0f / a;
        float q = TN_F32(0x3d035777u);        // ERFC_Q[9]
        q = fma(q, u, TN_F32(0xbe3fb016u));   // ERFC_Q[8]
        q = fma(q, u, TN_F32(0x3ee994e2u));   // ERFC_Q[7]
        q = fma(q, u, TN_F32(0xbf0fbeb8u));   // ERFC_Q[6]
        q = fma(q, u, TN_F32(0x3e84c675u));   // ERFC_Q[5]
        q = fma(q, u, TN_F32(0x3e60040fu));   // ERFC_Q[4]
        q = fma(q, u, TN_F32(0xbebe4ea0u));   // ERFC_Q[3]
        q = fma(q, u, TN_F32(0x3ca09864u));   // ERFC_Q[2]
        q = fma(q, u, TN_F32(0x3f0fd7beu));   // ERFC_Q[1]
        q = fma(q, u, TN_F32(0x38f07a9cu));   // ERFC_Q[0]
        y = 1.0f - tn_exp(-(a * a)) * q;
    }
    return tn_copysign(y, x);
}

// ---------------------------------------------------------------------------------------------
// pow, whose finite core is computed in f64. A device without fp64 cannot compute it exactly:
// there `TN_HAVE_FP64` is 0 and `tn_pow` returns NaN for the finite core (the determinism
// check refuses such a device for the exact tier).

#if defined(cl_khr_fp64) || defined(__opencl_c_fp64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define TN_HAVE_FP64 1
#else
#define TN_HAVE_FP64 0
#endif

#if TN_HAVE_FP64

#define TN_F64(bits) as_double((ulong)(bits))
#define TN_LN2_HI64 TN_F64(0x3fe62e42fee00000ul)
#define TN_LN2_LO64 TN_F64(0x3dea39ef35793c76ul)

// e^x in f64: Taylor to degree 13 after reduction to |r| <= 0.35 (math.rs `exp64`).
double tn_exp64(double x) {
    if (isnan(x)) {
        return as_double(0x7ff8000000000000ul);
    }
    double xc = x;
    if (xc < -1100.0) {
        xc = -1100.0;
    }
    if (xc > 1100.0) {
        xc = 1100.0;
    }
    // round_ties_even: rint in the default rounding mode, exact.
    double k = rint(xc * TN_F64(0x3ff71547652b82feul)); // log2(e)
    double r = fma(-k, TN_LN2_HI64, xc);
    r = fma(-k, TN_LN2_LO64, r);
    // 1/n! for n = 13 down to 0, each c[n] = c[n-1] / n in f64 as the Rust builds them.
    double p = TN_F64(0x3de6124613a86d0aul);
    p = fma(p, r, TN_F64(0x3e21eed8eff8d898ul));
    p = fma(p, r, TN_F64(0x3e5ae64567f544e4ul));
    p = fma(p, r, TN_F64(0x3e927e4fb7789f5dul));
    p = fma(p, r, TN_F64(0x3ec71de3a556c734ul));
    p = fma(p, r, TN_F64(0x3efa01a01a01a01aul));
    p = fma(p, r, TN_F64(0x3f2a01a01a01a01aul));
    p = fma(p, r, TN_F64(0x3f56c16c16c16c17ul));
    p = fma(p, r, TN_F64(0x3f81111111111111ul));
    p = fma(p, r, TN_F64(0x3fa5555555555555ul));
    p = fma(p, r, TN_F64(0x3fc5555555555555ul));
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    int ki = (int)k;
    int k1 = ki >> 1;
    int k2 = ki - k1;
    double s1 = as_double((ulong)(k1 + 1023) << 52);
    double s2 = as_double((ulong)(k2 + 1023) << 52);
    return p * s1 * s2;
}

// ln x in f64 for positive, finite, normal x: atanh series to degree 8 in s^2 (math.rs `log64`).
double tn_log64(double x) {
    ulong bits = as_ulong(x);
    long e = (long)(bits >> 52) - 1023;
    double m = as_double((bits & 0x000ffffffffffffful) | 0x3ff0000000000000ul);
    if (m > TN_F64(0x3ff6a09e667f3bcdul)) { // sqrt(2)
        m = m * 0.5;
        e += 1;
    }
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double r = TN_F64(0x3fbe1e1e1e1e1e1eul);      // 2/17
    r = fma(r, z, TN_F64(0x3fc1111111111111ul));  // 2/15
    r = fma(r, z, TN_F64(0x3fc3b13b13b13b14ul));  // 2/13
    r = fma(r, z, TN_F64(0x3fc745d1745d1746ul));  // 2/11
    r = fma(r, z, TN_F64(0x3fcc71c71c71c71cul));  // 2/9
    r = fma(r, z, TN_F64(0x3fd2492492492492ul));  // 2/7
    r = fma(r, z, TN_F64(0x3fd999999999999aul));  // 2/5
    r = fma(r, z, TN_F64(0x3fe5555555555555ul));  // 2/3
    r = r * z;
    double hfsq = 0.5 * f * f;
    double ef = (double)e;
    return (((s * (hfsq + r) + ef * TN_LN2_LO64) - hfsq) + f) + ef * TN_LN2_HI64;
}

#endif // TN_HAVE_FP64

// x^y with the IEEE-754 special cases; the finite core is exp(y ln|x|) in f64, rounded once.
float tn_pow(float x, float y) {
    if (y == 0.0f || x == 1.0f) {
        return 1.0f;
    }
    if (tn_is_nan(x) || tn_is_nan(y)) {
        return TN_NAN;
    }
    bool y_int = floor(y) == y;
    // |y| < 2^24, so the conversion is exact and defined.
    bool y_odd = y_int && tn_abs(y) < 16777216.0f && ((long)y % 2) != 0;
    if (x == 0.0f) {
        float mag = y < 0.0f ? TN_INF : 0.0f;
        return y_odd ? tn_copysign(mag, x) : mag;
    }
    if (tn_is_inf(x)) {
        float mag = y < 0.0f ? 0.0f : TN_INF;
        return (x < 0.0f && y_odd) ? -mag : mag;
    }
    if (tn_is_inf(y)) {
        float a = tn_abs(x);
        if (a == 1.0f) {
            return 1.0f;
        }
        return ((a < 1.0f) == (y < 0.0f)) ? TN_INF : 0.0f;
    }
    if (x < 0.0f && !y_int) {
        return TN_NAN;
    }
#if TN_HAVE_FP64
    float mag = (float)tn_exp64((double)y * tn_log64((double)tn_abs(x)));
    return (x < 0.0f && y_odd) ? -mag : mag;
#else
    return TN_NAN;
#endif
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops (interp.rs `unary_f32`, `binary_f32`, `fmax`, `fmin`, `compare`).

// max with the reference's rules: NaN if either is NaN; +0 over -0.
float tn_fmax(float a, float b) {
    if (tn_is_nan(a) || tn_is_nan(b)) {
        return TN_NAN;
    }
    if (a > b) {
        return a;
    }
    if (b > a) {
        return b;
    }
    return tn_sign_negative(a) ? b : a;
}

// min with the reference's rules: NaN if either is NaN; -0 over +0.
float tn_fmin(float a, float b) {
    if (tn_is_nan(a) || tn_is_nan(b)) {
        return TN_NAN;
    }
    if (a < b) {
        return a;
    }
    if (b < a) {
        return b;
    }
    return tn_sign_negative(a) ? a : b;
}

float tn_sigmoid(float x) {
    return 1.0f / (1.0f + tn_exp(-x));
}

float tn_relu(float x) {
    if (tn_is_nan(x)) {
        return TN_NAN;
    }
    return x > 0.0f ? x : 0.0f;
}

float tn_gelu_erf(float x) {
    // x * (1/sqrt 2) with f32 FRAC_1_SQRT_2.
    return (x * 0.5f) * (1.0f + tn_erf(x * TN_F32(0x3f3504f3u)));
}

float tn_gelu_tanh(float x) {
    // 0.044715 and 0.7978846 (sqrt(2/pi)) as f32.
    float u = (x + TN_F32(0x3d372713u) * ((x * x) * x)) * TN_F32(0x3f4c422au);
    return (x * 0.5f) * (1.0f + tn_tanh(u));
}

// sign: NaN, +-1, or the zero itself (keeping its sign).
float tn_sign(float x) {
    if (tn_is_nan(x)) {
        return TN_NAN;
    }
    if (x > 0.0f) {
        return 1.0f;
    }
    if (x < 0.0f) {
        return -1.0f;
    }
    return x;
}

// One float element of a unary op, before rounding to the storage type. `Not` (bool only)
// gives NaN, as in the reference.
float tn_unary(int op, float x) {
    switch (op) {
    case TN_UNARY_NEG:
        // The sign bit alone: NVIDIA's `-x` on a NaN gives its own canonical NaN (0x7fffffff),
        // where the reference keeps the payload and flips the sign.
        return as_float(as_uint(x) ^ 0x80000000u);
    case TN_UNARY_ABS:
        return tn_abs(x);
    case TN_UNARY_EXP:
        return tn_exp(x);
    case TN_UNARY_LOG:
        return tn_log(x);
    case TN_UNARY_SQRT:
        return sqrt(x);
    case TN_UNARY_RSQRT:
        // A correctly rounded square root and division, never the approximate rsqrt().
        return 1.0f / sqrt(x);
    case TN_UNARY_RECIPROCAL:
        return 1.0f / x;
    case TN_UNARY_SIN:
        return tn_sin(x);
    case TN_UNARY_COS:
        return tn_cos(x);
    case TN_UNARY_TANH:
        return tn_tanh(x);
    case TN_UNARY_SIGMOID:
        return tn_sigmoid(x);
    case TN_UNARY_RELU:
        return tn_relu(x);
    case TN_UNARY_GELU_ERF:
        return tn_gelu_erf(x);
    case TN_UNARY_GELU_TANH:
        return tn_gelu_tanh(x);
    case TN_UNARY_ERF:
        return tn_erf(x);
    case TN_UNARY_FLOOR:
        return floor(x);
    case TN_UNARY_CEIL:
        return ceil(x);
    case TN_UNARY_ROUND:
        // Rust's round_ties_even; rint rounds to nearest even in the default mode.
        return rint(x);
    case TN_UNARY_SIGN:
        return tn_sign(x);
    default:
        return TN_NAN;
    }
}

// One element of a float arithmetic binary op, before rounding to the storage type.
// Comparisons and logic give NaN here, as in the reference; see `tn_compare`.
float tn_binary(int op, float a, float b) {
    switch (op) {
    case TN_BINARY_ADD:
        return a + b;
    case TN_BINARY_SUB:
        return a - b;
    case TN_BINARY_MUL:
        return a * b;
    case TN_BINARY_DIV:
        return a / b;
    case TN_BINARY_POW:
        return tn_pow(a, b);
    case TN_BINARY_MAX:
        return tn_fmax(a, b);
    case TN_BINARY_MIN:
        return tn_fmin(a, b);
    default:
        return TN_NAN;
    }
}

// A float comparison (IEEE: every comparison with NaN is false except `ne`); 1 or 0. Tags
// other than the six comparisons give 0.
int tn_compare(int op, float a, float b) {
    switch (op) {
    case TN_BINARY_EQ:
        return a == b;
    case TN_BINARY_NE:
        return !(a == b);
    case TN_BINARY_LT:
        return a < b;
    case TN_BINARY_LE:
        return a <= b;
    case TN_BINARY_GT:
        return a > b;
    case TN_BINARY_GE:
        return a >= b;
    default:
        return 0;
    }
}
