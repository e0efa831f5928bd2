//! An OpenAI-compatible API over verified generation: `GET /v1/models`,
//! `POST /v1/chat/completions` and `POST /v1/completions`, for the LLMs deployed on this
//! coordinator (`POST /v1/llms`, `tenet deploy --model smollm2`).
//!
//! A completion is one or more generation jobs (`tenet_models::generation`), each run like
//! any job: on several nodes with commit-reveal, compared exactly, liars slashed, a referee
//! when there is no majority. Without `stream` it is one job of `max_tokens`; with `stream`
//! it is jobs of [`STREAM_CHUNK`] tokens, each continuing from the tokens agreed so far at the
//! sampler step it has reached, and each chunk's text is sent as a server-sent event only
//! once its job is decided — so nothing a client sees was produced by fewer than a majority.
//! Either way the tokens are the same (the sampler draws by step, and the model's logits
//! depend only on the tokens). The response carries the usual fields plus `tenet_receipt`,
//! the signed receipt of the last job: its input `ids` are the prompt and every earlier
//! token, its output the last tokens, so it binds the whole completion; `tenet_jobs` lists
//! every job.
//!
//! The chat template is SmolLM2's (ChatML, with its default system message when the
//! messages give none); `stop` strings end the text where they first appear (OpenAI's rule:
//! the stop string itself is not returned). Temperature 0 (the default here) is greedy;
//! otherwise the seed is the request's `seed`, or one the coordinator draws and returns as
//! `tenet_seed`, so anyone can re-run the completion.
//!
//! Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with 4xx
//! statuses for anything the request got wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::Response;
use hyper::header::HeaderValue;
use serde::Deserialize;
use serde_json::{Value, json};
use tenet_ledger::Ledger;
use tenet_models::generation::{self, Arithmetic, GenerationParams};
use tenet_models::smollm2::{EOS, FinishReason, SmolLm2};
use tenet_net::serve::{Reply, ReplyBody, error_reply, json_reply};
use tenet_proto::{ApiError, ErrorCode, Hash};
use tenet_store::Store;

use crate::dispatch::{Coordinator, DispatchError, JobRequest};

/// Tokens per job when streaming: each chunk is verified before it is sent.
pub const STREAM_CHUNK: u64 = 16;

/// The most stop strings a request may give (OpenAI's limit).
const MAX_STOP_STRINGS: usize = 4;

/// SmolLM2's default system message, which its chat template adds when there is none.
const DEFAULT_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A deployed LLM: its name, its GGUF file, and the model (weights mapped, tokenizer built)
/// this coordinator uses to tokenize, detokenize and referee.
pub struct Llm {
    pub name: String,
    pub weights: Hash,
    /// How its linear layers compute: what its generation task names.
    pub arithmetic: Arithmetic,
    pub created: u64,
    pub model: Arc<SmolLm2>,
    /// Stage weights files built for staged generations, by stage count (see `staged.rs`).
    pub staged: Mutex<Vec<(u64, Arc<tenet_net::stages::StageFiles>)>>,
}

/// The LLMs deployed here, kept in `llms.json` in the data directory so a restart keeps them.
pub struct Llms {
    path: PathBuf,
    models: Mutex<BTreeMap<String, Arc<Llm>>>,
}

#[derive(serde::Serialize, Deserialize)]
struct Entry {
    name: String,
    weights: Hash,
    /// Absent in files written before there was a choice: `exact`, all there was then.
    #[serde(default)]
    arithmetic: Arithmetic,
    created: u64,
}

fn load(store: &Store, weights: &Hash, arithmetic: Arithmetic) -> Result<SmolLm2, String> {
    if store.contains(weights).is_none() {
        return Err(format!(
            "the model's GGUF file {weights} is not here: upload it with PUT /v1/blobs/{weights} first"
        ));
    }
    SmolLm2::load_with(&store.path(weights), arithmetic.weights_mode())
        .map_err(|e| format!("{weights} is not a Llama GGUF model this coordinator can serve: {e}"))
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

impl Llms {
    /// The LLMs recorded in `data_dir`, loaded from `store` (one whose file has gone is
    /// skipped with a warning on stderr).
    pub fn open(data_dir: &Path, store: &Store) -> Result<Llms, String> {
        let path = data_dir.join("llms.json");
        let mut models = BTreeMap::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            let entries: Vec<Entry> = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not a list of LLMs: {e}", path.display()))?;
            for e in entries {
                match load(store, &e.weights, e.arithmetic) {
                    Ok(model) => {
                        let llm = Llm {
                            name: e.name.clone(),
                            weights: e.weights,
                            arithmetic: e.arithmetic,
                            created: e.created,
                            model: Arc::new(model),
                            staged: Mutex::default(),
                        };
                        models.insert(e.name, Arc::new(llm));
                    }
                    Err(why) => eprintln!("tenet coordinator: LLM {} not served: {why}", e.name),
                }
            }
        }
        Ok(Llms {
            path,
            models: Mutex::new(models),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Llm>>> {
        self.models.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, name: &str) -> Option<Arc<Llm>> {
        self.lock().get(name).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Llm>> {
        self.lock().values().cloned().collect()
    }

    /// Deploy the GGUF file `weights` (already in `store`) as the LLM `name` computing with
    /// `arithmetic`, replacing one of that name; recorded before this returns.
    pub fn register(
        &self,
        name: &str,
        weights: Hash,
        arithmetic: Arithmetic,
        store: &Store,
    ) -> Result<Arc<Llm>, ApiError> {
        if !valid_name(name) {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("an LLM's name is 1-64 of [A-Za-z0-9._:-], not {name:?}"),
            ));
        }
        let model = load(store, &weights, arithmetic)
            .map_err(|e| ApiError::new(ErrorCode::BadInputs, e))?;
        let llm = Arc::new(Llm {
            name: name.to_string(),
            weights,
            arithmetic,
            created: crate::dispatch::now() as u64,
            model: Arc::new(model),
            staged: Mutex::default(),
        });
        let mut models = self.lock();
        models.insert(name.to_string(), llm.clone());
        let entries: Vec<Entry> = models
            .values()
            .map(|l| Entry {
                name: l.name.clone(),
                weights: l.weights,
                arithmetic: l.arithmetic,
                created: l.created,
            })
            .collect();
        let text = serde_json::to_string_pretty(&entries).expect("plain data");
        tenet_models::write_atomically(&self.path, text.as_bytes()).map_err(|e| {
            ApiError::new(
                ErrorCode::Internal,
                format!("cannot record the LLM in {}: {e}", self.path.display()),
            )
        })?;
        Ok(llm)
    }
}

/// An OpenAI-shaped error: status from the code, `type` from the status.
pub struct OpenAiError {
    status: u16,
    message: String,
    param: Option<&'static str>,
    code: &'static str,
}

impl OpenAiError {
    fn invalid(
        message: impl Into<String>,
        param: Option<&'static str>,
        code: &'static str,
    ) -> OpenAiError {
        OpenAiError {
            status: 400,
            message: message.into(),
            param,
            code,
        }
    }

    pub fn reply(&self) -> Reply {
        let kind = match self.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "invalid_request_error",
            429 | 503 => "server_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        };
        let v = json!({"error": {
            "message": self.message, "type": kind, "param": self.param, "code": self.code,
        }});
        let mut r = json_reply(&v).unwrap_or_else(|e| error_reply(&e));
        *r.status_mut() = hyper::StatusCode::from_u16(self.status).unwrap_or_default();
        r
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> OpenAiError {
        OpenAiError {
            status: e.code.http_status(),
            message: e.message.clone(),
            param: None,
            code: e.code.as_str(),
        }
    }
}

impl From<DispatchError> for OpenAiError {
    fn from(e: DispatchError) -> OpenAiError {
        let (status, code) = match &e {
            DispatchError::BadRequest(_) => (400, "invalid_request"),
            DispatchError::NotEnoughNodes { .. } | DispatchError::Nodes(_) => (503, "no_nodes"),
            DispatchError::ExceedsLimits(_) => (400, "exceeds_limits"),
            _ => (500, "internal_error"),
        };
        OpenAiError {
            status,
            message: e.to_string(),
            param: None,
            code,
        }
    }
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Content,
}

/// A message's content: a string, or OpenAI's list of parts (text parts only).
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// The fields of both requests that tenet reads; others (user, logit_bias left empty, ...)
/// are ignored, and the ones it cannot honour are refused when set.
#[derive(Deserialize)]
struct Request {
    model: String,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    logprobs: Option<Value>,
}

/// What a request asks for, checked, of the model `M` (a deployed [`Llm`]).
struct Asked<M = Arc<Llm>> {
    llm: M,
    prompt: Vec<u32>,
    max_tokens: u64,
    sampling: Option<(f32, f32)>,
    seed: u64,
    stop: Vec<String>,
    stream: bool,
    chat: bool,
}

/// The text of ChatML messages as SmolLM2's template writes them, ready for the answer.
fn chat_text(messages: &[Message]) -> Result<String, OpenAiError> {
    if messages.is_empty() {
        return Err(OpenAiError::invalid(
            "messages must hold at least one message",
            Some("messages"),
            "invalid_value",
        ));
    }
    let mut text = String::new();
    if messages[0].role != "system" {
        text.push_str(&format!("<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"));
    }
    for m in messages {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer"
        ) {
            return Err(OpenAiError::invalid(
                format!(
                    "role {:?} is not system, developer, user or assistant",
                    m.role
                ),
                Some("messages"),
                "invalid_value",
            ));
        }
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        let content = match &m.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => t.push_str(s),
                        _ => {
                            return Err(OpenAiError::invalid(
                                format!(
                                    "content parts of type {:?} are not supported (text only)",
                                    p.kind
                                ),
                                Some("messages"),
                                "invalid_value",
                            ));
                        }
                    }
                }
                t
            }
        };
        text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
    }
    text.push_str("<|im_start|>assistant\n");
    Ok(text)
}

fn parse(body: &[u8], llms: &Llms, chat: bool) -> Result<Asked, OpenAiError> {
    parse_with(
        body,
        chat,
        |name| llms.get(name),
        |llm, text| llm.model.encode(text),
        |llm| llm.model.config.context,
    )
}

/// [`parse`] with the model found by `lookup`, its tokenizer `encode` and its `context`.
fn parse_with<M>(
    body: &[u8],
    chat: bool,
    lookup: impl Fn(&str) -> Option<M>,
    encode: impl Fn(&M, &str) -> Result<Vec<u32>, String>,
    context: impl Fn(&M) -> u64,
) -> Result<Asked<M>, OpenAiError> {
    let req: Request = serde_json::from_slice(body).map_err(|e| {
        OpenAiError::invalid(
            format!("the body is not a valid request: {e}"),
            None,
            "invalid_json",
        )
    })?;
    let llm = lookup(&req.model).ok_or_else(|| OpenAiError {
        status: 404,
        message: format!(
            "the model {:?} does not exist here; GET /v1/models lists the deployed ones",
            req.model
        ),
        param: Some("model"),
        code: "model_not_found",
    })?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(OpenAiError::invalid(
            "only n = 1 is supported",
            Some("n"),
            "invalid_value",
        ));
    }
    if req
        .logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && *v != json!(false))
    {
        return Err(OpenAiError::invalid(
            "logprobs are not supported",
            Some("logprobs"),
            "invalid_value",
        ));
    }
    let text = if chat {
        let messages = req.messages.as_deref().ok_or_else(|| {
            OpenAiError::invalid(
                "a chat completion needs messages",
                Some("messages"),
                "missing",
            )
        })?;
        chat_text(messages)?
    } else {
        match &req.prompt {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                a[0].as_str().unwrap_or_default().to_string()
            }
            _ => {
                return Err(OpenAiError::invalid(
                    "a completion needs one prompt string",
                    Some("prompt"),
                    "invalid_value",
                ));
            }
        }
    };
    let prompt = encode(&llm, &text).map_err(|e| {
        OpenAiError::invalid(
            format!("cannot tokenize the prompt: {e}"),
            Some("messages"),
            "invalid_value",
        )
    })?;
    if prompt.is_empty() {
        return Err(OpenAiError::invalid(
            "the prompt is empty",
            Some("prompt"),
            "invalid_value",
        ));
    }
    let context = context(&llm);
    let room = context.saturating_sub(prompt.len() as u64);
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    if let Some(m) = max_tokens
        && !(1..=generation::MAX_NEW_TOKENS).contains(&m)
    {
        return Err(OpenAiError::invalid(
            format!(
                "max_tokens is {m}; it must be 1..={}",
                generation::MAX_NEW_TOKENS
            ),
            Some("max_tokens"),
            "invalid_value",
        ));
    }
    if room == 0 || max_tokens.is_some_and(|m| m > room) {
        return Err(OpenAiError::invalid(
            format!(
                "this model's context is {context} tokens; the prompt takes {} and max_tokens asks for {}",
                prompt.len(),
                max_tokens.unwrap_or(1)
            ),
            Some("messages"),
            "context_length_exceeded",
        ));
    }
    let max_tokens = max_tokens.unwrap_or(room.min(generation::MAX_NEW_TOKENS).min(256));
    let temperature = req.temperature.unwrap_or(0.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(OpenAiError::invalid(
            format!("temperature is {temperature}; it must be 0..=2"),
            Some("temperature"),
            "invalid_value",
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(OpenAiError::invalid(
            format!("top_p is {top_p}; it must be in (0, 1]"),
            Some("top_p"),
            "invalid_value",
        ));
    }
    let stop = match req.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOP_STRINGS || stop.iter().any(String::is_empty) {
        return Err(OpenAiError::invalid(
            format!("stop takes up to {MAX_STOP_STRINGS} non-empty strings"),
            Some("stop"),
            "invalid_value",
        ));
    }
    let seed = match req.seed {
        Some(s) => s as u64,
        None => u64::from_le_bytes(tenet_net::identity::random_bytes::<8>()),
    };
    Ok(Asked {
        llm,
        prompt,
        max_tokens,
        sampling: (temperature > 0.0).then_some((temperature, top_p)),
        seed,
        stop,
        stream: req.stream,
        chat,
    })
}

/// The text of `tokens` that is final: up to the first stop string (and whether one was
/// found), never ending inside a character still being spelled by byte tokens.
fn text_of(model: &SmolLm2, tokens: &[u32], stop: &[String]) -> (String, bool) {
    let ids: Vec<u32> = tokens.iter().copied().filter(|&t| t != EOS).collect();
    let mut text = model.decode(&ids).unwrap_or_default();
    if let Some(at) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(at);
        return (text, true);
    }
    while text.ends_with('\u{FFFD}') {
        text.pop();
    }
    (text, false)
}

/// One verified generation job: the tokens after `ids`, their finish reason, the job's id and
/// its receipt.
async fn run_job<L: Ledger + 'static>(
    core: &Arc<Coordinator<L>>,
    asked: &Asked,
    ids: &[u32],
    max_tokens: u64,
    first_step: u64,
) -> Result<(Vec<u32>, FinishReason, String, Value), OpenAiError> {
    let params = GenerationParams {
        max_tokens,
        first_step,
        sampling: asked.sampling,
        stop: Vec::new(),
    };
    let req = JobRequest {
        task: Hash(asked.llm.arithmetic.task_id()),
        weights: Some(asked.llm.weights),
        inputs: generation::inputs(ids, &params).into_iter().collect(),
        tier: tenet_proto::commit::Tier::Exact,
        seed: asked.seed,
    };
    let out = core.run(req).await?;
    let (tokens, finish) = generation::parse_outputs(&out.outputs).map_err(|e| OpenAiError {
        status: 502,
        message: format!("the agreed generation is malformed: {e}"),
        param: None,
        code: "bad_generation",
    })?;
    let receipt = serde_json::to_value(&out.receipt).unwrap_or(Value::Null);
    Ok((tokens, finish, out.job_id, receipt))
}

fn finish_name(reason: FinishReason, stopped_by_string: bool) -> &'static str {
    if stopped_by_string {
        return "stop";
    }
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// Answer a chat completion (`chat`) or a completion.
pub async fn complete<L: Ledger + 'static>(
    core: Arc<Coordinator<L>>,
    llms: &Llms,
    body: &[u8],
    chat: bool,
) -> Result<Reply, OpenAiError> {
    let asked = parse(body, llms, chat)?;
    let created = crate::dispatch::now();
    if asked.stream {
        return Ok(stream(core, asked, created));
    }
    let (tokens, finish, job_id, receipt) =
        run_job(&core, &asked, &asked.prompt, asked.max_tokens, 0).await?;
    let (text, by_string) = text_of(&asked.llm.model, &tokens, &asked.stop);
    let choice = if asked.chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text},
               "finish_reason": finish_name(finish, by_string), "logprobs": null})
    } else {
        json!({"index": 0, "text": text, "finish_reason": finish_name(finish, by_string),
               "logprobs": null})
    };
    let v = json!({
        "id": format!("{}-{job_id}", if asked.chat { "chatcmpl" } else { "cmpl" }),
        "object": if asked.chat { "chat.completion" } else { "text_completion" },
        "created": created,
        "model": asked.llm.name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": asked.prompt.len(),
            "completion_tokens": tokens.len(),
            "total_tokens": asked.prompt.len() + tokens.len(),
        },
        "system_fingerprint": format!("tenet-{}", env!("CARGO_PKG_VERSION")),
        "tenet_receipt": receipt,
        "tenet_jobs": [job_id],
        "tenet_seed": asked.seed,
        "tenet_tokens": tokens,
    });
    Ok(json_reply(&v)?)
}

/// A streamed completion: jobs of [`STREAM_CHUNK`] tokens, each chunk's text sent as an
/// event once its job is decided, then the finish, the receipt, and `[DONE]`.
fn stream<L: Ledger + 'static>(core: Arc<Coordinator<L>>, asked: Asked, created: i64) -> Reply {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let id = format!(
        "{}-{}",
        if asked.chat { "chatcmpl" } else { "cmpl" },
        tenet_proto::to_hex(&tenet_net::identity::random_bytes::<12>())
    );
    tokio::spawn(async move {
        let event = |v: Value| Bytes::from(format!("data: {v}\n\n"));
        let chunk = |delta: Value, finish: Value, extra: Value| {
            let mut v = if asked.chat {
                json!({"id": id, "object": "chat.completion.chunk", "created": created,
                       "model": asked.llm.name,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
            } else {
                json!({"id": id, "object": "text_completion", "created": created,
                       "model": asked.llm.name,
                       "choices": [{"index": 0, "text": delta.get("content").cloned().unwrap_or(json!("")),
                                    "finish_reason": finish, "logprobs": null}]})
            };
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            event(v)
        };
        if asked.chat
            && tx
                .send(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    json!({}),
                ))
                .await
                .is_err()
        {
            return;
        }
        let mut tokens: Vec<u32> = Vec::new();
        let mut sent = 0usize; // bytes of text sent
        let mut jobs = Vec::new();
        let mut receipt = Value::Null;
        let outcome: Result<(FinishReason, bool), OpenAiError> = async {
            loop {
                let ids = [asked.prompt.clone(), tokens.clone()].concat();
                let left = asked.max_tokens - tokens.len() as u64;
                let (new, finish, job_id, r) = run_job(
                    &core,
                    &asked,
                    &ids,
                    left.min(STREAM_CHUNK),
                    tokens.len() as u64,
                )
                .await?;
                jobs.push(job_id);
                receipt = r;
                tokens.extend(&new);
                let (text, by_string) = text_of(&asked.llm.model, &tokens, &asked.stop);
                if text.len() > sent && text.is_char_boundary(sent) {
                    let piece = &text[sent..];
                    if tx
                        .send(chunk(json!({"content": piece}), Value::Null, json!({})))
                        .await
                        .is_err()
                    {
                        return Ok((finish, by_string)); // the client left
                    }
                    sent = text.len();
                }
                let done = by_string
                    || finish == FinishReason::Stop
                    || tokens.len() as u64 >= asked.max_tokens
                    || (asked.prompt.len() + tokens.len()) as u64 >= asked.llm.model.config.context;
                if done {
                    return Ok((finish, by_string));
                }
            }
        }
        .await;
        match outcome {
            Ok((finish, by_string)) => {
                let extra = json!({
                    "usage": {"prompt_tokens": asked.prompt.len(), "completion_tokens": tokens.len(),
                              "total_tokens": asked.prompt.len() + tokens.len()},
                    "tenet_receipt": receipt, "tenet_jobs": jobs, "tenet_seed": asked.seed,
                    "tenet_tokens": tokens,
                });
                let delta = if asked.chat {
                    json!({})
                } else {
                    json!({"content": ""})
                };
                let _ = tx
                    .send(chunk(delta, json!(finish_name(finish, by_string)), extra))
                    .await;
            }
            Err(e) => {
                let v = json!({"error": {"message": e.message, "type": "server_error",
                                         "param": null, "code": e.code}});
                let _ = tx.send(event(v)).await;
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut r = Response::new(ReplyBody::Stream(rx));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// `GET /v1/models`.
pub fn models(llms: &Llms) -> Result<Reply, ApiError> {
    let data: Vec<Value> = llms
        .all()
        .iter()
        .map(|l| {
            json!({"id": l.name, "object": "model", "created": l.created, "owned_by": "tenet",
                        "tenet_weights": l.weights, "tenet_arithmetic": l.arithmetic,
                        "tenet_task": Hash(l.arithmetic.task_id()),
                        "context_length": l.model.config.context})
        })
        .collect();
    json_reply(&json!({"object": "list", "data": data}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A model of 1000 positions whose tokens are the text's bytes.
    fn fake(body: &[u8], chat: bool) -> Result<Asked<()>, OpenAiError> {
        parse_with(
            body,
            chat,
            |name| (name == "m").then_some(()),
            |_, text| Ok(text.bytes().map(u32::from).collect()),
            |_| 1000,
        )
    }

    /// What an accepted request always satisfies.
    fn sane(a: &Asked<()>) {
        assert!(!a.prompt.is_empty());
        assert!((1..=generation::MAX_NEW_TOKENS).contains(&a.max_tokens));
        assert!(a.prompt.len() as u64 + a.max_tokens <= 1000);
        if let Some((t, p)) = a.sampling {
            assert!(t > 0.0 && t <= 2.0 && p > 0.0 && p <= 1.0);
        }
        assert!(a.stop.len() <= MAX_STOP_STRINGS && a.stop.iter().all(|s| !s.is_empty()));
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z ]{0,12}".prop_map(Value::from),
            Just(json!("m")),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("model".to_string()),
                        Just("messages".to_string()),
                        Just("prompt".to_string()),
                        Just("max_tokens".to_string()),
                        Just("temperature".to_string()),
                        Just("top_p".to_string()),
                        Just("stop".to_string()),
                        Just("seed".to_string()),
                        Just("n".to_string()),
                        Just("role".to_string()),
                        Just("content".to_string()),
                        Just("stream".to_string()),
                    ],
                    inner,
                    0..6,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        /// Hostile bytes and hostile JSON never panic the parser, and whatever it accepts is
        /// within the limits.
        #[test]
        fn hostile_requests_are_refused_or_sane(bytes in prop::collection::vec(any::<u8>(), 0..256),
                                                v in value(), chat in any::<bool>()) {
            if let Ok(a) = fake(&bytes, chat) {
                sane(&a);
            }
            if let Ok(a) = fake(v.to_string().as_bytes(), chat) {
                sane(&a);
            }
        }
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        let ok = fake(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}"#,
            true,
        );
        let a = ok.ok().unwrap();
        sane(&a);
        assert_eq!(a.max_tokens, 3);
        let refused = |body: &str, chat: bool, code: &str| {
            let e = fake(body.as_bytes(), chat).err().unwrap();
            assert_eq!(e.code, code, "{body}: {}", e.message);
            assert!((400..500).contains(&e.status));
        };
        refused(r#"{"model": "x", "prompt": "a"}"#, false, "model_not_found");
        refused(
            r#"{"model": "m", "prompt": "a", "max_tokens": 0}"#,
            false,
            "invalid_value",
        );
        refused(
            r#"{"model": "m", "prompt": "a", "max_tokens": 1000}"#,
            false,
            "context_length_exceeded",
        );
        refused(
            r#"{"model": "m", "prompt": "a", "temperature": 3}"#,
            false,
            "invalid_value",
        );
        refused(
            r#"{"model": "m", "prompt": "a", "top_p": 0}"#,
            false,
            "invalid_value",
        );
        refused(
            r#"{"model": "m", "prompt": "a", "stop": ["", "b"]}"#,
            false,
            "invalid_value",
        );
        refused(
            r#"{"model": "m", "prompt": "a", "n": 2}"#,
            false,
            "invalid_value",
        );
        refused(r#"{"model": "m", "prompt": ""}"#, false, "invalid_value");
        refused(r#"{"model": "m"}"#, true, "missing");
        refused(r#"{"model": "m", "messages": []}"#, true, "invalid_value");
        refused(r#"{"model": "m""#, true, "invalid_json");
    }

    fn messages(v: Value) -> Vec<Message> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn chat_messages_follow_smollm2s_template() {
        let text = chat_text(&messages(json!([{"role": "user", "content": "Hi"}])))
            .ok()
            .unwrap();
        assert_eq!(
            text,
            format!(
                "<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            )
        );
        let text = chat_text(&messages(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        ])))
        .ok()
        .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAB<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(chat_text(&[]).is_err());
        assert!(chat_text(&messages(json!([{"role": "tool", "content": "x"}]))).is_err());
    }
}
