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

/// An f32 initializer.
fn init(name: &str, dims: &[i64], v: &[f32]) -> tenet_onnx::onnx_proto::TensorProto {
    tenet_onnx::onnx_proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// Conv then BatchNormalization, `y` the normalised result and, with `also_read`, the
/// convolution's own output as a second graph output; the imported graph's op names and its
/// outputs on a fixed input.
fn conv_bn(also_read: bool) -> (Vec<&'static str>, Vec<(String, HostTensor)>, Vec<f64>) {
    use tenet_onnx::onnx_proto::{AttributeProto, attribute_proto::AttributeType};
    let (c, o, hw) = (2usize, 3usize, 5usize);
    let w: Vec<f32> = (0..o * c * 9)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let b = [0.5f32, -0.25, 0.125];
    let (scale, shift, mean, var) = (
        [1.5f32, -0.5, 2.0],
        [0.1f32, 0.2, -0.3],
        [0.3f32, -0.1, 0.05],
        [0.8f32, 1.7, 0.02],
    );
    let pads = AttributeProto {
        name: Some("pads".into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: vec![1, 1, 1, 1],
        ..Default::default()
    };
    let mut outputs = vec![value("y", &[1, o as u64, hw as u64, hw as u64])];
    if also_read {
        outputs.push(value("c", &[1, o as u64, hw as u64, hw as u64]));
    }
    let model = common::model(
        vec![
            NodeProto {
                op_type: Some("Conv".into()),
                input: vec!["x".into(), "w".into(), "b".into()],
                output: vec!["c".into()],
                attribute: vec![pads],
                ..Default::default()
            },
            NodeProto {
                op_type: Some("BatchNormalization".into()),
                input: ["c", "scale", "shift", "mean", "var"]
                    .map(String::from)
                    .to_vec(),
                output: vec!["y".into()],
                ..Default::default()
            },
        ],
        vec![value("x", &[1, c as u64, hw as u64, hw as u64])],
        outputs,
        vec![
            init("w", &[o as i64, c as i64, 3, 3], &w),
            init("b", &[o as i64], &b),
            init("scale", &[3], &scale),
            init("shift", &[3], &shift),
            init("mean", &[3], &mean),
            init("var", &[3], &var),
        ],
    );
    let imported =
        tenet_onnx::import_bytes(&model.encode_to_vec(), None, &Default::default()).unwrap();
    let ops: Vec<&'static str> = imported
        .graph
        .nodes()
        .iter()
        .filter(|n| !n.op.is_source())
        .map(|n| n.op.name())
        .collect();
    let x: Vec<f32> = (0..c * hw * hw)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.125)
        .collect();
    let inputs = HashMap::from([(
        "x".to_string(),
        HostTensor::from_f32(&[1, c as u64, hw as u64, hw as u64], &x).unwrap(),
    )]);
    let weights = tenet_models::WeightSet(
        imported
            .weights
            .map(|b| tenet_models::WeightsFile::from_bytes(b, "w").unwrap())
            .into_iter()
            .collect(),
    );
    let out = tenet_reference::run(&imported.graph, &inputs, &weights, 0).unwrap();
    // BatchNormalization of the convolution, in f64.
    let mut want = Vec::new();
    for oc in 0..o {
        let s = scale[oc] as f64 / (var[oc] as f64 + 1e-5).sqrt();
        for y in 0..hw {
            for xx in 0..hw {
                let mut acc = b[oc] as f64;
                for ic in 0..c {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (y as i64 + ky - 1, xx as i64 + kx - 1);
                            if (0..hw as i64).contains(&iy) && (0..hw as i64).contains(&ix) {
                                acc += w[((oc * c + ic) * 3 + ky as usize) * 3 + kx as usize]
                                    as f64
                                    * x[(ic * hw + iy as usize) * hw + ix as usize] as f64;
                            }
                        }
                    }
                }
                want.push((acc - mean[oc] as f64) * s + shift[oc] as f64);
            }
        }
    }
    (ops, out, want)
}

#[test]
fn batch_norm_after_a_convolution_folds_into_its_weights() {
    let (ops, out, want) = conv_bn(false);
    // One convolution with the normalisation in its weights and bias: no pass after it.
    assert_eq!(ops.iter().filter(|&&o| o == "conv2d").count(), 1, "{ops:?}");
    assert!(!ops.iter().any(|&o| o == "mul" || o == "add"), "{ops:?}");
    let y = out[0].1.to_f32_vec();
    for (g, w) in y.iter().zip(&want) {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{g} vs {w}"
        );
    }
    // When something else reads the convolution's output too, it is kept and the
    // normalisation applied after it.
    let (ops, out, want) = conv_bn(true);
    assert!(ops.contains(&"mul"), "{ops:?}");
    let y = out[0].1.to_f32_vec();
    for (g, w) in y.iter().zip(&want) {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{g} vs {w}"
        );
    }
}
