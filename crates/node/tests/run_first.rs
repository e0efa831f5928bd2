//! A coordinator asks a node to run a job before uploading anything, and uploads only when the
//! node says it lacks a blob: so the node must answer "not found" for a missing task, weights
//! file or input *before* it takes the job's id, and then run the same id once the blob is
//! there. A job it did take keeps its id taken.

mod common;

use std::collections::BTreeMap;

use tenet_ir::{DType, GraphBuilder, HostTensor};
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::RunJob;
use tenet_proto::{ErrorCode, Hash, tensor};

fn job(id: &str, task: Hash, input: Hash, inline: Option<&[u8]>) -> RunJob {
    RunJob {
        job: JobSpec {
            job_id: id.into(),
            task,
            weights: None,
            inputs: BTreeMap::from([("x".to_string(), input)]),
            tier: Tier::Exact,
            seed: 0,
        },
        timeout_ms: Some(60_000),
        blobs: inline
            .map(|b| BTreeMap::from([(input, tenet_proto::to_hex(b))]))
            .unwrap_or_default(),
        pulls: Default::default(),
        stage: None,
    }
}

#[test]
fn a_job_missing_a_blob_is_refused_before_its_id_is_taken() {
    let data = tempfile::tempdir().unwrap();
    let node = common::open_node(data.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let client = common::serve(node).await;

        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, &[3]);
        let y = &x * 2.0;
        let graph = g.finish(&[("y", &y)]).unwrap().to_bytes();
        let task = tenet_net::digest::hash(&graph);
        let input = tensor::encode(&HostTensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap());
        let input_hash = tenet_net::digest::hash(&input);

        // The task is missing: refused as not found, naming it and how to provide it.
        let first = job("job-1", task, input_hash, Some(&input));
        let err = client.run_job(&first).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
        assert!(err.to_string().contains(&format!("task {task}")), "{err}");
        assert!(err.to_string().contains("PUT /v1/blobs"), "{err}");

        // Uploaded: the same id runs.
        client.put_blob(graph).await.unwrap();
        let committed = client.run_job(&first).await.expect("the same id runs");
        assert_eq!(committed.commitment.job, first.job);
        let revealed = client.reveal("job-1").await.unwrap();
        assert!(revealed.reveal.opens(&committed.commitment));

        // An input that is neither inline, nor stored, nor seen before: refused the same way,
        // by its name.
        let input = tensor::encode(&HostTensor::from_f32(&[3], &[4.0, 5.0, 6.0]).unwrap());
        let second = job("job-2", task, tenet_net::digest::hash(&input), None);
        let err = client.run_job(&second).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
        assert!(err.to_string().contains("input x"), "{err}");
        client.put_blob(input).await.unwrap();
        client.run_job(&second).await.expect("runs once uploaded");

        // A job the node took keeps its id: asking again is a conflict, not a second run.
        let err = client.run_job(&second).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    });
}
