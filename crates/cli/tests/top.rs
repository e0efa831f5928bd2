//! `tenet top` against a live network: a coordinator and three nodes, one of which lies
//! (`--cheat flip`), with jobs called before and while it watches. The screen is read from a
//! real terminal — tmux, at 160×45 — until it shows the nodes, the liar marked SLASHED and the
//! jobs decided; keys sort and filter it; `q` ends it with status 0 and the terminal back off
//! the alternate screen. `--once` prints the same facts as text, and a coordinator that wants
//! an API key gets a message saying how to pass one.
//!
//! Without tmux the terminal parts print `SKIPPED: tmux not installed` (and fail with
//! TENET_REQUIRE_TMUX=1).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::tenet;

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenet-top-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `GET path` over plain HTTP/1.0 (the answer ends with the connection): status and body.
fn http_get(url: &str, path: &str) -> (u16, String) {
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nhost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// Whether tmux is here; says SKIPPED when not (and fails when TENET_REQUIRE_TMUX=1).
fn tmux_available() -> bool {
    let found = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("TENET_REQUIRE_TMUX").as_deref() != Ok("1"),
            "TENET_REQUIRE_TMUX=1 but tmux is not installed"
        );
        println!("SKIPPED: tmux not installed");
    }
    found
}

/// A tmux server of the test's own (its own socket, no user configuration) running one
/// session; killed when dropped, however the test ends.
struct Tmux {
    socket: String,
    session: String,
}

impl Tmux {
    fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        let t = Tmux {
            socket: format!("tenet-top-test-{name}-{}", std::process::id()),
            session: name.to_string(),
        };
        // The command's exit status is printed by the shell that ran it, which then waits:
        // tmux's own record of a dead pane's status can miss it (its pane may close first).
        let wrapped = format!("{command}; echo tenet-exit=$?; sleep 120");
        let o = t
            .tmux()
            .args(["-f", "/dev/null", "new-session", "-d", "-s", name])
            .args([
                "-x",
                &width.to_string(),
                "-y",
                &height.to_string(),
                &wrapped,
            ])
            .args([";", "set-option", "-t", name, "remain-on-exit", "on"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        t
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        // UTF-8 whatever the locale says (the screen draws boxes and arrows).
        c.args(["-u", "-L", &self.socket]);
        c
    }

    fn screen(&self) -> String {
        let o = self
            .tmux()
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Everything the normal screen received, its history included (tmux's note that the
    /// pane is dead can scroll the first line off the screen), as one line: what a program
    /// printed there, however the terminal wrapped it.
    fn printed(&self) -> String {
        let o = self
            .tmux()
            .args(["capture-pane", "-p", "-S", "-", "-t", &self.session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).lines().collect()
    }

    /// Send keys: tmux key names (`Enter`, `C-c`), or literal text with `literal`.
    fn keys(&self, keys: &[&str], literal: bool) {
        let mut c = self.tmux();
        c.args(["send-keys", "-t", &self.session]);
        if literal {
            c.arg("-l");
        }
        assert!(c.args(keys).status().unwrap().success());
    }

    /// `#{pane_dead} #{pane_dead_status} #{alternate_on}`.
    fn pane(&self) -> String {
        let o = self
            .tmux()
            .args(["list-panes", "-t", &self.session])
            .args(["-F", "#{pane_dead} #{pane_dead_status} #{alternate_on}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Wait (20 s at most) until the screen satisfies `done`; the screen. Panics with the
    /// last screen seen, saying what was awaited, when it does not.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.screen();
            if done(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {what}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait (10 s at most) until the command has exited: `1 STATUS ALT` — its exit status as
    /// the shell that ran it printed it, and whether the terminal is still on the alternate
    /// screen.
    fn wait_exit(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let printed = self.printed();
            if let Some(at) = printed.find("tenet-exit=") {
                let code: String = printed[at + 11..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let alt = self.pane();
                let alt = alt.split(' ').next_back().unwrap_or("?").to_string();
                return format!("1 {code} {alt}");
            }
            assert!(
                Instant::now() < deadline,
                "still running:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").output();
    }
}

/// The number after the word `name` on the screen or in the text (`decided 12`, `decided  12+`).
fn figure(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let words: Vec<&str> = l
            .split(|c: char| c.is_whitespace() || c == ',' || c == '│')
            .filter(|w| !w.is_empty())
            .collect();
        words
            .windows(2)
            .find(|w| w[0] == name && w[1].trim_end_matches('+').parse::<u64>().is_ok())
            .map(|w| w[1].trim_end_matches('+').parse().unwrap())
    })
}

/// The line of `text` showing the node `id` (its first 12 hex digits).
fn row<'a>(text: &'a str, id: &str) -> Option<&'a str> {
    text.lines().find(|l| l.contains(&id[..12]))
}

#[test]
fn top_watches_a_network_with_a_liar() {
    let dir = temp_dir("net");
    let d = |p: &str| dir.join(p).to_str().unwrap().to_string();
    let net = common::spawn_network(&dir, 3, &[], &[None, None, Some("flip")]);
    let remote = ["--coordinator", net.url.as_str()];
    let task: serde_json::Value = serde_json::from_str(&ok(tenet()
        .args([
            "deploy",
            "examples/mlp.tg",
            "--weights",
            "examples/mlp.safetensors",
        ])
        .args(["--json"])
        .args(remote)
        .output()
        .unwrap()))
    .unwrap();
    let task = task["id"].as_str().unwrap().to_string();
    let x: Vec<Vec<f32>> = (0..8)
        .map(|i| {
            (0..64)
                .map(|j| ((i * 7 + j) % 13) as f32 / 13.0 - 0.4)
                .collect()
        })
        .collect();
    std::fs::write(d("x.json"), serde_json::to_string(&x).unwrap()).unwrap();
    let call = || {
        tenet()
            .args(["call", &task, "-i", &format!("x={}", d("x.json"))])
            .args(["-o", &d("y.json")])
            .args(remote)
            .output()
            .unwrap()
    };
    ok(common::once_joined(call));
    // The nodes' ids, and which one lies.
    let (status, body) = http_get(&net.url, "/v1/nodes");
    assert_eq!(status, 200, "{body}");
    let nodes: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<(String, String)> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                n["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(ids.len(), 3);
    let liar = ids
        .iter()
        .find(|(_, u)| *u == net.nodes[2].1)
        .unwrap()
        .0
        .clone();
    let honest: Vec<String> = ids
        .iter()
        .filter(|(id, _)| *id != liar)
        .map(|(id, _)| id.clone())
        .collect();

    // A screen that is not a terminal is refused, pointing at --once.
    let piped = tenet()
        .args(["top", &net.url])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!piped.status.success());
    assert!(
        String::from_utf8_lossy(&piped.stderr).contains("--once"),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );

    if tmux_available() {
        let bin = env!("CARGO_BIN_EXE_tenet");
        let t = Tmux::start("top", 160, 45, &format!("{bin} top {}", net.url));
        // Jobs decided while it watches arrive on the event stream.
        for _ in 0..3 {
            ok(call());
        }
        let screen = t.wait_for("the nodes, the liar SLASHED and 4 jobs decided", |s| {
            s.contains("tenet top")
                && s.contains(&net.key[..12])
                && s.contains("● live")
                && ids.iter().all(|(id, _)| row(s, id).is_some())
                && row(s, &liar).is_some_and(|r| r.contains("SLASHED"))
                && figure(s, "decided").is_some_and(|n| n >= 4)
        });
        println!("{screen}");
        for id in &honest {
            assert!(!row(&screen, id).unwrap().contains("SLASHED"), "{screen}");
        }
        assert!(screen.contains("latest slashes") && screen.contains("recent jobs"));
        assert!(
            figure(&screen, "slashed").is_some_and(|n| n >= 4),
            "{screen}"
        );

        // `s`: by score, the liar (score 0) last; `r`: first.
        let line_of = |s: &str, id: &str| s.lines().position(|l| l.contains(&id[..12])).unwrap();
        t.keys(&["s"], false);
        let s = t.wait_for("the nodes sorted by score", |s| s.contains("sort score ↓"));
        assert!(
            honest.iter().all(|h| line_of(&s, h) < line_of(&s, &liar)),
            "{s}"
        );
        t.keys(&["r"], false);
        let s = t.wait_for("the order reversed", |s| s.contains("sort score ↑"));
        assert!(
            honest.iter().all(|h| line_of(&s, h) > line_of(&s, &liar)),
            "{s}"
        );

        // `/` and the liar's id: the others leave the table.
        t.keys(&["/"], false);
        t.keys(&[&liar[..8]], true);
        t.keys(&["Enter"], false);
        let s = t.wait_for("only the liar", |s| s.contains("nodes 1/3"));
        assert!(row(&s, &liar).is_some_and(|r| r.contains("SLASHED")), "{s}");
        for h in &honest {
            assert!(!s.contains(&h[..12]), "{h} still shown:\n{s}");
        }

        // `q`: it exits 0, off the alternate screen, leaving nothing of the screen behind.
        t.keys(&["q"], false);
        assert_eq!(t.wait_exit(), "1 0 0");
        let after = t.screen();
        assert!(!after.contains("latest slashes"), "{after}");
    }

    // Its terminal going away (the tmux server killed: a hang-up, then a tty that reads
    // end-of-file) ends it too: nothing is left spinning.
    {
        let bin = env!("CARGO_BIN_EXE_tenet");
        let t = Tmux::start("hangup", 120, 35, &format!("{bin} top {}", net.url));
        t.wait_for("the first screen", |s| s.contains("tenet top"));
        let o = t
            .tmux()
            .args(["display-message", "-p", "-t", "hangup", "#{pane_pid}"])
            .output()
            .unwrap();
        let mut pid = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(!pid.is_empty());
        // The pane's process may be a shell running tenet: take tenet itself.
        if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() != "tenet") {
            let children =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
            pid = children.split_whitespace().next().unwrap().to_string();
        }
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .unwrap()
                .trim(),
            "tenet"
        );
        let _ = t.tmux().arg("kill-server").status();
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while proc.exists() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            !proc.exists(),
            "tenet top (pid {pid}) outlived its terminal"
        );
    }

    // --once: the same facts as text.
    let once = ok(tenet().args(["top", &net.url, "--once"]).output().unwrap());
    for (id, _) in &ids {
        assert!(row(&once, id).is_some(), "{once}");
    }
    assert!(row(&once, &liar).unwrap().contains("SLASHED"), "{once}");
    assert!(figure(&once, "decided").is_some_and(|n| n >= 4), "{once}");
    assert!(once.contains(&net.key), "{once}");
    assert!(once.contains("events live"), "{once}");
    // A node's URL: that node's own view, from its public info and metrics.
    let node_url = std::fs::read_to_string(dir.join("node0").join("addr"))
        .map(|a| format!("http://{}", a.trim()))
        .unwrap();
    let node = ok(tenet().args(["top", &node_url, "--once"]).output().unwrap());
    assert!(
        ids.iter()
            .any(|(id, _)| node.contains(&format!("node {}", &id[..12]))),
        "{node}"
    );
    assert!(figure(&node, "committed").is_some_and(|n| n >= 1), "{node}");
    assert!(node.contains("job_run"), "{node}");
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_coordinator_that_wants_a_key_says_how_to_pass_one() {
    let dir = temp_dir("key");
    let data = dir.join("coord");
    let (coordinator, line) = common::spawn_tenet([
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--api-key",
        "sekrit",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let url = common::url_of(&line);
    let top = |key: Option<&str>| {
        let mut c = tenet();
        c.args(["top", &url, "--once"]).env_remove("TENET_API_KEY");
        if let Some(k) = key {
            c.args(["--api-key", k]);
        }
        c.output().unwrap()
    };
    let none = top(None);
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(!none.status.success());
    assert!(
        err.contains("asks for an API key")
            && err.contains("--api-key KEY")
            && err.contains("TENET_API_KEY"),
        "{err}"
    );
    let wrong = top(Some("guess"));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success());
    assert!(
        err.contains("refused the API key given") && err.contains("--api-key"),
        "{err}"
    );
    let right = ok(top(Some("sekrit")));
    assert!(right.contains("nodes (0)"), "{right}");
    assert!(right.contains("events live"), "{right}");

    // On a terminal, the same message, and the terminal never leaves its normal screen.
    if tmux_available() {
        let bin = env!("CARGO_BIN_EXE_tenet");
        let t = Tmux::start(
            "key",
            120,
            35,
            &format!("env -u TENET_API_KEY {bin} top {url}"),
        );
        assert_eq!(t.wait_exit(), "1 1 0");
        let s = t.printed();
        assert!(
            s.contains("tenet: error:") && s.contains("--api-key KEY"),
            "{s}"
        );
    }
    drop(coordinator);
    let _ = std::fs::remove_dir_all(&dir);
}
