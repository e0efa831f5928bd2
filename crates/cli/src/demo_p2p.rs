//! `tenet demo --p2p`: tenet with no coordinator, end to end on this machine. Starts a
//! peer-to-peer network on 127.0.0.1 — three validators, five hosters of the example MLP (one
//! told to lie), a client — with short epochs; the client calls the MLP through the DHT,
//! checking each receipt and each result against this machine's own run, until two epochs
//! have been settled; by then the validators have scored the liar down and the client passes
//! it over. Ends with one summary (`--json`: one object).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;
use tenet_models::examples;
use tenet_p2p::call::{CallSpec, drop_bad, find};
use tenet_p2p::host::TaskFiles;
use tenet_p2p::local::{LocalPeers, LocalPeersOptions};
use tenet_p2p::validator::last_settled;
use tenet_proto::Hash;

/// How long one epoch of the demo's network lasts.
const EPOCH_MS: u64 = 3_000;

pub fn run(dir: &Path, as_json: bool) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (graph, weights) = examples::mlp()?;
    let (tnt, st) = (dir.join("mlp.tnt"), dir.join("mlp.safetensors"));
    crate::write_atomically(&tnt, &graph.to_bytes())?;
    crate::write_atomically(&st, &weights)?;
    let file = tenet_models::WeightsFile::open(&st)?;
    let (x, local) = crate::demo::input_and_local_answer(&graph, &file)?;
    let say = |s: String| {
        if !as_json {
            println!("{s}");
        }
    };
    let net_dir = dir.join("p2p");
    let _ = std::fs::remove_dir_all(&net_dir);
    let events = dir.join("p2p-events");
    let _ = std::fs::remove_dir_all(&events);
    std::fs::create_dir_all(&events)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let options = LocalPeersOptions {
            validators: 3,
            lying_validators: Vec::new(),
            hosters: 5,
            lying_hosters: vec![4],
            cheat: "flip".into(),
            tasks: vec![TaskFiles {
                graph: tnt.clone(),
                weights: Some(st.clone()),
                name: Some("mlp".into()),
            }],
            epoch_ms: EPOCH_MS,
            genesis_in_ms: 2_000,
            transport: tenet_p2p::Transport::Tcp,
            event_logs: Some(events.clone()),
        };
        say(format!(
            "tenet demo --p2p: 3 validators and 5 hosters of the example MLP (one lying) on 127.0.0.1, epochs of {:.1} s, no coordinator",
            EPOCH_MS as f64 / 1e3
        ));
        let peers = LocalPeers::start(&net_dir, &options).await?;
        let liar = peers.lying_hosters[0];
        say(format!(
            "  bootstrap {}; the lying hoster is {liar}",
            peers.bootstrap.first().map(|a| a.to_string()).unwrap_or_default()
        ));
        let key = tenet_net::identity::generate();
        let client = peers.client(key.clone()).await?;
        let task = Hash(graph.id().0);
        let started = Instant::now();
        let mut jobs = 0u32;
        let mut verified = true;
        let mut passed_over: Vec<String> = Vec::new();
        let mut receipt_written = false;
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut seen_epochs = 0;
        while peers.settled_epochs().len() < 2 {
            ensure!(
                Instant::now() < deadline,
                "two epochs were not settled within 90 s"
            );
            let mut found = find(&client, task, None, 5, Duration::from_secs(10)).await?;
            let dropped = drop_bad(&client, &peers.spec, &mut found).await;
            for d in &dropped {
                if !passed_over.contains(&d.to_string()) {
                    say(format!("  the client passes over {d}: in bad standing"));
                    passed_over.push(d.to_string());
                }
            }
            let replicas = found.hosters.len().min(5);
            let outcome = tenet_p2p::call::call(
                &client,
                &key,
                &found,
                CallSpec {
                    inputs: vec![("x".into(), x.clone())],
                    replicas,
                    seed: 0,
                    timeout: Duration::from_secs(30),
                    tier: tenet_proto::commit::Tier::Exact,
                    tolerance: 0.0,
                },
            )
            .await?;
            jobs += 1;
            let ok = outcome.receipt.verify().is_ok()
                && outcome.receipt.verify_from(&key.public()).is_ok()
                && outcome.outputs == local;
            verified &= ok;
            let dissent: Vec<String> = outcome
                .dissenters()
                .map(|p| p.peer[p.peer.len().saturating_sub(8)..].to_string())
                .collect();
            let epoch = peers.spec.epoch_at(tenet_p2p::swarm::now_ms());
            say(format!(
                "  job {jobs} (epoch {}): agreed by {} of {replicas}{}; receipt {}",
                epoch.map_or("-".into(), |e| e.to_string()),
                outcome.receipt.nodes.len(),
                if dissent.is_empty() {
                    String::new()
                } else {
                    format!(", outvoted …{}", dissent.join(", …"))
                },
                if ok { "verified" } else { "DID NOT VERIFY" }
            ));
            if !receipt_written {
                crate::write_atomically(
                    &dir.join("p2p-receipt.json"),
                    serde_json::to_string_pretty(&outcome.receipt)?.as_bytes(),
                )?;
                receipt_written = true;
            }
            let settled = peers.settled_epochs();
            if settled.len() > seen_epochs {
                seen_epochs = settled.len();
                if let Some(s) = last_settled(&client, &peers.spec).await {
                    let bad: Vec<String> = s
                        .standings
                        .iter()
                        .filter(|x| x.decided && !x.good)
                        .map(|x| x.peer.clone())
                        .collect();
                    say(format!(
                        "  epoch {} settled by {} validator(s): {} hoster(s) in good standing, bad: [{}]",
                        s.epoch,
                        s.counted.len(),
                        s.standings.iter().filter(|x| x.good).count(),
                        bad.join(", ")
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let settled = last_settled(&client, &peers.spec)
            .await
            .context("no epoch has settled")?;
        let caught = peers
            .lying_hosters
            .iter()
            .filter(|l| settled.is_bad(l))
            .count();
        let epochs = peers.settled_epochs();
        if as_json {
            let v = json!({
                "verified": verified,
                "cheaters_caught": caught,
                "jobs": jobs,
                "epochs": epochs.len(),
                "coordinator": null,
                "peers": {"validators": peers.validators.len(), "hosters": peers.hosters.len(),
                          "clients": 1},
                "liar": liar.to_string(),
                "passed_over": passed_over,
                "standings": settled,
                "task": task,
                "receipt": dir.join("p2p-receipt.json"),
                "event_logs": events,
                "seconds": started.elapsed().as_secs_f64(),
            });
            println!("{v}");
        } else {
            println!(
                "{jobs} jobs, all receipts verified: {verified}; {} epoch(s) settled; cheaters caught: {caught}; no coordinator",
                epochs.len()
            );
            println!(
                "event logs in {} (records, gossip, challenges, settlements)",
                events.display()
            );
        }
        ensure!(verified, "a receipt or a result did not verify");
        ensure!(caught == peers.lying_hosters.len(), "the lying hoster was not caught");
        Ok(())
    })
}
