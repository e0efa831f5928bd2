//! The f64 evaluator of the gradient checks (`support/f64_eval.rs`) against the f32 reference
//! interpreter (`tenet_reference::run`), one op at a time on random shapes and values.
//!
//! Each graph holds one op of interest over fresh inputs, so the reference's result is that op
//! of exactly the evaluator's inputs and the two may differ only by the reference's rounding.
//! That difference is held to docs/OPS.md's accuracy table (a bound per element, from the
//! exact value the evaluator gives); ops that only move, select or compare bits, integer
//! results and bools must agree exactly, the sign of zero included. Half-precision results
//! add their storage rounding. The random values include NaN, infinities, signed zeros and
//! denormals wherever the bound still means something.

mod support;

use std::collections::{BTreeSet, HashMap};

use half::{bf16, f16};
use support::f64_eval::{erf, eval_f64};
use tenet_ir::testing::Rng;
use tenet_ir::{
    BinaryOp, DType, Graph, GraphBuilder, HostTensor, NoWeights, PoolKind, Tensor, UnaryOp,
    Window2d,
};

/// Cases per op (or per op and dtype) and family: `TENET_F64_EVAL_CASES`, or 40.
fn cases() -> u64 {
    std::env::var("TENET_F64_EVAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

/// u = 2⁻²⁴, the unit roundoff of f32.
const U: f64 = 1.0 / 16_777_216.0;

/// γ(k) = k·u / (1 − k·u).
fn gamma(k: f64) -> f64 {
    k * U / (1.0 - k * U)
}

/// One unit in the last place of `x` as an f32 (denormal spacing below the normal range).
fn ulp32(x: f64) -> f64 {
    let a = (x as f32).abs();
    if !a.is_finite() {
        return f64::INFINITY;
    }
    if a < f32::MIN_POSITIVE {
        return 2f64.powi(-149);
    }
    let exp = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    2f64.powi(exp - 23)
}

/// Round `x` to `dtype`'s storage (floats; integers are already exact).
fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => f64::from(x as f32),
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

// ---------------------------------------------------------------------------------------------
// Values.

/// How wild the random values of a case are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Vals {
    /// Floats `k/100` in [-10, 10]; integers in [-20, 20] (u8: any).
    Ordinary,
    /// Ordinary, with a tenth ±0, ±inf, NaN and denormals.
    Mild,
    /// Mild, with huge floats, NaN payloads and integers near their bounds too.
    Wild,
    /// Only ±0, ±1, ±inf and NaN (integers −1, 0, 1): ties and signed zeros meet often.
    Few,
}

/// The values for ops that must agree exactly: mostly wild, now and then few.
fn exact_vals(rng: &mut Rng) -> Vals {
    if rng.chance(30) {
        Vals::Few
    } else {
        Vals::Wild
    }
}

fn ordinary_f32(rng: &mut Rng) -> f32 {
    (rng.below(2001) as f32 - 1000.0) / 100.0
}

fn random_value(rng: &mut Rng, dtype: DType, vals: Vals) -> f64 {
    match dtype {
        DType::Bool => rng.below(2) as f64,
        DType::I32 | DType::I64 | DType::U8 if vals == Vals::Few => {
            let v = rng.below(3) as f64 - 1.0;
            if dtype == DType::U8 { v.abs() } else { v }
        }
        DType::U8 => rng.below(256) as f64,
        DType::I32 | DType::I64 => {
            if vals == Vals::Wild && rng.chance(20) {
                let big: &[i64] = if dtype == DType::I32 {
                    &[i32::MIN as i64, i32::MAX as i64, -65_537, 1 << 20, 99_999]
                } else {
                    &[-(1 << 40) - 3, (1 << 40) + 7, i32::MIN as i64 - 1, 1 << 33]
                };
                *rng.pick(big) as f64
            } else {
                rng.below(41) as f64 - 20.0
            }
        }
        _ if vals == Vals::Few => {
            let v = *rng.pick(&[
                0.0,
                -0.0,
                1.0,
                -1.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
            ]);
            round_to(dtype, v)
        }
        _ => {
            let special = match vals {
                Vals::Ordinary | Vals::Few => None,
                _ if !rng.chance(10) => None,
                Vals::Mild => Some(*rng.pick(&[
                    0u32,
                    0x8000_0000,
                    0x7f80_0000,
                    0xff80_0000,
                    0x7fc0_0000,
                    1,
                    0x8000_0400,
                ])),
                Vals::Wild => {
                    let random = rng.next_u64() as u32;
                    Some(*rng.pick(&[
                        0u32,
                        0x8000_0000,
                        0x7f80_0000,
                        0xff80_0000,
                        0x7fc0_0000,
                        0xffc0_1234,
                        1,
                        0x8000_0400,
                        0x7f00_0000,
                        random,
                    ]))
                }
            };
            let v = special.map_or_else(|| ordinary_f32(rng), f32::from_bits);
            round_to(dtype, f64::from(v))
        }
    }
}

/// The tensor of `dtype[shape]` holding `values` (exactly representable in `dtype`).
fn host(dtype: DType, shape: &[u64], values: &[f64]) -> HostTensor {
    let mut data = Vec::new();
    for &v in values {
        match dtype {
            DType::F32 => data.extend((v as f32).to_le_bytes()),
            DType::F16 => data.extend(f16::from_f64(v).to_le_bytes()),
            DType::BF16 => data.extend(bf16::from_f64(v).to_le_bytes()),
            DType::I32 => data.extend((v as i32).to_le_bytes()),
            DType::I64 => data.extend((v as i64).to_le_bytes()),
            DType::U8 => data.push(v as u8),
            DType::Bool => data.push(u8::from(v != 0.0)),
        }
    }
    HostTensor::new(tenet_ir::TensorType::new(dtype, shape), data).expect("sized to the shape")
}

fn host_values(t: &HostTensor) -> Vec<f64> {
    if t.dtype().is_float() {
        t.to_f32_vec().into_iter().map(f64::from).collect()
    } else {
        t.to_i64_vec().into_iter().map(|v| v as f64).collect()
    }
}

/// Inputs of one case: the f64 values, and the same values as tensors for the reference.
struct Inputs {
    f64s: HashMap<String, Vec<f64>>,
    tensors: HashMap<String, HostTensor>,
}

impl Inputs {
    /// Random values for every input of `graph`.
    fn random(graph: &Graph, rng: &mut Rng, vals: Vals) -> Inputs {
        let mut ins = Inputs {
            f64s: HashMap::new(),
            tensors: HashMap::new(),
        };
        for (_, name, ty) in graph.inputs() {
            let n = ty.numel().unwrap() as usize;
            let v: Vec<f64> = (0..n).map(|_| random_value(rng, ty.dtype, vals)).collect();
            ins.set(graph, name, v);
        }
        ins
    }

    fn set(&mut self, graph: &Graph, name: &str, values: Vec<f64>) {
        let (_, _, ty) = graph.inputs().find(|(_, n, _)| *n == name).unwrap();
        let t = host(ty.dtype, &ty.shape, &values);
        assert_eq!(
            host_values(&t)
                .iter()
                .zip(&values)
                .filter(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
                .count(),
            0,
            "input {name} is not exactly representable as {}",
            ty.dtype
        );
        self.f64s.insert(name.to_string(), values);
        self.tensors.insert(name.to_string(), t);
    }

    /// The same inputs with every value replaced by its magnitude.
    fn abs(&self) -> HashMap<String, Vec<f64>> {
        self.f64s
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().map(|x| x.abs()).collect()))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison.

/// How far the reference may be from the exact value.
enum Bound {
    /// Bit for bit (NaN matches any NaN), the sign of zero included.
    Exact,
    /// |reference − exact| ≤ bound, per element, for an f32 computation (the storage rounding
    /// of half results is added on top).
    Each(Vec<f64>),
}

impl Bound {
    /// `k` units of roundoff relative to the exact value.
    fn rel(k: f64, exact: &[f64]) -> Bound {
        Bound::Each(exact.iter().map(|e| k * U * e.abs()).collect())
    }

    /// `k` f32 ulps of the result, plus `c`·u·|x_i| where `x` is `Some((x, c))`.
    fn ulps(k: f64, exact: &[f64], want: &[f64], x: Option<(&[f64], f64)>) -> Bound {
        Bound::Each(
            (0..exact.len())
                .map(|i| {
                    let u = ulp32(exact[i]).max(ulp32(want[i]));
                    k * u + x.map_or(0.0, |(x, c)| c * U * x[i].abs())
                })
                .collect(),
        )
    }
}

/// Whether the evaluator's `got` and the reference's `want` (both of output dtype `dtype`)
/// agree under `bound`: the largest |difference| / tolerance of an f32 result if so (half
/// results come within a hair of their storage rounding, which says nothing), the first
/// disagreement otherwise.
fn agree(dtype: DType, got: &[f64], want: &[f64], bound: &Bound) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} values, the reference has {}",
            got.len(),
            want.len()
        ));
    }
    let (storage, floor) = match dtype {
        DType::F16 => (2f64.powi(-11), 2f64.powi(-23)),
        DType::BF16 => (2f64.powi(-8), 2f64.powi(-131)),
        _ => (0.0, 2f64.powi(-147)),
    };
    let mut worst = 0.0f64;
    for i in 0..got.len() {
        let (g, w) = (got[i], want[i]);
        let ok = match bound {
            Bound::Exact => g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            Bound::Each(b) => {
                if g.is_nan() || w.is_nan() {
                    g.is_nan() && w.is_nan()
                } else if w.is_infinite() || round_to(dtype, g).is_infinite() {
                    round_to(dtype, g) == w
                } else {
                    let tol = b[i] + storage * g.abs() + 1e-14 * g.abs() + floor;
                    if storage == 0.0 {
                        worst = worst.max((g - w).abs() / tol);
                    }
                    (g - w).abs() <= tol
                }
            }
        };
        if !ok {
            let tol = match bound {
                Bound::Exact => "exact".to_string(),
                Bound::Each(b) => format!("bound {:e}", b[i]),
            };
            return Err(format!(
                "element {i}: f64 evaluator {g:e} ({:#x}), reference {w:e} ({:#x}), |diff| {:e}, {tol}",
                g.to_bits(),
                w.to_bits(),
                (g - w).abs()
            ));
        }
    }
    Ok(worst)
}

/// Runs cases, remembers which ops they covered.
struct Harness {
    family: &'static str,
    covered: BTreeSet<&'static str>,
    cases: usize,
    /// The largest |difference| / tolerance seen (how tight the bounds are in practice).
    worst: std::cell::Cell<f64>,
}

impl Harness {
    fn new(family: &'static str) -> Harness {
        Harness {
            family,
            covered: BTreeSet::new(),
            cases: 0,
            worst: std::cell::Cell::new(0.0),
        }
    }

    /// Both evaluations of `graph` on `ins`: (evaluator, reference), by output name.
    fn run(&mut self, graph: &Graph, ins: &Inputs) -> (Eval, Eval) {
        self.covered.extend(tenet_ir::testing::op_names(graph));
        self.cases += 1;
        let want = tenet_reference::run(graph, &ins.tensors, &NoWeights, 0)
            .unwrap_or_else(|e| panic!("reference failed: {e}\n{}", tenet_ir::text::print(graph)));
        let mut got = eval_f64(graph, &ins.f64s);
        let got = graph
            .outputs()
            .iter()
            .map(|o| {
                let dtype = graph.node(o.node).ty.dtype;
                (o.name.clone(), (dtype, got.remove(&o.name).unwrap()))
            })
            .collect();
        let want = want
            .iter()
            .map(|(n, t)| (n.clone(), (t.dtype(), host_values(t))))
            .collect();
        (Eval(got), Eval(want))
    }

    /// Check output `name` of a case under `bound`, panicking with the whole case on failure.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        seed: u64,
        graph: &Graph,
        ins: &Inputs,
        got: &Eval,
        want: &Eval,
        name: &str,
        bound: &Bound,
    ) {
        let ((dtype, g), (want_dtype, w)) = (&got.0[name], &want.0[name]);
        assert_eq!(
            dtype, want_dtype,
            "{} seed {seed}: output {name:?}",
            self.family
        );
        match agree(*dtype, g, w, bound) {
            Ok(r) => self.worst.set(self.worst.get().max(r)),
            Err(e) => {
                let mut inputs: Vec<_> = ins.f64s.iter().collect();
                inputs.sort_by(|a, b| a.0.cmp(b.0));
                panic!(
                    "{} seed {seed}: output {name:?}: {e}\n{}inputs: {inputs:?}\nf64: {g:?}\nf32: {w:?}",
                    self.family,
                    tenet_ir::text::print(graph)
                );
            }
        }
    }

    fn assert_covers(&self, ops: &[&str]) {
        for op in ops {
            assert!(
                self.covered.contains(op),
                "{}: no case covered {op} (covered: {:?})",
                self.family,
                self.covered
            );
        }
        eprintln!(
            "{}: {} cases, largest |f64 - f32| / bound of an f32 result {:.3}",
            self.family,
            self.cases,
            self.worst.get()
        );
    }
}

/// One evaluation's outputs: name → (dtype, values).
struct Eval(HashMap<String, (DType, Vec<f64>)>);

impl Eval {
    fn y(&self) -> &[f64] {
        &self.0["y"].1
    }
}

// ---------------------------------------------------------------------------------------------
// Shapes.

fn random_shape(rng: &mut Rng, min_rank: u64, max_rank: u64, zero: bool) -> Vec<u64> {
    let rank = min_rank + rng.below(max_rank - min_rank + 1);
    (0..rank)
        .map(|_| {
            if zero && rng.chance(5) {
                0
            } else {
                1 + rng.below(4)
            }
        })
        .collect()
}

/// A shape that broadcasts to `out`: a suffix of it, some dims set to 1.
fn broadcast_operand(rng: &mut Rng, out: &[u64]) -> Vec<u64> {
    let keep = out.len() - rng.below(out.len() as u64 + 1) as usize;
    out[out.len() - keep..]
        .iter()
        .map(|&d| if rng.chance(25) { 1 } else { d })
        .collect()
}

fn float_dtype(rng: &mut Rng) -> DType {
    *rng.pick(&[DType::F32, DType::F32, DType::F32, DType::F16, DType::BF16])
}

fn unary(x: &Tensor, op: UnaryOp) -> Tensor {
    use UnaryOp::*;
    match op {
        Neg => x.neg(),
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.log(),
        Sqrt => x.sqrt(),
        Rsqrt => x.rsqrt(),
        Reciprocal => x.reciprocal(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => x.sigmoid(),
        Relu => x.relu(),
        GeluErf => x.gelu(),
        GeluTanh => x.gelu_tanh(),
        Erf => x.erf(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round(),
        Sign => x.sign(),
        Not => x.not(),
    }
}

fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Tensor {
    use BinaryOp::*;
    match op {
        Add => a.add(b),
        Sub => a.sub(b),
        Mul => a.mul(b),
        Div => a.div(b),
        Pow => a.pow(b),
        Max => a.maximum(b),
        Min => a.minimum(b),
        Eq => a.eq(b),
        Ne => a.ne(b),
        Lt => a.lt(b),
        Le => a.le(b),
        Gt => a.gt(b),
        Ge => a.ge(b),
        And => a.and(b),
        Or => a.or(b),
    }
}

// ---------------------------------------------------------------------------------------------
// Families.

#[test]
fn unary_ops_agree() {
    use UnaryOp::*;
    let mut h = Harness::new("unary");
    for &op in UnaryOp::ALL {
        for seed in 0..cases() {
            let mut rng = Rng(seed * 1000 + op as u64);
            let int_op = matches!(op, Neg | Abs | Sign | Relu) && rng.chance(30);
            let dtype = if op == Not {
                DType::Bool
            } else if int_op {
                *rng.pick(&[DType::I32, DType::I64])
            } else {
                float_dtype(&mut rng)
            };
            let g = GraphBuilder::new();
            let x = g.input("x", dtype, &random_shape(&mut rng, 0, 3, true));
            let y = unary(&x, op);
            let graph = g.finish(&[("y", &y)]).unwrap();
            let exact = matches!(op, Neg | Abs | Relu | Floor | Ceil | Round | Sign | Not);
            let vals = if exact {
                exact_vals(&mut rng)
            } else {
                Vals::Mild
            };
            let mut ins = Inputs::random(&graph, &mut rng, vals);
            if matches!(op, Floor | Ceil | Round) && rng.chance(50) {
                // Halves and quarters: the ties `round` breaks to even.
                let n = ins.f64s["x"].len();
                let v = (0..n)
                    .map(|_| (rng.below(41) as f64 - 20.0) / 4.0)
                    .collect();
                ins.set(&graph, "x", v);
            }
            let (got, want) = h.run(&graph, &ins);
            let (e, w, x) = (got.y(), want.y(), &ins.f64s["x"][..]);
            let bound = match op {
                _ if exact => Bound::Exact,
                Sqrt | Reciprocal => Bound::rel(1.0, e),
                Rsqrt => Bound::rel(2.01, e),
                Exp => Bound::ulps(0.90, e, w, None),
                Log => Bound::ulps(0.78, e, w, None),
                Sin | Cos => Bound::ulps(1.40, e, w, None),
                Tanh => Bound::ulps(1.48, e, w, None),
                Erf => Bound::ulps(1.00, e, w, None),
                Sigmoid => Bound::ulps(4.0, e, w, Some((x, 4.0))),
                GeluErf => Bound::ulps(5.0, e, w, Some((x, 4.0))),
                GeluTanh => Bound::ulps(6.0, e, w, Some((x, 4.0))),
                _ => unreachable!(),
            };
            h.check(seed, &graph, &ins, &got, &want, "y", &bound);
        }
    }
    let names: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
    h.assert_covers(&names);
}

#[test]
fn binary_ops_agree() {
    use BinaryOp::*;
    let mut h = Harness::new("binary");
    for &op in BinaryOp::ALL {
        for seed in 0..cases() {
            let mut rng = Rng(seed * 1000 + 100 + op as u64);
            let dtype = if op.is_logical() {
                DType::Bool
            } else if op == Pow {
                float_dtype(&mut rng)
            } else if rng.chance(40) {
                let mut ints = vec![DType::I32, DType::I64, DType::U8];
                if op.is_comparison() {
                    ints.push(DType::Bool);
                }
                *rng.pick(&ints)
            } else {
                float_dtype(&mut rng)
            };
            let out = random_shape(&mut rng, 0, 4, true);
            let (sa, sb) = (
                broadcast_operand(&mut rng, &out),
                broadcast_operand(&mut rng, &out),
            );
            let g = GraphBuilder::new();
            let a = g.input("a", dtype, &sa);
            let b = g.input("b", dtype, &sb);
            let y = binary(&a, &b, op);
            let graph = g.finish(&[("y", &y)]).unwrap();
            let exact = !dtype.is_float() || matches!(op, Max | Min) || op.is_comparison();
            let vals = if exact {
                exact_vals(&mut rng)
            } else {
                Vals::Mild
            };
            let ins = Inputs::random(&graph, &mut rng, vals);
            let (got, want) = h.run(&graph, &ins);
            let bound = match op {
                _ if exact => Bound::Exact,
                Pow => Bound::ulps(0.51, got.y(), want.y(), None),
                _ => Bound::rel(1.0, got.y()),
            };
            h.check(seed, &graph, &ins, &got, &want, "y", &bound);
        }
    }
    let names: Vec<&str> = BinaryOp::ALL.iter().map(|o| o.name()).collect();
    h.assert_covers(&names);
}

#[test]
fn constants_where_and_casts_agree() {
    let mut h = Harness::new("const/where/cast");
    for seed in 0..cases() * 4 {
        let mut rng = Rng(seed + 20_000);
        let from = *rng.pick(&DType::ALL);
        let to = *rng.pick(&DType::ALL);
        let shape = random_shape(&mut rng, 0, 3, true);
        let g = GraphBuilder::new();
        // A constant of `from`, its bytes random values of that dtype.
        let n = tenet_ir::numel(&shape).unwrap() as usize;
        let cv: Vec<f64> = (0..n)
            .map(|_| random_value(&mut rng, from, Vals::Wild))
            .collect();
        let c = g.constant(from, &shape, host(from, &shape, &cv).bytes().to_vec());
        let x = g.input("x", from, &shape);
        let cond = g.input("cond", DType::Bool, &broadcast_operand(&mut rng, &shape));
        let other = g.input("b", from, &broadcast_operand(&mut rng, &shape));
        let picked = cond.where_(&x, &other);
        let graph = g
            .finish(&[("c", &c), ("w", &picked), ("cast", &x.cast(to))])
            .unwrap();
        let vals = exact_vals(&mut rng);
        let ins = Inputs::random(&graph, &mut rng, vals);
        let (got, want) = h.run(&graph, &ins);
        for name in ["c", "w"] {
            h.check(seed, &graph, &ins, &got, &want, name, &Bound::Exact);
        }
        // A cast to a float rounds (int → f32, f32 → f16/bf16); any other cast is exact.
        let bound = if to.is_float() && to != from {
            Bound::rel(1.0, &got.0["cast"].1)
        } else {
            Bound::Exact
        };
        h.check(seed, &graph, &ins, &got, &want, "cast", &bound);
    }
    h.assert_covers(&["const", "where", "cast"]);
}

#[test]
fn reductions_agree() {
    use tenet_ir::ReduceOp::*;
    let mut h = Harness::new("reduce");
    for &op in tenet_ir::ReduceOp::ALL {
        for seed in 0..cases() {
            let mut rng = Rng(seed * 1000 + 300 + op as u64);
            let dtype = if op == Mean || rng.chance(70) {
                float_dtype(&mut rng)
            } else {
                *rng.pick(&[DType::I32, DType::I64, DType::U8])
            };
            let zero = matches!(op, Sum | Mean);
            let mut shape = random_shape(&mut rng, 1, 4, zero);
            if rng.chance(20) {
                // A longer row, past the 16 lanes of the summation order.
                let d = rng.below(shape.len() as u64) as usize;
                shape[d] = 20 + rng.below(30);
            }
            let rank = shape.len() as i64;
            let mut axes: Vec<i64> = (0..rank).filter(|_| rng.chance(50)).collect();
            if axes.is_empty() {
                axes.push(rng.below(rank as u64) as i64);
            }
            let keepdim = rng.chance(50);
            let g = GraphBuilder::new();
            let x = g.input("x", dtype, &shape);
            let y = match op {
                Sum => x.sum(&axes, keepdim),
                Mean => x.mean(&axes, keepdim),
                Max => x.max(&axes, keepdim),
                Min => x.min(&axes, keepdim),
                ArgMax => x.argmax(&axes, keepdim),
                ArgMin => x.argmin(&axes, keepdim),
            };
            let graph = g.finish(&[("y", &y)]).unwrap();
            let exact = !dtype.is_float() || !matches!(op, Sum | Mean);
            let vals = if exact {
                exact_vals(&mut rng)
            } else {
                Vals::Mild
            };
            let ins = Inputs::random(&graph, &mut rng, vals);
            let (got, want) = h.run(&graph, &ins);
            let n: u64 = axes.iter().map(|&a| shape[a as usize]).product();
            let lanes = n.div_ceil(16) as f64;
            let bound = if exact {
                Bound::Exact
            } else {
                // Σ|x| (sum) or Σ|x|/n (mean): the same graph on the magnitudes.
                let mag = &eval_f64(&graph, &ins.abs())["y"];
                let e = got.y();
                Bound::Each(
                    (0..e.len())
                        .map(|i| {
                            let b = gamma(lanes + 4.0) * mag[i];
                            if op == Mean {
                                b + 2.0 * U * e[i].abs()
                            } else {
                                b
                            }
                        })
                        .collect(),
                )
            };
            h.check(seed, &graph, &ins, &got, &want, "y", &bound);
        }
    }
    let names: Vec<&str> = tenet_ir::ReduceOp::ALL.iter().map(|o| o.name()).collect();
    h.assert_covers(&names);
}

#[test]
fn matmul_agrees() {
    let mut h = Harness::new("matmul");
    for seed in 0..cases() * 3 {
        let mut rng = Rng(seed + 40_000);
        let dtype = *rng.pick(&[DType::F32, DType::F32, DType::F16, DType::I32, DType::I64]);
        let batch = random_shape(&mut rng, 0, 2, false);
        let dim = |rng: &mut Rng| {
            if rng.chance(5) { 0 } else { 1 + rng.below(5) }
        };
        let (m, k, n) = (dim(&mut rng), dim(&mut rng), dim(&mut rng));
        let k = if rng.chance(15) { 40 + k } else { k };
        let mut sa = broadcast_operand(&mut rng, &batch);
        let mut sb = broadcast_operand(&mut rng, &batch);
        sa.extend([m, k]);
        sb.extend([k, n]);
        let g = GraphBuilder::new();
        let y = g.input("a", dtype, &sa).matmul(&g.input("b", dtype, &sb));
        let graph = g.finish(&[("y", &y)]).unwrap();
        let exact = !dtype.is_float();
        let vals = if exact {
            exact_vals(&mut rng)
        } else {
            Vals::Ordinary
        };
        let ins = Inputs::random(&graph, &mut rng, vals);
        let (got, want) = h.run(&graph, &ins);
        let bound = if exact {
            Bound::Exact
        } else {
            let mag = &eval_f64(&graph, &ins.abs())["y"];
            Bound::Each(mag.iter().map(|m| gamma(k as f64) * m).collect())
        };
        h.check(seed, &graph, &ins, &got, &want, "y", &bound);
    }
    h.assert_covers(&["matmul"]);
}

#[test]
fn movement_ops_agree() {
    let mut h = Harness::new("movement");
    for seed in 0..cases() * 6 {
        let mut rng = Rng(seed + 60_000);
        let dtype = *rng.pick(&DType::ALL);
        let shape = random_shape(&mut rng, 1, 4, true);
        let rank = shape.len();
        let g = GraphBuilder::new();
        let x = g.input("x", dtype, &shape);
        let mut outs: Vec<(&str, Tensor)> = Vec::new();
        // reshape: reversed dims, maybe a trailing 1.
        let mut rs: Vec<i64> = shape.iter().rev().map(|&d| d as i64).collect();
        if rng.chance(50) {
            rs.push(1);
        }
        outs.push(("reshape", x.reshape(&rs)));
        // permute: a random permutation.
        let mut perm: Vec<u32> = (0..rank as u32).collect();
        for i in (1..rank).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        outs.push(("permute", x.permute(&perm)));
        // expand: 1s grown, maybe a new leading axis.
        let mut es: Vec<u64> = shape
            .iter()
            .map(|&d| if d == 1 { 1 + rng.below(3) } else { d })
            .collect();
        if rng.chance(50) {
            es.insert(0, 2);
        }
        outs.push(("expand", x.expand(&es)));
        // slice: every axis sliced in turn.
        let mut s = x.clone();
        for (a, &d) in shape.iter().enumerate() {
            let start = rng.below(d + 1);
            let end = start + rng.below(d - start + 1);
            s = s.slice(a as i64, start, end, 1 + rng.below(3));
        }
        outs.push(("slice", s));
        // pad with a value of the dtype.
        let pads: Vec<(u64, u64)> = (0..rank).map(|_| (rng.below(3), rng.below(3))).collect();
        let value = match dtype {
            DType::Bool => rng.below(2) as f64,
            DType::U8 => rng.below(256) as f64,
            DType::I32 | DType::I64 => rng.below(200) as f64 - 100.0,
            _ => *rng.pick(&[-0.0, 1.5, -2.25, f64::INFINITY, f64::NAN]),
        };
        outs.push(("pad", x.pad(&pads, value)));
        // concat of x with 1 to 3 tensors along a random axis.
        let axis = rng.below(rank as u64) as usize;
        let mut parts = vec![x.clone()];
        for i in 0..1 + rng.below(3) {
            let mut ps = shape.clone();
            ps[axis] = rng.below(4);
            parts.push(g.input(&format!("c{i}"), dtype, &ps));
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        outs.push(("concat", g.concat(&refs, axis as i64)));
        // gather along a random axis, negative indices included.
        let ga = rng.below(rank as u64) as usize;
        let idx_shape = if shape[ga] == 0 {
            vec![0] // only no index can be taken from an empty axis
        } else {
            random_shape(&mut rng, 0, 2, true)
        };
        let idx_dtype = *rng.pick(&[DType::I32, DType::I64]);
        let idx = g.input("idx", idx_dtype, &idx_shape);
        outs.push(("gather", x.gather(&idx, ga as i64)));
        let named: Vec<(&str, &Tensor)> = outs.iter().map(|(n, t)| (*n, t)).collect();
        let graph = g.finish(&named).unwrap();
        let vals = exact_vals(&mut rng);
        let mut ins = Inputs::random(&graph, &mut rng, vals);
        let size = shape[ga] as i64;
        let ni = tenet_ir::numel(&idx_shape).unwrap();
        let iv: Vec<f64> = (0..ni)
            .map(|_| (rng.below(2 * size as u64) as i64 - size) as f64)
            .collect();
        ins.set(&graph, "idx", iv);
        let (got, want) = h.run(&graph, &ins);
        for (name, _) in &outs {
            h.check(seed, &graph, &ins, &got, &want, name, &Bound::Exact);
        }
    }
    h.assert_covers(&[
        "reshape", "permute", "expand", "slice", "pad", "concat", "gather",
    ]);
}

#[test]
fn iota_and_tri_mask_agree() {
    let mut h = Harness::new("iota/tri_mask");
    for seed in 0..cases() * 2 {
        let mut rng = Rng(seed + 80_000);
        let dtype = *rng.pick(&[
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U8,
        ]);
        let mut shape = random_shape(&mut rng, 2, 4, true);
        let axis = rng.below(shape.len() as u64) as u32;
        if rng.chance(20) {
            // Past u8's range (iota wraps) and bf16's exact integers (iota rounds).
            shape[axis as usize] = 300;
        }
        let g = GraphBuilder::new();
        let iota = g.iota(dtype, &shape, axis);
        let mask = g.tri_mask(&shape, rng.chance(50), rng.below(7) as i64 - 3);
        let graph = g.finish(&[("iota", &iota), ("mask", &mask)]).unwrap();
        let ins = Inputs::random(&graph, &mut rng, Vals::Wild);
        let (got, want) = h.run(&graph, &ins);
        // bf16 holds integers exactly only up to 256: past that the reference rounds.
        let bound = if dtype == DType::BF16 {
            Bound::rel(1.0, &got.0["iota"].1)
        } else {
            Bound::Exact
        };
        h.check(seed, &graph, &ins, &got, &want, "iota", &bound);
        h.check(seed, &graph, &ins, &got, &want, "mask", &Bound::Exact);
    }
    h.assert_covers(&["iota", "tri_mask"]);
}

#[test]
fn softmax_agrees() {
    let mut h = Harness::new("softmax");
    for seed in 0..cases() * 4 {
        let mut rng = Rng(seed + 100_000);
        let dtype = float_dtype(&mut rng);
        let mut shape = random_shape(&mut rng, 1, 3, false);
        let axis = rng.below(shape.len() as u64) as usize;
        if rng.chance(20) {
            shape[axis] = 17 + rng.below(30);
        }
        let log = rng.chance(50);
        let g = GraphBuilder::new();
        let x = g.input("x", dtype, &shape);
        let y = if log {
            x.log_softmax(axis as i64)
        } else {
            x.softmax(axis as i64)
        };
        let graph = g.finish(&[("y", &y)]).unwrap();
        let ins = Inputs::random(&graph, &mut rng, Vals::Ordinary);
        let (got, want) = h.run(&graph, &ins);
        let xs = &ins.f64s["x"];
        // |x_j − m| is at most the spread of all the inputs; s lies in [1, n].
        let spread = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            - xs.iter().copied().fold(f64::INFINITY, f64::min);
        let n = shape[axis] as f64;
        let lanes = (shape[axis].div_ceil(16)) as f64;
        let e = got.y();
        let bound = if log {
            let b = 2.0 * U * (spread + n.ln() + 2.0) + (lanes + 8.0) * U;
            Bound::Each(vec![b; e.len()])
        } else {
            Bound::rel(spread + lanes + 9.0, e)
        };
        h.check(seed, &graph, &ins, &got, &want, "y", &bound);
    }
    h.assert_covers(&["softmax", "log_softmax"]);
}

#[test]
fn norms_agree() {
    let mut h = Harness::new("norms");
    for seed in 0..cases() * 4 {
        let mut rng = Rng(seed + 120_000);
        let dtype = float_dtype(&mut rng);
        let mut shape = random_shape(&mut rng, 1, 3, false);
        let last = shape.len() - 1;
        if rng.chance(30) {
            shape[last] = 17 + rng.below(40);
        }
        let n = shape[last];
        let eps = *rng.pick(&[1e-6f32, 1e-5, 1e-3, 0.1]);
        let (with_g, with_b, rms) = (rng.chance(60), rng.chance(60), rng.chance(40));
        let g = GraphBuilder::new();
        let x = g.input("x", dtype, &shape);
        let gamma_t = g.input("gamma", dtype, &[n]);
        let beta_t = g.input("beta", dtype, &[n]);
        let gm = with_g.then_some(&gamma_t);
        let y = if rms {
            x.rms_norm(gm, eps)
        } else {
            x.layer_norm(gm, with_b.then_some(&beta_t), eps)
        };
        // The unused parameters stay inputs; the graph keeps every input.
        let graph = g.finish(&[("y", &y)]).unwrap();
        let ins = Inputs::random(&graph, &mut rng, Vals::Ordinary);
        let (got, want) = h.run(&graph, &ins);
        let (xs, gs) = (&ins.f64s["x"], &ins.f64s["gamma"]);
        let k = (n.div_ceil(16) as f64 + 12.0) * U;
        let e = got.y();
        let bound = Bound::Each(
            (0..e.len())
                .map(|i| {
                    if rms {
                        return k * e[i].abs();
                    }
                    let row = &xs[i / n as usize * n as usize..][..n as usize];
                    let mean = row.iter().sum::<f64>() / n as f64;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
                    let sigma = (var + f64::from(eps)).sqrt();
                    let g = if with_g {
                        gs[i % n as usize].abs()
                    } else {
                        1.0
                    };
                    // OPS.md's bound has |mean| here, but the computed mean is off by up to
                    // the sum's bound / n, relative to mean(|x|), and that error shifts every
                    // d_j: with |mean| the bound fails when the row's mean is small next to its
                    // magnitudes (TENET_F64_EVAL_CASES=3000, seed 11457: n = 46, 1.4× over).
                    let mean_abs = row.iter().map(|v| v.abs()).sum::<f64>() / n as f64;
                    k * (e[i].abs() + (xs[i].abs() + mean_abs) * g / sigma)
                })
                .collect(),
        );
        h.check(seed, &graph, &ins, &got, &want, "y", &bound);
    }
    h.assert_covers(&["layer_norm", "rms_norm"]);
}

#[test]
fn conv2d_agrees() {
    let mut h = Harness::new("conv2d");
    let mut seed = 140_000;
    while h.cases < (cases() * 3) as usize {
        seed += 1;
        let mut rng = Rng(seed);
        let dtype = *rng.pick(&[DType::F32, DType::F32, DType::F16]);
        let groups = 1 + rng.below(2) as u32;
        let (cg, og) = (1 + rng.below(3), 1 + rng.below(3));
        let (c, o) = (cg * groups as u64, og * groups as u64);
        let (kh, kw) = (1 + rng.below(3), 1 + rng.below(3));
        let xs = [1 + rng.below(2), c, 1 + rng.below(6), 1 + rng.below(6)];
        let stride = [1 + rng.below(2) as u32, 1 + rng.below(2) as u32];
        let dilation = [1 + rng.below(2) as u32, 1 + rng.below(2) as u32];
        let padding = [0; 4].map(|_: u32| rng.below(3) as u32);
        let g = GraphBuilder::new();
        let x = g.input("x", dtype, &xs);
        let w = g.input("w", dtype, &[o, cg, kh, kw]);
        let b = g.input("bias", dtype, &[o]);
        let with_bias = rng.chance(50);
        let y = x.conv2d(
            &w,
            with_bias.then_some(&b),
            stride,
            padding,
            dilation,
            groups,
        );
        let Ok(graph) = g.finish(&[("y", &y)]) else {
            continue; // the padded input does not cover one window
        };
        let ins = Inputs::random(&graph, &mut rng, Vals::Ordinary);
        let (got, want) = h.run(&graph, &ins);
        // One fma chain of cg·kh·kw taps, then the bias: γ(taps + 1)·(Σ|x·w| + |b|).
        let mag = &eval_f64(&graph, &ins.abs())["y"];
        let taps = (cg * kh * kw) as f64 + 1.0;
        let bound = Bound::Each(mag.iter().map(|m| gamma(taps) * m).collect());
        h.check(seed, &graph, &ins, &got, &want, "y", &bound);
    }
    h.assert_covers(&["conv2d"]);
}

#[test]
fn pool2d_agrees() {
    let mut h = Harness::new("pool2d");
    let mut seed = 160_000;
    while h.cases < (cases() * 4) as usize {
        seed += 1;
        let mut rng = Rng(seed);
        let kind = *rng.pick(PoolKind::ALL);
        let dtype = if kind == PoolKind::Max && rng.chance(30) {
            *rng.pick(&[DType::I32, DType::I64, DType::U8])
        } else {
            float_dtype(&mut rng)
        };
        let kernel = [1 + rng.below(3) as u32, 1 + rng.below(3) as u32];
        let window = Window2d {
            stride: [1 + rng.below(2) as u32, 1 + rng.below(2) as u32],
            padding: [0; 4].map(|_: u32| rng.below(2) as u32),
            dilation: [1 + rng.below(2) as u32, 1 + rng.below(2) as u32],
        };
        let xs = [
            1 + rng.below(2),
            1 + rng.below(3),
            1 + rng.below(6),
            1 + rng.below(6),
        ];
        let g = GraphBuilder::new();
        let y = g.input("x", dtype, &xs).pool2d(kind, kernel, window);
        let Ok(graph) = g.finish(&[("y", &y)]) else {
            continue; // padding over half the window, or no window fits
        };
        let exact = kind == PoolKind::Max;
        let vals = if exact {
            exact_vals(&mut rng)
        } else {
            Vals::Ordinary
        };
        let ins = Inputs::random(&graph, &mut rng, vals);
        let (got, want) = h.run(&graph, &ins);
        let bound = if exact {
            Bound::Exact
        } else {
            // Sequential adds of at most kh·kw taps, then the division.
            let mag = &eval_f64(&graph, &ins.abs())["y"];
            let taps = f64::from(kernel[0] * kernel[1]);
            Bound::Each(mag.iter().map(|m| gamma(taps + 1.0) * m).collect())
        };
        h.check(seed, &graph, &ins, &got, &want, "y", &bound);
    }
    let names: Vec<&str> = PoolKind::ALL.iter().map(|o| o.name()).collect();
    h.assert_covers(&names);
}

/// The families above cover every op of the op set but those the evaluator refuses.
#[test]
fn families_cover_the_op_set() {
    let mut covered: BTreeSet<&str> = ["input", "const", "where", "cast", "matmul"].into();
    covered.extend(UnaryOp::ALL.iter().map(|o| o.name()));
    covered.extend(BinaryOp::ALL.iter().map(|o| o.name()));
    covered.extend(tenet_ir::ReduceOp::ALL.iter().map(|o| o.name()));
    covered.extend(PoolKind::ALL.iter().map(|o| o.name()));
    covered.extend([
        "reshape",
        "permute",
        "expand",
        "slice",
        "pad",
        "concat",
        "gather",
        "iota",
        "tri_mask",
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "conv2d",
    ]);
    let unsupported: BTreeSet<&str> = [
        "weight",
        "random_uniform",
        "random_normal",
        "dequantize",
        "qmatmul",
        "qmatmul_q8",
    ]
    .into();
    let every = tenet_ir::testing::every_op_name();
    let want: BTreeSet<&str> = every.difference(&unsupported).copied().collect();
    assert_eq!(covered, want);
}

// ---------------------------------------------------------------------------------------------
// The evaluator on its own.

/// erf against 20-digit values (mpmath at 40 digits).
#[test]
#[allow(clippy::excessive_precision)] // the digits as tabulated; each reads as the nearest f64
fn erf_matches_tabulated_values() {
    let table: &[(f64, f64)] = &[
        (1e-8, 1.128_379_167_095_512_56e-8),
        (0.001, 0.001_128_378_790_969_236_403_4),
        (0.1, 0.112_462_916_018_284_898_4),
        (0.25, 0.276_326_390_168_236_933),
        (0.5, 0.520_499_877_813_046_537_7),
        (0.7, 0.677_801_193_837_418_442_3),
        (0.75, 0.711_155_633_653_515_131_6),
        (0.99, 0.838_508_069_555_369_799_8),
        (1.0, 0.842_700_792_949_714_869_3),
        (1.01, 0.846_810_496_228_276_701_5),
        (1.5, 0.966_105_146_475_310_727_1),
        (2.0, 0.995_322_265_018_952_734_2),
        (2.5, 0.999_593_047_982_555_041_1),
        (3.0, 0.999_977_909_503_001_414_6),
        (3.5, 0.999_999_256_901_627_658_6),
        (4.0, 0.999_999_984_582_742_099_7),
        (5.0, 0.999_999_999_998_462_540_2),
        (5.99, 0.999_999_999_999_999_975_7),
    ];
    for &(x, want) in table {
        for (x, want) in [(x, want), (-x, -want)] {
            let got = erf(x);
            assert!(
                (got - want).abs() <= 1e-15 * want.abs(),
                "erf({x}) = {got:e}, want {want:e}"
            );
        }
    }
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erf(f64::NEG_INFINITY), -1.0);
    assert_eq!(erf(-0.0).to_bits(), (-0.0f64).to_bits());
    assert!(erf(f64::NAN).is_nan());
    // Continuous where the method changes (series below 1, continued fraction above).
    let (below, above) = (erf(1.0 - 1e-15), erf(1.0));
    assert!((above - below).abs() < 1e-14);
}

/// The evaluator computes in f64: values no f32 holds, and results no f32 computation gives.
#[test]
fn evaluates_in_f64() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[3]);
    let h = g.input("h", DType::F16, &[3]);
    let s = x.sum(&[0], false);
    let e = (x.exp() - 1.0).mul(&x.reciprocal());
    let c = x.cast(DType::F16);
    let graph = g
        .finish(&[("s", &s), ("e", &e), ("c", &c), ("h2", &(&h * &h))])
        .unwrap();
    let tiny = 2f64.powi(-30);
    let ins: HashMap<String, Vec<f64>> = [
        ("x".to_string(), vec![1.0, tiny, -1.0]),
        ("h".to_string(), vec![1.0 + 1e-9, 3.0e5, 0.1]),
    ]
    .into();
    let out = eval_f64(&graph, &ins);
    assert_eq!(out["s"], vec![tiny]);
    // (e^x − 1)/x at 2^-30 is 1 + 2^-31: f32 gives 0.
    assert!((out["e"][1] - 1.0).abs() < 1e-3, "{:?}", out["e"]);
    // Casts between floats keep the f64 value; half inputs are never rounded.
    assert_eq!(out["c"], vec![1.0, tiny, -1.0]);
    assert_eq!(
        out["h2"],
        vec![(1.0 + 1e-9) * (1.0 + 1e-9), 9.0e10, 0.1 * 0.1]
    );
}

#[test]
fn integers_wrap_to_their_dtype() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::I32, &[4]);
    let b = g.input("b", DType::I32, &[4]);
    let u = g.input("u", DType::U8, &[2]);
    let f = g.input("f", DType::F32, &[5]);
    let graph = g
        .finish(&[
            ("add", &(&a + &b)),
            ("div", &(&a / &b)),
            ("neg", &-&a),
            ("u", &(&u - &(&u + &u))),
            ("fi", &f.cast(DType::I32)),
            ("fu", &f.cast(DType::U8)),
            ("ab", &f.cast(DType::Bool)),
        ])
        .unwrap();
    let min = i32::MIN as f64;
    let ins: HashMap<String, Vec<f64>> = [
        ("a".to_string(), vec![i32::MAX as f64, min, 7.0, -7.0]),
        ("b".to_string(), vec![1.0, -1.0, 0.0, 2.0]),
        ("u".to_string(), vec![3.0, 200.0]),
        ("f".to_string(), vec![-2.7, 3e10, f64::NAN, 300.5, -0.0]),
    ]
    .into();
    let out = eval_f64(&graph, &ins);
    assert_eq!(out["add"], vec![min, i32::MAX as f64, 7.0, -5.0]);
    assert_eq!(out["div"], vec![i32::MAX as f64, min, 0.0, -3.0]);
    assert_eq!(out["neg"], vec![-(i32::MAX as f64), min, -7.0, 7.0]);
    assert_eq!(out["u"], vec![253.0, 56.0]);
    assert_eq!(out["fi"], vec![-2.0, i32::MAX as f64, 0.0, 300.0, 0.0]);
    assert_eq!(out["fu"], vec![0.0, 255.0, 0.0, 255.0, 0.0]);
    assert_eq!(out["ab"], vec![1.0, 1.0, 1.0, 1.0, 0.0]);
}

/// The checks can fail: a wrong value, a wrong zero sign or a wrong NaN is caught.
#[test]
fn the_comparison_catches_mistakes() {
    let exact = vec![1.0, -2.5, 0.0];
    let bound = Bound::rel(4.0, &exact);
    assert!(agree(DType::F32, &exact, &[1.0, -2.5, 0.0], &bound).is_ok());
    // Within 4u of 1.0, and just past it.
    assert!(agree(DType::F32, &exact, &[1.0 + 3.9 * U, -2.5, 0.0], &bound).is_ok());
    assert!(agree(DType::F32, &exact, &[1.0 + 5.0 * U, -2.5, 0.0], &bound).is_err());
    assert!(agree(DType::F32, &exact, &[1.0, -2.5, f64::NAN], &bound).is_err());
    assert!(agree(DType::F32, &exact, &[f64::INFINITY, -2.5, 0.0], &bound).is_err());
    assert!(agree(DType::F32, &exact, &[1.0, -2.5, -0.0], &Bound::Exact).is_err());
    assert!(agree(DType::I64, &[3.0], &[4.0], &Bound::Exact).is_err());
    // f16 results may be a storage rounding away, no further.
    assert!(agree(DType::F16, &[1.0003], &[1.0], &Bound::rel(1.0, &[1.0003])).is_ok());
    assert!(agree(DType::F16, &[1.002], &[1.0], &Bound::rel(1.0, &[1.002])).is_err());
    // A real case with a wrong evaluator: softmax checked against a perturbed result fails.
    let g = GraphBuilder::new();
    let y = g.input("x", DType::F32, &[8]).softmax(0);
    let graph = g.finish(&[("y", &y)]).unwrap();
    let ins = Inputs::random(&graph, &mut Rng(7), Vals::Ordinary);
    let want = tenet_reference::run(&graph, &ins.tensors, &NoWeights, 0).unwrap();
    let want = host_values(&want[0].1);
    let mut got = eval_f64(&graph, &ins.f64s)["y"].clone();
    let bound = Bound::rel(30.0, &got);
    assert!(agree(DType::F32, &got, &want, &bound).is_ok());
    got[3] *= 1.0 + 1e-5;
    assert!(agree(DType::F32, &got, &want, &bound).is_err());
}

#[test]
#[should_panic(expected = "does not support")]
fn unsupported_ops_panic() {
    let g = GraphBuilder::new();
    let y = g.random_uniform(DType::F32, &[2], 1);
    let graph = g.finish(&[("y", &y)]).unwrap();
    eval_f64(&graph, &HashMap::new());
}

#[test]
#[should_panic(expected = "missing input")]
fn missing_inputs_panic() {
    let g = GraphBuilder::new();
    let y = g.input("x", DType::F32, &[2]).exp();
    let graph = g.finish(&[("y", &y)]).unwrap();
    eval_f64(&graph, &HashMap::new());
}
