//! Single ops whose edge cases the backend tests do not reach: MatMul with a vector operand
//! on either side (numpy drops the axis it added), against a direct computation.

use std::collections::HashMap;

mod common;

use common::value;
use prost::Message;
use tenet_ir::HostTensor;
use tenet_onnx::onnx_proto::NodeProto;

fn run_matmul(a: &[u64], b: &[u64], av: &[f32], bv: &[f32]) -> HostTensor {
    let model = common::model(
        vec![NodeProto {
            op_type: Some("MatMul".into()),
            input: vec!["a".into(), "b".into()],
            output: vec!["c".into()],
            ..Default::default()
        }],
        vec![value("a", a), value("b", b)],
        vec![value("c", &[])],
        vec![],
    );
    let imported =
        tenet_onnx::import_bytes(&model.encode_to_vec(), None, &Default::default()).unwrap();
    let inputs = HashMap::from([
        ("a".to_string(), HostTensor::from_f32(a, av).unwrap()),
        ("b".to_string(), HostTensor::from_f32(b, bv).unwrap()),
    ]);
    tenet_reference::run(&imported.graph, &inputs, &tenet_ir::NoWeights, 0)
        .unwrap()
        .remove(0)
        .1
}

#[test]
fn matmul_with_vectors_drops_the_added_axis() {
    // [4] @ [2, 4, 3] → [2, 3]
    let a: Vec<f32> = (0..4).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..24).map(|i| (i % 7) as f32 - 3.0).collect();
    let c = run_matmul(&[4], &[2, 4, 3], &a, &b);
    assert_eq!(c.shape(), &[2, 3]);
    let want: Vec<f32> = (0..2)
        .flat_map(|bt| {
            let b = &b;
            let a = &a;
            (0..3).map(move |j| (0..4).map(|k| a[k] * b[bt * 12 + k * 3 + j]).sum())
        })
        .collect();
    assert_eq!(c.to_f32_vec(), want);
    // [2, 3, 4] @ [4] → [2, 3]
    let c = run_matmul(&[2, 3, 4], &[4], &b, &a);
    assert_eq!(c.shape(), &[2, 3]);
    // [4] @ [4] → []
    let c = run_matmul(&[4], &[4], &a, &a);
    assert_eq!(c.shape(), &[] as &[u64]);
    assert_eq!(c.to_f32_vec(), [14.0]);
}
