//! The GGUF reader on the real SmolLM2 file (against gguf-py's dequantised values in
//! tests/fixtures/smollm2_dequant.json) and on hostile bytes.

use std::path::Path;

use tenet_ir::{DType, QuantFormat};
use tenet_models::fetch::{SMOLLM2, find_file};
use tenet_models::gguf::{GgmlType, GgufError, GgufFile, GgufTensor, Value};
use tenet_reference::quant;

#[path = "common/weights_build.rs"]
mod build;
mod common;

/// A small valid GGUF: two metadata entries, one F32 tensor [2, 3] and one Q8_0 tensor [32].
fn synthetic() -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(2u64.to_le_bytes()); // tensors
    b.extend(2u64.to_le_bytes()); // metadata
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    };
    s(&mut b, "llama.block_count");
    b.extend(4u32.to_le_bytes());
    b.extend(30u32.to_le_bytes());
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    s(&mut b, "a");
    s(&mut b, "bc");
    // tensor infos
    s(&mut b, "w");
    b.extend(2u32.to_le_bytes());
    b.extend(3u64.to_le_bytes()); // innermost first
    b.extend(2u64.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    s(&mut b, "q");
    b.extend(1u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    for v in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
        b.extend(v.to_le_bytes());
    }
    b.extend([0u8; 8]); // pad to offset 32
    b.extend(half::f16::from_f32(0.5).to_le_bytes());
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    b
}

#[test]
fn synthetic_file_parses_and_dequantises() {
    let g = GgufFile::parse(synthetic()).unwrap();
    assert_eq!(g.get("llama.block_count").and_then(Value::as_u64), Some(30));
    assert_eq!(
        g.get("tokenizer.ggml.tokens"),
        Some(&Value::Array(vec![
            Value::Str("a".into()),
            Value::Str("bc".into())
        ]))
    );
    let w = g.tensor("w").unwrap();
    assert_eq!((w.shape.clone(), w.kind), (vec![2, 3], GgmlType::F32));
    assert_eq!(
        g.dequantize(w).unwrap().to_f32_vec(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    let q = g.dequantize(g.tensor("q").unwrap()).unwrap().to_f32_vec();
    assert_eq!(q[0], -8.0);
    assert_eq!(q[31], 7.5);
}

#[test]
fn a_gguf_file_serves_as_weights_dequantised_to_f32() {
    use tenet_ir::{DType, WeightSource, WeightsId};
    let bytes = synthetic();
    let file = tenet_models::WeightsFile::from_bytes(bytes.clone(), "synthetic.gguf").unwrap();
    assert_eq!(file.id, WeightsId::of_bytes(&bytes));
    let w = file.tensor("w").unwrap();
    assert_eq!((w.dtype(), w.shape()), (DType::F32, &[2u64, 3][..]));
    assert_eq!(w.to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(file.tensors["q"].safetensors_dtype, "Q8_0");
    let set = tenet_models::WeightSet(vec![file]);
    let q = set.weight(&WeightsId::of_bytes(&bytes), "q").unwrap();
    assert_eq!((q.to_f32_vec()[0], q.to_f32_vec()[31]), (-8.0, 7.5));
    // A broken GGUF is an error that says what it is, not a safetensors complaint.
    let e = tenet_models::WeightsFile::from_bytes(bytes[..40].to_vec(), "cut.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cut.gguf is not a usable GGUF file"), "{e}");
}

#[test]
fn hostile_bytes_are_errors_not_panics() {
    let good = synthetic();
    for cut in 0..good.len() {
        assert!(
            GgufFile::parse(good[..cut].to_vec()).is_err(),
            "truncated at {cut} accepted"
        );
    }
    let mut s = 0x1234_5678_9abc_def0u64;
    for _ in 0..5000 {
        let mut b = good.clone();
        for _ in 0..3 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let at = (s % b.len() as u64) as usize;
            b[at] = (s >> 32) as u8;
        }
        if let Ok(g) = GgufFile::parse(b) {
            for t in &g.tensors {
                let _ = g.dequantize(t);
                let _ = g.blocks(t);
            }
        }
    }
    // Counts that claim more than the file holds are refused up front.
    let mut huge = good.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::parse(huge).err().unwrap().to_string();
    assert!(e.contains("byte 8") && e.contains("cannot fit"), "{e}");
}

/// The values of `blocks` of `format`, by the definition the `dequantize` op uses.
fn values_of(format: QuantFormat, blocks: &[u8]) -> Vec<u32> {
    let mut v = Vec::new();
    quant::dequantize_into(format, blocks, &mut v);
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn q4_0_dequantises_with_gguf_py_arithmetic() {
    let g = GgufFile::parse(build::quantized_gguf()).unwrap();
    let t = g.tensor("q4_0").unwrap();
    assert_eq!((t.kind, t.shape.clone()), (GgmlType::Q4_0, vec![2, 64]));
    assert_eq!(t.range.len(), 4 * 18);
    assert_eq!(t.kind.format(), Some(QuantFormat::Q4_0));
    let v = g.dequantize(t).unwrap();
    assert_eq!((v.dtype(), v.shape()), (DType::F32, &[2u64, 64][..]));
    let v = v.to_f32_vec();
    // Block i, element e < 16: ((i + e) % 16 - 8) / 4; element e + 16: (15 - e - 8) / 4.
    for i in 0..4 {
        for e in 0..16 {
            let lo = ((i + e) % 16) as f32 - 8.0;
            let hi = (15 - e) as f32 - 8.0;
            assert_eq!(v[i * 32 + e], lo * 0.25, "block {i} element {e}");
            assert_eq!(
                v[i * 32 + e + 16],
                hi * 0.25,
                "block {i} element {}",
                e + 16
            );
        }
    }
    // As weights: listed as Q4_0, dequantised to f32.
    let file = tenet_models::WeightsFile::from_bytes(build::quantized_gguf(), "q.gguf").unwrap();
    assert_eq!(file.tensors["q4_0"].safetensors_dtype, "Q4_0");
    assert_eq!(file.tensor("q4_0").unwrap().to_f32_vec(), v);
}

/// Quantised tensors lent as they are: u8 [..., rows, cols/32, block_bytes] views of the file
/// whose values, by the `dequantize` op's definition, are the tensor's dequantised values.
#[test]
fn quantized_tensors_are_lent_as_views_of_their_blocks() {
    let bytes = build::quantized_gguf();
    let g = GgufFile::parse(bytes.clone()).unwrap();
    for (name, format, shape) in [
        ("q4_0", QuantFormat::Q4_0, vec![2, 2, 18]),
        ("q4_1", QuantFormat::Q4_1, vec![3, 1, 20]),
        ("q8_0", QuantFormat::Q8_0, vec![2, 1, 34]),
        ("q8_0_3d", QuantFormat::Q8_0, vec![2, 1, 1, 34]),
        ("empty", QuantFormat::Q4_0, vec![0, 1, 18]),
    ] {
        let t = g.tensor(name).unwrap();
        let (view, f) = g.blocks(t).unwrap();
        assert_eq!(f, format, "{name}");
        assert_eq!(
            (view.dtype(), view.shape()),
            (DType::U8, &shape[..]),
            "{name}"
        );
        assert!(view.is_shared(), "{name} is a view of the file, not a copy");
        assert_eq!(view.bytes(), &bytes[t.range.clone()], "{name}");
        let want: Vec<u32> = g
            .dequantize(t)
            .unwrap()
            .to_f32_vec()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(values_of(format, view.bytes()), want, "{name}");
    }
    let refused = |name: &str| g.blocks(g.tensor(name).unwrap()).unwrap_err().to_string();
    let e = refused("norm");
    assert!(
        e.contains("\"norm\"") && e.contains("not block-quantised"),
        "{e}"
    );
    let e = refused("straddling");
    assert!(
        e.contains("\"straddling\"") && e.contains("not a multiple of the 32"),
        "{e}"
    );
    // Its blocks still dequantise as a whole.
    assert_eq!(
        g.dequantize(g.tensor("straddling").unwrap())
            .unwrap()
            .shape(),
        &[2, 48]
    );
}

/// An index entry made up by the caller (the fields are public) is checked against the file
/// and its shape, never trusted.
#[test]
fn blocks_of_a_made_up_tensor_are_refused_with_its_name() {
    let g = GgufFile::parse(build::quantized_gguf()).unwrap();
    let real = g.tensor("q4_1").unwrap().clone();
    let len = g.tensor("straddling").unwrap().range.end;
    let cases = [
        // Past the end of the file.
        GgufTensor {
            range: len..len + 60,
            ..real.clone()
        },
        // Fewer bytes than the shape takes.
        GgufTensor {
            range: real.range.start..real.range.end - 1,
            ..real.clone()
        },
        // A shape whose size overflows.
        GgufTensor {
            shape: vec![u64::MAX, 32],
            ..real.clone()
        },
        // No dimensions.
        GgufTensor {
            shape: vec![],
            ..real.clone()
        },
        // Of a type the reader cannot read.
        GgufTensor {
            kind: GgmlType::Other(12),
            ..real.clone()
        },
    ];
    for (i, t) in cases.iter().enumerate() {
        let GgufTensor { name, .. } = t;
        match g.blocks(t) {
            Err(GgufError::Tensor { name: n, reason }) => {
                assert_eq!(&n, name, "case {i}");
                assert!(!reason.is_empty());
            }
            other => panic!(
                "case {i}: {:?}",
                other.map(|(v, f)| (v.shape().to_vec(), f))
            ),
        }
    }
}

#[test]
fn smollm2_file_matches_gguf_py() {
    let Some(dir) = common::cached_or_skip(&SMOLLM2) else {
        return;
    };
    let path = find_file(&dir, tenet_models::smollm2::GGUF_FILE).expect("the wheel holds the GGUF");
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.tensors.len(), 272);
    let count = |k: GgmlType| g.tensors.iter().filter(|t| t.kind == k).count();
    assert_eq!(
        (
            count(GgmlType::Q4_0),
            count(GgmlType::Q4_1),
            count(GgmlType::Q8_0),
            count(GgmlType::F32)
        ),
        (0, 210, 1, 61)
    );
    // Every quantised tensor is a matrix of whole-block rows, lent as it is.
    for t in g.tensors.iter().filter(|t| t.kind.format().is_some()) {
        let (view, format) = g.blocks(t).unwrap();
        assert_eq!(Some(format), t.kind.format());
        assert_eq!(
            view.shape(),
            &[t.shape[0], t.shape[1] / 32, format.block_bytes()],
            "{}",
            t.name
        );
        assert!(view.is_shared());
    }
    for (key, want) in [
        ("llama.block_count", 30),
        ("llama.embedding_length", 576),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
        ("llama.vocab_size", 49152),
    ] {
        assert_eq!(g.get(key).and_then(Value::as_u64), Some(want), "{key}");
    }
    let fixture_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/smollm2_dequant.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_path).unwrap()).unwrap();
    for (name, want) in fixture.as_object().unwrap() {
        let t = g.dequantize(g.tensor(name).unwrap()).unwrap();
        // The blocks, dequantised by the `dequantize` op's definition, are the same values.
        if let Ok((blocks, format)) = g.blocks(g.tensor(name).unwrap()) {
            let bits: Vec<u32> = t.to_f32_vec().iter().map(|x| x.to_bits()).collect();
            assert!(values_of(format, blocks.bytes()) == bits, "{name}");
        }
        let shape: Vec<u64> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.shape(), &shape[..], "{name}");
        let v = t.to_f32_vec();
        for (i, bits) in want["samples"].as_object().unwrap() {
            let i: usize = i.parse().unwrap();
            assert_eq!(v[i].to_bits() as u64, bits.as_u64().unwrap(), "{name}[{i}]");
        }
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let want_sum = want["sum"].as_f64().unwrap();
        assert!(
            (sum - want_sum).abs() <= 1e-6 * want_sum.abs().max(1.0),
            "{name}: sum {sum} vs {want_sum}"
        );
    }
}
