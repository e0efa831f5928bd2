//! Twelve peers in one process over libp2p's in-memory transport — three validators, eight
//! hosters (one of them lying), one client — and no coordinator: the client's jobs are
//! verified by the hosters it finds on the DHT; within one epoch every honest validator
//! scores the liar down, the validator that reveals scores other than those it committed to
//! is ignored, the liar is slashed in the honest validators' ledgers, and the client stops
//! choosing it. Score records from outside the validator set are refused by the peers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenet_ledger::Ledger;
use tenet_node::NodeConfig;
use tenet_p2p::call::{CallSpec, drop_bad, find};
use tenet_p2p::epoch::{NetworkSpec, ScoreCommit, ScoreRecord};
use tenet_p2p::host::{HostConfig, Hoster, TaskFiles};
use tenet_p2p::validator::{ValidatorOptions, last_settled};
use tenet_p2p::{Config, Multiaddr, Network};
use tenet_proto::Hash;

mod common;
use common::{graph, inputs};

const EPOCH_MS: u64 = 4_000;

fn config(bootstrap: &[Multiaddr], spec: &Arc<NetworkSpec>) -> Config {
    let mut c = common::config(bootstrap);
    c.spec = Some(spec.clone());
    c
}

#[allow(clippy::too_many_arguments)]
async fn peer(
    dir: &std::path::Path,
    name: &str,
    graph: Option<&std::path::Path>,
    bootstrap: &[Multiaddr],
    spec: &Arc<NetworkSpec>,
    cheat: Option<&str>,
    validate: bool,
    cheat_scores: bool,
) -> Hoster {
    let data_dir = dir.join(name);
    let node = NodeConfig {
        data_dir: data_dir.clone(),
        cheat: cheat.map(str::to_string),
        busy_poll_us: 0,
        durable: false,
        ..NodeConfig::default()
    };
    Hoster::start(HostConfig {
        node,
        net: config(bootstrap, spec),
        tasks: graph
            .map(|g| TaskFiles {
                graph: g.to_path_buf(),
                weights: None,
                name: Some("tanh".into()),
            })
            .into_iter()
            .collect(),
        gossip_every: Duration::from_secs(1),
        validator: validate.then(|| ValidatorOptions {
            spec: spec.clone(),
            data_dir,
            cheat_scores,
        }),
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validators_score_a_liar_down_within_an_epoch_and_callers_pass_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let g = graph();
    let path = dir.path().join("tanh.tnt");
    std::fs::write(&path, g.to_bytes()).unwrap();
    let task = Hash(g.id().0);

    // The validators' keys go in the spec before anyone starts.
    let vkeys: Vec<_> = (0..3)
        .map(|i| {
            let d = dir.path().join(format!("validator{i}"));
            std::fs::create_dir_all(&d).unwrap();
            tenet_net::identity::load_or_create(&d).unwrap()
        })
        .collect();
    let genesis = tenet_p2p::swarm::now_ms() + 2_500;
    let spec = Arc::new(NetworkSpec::local(
        "test",
        genesis,
        EPOCH_MS,
        &vkeys.iter().map(|k| k.public()).collect::<Vec<_>>(),
    ));

    let first = peer(
        dir.path(),
        "hoster0",
        Some(&path),
        &[],
        &spec,
        None,
        false,
        false,
    )
    .await;
    let boot = first.net.listen_addrs().await.unwrap();
    let mut hosters = vec![first];
    for i in 1..8 {
        let cheat = (i == 7).then_some("flip");
        let name = format!("hoster{i}");
        hosters.push(
            peer(
                dir.path(),
                &name,
                Some(&path),
                &boot,
                &spec,
                cheat,
                false,
                false,
            )
            .await,
        );
    }
    let liar = hosters[7].net.peer_id();
    let mut validators = Vec::new();
    for i in 0..3 {
        let name = format!("validator{i}");
        // The third validator reveals scores other than those it committed to.
        validators.push(peer(dir.path(), &name, None, &boot, &spec, None, true, i == 2).await);
    }

    let key = tenet_net::identity::generate();
    let mut c = config(&boot, &spec);
    c.listen.clear();
    let client = Network::start(c, None).await.unwrap();
    let found = find(&client, task, None, 8, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(found.hosters.len(), 8);
    let spec_call = |replicas| CallSpec {
        inputs: inputs(7),
        replicas,
        seed: 0,
        timeout: Duration::from_secs(30),
        tier: tenet_proto::commit::Tier::Exact,
        tolerance: 0.0,
    };
    let outcome = tenet_p2p::call::call(&client, &key, &found, spec_call(8))
        .await
        .unwrap();
    assert_eq!(outcome.receipt.nodes.len(), 7, "seven hosters agree");
    let dissent: Vec<_> = outcome.dissenters().map(|p| p.peer.clone()).collect();
    assert_eq!(dissent, vec![liar.to_string()]);

    // Epoch 0 runs and is settled early in epoch 1.
    let deadline = Instant::now() + Duration::from_secs(40);
    let settled_everywhere = || {
        validators[..2].iter().all(|v| {
            let st = v.validator.as_ref().unwrap().state.lock().unwrap();
            st.settled.iter().any(|s| s.epoch == 0)
        })
    };
    while !settled_everywhere() {
        assert!(Instant::now() < deadline, "epoch 0 was not settled in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, v) in validators.iter().enumerate().take(2) {
        let st = v.validator.as_ref().unwrap().state.lock().unwrap().clone();
        let liar_score = st
            .scores
            .iter()
            .find(|s| s.peer == liar.to_string())
            .unwrap_or_else(|| panic!("validator {i} did not score the liar: {:?}", st.scores));
        assert_eq!(liar_score.score, 0.0, "validator {i} scores the liar down");
        assert_eq!(st.scores.len(), 8, "validator {i} scored every hoster");
        assert!(
            st.scores
                .iter()
                .filter(|s| s.peer != liar.to_string())
                .all(|s| s.score == 1.0)
        );
        let settled = st.settled.iter().find(|s| s.epoch == 0).unwrap();
        assert_eq!(settled.counted.len(), 2, "{settled:?}");
        assert_eq!(settled.ignored.len(), 1, "{settled:?}");
        assert_eq!(settled.ignored[0].0, vkeys[2].public());
        assert!(settled.is_bad(&liar));
        for h in &hosters[..7] {
            let s = settled.standing(&h.net.peer_id()).unwrap();
            assert!(s.good, "{s:?}");
        }
        // Slashed in this validator's ledger, with the evidence named.
        let ledger = tenet_ledger::SqlLedger::connect(&format!(
            "sqlite://{}",
            dir.path()
                .join(format!("validator{i}/validator/ledger.db"))
                .display()
        ))
        .await
        .unwrap();
        let liar_key = hosters[7].node.key().public().to_hex();
        let events = ledger.stake_events(&liar_key).await.unwrap();
        let slash = events
            .iter()
            .find(|e| e.job_id.as_deref() == Some("epoch-0") && e.delta < 0)
            .unwrap_or_else(|| panic!("no slash in validator {i}'s ledger: {events:?}"));
        assert!(slash.reason.contains("evidence"));
        let honest = hosters[0].node.key().public().to_hex();
        assert!(
            ledger
                .stake_events(&honest)
                .await
                .unwrap()
                .iter()
                .any(|e| e.job_id.as_deref() == Some("epoch-0") && e.delta > 0)
        );
    }

    // The client reads the same standings from the DHT and passes the liar over.
    let settled = last_settled(&client, &spec).await.unwrap();
    assert_eq!(settled.epoch, 0);
    assert!(settled.is_bad(&liar));
    let mut found = find(&client, task, None, 8, Duration::from_secs(5))
        .await
        .unwrap();
    let dropped = drop_bad(&client, &spec, &mut found).await;
    assert_eq!(dropped, vec![liar]);
    assert_eq!(found.hosters.len(), 7);
    let outcome = tenet_p2p::call::call(&client, &key, &found, spec_call(7))
        .await
        .unwrap();
    assert_eq!(outcome.receipt.nodes.len(), 7);
    assert_eq!(outcome.dissenters().count(), 0);

    // A score record signed by a key outside the validator set is refused by the peers.
    let refused = || -> u64 {
        hosters
            .iter()
            .chain(&validators)
            .map(|h| {
                h.net
                    .stats
                    .refused_records
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    };
    let before = refused();
    let now = tenet_p2p::swarm::now_ms();
    let epoch = spec.epoch_at(now).unwrap();
    let outsider = tenet_net::identity::generate();
    let forged = ScoreRecord::Commit(ScoreCommit::sign(
        &outsider,
        epoch,
        Hash::of(b"x"),
        Hash::of(b"y"),
        now,
    ))
    .record(&spec, now)
    .unwrap();
    let _ = client.put_record(forged).await;
    let mid = refused();
    assert!(
        mid > before,
        "the forged score record was refused and counted"
    );
    // So is one from a real validator out of its phase window: a commitment for an epoch
    // three ahead, signed now.
    let early = ScoreRecord::Commit(ScoreCommit::sign(
        &vkeys[0],
        epoch + 3,
        Hash::of(b"x"),
        Hash::of(b"y"),
        now,
    ))
    .record(&spec, now)
    .unwrap();
    let _ = client.put_record(early).await;
    let after = refused();
    assert!(
        after > mid,
        "the out-of-window score record was refused and counted"
    );
}
