//! Generators for property tests in this and other crates (feature `testing`): random valid
//! graphs covering every op, and random tensors with the values that break kernels (NaN with
//! payloads, infinities, signed zeros, denormals).

use crate::*;

/// splitmix64: tiny, deterministic, good enough to drive generators from a proptest seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn random_shape(rng: &mut Rng, max_rank: u64) -> Vec<u64> {
    let rank = rng.below(max_rank + 1);
    (0..rank)
        .map(|_| if rng.chance(5) { 0 } else { 1 + rng.below(4) })
        .collect()
}

/// Interesting float bits: NaNs with payloads, infinities, signed zeros, denormals.
fn random_f32_bits(rng: &mut Rng) -> u32 {
    let random = rng.next_u64() as u32;
    *rng.pick(&[
        0u32,
        0x8000_0000,
        1,
        0x0000_0400,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_1234,
        0x3f80_0000,
        0xbf00_0000,
        random,
    ])
}

fn constant_data(rng: &mut Rng, ty: &TensorType) -> Vec<u8> {
    let n = ty.numel().unwrap() as usize;
    let mut data = Vec::new();
    for _ in 0..n {
        let bits: u64 = match ty.dtype {
            DType::F32 => random_f32_bits(rng) as u64,
            DType::Bool => rng.below(2),
            _ => rng.next_u64(),
        };
        data.extend_from_slice(&bits.to_le_bytes()[..ty.dtype.size() as usize]);
    }
    data
}

/// Propose one random op over the existing nodes (it may be invalid; the caller checks).
fn propose(rng: &mut Rng, nodes: &[Node]) -> (Op, Option<TensorType>) {
    let n = nodes.len() as u32;
    let pick = |rng: &mut Rng| NodeId(rng.below(n as u64) as u32);
    let x = pick(rng);
    let tx = nodes[x.index()].ty.clone();
    let rank = tx.rank();
    let axis = rng.below(rank.max(1) as u64) as u32;
    let float = *rng.pick(&[DType::F32, DType::F16, DType::BF16]);
    let window = |rng: &mut Rng| Window2d {
        stride: [1 + rng.below(2) as u32, 1 + rng.below(2) as u32],
        padding: [
            rng.below(2) as u32,
            rng.below(2) as u32,
            rng.below(2) as u32,
            rng.below(2) as u32,
        ],
        dilation: [1 + rng.below(2) as u32, 1],
    };
    match rng.below(26) {
        0 => {
            let ty = TensorType::new(*rng.pick(&DType::ALL), random_shape(rng, 2));
            (
                Op::Constant {
                    data: constant_data(rng, &ty),
                },
                Some(ty),
            )
        }
        1 => (
            Op::Unary {
                op: *rng.pick(UnaryOp::ALL),
                x,
            },
            None,
        ),
        2 | 3 => (
            Op::Binary {
                op: *rng.pick(BinaryOp::ALL),
                a: x,
                b: pick(rng),
            },
            None,
        ),
        4 => (
            Op::Where {
                cond: x,
                a: pick(rng),
                b: pick(rng),
            },
            None,
        ),
        5 => (
            Op::Cast { x },
            Some(TensorType::new(*rng.pick(&DType::ALL), tx.shape.clone())),
        ),
        6 => {
            let mut axes: Vec<u32> = (0..rank as u32).filter(|_| rng.chance(50)).collect();
            if axes.is_empty() && rank > 0 {
                axes.push(axis);
            }
            (
                Op::Reduce {
                    op: *rng.pick(ReduceOp::ALL),
                    x,
                    axes,
                    keepdim: rng.chance(50),
                },
                None,
            )
        }
        7 => (Op::MatMul { a: x, b: pick(rng) }, None),
        8 => {
            let mut shape = tx.shape.clone();
            shape.reverse();
            if rng.chance(50) {
                shape.push(1);
            }
            (Op::Reshape { x }, Some(TensorType::new(tx.dtype, shape)))
        }
        9 => {
            let mut perm: Vec<u32> = (0..rank as u32).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.below(i as u64 + 1) as usize);
            }
            (Op::Permute { x, perm }, None)
        }
        10 => {
            let mut shape: Vec<u64> = tx
                .shape
                .iter()
                .map(|&d| if d == 1 { 1 + rng.below(3) } else { d })
                .collect();
            if rng.chance(50) {
                shape.insert(0, 2);
            }
            (Op::Expand { x }, Some(TensorType::new(tx.dtype, shape)))
        }
        11 => {
            let ranges = tx
                .shape
                .iter()
                .map(|&d| {
                    let start = rng.below(d + 1);
                    let end = start + rng.below(d - start + 1);
                    SliceRange {
                        start,
                        end,
                        step: 1 + rng.below(3),
                    }
                })
                .collect();
            (Op::Slice { x, ranges }, None)
        }
        12 => {
            let pads = (0..rank).map(|_| (rng.below(2), rng.below(2))).collect();
            let value = match tx.dtype {
                DType::F32 => random_f32_bits(rng) as u64,
                DType::Bool => rng.below(2),
                d => rng.next_u64() & ((1u128 << (8 * d.size())) - 1) as u64,
            };
            (Op::Pad { x, pads, value }, None)
        }
        13 => {
            let xs = (0..1 + rng.below(3))
                .map(|i| if i == 0 { x } else { pick(rng) })
                .collect();
            (Op::Concat { xs, axis }, None)
        }
        14 => (
            Op::Gather {
                x,
                indices: pick(rng),
                axis,
            },
            None,
        ),
        15 => {
            let ty = TensorType::new(
                *rng.pick(&[DType::I32, DType::I64, DType::F32]),
                random_shape(rng, 3),
            );
            (
                Op::Iota {
                    axis: rng.below(3) as u32,
                },
                Some(ty),
            )
        }
        16 => {
            let ty = TensorType::new(DType::Bool, [2 + rng.below(3), 2 + rng.below(3)]);
            (
                Op::TriMask {
                    upper: rng.chance(50),
                    diagonal: rng.below(5) as i64 - 2,
                },
                Some(ty),
            )
        }
        17 => (
            Op::Normalize {
                op: *rng.pick(NormOp::ALL),
                x,
                axis,
            },
            None,
        ),
        18 => {
            let g = rng.chance(50).then(|| pick(rng));
            let b = rng.chance(50).then(|| pick(rng));
            (
                Op::LayerNorm {
                    x,
                    gamma: g,
                    beta: b,
                    eps_bits: 1e-5f32.to_bits(),
                },
                None,
            )
        }
        19 => (
            Op::RmsNorm {
                x,
                gamma: rng.chance(50).then(|| pick(rng)),
                eps_bits: 1e-6f32.to_bits(),
            },
            None,
        ),
        20 => {
            let bias = rng.chance(50).then(|| pick(rng));
            (
                Op::Conv2d {
                    x,
                    w: pick(rng),
                    bias,
                    window: window(rng),
                    groups: 1 + rng.below(2) as u32,
                },
                None,
            )
        }
        21 => {
            let kernel = [1 + rng.below(3) as u32, 1 + rng.below(2) as u32];
            (
                Op::Pool2d {
                    kind: *rng.pick(PoolKind::ALL),
                    x,
                    kernel,
                    window: window(rng),
                },
                None,
            )
        }
        22 => {
            let ty = TensorType::new(float, random_shape(rng, 3));
            (
                Op::Random {
                    dist: *rng.pick(Distribution::ALL),
                    key: rng.next_u64(),
                },
                Some(ty),
            )
        }
        23 => {
            let file = WeightsId(std::array::from_fn(|_| rng.next_u64() as u8));
            let ty = TensorType::new(float, random_shape(rng, 3));
            (
                Op::Weight {
                    file,
                    tensor: format!("layer{}.weight", rng.below(1000)),
                },
                Some(ty),
            )
        }
        _ => {
            let ty = TensorType::new(*rng.pick(&DType::ALL), random_shape(rng, 4));
            (
                Op::Input {
                    name: format!("in{}", rng.below(1000)),
                },
                Some(ty),
            )
        }
    }
}

/// Append a quantised tensor (an input, weight or constant of random bytes: random f16 scales,
/// infinities, NaNs and denormals among them) and a `dequantize` or `qmatmul` reading it.
/// Its own generator `q`, so the other proposals' stream is the same with or without it.
fn quant_step(q: &mut Rng, nodes: &mut Vec<Node>) {
    let format = *q.pick(QuantFormat::ALL);
    let (nb, bb) = (1 + q.below(2), format.block_bytes());
    let k = nb * QuantFormat::BLOCK;
    let lead = |q: &mut Rng| if q.chance(5) { 0 } else { 1 + q.below(3) };
    let qmatmul = q.chance(60);
    let shape = if qmatmul {
        vec![lead(q), nb, bb]
    } else if q.chance(50) {
        vec![nb, bb]
    } else {
        vec![lead(q), nb, bb]
    };
    let ty = TensorType::new(DType::U8, shape);
    let at = nodes.len();
    let op = match q.below(3) {
        0 => Op::Input {
            name: format!("qin{at}"),
        },
        1 => Op::Weight {
            file: WeightsId(std::array::from_fn(|_| q.next_u64() as u8)),
            tensor: format!("q{at}.weight"),
        },
        _ => Op::Constant {
            data: constant_data(q, &ty),
        },
    };
    nodes.push(Node { op, ty });
    let w = NodeId(at as u32);
    let op = if qmatmul {
        // Activations: an earlier f32 node of the right width, or a new input.
        let fits: Vec<usize> = (0..at)
            .filter(|&i| {
                let t = &nodes[i].ty;
                t.dtype == DType::F32 && t.rank() >= 2 && t.shape.last() == Some(&k)
            })
            .collect();
        let a = if !fits.is_empty() && q.chance(50) {
            NodeId(*q.pick(&fits) as u32)
        } else {
            let mut shape = vec![lead(q), k];
            if q.chance(30) {
                shape.insert(0, 1 + q.below(2));
            }
            nodes.push(Node {
                op: Op::Input {
                    name: format!("qa{}", nodes.len()),
                },
                ty: TensorType::new(DType::F32, shape),
            });
            NodeId(nodes.len() as u32 - 1)
        };
        // Drawn last, so the rest of the stream is what it was before `qmatmul_q8` existed.
        let dot = if q.chance(50) { QDot::Q8 } else { QDot::F32 };
        Op::QMatMul { a, w, format, dot }
    } else {
        Op::Dequantize { x: w, format }
    };
    let ty_of = |n: NodeId| nodes[n.index()].ty.clone();
    let ty = infer(&op, &ty_of, None).expect("quantised operands are built to fit");
    nodes.push(Node { op, ty });
}

/// A random valid graph of up to `steps` proposed ops on top of 1 to 3 inputs; now and then
/// (about one step in 30) a quantised tensor and a `dequantize` or `qmatmul` of it.
pub fn random_graph(seed: u64, steps: usize) -> Graph {
    let mut rng = Rng(seed);
    let mut q = Rng(seed ^ 0x71ab_7c3e_05d2_9f11);
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..1 + rng.below(3) {
        let dtype = *rng.pick(&[DType::F32, DType::F32, DType::I64, DType::Bool, DType::F16]);
        let shape = if rng.chance(30) {
            vec![1, 2, 3, 3]
        } else {
            random_shape(&mut rng, 3)
        };
        nodes.push(Node {
            op: Op::Input {
                name: format!("x{i}"),
            },
            ty: TensorType::new(dtype, shape),
        });
    }
    let limits = Limits::default();
    for _ in 0..steps {
        if q.chance(3) {
            quant_step(&mut q, &mut nodes);
        }
        let (op, declared) = propose(&mut rng, &nodes);
        let ty_of = |n: NodeId| nodes[n.index()].ty.clone();
        let Ok(ty) = infer(&op, &ty_of, declared.as_ref()) else {
            continue;
        };
        if ty.numel().is_none_or(|n| n > 4096) || ty.rank() > limits.max_rank {
            continue;
        }
        let dup = nodes.iter().any(|n| match (&n.op, &op) {
            (Op::Input { name: a }, Op::Input { name: b }) => a == b,
            (
                Op::Weight {
                    file: f1,
                    tensor: t1,
                },
                Op::Weight {
                    file: f2,
                    tensor: t2,
                },
            ) => f1 == f2 && t1 == t2,
            _ => false,
        });
        if !dup {
            nodes.push(Node { op, ty });
        }
    }
    // Every node nothing else uses becomes an output, so no node is dead.
    let mut used = vec![false; nodes.len()];
    for n in &nodes {
        for o in n.op.operands() {
            used[o.index()] = true;
        }
    }
    let mut outputs: Vec<Output> = (0..nodes.len())
        .filter(|&i| !used[i] && !matches!(nodes[i].op, Op::Input { .. }))
        .map(|i| Output {
            name: format!("out{i}"),
            node: NodeId(i as u32),
        })
        .collect();
    if outputs.is_empty() {
        outputs.push(Output {
            name: "out".into(),
            node: NodeId(0),
        });
    }
    Graph::new(nodes, outputs).expect("the generator builds valid graphs")
}

/// The name of every op of the op set (what a generator or a suite covering it must reach).
pub fn every_op_name() -> std::collections::BTreeSet<&'static str> {
    let mut names: std::collections::BTreeSet<&'static str> = [
        "input",
        "weight",
        "const",
        "where",
        "cast",
        "matmul",
        "reshape",
        "permute",
        "expand",
        "slice",
        "pad",
        "concat",
        "gather",
        "iota",
        "tri_mask",
        "layer_norm",
        "rms_norm",
        "conv2d",
        "dequantize",
        "qmatmul",
        "qmatmul_q8",
    ]
    .into_iter()
    .collect();
    names.extend(UnaryOp::ALL.iter().map(|o| o.name()));
    names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
    names.extend(ReduceOp::ALL.iter().map(|o| o.name()));
    names.extend(NormOp::ALL.iter().map(|o| o.name()));
    names.extend(PoolKind::ALL.iter().map(|o| o.name()));
    names.extend(Distribution::ALL.iter().map(|o| o.name()));
    names
}

/// Which op names occur in a graph.
pub fn op_names(g: &Graph) -> std::collections::BTreeSet<&'static str> {
    g.nodes().iter().map(|n| n.op.name()).collect()
}

/// A random tensor of type `ty`: f32 tensors are either all ordinary values or, half of the
/// time, a mix with a fifth of NaN, ±inf, ±0 and denormals (a mix alone would make nearly every
/// long sum or dot product NaN, hiding the order it was computed in); integers span their
/// range; bools are 0 or 1.
pub fn random_tensor(rng: &mut Rng, ty: &TensorType) -> HostTensor {
    let n = ty.numel().unwrap_or(0) as usize;
    let mut data = Vec::with_capacity(n * ty.dtype.size() as usize);
    let ordinary_share = if rng.chance(50) { 100 } else { 80 };
    for _ in 0..n {
        let bits: u64 = match ty.dtype {
            DType::F32 => {
                if rng.chance(ordinary_share) {
                    ((rng.below(2001) as f32 - 1000.0) / 100.0).to_bits() as u64
                } else {
                    random_f32_bits(rng) as u64
                }
            }
            DType::F16 => {
                half::f16::from_f32((rng.below(2001) as f32 - 1000.0) / 100.0).to_bits() as u64
            }
            DType::BF16 => {
                half::bf16::from_f32((rng.below(2001) as f32 - 1000.0) / 100.0).to_bits() as u64
            }
            DType::Bool => rng.below(2),
            DType::I32 | DType::I64 if rng.chance(70) => (rng.below(9) as i64 - 4) as u64,
            _ => rng.next_u64(),
        };
        data.extend_from_slice(&bits.to_le_bytes()[..ty.dtype.size() as usize]);
    }
    HostTensor::new(ty.clone(), data).expect("sized to the type")
}

/// Weights for [`random_io`]: by (file, tensor name), as [`WeightSource`] reads them.
pub type RandomWeights = std::collections::HashMap<(WeightsId, String), HostTensor>;

/// Random tensors for every input and weight of `graph` ([`random_tensor`]), from `seed`.
pub fn random_io(
    graph: &Graph,
    seed: u64,
) -> (std::collections::HashMap<String, HostTensor>, RandomWeights) {
    let mut rng = Rng(seed);
    let inputs = graph
        .inputs()
        .map(|(_, n, t)| (n.to_string(), random_tensor(&mut rng, t)))
        .collect();
    let weights = graph
        .weights()
        .filter_map(|(_, op, ty)| match op {
            Op::Weight { file, tensor } => {
                Some(((*file, tensor.clone()), random_tensor(&mut rng, ty)))
            }
            _ => None,
        })
        .collect();
    (inputs, weights)
}
