//! `tenet node` and `tenet key`: flags onto the node's config, and key files.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, bail};
use tenet_net::identity;
use tenet_node::NodeConfig;
use tenet_node::config::parse_size;

fn size(text: &str) -> Result<u64, String> {
    parse_size(text).ok_or_else(|| format!("`{text}` is not a size such as 4096, 64K, 512M or 8G"))
}

#[derive(clap::Args)]
pub struct NodeArgs {
    /// A TOML config file; flags override its values.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where the node keeps its identity key and blobs [default: ~/.local/share/tenet/node].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7070]; port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Trust this public key (a coordinator's or client's, 64 hex characters); repeatable.
    #[arg(long = "trust", value_name = "KEY")]
    trust: Vec<String>,
    /// Accept requests signed by any key. For local experiments only: anyone who can reach the
    /// port can run jobs.
    #[arg(long)]
    open: bool,
    /// The most tensor memory one job may need, by its cost certificate (e.g. 4G)
    /// [default: the memory available at start].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    memory_limit: Option<u64>,
    /// The most GFLOP one job may need, by its cost certificate [default: 10000].
    #[arg(long, value_name = "GFLOP")]
    max_job_gflop: Option<u64>,
    /// Jobs run at once [default: 1].
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Threads per job [default: all cores].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// The device jobs run on: `cpu`, `opencl` or `opencl:N` (`tenet devices` lists them)
    /// [default: cpu]. A device that fails its determinism check serves the tolerant tier
    /// only, and /v1/info says so.
    #[arg(long, value_name = "SPEC")]
    device: Option<String>,
    /// Requests that may wait for a worker before more are refused as busy [default: 256].
    #[arg(long, value_name = "N")]
    queue: Option<usize>,
    /// Longest a job may run, in seconds [default: 60].
    #[arg(long, value_name = "SECS")]
    job_timeout: Option<f64>,
    /// Disk space for blobs; least recently used unpinned blobs are evicted beyond it [default: 8G].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    disk_quota: Option<u64>,
    /// The largest single blob accepted [default: 2G].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    max_blob: Option<u64>,
    /// Connections served at once; at the cap the idlest is closed and new ones wait
    /// [default: 512].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Seconds a connection may take to send a request head (also the keep-alive idle
    /// timeout) [default: 30].
    #[arg(long, value_name = "SECS")]
    header_timeout: Option<f64>,
    /// Seconds a request body may send nothing before it is dropped [default: 30].
    #[arg(long, value_name = "SECS")]
    body_timeout: Option<f64>,
    /// The fewest bytes a second a request body must average, from one --body-timeout after
    /// it began; 0: no floor [default: 65536].
    #[arg(long, value_name = "BYTES")]
    min_body_rate: Option<u64>,
    /// Let session pulls fetch from the node at URL (http://HOST:PORT); repeatable. Pulls from
    /// anywhere else are refused (an --open node may also pull from loopback addresses).
    #[arg(long = "pull-from", value_name = "URL")]
    pull_from: Vec<String>,
    /// Write every request and job phase as a JSON line to this file (`-` = standard error).
    #[arg(long, value_name = "PATH", env = "TENET_EVENT_LOG")]
    event_log: Option<PathBuf>,
    /// Acknowledge blobs without fsync (faster; a power cut may lose acknowledged blobs).
    #[arg(long)]
    no_fsync: bool,
    /// After each request, keep the event loop spinning this many µs so that the next request
    /// is read at once instead of after a wake-up: lower latency for one busy core meanwhile;
    /// 0 sleeps at once [default: 200].
    #[arg(long, value_name = "MICROS")]
    busy_poll_us: Option<u64>,
    /// Price per GFLOP advertised in /v1/info.
    #[arg(long, value_name = "PRICE")]
    price_per_gflop: Option<f64>,
    /// Lie on purpose: flip, noise=AMPLITUDE, collude, withhold (commit, then never reveal),
    /// op=K (lie at node %K inside the graph as it runs, on the reference interpreter, so the
    /// outputs and the node's trace follow from the lie: what a dispute by bisection pins
    /// down; op=K@N: only in the Nth graph job), or stall=K (lie as op=K, then never answer a
    /// dispute's questions). For demos and tests of the coordinator only: a cheating node's commitments are
    /// signed lies (or broken promises) and will be slashed.
    #[arg(long, value_name = "MODE")]
    cheat: Option<String>,
    /// Join the coordinator at URL: trust its key, register once listening, send heartbeats,
    /// deregister on shutdown.
    #[arg(long, value_name = "URL")]
    coordinator: Option<String>,
    /// Stake to bond at the first registration (with --coordinator); only the coordinator's
    /// admin bonds stake, so --api-key must be its admin key. Without it the node gets jobs
    /// once the admin bonds some (`tenet bond`).
    #[arg(long, value_name = "N", requires = "coordinator")]
    stake: Option<i64>,
    /// An API key of the coordinator's for registering (with --coordinator); without one the
    /// node signs the registration with its own key, which the coordinator must trust.
    #[arg(long, value_name = "KEY", requires = "coordinator")]
    api_key: Option<String>,
    /// The URL the coordinator reaches this node at [default: http:// and the listen address].
    #[arg(long, value_name = "URL", requires = "coordinator")]
    advertise: Option<String>,
    /// Seconds between heartbeats to the coordinator [default: 10].
    #[arg(long, value_name = "SECS", requires = "coordinator")]
    heartbeat: Option<f64>,
}

impl NodeArgs {
    /// The config file (if any) with the flags applied on top.
    pub fn config(&self) -> Result<NodeConfig> {
        let mut c = match &self.config {
            Some(p) => NodeConfig::from_file(p)?,
            None => NodeConfig::default(),
        };
        if let Some(d) = &self.data_dir {
            c.data_dir = d.clone();
        }
        if let Some(l) = self.listen {
            c.listen = l;
        }
        c.trusted_keys.extend(self.trust.iter().cloned());
        c.open |= self.open;
        if let Some(v) = self.memory_limit {
            c.memory_limit_bytes = v;
        }
        if let Some(v) = self.max_job_gflop {
            c.max_job_flops = v.saturating_mul(1_000_000_000);
        }
        if let Some(v) = self.workers {
            c.workers = v;
        }
        if let Some(v) = self.threads {
            c.threads_per_job = v;
        }
        if let Some(v) = &self.device {
            c.device = v.clone();
        }
        if let Some(v) = self.queue {
            c.queue_limit = v;
        }
        if let Some(v) = self.job_timeout {
            if v.is_nan() || v <= 0.0 {
                bail!("--job-timeout must be above 0 seconds");
            }
            c.job_timeout_ms = (v * 1000.0).round() as u64;
        }
        if let Some(v) = self.disk_quota {
            c.disk_quota_bytes = v;
        }
        if let Some(v) = self.max_blob {
            c.max_blob_bytes = v;
        }
        if let Some(v) = self.max_connections {
            c.max_connections = v;
        }
        for (flag, value, field) in [
            (
                "--header-timeout",
                self.header_timeout,
                &mut c.header_timeout_ms,
            ),
            ("--body-timeout", self.body_timeout, &mut c.body_timeout_ms),
        ] {
            if let Some(v) = value {
                if !(v > 0.0 && v.is_finite()) {
                    bail!("{flag} must be a number of seconds above 0");
                }
                *field = (v * 1000.0).round().max(1.0) as u64;
            }
        }
        if let Some(v) = self.min_body_rate {
            c.min_body_bytes_per_sec = v;
        }
        c.pull_peers.extend(self.pull_from.iter().cloned());
        if let Some(p) = &self.event_log {
            c.event_log = Some(p.clone());
        }
        c.durable &= !self.no_fsync;
        if let Some(v) = self.busy_poll_us {
            c.busy_poll_us = v;
        }
        if let Some(v) = self.price_per_gflop {
            c.price_per_gflop = v;
        }
        if let Some(m) = &self.cheat {
            c.cheat = Some(m.clone());
        }
        if let Some(url) = &self.coordinator {
            let m = c
                .membership
                .get_or_insert_with(|| tenet_node::membership::Membership {
                    coordinator: url.clone(),
                    stake: None,
                    api_key: None,
                    advertise: None,
                    heartbeat_secs: 10.0,
                });
            m.coordinator = url.clone();
        }
        if let Some(m) = &mut c.membership {
            if let Some(s) = self.stake {
                m.stake = Some(s);
            }
            if let Some(k) = &self.api_key {
                m.api_key = Some(k.clone());
            }
            if let Some(a) = &self.advertise {
                m.advertise = Some(a.clone());
            }
            if let Some(h) = self.heartbeat {
                m.heartbeat_secs = h;
            }
            if m.stake.is_some_and(|s| s <= 0) {
                bail!("--stake must be a positive integer");
            }
            if !(m.heartbeat_secs > 0.0 && m.heartbeat_secs.is_finite()) {
                bail!("--heartbeat must be above 0 seconds");
            }
        }
        Ok(c)
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn run_node(args: &NodeArgs) -> Result<()> {
    let config = args.config()?;
    let trusted = config.trusted_keys.len();
    tenet_node::run_blocking(config, |addr, node| {
        let info = node.info();
        let c = node.config();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "tenet node {} listening on http://{addr}",
            info.node_id
        );
        let _ = writeln!(
            out,
            "  data {}  backend {}  {} worker(s)  jobs up to {} and {} GFLOP, {} s",
            c.data_dir.display(),
            info.backend,
            c.workers,
            gib(c.memory_limit_bytes),
            c.max_job_flops / 1_000_000_000,
            c.job_timeout_ms as f64 / 1000.0
        );
        if let Some(m) = &c.cheat {
            let _ = writeln!(
                out,
                "  WARNING: CHEATING NODE ({m}): every result it commits to is deliberately wrong"
            );
            eprintln!("tenet node: WARNING: cheating on purpose ({m})");
        }
        if info.open {
            let _ = writeln!(
                out,
                "  WARNING: open mode: any key may run jobs on this node. Use it on loopback only."
            );
            eprintln!("tenet node: WARNING: open mode, requests from any key are accepted");
        } else {
            let _ = writeln!(
                out,
                "  trusts {} key(s); Ctrl-C stops it gracefully",
                trusted + usize::from(c.membership.is_some())
            );
        }
        if let Some(m) = &c.membership {
            let stake = match m.stake {
                Some(s) => format!("bonding stake {s}"),
                None => "(stake is what the coordinator's admin bonds)".to_string(),
            };
            let _ = writeln!(
                out,
                "  joined the coordinator at {} {stake}; heartbeat every {} s",
                m.coordinator, m.heartbeat_secs
            );
        }
        let _ = out.flush();
    })?;
    eprintln!("tenet node: stopped");
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum KeyCommand {
    /// Create an Ed25519 key file (mode 0600) and print its public key.
    New {
        /// Where to write it; refuses to overwrite.
        file: PathBuf,
    },
    /// Print the public key of a key file (a node's is DATA_DIR/node.key).
    Show { file: PathBuf },
}

pub fn key(cmd: &KeyCommand) -> Result<()> {
    match cmd {
        KeyCommand::New { file } => {
            if file.exists() {
                bail!("{} exists; refusing to overwrite a key", file.display());
            }
            let key = identity::generate();
            identity::write_key(file, &key)?;
            println!("{}", key.public());
        }
        KeyCommand::Show { file } => println!("{}", identity::read_key(file)?.public()),
    }
    Ok(())
}
