//! Reading event logs: the JSON lines `tenet node --event-log FILE` and `tenet coordinator
//! --event-log FILE` write (`{"ts_us": …, "event": …, fields}`), merged into one stream ordered
//! by `ts_us`.
//!
//! A log may come from a stranger, so everything is bounded: a file over
//! [`Limits::max_file_bytes`] is refused before it is read, reading stops at
//! [`Limits::max_events`] events in all, a line longer than [`Limits::max_line_bytes`] is
//! skipped unparsed (a JSON value in memory is many times its text: real event lines are well
//! under a kilobyte), ids are cut to [`MAX_ID_CHARS`] and error texts to [`MAX_TEXT_CHARS`]. A line that is not a JSON object with a numeric `ts_us` and a string
//! `event` is counted and skipped, never fatal (a log cut off mid-line by a crash is normal).
//! Unknown events and fields are ignored. Ids are interned: an event holds indices, so memory
//! follows the number of events, not the length of their lines.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde_json::{Map, Value};

use crate::TimelineError;

/// Longest job or node id kept, in characters; longer ones are cut (and may then merge).
pub const MAX_ID_CHARS: usize = 128;
/// Longest error text kept (for tooltips), in characters.
pub const MAX_TEXT_CHARS: usize = 160;
/// Most node ids read from one `decided` event's `agreeing` or `dissenting` list.
pub const MAX_LISTED_NODES: usize = 256;

/// What reading may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A file larger than this is refused.
    pub max_file_bytes: u64,
    /// Reading stops after this many events, over all files.
    pub max_events: usize,
    /// A longer line is skipped (and counted) without being parsed.
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_file_bytes: 256 << 20,
            max_events: 2_000_000,
            max_line_bytes: 64 << 10,
        }
    }
}

/// An interned id (a job's or a node's): an index into [`Log::names`].
pub type Name = u32;

/// Whose log an event came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// A node, by its id (from its `start` event), or by the file's name when the log never says.
    Node { id: String, from_file_name: bool },
    /// A coordinator, by its key (from its `start` event), or by the file's name.
    Coordinator { key: String, from_file_name: bool },
}

/// A job phase as the logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Accepted,
    Assigned,
    Started,
    Committed,
    Revealed,
    Failed,
    CancelRequested,
}

impl Phase {
    fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "accepted" => Phase::Accepted,
            "assigned" => Phase::Assigned,
            "started" => Phase::Started,
            "committed" => Phase::Committed,
            "revealed" => Phase::Revealed,
            "failed" => Phase::Failed,
            "cancel_requested" => Phase::CancelRequested,
            _ => return None,
        })
    }
}

/// What an event says, in the terms the timeline needs.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// A node's or a coordinator's `start`.
    Start,
    /// A job phase. `node` is set where a coordinator's event names the node it is about; in a
    /// node's own log the writer is the node.
    Job {
        job: Name,
        phase: Phase,
        node: Option<Name>,
        error: Option<Box<str>>,
    },
    /// A coordinator's decision on a job: who agreed and who did not.
    Decided {
        job: Name,
        agreeing: Vec<Name>,
        dissenting: Vec<Name>,
        disputed: bool,
    },
    /// A coordinator slashed `node` over `job`.
    Slashed { job: Name, node: Name },
    /// A node joined, left, went offline, came back, shut down, missed a heartbeat: `node`
    /// names it in a coordinator's log; in a node's own log the writer is the node.
    Membership { node: Option<Name>, what: Box<str> },
}

/// One event kept for the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub ts_us: u64,
    /// Index into [`Log::writers`].
    pub writer: usize,
    pub what: What,
}

/// What one file gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStats {
    /// The path (or name) it was read as.
    pub path: String,
    /// Event lines read (including kinds the timeline does not draw).
    pub events: u64,
    /// Lines skipped: not JSON, or not an object with `ts_us` and `event`.
    pub skipped: u64,
}

/// Every file's events, merged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Log {
    /// Ordered by `ts_us`; events with equal times keep file order, then line order.
    pub events: Vec<Event>,
    /// Interned ids, by [`Name`].
    pub names: Vec<String>,
    pub writers: Vec<Writer>,
    pub files: Vec<FileStats>,
    /// Reading stopped at [`Limits::max_events`]: later events are missing.
    pub truncated: bool,
}

impl Log {
    /// The id `name` stands for.
    pub fn name(&self, name: Name) -> &str {
        self.names.get(name as usize).map_or("", String::as_str)
    }

    /// Event lines read over all files.
    pub fn events_read(&self) -> u64 {
        self.files.iter().map(|f| f.events).sum()
    }

    /// Lines skipped over all files.
    pub fn lines_skipped(&self) -> u64 {
        self.files.iter().map(|f| f.skipped).sum()
    }
}

/// Read and merge the files at `paths`.
pub fn read_files<P: AsRef<Path>>(paths: &[P], limits: &Limits) -> Result<Log, TimelineError> {
    let mut reader = Reader::new(*limits);
    for path in paths {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let io = |source| TimelineError::Read {
            path: shown.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        if bytes > limits.max_file_bytes {
            return Err(TimelineError::TooLarge {
                path: shown,
                bytes,
                limit: limits.max_file_bytes,
            });
        }
        reader.add(&shown, BufReader::new(file))?;
    }
    Ok(reader.finish())
}

/// Read and merge logs already in memory, each with the name it is shown as.
pub fn read_sources(sources: &[(&str, &[u8])], limits: &Limits) -> Result<Log, TimelineError> {
    let mut reader = Reader::new(*limits);
    for (name, bytes) in sources {
        reader.add(name, *bytes)?;
    }
    Ok(reader.finish())
}

/// Merges files one at a time.
struct Reader {
    limits: Limits,
    log: Log,
    ids: HashMap<String, Name>,
    total: usize,
}

impl Reader {
    fn new(limits: Limits) -> Reader {
        Reader {
            limits,
            log: Log::default(),
            ids: HashMap::new(),
            total: 0,
        }
    }

    fn intern(&mut self, id: &str) -> Name {
        let id = cut(id, MAX_ID_CHARS);
        if let Some(n) = self.ids.get(id) {
            return *n;
        }
        // At most `max_events` events, each naming a bounded number of ids: this fits a u32
        // for any limit that fits in memory; saturate rather than wrap if it ever does not.
        let n = Name::try_from(self.log.names.len()).unwrap_or(Name::MAX);
        self.log.names.push(id.to_string());
        self.ids.insert(id.to_string(), n);
        n
    }

    fn writer(&mut self, w: Writer) -> usize {
        if let Some(i) = self.log.writers.iter().position(|x| *x == w) {
            return i;
        }
        self.log.writers.push(w);
        self.log.writers.len() - 1
    }

    /// Read one file. Events written before the file's first `start` belong to the writer that
    /// `start` names; a file with no `start` at all is named after the file.
    fn add(&mut self, path: &str, mut input: impl BufRead) -> Result<(), TimelineError> {
        let mut stats = FileStats {
            path: path.to_string(),
            events: 0,
            skipped: 0,
        };
        let first_event = self.log.events.len();
        let mut current: Option<usize> = None;
        let mut coordinator_like = false;
        let mut read: u64 = 0;
        let mut line = Vec::new();
        loop {
            if self.total >= self.limits.max_events {
                self.log.truncated = true;
                break;
            }
            line.clear();
            // `take` bounds one line as well as the file: a file that grew past the limit
            // after its size was checked (or an in-memory source) is refused all the same.
            let room = self
                .limits
                .max_file_bytes
                .saturating_sub(read)
                .saturating_add(1);
            let mut bounded = (&mut input).take(room);
            let (n, overlong) = read_line(&mut bounded, &mut line, self.limits.max_line_bytes)
                .map_err(|source| TimelineError::Read {
                    path: path.to_string(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            read = read.saturating_add(n);
            if read > self.limits.max_file_bytes {
                return Err(TimelineError::TooLarge {
                    path: path.to_string(),
                    bytes: read,
                    limit: self.limits.max_file_bytes,
                });
            }
            if overlong {
                stats.skipped += 1;
                continue;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let Some((ts_us, event, obj)) = parse_line(&line) else {
                stats.skipped += 1;
                continue;
            };
            stats.events += 1;
            self.total += 1;
            if event == "start" {
                let named = |k: &str| obj.get(k).and_then(Value::as_str);
                let w = if let Some(key) = named("coordinator") {
                    Writer::Coordinator {
                        key: cut(key, MAX_ID_CHARS).to_string(),
                        from_file_name: false,
                    }
                } else if let Some(id) = named("node_id") {
                    Writer::Node {
                        id: cut(id, MAX_ID_CHARS).to_string(),
                        from_file_name: false,
                    }
                } else {
                    continue;
                };
                let w = self.writer(w);
                if current.is_none() {
                    for e in &mut self.log.events[first_event..] {
                        e.writer = w;
                    }
                }
                current = Some(w);
                self.push(ts_us, w, What::Start);
                continue;
            }
            let Some(what) = self.what(&event, &obj) else {
                continue;
            };
            coordinator_like |= matches!(
                what,
                What::Decided { .. }
                    | What::Slashed { .. }
                    | What::Job { node: Some(_), .. }
                    | What::Membership { node: Some(_), .. }
            );
            // usize::MAX marks "not known yet": fixed below once the file says who wrote it.
            self.push(ts_us, current.unwrap_or(usize::MAX), what);
        }
        if current.is_none() && self.log.events.len() > first_event {
            let name = file_name(path);
            let w = if coordinator_like {
                Writer::Coordinator {
                    key: name,
                    from_file_name: true,
                }
            } else {
                Writer::Node {
                    id: name,
                    from_file_name: true,
                }
            };
            let w = self.writer(w);
            for e in &mut self.log.events[first_event..] {
                e.writer = w;
            }
        }
        self.log.files.push(stats);
        Ok(())
    }

    fn push(&mut self, ts_us: u64, writer: usize, what: What) {
        self.log.events.push(Event {
            ts_us,
            writer,
            what,
        });
    }

    /// The part of an event the timeline draws, or `None` for events it ignores.
    fn what(&mut self, event: &str, obj: &Map<String, Value>) -> Option<What> {
        let text = |k: &str| obj.get(k).and_then(Value::as_str);
        match event {
            "job" => {
                let job = self.intern(text("job")?);
                let phase = text("phase")?;
                if phase == "decided" {
                    let mut list = |k: &str| -> Vec<Name> {
                        let items = obj.get(k).and_then(Value::as_array);
                        let ids = items.into_iter().flatten().filter_map(Value::as_str);
                        ids.take(MAX_LISTED_NODES)
                            .map(|id| self.intern(id))
                            .collect()
                    };
                    let agreeing = list("agreeing");
                    let dissenting = list("dissenting");
                    let disputed = obj.get("disputed").and_then(Value::as_bool) == Some(true);
                    return Some(What::Decided {
                        job,
                        agreeing,
                        dissenting,
                        disputed,
                    });
                }
                let phase = Phase::parse(phase)?;
                let node = text("node").map(|n| self.intern(n));
                let error = text("error").map(|e| cut(e, MAX_TEXT_CHARS).into());
                Some(What::Job {
                    job,
                    phase,
                    node,
                    error,
                })
            }
            "slashed" => {
                let job = self.intern(text("job")?);
                let node = self.intern(text("node")?);
                Some(What::Slashed { job, node })
            }
            // The coordinator's view of a node's membership.
            "node" => {
                let node = self.intern(text("node")?);
                let what = cut(text("phase").unwrap_or("node"), 24).into();
                Some(What::Membership {
                    node: Some(node),
                    what,
                })
            }
            // A node's own view of its membership and life.
            "joined" | "left" | "shutdown" | "heartbeat_failed" => Some(What::Membership {
                node: None,
                what: event.into(),
            }),
            _ => None,
        }
    }

    fn finish(mut self) -> Log {
        // Stable: equal times keep file order, then line order.
        self.log.events.sort_by_key(|e| e.ts_us);
        self.log
    }
}

/// Read one line (through its newline, or to the end) from `input`, keeping at most `keep`
/// bytes of it in `line`: (bytes consumed, whether the line was longer than `keep`).
fn read_line(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    keep: usize,
) -> std::io::Result<(u64, bool)> {
    let (mut consumed, mut overlong) = (0u64, false);
    loop {
        let buf = match input.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok((consumed, overlong));
        }
        let (n, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = keep.saturating_sub(line.len());
        overlong |= n > room;
        line.extend_from_slice(&buf[..n.min(room)]);
        input.consume(n);
        consumed = consumed.saturating_add(n as u64);
        if done {
            return Ok((consumed, overlong));
        }
    }
}

/// `(ts_us, event, the object)` of one line, or `None` if it is not an event.
fn parse_line(line: &[u8]) -> Option<(u64, String, Map<String, Value>)> {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    let ts_us = obj.get("ts_us")?.as_u64()?;
    let Some(Value::String(event)) = obj.remove("event") else {
        return None;
    };
    Some((ts_us, event, obj))
}

/// `s` cut to at most `max` characters (on a character boundary).
pub fn cut(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The last component of `path`, for naming a log that never says who wrote it.
fn file_name(path: &str) -> String {
    let name = Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    cut(&name, MAX_ID_CHARS).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const NODE_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn read(sources: &[(&str, &str)], limits: Limits) -> Result<Log, TimelineError> {
        let bytes: Vec<(&str, &[u8])> = sources.iter().map(|(n, s)| (*n, s.as_bytes())).collect();
        read_sources(&bytes, &limits)
    }

    #[test]
    fn two_logs_interleave_by_ts_and_keep_file_order_on_ties() {
        let a = format!(
            "{{\"ts_us\":10,\"event\":\"start\",\"node_id\":\"{NODE_A}\",\"open\":true}}\n\
             {{\"ts_us\":30,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"accepted\"}}\n\
             {{\"ts_us\":50,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"started\"}}\n"
        );
        let b = format!(
            "{{\"ts_us\":20,\"event\":\"start\",\"node_id\":\"{NODE_B}\"}}\n\
             {{\"ts_us\":30,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"accepted\"}}\n\
             {{\"ts_us\":40,\"event\":\"request\",\"path\":\"/v1/jobs\"}}\n\
             {{\"ts_us\":45,\"event\":\"job\",\"job\":\"j1\",\"phase\":\"started\",\"new\":1}}\n"
        );
        let log = read(&[("a.jsonl", &a), ("b.jsonl", &b)], Limits::default()).unwrap();
        let order: Vec<(u64, usize)> = log.events.iter().map(|e| (e.ts_us, e.writer)).collect();
        // The request is read (counted) but not kept; the 30 µs tie keeps a before b.
        assert_eq!(
            order,
            vec![(10, 0), (20, 1), (30, 0), (30, 1), (45, 1), (50, 0)]
        );
        assert_eq!(log.events_read(), 7);
        assert_eq!(log.lines_skipped(), 0);
        assert_eq!(
            log.writers[0],
            Writer::Node {
                id: NODE_A.into(),
                from_file_name: false
            }
        );
        let j = &log.events[2].what;
        assert!(
            matches!(
                j,
                What::Job {
                    phase: Phase::Accepted,
                    node: None,
                    ..
                }
            ),
            "{j:?}"
        );
    }

    #[test]
    fn bad_lines_are_counted_not_fatal() {
        let text = format!(
            "{{\"ts_us\":1,\"event\":\"start\",\"node_id\":\"{NODE_A}\"}}\n\
             not json at all\n\
             \n\
             [1,2,3]\n\
             {{\"event\":\"job\",\"job\":\"j\",\"phase\":\"started\"}}\n\
             {{\"ts_us\":-5,\"event\":\"job\"}}\n\
             {{\"ts_us\":2,\"event\":\"job\",\"job\":\"j\",\"phase\":\"started\"}}\n\
             {{\"ts_us\":3,\"event\":\"job\",\"job\":\"j\",\"phase\":\"comm"
        );
        let log = read(&[("n.jsonl", &text)], Limits::default()).unwrap();
        assert_eq!(log.lines_skipped(), 5, "{:?}", log.files);
        assert_eq!(log.events_read(), 2);
        assert_eq!(log.events.len(), 2);
    }

    #[test]
    fn an_oversized_log_is_refused() {
        let dir = std::env::temp_dir().join(format!("tenet-timeline-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.jsonl");
        let line = "{\"ts_us\":1,\"event\":\"shutdown\"}\n";
        std::fs::write(&path, line.repeat(100)).unwrap();
        let limits = Limits {
            max_file_bytes: 1000,
            ..Limits::default()
        };
        let err = read_files(&[&path], &limits).unwrap_err();
        assert!(
            matches!(err, TimelineError::TooLarge { bytes, limit: 1000, .. } if bytes == 3100),
            "{err}"
        );
        assert!(
            err.to_string().contains("over the 1000-byte limit"),
            "{err}"
        );
        // The same bound holds for a source whose size is not known up front.
        let err = read(&[("mem", &line.repeat(100))], limits).unwrap_err();
        assert!(matches!(err, TimelineError::TooLarge { .. }), "{err}");
        // Under the limit it reads.
        let log = read_files(&[&path], &Limits::default()).unwrap();
        assert_eq!(log.events_read(), 100);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overlong_lines_are_skipped_unparsed() {
        let ok = "{\"ts_us\":1,\"event\":\"shutdown\"}\n";
        let long = format!(
            "{{\"ts_us\":2,\"event\":\"shutdown\",\"pad\":\"{}\"}}\n",
            "x".repeat(500)
        );
        let limits = Limits {
            max_line_bytes: 100,
            ..Limits::default()
        };
        let text = format!("{ok}{long}{ok}{long}");
        // Through a tiny buffer too, so a line spans many reads.
        let reader = std::io::BufReader::with_capacity(7, text.as_bytes());
        let mut r = Reader::new(limits);
        r.add("small-buffer", reader).unwrap();
        r.add("whole", text.as_bytes()).unwrap();
        let log = r.finish();
        for f in &log.files {
            assert_eq!((f.events, f.skipped), (2, 2), "{f:?}");
        }
        assert!(log.events.iter().all(|e| e.ts_us == 1));
    }

    #[test]
    fn reading_stops_at_the_event_cap() {
        let line = "{\"ts_us\":1,\"event\":\"job\",\"job\":\"j\",\"phase\":\"started\"}\n";
        let limits = Limits {
            max_events: 10,
            ..Limits::default()
        };
        let log = read(&[("a", &line.repeat(8)), ("b", &line.repeat(8))], limits).unwrap();
        assert!(log.truncated);
        assert_eq!(log.events_read(), 10);
        assert_eq!(log.events.len(), 10);
    }

    #[test]
    fn a_log_without_start_is_named_after_its_file_and_ids_are_cut() {
        let long = "j".repeat(1000);
        let text = format!(
            "{{\"ts_us\":5,\"event\":\"job\",\"job\":\"{long}\",\"phase\":\"assigned\",\"node\":\"n\"}}\n"
        );
        let log = read(&[("/tmp/x/coord.jsonl", &text)], Limits::default()).unwrap();
        assert_eq!(
            log.writers,
            vec![Writer::Coordinator {
                key: "coord.jsonl".into(),
                from_file_name: true
            }]
        );
        assert_eq!(log.names[0].len(), MAX_ID_CHARS);
    }

    #[test]
    fn events_before_start_belong_to_the_starting_writer() {
        let text = format!(
            "{{\"ts_us\":5,\"event\":\"job\",\"job\":\"j\",\"phase\":\"started\"}}\n\
             {{\"ts_us\":6,\"event\":\"start\",\"coordinator\":\"{NODE_B}\",\"addr\":\"x\"}}\n\
             {{\"ts_us\":7,\"event\":\"job\",\"job\":\"j\",\"phase\":\"decided\",\"agreeing\":[\"{NODE_A}\"],\"dissenting\":[\"n2\"],\"disputed\":false}}\n"
        );
        let log = read(&[("c", &text)], Limits::default()).unwrap();
        assert_eq!(log.writers.len(), 1);
        assert!(log.events.iter().all(|e| e.writer == 0));
        let What::Decided {
            agreeing,
            dissenting,
            ..
        } = &log.events[2].what
        else {
            panic!("{:?}", log.events[2]);
        };
        assert_eq!(log.name(agreeing[0]), NODE_A);
        assert_eq!(log.name(dissenting[0]), "n2");
    }
}
