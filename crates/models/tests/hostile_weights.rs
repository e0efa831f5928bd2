//! Weights files built to amplify (issue 29): GGUF tensors that share bytes, metadata arrays of
//! tiny elements, files whose dequantised size passes the caller's memory limit, and the
//! safetensors equivalents. Each is refused before the memory is taken, with an error that says
//! what and how much.

use tenet_ir::WeightsId;
use tenet_models::gguf::{GgufError, GgufFile, header_memory_limit};
use tenet_models::{SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE, WeightsError, WeightsFile};

#[path = "common/weights_build.rs"]
mod build;

use build::{F32, Gguf, Q4_1, q4_1_blocks};

/// Blocks of Q4_1 in about 1 MB.
const MB_OF_BLOCKS: usize = (1 << 20) / build::Q4_1_BLOCK;

#[test]
fn three_thousand_q4_1_tensors_over_one_megabyte_are_refused_by_name() {
    let bomb = build::q4_1_bomb(3000, MB_OF_BLOCKS);
    assert!(bomb.len() < 1_300_000, "{} bytes", bomb.len());
    // What it would have cost: ~20 GB of f32 from a ~1 MB file.
    let claimed = 3000 * MB_OF_BLOCKS as u64 * 32 * 4;
    assert!(claimed > 19_000_000_000);
    let e = GgufFile::parse(bomb.clone()).err().expect("refused");
    let text = e.to_string();
    assert!(matches!(e, GgufError::Malformed { .. }), "{e:?}");
    assert!(
        text.contains("\"blk.1.w\": its data (bytes")
            && text.contains("overlaps tensor \"blk.0.w\"'s"),
        "{text}"
    );
    // As weights, under a node's 2 GiB, then under the default (only once the first refusal
    // is known to be the overlap, since the default may be more than 20 GB): refused, never
    // dequantised.
    let check = |e: WeightsError| {
        let text = e.to_string();
        assert!(matches!(e, WeightsError::Gguf { .. }), "{e:?}");
        assert!(
            text.contains("bomb.gguf is not a usable GGUF file") && text.contains("overlaps"),
            "{text}"
        );
    };
    check(WeightsFile::from_bytes_within(bomb.clone(), "bomb.gguf", 2 << 30).unwrap_err());
    check(WeightsFile::from_bytes(bomb, "bomb.gguf").unwrap_err());
}

#[test]
fn overlap_is_refused_in_any_order_and_disjoint_tensors_may_come_in_any_order() {
    // "late" is listed first, its data after "early"'s; the two share 8 bytes.
    let mut g = Gguf::new();
    let at = g.data(&q4_1_blocks(4));
    g.tensor("late", &[64], Q4_1, at + 32);
    g.tensor("early", &[64], Q4_1, at);
    let e = GgufFile::parse(g.finish())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("tensor \"late\": its data") && e.contains("overlaps tensor \"early\"'s"),
        "{e}"
    );
    // Disjoint, listed in descending order of offset: accepted, each with its own values.
    let mut g = Gguf::new();
    let a = g.data(&[1.0f32, 2.0].map(f32::to_le_bytes).concat());
    let b = g.data(&[3.0f32, 4.0, 5.0].map(f32::to_le_bytes).concat());
    g.tensor("b", &[3], F32, b);
    g.tensor("a", &[2], F32, a);
    let file = WeightsFile::from_bytes_within(g.finish(), "ordered.gguf", 1 << 20).unwrap();
    assert_eq!(file.tensor("a").unwrap().to_f32_vec(), vec![1.0, 2.0]);
    assert_eq!(file.tensor("b").unwrap().to_f32_vec(), vec![3.0, 4.0, 5.0]);
    // Empty tensors share nothing, wherever they point.
    let mut g = Gguf::new();
    let at = g.data(&[0; 8]);
    g.tensor("e1", &[0], F32, at);
    g.tensor("e2", &[0, 5], F32, at);
    g.tensor("x", &[2], F32, at);
    assert_eq!(GgufFile::parse(g.finish()).unwrap().tensors.len(), 3);
}

#[test]
fn a_metadata_array_of_tiny_elements_is_refused_by_the_header_limit() {
    // 1 MiB of one-byte elements would decode to 32 MiB of values.
    let bomb = build::metadata_bomb(1 << 20);
    let limit = header_memory_limit(bomb.len() as u64);
    assert!(limit < 10 << 20);
    let e = GgufFile::parse(bomb.clone()).err().expect("refused");
    match &e {
        GgufError::HeaderTooLarge {
            offset,
            needs,
            limit: l,
            ..
        } => {
            assert_eq!(*l, limit);
            assert!(*needs > limit);
            assert!(*offset < 64, "at the array, before its elements: {offset}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("a metadata array"), "{e}");
    let e = WeightsFile::from_bytes(bomb, "meta.gguf")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("meta.gguf is not a usable GGUF file") && e.contains("header"),
        "{e}"
    );
    // A tokenizer-sized array of strings is far inside the limit, and is charged what it takes.
    let mut g = Gguf::new();
    g.meta_array("tokenizer.ggml.tokens", 8, 50_000, &{
        let mut v = 5u64.to_le_bytes().to_vec();
        v.extend(b"token");
        v
    });
    let file = GgufFile::parse(g.finish()).unwrap();
    let charged = file.header_bytes();
    assert!(
        (50_000 * 37..50_000 * 64).contains(&charged),
        "{charged} for 50,000 five-byte strings"
    );
}

#[test]
fn the_header_limit_is_the_lower_of_the_format_limit_and_the_callers() {
    // 5,000 one-byte elements: 160 KB decoded, inside the format's limit but not 64 KiB.
    let bomb = build::metadata_bomb(5000);
    assert!(GgufFile::parse(bomb.clone()).is_ok());
    let e = WeightsFile::from_bytes_within(bomb, "meta.gguf", 64 << 10).unwrap_err();
    match &e {
        WeightsError::OverBudget { path, needs, limit } => {
            assert_eq!((path.as_str(), *limit), ("meta.gguf", 64 << 10));
            assert!(*needs > *limit);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_dequantised_size_is_refused_over_the_limit_before_anything_is_dequantised() {
    // Four disjoint tensors of 512 Q4_1 blocks: 40 KiB of data, 256 KiB of f32.
    let file = build::q4_1_disjoint(4, 512);
    let f32_bytes = 4 * 512 * 32 * 4;
    let e = WeightsFile::from_bytes_within(file.clone(), "big.gguf", 200 << 10).unwrap_err();
    let text = e.to_string();
    match &e {
        WeightsError::OverBudget { path, needs, limit } => {
            assert_eq!((path.as_str(), *limit), ("big.gguf", 200 << 10));
            assert!(*needs >= f32_bytes, "{needs}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        text.contains("weights file big.gguf would take at least")
            && text.contains("above the limit of 204800 bytes")
            && text.contains("--memory-limit"),
        "{text}"
    );
    // Within a limit that holds it: loaded, charged at least what the tensors hold.
    let loaded = WeightsFile::from_bytes_within(file.clone(), "big.gguf", 1 << 20).unwrap();
    assert_eq!(loaded.id, WeightsId::of_bytes(&file));
    let held: u64 = (0..4)
        .map(|i| loaded.tensor(&format!("blk.{i}.w")).unwrap().bytes().len() as u64)
        .sum();
    assert_eq!(held, f32_bytes);
    assert!((f32_bytes..=1 << 20).contains(&loaded.resident_bytes()));
}

#[test]
fn dequantisation_keeps_gguf_py_arithmetic() {
    let file = WeightsFile::from_bytes(build::valid_gguf(), "valid.gguf").unwrap();
    let w = file.tensor("w").unwrap();
    assert!(w.is_shared(), "aligned F32 is a view of the file");
    assert_eq!(w.to_f32_vec(), vec![-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]);
    assert_eq!(
        file.tensor("h").unwrap().to_f32_vec(),
        vec![0.0, 0.5, 1.0, 1.5]
    );
    let q8 = file.tensor("q8").unwrap().to_f32_vec();
    assert_eq!((q8[0], q8[31]), (-8.0, 7.5));
    // Q4_1: (d·q) + m, low nibbles of the 16 bytes first, then high nibbles.
    let blocks = q4_1_blocks(2);
    let mut want = Vec::new();
    for b in blocks.chunks(20) {
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let m = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
        want.extend(b[4..].iter().map(|&q| d * (q & 15) as f32 + m));
        want.extend(b[4..].iter().map(|&q| d * (q >> 4) as f32 + m));
    }
    let q4 = file.tensor("q4").unwrap();
    assert_eq!(q4.shape(), &[2, 32]);
    assert_eq!(q4.to_f32_vec(), want);
}

#[test]
fn safetensors_with_shared_bytes_are_refused_by_the_safetensors_crate() {
    // The crate requires offsets that tile the data section in order, so two tensors cannot
    // share bytes and nothing is copied twice; tenet's index checks the same again.
    let e =
        WeightsFile::from_bytes(build::overlapping_safetensors(), "twice.safetensors").unwrap_err();
    assert!(matches!(e, WeightsError::Malformed { .. }), "{e:?}");
    assert!(e.to_string().contains("invalid offset"), "{e}");
}

#[test]
fn a_safetensors_header_is_charged_before_it_is_parsed() {
    // 100,000 dimensions of 1: a 200 KB header that parses into several MB of shapes.
    let bomb = build::shape_bomb_safetensors(100_000);
    let header = u64::from_le_bytes(bomb[..8].try_into().unwrap());
    let charge = header * SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE;
    let e = WeightsFile::from_bytes_within(bomb.clone(), "shape.safetensors", 1 << 20).unwrap_err();
    match &e {
        WeightsError::OverBudget { path, needs, .. } => {
            assert_eq!((path.as_str(), *needs), ("shape.safetensors", charge));
        }
        other => panic!("{other:?}"),
    }
    assert!(WeightsFile::from_bytes_within(bomb.clone(), "shape.safetensors", charge).is_ok());
    // Charged from the declared length alone: the same header cut short of its closing brace
    // is refused for its size, not parsed (which would find it malformed).
    let mut cut = bomb;
    let brace = cut.iter().rposition(|&b| b == b'}').unwrap();
    cut[brace] = b' ';
    let e = WeightsFile::from_bytes_within(cut.clone(), "cut.safetensors", 1 << 20).unwrap_err();
    assert!(matches!(e, WeightsError::OverBudget { .. }), "{e:?}");
    let e = WeightsFile::from_bytes_within(cut, "cut.safetensors", charge).unwrap_err();
    assert!(matches!(e, WeightsError::Malformed { .. }), "{e:?}");
}

#[test]
fn copies_of_misaligned_safetensors_tensors_count_against_the_limit() {
    let file = build::misaligned_safetensors();
    let header = u64::from_le_bytes(file[..8].try_into().unwrap());
    let index = header * SAFETENSORS_INDEX_BYTES_PER_HEADER_BYTE;
    // "b" (8 bytes of f32) sits at an odd address and is copied; "a" (one byte) is a view.
    let e = WeightsFile::from_bytes_within(file.clone(), "odd", index + 7).unwrap_err();
    assert!(
        matches!(e, WeightsError::OverBudget { needs, .. } if needs == index + 8),
        "{e:?}"
    );
    let loaded = WeightsFile::from_bytes_within(file, "odd", index + 8).unwrap();
    assert_eq!(loaded.resident_bytes(), index + 8);
    assert!(!loaded.tensor("b").unwrap().is_shared());
    assert_eq!(loaded.tensor("b").unwrap().to_f32_vec(), vec![1.5, -0.25]);
}

#[test]
fn the_plain_loaders_keep_working_under_the_default_limit() {
    assert!(tenet_models::default_max_resident_bytes() > 0);
    let file = WeightsFile::from_bytes(build::valid_safetensors(), "small").unwrap();
    assert_eq!(file.tensor("ids").unwrap().to_i64_vec(), vec![5, -1]);
    assert!(file.resident_bytes() > 0);
}

#[test]
fn a_tensor_name_or_metadata_key_used_twice_is_refused() {
    // Found by the `decode_safetensors` fuzz target: the second entry replaced the first in
    // the index while the first's tensor stayed, so the index and the tensor disagreed.
    let mut g = Gguf::new();
    let at = g.data(&[0; 32]);
    g.tensor("w", &[2], F32, at);
    g.tensor("w", &[4], 99, at);
    let e = GgufFile::parse(g.finish())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("tensor \"w\" appears twice"), "{e}");
    let mut g = Gguf::new();
    g.meta("k", 4, &1u32.to_le_bytes());
    g.meta("k", 4, &2u32.to_le_bytes());
    let e = GgufFile::parse(g.finish())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("metadata key \"k\" appears twice"), "{e}");
}
