//! The OpenCL C library (`src/cl/*.cl`) bit for bit against the Rust it ports: the reference's
//! math (`tenet_reference::math`), its float elementwise ops (`unary_f32`, `binary_f32`, the
//! comparisons), Philox and the random ops' values (`tenet_reference::eval_op` on `Random`),
//! and the `half` crate's f16/bf16 conversions, on the first OpenCL device found.
//!
//! Inputs: hand-picked hard cases (zeros, infinities, NaNs with payloads, subnormals, the
//! extremes of the normals, every branch boundary of every function and its neighbours in
//! ulps, huge arguments for sin/cos), ~100k random bit patterns and ~100k random moderate
//! values; every f16 and bf16 pattern for the conversions, and every f16/bf16 rounding tie.
//!
//! Skips (prints a line and passes) when no OpenCL platform or device is present, unless
//! `TENET_REQUIRE_OPENCL=1`.

// The library's source and options, compiled into this test from the crate's own file (the
// module is private to the crate).
#[allow(dead_code)]
#[path = "../src/source.rs"]
mod source;

use std::ptr;
use std::sync::OnceLock;

use half::{bf16, f16};
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device};
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_ONLY, CL_MEM_WRITE_ONLY, ClMem};
use opencl3::platform::get_platforms;
use opencl3::program::Program;
use opencl3::types::CL_BLOCKING;
use tenet_ir::{BinaryOp, DType, Distribution, NodeId, Op, TensorType, UnaryOp};
use tenet_reference::{binary_f32, math, philox, unary_f32};

use source::{MATH_CL, Quirks, build_options, preamble};

/// Test kernels: all take the same arguments (two input word buffers, one output word buffer,
/// an int selector), so one launcher serves them all. Floats travel as their bits.
const TEST_KERNELS: &str = r#"
kernel void t_unary(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    out[i] = as_uint(tn_unary(op, as_float(a[i])));
}
kernel void t_binary(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    out[i] = as_uint(tn_binary(op, as_float(a[i]), as_float(b[i])));
}
kernel void t_compare(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    out[i] = (uint)tn_compare(op, as_float(a[i]), as_float(b[i]));
}
kernel void t_math(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    float x = as_float(a[i]);
    float r;
    switch (op) {
    case 0: r = tn_canonical(x); break;
    case 1: r = tn_exp(x); break;
    case 2: r = tn_log(x); break;
    case 3: r = tn_sin(x); break;
    case 4: r = tn_cos(x); break;
    case 5: r = tn_tanh(x); break;
    case 6: r = tn_erf(x); break;
    default: r = tn_pow(x, as_float(b[i])); break;
    }
    out[i] = as_uint(r);
}
kernel void t_convert(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    uint x = a[i];
    switch (op) {
    case 0: out[i] = as_uint(tn_f16_to_f32((ushort)x)); break;
    case 1: out[i] = (uint)tn_f32_to_f16(as_float(x)); break;
    case 2: out[i] = as_uint(tn_bf16_to_f32((ushort)x)); break;
    default: out[i] = (uint)tn_f32_to_bf16(as_float(x)); break;
    }
}
#if TN_HAVE_FP64
kernel void t_math64(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    double x = as_double((ulong)a[2 * i] | ((ulong)a[2 * i + 1] << 32));
    ulong r = as_ulong(op == 0 ? tn_exp64(x) : tn_log64(x));
    out[2 * i] = (uint)r;
    out[2 * i + 1] = (uint)(r >> 32);
}
#endif
kernel void t_philox(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    uint4 c = (uint4)(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
    uint2 k = (uint2)(b[2 * i], b[2 * i + 1]);
    vstore4(tn_philox4x32_10(c, k), i, out);
}
ulong t_u64(global const uint* a, size_t at) {
    return (ulong)a[at] | ((ulong)a[at + 1] << 32);
}
kernel void t_random(global const uint* a, global const uint* b, global uint* out, int op) {
    size_t i = get_global_id(0);
    ulong seed = t_u64(a, 6 * i), key = t_u64(a, 6 * i + 2), index = t_u64(a, 6 * i + 4);
    switch (op) {
    case 0: vstore4(tn_philox_words(seed, key, index), i, out); break;
    case 1: out[i] = as_uint(tn_random_uniform(seed, key, index)); break;
    default: out[i] = as_uint(tn_random_normal(seed, key, index)); break;
    }
}
"#;

struct Env {
    context: Context,
    queue: CommandQueue,
    program: Program,
    device: String,
}

/// The first OpenCL device, with the library and the test kernels built; `None` (after saying
/// so) when there is none and OpenCL is not required.
fn env() -> Option<&'static Env> {
    static ENV: OnceLock<Option<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
        let device = match first_device() {
            Ok(d) => d,
            Err(why) => {
                assert!(!required, "TENET_REQUIRE_OPENCL=1 but {why}");
                eprintln!("skipping the OpenCL library tests: {why}");
                return None;
            }
        };
        let name = device.name().unwrap_or_default();
        let context = Context::from_device(&device).expect("an OpenCL context");
        #[allow(deprecated)] // clCreateCommandQueue: present on OpenCL 1.2 devices too
        let queue = CommandQueue::create_default(&context, 0).expect("a command queue");
        let q = Quirks::default();
        let src = preamble(&q) + TEST_KERNELS;
        let program = Program::create_and_build_from_source(&context, &src, &build_options(&q))
            .unwrap_or_else(|log| panic!("the library does not build on {name}:\n{log}"));
        eprintln!("OpenCL library tests on {name}");
        Some(Env {
            context,
            queue,
            program,
            device: name,
        })
    })
    .as_ref()
}

fn first_device() -> Result<Device, String> {
    let platforms = get_platforms().map_err(|e| format!("no OpenCL runtime ({e})"))?;
    for p in &platforms {
        if let Ok(ids) = p.get_devices(CL_DEVICE_TYPE_ALL)
            && let Some(&id) = ids.first()
        {
            return Ok(Device::new(id));
        }
    }
    Err(format!("no OpenCL device ({} platforms)", platforms.len()))
}

impl Env {
    /// Run `kernel` over `n` work-items with input words `a` and `b` and selector `op`;
    /// returns `n * per_item` output words.
    fn launch(
        &self,
        kernel: &str,
        a: &[u32],
        b: &[u32],
        op: i32,
        n: usize,
        per_item: usize,
    ) -> Vec<u32> {
        let mut out = vec![0u32; n * per_item];
        if n == 0 {
            return out;
        }
        let dummy = [0u32];
        let b = if b.is_empty() { &dummy[..] } else { b };
        // SAFETY (of the whole block): the buffers are created from live slices and copied at
        // creation; the kernel's arguments match its signature; the output is read blocking.
        unsafe {
            let ba = Buffer::<u32>::create(
                &self.context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                a.len(),
                a.as_ptr() as *mut _,
            )
            .expect("input buffer");
            let bb = Buffer::<u32>::create(
                &self.context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                b.len(),
                b.as_ptr() as *mut _,
            )
            .expect("input buffer");
            let bo =
                Buffer::<u32>::create(&self.context, CL_MEM_WRITE_ONLY, out.len(), ptr::null_mut())
                    .expect("output buffer");
            let k = Kernel::create(&self.program, kernel).expect("kernel");
            k.set_arg(0, &ba.get()).unwrap();
            k.set_arg(1, &bb.get()).unwrap();
            k.set_arg(2, &bo.get()).unwrap();
            k.set_arg(3, &op).unwrap();
            let global = [n];
            self.queue
                .enqueue_nd_range_kernel(k.get(), 1, ptr::null(), global.as_ptr(), ptr::null(), &[])
                .expect("enqueue");
            self.queue
                .enqueue_read_buffer(&bo, CL_BLOCKING, 0, &mut out, &[])
                .expect("read");
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs.

/// splitmix64: a fixed stream of test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
    /// A float of either sign with its exponent field in `lo..=hi`.
    fn float_exp(&mut self, lo: u32, hi: u32) -> u32 {
        let r = self.u32();
        let e = lo + (r % (hi - lo + 1));
        (self.u32() & 0x807f_ffff) | (e << 23)
    }
}

/// Each value and its neighbours up to `ulps` away, in both signs.
fn around(values: &[f32], ulps: i32, out: &mut Vec<u32>) {
    for &v in values {
        let b = v.abs().to_bits() as i64;
        for d in -ulps..=ulps {
            let n = b + d as i64;
            if (0..=0x7f80_0000).contains(&n) {
                out.push(n as u32);
                out.push(n as u32 | 0x8000_0000);
            }
        }
    }
}

/// Special values every function sees.
fn specials() -> Vec<u32> {
    let mut v = vec![
        0x0000_0000,
        0x8000_0000, // ±0
        0x7f80_0000,
        0xff80_0000, // ±inf
        0x7fc0_0000,
        0xffc0_0000,
        0x7fc0_0001,
        0x7fff_ffff,
        0xffff_ffff, // quiet NaNs
        0x7f80_0001,
        0x7fa0_0000,
        0x7fbf_ffff,
        0xff80_0001, // signalling NaNs
        0x0000_0001,
        0x0000_0002,
        0x0000_0003,
        0x0040_0000,
        0x007f_ffff,
        0x0012_3456, // subnormals
        0x0080_0000,
        0x0080_0001,
        0x00ff_ffff, // smallest normals
        0x7f7f_ffff,
        0x7f7f_fffe,
        0x7f00_0000, // largest normals
        0x3f80_0000,
        0x3f7f_ffff,
        0x3f80_0001,
        0x4000_0000,
        0x3f00_0000,
    ];
    let neg: Vec<u32> = v.iter().map(|b| b ^ 0x8000_0000).collect();
    v.extend(neg);
    v
}

/// Branch boundaries of the library's functions (and the constants they compare with).
fn boundaries() -> Vec<u32> {
    use std::f32::consts::*;
    let mut out = Vec::new();
    let mut vals = vec![
        // exp: the clamp, overflow and underflow edges, the ties of k's rounding.
        -104.0,
        89.0,
        88.72284,
        88.7,
        -87.33655,
        -103.27893,
        -103.972,
        -100.0,
        -126.0 * LN_2,
        -149.0 * LN_2,
        -150.0 * LN_2,
        0.5 * LN_2,
        1.5 * LN_2,
        2.5 * LN_2,
        0.35,
        1e-8,
        // log: the subnormal scaling, the mantissa split at sqrt 2, 1.
        f32::MIN_POSITIVE,
        SQRT_2,
        0.5 * SQRT_2,
        2.0 * SQRT_2,
        1.0,
        2.0,
        0.5,
        10.0,
        1e30,
        // sin/cos: TINY, the quadrant edges, the 2^22 switch of the reduction, huge arguments.
        1.0 / 4096.0,
        FRAC_PI_4,
        FRAC_PI_2,
        PI,
        3.0 * FRAC_PI_2,
        2.0 * PI,
        3.0 * FRAC_PI_4,
        5.0 * FRAC_PI_4,
        100.0 * PI,
        1e5,
        1.5e5,
        3e5,
        4_194_304.0 / FRAC_2_PI,
        6_588_397.0,
        8_388_608.0 / FRAC_2_PI,
        16_777_216.0 / FRAC_2_PI,
        1e7,
        1e10,
        1e20,
        1e30,
        3e38,
        102_943.7,
        // tanh and erf: the polynomial / exp / saturated edges.
        0.55,
        9.01,
        4.0,
        1.0,
        0.625,
        8.0,
        10.0,
        // gelu_erf's erf argument crosses 1 and 4 at x = sqrt 2 and 4 sqrt 2.
        SQRT_2 * 4.0,
        5.656854,
        // round: ties and the end of fractional values; floor/ceil.
        0.5,
        1.5,
        2.5,
        3.5,
        0.49999997,
        8_388_607.5,
        8_388_608.0,
        4_194_303.5,
        4_194_304.5,
        16_777_215.0,
        16_777_216.0,
        0.1,
        0.9,
        0.999_999_94,
    ];
    // Multiples of pi/2 (where the quadrant reduction is hardest).
    for k in 1..64 {
        vals.push(k as f32 * FRAC_PI_2);
    }
    vals.extend((0..=30).map(|i| 2f32.powi(i) * FRAC_PI_2));
    around(&vals, 4, &mut out);
    out
}

/// The f32 inputs every unary function sees: specials, boundaries, random patterns.
fn unary_inputs() -> Vec<u32> {
    let mut v = specials();
    v.extend(boundaries());
    let mut rng = Rng(1);
    v.extend((0..100_000).map(|_| rng.u32()));
    // Moderate magnitudes (2^-20 .. 2^12), where the polynomial branches are.
    v.extend((0..100_000).map(|_| rng.float_exp(107, 139)));
    v
}

// ---------------------------------------------------------------------------------------------
// Comparison.

/// The first few mismatches between `got` and `want` (by `same`), as readable lines.
fn mismatches(
    what: &str,
    inputs: &dyn Fn(usize) -> String,
    got: &[u32],
    want: &[u32],
    same: &dyn Fn(u32, u32) -> bool,
) -> Vec<String> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !same(**g, **w))
        .take(8)
        .map(|(i, (g, w))| {
            format!(
                "{what}({}): got {:#010x} ({:e}), want {:#010x} ({:e})",
                inputs(i),
                g,
                f32::from_bits(*g),
                w,
                f32::from_bits(*w)
            )
        })
        .collect()
}

fn exact(g: u32, w: u32) -> bool {
    g == w
}

/// Bits equal, or both NaN: for results the reference leaves as the hardware's NaN (what is
/// stored is always the canonical NaN).
fn exact_or_nan(g: u32, w: u32) -> bool {
    g == w || (f32::from_bits(g).is_nan() && f32::from_bits(w).is_nan())
}

fn show(b: u32) -> String {
    format!("{:#010x} = {:e}", b, f32::from_bits(b))
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn math_functions_match_the_reference() {
    let Some(env) = env() else { return };
    let xs = unary_inputs();
    type F = fn(f32) -> f32;
    let fns: [(&str, F); 7] = [
        ("canonical", math::canonical),
        ("exp", math::exp),
        ("log", math::log),
        ("sin", math::sin),
        ("cos", math::cos),
        ("tanh", math::tanh),
        ("erf", math::erf),
    ];
    let mut bad = Vec::new();
    for (sel, (name, f)) in fns.iter().enumerate() {
        let got = env.launch("t_math", &xs, &[], sel as i32, xs.len(), 1);
        let want: Vec<u32> = xs.iter().map(|&x| f(f32::from_bits(x)).to_bits()).collect();
        // These functions return the canonical NaN themselves for NaN and infinite inputs,
        // so every bit must match; sin and cos of huge finite inputs reach a NaN inside their
        // polynomial, which is the hardware's own (x86: 0xffc00000, NVIDIA: 0x7fffffff) until
        // the op stores it as the canonical one.
        let same: &dyn Fn(u32, u32) -> bool = match *name {
            "sin" | "cos" => &exact_or_nan,
            _ => &exact,
        };
        bad.extend(mismatches(name, &|i| show(xs[i]), &got, &want, same));
    }
    assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
}

/// pow's f64 core, compared before its rounding to f32 hides most differences.
use tenet_reference::math as reference64;

#[test]
fn pow_core_in_f64_matches_the_reference() {
    let Some(env) = env() else { return };
    if !env.program.kernel_names().contains("t_math64") {
        eprintln!("skipping the f64 core: {} has no fp64", env.device);
        return;
    }
    let mut rng = Rng(5);
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1100.0,
        -1100.0,
        1100.5,
        -1100.5,
        709.78,
        -745.2,
        88.72,
        -103.3,
        0.5 * std::f64::consts::LN_2,
        1.5 * std::f64::consts::LN_2,
    ];
    xs.extend(
        (0..100_000).map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2400.0 - 1200.0),
    );
    xs.extend((0..50_000).map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0));
    let words = |v: &[f64]| -> Vec<u32> {
        v.iter()
            .flat_map(|x| [x.to_bits() as u32, (x.to_bits() >> 32) as u32])
            .collect()
    };
    let join = |w: &[u32]| -> Vec<u64> {
        w.chunks(2)
            .map(|c| c[0] as u64 | (c[1] as u64) << 32)
            .collect()
    };
    let got = join(&env.launch("t_math64", &words(&xs), &[], 0, xs.len(), 2));
    for (x, g) in xs.iter().zip(&got) {
        let w = reference64::exp64(*x).to_bits();
        assert_eq!(
            *g,
            w,
            "exp64({x:e}): got {:e}, want {:e}",
            f64::from_bits(*g),
            f64::from_bits(w)
        );
    }
    // log64 sees |x| of an f32 (normal in f64) in pow; test all positive normal f64 too.
    let mut ys: Vec<f64> = vec![
        std::f64::consts::SQRT_2,
        f64::from_bits(std::f64::consts::SQRT_2.to_bits() + 1),
        1.0,
        2.0,
        0.5,
        f64::MIN_POSITIVE,
        f64::MAX,
        1e-45,
    ];
    ys.extend((0..50_000).map(|_| {
        f64::from_bits((rng.next() & 0x7fff_ffff_ffff_ffff).clamp(1 << 52, 0x7fef_ffff_ffff_ffff))
    }));
    ys.extend(
        (0..50_000).map(|_| f32::from_bits(rng.u32() & 0x7f7f_ffff).max(f32::from_bits(1)) as f64),
    );
    ys.extend((0..50_000).map(|_| 0.5 + (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.5));
    let got = join(&env.launch("t_math64", &words(&ys), &[], 1, ys.len(), 2));
    for (y, g) in ys.iter().zip(&got) {
        let w = reference64::log64(*y).to_bits();
        assert_eq!(
            *g,
            w,
            "log64({y:e}): got {:e}, want {:e}",
            f64::from_bits(*g),
            f64::from_bits(w)
        );
    }
}

/// Pairs for pow and the binary ops: specials against specials, random bit patterns, and
/// moderate bases and exponents (integers, halves, negative bases) where pow's core runs.
fn binary_inputs() -> (Vec<u32>, Vec<u32>) {
    let mut s = specials();
    let extra: [f32; 16] = [
        0.5,
        2.0,
        3.0,
        -3.0,
        -2.0,
        0.25,
        1.5,
        -1.5,
        10.0,
        -0.5,
        16_777_216.0,
        16_777_217.0,
        -16_777_215.0,
        8_388_609.0,
        1e-3,
        127.5,
    ];
    s.extend(extra.iter().map(|v| v.to_bits()));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &s {
        for &y in &s {
            a.push(x);
            b.push(y);
        }
    }
    let mut rng = Rng(2);
    for _ in 0..100_000 {
        a.push(rng.u32());
        b.push(rng.u32());
    }
    for _ in 0..100_000 {
        // Base in 2^-10 .. 2^10 (either sign), exponent in 2^-6 .. 2^6.
        a.push(rng.float_exp(117, 137));
        let y = rng.float_exp(121, 133);
        // A third of exponents are integers, a third halves.
        let yv = f32::from_bits(y);
        let y = match rng.u32() % 3 {
            0 => yv.round_ties_even().to_bits(),
            1 => ((yv * 2.0).round_ties_even() * 0.5).to_bits(),
            _ => y,
        };
        b.push(y);
    }
    // Results near overflow and underflow: x^y close to 2^±128 and 2^-149.
    for _ in 0..20_000 {
        let x = 1.0 + (rng.u32() >> 9) as f32 / 8_388_608.0; // [1, 2)
        let target = [128.0f32, -126.0, -149.0, -150.0][rng.u32() as usize % 4];
        let y = target / x.log2() * (1.0 + ((rng.u32() % 2001) as f32 - 1000.0) * 1e-6);
        a.push(x.to_bits());
        b.push(y.to_bits());
    }
    (a, b)
}

#[test]
fn pow_matches_the_reference() {
    let Some(env) = env() else { return };
    let (a, b) = binary_inputs();
    let got = env.launch("t_math", &a, &b, 7, a.len(), 1);
    let want: Vec<u32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| math::pow(f32::from_bits(x), f32::from_bits(y)).to_bits())
        .collect();
    let input = |i: usize| format!("{}, {}", show(a[i]), show(b[i]));
    let bad = mismatches("pow", &input, &got, &want, &exact);
    assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
}

#[test]
fn unary_ops_match_the_reference() {
    let Some(env) = env() else { return };
    let xs = unary_inputs();
    let mut bad = Vec::new();
    for &op in UnaryOp::ALL {
        if op == UnaryOp::Not {
            continue; // bool only: no float element function
        }
        let got = env.launch("t_unary", &xs, &[], op.tag() as i32, xs.len(), 1);
        let want: Vec<u32> = xs
            .iter()
            .map(|&x| unary_f32(op, f32::from_bits(x)).to_bits())
            .collect();
        // Neg and abs are sign-bit operations, exact on NaN payloads too; the others may leave
        // the hardware's NaN, which storing canonicalises.
        let same: &dyn Fn(u32, u32) -> bool = match op {
            UnaryOp::Neg | UnaryOp::Abs => &exact,
            _ => &exact_or_nan,
        };
        bad.extend(mismatches(op.name(), &|i| show(xs[i]), &got, &want, same));
    }
    assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
}

#[test]
fn binary_ops_and_comparisons_match_the_reference() {
    let Some(env) = env() else { return };
    let (a, b) = binary_inputs();
    let input = |i: usize| format!("{}, {}", show(a[i]), show(b[i]));
    let mut bad = Vec::new();
    for &op in BinaryOp::ALL {
        let (x, y) = (
            a.iter().map(|&v| f32::from_bits(v)),
            b.iter().map(|&v| f32::from_bits(v)),
        );
        if op.is_comparison() {
            let got = env.launch("t_compare", &a, &b, op.tag() as i32, a.len(), 1);
            let want: Vec<u32> = x
                .zip(y)
                .map(|(p, q)| {
                    let o = p.partial_cmp(&q);
                    use std::cmp::Ordering::*;
                    (match op {
                        BinaryOp::Eq => o == Some(Equal),
                        BinaryOp::Ne => o != Some(Equal),
                        BinaryOp::Lt => o == Some(Less),
                        BinaryOp::Le => matches!(o, Some(Less | Equal)),
                        BinaryOp::Gt => o == Some(Greater),
                        _ => matches!(o, Some(Greater | Equal)),
                    }) as u32
                })
                .collect();
            bad.extend(mismatches(op.name(), &input, &got, &want, &exact));
            continue;
        }
        let got = env.launch("t_binary", &a, &b, op.tag() as i32, a.len(), 1);
        let want: Vec<u32> = x
            .zip(y)
            .map(|(p, q)| binary_f32(op, p, q).to_bits())
            .collect();
        bad.extend(mismatches(op.name(), &input, &got, &want, &exact_or_nan));
    }
    assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
}

/// The op tags the library's `#define`s use are tenet_ir's.
#[test]
fn op_tags_match_the_ir() {
    let define = |prefix: &str, name: &str| -> Option<u8> {
        let key = format!("#define TN_{prefix}_{} ", name.to_uppercase());
        let line = MATH_CL.lines().find(|l| l.starts_with(&key))?;
        line[key.len()..].trim().parse().ok()
    };
    for &op in UnaryOp::ALL {
        assert_eq!(define("UNARY", op.name()), Some(op.tag()), "{op:?}");
    }
    for &op in BinaryOp::ALL {
        assert_eq!(define("BINARY", op.name()), Some(op.tag()), "{op:?}");
    }
}

#[test]
fn conversions_match_half() {
    let Some(env) = env() else { return };
    let mut bad = Vec::new();
    // Decoding: every pattern.
    let all: Vec<u32> = (0..=0xffff).collect();
    let got = env.launch("t_convert", &all, &[], 0, all.len(), 1);
    let want: Vec<u32> = all
        .iter()
        .map(|&h| f16::from_bits(h as u16).to_f32().to_bits())
        .collect();
    bad.extend(mismatches(
        "f16_to_f32",
        &|i| format!("{:#06x}", all[i]),
        &got,
        &want,
        &exact,
    ));
    let got = env.launch("t_convert", &all, &[], 2, all.len(), 1);
    let want: Vec<u32> = all
        .iter()
        .map(|&h| bf16::from_bits(h as u16).to_f32().to_bits())
        .collect();
    bad.extend(mismatches(
        "bf16_to_f32",
        &|i| format!("{:#06x}", all[i]),
        &got,
        &want,
        &exact,
    ));

    // Encoding to f16: each f16 value, its f32 neighbours, the exact tie with the next f16
    // and its neighbours; plus random patterns.
    let mut xs = specials();
    for h in 0..=0xffffu16 {
        let v = f16::from_bits(h).to_f32();
        if !v.is_finite() {
            continue;
        }
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        let mid = if next.is_finite() && h & 0x7fff != 0x7bff {
            (v as f64 + next as f64) / 2.0
        } else {
            // The overflow threshold: 65520 (the tie between 65504 and 65536).
            65520.0f64.copysign(v as f64)
        };
        for c in [v, mid as f32] {
            let b = c.to_bits();
            xs.extend([b, b.wrapping_add(1), b.wrapping_sub(1), b.wrapping_add(2)]);
        }
    }
    let mut rng = Rng(3);
    xs.extend((0..200_000).map(|_| rng.u32()));
    // Around the f16 range, where rounding happens (exponent fields 100..=145).
    xs.extend((0..200_000).map(|_| rng.float_exp(100, 145)));
    let got = env.launch("t_convert", &xs, &[], 1, xs.len(), 1);
    let want: Vec<u32> = xs
        .iter()
        .map(|&x| f16::from_f32(f32::from_bits(x)).to_bits() as u32)
        .collect();
    bad.extend(mismatches(
        "f32_to_f16",
        &|i| show(xs[i]),
        &got,
        &want,
        &exact,
    ));

    // Encoding to bf16: every bf16 pattern with low halves at and around the tie.
    let mut xs = specials();
    for hi in 0..=0xffffu32 {
        for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, rng.u32() & 0xffff] {
            xs.push(hi << 16 | lo);
        }
    }
    xs.extend((0..100_000).map(|_| rng.u32()));
    let got = env.launch("t_convert", &xs, &[], 3, xs.len(), 1);
    let want: Vec<u32> = xs
        .iter()
        .map(|&x| bf16::from_f32(f32::from_bits(x)).to_bits() as u32)
        .collect();
    bad.extend(mismatches(
        "f32_to_bf16",
        &|i| show(xs[i]),
        &got,
        &want,
        &exact,
    ));
    assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
}

#[test]
fn philox_matches_the_reference() {
    let Some(env) = env() else { return };
    let mut rng = Rng(4);
    // Random123's known-answer vectors first, then random counters and keys.
    let mut counters: Vec<[u32; 4]> = vec![
        [0; 4],
        [u32::MAX; 4],
        [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
    ];
    let mut keys: Vec<[u32; 2]> = vec![[0; 2], [u32::MAX; 2], [0xa4093822, 0x299f31d0]];
    for _ in 0..20_000 {
        counters.push([rng.u32(), rng.u32(), rng.u32(), rng.u32()]);
        keys.push([rng.u32(), rng.u32()]);
    }
    let a: Vec<u32> = counters.iter().flatten().copied().collect();
    let b: Vec<u32> = keys.iter().flatten().copied().collect();
    let got = env.launch("t_philox", &a, &b, 0, counters.len(), 4);
    let want: Vec<u32> = counters
        .iter()
        .zip(&keys)
        .flat_map(|(&c, &k)| philox::philox4x32_10(c, k))
        .collect();
    assert_eq!(&got[..4], &[0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert!(got == want, "philox4x32_10 differs on {}", env.device);

    // words(seed, key, index) for random triples.
    let triples: Vec<[u64; 3]> = (0..20_000)
        .map(|_| [rng.next(), rng.next(), rng.next()])
        .collect();
    let a: Vec<u32> = triples
        .iter()
        .flat_map(|t| t.iter().flat_map(|&v| [v as u32, (v >> 32) as u32]))
        .collect();
    let got = env.launch("t_random", &a, &[], 0, triples.len(), 4);
    let want: Vec<u32> = triples
        .iter()
        .flat_map(|t| philox::words(t[0], t[1], t[2]))
        .collect();
    assert!(got == want, "philox words differ on {}", env.device);
}

#[test]
fn random_values_match_the_reference() {
    let Some(env) = env() else { return };
    let n = 100_000u64;
    for (seed, key) in [(0u64, 0u64), (42, 7), (u64::MAX, 0x1234_5678_9abc_def0)] {
        let a: Vec<u32> = (0..n)
            .flat_map(|i| {
                [seed, key, i]
                    .into_iter()
                    .flat_map(|v| [v as u32, (v >> 32) as u32])
            })
            .collect();
        for (sel, dist) in [(1, Distribution::Uniform), (2, Distribution::Normal)] {
            let got = env.launch("t_random", &a, &[], sel, n as usize, 1);
            let ty = TensorType::new(DType::F32, vec![n]);
            let t = tenet_reference::eval_op(NodeId(0), &Op::Random { dist, key }, &ty, &[], seed)
                .expect("the reference's random op");
            let want: Vec<u32> = t.to_f32_vec().iter().map(|v| v.to_bits()).collect();
            let bad = mismatches(
                dist.name(),
                &|i| format!("seed {seed} key {key} index {i}"),
                &got,
                &want,
                &exact,
            );
            assert!(bad.is_empty(), "on {}:\n{}", env.device, bad.join("\n"));
        }
    }
}
