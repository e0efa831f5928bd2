//! `tenet peer` (a hoster or validator on the peer-to-peer network, `tenet peer status`,
//! `tenet peer key`, `tenet peer network`) and `tenet call --p2p` (a verified job with no
//! coordinator): argument parsing and printing; the work is `tenet_p2p`'s.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tenet_p2p::call::{CallSpec, Outcome};
use tenet_p2p::epoch::NetworkSpec;
use tenet_p2p::host::{HostConfig, Hoster, TaskFiles};
use tenet_p2p::validator::ValidatorOptions;
use tenet_p2p::{Config, Multiaddr, Network};
use tenet_proto::Hash;

/// The arguments of `tenet peer`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PeerArgs {
    #[command(subcommand)]
    action: Option<PeerAction>,
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
    /// Write every request and job phase as a JSON line here (`-`: standard error); the
    /// swarm's lines (DHT records, gossip, challenges, settlements) go beside it, to
    /// NAME-p2p.jsonl for a FILE named NAME.jsonl.
    #[arg(long, value_name = "FILE")]
    event_log: Option<PathBuf>,
    /// The network spec (`tenet peer network` writes one): epochs, validators and their
    /// stakes. Without it the peer hosts tasks but takes no part in epochs, and refuses score
    /// records.
    #[arg(long, value_name = "FILE")]
    network: Option<PathBuf>,
    /// Validate: challenge the hosters each epoch, publish scores by commit-reveal, settle
    /// epochs into this peer's ledger. Needs --network, naming this peer's key.
    #[arg(long, requires = "network")]
    validate: bool,
    /// Reveal scores other than those committed to: for demos of the network.
    #[arg(long, hide = true, requires = "validate")]
    cheat_scores: bool,
    /// How often the peer gossips its advert, in seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    gossip_every: f64,
}

#[derive(clap::Subcommand)]
pub enum PeerAction {
    /// Ask a running peer what it sees: its connections, DHT, hosted tasks, the epoch and
    /// phase, its validator's scores, and the last settled epoch's standings.
    #[command(after_help = "Example:\n  tenet peer status /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW…")]
    Status {
        /// The peer's address, as it printed it (…/p2p/PEER_ID).
        peer: String,
        /// Print the whole status as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print this peer's public key (creating its identity in --data-dir if there is none):
    /// what a network spec names a validator by.
    Key {
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Write a network spec: its validators (KEY or KEY=STAKE, as `tenet peer key` prints),
    /// the epoch length and when epoch 0 begins.
    #[command(
        after_help = "Example:\n  tenet peer network -o net.json --validator $(tenet peer key --data-dir v1) \\\n      --epoch-secs 60"
    )]
    Network {
        /// Where to write it.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// A validator, KEY[=STAKE] (default stake 100); repeatable, at least one.
        #[arg(long, value_name = "KEY[=STAKE]", required = true)]
        validator: Vec<String>,
        /// How long one epoch lasts.
        #[arg(long, default_value_t = 60.0, value_name = "SECS")]
        epoch_secs: f64,
        /// Epoch 0 begins this many seconds from now.
        #[arg(long, default_value_t = 10.0, value_name = "SECS")]
        genesis_in: f64,
        #[arg(long, default_value = "tenet")]
        name: String,
    },
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

/// `tenet peer`: host tasks (and validate) until Ctrl-C, or one of its subcommands.
pub fn run_peer(args: &PeerArgs) -> Result<()> {
    match &args.action {
        Some(PeerAction::Status { peer, json }) => return status(peer, *json),
        Some(PeerAction::Key { data_dir }) => {
            let dir = data_dir
                .clone()
                .unwrap_or_else(|| tenet_node::config::data_dir_for("peer"));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let key = tenet_net::identity::load_or_create(&dir)?;
            println!("{}", key.public().to_hex());
            return Ok(());
        }
        Some(PeerAction::Network {
            output,
            validator,
            epoch_secs,
            genesis_in,
            name,
        }) => return write_network(output, validator, *epoch_secs, *genesis_in, name),
        None => {}
    }
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
    let spec = match &args.network {
        Some(p) => Some(Arc::new(NetworkSpec::load(p)?)),
        None => None,
    };
    net.spec = spec.clone();
    if let Some(log) = &args.event_log {
        let path = if log == std::path::Path::new("-") {
            log.clone()
        } else {
            log.with_file_name(format!(
                "{}-p2p.jsonl",
                log.file_stem().unwrap_or_default().to_string_lossy()
            ))
        };
        let events = tenet_net::events::EventLog::open(&path)
            .with_context(|| format!("cannot open the event log {}", path.display()))?;
        net.events = tenet_p2p::swarm::Events(Arc::new(events));
    }
    let validator = match (&spec, args.validate) {
        (Some(spec), true) => Some(ValidatorOptions {
            spec: spec.clone(),
            data_dir: node.data_dir.clone(),
            cheat_scores: args.cheat_scores,
        }),
        _ => None,
    };
    let gossip_every = Duration::try_from_secs_f64(args.gossip_every)
        .ok()
        .filter(|d| *d >= Duration::from_millis(100))
        .context("--gossip-every takes a number of seconds, at least 0.1")?;
    let rt = runtime()?;
    rt.block_on(async {
        let hoster = Hoster::start(HostConfig {
            node,
            net,
            tasks,
            gossip_every,
            validator,
        })
        .await?;
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
        if let Some(spec) = &spec {
            let role = if hoster.validator.is_some() {
                "validating"
            } else {
                "hosting"
            };
            writeln!(
                out,
                "  network {:?}: epochs of {:.1} s, {} validator(s); {role}",
                spec.name,
                spec.epoch_ms as f64 / 1e3,
                spec.validators.len()
            )?;
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

/// `tenet peer status ADDR`: ask a running peer over the network.
fn status(peer: &str, json: bool) -> Result<()> {
    let addr: Multiaddr = peer
        .parse()
        .with_context(|| format!("{peer:?} is not a libp2p multiaddr (…/p2p/PEER_ID)"))?;
    let id = tenet_p2p::swarm::address_peer(&addr)
        .with_context(|| format!("{peer:?} does not end in /p2p/PEER_ID"))?;
    runtime()?.block_on(async {
        let net = Network::start(Config::new(tenet_net::identity::generate()), None).await?;
        net.dial(addr)
            .await
            .with_context(|| format!("cannot reach {peer}: is the peer running?"))?;
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            net.request(
                id,
                tenet_p2p::wire::Request {
                    method: "GET".into(),
                    path: tenet_p2p::host::STATUS_PATH.into(),
                    headers: Vec::new(),
                    body: tenet_p2p::wire::Blob(Vec::new().into()),
                },
            ),
        )
        .await
        .context("the peer did not answer within 20 s")??;
        let v: serde_json::Value = serde_json::from_slice(&answer.body.0)
            .with_context(|| format!("the peer answered {} without a status", answer.status))?;
        if json {
            println!("{v}");
            return Ok(());
        }
        let sw = &v["swarm"];
        println!("peer {}", sw["peer_id"].as_str().unwrap_or("?"));
        for a in sw["listen"].as_array().into_iter().flatten() {
            println!("  listening on {}", a.as_str().unwrap_or(""));
        }
        println!(
            "  connected to {} peer(s); {} in its routing table; {} record(s) held; {} refused",
            sw["connected"].as_array().map_or(0, |a| a.len()),
            sw["routing"],
            sw["records"],
            sw["refused_records"]
        );
        println!(
            "  gossip: {} advert(s) known, {} message(s) taken, {} refused, {} dropped as floods; requests: {} in, {} refused, {} over a peer's share",
            sw["known_adverts"],
            sw["gossip_accepted"],
            sw["gossip_refused"],
            sw["gossip_rate_limited"],
            sw["inbound_requests"],
            sw["refused_requests"],
            sw["rate_limited"]
        );
        for h in v["hosted"].as_array().into_iter().flatten() {
            println!(
                "  hosting {} (task {})",
                h["name"].as_str().unwrap_or(""),
                h["task"].as_str().unwrap_or("")
            );
        }
        match v["network"].as_str() {
            Some(n) => println!(
                "  network {n:?}: epoch {} ({} phase)",
                v["epoch"],
                v["phase"].as_str().unwrap_or("?")
            ),
            None => println!("  no network spec: takes no part in epochs"),
        }
        if let Some(val) = v["validator"].as_object() {
            println!(
                "  validator: {} epoch(s) committed, {} revealed; {} challenge answer(s), {} agreeing with the majority",
                val["committed"], val["revealed"], val["challenges_sent"], val["challenges_agreed"]
            );
            for s in val["scores"].as_array().into_iter().flatten() {
                println!(
                    "    scored {} {:.2} over {} challenge(s)",
                    s["peer"].as_str().unwrap_or(""),
                    s["score"].as_f64().unwrap_or(0.0),
                    s["challenges"]
                );
            }
        }
        if let Some(st) = v["standings"].as_object() {
            println!(
                "  epoch {} settled: {} validator(s) counted, {} ignored",
                st["epoch"],
                st["counted"].as_array().map_or(0, |a| a.len()),
                st["ignored"].as_array().map_or(0, |a| a.len())
            );
            for s in st["standings"].as_array().into_iter().flatten() {
                let verdict = match (s["decided"].as_bool(), s["good"].as_bool()) {
                    (Some(true), Some(true)) => "good standing",
                    (Some(true), _) => "BAD standing",
                    _ => "undecided",
                };
                println!(
                    "    {} score {:.2}: {verdict}",
                    s["peer"].as_str().unwrap_or(""),
                    s["score"].as_f64().unwrap_or(0.0)
                );
            }
        }
        Ok(())
    })
}

/// `tenet peer network`: write a spec file.
fn write_network(
    output: &std::path::Path,
    validators: &[String],
    epoch_secs: f64,
    genesis_in: f64,
    name: &str,
) -> Result<()> {
    let mut keys = Vec::new();
    let mut stakes = Vec::new();
    for v in validators {
        let (k, stake) = match v.split_once('=') {
            Some((k, s)) => (
                k,
                s.parse::<u64>().with_context(|| {
                    format!("--validator {v:?}: the stake is not a whole number")
                })?,
            ),
            None => (v.as_str(), 100),
        };
        keys.push(tenet_proto::auth::PublicKey::parse(k).with_context(|| {
            format!("--validator {v:?}: not a public key (64 hex characters, as `tenet peer key` prints)")
        })?);
        stakes.push(stake);
    }
    let epoch_ms = (epoch_secs * 1e3) as u64;
    let genesis = tenet_p2p::swarm::now_ms() + (genesis_in.max(0.0) * 1e3) as u64;
    let mut spec = NetworkSpec::local(name, genesis, epoch_ms, &keys);
    for (v, s) in spec.validators.iter_mut().zip(stakes) {
        v.stake = s;
    }
    spec.check()
        .map_err(|m| anyhow::anyhow!("the network spec would not be valid: {m}"))?;
    tenet_models::write_atomically(output, serde_json::to_string_pretty(&spec)?.as_bytes())?;
    println!(
        "wrote {}: network {name:?}, {} validator(s), epochs of {epoch_secs} s from {} (unix ms)",
        output.display(),
        spec.validators.len(),
        spec.genesis_ms
    );
    Ok(())
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
    /// The network spec: hosters the last settled epoch put in bad standing are passed over.
    pub network: Option<&'a std::path::Path>,
    pub tier: tenet_proto::commit::Tier,
    /// The tolerant tier's bound on each element's distance from the element-wise median.
    pub tolerance: f64,
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
    let spec = a.network.map(NetworkSpec::load).transpose()?;
    config.spec = spec.clone().map(Arc::new);
    runtime()?.block_on(async {
        let net = Network::start(config, None).await?;
        let started = Instant::now();
        let mut found = tenet_p2p::call::find(
            &net,
            task,
            weights,
            a.replicas,
            a.wait.min(Duration::from_secs(30)),
        )
        .await?;
        if let Some(spec) = &spec {
            for peer in tenet_p2p::call::drop_bad(&net, spec, &mut found).await {
                if !a.json {
                    eprintln!("passing over {peer}: in bad standing after the last settled epoch");
                }
            }
        }
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
                tier: a.tier,
                tolerance: a.tolerance,
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
