//! Single ops whose edge cases the backend tests do not reach: MatMul with a vector operand
//! on either side (numpy drops the axis it added), against a direct computation.

use std::collections::HashMap;

use prost::Message;
use tenet_ir::HostTensor;
use tenet_onnx::onnx_proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto, tensor_shape_proto, type_proto,
};

fn value(name: &str, dims: &[u64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn run_matmul(a: &[u64], b: &[u64], av: &[f32], bv: &[f32]) -> HostTensor {
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                op_type: Some("MatMul".into()),
                input: vec!["a".into(), "b".into()],
                output: vec!["c".into()],
                ..Default::default()
            }],
            input: vec![value("a", a), value("b", b)],
            output: vec![value("c", &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
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
