//! The quantised-weight ops, `dequantize` and `qmatmul`: type rules, text form, binary tags
//! (appended after the existing ones, a format as one tag byte) and cost.

use tenet_ir::*;

const FILE: WeightsId = WeightsId([7; 32]);

/// `x[1, 576] @ transpose(dequantize(w[8, 18, 20]))` and a dequantised Q8_0 table.
fn graph() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 576]);
    let w = g.weight(FILE, "proj.weight", DType::U8, &[8, 18, 20]);
    let y = x.qmatmul(&w, QuantFormat::Q4_1);
    let t = g.input("t", DType::U8, &[3, 2, 34]);
    let d = t.dequantize(QuantFormat::Q8_0);
    assert_eq!(y.ty(), &TensorType::new(DType::F32, [1, 8]));
    assert_eq!(d.ty(), &TensorType::new(DType::F32, [3, 64]));
    g.finish(&[("y", &y), ("d", &d)]).unwrap()
}

#[test]
fn formats_have_fixed_names_tags_and_block_sizes() {
    let table: Vec<_> = QuantFormat::ALL
        .iter()
        .map(|f| (f.name(), f.tag(), f.block_bytes()))
        .collect();
    assert_eq!(table, [("q4_0", 0, 18), ("q4_1", 1, 20), ("q8_0", 2, 34)]);
    assert_eq!(QuantFormat::BLOCK, 32);
    assert_eq!(QuantFormat::from_tag(3), None);
}

#[test]
fn text_form_names_the_format() {
    let text = text::print(&graph());
    assert_eq!(
        text,
        format!(
            "tenet graph v1\n\
             %0 = input(\"x\") : f32[1,576]\n\
             %1 = weight(\"proj.weight\", file=\"{FILE}\") : u8[8,18,20]\n\
             %2 = qmatmul(%0, %1, format=q4_1) : f32[1,8]\n\
             %3 = input(\"t\") : u8[3,2,34]\n\
             %4 = dequantize(%3, format=q8_0) : f32[3,64]\n\
             output \"y\" = %2\n\
             output \"d\" = %4\n"
        )
    );
    assert_eq!(text::parse(&text).unwrap(), graph());
    let bad = text.replace("format=q4_1", "format=q5_0");
    let e = text::parse(&bad).unwrap_err().to_string();
    assert!(e.contains("unknown quantisation format `q5_0`"), "{e}");
}

/// Where node `index`'s encoding starts, and its bytes.
fn node_bytes(g: &Graph, index: usize) -> (usize, Vec<u8>) {
    let bytes = g.to_bytes();
    // Magic, version, node count.
    let mut at = 8 + 2 + 4;
    for (i, node) in g.nodes().iter().enumerate() {
        let single = {
            // Tag, dtype, rank, dims, then the op's payload.
            let head = 3 + 8 * node.ty.rank();
            let payload = match &node.op {
                Op::Input { name } => 4 + name.len(),
                Op::Weight { tensor, .. } => 32 + 4 + tensor.len(),
                Op::Dequantize { .. } => 1 + 4,
                Op::QMatMul { .. } => 1 + 4 + 4,
                op => panic!("not in this test: {op:?}"),
            };
            head + payload
        };
        if i == index {
            return (at, bytes[at..at + single].to_vec());
        }
        at += single;
    }
    unreachable!()
}

#[test]
fn binary_tags_are_appended_and_the_format_is_a_byte() {
    let g = graph();
    // qmatmul: tag 25, dtype f32 (0), rank 2, dims 1 and 8, format q4_1 (1), a = 0, w = 1.
    let mut want = vec![25u8, 0, 2];
    want.extend(1u64.to_le_bytes());
    want.extend(8u64.to_le_bytes());
    want.push(1);
    want.extend(0u32.to_le_bytes());
    want.extend(1u32.to_le_bytes());
    assert_eq!(node_bytes(&g, 2).1, want);
    // dequantize: tag 24, f32, rank 2, dims 3 and 64, format q8_0 (2), x = 3.
    let mut want = vec![24u8, 0, 2];
    want.extend(3u64.to_le_bytes());
    want.extend(64u64.to_le_bytes());
    want.push(2);
    want.extend(3u32.to_le_bytes());
    let (start, got) = node_bytes(&g, 4);
    assert_eq!(got, want);
    let back = codec::decode(&g.to_bytes()).unwrap();
    assert_eq!(back, g);
    // An unknown format byte is refused with its offset.
    let mut bytes = g.to_bytes();
    let at = start + 3 + 16;
    assert_eq!(bytes[at], 2, "the format byte of the dequantize");
    bytes[at] = 3;
    let e = codec::decode(&bytes).unwrap_err();
    assert_eq!(e.offset, at as u64, "{e}");
    assert!(e.to_string().contains("quantisation format"), "{e}");
}

#[test]
fn type_rules_refuse_with_clear_errors() {
    let rule = |x: &[u64], xd: DType, w: &[u64], f: QuantFormat| {
        let g = GraphBuilder::new();
        let a = g.input("a", xd, x);
        let w = g.input("w", DType::U8, w);
        let _ = a.qmatmul(&w, f);
        g.error().map(|e| e.to_string())
    };
    use QuantFormat::*;
    assert_eq!(rule(&[2, 3, 64], DType::F32, &[5, 2, 18], Q4_0), None);
    let e = rule(&[2, 64], DType::F32, &[5, 2, 20], Q4_0).unwrap();
    assert!(e.contains("q4_0 blocks are u8[..., nb, 18]"), "{e}");
    let e = rule(&[2, 64], DType::F32, &[2, 20], Q4_1).unwrap();
    assert!(e.contains("needs u8[n, k/32, 20]"), "{e}");
    let e = rule(&[2, 0], DType::F32, &[5, 0, 34], Q8_0).unwrap();
    assert!(e.contains("no blocks"), "{e}");
    let e = rule(&[2, 32], DType::F32, &[5, 2, 34], Q8_0).unwrap();
    assert!(e.contains("inner dimensions differ (32 vs 2 blocks"), "{e}");
    let e = rule(&[2, 64], DType::F16, &[5, 2, 34], Q8_0).unwrap();
    assert!(e.contains("need f32 of rank >= 2"), "{e}");
    let e = rule(&[64], DType::F32, &[5, 2, 34], Q8_0).unwrap();
    assert!(e.contains("need f32 of rank >= 2"), "{e}");

    let deq = |x: &[u64], d: DType| {
        let g = GraphBuilder::new();
        let t = g.input("t", d, x).dequantize(Q4_0);
        g.error().map(|e| e.to_string()).ok_or(t.shape().to_vec())
    };
    assert_eq!(deq(&[4, 0, 18], DType::U8), Err(vec![4, 0]));
    assert_eq!(deq(&[1, 18], DType::U8), Err(vec![32]));
    assert!(deq(&[18], DType::U8).unwrap().contains("u8[..., nb, 18]"));
    assert!(deq(&[1, 18], DType::I32).unwrap().contains("got i32[1,18]"));
}

#[test]
fn cost_counts_the_product_and_the_real_weight_bytes() {
    let g = graph();
    let c = g.cost();
    let (k, n) = (576u64, 8u64);
    let w_bytes = 8 * 18 * 20;
    // qmatmul 2·m·n·k; dequantize one per output element.
    assert_eq!(c.flops, 2 * n * k + 3 * 64);
    assert_eq!(c.weight_bytes, w_bytes);
    assert_eq!(c.bytes_read, k * 4 + w_bytes + 3 * 2 * 34);
    assert_eq!(c.bytes_written, n * 4 + 3 * 64 * 4);
}
