//! `tenet node` as a real process on 127.0.0.1 against clients and peers that misbehave
//! (issue 29): floods of idle connections, slow request heads and bodies, uploads that declare
//! more than they send, uploads to sessions that do not exist, tensors beyond the graph limits,
//! and pulls from peers that never answer or answer without end. Every load here is bounded
//! in count and time, and every assertion is about an outcome (answered, refused, closed,
//! files gone, blobs still there), never about how fast.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tenet_ir::HostTensor;
use tenet_net::{Method, NodeClient, identity};
use tenet_proto::auth::KeyPair;
use tenet_proto::wire::{Batch, SessionOp};
use tenet_proto::{ErrorCode, Hash, tensor};

mod common;

use common::{Proc, url_of};

/// A generous bound on anything that should happen "soon": outcomes are asserted, and this
/// only keeps a regression from hanging the suite.
const SOON: Duration = Duration::from_secs(20);

struct NodeProc {
    _child: Proc,
    addr: String,
    dir: PathBuf,
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tenet-hostile-{}-{name}-{}",
        std::process::id(),
        tenet_proto::to_hex(&identity::random_bytes::<4>())
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Start `tenet node` trusting `key`, with `toml` as its config file and `extra` flags; with
/// `max_files`, under that limit on open file descriptors (as a small host would have).
fn start(
    name: &str,
    key: &KeyPair,
    toml: &str,
    extra: &[&str],
    max_files: Option<u32>,
) -> NodeProc {
    let dir = temp_dir(name);
    let config = dir.join("node.toml");
    std::fs::write(&config, toml).unwrap();
    let mut args: Vec<String> = [
        "node",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--data-dir",
        dir.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--trust",
        &key.public().to_hex(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let exe = env!("CARGO_BIN_EXE_tenet");
    let mut cmd = match max_files {
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(exe);
            c
        }
        None => Command::new(exe),
    };
    let mut child = cmd
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tenet");
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    if !first.contains("listening on http://") {
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("tenet node did not start: {first}{err}");
    }
    NodeProc {
        addr: url_of(first.trim())
            .trim_start_matches("http://")
            .to_string(),
        _child: Proc(child),
        dir,
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self._child.0.kill();
        let _ = self._child.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl NodeProc {
    fn client(&self, key: &KeyPair) -> NodeClient {
        NodeClient::new(&self.addr, key.clone()).unwrap()
    }

    fn tmp_files(&self) -> usize {
        std::fs::read_dir(self.dir.join("store").join("tmp"))
            .unwrap()
            .count()
    }
}

/// A request head with the given signature headers and declared length.
fn head(method: &str, path: &str, headers: &[(String, String)], length: u64) -> String {
    let mut h = format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {length}\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

/// Wait until `cond` holds, at most [`SOON`].
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < SOON, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Read from `s` until the server closes it (or it errors); false if it stays open past
/// [`SOON`]. Returns what was read.
fn read_until_closed(s: &mut TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(SOON)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return None;
            }
            // Reset by the server: closed too.
            Err(_) => return Some(got),
        }
    }
}

/// Read one whole answer (head and a body of its content-length), or up to the server's
/// close; `None` if neither comes within [`SOON`].
fn read_answer(s: &mut TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(SOON)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return Some(got);
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return None;
            }
            Err(_) => return Some(got),
        }
    }
}

/// The status of an HTTP answer's first line.
fn status_of(answer: &[u8]) -> u16 {
    String::from_utf8_lossy(answer)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn config(lines: &[&str]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Item 9: idle connections beyond the cap, with few file descriptors, do not lock honest
/// clients out: at the cap the idlest connection is closed, and idle ones time out anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_lock_out_a_signed_client() {
    let key = identity::generate();
    let cap = 16;
    // 96 descriptors: without a cap, the idle flood below uses every one of them.
    let node = start(
        "flood",
        &key,
        &config(&["header_timeout_ms = 2000"]),
        &["--max-connections", &cap.to_string()],
        Some(96),
    );
    let idle: Vec<TcpStream> = (0..cap + 150)
        .map(|_| TcpStream::connect(&node.addr).unwrap())
        .collect();
    // A signed request and the info route still answer while the idle ones stay open.
    let c = node.client(&key);
    let sid = tokio::time::timeout(SOON, c.create_session())
        .await
        .expect("a signed request is answered despite the flood")
        .unwrap();
    assert_eq!(sid.len(), 32);
    let info = tokio::time::timeout(SOON, node.client(&key).info())
        .await
        .expect("info answers")
        .unwrap();
    assert!(!info.open);
    // The idle connections are closed by the node (evicted at the cap or timed out).
    let idle = tokio::task::spawn_blocking(move || {
        idle.into_iter()
            .map(|mut s| read_until_closed(&mut s).is_some())
            .filter(|closed| *closed)
            .count()
    })
    .await
    .unwrap();
    assert_eq!(
        idle,
        cap + 150,
        "every idle connection was closed by the node"
    );
    // And the node still serves — a new connection: `c`'s kept-alive one sat idle while the
    // flood was read out, so the node may have closed it with the rest, and a request racing
    // that close fails in transport before the node ever sees it.
    node.client(&key).delete_session(&sid).await.unwrap();
}

/// Item 9: a request head sent a byte at a time is cut off at the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_request_head_is_closed_at_the_header_timeout() {
    let key = identity::generate();
    // The timeout as a flag (the config file's `header_timeout_ms` works the same).
    let node = start(
        "slowhead",
        &key,
        &config(&[]),
        &["--header-timeout", "0.5"],
        None,
    );
    let mut s = TcpStream::connect(&node.addr).unwrap();
    let mut writer = s.try_clone().unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let stop = done.clone();
    // One byte of the head every 100 ms, never ending it, until the node closes or the
    // test gives up.
    let slow = std::thread::spawn(move || {
        for b in b"GET /v1/info HTTP/1.1\r\nx-slow: "
            .iter()
            .chain(b"a".iter().cycle())
        {
            if stop.load(Ordering::Relaxed) > 0 || writer.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let closed = tokio::task::spawn_blocking(move || read_until_closed(&mut s))
        .await
        .unwrap();
    done.store(1, Ordering::Relaxed);
    slow.join().unwrap();
    assert!(
        closed.is_some(),
        "the node never closed a slow request head"
    );
    // Honest requests are unaffected.
    node.client(&key).info().await.unwrap();
}

/// Item 9: an upload trickling a byte at a time is dropped, and with it its temporary file
/// and its room in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_upload_is_dropped_and_its_temp_file_is_gone() {
    let key = identity::generate();
    // The pace as flags (the config file's `body_timeout_ms` and `min_body_bytes_per_sec`
    // work the same).
    let node = start(
        "slowbody",
        &key,
        &config(&[]),
        &["--body-timeout", "1", "--min-body-rate", "1024"],
        None,
    );
    let c = node.client(&key);
    let data = vec![7u8; 1 << 20];
    let hash = Hash::of(&data);
    let path = format!("/v1/blobs/{hash}");
    let headers = c.auth_headers(&Method::PUT, &path, &data);
    let mut s = TcpStream::connect(&node.addr).unwrap();
    s.write_all(head("PUT", &path, &headers, data.len() as u64).as_bytes())
        .unwrap();
    s.write_all(&data[..16]).unwrap();
    eventually("the upload started", || node.tmp_files() == 1);
    // One byte a second from now on, until the node gives up on it.
    let mut writer = s.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        for b in &data[16..64] {
            std::thread::sleep(Duration::from_millis(200));
            if writer.write_all(&[*b]).is_err() {
                return;
            }
        }
    });
    let answer = tokio::task::spawn_blocking(move || read_until_closed(&mut s))
        .await
        .unwrap()
        .expect("the node closed the slow upload");
    if !answer.is_empty() {
        assert_eq!(
            status_of(&answer),
            400,
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(String::from_utf8_lossy(&answer).contains("too slowly"));
    }
    trickle.join().unwrap();
    eventually("the temporary file is gone", || node.tmp_files() == 0);
    assert_eq!(c.has_blob(&hash).await.unwrap(), None);
    // A real upload of the same blob goes through.
    assert!(!c.put_blob(vec![7u8; 1 << 20]).await.unwrap().existed);
}

/// Item 10: uploads that declare 2 GiB-style lengths and send nothing neither evict stored
/// blobs nor make real uploads fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_only_uploads_evict_nothing_and_real_uploads_still_succeed() {
    let key = identity::generate();
    let node = start(
        "declared",
        &key,
        &config(&[]),
        &["--disk-quota", "4M", "--max-blob", "4M"],
        None,
    );
    let c = node.client(&key);
    let stored: Vec<Hash> = (1..=3u8)
        .map(|b| vec![b; 1_000_000])
        .map(|d| Hash::of(&d))
        .collect();
    for b in 1..=3u8 {
        c.put_blob(vec![b; 1_000_000]).await.unwrap();
    }
    // Four uploads, each declaring the whole quota, sending only their heads.
    let mut open = Vec::new();
    for i in 0..4u8 {
        let promised = vec![100 + i; 4 << 20];
        let hash = Hash::of(&promised);
        let path = format!("/v1/blobs/{hash}");
        let headers = c.auth_headers(&Method::PUT, &path, &promised);
        let mut s = TcpStream::connect(&node.addr).unwrap();
        s.write_all(head("PUT", &path, &headers, 4 << 20).as_bytes())
            .unwrap();
        open.push(s);
    }
    eventually("the uploads started", || node.tmp_files() == 4);
    for h in &stored {
        assert!(
            c.has_blob(h).await.unwrap().is_some(),
            "blob {h} was evicted for bytes that never came"
        );
    }
    let fresh = c.put_blob(vec![9u8; 1_000_000]).await.unwrap();
    assert!(!fresh.existed);
    assert!(c.has_blob(&fresh.hash).await.unwrap().is_some());
    for h in &stored {
        assert!(
            c.has_blob(h).await.unwrap().is_some(),
            "quota had room for all four"
        );
    }
    drop(open);
    eventually("the abandoned uploads are cleaned up", || {
        node.tmp_files() == 0
    });
}

/// Item 11: a tensor upload to a session that does not exist, or larger than the sessions'
/// memory can take, is refused before its body is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_uploads_are_refused_before_their_bodies_are_read() {
    let key = identity::generate();
    let node = start(
        "sessionput",
        &key,
        &config(&["session_memory_bytes = 8388608"]),
        &[],
        None,
    );
    let c = node.client(&key);
    let sid = c.create_session().await.unwrap();
    let refused = |path: String, declared: u64| {
        let headers = c.auth_headers(&Method::PUT, &path, b"never sent");
        let addr = node.addr.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(head("PUT", &path, &headers, declared).as_bytes())
                .unwrap();
            // Not one byte of the body: the answer must come anyway.
            let answer = read_answer(&mut s).expect("the node answered without the body");
            (
                status_of(&answer),
                String::from_utf8_lossy(&answer).into_owned(),
            )
        })
    };
    // Six uploads of 256 MiB to a session that does not exist, at once.
    let nowhere: Vec<_> = (0..6)
        .map(|i| refused(format!("/v1/sessions/nope/tensors/t{i}"), 256 << 20))
        .collect();
    for t in nowhere {
        let (status, answer) = t.join().unwrap();
        assert_eq!(status, 404, "{answer}");
        assert!(answer.contains("no session nope"), "{answer}");
    }
    // An existing session, but more than its memory can take.
    let (status, answer) = refused(format!("/v1/sessions/{sid}/tensors/big"), 256 << 20)
        .join()
        .unwrap();
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains("exceeds_limits"), "{answer}");
    // What fits is still accepted.
    let t = HostTensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    c.put_tensor(&sid, "small", tensor::encode(&t))
        .await
        .unwrap();
}

/// Item 12 (tensor part): tensors no graph could take are refused on upload, naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_beyond_the_graph_limits_are_refused_on_upload() {
    let key = identity::generate();
    let node = start("limits", &key, &config(&[]), &[], None);
    let c = node.client(&key);
    let sid = c.create_session().await.unwrap();
    let mut rank200 = format!("f32[{}]", ["1"; 200].join(",")).into_bytes();
    rank200.push(0);
    rank200.extend_from_slice(&[0; 4]);
    let mut huge_zero = b"f32[0,18446744073709551615]".to_vec();
    huge_zero.push(0);
    for (blob, says) in [(rank200, "rank 200"), (huge_zero, "18446744073709551615")] {
        let e = c.put_tensor(&sid, "t", blob.clone()).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadInputs), "{e}");
        assert!(
            e.to_string().contains(says) && e.to_string().contains("limit"),
            "{e}"
        );
        // Also as a job input and in a batch.
        let put = SessionOp::Put {
            name: "t".into(),
            blob: tenet_proto::to_hex(&blob),
        };
        let r = c.batch(&sid, &Batch { ops: vec![put] }).await.unwrap();
        assert_eq!(r.error.unwrap().error.code, ErrorCode::BadInputs);
    }
}

/// A peer that misbehaves on every connection, on a thread per connection.
#[derive(Clone, Copy)]
enum Peer {
    /// Reads the request and never answers.
    Silent,
    /// Answers 200 and streams a chunked body without end (without end for any node that
    /// reads less than [`ENDLESS_CAP`]: there it stops, so that a node without limits fails
    /// this test instead of taking the machine's memory).
    Endless,
}

/// Where an endless peer gives up.
const ENDLESS_CAP: u64 = 256 << 20;

struct PeerServer {
    url: String,
    /// Bytes of body written, connections accepted, and connections the node hung up on.
    sent: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    hung_up: Arc<AtomicU64>,
}

fn peer_server(kind: Peer) -> PeerServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (sent, accepted, hung_up) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s, a, h) = (sent.clone(), accepted.clone(), hung_up.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            a.fetch_add(1, Ordering::Relaxed);
            let (s, h) = (s.clone(), h.clone());
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                match kind {
                    Peer::Silent => {
                        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                    Peer::Endless => {
                        let chunk = vec![b'x'; 64 << 10];
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
                        while s.load(Ordering::Relaxed) < ENDLESS_CAP {
                            let piece =
                                [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"]
                                    .concat();
                            if stream.write_all(&piece).is_err() {
                                h.fetch_add(1, Ordering::Relaxed);
                                let _ = stream.shutdown(Shutdown::Both);
                                return;
                            }
                            s.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        }
                        let _ = stream.write_all(b"0\r\n\r\n");
                    }
                }
            });
        }
    });
    PeerServer {
        url,
        sent,
        accepted,
        hung_up,
    }
}

/// Item 8: pulls go only to listed peers, end at their deadline, and read no more than the
/// sessions' memory can still take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_from_hostile_peers_fail_quickly_and_read_within_the_session_budget() {
    let key = identity::generate();
    let (silent, endless, unlisted) = (
        peer_server(Peer::Silent),
        peer_server(Peer::Endless),
        peer_server(Peer::Endless),
    );
    let node = start(
        "pull",
        &key,
        &config(&["session_memory_bytes = 8388608", "pull_timeout_ms = 1500"]),
        &["--pull-from", &silent.url, "--pull-from", &endless.url],
        None,
    );
    let c = node.client(&key);
    let sid = c.create_session().await.unwrap();
    let pull = |peer: &str| Batch {
        ops: vec![SessionOp::Pull {
            name: "t".into(),
            hash: Hash::of(b"anything"),
            peer: peer.to_string(),
        }],
    };
    // A peer nobody listed is refused without being contacted.
    let r = tokio::time::timeout(SOON, c.batch(&sid, &pull(&unlisted.url)))
        .await
        .expect("refused at once")
        .unwrap();
    let e = r.error.expect("refused").error;
    assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    assert!(e.message.contains("--pull-from"), "{e}");
    assert_eq!(unlisted.accepted.load(Ordering::Relaxed), 0);
    // A listed peer that never answers: the pull fails at its deadline.
    let r = tokio::time::timeout(SOON, c.batch(&sid, &pull(&silent.url)))
        .await
        .expect("the pull gives up by itself")
        .unwrap();
    let e = r.error.expect("failed").error;
    assert_eq!(e.code, ErrorCode::PeerFailed, "{e}");
    assert!(e.message.contains("did not answer within"), "{e}");
    // A listed peer that streams without end: the node stops reading at the 8 MiB the
    // sessions can still hold, and hangs up.
    let r = tokio::time::timeout(SOON, c.batch(&sid, &pull(&endless.url)))
        .await
        .expect("the pull gives up by itself")
        .unwrap();
    let e = r.error.expect("failed").error;
    assert_eq!(e.code, ErrorCode::ExceedsLimits, "{e}");
    assert!(e.message.contains("8388608"), "{e}");
    eventually("the peer saw the node hang up", || {
        endless.hung_up.load(Ordering::Relaxed) > 0
    });
    eventually("the silent peer saw the node hang up", || {
        silent.hung_up.load(Ordering::Relaxed) > 0
    });
    let sent = endless.sent.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the node let the peer send {sent} bytes");
    // The node's memory did not grow with the stream, and the budget is whole again.
    let t = HostTensor::from_f32(&[1 << 20], &vec![0.5; 1 << 20]).unwrap();
    c.put_tensor(&sid, "four_mib", tensor::encode(&t))
        .await
        .unwrap();
}
