//! The web dashboard in a real headless Chromium (Debian's package, driven through the DevTools
//! protocol by `browser/dashboard.mjs` under node.js): `tenet demo --dashboard` keeps its
//! network up — a coordinator, five nodes, one lying — and the page must show the nodes, a job
//! appearing live, the liar marked slashed, and a receipt verified in the page (a tampered one
//! refused, the downloaded one verified by `tenet receipt verify`); a node's own page shows its
//! id and the jobs it committed. Screenshots are kept in `target/artifacts/dashboard/`. Skipped, saying so, where
//! Chromium or node.js is missing, unless `TENET_REQUIRE_CHROMIUM=1` (CI installs both).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn find(names: &[&str], env: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

fn required() -> bool {
    std::env::var("TENET_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1")
}

/// The demo, stopped with SIGINT (a clean shutdown) when dropped.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn artifacts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/artifacts/dashboard")
        .to_path_buf()
}

fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let be = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn the_dashboard_shows_the_network_live_and_verifies_a_receipt_in_the_browser() {
    let (Some(chromium), Some(node)) = (
        find(&["chromium", "chromium-browser"], "TENET_CHROMIUM"),
        find(&["node", "nodejs"], "TENET_NODE"),
    ) else {
        assert!(
            !required(),
            "TENET_REQUIRE_CHROMIUM=1 but chromium or node is not installed"
        );
        eprintln!(
            "SKIPPED: chromium or node.js is not installed (apt-get install chromium nodejs)"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("tenet-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["demo", "--dashboard", "--json", "--dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let demo = Demo(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the demo printed no summary ({e}): {line:?}"));
    assert_eq!(summary["verified"], true, "{summary}");
    let url = summary["dashboard"].as_str().unwrap();
    let cheater = summary["cheater"].as_str().unwrap();
    let honest = summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["cheating"] == false)
        .unwrap();
    let (node_url, node_id) = (
        format!("{}/", honest["url"].as_str().unwrap()),
        honest["id"].as_str().unwrap(),
    );

    // The page's data takes no key here: the demo's views are public on loopback.
    let out = artifacts();
    std::fs::create_dir_all(&out).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.mjs");
    let run = Command::new(node)
        .arg(&script)
        .args(["--chromium", chromium.to_str().unwrap()])
        .args(["--url", url, "--cheater", cheater])
        .args(["--node-url", &node_url, "--node-id", node_id])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(report["nodes"], 5, "{report}");
    assert_eq!(report["liar_marked"], true, "{report}");
    assert!(report["live_job"].is_string(), "{report}");
    assert!(report["slash_listed"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["verdict"], "verified in this browser", "{report}");
    // The liar's job was decided by a dispute (its flipped outputs are not its own trace's):
    // the receipt checked in the page carries that transcript.
    assert_eq!(report["disputed"], true, "{report}");
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() >= 8, "{report}");
    assert!(checks.iter().all(|c| c.as_str().unwrap().starts_with("+ ")));
    assert!(
        checks.iter().any(|c| c
            .as_str()
            .unwrap()
            .contains("coordinator's Ed25519 signature")),
        "{report}"
    );
    assert_eq!(
        report["tampered"],
        serde_json::json!([false, false, false]),
        "{report}"
    );
    // The receipt the page offers for download verifies offline, pinned to the coordinator.
    let file = dir.join("downloaded-receipt.json");
    std::fs::write(&file, report["download"].as_str().unwrap()).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["receipt", "verify"])
        .arg(&file)
        .args(["--coordinator", summary["coordinator"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(report["node_page"].as_u64().unwrap() >= 1, "{report}");
    for shot in ["dashboard.png", "receipt.png", "node.png"] {
        let (w, h) = png_size(&out.join(shot));
        assert!(w >= 1000 && h >= 600, "{shot}: {w}×{h}");
    }
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
