//! Regenerate the committed example files: `cargo run -p tenet-models --example write_examples`.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let (graph, weights) = tenet_models::examples::mlp()?;
    std::fs::write(dir.join("mlp.safetensors"), weights)?;
    std::fs::write(dir.join("mlp.tg"), tenet_ir::text::print(&graph))?;
    println!(
        "wrote examples/mlp.tg (graph {}) and examples/mlp.safetensors",
        graph.id().short()
    );
    Ok(())
}
