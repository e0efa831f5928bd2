//! The peer-to-peer network as a user drives it, with real processes on 127.0.0.1: four
//! `tenet peer` hosters (one lying) joined through the first, and `tenet call --p2p` finding
//! them on the DHT, running the example MLP on all four with no coordinator, and getting the
//! local result with a receipt `tenet receipt verify` accepts.

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

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Start a peer and read what it prints up to its task line.
fn peer(dir: &Path, i: usize, bootstrap: Option<&str>, cheat: bool) -> Peer {
    let e = examples();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenet"));
    cmd.arg("peer")
        .arg("--data-dir")
        .arg(dir.join(format!("p{i}")))
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .arg("--host")
        .arg(format!(
            "{},{}",
            e.join("mlp.tg").display(),
            e.join("mlp.safetensors").display()
        ));
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    if cheat {
        cmd.args(["--cheat", "flip"]);
    }
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
        let done = line.contains("hosting");
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
