//! The fixture logs (tests/fixtures: a coordinator and three of its four nodes, five jobs,
//! node c outvoted and slashed on the third, node b timing out on the fifth and replaced by
//! node d, node c's log cut off mid-line) read through the public API.

use std::path::{Path, PathBuf};

use tenet_timeline::{BarKind, LaneKind, MarkKind, Style};

fn logs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    ["node-c", "coordinator", "node-a", "node-b"]
        .iter()
        .map(|n| dir.join(format!("{n}.jsonl")))
        .collect()
}

#[test]
fn the_fixture_reads_as_five_lanes_and_five_jobs() {
    let t = tenet_timeline::read_logs(&logs()).unwrap();
    let labels: Vec<&str> = t.lanes.iter().map(|l| l.label.as_str()).collect();
    // Coordinator first whatever the file order; then nodes by first appearance (each node's
    // own `start` precedes the coordinator's `joined`); d has no log of its own.
    assert_eq!(
        labels,
        [
            "coordinator",
            "66570ff05a20",
            "93ef37c61571",
            "092cd5e29db9",
            "db81832da1ab"
        ]
    );
    assert_eq!(t.lanes[0].kind, LaneKind::Coordinator);
    assert_eq!((t.jobs, t.files, t.events, t.skipped), (5, 4, 151, 1));
    assert_eq!(t.start_us, 1_764_590_400_000_000);

    let (b, c, d) = (&t.lanes[2], &t.lanes[3], &t.lanes[4]);
    // Five jobs on the coordinator's lane, one with a disagreement.
    let jobs: Vec<bool> = t.lanes[0].bars.iter().map(|b| b.flagged).collect();
    assert_eq!(jobs, [false, false, true, false, false]);
    // c: flagged only on the job it was outvoted on, with both marks.
    let flagged: Vec<&str> = c
        .bars
        .iter()
        .filter(|b| b.flagged)
        .map(|b| b.job.as_str())
        .collect();
    assert_eq!(flagged, ["c07e9a4412d5b3f86e1a2d90"; 3]);
    let marks: Vec<MarkKind> = c
        .marks
        .iter()
        .map(|m| m.kind)
        .filter(|k| *k != MarkKind::Membership)
        .collect();
    assert_eq!(marks, [MarkKind::Dissent, MarkKind::Slashed]);
    // b timed out on the last job; d, known only from the coordinator's log, replaced it.
    let failed: Vec<&str> = b
        .bars
        .iter()
        .filter(|x| x.kind == BarKind::Failed)
        .map(|x| x.note.as_str())
        .collect();
    assert_eq!(failed, ["timeout"]);
    assert!(
        d.bars
            .iter()
            .all(|x| matches!(x.kind, BarKind::Awaiting | BarKind::Revealing))
    );
    assert_eq!(
        d.bars
            .iter()
            .filter(|x| x.kind == BarKind::Awaiting)
            .count(),
        3
    );
    assert!(
        t.lanes
            .iter()
            .all(|l| l.bars.iter().all(|b| b.start_us <= b.end_us))
    );
}

#[test]
fn the_fixture_renders_the_same_bytes_in_any_file_order() {
    let mut paths = logs();
    let style = Style::default();
    let t = tenet_timeline::read_logs(&paths).unwrap();
    let (svg, png) = (
        tenet_timeline::render_svg(&t, &style),
        tenet_timeline::render_png(&t, &style),
    );
    // Equal timestamps are rare across machines; the fixture has none across files, so the
    // merge, and with it the picture, is independent of the order the files are given in.
    paths.reverse();
    let t2 = tenet_timeline::read_logs(&paths).unwrap();
    assert_eq!(svg, tenet_timeline::render_svg(&t2, &style));
    assert_eq!(png, tenet_timeline::render_png(&t2, &style));
}
