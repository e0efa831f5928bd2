//! Times the OpenCL backend's heavy kernels on device 0: products, softmax, the norms and
//! reductions, each a one-op graph run on buffers already on the device (best of a few runs,
//! after a warm-up that builds and specialises the kernels).
//!
//! `cargo run --release -p tenet-opencl --example opencl_speed [case...]`; cases: `matmul`,
//! `matmul_minilm`, `gemv` (one row times a transposed weight), `qgemv_head`, `qgemv_576`,
//! `qgemv_prefill` (products with quantised weights of SmolLM2's shapes: the Q8_0 logits
//! head, a Q4_1 576² projection, a 128-token prompt through a Q4_1 576→1536 projection;
//! with their weights' read rate), `xyz` (x*y+z over 16M),
//! `softmax`, `layer_norm`, `rms_norm`, `sum_rows`, `sum_cols`, `mean_seq`,
//! `argmax`; none runs them all. Times are from launch to the device finishing (outputs stay
//! on the device; their download is timed apart). `TENET_OPENCL_PROFILE=1` adds each run's
//! per-kernel device times. `--check` also compares each result with the reference (slow
//! for the big products); `--gemm=NAME` makes products use only that SGEMM kernel (one of
//! those printed first, or `k_matmul`); `--unfused` runs
//! elementwise chains one kernel per node; `--size=N` sets the square product's side (1024).

use std::collections::HashMap;
use std::time::Instant;

use tenet_exec::Device;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, NoWeights, QuantFormat};
use tenet_opencl::{OpenClDevice, Quirks};

/// The case's graph, its flops, and the bytes of quantised weight it reads (0 for none).
fn case(name: &str, size: u64) -> Option<(Graph, f64, f64)> {
    let g = GraphBuilder::new();
    let quantised = |rows: u64, n: u64, k: u64, format: QuantFormat| {
        let x = g.input("x", DType::F32, &[rows, k]);
        let bb = format.block_bytes();
        let w = g.input("w", DType::U8, &[n, k / 32, bb]);
        (
            x.qmatmul(&w, format),
            2.0 * (rows * n * k) as f64,
            (n * k / 32 * bb) as f64,
        )
    };
    let (y, flops, weight_bytes) = match name {
        "qgemv_head" => quantised(1, 49152, 576, QuantFormat::Q8_0),
        "qgemv_576" => quantised(1, 576, 576, QuantFormat::Q4_1),
        "qgemv_prefill" => quantised(128, 1536, 576, QuantFormat::Q4_1),
        "matmul" => {
            let n = size;
            let a = g.input("a", DType::F32, &[n, n]);
            let b = g.input("b", DType::F32, &[n, n]);
            (a.matmul(&b), 2.0 * (n * n * n) as f64, 0.0)
        }
        "matmul_minilm" => {
            let a = g.input("a", DType::F32, &[4096, 384]);
            let b = g.input("b", DType::F32, &[384, 1536]);
            (a.matmul(&b), 2.0 * 4096.0 * 384.0 * 1536.0, 0.0)
        }
        "gemv" => {
            // A decode step's logits: one token times a transposed [49152, 576] weight.
            let x = g.input("x", DType::F32, &[1, 576]);
            let w = g.input("w", DType::F32, &[49152, 576]);
            (x.matmul(&w.transpose(0, 1)), 2.0 * 576.0 * 49152.0, 0.0)
        }
        "xyz" => {
            let x = g.input("x", DType::F32, &[16 << 20]);
            let y = g.input("y", DType::F32, &[16 << 20]);
            let z = g.input("z", DType::F32, &[16 << 20]);
            (&(&x * &y) + &z, 0.0, 0.0)
        }
        "softmax" => {
            let x = g.input("x", DType::F32, &[4096, 1024]);
            (x.softmax(-1), 0.0, 0.0)
        }
        "layer_norm" => {
            let x = g.input("x", DType::F32, &[4096, 1024]);
            let gamma = g.input("g", DType::F32, &[1024]);
            let beta = g.input("b", DType::F32, &[1024]);
            (x.layer_norm(Some(&gamma), Some(&beta), 1e-5), 0.0, 0.0)
        }
        "rms_norm" => {
            let x = g.input("x", DType::F32, &[4096, 1024]);
            (x.rms_norm(None, 1e-6), 0.0, 0.0)
        }
        "sum_rows" => {
            let x = g.input("x", DType::F32, &[4096, 1024]);
            (x.sum(&[-1], false), 0.0, 0.0)
        }
        "sum_cols" => {
            let x = g.input("x", DType::F32, &[1024, 4096]);
            (x.sum(&[0], false), 0.0, 0.0)
        }
        "mean_seq" => {
            let x = g.input("x", DType::F32, &[32, 128, 384]);
            (x.mean(&[1], false), 0.0, 0.0)
        }
        "argmax" => {
            let x = g.input("x", DType::F32, &[4096, 1024]);
            (x.argmax(&[-1], false), 0.0, 0.0)
        }
        _ => return None,
    };
    Some((
        g.finish(&[("y", &y)]).expect("a valid graph"),
        flops,
        weight_bytes,
    ))
}

const ALL: [&str; 14] = [
    "matmul",
    "matmul_minilm",
    "gemv",
    "qgemv_head",
    "qgemv_576",
    "qgemv_prefill",
    "xyz",
    "softmax",
    "layer_norm",
    "rms_norm",
    "sum_rows",
    "sum_cols",
    "mean_seq",
    "argmax",
];

/// Uniform values in [-2, 2) for float inputs; for quantised weights (u8 `[n, blocks,
/// bytes]`) random bytes with every block's f16 scale (and minimum) a small finite value.
fn inputs(graph: &Graph) -> HashMap<String, HostTensor> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    graph
        .inputs()
        .map(|(_, name, ty)| {
            if ty.dtype == DType::U8 {
                let bb = *ty.shape.last().expect("blocks") as usize;
                let n = ty.numel().expect("small") as usize;
                let mut bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        (state >> 56) as u8
                    })
                    .collect();
                for block in bytes.chunks_mut(bb) {
                    let scale = half::f16::from_f32(0.01 + f32::from(block[3]) / 8192.0);
                    block[..2].copy_from_slice(&scale.to_bits().to_le_bytes());
                    if bb == 20 {
                        block[2..4].copy_from_slice(&(-scale).to_bits().to_le_bytes());
                    }
                }
                let t = HostTensor::new(ty.clone(), bytes).expect("u8");
                return (name.to_string(), t);
            }
            let n = ty.numel().expect("small") as usize;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                })
                .collect();
            (
                name.to_string(),
                HostTensor::from_f32(&ty.shape, &v).expect("f32"),
            )
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let names: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let names = if names.is_empty() {
        ALL.to_vec()
    } else {
        names
    };
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string))
    };
    let size = flag("size").map_or(1024, |s| s.parse().expect("--size=N"));
    let dev = OpenClDevice::open(0, Quirks::default()).expect("an OpenCL device");
    println!("{}", dev.info().name);
    println!("SGEMM kernels: {:?}", dev.gemm_kernels());
    if let Some(k) = flag("gemm") {
        assert!(dev.force_gemm(Some(&k)), "no SGEMM kernel {k}");
        println!("products use {k} only");
    }
    if args.iter().any(|a| a == "--unfused") {
        dev.set_fusion(false);
        println!("elementwise chains unfused");
    }
    for name in names {
        let Some((graph, flops, weight_bytes)) = case(name, size) else {
            eprintln!("unknown case {name}; cases: {ALL:?}");
            std::process::exit(2);
        };
        let host = inputs(&graph);
        let t = Instant::now();
        let program = dev.compile(&graph).expect("compiles");
        let compile = t.elapsed().as_secs_f64();
        let on_device: HashMap<_, _> = host
            .iter()
            .map(|(n, t)| (n.clone(), dev.upload(t).expect("upload")))
            .collect();
        // A run returns once the device has finished it; the download is timed apart.
        let run = || {
            let t = Instant::now();
            let (outs, _) = program
                .run_buffers(&on_device, &NoWeights, 0, &|| false)
                .expect("runs");
            let ran = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let _ = dev.download(&outs[0].1).expect("download");
            (ran, t.elapsed().as_secs_f64())
        };
        let first = run().0;
        let (best, download) = (0..5)
            .map(|_| run())
            .fold((f64::INFINITY, f64::INFINITY), |(r, d), (r2, d2)| {
                (r.min(r2), d.min(d2))
            });
        let mut rate = if flops > 0.0 {
            format!(", {:.2} GFLOP/s", flops / best / 1e9)
        } else {
            String::new()
        };
        if weight_bytes > 0.0 {
            rate += &format!(", weights read at {:.1} GB/s", weight_bytes / best / 1e9);
        }
        println!(
            "{name:>14}: compile {compile:.3} s, first run {first:.3} s, best {:.2} ms{rate} \
             (output download {:.2} ms)",
            best * 1e3,
            download * 1e3
        );
        if check {
            let want = tenet_reference::run(&graph, &host, &NoWeights, 0).expect("reference");
            let got = program.run(&host, &NoWeights, 0).expect("runs");
            let same = want[0].1.bytes() == got[0].1.bytes();
            println!(
                "{name:>14}: {}",
                if same { "bits match" } else { "BITS DIFFER" }
            );
            assert!(same, "{name}: bits differ from the reference");
        }
    }
}
