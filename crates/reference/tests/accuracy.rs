//! f32 results against float64 oracles, within the bounds docs/OPS.md states per op
//! ("Accuracy"). u = 2^-24 is the unit roundoff of f32.

use std::collections::HashMap;

use tenet_ir::testing::Rng;
use tenet_ir::{DType, GraphBuilder, HostTensor, NoWeights, Tensor};

const U: f64 = 1.0 / 16_777_216.0;

fn data(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.below(2_000_001) as f32 - 1e6) / 1e6) * scale)
        .collect()
}

/// Run a one-output graph over f32 inputs.
fn run(inputs: &[(&str, &[u64], &[f32])], f: impl Fn(&[Tensor]) -> Tensor) -> Vec<f32> {
    let g = GraphBuilder::new();
    let ts: Vec<Tensor> = inputs
        .iter()
        .map(|(n, s, _)| g.input(n, DType::F32, s))
        .collect();
    let graph = g.finish(&[("y", &f(&ts))]).unwrap();
    let map: HashMap<String, HostTensor> = inputs
        .iter()
        .map(|(n, s, v)| (n.to_string(), HostTensor::from_f32(s, v).unwrap()))
        .collect();
    tenet_reference::run(&graph, &map, &NoWeights, 0)
        .unwrap()
        .remove(0)
        .1
        .to_f32_vec()
}

/// Name, the op on tensors, the op in f64.
type BinaryCase = (
    &'static str,
    fn(&Tensor, &Tensor) -> Tensor,
    fn(f64, f64) -> f64,
);
/// Name, the op on tensors, the op in f64, allowed ulps.
type UnaryCase = (
    &'static str,
    fn(&Tensor) -> Tensor,
    Box<dyn Fn(f64) -> f64>,
    f64,
);

fn gamma(k: f64) -> f64 {
    k * U / (1.0 - k * U)
}

#[test]
fn elementwise_basic_ops_are_correctly_rounded() {
    let mut rng = Rng(1);
    let (a, b) = (data(&mut rng, 10_000, 100.0), data(&mut rng, 10_000, 3.0));
    let ops: [BinaryCase; 4] = [
        ("add", |x, y| x.add(y), |x, y| x + y),
        ("sub", |x, y| x.sub(y), |x, y| x - y),
        ("mul", |x, y| x.mul(y), |x, y| x * y),
        ("div", |x, y| x.div(y), |x, y| x / y),
    ];
    for (name, op, exact) in ops {
        let y = run(&[("a", &[10_000], &a), ("b", &[10_000], &b)], |t| {
            op(&t[0], &t[1])
        });
        for i in 0..a.len() {
            let e = exact(a[i] as f64, b[i] as f64);
            assert!(
                (y[i] as f64 - e).abs() <= U * e.abs() * 1.000_001,
                "{name}: {} vs {e}",
                y[i]
            );
        }
    }
}

#[test]
fn sums_and_means_within_gamma_bound() {
    let mut rng = Rng(2);
    for n in [1usize, 15, 16, 17, 1000, 100_000] {
        let x = data(&mut rng, n, 50.0);
        let s = run(&[("x", &[n as u64], &x)], |t| t[0].sum(&[0], false))[0] as f64;
        let m = run(&[("x", &[n as u64], &x)], |t| t[0].mean(&[0], false))[0] as f64;
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        let abs: f64 = x.iter().map(|&v| (v as f64).abs()).sum();
        // Each element takes part in at most ceil(n/16) lane additions and 4 tree additions.
        let bound = gamma((n.div_ceil(16) + 4) as f64) * abs;
        assert!(
            (s - exact).abs() <= bound,
            "sum n={n}: err {} > {bound}",
            (s - exact).abs()
        );
        let mb = bound / n as f64 + U * (exact / n as f64).abs() * 2.0;
        assert!((m - exact / n as f64).abs() <= mb, "mean n={n}");
    }
}

#[test]
fn matmul_within_gamma_k_bound() {
    let mut rng = Rng(3);
    let (m, k, n) = (13usize, 777usize, 9usize);
    let (a, b) = (data(&mut rng, m * k, 2.0), data(&mut rng, k * n, 2.0));
    let c = run(
        &[
            ("a", &[m as u64, k as u64], &a),
            ("b", &[k as u64, n as u64], &b),
        ],
        |t| t[0].matmul(&t[1]),
    );
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64);
            let exact: f64 = terms.clone().sum();
            let abs: f64 = terms.map(f64::abs).sum();
            assert!(
                (c[i * n + j] as f64 - exact).abs() <= gamma(k as f64) * abs,
                "c[{i},{j}]"
            );
        }
    }
}

#[test]
fn softmax_and_log_softmax_within_bounds() {
    let mut rng = Rng(4);
    let n = 1000usize;
    let x = data(&mut rng, 4 * n, 8.0);
    let y = run(&[("x", &[4, n as u64], &x)], |t| t[0].softmax(-1));
    let ly = run(&[("x", &[4, n as u64], &x)], |t| t[0].log_softmax(-1));
    for r in 0..4 {
        let row = &x[r * n..(r + 1) * n];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for j in 0..n {
            let exact = (row[j] as f64 - m).exp() / s;
            let d = (row[j] as f64 - m).abs();
            // exp ≤ 2 ulp, its argument rounded once (relative error d·u), the sum's order,
            // and the final division.
            let rel = (d + 2.0 * 2.0 + (n.div_ceil(16) + 4) as f64 + 1.0) * U * 1.01;
            assert!(
                (y[r * n + j] as f64 - exact).abs() <= rel * exact,
                "softmax[{r},{j}]"
            );
            let lexact = (row[j] as f64 - m) - s.ln();
            let lbound = (d + s.ln().abs() + 2.0) * U * 2.0 + (n.div_ceil(16) + 8) as f64 * U;
            assert!(
                (ly[r * n + j] as f64 - lexact).abs() <= lbound,
                "log_softmax[{r},{j}]"
            );
        }
    }
}

#[test]
fn norms_within_bounds() {
    let mut rng = Rng(5);
    let n = 384usize;
    let x = data(&mut rng, 8 * n, 3.0);
    let g = data(&mut rng, n, 1.5);
    let ln = run(&[("x", &[8, n as u64], &x), ("g", &[n as u64], &g)], |t| {
        t[0].layer_norm(Some(&t[1]), None, 1e-5)
    });
    let rms = run(&[("x", &[8, n as u64], &x), ("g", &[n as u64], &g)], |t| {
        t[0].rms_norm(Some(&t[1]), 1e-6)
    });
    for r in 0..8 {
        let row: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let k = (n.div_ceil(16) + 12) as f64;
        for j in 0..n {
            let gj = g[j] as f64;
            let e_ln = (row[j] - mean) / (var + 1e-5).sqrt() * gj;
            let e_rms = row[j] / (ms + 1e-6).sqrt() * gj;
            // Relative to the row's scale: the mean's error, which grows with the row's
            // magnitudes (not with |mean|, which may be near zero), shifts every d_j.
            let mean_abs = row.iter().map(|v| v.abs()).sum::<f64>() / n as f64;
            let scale = (row[j].abs() + mean_abs) / (var + 1e-5).sqrt() * gj.abs();
            assert!(
                (ln[r * n + j] as f64 - e_ln).abs() <= k * U * (e_ln.abs() + scale),
                "layer_norm[{r},{j}]"
            );
            assert!(
                (rms[r * n + j] as f64 - e_rms).abs() <= k * U * e_rms.abs().max(1e-30),
                "rms_norm[{r},{j}]"
            );
        }
    }
}

#[test]
fn activations_within_bounds() {
    let mut rng = Rng(6);
    let x = data(&mut rng, 20_000, 6.0);
    let erf64 = |v: f64| {
        let (mut term, mut sum, mut n) = (v, v, 0.0);
        while term.abs() > 1e-18 * sum.abs().max(1e-300) {
            n += 1.0;
            term *= 2.0 * v * v / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-v * v).exp() * sum
    };
    let cases: [UnaryCase; 3] = [
        (
            "sigmoid",
            |t| t.sigmoid(),
            Box::new(|v: f64| 1.0 / (1.0 + (-v).exp())),
            4.0,
        ),
        (
            "gelu_erf",
            |t| t.gelu(),
            Box::new(move |v: f64| 0.5 * v * (1.0 + erf64(v / 2f64.sqrt()))),
            5.0,
        ),
        (
            "gelu_tanh",
            |t| t.gelu_tanh(),
            Box::new(|v: f64| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            }),
            6.0,
        ),
    ];
    for (name, op, exact, ulps) in cases {
        let y = run(&[("x", &[20_000], &x)], |t| op(&t[0]));
        for (i, &v) in x.iter().enumerate() {
            let e = exact(v as f64);
            // `ulps` of the result, plus the cancellation in 1 + erf/tanh for negative inputs,
            // which is absolute in the bracket: |x|/2 · u · 8.
            let bound = ulps * U * e.abs() + (v as f64).abs() * 4.0 * U;
            assert!(
                (y[i] as f64 - e).abs() <= bound,
                "{name}({v}) = {} vs {e}",
                y[i]
            );
        }
    }
}
