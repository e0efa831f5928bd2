//! `tenet-coordinator`: runs each job on several independent nodes, collects their commitments
//! before any reveal, compares the results, answers with the agreed result and a receipt, and
//! slashes the nodes that lied.
//!
//! [`dispatch`] is the core (scheduling, commit-reveal across replicas, comparison per tier,
//! verdicts, slashes, receipts) over a [`tenet_ledger::Ledger`]; [`compare`] decides agreement;
//! [`economics`] prices honesty under spot-checking; [`http`] is the REST API for clients.

/// How replicas are compared: the same rules for the coordinator and a caller with none.
pub use tenet_proto::compare;
pub mod dashboard;
pub mod dispatch;
pub mod dispute;
pub mod economics;
pub mod events;
pub mod http;
pub mod openai;
mod phases;
pub mod pipeline;
pub mod registry;
pub mod scale;
pub mod staged;
pub mod training;

pub use dispatch::{
    Coordinator, CoordinatorConfig, DispatchError, JobOutcome, JobRequest, Stall, StallPoint,
};

use std::path::PathBuf;
use std::sync::Arc;

/// How to start a coordinator service.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub listen: std::net::SocketAddr,
    pub data_dir: PathBuf,
    /// `sqlite://PATH` or `postgres://…`; default: SQLite in the data directory.
    pub ledger_url: Option<String>,
    pub api_keys: Vec<String>,
    /// Admin bearer keys: what callers may do, and bond stake to nodes.
    pub admin_keys: Vec<String>,
    /// Client public keys (hex) whose signed requests are accepted.
    pub trusted_keys: Vec<String>,
    pub open: bool,
    pub core: CoordinatorConfig,
    /// How often the health monitor runs; nodes silent for three intervals are probed.
    pub health_interval: std::time::Duration,
    /// Connections, request heads and bodies (the node's accept loop and its defaults).
    pub conn: tenet_net::serve::ConnLimits,
    /// Where the event stream is logged too, one JSON object a line (`-`: standard error).
    pub event_log: Option<PathBuf>,
    /// The dashboard's read-only views without a key.
    pub public_dashboard: bool,
}

/// What a coordinator found when it started.
#[derive(Clone, Debug)]
pub struct Started {
    pub addr: std::net::SocketAddr,
    pub key: tenet_proto::auth::PublicKey,
    /// Unfinished jobs from the ledger, resumed.
    pub resumed: Vec<String>,
}

/// Why a coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot use the data directory {path}: {message}")]
    DataDir { path: String, message: String },
    #[error(transparent)]
    Ledger(#[from] tenet_ledger::LedgerError),
    #[error("resuming the unfinished jobs: {0}")]
    Resume(#[from] DispatchError),
    #[error("cannot listen on {addr}: {message}")]
    Listen { addr: String, message: String },
    #[error("client key `{0}` is not a 64-hex-character public key")]
    BadKey(String),
    #[error(
        "nobody could call this coordinator: give an --api-key, --trust a client key, or run with --open for local use"
    )]
    NobodyAllowed,
    #[error(
        "an admin key may not also be an API key: callers must not be able to bond stake; give the admin a key of its own"
    )]
    SharedAdminKey,
}

/// This coordinator's lease holder id: made once per data directory and kept there, so a
/// restart takes back the jobs it was driving at once instead of waiting out their leases.
fn instance_id(dir: &std::path::Path) -> std::io::Result<String> {
    let path = dir.join("coordinator.instance");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let id = tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>());
            let tmp = dir.join("coordinator.instance.tmp");
            std::fs::write(&tmp, format!("{id}\n"))?;
            std::fs::rename(&tmp, &path)?;
            Ok(id)
        }
    }
}

/// Start a coordinator, resume the jobs its ledger holds unfinished, watch its nodes' health,
/// and serve until Ctrl-C or SIGTERM; `ready` hears where it listens, its key and what it
/// resumed.
pub fn run_blocking(config: ServiceConfig, ready: impl FnOnce(&Started)) -> Result<(), StartError> {
    if config.api_keys.is_empty()
        && config.admin_keys.is_empty()
        && config.trusted_keys.is_empty()
        && !config.open
    {
        return Err(StartError::NobodyAllowed);
    }
    if config
        .admin_keys
        .iter()
        .any(|k| config.api_keys.contains(k))
    {
        return Err(StartError::SharedAdminKey);
    }
    let trusted = config
        .trusted_keys
        .iter()
        .map(|k| {
            tenet_proto::auth::PublicKey::parse(k).ok_or_else(|| StartError::BadKey(k.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dir_err = |message: String| StartError::DataDir {
        path: config.data_dir.display().to_string(),
        message,
    };
    std::fs::create_dir_all(&config.data_dir).map_err(|e| dir_err(e.to_string()))?;
    // One process per data directory: its lease holder id lives there, and two processes
    // driving jobs under one id would defeat the leases.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(config.data_dir.join("lock"))
        .map_err(|e| dir_err(e.to_string()))?;
    lock.try_lock().map_err(|_| {
        dir_err(
            "another coordinator is running on this data directory; give each coordinator a directory of its own (--data-dir)"
                .into(),
        )
    })?;
    let key = tenet_net::identity::load_or_create_at(&config.data_dir.join("coordinator.key"))
        .map_err(|e| dir_err(e.to_string()))?;
    let holder = instance_id(&config.data_dir).map_err(|e| dir_err(e.to_string()))?;
    let store = tenet_store::Store::open(
        &config.data_dir.join("store"),
        tenet_store::StoreConfig::default(),
    )
    .map_err(|e| dir_err(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tenet-coordinator")
        .build()
        .map_err(|e| dir_err(e.to_string()))?;
    runtime.block_on(async move {
        let url = config
            .ledger_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", config.data_dir.join("ledger.db").display()));
        let ledger = tenet_ledger::SqlLedger::connect(&url)
            .await?
            .leasing(&holder, config.core.lease);
        let log = match &config.event_log {
            Some(path) => {
                tenet_net::events::EventLog::open(path).map_err(|e| StartError::DataDir {
                    path: path.display().to_string(),
                    message: format!("cannot open the event log: {e}"),
                })?
            }
            None => tenet_net::events::EventLog::off(),
        };
        let core = Arc::new(
            Coordinator::new(ledger, key.clone(), store, config.core.clone()).with_event_log(log),
        );
        let llms = openai::Llms::open(&config.data_dir, core.store()).map_err(|message| {
            StartError::DataDir {
                path: config.data_dir.display().to_string(),
                message,
            }
        })?;
        let service = Arc::new(http::Service {
            core,
            llms: Arc::new(llms),
            access: http::Access {
                api_keys: config.api_keys.clone(),
                admin_keys: config.admin_keys.clone(),
                gate: tenet_net::gate::Gate::new(
                    trusted,
                    config.open,
                    tenet_proto::auth::DEFAULT_MAX_SKEW_SECS,
                )
                .with_key(key.clone()),
                open: config.open,
                max_request_bytes: 1 << 30,
                conn: config.conn,
                public_reads: config.public_dashboard,
            },
        });
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| StartError::Listen {
                addr: config.listen.to_string(),
                message: e.to_string(),
            })?;
        let bound = listener.local_addr().map_err(|e| StartError::Listen {
            addr: config.listen.to_string(),
            message: e.to_string(),
        })?;
        service.core.events.emit(
            "start",
            serde_json::json!({"coordinator": key.public().to_hex(), "addr": bound.to_string()}),
        );
        let resumed = service.core.resume().await?;
        let monitor = tokio::spawn(service.core.clone().monitor_health(config.health_interval));
        let leases = tokio::spawn(service.core.clone().keep_leases(format!("http://{bound}")));
        let _ = std::fs::write(config.data_dir.join("addr"), format!("{bound}\n"));
        ready(&Started {
            addr: bound,
            key: key.public(),
            resumed,
        });
        let core = service.core.clone();
        let stopping = {
            let core = core.clone();
            async move {
                tenet_net::serve::shutdown_signal().await;
                core.events.end();
            }
        };
        http::serve(service, listener, stopping).await;
        monitor.abort();
        leases.abort();
        core.events.close();
        Ok(())
    })
}
