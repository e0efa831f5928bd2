//! The cost certificate's figures on graphs whose costs are known by hand.

use tenet_ir::*;

#[test]
fn matmul_costs() {
    let g = text::parse(include_str!("../../../examples/matmul.tg")).unwrap();
    let c = g.cost();
    let n = 1024u64;
    assert_eq!(c.flops, 2 * n * n * n);
    assert_eq!(c.input_bytes, 2 * n * n * 4);
    assert_eq!(c.output_bytes, n * n * 4);
    assert_eq!(c.bytes_read, 2 * n * n * 4);
    assert_eq!(c.bytes_written, n * n * 4);
    // a, b and c are all live while c is computed.
    assert_eq!(c.peak_bytes, 3 * n * n * 4);
    assert_eq!(c.weight_bytes, 0);
}

#[test]
fn peak_follows_liveness_in_graph_order() {
    // x -> a = exp(x) -> b = exp(a) -> c = exp(b): each step holds its operand and its result,
    // and x is released once a is computed, so two buffers are live at any time.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1000]);
    let c = x.exp().exp().exp();
    let graph = g.finish(&[("c", &c)]).unwrap();
    let cost = graph.cost();
    assert_eq!(cost.peak_bytes, 2 * 4000);
    assert_eq!(cost.flops, 3000);
    assert_eq!(cost.bytes_written, 3 * 4000);

    // Keeping x alive until the final add raises the peak by one buffer.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1000]);
    let c = x.exp().exp().exp() + &x;
    let graph = g.finish(&[("c", &c)]).unwrap();
    assert_eq!(graph.cost().peak_bytes, 3 * 4000);
}

#[test]
fn weights_and_conv_are_counted() {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 3, 8, 8]);
    let w = g.weight(WeightsId([9; 32]), "conv.weight", DType::F32, &[4, 3, 3, 3]);
    let y = x.conv2d(&w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1);
    let graph = g.finish(&[("y", &y)]).unwrap();
    assert_eq!(graph.cost().weight_bytes, 4 * 3 * 3 * 3 * 4);
    assert_eq!(graph.cost().flops, 2 * (4 * 8 * 8) * (3 * 3 * 3));
}
