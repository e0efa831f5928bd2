//! Rendering a graph summary for `tenet inspect`: for people, and as JSON.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Value, json};
use tenet_ir::{Graph, Op, TensorType};

fn op_histogram(graph: &Graph) -> BTreeMap<&'static str, u64> {
    let mut h = BTreeMap::new();
    for n in graph.nodes() {
        *h.entry(n.op.name()).or_insert(0) += 1;
    }
    h
}

fn ty_json(ty: &TensorType) -> Value {
    json!({ "dtype": ty.dtype.name(), "shape": ty.shape, "bytes": ty.bytes() })
}

/// The `--json` summary: one object with `id`, `inputs`, `outputs`, `weights`, `ops`, `cost`.
pub fn json(graph: &Graph, weights_checked: bool) -> Value {
    let with_name = |name: &str, ty: &TensorType| {
        let mut v = ty_json(ty);
        v["name"] = json!(name);
        v
    };
    let inputs: Vec<Value> = graph.inputs().map(|(_, n, t)| with_name(n, t)).collect();
    let outputs: Vec<Value> = graph
        .outputs()
        .iter()
        .map(|o| with_name(&o.name, &graph.node(o.node).ty))
        .collect();
    let weights: Vec<Value> = graph
        .weights()
        .filter_map(|(_, op, ty)| match op {
            Op::Weight { file, tensor } => {
                let mut v = with_name(tensor, ty);
                v["file"] = json!(file.to_hex());
                Some(v)
            }
            _ => None,
        })
        .collect();
    let c = graph.cost();
    json!({
        "id": graph.id().to_hex(),
        "short_id": graph.id().short(),
        "nodes": graph.nodes().len(),
        "inputs": inputs,
        "outputs": outputs,
        "weights": weights,
        "weights_checked": weights_checked,
        "ops": op_histogram(graph),
        "cost": {
            "flops": c.flops,
            "peak_bytes": c.peak_bytes,
            "bytes_read": c.bytes_read,
            "bytes_written": c.bytes_written,
            "weight_bytes": c.weight_bytes,
            "input_bytes": c.input_bytes,
            "output_bytes": c.output_bytes,
            "constant_bytes": c.constant_bytes,
        },
    })
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn flops(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} FLOP")
    } else {
        format!("{v:.2} {}FLOP", UNITS[u])
    }
}

/// The human summary.
pub fn human(graph: &Graph, weights_checked: bool) -> String {
    let mut s = String::new();
    let id = graph.id();
    let _ = writeln!(s, "graph {}  ({} nodes)", id.short(), graph.nodes().len());
    let _ = writeln!(s, "id    {id}");
    let _ = writeln!(s, "\ninputs:");
    for (_, name, ty) in graph.inputs() {
        let _ = writeln!(
            s,
            "  {name:<24} {ty:<24} {}",
            bytes(ty.bytes().unwrap_or(0))
        );
    }
    let _ = writeln!(s, "outputs:");
    for o in graph.outputs() {
        let ty = &graph.node(o.node).ty;
        let _ = writeln!(
            s,
            "  {:<24} {ty:<24} {}",
            o.name,
            bytes(ty.bytes().unwrap_or(0))
        );
    }
    let weights: Vec<_> = graph.weights().collect();
    if weights.is_empty() {
        let _ = writeln!(s, "weights: none");
    } else {
        let status = if weights_checked {
            "checked against the given files"
        } else {
            "not checked (pass --weights FILE)"
        };
        let _ = writeln!(s, "weights: {status}");
        for (_, op, ty) in weights {
            if let Op::Weight { file, tensor } = op {
                let _ = writeln!(s, "  {tensor:<24} {ty:<24} file {}", file.short());
            }
        }
    }
    let _ = writeln!(s, "ops:");
    for (name, count) in op_histogram(graph) {
        let _ = writeln!(s, "  {name:<24} {count}");
    }
    let c = graph.cost();
    let _ = writeln!(s, "cost certificate:");
    let rows = [
        ("flops", flops(c.flops)),
        ("peak memory", bytes(c.peak_bytes)),
        ("bytes read", bytes(c.bytes_read)),
        ("bytes written", bytes(c.bytes_written)),
        ("weights", bytes(c.weight_bytes)),
        ("inputs", bytes(c.input_bytes)),
        ("outputs", bytes(c.output_bytes)),
        ("constants", bytes(c.constant_bytes)),
    ];
    for (k, v) in rows {
        let _ = writeln!(s, "  {k:<24} {v}");
    }
    s
}

/// `tenet economics` as text.
pub fn economics(
    p: &tenet_coordinator::economics::Params,
    v: &tenet_coordinator::economics::Verdict,
) -> String {
    let mut out = format!(
        "spot-check economics: stake {} payment {} cost {} α {} collusion β {} catch γ {} ε {}\n",
        p.stake, p.payment, p.cost, p.alpha, p.collusion, p.catch, p.epsilon
    );
    out += &format!(
        "  expected value per job, honest:    {:>12.6}\n",
        v.ev_honest
    );
    out += &format!(
        "  expected value per job, dishonest: {:>12.6}\n",
        v.ev_dishonest
    );
    out += &format!(
        "  at α = {}: {}\n",
        p.alpha,
        if v.honest_dominant {
            "honesty dominates"
        } else {
            "CHEATING PAYS MORE"
        }
    );
    out += &match v.min_alpha {
        Some(a) if a > 0.0 => format!(
            "  smallest α keeping honesty dominant: {a:.6} (check about 1 job in {:.0})\n",
            (1.0 / a).floor()
        ),
        Some(_) => "  smallest α keeping honesty dominant: 0 (cheating saves nothing)\n".to_string(),
        None => "  no α ≤ 1 keeps honesty dominant: raise the stake, lower collusion, or raise the catch rate\n"
            .to_string(),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(12 << 20), "12.0 MiB");
        assert_eq!(flops(2_147_483_648), "2.15 GFLOP");
        assert_eq!(flops(7), "7 FLOP");
    }
}
