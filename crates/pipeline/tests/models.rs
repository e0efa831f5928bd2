//! Real models through a split's folder: MiniLM and SmolLM2's prompt pass cut into three
//! stages, written, loaded and run stage by stage on the CPU backend, give the whole graph's
//! outputs bit for bit; each stage needs less memory than the whole and carries only its own
//! weights. Needs the models in the cache (`tenet models fetch minilm smollm2`; `.ci/run` fetches
//! them); without them the tests say they were skipped.

use std::collections::HashMap;
use std::path::PathBuf;

use tenet_ir::split::SplitTarget;
use tenet_ir::{Graph, HostTensor};
use tenet_models::fetch::{MINILM, ModelPackage, SMOLLM2, cached, find_file};
use tenet_models::{WeightSet, WeightsFile};

fn cached_or_skip(pkg: &ModelPackage) -> Option<PathBuf> {
    match cached(pkg) {
        Ok(dir) => Some(dir),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED: {e}");
            None
        }
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenet-split-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Split `graph` in three, write and load the folder, and check it against the whole graph.
fn split_matches_whole(
    name: &str,
    graph: &Graph,
    weights: &WeightSet,
    inputs: &HashMap<String, HostTensor>,
) {
    let dir = temp_dir(name);
    let manifest =
        tenet_pipeline::write_split(graph, weights, SplitTarget::Stages(3), &dir, |_, _| {})
            .unwrap();
    assert_eq!(manifest.stages.len(), 3, "{name}: three stages");
    let whole_peak = graph.cost().peak_bytes;
    let whole_weights = graph.cost().weight_bytes;
    let model = tenet_pipeline::load(&dir).unwrap();
    for (s, stage) in manifest.stages.iter().zip(&model.stages) {
        assert!(
            s.peak_bytes < whole_peak * 3 / 4,
            "{name}: a stage needs {} of the whole's {whole_peak}",
            s.peak_bytes
        );
        // A stage's file holds its own tensors only (and a small header).
        let bytes: u64 = s.weights.iter().map(|w| w.bytes).sum();
        let own = stage.graph.cost().weight_bytes;
        assert!(
            bytes >= own && bytes < own + (1 << 20) && own < whole_weights,
            "{name}: stage weights file {bytes}, its tensors {own}, the whole's {whole_weights}"
        );
    }
    let device = tenet_devices::open("cpu", &Default::default()).unwrap();
    let whole = device
        .compile(graph)
        .unwrap()
        .run(inputs, weights, 0)
        .unwrap();
    let staged = tenet_pipeline::run_stages(&model, device.as_ref(), inputs, 0).unwrap();
    assert_eq!(whole.len(), staged.len());
    for ((n, a), (m, b)) in whole.iter().zip(&staged) {
        assert_eq!(n, m);
        assert!(a.bytes() == b.bytes(), "{name}: output {n} differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn minilm_in_three_stages_is_bit_identical() {
    let Some(dir) = cached_or_skip(&MINILM) else {
        return;
    };
    let m = tenet_models::minilm::MiniLm::load(&dir).unwrap();
    let batch = m
        .tokenize(&["a pipeline of stages", "each on a machine of its own"])
        .unwrap();
    let graph = m.graph(2, batch.seq).unwrap();
    let inputs = tenet_models::minilm::MiniLm::inputs(&batch);
    split_matches_whole("minilm", &graph, &m.weights, &inputs);
}

#[test]
fn smollm2_prompt_in_three_stages_is_bit_identical() {
    let Some(dir) = cached_or_skip(&SMOLLM2) else {
        return;
    };
    let gguf = find_file(&dir, tenet_models::smollm2::GGUF_FILE).unwrap();
    let weights = WeightSet(vec![WeightsFile::open(&gguf).unwrap()]);
    let m = tenet_models::smollm2::SmolLm2::load(&gguf).unwrap();
    let ids = m.encode("The capital of France is").unwrap();
    let n = ids.len() as u64;
    let graph =
        tenet_models::smollm2::llama_graph(&m.config, weights.0[0].id, 0, n, false).unwrap();
    let tokens: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let inputs: HashMap<String, HostTensor> = graph
        .inputs()
        .map(|(_, name, ty)| {
            assert_eq!(ty.shape, vec![n], "input {name}");
            (
                name.to_string(),
                HostTensor::from_i64(&[n], &tokens).unwrap(),
            )
        })
        .collect();
    split_matches_whole("smollm2", &graph, &weights, &inputs);
}
