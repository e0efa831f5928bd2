//! `tenet import`: an ONNX model as a tenet graph plus the safetensors file of its weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tenet_ir::{DType, HostTensor, TensorType};
use tenet_onnx::{ImportOptions, describe_file, import_file, is_supported};

/// What `tenet import` was asked to do.
pub struct ImportArgs {
    pub model: PathBuf,
    pub output: Option<PathBuf>,
    pub weights_out: Option<PathBuf>,
    pub shapes: Vec<String>,
    pub fixes: Vec<String>,
    pub opset_check: bool,
    pub json: bool,
}

fn split_pair<'a>(arg: &'a str, flag: &str, form: &str) -> Result<(&'a str, &'a str)> {
    arg.split_once('=')
        .filter(|(n, v)| !n.is_empty() && !v.is_empty())
        .with_context(|| format!("{flag} {arg:?}: expected {form}"))
}

fn parse_shape(arg: &str) -> Result<(String, Vec<u64>)> {
    let (name, dims) = split_pair(arg, "--shape", "NAME=D0,D1,... (e.g. x=1,3,48,320)")?;
    let dims = dims
        .split(',')
        .map(|d| d.trim().parse::<u64>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--shape {arg:?}: dimensions must be non-negative integers"))?;
    Ok((name.to_string(), dims))
}

/// `NAME=FILE` (.pb, .npy, .json, .safetensors) or `NAME=V0,V1,...` (a 1-D list).
fn parse_fix(
    arg: &str,
    declared: &HashMap<String, (Option<DType>, Vec<Option<u64>>)>,
) -> Result<(String, HostTensor)> {
    let (name, value) = split_pair(arg, "--fix", "NAME=FILE or NAME=V0,V1,...")?;
    let Some((dtype, dims)) = declared.get(name) else {
        bail!("--fix {arg:?}: the model has no input called {name:?}");
    };
    let dtype =
        dtype.with_context(|| format!("--fix {arg:?}: input {name:?} has no tenet dtype"))?;
    let path = Path::new(value);
    let tensor = if path.extension().is_some_and(|e| e == "pb") {
        let bytes = std::fs::read(path).with_context(|| format!("reading {value}"))?;
        tenet_onnx::read_tensor_pb(&bytes)
            .map_err(|e| anyhow::anyhow!("{value}: {e}"))?
            .1
    } else if path.is_file() {
        let shape: Option<Vec<u64>> = dims.iter().copied().collect();
        let shape = shape.with_context(|| {
            format!(
                "--fix {arg:?}: {name:?} has dynamic dimensions; give the value as an ONNX .pb file"
            )
        })?;
        tenet_models::read_tensor(path, name, &TensorType::new(dtype, shape))?
    } else {
        let items: Vec<&str> = value.split(',').map(str::trim).collect();
        let n = items.len() as u64;
        match dtype {
            DType::I64 => HostTensor::from_i64(
                &[n],
                &items
                    .iter()
                    .map(|v| v.parse())
                    .collect::<Result<Vec<i64>, _>>()?,
            )?,
            DType::I32 => HostTensor::from_i32(
                &[n],
                &items
                    .iter()
                    .map(|v| v.parse())
                    .collect::<Result<Vec<i32>, _>>()?,
            )?,
            DType::F32 => HostTensor::from_f32(
                &[n],
                &items
                    .iter()
                    .map(|v| v.parse())
                    .collect::<Result<Vec<f32>, _>>()?,
            )?,
            other => bail!("--fix {arg:?}: give a {other} value as a file"),
        }
    };
    if tensor.dtype() != dtype {
        bail!(
            "--fix {arg:?}: input {name:?} is {dtype} in the model, the value is {}",
            tensor.ty()
        );
    }
    Ok((name.to_string(), tensor))
}

pub fn import(args: ImportArgs) -> Result<()> {
    let mut opts = ImportOptions::default();
    for s in &args.shapes {
        let (name, dims) = parse_shape(s)?;
        opts.shapes.insert(name, dims);
    }
    // The model's declared inputs and op types: read only when --fix or --opset-check needs
    // them (the import reads the file again).
    if args.opset_check || !args.fixes.is_empty() {
        let description = describe_file(&args.model, &opts)?;
        if args.opset_check {
            return opset_check(&args, &description);
        }
        let declared: HashMap<String, (Option<DType>, Vec<Option<u64>>)> = description
            .inputs
            .iter()
            .map(|(n, d, dims)| (n.clone(), (d.clone().ok(), dims.clone())))
            .collect();
        for f in &args.fixes {
            let (name, t) = parse_fix(f, &declared)?;
            opts.fixed.insert(name, t);
        }
    }
    let imported = import_file(&args.model, &opts)?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.model.with_extension("tnt"));
    let weights_out = args
        .weights_out
        .clone()
        .unwrap_or_else(|| output.with_extension("safetensors"));
    if output == args.model || weights_out == args.model {
        bail!(
            "refusing to overwrite the model {}; pass -o",
            args.model.display()
        );
    }
    let graph_bytes = imported.graph.to_bytes();
    tenet_models::write_atomically(&output, &graph_bytes)
        .with_context(|| format!("writing {}", output.display()))?;
    if let Some(w) = &imported.weights {
        tenet_models::write_atomically(&weights_out, w)
            .with_context(|| format!("writing {}", weights_out.display()))?;
    }
    let r = &imported.report;
    let cost = imported.graph.cost();
    let inputs: Vec<String> = imported
        .graph
        .inputs()
        .map(|(_, n, t)| format!("{n}: {t}"))
        .collect();
    let outputs: Vec<String> = imported
        .graph
        .outputs()
        .iter()
        .map(|o| format!("{}: {}", o.name, imported.graph.node(o.node).ty))
        .collect();
    if args.json {
        let v = serde_json::json!({
            "graph": output.display().to_string(),
            "graph_id": imported.graph.id().to_hex(),
            "weights": imported.weights.as_ref().map(|_| weights_out.display().to_string()),
            "weights_id": imported.weights.as_ref().map(|w| tenet_ir::WeightsId::of_bytes(w).to_hex()),
            "opset": r.opset,
            "producer": r.producer,
            "onnx_nodes": r.onnx_nodes,
            "folded_nodes": r.folded_nodes,
            "tenet_nodes": imported.graph.nodes().len(),
            "weight_tensors": r.weight_tensors,
            "inputs": inputs,
            "outputs": outputs,
            "flops": cost.flops,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "imported {} ({}, opset {}): {} ONNX nodes, {} folded at import, {} tenet nodes",
        args.model.display(),
        if r.producer.is_empty() {
            "unknown producer"
        } else {
            &r.producer
        },
        r.opset,
        r.onnx_nodes,
        r.folded_nodes,
        imported.graph.nodes().len()
    );
    println!(
        "graph   {}  id {}",
        output.display(),
        imported.graph.id().short()
    );
    match &imported.weights {
        Some(w) => println!(
            "weights {}  id {}  ({} tensors, {} bytes)",
            weights_out.display(),
            tenet_ir::WeightsId::of_bytes(w).short(),
            r.weight_tensors,
            w.len()
        ),
        None => println!("weights none (every constant is inline)"),
    }
    println!("inputs  {}", inputs.join(", "));
    println!("outputs {}", outputs.join(", "));
    println!("cost    {:.3} GFLOP per run", cost.flops as f64 / 1e9);
    let weights_arg = if imported.weights.is_some() {
        format!(" --weights {}", weights_out.display())
    } else {
        String::new()
    };
    let input_args: Vec<String> = imported
        .graph
        .inputs()
        .map(|(_, n, _)| format!(" --input {n}={n}.npy"))
        .collect();
    println!(
        "run it: tenet run {}{weights_arg}{}",
        output.display(),
        input_args.concat()
    );
    Ok(())
}

fn opset_check(args: &ImportArgs, d: &tenet_onnx::Description) -> Result<()> {
    let unsupported: Vec<&String> = d.op_counts.keys().filter(|op| !is_supported(op)).collect();
    if args.json {
        let ops: serde_json::Map<String, serde_json::Value> = d
            .op_counts
            .iter()
            .map(|(op, n)| {
                (
                    op.clone(),
                    serde_json::json!({"nodes": n, "supported": is_supported(op)}),
                )
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "opset": d.opset,
                "ops": ops,
                "unsupported": unsupported,
            }))?
        );
    } else {
        println!("{}: opset {}", args.model.display(), d.opset);
        for (op, n) in &d.op_counts {
            let mark = if is_supported(op) {
                "ok"
            } else {
                "UNSUPPORTED"
            };
            println!("  {op:<24} {n:>5} nodes  {mark}");
        }
        for (name, dtype, dims) in &d.inputs {
            let dims: Vec<String> = dims
                .iter()
                .map(|d| d.map_or("?".to_string(), |v| v.to_string()))
                .collect();
            match dtype {
                Ok(t) => println!("  input {name}: {t}[{}]", dims.join(", ")),
                Err(e) => println!("  input {name}: {e}"),
            }
        }
    }
    if !unsupported.is_empty() {
        bail!(
            "{} op type(s) have no tenet mapping: {}",
            unsupported.len(),
            unsupported
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
