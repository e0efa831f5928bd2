//! A graph's id is a function of exactly its content.

use tenet_ir::*;

const FILE_A: WeightsId = WeightsId([1; 32]);
const FILE_B: WeightsId = WeightsId([2; 32]);

/// A small MLP whose every ingredient can be varied by one knob.
#[derive(Clone, Copy)]
struct Knobs {
    hidden: u64,
    dtype: DType,
    activation: UnaryOp,
    scale: f64,
    weights: WeightsId,
    tensor: &'static str,
}

const BASE: Knobs = Knobs {
    hidden: 16,
    dtype: DType::F32,
    activation: UnaryOp::Relu,
    scale: 0.5,
    weights: FILE_A,
    tensor: "fc1.weight",
};

fn build(k: Knobs) -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", k.dtype, &[4, 8]);
    let w = g.weight(k.weights, k.tensor, k.dtype, &[8, k.hidden]);
    let h = x.matmul(&w) * k.scale;
    let h = match k.activation {
        UnaryOp::Relu => h.relu(),
        _ => h.tanh(),
    };
    let y = h.sum(&[-1], true);
    g.finish(&[("y", &y)]).unwrap()
}

#[test]
fn same_program_same_id() {
    assert_eq!(build(BASE).id(), build(BASE).id());
    assert_eq!(build(BASE).to_bytes(), build(BASE).to_bytes());
}

#[test]
fn every_ingredient_changes_the_id() {
    let base = build(BASE).id();
    let variants = [
        ("shape", Knobs { hidden: 17, ..BASE }),
        (
            "dtype",
            Knobs {
                dtype: DType::BF16,
                ..BASE
            },
        ),
        (
            "op",
            Knobs {
                activation: UnaryOp::Tanh,
                ..BASE
            },
        ),
        (
            "constant",
            Knobs {
                scale: 0.25,
                ..BASE
            },
        ),
        (
            "weights file",
            Knobs {
                weights: FILE_B,
                ..BASE
            },
        ),
        (
            "weight tensor",
            Knobs {
                tensor: "fc2.weight",
                ..BASE
            },
        ),
    ];
    let mut seen = vec![base];
    for (what, k) in variants {
        let id = build(k).id();
        assert!(
            !seen.contains(&id),
            "changing the {what} did not change the id"
        );
        seen.push(id);
    }
}

#[test]
fn names_and_attributes_change_the_id() {
    let make = |input: &str, output: &str, keepdim: bool| {
        let g = GraphBuilder::new();
        let x = g.input(input, DType::F32, &[2, 2]);
        let s = x.sum(&[0], keepdim);
        g.finish(&[(output, &s)]).unwrap().id()
    };
    let base = make("x", "s", false);
    assert_ne!(base, make("y", "s", false));
    assert_ne!(base, make("x", "t", false));
    assert_ne!(base, make("x", "s", true));
}

#[test]
fn unused_nodes_do_not_change_the_id() {
    let g1 = GraphBuilder::new();
    let x = g1.input("x", DType::F32, &[3]);
    let _unused = x.exp();
    let y = x.relu();
    let a = g1.finish(&[("y", &y)]).unwrap();
    let g2 = GraphBuilder::new();
    let x = g2.input("x", DType::F32, &[3]);
    let y = x.relu();
    let b = g2.finish(&[("y", &y)]).unwrap();
    assert_eq!(a.id(), b.id());
    assert_eq!(a.nodes().len(), 2);
}

#[test]
fn id_is_blake3_of_canonical_bytes() {
    let g = build(BASE);
    assert_eq!(g.id().0, *blake3_hash(&g.to_bytes()));
    assert_eq!(g.id().short().len(), 12);
}

fn blake3_hash(bytes: &[u8]) -> Box<[u8; 32]> {
    Box::new(GraphId::of_bytes(bytes).0)
}

/// The examples' ids, pinned: an encoding change that would alter an existing graph's id (a
/// renumbered op tag, a reordered payload) fails here. New ops only append tags.
#[test]
fn the_examples_ids_are_pinned() {
    let id = |src: &str| text::parse(src).unwrap().id().to_string();
    assert_eq!(
        id(include_str!("../../../examples/matmul.tg")),
        "aabeec0929b0961f991adc307f832e6ae07de0ee9c283ce506cb28b497f4f9ba"
    );
    assert_eq!(
        id(include_str!("../../../examples/mlp.tg")),
        "ea642b769dc7ab68e31cfbcb7678c9a17ea8cab299db93423bee942fdc007b13"
    );
}
