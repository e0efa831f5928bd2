//! What the tests that start `tenet` service processes share: starting one and reading the
//! line it prints when it listens, and killing it when the test ends.
// Each test binary uses some of these helpers, not all.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, Read};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Stdio};

/// A `tenet` process, killed when dropped.
pub struct Proc(pub Child);

impl Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tenet` run from the repository root.
pub fn tenet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tenet"));
    c.current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    c
}

/// Run `command`, which must succeed (else panic with `what` and its standard error), and
/// parse what it printed as JSON.
pub fn json_of(mut command: Command, what: &str) -> serde_json::Value {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{what}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Start `tenet ARGS` (a node or coordinator) and return it with the first line it prints
/// (`… listening on http://…`); panics with its standard error if it does not start.
pub fn spawn_tenet<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> (Proc, String) {
    let mut c = tenet();
    c.args(args);
    spawn_service(c)
}

/// Start `command` (a `tenet` node or coordinator, however it is wrapped) and return it with
/// the first line it prints; panics with its standard error if it does not start.
pub fn spawn_service(mut command: Command) -> (Proc, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tenet");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut first)
        .expect("read the first line");
    if !first.contains("listening on http://") {
        let mut err = String::new();
        let _ = child
            .stderr
            .take()
            .expect("piped stderr")
            .read_to_string(&mut err);
        panic!("tenet did not start: {first}{err}");
    }
    (Proc(child), first.trim().to_string())
}

/// The URL at the end of a `listening on http://…` line.
/// Start a test node — loopback, an OS-chosen port, one thread, no fsync — keeping its data
/// in `data_dir` and trusting the key `trust` (hex), with `extra` flags; it and its URL.
pub fn spawn_node(data_dir: &str, trust: &str, extra: &[&str]) -> (Proc, String) {
    spawn_test_node(data_dir, &["--trust", trust], extra)
}

/// [`spawn_node`], open to any key (`--open`: what a client driving nodes itself uses).
pub fn spawn_open_node(data_dir: &str, extra: &[&str]) -> (Proc, String) {
    spawn_test_node(data_dir, &["--open"], extra)
}

fn spawn_test_node(data_dir: &str, access: &[&str], extra: &[&str]) -> (Proc, String) {
    let mut args = vec![
        "node",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--no-fsync",
    ];
    args.extend(["--data-dir", data_dir]);
    args.extend(access);
    args.extend(extra);
    let (p, line) = spawn_tenet(&args);
    (p, url_of(&line))
}

pub fn url_of(line: &str) -> String {
    line.rsplit(' ').next().unwrap_or_default().to_string()
}

/// A coordinator and its nodes on loopback, killed when dropped.
pub struct Network {
    pub coordinator: Proc,
    pub url: String,
    /// The coordinator's key (hex).
    pub key: String,
    pub nodes: Vec<(Proc, String)>,
}

/// An `--open` coordinator asking `replicas` nodes a job (and `extra` flags), and one node per
/// entry of `cheats` (a `--cheat` mode, or `None` for an honest one) that joins it with stake
/// 1000, all keeping their data under `dir`.
pub fn spawn_network(
    dir: &std::path::Path,
    replicas: u32,
    extra: &[&str],
    cheats: &[Option<&str>],
) -> Network {
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let replicas = replicas.to_string();
    let mut args = vec![
        "coordinator",
        "--open",
        "--listen",
        "127.0.0.1:0",
        "--replicas",
        &replicas,
    ];
    let data = d("coord");
    args.extend(["--data-dir", &data]);
    args.extend(extra);
    let (coordinator, line) = spawn_tenet(&args);
    let url = url_of(&line);
    let key = line.split_whitespace().nth(2).unwrap().to_string();
    let nodes = cheats
        .iter()
        .enumerate()
        .map(|(i, cheat)| {
            let mut flags = vec!["--coordinator", url.as_str(), "--stake", "1000"];
            if let Some(c) = cheat {
                flags.extend(["--cheat", c]);
            }
            spawn_node(&d(&format!("node{i}")), &key, &flags)
        })
        .collect();
    Network {
        coordinator,
        url,
        key,
        nodes,
    }
}

/// Run `command` until it succeeds — nodes join a coordinator by themselves, a moment after
/// they start — at most 40 times, 250 ms apart; its output.
pub fn once_joined(mut command: impl FnMut() -> std::process::Output) -> std::process::Output {
    let mut last = None;
    for _ in 0..40 {
        let o = command();
        if o.status.success() {
            return o;
        }
        last = Some(o);
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let o = last.expect("tried at least once");
    panic!(
        "still failing once the nodes should have joined: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
