//! Example models shipped in `examples/`, built here so that the committed files can be
//! regenerated (`cargo run -p tenet-models --example write_examples`) and checked by tests.

use tenet_ir::{DType, Graph, GraphBuilder, WeightsId};

use crate::safetensors_io::{WeightsError, write_safetensors};

/// Layer sizes of the example MLP: 8×8 digit images in, ten classes out.
pub const MLP_SIZES: [u64; 3] = [64, 32, 10];
/// Rows per call.
pub const MLP_BATCH: u64 = 8;

/// Deterministic weights in `[-1/sqrt(fan_in), 1/sqrt(fan_in))` from a fixed splitmix64 stream.
fn init(count: u64, fan_in: u64, state: &mut u64) -> Vec<u8> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    (0..count)
        .flat_map(|_| {
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
            (((2.0 * unit - 1.0) * bound) as f32).to_le_bytes()
        })
        .collect()
}

/// The 2-layer MLP: `probs = softmax(relu(x @ w1 + b1) @ w2 + b2)`, plus its weights file.
pub fn mlp() -> Result<(Graph, Vec<u8>), WeightsError> {
    let [d_in, d_hidden, d_out] = MLP_SIZES;
    let mut state = 0x7e4e7;
    let tensors = vec![
        (
            "fc1.weight",
            DType::F32,
            vec![d_in, d_hidden],
            init(d_in * d_hidden, d_in, &mut state),
        ),
        (
            "fc1.bias",
            DType::F32,
            vec![d_hidden],
            init(d_hidden, d_in, &mut state),
        ),
        (
            "fc2.weight",
            DType::F32,
            vec![d_hidden, d_out],
            init(d_hidden * d_out, d_hidden, &mut state),
        ),
        (
            "fc2.bias",
            DType::F32,
            vec![d_out],
            init(d_out, d_hidden, &mut state),
        ),
    ];
    let file = write_safetensors(&tensors)?;
    let id = WeightsId::of_bytes(&file);

    let g = GraphBuilder::new();
    let w = |name: &str, shape: &[u64]| g.weight(id, name, DType::F32, shape);
    let x = g.input("x", DType::F32, &[MLP_BATCH, d_in]);
    let h = (x.matmul(&w("fc1.weight", &[d_in, d_hidden])) + w("fc1.bias", &[d_hidden])).relu();
    let logits = h.matmul(&w("fc2.weight", &[d_hidden, d_out])) + w("fc2.bias", &[d_out]);
    let probs = logits.softmax(-1);
    let graph = g
        .finish(&[("logits", &logits), ("probs", &probs)])
        .expect("the example MLP is well-formed");
    Ok((graph, file))
}
