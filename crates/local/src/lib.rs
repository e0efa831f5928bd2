//! A whole tenet network in one process, on 127.0.0.1: a coordinator (SQLite ledger in a given
//! directory) and several nodes, some optionally told to lie. Real HTTP between them; what
//! `tenet demo` and benchmarks start, then stop.

use std::path::Path;
use std::sync::Arc;

use tenet_ledger::SqlLedger;
use tenet_node::{Node, NodeConfig};
use tenet_proto::auth::KeyPair;
use tokio::sync::watch;

use tenet_coordinator::http::{Access, Service};
use tenet_coordinator::{Coordinator, CoordinatorConfig};

/// A coordinator's ledger handle — leasing under a holder id of its own, as a coordinator
/// service does — and its blob store under `dir`.
async fn coordinator_state(
    ledger_url: &str,
    dir: &Path,
    config: &CoordinatorConfig,
) -> Result<(SqlLedger, Arc<tenet_store::Store>), LocalError> {
    let holder = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>());
    let ledger = SqlLedger::connect(ledger_url)
        .await
        .map_err(err)?
        .leasing(&holder, config.lease);
    let store = tenet_store::Store::open(
        &dir.join("coordinator-store"),
        tenet_store::StoreConfig::default(),
    )
    .map_err(err)?;
    Ok((ledger, store))
}

/// Serve `core`'s API on a free port of 127.0.0.1 and keep its leases, until `rx` says stop;
/// its URL and the tasks serving it.
async fn serve(
    core: Arc<Coordinator<SqlLedger>>,
    dir: &Path,
    api_key: &str,
    public_reads: bool,
    rx: &watch::Receiver<bool>,
) -> Result<(String, Vec<tokio::task::JoinHandle<()>>), LocalError> {
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let llms = tenet_coordinator::openai::Llms::open(dir, core.store()).map_err(err)?;
    let service = Arc::new(Service {
        core: core.clone(),
        llms: Arc::new(llms),
        access: Access {
            api_keys: vec![api_key.to_string()],
            admin_keys: Vec::new(),
            gate: tenet_net::gate::Gate::new(
                Vec::new(),
                false,
                tenet_proto::auth::DEFAULT_MAX_SKEW_SECS,
            )
            .with_key(core.key().clone()),
            open: false,
            max_request_bytes: 1 << 30,
            conn: tenet_net::serve::ConnLimits::default(),
            public_reads,
        },
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let url = format!("http://{}", listener.local_addr().map_err(err)?);
    let mut tasks = vec![tokio::spawn(tenet_coordinator::http::serve(
        service,
        listener,
        stopped(rx.clone()),
    ))];
    let leases = core.keep_leases(url.clone());
    let stop_leases = stopped(rx.clone());
    tasks.push(tokio::spawn(async move {
        tokio::select! {
            _ = leases => {}
            _ = stop_leases => {}
        }
    }));
    Ok((url, tasks))
}

/// A running local network.
pub struct LocalNetwork {
    pub coordinator_url: String,
    pub coordinator_key: KeyPair,
    /// The API key callers use.
    pub api_key: String,
    /// Each node's URL, id and cheat mode.
    pub nodes: Vec<(String, String, Option<String>)>,
    pub core: Arc<Coordinator<SqlLedger>>,
    /// Where the ledger is (every coordinator of the network shares it).
    pub ledger_url: String,
    /// Keys for the peer coordinators the nodes trust ([`LocalOptions::peer_coordinators`]),
    /// taken by [`LocalNetwork::add_coordinator`] in turn.
    pub peer_keys: Vec<KeyPair>,
    public_reads: bool,
    stop: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

/// What a local network does beyond running jobs.
#[derive(Clone, Debug, Default)]
pub struct LocalOptions {
    /// Write every node's and the coordinator's event log into this directory
    /// (`node<i>.jsonl`, `coordinator.jsonl`), for `tenet timeline`.
    pub event_logs: Option<std::path::PathBuf>,
    /// The dashboard's read-only views without the API key (a network on loopback).
    pub public_reads: bool,
    /// Keys for this many more coordinators on the same ledger, which the nodes trust too
    /// ([`LocalNetwork::add_coordinator`] starts one).
    pub peer_coordinators: usize,
}

/// Another coordinator on a local network's ledger (its own key, store and port).
pub struct PeerCoordinator {
    pub url: String,
    pub key: KeyPair,
    pub core: Arc<Coordinator<SqlLedger>>,
}

/// Why the network could not start.
#[derive(Debug, thiserror::Error)]
#[error("starting the local network: {0}")]
pub struct LocalError(pub String);

fn err(e: impl std::fmt::Display) -> LocalError {
    LocalError(e.to_string())
}

impl LocalNetwork {
    /// Start a coordinator and one node per entry of `cheats` (`None` = honest) under `dir`,
    /// register every node with `stake`.
    pub async fn start(
        dir: &Path,
        cheats: &[Option<&str>],
        stake: i64,
        config: CoordinatorConfig,
    ) -> Result<LocalNetwork, LocalError> {
        LocalNetwork::start_on(dir, cheats, stake, config, None).await
    }

    /// [`LocalNetwork::start`] with the ledger at `ledger_url` (`postgres://…`, or SQLite in
    /// `dir` when `None`).
    pub async fn start_on(
        dir: &Path,
        cheats: &[Option<&str>],
        stake: i64,
        config: CoordinatorConfig,
        ledger_url: Option<&str>,
    ) -> Result<LocalNetwork, LocalError> {
        let options = LocalOptions::default();
        LocalNetwork::start_with(dir, cheats, stake, config, ledger_url, &options).await
    }

    /// [`LocalNetwork::start_on`] with event logs and the dashboard's access as `options` say.
    pub async fn start_with(
        dir: &Path,
        cheats: &[Option<&str>],
        stake: i64,
        config: CoordinatorConfig,
        ledger_url: Option<&str>,
        options: &LocalOptions,
    ) -> Result<LocalNetwork, LocalError> {
        std::fs::create_dir_all(dir).map_err(err)?;
        if let Some(d) = &options.event_logs {
            std::fs::create_dir_all(d).map_err(err)?;
        }
        let (stop, rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let key = tenet_net::identity::generate();
        let peer_keys: Vec<KeyPair> = (0..options.peer_coordinators)
            .map(|_| tenet_net::identity::generate())
            .collect();
        let trusted: Vec<String> = std::iter::once(&key)
            .chain(&peer_keys)
            .map(|k| k.public().to_hex())
            .collect();
        let mut servers = Vec::new();
        let mut nodes = Vec::new();
        for (i, cheat) in cheats.iter().enumerate() {
            let config = NodeConfig {
                listen: "127.0.0.1:0".parse().map_err(err)?,
                data_dir: dir.join(format!("node{i}")),
                trusted_keys: trusted.clone(),
                threads_per_job: 1,
                durable: false,
                cheat: cheat.map(str::to_string),
                event_log: options
                    .event_logs
                    .as_ref()
                    .map(|d| d.join(format!("node{i}.jsonl"))),
                ..NodeConfig::default()
            };
            let node = Node::start(config).map_err(err)?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(err)?;
            let url = format!("http://{}", listener.local_addr().map_err(err)?);
            let id = node.info().node_id.to_hex();
            node.events.emit(
                "start",
                serde_json::json!({"addr": url.trim_start_matches("http://"), "node_id": id, "open": false}),
            );
            servers.push(tokio::spawn(tenet_node::http::serve(
                node,
                listener,
                stopped(rx.clone()),
            )));
            nodes.push((url, id, cheat.map(str::to_string)));
        }
        let sqlite = format!("sqlite://{}", dir.join("ledger.db").display());
        let ledger_url = ledger_url.unwrap_or(&sqlite).to_string();
        let (ledger, store) = coordinator_state(&ledger_url, dir, &config).await?;
        let log = match &options.event_logs {
            Some(d) => {
                tenet_net::events::EventLog::open(&d.join("coordinator.jsonl")).map_err(err)?
            }
            None => tenet_net::events::EventLog::off(),
        };
        let core =
            Arc::new(Coordinator::new(ledger, key.clone(), store, config).with_event_log(log));
        core.events.emit(
            "start",
            serde_json::json!({"coordinator": key.public().to_hex()}),
        );
        for (url, _, _) in &nodes {
            core.register_node(url, stake, None).await.map_err(err)?;
        }
        let api_key = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<16>());
        let (coordinator_url, mut served) =
            serve(core.clone(), dir, &api_key, options.public_reads, &rx).await?;
        servers.append(&mut served);
        Ok(LocalNetwork {
            coordinator_url,
            coordinator_key: key,
            api_key,
            nodes,
            core,
            ledger_url,
            peer_keys,
            public_reads: options.public_reads,
            stop,
            servers,
        })
    }

    /// Start another coordinator on the network's ledger, with the next of
    /// [`LocalNetwork::peer_keys`], its store under `dir`, the same API key, and `config`.
    pub async fn add_coordinator(
        &mut self,
        dir: &Path,
        config: CoordinatorConfig,
    ) -> Result<PeerCoordinator, LocalError> {
        if self.peer_keys.is_empty() {
            return Err(LocalError(
                "no peer coordinator keys are left: start the network with LocalOptions::peer_coordinators".into(),
            ));
        }
        let key = self.peer_keys.remove(0);
        std::fs::create_dir_all(dir).map_err(err)?;
        let (ledger, store) = coordinator_state(&self.ledger_url, dir, &config).await?;
        let core = Arc::new(Coordinator::new(ledger, key.clone(), store, config));
        let rx = self.stop.subscribe();
        let (url, mut served) =
            serve(core.clone(), dir, &self.api_key, self.public_reads, &rx).await?;
        self.servers.append(&mut served);
        core.resume().await.map_err(err)?;
        Ok(PeerCoordinator { url, key, core })
    }

    /// Stop every server and wait for them.
    pub async fn shutdown(self) {
        self.core.events.end();
        let _ = self.stop.send(true);
        for s in self.servers {
            let _ = s.await;
        }
        self.core.events.close();
    }
}
