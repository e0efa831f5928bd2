//! `tenet timeline`: draw event logs as a timeline picture. The reading, modelling and drawing
//! are `tenet_timeline`'s; this is the arguments and the one-line summary.

use std::path::PathBuf;

use anyhow::{Context, Result};
use tenet_timeline::{Format, Style};

#[derive(clap::Args)]
#[command(
    after_help = "Inputs: the JSON-lines files written by `tenet node --event-log FILE` \
    (one per node: its `start` event names the node's lane) and `tenet coordinator --event-log FILE` \
    (the coordinator's lane, plus its view of every node it assigned work to, which fills the lane \
    of a node whose own log is not given). Logs are merged by their `ts_us` clock; lines that are \
    not JSON events are skipped and counted. Limits: 256 MiB a file, 2 million events in all, \
    64 lanes (further nodes share a last \"+N more\" lane).\n\n\
    Output: chosen by the extension of -o: .svg (text you can zoom, with a tooltip on every bar) \
    or .png.\n\n\
    Example:\n  tenet coordinator --event-log coord.jsonl ...\n  tenet node --event-log a.jsonl ...\n  \
    tenet node --event-log b.jsonl ...\n  tenet timeline coord.jsonl a.jsonl b.jsonl -o timeline.svg"
)]
pub struct TimelineArgs {
    /// Event logs (JSON lines), from nodes and coordinators, in any order.
    #[arg(required = true, value_name = "EVENTS.jsonl")]
    pub logs: Vec<PathBuf>,
    /// Where to write the picture: FILE.svg or FILE.png.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Width of the picture in pixels (640 to 8192); its height follows from the lanes.
    #[arg(long, value_name = "PX", default_value_t = tenet_timeline::layout::DEFAULT_WIDTH,
          value_parser = clap::value_parser!(u32).range(640..=8192))]
    pub width: u32,
    /// The title drawn at the top [default: "tenet timeline"].
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

pub fn run(args: &TimelineArgs) -> Result<()> {
    // Refuse an unknown format before reading anything.
    let format = Format::from_path(&args.output)?;
    let timeline = tenet_timeline::read_logs(&args.logs)?;
    let style = Style {
        width: args.width,
        title: args.title.clone(),
    };
    let bytes = tenet_timeline::render(&timeline, &style, format);
    std::fs::write(&args.output, bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    println!(
        "timeline: {}, {}, {} read, {} skipped -> {}",
        plural(timeline.lanes.len() as u64, "lane", "lanes"),
        plural(timeline.jobs as u64, "job", "jobs"),
        plural(timeline.events, "event", "events"),
        plural(timeline.skipped, "line", "lines"),
        args.output.display()
    );
    for note in &timeline.notes {
        if !note.contains("skipped") {
            println!("  note: {note}");
        }
    }
    Ok(())
}
