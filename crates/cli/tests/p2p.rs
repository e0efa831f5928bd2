//! The peer-to-peer network as a user drives it, with real processes on 127.0.0.1: four
//! `tenet peer` hosters (one lying) joined through the first, and `tenet call --p2p` finding
//! them on the DHT, running the example MLP on all four with no coordinator, and getting the
//! local result with a receipt `tenet receipt verify` accepts; twelve peers (three validators,
//! one revealing scores it did not commit to; eight hosters, one lying; a client) on a network
//! spec written by `tenet peer network`, whose first epoch scores the liar down and ignores the
//! lying validator, seen through `tenet peer status`, after which `tenet call --p2p --network`
//! passes the liar over; `tenet demo --p2p --json`; and `tenet bench p2p`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Peer {
    child: Child,
    lines: Vec<String>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Held by the tests that run whole networks on wall-clock epochs (a dozen processes each):
/// two of them at once on a 2-core machine under load let a peer join after the first epoch
/// was scored, and the liar then had no standing yet. The lighter tests run beside either.
static EPOCHS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn epochs() -> std::sync::MutexGuard<'static, ()> {
    EPOCHS.lock().unwrap_or_else(|e| e.into_inner())
}

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Start a peer and read what it prints up to its task line.
fn peer(dir: &Path, i: usize, bootstrap: Option<&str>, cheat: bool) -> Peer {
    let cheat: &[&str] = if cheat { &["--cheat", "flip"] } else { &[] };
    peer_with(
        &dir.join(format!("p{i}")),
        bootstrap,
        true,
        cheat,
        "hosting",
    )
}

/// Start a peer (hosting the example MLP or not) and read what it prints up to a line
/// containing `until`.
fn peer_with(
    data_dir: &Path,
    bootstrap: Option<&str>,
    host: bool,
    extra: &[&str],
    until_line: &str,
) -> Peer {
    let e = examples();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenet"));
    cmd.arg("peer")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"]);
    if host {
        cmd.arg("--host").arg(format!(
            "{},{}",
            e.join("mlp.tg").display(),
            e.join("mlp.safetensors").display()
        ));
    }
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    cmd.args(extra);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let mut line = String::new();
        assert!(Instant::now() < until, "the peer did not start: {lines:?}");
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the peer exited: {lines:?}");
        }
        let done = line.contains(until_line);
        lines.push(line.trim().to_string());
        if done {
            break;
        }
    }
    // Keep reading (and dropping) what it prints later, so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    Peer { child, lines }
}

#[test]
fn a_call_with_no_coordinator_is_verified_by_peers_and_outvotes_a_liar() {
    let dir = tempfile::tempdir().unwrap();
    let first = peer(dir.path(), 0, None, false);
    let boot = first
        .lines
        .iter()
        .find_map(|l| l.strip_prefix("listening on "))
        .expect("the peer prints its address")
        .to_string();
    assert!(boot.contains("/p2p/12D3KooW"), "{boot}");
    let task = first
        .lines
        .iter()
        .find_map(|l| l.split("(task ").nth(1))
        .and_then(|t| t.split(',').next())
        .unwrap()
        .to_string();
    let mut peers = vec![first];
    for i in 1..4 {
        peers.push(peer(dir.path(), i, Some(&boot), i == 3));
    }
    let liar_id = peers[3].lines[0]
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();

    let x = dir.path().join("x.json");
    let rows: Vec<Vec<f32>> = (0..8)
        .map(|i| (0..64).map(|j| ((i * 7 + j) % 13) as f32 / 13.0).collect())
        .collect();
    std::fs::write(&x, serde_json::to_vec(&rows).unwrap()).unwrap();
    let receipt = dir.path().join("receipt.json");
    let out = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args([
            "call",
            "--p2p",
            "--bootstrap",
            &boot,
            "--replicas",
            "4",
            "--json",
            &task,
        ])
        .arg("-i")
        .arg(format!("x={}", x.display()))
        .arg("--receipt")
        .arg(&receipt)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tenet call --p2p failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts: Vec<(String, String)> = v["hosters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["peer"].as_str().unwrap().to_string(),
                h["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(verdicts.len(), 4);
    for (peer, verdict) in &verdicts {
        let want = if *peer == liar_id {
            "dissented"
        } else {
            "agreed"
        };
        assert_eq!(verdict, want, "{peer}: {verdicts:?}");
    }

    // The same result as running the graph here.
    let local = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .arg("run")
        .arg(examples().join("mlp.tg"))
        .arg("--weights")
        .arg(examples().join("mlp.safetensors"))
        .arg("-i")
        .arg(format!("x={}", x.display()))
        .output()
        .unwrap();
    let local = String::from_utf8_lossy(&local.stdout);
    for o in v["outputs"].as_array().unwrap() {
        let hash = o["hash"].as_str().unwrap();
        assert!(
            local.contains(&format!("hash {}", &hash[..12])),
            "{hash} not in {local}"
        );
    }

    // The receipt checks out offline.
    let verify = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["receipt", "verify"])
        .arg(&receipt)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(said.contains("3 of 4 node(s) agreed"), "{said}");
}

fn tenet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(args)
        .output()
        .unwrap()
}

fn address(p: &Peer) -> String {
    p.lines
        .iter()
        .find_map(|l| l.strip_prefix("listening on "))
        .expect("the peer prints its address")
        .to_string()
}

#[test]
fn twelve_peers_score_a_liar_down_ignore_a_lying_validator_and_pass_the_liar_over() {
    let _epochs = epochs();
    // Three validators (the third reveals scores it did not commit to), eight hosters (the
    // eighth lies), and a client: twelve processes, no coordinator.
    let dir = tempfile::tempdir().unwrap();
    let vdirs: Vec<_> = (0..3).map(|i| dir.path().join(format!("v{i}"))).collect();
    let vkeys: Vec<String> = vdirs
        .iter()
        .map(|d| {
            let out = tenet(&["peer", "key", "--data-dir", d.to_str().unwrap()]);
            assert!(out.status.success());
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    assert!(vkeys.iter().all(|k| k.len() == 64), "{vkeys:?}");
    let spec = dir.path().join("net.json");
    let out = tenet(&[
        "peer",
        "network",
        "-o",
        spec.to_str().unwrap(),
        "--validator",
        &vkeys[0],
        "--validator",
        &vkeys[1],
        "--validator",
        &format!("{}=100", vkeys[2]),
        "--epoch-secs",
        "4",
        "--genesis-in",
        "9",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A spec naming something that is not a key is refused with the reason.
    let bad = tenet(&["peer", "network", "-o", "/dev/null", "--validator", "zz"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a public key"));

    let net = ["--network", spec.to_str().unwrap(), "--gossip-every", "0.5"];
    let first = peer_with(&dir.path().join("h0"), None, true, &net, "network");
    let boot = address(&first);
    let mut hosters = vec![first];
    for i in 1..8 {
        let mut extra = net.to_vec();
        if i == 7 {
            extra.extend(["--cheat", "flip"]);
        }
        hosters.push(peer_with(
            &dir.path().join(format!("h{i}")),
            Some(&boot),
            true,
            &extra,
            "network",
        ));
    }
    let liar = hosters[7].lines[0]
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();
    let mut validators = Vec::new();
    for (i, d) in vdirs.iter().enumerate() {
        let mut extra = net.to_vec();
        extra.push("--validate");
        if i == 2 {
            extra.push("--cheat-scores");
        }
        validators.push(peer_with(d, Some(&boot), false, &extra, "validating"));
    }
    let vaddr = address(&validators[0]);

    // Epoch 0 is scored and settled; the validator's status says so.
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        assert!(Instant::now() < until, "epoch 0 was not settled in time");
        let out = tenet(&["peer", "status", &vaddr, "--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["standings"]["epoch"].as_u64().is_some() {
                break v;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(status["network"], "tenet");
    let scores = status["validator"]["scores"].as_array().unwrap();
    assert_eq!(scores.len(), 8, "{status}");
    for s in scores {
        let want = if s["peer"] == liar.as_str() { 0.0 } else { 1.0 };
        assert_eq!(s["score"].as_f64(), Some(want), "{s}");
    }
    let standings = status["standings"]["standings"].as_array().unwrap();
    let liar_standing = standings
        .iter()
        .find(|s| s["peer"] == liar.as_str())
        .unwrap();
    assert_eq!(liar_standing["good"], false);
    assert_eq!(liar_standing["decided"], true);
    // Every honest hoster in good standing; the lying validator ignored, the other two counted.
    assert_eq!(
        standings.iter().filter(|s| s["good"] == true).count(),
        7,
        "{status}"
    );
    assert_eq!(status["standings"]["counted"].as_array().unwrap().len(), 2);
    let ignored = status["standings"]["ignored"].as_array().unwrap();
    assert_eq!(ignored.len(), 1, "{status}");
    assert_eq!(ignored[0][0], vkeys[2].as_str());
    // The text form names it.
    let text = tenet(&["peer", "status", &vaddr]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("{liar} score 0.00: BAD standing")),
        "{text}"
    );

    // A caller with the spec passes the liar over; seven honest hosters agree.
    let x = dir.path().join("x.json");
    let rows: Vec<Vec<f32>> = (0..8).map(|i| vec![i as f32 / 8.0; 64]).collect();
    std::fs::write(&x, serde_json::to_vec(&rows).unwrap()).unwrap();
    let task = hosters[0]
        .lines
        .iter()
        .find_map(|l| l.split("(task ").nth(1))
        .and_then(|t| t.split(',').next())
        .unwrap()
        .to_string();
    let out = tenet(&[
        "call",
        "--p2p",
        "--bootstrap",
        &boot,
        "--network",
        spec.to_str().unwrap(),
        "--replicas",
        "7",
        "--json",
        &task,
        "-i",
        &format!("x={}", x.display()),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hosters_used: Vec<&str> = v["hosters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["peer"].as_str().unwrap())
        .collect();
    assert_eq!(hosters_used.len(), 7);
    assert!(!hosters_used.contains(&liar.as_str()), "{v}");
    assert_eq!(v["receipt"]["nodes"].as_array().unwrap().len(), 7);
}

#[test]
fn the_p2p_demo_runs_two_epochs_and_catches_the_liar() {
    let _epochs = epochs();
    let dir = tempfile::tempdir().unwrap();
    let out = tenet(&[
        "demo",
        "--p2p",
        "--json",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["cheaters_caught"], 1, "{v}");
    assert!(v["epochs"].as_u64().unwrap() >= 2, "{v}");
    assert!(v["jobs"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["coordinator"].is_null());
    assert!(
        v["passed_over"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| *p == v["liar"])
    );
}

#[test]
fn the_p2p_benchmark_runs_both_paths_and_prints_their_ratio() {
    let out = tenet(&["bench", "p2p", "--jobs", "5", "--records", "3", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for path in ["coordinator", "p2p", "dht_put", "dht_get"] {
        let p50 = v[path]["p50_ms"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50.is_finite(), "{path}: {v}");
    }
    let ratio = v["ratio_p50"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio.is_finite(), "{v}");
}
