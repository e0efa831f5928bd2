//! Results computed into recycled buffers. Dropping a large tensor hands its buffer to the
//! process-wide cache (`tenet_ir::recycle`), and the next result of that size is computed into
//! it, stale bytes and all: every kernel must overwrite every byte. Here the stale bytes are NaN
//! payloads and the results must still be the reference's, bit for bit.

use std::collections::HashMap;

use tenet_cpu::{CpuDevice, SimdLevel};
use tenet_exec::Device;
use tenet_ir::testing::{Rng, random_tensor};
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, NoWeights, TensorType};

/// Graphs whose single output is 512×1024 f32 (2 MiB, above the cache's minimum).
fn graphs() -> Vec<(&'static str, Graph)> {
    let mut v = Vec::new();
    let input = |g: &GraphBuilder, n: &str, s: &[u64]| g.input(n, DType::F32, s);
    let g = GraphBuilder::new();
    let (x, y) = (input(&g, "x", &[512, 1024]), input(&g, "y", &[512, 1024]));
    v.push((
        "fused x*y+x",
        g.finish(&[("o", &(x.clone() * y + x))]).unwrap(),
    ));
    let g = GraphBuilder::new();
    let (x, y) = (input(&g, "x", &[512, 64]), input(&g, "y", &[64, 1024]));
    v.push(("matmul", g.finish(&[("o", &x.matmul(&y))]).unwrap()));
    let g = GraphBuilder::new();
    let x = input(&g, "x", &[512, 1024]);
    v.push(("softmax", g.finish(&[("o", &x.softmax(-1))]).unwrap()));
    let g = GraphBuilder::new();
    let x = input(&g, "x", &[1024, 512]);
    v.push(("transpose", g.finish(&[("o", &x.transpose(0, 1))]).unwrap()));
    v
}

#[test]
fn stale_buffers_never_leak_into_results() {
    let backend = CpuDevice::new(2, SimdLevel::detect());
    for (name, graph) in graphs() {
        let mut rng = Rng(7);
        let inputs: HashMap<String, HostTensor> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), random_tensor(&mut rng, t)))
            .collect();
        let want = tenet_reference::run(&graph, &inputs, &NoWeights, 0).unwrap();
        let prepared = backend.compile(&graph).unwrap();
        for _ in 0..3 {
            // A tensor of the output's size full of NaN payloads, dropped into the cache.
            let ty = TensorType::new(DType::F32, [512, 1024]);
            let garbage = HostTensor::new(ty, vec![0xff; 512 * 1024 * 4]).unwrap();
            drop(garbage);
            assert!(tenet_ir::recycle::held_bytes() >= 512 * 1024 * 4);
            let got = prepared.run(&inputs, &NoWeights, 0).unwrap();
            assert!(
                got[0].1.bytes() == want[0].1.bytes(),
                "{name}: a recycled buffer changed the result"
            );
        }
    }
}
