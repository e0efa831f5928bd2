//! The committed examples are exactly what the builders produce, and their references bind.

use std::path::Path;

use tenet_ir::text;
use tenet_models::{BindError, WeightsFile, check_bindings, examples};

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

#[test]
fn committed_mlp_matches_the_builder() {
    let (graph, weights) = examples::mlp().unwrap();
    let committed_text = std::fs::read_to_string(example("mlp.tg")).unwrap();
    let committed_weights = std::fs::read(example("mlp.safetensors")).unwrap();
    assert_eq!(
        committed_weights, weights,
        "regenerate with: cargo run -p tenet-models --example write_examples"
    );
    assert_eq!(
        committed_text,
        text::print(&graph),
        "examples/mlp.tg is stale or not canonical"
    );
    assert_eq!(
        examples::mlp().unwrap().1,
        weights,
        "weights are not reproducible"
    );
}

#[test]
fn mlp_weights_bind() {
    let graph = text::parse(&std::fs::read_to_string(example("mlp.tg")).unwrap()).unwrap();
    let file = WeightsFile::open(&example("mlp.safetensors")).unwrap();
    assert_eq!(file.tensors.len(), 4);
    check_bindings(&graph, std::slice::from_ref(&file)).unwrap();
    assert!(matches!(
        check_bindings(&graph, &[]),
        Err(BindError::MissingFile { .. })
    ));

    // The same names with another shape do not bind.
    let other = tenet_models::write_safetensors(&[(
        "fc1.weight",
        tenet_ir::DType::F32,
        vec![1],
        vec![0; 4],
    )])
    .unwrap();
    let src = text::print(&graph).replace(
        &file.id.to_hex(),
        &tenet_ir::WeightsId::of_bytes(&other).to_hex(),
    );
    let rebound = text::parse(&src).unwrap();
    let other = WeightsFile::from_bytes(other, "other").unwrap();
    let err = check_bindings(&rebound, &[other]).unwrap_err();
    assert!(
        matches!(
            err,
            BindError::Mismatch { .. } | BindError::MissingTensor { .. }
        ),
        "{err}"
    );
}

#[test]
fn matmul_example_is_canonical() {
    let src = std::fs::read_to_string(example("matmul.tg")).unwrap();
    let graph = text::parse(&src).unwrap();
    assert_eq!(text::print(&graph), src);
    let names: Vec<_> = graph.inputs().map(|(_, n, t)| format!("{n}:{t}")).collect();
    assert_eq!(names, ["a:f32[1024,1024]", "b:f32[1024,1024]"]);
}

#[test]
fn malformed_weights_files_are_errors() {
    for bytes in [
        vec![],
        vec![0xff; 8],
        b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":1}".to_vec(),
    ] {
        assert!(WeightsFile::from_bytes(bytes, "bad").is_err());
    }
    let (_, good) = examples::mlp().unwrap();
    for cut in [8, 100, good.len() - 1] {
        let err = WeightsFile::from_bytes(good[..cut].to_vec(), "cut").unwrap_err();
        assert!(
            err.to_string().contains("not a valid safetensors file"),
            "{err}"
        );
    }
}
