//! Gradients against formulas written out by hand (no autodiff involved): matmul, softmax
//! cross-entropy and layer_norm; the documented choices at points without a derivative; the
//! quantised product's gradient against the dense product's, bit for bit; and the errors.

use std::collections::HashMap;

use tenet_autodiff::{GradError, grad, gradients};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, NoWeights, QuantFormat};

fn run(graph: &Graph, inputs: &[(&str, HostTensor)]) -> HashMap<String, Vec<f32>> {
    let inputs: HashMap<String, HostTensor> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    tenet_reference::run(graph, &inputs, &NoWeights, 0)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_f32_vec()))
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503));
            ((x >> 8) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn close(a: &[f32], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: sizes");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x as f64 - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs the closed form's {y}"
        );
    }
}

#[test]
fn matmul_is_g_times_b_transposed_and_a_transposed_times_g() {
    let (m, k, n) = (3, 4, 2);
    let b = GraphBuilder::new();
    let a_in = b.input("a", DType::F32, &[m, k]);
    let b_in = b.input("b", DType::F32, &[k, n]);
    let r_in = b.input("r", DType::F32, &[m, n]);
    let loss = (a_in.matmul(&b_in) * &r_in).sum(&[0, 1], false);
    let graph = b.finish(&[("loss", &loss)]).unwrap();
    let g = grad(&graph, "loss", &["a", "b"]).unwrap();
    let (av, bv, rv) = (values(12, 1), values(8, 2), values(6, 3));
    let out = run(
        &g,
        &[
            ("a", HostTensor::from_f32(&[m, k], &av).unwrap()),
            ("b", HostTensor::from_f32(&[k, n], &bv).unwrap()),
            ("r", HostTensor::from_f32(&[m, n], &rv).unwrap()),
        ],
    );
    let (m, k, n) = (m as usize, k as usize, n as usize);
    // dL/dA = R Bᵀ, dL/dB = Aᵀ R.
    let mut da = vec![0f64; m * k];
    let mut db = vec![0f64; k * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                da[i * k + p] += rv[i * n + j] as f64 * bv[p * n + j] as f64;
                db[p * n + j] += av[i * k + p] as f64 * rv[i * n + j] as f64;
            }
        }
    }
    close(&out["grad/a"], &da, 1e-6, "dA");
    close(&out["grad/b"], &db, 1e-6, "dB");
}

#[test]
fn softmax_cross_entropy_is_softmax_minus_onehot_over_n() {
    let (rows, classes) = (5u64, 4u64);
    let b = GraphBuilder::new();
    let z = b.input("z", DType::F32, &[rows, classes]);
    let labels = b.input("labels", DType::I64, &[rows, 1]);
    let onehot = labels
        .eq(&b.iota(DType::I64, &[rows, classes], 1))
        .cast(DType::F32);
    let loss = -(z.log_softmax(-1) * onehot)
        .sum(&[1], false)
        .mean(&[0], false);
    let graph = b.finish(&[("loss", &loss)]).unwrap();
    let g = grad(&graph, "loss", &["z"]).unwrap();
    let zv: Vec<f32> = values(20, 9).iter().map(|v| v * 3.0).collect();
    let lv = vec![0i64, 3, 1, 1, 2];
    let out = run(
        &g,
        &[
            ("z", HostTensor::from_f32(&[rows, classes], &zv).unwrap()),
            ("labels", HostTensor::from_i64(&[rows, 1], &lv).unwrap()),
        ],
    );
    let (rows, classes) = (rows as usize, classes as usize);
    let mut want = vec![0f64; rows * classes];
    for r in 0..rows {
        let row = &zv[r * classes..(r + 1) * classes];
        let m = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for c in 0..classes {
            let p = (row[c] as f64 - m).exp() / s;
            let y = if lv[r] as usize == c { 1.0 } else { 0.0 };
            want[r * classes + c] = (p - y) / rows as f64;
        }
    }
    close(&out["grad/z"], &want, 2e-6, "dZ");
}

#[test]
fn layer_norm_matches_its_textbook_gradient() {
    let (rows, n) = (3u64, 6u64);
    let eps = 1e-5f32;
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, &[rows, n]);
    let gamma = b.input("gamma", DType::F32, &[n]);
    let beta = b.input("beta", DType::F32, &[n]);
    let r = b.input("r", DType::F32, &[rows, n]);
    let loss = (x.layer_norm(Some(&gamma), Some(&beta), eps) * &r).sum(&[0, 1], false);
    let graph = b.finish(&[("loss", &loss)]).unwrap();
    let g = grad(&graph, "loss", &["x", "gamma", "beta"]).unwrap();
    let xv: Vec<f32> = values(18, 4).iter().map(|v| v * 2.0).collect();
    let gv: Vec<f32> = values(6, 5).iter().map(|v| 1.0 + v * 0.5).collect();
    let bv = values(6, 6);
    let rv = values(18, 7);
    let out = run(
        &g,
        &[
            ("x", HostTensor::from_f32(&[rows, n], &xv).unwrap()),
            ("gamma", HostTensor::from_f32(&[n], &gv).unwrap()),
            ("beta", HostTensor::from_f32(&[n], &bv).unwrap()),
            ("r", HostTensor::from_f32(&[rows, n], &rv).unwrap()),
        ],
    );
    let (rows, n) = (rows as usize, n as usize);
    let (mut dx, mut dg, mut db) = (vec![0f64; rows * n], vec![0f64; n], vec![0f64; n]);
    for i in 0..rows {
        let row: Vec<f64> = xv[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect();
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let dxhat: Vec<f64> = (0..n)
            .map(|j| rv[i * n + j] as f64 * gv[j] as f64)
            .collect();
        let m1 = dxhat.iter().sum::<f64>() / n as f64;
        let m2 = (0..n).map(|j| dxhat[j] * xhat[j]).sum::<f64>() / n as f64;
        for j in 0..n {
            dx[i * n + j] = rstd * (dxhat[j] - m1 - xhat[j] * m2);
            dg[j] += rv[i * n + j] as f64 * xhat[j];
            db[j] += rv[i * n + j] as f64;
        }
    }
    close(&out["grad/x"], &dx, 2e-5, "dX");
    close(&out["grad/gamma"], &dg, 1e-5, "dGamma");
    close(&out["grad/beta"], &db, 1e-6, "dBeta");
}

#[test]
fn ties_follow_the_documented_choices() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, &[1, 1, 2, 2]);
    let pooled = x
        .max_pool2d([2, 2], [1, 1], [0, 0, 0, 0])
        .sum(&[0, 1, 2, 3], false);
    let reduced = x.max(&[2, 3], false).sum(&[0, 1], false);
    let pair = x.maximum(&(x.clone() * 1.0)).sum(&[0, 1, 2, 3], false);
    let relu = x.relu().sum(&[0, 1, 2, 3], false);
    let loss = pooled * 1.0 + reduced * 10.0 + pair * 100.0 + relu * 1000.0;
    let graph = b.finish(&[("loss", &loss)]).unwrap();
    let g = grad(&graph, "loss", &["x"]).unwrap();
    let out = run(
        &g,
        &[(
            "x",
            HostTensor::from_f32(&[1, 1, 2, 2], &[0.0, 0.0, 0.0, 0.0]).unwrap(),
        )],
    );
    // max_pool2d: the first maximum takes it all; reduce_max: shared by the four tied
    // elements; max(x, x): half to each side, so 1 in all; relu at 0: nothing.
    assert_eq!(
        out["grad/x"],
        vec![1.0 + 2.5 + 100.0, 2.5 + 100.0, 2.5 + 100.0, 2.5 + 100.0]
    );
}

#[test]
fn quantised_product_gradient_equals_the_dense_one_bit_for_bit() {
    let (m, k, n) = (3u64, 64u64, 5u64);
    let format = QuantFormat::Q8_0;
    let bb = format.block_bytes();
    let mut blocks = vec![0u8; (n * (k / 32) * bb) as usize];
    for (i, byte) in blocks.iter_mut().enumerate() {
        *byte = (i as u32).wrapping_mul(2654435761).to_le_bytes()[2];
    }
    // Tame scales: f16 1/64 in each block's first two bytes.
    for blk in blocks.chunks_mut(bb as usize) {
        blk[..2].copy_from_slice(&half::f16::from_f32(1.0 / 64.0).to_le_bytes());
    }
    let w = HostTensor::new(
        tenet_ir::TensorType::new(DType::U8, [n, k / 32, bb]),
        blocks,
    )
    .unwrap();
    let av = values((m * k) as usize, 11);
    let rv = values((m * n) as usize, 12);

    let q = GraphBuilder::new();
    let a = q.input("a", DType::F32, &[m, k]);
    let wq = q.input("w", DType::U8, &[n, k / 32, bb]);
    let r = q.input("r", DType::F32, &[m, n]);
    let loss = (a.qmatmul(&wq, format) * &r).sum(&[0, 1], false);
    let qg = grad(&q.finish(&[("loss", &loss)]).unwrap(), "loss", &["a"]).unwrap();

    let d = GraphBuilder::new();
    let a = d.input("a", DType::F32, &[m, k]);
    let wq = d.input("w", DType::U8, &[n, k / 32, bb]);
    let r = d.input("r", DType::F32, &[m, n]);
    let dense = wq.dequantize(format).transpose(0, 1);
    let loss = (a.matmul(&dense) * &r).sum(&[0, 1], false);
    let dg = grad(&d.finish(&[("loss", &loss)]).unwrap(), "loss", &["a"]).unwrap();

    let inputs = [
        ("a", HostTensor::from_f32(&[m, k], &av).unwrap()),
        ("w", w),
        ("r", HostTensor::from_f32(&[m, n], &rv).unwrap()),
    ];
    let (qo, dout) = (run(&qg, &inputs), run(&dg, &inputs));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&qo["grad/a"]), bits(&dout["grad/a"]));
    assert!(qo["grad/a"].iter().any(|&v| v != 0.0));
}

#[test]
fn mistakes_are_named() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, &[3]);
    let h = b.input("h", DType::F16, &[3]);
    let not_scalar = x.exp();
    assert!(matches!(
        gradients(&not_scalar, &[&x]),
        Err(GradError::LossNotScalar(_))
    ));
    assert!(matches!(
        gradients(&x.sum(&[0], false), &[&h]),
        Err(GradError::NotF32 { .. })
    ));
    let through_half = x.cast(DType::F16).exp().cast(DType::F32).sum(&[0], false);
    let err = gradients(&through_half, &[&x]).unwrap_err();
    assert!(matches!(err, GradError::NotDifferentiable { .. }), "{err}");
    assert!(err.to_string().contains("cast to f32"), "{err}");
    let other = GraphBuilder::new().input("y", DType::F32, &[3]);
    assert!(matches!(
        gradients(&x.sum(&[0], false), &[&other]),
        Err(GradError::ForeignTensor)
    ));
    let graph = b.finish(&[("s", &x.sum(&[0], false))]).unwrap();
    let e = grad(&graph, "loss", &["x"]).unwrap_err();
    assert!(e.to_string().contains("no output named \"loss\""), "{e}");
    let e = grad(&graph, "s", &["nope"]).unwrap_err();
    assert!(e.to_string().contains("inputs: x, h"), "{e}");
    // A variable the loss ignores gets zeros.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, &[2]);
    let y = b.input("y", DType::F32, &[2]);
    let loss = x.sum(&[0], false);
    let gs = gradients(&loss, &[&x, &y]).unwrap();
    let graph = b.finish(&[("gx", &gs[0]), ("gy", &gs[1])]).unwrap();
    let out = run(
        &graph,
        &[
            ("x", HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap()),
            ("y", HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap()),
        ],
    );
    assert_eq!(out["gx"], vec![1.0, 1.0]);
    assert_eq!(out["gy"], vec![0.0, 0.0]);
    // Nor can a variable made after the loss.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, &[2]);
    let loss = x.sum(&[0], false);
    let later = b.input("later", DType::F32, &[3]);
    let gs = gradients(&loss, &[&later, &x]).unwrap();
    assert_eq!(gs[0].shape(), &[3]);
}
