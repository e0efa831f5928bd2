//! `tenet train` as a user drives it: the JSON report, the same weights hash at another thread
//! count, resuming by a hash prefix, and mistakes named (skipped, saying so, when the digits
//! have not been fetched).

use std::path::Path;
use std::process::{Command, Output};

fn tenet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(args)
        .output()
        .expect("the tenet binary runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "tenet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn fetched() -> bool {
    match tenet_models::fetch::cached(&tenet_models::fetch::DIGITS) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

#[test]
fn train_reports_resumes_and_is_deterministic() {
    if !fetched() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tenet-cli-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = |name: &str| dir.join(name).display().to_string();
    let base = ["train", "--dataset", "digits", "--seed", "3", "--json"];
    let two = |extra: &[&str], o: &str| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend(extra);
        a.extend(["--out", o]);
        json(&tenet(&a))
    };
    let a = two(&["--epochs", "2", "--threads", "2"], &out("a"));
    for key in ["test_accuracy", "final_loss", "steps", "weights_hash"] {
        assert!(!a[key].is_null(), "{key} missing from {a}");
    }
    assert_eq!(a["steps"], 2 * (1438 / 32));
    assert!(a["test_accuracy"].as_f64().unwrap() > 0.8, "{a}");
    let hash = a["weights_hash"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 64);
    assert!(Path::new(a["loss_svg"].as_str().unwrap()).is_file());

    let b = two(&["--epochs", "2", "--threads", "1"], &out("b"));
    assert_eq!(
        b["weights_hash"].as_str().unwrap(),
        hash,
        "thread count changed the weights"
    );

    // One epoch, then resume to two by the checkpoint's hash prefix.
    let c1 = two(&["--epochs", "1"], &out("c"));
    let ck = Path::new(c1["checkpoint"].as_str().unwrap());
    let prefix = &ck.file_stem().unwrap().to_str().unwrap()[..12];
    let c2 = two(&["--epochs", "2", "--resume", prefix], &out("c"));
    assert_eq!(
        c2["weights_hash"].as_str().unwrap(),
        hash,
        "resuming changed the trajectory"
    );

    // Another setting than the checkpoint's is named.
    let wrong = tenet(&[
        "train",
        "--dataset",
        "digits",
        "--seed",
        "4",
        "--epochs",
        "2",
        "--resume",
        prefix,
        "--out",
        &out("c"),
    ]);
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("seed 3, this run asks for 4"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same training on an OpenCL device gives the same weights, bit for bit (required when
/// `TENET_REQUIRE_OPENCL=1`, as `.ci/run` sets with PoCL; skipped, saying so, otherwise).
#[test]
fn training_on_opencl_gives_the_cpu_weights() {
    if !fetched() {
        return;
    }
    let listed: serde_json::Value = json(&tenet(&["devices", "--json"]));
    let found = listed.as_array().unwrap().iter().any(|d| {
        d["spec"].as_str().is_some_and(|s| s.starts_with("opencl")) && d["exact_check"] == "passed"
    });
    let required = std::env::var("TENET_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    assert!(found || !required, "TENET_REQUIRE_OPENCL=1 but: {listed}");
    if !found {
        eprintln!("SKIPPED: no OpenCL device passed its determinism check");
        return;
    }
    let dir = std::env::temp_dir().join(format!("tenet-cli-train-cl-{}", std::process::id()));
    let run = |device: &str| {
        let out = dir.join(device).display().to_string();
        json(&tenet(&[
            "train",
            "--dataset",
            "digits",
            "--seed",
            "3",
            "--epochs",
            "1",
            "--device",
            device,
            "--json",
            "--out",
            &out,
        ]))
    };
    let (cpu, cl) = (run("cpu"), run("opencl"));
    assert_eq!(cl["weights_hash"], cpu["weights_hash"], "{cl}");
    assert_eq!(cl["final_loss"], cpu["final_loss"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mistakes_are_named_before_anything_runs() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["train", "--dataset", "cifar"],
            "unknown dataset \"cifar\"",
        ),
        (
            &["train", "--dataset", "digits", "--model", "resnet"],
            "choose mlp or cnn",
        ),
        (
            &[
                "train",
                "--dataset",
                "digits",
                "--batch",
                "10",
                "--shards",
                "3",
            ],
            "must divide",
        ),
        (&["train", "--dataset", "digits", "--lr=-1"], "positive"),
        (
            &["train", "--dataset", "digits", "--optimizer", "lbfgs"],
            "choose adamw or sgd",
        ),
    ];
    for (args, want) in cases {
        let out = tenet(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

mod common;

/// `tenet train --config FILE --json --out OUT`, the file's text being `yaml`, retried until
/// the network's nodes have joined; its JSON report.
fn train_with_config(dir: &std::path::Path, yaml: &str, out: &str) -> serde_json::Value {
    let config = dir.join("train.yaml");
    std::fs::write(&config, yaml).unwrap();
    json(&common::once_joined(|| {
        tenet(&[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--json",
            "--out",
            out,
        ])
    }))
}

/// The parameters a run wrote to `weights` (its safetensors file), in the model's order.
fn params_of(weights: &str, model: &tenet_train::Model) -> Vec<(String, tenet_ir::HostTensor)> {
    let bytes = std::fs::read(weights).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    model
        .params()
        .into_iter()
        .map(|p| {
            let view = st.tensor(&p.name).unwrap();
            let ty = tenet_ir::TensorType::new(tenet_ir::DType::F32, p.shape.clone());
            (
                p.name,
                tenet_ir::HostTensor::new(ty, view.data().to_vec()).unwrap(),
            )
        })
        .collect()
}

/// Data-parallel training over node processes on 127.0.0.1, configured by a YAML file: each
/// step's three shards and its update are verified jobs; one node lies in every job it gets.
/// The weights are the local run's with the same shards, bit for bit; the liar is slashed; the
/// training receipt verifies offline and a reordered one does not.
#[test]
fn data_parallel_training_over_nodes_matches_local_training() {
    if !fetched() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tenet-cli-dp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).display().to_string();
    let local = json(&tenet(&[
        "train",
        "--dataset",
        "digits",
        "--seed",
        "9",
        "--epochs",
        "1",
        "--batch",
        "30",
        "--shards",
        "3",
        "--json",
        "--out",
        &d("local"),
    ]));

    let network = common::spawn_network(&dir, 2, &[], &[None, None, Some("flip")]);
    let (curl, ckey) = (network.url.clone(), network.key.clone());
    let net = train_with_config(
        &dir,
        &format!(
            "# three shards a step, each a verified job\ndataset: digits\nseed: 9\nepochs: 1\nbatch: 30\ndata_parallel: 3\ncoordinator: {curl}\n"
        ),
        &d("net"),
    );
    assert_eq!(net["verified"], true, "{net}");
    assert_eq!(net["weights_hash"], local["weights_hash"], "{net}");
    assert_eq!(net["steps"], local["steps"]);
    assert_eq!(net["test_accuracy"], local["test_accuracy"]);
    let slashed = net["slashed"].as_array().unwrap();
    assert!(!slashed.is_empty(), "the liar went unnoticed: {net}");
    let liar = &slashed[0]["node"];
    assert!(slashed.iter().all(|s| &s["node"] == liar), "{net}");

    // The receipt, offline: pinned to the coordinator's key; reordered steps do not chain.
    let receipt = net["receipt"].as_str().unwrap();
    let ok = tenet(&["receipt", "verify", receipt, "--coordinator", &ckey]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(receipt).unwrap()).unwrap();
    r["steps"].as_array_mut().unwrap().swap(3, 4);
    let swapped = dir.join("swapped.json");
    std::fs::write(&swapped, r.to_string()).unwrap();
    let bad = tenet(&[
        "receipt",
        "verify",
        swapped.to_str().unwrap(),
        "--coordinator",
        &ckey,
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("does NOT verify") && err.contains("step 4"),
        "{err}"
    );

    // What the caller checks beyond the chain: the graphs, the seed, the batches, the weights.
    let r: tenet_proto::training_receipt::TrainingReceipt =
        serde_json::from_str(&std::fs::read_to_string(receipt).unwrap()).unwrap();
    let key = tenet_proto::auth::PublicKey::parse(&ckey).unwrap();
    let mut data = tenet_train::data::load("digits").unwrap();
    let model = tenet_train::Model::new(tenet_train::Arch::Mlp, &data.sample_shape, 10);
    let spec = tenet_train::StepSpec {
        model: model.clone(),
        optimizer: tenet_train::Optimizer::adamw(5e-4),
        batch: 30,
        shards: 3,
    };
    let mut params = params_of(net["weights"].as_str().unwrap(), &model);
    let check = |spec: &tenet_train::StepSpec,
                 data: &tenet_train::Dataset,
                 seed: u64,
                 params: &[(String, tenet_ir::HostTensor)]| {
        tenet_train::verify::check_run(&r, &key, spec, &[], data, seed, 1, params)
            .map_err(|e| e.to_string())
    };
    check(&spec, &data, 9, &params).unwrap();
    let e = check(&spec, &data, 10, &params).unwrap_err();
    assert!(e.contains("seed 9, not 10"), "{e}");
    let other = tenet_train::StepSpec {
        optimizer: tenet_train::Optimizer::adamw(1e-3),
        ..spec.clone()
    };
    let e = check(&other, &data, 9, &params).unwrap_err();
    assert!(e.contains("update jobs ran graph"), "{e}");
    let mut bytes = params[0].1.bytes().to_vec();
    bytes[0] ^= 1;
    params[0].1 = tenet_ir::HostTensor::new(params[0].1.ty().clone(), bytes).unwrap();
    let e = check(&spec, &data, 9, &params).unwrap_err();
    assert!(e.contains("not what the last job agreed on"), "{e}");
    data.train_x[64 * 5] += 1.0 / 16.0;
    params[0].1 = tenet_ir::HostTensor::new(params[0].1.ty().clone(), {
        let mut b = params[0].1.bytes().to_vec();
        b[0] ^= 1;
        b
    })
    .unwrap();
    let e = check(&spec, &data, 9, &params).unwrap_err();
    assert!(e.contains("is not the batch the seed cuts"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dispute in training, over three node processes: one node lies at one op — the
/// first layer's weight gradient — of one job only (its 6th: a shard of step 2). The other two
/// outvote it; the coordinator's bisection between the majority and the liar walks both traces
/// to that op and re-runs it (the receipt's evidence), the liar is slashed, and training goes
/// on from the agreed result: the final weights are the local run's, and the training receipt
/// holds the dispute's transcript at step 2, naming the op.
#[test]
fn a_liar_at_one_gradient_op_of_one_step_is_found_by_bisection() {
    if !fetched() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tenet-cli-dp-dispute-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).display().to_string();
    let local = json(&tenet(&[
        "train",
        "--dataset",
        "digits",
        "--seed",
        "9",
        "--epochs",
        "1",
        "--batch",
        "30",
        "--shards",
        "3",
        "--json",
        "--out",
        &d("local"),
    ]));
    // The op: the node computing the shard graph's gradient of fc1.weight.
    let spec = tenet_train::StepSpec {
        model: tenet_train::Model::new(tenet_train::Arch::Mlp, &[1, 8, 8], 10),
        optimizer: tenet_train::Optimizer::adamw(5e-4),
        batch: 30,
        shards: 3,
    };
    let shard = spec.shard().unwrap();
    let k = shard
        .outputs()
        .iter()
        .find(|o| o.name == "grad/fc1.weight")
        .unwrap()
        .node
        .0;
    assert_eq!(shard.node(tenet_ir::NodeId(k)).op.name(), "matmul");

    let cheat = format!("op={k}@6");
    let network = common::spawn_network(&dir, 3, &[], &[None, None, Some(cheat.as_str())]);
    let (curl, ckey) = (network.url.clone(), network.key.clone());
    let net = json(&common::once_joined(|| {
        tenet(&[
            "train",
            "--dataset",
            "digits",
            "--seed",
            "9",
            "--epochs",
            "1",
            "--batch",
            "30",
            "--data-parallel",
            "3",
            "--coordinator",
            &curl,
            "--json",
            "--out",
            &d("net"),
        ])
    }));
    assert_eq!(net["weights_hash"], local["weights_hash"], "{net}");
    let disputes = net["disputes"].as_array().unwrap();
    assert_eq!(disputes.len(), 1, "{net}");
    assert_eq!(disputes[0]["step"], 2, "{net}");
    assert_eq!(
        disputes[0]["node"], k,
        "the walk names the op that lied: {net}"
    );
    assert_eq!(disputes[0]["op"], "matmul");
    let slashed = net["slashed"].as_array().unwrap();
    assert_eq!(slashed.len(), 1, "{net}");
    assert_eq!(slashed[0]["step"], 2, "{net}");
    let receipt = net["receipt"].as_str().unwrap();
    let ok = tenet(&["receipt", "verify", receipt, "--coordinator", &ckey]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pipeline-parallel training over three node processes, configured by a YAML file: each step's
/// shard runs as a pipeline of three stages (fc1's forward; fc2's forward, the loss and fc2's
/// backward; fc1's backward), each stage a verified job, then the update. One node lies at one
/// op of one stage job — fc1's weight gradient, in the last stage of step 2 — and only there.
/// The bisection inside that stage names the op, the liar is slashed, and the final weights
/// are those of training on one machine, bit for bit. The receipt verifies offline as a
/// pipelined training, and checking it against other stage boundaries fails.
#[test]
fn pipeline_parallel_training_over_nodes_matches_local_training() {
    if !fetched() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tenet-cli-pp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = |p: &str| dir.join(p).display().to_string();
    let local = json(&tenet(&[
        "train",
        "--dataset",
        "digits",
        "--seed",
        "4",
        "--epochs",
        "1",
        "--batch",
        "30",
        "--json",
        "--out",
        &d("local"),
    ]));
    let spec = tenet_train::StepSpec {
        model: tenet_train::Model::new(tenet_train::Arch::Mlp, &[1, 8, 8], 10),
        optimizer: tenet_train::Optimizer::adamw(5e-4),
        batch: 30,
        shards: 1,
    };
    let bad = tenet(&[
        "train",
        "--dataset",
        "digits",
        "--stage-boundaries",
        "fc2,fc9",
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains(
            "\"fc9\" is not a layer of mlp-1x8x8-10 (layers: 0 flatten, 1 fc1, 2 relu, 3 fc2)"
        ),
        "{err}"
    );
    let starts = spec.stage_starts(&["fc2".to_string()]).unwrap();
    let stages = spec.shard_stages(&starts).unwrap();
    assert_eq!(stages.len(), 3);
    let last = &stages[2].graph;
    let k = last
        .outputs()
        .iter()
        .find(|o| o.name == "grad/fc1.weight")
        .expect("fc1's gradient leaves at the last stage")
        .node
        .0;
    assert_eq!(last.node(tenet_ir::NodeId(k)).op.name(), "matmul");

    // Jobs every node runs in order: the initialisation, then per step three stages and the
    // update; step 2's last stage is the 8th.
    let cheat = format!("op={k}@8");
    let network = common::spawn_network(&dir, 3, &[], &[None, None, Some(cheat.as_str())]);
    let (curl, ckey) = (network.url.clone(), network.key.clone());
    let net = train_with_config(
        &dir,
        &format!(
            "dataset: digits\nseed: 4\nepochs: 1\nbatch: 30\nstage_boundaries: [fc2]   # fc1 | fc2\ncoordinator: {curl}\n"
        ),
        &d("net"),
    );
    assert_eq!(net["verified"], true, "{net}");
    assert_eq!(net["pipeline_stages"], 3, "{net}");
    assert_eq!(net["weights_hash"], local["weights_hash"], "{net}");
    assert_eq!(net["steps"], local["steps"]);
    let steps = net["steps"].as_u64().unwrap();
    assert_eq!(net["jobs"], 1 + 4 * steps, "{net}");
    let disputes = net["disputes"].as_array().unwrap();
    assert_eq!(disputes.len(), 1, "{net}");
    assert_eq!(disputes[0]["step"], 2, "{net}");
    assert_eq!(disputes[0]["job"], "shard 0, stage 3", "{net}");
    assert_eq!(disputes[0]["node"], k, "{net}");
    assert_eq!(disputes[0]["op"], "matmul");
    let slashed = net["slashed"].as_array().unwrap();
    assert_eq!(slashed.len(), 1, "{net}");
    assert_eq!(slashed[0]["step"], 2, "{net}");

    let receipt = net["receipt"].as_str().unwrap();
    let ok = tenet(&[
        "receipt",
        "verify",
        receipt,
        "--coordinator",
        &ckey,
        "--json",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let v = json(&ok);
    assert_eq!(v["pipeline_stages"], 3, "{v}");
    assert_eq!(v["disputes"], 1, "{v}");
    // A stage's receipt taken out of its pipeline breaks the pipeline's signature.
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(receipt).unwrap()).unwrap();
    r["steps"][3]["pipelined"][0]["stages"]
        .as_array_mut()
        .unwrap()
        .swap(0, 1);
    let swapped = dir.join("swapped.json");
    std::fs::write(&swapped, r.to_string()).unwrap();
    let bad = tenet(&["receipt", "verify", swapped.to_str().unwrap()]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("step 4, shard 0"), "{err}");

    // Checked as another cut of the same training, the stage graphs differ.
    let r: tenet_proto::training_receipt::TrainingReceipt =
        serde_json::from_str(&std::fs::read_to_string(receipt).unwrap()).unwrap();
    let key = tenet_proto::auth::PublicKey::parse(&ckey).unwrap();
    let data = tenet_train::data::load("digits").unwrap();
    let params = params_of(net["weights"].as_str().unwrap(), &spec.model);
    let check = |starts: &[usize]| {
        tenet_train::verify::check_run(&r, &key, &spec, starts, &data, 4, 1, &params)
            .map_err(|e| e.to_string())
    };
    check(&starts).unwrap();
    let e = check(&[2]).unwrap_err();
    assert!(e.contains("shard jobs ran graph"), "{e}");
    let e = check(&[]).unwrap_err();
    assert!(e.contains("shard jobs ran graph"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
