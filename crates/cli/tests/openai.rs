//! The OpenAI-compatible API through OpenAI's own Python client (tests/openai/client.py):
//! a coordinator and three nodes on 127.0.0.1, one of them lying, SmolLM2 deployed with
//! `tenet deploy --model smollm2` (and again with `--arithmetic q8` under another name);
//! chat completions streamed and not, one in `q8`, a completion with a stop string, seeded
//! sampling, and malformed requests. The text is the model's own (its
//! greedy tokens decoded locally), the receipt verifies offline against the coordinator's key,
//! and the liar is slashed.
//!
//! Needs the model in the cache and a Python with the `openai` package
//! (`TENET_OPENAI_PYTHON`, else `python3`); without them the test says it was skipped, unless
//! `TENET_REQUIRE_OPENAI=1` (set by `.ci/run`, which installs the client).

use std::process::Command;

mod common;

use common::{spawn_node, spawn_tenet, tenet, url_of};

fn python() -> Option<String> {
    let python = std::env::var("TENET_OPENAI_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    let required = std::env::var("TENET_REQUIRE_OPENAI").is_ok_and(|v| v == "1");
    assert!(
        ok || !required,
        "TENET_REQUIRE_OPENAI=1 but {python} cannot import openai"
    );
    if !ok {
        eprintln!(
            "SKIPPED: {python} cannot import openai (pip install openai, or set TENET_OPENAI_PYTHON)"
        );
    }
    ok.then_some(python)
}

fn get_json(url: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-s", url])
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn the_openai_client_gets_verified_completions_and_the_liar_is_slashed() {
    use tenet_models::fetch::{SMOLLM2, cached, find_file};
    use tenet_models::smollm2::{GGUF_FILE, SmolLm2, WeightsMode};
    let Ok(dir) = cached(&SMOLLM2) else {
        eprintln!("SKIPPED: smollm2 is not in the model cache; run `tenet models fetch smollm2`");
        return;
    };
    let Some(python) = python() else { return };
    // What the model says, decoded here: the chat template and greedy tokens.
    let model =
        SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Quantized).unwrap();
    let prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let cpu = tenet_devices::CpuDevice::auto();
    let want = model
        .generate(&model.encode(prompt).unwrap(), 16, None, &cpu, |_| {})
        .unwrap();
    let want_text = model
        .decode(&want.iter().copied().filter(|&t| t != 2).collect::<Vec<_>>())
        .unwrap();
    // And in `q8` arithmetic, which the same file deployed with `--arithmetic q8` serves.
    let q8 = SmolLm2::load_with(&find_file(&dir, GGUF_FILE).unwrap(), WeightsMode::Q8).unwrap();
    let want_q8 = q8
        .generate(&q8.encode(prompt).unwrap(), 16, None, &cpu, |_| {})
        .unwrap();
    assert_ne!(want_q8, want, "the prompt tells the arithmetics apart");

    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("coordinator");
    let (_coordinator, line) = spawn_tenet([
        "coordinator",
        "--open",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let url = url_of(&line);
    let key = line.split_whitespace().nth(2).unwrap().to_string();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let dir = tmp.path().join(format!("node{i}"));
        let mut extra = vec!["--coordinator", &url, "--stake", "1000"];
        if i == 1 {
            extra.extend(["--cheat", "flip"]);
        }
        nodes.push(spawn_node(dir.to_str().unwrap(), &key, &extra));
    }
    // SmolLM2 as `smollm2` (exact) and as `smollm2-q8`; each deploy's answer as JSON.
    let deploy = |extra: &[&str]| -> serde_json::Value {
        let mut c = tenet();
        c.args([
            "deploy",
            "--model",
            "smollm2",
            "--coordinator",
            &url,
            "--json",
        ])
        .args(extra);
        common::json_of(c, "")
    };
    let exact = deploy(&[]);
    assert_eq!(exact["arithmetic"], "exact", "{exact}");
    let d = deploy(&["--arithmetic", "q8", "--name", "smollm2-q8"]);
    let q8_task = tenet_proto::Hash(tenet_models::generation::Arithmetic::Q8.task_id());
    assert_eq!(d["arithmetic"], "q8", "{d}");
    assert_eq!(d["task"], q8_task.to_hex(), "{d}");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai/client.py");
    let mut client = Command::new(&python);
    client.args([script, &url, "smollm2-q8"]);
    let v = common::json_of(client, "client.py failed: ");
    assert_eq!(v["models"], serde_json::json!(["smollm2", "smollm2-q8"]));

    // Not streamed: the model's own tokens and text.
    let chat = &v["chat"];
    let tokens: Vec<u32> = serde_json::from_value(chat["tokens"].clone()).unwrap();
    assert_eq!(tokens, want);
    assert_eq!(chat["content"], want_text);
    assert_eq!(chat["usage"][1], want.len());
    let finish = if want.contains(&2) { "stop" } else { "length" };
    assert_eq!(chat["finish_reason"], finish);

    // Streamed in verified chunks: the same text, and its last job's receipt.
    assert_eq!(v["stream"]["content"], want_text);
    assert_eq!(v["stream"]["finish_reason"], finish);
    assert!(!v["stream"]["jobs"].as_array().unwrap().is_empty());

    // The `q8` deployment: that arithmetic's tokens, under a receipt naming its task.
    let q8_chat = &v["q8_chat"];
    let tokens: Vec<u32> = serde_json::from_value(q8_chat["tokens"].clone()).unwrap();
    assert_eq!(tokens, want_q8);
    assert_eq!(q8_chat["receipt"]["job"]["task"], q8_task.to_hex());
    let exact_task = tenet_proto::Hash(tenet_models::generation::Arithmetic::Exact.task_id());
    assert_eq!(v["chat"]["receipt"]["job"]["task"], exact_task.to_hex());

    // Every receipt verifies offline against the coordinator's key.
    for which in ["chat", "stream", "q8_chat"] {
        let path = tmp.path().join(format!("{which}-receipt.json"));
        std::fs::write(&path, v[which]["receipt"].to_string()).unwrap();
        let check = tenet()
            .args([
                "receipt",
                "verify",
                path.to_str().unwrap(),
                "--coordinator",
                &key,
            ])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{which}: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }

    // Seeded sampling is reproducible.
    assert_eq!(v["sampled"][0], v["sampled"][1]);
    // A stop string ends the text before it.
    let text = v["completion"]["text"].as_str().unwrap();
    assert!(!text.contains('7'), "{text:?}");
    assert_eq!(v["completion"]["finish_reason"], "stop");

    // Malformed requests: OpenAI-shaped errors with 4xx statuses.
    let e = &v["errors"];
    assert_eq!(e["unknown_model"]["status"], 404);
    assert_eq!(e["unknown_model"]["code"], "model_not_found");
    assert_eq!(e["absurd_max_tokens"]["status"], 400);
    assert_eq!(e["past_the_context"]["status"], 400);
    assert_eq!(e["past_the_context"]["code"], "context_length_exceeded");
    assert_eq!(e["no_messages"]["status"], 400);

    // The liar disagreed on every job and lost stake; the others agreed.
    let nodes_now = get_json(&format!("{url}/v1/nodes"));
    let liar_url = &nodes[1].1;
    for n in nodes_now.as_array().unwrap() {
        let lied = n["url"].as_str() == Some(liar_url.as_str());
        if lied {
            assert_eq!(n["agreed"], 0, "{n}");
            assert!(n["disagreed"].as_i64().unwrap() >= 4, "{n}");
            assert!(n["stake"].as_i64().unwrap() < 1000, "{n}");
        } else {
            assert_eq!(n["disagreed"], 0, "{n}");
        }
    }
}
