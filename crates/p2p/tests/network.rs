//! Several peers in one process over libp2p's in-memory transport: hosters announce a task on
//! the DHT, a caller with no coordinator finds them, runs a job on them, and verifies it — a
//! lying hoster is outvoted and named; records that are not what they claim are refused.

use std::collections::HashMap;
use std::time::Duration;

use tenet_ir::{DType, Graph, GraphBuilder, HostTensor};
use tenet_node::NodeConfig;
use tenet_p2p::advert::{Advert, Hosted, peer_key};
use tenet_p2p::call::{CallSpec, find};
use tenet_p2p::host::{HostConfig, Hoster, TaskFiles};
use tenet_p2p::{Multiaddr, Network};
use tenet_proto::Hash;

mod common;
use common::{config, tensor_of};

/// y = tanh(x @ w) + b.
fn graph() -> Graph {
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4, 8]);
    let w = g.input("w", DType::F32, &[8, 3]);
    let b = g.input("b", DType::F32, &[3]);
    let y = x.matmul(&w).tanh().add(&b);
    g.finish(&[("y", &y)]).unwrap()
}

async fn hoster(
    dir: &std::path::Path,
    i: usize,
    graph: &std::path::Path,
    bootstrap: &[Multiaddr],
    cheat: Option<&str>,
) -> Hoster {
    let node = NodeConfig {
        data_dir: dir.join(format!("peer{i}")),
        cheat: cheat.map(str::to_string),
        busy_poll_us: 0,
        durable: false,
        ..NodeConfig::default()
    };
    Hoster::start(HostConfig {
        node,
        net: config(bootstrap),
        tasks: vec![TaskFiles {
            graph: graph.to_path_buf(),
            weights: None,
            name: Some("tanh".into()),
        }],
        gossip_every: Duration::from_secs(30),
        validator: None,
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_verified_by_hosters_found_on_the_dht_and_a_liar_is_outvoted() {
    let dir = tempfile::tempdir().unwrap();
    let g = graph();
    let path = dir.path().join("tanh.tnt");
    std::fs::write(&path, g.to_bytes()).unwrap();
    let task = Hash(g.id().0);

    let first = hoster(dir.path(), 0, &path, &[], None).await;
    let boot = first.net.listen_addrs().await.unwrap();
    assert_eq!(first.hosted[0].task, task);
    let mut hosters = vec![first];
    for i in 1..4 {
        let cheat = (i == 3).then_some("flip");
        hosters.push(hoster(dir.path(), i, &path, &boot, cheat).await);
    }
    let liar = hosters[3].net.peer_id();

    let key = tenet_net::identity::generate();
    let mut c = config(&boot);
    c.listen.clear();
    let net = Network::start(c, None).await.unwrap();
    let found = find(&net, task, None, 4, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(
        found.hosters.len(),
        4,
        "every hoster is found through the DHT"
    );
    let fetched = tenet_p2p::call::graph(&net, &key, &found).await.unwrap();
    assert_eq!(fetched.id(), g.id());

    let inputs: HashMap<String, HostTensor> = [
        ("x".to_string(), tensor_of(&[4, 8], 1)),
        ("w".to_string(), tensor_of(&[8, 3], 2)),
        ("b".to_string(), tensor_of(&[3], 3)),
    ]
    .into();
    let outcome = tenet_p2p::call::call(
        &net,
        &key,
        &found,
        CallSpec {
            inputs: inputs.clone().into_iter().collect(),
            replicas: 4,
            seed: 0,
            timeout: Duration::from_secs(60),
            tier: tenet_proto::commit::Tier::Exact,
            tolerance: 0.0,
        },
    )
    .await
    .unwrap();
    // The agreed result is the reference interpreter's, bit for bit.
    let expected = tenet_reference::run(&g, &inputs, &tenet_ir::NoWeights, 0).unwrap();
    assert_eq!(outcome.outputs.len(), 1);
    assert_eq!(outcome.outputs[0].1.bytes(), expected[0].1.bytes());
    // Three honest hosters agreed and signed; the liar committed to something else.
    outcome.receipt.verify().unwrap();
    assert_eq!(outcome.receipt.nodes.len(), 3);
    assert_eq!(
        outcome.receipt.coordinator,
        key.public(),
        "issued by the caller"
    );
    let dissent: Vec<&str> = outcome.dissenters().map(|p| p.peer.as_str()).collect();
    assert_eq!(dissent, vec![liar.to_string().as_str()]);
    for a in &outcome.receipt.nodes {
        assert_ne!(tenet_p2p::keys::peer_id(&a.commitment.node), Some(liar));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_signed_by_someone_else_are_refused_and_counted() {
    let a = Network::start(config(&[]), None).await.unwrap();
    let boot = a.listen_addrs().await.unwrap();
    let b = Network::start(config(&boot), None).await.unwrap();
    let mallory = tenet_net::identity::generate();
    let victim = tenet_net::identity::generate();
    let victim_peer = tenet_p2p::keys::peer_id(&victim.public()).unwrap();
    // Mallory signs an advert and files it under the victim's key.
    let forged = Advert::sign(
        &mallory,
        vec![],
        vec![Hosted {
            task: Hash::of(b"t"),
            weights: None,
            name: "x".into(),
        }],
        "cpu".into(),
        0,
        0.0,
        tenet_proto::unix_now(),
    );
    let mut record = forged.record().unwrap();
    record.key = peer_key(&victim_peer);
    record.publisher = None;
    // Wait until b knows a, then put: a refuses to store it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = b.put_record(record).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a
        .stats
        .refused_records
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the forged record was not refused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.adverts(&victim_peer).await.unwrap().is_empty());
    // An honest advert is stored and found.
    let honest = Advert::sign(
        &victim,
        vec![],
        vec![],
        "cpu".into(),
        0,
        0.0,
        tenet_proto::unix_now(),
    );
    let _ = b.put_record(honest.record().unwrap()).await;
    let got = a.adverts(&victim_peer).await.unwrap();
    assert_eq!(got.len(), 1);
}
