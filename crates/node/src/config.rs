//! The node's configuration: a TOML file, then flags on top (the CLI applies them). Every field
//! has a default, so an empty file — or none — gives a working local node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tenet_proto::auth::PublicKey;

/// Everything a node needs to start.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where to listen. Loopback unless the operator says otherwise.
    pub listen: SocketAddr,
    /// Identity key, blobs, and the address file live here.
    pub data_dir: PathBuf,
    /// Public keys (hex) whose signed requests are accepted: the node's coordinators.
    pub trusted_keys: Vec<String>,
    /// Accept any correctly signed request, whatever its key. For local use only; logged loudly.
    pub open: bool,
    /// On an open node, let jobs pull inputs from loopback addresses (a local network's nodes
    /// find each other there). A peer-to-peer hoster turns it off: its callers are strangers,
    /// and a pull names an address for the node to fetch from.
    pub loopback_pulls: bool,
    /// The most tensor memory one job may need by its cost certificate; 0 = what the OS says is
    /// available at start.
    pub memory_limit_bytes: u64,
    /// The most operations one job may need by its cost certificate.
    pub max_job_flops: u64,
    /// Jobs (and session batches) run at once.
    pub workers: usize,
    /// Threads each job's kernels use; 0 = all cores.
    pub threads_per_job: usize,
    /// The device jobs run on: `cpu`, `opencl` (the first OpenCL device) or `opencl:N`
    /// (`tenet devices` lists them).
    pub device: String,
    /// Requests waiting for a worker beyond the running ones; more are refused as busy.
    pub queue_limit: usize,
    /// Longest a job may run; a request may ask for less.
    pub job_timeout_ms: u64,
    /// Total bytes of blobs kept on disk (LRU-evicted beyond it).
    pub disk_quota_bytes: u64,
    /// The largest single blob accepted.
    pub max_blob_bytes: u64,
    /// The largest JSON request body accepted.
    pub max_request_bytes: u64,
    /// Bytes of tensors all sessions together may keep resident, counting uploads and pulls
    /// as their bytes arrive.
    pub session_memory_bytes: u64,
    /// Bytes that blob uploads still arriving may hold on disk together (room is taken as
    /// their bytes arrive, never for a declared length); beyond it an upload is refused as
    /// busy.
    pub max_pending_upload_bytes: u64,
    /// Connections served at once. At the cap the connection idle longest (no request in
    /// flight) is closed to make room; if every one is in the middle of a request, new ones
    /// wait in the listen backlog until one ends.
    pub max_connections: usize,
    /// A connection must send a whole request head within this long of opening, or of its
    /// previous answer (so this is also the keep-alive idle timeout), or it is closed.
    pub header_timeout_ms: u64,
    /// A request body that sends nothing for this long is dropped (an upload's temporary
    /// file and room go with it); 0 = never.
    pub body_timeout_ms: u64,
    /// ... and one that averages fewer bytes a second than this, counted from one
    /// `body_timeout_ms` after it began; 0 = no floor.
    pub min_body_bytes_per_sec: u64,
    /// Peers session `pull`s may fetch from (`http://host:port`); an open node may also pull
    /// from loopback addresses. Any other peer is refused without being contacted.
    pub pull_peers: Vec<String>,
    /// Longest one pull may take: connecting, asking, and reading the tensor.
    pub pull_timeout_ms: u64,
    /// fsync blobs before acknowledging them.
    pub durable: bool,
    /// How far a request's clock may be from the node's.
    pub max_clock_skew_secs: u64,
    /// After each request, keep the event loop spinning this long (µs) so that the next
    /// request is read at once instead of after a wake-up (`busy`); 0 = sleep at once.
    pub busy_poll_us: u64,
    /// What the node asks per GFLOP (advertised in `/v1/info`).
    pub price_per_gflop: f64,
    /// Write every request and job phase as a JSON line here (`-` = standard error).
    pub event_log: Option<PathBuf>,
    /// Lie on purpose (`flip`, `noise=AMPLITUDE`, `collude`): for demos and the coordinator's
    /// tests only.
    pub cheat: Option<String>,
    /// A coordinator to join (register with, send heartbeats to, leave on shutdown); its key
    /// is trusted.
    pub membership: Option<crate::membership::Membership>,
}

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_dir: default_data_dir(),
            trusted_keys: Vec::new(),
            open: false,
            loopback_pulls: true,
            memory_limit_bytes: 0,
            max_job_flops: 10_000_000_000_000,
            workers: 1,
            threads_per_job: 0,
            device: "cpu".to_string(),
            queue_limit: 256,
            job_timeout_ms: 60_000,
            disk_quota_bytes: 8 << 30,
            max_blob_bytes: 2 << 30,
            max_request_bytes: 64 << 20,
            session_memory_bytes: 2 << 30,
            max_pending_upload_bytes: 4 << 30,
            max_connections: 512,
            header_timeout_ms: 30_000,
            body_timeout_ms: 30_000,
            min_body_bytes_per_sec: 64 << 10,
            pull_peers: Vec::new(),
            pull_timeout_ms: 60_000,
            durable: true,
            max_clock_skew_secs: tenet_proto::auth::DEFAULT_MAX_SKEW_SECS,
            busy_poll_us: tenet_net::client::DEFAULT_BUSY_POLL.as_micros() as u64,
            price_per_gflop: 0.0,
            event_log: None,
            cheat: None,
            membership: None,
        }
    }
}

fn default_data_dir() -> PathBuf {
    data_dir_for("node")
}

/// Where a tenet service called `name` keeps its data by default:
/// `$XDG_DATA_HOME/tenet/NAME`, else `~/.local/share/tenet/NAME`.
pub fn data_dir_for(name: &str) -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("tenet").join(name)
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("trusted key `{0}` is not a 64-hex-character Ed25519 public key")]
    BadKey(String),
    #[error(
        "the node trusts no keys and is not open: add a coordinator's key (--trust KEY or trusted_keys in the config), or run with --open for local use"
    )]
    NobodyTrusted,
    #[error(
        "cheat mode `{0}` is not one of flip, noise=AMPLITUDE, collude, withhold, op=K, op=K@N, stall=K"
    )]
    BadCheat(String),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("pull peer `{0}` is not a node address: expected http://HOST:PORT")]
    BadPeer(String),
}

impl NodeConfig {
    /// Read a TOML config file.
    pub fn from_file(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The trusted keys, parsed; refuses a node nobody could use.
    pub fn trusted(&self) -> Result<Vec<PublicKey>, ConfigError> {
        let keys: Vec<PublicKey> = self
            .trusted_keys
            .iter()
            .map(|k| PublicKey::parse(k).ok_or_else(|| ConfigError::BadKey(k.clone())))
            .collect::<Result<_, _>>()?;
        if keys.is_empty() && !self.open {
            return Err(ConfigError::NobodyTrusted);
        }
        if let Some(c) = &self.cheat
            && crate::cheat::Cheat::parse(c).is_none()
        {
            return Err(ConfigError::BadCheat(c.clone()));
        }
        if self.workers == 0 {
            return Err(ConfigError::Zero("workers"));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::Zero("max_connections"));
        }
        if self.header_timeout_ms == 0 {
            return Err(ConfigError::Zero("header_timeout_ms"));
        }
        self.pull_peer_addrs()?;
        Ok(keys)
    }

    /// The peers pulls may fetch from, as `host:port`.
    pub fn pull_peer_addrs(&self) -> Result<Vec<String>, ConfigError> {
        self.pull_peers
            .iter()
            .map(|p| tenet_net::client::authority(p).ok_or_else(|| ConfigError::BadPeer(p.clone())))
            .collect()
    }

    /// What the accept loop and body reads enforce.
    pub fn conn_limits(&self) -> tenet_net::serve::ConnLimits {
        tenet_net::serve::ConnLimits {
            max_connections: self.max_connections,
            header_timeout: std::time::Duration::from_millis(self.header_timeout_ms),
            body: tenet_net::serve::BodyPace {
                idle: std::time::Duration::from_millis(self.body_timeout_ms),
                min_rate: self.min_body_bytes_per_sec,
            },
        }
    }
}

/// Parse a byte count such as `4096`, `64K`, `512MiB` or `8G` (binary multiples).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("8 g"), Some(8 << 30));
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn config_files_parse_and_reject_unknown_fields() {
        let c: NodeConfig = toml::from_str("open = true\nworkers = 2\n").unwrap();
        assert!(c.open);
        assert_eq!(c.workers, 2);
        assert_eq!(c.listen.ip().to_string(), "127.0.0.1");
        assert!(toml::from_str::<NodeConfig>("wrokers = 2").is_err());
        let mut c: NodeConfig = toml::from_str(
            "open = true\nmax_connections = 8\npull_peers = [\"http://127.0.0.1:9/\"]\n",
        )
        .unwrap();
        assert_eq!(c.max_connections, 8);
        assert_eq!(c.pull_peer_addrs().unwrap(), ["127.0.0.1:9"]);
        c.pull_peers.push("ftp://x/y".into());
        assert!(matches!(c.trusted(), Err(ConfigError::BadPeer(_))));
        assert!(matches!(
            NodeConfig::default().trusted(),
            Err(ConfigError::NobodyTrusted)
        ));
    }
}
