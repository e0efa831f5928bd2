//! The interpreter against hand-computed results: one or more cases per op, with the edge cases
//! docs/OPS.md promises (NaN, signed zeros, wrapping, saturation, order of accumulation).

use std::collections::HashMap;

use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, Tensor, TensorType, text};
use tenet_reference::{RunError, run, sum_ordered};

fn run_text(src: &str, inputs: &[(&str, HostTensor)]) -> Result<Vec<HostTensor>, RunError> {
    let g = text::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let map: HashMap<String, HostTensor> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    Ok(run(&g, &map, &NoWeights, 7)?
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// Build a one-output graph over f32 inputs with the builder and run it.
fn eval(shapes: &[(&str, &[u64], &[f32])], f: impl Fn(&[Tensor]) -> Tensor) -> HostTensor {
    let g = GraphBuilder::new();
    let ts: Vec<Tensor> = shapes
        .iter()
        .map(|(n, s, _)| g.input(n, DType::F32, s))
        .collect();
    let y = f(&ts);
    let graph = g.finish(&[("y", &y)]).unwrap_or_else(|e| panic!("{e}"));
    let inputs = shapes
        .iter()
        .map(|(n, s, v)| (n.to_string(), HostTensor::from_f32(s, v).unwrap()))
        .collect();
    run(&graph, &inputs, &NoWeights, 7).unwrap().remove(0).1
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    t.to_f32_vec()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn elementwise_float_rules() {
    let nan_payload = f32::from_bits(0x7fc0_1234);
    let x: &[f32] = &[-2.0, -0.0, 0.0, 1.5, f32::INFINITY, nan_payload];
    let y = eval(&[("x", &[6], x)], |t| t[0].relu());
    assert_eq!(
        bits(&f32s(&y)),
        bits(&[0.0, 0.0, 0.0, 1.5, f32::INFINITY, f32::NAN])
    );
    // neg and abs act on the sign bit only, so NaN payloads survive.
    let y = eval(&[("x", &[6], x)], |t| t[0].neg());
    assert_eq!(f32s(&y)[5].to_bits(), 0xffc0_1234);
    assert_eq!(f32s(&y)[1].to_bits(), 0.0f32.to_bits());
    // Computing ops produce the canonical NaN.
    let y = eval(&[("x", &[6], x)], |t| &t[0] * 1.0);
    assert_eq!(f32s(&y)[5].to_bits(), 0x7fc0_0000);
    let y = eval(&[("x", &[6], x)], |t| t[0].sign());
    assert_eq!(
        bits(&f32s(&y)),
        bits(&[-1.0, -0.0, 0.0, 1.0, 1.0, f32::NAN])
    );
    let y = eval(&[("x", &[4], &[0.5, 1.5, 2.5, -0.5])], |t| t[0].round());
    assert_eq!(f32s(&y), vec![0.0, 2.0, 2.0, -0.0]);
}

#[test]
fn max_min_signed_zero_and_nan() {
    let a: &[f32] = &[-0.0, 0.0, 1.0, f32::NAN];
    let b: &[f32] = &[0.0, -0.0, f32::NAN, 1.0];
    let mx = eval(&[("a", &[4], a), ("b", &[4], b)], |t| t[0].maximum(&t[1]));
    assert_eq!(bits(&f32s(&mx)), bits(&[0.0, 0.0, f32::NAN, f32::NAN]));
    let mn = eval(&[("a", &[4], a), ("b", &[4], b)], |t| t[0].minimum(&t[1]));
    assert_eq!(bits(&f32s(&mn)), bits(&[-0.0, -0.0, f32::NAN, f32::NAN]));
}

#[test]
fn broadcasting_and_comparisons() {
    let y = eval(
        &[
            ("a", &[2, 1], &[1.0, 2.0]),
            ("b", &[3], &[10.0, 20.0, 30.0]),
        ],
        |t| &t[0] + &t[1],
    );
    assert_eq!(y.shape(), &[2, 3]);
    assert_eq!(f32s(&y), vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    let out = run_text(
        "tenet graph v1\n%0 = input(\"a\") : f32[3]\n%1 = const(1.0) : f32[]\n%2 = lt(%0, %1) : bool[3]\n%3 = ne(%0, %0) : bool[3]\noutput \"lt\" = %2\noutput \"nan\" = %3\n",
        &[("a", HostTensor::from_f32(&[3], &[0.5, 1.0, f32::NAN]).unwrap())],
    )
    .unwrap();
    assert_eq!(out[0].bytes(), &[1, 0, 0]);
    assert_eq!(out[1].bytes(), &[0, 0, 1]);
}

#[test]
fn integer_arithmetic_wraps_and_divides_safely() {
    let src = "tenet graph v1\n%0 = input(\"a\") : i32[4]\n%1 = input(\"b\") : i32[4]\n%2 = add(%0, %1) : i32[4]\n%3 = div(%0, %1) : i32[4]\n%4 = mul(%0, %1) : i32[4]\noutput \"add\" = %2\noutput \"div\" = %3\noutput \"mul\" = %4\n";
    let a = HostTensor::from_i32(&[4], &[i32::MAX, i32::MIN, 7, -7]).unwrap();
    let b = HostTensor::from_i32(&[4], &[1, -1, 0, 2]).unwrap();
    let out = run_text(src, &[("a", a), ("b", b)]).unwrap();
    assert_eq!(
        out[0].to_i64_vec(),
        vec![i32::MIN as i64, i32::MAX as i64, 7, -5]
    );
    assert_eq!(
        out[1].to_i64_vec(),
        vec![i32::MAX as i64, i32::MIN as i64, 0, -3]
    );
    assert_eq!(
        out[2].to_i64_vec(),
        vec![i32::MAX as i64, i32::MIN as i64, 0, -14]
    );
}

#[test]
fn casts_saturate_truncate_and_round() {
    let src = "tenet graph v1\n%0 = input(\"x\") : f32[5]\n%1 = cast(%0) : i32[5]\n%2 = cast(%0) : u8[5]\n%3 = cast(%0) : bool[5]\n%4 = cast(%0) : f16[5]\noutput \"i\" = %1\noutput \"u\" = %2\noutput \"b\" = %3\noutput \"h\" = %4\n";
    let x = HostTensor::from_f32(&[5], &[-1.7, 3e10, f32::NAN, 300.9, 1.0 + 1.0 / 4096.0]).unwrap();
    let out = run_text(src, &[("x", x)]).unwrap();
    assert_eq!(out[0].to_i64_vec(), vec![-1, i32::MAX as i64, 0, 300, 1]);
    assert_eq!(out[1].to_i64_vec(), vec![0, 255, 0, 255, 1]);
    assert_eq!(out[2].bytes(), &[1, 1, 1, 1, 1]);
    // 1 + 2^-12 is halfway between two f16 values: ties to even gives 1.0.
    assert_eq!(out[3].to_f32_vec()[4], 1.0);
    assert_eq!(out[3].to_f32_vec()[1], f32::INFINITY);
}

#[test]
fn sums_follow_the_sixteen_lane_order() {
    // 1e8 in lane 0, then 1.0 in lanes 1..=15 and 1.0 again in lane 0 (element 16): the lane sums
    // differ from a sequential sum, which loses every 1.0 against 1e8.
    let mut v = vec![1.0f32; 17];
    v[0] = 1e8;
    let expected = sum_ordered(v.iter().copied());
    let sequential = v.iter().fold(0.0f32, |a, &b| a + b);
    assert_ne!(
        expected, sequential,
        "the test values must tell the orders apart"
    );
    let y = eval(&[("x", &[17], &v)], |t| t[0].sum(&[0], false));
    assert_eq!(f32s(&y), vec![expected]);
    // Sum over a non-trailing axis visits elements in row-major order of the reduced index.
    let y = eval(&[("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])], |t| {
        t[0].sum(&[0], true)
    });
    assert_eq!((y.shape(), f32s(&y)), (&[1u64, 3][..], vec![5.0, 7.0, 9.0]));
    let y = eval(&[("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])], |t| {
        t[0].mean(&[0, 1], false)
    });
    assert_eq!(f32s(&y), vec![3.5]);
}

#[test]
fn arg_reductions_take_the_first_extreme_and_nan() {
    let y = eval(&[("x", &[5], &[1.0, 3.0, 3.0, f32::NAN, f32::NAN])], |t| {
        t[0].argmax(&[0], false)
    });
    assert_eq!(y.to_i64_vec(), vec![3]);
    let y = eval(&[("x", &[4], &[2.0, -1.0, 5.0, -1.0])], |t| {
        t[0].argmin(&[0], false)
    });
    assert_eq!(y.to_i64_vec(), vec![1]);
    let y = eval(&[("x", &[2, 2], &[1.0, 9.0, 4.0, 2.0])], |t| {
        t[0].argmax(&[0, 1], false)
    });
    assert_eq!(y.to_i64_vec(), vec![1]);
    let y = eval(&[("x", &[2, 3], &[1.0, 9.0, 4.0, 2.0, -8.0, 0.5])], |t| {
        t[0].max(&[1], false)
    });
    assert_eq!(f32s(&y), vec![9.0, 2.0]);
}

#[test]
fn matmul_is_one_fma_chain_per_element() {
    // acc = fma(-1, 1, 0) = -1, then fma(e, e, -1) keeps (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24
    // exactly; a separate multiply would round e·e to 1 + 2^-11 first and lose the 2^-24.
    let e = 1.0 + 1.0 / 4096.0;
    let y = eval(
        &[("a", &[1, 2], &[-1.0, e]), ("b", &[2, 1], &[1.0, e])],
        |t| t[0].matmul(&t[1]),
    );
    assert_eq!(f32s(&y), vec![1.0 / 2048.0 + 1.0 / 16_777_216.0]);
    assert_ne!(e * e - 1.0, 1.0 / 2048.0 + 1.0 / 16_777_216.0);
    // Batched with broadcasting: [2, 2, 2] @ [2, 2].
    let a: Vec<f32> = (0..8).map(|v| v as f32).collect();
    let y = eval(
        &[("a", &[2, 2, 2], &a), ("b", &[2, 2], &[1.0, 0.0, 0.0, 2.0])],
        |t| t[0].matmul(&t[1]),
    );
    assert_eq!(f32s(&y), vec![0.0, 2.0, 2.0, 6.0, 4.0, 10.0, 6.0, 14.0]);
}

#[test]
fn movement_ops() {
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let y = eval(&[("x", &[2, 3], &x)], |t| t[0].transpose(0, 1));
    assert_eq!(f32s(&y), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let y = eval(&[("x", &[2, 3], &x)], |t| t[0].slice(1, 0, 3, 2));
    assert_eq!(f32s(&y), vec![0.0, 2.0, 3.0, 5.0]);
    let y = eval(&[("x", &[2, 3], &x)], |t| t[0].pad(&[(1, 0), (0, 1)], -1.0));
    assert_eq!(y.shape(), &[3, 4]);
    assert_eq!(
        f32s(&y),
        vec![
            -1.0, -1.0, -1.0, -1.0, 0.0, 1.0, 2.0, -1.0, 3.0, 4.0, 5.0, -1.0
        ]
    );
    let y = eval(&[("x", &[2, 3], &x)], |t| {
        t[0].slice(1, 2, 3, 1).expand(&[2, 2])
    });
    assert_eq!(f32s(&y), vec![2.0, 2.0, 5.0, 5.0]);
}

#[test]
fn concat_gather_iota_trimask() {
    let src = "tenet graph v1\n%0 = input(\"a\") : f32[2,1]\n%1 = input(\"b\") : f32[2,2]\n%2 = concat(%0, %1, axis=1) : f32[2,3]\n%3 = input(\"i\") : i64[3]\n%4 = gather(%2, %3, axis=1) : f32[2,3]\n%5 = iota(axis=1) : i32[2,3]\n%6 = tri_mask(upper=false, diagonal=0) : bool[3,3]\noutput \"cat\" = %2\noutput \"g\" = %4\noutput \"iota\" = %5\noutput \"tri\" = %6\n";
    let out = run_text(
        src,
        &[
            ("a", HostTensor::from_f32(&[2, 1], &[1.0, 2.0]).unwrap()),
            (
                "b",
                HostTensor::from_f32(&[2, 2], &[3.0, 4.0, 5.0, 6.0]).unwrap(),
            ),
            ("i", HostTensor::from_i64(&[3], &[2, -3, 0]).unwrap()),
        ],
    )
    .unwrap();
    assert_eq!(out[0].to_f32_vec(), vec![1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
    assert_eq!(out[1].to_f32_vec(), vec![4.0, 1.0, 1.0, 6.0, 2.0, 2.0]);
    assert_eq!(out[2].to_i64_vec(), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(out[3].bytes(), &[1, 0, 0, 1, 1, 0, 1, 1, 1]);

    let bad = run_text(
        src,
        &[
            ("a", HostTensor::from_f32(&[2, 1], &[1.0, 2.0]).unwrap()),
            (
                "b",
                HostTensor::from_f32(&[2, 2], &[3.0, 4.0, 5.0, 6.0]).unwrap(),
            ),
            ("i", HostTensor::from_i64(&[3], &[0, 3, 0]).unwrap()),
        ],
    );
    assert_eq!(
        bad.unwrap_err(),
        RunError::IndexOutOfRange {
            node: tenet_ir::NodeId(4),
            index: 3,
            size: 3
        }
    );
}

#[test]
fn softmax_and_norms_follow_their_definitions() {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let y = f32s(&eval(&[("x", &[4], &x)], |t| t[0].softmax(0)));
    let e: Vec<f32> = x
        .iter()
        .map(|&v| tenet_reference::math::exp(v - 4.0))
        .collect();
    let s = sum_ordered(e.iter().copied());
    assert_eq!(y, e.iter().map(|v| v / s).collect::<Vec<_>>());
    assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-6);

    let y = f32s(&eval(&[("x", &[4], &x)], |t| {
        t[0].layer_norm(None, None, 1e-5)
    }));
    let mean = 2.5f32;
    let var = sum_ordered(x.iter().map(|v| (v - mean) * (v - mean))) / 4.0;
    let r = 1.0 / (var + 1e-5).sqrt();
    assert_eq!(y, x.iter().map(|v| (v - mean) * r).collect::<Vec<_>>());

    let y = f32s(&eval(
        &[("x", &[4], &x), ("g", &[4], &[1.0, 2.0, 1.0, 0.5])],
        |t| t[0].rms_norm(Some(&t[1]), 1e-6),
    ));
    let r = 1.0 / (sum_ordered(x.iter().map(|v| v * v)) / 4.0 + 1e-6).sqrt();
    assert_eq!(
        y,
        vec![(1.0 * r) * 1.0, (2.0 * r) * 2.0, 3.0 * r, (4.0 * r) * 0.5]
    );

    let y = f32s(&eval(
        &[("x", &[2], &[f32::NEG_INFINITY, f32::NEG_INFINITY])],
        |t| t[0].softmax(0),
    ));
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn conv_and_pools() {
    // 1×1×3×3 input, 1×1×2×2 kernel of ones, padding 1 on top/left only.
    let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    let y = eval(
        &[("x", &[1, 1, 3, 3], &x), ("w", &[1, 1, 2, 2], &[1.0; 4])],
        |t| t[0].conv2d(&t[1], None, [1, 1], [1, 1, 0, 0], [1, 1], 1),
    );
    assert_eq!(y.shape(), &[1, 1, 3, 3]);
    assert_eq!(
        f32s(&y),
        vec![1.0, 3.0, 5.0, 5.0, 12.0, 16.0, 11.0, 24.0, 28.0]
    );
    let y = eval(&[("x", &[1, 1, 3, 3], &x)], |t| {
        t[0].max_pool2d([2, 2], [1, 1], [0, 0, 0, 0])
    });
    assert_eq!(f32s(&y), vec![5.0, 6.0, 8.0, 9.0]);
    let y = eval(&[("x", &[1, 1, 3, 3], &x)], |t| {
        t[0].avg_pool2d([2, 2], [2, 2], [1, 1, 1, 1])
    });
    // Windows at the corners see 1, 2 and 4 real elements.
    assert_eq!(f32s(&y), vec![1.0, 2.5, 5.5, 7.0]);
    // Grouped convolution: two channels, each its own 1×1 kernel.
    let y = eval(
        &[
            ("x", &[1, 2, 1, 2], &[1.0, 2.0, 3.0, 4.0]),
            ("w", &[2, 1, 1, 1], &[10.0, -1.0]),
        ],
        |t| t[0].conv2d(&t[1], None, [1, 1], [0, 0, 0, 0], [1, 1], 2),
    );
    assert_eq!(f32s(&y), vec![10.0, 20.0, -3.0, -4.0]);
}

#[test]
fn random_is_deterministic_and_well_distributed() {
    let g = GraphBuilder::new();
    let u = g.random_uniform(DType::F32, &[4096], 1);
    let n = g.random_normal(DType::F32, &[4096], 2);
    let graph = g.finish(&[("u", &u), ("n", &n)]).unwrap();
    let a = run(&graph, &HashMap::new(), &NoWeights, 42).unwrap();
    let b = run(&graph, &HashMap::new(), &NoWeights, 42).unwrap();
    let c = run(&graph, &HashMap::new(), &NoWeights, 43).unwrap();
    assert_eq!(a, b);
    assert_ne!(a[0].1, c[0].1);
    let u = a[0].1.to_f32_vec();
    assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
    let mean = u.iter().sum::<f32>() / 4096.0;
    assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}");
    let nv = a[1].1.to_f32_vec();
    let m = nv.iter().sum::<f32>() / 4096.0;
    let var = nv.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / 4096.0;
    assert!(
        m.abs() < 0.05 && (var - 1.0).abs() < 0.08,
        "normal mean {m} var {var}"
    );
}

#[test]
fn half_types_compute_in_f32_and_round_once() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F16, &[1, 3]);
    let b = g.input("b", DType::F16, &[3, 1]);
    let y = a.matmul(&b);
    let graph = g.finish(&[("y", &y)]).unwrap();
    let half = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let inputs = HashMap::from([
        (
            "a".to_string(),
            HostTensor::new(
                TensorType::new(DType::F16, [1, 3]),
                half(&[1000.0, 0.25, 0.25]),
            )
            .unwrap(),
        ),
        (
            "b".to_string(),
            HostTensor::new(TensorType::new(DType::F16, [3, 1]), half(&[1.0, 1.0, 1.0])).unwrap(),
        ),
    ]);
    let out = run(&graph, &inputs, &NoWeights, 0).unwrap();
    // f32 accumulation keeps 1000.5, which f16 (spacing 0.5 near 1000) represents exactly; an f16
    // accumulator would have rounded 1000.25 to 1000 twice.
    assert_eq!(out[0].1.to_f32_vec(), vec![1000.5]);
}

#[test]
fn interface_errors_name_the_input() {
    let src =
        "tenet graph v1\n%0 = input(\"a\") : f32[2]\n%1 = exp(%0) : f32[2]\noutput \"y\" = %1\n";
    let e = run_text(src, &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("missing input \"a\": the graph expects f32[2]"),
        "{e}"
    );
    let e = run_text(
        src,
        &[("a", HostTensor::from_f32(&[3], &[0.0; 3]).unwrap())],
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("input \"a\" is f32[3], the graph expects f32[2]"),
        "{e}"
    );
    let e = run_text(
        src,
        &[
            ("a", HostTensor::from_f32(&[2], &[0.0; 2]).unwrap()),
            ("zz", HostTensor::from_f32(&[1], &[0.0]).unwrap()),
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("unexpected input \"zz\""), "{e}");
}
