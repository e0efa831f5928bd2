//! Where an imported ONNX model's time goes, warm: `cargo run --release -p tenet-onnx
//! --example onnx_profile -- MODEL.onnx NAME=D0,D1,... [THREADS] [RUNS] [INPUT.npy]` imports the model with
//! that input shape, runs it once to warm up, then RUNS times, and prints the last run's time
//! by kind of step and its slowest steps (a single `tenet run --profile` also counts faulting
//! in the weights and fresh buffers).

use std::collections::HashMap;

use tenet_ir::HostTensor;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: onnx_profile MODEL.onnx NAME=D0,D1,... [THREADS] [RUNS] [INPUT.npy]");
        std::process::exit(2);
    }
    let (name, dims) = args[2].split_once('=').expect("NAME=DIMS");
    let shape: Vec<u64> = dims
        .split(',')
        .map(|d| d.parse().expect("a dimension"))
        .collect();
    let threads: usize = args.get(3).map_or(2, |t| t.parse().expect("threads"));
    let runs: usize = args.get(4).map_or(10, |t| t.parse().expect("runs"));
    let mut opts = tenet_onnx::ImportOptions::default();
    opts.shapes.insert(name.to_string(), shape.clone());
    let imported = tenet_onnx::import_file(std::path::Path::new(&args[1]), &opts).expect("import");
    let weights = match &imported.weights {
        Some(b) => tenet_models::WeightSet(vec![
            tenet_models::WeightsFile::from_bytes(b.clone(), "w").expect("weights"),
        ]),
        None => tenet_models::WeightSet(Vec::new()),
    };
    // The input: an .npy file given as a fifth argument, else a fixed pattern in [-1, 1).
    let x = match args.get(5) {
        Some(path) => tenet_models::read_tensor(
            std::path::Path::new(path),
            name,
            &tenet_ir::TensorType::new(tenet_ir::DType::F32, shape.clone()),
        )
        .expect("the input file"),
        None => {
            let n: u64 = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|i| ((i % 251) as f32 / 125.0) - 1.0).collect();
            HostTensor::from_f32(&shape, &v).unwrap()
        }
    };
    let inputs = HashMap::from([(name.to_string(), x)]);
    let device = tenet_devices::open(
        "cpu",
        &tenet_devices::Options {
            threads: Some(threads),
            ..Default::default()
        },
    )
    .expect("cpu");
    let program = device.compile(&imported.graph).expect("compile");
    program.run(&inputs, &weights, 0).expect("warm-up");
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = std::time::Instant::now();
        let (_, stats) = program.run_with_stats(&inputs, &weights, 0).expect("run");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(stats);
    }
    times.sort_by(f64::total_cmp);
    let stats = last.expect("at least one run");
    println!(
        "median {:.2} ms over {runs} runs, {threads} threads",
        times[times.len() / 2]
    );
    let mut kinds = stats.time_by_kind.clone();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.nanos));
    for k in kinds {
        println!(
            "  {:<10} {:>5} steps {:>9.3} ms",
            k.kind,
            k.steps,
            k.nanos as f64 / 1e6
        );
    }
    println!("slowest steps of the last run:");
    for (node, kind, nanos) in stats.slowest {
        let nd = imported.graph.node(node);
        let operand = nd
            .op
            .operands()
            .iter()
            .take(2)
            .map(|o| imported.graph.node(*o).ty.to_string())
            .reduce(|a, b| format!("{a} {b}"));
        println!(
            "  {node:<7} {kind:<9} {:>8.3} ms  {} {} -> {}",
            nanos as f64 / 1e6,
            nd.op.name(),
            operand.unwrap_or_default(),
            nd.ty
        );
    }
}
