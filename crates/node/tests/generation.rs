//! Generation jobs (`tenet_models::generation`) on a real node over HTTP: a job naming the
//! generation task and SmolLM2's GGUF file is committed and revealed like any job, its tokens
//! are the model's own (bit-identical to decoding locally, in the arithmetic the task names),
//! concurrent generations are decoded together with the same tokens, and malformed ones are
//! refused. Needs the model in the
//! cache (`tenet models fetch smollm2`); without it the test says it was skipped.

mod common;

use std::collections::BTreeMap;

use tenet_ir::HostTensor;
use tenet_models::fetch::{SMOLLM2, cached, find_file};
use tenet_models::generation::{self, Arithmetic, GenerationParams};
use tenet_models::smollm2::{FinishReason, GGUF_FILE, SmolLm2, WeightsMode};
use tenet_net::NodeClient;
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::RunJob;
use tenet_proto::{ErrorCode, Hash, tensor};

/// A generation job's wire form with `exact` arithmetic: inputs carried inline.
fn job(id: &str, weights: Hash, ids: &[u32], params: &GenerationParams, seed: u64) -> RunJob {
    job_in(Arithmetic::Exact, id, weights, ids, params, seed)
}

/// A generation job's wire form with `arithmetic`.
fn job_in(
    arithmetic: Arithmetic,
    id: &str,
    weights: Hash,
    ids: &[u32],
    params: &GenerationParams,
    seed: u64,
) -> RunJob {
    let mut inputs = BTreeMap::new();
    let mut blobs = BTreeMap::new();
    for (name, t) in generation::inputs(ids, params) {
        let blob = tensor::encode(&t);
        let hash = tenet_net::digest::hash(&blob);
        inputs.insert(name, hash);
        blobs.insert(hash, tenet_proto::to_hex(&blob));
    }
    RunJob {
        job: JobSpec {
            job_id: id.into(),
            task: Hash(arithmetic.task_id()),
            weights: Some(weights),
            inputs,
            tier: Tier::Exact,
            seed,
        },
        timeout_ms: Some(600_000),
        blobs,
        pulls: Default::default(),
        stage: None,
    }
}

/// Run `job` on the node: commit, reveal, check that the reveal opens the commitment, and
/// give the tokens and finish reason.
async fn generate(client: &NodeClient, job: &RunJob) -> (Vec<u32>, FinishReason) {
    let committed = client.run_job(job).await.expect("committed");
    let revealed = client.reveal(&job.job.job_id).await.expect("revealed");
    assert!(
        revealed.reveal.opens(&committed.commitment),
        "the reveal opens the commitment"
    );
    let outputs: Vec<(String, HostTensor)> = revealed
        .reveal
        .outputs
        .iter()
        .map(|o| {
            let hex = &revealed.blobs[&o.hash];
            let t = tensor::decode(&tenet_proto::from_hex(hex).unwrap()).unwrap();
            (o.name.clone(), t)
        })
        .collect();
    generation::parse_outputs(&outputs).expect("a generation's outputs")
}

#[test]
fn a_node_generates_the_models_tokens_as_committed_jobs() {
    let Ok(dir) = cached(&SMOLLM2) else {
        eprintln!("SKIPPED: smollm2 is not in the model cache; run `tenet models fetch smollm2`");
        return;
    };
    let gguf = find_file(&dir, GGUF_FILE).unwrap();
    // The expected tokens, decoded locally with f32 weights: the node's quantised weights
    // give the same bits.
    let local = SmolLm2::load_with(&gguf, WeightsMode::F32).unwrap();
    let cpu = tenet_cpu::CpuDevice::auto();
    let prompts = ["The capital of France is", "1, 2, 3,"];
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| local.encode(p).unwrap()).collect();
    let want: Vec<Vec<u32>> = ids
        .iter()
        .map(|i| local.generate(i, 3, None, &cpu, |_| {}).unwrap())
        .collect();
    let sampling = tenet_models::smollm2::Sampling {
        seed: 5,
        temperature: 0.9,
        top_p: 0.9,
    };
    let want_sampled = local
        .generate(&ids[0], 3, Some(sampling), &cpu, |_| {})
        .unwrap();
    let want5 = local.generate(&ids[0], 5, None, &cpu, |_| {}).unwrap();
    // The `q8` task's tokens are those of the model loaded in `q8` (about the prompt below,
    // they part from the exact ones at the sixth token).
    let local_q8 = SmolLm2::load_with(&gguf, WeightsMode::Q8).unwrap();
    let want_q8 = local_q8.generate(&ids[0], 7, None, &cpu, |_| {}).unwrap();
    let want_exact7 = local.generate(&ids[0], 7, None, &cpu, |_| {}).unwrap();
    assert_ne!(
        want_q8, want_exact7,
        "the prompt tells the arithmetics apart"
    );
    drop(local_q8);

    let data = tempfile::tempdir().unwrap();
    let node = common::open_node(data.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let client = common::serve(node).await;
        let stored = client
            .upload_blob(std::fs::read(&gguf).unwrap())
            .await
            .unwrap();
        let weights = stored.hash;
        let greedy = |max_tokens| GenerationParams {
            max_tokens,
            first_step: 0,
            sampling: None,
            stop: vec![],
        };

        // Two generations at once: decoded together, each with its own tokens.
        let (a, b) = (
            job("gen-a", weights, &ids[0], &greedy(3), 0),
            job("gen-b", weights, &ids[1], &greedy(3), 0),
        );
        let (ga, gb) = tokio::join!(generate(&client, &a), generate(&client, &b));
        assert_eq!(ga, (want[0].clone(), FinishReason::Length));
        assert_eq!(gb, (want[1].clone(), FinishReason::Length));

        // The same prompt as a `q8` job and an `exact` one at once: each its arithmetic's
        // tokens (the node keeps one model per file and arithmetic).
        let (q, e) = (
            job_in(Arithmetic::Q8, "gen-q8", weights, &ids[0], &greedy(7), 0),
            job("gen-e7", weights, &ids[0], &greedy(7), 0),
        );
        let (gq, ge) = tokio::join!(generate(&client, &q), generate(&client, &e));
        assert_eq!(gq.0, want_q8);
        assert_eq!(ge.0, want_exact7);

        // Sampling is the seeded sampler's: the job's seed, the params' temperature and top_p.
        let sampled = GenerationParams {
            sampling: Some((0.9, 0.9)),
            ..greedy(3)
        };
        let got = generate(&client, &job("gen-s", weights, &ids[0], &sampled, 5)).await;
        assert_eq!(got.0, want_sampled);

        // A continuation from the first token, at step 1, gives the rest of the same tokens.
        let rest = GenerationParams {
            first_step: 1,
            ..greedy(2)
        };
        let prefix = [ids[0].clone(), vec![want[0][0]]].concat();
        let got = generate(&client, &job("gen-c", weights, &prefix, &rest, 0)).await;
        assert_eq!(got.0, want[0][1..]);

        // Continuing the first generation's tokens (as a streamed completion's next chunk
        // does) takes up its finished session and gives the same tokens as one generation.
        let next = GenerationParams {
            first_step: 3,
            ..greedy(2)
        };
        let prefix = [ids[0].clone(), want5[..3].to_vec()].concat();
        let got = generate(&client, &job("gen-r", weights, &prefix, &next, 0)).await;
        assert_eq!(got.0, want5[3..]);

        // A stop token ends it, and is its last token.
        let stop = GenerationParams {
            stop: vec![want[0][1]],
            ..greedy(3)
        };
        let got = generate(&client, &job("gen-t", weights, &ids[0], &stop, 0)).await;
        assert_eq!(got, (want[0][..2].to_vec(), FinishReason::Stop));

        // Malformed generations are refused before anything runs.
        let mut bad = job("gen-bad", weights, &ids[0], &greedy(3), 0);
        let huge = HostTensor::from_i64(&[4], &[1 << 40, 0, 0, 0]).unwrap();
        let blob = tensor::encode(&huge);
        let hash = tenet_net::digest::hash(&blob);
        bad.job.inputs.insert("params".into(), hash);
        bad.blobs.insert(hash, tenet_proto::to_hex(&blob));
        let err = client.run_job(&bad).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::BadInputs), "{err}");
        assert!(err.to_string().contains("max_tokens"), "{err}");
        let missing = job("gen-missing", Hash([7; 32]), &ids[0], &greedy(3), 0);
        let err = client.run_job(&missing).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
    });
}
