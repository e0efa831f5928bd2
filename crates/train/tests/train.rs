//! Training end to end on the digits (skipped, saying so, when `tenet models fetch digits` has
//! not run): the accuracy goal, the same weights at every thread count and SIMD level, resuming
//! from a checkpoint continuing the same trajectory, the shards' halves of a step equal to the
//! whole step bit for bit, and checkpoints refusing what they must.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tenet_devices::{Options, SimdLevel};
use tenet_exec::Device;
use tenet_ir::{HostTensor, NoWeights};
use tenet_train::{
    Arch, Checkpoint, CheckpointError, Dataset, Optimizer, StepSpec, TrainConfig, TrainReport,
    data, train,
};

fn digits() -> Option<Dataset> {
    match data::load("digits") {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenet-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(name: &str, epochs: u32) -> TrainConfig {
    TrainConfig {
        model: Arch::Mlp.into(),
        optimizer: Optimizer::adamw(5e-4),
        seed: 7,
        epochs,
        batch: 32,
        shards: 1,
        eval_rows: 100,
        out_dir: out_dir(name),
    }
}

fn cpu(threads: usize, simd: Option<&str>) -> Arc<dyn Device> {
    let level = simd.map(|name| match name {
        "portable" => SimdLevel::Portable,
        "avx2" => SimdLevel::Avx2,
        other => panic!("{other}"),
    });
    let options = Options {
        threads: Some(threads),
        simd: level,
        ..Default::default()
    };
    tenet_devices::open("cpu", &options).expect("the CPU device")
}

fn run(cfg: &TrainConfig, data: &Dataset, device: &dyn Device) -> TrainReport {
    train(cfg, data, device, None, &mut |_| {}).expect("training runs")
}

#[test]
fn the_mlp_reaches_97_percent_on_the_digits() {
    let Some(data) = digits() else { return };
    let cfg = config("goal", 40);
    let mut epochs = 0;
    let report = train(&cfg, &data, cpu(2, None).as_ref(), None, &mut |e| {
        if let tenet_train::Event::Epoch { .. } = e {
            epochs += 1;
        }
    })
    .unwrap();
    assert_eq!(epochs, 40);
    assert_eq!(report.steps, 40 * (1438 / 32));
    assert!(
        report.test_accuracy >= 0.97,
        "test accuracy {} below the goal",
        report.test_accuracy
    );
    assert!(report.final_loss.is_finite() && report.final_loss < 0.5);
    // The curve files hold every step.
    let csv = std::fs::read_to_string(&report.curve_csv).unwrap();
    assert_eq!(csv.lines().count() as u64, report.steps + 1);
    let svg = std::fs::read_to_string(&report.curve_svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    // The weights file is what the hash names.
    let weights = std::fs::read(&report.weights).unwrap();
    assert_eq!(
        blake3::hash(&weights).to_hex().to_string(),
        report.weights_hash
    );
    let _ = std::fs::remove_dir_all(&cfg.out_dir);
}

#[test]
fn same_seed_same_weights_at_every_thread_count_and_simd_level() {
    let Some(data) = digits() else { return };
    let cfg = config("determinism", 2);
    let reference = run(&cfg, &data, cpu(2, None).as_ref());
    let mut levels = vec![None, Some("portable")];
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        levels.push(Some("avx2"));
    }
    for (threads, simd) in [
        (1, None),
        (2, Some("portable")),
        (1, levels[levels.len() - 1]),
    ] {
        let r = run(&cfg, &data, cpu(threads, simd).as_ref());
        assert_eq!(
            r.weights_hash, reference.weights_hash,
            "{threads} threads, SIMD {simd:?}"
        );
        assert_eq!(r.final_loss.to_bits(), reference.final_loss.to_bits());
    }
    // Another seed is another run.
    let other = run(
        &TrainConfig {
            seed: 8,
            ..cfg.clone()
        },
        &data,
        cpu(2, None).as_ref(),
    );
    assert_ne!(other.weights_hash, reference.weights_hash);
    let _ = std::fs::remove_dir_all(&cfg.out_dir);
}

#[test]
fn resuming_continues_the_same_trajectory() {
    let Some(data) = digits() else { return };
    let device = cpu(2, None);
    let straight = run(&config("straight", 3), &data, device.as_ref());

    let first = config("resumed", 1);
    let part = run(&first, &data, device.as_ref());
    let ck = Checkpoint::load(&part.checkpoint).unwrap();
    assert_eq!(ck.meta.step, 1438 / 32);
    let rest = TrainConfig {
        epochs: 3,
        ..first.clone()
    };
    let resumed = train(&rest, &data, device.as_ref(), Some(&ck), &mut |_| {}).unwrap();
    assert_eq!(resumed.weights_hash, straight.weights_hash);
    assert_eq!(resumed.steps, straight.steps);
    // The history came along: the curve is the whole run's.
    let csv = std::fs::read_to_string(&resumed.curve_csv).unwrap();
    assert_eq!(csv, std::fs::read_to_string(&straight.curve_csv).unwrap());

    // A checkpoint is found by a prefix of its hash.
    let name = part.checkpoint.file_stem().unwrap().to_str().unwrap();
    let found = Checkpoint::find(&name[..10], part.checkpoint.parent().unwrap()).unwrap();
    assert_eq!(found, part.checkpoint);

    // A different setting is refused, naming it.
    let other = TrainConfig {
        batch: 64,
        ..rest.clone()
    };
    let err = train(&other, &data, device.as_ref(), Some(&ck), &mut |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("batch 32, this run asks for 64"),
        "{err}"
    );

    // A changed byte is caught by the name.
    let mut bytes = std::fs::read(&part.checkpoint).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let tampered = first
        .out_dir
        .join("checkpoints")
        .join(part.checkpoint.file_name().unwrap());
    std::fs::write(&tampered, &bytes).unwrap();
    assert!(matches!(
        Checkpoint::load(&tampered),
        Err(CheckpointError::Tampered { .. })
    ));
    let _ = std::fs::remove_dir_all(&first.out_dir);
    let _ = std::fs::remove_dir_all(config("straight", 3).out_dir);
}

/// The basis of data-parallel training: each shard's graph, then the update graph on their
/// gradients in shard order, give the one-graph step's outputs bit for bit.
#[test]
fn a_step_equals_its_shards_then_the_update() {
    for arch in [Arch::Mlp, Arch::Cnn] {
        let model = tenet_train::Model::new(arch, &[1, 8, 8], 10);
        let spec = StepSpec {
            model: model.clone(),
            optimizer: Optimizer::adamw(1e-3),
            batch: 12,
            shards: 3,
        };
        let device = cpu(2, None);
        let init = device
            .compile(&tenet_train::step::init_graph(&model).unwrap())
            .unwrap();
        let params = init.run(&HashMap::new(), &NoWeights, 5).unwrap();
        let mut inputs: HashMap<String, HostTensor> = params.into_iter().collect();
        for p in model.params() {
            for slot in ["m", "v"] {
                let n = p.shape.iter().product::<u64>() as usize;
                let vals: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 1e-3).collect();
                inputs.insert(
                    format!("state/{}/{slot}", p.name),
                    HostTensor::from_f32(&p.shape, &vals).unwrap(),
                );
            }
        }
        let x: Vec<f32> = (0..12 * 64)
            .map(|i| ((i * 37) % 17) as f32 / 17.0)
            .collect();
        let y: Vec<i64> = (0..12).map(|i| (i * 3) % 10).collect();
        let step_t = HostTensor::from_f32(&[], &[4.0]).unwrap();

        let mut whole_in = inputs.clone();
        whole_in.insert(
            "x".into(),
            HostTensor::from_f32(&[12, 1, 8, 8], &x).unwrap(),
        );
        whole_in.insert("y".into(), HostTensor::from_i64(&[12], &y).unwrap());
        whole_in.insert("step".into(), step_t.clone());
        let whole: HashMap<String, HostTensor> = device
            .compile(&spec.step().unwrap())
            .unwrap()
            .run(&whole_in, &NoWeights, 0)
            .unwrap()
            .into_iter()
            .collect();

        let shard = device.compile(&spec.shard().unwrap()).unwrap();
        let mut update_in = inputs.clone();
        update_in.insert("step".into(), step_t);
        let mut loss = 0f32;
        for s in 0..3 {
            let mut sin: HashMap<String, HostTensor> = inputs
                .iter()
                .filter(|(k, _)| k.starts_with("param/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let rows = s * 4..(s + 1) * 4;
            sin.insert(
                "x".into(),
                HostTensor::from_f32(&[4, 1, 8, 8], &x[rows.start * 64..rows.end * 64]).unwrap(),
            );
            sin.insert("y".into(), HostTensor::from_i64(&[4], &y[rows]).unwrap());
            for (name, t) in shard.run(&sin, &NoWeights, 0).unwrap() {
                if let Some(p) = name.strip_prefix("grad/") {
                    update_in.insert(format!("grad{s}/{p}"), t);
                } else if name == "loss" {
                    loss = if s == 0 {
                        t.get_f32(0)
                    } else {
                        loss + t.get_f32(0)
                    };
                }
            }
        }
        let updated = device
            .compile(&spec.update().unwrap())
            .unwrap()
            .run(&update_in, &NoWeights, 0)
            .unwrap();
        assert!(!updated.is_empty());
        for (name, t) in updated {
            assert_eq!(t.bytes(), whole[&name].bytes(), "{arch:?}: {name}");
        }
        assert_eq!(loss.to_bits(), whole["loss"].get_f32(0).to_bits());
        // And it changed something.
        assert_ne!(
            whole["param/fc2.bias"].bytes(),
            inputs["param/fc2.bias"].bytes()
        );
    }
}

/// A shard's graph cut into pipeline stages at layer boundaries computes the shard's outputs
/// bit for bit, run stage after stage; each layer group's gradients leave at the stage that
/// computes them (the last group's in the middle stage, with the loss; the first group's last).
#[test]
fn a_shard_cut_into_stages_equals_the_shard() {
    for (arch, boundaries, first_group) in [
        (Arch::Mlp, vec!["fc2"], "fc1"),
        (Arch::Cnn, vec!["conv2", "7"], "conv1"),
    ] {
        let model = tenet_train::Model::new(arch, &[1, 8, 8], 10);
        let spec = StepSpec {
            model: model.clone(),
            optimizer: Optimizer::sgd(0.1),
            batch: 6,
            shards: 2,
        };
        let names: Vec<String> = boundaries.iter().map(|b| b.to_string()).collect();
        let starts = spec.stage_starts(&names).unwrap();
        let stages = spec.shard_stages(&starts).unwrap();
        assert_eq!(stages.len(), 2 * boundaries.len() + 1, "{arch:?}");
        let device = cpu(2, None);
        let init = device
            .compile(&tenet_train::step::init_graph(&model).unwrap())
            .unwrap();
        let mut inputs: HashMap<String, HostTensor> = init
            .run(&HashMap::new(), &NoWeights, 9)
            .unwrap()
            .into_iter()
            .collect();
        let x: Vec<f32> = (0..3 * 64).map(|i| ((i * 13) % 11) as f32 / 11.0).collect();
        inputs.insert("x".into(), HostTensor::from_f32(&[3, 1, 8, 8], &x).unwrap());
        inputs.insert("y".into(), HostTensor::from_i64(&[3], &[4, 0, 9]).unwrap());
        let whole = device
            .compile(&spec.shard().unwrap())
            .unwrap()
            .run(&inputs, &NoWeights, 0)
            .unwrap();

        let mut carried: HashMap<String, HostTensor> = HashMap::new();
        let mut got: HashMap<String, (usize, HostTensor)> = HashMap::new();
        for (k, stage) in stages.iter().enumerate() {
            let mut stage_in = std::mem::take(&mut carried);
            for name in &stage.inputs {
                stage_in.insert(name.clone(), inputs[name].clone());
            }
            let out = device
                .compile(&stage.graph)
                .unwrap()
                .run(&stage_in, &NoWeights, 0)
                .unwrap();
            for (name, t) in out {
                if stage.boundary_out.contains(&name) {
                    carried.insert(name, t);
                } else {
                    got.insert(name, (k, t));
                }
            }
        }
        assert_eq!(got.len(), whole.len());
        for (name, t) in &whole {
            assert_eq!(got[name].1.bytes(), t.bytes(), "{arch:?}: {name}");
        }
        let middle = boundaries.len();
        assert_eq!(got["loss"].0, middle, "{arch:?}: the loss");
        assert_eq!(got["grad/fc2.weight"].0, middle, "{arch:?}");
        let first = format!("grad/{first_group}.weight");
        assert_eq!(got[&first].0, stages.len() - 1, "{arch:?}");
        // The first stage runs only the first group's forward pass: it reads no later weights.
        assert!(
            stages[0].inputs.iter().all(|i| !i.contains("fc2")),
            "{arch:?}: {:?}",
            stages[0].inputs
        );
    }

    let spec = StepSpec {
        model: tenet_train::Model::new(Arch::Mlp, &[1, 8, 8], 10),
        optimizer: Optimizer::sgd(0.1),
        batch: 4,
        shards: 1,
    };
    for (boundaries, want) in [
        (
            vec!["fc9"],
            "\"fc9\" is not a layer of mlp-1x8x8-10 (layers: 0 flatten, 1 fc1, 2 relu, 3 fc2)",
        ),
        (vec!["0"], "is the first layer"),
        (vec!["fc2", "fc1"], "list the layers in order"),
        (vec!["fc1", "1"], "list the layers in order"),
    ] {
        let names: Vec<String> = boundaries.iter().map(|b| b.to_string()).collect();
        let err = spec.stage_starts(&names).unwrap_err().to_string();
        assert!(err.contains(want), "{boundaries:?}: {err}");
    }
}

#[test]
fn mistakes_in_the_spec_are_named() {
    let model = tenet_train::Model::new(Arch::Mlp, &[1, 8, 8], 10);
    let spec = StepSpec {
        model,
        optimizer: Optimizer::sgd(0.1),
        batch: 10,
        shards: 3,
    };
    let err = spec.step().unwrap_err();
    assert!(
        err.to_string().contains("10 rows cannot be cut into 3"),
        "{err}"
    );
    let err = Checkpoint::find("nothing-like-a-hash", &out_dir("none")).unwrap_err();
    assert!(err.to_string().contains("8+ characters"), "{err}");
}

/// A model of the caller's own layers trains like a bundled one, and layers whose shapes do not
/// flow are refused by name before anything runs.
#[test]
fn custom_layers_train_and_bad_ones_are_named() {
    use tenet_train::{Layer, Model, ModelSpec};
    let Some(data) = digits() else { return };
    let layers = vec![
        Layer::Conv2d {
            name: "c".into(),
            channels: 8,
            kernel: 3,
            padding: 1,
        },
        Layer::Relu,
        Layer::MaxPool2d { size: 2 },
        Layer::Flatten,
        Layer::Linear {
            name: "out".into(),
            outputs: 10,
        },
    ];
    let cfg = TrainConfig {
        model: ModelSpec::Layers {
            name: "tiny".into(),
            layers: layers.clone(),
        },
        optimizer: Optimizer::adamw(3e-3),
        ..config("custom", 4)
    };
    let r = run(&cfg, &data, cpu(2, None).as_ref());
    assert!(r.model.starts_with("tiny-1x8x8-10"), "{}", r.model);
    assert!(r.test_accuracy > 0.8, "{}", r.test_accuracy);
    let m = Model::from_layers("tiny", layers, &[1, 8, 8], 10).unwrap();
    let names: Vec<String> = m.params().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["c.weight", "c.bias", "out.weight", "out.bias"]);
    for (layers, want) in [
        (
            vec![Layer::Linear {
                name: "out".into(),
                outputs: 10,
            }],
            "flatten first",
        ),
        (
            vec![Layer::Flatten],
            "end with a linear layer of 10 outputs",
        ),
        (vec![Layer::MaxPool2d { size: 9 }], "does not fit"),
    ] {
        let e = Model::from_layers("bad", layers, &[1, 8, 8], 10).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
    // A bundled model on samples too small for it is refused, not run.
    let e = ModelSpec::Bundled(Arch::Cnn)
        .fit(&[1, 2, 2], 10)
        .unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    let _ = std::fs::remove_dir_all(&cfg.out_dir);
}
