//! Mistakes are reported with what is wrong and where.

use tenet_ir::*;

#[test]
fn builder_errors_name_op_shapes_and_location() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2, 3]);
    let b = g.input("b", DType::F32, &[4, 5]);
    let c = a.matmul(&b); // line 10
    let d = (c + 1.0).relu(); // inert after the first error
    let err = g.finish(&[("d", &d)]).unwrap_err().to_string();
    assert!(err.contains("tests/errors.rs:10:"), "{err}");
    assert!(err.contains("matmul"), "{err}");
    assert!(
        err.contains("f32[2,3]") && err.contains("f32[4,5]"),
        "{err}"
    );
    assert!(err.contains("inner dimensions differ"), "{err}");
}

#[test]
fn builder_rejects_mixed_dtypes_and_bad_broadcasts() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2, 3]);
    let b = g.input("b", DType::I32, &[2, 3]);
    let _ = &a + &b;
    let e = g.error().unwrap().to_string();
    assert!(e.contains("add") && e.contains("different dtypes"), "{e}");

    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2, 3]);
    let b = g.input("b", DType::F32, &[4]);
    let _ = &a * &b;
    let e = g.error().unwrap().to_string();
    assert!(e.contains("cannot broadcast f32[2,3] with f32[4]"), "{e}");
}

#[test]
fn builder_broadcasts_like_numpy() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[4, 1, 3]);
    let b = g.input("b", DType::F32, &[5, 1]);
    let c = (&a + &b) / 2.0;
    assert_eq!(c.shape(), &[4, 5, 3]);
    let r = c.reshape(&[-1, 3]);
    assert_eq!(r.shape(), &[20, 3]);
    assert!(g.finish(&[("r", &r)]).is_ok());
}

fn parse_err(src: &str) -> text::ParseError {
    text::parse(src).unwrap_err()
}

#[test]
fn text_errors_carry_line_and_column() {
    let e = parse_err(
        "tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = matmul(%0, %0) : f32[2,3]\noutput \"o\" = %1\n",
    );
    assert_eq!((e.line, e.column), (3, 6), "{e}");
    assert!(e.message.contains("inner dimensions differ"), "{e}");

    let e =
        parse_err("tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = frobnicate(%0) : f32[2,3]\n");
    assert_eq!((e.line, e.column), (3, 6));
    assert!(e.message.contains("unknown op `frobnicate`"));

    let e = parse_err("tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = exp(%9) : f32[2,3]\n");
    assert_eq!((e.line, e.column), (3, 10));
    assert!(e.message.contains("unknown node %9"));

    let e = parse_err(
        "tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = sum(%0, axes=[1]) : f32[2]\n",
    );
    assert!(e.message.contains("missing attribute `keepdim=`"), "{e}");

    let e = parse_err("tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = exp(%0) : f32[2,3]\n");
    assert!(e.message.contains("at least one output"), "{e}");

    let e = parse_err("hello\n");
    assert_eq!((e.line, e.column), (1, 1));
    assert!(e.message.contains("tenet graph v1"));

    let e = parse_err(
        "tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = exp(%0) : f32[3,2]\noutput \"o\" = %1\n",
    );
    assert!(
        e.message
            .contains("declared type f32[3,2] but the operands give f32[2,3]"),
        "{e}"
    );

    let e = parse_err(
        "tenet graph v1\n%0 = input(\"a\") : f32[2,3]\n%1 = exp(%0) : f32[2,3]\n%2 = exp(%0) : f32[2,3]\noutput \"o\" = %1\n",
    );
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.contains("never used"), "{e}");

    let e = parse_err(
        "tenet graph v1\n%0 = input(\"a\") : f32[2]\n%1 = const([1.0, 2.0, 3.0]) : f32[2]\n",
    );
    assert!(e.message.contains("needs 2 values, found 3"), "{e}");
}

#[test]
fn binary_errors_carry_byte_offsets() {
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2, 3]);
    let e = a.exp();
    let graph = g.finish(&[("e", &e)]).unwrap();
    let bytes = graph.to_bytes();

    let err = codec::decode(b"GARBAGE!").unwrap_err();
    assert_eq!(err.offset, 0);
    assert_eq!(err.kind, codec::DecodeErrorKind::BadMagic);

    let mut v2 = bytes.clone();
    v2[8] = 2;
    assert_eq!(
        codec::decode(&v2).unwrap_err().kind,
        codec::DecodeErrorKind::UnsupportedVersion(2)
    );

    let err = codec::decode(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(
        matches!(err.kind, codec::DecodeErrorKind::Truncated { .. }),
        "{err}"
    );

    let mut trailing = bytes.clone();
    trailing.push(0);
    let err = codec::decode(&trailing).unwrap_err();
    assert_eq!(err.offset, bytes.len() as u64);

    // Node 1 (exp) starts after magic, version, count and node 0 (tag, dtype, rank, 2 dims,
    // name length, "a"). Its unary op byte follows tag, dtype, rank and two dims: make it an
    // unknown op.
    let node1 = 8 + 2 + 4 + (3 + 16 + 4 + 1);
    let op_byte = node1 + 3 + 16;
    let mut bad = bytes.clone();
    bad[op_byte] = 200;
    let err = codec::decode(&bad).unwrap_err();
    assert_eq!(err.offset, op_byte as u64, "{err}");
    assert!(err.to_string().contains("invalid unary op 200"), "{err}");

    // A node count claiming 4 billion nodes is refused without allocating.
    let mut huge = bytes.clone();
    huge[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = codec::decode(&huge).unwrap_err();
    assert_eq!(err.offset, 10);
    assert!(matches!(err.kind, codec::DecodeErrorKind::TooMany { .. }));

    // A rule violation is reported at the offending node's offset.
    let mut wrong_ty = bytes.clone();
    wrong_ty[node1 + 3 + 8] = 9; // exp's declared second dim: 3 -> 9
    let err = codec::decode(&wrong_ty).unwrap_err();
    assert_eq!(err.offset, node1 as u64, "{err}");
    assert!(
        err.to_string()
            .contains("node %1 (exp): declared type f32[2,9]"),
        "{err}"
    );
}

#[test]
fn limits_are_enforced() {
    let limits = Limits {
        max_nodes: 2,
        ..Limits::default()
    };
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[2]);
    let e = a.exp().exp();
    let graph = g.finish(&[("e", &e)]).unwrap();
    let err = codec::decode_with_limits(&graph.to_bytes(), &limits).unwrap_err();
    assert!(
        matches!(
            err.kind,
            codec::DecodeErrorKind::TooMany {
                what: "node count",
                ..
            }
        ),
        "{err}"
    );
    let err = text::parse_with_limits(&text::print(&graph), &limits).unwrap_err();
    assert!(err.message.contains("more than 2 nodes"), "{err}");

    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[1 << 41]);
    assert!(
        g.finish(&[("a", &a)])
            .unwrap_err()
            .to_string()
            .contains("above the limit")
    );
}

#[test]
fn window_arithmetic_cannot_overflow() {
    let src = "tenet graph v1\n%0 = input(\"x\") : f32[1,1,4,4]\n%1 = input(\"w\") : f32[1,1,1099511627776,1]\n%2 = conv2d(%0, %1, stride=[1, 1], padding=[0, 0, 0, 0], dilation=[4294967295, 1], groups=1) : f32[1,1,1,4]\noutput \"y\" = %2\n";
    let e = text::parse(src).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.contains("overflows"), "{e}");
}
