//! `tenet demo`: tenet's main job as far as it exists today, end to end on this machine.
//!
//! Builds the example MLP with the Rust builder, writes the graph (binary and text) and its
//! weights to a fresh directory, reads them back as a stranger's files would be read, checks that
//! every form names the same graph id and that the weight references bind, and prints the
//! graph's interface and cost certificate. Later milestones extend this to running the graph on a
//! local network of nodes with a verified receipt.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use tenet_ir::{codec, text};
use tenet_models::{WeightsFile, check_bindings, examples};

use crate::report;

pub fn run(dir: &Path, as_json: bool) -> Result<()> {
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

    if as_json {
        let summary = json!({
            "verified": true,
            "id": graph.id().to_hex(),
            "weights_id": file.id.to_hex(),
            "files": [tnt, tg, st],
            "graph": report::json(&from_binary, true),
        });
        println!("{summary}");
    } else {
        println!("tenet demo: a 2-layer MLP built with the Rust builder\n");
        println!(
            "wrote {}  (canonical binary, {} bytes)",
            tnt.display(),
            graph.to_bytes().len()
        );
        println!("wrote {}  (text form, for review)", tg.display());
        println!("wrote {}  (weights, id {})", st.display(), file.id.short());
        println!(
            "read back: binary and text both name graph {}; weights bind\n",
            graph.id().short()
        );
        print!("{}", report::human(&from_binary, true));
        println!("\nnext: tenet inspect {} --text", tnt.display());
    }
    Ok(())
}
