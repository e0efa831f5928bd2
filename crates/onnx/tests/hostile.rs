//! Malformed and hostile models are refused with a clear message, never a panic, and a small
//! file cannot make the importer allocate what it claims: truncation, garbage, absurd dims,
//! element counts the data does not hold, cycles, unknown ops and domains, external data
//! outside the model's folder. Also: a well-formed model built here imports and runs, and the
//! fuzz corpus's seeds (`fuzz/corpus/import_onnx/seed-*`) pass the fuzz target's checks.

use std::collections::HashMap;
use std::path::Path;

mod common;

use common::value;
use prost::Message;
use tenet_ir::HostTensor;
use tenet_onnx::onnx_proto::{
    ModelProto, NodeProto, StringStringEntryProto, TensorProto, tensor_shape_proto, type_proto,
};
use tenet_onnx::{ImportOptions, import_bytes, import_file};

fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `y = relu(x) + w` with `x: f32[2,3]` and an initializer `w`.
fn model(w: TensorProto, nodes: Vec<NodeProto>) -> ModelProto {
    common::model(
        nodes,
        vec![value("x", &[2, 3])],
        vec![value("y", &[2, 3])],
        vec![w],
    )
}

fn weight(dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: Some("w".into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(raw),
        ..Default::default()
    }
}

fn good_nodes() -> Vec<NodeProto> {
    vec![
        node("Relu", &["x"], &["r"]),
        node("Add", &["r", "w"], &["y"]),
    ]
}

fn refuse(m: &ModelProto, needle: &str) {
    let err = import_bytes(&m.encode_to_vec(), None, &ImportOptions::default())
        .err()
        .unwrap_or_else(|| panic!("imported a model that should be refused ({needle})"));
    let text = err.to_string();
    assert!(text.contains(needle), "{text:?} should mention {needle:?}");
}

#[test]
fn a_small_model_imports_and_runs() {
    let w = weight(
        &[3],
        [1.0f32, -2.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    );
    let imported = import_bytes(
        &model(w, good_nodes()).encode_to_vec(),
        None,
        &Default::default(),
    )
    .unwrap();
    let x = HostTensor::from_f32(&[2, 3], &[-1.0, 2.0, 3.0, 4.0, -5.0, 0.0]).unwrap();
    let out = tenet_reference::run(
        &imported.graph,
        &HashMap::from([("x".to_string(), x)]),
        &tenet_ir::NoWeights,
        0,
    )
    .unwrap();
    assert_eq!(out[0].1.to_f32_vec(), [1.0, 0.0, 3.5, 5.0, -2.0, 0.5]);
    assert!(
        imported.weights.is_none(),
        "a 12-byte initializer stays inline"
    );
}

#[test]
fn truncated_and_garbage_bytes_are_refused() {
    let w = weight(&[3], vec![0; 12]);
    let bytes = model(w, good_nodes()).encode_to_vec();
    for cut in [1, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        // Some prefixes are valid protobuf; none may panic.
        let _ = import_bytes(&bytes[..cut], None, &Default::default());
    }
    let err = import_bytes(&[0xff; 64], None, &Default::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("not an ONNX model"), "{err}");
    let err = import_bytes(&[], None, &Default::default()).err().unwrap();
    assert!(err.to_string().contains("opset"), "{err}");
}

#[test]
fn element_counts_the_data_does_not_hold_are_refused_before_allocating() {
    refuse(
        &model(weight(&[1_000_000_000], vec![0; 4]), good_nodes()),
        "raw data holds 4 bytes",
    );
    refuse(
        &model(weight(&[1 << 40, 1 << 40], vec![]), good_nodes()),
        "too many elements",
    );
    refuse(
        &model(weight(&[-3], vec![]), good_nodes()),
        "negative dimension",
    );
    let mut float_field = weight(&[1_000_000_000], vec![]);
    float_field.raw_data = None;
    float_field.float_data = vec![1.0; 3];
    refuse(&model(float_field, good_nodes()), "float_data holds 3");
}

#[test]
fn cycles_unknown_ops_and_foreign_domains_are_refused() {
    let w = || weight(&[3], vec![0; 12]);
    let cycle = vec![node("Relu", &["b"], &["a"]), node("Relu", &["a"], &["b"])];
    refuse(&model(w(), cycle), "topological order, or has a cycle");
    refuse(
        &model(w(), vec![node("FancyOp", &["x"], &["y"])]),
        "no mapping for the op type \"FancyOp\"",
    );
    let mut foreign = node("Relu", &["x"], &["y"]);
    foreign.domain = Some("com.example".into());
    refuse(&model(w(), vec![foreign]), "domain \"com.example\"");
    let mut m = model(w(), good_nodes());
    m.opset_import[0].version = Some(99);
    refuse(&m, "opset 99");
}

#[test]
fn unknown_attributes_and_unread_outputs_are_refused() {
    let mut relu = node("Relu", &["x"], &["r"]);
    relu.attribute.push(tenet_onnx::onnx_proto::AttributeProto {
        name: Some("mystery".into()),
        i: Some(1),
        ..Default::default()
    });
    let nodes = vec![relu, node("Add", &["r", "w"], &["y"])];
    refuse(
        &model(weight(&[3], vec![0; 12]), nodes),
        "attribute \"mystery\" is not supported",
    );
}

#[test]
fn external_data_outside_the_models_folder_is_refused() {
    let dir = std::env::temp_dir().join(format!("tenet-onnx-hostile-{}", std::process::id()));
    let inner = dir.join("model");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(dir.join("secret.bin"), [7u8; 12]).unwrap();
    std::fs::write(inner.join("weights.bin"), [0u8; 12]).unwrap();
    let external = |location: &str, length: Option<&str>| {
        let mut w = weight(&[3], vec![]);
        w.raw_data = None;
        w.data_location = Some(1);
        w.external_data = vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some(location.into()),
        }];
        if let Some(l) = length {
            w.external_data.push(StringStringEntryProto {
                key: Some("length".into()),
                value: Some(l.into()),
            });
        }
        let path = inner.join("model.onnx");
        std::fs::write(&path, model(w, good_nodes()).encode_to_vec()).unwrap();
        import_file(&path, &Default::default())
    };
    let secret = dir.join("secret.bin").display().to_string();
    for bad in ["../secret.bin", secret.as_str(), "", "./../secret.bin"] {
        let err = external(bad, None).err().unwrap().to_string();
        assert!(err.contains("inside the model's folder"), "{bad}: {err}");
    }
    let err = external("weights.bin", Some("4000000000"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("dims claim 12"), "{err}");
    let err = external("missing.bin", None).err().unwrap().to_string();
    assert!(err.contains("does not exist"), "{err}");
    assert!(external("weights.bin", None).is_ok());
    // Bytes alone (no folder) cannot reach any file.
    let mut w = weight(&[3], vec![]);
    w.raw_data = None;
    w.data_location = Some(1);
    w.external_data = vec![StringStringEntryProto {
        key: Some("location".into()),
        value: Some("weights.bin".into()),
    }];
    refuse(&model(w, good_nodes()), "not read from a folder");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dynamic_inputs_need_a_shape_and_say_how() {
    let mut m = model(weight(&[3], vec![0; 12]), good_nodes());
    let g = m.graph.as_mut().unwrap();
    g.input[0] = value("x", &[2, 3]);
    if let Some(type_proto::Value::TensorType(t)) = &mut g.input[0].r#type.as_mut().unwrap().value {
        t.shape.as_mut().unwrap().dim[0].value = Some(
            tensor_shape_proto::dimension::Value::DimParam("batch".into()),
        );
    }
    refuse(&m, "--shape x=");
    let mut opts = ImportOptions::default();
    opts.shapes.insert("x".into(), vec![5, 3]);
    let imported = import_bytes(&m.encode_to_vec(), None, &opts).unwrap();
    assert_eq!(imported.graph.inputs().next().unwrap().2.shape, [5, 3]);
    opts.shapes.insert("x".into(), vec![5, 4]);
    let err = import_bytes(&m.encode_to_vec(), None, &opts).err().unwrap();
    assert!(err.to_string().contains("fixed to 3"), "{err}");
}

/// The fuzz target's checks, run on its seeds.
#[test]
fn fuzz_corpus_seeds_are_imported_or_refused_cleanly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_onnx");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let _ = import_bytes(&bytes, None, &tenet_onnx::fuzz_limits());
        n += 1;
    }
    assert!(n >= 5, "the corpus has its seeds");
}

/// A small deterministic generator for the mutation tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Iterations per seed (more with `TENET_FUZZ_ITERS`, for a longer local run) and the
/// generator's seed (`TENET_FUZZ_SEED`).
fn iters(default: u64) -> u64 {
    std::env::var("TENET_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fuzz_seed(default: u64) -> u64 {
    std::env::var("TENET_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Values an attacker would try in an integer field.
const EXTREMES: [i64; 9] = [0, -1, 1, 2, -2, i64::MAX, i64::MIN, 1 << 40, -(1 << 40)];

fn seed_models() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_onnx");
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    out.sort();
    out
}

/// Thousands of byte-level mutations of every seed: each is imported or refused, never a
/// panic.
#[test]
fn mutated_bytes_never_panic() {
    let mut rng = Rng(fuzz_seed(0x5eed_0000_0001) | 1);
    for seed in seed_models() {
        for _ in 0..iters(1500) {
            let mut m = seed.clone();
            for _ in 0..=rng.below(4) {
                match rng.below(4) {
                    0 if !m.is_empty() => {
                        let i = rng.below(m.len() as u64) as usize;
                        m[i] ^= 1 << rng.below(8);
                    }
                    1 if !m.is_empty() => {
                        let i = rng.below(m.len() as u64) as usize;
                        m[i] = rng.next() as u8;
                    }
                    2 => m.truncate(rng.below(m.len() as u64 + 1) as usize),
                    _ => {
                        let i = rng.below(m.len() as u64 + 1) as usize;
                        m.insert(i, rng.next() as u8);
                    }
                }
            }
            let r = std::panic::catch_unwind(|| {
                let _ = import_bytes(&m, None, &tenet_onnx::fuzz_limits());
            });
            assert!(r.is_ok(), "a mutated model panicked the importer");
        }
    }
}

/// Structured mutations: every integer attribute, tensor dimension and dtype of the seeds set
/// to extreme values, and nodes' op types swapped — imported or refused, never a panic.
#[test]
fn extreme_attributes_and_dims_never_panic() {
    let mut rng = Rng(fuzz_seed(0x5eed_0000_0002) | 1);
    let ops = tenet_onnx::supported_ops();
    for seed in seed_models() {
        let base = ModelProto::decode(&seed[..]).unwrap();
        for _ in 0..iters(400) {
            let mut m = base.clone();
            let g = m.graph.as_mut().unwrap();
            for node in &mut g.node {
                if rng.below(4) == 0 {
                    node.op_type = Some(ops[rng.below(ops.len() as u64) as usize].to_string());
                }
                for a in &mut node.attribute {
                    if a.i.is_some() && rng.below(2) == 0 {
                        a.i = Some(EXTREMES[rng.below(EXTREMES.len() as u64) as usize]);
                    }
                    for v in &mut a.ints {
                        if rng.below(3) == 0 {
                            *v = EXTREMES[rng.below(EXTREMES.len() as u64) as usize];
                        }
                    }
                    if let Some(f) = &mut a.f
                        && rng.below(3) == 0
                    {
                        *f = [f32::NAN, f32::INFINITY, -1.0, 0.0, 1e30][rng.below(5) as usize];
                    }
                }
            }
            for t in &mut g.initializer {
                for d in &mut t.dims {
                    if rng.below(3) == 0 {
                        *d = EXTREMES[rng.below(EXTREMES.len() as u64) as usize];
                    }
                }
                if rng.below(5) == 0 {
                    t.data_type = Some(rng.below(24) as i32);
                }
            }
            for input in g.input.iter_mut().chain(g.output.iter_mut()) {
                if let Some(type_proto::Value::TensorType(tt)) =
                    input.r#type.as_mut().and_then(|t| t.value.as_mut())
                    && let Some(shape) = tt.shape.as_mut()
                {
                    for d in &mut shape.dim {
                        if rng.below(3) == 0 {
                            let v = [0i64, 1, 2, 3, 7, 1 << 20][rng.below(6) as usize];
                            d.value = Some(tensor_shape_proto::dimension::Value::DimValue(v));
                        }
                    }
                }
            }
            let bytes = m.encode_to_vec();
            let r = std::panic::catch_unwind(|| {
                let _ = import_bytes(&bytes, None, &tenet_onnx::fuzz_limits());
            });
            assert!(
                r.is_ok(),
                "a model with extreme values panicked the importer: {m:?}"
            );
        }
    }
}
