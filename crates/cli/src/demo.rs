//! `tenet demo`: tenet's main job, end to end on this machine.
//!
//! Builds the example MLP with the Rust builder and checks its files (binary, text, weights)
//! read back to the same graph; then starts a local network on 127.0.0.1 — a coordinator with a
//! SQLite ledger in a temporary directory and five nodes, one of them told to lie — deploys the
//! MLP over the REST API, calls it until the liar has been caught, checks every receipt and the
//! result against a local run, prints what happened, and shuts the network down.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tenet_coordinator::CoordinatorConfig;
use tenet_ir::{HostTensor, codec, text};
use tenet_local::{LocalNetwork, LocalOptions};
use tenet_models::{WeightsFile, check_bindings, examples};
use tenet_net::Method;
use tenet_proto::api;
use tenet_proto::commit::Tier;

use crate::coord_cmd::{Client, not_an_answer};
use crate::report;

const STAKE: i64 = 1000;
const CHEAT: &str = "flip";

/// What `tenet demo` does beyond its run.
#[derive(Clone, Copy, Debug, Default)]
pub struct DemoOptions {
    pub as_json: bool,
    /// Keep the network running afterwards, its dashboard's views public, calling the MLP every
    /// couple of seconds, until Ctrl-C.
    pub dashboard: bool,
}

/// The demo's input to the MLP, and the answer this machine computes by itself (what every
/// verified result must equal).
pub(crate) fn input_and_local_answer(
    graph: &tenet_ir::Graph,
    weights: &WeightsFile,
) -> Result<(HostTensor, Vec<(String, HostTensor)>)> {
    let (_, _, x_ty) = graph.inputs().next().context("the MLP has an input")?;
    let n = x_ty.numel().unwrap_or(0) as usize;
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x = HostTensor::from_f32(&x_ty.shape, &xs)?;
    let local = tenet_devices::open("cpu", &Default::default())?
        .compile(graph)?
        .run(
            &HashMap::from([("x".to_string(), x.clone())]),
            &tenet_models::WeightSet(vec![weights.clone()]),
            0,
        )?;
    Ok((x, local))
}

pub fn run(dir: &Path, options: DemoOptions) -> Result<()> {
    let as_json = options.as_json;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (graph, weights) = examples::mlp()?;
    let (tnt, tg, st) = (
        dir.join("mlp.tnt"),
        dir.join("mlp.tg"),
        dir.join("mlp.safetensors"),
    );
    crate::write_atomically(&tnt, &graph.to_bytes())?;
    crate::write_atomically(&tg, text::print(&graph).as_bytes())?;
    crate::write_atomically(&st, &weights)?;
    let from_binary = codec::decode(&std::fs::read(&tnt)?)?;
    let from_text = text::parse(&std::fs::read_to_string(&tg)?)?;
    ensure!(
        from_binary.id() == graph.id(),
        "binary form changed the graph id"
    );
    ensure!(
        from_text.id() == graph.id(),
        "text form changed the graph id"
    );
    ensure!(
        from_binary.to_bytes() == graph.to_bytes(),
        "binary form is not canonical"
    );
    let file = WeightsFile::open(&st)?;
    check_bindings(&from_binary, std::slice::from_ref(&file))?;
    if !as_json {
        println!("tenet demo: a 2-layer MLP built with the Rust builder");
        println!(
            "  wrote {} (graph {}), {} and {} (weights {}); all read back the same\n",
            tnt.display(),
            graph.id().short(),
            tg.display(),
            st.display(),
            file.id.short()
        );
    }

    let (x, local) = input_and_local_answer(&graph, &file)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let net_dir = dir.join("network");
    let _ = std::fs::remove_dir_all(&net_dir);
    let events = dir.join("events");
    let _ = std::fs::remove_dir_all(&events);
    runtime.block_on(async {
        let cheats = [None, None, None, None, Some(CHEAT)];
        let local_options = LocalOptions {
            event_logs: Some(events.clone()),
            public_reads: options.dashboard,
            ..LocalOptions::default()
        };
        let net = LocalNetwork::start_with(
            &net_dir,
            &cheats,
            STAKE,
            CoordinatorConfig::default(),
            None,
            &local_options,
        )
        .await?;
        let mut result = drive(&net, &graph, &weights, &x, &local, dir, options).await;
        if let (Ok(call), true) = (&result, options.dashboard) {
            result = keep_serving(&net, call).await;
        }
        net.shutdown().await;
        if result.is_ok() && !as_json {
            println!(
                "event logs in {}: draw them with `tenet timeline {}/*.jsonl -o timeline.png`",
                events.display(),
                events.display()
            );
        }
        result.map(|_| ())
    })
}

/// How the demo calls the MLP: the task's run path and the request body.
struct Call {
    path: String,
    body: Vec<u8>,
}

/// `--dashboard`: the network stays up, its dashboard's views public, and the MLP is called
/// every two seconds so that jobs keep appearing, until Ctrl-C.
async fn keep_serving(net: &LocalNetwork, call: &Call) -> Result<Call> {
    let client = Client::with_api_key(&net.coordinator_url, &net.api_key)?;
    let stop = tenet_net::serve::shutdown_signal();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                if let Err(e) = client
                    .call(Method::POST, &call.path, call.body.clone(), "application/json")
                    .await
                {
                    eprintln!("tenet demo: a call failed: {e:#}");
                }
            }
        }
    }
    Ok(Call {
        path: call.path.clone(),
        body: call.body.clone(),
    })
}

async fn drive(
    net: &LocalNetwork,
    graph: &tenet_ir::Graph,
    weights: &[u8],
    x: &HostTensor,
    local: &[(String, HostTensor)],
    dir: &Path,
    options: DemoOptions,
) -> Result<Call> {
    let as_json = options.as_json;
    let say = |s: String| {
        if !as_json {
            println!("{s}");
        }
    };
    say(format!(
        "started on 127.0.0.1: coordinator {} (key {}, SQLite ledger), {} nodes with stake {STAKE} each; node {} is told to lie (--cheat {CHEAT})",
        net.coordinator_url,
        &net.coordinator_key.public().to_hex()[..12],
        net.nodes.len(),
        &net.nodes[4].1[..12],
    ));
    let client = Client::with_api_key(&net.coordinator_url, &net.api_key)?;
    let task = client
        .deploy(
            graph,
            Some(&("mlp.safetensors".to_string(), weights.to_vec())),
        )
        .await?
        .task;
    let task_id = task.id.to_hex();
    say(format!(
        "deployed task {} → {}",
        &task_id[..12],
        task.endpoint
    ));

    let body = api::to_vec(&api::RunRequest {
        inputs: serde_json::from_str(&tenet_models::outputs_json(&[("x".to_string(), x.clone())]))?,
        tier: Some(Tier::Exact),
        seed: None,
    })?;
    let expected: api::JsonTensors = serde_json::from_str(&tenet_models::outputs_json(local))?;
    let coordinator = net.coordinator_key.public();
    let cheater = net.nodes[4].1.clone();
    let mut jobs = 0;
    let mut verified = true;
    let mut caught = false;
    let mut last = None;
    let mut first_catch: Option<api::RunAnswer> = None;
    while jobs < 3 || (!caught && jobs < 20) {
        let r = client
            .call(
                Method::POST,
                &format!("/v1/tasks/{task_id}/run"),
                body.clone(),
                "application/json",
            )
            .await?;
        jobs += 1;
        let r: api::RunAnswer =
            api::from_value(&r).with_context(|| not_an_answer("a call's answer"))?;
        let receipt = &r.receipt;
        let ok = receipt.verify_from(&coordinator).is_ok() && r.outputs == expected;
        verified &= ok;
        let slashed: Vec<&str> = r.slashed.iter().map(|s| s.node.as_str()).collect();
        let nodes: Vec<String> = receipt
            .nodes
            .iter()
            .map(|a| a.commitment.node.to_hex()[..12].to_string())
            .collect();
        say(format!(
            "call {jobs}: job {} agreed by {} [{}]{}; receipt {}",
            &r.job_id[..12],
            receipt.nodes.len(),
            nodes.join(", "),
            if slashed.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} disagreed → slashed",
                    slashed
                        .iter()
                        .map(|s| &s[..12])
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            if ok { "verified" } else { "DID NOT VERIFY" },
        ));
        let catches = slashed.contains(&cheater.as_str());
        if catches && first_catch.is_none() {
            first_catch = Some(r.clone());
        }
        caught |= catches;
        last = Some(r);
    }
    let shown = first_catch
        .as_ref()
        .or(last.as_ref())
        .context("the MLP was never called")?;
    let receipt_path = dir.join("receipt.json");
    // Through a `Value`, keys sorted: the file reads as it always has.
    crate::write_atomically(
        &receipt_path,
        serde_json::to_string_pretty(&api::to_value(&shown.receipt)?)?.as_bytes(),
    )?;
    let nodes = client
        .call(Method::GET, "/v1/nodes", Vec::new(), "application/json")
        .await?;
    let nodes: Vec<api::Node> =
        api::from_value(&nodes).with_context(|| not_an_answer("a list of nodes"))?;
    let node_list: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({"id": n.id, "url": n.url, "stake": n.stake, "agreed": n.agreed,
                   "disagreed": n.disagreed, "cheating": n.id == cheater})
        })
        .collect();
    let cheater_row = node_list
        .iter()
        .find(|n| n["cheating"] == true)
        .cloned()
        .unwrap_or(Value::Null);
    let dashboard = format!("{}/", net.coordinator_url);
    if as_json {
        let mut v = json!({
            "verified": verified,
            "cheaters_caught": if caught { 1 } else { 0 },
            "jobs": jobs,
            "task": task_id,
            "coordinator": coordinator.to_hex(),
            "receipt": receipt_path,
            "outputs": shown.outputs,
            "nodes": node_list,
            "graph": report::json(graph, true),
            "event_logs": dir.join("events"),
        });
        if options.dashboard {
            v["dashboard"] = json!(dashboard);
            v["api_key"] = json!(net.api_key);
            v["cheater"] = json!(cheater);
        }
        println!("{v}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    } else {
        println!("\nverified result (identical to this machine's own run):");
        for (name, t) in local {
            let v = t.to_f32_vec();
            println!(
                "  {name} {}: [{:.6}, {:.6}, {:.6}, …]",
                t.ty(),
                v[0],
                v[1],
                v[2]
            );
        }
        println!(
            "receipt: {} (check it offline: tenet receipt verify {} --coordinator {})",
            receipt_path.display(),
            receipt_path.display(),
            coordinator
        );
        println!(
            "cheater {}: {} — disagreed {} time(s), stake {} → {}",
            &cheater[..12],
            if caught {
                "CAUGHT and slashed"
            } else {
                "never picked"
            },
            cheater_row["disagreed"],
            STAKE,
            cheater_row["stake"]
        );
        if options.dashboard {
            println!("{jobs} calls, all receipts verified: {verified}");
            println!(
                "\ndashboard  {dashboard}   (views public on this loopback network; API key {} for calls)",
                net.api_key
            );
            println!("the demo keeps calling the MLP every 2 s; Ctrl-C stops the network");
            use std::io::Write;
            let _ = std::io::stdout().flush();
        } else {
            println!("{jobs} calls, all receipts verified: {verified}; network shut down");
        }
    }
    ensure!(verified, "a receipt or a result did not verify");
    Ok(Call {
        path: format!("/v1/tasks/{task_id}/run"),
        body,
    })
}
