//! Hostile and broken splits: a manifest that does not chain (a stage missing, types that
//! differ, a stage reading what no stage writes), names outside the folder, outputs produced
//! twice or never, and files that do not match the manifest are refused with a message that
//! says what is wrong — never run.

use std::path::{Path, PathBuf};

use tenet_ir::split::SplitTarget;
use tenet_ir::{DType, GraphBuilder, WeightsId};
use tenet_models::{WeightSet, WeightsFile, write_safetensors};
use tenet_pipeline::{Manifest, ManifestError, PipelineError};

/// A three-layer MLP split in three, written to a fresh folder.
fn written(name: &str) -> (PathBuf, Manifest) {
    let mut tensors = Vec::new();
    for (i, (r, c)) in [(8u64, 16u64), (16, 16), (16, 4)].iter().enumerate() {
        let v: Vec<f32> = (0..r * c)
            .map(|j| ((j * 7 + i as u64) % 11) as f32 * 0.1)
            .collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((format!("w{i}"), vec![*r, *c], bytes));
    }
    let list: Vec<(&str, DType, Vec<u64>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, b)| (n.as_str(), DType::F32, s.clone(), b.clone()))
        .collect();
    let bytes = write_safetensors(&list).unwrap();
    let file = WeightsId::of_bytes(&bytes);
    let g = GraphBuilder::new();
    let mut h = g.input("x", DType::F32, &[2, 8]);
    for (n, s, _) in &tensors {
        h = h.matmul(&g.weight(file, n, DType::F32, s)).relu();
    }
    let graph = g.finish(&[("y", &h)]).unwrap();
    let weights = WeightSet(vec![WeightsFile::from_bytes(bytes, "mlp").unwrap()]);
    let dir = std::env::temp_dir().join(format!("tenet-manifest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = tenet_pipeline::write_split(&graph, &weights, SplitTarget::Stages(3), &dir, |_, _| {})
        .unwrap();
    assert_eq!(m.stages.len(), 3);
    (dir, m)
}

fn json(m: &Manifest) -> serde_json::Value {
    serde_json::from_str(&m.to_json()).unwrap()
}

fn parse(v: &serde_json::Value) -> Result<Manifest, ManifestError> {
    Manifest::parse(v.to_string().as_bytes())
}

fn refused(v: &serde_json::Value, says: &str) {
    match parse(v) {
        Ok(_) => panic!("accepted a manifest that should say {says:?}"),
        Err(e) => assert!(e.to_string().contains(says), "{e} (wanted {says:?})"),
    }
}

#[test]
fn the_written_manifest_parses_and_loads() {
    let (dir, m) = written("ok");
    assert_eq!(parse(&json(&m)).unwrap(), m);
    let model = tenet_pipeline::load(&dir).unwrap();
    assert_eq!(model.stages.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn manifests_that_do_not_chain_are_refused() {
    let (dir, m) = written("chain");
    let v = json(&m);
    // A stage missing.
    let mut missing = v.clone();
    missing["stages"].as_array_mut().unwrap().remove(1);
    refused(&missing, "does not chain");
    // A boundary tensor whose type differs between writer and reader.
    let mut types = v.clone();
    types["stages"][1]["boundary_in"][0]["dtype"] = "f16".into();
    refused(&types, "does not chain");
    let mut shapes = v.clone();
    shapes["stages"][0]["boundary_out"][0]["shape"][1] = 17.into();
    refused(&shapes, "does not chain");
    // The order of the stages swapped.
    let mut swapped = v.clone();
    swapped["stages"].as_array_mut().unwrap().swap(1, 2);
    refused(&swapped, "does not chain");
    // A stage that reads what it writes itself (a loop), not what the stage before writes.
    let mut looped = v.clone();
    let out = looped["stages"][1]["boundary_out"].clone();
    looped["stages"][1]["boundary_in"] = out;
    refused(&looped, "does not chain");
    // The last stage writing boundary tensors no stage reads.
    let mut dangling = v.clone();
    let out = dangling["stages"][0]["boundary_out"].clone();
    dangling["stages"][2]["boundary_out"] = out;
    refused(&dangling, "no stage reads");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_outputs_and_sizes_are_checked() {
    let (dir, m) = written("names");
    let v = json(&m);
    for bad in ["../stage-1.tnt", "/etc/passwd", ".hidden", "a/b.tnt", ""] {
        let mut x = v.clone();
        x["stages"][0]["file"] = bad.into();
        refused(&x, "plain name");
        let mut x = v.clone();
        x["stages"][0]["weights"][0]["file"] = bad.into();
        refused(&x, "plain name");
    }
    let mut twice = v.clone();
    twice["stages"][1]["outputs"] = serde_json::json!(["y"]);
    refused(&twice, "produced twice");
    let mut never = v.clone();
    never["stages"][2]["outputs"] = serde_json::json!([]);
    refused(&never, "no stage produces");
    let mut unknown = v.clone();
    unknown["stages"][0]["inputs"] = serde_json::json!(["z"]);
    refused(&unknown, "not an input of the model");
    let mut format = v.clone();
    format["format"] = "tenet-split/9".into();
    refused(&format, "format");
    let mut extra = v.clone();
    extra["stages"][0]["command"] = "rm -rf /".into();
    refused(&extra, "unknown field");
    let mut many = v.clone();
    let stage = many["stages"][0].clone();
    many["stages"] = serde_json::Value::Array(vec![stage; 65]);
    refused(&many, "65 stages");
    let mut none = v.clone();
    none["stages"] = serde_json::json!([]);
    refused(&none, "0 stages");
    let mut hash = v.clone();
    hash["stages"][0]["graph"] = "xyz".into();
    refused(&hash, "hex");
    assert!(matches!(
        Manifest::parse(&vec![b' '; 5 << 20]),
        Err(ManifestError::TooLarge(_))
    ));
    assert!(Manifest::parse(b"{\"format\": ").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

fn load_err(dir: &Path) -> String {
    match tenet_pipeline::load(dir) {
        Ok(_) => panic!("loaded a tampered split"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn files_that_do_not_match_the_manifest_are_refused() {
    let (dir, m) = written("files");
    // A stage graph swapped for another stage's.
    std::fs::copy(dir.join("stage-2.tnt"), dir.join("stage-1.tnt")).unwrap();
    assert!(load_err(&dir).contains("does not match"));
    std::fs::write(dir.join("manifest.json"), m.to_json()).unwrap();
    // Restore it by writing the split again, then change a weights file.
    let (dir, _) = written("files");
    let path = dir.join("stage-2.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    assert!(load_err(&dir).contains("hash"));
    // A manifest whose certificate was edited to fit a smaller node.
    let (dir, m) = written("files");
    let mut v = json(&m);
    v["stages"][0]["peak_bytes"] = 1.into();
    std::fs::write(dir.join("manifest.json"), v.to_string()).unwrap();
    assert!(load_err(&dir).contains("certificate"));
    let err = tenet_pipeline::load(&dir.join("missing")).err().unwrap();
    assert!(matches!(err, PipelineError::Io { .. }));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fuzz corpus (`fuzz/corpus/split_manifest`) and mutations of it, through the checks of
/// `cargo fuzz run split_manifest`: seeds named `refused` are refused, the others accepted;
/// no mutation panics, and whatever is accepted chains.
#[test]
fn the_fuzz_corpus_and_its_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/split_manifest");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 5, "the corpus lost its seeds");
    let chains = |m: &Manifest| {
        m.stages[0].boundary_in.is_empty()
            && m.stages.last().unwrap().boundary_out.is_empty()
            && m.stages
                .windows(2)
                .all(|w| w[0].boundary_out == w[1].boundary_in)
    };
    for (name, bytes) in &seeds {
        let r = Manifest::parse(bytes);
        assert_eq!(r.is_err(), name.contains("refused"), "{name}: {r:?}");
    }
    let iters: u64 = std::env::var("TENET_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..iters {
        let mut bytes = seeds[(i as usize) % seeds.len()].1.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % bytes.len().max(1);
            match next() % 3 {
                0 => bytes[at] = next() as u8,
                1 => {
                    bytes.insert(at, b"0123456789-e.\"[]{},:"[(next() % 20) as usize]);
                }
                _ => {
                    bytes.remove(at);
                }
            }
        }
        if let Ok(m) = Manifest::parse(&bytes) {
            assert!(
                chains(&m),
                "mutation {i} accepted a manifest that does not chain"
            );
        }
    }
}
