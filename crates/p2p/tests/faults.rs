//! Faults and hostile peers, over libp2p's in-memory transport: a third of the hosters killed
//! mid-epoch while jobs run loses no job, and the epoch still settles; the tolerant tier decided by the caller outvotes a noisy
//! hoster; a peer flooding another with requests is held to its share and counted; a network
//! split in two (each side blocking the other's peers) keeps working on each side and, once
//! healed, its DHT answers across the old split.

use std::time::{Duration, Instant};

use tenet_node::NodeConfig;
use tenet_p2p::advert::task_key;
use tenet_p2p::call::{CallSpec, find};
use tenet_p2p::host::{HostConfig, Hoster, TaskFiles};
use tenet_p2p::{Multiaddr, Network, Transport};
use tenet_proto::Hash;
use tenet_proto::commit::Tier;

mod common;
use common::{config, graph, inputs};

async fn hoster(
    dir: &std::path::Path,
    name: &str,
    graph: &std::path::Path,
    bootstrap: &[Multiaddr],
    cheat: Option<&str>,
) -> Hoster {
    Hoster::start(HostConfig {
        node: NodeConfig {
            data_dir: dir.join(name),
            cheat: cheat.map(str::to_string),
            busy_poll_us: 0,
            durable: false,
            ..NodeConfig::default()
        },
        net: config(bootstrap),
        tasks: vec![TaskFiles {
            graph: graph.to_path_buf(),
            weights: None,
            name: None,
        }],
        gossip_every: Duration::from_secs(30),
        validator: None,
    })
    .await
    .unwrap()
}

async fn setup(n: usize, cheat: Option<(usize, &str)>) -> (tempfile::TempDir, Hash, Vec<Hoster>) {
    let dir = tempfile::tempdir().unwrap();
    let g = graph();
    let path = dir.path().join("g.tnt");
    std::fs::write(&path, g.to_bytes()).unwrap();
    let first = hoster(dir.path(), "h0", &path, &[], None).await;
    let boot = first.net.listen_addrs().await.unwrap();
    let mut hosters = vec![first];
    for i in 1..n {
        let c = cheat.filter(|(at, _)| *at == i).map(|(_, how)| how);
        hosters.push(hoster(dir.path(), &format!("h{i}"), &path, &boot, c).await);
    }
    (dir, Hash(g.id().0), hosters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_third_of_the_hosters_mid_epoch_loses_no_job() {
    // Three validators and nine hosters with epochs running; a third of the hosters killed in
    // the middle of epoch 0's commit phase while a client's jobs keep going.
    let dir = tempfile::tempdir().unwrap();
    let g = graph();
    let path = dir.path().join("g.tnt");
    std::fs::write(&path, g.to_bytes()).unwrap();
    let mut peers = tenet_p2p::local::LocalPeers::start(
        dir.path(),
        &tenet_p2p::local::LocalPeersOptions {
            validators: 3,
            lying_validators: Vec::new(),
            hosters: 9,
            lying_hosters: Vec::new(),
            cheat: String::new(),
            tasks: vec![TaskFiles {
                graph: path,
                weights: None,
                name: None,
            }],
            epoch_ms: 4_000,
            genesis_in_ms: 3_000,
            transport: Transport::Memory,
            event_logs: None,
        },
    )
    .await
    .unwrap();
    let key = tenet_net::identity::generate();
    let client = peers.client(key.clone()).await.unwrap();
    let task = Hash(g.id().0);
    let found = find(&client, task, None, 9, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(found.hosters.len(), 9);
    // The client keeps the hosters it found before the kill (their records outlive them), so
    // jobs are sent to dead hosters and must be carried by the others.
    let killed_flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let jobs = {
        let (client, key, found) = (client.clone(), key.clone(), found.clone());
        let killed = killed_flag.clone();
        tokio::spawn(async move {
            let mut done = Vec::new();
            let mut after = 0;
            // Jobs until four have started after the kill (at most 300).
            for j in 0..300u32 {
                if killed.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                    if after > 4 {
                        break;
                    }
                }
                let spec = CallSpec::exact(inputs(j), 3, Duration::from_secs(10));
                done.push(tenet_p2p::call::call(&client, &key, &found, spec).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            done
        })
    };
    // Into epoch 0's commit phase, while the validators challenge.
    let spec = peers.spec.clone();
    let at = spec.start_ms(0) + spec.epoch_ms / 4;
    let wait = at.saturating_sub(tenet_p2p::swarm::now_ms());
    tokio::time::sleep(Duration::from_millis(wait)).await;
    assert!(
        spec.phase_at(tenet_p2p::swarm::now_ms()).is_some(),
        "an epoch is under way"
    );
    // The killed ones are the first chosen for every job, so replacements are needed.
    let killed: Vec<_> = found.hosters[..3].iter().map(|h| h.peer).collect();
    peers.hosters.retain(|h| !killed.contains(&h.net.peer_id()));
    assert_eq!(peers.hosters.len(), 6);
    killed_flag.store(true, std::sync::atomic::Ordering::SeqCst);
    let jobs = jobs.await.unwrap();
    assert!(jobs.len() >= 5 && jobs.len() < 300, "{}", jobs.len());
    for (j, r) in jobs.iter().enumerate() {
        let o = r
            .as_ref()
            .unwrap_or_else(|e| panic!("job {j} was lost: {e}"));
        o.receipt.verify().unwrap();
        assert_eq!(o.receipt.nodes.len(), 3, "job {j}");
    }
    // After the kill, a job that found dead hosters shows them failed and replaced.
    let last = jobs.last().unwrap().as_ref().unwrap();
    let failed: Vec<_> = last
        .parts
        .iter()
        .filter(|p| p.verdict == "failed")
        .map(|p| p.peer.clone())
        .collect();
    assert!(
        failed
            .iter()
            .all(|p| killed.iter().any(|k| k.to_string() == *p)),
        "{failed:?}"
    );
    assert!(!failed.is_empty(), "the dead hosters were asked first");
    // The epoch still settles, and every surviving hoster is in good standing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !peers.settled_epochs().contains(&0) {
        assert!(Instant::now() < deadline, "epoch 0 did not settle");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settled = tenet_p2p::validator::last_settled(&client, &spec)
        .await
        .unwrap();
    for h in &peers.hosters {
        let s = settled.standing(&h.net.peer_id());
        assert!(s.is_some_and(|s| s.good), "{s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tolerant_tier_is_decided_by_the_caller_against_the_median() {
    let (_dir, task, hosters) = setup(4, Some((3, "noise=0.5"))).await;
    let boot = hosters[0].net.listen_addrs().await.unwrap();
    let mut c = config(&boot);
    c.listen.clear();
    let client = Network::start(c, None).await.unwrap();
    let key = tenet_net::identity::generate();
    let found = find(&client, task, None, 4, Duration::from_secs(20))
        .await
        .unwrap();
    let mut spec = CallSpec::exact(inputs(3), 4, Duration::from_secs(20));
    spec.tier = Tier::Tolerant;
    spec.tolerance = 1e-3;
    let outcome = tenet_p2p::call::call(&client, &key, &found, spec)
        .await
        .unwrap();
    outcome.receipt.verify().unwrap();
    assert_eq!(outcome.receipt.job.tier, Tier::Tolerant);
    assert_eq!(outcome.receipt.tolerance, 1e-3);
    assert_eq!(outcome.receipt.nodes.len(), 3);
    let noisy = hosters[3].net.peer_id().to_string();
    for p in &outcome.parts {
        let d = p.distance.unwrap();
        if p.peer == noisy {
            assert_eq!(p.verdict, "dissented");
            assert!(d > 1e-3, "{d}");
        } else {
            assert_eq!(p.verdict, "agreed");
            assert!(d <= 1e-3, "{d}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_peer_is_held_to_its_share_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.tnt");
    std::fs::write(&path, graph().to_bytes()).unwrap();
    let mut net = config(&[]);
    net.per_peer_inflight = 4;
    let hosters = [Hoster::start(HostConfig {
        node: NodeConfig {
            data_dir: dir.path().join("h0"),
            busy_poll_us: 0,
            durable: false,
            ..NodeConfig::default()
        },
        net,
        tasks: vec![TaskFiles {
            graph: path,
            weights: None,
            name: None,
        }],
        gossip_every: Duration::from_secs(30),
        validator: None,
    })
    .await
    .unwrap()];
    let boot = hosters[0].net.listen_addrs().await.unwrap();
    let mut c = config(&boot);
    c.listen.clear();
    let flooder = Network::start(c, None).await.unwrap();
    flooder.dial(boot[0].clone()).await.unwrap();
    let target = hosters[0].net.peer_id();
    // 200 requests at once, each for a blob that does not exist (answered quickly), with no
    // signature: every one is answered, none crashes anything, and those beyond the peer's
    // share in flight are refused as busy and counted.
    let asks = (0..200).map(|i| {
        flooder.request(
            target,
            tenet_p2p::wire::Request {
                method: "GET".into(),
                path: format!("/v1/blobs/{}", Hash::of(&[i as u8; 4])),
                headers: Vec::new(),
                body: tenet_p2p::wire::Blob(Vec::new().into()),
            },
        )
    });
    let answers = futures_util::future::join_all(asks).await;
    let statuses: Vec<u16> = answers
        .iter()
        .map(|a| a.as_ref().map_or(0, |a| a.status))
        .collect();
    assert!(statuses.iter().all(|s| *s >= 400), "{statuses:?}");
    let busy = statuses.iter().filter(|s| **s == 503 || **s == 429).count();
    let stats = &hosters[0].net.stats;
    let limited = stats
        .rate_limited
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(busy as u64, limited, "{statuses:?}");
    assert!(limited > 0, "nothing was held back: {statuses:?}");
    // Every one was counted on arrival.
    assert!(
        stats
            .inbound_requests
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 200
    );
    // The hoster still answers others.
    let status = hosters[0].net.status().await.unwrap();
    assert!(status.rate_limited > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_network_heals_and_its_dht_answers_across_the_old_split() {
    // Six peers; peer 0 bootstraps everyone. Split: {0, 1, 2} and {3, 4, 5}.
    let mut c = config(&[]);
    c.rejoin_every = Duration::from_millis(300);
    let first = Network::start(c, None).await.unwrap();
    let boot = first.listen_addrs().await.unwrap();
    let mut peers = vec![first];
    for _ in 1..6 {
        let mut c = config(&boot);
        c.rejoin_every = Duration::from_millis(300);
        peers.push(Network::start(c, None).await.unwrap());
    }
    // Everyone knows everyone before the split.
    let everyone_connected = |peers: &Vec<Network>| {
        let peers = peers.clone();
        async move {
            for p in &peers {
                if p.status().await.unwrap().routing < 3 {
                    return false;
                }
            }
            true
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !everyone_connected(&peers).await {
        assert!(Instant::now() < deadline, "the network did not form");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<_> = peers.iter().map(|p| p.peer_id()).collect();
    for (i, p) in peers.iter().enumerate() {
        for (j, id) in ids.iter().enumerate() {
            if (i < 3) != (j < 3) {
                p.block(*id).await.unwrap();
            }
        }
    }
    // During the split, a task announced on each side is found on that side only.
    let (left, right) = (Hash::of(b"left"), Hash::of(b"right"));
    peers[1].provide(task_key(&left)).await.unwrap();
    peers[4].provide(task_key(&right)).await.unwrap();
    assert_eq!(
        peers[2].providers(task_key(&left)).await.unwrap(),
        vec![ids[1]]
    );
    assert!(
        peers[5]
            .providers(task_key(&left))
            .await
            .unwrap()
            .is_empty(),
        "the split let a record across"
    );
    for p in &peers {
        let connected = p.status().await.unwrap().connected;
        let me = peers
            .iter()
            .position(|q| q.peer_id() == p.peer_id())
            .unwrap();
        for c in connected {
            let j = ids.iter().position(|id| id.to_string() == c);
            if let Some(j) = j {
                assert_eq!(me < 3, j < 3, "a connection crosses the split");
            }
        }
    }
    // Heal: unblock; the peers rejoin through their bootstrap peer on their own.
    for p in &peers {
        for id in &ids {
            p.unblock(*id).await.unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let across = peers[5].providers(task_key(&left)).await.unwrap();
        let back = peers[2].providers(task_key(&right)).await.unwrap();
        if across == vec![ids[1]] && back == vec![ids[4]] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the DHT did not converge after the heal: {across:?} {back:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_make_a_hoster_fetch_from_its_own_machine() {
    let (_dir, task, hosters) = setup(1, None).await;
    let boot = hosters[0].net.listen_addrs().await.unwrap();
    let mut c = config(&boot);
    c.listen.clear();
    let client = Network::start(c, None).await.unwrap();
    client.dial(boot[0].clone()).await.unwrap();
    let key = tenet_net::identity::generate();
    // A job whose input is to be pulled from a service on the hoster's loopback: an open
    // node of a local network would fetch it; a hoster refuses.
    let hash = Hash::of(b"an input somewhere");
    let job = tenet_proto::commit::JobSpec {
        job_id: "pull-me".into(),
        task,
        weights: None,
        inputs: [("x".to_string(), hash), ("w".to_string(), hash)].into(),
        tier: Tier::Exact,
        seed: 0,
    };
    let run = tenet_proto::wire::RunJob {
        job,
        timeout_ms: Some(5_000),
        blobs: Default::default(),
        pulls: [(
            hash,
            tenet_proto::wire::PullFrom {
                peers: vec!["http://127.0.0.1:5432".into()],
                grant: tenet_proto::grant::PullGrant::sign(hash, tenet_proto::unix_now(), &key),
            },
        )]
        .into(),
        stage: None,
    };
    let node = tenet_p2p::link::P2pLink::client(&client, hosters[0].net.peer_id(), key);
    let err = node.run_job(&run).await.unwrap_err().to_string();
    assert!(err.contains("does not pull from 127.0.0.1:5432"), "{err}");
    assert!(!err.contains("being open"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_floods_are_dropped_and_forged_adverts_refused() {
    let a = Network::start(config(&[]), None).await.unwrap();
    let boot = a.listen_addrs().await.unwrap();
    let key = tenet_net::identity::generate();
    let mut c = config(&boot);
    c.key = key.clone();
    let b = Network::start(c, None).await.unwrap();
    let advert = |k: &tenet_proto::auth::KeyPair, n: u64| {
        tenet_p2p::advert::Advert::sign(
            k,
            Vec::new(),
            Vec::new(),
            format!("flood {n}"),
            0,
            0.0,
            tenet_proto::unix_now(),
        )
    };
    // Wait until b may publish (it knows a subscribes).
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.gossip_advert(&advert(&key, 0)).await.is_err() {
        assert!(Instant::now() < deadline, "no gossip peer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for n in 1..=50 {
        let _ = b.gossip_advert(&advert(&key, n)).await;
    }
    // One signed by a key other than the author's.
    let _ = b
        .gossip_advert(&advert(&tenet_net::identity::generate(), 99))
        .await;
    let stats = &a.stats;
    let load = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(20);
    while load(&stats.gossip_accepted) + load(&stats.gossip_rate_limited) < 51
        || load(&stats.gossip_refused) < 1
    {
        assert!(
            Instant::now() < deadline,
            "the gossip did not arrive: {:?}",
            a.status().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let accepted = load(&stats.gossip_accepted);
    assert!(
        accepted < 10,
        "a burst of 51 adverts from one author was mostly taken: {accepted}"
    );
    assert!(load(&stats.gossip_rate_limited) >= 41);
    assert_eq!(load(&stats.gossip_refused), 1, "the forged advert");
    // What was taken is the author's own advert.
    let known = a.directory();
    assert_eq!(known.len(), 1);
    assert_eq!(known[0].key, key.public());
}
