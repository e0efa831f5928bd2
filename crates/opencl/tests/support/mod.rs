//! Shared by the OpenCL backend's tests: opening the device once per test binary (or skipping
//! when there is none, unless `TENET_REQUIRE_OPENCL=1`), a small graph builder that takes any
//! op directly, hostile tensors for every dtype, and the comparison against the reference.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::OnceLock;

use tenet_exec::{Device, ExecError};
use tenet_ir::testing::Rng;
use tenet_ir::{DType, Graph, HostTensor, Node, NodeId, Op, Output, TensorType, WeightSource};
use tenet_opencl::{OpenClDevice, Quirks};

/// The device every test of this binary shares, or `None` (with a line printed) when this
/// machine has no OpenCL device. With `TENET_REQUIRE_OPENCL=1` a missing device fails instead.
pub fn device() -> Option<&'static OpenClDevice> {
    static DEVICE: OnceLock<Option<OpenClDevice>> = OnceLock::new();
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    let d = DEVICE.get_or_init(|| {
        if !OpenClDevice::available() {
            return None;
        }
        Some(OpenClDevice::open(0, Quirks::default()).expect("opening OpenCL device 0"))
    });
    if d.is_none() {
        assert!(
            !required,
            "TENET_REQUIRE_OPENCL=1 but no OpenCL device is available"
        );
        println!("skipped: no OpenCL device on this machine");
    }
    d.as_ref()
}

/// Builds graphs from ops directly, checking each with the IR's own rules.
#[derive(Default)]
pub struct G {
    pub nodes: Vec<Node>,
}

impl G {
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[u64]) -> NodeId {
        self.push(
            Op::Input {
                name: name.to_string(),
            },
            Some(TensorType::new(dtype, shape)),
        )
        .expect("an input is valid")
    }

    /// The node, or `None` if the op's rules refuse it.
    pub fn push(&mut self, op: Op, declared: Option<TensorType>) -> Option<NodeId> {
        let ty_of = |n: NodeId| self.nodes[n.index()].ty.clone();
        let ty = tenet_ir::infer(&op, &ty_of, declared.as_ref()).ok()?;
        self.nodes.push(Node { op, ty });
        Some(NodeId(self.nodes.len() as u32 - 1))
    }

    pub fn ty(&self, n: NodeId) -> &TensorType {
        &self.nodes[n.index()].ty
    }

    pub fn finish(self, outputs: &[NodeId]) -> Graph {
        let outputs = outputs
            .iter()
            .enumerate()
            .map(|(i, &node)| Output {
                name: format!("out{i}"),
                node,
            })
            .collect();
        Graph::new(self.nodes, outputs).expect("a valid graph")
    }
}

/// Values that break kernels: NaN payloads, infinities, signed zeros, denormals, integer
/// extremes, mixed with ordinary values.
pub fn hostile(rng: &mut Rng, ty: &TensorType) -> HostTensor {
    let n = ty.numel().unwrap() as usize;
    let mut data = Vec::with_capacity(n * ty.dtype.size() as usize);
    // Some tensors all ordinary (a long sum of a mix is nearly always NaN, hiding its order).
    let special_share = *rng.pick(&[0, 5, 40]);
    for _ in 0..n {
        let ordinary = !rng.chance(special_share);
        let random = rng.next_u64();
        // Short decimals, or any mantissa with an exponent in 2^-12..2^12 (sums round).
        let small = if rng.chance(50) {
            (rng.below(2001) as f32 - 1000.0) / 100.0
        } else {
            f32::from_bits(((115 + random % 24) << 23) as u32 | (random >> 32) as u32 & 0x807f_ffff)
        };
        let bits: u64 = match ty.dtype {
            DType::F32 if ordinary => small.to_bits() as u64,
            DType::F32 => *rng.pick(&[
                0u64,
                0x8000_0000,
                1,
                0x0000_0400,
                0x807f_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0xffc0_1234,
                0x7f80_0001,
                0x7f7f_ffff,
                0x4b40_0001,
                random & 0xffff_ffff,
            ]),
            DType::F16 if ordinary => half::f16::from_f32(small).to_bits() as u64,
            DType::F16 => *rng.pick(&[
                0u64,
                0x8000,
                1,
                0x03ff,
                0x83ff,
                0x7c00,
                0xfc00,
                0x7e00,
                0x7e01,
                0xfd55,
                0x7bff,
                random & 0xffff,
            ]),
            DType::BF16 if ordinary => half::bf16::from_f32(small).to_bits() as u64,
            DType::BF16 => *rng.pick(&[
                0u64,
                0x8000,
                1,
                0x007f,
                0x807f,
                0x7f80,
                0xff80,
                0x7fc0,
                0x7fc1,
                0xffa0,
                0x7f7f,
                random & 0xffff,
            ]),
            DType::I32 | DType::I64 if ordinary => (rng.below(9) as i64 - 4) as u64,
            DType::I32 => *rng.pick(&[
                i32::MIN as u32 as u64,
                i32::MAX as u64,
                u32::MAX as u64,
                random,
            ]),
            DType::I64 => *rng.pick(&[i64::MIN as u64, i64::MAX as u64, u64::MAX, random]),
            DType::U8 => random & 0xff,
            DType::Bool => rng.below(2),
        };
        data.extend_from_slice(&bits.to_le_bytes()[..ty.dtype.size() as usize]);
    }
    HostTensor::new(ty.clone(), data).unwrap()
}

/// Hostile tensors for every input of `graph`.
pub fn hostile_inputs(graph: &Graph, seed: u64) -> HashMap<String, HostTensor> {
    let mut rng = Rng(seed);
    graph
        .inputs()
        .map(|(_, name, ty)| (name.to_string(), hostile(&mut rng, ty)))
        .collect()
}

/// Run `graph` on the device and through the reference: the same bits in every output, or the
/// same error.
pub fn assert_matches(
    device: &OpenClDevice,
    graph: &Graph,
    inputs: &HashMap<String, HostTensor>,
    weights: &dyn WeightSource,
    seed: u64,
    what: &str,
) {
    let want = tenet_reference::run(graph, inputs, weights, seed);
    let program = device.compile(graph).expect("compiles");
    let got = program.run_with_stats(inputs, weights, seed);
    match (&want, &got) {
        (Ok(w), Ok((g, stats))) => {
            assert!(
                stats.peak_bytes <= graph.cost().peak_bytes,
                "{what}: peak {} above the certificate's {}",
                stats.peak_bytes,
                graph.cost().peak_bytes
            );
            for ((name, wt), (_, gt)) in w.iter().zip(g) {
                assert_eq!(wt.ty(), gt.ty(), "{what}: output {name}");
                if wt.bytes() != gt.bytes() {
                    panic!(
                        "{what}: output {name} ({}) differs from the reference\n{}\ninputs: {}\nwant: {}\ngot:  {}",
                        wt.ty(),
                        tenet_ir::text::print(graph),
                        show_inputs(inputs),
                        show(wt),
                        show(gt)
                    );
                }
            }
        }
        (Err(w), Err(ExecError::Run(g))) => assert_eq!(w.to_string(), g.to_string(), "{what}"),
        _ => panic!(
            "{what}: reference {:?} vs OpenCL {:?}\n{}",
            want.as_ref().err(),
            got.as_ref().err(),
            tenet_ir::text::print(graph)
        ),
    }
}

fn show_inputs(inputs: &HashMap<String, HostTensor>) -> String {
    let mut names: Vec<&String> = inputs.keys().collect();
    names.sort();
    names
        .iter()
        .map(|n| format!("{n} = {}", show(&inputs[*n])))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Elements as hex bits, for failure messages.
pub fn show(t: &HostTensor) -> String {
    let size = t.dtype().size() as usize;
    let items: Vec<String> = t
        .bytes()
        .chunks(size)
        .take(64)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            format!("{:x}", u64::from_le_bytes(b))
        })
        .collect();
    format!("{} [{}]", t.ty(), items.join(" "))
}
