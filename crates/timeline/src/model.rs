//! From merged events to what a timeline shows: one lane per node (and one per coordinator),
//! each (job, node) pair's phases as bars, disagreements and slashes as flags and marks.
//!
//! A node's own log is preferred for its lane: where it describes a (job, node) pair, the
//! coordinator's view of that pair is not drawn again. Bars are packed into rows within a lane
//! so concurrent jobs do not hide each other. Lanes beyond [`MAX_LANES`] fold into one last
//! "+N more" lane. Everything here is ordered by the input alone, so the same logs always give
//! the same timeline.

use std::collections::{BTreeMap, HashMap};

use crate::events::{Log, Name, Phase, What, Writer, cut};

/// Most lanes drawn; the rest fold into the last one.
pub const MAX_LANES: usize = 64;
/// Most rows of bars within one lane; jobs past it share the row that frees up first.
pub const MAX_ROWS: u32 = 6;
/// Characters of a job id shown in tooltips and labels.
pub const JOB_CHARS: usize = 24;
/// Characters of a node id in its lane's label.
pub const NODE_CHARS: usize = 12;

/// What a bar stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BarKind {
    /// Node's log: accepted → started.
    Queued,
    /// Node's log: started → committed.
    Computing,
    /// Node's or coordinator's log: committed → revealed.
    Revealing,
    /// Coordinator's log: assigned → committed (its view of a node it has no log of).
    Awaiting,
    /// Coordinator's lane: accepted → decided.
    Job,
    /// The phase that ended in `failed`.
    Failed,
}

impl BarKind {
    pub const ALL: [BarKind; 6] = [
        BarKind::Queued,
        BarKind::Computing,
        BarKind::Revealing,
        BarKind::Awaiting,
        BarKind::Job,
        BarKind::Failed,
    ];

    /// The legend's words for it.
    pub fn label(self) -> &'static str {
        match self {
            BarKind::Queued => "queued",
            BarKind::Computing => "computing",
            BarKind::Revealing => "revealing",
            BarKind::Awaiting => "assigned->committed (coordinator's view)",
            BarKind::Job => "job: accepted->decided",
            BarKind::Failed => "failed",
        }
    }
}

/// One phase of one job on one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bar {
    /// The job id, cut to [`JOB_CHARS`].
    pub job: String,
    pub kind: BarKind,
    pub start_us: u64,
    pub end_us: u64,
    /// The lane's node disagreed with the decision on this job, or was slashed over it (on the
    /// coordinator's lane: someone disagreed).
    pub flagged: bool,
    /// The row within the lane, from 0.
    pub row: u32,
    /// Said in the SVG's tooltip after the job and phase (an error, say).
    pub note: String,
}

/// What a mark stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// The lane's node was outvoted on a job.
    Dissent,
    /// The lane's node was slashed.
    Slashed,
    /// Joined, left, started, went offline, ...
    Membership,
}

/// An instant on a lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub ts_us: u64,
    pub kind: MarkKind,
    pub row: u32,
    /// What happened, in words (the SVG's tooltip).
    pub text: String,
}

/// Whose lane it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneKind {
    Coordinator,
    Node,
    /// The lanes past [`MAX_LANES`], this many, drawn as one.
    Folded(usize),
}

/// One lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Its label: the first [`NODE_CHARS`] characters of the node's id, "coordinator", "+N more".
    pub label: String,
    /// The full id (cut to the reader's bound), or the file name a log without `start` had.
    pub id: String,
    pub kind: LaneKind,
    pub bars: Vec<Bar>,
    pub marks: Vec<Mark>,
    /// Rows of bars it needs (at least 1).
    pub rows: u32,
}

/// Everything a rendering needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeline {
    pub lanes: Vec<Lane>,
    /// The first event's time: the axis's zero.
    pub start_us: u64,
    /// The last event's time.
    pub end_us: u64,
    /// Distinct jobs seen.
    pub jobs: usize,
    /// Files read.
    pub files: usize,
    /// Event lines read.
    pub events: u64,
    /// Lines skipped as not events.
    pub skipped: u64,
    /// What a reader of the picture should know (lines skipped, reading cut short, lanes folded).
    pub notes: Vec<String>,
}

/// The times of one (job, lane) pair's phases, as one log saw them (first of each).
#[derive(Clone, Copy, Debug, Default)]
struct Phases {
    at: [Option<u64>; 7],
}

impl Phases {
    fn set(&mut self, p: Phase, ts: u64) {
        let slot = &mut self.at[p as usize];
        if slot.is_none() {
            *slot = Some(ts);
        }
    }
    fn get(&self, p: Phase) -> Option<u64> {
        self.at[p as usize]
    }
    fn any(&self) -> bool {
        self.at.iter().any(Option::is_some)
    }
}

/// One (job, lane) pair as both kinds of log saw it.
#[derive(Debug, Default)]
struct Pair {
    own: Phases,
    coordinator: Phases,
    error: Option<Box<str>>,
    flagged: bool,
}

/// A coordinator's own view of a job.
#[derive(Debug, Default)]
struct CoordJob {
    first: Option<u64>,
    accepted: Option<u64>,
    decided: Option<u64>,
    failed: Option<u64>,
    error: Option<Box<str>>,
    disagreed: bool,
}

/// Lane keys: a coordinator by writer index, a node by its interned id, or a node known only
/// by the file its log came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Coordinator(usize),
    Node(Name),
    NodeFile(usize),
}

/// Build the timeline of `log`.
pub fn build(log: &Log) -> Timeline {
    let mut b = Builder::new(log);
    for e in &log.events {
        b.event(e.ts_us, e.writer, &e.what);
    }
    b.finish()
}

struct Builder<'a> {
    log: &'a Log,
    /// Lane keys in order of first appearance.
    order: Vec<Key>,
    seen: HashMap<Key, usize>,
    /// Node lanes keyed by their id string, so a node's own log (writer) and a coordinator's
    /// mention of it (interned name) meet in one lane.
    node_names: HashMap<&'a str, Key>,
    pairs: BTreeMap<(usize, Name), Pair>,
    coord_jobs: BTreeMap<(usize, Name), CoordJob>,
    marks: Vec<(usize, Option<Name>, Mark)>,
    jobs: BTreeMap<Name, ()>,
}

impl<'a> Builder<'a> {
    fn new(log: &'a Log) -> Builder<'a> {
        Builder {
            log,
            order: Vec::new(),
            seen: HashMap::new(),
            node_names: HashMap::new(),
            pairs: BTreeMap::new(),
            coord_jobs: BTreeMap::new(),
            marks: Vec::new(),
            jobs: BTreeMap::new(),
        }
    }

    /// The lane index (in order of appearance) for `key`.
    fn lane(&mut self, key: Key) -> usize {
        if let Some(i) = self.seen.get(&key) {
            return *i;
        }
        self.order.push(key);
        self.seen.insert(key, self.order.len() - 1);
        self.order.len() - 1
    }

    /// The lane of the node named `name` in a coordinator's event.
    fn node_lane(&mut self, name: Name) -> usize {
        let id = self.log.name(name);
        let key = *self.node_names.entry(id).or_insert(Key::Node(name));
        self.lane(key)
    }

    /// The lane of the log's writer.
    fn writer_lane(&mut self, writer: usize) -> Option<usize> {
        let log = self.log;
        match log.writers.get(writer)? {
            Writer::Coordinator { .. } => Some(self.lane(Key::Coordinator(writer))),
            Writer::Node { id, .. } => {
                let key = *self
                    .node_names
                    .entry(id.as_str())
                    .or_insert(Key::NodeFile(writer));
                Some(self.lane(key))
            }
        }
    }

    fn is_coordinator(&self, writer: usize) -> bool {
        matches!(
            self.log.writers.get(writer),
            Some(Writer::Coordinator { .. })
        )
    }

    fn event(&mut self, ts: u64, writer: usize, what: &What) {
        let coordinator = self.is_coordinator(writer);
        let Some(own_lane) = self.writer_lane(writer) else {
            return;
        };
        match what {
            What::Start => self.mark(own_lane, None, ts, MarkKind::Membership, "start".into()),
            What::Job {
                job,
                phase,
                node,
                error,
            } => {
                self.jobs.insert(*job, ());
                match (coordinator, node) {
                    (true, Some(n)) => {
                        let lane = self.node_lane(*n);
                        let pair = self.pairs.entry((lane, *job)).or_default();
                        pair.coordinator.set(*phase, ts);
                        if pair.error.is_none() {
                            pair.error.clone_from(error);
                        }
                    }
                    (true, None) => {
                        let cj = self.coord_jobs.entry((own_lane, *job)).or_default();
                        cj.first.get_or_insert(ts);
                        match phase {
                            Phase::Accepted => {
                                cj.accepted.get_or_insert(ts);
                            }
                            Phase::Failed => {
                                cj.failed.get_or_insert(ts);
                                if cj.error.is_none() {
                                    cj.error.clone_from(error);
                                }
                            }
                            _ => {}
                        }
                    }
                    // A node's own log: its lane, whatever `node` field it may carry.
                    (false, _) => {
                        let pair = self.pairs.entry((own_lane, *job)).or_default();
                        pair.own.set(*phase, ts);
                        if error.is_some() {
                            pair.error.clone_from(error);
                        }
                    }
                }
            }
            What::Decided {
                job,
                agreeing,
                dissenting,
                disputed,
            } => {
                self.jobs.insert(*job, ());
                let cj = self.coord_jobs.entry((own_lane, *job)).or_default();
                cj.first.get_or_insert(ts);
                cj.decided.get_or_insert(ts);
                cj.disagreed |= !dissenting.is_empty() || *disputed;
                // Agreeing nodes get a lane even if nothing else names them.
                for n in agreeing {
                    self.node_lane(*n);
                }
                for n in dissenting {
                    let lane = self.node_lane(*n);
                    self.pairs.entry((lane, *job)).or_default().flagged = true;
                    let text = format!("disagreed on job {}", self.job(*job));
                    self.mark(lane, Some(*job), ts, MarkKind::Dissent, text);
                }
            }
            What::Slashed { job, node } => {
                self.jobs.insert(*job, ());
                let lane = self.node_lane(*node);
                self.pairs.entry((lane, *job)).or_default().flagged = true;
                let text = format!("slashed over job {}", self.job(*job));
                self.mark(lane, Some(*job), ts, MarkKind::Slashed, text);
            }
            What::Membership { node, what } => {
                let lane = match node {
                    Some(n) if coordinator => self.node_lane(*n),
                    _ => own_lane,
                };
                self.mark(lane, None, ts, MarkKind::Membership, what.to_string());
            }
        }
    }

    fn job(&self, job: Name) -> &'a str {
        cut(self.log.name(job), JOB_CHARS)
    }

    fn mark(&mut self, lane: usize, job: Option<Name>, ts: u64, kind: MarkKind, text: String) {
        let mark = Mark {
            ts_us: ts,
            kind,
            row: 0,
            text,
        };
        self.marks.push((lane, job, mark));
    }

    fn finish(self) -> Timeline {
        let log = self.log;
        // Bars, grouped by (lane, job) in job order of first appearance within the lane.
        let mut groups: Vec<(usize, Name, Vec<Bar>)> = Vec::new();
        for (&(lane, job), pair) in &self.pairs {
            let bars = pair_bars(pair, cut(log.name(job), JOB_CHARS));
            groups.push((lane, job, bars));
        }
        for (&(lane, job), cj) in &self.coord_jobs {
            groups.push((
                lane,
                job,
                coordinator_bars(cj, cut(log.name(job), JOB_CHARS)),
            ));
        }
        let mut marks = self.marks;
        // Coordinators first, then nodes, each in order of first appearance.
        let mut order: Vec<usize> = (0..self.order.len()).collect();
        order.sort_by_key(|&i| (!matches!(self.order[i], Key::Coordinator(_)), i));
        let mut position = vec![0; order.len()];
        for (pos, &i) in order.iter().enumerate() {
            position[i] = pos;
        }
        let mut lanes: Vec<Lane> = order
            .iter()
            .map(|&i| new_lane(log, self.order[i]))
            .collect();
        let mut notes = Vec::new();
        // Fold the lanes past the cap into the last one.
        let keep = lanes.len().min(MAX_LANES);
        if lanes.len() > MAX_LANES {
            let extra = lanes.len() - (MAX_LANES - 1);
            lanes.truncate(MAX_LANES - 1);
            lanes.push(Lane {
                label: format!("+{extra} more"),
                id: format!("{extra} more lanes"),
                kind: LaneKind::Folded(extra),
                bars: Vec::new(),
                marks: Vec::new(),
                rows: 1,
            });
            notes.push(format!(
                "{extra} lanes past the first {} are drawn together in the last lane",
                MAX_LANES - 1
            ));
        }
        let place = |lane: usize| position[lane].min(keep.saturating_sub(1));
        // Rows: each (lane, job) group takes the first row free at its start.
        let mut by_lane: Vec<Vec<(u64, u64, usize)>> = vec![Vec::new(); lanes.len()];
        for (g, (lane, _, bars)) in groups.iter().enumerate() {
            if let (Some(s), Some(e)) = (
                bars.iter().map(|b| b.start_us).min(),
                bars.iter().map(|b| b.end_us).max(),
            ) {
                by_lane[place(*lane)].push((s, e, g));
            }
        }
        let mut row_of = vec![0u32; groups.len()];
        for (l, spans) in by_lane.iter_mut().enumerate() {
            spans.sort();
            let mut ends: Vec<u64> = Vec::new();
            for &(s, e, g) in spans.iter() {
                let row = match ends.iter().position(|&end| end < s) {
                    Some(r) => r,
                    None if ends.len() < MAX_ROWS as usize => {
                        ends.push(0);
                        ends.len() - 1
                    }
                    // Full: share the row that frees up first.
                    None => (0..ends.len()).min_by_key(|&r| ends[r]).unwrap_or(0),
                };
                ends[row] = ends[row].max(e);
                row_of[g] = row as u32;
            }
            lanes[l].rows = (ends.len() as u32).max(1);
        }
        let mut job_row: HashMap<(usize, Name), u32> = HashMap::new();
        for (g, (lane, job, bars)) in groups.into_iter().enumerate() {
            let l = place(lane);
            job_row.insert((l, job), row_of[g]);
            for mut bar in bars {
                bar.row = row_of[g];
                lanes[l].bars.push(bar);
            }
        }
        for (lane, job, mut mark) in marks.drain(..) {
            let l = place(lane);
            mark.row = job.and_then(|j| job_row.get(&(l, j)).copied()).unwrap_or(0);
            lanes[l].marks.push(mark);
        }
        for lane in &mut lanes {
            lane.bars.sort_by_key(|b| (b.start_us, b.row, b.kind));
            lane.marks.sort_by_key(|m| m.ts_us);
        }
        let start_us = log.events.first().map_or(0, |e| e.ts_us);
        let end_us = log.events.last().map_or(0, |e| e.ts_us);
        let skipped = log.lines_skipped();
        if skipped > 0 {
            notes.push(format!(
                "{skipped} line{} skipped (not JSON event objects)",
                plural(skipped)
            ));
        }
        if log.truncated {
            notes.push(format!(
                "stopped after {} events: later events are not shown",
                log.events_read()
            ));
        }
        Timeline {
            lanes,
            start_us,
            end_us,
            jobs: self.jobs.len(),
            files: log.files.len(),
            events: log.events_read(),
            skipped,
            notes,
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn new_lane(log: &Log, key: Key) -> Lane {
    let (label, id, kind) = match key {
        Key::Coordinator(w) => {
            let (key, by_file) = match log.writers.get(w) {
                Some(Writer::Coordinator {
                    key,
                    from_file_name,
                }) => (key.as_str(), *from_file_name),
                _ => ("", false),
            };
            let several = log
                .writers
                .iter()
                .filter(|w| matches!(w, Writer::Coordinator { .. }))
                .count()
                > 1;
            let label = if several {
                format!("coord {}", cut(key, 6))
            } else {
                "coordinator".to_string()
            };
            let id = if by_file {
                format!("coordinator (log {key})")
            } else {
                format!("coordinator {key}")
            };
            (label, id, LaneKind::Coordinator)
        }
        Key::Node(n) => {
            let id = log.name(n);
            (
                cut(id, NODE_CHARS).to_string(),
                id.to_string(),
                LaneKind::Node,
            )
        }
        Key::NodeFile(w) => {
            let id = match log.writers.get(w) {
                Some(Writer::Node { id, .. }) => id.as_str(),
                _ => "",
            };
            (
                cut(id, NODE_CHARS).to_string(),
                id.to_string(),
                LaneKind::Node,
            )
        }
    };
    Lane {
        label,
        id,
        kind,
        bars: Vec::new(),
        marks: Vec::new(),
        rows: 1,
    }
}

/// One (job, node) pair's bars: from the node's own log where it has one, else from the
/// coordinator's.
fn pair_bars(pair: &Pair, job: &str) -> Vec<Bar> {
    let mut bars = Vec::new();
    let mut push = |kind, from: Option<u64>, to: Option<u64>| {
        if let (Some(s), Some(e)) = (from, to) {
            // Clocks of different machines may disagree: never draw a bar backwards.
            let e = e.max(s);
            bars.push(Bar {
                job: job.to_string(),
                kind,
                start_us: s,
                end_us: e,
                flagged: pair.flagged,
                row: 0,
                note: String::new(),
            });
        }
    };
    let p = if pair.own.any() {
        let p = &pair.own;
        push(
            BarKind::Queued,
            p.get(Phase::Accepted),
            p.get(Phase::Started),
        );
        push(
            BarKind::Computing,
            p.get(Phase::Started),
            p.get(Phase::Committed),
        );
        push(
            BarKind::Revealing,
            p.get(Phase::Committed),
            p.get(Phase::Revealed),
        );
        p
    } else {
        let p = &pair.coordinator;
        push(
            BarKind::Awaiting,
            p.get(Phase::Assigned),
            p.get(Phase::Committed),
        );
        push(
            BarKind::Revealing,
            p.get(Phase::Committed),
            p.get(Phase::Revealed),
        );
        p
    };
    if let Some(f) = p.get(Phase::Failed) {
        // The failed phase runs from the last phase that began before it.
        let began = [
            Phase::Accepted,
            Phase::Assigned,
            Phase::Started,
            Phase::Committed,
        ]
        .iter()
        .filter_map(|ph| p.get(*ph))
        .filter(|&t| t <= f)
        .max()
        .unwrap_or(f);
        push(BarKind::Failed, Some(began), Some(f));
    }
    if let Some(err) = &pair.error
        && let Some(b) = bars.iter_mut().find(|b| b.kind == BarKind::Failed)
    {
        b.note = err.to_string();
    }
    bars
}

/// A coordinator's bar for one job: accepted (or its first event) to decided, or to failed.
fn coordinator_bars(cj: &CoordJob, job: &str) -> Vec<Bar> {
    let Some(start) = cj.accepted.or(cj.first) else {
        return Vec::new();
    };
    let (kind, end) = match (cj.decided, cj.failed) {
        (Some(d), _) => (BarKind::Job, d),
        (None, Some(f)) => (BarKind::Failed, f),
        (None, None) => return Vec::new(),
    };
    vec![Bar {
        job: job.to_string(),
        kind,
        start_us: start,
        end_us: end.max(start),
        flagged: cj.disagreed,
        row: 0,
        note: cj.error.as_deref().unwrap_or("").to_string(),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Limits, read_sources};

    fn hex(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn timeline(sources: &[(&str, String)]) -> Timeline {
        let bytes: Vec<(&str, &[u8])> = sources.iter().map(|(n, s)| (*n, s.as_bytes())).collect();
        build(&read_sources(&bytes, &Limits::default()).unwrap())
    }

    /// A coordinator log and one node's log for two jobs on nodes a and b; b dissents on j2.
    fn sample() -> Timeline {
        let (a, b, c) = (hex('a'), hex('b'), hex('c'));
        let coord = format!(
            "{{\"ts_us\":1000,\"event\":\"start\",\"coordinator\":\"{c}\",\"addr\":\"x\"}}\n\
             {{\"ts_us\":1100,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"accepted\",\"replicas\":2}}\n\
             {{\"ts_us\":1110,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"assigned\",\"node\":\"{a}\"}}\n\
             {{\"ts_us\":1120,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"assigned\",\"node\":\"{b}\"}}\n\
             {{\"ts_us\":1400,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"committed\",\"node\":\"{a}\"}}\n\
             {{\"ts_us\":1500,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"committed\",\"node\":\"{b}\"}}\n\
             {{\"ts_us\":1600,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"revealed\",\"node\":\"{a}\"}}\n\
             {{\"ts_us\":1650,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"revealed\",\"node\":\"{b}\"}}\n\
             {{\"ts_us\":1700,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"decided\",\"agreeing\":[\"{a}\",\"{b}\"],\"dissenting\":[]}}\n\
             {{\"ts_us\":2000,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"accepted\"}}\n\
             {{\"ts_us\":2010,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"assigned\",\"node\":\"{a}\"}}\n\
             {{\"ts_us\":2020,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"assigned\",\"node\":\"{b}\"}}\n\
             {{\"ts_us\":2300,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"committed\",\"node\":\"{b}\"}}\n\
             {{\"ts_us\":2700,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"decided\",\"agreeing\":[\"{a}\"],\"dissenting\":[\"{b}\"]}}\n\
             {{\"ts_us\":2710,\"event\":\"slashed\",\"job\":\"j2\",\"node\":\"{b}\",\"amount\":100}}\n"
        );
        let node_a = format!(
            "{{\"ts_us\":900,\"event\":\"start\",\"node_id\":\"{a}\",\"open\":false}}\n\
             {{\"ts_us\":1115,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"accepted\"}}\n\
             {{\"ts_us\":1130,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"started\"}}\n\
             {{\"ts_us\":1390,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"committed\",\"exec_us\":250}}\n\
             {{\"ts_us\":1590,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"revealed\"}}\n\
             {{\"ts_us\":2015,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"accepted\"}}\n\
             {{\"ts_us\":2030,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"started\"}}\n\
             {{\"ts_us\":2290,\"event\":\"job\",\"job\":\"j2\",\"phase\":\"failed\",\"error\":\"timeout\"}}\n"
        );
        timeline(&[("coord.jsonl", coord), ("a.jsonl", node_a)])
    }

    #[test]
    fn lanes_are_the_coordinator_then_nodes_in_order_of_appearance() {
        let t = sample();
        let labels: Vec<&str> = t.lanes.iter().map(|l| l.label.as_str()).collect();
        // Node a's own log starts first (900 µs), then b appears in the coordinator's log.
        assert_eq!(labels, ["coordinator", "aaaaaaaaaaaa", "bbbbbbbbbbbb"]);
        assert_eq!(t.jobs, 2);
        assert_eq!(t.start_us, 900);
        assert_eq!(t.end_us, 2710);
        assert_eq!(t.lanes[1].id, hex('a'));
    }

    #[test]
    fn bars_come_from_the_nodes_own_log_when_there_is_one() {
        let t = sample();
        fn kinds(l: &Lane) -> Vec<(BarKind, &str, u64, u64)> {
            l.bars
                .iter()
                .map(|b| (b.kind, b.job.as_str(), b.start_us, b.end_us))
                .collect()
        }
        // Node a: its own log, not the coordinator's view (no Awaiting bars).
        assert_eq!(
            kinds(&t.lanes[1]),
            vec![
                (BarKind::Queued, "j1", 1115, 1130),
                (BarKind::Computing, "j1", 1130, 1390),
                (BarKind::Revealing, "j1", 1390, 1590),
                (BarKind::Queued, "j2", 2015, 2030),
                (BarKind::Failed, "j2", 2030, 2290),
            ]
        );
        assert_eq!(t.lanes[1].bars[4].note, "timeout");
        // Node b: only the coordinator's view.
        assert_eq!(
            kinds(&t.lanes[2]),
            vec![
                (BarKind::Awaiting, "j1", 1120, 1500),
                (BarKind::Revealing, "j1", 1500, 1650),
                (BarKind::Awaiting, "j2", 2020, 2300),
            ]
        );
        // The coordinator: accepted -> decided.
        assert_eq!(
            kinds(&t.lanes[0]),
            vec![
                (BarKind::Job, "j1", 1100, 1700),
                (BarKind::Job, "j2", 2000, 2700)
            ]
        );
    }

    #[test]
    fn dissent_and_slashing_flag_the_nodes_bars_for_that_job_only() {
        let t = sample();
        let b = &t.lanes[2];
        for bar in &b.bars {
            assert_eq!(bar.flagged, bar.job == "j2", "{bar:?}");
        }
        assert!(t.lanes[1].bars.iter().all(|b| !b.flagged));
        let flagged: Vec<bool> = t.lanes[0].bars.iter().map(|b| b.flagged).collect();
        assert_eq!(flagged, [false, true]);
        let marks: Vec<(MarkKind, u64)> = b
            .marks
            .iter()
            .filter(|m| m.kind != MarkKind::Membership)
            .map(|m| (m.kind, m.ts_us))
            .collect();
        assert_eq!(
            marks,
            [(MarkKind::Dissent, 2700), (MarkKind::Slashed, 2710)]
        );
        assert!(
            t.lanes[1]
                .marks
                .iter()
                .all(|m| m.kind == MarkKind::Membership)
        );
    }

    #[test]
    fn concurrent_jobs_take_separate_rows() {
        let a = hex('a');
        let mut text = format!("{{\"ts_us\":0,\"event\":\"start\",\"node_id\":\"{a}\"}}\n");
        // Three jobs overlapping, then one after them all.
        for (job, s, e) in [("x", 10, 50), ("y", 20, 60), ("z", 30, 40), ("w", 70, 80)] {
            text += &format!(
                "{{\"ts_us\":{s},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"started\"}}\n\
                 {{\"ts_us\":{e},\"event\":\"job\",\"job\":\"{job}\",\"phase\":\"committed\"}}\n"
            );
        }
        let t = timeline(&[("a", text)]);
        let rows: Vec<(&str, u32)> = t.lanes[0]
            .bars
            .iter()
            .map(|b| (b.job.as_str(), b.row))
            .collect();
        assert_eq!(rows, [("x", 0), ("y", 1), ("z", 2), ("w", 0)]);
        assert_eq!(t.lanes[0].rows, 3);
    }

    #[test]
    fn lanes_past_the_cap_fold_into_one() {
        let c = hex('c');
        let mut text = format!("{{\"ts_us\":0,\"event\":\"start\",\"coordinator\":\"{c}\"}}\n");
        for i in 0..100u64 {
            text += &format!(
                "{{\"ts_us\":{},\"event\":\"job\",\"job\":\"j{i}\",\"phase\":\"assigned\",\"node\":\"n{i:03}\"}}\n\
                 {{\"ts_us\":{},\"event\":\"job\",\"job\":\"j{i}\",\"phase\":\"committed\",\"node\":\"n{i:03}\"}}\n",
                10 * i + 1,
                10 * i + 5
            );
        }
        let t = timeline(&[("c", text)]);
        assert_eq!(t.lanes.len(), MAX_LANES);
        let last = t.lanes.last().unwrap();
        // 1 coordinator lane + 100 nodes = 101 lanes; 63 kept, 38 folded.
        assert_eq!(last.kind, LaneKind::Folded(38));
        assert_eq!(last.label, "+38 more");
        assert_eq!(last.bars.len(), 38);
        assert_eq!(t.lanes[62].label, "n061");
        assert!(
            t.notes.iter().any(|n| n.contains("38 lanes")),
            "{:?}",
            t.notes
        );
    }
}
