//! `tenet timeline`: the JSON-lines event logs that tenet's nodes and coordinator write
//! (`--event-log FILE`), merged by their `ts_us` clock and drawn as one picture: a lane per
//! node (and one for the coordinator), each job's phases on that node as bars along a shared
//! time axis, disagreements and slashes in red.
//!
//! ```text
//! read_logs(paths) ─► events (read, bounded, merged) ─► model (lanes, bars, marks) = Timeline
//! Timeline + Style ─► layout (shapes in pixels) ─► svg (text) | png (rasteriser + encoder)
//! ```
//!
//! Depends on no other tenet crate: it reads only the logs' JSON shape (docs/NODE.md,
//! "Observability"), so it can draw logs from any version that writes it.

pub mod events;
pub mod font;
pub mod layout;
pub mod model;
pub mod png;
pub mod svg;

use std::path::Path;

pub use events::{Limits, Log};
pub use layout::{Scene, Style};
pub use model::{Bar, BarKind, Lane, LaneKind, Mark, MarkKind, Timeline};

/// What went wrong reading logs or choosing an output.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error(
        "no event logs given: pass the files that `tenet node --event-log FILE` and `tenet coordinator --event-log FILE` wrote"
    )]
    NoLogs,
    #[error("cannot read event log {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "event log {path} is {bytes} bytes, over the {limit}-byte limit: draw a part of it (e.g. `tail -n 200000 {path} > part.jsonl`)"
    )]
    TooLarge {
        path: String,
        bytes: u64,
        limit: u64,
    },
    #[error(
        "no events in {files} log(s) ({skipped} line(s) were not JSON objects with `ts_us` and `event`): are these the files `--event-log FILE` wrote?"
    )]
    NoEvents { files: usize, skipped: u64 },
    #[error("cannot tell the picture's format from {path}: name the output file .svg or .png")]
    UnknownFormat { path: String },
}

/// The formats a timeline is drawn in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format named by `path`'s extension (`.svg` or `.png`, any case).
    pub fn from_path(path: &Path) -> Result<Format, TimelineError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(TimelineError::UnknownFormat {
                path: path.display().to_string(),
            }),
        }
    }
}

/// Read, merge and model the logs at `paths`, within the default [`Limits`].
pub fn read_logs<P: AsRef<Path>>(paths: &[P]) -> Result<Timeline, TimelineError> {
    read_logs_with(paths, &Limits::default())
}

/// [`read_logs`] within `limits`.
pub fn read_logs_with<P: AsRef<Path>>(
    paths: &[P],
    limits: &Limits,
) -> Result<Timeline, TimelineError> {
    if paths.is_empty() {
        return Err(TimelineError::NoLogs);
    }
    timeline_of(&events::read_files(paths, limits)?)
}

/// The timeline of logs already in memory, each with the name it is shown as.
pub fn from_sources(sources: &[(&str, &[u8])], limits: &Limits) -> Result<Timeline, TimelineError> {
    if sources.is_empty() {
        return Err(TimelineError::NoLogs);
    }
    timeline_of(&events::read_sources(sources, limits)?)
}

fn timeline_of(log: &Log) -> Result<Timeline, TimelineError> {
    if log.events_read() == 0 {
        return Err(TimelineError::NoEvents {
            files: log.files.len(),
            skipped: log.lines_skipped(),
        });
    }
    Ok(model::build(log))
}

/// The timeline as an SVG document.
pub fn render_svg(t: &Timeline, style: &Style) -> String {
    svg::render(&layout::layout(t, style))
}

/// The timeline as PNG bytes.
pub fn render_png(t: &Timeline, style: &Style) -> Vec<u8> {
    png::render(&layout::layout(t, style))
}

/// The timeline in `format`, as the bytes of its file.
pub fn render(t: &Timeline, style: &Style, format: Format) -> Vec<u8> {
    match format {
        Format::Svg => render_svg(t, style).into_bytes(),
        Format::Png => render_png(t, style),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{bar_colour, palette};

    fn hex(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    /// A coordinator and three nodes; node c dissents on j2 and is slashed.
    fn logs() -> Vec<(String, String)> {
        let (a, b, c, k) = (hex('a'), hex('b'), hex('c'), hex('f'));
        let mut coord =
            format!("{{\"ts_us\":1000000,\"event\":\"start\",\"coordinator\":\"{k}\"}}\n");
        let mut nodes: Vec<String> = [&a, &b, &c]
            .iter()
            .map(|n| format!("{{\"ts_us\":999000,\"event\":\"start\",\"node_id\":\"{n}\"}}\n"))
            .collect();
        for j in 0..3u64 {
            let t = 1_001_000 + j * 20_000;
            let job = format!("j{j}");
            coord += &format!(
                "{{\"ts_us\":{t},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"accepted\"}}\n"
            );
            for (i, n) in [&a, &b, &c].iter().enumerate() {
                let i = i as u64;
                coord += &format!(
                    "{{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"assigned\",\"node\":\"{n}\"}}\n",
                    t + 100 + i
                );
                nodes[i as usize] += &format!(
                    "{{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"accepted\"}}\n\
                     {{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"started\"}}\n\
                     {{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"committed\"}}\n\
                     {{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"revealed\"}}\n",
                    t + 200,
                    t + 1000,
                    t + 9000 + 500 * i,
                    t + 12_000
                );
            }
            let dissent = if j == 2 {
                format!("\"{c}\"")
            } else {
                String::new()
            };
            coord += &format!(
                "{{\"ts_us\":{},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"decided\",\"agreeing\":[\"{a}\",\"{b}\"],\"dissenting\":[{dissent}]}}\n",
                t + 13_000
            );
        }
        coord += &format!(
            "{{\"ts_us\":1054500,\"event\":\"slashed\",\"job\":\"j2\",\"node\":\"{c}\",\"amount\":100}}\n"
        );
        let mut out = vec![("coord.jsonl".to_string(), coord)];
        for (i, n) in nodes.into_iter().enumerate() {
            out.push((format!("node{i}.jsonl"), n));
        }
        out
    }

    fn timeline() -> Timeline {
        let logs = logs();
        let sources: Vec<(&str, &[u8])> = logs
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_bytes()))
            .collect();
        from_sources(&sources, &Limits::default()).unwrap()
    }

    #[test]
    fn the_png_shows_each_lanes_bars_and_red_only_where_a_node_dissented() {
        let t = timeline();
        assert_eq!(t.lanes.len(), 4);
        assert_eq!(t.jobs, 3);
        let style = Style {
            width: 1200,
            title: Some("test".into()),
        };
        let scene = layout::layout(&t, &style);
        let png = render_png(&t, &style);
        let d = png::tests::decode(&png);
        assert_eq!((d.width, d.height), (scene.width, scene.height));
        assert_eq!(d.width, 1200);
        let (x0, x1) = (scene.plot.0 as u32, scene.plot.1 as u32);
        let count = |band: layout::Band, colour| {
            let mut n = 0;
            for y in band.top..band.top + band.height {
                for x in x0..=x1 {
                    n += usize::from(d.at(x, y) == colour);
                }
            }
            n
        };
        // Coordinator lane: job bars. Node lanes: queued, computing and revealing bars.
        assert!(count(scene.bands[0], bar_colour(BarKind::Job)) > 100);
        for (i, band) in scene.bands.iter().enumerate().skip(1) {
            for kind in [BarKind::Queued, BarKind::Computing, BarKind::Revealing] {
                assert!(
                    count(*band, bar_colour(kind)) > 20,
                    "lane {i} lacks {kind:?}"
                );
            }
            // The nodes' own logs are preferred: no coordinator's-view bars.
            assert_eq!(count(*band, bar_colour(BarKind::Awaiting)), 0, "lane {i}");
        }
        // Red: on the dissenting node's lane (c, the last) and the coordinator's (a job with a
        // dissent), nowhere on the honest nodes' lanes.
        let red = palette::ALARM;
        assert!(count(scene.bands[3], red) > 50);
        assert!(count(scene.bands[0], red) > 0);
        assert_eq!(count(scene.bands[1], red), 0);
        assert_eq!(count(scene.bands[2], red), 0);
        // And on c's lane only at j2's time, to the right of where j1 ended.
        let j1_end = x0 + (x1 - x0) * 33 / 54;
        let band = scene.bands[3];
        for y in band.top..band.top + band.height {
            for x in x0..j1_end {
                assert_ne!(d.at(x, y), red, "red at ({x}, {y})");
            }
        }
    }

    #[test]
    fn the_svg_labels_every_lane_and_output_is_deterministic() {
        let t = timeline();
        let svg = render_svg(&t, &Style::default());
        for label in [
            "coordinator",
            "aaaaaaaaaaaa",
            "bbbbbbbbbbbb",
            "cccccccccccc",
        ] {
            assert!(svg.contains(&format!(">{label}</text>")), "{label}");
        }
        assert!(svg.contains("disagreed on job j2"));
        assert!(svg.contains("slashed over job j2"));
        assert_eq!(svg, render_svg(&timeline(), &Style::default()));
        let png = render_png(&t, &Style::default());
        assert_eq!(png, render_png(&timeline(), &Style::default()));
    }

    #[test]
    fn formats_and_errors_say_what_to_do() {
        assert_eq!(
            Format::from_path(Path::new("x/t.SVG")).unwrap(),
            Format::Svg
        );
        assert_eq!(Format::from_path(Path::new("t.png")).unwrap(), Format::Png);
        let err = Format::from_path(Path::new("t.jpg")).unwrap_err();
        assert!(err.to_string().contains(".svg or .png"), "{err}");
        assert!(Format::from_path(Path::new("noext")).is_err());
        let none: [&str; 0] = [];
        assert!(matches!(read_logs(&none), Err(TimelineError::NoLogs)));
        let err = from_sources(&[("x", b"hello\nworld\n")], &Limits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                TimelineError::NoEvents {
                    files: 1,
                    skipped: 2
                }
            ),
            "{err}"
        );
        let err = read_logs(&["/nonexistent/tenet-events.jsonl"]).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tenet-events.jsonl"),
            "{err}"
        );
    }
}
