//! What `tenet top` knows about a coordinator, as plain data: the nodes and jobs its API lists,
//! merged with the events its stream sends, and what the screen derives from them —
//! throughput over a sliding window, jobs in flight per node, the queue, the latest slashes,
//! and the nodes table's order and filter. No I/O and no clock: every time is passed in
//! (microseconds since the Unix epoch, the events' `ts_us`), so all of it is tested directly.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::Value;

/// Decisions counted for the throughput figure: the last 10 s.
pub const WINDOW_US: u64 = 10_000_000;
/// Seconds of throughput history kept for the sparkline.
pub const HISTORY_SECS: usize = 60;
/// Jobs remembered; past it the oldest finished ones are forgotten (their counts stay).
pub const MAX_JOBS: usize = 4096;
/// Slashes listed.
pub const MAX_SLASHES: usize = 64;
/// (job, node) slashes remembered to tell a replayed event (after a reconnect) from a new one.
const MAX_SLASH_KEYS: usize = 4096;
/// A node id or job id as shown: its first 12 hex digits.
pub const SHORT: usize = 12;

/// The first [`SHORT`] characters of an id.
pub fn short(id: &str) -> &str {
    match id.char_indices().nth(SHORT) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

/// A job's state, as the coordinator's ledger names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobState {
    #[default]
    Pending,
    Committing,
    Revealing,
    Decided,
    Failed,
}

impl JobState {
    pub fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "pending" => JobState::Pending,
            "committing" => JobState::Committing,
            "revealing" => JobState::Revealing,
            "decided" => JobState::Decided,
            "failed" => JobState::Failed,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Committing => "committing",
            JobState::Revealing => "revealing",
            JobState::Decided => "decided",
            JobState::Failed => "failed",
        }
    }

    /// How far along: a state only ever moves forward, whichever source says so first.
    fn rank(self) -> u8 {
        match self {
            JobState::Pending => 0,
            JobState::Committing => 1,
            JobState::Revealing => 2,
            JobState::Decided | JobState::Failed => 3,
        }
    }

    pub fn finished(self) -> bool {
        self.rank() == 3
    }

    /// Waiting for its nodes to commit: what `queue` counts.
    pub fn queued(self) -> bool {
        matches!(self, JobState::Pending | JobState::Committing)
    }
}

/// One job, from its events and from the API's listing.
#[derive(Clone, Debug, Default)]
pub struct Job {
    pub id: String,
    pub task: Option<String>,
    pub state: JobState,
    /// Nodes asked, in the order they were assigned.
    pub assigned: Vec<String>,
    /// Assigned nodes that are through with it: revealed, lied, withheld or failed.
    pub done: HashSet<String>,
    /// Nodes asked in all, once decided (or as the job was accepted).
    pub replicas: Option<u64>,
    /// Nodes that agreed on the decided output.
    pub agreeing: Option<usize>,
    pub dissenting: usize,
    /// From accepted to decided, as the coordinator measured it.
    pub ms: Option<f64>,
    pub disputed: bool,
    pub refereed: bool,
    pub error: Option<String>,
    /// When this job last changed (its newest event, or its listing's `updated_at`).
    pub updated_us: u64,
    /// Order first seen (ties in `updated_us`).
    seq: u64,
}

impl Job {
    /// Nodes still working on it: assigned and not through, while it is not finished.
    pub fn busy_nodes(&self) -> impl Iterator<Item = &str> {
        let live = !self.state.finished();
        self.assigned
            .iter()
            .filter(move |n| live && !self.done.contains(*n))
            .map(String::as_str)
    }
}

/// One node, as `GET /v1/nodes` lists it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub id: String,
    pub url: String,
    pub state: String,
    pub stake: i64,
    pub score: f64,
    pub agreed: i64,
    pub disagreed: i64,
    pub device: String,
    pub operator: String,
    /// Unix seconds; 0: never.
    pub last_heartbeat: u64,
}

impl Node {
    fn from_json(v: &Value) -> Option<Node> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let id = v.get("id")?.as_str()?.to_string();
        Some(Node {
            id,
            url: s("url"),
            state: s("state"),
            stake: v.get("stake").and_then(Value::as_i64).unwrap_or(0),
            score: v.get("score").and_then(Value::as_f64).unwrap_or(0.0),
            agreed: v.get("agreed").and_then(Value::as_i64).unwrap_or(0),
            disagreed: v.get("disagreed").and_then(Value::as_i64).unwrap_or(0),
            device: s("device"),
            operator: s("operator"),
            last_heartbeat: v.get("last_heartbeat").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// One slash seen on the event stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Slash {
    pub ts_us: u64,
    pub node: String,
    pub job: String,
    pub amount: i64,
}

/// The coordinator's `GET /v1/info`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Info {
    pub coordinator: String,
    pub version: String,
    pub replicas: u64,
    pub open: bool,
    pub public_dashboard: bool,
}

impl Info {
    pub fn from_json(v: &Value) -> Info {
        Info {
            coordinator: v["coordinator"].as_str().unwrap_or("").to_string(),
            version: v["version"].as_str().unwrap_or("").to_string(),
            replicas: v["replicas"].as_u64().unwrap_or(0),
            open: v["open"].as_bool().unwrap_or(false),
            public_dashboard: v["public_dashboard"].as_bool().unwrap_or(false),
        }
    }
}

/// A job's phase on the event stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    Accepted {
        task: Option<String>,
        replicas: Option<u64>,
    },
    Assigned(String),
    Committed(String),
    /// Revealed (`lied`: a reveal that did not open its commitment, `withheld`: none).
    Revealed(String),
    Lied(String),
    Withheld(String),
    NodeFailed(String),
    Decided {
        agreeing: Vec<String>,
        dissenting: Vec<String>,
        replicas: Option<u64>,
        refereed: bool,
        disputed: bool,
        ms: Option<f64>,
    },
    Failed(String),
    /// A phase this version does not know.
    Other(String),
}

/// One event of `GET /v1/events`, the fields `tenet top` reads; anything else in it is
/// ignored, and an event it does not know is [`Event::Other`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Job {
        ts_us: u64,
        job: String,
        phase: Phase,
    },
    Slashed(Slash),
    Node {
        ts_us: u64,
        node: String,
        phase: String,
        url: Option<String>,
        stake: Option<i64>,
        device: Option<String>,
    },
    Start {
        ts_us: u64,
    },
    Shutdown {
        ts_us: u64,
    },
    Other {
        ts_us: u64,
    },
}

impl Event {
    pub fn ts_us(&self) -> u64 {
        match self {
            Event::Job { ts_us, .. }
            | Event::Node { ts_us, .. }
            | Event::Start { ts_us }
            | Event::Shutdown { ts_us }
            | Event::Other { ts_us } => *ts_us,
            Event::Slashed(s) => s.ts_us,
        }
    }
}

/// Read one event object; `None` when it is not one (not an object, no `event` name, or a
/// known event missing a field it cannot do without).
pub fn parse_event(v: &Value) -> Option<Event> {
    let ts_us = v.get("ts_us").and_then(Value::as_u64).unwrap_or(0);
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let node = || text("node");
    Some(match v.get("event")?.as_str()? {
        "job" => {
            let job = text("job")?;
            let phase = match v.get("phase").and_then(Value::as_str).unwrap_or("") {
                "accepted" => Phase::Accepted {
                    task: text("task"),
                    replicas: v.get("replicas").and_then(Value::as_u64),
                },
                "assigned" => Phase::Assigned(node()?),
                "committed" => Phase::Committed(node()?),
                "revealed" => Phase::Revealed(node()?),
                "lied" => Phase::Lied(node()?),
                "withheld" => Phase::Withheld(node()?),
                "node_failed" => Phase::NodeFailed(node()?),
                "decided" => {
                    let ids = |k: &str| -> Vec<String> {
                        v.get(k)
                            .and_then(Value::as_array)
                            .map(|a| {
                                a.iter()
                                    .filter_map(|x| x.as_str().map(str::to_string))
                                    .collect()
                            })
                            .unwrap_or_default()
                    };
                    Phase::Decided {
                        agreeing: ids("agreeing"),
                        dissenting: ids("dissenting"),
                        replicas: v.get("replicas").and_then(Value::as_u64),
                        refereed: v.get("refereed").and_then(Value::as_bool).unwrap_or(false),
                        disputed: v.get("disputed").and_then(Value::as_bool).unwrap_or(false),
                        ms: v.get("ms").and_then(Value::as_f64),
                    }
                }
                "failed" => Phase::Failed(text("error").unwrap_or_default()),
                other => Phase::Other(other.to_string()),
            };
            Event::Job { ts_us, job, phase }
        }
        "slashed" => Event::Slashed(Slash {
            ts_us,
            node: node()?,
            job: text("job").unwrap_or_default(),
            amount: v.get("amount").and_then(Value::as_i64).unwrap_or(0),
        }),
        "node" => Event::Node {
            ts_us,
            node: node()?,
            phase: text("phase").unwrap_or_default(),
            url: text("url"),
            stake: v.get("stake").and_then(Value::as_i64),
            device: text("device"),
        },
        "start" => Event::Start { ts_us },
        "shutdown" => Event::Shutdown { ts_us },
        _ => Event::Other { ts_us },
    })
}

/// The nodes table's sort column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Stake,
    Score,
    InFlight,
    Id,
}

impl SortKey {
    pub fn next(self) -> SortKey {
        match self {
            SortKey::Stake => SortKey::Score,
            SortKey::Score => SortKey::InFlight,
            SortKey::InFlight => SortKey::Id,
            SortKey::Id => SortKey::Stake,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Stake => "stake",
            SortKey::Score => "score",
            SortKey::InFlight => "in-flight",
            SortKey::Id => "id",
        }
    }
}

/// What the viewer chose: order, filter, selection, pause.
#[derive(Clone, Debug, Default)]
pub struct ViewState {
    pub sort: SortKey,
    /// Reverse the sort's natural order (largest stake, score and in-flight first; ids A–Z).
    pub reverse: bool,
    /// Nodes shown are those whose id, state or device contains this (any case).
    pub filter: String,
    /// The filter is being typed.
    pub editing: bool,
    /// The selected node's id.
    pub selected: Option<String>,
    pub paused: bool,
}

impl ViewState {
    /// Move the selection `by` rows within `rows` (the table as shown), clamped to its ends;
    /// the first row when nothing was selected.
    pub fn move_selection(&mut self, rows: &[NodeRow<'_>], by: isize) {
        if rows.is_empty() {
            self.selected = None;
            return;
        }
        let at = self
            .selected
            .as_ref()
            .and_then(|id| rows.iter().position(|r| &r.node.id == id));
        let to = match at {
            Some(i) => (i as isize + by).clamp(0, rows.len() as isize - 1) as usize,
            None => 0,
        };
        self.selected = Some(rows[to].node.id.clone());
    }

    /// The selected row's index in `rows`, if it is there.
    pub fn selected_index(&self, rows: &[NodeRow<'_>]) -> Option<usize> {
        let id = self.selected.as_ref()?;
        rows.iter().position(|r| &r.node.id == id)
    }
}

/// A row of the nodes table.
#[derive(Clone, Debug)]
pub struct NodeRow<'a> {
    pub node: &'a Node,
    /// Jobs assigned to it that it is not through with.
    pub in_flight: usize,
    /// Times it is known to have been slashed (0: never).
    pub slashed: u64,
}

/// Everything `tenet top` knows.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub info: Option<Info>,
    pub nodes: Vec<Node>,
    jobs: HashMap<String, Job>,
    /// Job ids in the order first seen, for forgetting the oldest.
    order: VecDeque<String>,
    next_seq: u64,
    pub decided_total: u64,
    pub failed_total: u64,
    /// The first listing of jobs was cut at its limit: older jobs are not counted.
    pub totals_partial: bool,
    /// When each recent decision happened (µs), for throughput.
    decisions: Vec<u64>,
    /// Newest first.
    pub slashes: VecDeque<Slash>,
    slash_keys: HashSet<(String, String)>,
    slash_key_order: VecDeque<(String, String)>,
    /// Slash events seen per node.
    slashed_seen: HashMap<String, u64>,
    slash_events: u64,
    /// The coordinator's `start` event, if the stream still held it.
    pub started_us: Option<u64>,
    pub shutdown: bool,
    /// The newest event time seen: a coordinator whose clock runs ahead of ours does not
    /// put its events in the future.
    pub newest_us: u64,
    pub events_seen: u64,
}

impl Model {
    pub fn set_info(&mut self, v: &Value) {
        self.info = Some(Info::from_json(v));
    }

    /// Replace the nodes with `GET /v1/nodes`'s list (entries without an id are skipped).
    pub fn set_nodes(&mut self, v: &Value) {
        if let Some(list) = v.as_array() {
            self.nodes = list.iter().filter_map(Node::from_json).collect();
        }
    }

    /// The job `id`, made if new (and the oldest finished ones forgotten past [`MAX_JOBS`]).
    fn job_mut(&mut self, id: &str) -> &mut Job {
        if !self.jobs.contains_key(id) {
            self.next_seq += 1;
            let job = Job {
                id: id.to_string(),
                seq: self.next_seq,
                ..Job::default()
            };
            self.jobs.insert(id.to_string(), job);
            self.order.push_back(id.to_string());
            self.forget_old(id);
        }
        self.jobs.get_mut(id).expect("inserted above")
    }

    fn forget_old(&mut self, keep: &str) {
        let mut passes = 0;
        while self.jobs.len() > MAX_JOBS && passes <= self.order.len() {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            let running = self.jobs.get(&id).is_some_and(|j| !j.state.finished());
            // Jobs still running stay while finished ones can go instead.
            if id == keep || (running && passes < self.order.len()) {
                self.order.push_back(id);
                passes += 1;
            } else {
                self.jobs.remove(&id);
            }
        }
    }

    /// Move a job's state forward to `to` (never back); counts the job once when it ends.
    fn advance(&mut self, id: &str, to: JobState, at_us: u64) {
        let job = self.job_mut(id);
        if to.rank() <= job.state.rank() {
            return;
        }
        job.state = to;
        match to {
            JobState::Decided => {
                self.decided_total += 1;
                self.decisions.push(at_us);
            }
            JobState::Failed => self.failed_total += 1,
            _ => {}
        }
    }

    /// Apply one event from the stream (a replayed one changes nothing twice).
    pub fn apply(&mut self, ev: Event) {
        self.events_seen += 1;
        let ts = ev.ts_us();
        self.newest_us = self.newest_us.max(ts);
        match ev {
            Event::Job { ts_us, job, phase } => {
                {
                    let j = self.job_mut(&job);
                    j.updated_us = j.updated_us.max(ts_us);
                }
                match phase {
                    Phase::Accepted { task, replicas } => {
                        let j = self.job_mut(&job);
                        j.task = j.task.take().or(task);
                        j.replicas = j.replicas.or(replicas);
                    }
                    Phase::Assigned(node) => {
                        let j = self.job_mut(&job);
                        if !j.assigned.contains(&node) {
                            j.assigned.push(node);
                        }
                    }
                    Phase::Committed(_) => self.advance(&job, JobState::Committing, ts_us),
                    Phase::Revealed(node) | Phase::Lied(node) | Phase::Withheld(node) => {
                        self.job_mut(&job).done.insert(node);
                        self.advance(&job, JobState::Revealing, ts_us);
                    }
                    Phase::NodeFailed(node) => {
                        self.job_mut(&job).done.insert(node);
                    }
                    Phase::Decided {
                        agreeing,
                        dissenting,
                        replicas,
                        refereed,
                        disputed,
                        ms,
                    } => {
                        self.advance(&job, JobState::Decided, ts_us);
                        let j = self.job_mut(&job);
                        j.agreeing = Some(agreeing.len());
                        j.dissenting = dissenting.len();
                        j.replicas = replicas.or(j.replicas);
                        j.refereed = refereed;
                        j.disputed = disputed;
                        j.ms = ms;
                    }
                    Phase::Failed(error) => {
                        self.advance(&job, JobState::Failed, ts_us);
                        self.job_mut(&job).error = Some(error);
                    }
                    Phase::Other(_) => {}
                }
            }
            Event::Slashed(s) => self.slashed(s),
            Event::Node {
                node,
                phase,
                url,
                stake,
                device,
                ..
            } => {
                let state = match phase.as_str() {
                    "joined" | "healthy" => "active",
                    "offline" => "unhealthy",
                    "left" => "deregistered",
                    _ => return,
                };
                match self.nodes.iter_mut().find(|n| n.id == node) {
                    Some(n) => n.state = state.to_string(),
                    None if phase == "joined" => self.nodes.push(Node {
                        id: node,
                        url: url.unwrap_or_default(),
                        state: state.to_string(),
                        stake: stake.unwrap_or(0),
                        score: 1.0,
                        device: device.unwrap_or_default(),
                        ..Node::default()
                    }),
                    None => {}
                }
            }
            Event::Start { ts_us } => {
                self.started_us = Some(ts_us);
                self.shutdown = false;
            }
            Event::Shutdown { .. } => self.shutdown = true,
            Event::Other { .. } => {}
        }
    }

    /// Apply one event as JSON; false when it is not an event (ignored).
    pub fn apply_json(&mut self, v: &Value) -> bool {
        match parse_event(v) {
            Some(e) => {
                self.apply(e);
                true
            }
            None => false,
        }
    }

    fn slashed(&mut self, s: Slash) {
        let key = (s.job.clone(), s.node.clone());
        if !s.job.is_empty() {
            if !self.slash_keys.insert(key.clone()) {
                return;
            }
            self.slash_key_order.push_back(key);
            if self.slash_key_order.len() > MAX_SLASH_KEYS
                && let Some(old) = self.slash_key_order.pop_front()
            {
                self.slash_keys.remove(&old);
            }
        }
        *self.slashed_seen.entry(s.node.clone()).or_default() += 1;
        self.slash_events += 1;
        // Newest first, by the coordinator's clock (a backlog arrives oldest first).
        let at = self
            .slashes
            .iter()
            .position(|o| o.ts_us <= s.ts_us)
            .unwrap_or(self.slashes.len());
        self.slashes.insert(at, s);
        self.slashes.truncate(MAX_SLASHES);
    }

    /// Merge a `GET /v1/jobs` listing (or one `GET /v1/jobs/{id}` as a one-element list).
    /// `first` with `limit`: the first listing, which sets [`Model::totals_partial`] when full.
    pub fn apply_jobs(&mut self, v: &Value, first_limit: Option<usize>) {
        let Some(list) = v.as_array() else {
            return;
        };
        if let Some(limit) = first_limit {
            self.totals_partial = list.len() >= limit;
        }
        // Oldest first, so that jobs new to us are numbered in order.
        for j in list.iter().rev() {
            self.apply_job(j);
        }
    }

    /// Merge one job as the API shows it.
    pub fn apply_job(&mut self, v: &Value) {
        let Some(id) = v.get("job_id").and_then(Value::as_str) else {
            return;
        };
        let Some(state) = v
            .get("state")
            .and_then(Value::as_str)
            .and_then(JobState::parse)
        else {
            return;
        };
        let updated_us = v
            .get("updated_at")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        self.advance(id, state, updated_us);
        let j = self.job_mut(id);
        if j.updated_us == 0 {
            j.updated_us = updated_us;
        }
        if j.task.is_none() {
            j.task = v.get("task").and_then(Value::as_str).map(str::to_string);
        }
        let receipt = v.get("receipt").filter(|r| r.is_object());
        if let Some(r) = receipt {
            if j.agreeing.is_none() {
                j.agreeing = r.get("nodes").and_then(Value::as_array).map(Vec::len);
            }
            if let Some(n) = r.get("replicas").and_then(Value::as_u64) {
                j.replicas = Some(n);
            }
            if r.get("dispute").is_some_and(|d| !d.is_null()) {
                j.disputed = true;
            }
        }
        if j.replicas.is_none() {
            j.replicas = v.get("replicas").and_then(Value::as_u64);
        }
        if j.error.is_none() {
            j.error = v.get("error").and_then(Value::as_str).map(str::to_string);
        }
    }

    /// Jobs not finished whose newest news is older than `older_than_us` before `now_us`:
    /// ones whose end the stream may not have told (a reconnect loses events), to be asked
    /// about one by one; at most `n`, oldest first.
    pub fn stale_jobs(&self, now_us: u64, older_than_us: u64, n: usize) -> Vec<String> {
        let mut v: Vec<&Job> = self
            .jobs
            .values()
            .filter(|j| !j.state.finished() && j.updated_us + older_than_us < now_us)
            .collect();
        v.sort_by_key(|j| (j.updated_us, j.seq));
        v.into_iter().take(n).map(|j| j.id.clone()).collect()
    }

    #[cfg(test)]
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    pub fn jobs_known(&self) -> usize {
        self.jobs.len()
    }

    /// Jobs accepted and not yet decided (or failed).
    pub fn in_flight(&self) -> usize {
        self.jobs.values().filter(|j| !j.state.finished()).count()
    }

    /// Jobs waiting for their nodes' commitments (`pending` or `committing`).
    pub fn queue(&self) -> usize {
        self.jobs.values().filter(|j| j.state.queued()).count()
    }

    /// Jobs each node is working on: assigned to it and not through, per node id.
    pub fn node_in_flight(&self) -> HashMap<&str, usize> {
        let mut m: HashMap<&str, usize> = HashMap::new();
        for j in self.jobs.values() {
            for n in j.busy_nodes() {
                *m.entry(n).or_default() += 1;
            }
        }
        m
    }

    /// Times node `id` is known to have been slashed: the ledger's count of its disagreements
    /// (each one slashed), or the slash events seen, whichever is more.
    pub fn slash_count(&self, id: &str) -> u64 {
        let ledger = self
            .nodes
            .iter()
            .find(|n| n.id == id)
            .map_or(0, |n| n.disagreed.max(0) as u64);
        ledger.max(self.slashed_seen.get(id).copied().unwrap_or(0))
    }

    /// Slashes in all: the nodes' disagreements in the ledger, or the events seen if more.
    pub fn slashed_total(&self) -> u64 {
        let ledger: u64 = self.nodes.iter().map(|n| n.disagreed.max(0) as u64).sum();
        ledger.max(self.slash_events)
    }

    /// "Now" on the coordinator's clock, as well as we can tell: ours, or its newest event.
    pub fn now(&self, local_us: u64) -> u64 {
        local_us.max(self.newest_us)
    }

    /// Jobs decided per second over the last [`WINDOW_US`].
    pub fn throughput(&self, now_us: u64) -> f64 {
        let from = now_us.saturating_sub(WINDOW_US);
        let n = self
            .decisions
            .iter()
            .filter(|&&t| t > from && t <= now_us)
            .count();
        n as f64 / (WINDOW_US as f64 / 1e6)
    }

    /// Jobs decided in each of the last [`HISTORY_SECS`] seconds, the newest second first.
    pub fn history(&self, now_us: u64) -> Vec<u64> {
        let mut h = vec![0u64; HISTORY_SECS];
        for &t in &self.decisions {
            let ago = now_us.saturating_sub(t) / 1_000_000;
            if let Some(b) = h.get_mut(ago as usize) {
                *b += 1;
            }
        }
        h
    }

    /// Forget decisions older than the history (call now and then).
    pub fn prune(&mut self, now_us: u64) {
        let keep_from = now_us.saturating_sub(HISTORY_SECS as u64 * 1_000_000);
        self.decisions.retain(|&t| t >= keep_from);
    }

    /// The most recently changed jobs, newest first, at most `n`.
    pub fn recent_jobs(&self, n: usize) -> Vec<&Job> {
        let mut v: Vec<&Job> = self.jobs.values().collect();
        v.sort_by(|a, b| {
            b.updated_us
                .cmp(&a.updated_us)
                .then_with(|| b.seq.cmp(&a.seq))
        });
        v.truncate(n);
        v
    }

    /// The nodes table: filtered by `view.filter`, sorted by `view.sort` (ties by id).
    pub fn rows(&self, view: &ViewState) -> Vec<NodeRow<'_>> {
        let busy = self.node_in_flight();
        let needle = view.filter.to_lowercase();
        let mut rows: Vec<NodeRow<'_>> = self
            .nodes
            .iter()
            .map(|node| NodeRow {
                node,
                in_flight: busy.get(node.id.as_str()).copied().unwrap_or(0),
                slashed: self.slash_count(&node.id),
            })
            .filter(|r| {
                needle.is_empty()
                    || [&r.node.id, &r.node.state, &r.node.device]
                        .iter()
                        .any(|f| f.to_lowercase().contains(&needle))
                    || (r.slashed > 0 && "slashed".contains(&needle))
            })
            .collect();
        rows.sort_by(|a, b| {
            let natural = match view.sort {
                SortKey::Stake => b.node.stake.cmp(&a.node.stake),
                SortKey::Score => b.node.score.total_cmp(&a.node.score),
                SortKey::InFlight => b.in_flight.cmp(&a.in_flight),
                SortKey::Id => std::cmp::Ordering::Equal,
            };
            let natural = natural.then_with(|| a.node.id.cmp(&b.node.id));
            if view.reverse {
                natural.reverse()
            } else {
                natural
            }
        });
        rows
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const S: u64 = 1_000_000;

    fn node(id: &str, stake: i64, score: f64, disagreed: i64, device: &str) -> Value {
        json!({"id": id, "url": format!("http://{id}:1"), "stake": stake, "state": "active",
            "operator": id, "memory_limit": 1, "max_flops": 1, "device": device, "exact": true,
            "agreed": 5, "disagreed": disagreed, "score": score, "last_heartbeat": 100})
    }

    fn ev(m: &mut Model, v: Value) {
        assert!(m.apply_json(&v), "not taken as an event: {v}");
    }

    fn job(m: &mut Model, ts: u64, id: &str, phase: &str, extra: Value) {
        let mut v = json!({"ts_us": ts, "event": "job", "job": id, "phase": phase});
        if let Value::Object(e) = extra {
            v.as_object_mut().unwrap().extend(e);
        }
        ev(m, v);
    }

    /// A job accepted and assigned to `nodes`.
    fn start(m: &mut Model, ts: u64, id: &str, nodes: &[&str]) {
        job(
            m,
            ts,
            id,
            "accepted",
            json!({"task": "t", "replicas": nodes.len(), "tier": "exact"}),
        );
        for n in nodes {
            job(m, ts, id, "assigned", json!({"node": n}));
        }
    }

    fn decide(m: &mut Model, ts: u64, id: &str, agreeing: &[&str], dissenting: &[&str]) {
        job(
            m,
            ts,
            id,
            "decided",
            json!({"agreeing": agreeing, "dissenting": dissenting, "replicas": 3,
                "refereed": false, "disputed": !dissenting.is_empty(), "output": "ab", "ms": 12.5}),
        );
    }

    #[test]
    fn events_make_in_flight_counts_per_node_and_the_queue() {
        let mut m = Model::default();
        start(&mut m, S, "j1", &["a", "b", "c"]);
        start(&mut m, S, "j2", &["a", "b", "d"]);
        assert_eq!(m.in_flight(), 2);
        assert_eq!(m.queue(), 2);
        let busy = m.node_in_flight();
        assert_eq!((busy["a"], busy["b"], busy["c"], busy["d"]), (2, 2, 1, 1));
        // j1 commits and reveals on a and b: they are through with it, c is not.
        for n in ["a", "b", "c"] {
            job(&mut m, 2 * S, "j1", "committed", json!({"node": n}));
        }
        assert_eq!(m.queue(), 2, "committing still waits for commitments");
        job(
            &mut m,
            3 * S,
            "j1",
            "revealed",
            json!({"node": "a", "output": "x"}),
        );
        job(
            &mut m,
            3 * S,
            "j1",
            "lied",
            json!({"node": "b", "why": "w"}),
        );
        assert_eq!(m.queue(), 1);
        assert_eq!(m.job("j1").unwrap().state, JobState::Revealing);
        let busy = m.node_in_flight();
        assert_eq!((busy["a"], busy["b"], busy["c"]), (1, 1, 1));
        // A node that fails is replaced; the failed one is through.
        job(
            &mut m,
            3 * S,
            "j2",
            "node_failed",
            json!({"node": "d", "error": "e"}),
        );
        job(
            &mut m,
            3 * S,
            "j2",
            "assigned",
            json!({"node": "e", "replacing": true}),
        );
        let busy = m.node_in_flight();
        assert_eq!(busy.get("d"), None);
        assert_eq!(busy["e"], 1);
        // Decided: nobody is busy with j1 any more.
        decide(&mut m, 4 * S, "j1", &["a", "c"], &["b"]);
        assert_eq!(m.in_flight(), 1);
        assert_eq!(m.decided_total, 1);
        let busy = m.node_in_flight();
        assert_eq!((busy["a"], busy["b"], busy.get("c")), (1, 1, None));
        let j1 = m.job("j1").unwrap();
        assert_eq!(
            (j1.agreeing, j1.dissenting, j1.replicas, j1.disputed, j1.ms),
            (Some(2), 1, Some(3), true, Some(12.5))
        );
        job(&mut m, 5 * S, "j2", "failed", json!({"error": "no nodes"}));
        assert_eq!((m.in_flight(), m.queue(), m.failed_total), (0, 0, 1));
        assert!(m.node_in_flight().is_empty());
        assert_eq!(m.job("j2").unwrap().error.as_deref(), Some("no nodes"));
    }

    #[test]
    fn a_replayed_backlog_and_the_listing_count_each_job_and_slash_once() {
        let mut m = Model::default();
        let events = |m: &mut Model| {
            start(m, S, "j1", &["a", "b"]);
            decide(m, 2 * S, "j1", &["a"], &["b"]);
            ev(
                m,
                json!({"ts_us": 2 * S, "event": "slashed", "job": "j1", "node": "b", "amount": 100}),
            );
        };
        events(&mut m);
        // The stream ends and starts again from its backlog.
        events(&mut m);
        // The listing says the same.
        m.apply_jobs(
            &json!([{"job_id": "j1", "state": "decided", "updated_at": 2, "created_at": 1,
                "replicas": 2, "task": "t", "receipt": {"nodes": [{}], "replicas": 2}}]),
            Some(100),
        );
        assert_eq!((m.decided_total, m.slashed_total()), (1, 1));
        assert_eq!(m.slashes.len(), 1);
        assert_eq!(m.throughput(3 * S), 0.1);
        assert!(!m.totals_partial);
    }

    #[test]
    fn the_listing_fills_in_jobs_the_stream_did_not_tell_and_states_only_move_forward() {
        let mut m = Model::default();
        m.apply_jobs(
            &json!([
                {"job_id": "new", "state": "committing", "updated_at": 9, "replicas": 3},
                {"job_id": "old", "state": "decided", "updated_at": 5, "replicas": 3,
                 "receipt": {"nodes": [{}, {}], "replicas": 3, "dispute": {"leaf": 1}}},
            ]),
            Some(2),
        );
        assert!(
            m.totals_partial,
            "a full first listing may have cut older jobs"
        );
        assert_eq!((m.decided_total, m.in_flight(), m.queue()), (1, 1, 1));
        let old = m.job("old").unwrap();
        assert_eq!(
            (old.agreeing, old.replicas, old.disputed),
            (Some(2), Some(3), true)
        );
        // The newest first in the recent list.
        let recent: Vec<&str> = m.recent_jobs(5).iter().map(|j| j.id.as_str()).collect();
        assert_eq!(recent, ["new", "old"]);
        // A stale listing does not move a job back.
        job(
            &mut m,
            10 * S,
            "new",
            "decided",
            json!({"agreeing": ["a"], "replicas": 1}),
        );
        m.apply_jobs(
            &json!([{"job_id": "new", "state": "pending", "updated_at": 9}]),
            None,
        );
        assert_eq!(m.job("new").unwrap().state, JobState::Decided);
        assert_eq!(m.decided_total, 2);
        // Entries that are not jobs are skipped.
        m.apply_jobs(
            &json!([{"state": "decided"}, {"job_id": "x", "state": "odd"}, 7]),
            None,
        );
        assert_eq!(m.jobs_known(), 2);
    }

    #[test]
    fn throughput_counts_the_last_ten_seconds_and_history_the_last_sixty() {
        let mut m = Model::default();
        // Decisions at 1..=30 s, one a second, and three more in second 30.
        for (i, t) in (1..=30)
            .map(|s| s * S)
            .chain([30 * S + 1, 30 * S + 2, 30 * S + 3])
            .enumerate()
        {
            start(&mut m, t, &format!("j{i}"), &["a"]);
            decide(&mut m, t, &format!("j{i}"), &["a"], &[]);
        }
        let now = 30 * S + 500_000;
        // (20.5 s, 30.5 s]: seconds 21..=30, plus the three extra.
        assert_eq!(m.throughput(now), 1.3);
        let h = m.history(now);
        assert_eq!(h.len(), HISTORY_SECS);
        assert_eq!(&h[..3], &[4, 1, 1]);
        assert_eq!(h[29], 1);
        assert_eq!(h[30..].iter().sum::<u64>(), 0);
        assert_eq!(h.iter().sum::<u64>(), 33);
        // A minute later the window is empty, and pruning forgets them.
        let later = now + 65 * S;
        assert_eq!(m.throughput(later), 0.0);
        m.prune(later);
        assert_eq!(m.history(later).iter().sum::<u64>(), 0);
        assert_eq!(m.decided_total, 33, "totals outlive the window");
        // Our clock behind the coordinator's: its newest event is "now".
        assert_eq!(m.now(5), 30 * S + 3);
    }

    #[test]
    fn slashed_nodes_are_marked_from_events_and_from_the_ledger_and_listed_newest_first() {
        let mut m = Model::default();
        m.set_nodes(&json!([
            node("aaa", 1000, 1.0, 0, "cpu"),
            node("bbb", 900, 0.5, 2, "cpu"),
            node("ccc", 800, 1.0, 0, "opencl:0"),
        ]));
        assert_eq!(m.slash_count("bbb"), 2, "the ledger's disagreements");
        assert_eq!(m.slash_count("aaa"), 0);
        for (ts, j) in [(5 * S, "j5"), (3 * S, "j3"), (9 * S, "j9")] {
            ev(
                &mut m,
                json!({"ts_us": ts, "event": "slashed", "job": j, "node": "ccc", "amount": 10, "extra": [1]}),
            );
        }
        assert_eq!(m.slash_count("ccc"), 3);
        assert_eq!(
            m.slashed_total(),
            3,
            "the larger of the ledger's 2 and the 3 seen"
        );
        let jobs: Vec<&str> = m.slashes.iter().map(|s| s.job.as_str()).collect();
        assert_eq!(jobs, ["j9", "j5", "j3"]);
        let rows = m.rows(&ViewState::default());
        let marked: Vec<(&str, u64)> = rows
            .iter()
            .map(|r| (r.node.id.as_str(), r.slashed))
            .collect();
        assert_eq!(marked, [("aaa", 0), ("bbb", 2), ("ccc", 3)]);
        // The filter "slashed" finds them.
        let v = ViewState {
            filter: "SLASHED".into(),
            ..ViewState::default()
        };
        let ids: Vec<&str> = m.rows(&v).iter().map(|r| r.node.id.as_str()).collect();
        assert_eq!(ids, ["bbb", "ccc"]);
        // Only the newest MAX_SLASHES are listed.
        for i in 0..(MAX_SLASHES + 5) {
            ev(
                &mut m,
                json!({"ts_us": 100 * S + i as u64, "event": "slashed", "job": format!("k{i}"), "node": "aaa", "amount": 1}),
            );
        }
        assert_eq!(m.slashes.len(), MAX_SLASHES);
        assert_eq!(m.slashes[0].job, format!("k{}", MAX_SLASHES + 4));
    }

    #[test]
    fn nodes_sort_by_each_column_reverse_and_filter() {
        let mut m = Model::default();
        m.set_nodes(&json!([
            node("b1", 500, 0.9, 0, "cpu"),
            node("a2", 1000, 0.7, 0, "opencl:0"),
            node("c3", 500, 1.0, 1, "cpu"),
            {"no id": true},
        ]));
        start(&mut m, S, "j", &["c3"]);
        start(&mut m, S, "k", &["c3", "b1"]);
        let ids = |v: &ViewState| -> Vec<String> {
            m.rows(v).iter().map(|r| r.node.id.clone()).collect()
        };
        let mut v = ViewState::default();
        assert_eq!(
            ids(&v),
            ["a2", "b1", "c3"],
            "stake, largest first, ties by id"
        );
        v.sort = v.sort.next();
        assert_eq!(v.sort, SortKey::Score);
        assert_eq!(ids(&v), ["c3", "b1", "a2"]);
        v.sort = v.sort.next();
        assert_eq!(ids(&v), ["c3", "b1", "a2"], "in flight: 2, 1, 0");
        assert_eq!(m.rows(&v)[0].in_flight, 2);
        v.sort = v.sort.next();
        assert_eq!(ids(&v), ["a2", "b1", "c3"]);
        v.reverse = true;
        assert_eq!(ids(&v), ["c3", "b1", "a2"]);
        assert_eq!(v.sort.next(), SortKey::Stake);
        // Filters: id, device, state, any case.
        v.filter = "B".into();
        assert_eq!(ids(&v), ["b1"]);
        v.filter = "opencl".into();
        assert_eq!(ids(&v), ["a2"]);
        v.filter = "ACTIVE".into();
        assert_eq!(ids(&v).len(), 3);
        v.filter = "zzz".into();
        assert!(ids(&v).is_empty());
        // Selection follows the node, not the row, and stays within the table.
        v.filter.clear();
        v.reverse = false;
        let rows = m.rows(&v);
        v.move_selection(&rows, 1);
        assert_eq!(
            v.selected.as_deref(),
            Some("a2"),
            "first move selects the top row"
        );
        v.move_selection(&rows, 5);
        assert_eq!(v.selected.as_deref(), Some("c3"));
        v.reverse = true;
        let rows = m.rows(&v);
        assert_eq!(v.selected_index(&rows), Some(0));
        v.move_selection(&rows, -3);
        assert_eq!(v.selected.as_deref(), Some("c3"));
        v.move_selection(&[], 1);
        assert_eq!(v.selected, None);
    }

    #[test]
    fn events_are_read_robustly() {
        // Unknown fields are ignored; unknown events and phases are kept as such.
        let e = parse_event(
            &json!({"ts_us": 7, "event": "job", "job": "j", "phase": "accepted",
            "task": "t", "replicas": 3, "tier": "exact", "new_field": {"x": 1}}),
        )
        .unwrap();
        assert_eq!(
            e,
            Event::Job {
                ts_us: 7,
                job: "j".into(),
                phase: Phase::Accepted {
                    task: Some("t".into()),
                    replicas: Some(3)
                }
            }
        );
        assert_eq!(
            parse_event(&json!({"ts_us": 8, "event": "job", "job": "j", "phase": "teleported"})),
            Some(Event::Job {
                ts_us: 8,
                job: "j".into(),
                phase: Phase::Other("teleported".into())
            })
        );
        assert_eq!(
            parse_event(&json!({"ts_us": 9, "event": "weather", "rain": true})),
            Some(Event::Other { ts_us: 9 })
        );
        assert_eq!(
            parse_event(&json!({"event": "shutdown"})),
            Some(Event::Shutdown { ts_us: 0 })
        );
        // Not events, or missing what they cannot do without.
        for bad in [
            json!(null),
            json!([1]),
            json!({"ts_us": 1}),
            json!({"event": 5}),
            json!({"event": "job", "phase": "accepted"}),
            json!({"event": "job", "job": "j", "phase": "assigned"}),
            json!({"event": "slashed", "job": "j", "amount": 3}),
            json!({"event": "node", "phase": "joined"}),
        ] {
            assert_eq!(parse_event(&bad), None, "{bad}");
        }
        // Wrongly typed optional fields fall back rather than fail.
        let d = parse_event(&json!({"event": "job", "job": "j", "phase": "decided",
            "agreeing": ["a", 3, "b"], "dissenting": "nope", "ms": "fast", "refereed": 1}))
        .unwrap();
        let Event::Job {
            phase:
                Phase::Decided {
                    agreeing,
                    dissenting,
                    ms,
                    refereed,
                    ..
                },
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        assert_eq!(
            (agreeing.len(), dissenting.len(), ms, refereed),
            (2, 0, None, false)
        );
    }

    #[test]
    fn node_events_update_states_and_add_joined_nodes() {
        let mut m = Model::default();
        m.set_nodes(&json!([node("aaa", 10, 1.0, 0, "cpu")]));
        ev(
            &mut m,
            json!({"ts_us": 1, "event": "node", "node": "aaa", "phase": "offline"}),
        );
        assert_eq!(m.nodes[0].state, "unhealthy");
        ev(
            &mut m,
            json!({"ts_us": 2, "event": "node", "node": "aaa", "phase": "healthy"}),
        );
        assert_eq!(m.nodes[0].state, "active");
        ev(
            &mut m,
            json!({"ts_us": 3, "event": "node", "node": "bbb", "phase": "joined", "url": "u", "stake": 7, "device": "cpu"}),
        );
        assert_eq!((m.nodes[1].id.as_str(), m.nodes[1].stake), ("bbb", 7));
        ev(
            &mut m,
            json!({"ts_us": 4, "event": "node", "node": "bbb", "phase": "left"}),
        );
        assert_eq!(m.nodes[1].state, "deregistered");
        ev(
            &mut m,
            json!({"ts_us": 5, "event": "node", "node": "ccc", "phase": "offline"}),
        );
        assert_eq!(
            m.nodes.len(),
            2,
            "an unknown node going offline adds nothing"
        );
        ev(
            &mut m,
            json!({"ts_us": 6, "event": "start", "coordinator": "k"}),
        );
        ev(&mut m, json!({"ts_us": 7, "event": "shutdown"}));
        assert_eq!((m.started_us, m.shutdown), (Some(6), true));
    }

    #[test]
    fn old_finished_jobs_are_forgotten_but_counted_and_running_ones_kept() {
        let mut m = Model::default();
        start(&mut m, S, "running", &["a"]);
        for i in 0..(MAX_JOBS + 10) {
            let id = format!("j{i}");
            start(&mut m, 2 * S, &id, &["b"]);
            decide(&mut m, 2 * S, &id, &["b"], &[]);
        }
        assert_eq!(m.jobs_known(), MAX_JOBS);
        assert!(m.job("running").is_some());
        assert!(m.job("j0").is_none());
        assert_eq!(m.decided_total, MAX_JOBS as u64 + 10);
        assert_eq!(m.node_in_flight()["a"], 1);
        // It has had no news for a while: ask about it.
        assert_eq!(m.stale_jobs(30 * S, 10 * S, 8), ["running"]);
        assert!(m.stale_jobs(5 * S, 10 * S, 8).is_empty());
    }

    #[test]
    fn short_ids() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }
}
