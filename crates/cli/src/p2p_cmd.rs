//! `tenet peer` (a hoster on the peer-to-peer network) and `tenet call --p2p` (a verified job
//! with no coordinator): argument parsing and printing; the work is `tenet_p2p`'s.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tenet_p2p::call::{CallSpec, Outcome};
use tenet_p2p::host::{HostConfig, Hoster, TaskFiles};
use tenet_p2p::{Config, Multiaddr, Network};
use tenet_proto::Hash;

/// The arguments of `tenet peer`.
#[derive(clap::Args)]
pub struct PeerArgs {
    /// Where the peer keeps its identity key (also its peer id) and blobs
    /// [default: ~/.local/share/tenet/peer].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// A libp2p address to listen on; repeatable. TCP: /ip4/IP/tcp/PORT; QUIC:
    /// /ip4/IP/udp/PORT/quic-v1 (port 0 picks a free one).
    #[arg(
        long,
        value_name = "MULTIADDR",
        default_value = "/ip4/127.0.0.1/tcp/4001"
    )]
    listen: Vec<String>,
    /// A peer to join the network through, as printed by that peer (…/p2p/PEER_ID);
    /// repeatable. None: this peer starts a network of its own.
    #[arg(long, value_name = "MULTIADDR")]
    bootstrap: Vec<String>,
    /// A task to host: GRAPH (text or binary form) or GRAPH,WEIGHTS (a safetensors file);
    /// repeatable. Announced on the DHT, answered for any caller.
    #[arg(long, value_name = "GRAPH[,WEIGHTS]")]
    host: Vec<String>,
    /// The device jobs run on (`tenet devices` lists them).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Jobs run at once.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Lie on purpose (`flip`, `noise=AMPLITUDE`): for demos and tests of the network.
    #[arg(long, hide = true)]
    cheat: Option<String>,
    /// Write every request and job phase as a JSON line here (`-`: standard error).
    #[arg(long, value_name = "FILE")]
    event_log: Option<PathBuf>,
}

fn multiaddrs(list: &[String], what: &str) -> Result<Vec<Multiaddr>> {
    list.iter()
        .map(|a| {
            a.parse()
                .with_context(|| format!("{what} {a:?} is not a libp2p multiaddr (e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW…)"))
        })
        .collect()
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `tenet peer`: host tasks until Ctrl-C.
pub fn run_peer(args: &PeerArgs) -> Result<()> {
    let mut node = tenet_node::NodeConfig {
        data_dir: args
            .data_dir
            .clone()
            .unwrap_or_else(|| tenet_node::config::data_dir_for("peer")),
        device: args.device.clone(),
        workers: args.workers.max(1),
        cheat: args.cheat.clone(),
        event_log: args.event_log.clone(),
        ..tenet_node::NodeConfig::default()
    };
    node.busy_poll_us = 0;
    let tasks = args
        .host
        .iter()
        .map(|h| {
            let (graph, weights) = match h.split_once(',') {
                Some((g, w)) => (g, Some(PathBuf::from(w))),
                None => (h.as_str(), None),
            };
            TaskFiles {
                graph: PathBuf::from(graph),
                weights,
                name: None,
            }
        })
        .collect();
    let key = tenet_net::identity::generate();
    let mut net = Config::new(key);
    net.listen = multiaddrs(&args.listen, "--listen")?;
    net.bootstrap = multiaddrs(&args.bootstrap, "--bootstrap")?;
    let rt = runtime()?;
    rt.block_on(async {
        let hoster = Hoster::start(HostConfig { node, net, tasks }).await?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "tenet peer {} (key {})",
            hoster.net.peer_id(),
            hoster.node.key().public().to_hex()
        )?;
        for a in hoster.net.listen_addrs().await? {
            writeln!(out, "  listening on {a}")?;
        }
        for h in &hoster.hosted {
            let w = h
                .weights
                .map_or(String::new(), |w| format!(", weights {w}"));
            writeln!(out, "  hosting {} (task {}{w})", h.name, h.task)?;
        }
        if let Some(m) = &hoster.node.config().cheat {
            writeln!(
                out,
                "  WARNING: CHEATING PEER ({m}): every result it commits to is deliberately wrong"
            )?;
        }
        out.flush()?;
        drop(out);
        tenet_net::serve::shutdown_signal().await;
        Ok(())
    })
}

/// What `tenet call --p2p` was given.
pub struct P2pCall<'a> {
    pub task: &'a str,
    pub inputs: &'a [String],
    pub seed: u64,
    pub bootstrap: &'a [String],
    pub replicas: usize,
    pub weights: Option<&'a str>,
    pub output: Option<&'a std::path::Path>,
    pub receipt: Option<&'a std::path::Path>,
    pub json: bool,
    pub wait: Duration,
}

/// `tenet call --p2p`: find hosters on the DHT, run the job on `replicas` of them, verify.
pub fn call(a: P2pCall<'_>) -> Result<()> {
    if a.bootstrap.is_empty() {
        bail!("--p2p needs --bootstrap MULTIADDR: the address a running `tenet peer` printed");
    }
    let task = Hash::parse(a.task).with_context(|| {
        format!(
            "{:?} is not a task id (64 hex characters, as `tenet peer` prints)",
            a.task
        )
    })?;
    let weights = a
        .weights
        .map(|w| Hash::parse(w).with_context(|| format!("--weights {w:?} is not a hash")))
        .transpose()?;
    let key = tenet_net::identity::generate();
    let mut config = Config::new(key.clone());
    config.bootstrap = multiaddrs(a.bootstrap, "--bootstrap")?;
    runtime()?.block_on(async {
        let net = Network::start(config, None).await?;
        let started = Instant::now();
        let found = tenet_p2p::call::find(
            &net,
            task,
            weights,
            a.replicas,
            a.wait.min(Duration::from_secs(30)),
        )
        .await?;
        let graph = tenet_p2p::call::graph(&net, &key, &found).await?;
        let declared: Vec<(String, tenet_ir::TensorType)> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), t.clone()))
            .collect();
        let mut inputs: Vec<(String, tenet_ir::HostTensor)> =
            crate::run::read_declared(&declared, a.inputs)?
                .into_iter()
                .collect();
        inputs.sort_by(|x, y| x.0.cmp(&y.0));
        let outcome = tenet_p2p::call::call(
            &net,
            &key,
            &found,
            CallSpec {
                inputs,
                replicas: a.replicas,
                seed: a.seed,
                timeout: a.wait,
            },
        )
        .await?;
        outcome
            .receipt
            .verify()
            .context("the receipt does NOT verify")?;
        report(&a, &outcome, started.elapsed())
    })
}

fn report(a: &P2pCall<'_>, outcome: &Outcome, took: Duration) -> Result<()> {
    let receipt = &outcome.receipt;
    if let Some(p) = a.receipt {
        tenet_models::write_atomically(p, serde_json::to_string_pretty(receipt)?.as_bytes())?;
    }
    if let Some(p) = a.output {
        tenet_models::write_outputs(p, &outcome.outputs)?;
    }
    if a.json {
        let v = serde_json::json!({
            "job_id": receipt.job.job_id,
            "task": receipt.job.task,
            "outputs": outcome.outputs.iter().map(|(n, t)| serde_json::json!({
                "name": n, "type": t.ty().to_string(), "hash": tenet_proto::tensor::hash(t),
            })).collect::<Vec<_>>(),
            "hosters": outcome.parts,
            "ms": took.as_secs_f64() * 1e3,
            "receipt": receipt,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "job {} verified by {} of {} hoster(s) in {:.1} ms, no coordinator; receipt issued by this caller ({})",
        receipt.job.job_id,
        receipt.nodes.len(),
        receipt.replicas,
        took.as_secs_f64() * 1e3,
        &receipt.coordinator.to_hex()[..12]
    );
    for p in &outcome.parts {
        let e = p.error.as_ref().map_or(String::new(), |e| format!(": {e}"));
        println!("  {} {}{e}", p.peer, p.verdict);
    }
    print!("{}", crate::run::summary(&outcome.outputs));
    Ok(())
}
