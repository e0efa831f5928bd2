//! The dashboard's in-browser receipt check (`src/dashboard/verify.js`) run under node.js
//! against receipts signed here by the Rust code, served as the API serves them: its BLAKE3
//! against the Rust one on inputs around every chunk and block boundary, and its verdicts —
//! receipts with and without a dispute, a seed past 2^53, input names in byte order — passing,
//! and every signed field altered failing. Skipped, saying so, where node.js is missing, unless
//! `TENET_REQUIRE_CHROMIUM=1` (CI installs it with Chromium for the browser tests).

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{Value, json};
use tenet_proto::Hash;
use tenet_proto::auth::KeyPair;
use tenet_proto::commit::{
    Commitment, JobSpec, OutputRef, Sig, Tier, commitment_digest, output_hash,
};
use tenet_proto::receipt::{Attestation, Receipt};
use tenet_proto::trace::{Bisection, Step, TraceTree, Transcript, Verdict};

fn key(b: u8) -> KeyPair {
    KeyPair::from_seed([b; 32])
}

fn h(s: &str) -> Hash {
    Hash::of(s.as_bytes())
}

fn receipt(dispute: Option<Transcript>, agreeing: usize) -> Receipt {
    let mut inputs = BTreeMap::new();
    for name in ["x", "X2", "é", "a b"] {
        inputs.insert(name.to_string(), h(name));
    }
    let job = JobSpec {
        job_id: "job-7".into(),
        task: h("task"),
        weights: Some(h("weights")),
        inputs,
        tier: Tier::Exact,
        seed: (1u64 << 63) + 5,
    };
    let outputs = vec![
        OutputRef {
            name: "y".into(),
            hash: h("y"),
            ty: "f32[2,3]".into(),
        },
        OutputRef {
            name: "logits".into(),
            hash: h("logits"),
            ty: "f32[10]".into(),
        },
    ];
    let out = output_hash(&outputs);
    let nodes = (0..agreeing)
        .map(|i| {
            let salt = h(&format!("salt{i}"));
            let c = Commitment::sign(job.clone(), &key(10 + i as u8), &out, &salt);
            assert_eq!(c.commitment, commitment_digest(&out, &salt));
            Attestation {
                commitment: c,
                output_hash: out,
                salt,
            }
        })
        .collect();
    Receipt {
        version: 1,
        job,
        outputs,
        output_hash: out,
        replicas: 3,
        tolerance: 0.0,
        nodes,
        coordinator: key(1).public(),
        issued_at: 1_795_000_000,
        dispute,
        signature: Sig([0; 64]),
    }
    .sign(&key(1))
}

/// A real walk between two traces of 37 nodes that differ from node 21 on: found and refereed
/// (party 1 wrong), or with party 1 stalling after the first round.
fn transcript(stalled: bool) -> Transcript {
    let a: Vec<Hash> = (0..37).map(|i| h(&format!("v{i}"))).collect();
    let mut b = a.clone();
    for v in &mut b[21..] {
        *v = h(&format!("{v:?}'"));
    }
    let (ta, tb) = (TraceTree::new(a), TraceTree::new(b));
    let roots = [ta.root(), tb.root()];
    let mut walk = Bisection::new(37, roots);
    let mut t = Transcript {
        count: 37,
        roots,
        rounds: Vec::new(),
        leaf: None,
        operands: Vec::new(),
        operands_from: 0,
        bad_operands: Vec::new(),
        referee: None,
        verdict: Verdict::Lost(vec![1]),
        stalled: None,
        committed: None,
        outputs: Vec::new(),
    };
    loop {
        match walk.next() {
            Step::Ask { depth, index } => {
                if stalled && !walk.rounds().is_empty() {
                    t.stalled = Some(1);
                    break;
                }
                walk.answer([
                    ta.children(depth, index).unwrap(),
                    tb.children(depth, index).unwrap(),
                ]);
            }
            Step::Found { leaf, hashes } => {
                t.leaf = Some(leaf);
                t.operands = vec![ta.proof(leaf - 1).unwrap()];
                t.referee = Some(hashes[0]);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    t.rounds = walk.rounds().to_vec();
    t
}

/// Equal traces, different results: the outputs each side committed to decide (party 1
/// reported something other than its trace's outputs, which are the receipt's `y`, `logits`).
fn agreeing_transcript() -> Transcript {
    let mut leaves: Vec<Hash> = (0..37).map(|i| h(&format!("v{i}"))).collect();
    leaves[35] = h("y");
    leaves[36] = h("logits");
    let tree = TraceTree::new(leaves);
    Transcript {
        count: 37,
        roots: [tree.root(), tree.root()],
        rounds: Vec::new(),
        leaf: None,
        operands: Vec::new(),
        operands_from: 0,
        bad_operands: Vec::new(),
        referee: None,
        verdict: Verdict::Lost(vec![1]),
        stalled: None,
        committed: Some([vec![h("y"), h("logits")], vec![h("y"), h("flipped")]]),
        outputs: vec![tree.proof(35).unwrap(), tree.proof(36).unwrap()],
    }
}

/// As `GET /v1/jobs/{id}` serves a receipt: through a `serde_json::Value`.
fn served(r: &Receipt) -> String {
    serde_json::to_value(r).unwrap().to_string()
}

#[test]
fn the_browser_check_agrees_with_the_rust_one() {
    let node = ["node", "nodejs"].iter().find(|n| {
        Command::new(n)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(node) = node else {
        assert!(
            std::env::var("TENET_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "TENET_REQUIRE_CHROMIUM=1 but node.js is not installed"
        );
        eprintln!("SKIPPED: node.js is not installed");
        return;
    };
    let coordinator = key(1).public().to_hex();
    let plain = receipt(None, 2);
    let disputed = receipt(Some(transcript(false)), 1);
    let stalled = receipt(Some(transcript(true)), 2);
    let bound = receipt(Some(agreeing_transcript()), 2);
    for r in [&plain, &disputed, &stalled, &bound] {
        r.verify_from(&key(1).public())
            .expect("the Rust check passes");
    }
    let mut cases: Vec<(String, String, bool)> = vec![
        ("plain".into(), served(&plain), true),
        ("disputed".into(), served(&disputed), true),
        ("stalled".into(), served(&stalled), true),
        ("bound by outputs".into(), served(&bound), true),
    ];
    // Every signed field altered, in the served JSON.
    let alter = |name: &str, r: &Receipt, f: &dyn Fn(&mut Value)| {
        let mut v = serde_json::to_value(r).unwrap();
        f(&mut v);
        (name.to_string(), v.to_string(), false)
    };
    cases.push(alter("seed", &plain, &|v| {
        v["job"]["seed"] = json!((1u64 << 63) + 6)
    }));
    cases.push(alter("input", &plain, &|v| {
        v["job"]["inputs"]["é"] = json!(h("other").to_hex())
    }));
    cases.push(alter("output type", &plain, &|v| {
        v["outputs"][1]["type"] = json!("f32[11]")
    }));
    cases.push(alter("tolerance", &plain, &|v| v["tolerance"] = json!(0.5)));
    cases.push(alter("issued", &plain, &|v| {
        v["issued_at"] = json!(1_795_000_001u64)
    }));
    cases.push(alter("node order", &plain, &|v| {
        v["nodes"].as_array_mut().unwrap().swap(0, 1)
    }));
    cases.push(alter("salt", &plain, &|v| {
        v["nodes"][0]["salt"] = json!(h("salt9").to_hex())
    }));
    cases.push(alter("dispute referee", &disputed, &|v| {
        v["dispute"]["referee"] = json!(h("other").to_hex())
    }));
    cases.push(alter("dispute verdict", &disputed, &|v| {
        v["dispute"]["verdict"] = json!({"Lost": [0]})
    }));
    cases.push(alter("stall", &stalled, &|v| {
        v["dispute"]["stalled"] = json!(0)
    }));
    cases.push(alter("committed", &bound, &|v| {
        v["dispute"]["committed"][1][1] = json!(h("other").to_hex())
    }));
    cases.push(alter("output proof", &bound, &|v| {
        v["dispute"]["outputs"][0]["leaf"] = json!(h("z").to_hex())
    }));
    // A receipt no majority backs, honestly signed: the count check refuses it.
    cases.push(("minority".into(), served(&receipt(None, 1)), false));

    // BLAKE3 around every chunk (1024) and block (64) boundary.
    let lengths = [
        0usize, 1, 63, 64, 65, 127, 128, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 4096, 5121,
        8193, 16385, 31745,
    ];
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    let hashes: Vec<Value> = lengths
        .iter()
        .map(|&n| json!([n, Hash::of(&data[..n]).to_hex()]))
        .collect();

    let dir = std::env::temp_dir().join(format!("tenet-verify-js-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("cases.json");
    std::fs::write(
        &input,
        json!({"coordinator": coordinator, "cases": cases.iter().map(|(n, t, _)| json!([n, t])).collect::<Vec<_>>(), "hashes": hashes}).to_string(),
    )
    .unwrap();
    let script = r#"
        // node.js before 19 keeps WebCrypto out of the globals.
        globalThis.crypto ??= require("node:crypto").webcrypto;
        const V = require(process.argv[1]);
        const input = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
        (async () => {
          const out = { hashes: [], cases: [] };
          const data = Uint8Array.from({ length: 40000 }, (_, i) => i % 251);
          for (const [n, want] of input.hashes) out.hashes.push([n, V.toHex(V.blake3(data.subarray(0, n))) === want]);
          for (const [name, text] of input.cases) {
            const r = await V.verifyReceipt(V.parse(text), input.coordinator);
            out.cases.push([name, r.ok, r.checks.filter((c) => !c.ok).map((c) => c.what)]);
          }
          console.log(JSON.stringify(out));
        })();
    "#;
    let verify_js = concat!(env!("CARGO_MANIFEST_DIR"), "/src/dashboard/verify.js");
    let run = Command::new(node)
        .args(["-e", script, verify_js])
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let out: Value = serde_json::from_slice(&run.stdout).unwrap();
    for h in out["hashes"].as_array().unwrap() {
        assert_eq!(h[1], true, "BLAKE3 of {} bytes differs from Rust's", h[0]);
    }
    for (case, (name, _, want)) in out["cases"].as_array().unwrap().iter().zip(&cases) {
        assert_eq!(case[0], json!(name));
        assert_eq!(case[1], json!(want), "{name}: {case}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
