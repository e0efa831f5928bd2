//! `tenet bench hostile`: the network under attack, as real processes on 127.0.0.1 (issue 29).
//!
//! It starts a coordinator and three nodes from the `tenet` binary (and, with the `stall`
//! class, a fourth node that commits and never reveals), registers and bonds the nodes as the
//! admin under distinct operators, and deploys a small task (one 16→32 layer with tanh). Then
//! honest callers (`clients` of them, over the REST API with the callers' key) call it one
//! call after another for `seconds`, first with nobody else on the network (the quiet phase),
//! then for as long again while attackers run every chosen class of issue 29 at a bounded
//! rate (the attack phase). Every honest answer is checked: status 200, a receipt signed by
//! this coordinator that verifies and names only bonded nodes, and the result equal to a local
//! run; at the end the coordinator's ledger must hold every honest job decided.
//!
//! Each attack class keeps its own counters of what the network answered: the refusal (or
//! outcome) the class expects, and anything else. Connection-level attacks (idle, slow-head,
//! 1 byte/s bodies, header-only uploads) are held past the phase, for at most `linger_secs`,
//! to see whether the servers close them.
//!
//! Every process's memory is sampled (`VmRSS` every 50 ms, and `VmHWM` when the attack ends,
//! before the bench's own reads of the ledger, from `/proc/PID/status`) and compared with the
//! limit it was configured with:
//! - a node: its resident peak in the quiet phase (the base: runtime, caches, honest work) +
//!   workers × `--memory-limit` + `session_memory_bytes` + the recycled-buffer cache
//!   ([`tenet_ir::recycle::MAX_HELD`]);
//! - the coordinator: its quiet peak + `--max-task-memory` (one referee run) + the recycled
//!   buffer cache.
//!
//! The goal (issue 29): 100% honest success in both phases, the attack phase's p99 at most
//! twice the quiet one's, every process alive and within its limit, and the ledger holding
//! every honest job decided. Everything is bounded in count and time; every child process is
//! killed when the run ends, however it ends, and one whose resident memory passes
//! `rss_guard_bytes` is killed on the spot (reported as over its limit) so that a missing
//! defence cannot take the machine's memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenet_ir::{DType, Graph, GraphBuilder, WeightsId};
use tenet_net::client::Bounds;
use tenet_net::{Bytes, ClientError, Method, NodeClient, RawRequest, identity};
use tenet_proto::Hash;
use tenet_proto::api;
use tenet_proto::auth::{KeyPair, PublicKey};
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::{Batch, NodeInfo, RunJob, SessionOp};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::load::{Call, calls, quantile, task, verified};

/// Each node's `--memory-limit`: the most tensor memory one job may need by its certificate.
pub const NODE_MEMORY_LIMIT: u64 = 256 << 20;
/// Each node's `session_memory_bytes` (its config file).
pub const NODE_SESSION_MEMORY: u64 = 64 << 20;
/// Each node's `pull_timeout_ms` (its config file).
pub const NODE_PULL_TIMEOUT_MS: u64 = 10_000;
/// Jobs a node runs at once (the node's default, stated here for the limit).
pub const NODE_WORKERS: u64 = 1;
/// The coordinator's `--max-task-memory`: the largest task it deploys (and would referee).
pub const COORDINATOR_MAX_TASK: u64 = 512 << 20;
/// The coordinator's `--node-timeout`, seconds.
pub const NODE_TIMEOUT_SECS: u64 = 5;
/// Stake the admin bonds to each node.
const STAKE: i64 = 1000;
/// Stake an attacker claims.
const INVENTED_STAKE: i64 = 1_000_000_000_000_000;
/// Slow-head and slow-body connections per process, in the `conns` class.
const SLOW_PER_PROCESS: usize = 4;
/// Header-only 2 GiB uploads to each node and to the coordinator, in the `declared` class.
const DECLARED_PER_PROCESS: usize = 4;
/// The most a hostile peer streams on one connection.
const PEER_STREAM_CAP: u64 = 2 << 30;

/// An attack class of issue 29 (numbered as its defects).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Weights,
    Chain,
    Bench,
    Sybil,
    Stall,
    Json,
    Wait,
    Pull,
    Conns,
    Declared,
    Session,
    Values,
}

impl Class {
    pub const ALL: [Class; 12] = [
        Class::Weights,
        Class::Chain,
        Class::Bench,
        Class::Sybil,
        Class::Stall,
        Class::Json,
        Class::Wait,
        Class::Pull,
        Class::Conns,
        Class::Declared,
        Class::Session,
        Class::Values,
    ];

    /// The classes run unless asked otherwise: all but `stall`, whose 4th node makes every
    /// job it is drawn for wait `--node-timeout` by design.
    pub fn default_set() -> Vec<Class> {
        Class::ALL
            .into_iter()
            .filter(|c| *c != Class::Stall)
            .collect()
    }

    /// The item of issue 29 it attacks.
    pub fn number(self) -> usize {
        Class::ALL.iter().position(|c| *c == self).unwrap_or(0) + 1
    }

    pub fn name(self) -> &'static str {
        match self {
            Class::Weights => "weights",
            Class::Chain => "chain",
            Class::Bench => "bench",
            Class::Sybil => "sybil",
            Class::Stall => "stall",
            Class::Json => "json",
            Class::Wait => "wait",
            Class::Pull => "pull",
            Class::Conns => "conns",
            Class::Declared => "declared",
            Class::Session => "session",
            Class::Values => "values",
        }
    }

    /// What the attackers do.
    pub fn what(self) -> &'static str {
        match self {
            Class::Weights => {
                "GGUF of 3000 Q4_1 tensors over the same 1 MiB (~20 GB dequantised) as deploy weights, as a call body and as a node job's weights; a safetensors call body of overlapping tensors"
            }
            Class::Chain => "deploy and call a long chain of tanh on a 4-element tensor",
            Class::Bench => "call a task whose certificate exceeds every node's memory limit",
            Class::Sybil => {
                "register fake nodes with invented stake (caller key), and fake nodes without stake"
            }
            Class::Stall => "a 4th node, bonded, that commits and never reveals",
            Class::Json => "100 MB JSON call bodies: declared length, then chunked, streamed",
            Class::Wait => "GET /v1/jobs/x?wait=NaN|inf|-1|1e999",
            Class::Pull => {
                "session pulls from an unlisted peer and from a listed peer that streams without end"
            }
            Class::Conns => {
                "idle connections, heads at 1 byte/s and bodies at 1 byte/s to every process"
            }
            Class::Declared => {
                "header-only blob uploads declaring 2 GiB to the nodes and the coordinator, real 1 MiB uploads meanwhile"
            }
            Class::Session => "256 MiB tensor uploads (headers only) to sessions that do not exist",
            Class::Values => "call bodies with seed -1, seed \"7\", an f32 input of 1e39",
        }
    }

    /// What counts as the expected answer.
    pub fn expects(self) -> &'static str {
        match self {
            Class::Weights => "4xx refusals (422)",
            Class::Chain => "200 or 422, never a timeout or 5xx",
            Class::Bench => "422 exceeds_limits",
            Class::Sybil => "403 for stake; 200 with stake 0 without",
            Class::Stall => "slashed in every job it was drawn for",
            Class::Json => "413",
            Class::Wait => "400",
            Class::Pull => "an error in the batch (unlisted: bad_request, not contacted)",
            Class::Conns => "closed by the server",
            Class::Declared => "real uploads 200; held uploads dropped by the server",
            Class::Session => "404 before the body",
            Class::Values => "422",
        }
    }

    /// A class by name or number.
    pub fn parse(text: &str) -> Option<Class> {
        let text = text.trim();
        if let Ok(n) = text.parse::<usize>() {
            return (1..=12).contains(&n).then(|| Class::ALL[n - 1]);
        }
        Class::ALL.into_iter().find(|c| c.name() == text)
    }
}

/// Parse `--only` (names or numbers); empty → the default set. `stall` adds the stalling node.
pub fn parse_classes(list: &[String], stall: bool) -> Result<Vec<Class>, String> {
    let mut classes = if list.is_empty() {
        Class::default_set()
    } else {
        list.iter()
            .flat_map(|s| s.split(','))
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                Class::parse(s).ok_or_else(|| {
                    format!(
                        "`{s}` is not an attack class: {}",
                        Class::ALL.map(Class::name).join(", ")
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    if stall {
        classes.push(Class::Stall);
    }
    classes.sort();
    classes.dedup();
    Ok(classes)
}

/// What to run.
#[derive(Clone, Debug)]
pub struct HostileConfig {
    /// The `tenet` binary to start the processes from.
    pub exe: PathBuf,
    /// Length of each phase (quiet, then under attack).
    pub seconds: f64,
    /// Concurrent honest callers.
    pub clients: usize,
    /// Attempts per second of each paced class.
    pub rate: f64,
    /// The most attempts of each paced class.
    pub max_per_class: usize,
    pub classes: Vec<Class>,
    /// Idle connections held to each process (`conns`).
    pub idle_per_process: usize,
    /// Ops in the `chain` class's tanh chain.
    pub chain_ops: usize,
    /// How long after the attack phase held connections may stay open before they count as
    /// never closed.
    pub linger_secs: f64,
    /// A child whose resident memory passes this is killed at once (a safety net).
    pub rss_guard_bytes: u64,
}

impl HostileConfig {
    pub fn new(exe: PathBuf) -> HostileConfig {
        HostileConfig {
            exe,
            seconds: 20.0,
            clients: 8,
            rate: 2.0,
            max_per_class: 200,
            classes: Class::default_set(),
            idle_per_process: 600,
            chain_ops: 100_000,
            linger_secs: 35.0,
            rss_guard_bytes: 4 << 30,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reports

/// One phase of honest calls.
#[derive(Clone, Debug, Default)]
pub struct PhaseSummary {
    pub ok: usize,
    pub failed: usize,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The first few failures.
    pub errors: Vec<String>,
}

impl PhaseSummary {
    pub fn success_rate(&self) -> f64 {
        let n = self.ok + self.failed;
        if n == 0 {
            0.0
        } else {
            self.ok as f64 / n as f64
        }
    }

    fn json(&self) -> Value {
        json!({
            "ok": self.ok, "failed": self.failed, "success_rate": self.success_rate(),
            "seconds": self.seconds, "calls_per_s": self.ok as f64 / self.seconds.max(1e-9),
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms,
            "errors": self.errors,
        })
    }
}

/// What one attack class got back.
#[derive(Clone, Debug)]
pub struct ClassReport {
    pub class: Class,
    pub attempts: u64,
    /// Answers the class expects (the refusal, or the outcome a defence gives).
    pub expected: u64,
    /// Anything else.
    pub other: u64,
    /// Each answer, counted.
    pub outcomes: BTreeMap<String, u64>,
    pub notes: Vec<String>,
    /// The first few unexpected answers in full.
    pub unexpected: Vec<String>,
}

impl ClassReport {
    fn new(class: Class) -> ClassReport {
        ClassReport {
            class,
            attempts: 0,
            expected: 0,
            other: 0,
            outcomes: BTreeMap::new(),
            notes: Vec::new(),
            unexpected: Vec::new(),
        }
    }

    /// [`ClassReport::add`], keeping what came back in full when it was not expected.
    fn add_reply(
        &mut self,
        label: impl Into<String>,
        expected: bool,
        reply: &dyn std::fmt::Display,
    ) {
        if !expected && self.unexpected.len() < 3 {
            self.unexpected
                .push(reply.to_string().chars().take(300).collect());
        }
        self.add(label, expected);
    }

    fn add(&mut self, label: impl Into<String>, expected: bool) {
        self.attempts += 1;
        if expected {
            self.expected += 1;
        } else {
            self.other += 1;
        }
        *self.outcomes.entry(label.into()).or_default() += 1;
    }

    fn json(&self) -> Value {
        json!({
            "class": self.class.name(), "issue_item": self.class.number(),
            "what": self.class.what(), "expects": self.class.expects(),
            "attempts": self.attempts, "expected": self.expected, "other": self.other,
            "outcomes": self.outcomes, "notes": self.notes, "unexpected": self.unexpected,
        })
    }
}

/// One process's memory against its limit.
#[derive(Clone, Debug)]
pub struct ProcessReport {
    pub name: String,
    pub pid: u32,
    pub quiet_peak: u64,
    pub attack_peak: u64,
    /// `VmHWM` when the attack ended: the peak over the process's life until then.
    pub hwm: u64,
    pub limit: u64,
    pub limit_formula: String,
    /// Why it is not running any more, if it is not.
    pub died: Option<String>,
}

impl ProcessReport {
    pub fn peak(&self) -> u64 {
        self.hwm.max(self.attack_peak).max(self.quiet_peak)
    }

    pub fn within(&self) -> bool {
        self.died.is_none() && self.peak() <= self.limit
    }
}

/// A node as the coordinator lists it at the end.
#[derive(Clone, Debug)]
pub struct NodeSeen {
    pub name: String,
    pub id: String,
    pub operator: String,
    pub state: String,
    pub stake: i64,
}

/// What the run measured.
#[derive(Clone, Debug)]
pub struct HostileReport {
    pub config: HostileConfig,
    pub quiet: PhaseSummary,
    pub attack: PhaseSummary,
    /// Honest jobs answered, and those the ledger holds decided.
    pub honest_jobs: usize,
    pub ledger_decided: usize,
    pub ledger_not_decided: Vec<String>,
    pub classes: Vec<ClassReport>,
    pub processes: Vec<ProcessReport>,
    pub nodes: Vec<NodeSeen>,
    /// Fake nodes registered by the `sybil` class that the ledger lists at the end.
    pub fake_nodes_listed: usize,
    pub seconds_total: f64,
}

impl HostileReport {
    pub fn p99_ratio(&self) -> f64 {
        self.attack.p99_ms / self.quiet.p99_ms
    }

    pub fn honest_ok(&self) -> bool {
        self.quiet.failed == 0 && self.attack.failed == 0 && self.quiet.ok > 0 && self.attack.ok > 0
    }

    pub fn latency_ok(&self) -> bool {
        self.p99_ratio() <= 2.0
    }

    pub fn memory_ok(&self) -> bool {
        self.processes.iter().all(ProcessReport::within)
    }

    pub fn ledger_ok(&self) -> bool {
        self.ledger_decided == self.honest_jobs && self.ledger_not_decided.is_empty()
    }

    /// Every attack got the answer its class expects (classes that answered otherwise, and
    /// how often).
    pub fn attacks_as_expected(&self) -> bool {
        self.classes.iter().all(|c| c.other == 0)
    }

    /// The goals of issue 29.
    pub fn goals_met(&self) -> bool {
        self.honest_ok() && self.latency_ok() && self.memory_ok() && self.ledger_ok()
    }

    pub fn json(&self) -> Value {
        let c = &self.config;
        json!({
            "seconds_per_phase": c.seconds,
            "clients": c.clients,
            "rate_per_class": c.rate,
            "max_per_class": c.max_per_class,
            "idle_per_process": c.idle_per_process,
            "chain_ops": c.chain_ops,
            "classes": c.classes.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "quiet": self.quiet.json(),
            "attack": self.attack.json(),
            "p99_ratio": self.p99_ratio(),
            "honest_jobs": self.honest_jobs,
            "ledger_decided": self.ledger_decided,
            "ledger_not_decided": self.ledger_not_decided,
            "attacks": self.classes.iter().map(ClassReport::json).collect::<Vec<_>>(),
            "processes": self.processes.iter().map(|p| json!({
                "name": p.name, "pid": p.pid, "quiet_peak_bytes": p.quiet_peak,
                "attack_peak_bytes": p.attack_peak, "hwm_bytes": p.hwm,
                "limit_bytes": p.limit, "limit": p.limit_formula, "died": p.died,
                "within": p.within(),
            })).collect::<Vec<_>>(),
            "nodes": self.nodes.iter().map(|n| json!({
                "name": n.name, "id": n.id, "operator": n.operator, "state": n.state,
                "stake": n.stake,
            })).collect::<Vec<_>>(),
            "fake_nodes_listed": self.fake_nodes_listed,
            "goals": {
                "honest_success": self.honest_ok(),
                "p99_within_2x": self.latency_ok(),
                "memory_within_limits": self.memory_ok(),
                "ledger_complete": self.ledger_ok(),
                "met": self.goals_met(),
            },
            "attacks_as_expected": self.attacks_as_expected(),
            "seconds_total": self.seconds_total,
        })
    }

    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "tenet hostile on 127.0.0.1: coordinator + 3 nodes{}, {} honest clients, {:.0} s quiet then {:.0} s under attack, {} attempts/s per class (at most {})\n\n",
            if c.classes.contains(&Class::Stall) {
                " + 1 withholding node"
            } else {
                ""
            },
            c.clients,
            c.seconds,
            c.seconds,
            c.rate,
            c.max_per_class
        );
        out += "honest calls        ok      failed  success   p50 ms    p99 ms    max ms\n";
        for (name, p) in [("quiet", &self.quiet), ("under attack", &self.attack)] {
            out += &format!(
                "{name:<18}{:>5}  {:>8}  {:>6.2}%  {:>8.1}  {:>8.1}  {:>8.1}\n",
                p.ok,
                p.failed,
                100.0 * p.success_rate(),
                p.p50_ms,
                p.p99_ms,
                p.max_ms
            );
        }
        out += &format!(
            "p99 under attack / quiet: {:.2} (goal <= 2)\n",
            self.p99_ratio()
        );
        out += &format!(
            "ledger: {} of {} honest jobs decided{}\n",
            self.ledger_decided,
            self.honest_jobs,
            if self.ledger_not_decided.is_empty() {
                String::new()
            } else {
                format!(" (not decided: {})", self.ledger_not_decided.join(", "))
            }
        );
        for (name, p) in [("quiet", &self.quiet), ("attack", &self.attack)] {
            for e in &p.errors {
                out += &format!("  {name} error: {e}\n");
            }
        }
        out += "\nattack class     attempts  expected  other  answers\n";
        for r in &self.classes {
            let answers: Vec<String> = r
                .outcomes
                .iter()
                .map(|(k, v)| format!("{k} ×{v}"))
                .collect();
            out += &format!(
                "{:>2} {:<13}{:>9}  {:>8}  {:>5}  {}\n",
                r.class.number(),
                r.class.name(),
                r.attempts,
                r.expected,
                r.other,
                answers.join(", ")
            );
            out += &format!("   {}; expects {}\n", r.class.what(), r.class.expects());
            for n in &r.notes {
                out += &format!("   note: {n}\n");
            }
            for u in &r.unexpected {
                out += &format!("   unexpected: {u}\n");
            }
        }
        out += "\nprocess        pid      quiet MiB  attack MiB  VmHWM MiB  limit MiB  within\n";
        for p in &self.processes {
            out += &format!(
                "{:<13}{:>7}  {:>9.1}  {:>10.1}  {:>9.1}  {:>9.1}  {}\n",
                p.name,
                p.pid,
                mib(p.quiet_peak),
                mib(p.attack_peak),
                mib(p.hwm),
                mib(p.limit),
                match (&p.died, p.within()) {
                    (Some(d), _) => format!("NO: {d}"),
                    (None, true) => "yes".to_string(),
                    (None, false) => "NO".to_string(),
                }
            );
        }
        let mut formulas: Vec<&str> = self
            .processes
            .iter()
            .map(|p| p.limit_formula.as_str())
            .collect();
        formulas.dedup();
        for f in formulas {
            out += &format!("  limit: {f}\n");
        }
        out += "\nnodes at the end (coordinator's view):\n";
        for n in &self.nodes {
            out += &format!(
                "  {:<12} {}  operator {:<8} {:<10} stake {}\n",
                n.name,
                &n.id[..12.min(n.id.len())],
                n.operator,
                n.state,
                n.stake
            );
        }
        if self.fake_nodes_listed > 0 {
            out += &format!(
                "  and {} fake node(s) registered without stake by the sybil class\n",
                self.fake_nodes_listed
            );
        }
        out += &format!(
            "\ngoals: honest success {}, p99 within 2x {}, memory within limits {}, ledger complete {} -> {}\n",
            yes(self.honest_ok()),
            yes(self.latency_ok()),
            yes(self.memory_ok()),
            yes(self.ledger_ok()),
            if self.goals_met() { "MET" } else { "NOT MET" }
        );
        let otherwise: Vec<String> = self
            .classes
            .iter()
            .filter(|c| c.other > 0)
            .map(|c| format!("{} ({} of {})", c.class.name(), c.other, c.attempts))
            .collect();
        out += &format!(
            "attacks answered otherwise than expected: {}\n",
            if otherwise.is_empty() {
                "none".to_string()
            } else {
                otherwise.join(", ")
            }
        );
        out += &format!("({:.0} s in all)\n", self.seconds_total);
        out
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

// ---------------------------------------------------------------------------------------
// Hostile files

/// `n` Q4_1 blocks (20 bytes each: f16 scale 1/8, f16 offset -1, 16 bytes of nibbles).
fn q4_1_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * 20);
    for i in 0..n {
        b.extend([0x00, 0x30, 0x00, 0xbc]);
        b.extend((0..16).map(|j| (i * 31 + j * 7) as u8));
    }
    b
}

/// The amplifying GGUF of issue 29: `tensors` 1-D Q4_1 tensors of `blocks × 32` elements that
/// all point at the same `blocks` blocks, so `blocks × 20` bytes of data claim
/// `tensors × blocks × 128` bytes of f32. `salt` (a metadata value) makes each file distinct.
pub fn gguf_bomb(tensors: usize, blocks: usize, salt: u32) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors as u64).to_le_bytes());
    b.extend(1u64.to_le_bytes());
    let key = b"bench.salt";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(4u32.to_le_bytes());
    b.extend(salt.to_le_bytes());
    for i in 0..tensors {
        let name = format!("blk.{i}.w");
        b.extend((name.len() as u64).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend((blocks as u64 * 32).to_le_bytes());
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(q4_1_blocks(blocks));
    b
}

/// A safetensors file whose tensors (`x` first, then `t1`, `t2`, …) all cover the same
/// `elements` f32, as many as fit a header of `max_header` bytes: a body the size of one
/// tensor that claims hundreds of them.
pub fn safetensors_bomb(elements: u64, max_header: usize) -> Vec<u8> {
    let bytes = elements * 4;
    let entry = |name: &str| {
        format!(
            "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[{elements}],\"data_offsets\":[0,{bytes}]}}"
        )
    };
    let mut header = format!("{{{}", entry("x"));
    for i in 1.. {
        let next = format!(",{}", entry(&format!("t{i}")));
        if header.len() + next.len() + 1 > max_header {
            break;
        }
        header += &next;
    }
    header.push('}');
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, bytes as usize));
    b
}

// ---------------------------------------------------------------------------------------
// Graphs

/// `ops` tanh in a row on 4 numbers: certified at a few bytes.
fn chain_task(ops: usize) -> Result<Graph, String> {
    let g = GraphBuilder::new();
    let mut t = g.input("x", DType::F32, &[4]);
    for _ in 0..ops {
        t = t.tanh();
    }
    g.finish(&[("y", &t)]).map_err(|e| e.to_string())
}

/// A 1×1 input expanded to 10240² and summed: ~400 MiB by its certificate, over every node's
/// 256 MiB and under the coordinator's 512 MiB.
fn over_limit_task() -> Result<Graph, String> {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1, 1]);
    g.finish(&[("s", &x.expand(&[10240, 10240]).sum(&[0, 1], false))])
        .map_err(|e| e.to_string())
}

/// `y = relu(x)` over 2 MiB of f32: a call body large enough to carry a 1 MiB file.
fn wide_task() -> Result<Graph, String> {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 19]);
    g.finish(&[("y", &x.relu())]).map_err(|e| e.to_string())
}

/// A graph reading tensor `blk.0.w` of `elements` f32 from the weights file `file`.
fn weighted_task(file: &[u8], elements: u64) -> Result<Graph, String> {
    let g = GraphBuilder::new();
    let w = g.weight(
        WeightsId::of_bytes(file),
        "blk.0.w",
        DType::F32,
        &[elements],
    );
    g.finish(&[("y", &w.relu())]).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Processes

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Coordinator,
    Node,
    Staller,
}

/// A started `tenet` process.
struct Service {
    name: String,
    role: Role,
    child: Arc<Mutex<Child>>,
    pid: u32,
    /// `http://127.0.0.1:PORT`.
    url: String,
    /// What it printed to standard error (for diagnosis).
    log: PathBuf,
}

impl Service {
    fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }
}

/// Every process of the run, killed (and its directory removed) when dropped, however the run
/// ends.
struct Network {
    services: Vec<Service>,
    dir: PathBuf,
    coordinator_key: Option<PublicKey>,
}

impl Drop for Network {
    fn drop(&mut self) {
        for s in &self.services {
            if let Ok(mut c) = s.child.lock() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Start `exe ARGS`, wait (at most a minute) for its `… listening on http://…` line; the
/// child and that line. Standard error goes to `log`; the rest of standard output is drained.
pub(crate) fn spawn(exe: &Path, args: &[String], log: &Path) -> Result<(Child, String), String> {
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no standard output")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        let _ = reader.read_line(&mut first);
        let _ = tx.send(first);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if !first.contains("listening on http://") {
        let _ = child.kill();
        let _ = child.wait();
        let mut text = String::new();
        let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
        return Err(format!(
            "`tenet {}` did not start: {}{}",
            args.first().map_or("", String::as_str),
            first.trim(),
            text.trim()
        ));
    }
    Ok((child, first.trim().to_string()))
}

impl Network {
    fn start(
        config: &HostileConfig,
        dir: &Path,
        keys: &Keys,
        listed_peer: &str,
    ) -> Result<Network, String> {
        let mut net = Network {
            services: Vec::new(),
            dir: dir.to_path_buf(),
            coordinator_key: None,
        };
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let args: Vec<String> = [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path(dir.join("coordinator")),
            "--api-key",
            &keys.caller,
            "--admin-key",
            &keys.admin,
            "--replicas",
            "3",
            "--node-timeout",
            &NODE_TIMEOUT_SECS.to_string(),
            "--max-task-memory",
            &COORDINATOR_MAX_TASK.to_string(),
        ]
        .map(String::from)
        .to_vec();
        let log = dir.join("coordinator.log");
        let (child, line) = spawn(&config.exe, &args, &log)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let key = words
            .get(2)
            .and_then(|k| PublicKey::parse(k))
            .ok_or_else(|| format!("the coordinator's first line names no key: {line}"))?;
        net.coordinator_key = Some(key);
        net.push("coordinator", Role::Coordinator, child, &line, log);
        let nodes = 3 + usize::from(config.classes.contains(&Class::Stall));
        for i in 0..nodes {
            let role = if i < 3 { Role::Node } else { Role::Staller };
            let name = if role == Role::Node {
                format!("node-{i}")
            } else {
                "withholder".to_string()
            };
            let toml = dir.join(format!("{name}.toml"));
            std::fs::write(
                &toml,
                format!(
                    "session_memory_bytes = {NODE_SESSION_MEMORY}\npull_timeout_ms = {NODE_PULL_TIMEOUT_MS}\nworkers = {NODE_WORKERS}\n"
                ),
            )
            .map_err(|e| format!("{}: {e}", toml.display()))?;
            let mut args: Vec<String> = [
                "node",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &path(dir.join(&name)),
                "--config",
                &path(toml),
                "--trust",
                &key.to_hex(),
                "--trust",
                &keys.attacker.public().to_hex(),
                "--memory-limit",
                &NODE_MEMORY_LIMIT.to_string(),
                "--threads",
                "1",
                "--no-fsync",
                "--pull-from",
                listed_peer,
            ]
            .map(String::from)
            .to_vec();
            if role == Role::Staller {
                args.extend(["--cheat".to_string(), "withhold".to_string()]);
            }
            let log = dir.join(format!("{name}.log"));
            let (child, line) = spawn(&config.exe, &args, &log)?;
            net.push(&name, role, child, &line, log);
        }
        Ok(net)
    }

    fn push(&mut self, name: &str, role: Role, child: Child, line: &str, log: PathBuf) {
        let url = line.rsplit(' ').next().unwrap_or_default().to_string();
        self.services.push(Service {
            name: name.to_string(),
            role,
            pid: child.id(),
            child: Arc::new(Mutex::new(child)),
            url,
            log,
        });
    }

    fn coordinator(&self) -> &Service {
        &self.services[0]
    }

    fn nodes(&self) -> impl Iterator<Item = &Service> {
        self.services.iter().filter(|s| s.role == Role::Node)
    }

    fn staller(&self) -> Option<&Service> {
        self.services.iter().find(|s| s.role == Role::Staller)
    }
}

/// The credentials of the run.
struct Keys {
    /// The callers' API key (honest callers and attackers alike hold it).
    caller: String,
    admin: String,
    /// A key every node trusts (as a second client would be), held by the attackers.
    attacker: KeyPair,
}

// ---------------------------------------------------------------------------------------
// Memory

const PHASE_SETUP: u8 = 0;
const PHASE_QUIET: u8 = 1;
const PHASE_ATTACK: u8 = 2;
/// The bench's own reads of the ledger at the end: not counted (its answers are large).
const PHASE_CHECK: u8 = 3;

#[derive(Clone, Debug, Default)]
struct Mem {
    quiet_peak: u64,
    attack_peak: u64,
    hwm: u64,
    died: Option<String>,
}

/// `VmRSS` and `VmHWM` in bytes, and whether the process is a zombie.
fn proc_status(pid: u32) -> Option<(u64, u64, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    let zombie = text
        .lines()
        .any(|l| l.starts_with("State:") && l.contains('Z'));
    Some((field("VmRSS:")?, field("VmHWM:").unwrap_or(0), zombie))
}

/// Samples every process's resident memory until stopped, by phase, and kills one that
/// passes the guard.
struct Sampler {
    phase: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    mem: Arc<Mutex<Vec<Mem>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(net: &Network, guard: u64) -> Sampler {
        let phase = Arc::new(AtomicU8::new(PHASE_SETUP));
        let stop = Arc::new(AtomicBool::new(false));
        let mem = Arc::new(Mutex::new(vec![Mem::default(); net.services.len()]));
        let procs: Vec<(u32, Arc<Mutex<Child>>)> = net
            .services
            .iter()
            .map(|s| (s.pid, s.child.clone()))
            .collect();
        let (p, s, m) = (phase.clone(), stop.clone(), mem.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let now = p.load(Ordering::Relaxed);
                for (i, (pid, child)) in procs.iter().enumerate() {
                    let Ok(mut mem) = m.lock() else { return };
                    let slot = &mut mem[i];
                    if slot.died.is_some() {
                        continue;
                    }
                    match proc_status(*pid) {
                        Some((rss, hwm, zombie)) if !zombie => {
                            if now <= PHASE_ATTACK {
                                slot.hwm = slot.hwm.max(hwm);
                            }
                            match now {
                                PHASE_QUIET => slot.quiet_peak = slot.quiet_peak.max(rss),
                                PHASE_ATTACK => slot.attack_peak = slot.attack_peak.max(rss),
                                _ => {}
                            }
                            if rss > guard {
                                slot.attack_peak = slot.attack_peak.max(rss);
                                slot.died = Some(format!(
                                    "killed by the bench at {:.0} MiB resident (guard {:.0} MiB)",
                                    mib(rss),
                                    mib(guard)
                                ));
                                if let Ok(mut c) = child.lock() {
                                    let _ = c.kill();
                                }
                            }
                        }
                        _ => {
                            let status = child
                                .lock()
                                .ok()
                                .and_then(|mut c| c.try_wait().ok().flatten());
                            slot.died = Some(match status {
                                Some(s) => format!("exited: {s}"),
                                None => "gone".to_string(),
                            });
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler {
            phase,
            stop,
            mem,
            thread: Some(thread),
        }
    }

    fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// The attack is over: read each process's `VmHWM` once more, and count nothing after
    /// (the bench's own ledger reads come next), but keep watching for deaths.
    fn end_attack(&self, net: &Network) {
        if let Ok(mut mem) = self.mem.lock() {
            for (slot, s) in mem.iter_mut().zip(&net.services) {
                if let Some((rss, hwm, false)) = proc_status(s.pid) {
                    slot.hwm = slot.hwm.max(hwm);
                    slot.attack_peak = slot.attack_peak.max(rss);
                }
            }
        }
        self.set_phase(PHASE_CHECK);
    }

    /// Stop sampling; each process's figures.
    fn finish(mut self) -> Vec<Mem> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.mem.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

/// What one request got.
enum Reply {
    Answer(u16, Value),
    Timeout,
    Failed(String),
}

impl Reply {
    fn status(&self) -> Option<u16> {
        match self {
            Reply::Answer(s, _) => Some(*s),
            _ => None,
        }
    }

    fn label(&self) -> String {
        match self {
            Reply::Answer(s, v) => match v["error"]["code"].as_str() {
                Some(code) => format!("{s} {code}"),
                None => s.to_string(),
            },
            Reply::Timeout => "timeout".to_string(),
            Reply::Failed(_) => "no answer".to_string(),
        }
    }

    fn value(&self) -> &Value {
        match self {
            Reply::Answer(_, v) => v,
            _ => &Value::Null,
        }
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Answer(s, v) => write!(f, "{s}: {v}"),
            Reply::Timeout => write!(f, "no answer in time"),
            Reply::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// A coordinator client with a bearer key; a new connection per request.
#[derive(Clone)]
struct Api {
    url: String,
    bearer: String,
}

impl Api {
    async fn request(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: impl Into<Bytes>,
        timeout: Duration,
    ) -> Reply {
        let http = match NodeClient::new(&self.url, identity::generate()) {
            Ok(h) => h,
            Err(e) => return Reply::Failed(e.to_string()),
        };
        let raw = RawRequest {
            method,
            path: path.to_string(),
            headers: vec![
                ("authorization".into(), format!("Bearer {}", self.bearer)),
                ("content-type".into(), content_type.into()),
            ],
            body: body.into(),
        };
        reply_of(http.send_within(raw, Bounds::new(timeout, 64 << 20)).await)
    }

    async fn json(&self, method: Method, path: &str, body: &Value, timeout: Duration) -> Reply {
        self.request(method, path, "application/json", body.to_string(), timeout)
            .await
    }

    async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, "", Bytes::new(), Duration::from_secs(30))
            .await
    }

    /// Deploy a graph; its run path, or the reply.
    async fn deploy(&self, graph: &Graph) -> Result<String, Reply> {
        let r = self
            .request(
                Method::POST,
                "/v1/tasks",
                "application/octet-stream",
                graph.to_bytes(),
                Duration::from_secs(60),
            )
            .await;
        match api::from_value::<api::TaskDeployed>(r.value()) {
            Ok(d) if r.status() == Some(200) => Ok(d.task.endpoint),
            _ => Err(r),
        }
    }
}

fn reply_of(r: Result<tenet_net::RawResponse, ClientError>) -> Reply {
    match r {
        Ok(r) => Reply::Answer(
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        ),
        Err(ClientError::Timeout { .. }) => Reply::Timeout,
        Err(e) => Reply::Failed(e.to_string()),
    }
}

/// How a held or raw connection ended.
#[derive(Clone, Debug)]
enum End {
    /// The server answered with this status.
    Status(u16),
    /// The server closed (or reset) it without an answer.
    Closed,
    /// Still open when we stopped waiting.
    Open,
    /// We could not connect.
    NoConnect,
}

impl End {
    fn label(&self) -> String {
        match self {
            End::Status(s) => s.to_string(),
            End::Closed => "closed".to_string(),
            End::Open => "still open".to_string(),
            End::NoConnect => "connect failed".to_string(),
        }
    }

    /// The server dealt with it (answered or closed).
    fn ended(&self) -> bool {
        matches!(self, End::Status(_) | End::Closed)
    }
}

/// Read what the server sends until a whole answer head, or its close, by `deadline`.
async fn read_end(r: &mut (impl AsyncRead + Unpin), deadline: tokio::time::Instant) -> End {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]);
            return head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .map_or(End::Closed, End::Status);
        }
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Err(_) => return End::Open,
            Ok(Ok(0)) | Ok(Err(_)) => {
                return if got.is_empty() {
                    End::Closed
                } else {
                    String::from_utf8_lossy(&got)
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .map_or(End::Closed, End::Status)
                };
            }
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() > 64 << 10 {
                    return End::Closed;
                }
            }
        }
    }
}

/// A request head; `length: None` sends a chunked body.
fn head(
    method: &str,
    path: &str,
    addr: &str,
    headers: &[(String, String)],
    length: Option<u64>,
) -> String {
    let mut h = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\n");
    match length {
        Some(n) => h += &format!("content-length: {n}\r\n"),
        None => h += "transfer-encoding: chunked\r\n",
    }
    for (k, v) in headers {
        h += &format!("{k}: {v}\r\n");
    }
    h += "\r\n";
    h
}

async fn connect(addr: &str) -> Option<TcpStream> {
    tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
        .await
        .ok()?
        .ok()
}

/// Send `head`, then `body` at full speed (at most `total` bytes of pieces of `piece`,
/// chunk-framed when `chunked`), while reading the answer: how it ended and the body bytes
/// the connection took before it did.
async fn stream_body(
    addr: &str,
    head: String,
    piece: &[u8],
    total: u64,
    chunked: bool,
    wait: Duration,
) -> (End, u64) {
    let Some(s) = connect(addr).await else {
        return (End::NoConnect, 0);
    };
    let (mut r, mut w) = s.into_split();
    let deadline = tokio::time::Instant::now() + wait;
    let sent = AtomicU64::new(0);
    let writing = async {
        if w.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let framed = if chunked {
            [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat()
        } else {
            piece.to_vec()
        };
        while sent.load(Ordering::Relaxed) < total {
            if w.write_all(&framed).await.is_err() {
                return;
            }
            sent.fetch_add(piece.len() as u64, Ordering::Relaxed);
        }
        if chunked {
            let _ = w.write_all(b"0\r\n\r\n").await;
        }
        // Everything sent: wait for the answer.
        std::future::pending::<()>().await;
    };
    let reading = read_end(&mut r, deadline);
    tokio::pin!(writing, reading);
    let first = tokio::select! {
        end = &mut reading => Some(end),
        _ = &mut writing => None,
    };
    let end = match first {
        Some(end) => end,
        // A refused write: the server hung up; what did it say?
        None => after_hangup(&mut reading).await,
    };
    (end, sent.load(Ordering::Relaxed))
}

/// Hold a connection that sends `head` (if any) and then one byte of `trickle` a second,
/// until the server answers or closes it, or `until`: how it ended and after how long.
async fn hold(
    addr: String,
    head: Option<String>,
    trickle: Vec<u8>,
    until: tokio::time::Instant,
) -> (End, f64) {
    let started = Instant::now();
    let Some(s) = connect(&addr).await else {
        return (End::NoConnect, 0.0);
    };
    let (mut r, mut w) = s.into_split();
    let writing = async {
        if let Some(h) = head
            && w.write_all(h.as_bytes()).await.is_err()
        {
            return;
        }
        for b in trickle.iter().cycle() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    };
    let reading = read_end(&mut r, until);
    tokio::pin!(writing, reading);
    let first = tokio::select! {
        end = &mut reading => Some(end),
        _ = &mut writing => None,
    };
    let end = match first {
        Some(end) => end,
        None => after_hangup(&mut reading).await,
    };
    (end, started.elapsed().as_secs_f64())
}

/// After a write was refused (the server hung up): the answer it sent, if any comes within
/// 2 s; closed otherwise.
async fn after_hangup(reading: &mut (impl std::future::Future<Output = End> + Unpin)) -> End {
    match tokio::time::timeout(Duration::from_secs(2), reading).await {
        Ok(End::Open) | Err(_) => End::Closed,
        Ok(end) => end,
    }
}

// ---------------------------------------------------------------------------------------
// Hostile servers

/// Read a request head (at most 64 KiB, 10 s).
async fn read_request_head(s: &mut TcpStream) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return false,
        }
        if got.len() > 64 << 10 {
            return false;
        }
    }
    true
}

/// A peer that answers every request 200 with a chunked body that does not end (up to
/// [`PEER_STREAM_CAP`] a connection).
struct Peer {
    url: String,
    accepted: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
}

async fn endless_peer() -> Result<Peer, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let (accepted, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (a, total) = (accepted.clone(), sent.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::Relaxed);
            let total = total.clone();
            tokio::spawn(async move {
                if !read_request_head(&mut s).await {
                    return;
                }
                let piece = [
                    format!("{:x}\r\n", 64 << 10).as_bytes(),
                    &vec![b'x'; 64 << 10],
                    b"\r\n",
                ]
                .concat();
                if s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                let mut n = 0u64;
                while n < PEER_STREAM_CAP {
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                    n += 64 << 10;
                    total.fetch_add(64 << 10, Ordering::Relaxed);
                }
            });
        }
    });
    Ok(Peer {
        url,
        accepted,
        sent,
    })
}

/// A fake node: answers every request with a `/v1/info` of its own invented identity and
/// limits, and runs nothing. Its URL and id.
async fn fake_node() -> Result<(String, String), String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let id = identity::generate().public();
    let info = NodeInfo {
        node_id: id,
        version: env!("CARGO_PKG_VERSION").to_string(),
        backend: "fake".to_string(),
        cores: 1024,
        memory_limit_bytes: 1 << 40,
        max_job_flops: u64::MAX,
        tiers: vec![Tier::Exact, Tier::Tolerant],
        price_per_gflop: 0.0,
        open: false,
        devices: Vec::new(),
    };
    let body = serde_json::to_vec(&info).map_err(|e| e.to_string())?;
    let answer = [
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes(),
        body,
    ]
    .concat();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                if read_request_head(&mut s).await {
                    let _ = s.write_all(&answer).await;
                }
            });
        }
    });
    Ok((url, id.to_hex()))
}

// ---------------------------------------------------------------------------------------
// Honest callers

/// What honest callers share.
struct Honest {
    url: String,
    bearer: String,
    path: String,
    calls: Vec<Call>,
    coordinator: PublicKey,
    /// The nodes the admin bonded (hex ids): the only ones a receipt may name.
    bonded: HashSet<String>,
}

/// One honest answer that checked out.
struct Done {
    job: String,
    slashed: Vec<String>,
}

impl Honest {
    /// Check an answer: 200, a receipt by this coordinator that verifies and names only bonded
    /// nodes, the right result.
    fn check(&self, status: u16, body: &[u8], expected: &[u8]) -> Result<Done, String> {
        let answer = verified(status, body, &self.coordinator, expected)?;
        for a in &answer.receipt.nodes {
            let node = a.commitment.node.to_hex();
            if !self.bonded.contains(&node) {
                return Err(format!(
                    "the receipt names node {} which the admin never bonded",
                    &node[..12]
                ));
            }
        }
        Ok(Done {
            slashed: answer.slashed.into_iter().map(|s| s.node).collect(),
            job: answer.job_id,
        })
    }
}

/// What one phase of honest calls gave.
#[derive(Default)]
struct PhaseRun {
    latencies: Vec<f64>,
    done: Vec<Done>,
    failed: usize,
    errors: Vec<String>,
    seconds: f64,
}

/// `clients` callers, each calling one call after another until `duration` has passed.
async fn honest_phase(h: Arc<Honest>, clients: usize, duration: Duration, salt: usize) -> PhaseRun {
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for c in 0..clients {
        let h = h.clone();
        set.spawn(async move {
            let mut run = PhaseRun::default();
            let http = match NodeClient::new(&h.url, identity::generate()) {
                Ok(x) => x,
                Err(e) => {
                    run.failed += 1;
                    run.errors.push(e.to_string());
                    return run;
                }
            };
            let mut n = 0usize;
            while started.elapsed() < duration {
                let call = &h.calls[(salt + c * 7919 + n * 31) % h.calls.len()];
                n += 1;
                let t = Instant::now();
                let answer = http
                    .send_within(
                        RawRequest {
                            method: Method::POST,
                            path: h.path.clone(),
                            headers: vec![
                                ("authorization".into(), format!("Bearer {}", h.bearer)),
                                ("content-type".into(), "application/json".into()),
                            ],
                            body: call.body.clone(),
                        },
                        Bounds::new(Duration::from_secs(120), 16 << 20),
                    )
                    .await;
                let took = t.elapsed().as_secs_f64() * 1e3;
                match answer
                    .map_err(|e| e.to_string())
                    .and_then(|r| h.check(r.status, &r.body, &call.expected))
                {
                    Ok(d) => {
                        run.latencies.push(took);
                        run.done.push(d);
                    }
                    Err(e) => {
                        run.failed += 1;
                        if run.errors.len() < 3 {
                            run.errors.push(e);
                        }
                    }
                }
            }
            run
        });
    }
    let mut all = PhaseRun::default();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(r) => {
                all.latencies.extend(r.latencies);
                all.done.extend(r.done);
                all.failed += r.failed;
                all.errors.extend(r.errors);
            }
            Err(e) => {
                all.failed += 1;
                all.errors.push(format!("a client task failed: {e}"));
            }
        }
    }
    all.seconds = started.elapsed().as_secs_f64();
    all.errors.truncate(5);
    all
}

fn summary(run: &PhaseRun) -> PhaseSummary {
    let mut l = run.latencies.clone();
    l.sort_by(|a, b| a.total_cmp(b));
    PhaseSummary {
        ok: run.done.len(),
        failed: run.failed,
        seconds: run.seconds,
        p50_ms: quantile(&l, 0.5),
        p99_ms: quantile(&l, 0.99),
        max_ms: l.last().copied().unwrap_or(f64::NAN),
        errors: run.errors.clone(),
    }
}

// ---------------------------------------------------------------------------------------
// Attackers

/// What attackers share.
struct Ctx {
    caller: Api,
    admin: Api,
    coordinator_addr: String,
    /// The honest nodes (name, URL).
    nodes: Vec<(String, String)>,
    staller: Option<(String, String)>,
    attacker: KeyPair,
    honest_path: String,
    honest_inputs: Value,
    listed: Peer,
    unlisted: Peer,
    /// Fake nodes the sybil class registered (ids).
    fakes: Mutex<Vec<String>>,
    rate: f64,
    max: usize,
    chain_ops: usize,
    idle_per_process: usize,
    /// When the attack phase ends, and when held connections stop being waited for.
    until: Instant,
    hold_until: Instant,
}

impl Ctx {
    fn node_client(&self, i: usize) -> Result<NodeClient, String> {
        let (_, url) = &self.nodes[i % self.nodes.len()];
        NodeClient::new(url, self.attacker.clone()).map_err(|e| e.to_string())
    }

    fn pace(&self) -> Pace {
        Pace {
            interval: Duration::from_secs_f64(1.0 / self.rate),
            next: Instant::now(),
            until: self.until,
            left: self.max,
            i: 0,
        }
    }
}

/// Attempts at a bounded rate until the phase ends or the count is spent.
struct Pace {
    interval: Duration,
    next: Instant,
    until: Instant,
    left: usize,
    i: u64,
}

impl Pace {
    async fn tick(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep(self.next - now).await;
        } else {
            self.next = now;
        }
        if self.left == 0 || Instant::now() >= self.until {
            return None;
        }
        self.left -= 1;
        self.next += self.interval;
        self.i += 1;
        Some(self.i - 1)
    }
}

const SHORT: Duration = Duration::from_secs(30);

async fn attack(class: Class, ctx: Arc<Ctx>) -> ClassReport {
    let mut r = ClassReport::new(class);
    let result = match class {
        Class::Weights => weights(&ctx, &mut r).await,
        Class::Chain => chain(&ctx, &mut r).await,
        Class::Bench => bench_network(&ctx, &mut r).await,
        Class::Sybil => sybil(&ctx, &mut r).await,
        Class::Stall => stall(&ctx, &mut r).await,
        Class::Json => json_bodies(&ctx, &mut r).await,
        Class::Wait => wait_nan(&ctx, &mut r).await,
        Class::Pull => pulls(&ctx, &mut r).await,
        Class::Conns => conns(&ctx, &mut r).await,
        Class::Declared => declared(&ctx, &mut r).await,
        Class::Session => sessions(&ctx, &mut r).await,
        Class::Values => values(&ctx, &mut r).await,
    };
    if let Err(e) = result {
        r.notes.push(format!("the attacker stopped: {e}"));
    }
    r
}

fn is_4xx(reply: &Reply) -> bool {
    reply.status().is_some_and(|s| (400..500).contains(&s))
}

/// Class 1, weights that amplify.
async fn weights(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    const TENSORS: usize = 3000;
    let blocks = (1 << 20) / 20;
    let wide = match ctx.caller.deploy(&wide_task()?).await {
        Ok(p) => p,
        Err(e) => return Err(format!("deploying the 2 MiB task: {e}")),
    };
    let st_bomb = Bytes::from(safetensors_bomb(1 << 19, 60 << 10));
    let st_tensors = String::from_utf8_lossy(&st_bomb[..(64 << 10).min(st_bomb.len())])
        .matches("\"dtype\"")
        .count() as u64;
    let st_claims = st_tensors * (2 << 20);
    r.notes.push(format!(
        "GGUF: {TENSORS} tensors over 1 MiB ({:.1} GB dequantised); safetensors body: {:.1} MiB, {st_tensors} tensors claiming {:.1} GB",
        (TENSORS * blocks * 128) as f64 / 1e9,
        mib(st_bomb.len() as u64),
        st_claims as f64 / 1e9
    ));
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let bomb = gguf_bomb(TENSORS, blocks, i as u32);
        match i % 4 {
            0 => {
                // Deploy weights: the upload is stored (bytes are bytes); deploying a task
                // that binds it must be refused.
                let hash = Hash::of(&bomb);
                let graph = weighted_task(&bomb, blocks as u64 * 32)?;
                let up = ctx
                    .caller
                    .request(
                        Method::PUT,
                        &format!("/v1/blobs/{hash}"),
                        "application/octet-stream",
                        bomb,
                        SHORT,
                    )
                    .await;
                if up.status() != Some(200) {
                    r.add_reply(
                        format!("coordinator upload {}", up.label()),
                        is_4xx(&up),
                        &up,
                    );
                    continue;
                }
                let d = ctx
                    .caller
                    .request(
                        Method::POST,
                        "/v1/tasks",
                        "application/octet-stream",
                        graph.to_bytes(),
                        SHORT,
                    )
                    .await;
                r.add_reply(
                    format!("deploy with GGUF weights {}", d.label()),
                    d.status() == Some(422),
                    &d,
                );
            }
            1 => {
                let c = ctx
                    .caller
                    .request(Method::POST, &wide, "application/octet-stream", bomb, SHORT)
                    .await;
                r.add_reply(format!("GGUF call body {}", c.label()), is_4xx(&c), &c);
            }
            2 => {
                let c = ctx
                    .caller
                    .request(
                        Method::POST,
                        &wide,
                        "application/octet-stream",
                        st_bomb.clone(),
                        SHORT,
                    )
                    .await;
                r.add_reply(
                    format!("safetensors call body {}", c.label()),
                    is_4xx(&c),
                    &c,
                );
            }
            _ => {
                // A node's job with the file as its weights, from a key the node trusts.
                let node = ctx.node_client(i as usize / 4)?;
                let graph = weighted_task(&bomb, blocks as u64 * 32)?;
                let task = node.put_blob(graph.to_bytes()).await;
                let weights = node.put_blob(bomb).await;
                let (task, weights) = match (task, weights) {
                    (Ok(t), Ok(w)) => (t, w),
                    (Err(e), _) | (_, Err(e)) => {
                        r.add_reply("node upload failed", false, &e);
                        continue;
                    }
                };
                let job = RunJob {
                    job: JobSpec {
                        job_id: format!("bomb-{i}-{}", std::process::id()),
                        task: task.hash,
                        weights: Some(weights.hash),
                        inputs: BTreeMap::new(),
                        tier: Tier::Exact,
                        seed: 0,
                    },
                    timeout_ms: None,
                    blobs: BTreeMap::new(),
                    pulls: Default::default(),
                    stage: None,
                };
                let raw = node.signed(
                    Method::POST,
                    "/v1/jobs",
                    serde_json::to_vec(&job).map_err(|e| e.to_string())?,
                );
                let a = reply_of(node.send_within(raw, Bounds::new(SHORT, 1 << 20)).await);
                r.add_reply(
                    format!("node job with GGUF weights {}", a.label()),
                    a.status() == Some(422),
                    &a,
                );
            }
        }
    }
    Ok(())
}

/// Class 2, the certificate against the real cost.
async fn chain(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let graph = chain_task(ctx.chain_ops)?;
    let cost = graph.cost();
    r.notes.push(format!(
        "{} tanh on f32[4]: certified at {} bytes, {} flops",
        ctx.chain_ops, cost.peak_bytes, cost.flops
    ));
    let mut slowest = 0f64;
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let path = match ctx.caller.deploy(&graph).await {
            Ok(p) => p,
            Err(e) => {
                r.add_reply(format!("deploy {}", e.label()), e.status() == Some(422), &e);
                continue;
            }
        };
        let x = i as f64 * 0.001;
        let t = Instant::now();
        let c = ctx
            .caller
            .json(
                Method::POST,
                &path,
                &json!({"inputs": {"x": [x, 0.5, -1.0, 2.0]}}),
                Duration::from_secs(120),
            )
            .await;
        slowest = slowest.max(t.elapsed().as_secs_f64());
        r.add_reply(
            format!("call {}", c.label()),
            matches!(c.status(), Some(200) | Some(422)),
            &c,
        );
    }
    r.notes.push(format!("slowest chain call {:.2} s", slowest));
    Ok(())
}

/// Class 3, one call benching the network.
async fn bench_network(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let graph = over_limit_task()?;
    r.notes.push(format!(
        "task certified at {:.0} MiB; nodes take {:.0} MiB",
        mib(graph.cost().peak_bytes),
        mib(NODE_MEMORY_LIMIT)
    ));
    let path = match ctx.caller.deploy(&graph).await {
        Ok(p) => p,
        Err(e) => {
            r.add_reply(format!("deploy {}", e.label()), false, &e);
            return Ok(());
        }
    };
    let mut pace = ctx.pace();
    while let Some(_i) = pace.tick().await {
        let c = ctx
            .caller
            .json(
                Method::POST,
                &path,
                &json!({"inputs": {"x": [[1.0]]}}),
                SHORT,
            )
            .await;
        let code = c.value()["error"]["code"].as_str() == Some("exceeds_limits");
        r.add_reply(c.label(), c.status() == Some(422) && code, &c);
    }
    Ok(())
}

/// Class 4, Sybil stake.
async fn sybil(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let mut fakes = Vec::new();
    for _ in 0..8 {
        fakes.push(fake_node().await?);
    }
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let (url, id) = &fakes[(i as usize / 3) % fakes.len()];
        match i % 3 {
            0 => {
                let a = ctx
                    .caller
                    .json(
                        Method::POST,
                        "/v1/nodes",
                        &json!({"url": url, "stake": INVENTED_STAKE}),
                        SHORT,
                    )
                    .await;
                r.add_reply(
                    format!("register with stake {}", a.label()),
                    a.status() == Some(403),
                    &a,
                );
            }
            1 => {
                let a = ctx
                    .caller
                    .json(Method::POST, "/v1/nodes", &json!({"url": url}), SHORT)
                    .await;
                let stake = api::from_value::<api::Node>(a.value())
                    .ok()
                    .map(|n| n.stake);
                let label = match (a.status(), stake) {
                    (Some(200), Some(s)) => format!("register without stake 200, stake {s}"),
                    _ => format!("register without stake {}", a.label()),
                };
                // Refusing a caller's registration is a defence too; a stake is not.
                let fine = match a.status() {
                    Some(200) => stake == Some(0),
                    Some(s) => (400..500).contains(&s),
                    None => false,
                };
                if a.status() == Some(200)
                    && let Ok(mut f) = ctx.fakes.lock()
                    && !f.contains(id)
                {
                    f.push(id.clone());
                }
                r.add_reply(label, fine, &a);
            }
            _ => {
                let a = ctx
                    .caller
                    .json(
                        Method::PUT,
                        &format!("/v1/nodes/{id}"),
                        &json!({"url": url, "stake": INVENTED_STAKE}),
                        SHORT,
                    )
                    .await;
                r.add_reply(
                    format!("PUT with stake {}", a.label()),
                    a.status() == Some(403),
                    &a,
                );
            }
        }
    }
    Ok(())
}

/// Class 5, stalling: the admin bonds the withholding node as the attack begins; what it did
/// is counted from the honest jobs afterwards.
async fn stall(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let Some((_, url)) = &ctx.staller else {
        return Err("no withholding node was started".into());
    };
    let id = node_id_of(url).await?;
    let b = ctx
        .admin
        .json(
            Method::POST,
            &format!("/v1/nodes/{id}/stake"),
            &json!({"amount": STAKE, "operator": "withholder"}),
            SHORT,
        )
        .await;
    if b.status() != Some(200) {
        return Err(format!("bonding the withholding node: {b}"));
    }
    r.notes
        .push(format!("withholding node {} bonded {STAKE}", &id[..12]));
    Ok(())
}

/// Class 6, amplifying JSON.
async fn json_bodies(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    const TOTAL: u64 = 100_000_000;
    let piece = "0.5, ".repeat(13_000).into_bytes();
    let mut most = 0u64;
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let chunked = i % 2 == 1;
        let headers = vec![
            (
                "authorization".to_string(),
                format!("Bearer {}", ctx.caller.bearer),
            ),
            ("content-type".to_string(), "application/json".to_string()),
        ];
        let h = head(
            "POST",
            &ctx.honest_path,
            &ctx.coordinator_addr,
            &headers,
            (!chunked).then_some(TOTAL),
        );
        let prefix = b"{\"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1, 16], \"data\": [";
        // The prefix rides in the head's write: the server sees one continuous body.
        let head_and_prefix = if chunked {
            format!(
                "{h}{:x}\r\n{}\r\n",
                prefix.len(),
                String::from_utf8_lossy(prefix)
            )
        } else {
            format!("{h}{}", String::from_utf8_lossy(prefix))
        };
        let (end, sent) = stream_body(
            &ctx.coordinator_addr,
            head_and_prefix,
            &piece,
            TOTAL,
            chunked,
            SHORT,
        )
        .await;
        most = most.max(sent);
        let kind = if chunked { "chunked" } else { "declared" };
        r.add(
            format!("{kind} {}", end.label()),
            matches!(end, End::Status(413)),
        );
    }
    r.notes.push(format!(
        "the most body bytes a connection took before the answer: {:.1} MiB of 100 MB",
        mib(most)
    ));
    Ok(())
}

/// Class 7, a remote panic.
async fn wait_nan(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let waits = ["NaN", "inf", "-1", "1e999"];
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let w = waits[i as usize % waits.len()];
        let a = ctx.caller.get(&format!("/v1/jobs/x?wait={w}")).await;
        r.add_reply(
            format!("wait={w} {}", a.label()),
            a.status() == Some(400),
            &a,
        );
    }
    Ok(())
}

/// Class 8, session pulls from hostile addresses.
async fn pulls(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let mut sessions = Vec::new();
    for i in 0..ctx.nodes.len() {
        let c = ctx.node_client(i)?;
        let sid = c.create_session().await.map_err(|e| e.to_string())?;
        sessions.push((c, sid));
    }
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let (c, sid) = &sessions[(i as usize / 2) % sessions.len()];
        let (peer, which) = if i % 2 == 0 {
            (&ctx.unlisted.url, "unlisted")
        } else {
            (&ctx.listed.url, "listed endless")
        };
        let batch = Batch {
            ops: vec![SessionOp::Pull {
                name: format!("t{i}"),
                hash: Hash::of(format!("anything {i}").as_bytes()),
                peer: peer.clone(),
            }],
        };
        let raw = c.signed(
            Method::POST,
            &format!("/v1/sessions/{sid}/batch"),
            serde_json::to_vec(&batch).map_err(|e| e.to_string())?,
        );
        let a = reply_of(
            c.send_within(raw, Bounds::new(Duration::from_secs(60), 1 << 20))
                .await,
        );
        let code = a.value()["error"]["code"].as_str().map(str::to_string);
        let (label, fine) = match (a.status(), code) {
            (Some(200), Some(code)) => (
                format!("{which}: batch error {code}"),
                which != "unlisted" || code == "bad_request",
            ),
            (Some(200), None) => (format!("{which}: pulled"), false),
            (_, _) => (format!("{which}: {}", a.label()), is_4xx(&a)),
        };
        r.add_reply(label, fine, &a);
    }
    // Let the listed peer see the node hang up before counting what it sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.notes.push(format!(
        "the unlisted peer was contacted {} time(s); the listed endless peer sent {:.1} MiB over {} connection(s)",
        ctx.unlisted.accepted.load(Ordering::Relaxed),
        mib(ctx.listed.sent.load(Ordering::Relaxed)),
        ctx.listed.accepted.load(Ordering::Relaxed)
    ));
    Ok(())
}

/// Class 9, idle, slow-head and slow-body connections to every process, held until the
/// server closes them or `hold_until`.
async fn conns(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let until = tokio::time::Instant::from_std(ctx.hold_until);
    let mut targets = vec![(
        "coordinator".to_string(),
        ctx.coordinator_addr.clone(),
        None,
    )];
    for (i, (name, url)) in ctx.nodes.iter().enumerate() {
        targets.push((
            name.clone(),
            url.trim_start_matches("http://").to_string(),
            Some(i),
        ));
    }
    let mut set = tokio::task::JoinSet::new();
    for (t, (_, addr, node)) in targets.iter().enumerate() {
        for k in 0..ctx.idle_per_process {
            let addr = addr.clone();
            set.spawn(async move { (t, "idle", hold(addr, None, Vec::new(), until).await) });
            if k % 50 == 49 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        for _ in 0..SLOW_PER_PROCESS {
            let h = "GET /v1/info HTTP/1.1\r\nx-slow: ".to_string();
            set.spawn(hold_as(
                t,
                "slow head",
                addr.clone(),
                Some(h),
                b"a".to_vec(),
                until,
            ));
            let data = vec![7u8; 1 << 20];
            let hash = Hash::of(&data);
            let path = format!("/v1/blobs/{hash}");
            let headers = match node {
                Some(i) => ctx
                    .node_client(*i)?
                    .auth_headers(&Method::PUT, &path, &data),
                None => vec![(
                    "authorization".to_string(),
                    format!("Bearer {}", ctx.caller.bearer),
                )],
            };
            let mut h = head("PUT", &path, addr, &headers, Some(data.len() as u64));
            h += &String::from_utf8_lossy(&data[..16]);
            set.spawn(hold_as(
                t,
                "slow body",
                addr.clone(),
                Some(h),
                data[16..].to_vec(),
                until,
            ));
        }
    }
    // (target, kind) → times at which the server ended them.
    let mut ended: BTreeMap<(usize, &str), Vec<f64>> = BTreeMap::new();
    let mut count: BTreeMap<(usize, &str), usize> = BTreeMap::new();
    while let Some(done) = set.join_next().await {
        let Ok((t, kind, (end, after))) = done else {
            r.add("attacker task failed", false);
            continue;
        };
        r.add(format!("{kind} {}", end.label()), end.ended());
        *count.entry((t, kind)).or_default() += 1;
        if end.ended() {
            ended.entry((t, kind)).or_default().push(after);
        }
    }
    for ((t, kind), n) in count {
        let mut times = ended.remove(&(t, kind)).unwrap_or_default();
        times.sort_by(|a, b| a.total_cmp(b));
        r.notes.push(format!(
            "{}: {kind}: {} of {n} ended by the server{}",
            targets[t].0,
            times.len(),
            if times.is_empty() {
                String::new()
            } else {
                format!(" ({})", spread(&times))
            }
        ));
    }
    Ok(())
}

async fn hold_as(
    t: usize,
    kind: &'static str,
    addr: String,
    head: Option<String>,
    trickle: Vec<u8>,
    until: tokio::time::Instant,
) -> (usize, &'static str, (End, f64)) {
    (t, kind, hold(addr, head, trickle, until).await)
}

/// Class 10, quota reserved on declared length: header-only 2 GiB uploads held open, and
/// real uploads meanwhile, to every node (signed) and to the coordinator (its callers' key:
/// it stores uploaded weights too).
async fn declared(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let until = tokio::time::Instant::from_std(ctx.hold_until);
    let targets = ctx.nodes.len() + 1;
    let mut held = tokio::task::JoinSet::new();
    let mut opened = vec![0usize; targets];
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let t = (i as usize / 2) % targets;
        // Node `t`, or the coordinator after the last node.
        let node = (t < ctx.nodes.len())
            .then(|| ctx.node_client(t))
            .transpose()?;
        let name = node.as_ref().map_or("coordinator", |_| "node");
        if i % 2 == 0 && opened[t] < DECLARED_PER_PROCESS {
            opened[t] += 1;
            let dummy = format!("declared {i} {}", std::process::id()).into_bytes();
            let path = format!("/v1/blobs/{}", Hash::of(&dummy));
            let (addr, headers) = match &node {
                Some(n) => (
                    n.url().trim_start_matches("http://").to_string(),
                    n.auth_headers(&Method::PUT, &path, &dummy),
                ),
                None => (
                    ctx.coordinator_addr.clone(),
                    vec![(
                        "authorization".to_string(),
                        format!("Bearer {}", ctx.caller.bearer),
                    )],
                ),
            };
            let h = head("PUT", &path, &addr, &headers, Some(2 << 30));
            held.spawn(async move { (name, hold(addr, Some(h), Vec::new(), until).await) });
            continue;
        }
        let mut data = vec![0u8; 1 << 20];
        data[..8].copy_from_slice(&i.to_le_bytes());
        data[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        let a = match &node {
            Some(n) => match n.upload_blob(data).await {
                Ok(_) => Reply::Answer(200, Value::Null),
                Err(ClientError::Api { status, error }) => {
                    Reply::Answer(status, json!({"error": error}))
                }
                Err(ClientError::Timeout { .. }) => Reply::Timeout,
                Err(e) => Reply::Failed(e.to_string()),
            },
            None => {
                let path = format!("/v1/blobs/{}", Hash::of(&data));
                ctx.caller
                    .request(Method::PUT, &path, "application/octet-stream", data, SHORT)
                    .await
            }
        };
        r.add_reply(
            format!("{name}: real 1 MiB upload {}", a.label()),
            a.status() == Some(200),
            &a,
        );
    }
    let mut times: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    while let Some(done) = held.join_next().await {
        let Ok((name, (end, after))) = done else {
            r.add("attacker task failed", false);
            continue;
        };
        r.add(
            format!("{name}: 2 GiB header-only {}", end.label()),
            end.ended(),
        );
        if end.ended() {
            times.entry(name).or_default().push(after);
        }
    }
    for (name, mut t) in times {
        t.sort_by(|a, b| a.total_cmp(b));
        r.notes
            .push(format!("{name}: held uploads ended {}", spread(&t)));
    }
    Ok(())
}

/// "after A s at the earliest, M s median, Z s at the latest" of sorted times.
fn spread(sorted: &[f64]) -> String {
    format!(
        "after {:.1} s at the earliest, {:.1} s median, {:.1} s at the latest",
        sorted.first().copied().unwrap_or(f64::NAN),
        quantile(sorted, 0.5),
        sorted.last().copied().unwrap_or(f64::NAN)
    )
}

/// Class 11, session tensor uploads to sessions that do not exist.
async fn sessions(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let node = ctx.node_client(i as usize)?;
        let path = format!("/v1/sessions/nope{i}/tensors/t");
        let headers = node.auth_headers(&Method::PUT, &path, b"never sent");
        let addr = node.url().trim_start_matches("http://").to_string();
        let h = head("PUT", &path, &addr, &headers, Some(256 << 20));
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        let (end, _) = hold(addr, Some(h), Vec::new(), until).await;
        r.add(end.label(), matches!(end, End::Status(404)));
    }
    Ok(())
}

/// Class 12, values that used to be taken silently.
async fn values(ctx: &Ctx, r: &mut ClassReport) -> Result<(), String> {
    let mut pace = ctx.pace();
    while let Some(i) = pace.tick().await {
        let mut inputs = ctx.honest_inputs.clone();
        let (what, body) = match i % 3 {
            0 => ("seed -1", json!({"inputs": inputs, "seed": -1})),
            1 => ("seed \"7\"", json!({"inputs": inputs, "seed": "7"})),
            _ => {
                inputs["x"]["data"][0] = json!(1e39);
                ("x = 1e39", json!({"inputs": inputs}))
            }
        };
        let a = ctx
            .caller
            .json(Method::POST, &ctx.honest_path, &body, SHORT)
            .await;
        r.add_reply(format!("{what} {}", a.label()), a.status() == Some(422), &a);
    }
    Ok(())
}

/// A node's id, from its `/v1/info`.
async fn node_id_of(url: &str) -> Result<String, String> {
    let c = NodeClient::new(url, identity::generate()).map_err(|e| e.to_string())?;
    let info = tokio::time::timeout(SHORT, c.info())
        .await
        .map_err(|_| format!("{url} did not answer /v1/info"))?
        .map_err(|e| e.to_string())?;
    Ok(info.node_id.to_hex())
}

// ---------------------------------------------------------------------------------------
// The run

/// Register each node as the admin and bond its stake under its own operator; the bonded ids.
async fn bond_nodes(admin: &Api, nodes: &[(String, String)]) -> Result<Vec<String>, String> {
    let mut ids = Vec::new();
    for (i, (_, url)) in nodes.iter().enumerate() {
        let n = admin
            .json(Method::POST, "/v1/nodes", &json!({"url": url}), SHORT)
            .await;
        let id = api::from_value::<api::Node>(n.value())
            .map_err(|_| format!("registering {url}: {n}"))?
            .id;
        let b = admin
            .json(
                Method::POST,
                &format!("/v1/nodes/{id}/stake"),
                &json!({"amount": STAKE, "operator": format!("op-{i}")}),
                SHORT,
            )
            .await;
        if b.status() != Some(200) {
            return Err(format!("bonding {url}: {b}"));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Start the network, run both phases, check, stop. `progress` hears each step.
pub fn run(
    config: &HostileConfig,
    mut progress: impl FnMut(&str),
) -> Result<HostileReport, String> {
    if config.clients == 0
        || !(config.seconds > 0.0 && config.seconds.is_finite())
        || !(config.rate > 0.0 && config.rate.is_finite())
        || !(config.linger_secs >= 0.0 && config.linger_secs.is_finite())
        || config.chain_ops == 0
    {
        return Err(
            "clients, seconds, rate and chain ops must be above 0, and linger at least 0".into(),
        );
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("tenet-bench-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    // Honest callers and attackers on runtimes of their own: an attacker's task never
    // queues before an honest call in the bench's own scheduler.
    let honest_rt = runtime("honest")?;
    let attack_rt = runtime("attack")?;
    let keys = Keys {
        caller: format!(
            "caller-{}",
            tenet_proto::to_hex(&identity::random_bytes::<16>())
        ),
        admin: format!(
            "admin-{}",
            tenet_proto::to_hex(&identity::random_bytes::<16>())
        ),
        attacker: identity::generate(),
    };
    let (listed, unlisted) = attack_rt
        .block_on(async { Ok::<_, String>((endless_peer().await?, endless_peer().await?)) })?;
    progress(&format!(
        "starting a coordinator and {} nodes on 127.0.0.1",
        3 + usize::from(config.classes.contains(&Class::Stall))
    ));
    let net = Network::start(config, &dir, &keys, &listed.url)?;
    let sampler = Sampler::start(&net, config.rss_guard_bytes);
    let coord = net.coordinator();
    let caller = Api {
        url: coord.url.clone(),
        bearer: keys.caller.clone(),
    };
    let admin = Api {
        url: coord.url.clone(),
        bearer: keys.admin.clone(),
    };
    let honest_nodes: Vec<(String, String)> = net
        .nodes()
        .map(|s| (s.name.clone(), s.url.clone()))
        .collect();
    let staller = net.staller().map(|s| (s.name.clone(), s.url.clone()));
    let coordinator_key = net.coordinator_key.ok_or("no coordinator key")?;

    progress("registering and bonding the nodes, deploying the task");
    let graph = task();
    let calls = calls(&graph, 64, 5000)?;
    // The first call's inputs, as a body's "inputs" (the value classes send them wrong).
    let honest_inputs = serde_json::from_slice::<Value>(&calls[0].body)
        .map_err(|e| e.to_string())?["inputs"]
        .take();
    let (bonded, path, staller_id) = honest_rt.block_on(async {
        let mut bonded = bond_nodes(&admin, &honest_nodes).await?;
        // The withholding node registers without stake now; the stall class bonds it.
        let mut staller_id = None;
        if let Some((_, url)) = &staller {
            let n = admin
                .json(Method::POST, "/v1/nodes", &json!({"url": url}), SHORT)
                .await;
            let id = api::from_value::<api::Node>(n.value())
                .map_err(|_| format!("registering the withholding node: {n}"))?
                .id;
            bonded.push(id.clone());
            staller_id = Some(id);
        }
        let path = caller
            .deploy(&graph)
            .await
            .map_err(|e| format!("deploying the honest task: {e}"))?;
        Ok::<_, String>((bonded, path, staller_id))
    })?;
    let honest = Arc::new(Honest {
        url: coord.url.clone(),
        bearer: keys.caller.clone(),
        path: path.clone(),
        calls,
        coordinator: coordinator_key,
        bonded: bonded.iter().cloned().collect(),
    });
    progress("warming up");
    let warm = honest_rt.block_on(honest_phase(
        honest.clone(),
        config.clients,
        Duration::from_secs(1),
        0,
    ));
    if warm.done.is_empty() {
        return Err(format!(
            "no honest call succeeded before any attack: {}",
            warm.errors.join("; ")
        ));
    }
    let phase = Duration::from_secs_f64(config.seconds);
    progress(&format!(
        "quiet phase: {} honest clients for {:.0} s",
        config.clients, config.seconds
    ));
    sampler.set_phase(PHASE_QUIET);
    let quiet = honest_rt.block_on(honest_phase(honest.clone(), config.clients, phase, 1));
    sampler.set_phase(PHASE_ATTACK);
    progress(&format!(
        "attack phase: the same clients for {:.0} s while attackers run {}",
        config.seconds,
        config
            .classes
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let until = Instant::now() + phase;
    let ctx = Arc::new(Ctx {
        caller: caller.clone(),
        admin: admin.clone(),
        coordinator_addr: coord.addr(),
        nodes: honest_nodes.clone(),
        staller: staller.clone(),
        attacker: keys.attacker.clone(),
        honest_path: path.clone(),
        honest_inputs,
        listed,
        unlisted,
        fakes: Mutex::new(Vec::new()),
        rate: config.rate,
        max: config.max_per_class,
        chain_ops: config.chain_ops,
        idle_per_process: config.idle_per_process,
        until,
        hold_until: until + Duration::from_secs_f64(config.linger_secs),
    });
    let attackers: Vec<_> = config
        .classes
        .iter()
        .map(|c| attack_rt.spawn(attack(*c, ctx.clone())))
        .collect();
    let attacked = honest_rt.block_on(honest_phase(honest.clone(), config.clients, phase, 2));
    progress(&format!(
        "waiting for the attackers (held connections: at most {:.0} s more)",
        config.linger_secs
    ));
    let bound = ctx.hold_until + Duration::from_secs(150);
    let mut classes = Vec::new();
    for (c, h) in config.classes.iter().zip(attackers) {
        let left = bound.saturating_duration_since(Instant::now());
        let r = attack_rt.block_on(async { tokio::time::timeout(left, h).await });
        classes.push(match r {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                let mut r = ClassReport::new(*c);
                r.notes.push(format!("the attacker task failed: {e}"));
                r
            }
            Err(_) => {
                let mut r = ClassReport::new(*c);
                r.notes
                    .push("the attacker did not finish in time; its answers are lost".into());
                r
            }
        });
    }

    sampler.end_attack(&net);
    progress("checking the ledger and the nodes");
    let mut jobs: Vec<&Done> = quiet.done.iter().chain(&attacked.done).collect();
    jobs.sort_by(|a, b| a.job.cmp(&b.job));
    jobs.dedup_by(|a, b| a.job == b.job);
    let fakes = ctx.fakes.lock().map(|f| f.clone()).unwrap_or_default();
    let (ledger_decided, ledger_not_decided, nodes, fake_nodes_listed, stall_counts) = honest_rt
        .block_on(async {
            let listed = caller.get("/v1/jobs?limit=10000").await;
            let mut states: HashMap<String, String> =
                api::from_value::<Vec<api::Job>>(listed.value())
                    .map(|jobs| jobs.into_iter().map(|j| (j.job_id, j.state)).collect())
                    .unwrap_or_default();
            let mut decided = 0;
            let mut not = Vec::new();
            for d in &jobs {
                if !states.contains_key(&d.job) {
                    let j = caller.get(&format!("/v1/jobs/{}", d.job)).await;
                    let s = api::from_value::<api::JobView>(j.value())
                        .map_or_else(|_| "missing".to_string(), |j| j.job.state);
                    states.insert(d.job.clone(), s);
                }
                if states.get(&d.job).map(String::as_str) == Some("decided") {
                    decided += 1;
                } else if not.len() < 5 {
                    not.push(format!(
                        "{} ({})",
                        d.job,
                        states.get(&d.job).map_or("missing", String::as_str)
                    ));
                }
            }
            let listed = caller.get("/v1/nodes").await;
            let mut names: HashMap<String, String> = HashMap::new();
            for (n, (name, _)) in bonded.iter().zip(honest_nodes.iter().chain(staller.iter())) {
                names.insert(n.clone(), name.clone());
            }
            let mut nodes = Vec::new();
            let mut fake_count = 0;
            let listed: Vec<api::Node> = api::from_value(listed.value()).unwrap_or_default();
            for n in listed {
                match names.get(&n.id) {
                    Some(name) => nodes.push(NodeSeen {
                        name: name.clone(),
                        id: n.id,
                        operator: n.operator,
                        state: n.state,
                        stake: n.stake,
                    }),
                    None => fake_count += usize::from(fakes.contains(&n.id)),
                }
            }
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            // Which attack-phase jobs the withholding node was drawn for, and was it slashed.
            let mut stall_counts = (0usize, 0usize);
            if let Some(sid) = &staller_id {
                for d in attacked.done.iter().take(3000) {
                    let j = caller.get(&format!("/v1/jobs/{}", d.job)).await;
                    let drawn = api::from_value::<api::JobView>(j.value())
                        .is_ok_and(|j| j.assignments.iter().any(|x| x.node == *sid));
                    let slashed = d.slashed.contains(sid);
                    if drawn || slashed {
                        stall_counts.0 += 1;
                        stall_counts.1 += usize::from(slashed);
                    }
                }
            }
            (decided, not, nodes, fake_count, stall_counts)
        });
    if let Some(r) = classes.iter_mut().find(|r| r.class == Class::Stall) {
        let (touched, slashed) = stall_counts;
        for _ in 0..slashed {
            r.add("drawn for an honest job, slashed", true);
        }
        for _ in slashed..touched {
            r.add("drawn for an honest job, not slashed", false);
        }
        if let Some(n) = nodes.iter().find(|n| n.name == "withholder") {
            r.notes.push(format!(
                "{touched} of {} honest attack-phase calls touched it; its stake {STAKE} -> {}, state {}",
                attacked.done.len(),
                n.stake,
                n.state
            ));
        }
    }
    if let Some(r) = classes.iter_mut().find(|r| r.class == Class::Sybil) {
        r.notes.push(format!(
            "{} fake node(s) listed by the coordinator at the end; honest receipts are checked to name only bonded nodes",
            fake_nodes_listed
        ));
    }
    if let Some(r) = classes.iter_mut().find(|r| r.class == Class::Bench) {
        let active = nodes
            .iter()
            .filter(|n| n.name.starts_with("node-") && n.state == "active")
            .count();
        r.notes
            .push(format!("{active} of 3 honest nodes active at the end"));
    }
    let mem = sampler.finish();
    let processes = net
        .services
        .iter()
        .zip(mem)
        .map(|(s, m)| {
            let (extra, formula) = match s.role {
                Role::Coordinator => (
                    COORDINATOR_MAX_TASK + tenet_ir::recycle::MAX_HELD as u64,
                    format!(
                        "coordinator: quiet peak + {:.0} MiB --max-task-memory (a referee run) + {:.0} MiB recycled-buffer cache",
                        mib(COORDINATOR_MAX_TASK),
                        mib(tenet_ir::recycle::MAX_HELD as u64)
                    ),
                ),
                Role::Node | Role::Staller => (
                    NODE_WORKERS * NODE_MEMORY_LIMIT
                        + NODE_SESSION_MEMORY
                        + tenet_ir::recycle::MAX_HELD as u64,
                    format!(
                        "node: quiet peak + {NODE_WORKERS} worker × {:.0} MiB --memory-limit + {:.0} MiB session memory + {:.0} MiB recycled-buffer cache",
                        mib(NODE_MEMORY_LIMIT),
                        mib(NODE_SESSION_MEMORY),
                        mib(tenet_ir::recycle::MAX_HELD as u64)
                    ),
                ),
            };
            let died = m.died.clone().map(|d| {
                format!("{d} (its log: {})", s.log.display())
            });
            ProcessReport {
                name: s.name.clone(),
                pid: s.pid,
                quiet_peak: m.quiet_peak,
                attack_peak: m.attack_peak,
                hwm: m.hwm,
                limit: m.quiet_peak + extra,
                limit_formula: formula,
                died,
            }
        })
        .collect();
    let report = HostileReport {
        config: config.clone(),
        quiet: summary(&quiet),
        attack: summary(&attacked),
        honest_jobs: jobs.len(),
        ledger_decided,
        ledger_not_decided,
        classes,
        processes,
        nodes,
        fake_nodes_listed,
        seconds_total: started.elapsed().as_secs_f64(),
    };
    drop(ctx);
    drop(net);
    attack_rt.shutdown_background();
    honest_rt.shutdown_background();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gguf_bomb_is_refused_under_a_budget_and_one_of_its_tensors_is_not() {
        // 300 tensors of 1000 blocks over 20 kB: 38 MB once dequantised.
        let bomb = gguf_bomb(300, 1000, 7);
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let e = tenet_models::WeightsFile::from_bytes_within(bomb, "bomb", 16 << 20);
        assert!(e.is_err(), "the bomb was accepted");
        // The same file with one tensor is a well-formed GGUF well within the budget.
        let one = gguf_bomb(1, 1000, 7);
        let file = tenet_models::WeightsFile::from_bytes_within(one, "one", 16 << 20);
        assert!(file.is_ok(), "{:?}", file.err().map(|e| e.to_string()));
        // Salts make distinct files.
        assert_ne!(gguf_bomb(2, 10, 1), gguf_bomb(2, 10, 2));
    }

    #[test]
    fn the_safetensors_bomb_is_refused_under_a_budget_and_fits_its_header_bound() {
        let bomb = safetensors_bomb(1 << 14, 8 << 10);
        let header = u64::from_le_bytes(bomb[..8].try_into().unwrap()) as usize;
        assert!(header <= 8 << 10 && header.is_multiple_of(8), "{header}");
        assert_eq!(bomb.len(), 8 + header + (4 << 14));
        let e = tenet_models::WeightsFile::from_bytes_within(bomb, "bomb", 1 << 20);
        assert!(e.is_err(), "the bomb was accepted");
        let one = safetensors_bomb(1 << 14, 100);
        let file = tenet_models::WeightsFile::from_bytes_within(one, "one", 1 << 20);
        assert!(file.is_ok(), "{:?}", file.err().map(|e| e.to_string()));
    }

    #[test]
    fn classes_parse_by_name_and_number() {
        assert_eq!(Class::parse("json"), Some(Class::Json));
        assert_eq!(Class::parse("7"), Some(Class::Wait));
        assert_eq!(Class::parse("13"), None);
        assert_eq!(Class::parse("nope"), None);
        for c in Class::ALL {
            assert_eq!(Class::parse(c.name()), Some(c));
            assert_eq!(Class::parse(&c.number().to_string()), Some(c));
        }
        let all = parse_classes(&[], false).unwrap();
        assert!(!all.contains(&Class::Stall) && all.len() == 11);
        let some = parse_classes(&["json,wait".into(), "1".into()], true).unwrap();
        assert_eq!(
            some,
            vec![Class::Weights, Class::Stall, Class::Json, Class::Wait]
        );
        assert!(parse_classes(&["bogus".into()], false).is_err());
    }
}
