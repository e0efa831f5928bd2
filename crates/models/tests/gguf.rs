//! The GGUF reader on the real SmolLM2 file (against gguf-py's dequantised values in
//! tests/fixtures/smollm2_dequant.json) and on hostile bytes.

use std::path::Path;

use tenet_models::fetch::{SMOLLM2, find_file};
use tenet_models::gguf::{GgmlType, GgufFile, Value};

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
            }
        }
    }
    // Counts that claim more than the file holds are refused up front.
    let mut huge = good.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::parse(huge).err().unwrap().to_string();
    assert!(e.contains("byte 8") && e.contains("cannot fit"), "{e}");
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
            count(GgmlType::Q4_1),
            count(GgmlType::Q8_0),
            count(GgmlType::F32)
        ),
        (210, 1, 61)
    );
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
