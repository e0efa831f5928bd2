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
