//! The determinism check a device runs when it opens: a short program, built exactly as every
//! other program is (`source::preamble` + kernels, `source::build_options`), that asks the
//! device the questions the exact tier depends on and compares the answers with what the host
//! computes in Rust (the reference's own functions):
//!
//! 1. `fma()` is fused (one rounding);
//! 2. `a*b+c` written plainly is not fused (contraction is off);
//! 3. `/` and `sqrt` are correctly rounded, on quotients and roots next to a rounding tie;
//! 4. denormals are kept, as operands, as results, and through arithmetic and comparisons;
//! 5. the library's math (`tn_exp`, `tn_log`, `tn_tanh`, `tn_erf`, `tn_sin`, `tn_cos`,
//!    `tn_pow` — whose core needs fp64 — and every float unary/binary op) gives the
//!    reference's bits;
//! 6. the f16/bf16 conversions give `half`'s bits.
//!
//! Every input comes from a buffer, never a literal, so the device's compiler cannot fold a
//! case at build time on the host's arithmetic. The first property that fails is reported with
//! its case. Nothing here panics: a build or runtime error is a failed check. Buffers and the
//! launch go through `cl_api`, the crate's one module of `unsafe` OpenCL calls.

use half::{bf16, f16};
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::kernel::Kernel;
use opencl3::program::Program;
use tenet_exec::ExactCheck;
use tenet_ir::{BinaryOp, UnaryOp};
use tenet_reference::{binary_f32, math, unary_f32};

use crate::cl_api::{KernelArg, Mem, launch};
use crate::source::{Quirks, build_options, preamble};

/// The check's kernel: case `i` applies operation `op[i]` to the words `a[i]`, `b[i]`, `c[i]`.
/// Operation numbers are [`Case::op`]'s.
const CHECK_KERNEL: &str = r#"
kernel void tn_check(global const uint* op, global const uint* a, global const uint* b,
                     global const uint* c, global uint* out) {
    size_t i = get_global_id(0);
    uint o = op[i];
    float x = as_float(a[i]), y = as_float(b[i]), z = as_float(c[i]);
    uint r;
    switch (o) {
    case 0: r = as_uint(fma(x, y, z)); break;
    case 1: r = as_uint(x * y + z); break;
    case 2: r = as_uint(x / y); break;
    case 3: r = as_uint(sqrt(x)); break;
    case 4: r = as_uint(x * y); break;
    case 5: r = as_uint(x + y); break;
    case 6: r = as_uint(x - y); break;
    case 7: r = (uint)(x > y); break;
    case 8: r = as_uint(tn_exp(x)); break;
    case 9: r = as_uint(tn_log(x)); break;
    case 10: r = as_uint(tn_tanh(x)); break;
    case 11: r = as_uint(tn_erf(x)); break;
    case 12: r = as_uint(tn_sin(x)); break;
    case 13: r = as_uint(tn_cos(x)); break;
    case 14: r = as_uint(tn_pow(x, y)); break;
    case 15: r = as_uint(tn_canonical(tn_unary((int)c[i], x))); break;
    case 16: r = as_uint(tn_canonical(tn_binary((int)c[i], x, y))); break;
    case 17: r = as_uint(tn_f16_to_f32((ushort)a[i])); break;
    case 18: r = (uint)tn_f32_to_f16(x); break;
    case 19: r = as_uint(tn_bf16_to_f32((ushort)a[i])); break;
    case 20: r = (uint)tn_f32_to_bf16(x); break;
    default: r = TN_HAVE_FP64; break;
    }
    out[i] = r;
}
"#;

/// The properties, in the order they are checked and reported.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Property {
    Fma,
    Contraction,
    DivSqrt,
    Denormals,
    Math,
    Conversions,
}

impl Property {
    fn describe(self) -> &'static str {
        match self {
            Property::Fma => "fma() is not fused",
            Property::Contraction => "a*b+c was fused (contraction is on)",
            Property::DivSqrt => "division or sqrt is not correctly rounded",
            Property::Denormals => "denormals are flushed to zero",
            Property::Math => "the library's math differs from the reference",
            Property::Conversions => "an f16/bf16 conversion differs from the reference",
        }
    }
}

/// One question to the device: an operation on up to three words, and the answer expected.
struct Case {
    property: Property,
    op: u32,
    a: u32,
    b: u32,
    c: u32,
    want: u32,
}

const FMA: u32 = 0;
const MUL_ADD: u32 = 1;
const DIV: u32 = 2;
const SQRT: u32 = 3;
const MUL: u32 = 4;
const ADD: u32 = 5;
const SUB: u32 = 6;
const GT: u32 = 7;
const EXP: u32 = 8;
const LOG: u32 = 9;
const TANH: u32 = 10;
const ERF: u32 = 11;
const SIN: u32 = 12;
const COS: u32 = 13;
const POW: u32 = 14;
const UNARY: u32 = 15;
const BINARY: u32 = 16;
const F16_TO_F32: u32 = 17;
const F32_TO_F16: u32 = 18;
const BF16_TO_F32: u32 = 19;
const F32_TO_BF16: u32 = 20;
const HAVE_FP64: u32 = 21;

impl Case {
    /// A float case whose expected answer the host computes with `f`.
    fn float(
        property: Property,
        op: u32,
        a: f32,
        b: f32,
        c: f32,
        f: impl Fn(f32, f32, f32) -> f32,
    ) -> Case {
        Case {
            property,
            op,
            a: a.to_bits(),
            b: b.to_bits(),
            c: c.to_bits(),
            want: f(a, b, c).to_bits(),
        }
    }

    fn describe(&self, got: u32) -> String {
        let f = |w: u32| format!("{:e} ({w:#010x})", f32::from_bits(w));
        let (a, b, c) = (f(self.a), f(self.b), f(self.c));
        let case = match self.op {
            FMA => format!("fma({a}, {b}, {c})"),
            MUL_ADD => format!("{a}*{b}+{c}"),
            DIV => format!("{a}/{b}"),
            SQRT => format!("sqrt({a})"),
            MUL => format!("{a}*{b}"),
            ADD => format!("{a}+{b}"),
            SUB => format!("{a}-{b}"),
            GT => format!("{a} > {b}"),
            EXP => format!("tn_exp({a})"),
            LOG => format!("tn_log({a})"),
            TANH => format!("tn_tanh({a})"),
            ERF => format!("tn_erf({a})"),
            SIN => format!("tn_sin({a})"),
            COS => format!("tn_cos({a})"),
            POW => format!("tn_pow({a}, {b})"),
            UNARY => format!("tn_unary({}, {a})", op_name(UnaryOp::ALL, self.c)),
            BINARY => format!("tn_binary({}, {a}, {b})", op_name(BinaryOp::ALL, self.c)),
            F16_TO_F32 => format!("tn_f16_to_f32({:#06x})", self.a),
            F32_TO_F16 => format!("tn_f32_to_f16({a})"),
            BF16_TO_F32 => format!("tn_bf16_to_f32({:#06x})", self.a),
            F32_TO_BF16 => format!("tn_f32_to_bf16({a})"),
            _ => "fp64 support".into(),
        };
        let (got, want) = match self.op {
            F32_TO_F16 | F32_TO_BF16 | GT => (format!("{got:#06x}"), format!("{:#06x}", self.want)),
            _ => (f(got), f(self.want)),
        };
        format!(
            "{}: {case} gave {got}, expected {want}",
            self.property.describe()
        )
    }
}

fn op_name<T: Copy + std::fmt::Debug>(all: &[T], tag: u32) -> String {
    all.get(tag as usize)
        .map_or_else(|| tag.to_string(), |o| format!("{o:?}"))
}

/// A fixed pseudo-random stream (xorshift64), so the check asks the same questions each time.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    /// A float of either sign with magnitude in [2^lo, 2^hi).
    fn float(&mut self, lo: i32, hi: i32) -> f32 {
        let e = lo + (self.next() % (hi - lo) as u32) as i32;
        let sign = self.next() & 0x8000_0000;
        f32::from_bits(sign | (((e + 127) as u32) << 23) | (self.next() & 0x007f_ffff))
    }
}

fn bits(b: u32) -> f32 {
    f32::from_bits(b)
}

/// Every question, in property order.
fn cases() -> Vec<Case> {
    use Property::*;
    let mut v = Vec::new();
    let fma = |a: f32, b: f32, c: f32| a.mul_add(b, c);
    let mul_add = |a: f32, b: f32, c: f32| a * b + c;
    let one_up = bits(0x3f80_0001); // 1 + 2^-23

    // 1. fma fused: (1 + 2^-23)^2 - (1 + 2^-22) is 2^-46 exactly, 0 if the product rounds.
    v.push(Case::float(
        Fma,
        FMA,
        one_up,
        one_up,
        -bits(0x3f80_0002),
        fma,
    ));
    v.push(Case::float(
        Fma,
        FMA,
        bits(0x3fa0_0001),
        bits(0x4040_0003),
        -bits(0x4070_0004),
        fma,
    ));

    // 2. contraction off: the same expressions written plainly round the product.
    v.push(Case::float(
        Contraction,
        MUL_ADD,
        one_up,
        one_up,
        -bits(0x3f80_0002),
        mul_add,
    ));
    v.push(Case::float(
        Contraction,
        MUL_ADD,
        bits(0x3fa0_0001),
        bits(0x4040_0003),
        -bits(0x4070_0004),
        mul_add,
    ));

    // 3. division and sqrt next to a rounding tie (found by search: the exact result is within
    // 1e-5 ulp of a midpoint, and a·(1/b) rounds the other way), then pseudo-random ones.
    const DIVS: [(u32, u32); 8] = [
        (0x3f8b_c272, 0x3fdc_0976),
        (0x3fe5_78e5, 0x3f82_2b54),
        (0x3ff1_b9fe, 0x3fec_e50d),
        (0x3fd7_8b56, 0x3fca_31c0),
        (0x3f8e_9437, 0x3ff8_64df),
        (0x3fb7_7b82, 0x3fe5_b5f5),
        (0x3fac_0eb6, 0x3ffb_3b2b),
        (0x3fc6_1f72, 0x3f9a_0fcc),
    ];
    const SQRTS: [u32; 8] = [
        0x4056_2616,
        0x4055_aaf6,
        0x404f_0582,
        0x3fc6_e47e,
        0x3fb7_18b0,
        0x4070_5e84,
        0x3fbf_bd10,
        0x3fcd_8800,
    ];
    let div = |a: f32, b: f32, _: f32| a / b;
    let sqrt = |a: f32, _: f32, _: f32| a.sqrt();
    for (a, b) in DIVS {
        v.push(Case::float(DivSqrt, DIV, bits(a), bits(b), 0.0, div));
    }
    for a in SQRTS {
        v.push(Case::float(DivSqrt, SQRT, bits(a), 0.0, 0.0, sqrt));
    }
    let mut s = Stream(0x9e37_79b9_7f4a_7c15);
    for _ in 0..64 {
        let (a, b) = (s.float(-60, 60), s.float(-60, 60));
        v.push(Case::float(DivSqrt, DIV, a, b, 0.0, div));
        let r = s.float(-100, 100).abs();
        v.push(Case::float(DivSqrt, SQRT, r, 0.0, 0.0, sqrt));
    }

    // 4. denormals kept: as operands, as results, through +, -, *, /, sqrt, fma, comparison.
    let min_normal = f32::MIN_POSITIVE;
    let tiny = bits(1);
    let add = |a: f32, b: f32, _: f32| a + b;
    let sub = |a: f32, b: f32, _: f32| a - b;
    let mul = |a: f32, b: f32, _: f32| a * b;
    v.push(Case::float(Denormals, MUL, tiny, 2.0, 0.0, mul));
    v.push(Case::float(Denormals, MUL, min_normal, 0.5, 0.0, mul));
    v.push(Case::float(
        Denormals,
        MUL,
        bits(0x2000_0000),
        bits(0x1f00_0000),
        0.0,
        mul,
    ));
    v.push(Case::float(Denormals, ADD, bits(3), bits(5), 0.0, add));
    v.push(Case::float(
        Denormals,
        SUB,
        min_normal * 1.5,
        min_normal,
        0.0,
        sub,
    ));
    v.push(Case::float(Denormals, DIV, bits(2), 2.0, 0.0, div));
    v.push(Case::float(Denormals, DIV, 1.0, f32::MAX, 0.0, div));
    v.push(Case::float(Denormals, SQRT, tiny, 0.0, 0.0, sqrt));
    v.push(Case::float(
        Denormals,
        FMA,
        bits(0x0040_0000),
        2.0,
        tiny,
        fma,
    ));
    v.push(Case {
        property: Denormals,
        op: GT,
        a: 1,
        b: 0,
        c: 0,
        want: 1,
    });

    // 5. the library's math: boundaries of each function's branches and pseudo-random values.
    type F = fn(f32) -> f32;
    let functions: [(u32, F, &[f32]); 6] = [
        (
            EXP,
            math::exp,
            &[1.0, -0.0, 88.7, 89.5, -87.5, -103.97, -104.5, 0.346_573_6],
        ),
        (
            LOG,
            math::log,
            &[
                bits(1),
                bits(0x007f_ffff),
                std::f32::consts::SQRT_2,
                bits(0x3fb5_04f4), // just above sqrt 2
                3.0,
                0.1,
                f32::MAX,
            ],
        ),
        (
            TANH,
            math::tanh,
            &[0.549_999_95, 0.55, -0.3, 5.0, 9.01, 9.02, bits(1)],
        ),
        (
            ERF,
            math::erf,
            &[
                0.999_999_94,
                1.0,
                -0.5,
                3.999_999_8,
                4.0,
                2.5,
                bits(0x0040_0000),
            ],
        ),
        (
            SIN,
            math::sin,
            &[
                1e5,
                std::f32::consts::FRAC_PI_4,
                1e30,
                6_588_397.5,
                3.0,
                1.0 / 4096.0,
                bits(0x8000_0001),
            ],
        ),
        (
            COS,
            math::cos,
            &[3.0, std::f32::consts::FRAC_PI_2, 1e5, 1e20, 0.000_244_140_6],
        ),
    ];
    for (op, f, hard) in functions {
        let values = hard.iter().copied().chain((0..12).map(|_| s.float(-8, 4)));
        for x in values {
            v.push(Case::float(Math, op, x, 0.0, 0.0, |a, _, _| f(a)));
        }
    }
    let pow = |a: f32, b: f32, _: f32| math::pow(a, b);
    let pows: [(f32, f32); 10] = [
        (2.0, 0.5),
        (-2.0, 3.0),
        (1.000_000_1, 1e7),
        (10.0, -38.0),
        (10.0, -45.0),
        (0.5, 149.0),
        (3.0, 80.5),
        (-0.0, -3.0),
        (7.5, -2.25),
        (1.5, 218.0),
    ];
    for (a, b) in pows {
        v.push(Case::float(Math, POW, a, b, 0.0, pow));
    }
    for _ in 0..16 {
        let (a, b) = (s.float(-4, 4).abs(), s.float(-3, 5));
        v.push(Case::float(Math, POW, a, b, 0.0, pow));
    }
    // Every float elementwise op on a few values (canonical NaN, as stored).
    let xs = [
        -2.5f32,
        -0.0,
        0.5,
        1.0,
        2.5,
        std::f32::consts::FRAC_1_SQRT_2,
        -3.1,
        bits(0x0000_0007),
    ];
    for &op in UnaryOp::ALL.iter().filter(|&&o| o != UnaryOp::Not) {
        for &x in &xs {
            v.push(Case::float(
                Math,
                UNARY,
                x,
                0.0,
                bits(op.tag() as u32),
                |a, _, _| math::canonical(unary_f32(op, a)),
            ));
        }
    }
    let arithmetic = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
    ];
    for op in arithmetic {
        for (&x, &y) in xs.iter().zip(xs.iter().rev()) {
            v.push(Case::float(
                Math,
                BINARY,
                x,
                y,
                bits(op.tag() as u32),
                |a, b, _| math::canonical(binary_f32(op, a, b)),
            ));
        }
    }

    // 6. conversions: subnormals, NaN payloads, the overflow edge, ties.
    for h in [
        0x0001u16, 0x03ff, 0x8001, 0x7bff, 0x7c00, 0x7c01, 0xfe00, 0x3c01,
    ] {
        v.push(Case {
            property: Conversions,
            op: F16_TO_F32,
            a: h as u32,
            b: 0,
            c: 0,
            want: f16::from_bits(h).to_f32().to_bits(),
        });
    }
    for x in [
        65519.996f32,
        65520.0,
        bits(0x3300_0000), // 2^-25: a tie, to 0
        bits(0x3300_0001),
        bits(0x33c0_0000), // 1.5 * 2^-24: a tie, to 2 * 2^-24
        bits(0x3f80_1000), // a tie in the normal range, to even
        bits(0x3f80_3000),
        bits(0x7f80_0001),
        bits(0xffc1_2345),
        bits(1),
    ] {
        v.push(Case {
            property: Conversions,
            op: F32_TO_F16,
            a: x.to_bits(),
            b: 0,
            c: 0,
            want: f16::from_f32(x).to_bits() as u32,
        });
    }
    for h in [0x0001u16, 0x807f, 0x7f80, 0x7f81, 0xffc1, 0x3f81] {
        v.push(Case {
            property: Conversions,
            op: BF16_TO_F32,
            a: h as u32,
            b: 0,
            c: 0,
            want: bf16::from_bits(h).to_f32().to_bits(),
        });
    }
    for x in [
        0x3f80_8000u32,
        0x3f81_8000,
        0x0001_8000,
        0x0000_8001,
        0x7f7f_ffff,
        0x7f80_0001,
        0xff81_2345,
    ] {
        v.push(Case {
            property: Conversions,
            op: F32_TO_BF16,
            a: x,
            b: 0,
            c: 0,
            want: bf16::from_f32(bits(x)).to_bits() as u32,
        });
    }
    v
}

/// Decide whether the device behind `context`/`queue` gives the reference's bits.
pub(crate) fn self_test(context: &Context, queue: &CommandQueue, quirks: &Quirks) -> ExactCheck {
    match run(context, queue, quirks) {
        Ok(None) => ExactCheck::Passed,
        Ok(Some(reason)) => ExactCheck::Failed(reason),
        Err(e) => ExactCheck::Failed(e),
    }
}

/// Build and run the check: `Ok(None)` if every answer is right, `Ok(Some(reason))` for the
/// first wrong one, `Err` if the device could not be asked.
fn run(context: &Context, queue: &CommandQueue, quirks: &Quirks) -> Result<Option<String>, String> {
    let source = preamble(quirks) + CHECK_KERNEL;
    let program = Program::create_and_build_from_source(context, &source, &build_options(quirks))
        .map_err(|log| format!("the determinism check does not build: {log}"))?;
    let kernel =
        Kernel::create(&program, "tn_check").map_err(|e| format!("the check's kernel: {e}"))?;

    let mut cases = cases();
    // Last: whether the library could enable fp64 (pow's core). Asked with the others.
    cases.push(Case {
        property: Property::Math,
        op: HAVE_FP64,
        a: 0,
        b: 0,
        c: 0,
        want: 1,
    });
    let column = |f: fn(&Case) -> u32| -> Vec<u8> {
        cases.iter().flat_map(|c| f(c).to_ne_bytes()).collect()
    };
    let inputs = [
        column(|c| c.op),
        column(|c| c.a),
        column(|c| c.b),
        column(|c| c.c),
    ];
    let n = cases.len();
    let fail = |e: tenet_exec::ExecError| format!("the determinism check could not run: {e}");
    let mut buffers = Vec::with_capacity(5);
    for bytes in &inputs {
        let m = Mem::alloc(context, bytes.len() as u64).map_err(fail)?;
        m.write(queue, 0, bytes).map_err(fail)?;
        buffers.push(m);
    }
    buffers.push(Mem::alloc(context, 4 * n as u64).map_err(fail)?);
    let args: Vec<KernelArg<'_>> = buffers.iter().map(KernelArg::Mem).collect();
    // The kernel reads and writes only index get_global_id(0) < n of each buffer.
    launch(queue, &kernel, &args, n).map_err(fail)?;
    let mut bytes = vec![0u8; 4 * n];
    buffers[4].read(queue, 0, &mut bytes).map_err(fail)?;
    let out: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();

    let first_wrong = cases.iter().zip(&out).find(|(c, got)| **got != c.want);
    // Without fp64 the pow cases fail too: say why, unless something more basic failed first.
    let have_fp64 = out[n - 1] == 1;
    if !have_fp64 && first_wrong.is_none_or(|(c, _)| c.property >= Property::Math) {
        return Ok(Some(
            "the device has no fp64 (cl_khr_fp64): pow's f64 core cannot give the reference's bits"
                .into(),
        ));
    }
    // Cases are in property order: the first wrong answer names the first failing property.
    Ok(first_wrong.map(|(c, &got)| c.describe(got)))
}
