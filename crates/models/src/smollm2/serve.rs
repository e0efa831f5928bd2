//! Continuous batching: a [`Batcher`] owns one model on one device and decodes every request
//! submitted to it together, one token per member per step, requests joining and leaving the
//! batch between steps.
//!
//! A worker thread runs the loop. Between steps it admits waiting requests (up to the batch
//! limit): each is prefilled alone (a prompt is one graph of its own length) and its first
//! token chosen. Then one [`SmolLm2::step_batch`] advances every active request; each picks
//! its next token — greedily, or by its own seeded sampler at its own step index — and leaves
//! the batch when it reaches its token limit, a stop token, or its receiver is gone. Because a
//! batch never changes a member's bits (see `batch.rs`), every request gets exactly the tokens
//! it would get alone, whoever else is decoding: tested below and in the model's tests.
//!
//! A finished request's session (its KV cache) is kept, within a byte budget, for a request
//! whose prompt extends its tokens — the next chunk of a streamed completion — which then feeds
//! only the new tokens instead of prefilling everything again; a cached decode gives the bits
//! of recomputing, so the tokens do not change.
//!
//! Failures stay with their request: a prompt that cannot be prefilled (too long for the
//! context, say) fails that request only; a failed batched step fails its members.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use tenet_exec::Device;

use super::{DecodeSession, EOS, Sampling, SmolLm2, argmax, sample};

/// One generation: a prompt's token ids and how to continue it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    /// The most tokens to generate (at least one is, unless this is 0).
    pub max_tokens: usize,
    /// `None`: greedy.
    pub sampling: Option<Sampling>,
    /// The sampler's step index of the first new token (0 unless this continues tokens
    /// generated before: see `tenet_models::generation`).
    pub first_step: u64,
    /// Tokens that end the generation besides the model's end-of-sequence token (the
    /// token that ends it is its last).
    pub stop: Vec<u32>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` were generated, or the context is full.
    Length,
}

/// What a [`Batcher`] sends a request's receiver, in order: its tokens as they are chosen,
/// then one `Done` or `Failed`.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    Token(u32),
    Done(FinishReason),
    Failed(String),
}

struct Job {
    request: GenerationRequest,
    events: Sender<GenerationEvent>,
}

/// Decodes the requests submitted to it in one continuous batch (see the module's header).
/// Dropping it lets the worker finish the requests in flight and stop.
pub struct Batcher {
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    stats: Arc<Counters>,
}

/// What a [`Batcher`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatcherStats {
    /// Batched decode steps run.
    pub steps: u64,
    /// Tokens generated (first tokens from prefills included).
    pub tokens: u64,
    /// The most requests one step decoded.
    pub peak_batch: u64,
    /// Requests that continued a finished request's session (its KV cache) instead of
    /// prefilling their whole prompt.
    pub reused: u64,
}

#[derive(Default)]
struct Counters {
    steps: AtomicU64,
    tokens: AtomicU64,
    peak_batch: AtomicU64,
    reused: AtomicU64,
}

impl Batcher {
    /// Start a worker decoding on `device` with at most `max_batch` requests per step
    /// (at least 1).
    pub fn start(model: Arc<SmolLm2>, device: Arc<dyn Device>, max_batch: usize) -> Batcher {
        let (jobs, rx) = mpsc::channel();
        let stats = Arc::new(Counters::default());
        let counters = stats.clone();
        let worker = std::thread::Builder::new()
            .name("tenet-batcher".into())
            .spawn(move || run(&model, &*device, max_batch.max(1), rx, &counters))
            .expect("spawning the batcher's thread");
        Batcher {
            jobs: Some(jobs),
            worker: Some(worker),
            stats,
        }
    }

    pub fn stats(&self) -> BatcherStats {
        let s = &self.stats;
        BatcherStats {
            steps: s.steps.load(Ordering::Relaxed),
            tokens: s.tokens.load(Ordering::Relaxed),
            peak_batch: s.peak_batch.load(Ordering::Relaxed),
            reused: s.reused.load(Ordering::Relaxed),
        }
    }

    /// Queue `request`; its tokens and its end arrive on the returned receiver. Dropping the
    /// receiver cancels the request at the next step.
    pub fn submit(&self, request: GenerationRequest) -> Receiver<GenerationEvent> {
        let (events, rx) = mpsc::channel();
        let job = Job { request, events };
        if let Some(jobs) = &self.jobs
            && let Err(mpsc::SendError(job)) = jobs.send(job)
        {
            let _ = job
                .events
                .send(GenerationEvent::Failed("the batcher has stopped".into()));
        }
        rx
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// A request in the batch: its session, the token it feeds next, and its progress.
struct Active<'a> {
    session: DecodeSession<'a>,
    /// The tokens the session holds, in order.
    fed: Vec<u32>,
    events: Sender<GenerationEvent>,
    request: GenerationRequest,
    next: u32,
    generated: usize,
}

impl Active<'_> {
    /// Choose the token after `logits`, send it, and say whether the request goes on.
    fn choose(&mut self, logits: &[f32]) -> bool {
        let token = match self.request.sampling {
            None => argmax(logits),
            Some(s) => sample(logits, s, self.request.first_step + self.generated as u64),
        };
        self.generated += 1;
        self.next = token;
        if self.events.send(GenerationEvent::Token(token)).is_err() {
            return false; // nobody is listening: cancelled
        }
        let stop = token == EOS || self.request.stop.contains(&token);
        let full = self.session.len() >= self.session.model.config.context;
        let end = if stop {
            Some(FinishReason::Stop)
        } else if self.generated >= self.request.max_tokens || full {
            Some(FinishReason::Length)
        } else {
            None
        };
        match end {
            Some(reason) => {
                let _ = self.events.send(GenerationEvent::Done(reason));
                false
            }
            None => true,
        }
    }
}

fn run(
    model: &SmolLm2,
    device: &dyn Device,
    max_batch: usize,
    jobs: Receiver<Job>,
    counters: &Counters,
) {
    let mut active: Vec<Active<'_>> = Vec::new();
    let mut finished = Finished::default();
    let mut open = true;
    loop {
        // Admit waiting requests; with nothing to decode, wait for one.
        while open && active.len() < max_batch {
            let job = if active.is_empty() {
                match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            counters.tokens.fetch_add(1, Ordering::Relaxed);
            if let Some(a) = admit(model, device, job, &mut finished, counters) {
                active.push(a);
            }
        }
        if active.is_empty() {
            if open {
                continue;
            }
            return;
        }
        let tokens: Vec<u32> = active.iter().map(|a| a.next).collect();
        let n = active.len() as u64;
        counters.steps.fetch_add(1, Ordering::Relaxed);
        counters.tokens.fetch_add(n, Ordering::Relaxed);
        counters.peak_batch.fetch_max(n, Ordering::Relaxed);
        let result = {
            let mut sessions: Vec<&mut DecodeSession<'_>> =
                active.iter_mut().map(|a| &mut a.session).collect();
            model.step_batch(&mut sessions, &tokens)
        };
        match result {
            Ok(logits) => {
                let mut going = Vec::with_capacity(active.len());
                for (mut a, l) in active.drain(..).zip(&logits) {
                    a.fed.push(a.next);
                    if a.choose(l) {
                        going.push(a);
                    } else {
                        finished.keep(a.fed, a.session);
                    }
                }
                active = going;
            }
            Err(e) => {
                for a in active.drain(..) {
                    let _ = a.events.send(GenerationEvent::Failed(e.clone()));
                }
            }
        }
    }
}

/// Bytes of KV cache the sessions of finished requests may hold, kept for requests that
/// continue them (a long generation run as several jobs, each continuing from the tokens the
/// previous ones agreed on).
const FINISHED_CACHE_BYTES: u64 = 256 << 20;

/// Sessions of finished requests, with the tokens each holds, newest last.
#[derive(Default)]
struct Finished<'a> {
    sessions: Vec<(Vec<u32>, DecodeSession<'a>)>,
}

impl<'a> Finished<'a> {
    fn bytes(s: &DecodeSession<'_>) -> u64 {
        let c = &s.model.config;
        2 * c.layers * s.capacity() * c.kv_heads * (c.hidden / c.heads) * 4
    }

    /// Keep `session` (holding `tokens`), dropping the oldest past the byte budget.
    fn keep(&mut self, tokens: Vec<u32>, session: DecodeSession<'a>) {
        if Self::bytes(&session) > FINISHED_CACHE_BYTES {
            return;
        }
        self.sessions.push((tokens, session));
        while self
            .sessions
            .iter()
            .map(|(_, s)| Self::bytes(s))
            .sum::<u64>()
            > FINISHED_CACHE_BYTES
        {
            self.sessions.remove(0);
        }
    }

    /// The session holding the longest proper prefix of `prompt`, taken out.
    fn take_prefix_of(&mut self, prompt: &[u32]) -> Option<(usize, DecodeSession<'a>)> {
        let best = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| t.len() < prompt.len() && prompt.starts_with(t))
            .max_by_key(|(_, (t, _))| t.len())
            .map(|(i, _)| i)?;
        let (tokens, session) = self.sessions.remove(best);
        Some((tokens.len(), session))
    }
}

/// Prefill `job`'s prompt and choose its first token: the request joins the batch, or has
/// already ended (or failed). A prompt that extends a finished request's tokens continues its
/// session, feeding only the new tokens: a cached decode gives the bits of recomputing, so the
/// tokens are the same.
fn admit<'a>(
    model: &'a SmolLm2,
    device: &'a dyn Device,
    job: Job,
    finished: &mut Finished<'a>,
    counters: &Counters,
) -> Option<Active<'a>> {
    let Job { request, events } = job;
    if request.max_tokens == 0 {
        let _ = events.send(GenerationEvent::Done(FinishReason::Length));
        return None;
    }
    let (held, mut session) = match finished.take_prefix_of(&request.prompt) {
        Some(found) => {
            counters.reused.fetch_add(1, Ordering::Relaxed);
            found
        }
        None => (0, model.session(device)),
    };
    let logits = match session.prefill(&request.prompt[held..]) {
        Ok(l) => l,
        Err(e) => {
            let _ = events.send(GenerationEvent::Failed(e));
            return None;
        }
    };
    let mut a = Active {
        session,
        fed: request.prompt.clone(),
        events,
        request,
        next: 0,
        generated: 0,
    };
    a.choose(&logits).then_some(a)
}

#[cfg(test)]
mod tests {
    use super::super::tests::tiny;
    use super::*;
    use tenet_cpu::CpuDevice;

    fn collect(rx: Receiver<GenerationEvent>) -> (Vec<u32>, GenerationEvent) {
        let mut tokens = Vec::new();
        for e in rx {
            match e {
                GenerationEvent::Token(t) => tokens.push(t),
                end => return (tokens, end),
            }
        }
        panic!("the batcher hung up without an end");
    }

    fn request(
        prompt: Vec<u32>,
        max_tokens: usize,
        sampling: Option<Sampling>,
    ) -> GenerationRequest {
        GenerationRequest {
            prompt,
            max_tokens,
            sampling,
            first_step: 0,
            stop: vec![],
        }
    }

    /// Requests submitted together (more than the batch holds, greedy and sampled, of
    /// different lengths) get the tokens each gets alone.
    #[test]
    fn concurrent_requests_get_the_tokens_each_gets_alone() {
        let model = Arc::new(tiny(256));
        let device: Arc<dyn Device> = Arc::new(CpuDevice::new(2, tenet_cpu::SimdLevel::detect()));
        let requests: Vec<GenerationRequest> = (0..6u32)
            .map(|i| {
                let prompt: Vec<u32> = (0..(3 + 11 * i)).map(|j| (j * 5 + i) % 61).collect();
                let sampling = (i % 2 == 1).then(|| Sampling {
                    seed: 40 + i as u64,
                    temperature: 0.8,
                    top_p: if i == 3 { 0.9 } else { 1.0 },
                });
                request(prompt, 5 + i as usize, sampling)
            })
            .collect();
        let alone: Vec<(Vec<u32>, GenerationEvent)> = requests
            .iter()
            .map(|r| {
                let b = Batcher::start(model.clone(), device.clone(), 1);
                collect(b.submit(r.clone()))
            })
            .collect();
        let batcher = Batcher::start(model.clone(), device.clone(), 4);
        let receivers: Vec<_> = requests.iter().map(|r| batcher.submit(r.clone())).collect();
        for (i, (rx, want)) in receivers.into_iter().zip(&alone).enumerate() {
            let got = collect(rx);
            assert_eq!(&got, want, "request {i}");
            assert!(!got.0.is_empty());
        }
        let stats = batcher.stats();
        assert!(
            stats.peak_batch > 1,
            "requests were decoded together: {stats:?}"
        );
        assert!(
            stats.peak_batch <= 4,
            "never more than the limit: {stats:?}"
        );
        // Alone is also what the model's own generation gives (what a referee runs).
        for (r, (tokens, end)) in requests.iter().zip(&alone) {
            let direct = model
                .generate_from(&r.prompt, r.max_tokens, r.sampling, 0, &r.stop, &*device)
                .unwrap();
            assert_eq!(&direct.0, tokens);
            assert_eq!(&GenerationEvent::Done(direct.1), end);
        }
    }

    /// A sampled generation split into two requests — the second continuing from the first's
    /// tokens at its step index — gives the tokens of one request.
    #[test]
    fn a_generation_continued_from_its_tokens_gives_the_same_tokens() {
        let model = Arc::new(tiny(256));
        let device: Arc<dyn Device> = Arc::new(CpuDevice::new(1, tenet_cpu::SimdLevel::detect()));
        let batcher = Batcher::start(model, device, 4);
        let sampling = Some(Sampling {
            seed: 11,
            temperature: 1.3,
            top_p: 0.95,
        });
        let whole = collect(batcher.submit(request(vec![3, 1, 4], 10, sampling))).0;
        let first = collect(batcher.submit(request(vec![3, 1, 4], 4, sampling))).0;
        let mut rest = request([vec![3, 1, 4], first.clone()].concat(), 6, sampling);
        rest.first_step = 4;
        let rest = collect(batcher.submit(rest)).0;
        assert_eq!([first, rest].concat(), whole);
        assert_eq!(
            batcher.stats().reused,
            1,
            "the continuation took the first's session"
        );
        // Starting at another step draws other tokens (the test can tell).
        let mut shifted = request(vec![3, 1, 4], 10, sampling);
        shifted.first_step = 1;
        assert_ne!(collect(batcher.submit(shifted)).0, whole);
    }

    #[test]
    fn stops_limits_and_failures_end_each_request_alone() {
        let model = Arc::new(tiny(64));
        let device: Arc<dyn Device> = Arc::new(CpuDevice::new(1, tenet_cpu::SimdLevel::detect()));
        let batcher = Batcher::start(model.clone(), device.clone(), 8);
        // The first greedy token of this prompt, used as a stop token, ends it at once.
        let first = collect(batcher.submit(request(vec![1, 2, 3], 1, None))).0[0];
        let mut stopping = request(vec![1, 2, 3], 20, None);
        stopping.stop = vec![first];
        let too_long = request((0..65).map(|i| i % 61).collect(), 4, None);
        let none = request(vec![4], 0, None);
        let limited = request(vec![9, 9], 3, None);
        let rxs: Vec<_> = [stopping, too_long, none, limited]
            .into_iter()
            .map(|r| batcher.submit(r))
            .collect();
        let mut got = rxs.into_iter().map(collect);
        assert_eq!(
            got.next().unwrap(),
            (vec![first], GenerationEvent::Done(FinishReason::Stop))
        );
        let (tokens, end) = got.next().unwrap();
        assert!(tokens.is_empty());
        assert!(
            matches!(end, GenerationEvent::Failed(ref e) if e.contains("context")),
            "{end:?}"
        );
        assert_eq!(
            got.next().unwrap(),
            (vec![], GenerationEvent::Done(FinishReason::Length))
        );
        let (tokens, end) = got.next().unwrap();
        assert_eq!(
            (tokens.len(), end),
            (3, GenerationEvent::Done(FinishReason::Length))
        );
        // A request generating until the context is full ends with Length, not an error.
        let (tokens, end) = collect(batcher.submit(request(vec![1; 60], 100, None)));
        assert_eq!(end, GenerationEvent::Done(FinishReason::Length));
        assert_eq!(
            tokens.len(),
            5,
            "60 prompt tokens + 4 fed back fill 64 positions"
        );
    }
}
