//! `tenet timeline` as a user runs it: the fixture logs (a coordinator and three of its four
//! nodes, five jobs, one node outvoted and slashed, a log cut off mid-line) drawn as SVG and
//! PNG, and an output format it cannot write refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../timeline/tests/fixtures")
}

fn logs() -> Vec<PathBuf> {
    ["coordinator", "node-a", "node-b", "node-c"]
        .iter()
        .map(|n| fixtures().join(format!("{n}.jsonl")))
        .collect()
}

fn timeline(output: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenet"))
        .arg("timeline")
        .args(logs())
        .arg("-o")
        .arg(output)
        .args(extra)
        .output()
        .expect("run tenet")
}

/// The ids of the fixture's nodes, first 12 hex characters (how lanes are labelled).
const NODES: [&str; 4] = [
    "66570ff05a20",
    "93ef37c61571",
    "092cd5e29db9",
    "db81832da1ab",
];

fn succeeded(o: &Output) -> String {
    assert!(
        o.status.success(),
        "tenet timeline failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn draws_the_fixture_as_svg_with_a_lane_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    let stdout = succeeded(&timeline(&out, &["--title", "fixture <run>"]));
    // 151 events in four files; the last line of node-c.jsonl is cut off mid-write.
    assert_eq!(
        stdout.trim(),
        format!(
            "timeline: 5 lanes, 5 jobs, 151 events read, 1 line skipped -> {}",
            out.display()
        )
    );
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1600\""));
    assert!(svg.contains(">fixture &lt;run&gt;</text>"));
    assert!(svg.contains(">coordinator</text>"));
    for node in NODES {
        assert_eq!(svg.matches(&format!(">{node}</text>")).count(), 1, "{node}");
    }
    // Node c (092c…) was outvoted and slashed over job c07e9a44….
    assert!(svg.contains("disagreed on job c07e9a4412d5b3f86e1a2d90"));
    assert!(svg.contains("slashed over job c07e9a4412d5b3f86e1a2d90"));
    assert!(svg.contains("1 line skipped"));
}

#[test]
fn draws_the_fixture_as_png_of_the_asked_width() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.png");
    let stdout = succeeded(&timeline(&out, &["--width", "1000"]));
    assert!(stdout.starts_with("timeline: 5 lanes, 5 jobs"), "{stdout}");
    let png = std::fs::read(&out).unwrap();
    assert_eq!(
        png[..8],
        [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n']
    );
    assert_eq!(&png[12..16], b"IHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!(width, 1000);
    // Five lanes of at least 28 pixels, plus the title, legend and axis.
    assert!((5 * 28 + 100..2000).contains(&height), "height {height}");
    // The same input draws the same bytes.
    let again = dir.path().join("again.png");
    succeeded(&timeline(&again, &["--width", "1000"]));
    assert_eq!(png, std::fs::read(&again).unwrap());
}

#[test]
fn refuses_formats_it_cannot_write_and_missing_logs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.jpg");
    let o = timeline(&out, &[]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("t.jpg") && stderr.contains(".svg or .png"),
        "{stderr}"
    );
    assert!(!out.exists());

    let o = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["timeline", "/nonexistent/events.jsonl", "-o"])
        .arg(dir.path().join("t.svg"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("cannot read event log /nonexistent/events.jsonl"),
        "{stderr}"
    );

    // --help explains the inputs and the formats.
    let o = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["timeline", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "tenet node --event-log",
        "tenet coordinator --event-log",
        ".svg",
        ".png",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

/// The demo's own event logs (`tenet demo` writes the coordinator's and each node's) drawn as a
/// PNG: a lane for the coordinator and one per node, every call's job on it, and the lying node's
/// lane marked where it was outvoted and slashed. The picture is kept in `target/artifacts/`.
#[test]
fn the_demo_s_logs_draw_a_lane_per_node_with_the_liar_marked() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .args(["demo", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let summary: serde_json::Value = serde_json::from_slice(&demo.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&demo.stderr));
    });
    let logs: Vec<PathBuf> = std::fs::read_dir(dir.path().join("events"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 6, "a coordinator and five node logs: {logs:?}");
    let png = dir.path().join("timeline.png");
    let out = Command::new(env!("CARGO_BIN_EXE_tenet"))
        .arg("timeline")
        .args(&logs)
        .args(["--title", "tenet demo"])
        .arg("-o")
        .arg(&png)
        .output()
        .unwrap();
    let stdout = succeeded(&out);
    let jobs = summary["jobs"].as_u64().unwrap();
    assert!(
        stdout.starts_with(&format!("timeline: 6 lanes, {jobs} jobs,")),
        "{stdout}"
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let (w, h) = (be(16), be(20));
    assert_eq!(w, 1600);
    assert!(h > 6 * 30, "six lanes in {h} pixels");

    // The lanes, read back: every node's, and the liar's marked.
    let t = tenet_timeline::read_logs(&logs).unwrap();
    let nodes = summary["nodes"].as_array().unwrap();
    assert_eq!(t.lanes.len(), 6);
    for n in nodes {
        let id = n["id"].as_str().unwrap();
        let lane = t
            .lanes
            .iter()
            .find(|l| l.id == id)
            .unwrap_or_else(|| panic!("no lane for node {id}"));
        // The demo may end after three calls, nine replicas over five nodes: a node the picks
        // passed over has a lane and nothing on it; every node the ledger judged has its jobs.
        let judged = n["agreed"].as_i64().unwrap() + n["disagreed"].as_i64().unwrap();
        assert!(
            judged == 0 || !lane.bars.is_empty(),
            "node {id} was judged on {judged} jobs, but its lane has none"
        );
        let marked = lane
            .marks
            .iter()
            .any(|m| m.kind == tenet_timeline::model::MarkKind::Slashed);
        assert_eq!(marked, n["cheating"] == true, "node {id}: {:?}", lane.marks);
    }
    let kept = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/artifacts");
    let _ = std::fs::create_dir_all(&kept);
    let _ = std::fs::copy(&png, kept.join("timeline-demo.png"));
}
