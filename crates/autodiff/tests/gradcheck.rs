//! Every differentiable op's gradient against central finite differences computed in f64 (an
//! independent f64 evaluator, `support::f64_eval`), on random shapes and values: the gradient
//! graph runs on the f32 reference interpreter, the forward graph is perturbed in f64.
//!
//! Each case builds `loss = sum(op(inputs) * r)` with `r` a random weighting (an input the
//! gradient is not taken for), so that every output element matters with its own weight.

mod support;

use std::collections::HashMap;

use proptest::prelude::*;
use tenet_autodiff::grad;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, NoWeights, Tensor, TensorType, Window2d};

use support::f64_eval::eval_f64;

/// A small deterministic generator (xorshift*), seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
    fn values(&mut self, n: u64, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi) as f32 as f64).collect()
    }
    fn shape(&mut self, rank: usize, max: u64) -> Vec<u64> {
        (0..rank).map(|_| self.range(1, max)).collect()
    }
}

/// A forward graph under test: its inputs' values and which inputs to differentiate.
struct Case {
    b: GraphBuilder,
    values: HashMap<String, Vec<f64>>,
    wrt: Vec<String>,
}

impl Case {
    fn new() -> Case {
        Case {
            b: GraphBuilder::new(),
            values: HashMap::new(),
            wrt: Vec::new(),
        }
    }

    /// An input with the given values; differentiated when `var`.
    fn input(&mut self, name: &str, shape: &[u64], values: Vec<f64>, var: bool) -> Tensor {
        self.values.insert(name.to_string(), values);
        if var {
            self.wrt.push(name.to_string());
        }
        self.b.input(name, DType::F32, shape)
    }

    fn var(&mut self, rng: &mut Rng, name: &str, shape: &[u64], lo: f64, hi: f64) -> Tensor {
        let n = shape.iter().product();
        let v = rng.values(n, lo, hi);
        self.input(name, shape, v, true)
    }

    fn indices(&mut self, name: &str, shape: &[u64], values: Vec<i64>) -> Tensor {
        self.values
            .insert(name.to_string(), values.iter().map(|&v| v as f64).collect());
        self.b.input(name, DType::I64, shape)
    }

    /// `sum(y * r)` as the graph's only output, `loss`.
    fn finish(
        mut self,
        rng: &mut Rng,
        y: &Tensor,
    ) -> (Graph, HashMap<String, Vec<f64>>, Vec<String>) {
        let shape = y.shape().to_vec();
        let r = {
            let n = shape.iter().product();
            let v = rng.values(n, -1.0, 1.0);
            self.input("weighting", &shape, v, false)
        };
        let axes: Vec<i64> = (0..shape.len() as i64).collect();
        let weighted = y * &r;
        let loss = if axes.is_empty() {
            weighted
        } else {
            weighted.sum(&axes, false)
        };
        let graph = self
            .b
            .finish(&[("loss", &loss)])
            .expect("a valid forward graph");
        (graph, self.values, self.wrt)
    }
}

fn host(ty: &TensorType, values: &[f64]) -> HostTensor {
    match ty.dtype {
        DType::F32 => {
            let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            HostTensor::from_f32(&ty.shape, &v).unwrap()
        }
        DType::I64 => {
            let v: Vec<i64> = values.iter().map(|&v| v as i64).collect();
            HostTensor::from_i64(&ty.shape, &v).unwrap()
        }
        other => panic!("no test inputs of {other}"),
    }
}

/// The analytic gradients (f32, reference interpreter) against central differences of the
/// forward graph in f64. `tol` is relative to the largest difference quotient of the tensor.
fn check(graph: &Graph, values: &HashMap<String, Vec<f64>>, wrt: &[String], tol: f64) {
    let names: Vec<&str> = wrt.iter().map(String::as_str).collect();
    let gg = grad(graph, "loss", &names).expect("a gradient graph");
    let inputs: HashMap<String, HostTensor> = graph
        .inputs()
        .map(|(_, name, ty)| (name.to_string(), host(ty, &values[name])))
        .collect();
    let out = tenet_reference::run(&gg, &inputs, &NoWeights, 0).expect("the gradient graph runs");
    let loss_at = |vals: &HashMap<String, Vec<f64>>| eval_f64(graph, vals)["loss"][0];
    for name in wrt {
        let analytic = out
            .iter()
            .find(|(n, _)| *n == format!("grad/{name}"))
            .expect("a gradient output")
            .1
            .to_f32_vec();
        let base = &values[name];
        assert_eq!(
            analytic.len(),
            base.len(),
            "gradient of {name} has the input's size"
        );
        let mut numeric = Vec::with_capacity(base.len());
        for (k, x) in base.iter().enumerate() {
            let h = 1e-6 * x.abs().max(1.0);
            let mut plus = values.clone();
            plus.get_mut(name).unwrap()[k] += h;
            let mut minus = values.clone();
            minus.get_mut(name).unwrap()[k] -= h;
            numeric.push((loss_at(&plus) - loss_at(&minus)) / (2.0 * h));
        }
        let scale = numeric.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (k, (&a, &n)) in analytic.iter().zip(&numeric).enumerate() {
            let err = (a as f64 - n).abs();
            assert!(
                err <= tol * scale + 1e-6,
                "d loss / d {name}[{k}]: analytic {a}, finite differences {n} (scale {scale})\n{}",
                tenet_ir::text::print(graph)
            );
        }
    }
}

fn run_case(seed: u64, tol: f64, build: impl FnOnce(&mut Case, &mut Rng) -> Tensor) {
    let mut rng = Rng(seed | 1);
    let mut case = Case::new();
    let y = build(&mut case, &mut rng);
    let (graph, values, wrt) = case.finish(&mut rng, &y);
    check(&graph, &values, &wrt, tol);
}

const UNARY: &[(&str, f64, f64)] = &[
    ("neg", -2.0, 2.0),
    ("abs", -2.0, 2.0),
    ("exp", -2.0, 2.0),
    ("log", 0.2, 3.0),
    ("sqrt", 0.2, 3.0),
    ("rsqrt", 0.2, 3.0),
    ("reciprocal", 0.3, 3.0),
    ("sin", -3.0, 3.0),
    ("cos", -3.0, 3.0),
    ("tanh", -2.0, 2.0),
    ("sigmoid", -3.0, 3.0),
    ("relu", -2.0, 2.0),
    ("gelu", -3.0, 3.0),
    ("gelu_tanh", -3.0, 3.0),
    ("erf", -2.0, 2.0),
    ("floor", -2.0, 2.0),
];

fn unary(name: &str, x: &Tensor) -> Tensor {
    match name {
        "neg" => -x,
        "abs" => x.abs(),
        "exp" => x.exp(),
        "log" => x.log(),
        "sqrt" => x.sqrt(),
        "rsqrt" => x.rsqrt(),
        "reciprocal" => x.reciprocal(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tanh" => x.tanh(),
        "sigmoid" => x.sigmoid(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "gelu_tanh" => x.gelu_tanh(),
        "erf" => x.erf(),
        "floor" => x.floor(),
        other => panic!("{other}"),
    }
}

/// Two shapes that broadcast together: `b`'s is a suffix of `a`'s with some dims set to 1.
fn broadcast_pair(rng: &mut Rng) -> (Vec<u64>, Vec<u64>) {
    let rank = rng.range(1, 3) as usize;
    let a = rng.shape(rank, 4);
    let keep = rng.range(0, a.len() as u64) as usize;
    let mut b: Vec<u64> = a[a.len() - keep..].to_vec();
    for d in &mut b {
        if rng.below(3) == 0 {
            *d = 1;
        }
    }
    if rng.below(2) == 0 { (a, b) } else { (b, a) }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn elementwise_unary(seed in any::<u64>(), which in 0..UNARY.len()) {
        let (name, lo, hi) = UNARY[which];
        run_case(seed, 1e-3, |c, rng| {
            let rank = rng.range(0, 3) as usize;
            let shape = rng.shape(rank, 4);
            // Stay away from the kinks (relu, abs at 0; floor at integers) where the
            // difference quotient straddles a jump.
            let n = shape.iter().product();
            let mut v = rng.values(n, lo, hi);
            for x in &mut v {
                if matches!(name, "relu" | "abs") && x.abs() < 0.05 {
                    *x = 0.5;
                }
                if name == "floor" && (*x - x.round()).abs() < 0.05 {
                    *x += 0.25;
                }
            }
            let x = c.input("x", &shape, v, true);
            unary(name, &x)
        });
    }

    #[test]
    fn elementwise_binary(seed in any::<u64>(), which in 0..7usize) {
        run_case(seed, 1e-3, |c, rng| {
            let (sa, sb) = broadcast_pair(rng);
            let positive = which == 4;
            let (lo, hi) = if positive { (0.5, 2.0) } else { (-2.0, 2.0) };
            let a = c.var(rng, "a", &sa, lo, hi);
            let b = c.var(rng, "b", &sb, if which == 3 { 0.5 } else { lo }, hi);
            match which {
                0 => &a + &b,
                1 => &a - &b,
                2 => &a * &b,
                3 => &a / &b,
                4 => a.pow(&b),
                5 => a.maximum(&b),
                _ => a.minimum(&b),
            }
        });
    }

    #[test]
    fn where_and_cast(seed in any::<u64>()) {
        run_case(seed, 1e-3, |c, rng| {
            let (sa, sb) = broadcast_pair(rng);
            let a = c.var(rng, "a", &sa, -2.0, 2.0);
            let b = c.var(rng, "b", &sb, -2.0, 2.0);
            let cond = a.gt(&b);
            cond.where_(&(&a * &a), &b).cast(DType::F32)
        });
    }

    #[test]
    fn reductions(seed in any::<u64>(), which in 0..4usize) {
        run_case(seed, 1e-3, |c, rng| {
            let rank = rng.range(1, 3) as usize;
            let shape = rng.shape(rank, 4);
            let x = c.var(rng, "x", &shape, -2.0, 2.0);
            let mut axes: Vec<i64> = (0..rank as i64).filter(|_| rng.below(2) == 0).collect();
            if axes.is_empty() {
                axes.push(rng.below(rank as u64) as i64);
            }
            let keep = rng.below(2) == 0;
            match which {
                0 => x.sum(&axes, keep),
                1 => x.mean(&axes, keep),
                2 => x.max(&axes, keep),
                _ => x.min(&axes, keep),
            }
        });
    }

    #[test]
    fn matmul(seed in any::<u64>()) {
        run_case(seed, 1e-3, |c, rng| {
            let (m, k, n) = (rng.range(1, 4), rng.range(1, 5), rng.range(1, 4));
            let batch = rng.range(1, 3);
            let sa: Vec<u64> = if rng.below(2) == 0 { vec![batch, m, k] } else { vec![m, k] };
            let sb: Vec<u64> = if rng.below(2) == 0 { vec![1, k, n] } else { vec![batch, k, n] };
            let a = c.var(rng, "a", &sa, -1.0, 1.0);
            let b = c.var(rng, "b", &sb, -1.0, 1.0);
            a.matmul(&b)
        });
    }

    #[test]
    fn movement(seed in any::<u64>(), which in 0..6usize) {
        run_case(seed, 1e-3, |c, rng| {
            let shape = rng.shape(3, 5);
            let x = c.var(rng, "x", &shape, -1.0, 1.0);
            match which {
                0 => x.reshape(&[-1]),
                1 => x.permute(&[2, 0, 1]),
                2 => x.reshape(&[shape[0] as i64, 1, -1]).expand(&[shape[0], 3, shape[1] * shape[2]]),
                3 => {
                    let axis = rng.below(3) as usize;
                    let dim = shape[axis];
                    let start = rng.below(dim);
                    let end = rng.range(start, dim);
                    let step = rng.range(1, 3);
                    x.slice(axis as i64, start, end, step) * 1.5
                }
                4 => x.pad(&[(1, 0), (0, 2), (rng.below(2), 1)], 0.25),
                _ => {
                    let y = c.var(rng, "y", &[shape[0], 2, shape[2]], -1.0, 1.0);
                    c.b.concat(&[&x, &y, &x], 1)
                }
            }
        });
    }

    #[test]
    fn gather(seed in any::<u64>()) {
        run_case(seed, 1e-3, |c, rng| {
            let shape = rng.shape(3, 4);
            let axis = rng.below(3) as usize;
            let dim = shape[axis] as i64;
            let count = rng.range(1, 5);
            // Repeats and negative indices on purpose.
            let idx: Vec<i64> = (0..count).map(|_| rng.below(2 * dim as u64) as i64 - dim).collect();
            let x = c.var(rng, "x", &shape, -1.0, 1.0);
            let i = c.indices("i", &[count], idx);
            x.gather(&i, axis as i64)
        });
    }

    #[test]
    fn normalisations(seed in any::<u64>(), which in 0..6usize) {
        run_case(seed, 2e-3, |c, rng| {
            let rank = rng.range(1, 3) as usize;
            let shape = rng.shape(rank, 5);
            let n = *shape.last().unwrap();
            let x = c.var(rng, "x", &shape, -2.0, 2.0);
            let axis = rng.below(shape.len() as u64) as i64;
            match which {
                0 => x.softmax(axis),
                1 => x.log_softmax(axis),
                2 => x.layer_norm(None, None, 1e-5),
                3 => {
                    let g = c.var(rng, "gamma", &[n], 0.5, 1.5);
                    let b = c.var(rng, "beta", &[n], -1.0, 1.0);
                    x.layer_norm(Some(&g), Some(&b), 1e-5)
                }
                4 => x.rms_norm(None, 1e-6),
                _ => {
                    let g = c.var(rng, "gamma", &[n], 0.5, 1.5);
                    x.rms_norm(Some(&g), 1e-6)
                }
            }
        });
    }

    #[test]
    fn conv2d(seed in any::<u64>()) {
        run_case(seed, 2e-3, |c, rng| {
            let groups = rng.range(1, 2);
            let (cg, og) = (rng.range(1, 2), rng.range(1, 2));
            let (kh, kw) = (rng.range(1, 3), rng.range(1, 3));
            let stride = [rng.range(1, 2) as u32, rng.range(1, 3) as u32];
            let dilation = [rng.range(1, 2) as u32, rng.range(1, 2) as u32];
            let padding = [rng.below(3) as u32, rng.below(2) as u32, rng.below(2) as u32, rng.below(3) as u32];
            let span_h = (kh - 1) * dilation[0] as u64 + 1;
            let span_w = (kw - 1) * dilation[1] as u64 + 1;
            let h = rng.range(span_h.max(2), span_h + 4);
            let w = rng.range(span_w.max(2), span_w + 4);
            let n = rng.range(1, 2);
            let x = c.var(rng, "x", &[n, cg * groups, h, w], -1.0, 1.0);
            let k = c.var(rng, "w", &[og * groups, cg, kh, kw], -1.0, 1.0);
            let bias = (rng.below(2) == 0).then(|| c.var(rng, "bias", &[og * groups], -1.0, 1.0));
            x.conv2d(&k, bias.as_ref(), stride, padding, dilation, groups as u32)
        });
    }

    #[test]
    fn pools(seed in any::<u64>(), which in 0..3usize) {
        run_case(seed, 1e-3, |c, rng| {
            let kernel = [rng.range(1, 3) as u32, rng.range(1, 3) as u32];
            let stride = [rng.range(1, 2) as u32, rng.range(1, 3) as u32];
            let padding = [
                rng.below(kernel[0] as u64 / 2 + 1) as u32,
                rng.below(kernel[1] as u64 / 2 + 1) as u32,
                rng.below(kernel[0] as u64 / 2 + 1) as u32,
                rng.below(kernel[1] as u64 / 2 + 1) as u32,
            ];
            let h = rng.range(kernel[0] as u64, kernel[0] as u64 + 4);
            let w = rng.range(kernel[1] as u64, kernel[1] as u64 + 4);
            let x = c.var(rng, "x", &[1, 2, h, w], -1.0, 1.0);
            let kind = [tenet_ir::PoolKind::Max, tenet_ir::PoolKind::Avg, tenet_ir::PoolKind::AvgIncludePad][which];
            x.pool2d(kind, kernel, Window2d { stride, padding, dilation: [1, 1] })
        });
    }
}

/// A chain through several ops (an MLP's layer and a softmax cross-entropy), all variables at
/// once: the rules compose.
#[test]
fn a_small_network() {
    for seed in 1..6u64 {
        run_case(seed * 7919, 2e-3, |c, rng| {
            let x = c.var(rng, "x", &[4, 6], -1.0, 1.0);
            let w1 = c.var(rng, "w1", &[6, 5], -0.5, 0.5);
            let b1 = c.var(rng, "b1", &[5], -0.1, 0.1);
            let w2 = c.var(rng, "w2", &[5, 3], -0.5, 0.5);
            let h = (x.matmul(&w1) + &b1).tanh();
            let logits = h.matmul(&w2).layer_norm(None, None, 1e-5);
            logits.log_softmax(-1)
        });
    }
}
