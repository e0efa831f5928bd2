//! What the peer-to-peer tests share: a small task, its inputs, and an in-memory peer's swarm
//! configuration.
#![allow(dead_code)]

use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_p2p::{Config, Multiaddr, Transport};

/// y = tanh(x @ w), x [4, 8], w [8, 3].
pub fn graph() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4, 8]);
    let w = g.input("w", DType::F32, &[8, 3]);
    let y = x.matmul(&w).tanh();
    g.finish(&[("y", &y)]).unwrap()
}

/// A tensor of `shape` with values in [-1, 1) spread by `seed`.
pub fn tensor_of(shape: &[u64], seed: u32) -> HostTensor {
    let n: u64 = shape.iter().product();
    let v: Vec<f32> = (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    HostTensor::from_f32(shape, &v).unwrap()
}

/// Inputs to [`graph`].
pub fn inputs(seed: u32) -> Vec<(String, HostTensor)> {
    vec![
        ("x".into(), tensor_of(&[4, 8], seed)),
        ("w".into(), tensor_of(&[8, 3], seed + 1)),
    ]
}

/// A peer on the in-memory transport with a fresh key, joining through `bootstrap`.
pub fn config(bootstrap: &[Multiaddr]) -> Config {
    let mut c = Config::new(tenet_net::identity::generate());
    c.transport = Transport::Memory;
    c.listen = vec!["/memory/0".parse().unwrap()];
    c.bootstrap = bootstrap.to_vec();
    c
}
