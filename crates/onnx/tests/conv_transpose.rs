//! ConvTranspose, imported both ways (as one phase-stacked pointwise convolution when its
//! kernel equals its stride, else over the zero-upsampled input), against a direct scatter
//! implementation of ONNX's definition in f64: strides, pads, output_padding, output_shape,
//! groups, dilations and bias.

use std::collections::HashMap;

mod common;

use common::value;
use prost::Message;
use tenet_ir::HostTensor;
use tenet_onnx::onnx_proto::{AttributeProto, NodeProto, TensorProto};

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        ints: v.to_vec(),
        r#type: Some(7),
        ..Default::default()
    }
}

struct Case {
    x: [u64; 4],
    c_out_per_group: u64,
    kernel: [u64; 2],
    strides: [u64; 2],
    dilations: [u64; 2],
    pads: [u64; 4],
    out_pad: [u64; 2],
    group: u64,
    bias: bool,
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// ONNX's ConvTranspose by its definition: every input element scatters `x · w` into the
/// outputs its kernel covers, then the pads are cropped.
fn direct(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> (Vec<u64>, Vec<f64>) {
    let [n, ci, h, wd] = c.x;
    let g = c.group;
    let og = c.c_out_per_group;
    let o = og * g;
    let full = |i: usize, len: u64| {
        c.strides[i] * (len - 1) + c.out_pad[i] + (c.kernel[i] - 1) * c.dilations[i] + 1
    };
    let (fh, fw) = (full(0, h), full(1, wd));
    let mut y = vec![0f64; (n * o * fh * fw) as usize];
    for b_ in 0..n {
        for cc in 0..ci {
            let grp = cc / (ci / g);
            for i in 0..h {
                for j in 0..wd {
                    let xv = x[(((b_ * ci + cc) * h + i) * wd + j) as usize] as f64;
                    for oo in 0..og {
                        for a in 0..c.kernel[0] {
                            for bb in 0..c.kernel[1] {
                                let wv = w[(((cc * og + oo) * c.kernel[0] + a) * c.kernel[1] + bb)
                                    as usize] as f64;
                                let t = i * c.strides[0] + a * c.dilations[0];
                                let u = j * c.strides[1] + bb * c.dilations[1];
                                let oc = grp * og + oo;
                                y[(((b_ * o + oc) * fh + t) * fw + u) as usize] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    let (oh, ow) = (fh - c.pads[0] - c.pads[2], fw - c.pads[1] - c.pads[3]);
    let mut out = Vec::new();
    for b_ in 0..n {
        for oc in 0..o {
            for t in 0..oh {
                for u in 0..ow {
                    let v = y[(((b_ * o + oc) * fh + t + c.pads[0]) * fw + u + c.pads[1]) as usize];
                    out.push(v + b.map_or(0.0, |b| b[oc as usize] as f64));
                }
            }
        }
    }
    (vec![n, o, oh, ow], out)
}

#[test]
fn conv_transpose_matches_its_definition() {
    let cases = [
        Case {
            x: [1, 3, 4, 5],
            c_out_per_group: 4,
            kernel: [2, 2],
            strides: [2, 2],
            dilations: [1, 1],
            pads: [0; 4],
            out_pad: [0, 0],
            group: 1,
            bias: true,
        },
        Case {
            x: [2, 2, 3, 3],
            c_out_per_group: 3,
            kernel: [3, 2],
            strides: [3, 2],
            dilations: [1, 1],
            pads: [1, 0, 2, 1],
            out_pad: [1, 1],
            group: 1,
            bias: false,
        },
        Case {
            x: [1, 4, 3, 4],
            c_out_per_group: 2,
            kernel: [3, 3],
            strides: [2, 1],
            dilations: [1, 2],
            pads: [1, 1, 0, 2],
            out_pad: [1, 0],
            group: 2,
            bias: true,
        },
        Case {
            x: [1, 2, 5, 2],
            c_out_per_group: 2,
            kernel: [2, 2],
            strides: [2, 2],
            dilations: [1, 1],
            pads: [1, 1, 1, 1],
            out_pad: [0, 1],
            group: 1,
            bias: true,
        },
    ];
    for (k, c) in cases.iter().enumerate() {
        let w_dims = [c.x[1], c.c_out_per_group, c.kernel[0], c.kernel[1]];
        let xv = values(c.x.iter().product::<u64>() as usize, 3 + k as u64);
        let wv = values(w_dims.iter().product::<u64>() as usize, 7 + k as u64);
        let bv = values((c.c_out_per_group * c.group) as usize, 11 + k as u64);
        let (shape, want) = direct(c, &xv, &wv, c.bias.then_some(&bv[..]));
        let tensor = |name: &str, dims: &[u64], v: &[f32]| TensorProto {
            name: Some(name.into()),
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(1),
            raw_data: Some(v.iter().flat_map(|f| f.to_le_bytes()).collect()),
            ..Default::default()
        };
        let mut inputs = vec!["x".to_string(), "w".to_string()];
        let mut inits = vec![tensor("w", &w_dims, &wv)];
        if c.bias {
            inputs.push("b".into());
            inits.push(tensor("b", &[c.c_out_per_group * c.group], &bv));
        }
        let node = NodeProto {
            op_type: Some("ConvTranspose".into()),
            input: inputs,
            output: vec!["y".into()],
            attribute: vec![
                ints("kernel_shape", &c.kernel.map(|v| v as i64)),
                ints("strides", &c.strides.map(|v| v as i64)),
                ints("dilations", &c.dilations.map(|v| v as i64)),
                ints("pads", &c.pads.map(|v| v as i64)),
                ints("output_padding", &c.out_pad.map(|v| v as i64)),
                AttributeProto {
                    name: Some("group".into()),
                    i: Some(c.group as i64),
                    r#type: Some(2),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let model = common::model(
            vec![node],
            vec![value("x", &c.x)],
            vec![value("y", &shape)],
            inits,
        );
        let imported =
            tenet_onnx::import_bytes(&model.encode_to_vec(), None, &Default::default()).unwrap();
        let weights = match &imported.weights {
            Some(b) => tenet_models::WeightSet(vec![
                tenet_models::WeightsFile::from_bytes(b.clone(), "w").unwrap(),
            ]),
            None => tenet_models::WeightSet(Vec::new()),
        };
        let x = HostTensor::from_f32(&c.x, &xv).unwrap();
        let out = tenet_reference::run(
            &imported.graph,
            &HashMap::from([("x".to_string(), x)]),
            &weights,
            0,
        )
        .unwrap();
        assert_eq!(out[0].1.shape(), &shape[..], "case {k}");
        for (i, (&got, &want)) in out[0].1.to_f32_vec().iter().zip(&want).enumerate() {
            assert!(
                (got as f64 - want).abs() <= 1e-5 + 1e-5 * want.abs(),
                "case {k} element {i}: {got} vs {want}"
            );
        }
    }
}
