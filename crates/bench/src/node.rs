//! The node benchmark: a real `tenet node` process on 127.0.0.1, driven by the signed client
//! from this process, measuring what the node issue sets goals for — a tiny job's round trip,
//! small ops batched in one request, a 4 MiB upload, and what a 1024² matmul job costs over
//! running it locally. Medians; compare with the goals and with GT's figures measured on this
//! machine kind (../shared/perf/README.md), not with other machines.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};
use tenet_exec::Device;
use tenet_ir::{DType, GraphBuilder, HostTensor};
use tenet_net::{Bytes, NodeClient, identity};
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::{Batch, RunJob, SessionOp};
use tenet_proto::{Hash, tensor};

/// One measured figure.
pub struct NodeRow {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
    /// p99 where the figure is a latency with many samples.
    pub p99: Option<f64>,
    /// The goal, and whether the figure meets it.
    pub goal: Option<(&'static str, bool)>,
    /// What a peer measured on this machine kind, for scale.
    pub peer: &'static str,
}

/// Everything one node benchmark measured.
pub struct NodeReport {
    pub backend: String,
    pub rows: Vec<NodeRow>,
}

pub(crate) struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// A tensor of pseudo-random values in [-0.5, 0.5), the same for the same seed.
pub(crate) fn filled(shape: &[u64], seed: u32) -> HostTensor {
    let n: u64 = shape.iter().product();
    let v: Vec<f32> = (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761) ^ seed) >> 8) as f32 / 16777216.0 - 0.5)
        .collect();
    HostTensor::from_f32(shape, &v).expect("shape matches")
}

fn spec(id: String, task: Hash, inputs: &[(&str, &HostTensor)]) -> JobSpec {
    JobSpec {
        job_id: id,
        task,
        weights: None,
        inputs: inputs
            .iter()
            .map(|(n, t)| (n.to_string(), tensor::hash(t)))
            .collect(),
        tier: Tier::Exact,
        seed: 0,
    }
}

/// Start `exe node` on a free loopback port, trusting `key`; the process dies with the guard.
pub(crate) fn spawn_node(
    exe: &Path,
    dir: &Path,
    key: &tenet_proto::auth::KeyPair,
    threads: usize,
    extra: &[&str],
) -> Result<(Spawned, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut child = Command::new(exe)
        .args(["node", "--listen", "127.0.0.1:0", "--trust"])
        .arg(key.public().to_hex())
        .arg("--data-dir")
        .arg(dir)
        .args(["--threads", &threads.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {} node: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout from the node")?;
    let guard = Spawned(child);
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .map_err(|e| e.to_string())?;
    let addr = first
        .split("http://")
        .nth(1)
        .map(str::trim)
        .ok_or_else(|| format!("the node did not start: {first}"))?
        .to_string();
    Ok((guard, addr))
}

/// How to run the node benchmark.
pub struct NodeBenchOptions {
    /// Threads per job on the node (and for the local matmul).
    pub threads: usize,
    /// Fewer repetitions.
    pub quick: bool,
    /// The busy-poll window of the node (`--busy-poll-us`) and of the client, µs.
    pub busy_poll_us: u64,
}

/// Start `exe node` on a free loopback port, run the workloads, stop it (and a second node
/// with `--no-fsync`, for uploads). `progress` hears what is being measured.
pub fn run(
    exe: &Path,
    options: &NodeBenchOptions,
    mut progress: impl FnMut(&str),
) -> Result<NodeReport, String> {
    let dir = std::env::temp_dir().join(format!("tenet-bench-node-{}", std::process::id()));
    let key = identity::generate();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let busy = options.busy_poll_us.to_string();
    let client = |addr: &str| {
        NodeClient::new(addr, key.clone())
            .map(|c| c.with_busy_poll(std::time::Duration::from_micros(options.busy_poll_us)))
            .map_err(|e| e.to_string())
    };
    let report = (|| {
        let (threads, quick) = (options.threads, options.quick);
        let spawn = |name: &str, extra: &[&str]| {
            let args = [&["--busy-poll-us", busy.as_str()], extra].concat();
            spawn_node(exe, &dir.join(name), &key, threads, &args)
        };
        let (node, addr) = spawn("durable", &[])?;
        let c = client(&addr)?;
        let mut report = rt.block_on(measure(&c, node.0.id(), threads, quick, &mut progress))?;
        let (fast, addr) = spawn("no-fsync", &["--no-fsync"])?;
        progress("4 MiB uploads to a node started with --no-fsync");
        let c = client(&addr)?;
        let up = rt.block_on(uploads(&c, fast.0.id(), quick))?;
        report.rows.push(NodeRow {
            name: "4 MiB upload (hashed, --no-fsync)",
            value: up.gbps,
            unit: "GB/s",
            p99: None,
            goal: Some(("≥ 2 GB/s", up.gbps >= 2.0)),
            peer: "raw loopback TCP ≈ 3.5 GB/s",
        });
        report
            .rows
            .extend(up.node_cpu_row("  node CPU per upload (--no-fsync)"));
        Ok(report)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    report
}

/// Median µs of a 200-byte ping-pong and median ms of a 4 MiB send answered by one byte, over
/// loopback TCP to an echo thread: what no HTTP stack can beat on this machine.
fn tcp_floor(reps: usize) -> Result<(f64, f64), String> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut small = [0u8; 200];
        let mut big = vec![0u8; 4 << 20];
        loop {
            let mut kind = [0u8; 1];
            if s.read(&mut kind)? == 0 {
                return Ok(());
            }
            if kind[0] == b's' {
                s.read_exact(&mut small)?;
                s.write_all(&small)?;
            } else {
                s.read_exact(&mut big)?;
                s.write_all(b"k")?;
            }
        }
    });
    let io = |e: std::io::Error| e.to_string();
    let mut s = std::net::TcpStream::connect(addr).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    let mut small = [b's'; 201];
    let mut rtt = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        s.write_all(&small).map_err(io)?;
        s.read_exact(&mut small[1..]).map_err(io)?;
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut big = vec![b'b'; (4 << 20) + 1];
    let mut ack = [0u8; 1];
    let mut ms = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        s.write_all(&big).map_err(io)?;
        s.read_exact(&mut ack).map_err(io)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        big[0] = b'b';
    }
    drop(s);
    let _ = echo.join();
    Ok((quantile(&rtt, 0.5), quantile(&ms, 0.5)))
}

/// Median µs of a 200-byte ping-pong over loopback TCP with neither side ever sleeping (both
/// spin on non-blocking sockets): the round trip without the cost of waking a thread.
fn tcp_spinning_floor(reps: usize) -> Result<f64, String> {
    use std::io::{ErrorKind, Read, Write};
    fn read_spinning(s: &mut std::net::TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]) {
                Ok(0) => return Ok(false),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
    let io = |e: std::io::Error| e.to_string();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        let mut msg = [0u8; 200];
        while read_spinning(&mut s, &mut msg)? {
            s.write_all(&msg)?;
        }
        Ok(())
    });
    let mut s = std::net::TcpStream::connect(addr).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    s.set_nonblocking(true).map_err(io)?;
    let mut msg = [1u8; 200];
    let mut rtt = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        s.write_all(&msg).map_err(io)?;
        read_spinning(&mut s, &mut msg).map_err(io)?;
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(s);
    let _ = echo.join();
    Ok(quantile(&rtt, 0.5))
}

/// Median µs to sign a request-sized message (RFC 8032's way, then with a nonce made ahead of
/// time), and to verify it.
fn signature_costs() -> (f64, f64, f64) {
    let key = identity::generate();
    let msg = tenet_proto::auth::signing_message("POST", "/v1/jobs", &Hash::of(b"x"), 1, &[0; 16]);
    let (mut sign, mut sign_ready, mut verify) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..200 {
        let t = Instant::now();
        let sig = key.sign(&msg);
        sign.push(t.elapsed().as_secs_f64() * 1e6);
        key.refill_nonce(identity::random_bytes());
        let t = Instant::now();
        let ready = key.sign(&msg);
        sign_ready.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let ok = key.public().verify(&msg, &sig);
        verify.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(ok, "a fresh signature verifies");
        assert!(
            key.public().verify(&msg, &ready),
            "so does one with a ready nonce"
        );
    }
    let median = |v: &[f64]| quantile(v, 0.5);
    (median(&sign), median(&sign_ready), median(&verify))
}

/// What a series of 4 MiB uploads measured.
struct Uploads {
    /// Median GB/s.
    gbps: f64,
    /// The node process's CPU time per upload, ms (where the OS reports it).
    node_cpu_ms: Option<f64>,
}

impl Uploads {
    fn node_cpu_row(&self, name: &'static str) -> Option<NodeRow> {
        self.node_cpu_ms.map(|ms| NodeRow {
            name,
            value: ms,
            unit: "ms",
            p99: None,
            goal: None,
            peer: "blake3 of 4 MiB ≈ 0.7 ms on one core; includes busy polling",
        })
    }
}

/// CPU time all threads of process `pid` have run, ns (Linux's per-thread scheduler
/// statistics; `None` where there are none).
fn process_cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for t in tasks {
        let stat = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// 4 MiB uploads of fresh bytes (no HEAD skip) to the node process `node_pid`.
async fn uploads(c: &NodeClient, node_pid: u32, quick: bool) -> Result<Uploads, String> {
    let mut gbps = Vec::new();
    let mut node_cpu_ns = 0;
    let count = if quick { 5 } else { 20 };
    for i in 0..count {
        let mut data = vec![0u8; 4 << 20];
        for (j, chunk) in data.chunks_mut(8).enumerate() {
            let v = (j as u64 ^ (i as u64) << 40).wrapping_mul(0x9E3779B97F4A7C15);
            chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
        }
        let body = Bytes::from(data);
        let cpu_before = process_cpu_ns(node_pid);
        let t = Instant::now();
        // Hashing the bytes for their address is part of an upload's cost.
        c.upload_blob(body).await.map_err(|e| e.to_string())?;
        gbps.push((4u64 << 20) as f64 / t.elapsed().as_secs_f64() / 1e9);
        if let (Some(a), Some(b)) = (cpu_before, process_cpu_ns(node_pid)) {
            node_cpu_ns += b.saturating_sub(a);
        }
    }
    Ok(Uploads {
        gbps: quantile(&gbps, 0.5),
        node_cpu_ms: (node_cpu_ns > 0).then(|| node_cpu_ns as f64 / 1e6 / count as f64),
    })
}

async fn measure(
    c: &NodeClient,
    node_pid: u32,
    threads: usize,
    quick: bool,
    progress: &mut impl FnMut(&str),
) -> Result<NodeReport, String> {
    let err = |e: tenet_net::ClientError| e.to_string();
    let info = c.info().await.map_err(err)?;
    let mut rows = Vec::new();
    let reps = if quick { 200 } else { 2000 };

    // The floors: bare loopback TCP and the signatures every job pays for.
    progress("floors: bare loopback TCP (sleeping, then spinning), Ed25519");
    let (rtt, four_mib) = tcp_floor(reps)?;
    rows.push(NodeRow {
        name: "floor: bare TCP round trip on loopback, 200 B",
        value: rtt,
        unit: "µs",
        p99: None,
        goal: None,
        peer: "",
    });
    rows.push(NodeRow {
        name: "floor: bare TCP round trip, neither side sleeping",
        value: tcp_spinning_floor(reps)?,
        unit: "µs",
        p99: None,
        goal: None,
        peer: "",
    });
    rows.push(NodeRow {
        name: "floor: bare TCP, 4 MiB one way + 1 B back",
        value: four_mib,
        unit: "ms",
        p99: None,
        goal: None,
        peer: "",
    });
    let (sign_us, sign_ready_us, verify_us) = signature_costs();
    rows.push(NodeRow {
        name: "floor: Ed25519 sign (RFC 8032)",
        value: sign_us,
        unit: "µs",
        p99: None,
        goal: None,
        peer: "",
    });
    rows.push(NodeRow {
        name: "floor: Ed25519 sign, nonce made ahead of time",
        value: sign_ready_us,
        unit: "µs",
        p99: None,
        goal: None,
        peer: "",
    });
    rows.push(NodeRow {
        name: "floor: Ed25519 verify (strict)",
        value: verify_us,
        unit: "µs",
        p99: None,
        goal: None,
        peer: "",
    });

    // Round trips with no work.
    progress("round trips: unsigned info and a signed request");
    let mut info_us = Vec::new();
    let mut signed_us = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        c.info().await.map_err(err)?;
        info_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let _ = c.job_status("none").await;
        signed_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    rows.push(NodeRow {
        name: "round trip, nothing verified (GET /v1/info)",
        value: quantile(&info_us, 0.5),
        unit: "µs",
        p99: Some(quantile(&info_us, 0.99)),
        goal: None,
        peer: "ZeroMQ echo 46–110 µs",
    });
    rows.push(NodeRow {
        name: "signed round trip (GET /v1/jobs/x)",
        value: quantile(&signed_us, 0.5),
        unit: "µs",
        p99: Some(quantile(&signed_us, 0.99)),
        goal: None,
        peer: "",
    });

    // A tiny job: z = x + y over 16 floats, inputs inline, commitment back.
    progress("tiny jobs");
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[16]);
    let y = g.input("y", DType::F32, &[16]);
    let tiny = g.finish(&[("z", &x.add(&y))]).map_err(|e| e.to_string())?;
    let task = c.put_blob(tiny.to_bytes()).await.map_err(err)?.hash;
    let (xt, yt) = (filled(&[16], 1), filled(&[16], 2));
    let blobs: std::collections::BTreeMap<Hash, String> = [&xt, &yt]
        .iter()
        .map(|t| (tensor::hash(t), tenet_proto::to_hex(&tensor::encode(t))))
        .collect();
    let mut job_us = Vec::new();
    let mut both_us = Vec::new();
    let run_id = identity::random_bytes::<4>();
    for i in 0..reps {
        let req = RunJob {
            job: spec(
                format!("tiny-{}-{i}", tenet_proto::to_hex(&run_id)),
                task,
                &[("x", &xt), ("y", &yt)],
            ),
            timeout_ms: None,
            blobs: blobs.clone(),
            pulls: Default::default(),
            stage: None,
        };
        let t = Instant::now();
        let committed = c.run_job(&req).await.map_err(err)?;
        job_us.push(t.elapsed().as_secs_f64() * 1e6);
        c.reveal(&committed.commitment.job.job_id)
            .await
            .map_err(err)?;
        both_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let tiny_median = quantile(&job_us, 0.5);
    rows.push(NodeRow {
        name: "tiny job round trip (run → signed commitment)",
        value: tiny_median,
        unit: "µs",
        p99: Some(quantile(&job_us, 0.99)),
        goal: Some(("≤ 100 µs", tiny_median <= 100.0)),
        peer: "GT one op + fetch 770–990 µs",
    });
    rows.push(NodeRow {
        name: "tiny job commit + reveal (two round trips)",
        value: quantile(&both_us, 0.5),
        unit: "µs",
        p99: Some(quantile(&both_us, 0.99)),
        goal: None,
        peer: "GT one op + fetch 770–990 µs",
    });

    // 1000 small ops on resident tensors in one batch.
    progress("batches of 1000 small ops");
    let sid = c.create_session().await.map_err(err)?;
    c.put_tensor(&sid, "x", tensor::encode(&xt))
        .await
        .map_err(err)?;
    c.put_tensor(&sid, "y", tensor::encode(&yt))
        .await
        .map_err(err)?;
    let op = SessionOp::Run {
        task,
        weights: None,
        inputs: [("x", "x"), ("y", "y")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        outputs: [("z".to_string(), "z".to_string())].into(),
        seed: 0,
    };
    let batch = Batch {
        ops: vec![op; 1000],
    };
    let mut per_op = Vec::new();
    for _ in 0..if quick { 3 } else { 15 } {
        let t = Instant::now();
        let r = c.batch(&sid, &batch).await.map_err(err)?;
        if let Some(e) = r.error {
            return Err(format!("batch failed at op {}: {}", e.index, e.error));
        }
        per_op.push(t.elapsed().as_secs_f64() * 1e6 / 1000.0);
    }
    let per_op_median = quantile(&per_op, 0.5);
    rows.push(NodeRow {
        name: "1000 small ops in one batch, per op",
        value: per_op_median,
        unit: "µs",
        p99: None,
        goal: Some(("≤ 10 µs", per_op_median <= 10.0)),
        peer: "GT ≈600 µs per op",
    });

    // 4 MiB tensors into the session (resident in memory, as GT's worker keeps them).
    progress("4 MiB tensor uploads into a session");
    let mut tensor_gbps = Vec::new();
    for i in 0..if quick { 5 } else { 20 } {
        let values: Vec<f32> = (0..1usize << 20).map(|j| (j ^ (i << 20)) as f32).collect();
        let t = HostTensor::from_f32(&[1 << 20], &values).map_err(|e| e.to_string())?;
        let blob = Bytes::from(tensor::encode(&t));
        let start = Instant::now();
        // Hashing the blob to sign the request is part of an upload's cost.
        c.put_tensor(&sid, "upload", blob).await.map_err(err)?;
        tensor_gbps.push((4u64 << 20) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    let tensor_gbps = quantile(&tensor_gbps, 0.5);
    rows.push(NodeRow {
        name: "4 MiB tensor upload into a session (hashed)",
        value: tensor_gbps,
        unit: "GB/s",
        p99: None,
        goal: Some(("≥ 2 GB/s", tensor_gbps >= 2.0)),
        peer: "GT: 2 × 4 MiB up + 1024² matmul + fetch 56–65 ms",
    });
    c.free_tensor(&sid, "upload").await.map_err(err)?;

    // 4 MiB uploads of fresh bytes (no HEAD skip), hashed while streamed, fsynced.
    progress("4 MiB blob uploads");
    let up = uploads(c, node_pid, quick).await?;
    rows.push(NodeRow {
        name: "4 MiB upload (hashed, fsynced: the default)",
        value: up.gbps,
        unit: "GB/s",
        p99: None,
        goal: Some(("≥ 2 GB/s", up.gbps >= 2.0)),
        peer: "ZeroMQ 4 MiB echo 1.8–3.3 ms (1.3–2.3 GB/s)",
    });
    rows.extend(up.node_cpu_row("  node CPU per upload (fsynced)"));

    // A 1024² matmul job with its inputs already on the node, output fetched, against the
    // same matmul run locally.
    progress("1024² matmul: local, then as a job");
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[1024, 1024]);
    let b = g.input("b", DType::F32, &[1024, 1024]);
    let mm = g
        .finish(&[("c", &a.matmul(&b))])
        .map_err(|e| e.to_string())?;
    let (at, bt) = (filled(&[1024, 1024], 3), filled(&[1024, 1024], 4));
    let local = tenet_devices::cpu(&tenet_devices::Options {
        threads: Some(threads),
        simd: Some(tenet_devices::SimdLevel::detect()),
        ..Default::default()
    });
    let prepared = local.compile(&mm).map_err(|e| e.to_string())?;
    let inputs = HashMap::from([("a".to_string(), at.clone()), ("b".to_string(), bt.clone())]);
    let mm_reps = if quick { 5 } else { 60 };
    let mut local_ms = Vec::new();
    for _ in 0..mm_reps {
        let t = Instant::now();
        prepared
            .run(&inputs, &tenet_ir::NoWeights, 0)
            .map_err(|e| e.to_string())?;
        local_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mm_task = c.put_blob(mm.to_bytes()).await.map_err(err)?.hash;
    c.put_blob(tensor::encode(&at)).await.map_err(err)?;
    c.put_blob(tensor::encode(&bt)).await.map_err(err)?;
    let mut remote_ms = Vec::new();
    let mut exec_ms = Vec::new();
    let mut job_ms = Vec::new();
    let mut fetch_ms = Vec::new();
    for i in 0..mm_reps {
        let req = RunJob {
            job: spec(
                format!("mm-{}-{i}", tenet_proto::to_hex(&run_id)),
                mm_task,
                &[("a", &at), ("b", &bt)],
            ),
            timeout_ms: None,
            blobs: Default::default(),
            pulls: Default::default(),
            stage: None,
        };
        let t = Instant::now();
        let committed = c.run_job(&req).await.map_err(err)?;
        job_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let revealed = c.reveal(&req.job.job_id).await.map_err(err)?;
        let fetch = Instant::now();
        let out = c
            .get_blob(&revealed.reveal.outputs[0].hash)
            .await
            .map_err(err)?;
        remote_ms.push(t.elapsed().as_secs_f64() * 1e3);
        fetch_ms.push(fetch.elapsed().as_secs_f64() * 1e3);
        exec_ms.push(committed.exec_us as f64 / 1e3);
        if out.len() < 4 << 20 {
            return Err("the matmul output came back short".into());
        }
    }
    let (l, r) = (quantile(&local_ms, 0.5), quantile(&remote_ms, 0.5));
    rows.push(NodeRow {
        name: "1024² matmul run locally",
        value: l,
        unit: "ms",
        p99: None,
        goal: None,
        peer: "numpy ≈ 10 ms (2 threads)",
    });
    rows.push(NodeRow {
        name: "1024² matmul as a job (run, reveal, fetch 4 MiB)",
        value: r,
        unit: "ms",
        p99: None,
        goal: None,
        peer: "GT 35–38 ms",
    });
    for (name, v) in [
        ("  of which the job request (commitment back)", &job_ms),
        ("    of which the node executing the graph", &exec_ms),
        ("  of which fetching the 4 MiB output", &fetch_ms),
    ] {
        rows.push(NodeRow {
            name,
            value: quantile(v, 0.5),
            unit: "ms",
            p99: None,
            goal: None,
            peer: "",
        });
    }
    rows.push(NodeRow {
        name: "1024² matmul job overhead over local",
        value: r - l,
        unit: "ms",
        p99: None,
        goal: Some(("≤ 3 ms", r - l <= 3.0)),
        peer: "GT adds 15–18 ms",
    });
    Ok(NodeReport {
        backend: info.backend,
        rows,
    })
}

impl NodeReport {
    pub fn json(&self) -> Value {
        json!({
            "backend": self.backend,
            "rows": self.rows.iter().map(|r| json!({
                "name": r.name.trim(),
                "value": r.value,
                "unit": r.unit,
                "p99": r.p99,
                "goal": r.goal.map(|g| g.0),
                "goal_met": r.goal.map(|g| g.1),
                "peer": r.peer,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = format!(
            "tenet node on 127.0.0.1 ({}), signed client in another process; medians\n\n",
            self.backend
        );
        let _ = writeln!(
            out,
            "{:<50} {:>10} {:>10}  {:<16} peer on this machine kind",
            "workload", "median", "p99", "goal"
        );
        for r in &self.rows {
            let p99 = r.p99.map_or(String::new(), |p| format!("{p:.1}"));
            let goal = r.goal.map_or(String::new(), |(g, met)| {
                format!("{g} {}", if met { "met" } else { "MISSED" })
            });
            let _ = writeln!(
                out,
                "{:<50} {:>7.2} {:<4} {:>6}  {:<16} {}",
                r.name, r.value, r.unit, p99, goal, r.peer
            );
        }
        out
    }
}
