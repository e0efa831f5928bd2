//! The manifest of a split model (`manifest.json`): stages in order, each with its graph's id
//! and file, its weights files, its certificate, the whole graph's inputs and outputs it
//! handles, and the boundary tensors it reads from the stage before and writes for the stage
//! after.
//!
//! It is a file (a split's folder, `tenet-pipeline`) and a wire format (the body of a
//! pipeline's deploy, `POST /v1/pipelines`). A manifest may come from a stranger, so reading
//! one is bounded ([`MAX_MANIFEST_BYTES`], [`MAX_STAGES`]) and [`Manifest::check`] refuses
//! any that does not chain: stage k must read exactly the boundary tensors (names and types)
//! stage k−1 writes, the first reads none and the last writes none, every output of the whole
//! graph comes from exactly one stage, and file names stay inside the folder. Stages are a
//! list run in order, so a cycle cannot be written down; a stage that reads what it writes
//! itself would not chain with the stage before it.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use tenet_ir::{DType, Graph, TensorType, check_name};

/// The `format` of manifests this version writes and reads.
pub const FORMAT: &str = "tenet-split/1";
/// The largest manifest read.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The most stages a split may have.
pub const MAX_STAGES: usize = 64;
/// The most names in any one list of a manifest.
const MAX_NAMES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// The id of the graph that was split.
    pub whole: String,
    /// The whole graph's inputs.
    pub inputs: Vec<Port>,
    /// The whole graph's outputs, each with the (0-based) stage that produces it.
    pub outputs: Vec<Port>,
    pub stages: Vec<StageEntry>,
}

/// A named tensor and its type; `stage` only for the whole graph's outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<usize>,
}

impl Port {
    pub fn new(name: &str, ty: &TensorType) -> Port {
        Port {
            name: name.to_string(),
            dtype: ty.dtype.name().to_string(),
            shape: ty.shape.clone(),
            stage: None,
        }
    }

    /// The port's type, if its dtype is one tenet has.
    pub fn ty(&self) -> Option<TensorType> {
        DType::from_name(&self.dtype).map(|d| TensorType::new(d, self.shape.clone()))
    }

    fn describe(&self) -> String {
        format!("{} {}[{}]", self.name, self.dtype, {
            let s: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
            s.join(",")
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageEntry {
    /// The stage graph's id (hex).
    pub graph: String,
    /// Its binary graph, a file name in the folder.
    pub file: String,
    /// Its weights files.
    pub weights: Vec<WeightsEntry>,
    /// Its certificate's peak bytes and flops.
    pub peak_bytes: u64,
    pub flops: u64,
    /// The whole graph's nodes it computes, `[first, past-last]`.
    pub nodes: [usize; 2],
    /// The whole graph's inputs it reads.
    pub inputs: Vec<String>,
    /// Boundary tensors from the stage before.
    pub boundary_in: Vec<Port>,
    /// Boundary tensors for the stage after.
    pub boundary_out: Vec<Port>,
    /// The whole graph's outputs it produces.
    pub outputs: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsEntry {
    /// The file's blake3 hash (hex), as the stage graph refers to it.
    pub id: String,
    pub file: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("not a split manifest: {0}")]
    Json(String),
    #[error("the manifest is {0} bytes, above the limit of {MAX_MANIFEST_BYTES}")]
    TooLarge(u64),
    #[error("format {0:?} is not {FORMAT:?}")]
    Format(String),
    #[error("{0} stages: a split has 1 to {MAX_STAGES}")]
    StageCount(usize),
    #[error("{what}: {message}")]
    Bad { what: String, message: String },
    #[error(
        "stage {stage} does not chain: it reads {reads} but stage {prev} writes {writes}; a stage reads exactly the boundary tensors of the stage before it"
    )]
    Chain {
        stage: usize,
        prev: usize,
        reads: String,
        writes: String,
    },
    #[error("stage {stage}'s graph does not match the manifest: {message}")]
    Graph { stage: usize, message: String },
}

fn bad(what: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::Bad {
        what: what.into(),
        message: message.into(),
    }
}

/// A 64-digit lowercase hex id.
fn check_hex(what: &str, s: &str) -> Result<(), ManifestError> {
    if s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(bad(
            what,
            format!("{s:?} is not a 64-digit lowercase hex hash"),
        ))
    }
}

/// A plain file name inside the folder: no separators, not `.` or `..`, nothing hidden.
fn check_file(what: &str, s: &str) -> Result<(), ManifestError> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            what,
            format!("file name {s:?} must be a plain name in the split's folder"),
        ))
    }
}

fn check_port(what: &str, p: &Port) -> Result<TensorType, ManifestError> {
    check_name(what, &p.name).map_err(|m| bad(what, m))?;
    if p.shape.len() > 8 {
        return Err(bad(what, format!("{} has rank {}", p.name, p.shape.len())));
    }
    let ty = p
        .ty()
        .ok_or_else(|| bad(what, format!("{}: unknown dtype {:?}", p.name, p.dtype)))?;
    ty.bytes()
        .ok_or_else(|| bad(what, format!("{}: its size overflows", p.name)))?;
    Ok(ty)
}

fn list(ports: &[Port]) -> String {
    if ports.is_empty() {
        return "nothing".into();
    }
    ports
        .iter()
        .map(Port::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Manifest {
    /// Parse and check a manifest.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len() as u64));
        }
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        m.check()?;
        Ok(m)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest serialises")
    }

    /// The structural checks (see the module doc).
    pub fn check(&self) -> Result<(), ManifestError> {
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format.clone()));
        }
        let n = self.stages.len();
        if n == 0 || n > MAX_STAGES {
            return Err(ManifestError::StageCount(n));
        }
        check_hex("whole", &self.whole)?;
        if self.inputs.len() > MAX_NAMES || self.outputs.len() > MAX_NAMES {
            return Err(bad("manifest", "too many inputs or outputs"));
        }
        let mut inputs = HashMap::new();
        for p in &self.inputs {
            let ty = check_port("input", p)?;
            if inputs.insert(p.name.as_str(), ty).is_some() {
                return Err(bad("input", format!("{} appears twice", p.name)));
            }
        }
        let mut produced: HashMap<&str, usize> = HashMap::new();
        let mut files = HashSet::new();
        for (k, s) in self.stages.iter().enumerate() {
            let what = format!("stage {k}");
            check_hex(&what, &s.graph)?;
            check_file(&what, &s.file)?;
            if !files.insert(s.file.as_str()) {
                return Err(bad(&what, format!("file {} is used twice", s.file)));
            }
            if [&s.inputs, &s.outputs].iter().any(|l| l.len() > MAX_NAMES)
                || [&s.boundary_in, &s.boundary_out]
                    .iter()
                    .any(|l| l.len() > MAX_NAMES)
                || s.weights.len() > MAX_NAMES
            {
                return Err(bad(&what, "too many names"));
            }
            for w in &s.weights {
                check_hex(&what, &w.id)?;
                check_file(&what, &w.file)?;
                if !files.insert(w.file.as_str()) {
                    return Err(bad(&what, format!("file {} is used twice", w.file)));
                }
            }
            if s.nodes[0] >= s.nodes[1] {
                return Err(bad(&what, "computes no node of the whole graph"));
            }
            for name in &s.inputs {
                if !inputs.contains_key(name.as_str()) {
                    return Err(bad(
                        &what,
                        format!("reads {name:?}, not an input of the model"),
                    ));
                }
            }
            for p in s.boundary_in.iter().chain(&s.boundary_out) {
                check_port(&what, p)?;
            }
            for name in &s.outputs {
                if produced.insert(name.as_str(), k).is_some() {
                    return Err(bad(&what, format!("output {name:?} is produced twice")));
                }
            }
            let prev_out: &[Port] = if k == 0 {
                &[]
            } else {
                &self.stages[k - 1].boundary_out
            };
            if s.boundary_in != prev_out {
                return Err(ManifestError::Chain {
                    stage: k,
                    prev: k.saturating_sub(1),
                    reads: list(&s.boundary_in),
                    writes: list(prev_out),
                });
            }
        }
        if let Some(last) = self.stages.last().filter(|s| !s.boundary_out.is_empty()) {
            return Err(bad(
                format!("stage {}", n - 1),
                format!(
                    "the last stage writes boundary tensors ({}) that no stage reads",
                    list(&last.boundary_out)
                ),
            ));
        }
        for p in &self.outputs {
            check_port("output", p)?;
            match (produced.remove(p.name.as_str()), p.stage) {
                (Some(k), Some(s)) if k == s => {}
                (Some(k), _) => {
                    return Err(bad(
                        "output",
                        format!("{} is produced by stage {k}, not the stage listed", p.name),
                    ));
                }
                (None, _) => {
                    return Err(bad("output", format!("no stage produces {}", p.name)));
                }
            }
        }
        if let Some((name, k)) = produced.into_iter().next() {
            return Err(bad(
                format!("stage {k}"),
                format!("produces {name:?}, which is not an output of the model"),
            ));
        }
        Ok(())
    }

    /// Check stage `k`'s graph against its entry: its id and certificate, and that its inputs
    /// and outputs are exactly the entry's, with the manifest's types.
    pub fn check_stage(&self, k: usize, graph: &Graph) -> Result<(), ManifestError> {
        let s = self
            .stages
            .get(k)
            .ok_or_else(|| bad(format!("stage {k}"), "the manifest has no such stage"))?;
        let fail = |message: String| ManifestError::Graph { stage: k, message };
        if graph.id().to_string() != s.graph {
            return Err(fail(format!("its id is {}, not {}", graph.id(), s.graph)));
        }
        let cost = graph.cost();
        if cost.peak_bytes != s.peak_bytes || cost.flops != s.flops {
            return Err(fail("its certificate differs from the manifest's".into()));
        }
        let whole_in: HashMap<&str, TensorType> = self
            .inputs
            .iter()
            .filter_map(|p| Some((p.name.as_str(), p.ty()?)))
            .collect();
        let unknown = |what: &str, name: &str| {
            fail(format!(
                "it lists {what} {name:?}, which the manifest does not type"
            ))
        };
        let mut want: HashMap<String, TensorType> = HashMap::new();
        for name in &s.inputs {
            let ty = whole_in
                .get(name.as_str())
                .ok_or_else(|| unknown("input", name))?;
            want.insert(name.clone(), ty.clone());
        }
        for p in &s.boundary_in {
            want.insert(
                p.name.clone(),
                p.ty().ok_or_else(|| unknown("boundary", &p.name))?,
            );
        }
        let got: HashMap<String, TensorType> = graph
            .inputs()
            .map(|(_, n, t)| (n.to_string(), t.clone()))
            .collect();
        if got != want {
            return Err(fail(format!(
                "its inputs are {}, the manifest says {}",
                names(&got),
                names(&want)
            )));
        }
        let whole_out: HashMap<&str, TensorType> = self
            .outputs
            .iter()
            .filter_map(|p| Some((p.name.as_str(), p.ty()?)))
            .collect();
        let mut want: HashMap<String, TensorType> = HashMap::new();
        for name in &s.outputs {
            let ty = whole_out
                .get(name.as_str())
                .ok_or_else(|| unknown("output", name))?;
            want.insert(name.clone(), ty.clone());
        }
        for p in &s.boundary_out {
            want.insert(
                p.name.clone(),
                p.ty().ok_or_else(|| unknown("boundary", &p.name))?,
            );
        }
        let got: HashMap<String, TensorType> = graph
            .outputs()
            .iter()
            .map(|o| (o.name.clone(), graph.node(o.node).ty.clone()))
            .collect();
        if got != want {
            return Err(fail(format!(
                "its outputs are {}, the manifest says {}",
                names(&got),
                names(&want)
            )));
        }
        Ok(())
    }
}

fn names(m: &HashMap<String, TensorType>) -> String {
    let mut v: Vec<String> = m.iter().map(|(n, t)| format!("{n} {t}")).collect();
    v.sort();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
