//! The datasets training reads, from the model cache where `tenet models fetch digits` and
//! `tenet models fetch mnist` put them, already prepared by the fetcher (see
//! `tenet_models::fetch::Prepare`): the digits as a plain CSV, MNIST as raw little-endian arrays
//! with a JSON header — so nothing here decompresses or unpickles. The files are still treated
//! as untrusted bytes: every size is checked against what the dataset must hold before anything
//! is allocated, then every row count, every label (in `0..classes`) and every pixel (finite,
//! in `[0, 1]`); a failure names the file, what was wrong and how to get a good copy.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use tenet_models::fetch::{self, DIGITS, DIGITS_CSV, MNIST, MNIST_HEADER, ModelPackage};

/// The datasets `load` knows, by the names `tenet models fetch` uses.
pub const DATASETS: [&str; 2] = ["digits", "mnist"];

/// A classification dataset held in memory: images as `f32` in `[0, 1]`, sample after sample
/// (each `sample_shape`, row-major), and class labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub name: &'static str,
    /// One sample's shape, channels first: digits `[1, 8, 8]`, MNIST `[1, 28, 28]`.
    pub sample_shape: Vec<u64>,
    pub classes: usize,
    pub train_x: Vec<f32>,
    pub train_y: Vec<i64>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<i64>,
}

impl Dataset {
    pub fn train_len(&self) -> usize {
        self.train_y.len()
    }

    pub fn test_len(&self) -> usize {
        self.test_y.len()
    }

    /// Values per sample (the product of `sample_shape`).
    pub fn sample_len(&self) -> usize {
        self.sample_shape.iter().product::<u64>() as usize
    }
}

/// Passes over the training set when none are asked for: 2 for MNIST, 40 for the digits.
pub fn default_epochs(dataset: &str) -> u32 {
    if dataset == "mnist" { 2 } else { 40 }
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("unknown dataset {0:?} (known: digits, mnist)")]
    Unknown(String),
    /// Not in the cache (the message says which `tenet models fetch` to run).
    #[error(transparent)]
    NotFetched(#[from] fetch::FetchError),
    #[error(
        "cannot read {path}: {source}; run `tenet models fetch {name}` (after deleting {dir} if it is there)"
    )]
    Io {
        name: &'static str,
        path: String,
        dir: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: {reason}; this is not what `tenet models fetch {name}` writes: delete {dir} and fetch {name} again"
    )]
    Malformed {
        name: &'static str,
        path: String,
        dir: String,
        reason: String,
    },
}

/// The dataset `name` (`digits` or `mnist`) from the user's model cache.
pub fn load(name: &str) -> Result<Dataset, DataError> {
    let dir = fetch::cached(&package(name)?)?;
    load_from(name, &dir)
}

/// The dataset `name` from `dir`, a directory `tenet models fetch` prepared.
pub fn load_from(name: &str, dir: &Path) -> Result<Dataset, DataError> {
    match package(name)?.name {
        "digits" => load_digits(dir),
        _ => load_mnist(dir, MNIST_ROWS),
    }
}

fn package(name: &str) -> Result<ModelPackage, DataError> {
    match name {
        "digits" => Ok(DIGITS),
        "mnist" => Ok(MNIST),
        _ => Err(DataError::Unknown(name.to_string())),
    }
}

/// Both datasets are the ten digits.
const CLASSES: usize = 10;

/// sklearn's digits: 1797 images of 8×8 pixels, each 0..=16.
const DIGITS_ROWS: usize = 1797;
const DIGITS_PIXELS: usize = 64;
const DIGITS_MAX: u8 = 16;
/// The fixed split: sample `i` is a test sample when `i % DIGITS_TEST_EVERY ==
/// DIGITS_TEST_AT` (359 of them, every fifth), a training sample otherwise (1438). The file's
/// order cycles roughly through the classes, so the test set holds every class, though not
/// evenly (21 ones, 52 threes).
const DIGITS_TEST_EVERY: usize = 5;
const DIGITS_TEST_AT: usize = 4;
/// The CSV is about 265 KB; anything far larger is not it (checked before reading).
const DIGITS_MAX_BYTES: u64 = 1 << 20;

/// MNIST as the fetcher writes it: `train` (50k) and `valid` (10k) become the training set,
/// `test` (10k) the test set.
const MNIST_ROWS: [(&str, usize); 3] = [("train", 50_000), ("valid", 10_000), ("test", 10_000)];
const MNIST_PIXELS: usize = 28 * 28;
const MNIST_FORMAT: &str = "tenet-mnist-raw-1";
/// The header is under 1 KB.
const MNIST_HEADER_MAX_BYTES: u64 = 64 << 10;

/// Why a file was refused, before the path and dataset are attached.
enum Fault {
    Io(std::io::Error),
    Bad(String),
}

impl From<std::io::Error> for Fault {
    fn from(e: std::io::Error) -> Fault {
        Fault::Io(e)
    }
}

/// Attaches the file and the dataset to a `Fault`.
fn at(name: &'static str, dir: &Path, file: &str) -> impl Fn(Fault) -> DataError {
    let path = dir.join(file).display().to_string();
    let dir = dir.display().to_string();
    move |fault| match fault {
        Fault::Io(source) => DataError::Io {
            name,
            path: path.clone(),
            dir: dir.clone(),
            source,
        },
        Fault::Bad(reason) => DataError::Malformed {
            name,
            path: path.clone(),
            dir: dir.clone(),
            reason,
        },
    }
}

fn load_digits(dir: &Path) -> Result<Dataset, DataError> {
    let err = at("digits", dir, DIGITS_CSV);
    let text = read_text(&dir.join(DIGITS_CSV), DIGITS_MAX_BYTES).map_err(&err)?;
    let (x, y) = parse_digits_csv(&text, DIGITS_ROWS).map_err(|r| err(Fault::Bad(r)))?;
    let (mut train_x, mut train_y, mut test_x, mut test_y) = (
        Vec::with_capacity(x.len()),
        Vec::with_capacity(y.len()),
        Vec::new(),
        Vec::new(),
    );
    for (i, (sample, &label)) in x.chunks_exact(DIGITS_PIXELS).zip(&y).enumerate() {
        if i % DIGITS_TEST_EVERY == DIGITS_TEST_AT {
            test_x.extend_from_slice(sample);
            test_y.push(label);
        } else {
            train_x.extend_from_slice(sample);
            train_y.push(label);
        }
    }
    Ok(Dataset {
        name: "digits",
        sample_shape: vec![1, 8, 8],
        classes: CLASSES,
        train_x,
        train_y,
        test_x,
        test_y,
    })
}

/// A whole file of at most `max` bytes, as UTF-8.
fn read_text(path: &Path, max: u64) -> Result<String, Fault> {
    let len = std::fs::metadata(path)?.len();
    if len > max {
        return Err(Fault::Bad(format!(
            "{len} bytes, more than the {max} it can be"
        )));
    }
    let bytes = std::fs::read(path)?;
    String::from_utf8(bytes).map_err(|_| Fault::Bad("not UTF-8 text".into()))
}

/// Parses exactly `rows` lines of sklearn's digits CSV: 64 pixel values (0..=16, written as
/// plain decimal integers), then the label (0..=9); no header line, `\n` line ends (a `\r`
/// before one is allowed), one final line end optional. Pixels come back scaled by 1/16 into
/// `[0, 1]` (exactly: sixteenths are exact in `f32`).
fn parse_digits_csv(text: &str, rows: usize) -> Result<(Vec<f32>, Vec<i64>), String> {
    let mut x = Vec::with_capacity(rows * DIGITS_PIXELS);
    let mut y = Vec::with_capacity(rows);
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Err(format!("empty; {rows} rows expected"));
    }
    for (i, line) in body.split('\n').enumerate() {
        let n = i + 1;
        if i == rows {
            return Err(format!("more than the {rows} rows expected (line {n})"));
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut fields = 0;
        for (j, field) in line.split(',').enumerate() {
            fields = j + 1;
            if j > DIGITS_PIXELS {
                return Err(format!("line {n}: more than {} fields", DIGITS_PIXELS + 1));
            }
            let value = small_int(field)
                .ok_or_else(|| format!("line {n}, field {fields}: {field:?} is not an integer"))?;
            if j < DIGITS_PIXELS {
                if value > DIGITS_MAX {
                    return Err(format!(
                        "line {n}, field {fields}: pixel {value} is over {DIGITS_MAX}"
                    ));
                }
                x.push(f32::from(value) / f32::from(DIGITS_MAX));
            } else {
                if usize::from(value) >= CLASSES {
                    return Err(format!(
                        "line {n}: label {value} is not a class in 0..{CLASSES}"
                    ));
                }
                y.push(i64::from(value));
            }
        }
        if fields != DIGITS_PIXELS + 1 {
            return Err(format!(
                "line {n}: {fields} fields, {} expected (64 pixels and the label)",
                DIGITS_PIXELS + 1
            ));
        }
    }
    if y.len() != rows {
        return Err(format!("{} rows, {rows} expected", y.len()));
    }
    Ok((x, y))
}

/// A decimal integer of one to three ASCII digits (no sign, no spaces), as `u8`.
fn small_int(field: &str) -> Option<u8> {
    if field.is_empty() || field.len() > 3 || !field.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    field.parse().ok()
}

/// MNIST from `dir`, with `rows` images in each of its three files (`MNIST_ROWS`; the tests use
/// smaller ones).
fn load_mnist(dir: &Path, rows: [(&str, usize); 3]) -> Result<Dataset, DataError> {
    let err = at("mnist", dir, MNIST_HEADER);
    let header = read_text(&dir.join(MNIST_HEADER), MNIST_HEADER_MAX_BYTES).map_err(&err)?;
    check_mnist_header(&header, &rows).map_err(|r| err(Fault::Bad(r)))?;
    let [(train, train_n), (valid, valid_n), (test, test_n)] = rows;
    let mut data = Dataset {
        name: "mnist",
        sample_shape: vec![1, 28, 28],
        classes: CLASSES,
        train_x: Vec::new(),
        train_y: Vec::new(),
        test_x: Vec::new(),
        test_y: Vec::new(),
    };
    // The sizes are known before anything is read: reserve once, then append the splits.
    let reserve = |x: &mut Vec<f32>, y: &mut Vec<i64>, n: usize| -> Result<(), DataError> {
        x.try_reserve_exact(n * MNIST_PIXELS)
            .and_then(|()| y.try_reserve_exact(n))
            .map_err(|e| err(Fault::Bad(format!("cannot allocate {n} images: {e}"))))
    };
    reserve(&mut data.train_x, &mut data.train_y, train_n + valid_n)?;
    reserve(&mut data.test_x, &mut data.test_y, test_n)?;
    read_mnist_split(dir, train, train_n, &mut data.train_x, &mut data.train_y)?;
    read_mnist_split(dir, valid, valid_n, &mut data.train_x, &mut data.train_y)?;
    read_mnist_split(dir, test, test_n, &mut data.test_x, &mut data.test_y)?;
    Ok(data)
}

/// Appends the `n` images and labels of one of MNIST's files to `x` and `y`, checked.
fn read_mnist_split(
    dir: &Path,
    split: &str,
    n: usize,
    x: &mut Vec<f32>,
    y: &mut Vec<i64>,
) -> Result<(), DataError> {
    let file = format!("{split}-images.f32");
    let start = x.len();
    read_raw(&dir.join(&file), n * MNIST_PIXELS, x, f32::from_le_bytes)
        .and_then(|()| check_pixels(&x[start..]))
        .map_err(at("mnist", dir, &file))?;
    let file = format!("{split}-labels.i64");
    let start = y.len();
    read_raw(&dir.join(&file), n, y, i64::from_le_bytes)
        .and_then(|()| check_labels(&y[start..], CLASSES))
        .map_err(at("mnist", dir, &file))
}

/// The header must list exactly the six arrays the fetcher writes, with the row counts this
/// reader expects: it is a check that the directory is what it should be (the file names are
/// fixed here, never taken from it).
fn check_mnist_header(text: &str, rows: &[(&str, usize); 3]) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if v["format"] != MNIST_FORMAT {
        return Err(format!("format {}, {MNIST_FORMAT:?} expected", v["format"]));
    }
    if v["byte_order"] != "little" {
        return Err(format!(
            "byte order {}, \"little\" expected",
            v["byte_order"]
        ));
    }
    let arrays = v["arrays"].as_array().ok_or("no \"arrays\" list")?;
    if arrays.len() != 2 * rows.len() {
        return Err(format!(
            "{} arrays, {} expected",
            arrays.len(),
            2 * rows.len()
        ));
    }
    let expected = rows.iter().flat_map(|&(split, n)| {
        [
            (
                format!("{split}-images"),
                "f32",
                "float32",
                serde_json::json!([n, MNIST_PIXELS]),
            ),
            (
                format!("{split}-labels"),
                "i64",
                "int64",
                serde_json::json!([n]),
            ),
        ]
    });
    for (a, (name, ext, dtype, shape)) in arrays.iter().zip(expected) {
        let file = format!("{name}.{ext}");
        if a["name"] != name.as_str() || a["file"] != file.as_str() {
            return Err(format!(
                "array {} in file {} where {name} in {file} is expected",
                a["name"], a["file"]
            ));
        }
        if a["dtype"] != dtype || a["shape"] != shape {
            return Err(format!(
                "{name} is {} {}, {dtype} {shape} expected",
                a["dtype"], a["shape"]
            ));
        }
    }
    Ok(())
}

/// Appends the `count` little-endian elements of `N` bytes each that `path` holds (exactly
/// that many: its size is checked first) to `out`, decoded by `decode`.
fn read_raw<T, const N: usize>(
    path: &Path,
    count: usize,
    out: &mut Vec<T>,
    decode: fn([u8; N]) -> T,
) -> Result<(), Fault> {
    let expected = count
        .checked_mul(N)
        .ok_or_else(|| Fault::Bad(format!("{count} elements overflow")))?;
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    if len != expected as u64 {
        return Err(Fault::Bad(format!(
            "{len} bytes, {expected} expected ({count} elements of {N} bytes)"
        )));
    }
    out.try_reserve(count)
        .map_err(|e| Fault::Bad(format!("cannot allocate {count} elements: {e}")))?;
    let mut buf = vec![0u8; (1 << 20) / N * N];
    let mut left = expected;
    while left > 0 {
        let take = left.min(buf.len());
        let chunk = &mut buf[..take];
        file.read_exact(chunk)?;
        out.extend(
            chunk
                .chunks_exact(N)
                .map(|b| decode(b.try_into().expect("chunks of N"))),
        );
        left -= chunk.len();
    }
    Ok(())
}

/// Every pixel finite and in `[0, 1]`.
fn check_pixels(x: &[f32]) -> Result<(), Fault> {
    match x
        .iter()
        .position(|v| !(v.is_finite() && (0.0..=1.0).contains(v)))
    {
        Some(i) => Err(Fault::Bad(format!(
            "value {i} is {}, not a pixel in [0, 1]",
            x[i]
        ))),
        None => Ok(()),
    }
}

/// Every label a class in `0..classes`.
fn check_labels(y: &[i64], classes: usize) -> Result<(), Fault> {
    match y.iter().position(|&c| !(0..classes as i64).contains(&c)) {
        Some(i) => Err(Fault::Bad(format!(
            "label {i} is {}, not a class in 0..{classes}",
            y[i]
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A fresh scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("tenet-train-data-{}-{tag}", std::process::id()));
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

    /// A digits CSV line: pixels `p, p+1, ...` (mod 17) and the label.
    fn line(p: usize, label: usize) -> String {
        let mut fields: Vec<String> = (0..64).map(|j| ((p + j) % 17).to_string()).collect();
        fields.push(label.to_string());
        fields.join(",")
    }

    #[test]
    fn digits_csv_parses_and_scales() {
        let text = format!("{}\n{}\r\n{}", line(0, 3), line(5, 9), line(16, 0));
        let (x, y) = parse_digits_csv(&text, 3).unwrap();
        assert_eq!(y, [3, 9, 0]);
        assert_eq!(x.len(), 3 * 64);
        assert_eq!(x[0], 0.0);
        assert_eq!(x[1], 1.0 / 16.0);
        assert_eq!(x[64 + 11], 1.0); // (5 + 11) % 17 = 16
        assert_eq!(x[128], 1.0);
        // A final line end is allowed.
        assert_eq!(parse_digits_csv(&(text + "\n"), 3).unwrap().1, [3, 9, 0]);
    }

    #[test]
    fn malformed_digits_csv_is_refused() {
        let good = line(0, 1);
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "empty"),
            ("\n".into(), "empty"),
            (format!("{good}\n"), "1 rows, 2 expected"),
            (format!("{good}\n{good}\n{good}"), "more than the 2 rows"),
            (format!("{good}\n\n{good}"), "line 2, field 1: \"\""),
            (format!("{good}\n{good},1"), "line 2: more than 65 fields"),
            (format!("{good}\n{}", &good[..good.len() - 2]), "64 fields"),
            (
                format!("{good}\n{}", good.replacen('0', "17", 1)),
                "pixel 17 is over 16",
            ),
            (
                format!("{good}\n{}", good.replacen('0', "-1", 1)),
                "\"-1\" is not an integer",
            ),
            (
                format!("{good}\n{}", good.replacen('0', "0.5", 1)),
                "\"0.5\" is not an integer",
            ),
            (
                format!("{good}\n{}", good.replacen('0', " 0", 1)),
                "\" 0\" is not an integer",
            ),
            (
                format!("{good}\n{}", good.replacen('0', "0000", 1)),
                "\"0000\"",
            ),
            (format!("{good}\n{}0", good), "label 10 is not a class"),
        ];
        for (text, needle) in cases {
            let e = parse_digits_csv(&text, 2).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn digits_split_every_fifth_sample_into_the_test_set() {
        let dir = Scratch::new("digits");
        let text: Vec<String> = (0..DIGITS_ROWS).map(|i| line(i, i % 10)).collect();
        std::fs::write(dir.0.join(DIGITS_CSV), text.join("\n") + "\n").unwrap();
        let d = load_from("digits", &dir.0).unwrap();
        assert_eq!((d.train_len(), d.test_len()), (1438, 359));
        assert_eq!(d.sample_shape, [1, 8, 8]);
        assert_eq!(d.sample_len(), 64);
        assert_eq!(d.train_x.len(), 1438 * 64);
        assert_eq!(d.test_x.len(), 359 * 64);
        // Test samples are rows 4, 9, 14...; training samples rows 0, 1, 2, 3, 5...
        assert_eq!(&d.test_y[..3], [4, 9, 4]);
        assert_eq!(&d.train_y[..5], [0, 1, 2, 3, 5]);
        assert_eq!(d.test_x[0], 4.0 / 16.0);
        assert_eq!(d.train_x[4 * 64], 5.0 / 16.0);

        std::fs::write(dir.0.join(DIGITS_CSV), text[..10].join("\n")).unwrap();
        let e = load_from("digits", &dir.0).unwrap_err().to_string();
        assert!(e.contains("10 rows, 1797 expected"), "{e}");
        assert!(e.contains("fetch digits again"), "{e}");
        std::fs::write(dir.0.join(DIGITS_CSV), vec![b'0'; 2 << 20]).unwrap();
        let e = load_from("digits", &dir.0).unwrap_err().to_string();
        assert!(e.contains("more than the 1048576"), "{e}");
        std::fs::remove_file(dir.0.join(DIGITS_CSV)).unwrap();
        let e = load_from("digits", &dir.0).unwrap_err().to_string();
        assert!(e.contains("run `tenet models fetch digits`"), "{e}");
    }

    const SMALL: [(&str, usize); 3] = [("train", 3), ("valid", 2), ("test", 1)];

    fn header(rows: &[(&str, usize); 3]) -> serde_json::Value {
        let arrays: Vec<_> = rows
            .iter()
            .flat_map(|&(s, n)| {
                [
                    serde_json::json!({"name": format!("{s}-images"), "file": format!("{s}-images.f32"),
                        "dtype": "float32", "shape": [n, 784]}),
                    serde_json::json!({"name": format!("{s}-labels"), "file": format!("{s}-labels.i64"),
                        "dtype": "int64", "shape": [n]}),
                ]
            })
            .collect();
        serde_json::json!({"format": MNIST_FORMAT, "source": "mnist/data/mnist.pkl.gz",
            "byte_order": "little", "arrays": arrays})
    }

    /// Writes a small MNIST-shaped directory: image `k` of the whole set has every pixel
    /// `k/256`, label `k % 10`.
    fn write_mnist(dir: &Path) {
        std::fs::write(dir.join(MNIST_HEADER), header(&SMALL).to_string()).unwrap();
        let mut k = 0usize;
        for (split, n) in SMALL {
            let mut x = Vec::new();
            let mut y = Vec::new();
            for _ in 0..n {
                for _ in 0..784 {
                    x.extend_from_slice(&(k as f32 / 256.0).to_le_bytes());
                }
                y.extend_from_slice(&((k % 10) as i64).to_le_bytes());
                k += 1;
            }
            std::fs::write(dir.join(format!("{split}-images.f32")), x).unwrap();
            std::fs::write(dir.join(format!("{split}-labels.i64")), y).unwrap();
        }
    }

    #[test]
    fn mnist_raw_files_load_with_validation_in_train() {
        let dir = Scratch::new("mnist-ok");
        write_mnist(&dir.0);
        let d = load_mnist(&dir.0, SMALL).unwrap();
        assert_eq!(d.name, "mnist");
        assert_eq!(d.sample_shape, [1, 28, 28]);
        assert_eq!(d.sample_len(), 784);
        assert_eq!((d.train_len(), d.test_len()), (5, 1));
        assert_eq!(d.train_y, [0, 1, 2, 3, 4]);
        assert_eq!(d.test_y, [5]);
        for (i, v) in d.train_x.iter().enumerate() {
            assert_eq!(*v, (i / 784) as f32 / 256.0);
        }
        assert!(d.test_x.iter().all(|&v| v == 5.0 / 256.0));
    }

    #[test]
    fn malformed_mnist_is_refused_before_it_is_used() {
        let dir = Scratch::new("mnist-bad");
        let d = &dir.0;
        let check = |needle: &str| {
            let e = load_mnist(d, SMALL).unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
            assert!(e.contains("tenet models fetch mnist"), "{e}");
            write_mnist(d);
        };
        check("mnist.json: No such file"); // nothing there yet

        let mut h = header(&SMALL);
        h["arrays"][2]["shape"] = serde_json::json!([2, 783]);
        std::fs::write(d.join(MNIST_HEADER), h.to_string()).unwrap();
        check("valid-images is \"float32\" [2,783], float32 [2,784] expected");
        // The real header's row counts, against a reader expecting these.
        std::fs::write(d.join(MNIST_HEADER), header(&MNIST_ROWS).to_string()).unwrap();
        check("train-images is \"float32\" [50000,784]");
        let mut h = header(&SMALL);
        h["arrays"][1]["file"] = serde_json::json!("../../etc/passwd");
        std::fs::write(d.join(MNIST_HEADER), h.to_string()).unwrap();
        check("where train-labels in train-labels.i64 is expected");
        let mut h = header(&SMALL);
        h["byte_order"] = serde_json::json!("big");
        std::fs::write(d.join(MNIST_HEADER), h.to_string()).unwrap();
        check("byte order \"big\"");
        std::fs::write(d.join(MNIST_HEADER), "{\"format\": 1").unwrap();
        check("not JSON");
        std::fs::write(d.join(MNIST_HEADER), vec![b' '; 100 << 10]).unwrap();
        check("more than the 65536");

        // A file whose size does not match its header.
        let f = d.join("valid-labels.i64");
        std::fs::write(&f, &std::fs::read(&f).unwrap()[..12]).unwrap();
        check("valid-labels.i64: 12 bytes, 16 expected");
        std::fs::write(d.join("test-images.f32"), vec![0u8; 1 << 20]).unwrap();
        check("test-images.f32: 1048576 bytes, 3136 expected");
        std::fs::remove_file(d.join("train-labels.i64")).unwrap();
        check("train-labels.i64: No such file");

        // Values out of range.
        for (bad, needle) in [
            (f32::NAN, "value 5 is NaN"),
            (f32::INFINITY, "value 5 is inf"),
            (
                -0.5,
                "valid-images.f32: value 5 is -0.5, not a pixel in [0, 1]",
            ),
            (1.5, "value 5 is 1.5"),
        ] {
            let f = d.join("valid-images.f32");
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[20..24].copy_from_slice(&bad.to_le_bytes());
            std::fs::write(&f, bytes).unwrap();
            check(needle);
        }
        for (file, i, bad, needle) in [
            (
                "test-labels.i64",
                0,
                10i64,
                "test-labels.i64: label 0 is 10, not a class in 0..10",
            ),
            ("train-labels.i64", 1, -1, "train-labels.i64: label 1 is -1"),
        ] {
            let f = d.join(file);
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[8 * i..8 * i + 8].copy_from_slice(&bad.to_le_bytes());
            std::fs::write(&f, bytes).unwrap();
            check(needle);
        }
    }

    #[test]
    fn labels_and_pixels_are_checked() {
        assert!(check_labels(&[0, 9, 5], 10).is_ok());
        for (y, needle) in [(vec![0, 10], "label 1 is 10"), (vec![-1], "label 0 is -1")] {
            let Err(Fault::Bad(e)) = check_labels(&y, 10) else {
                panic!("{y:?} accepted")
            };
            assert!(e.contains(needle), "{e}");
        }
        assert!(check_pixels(&[0.0, 1.0, 0.5, -0.0]).is_ok());
        for x in [f32::NAN, f32::NEG_INFINITY, 1.0001, -1e-9] {
            assert!(matches!(check_pixels(&[0.0, x]), Err(Fault::Bad(_))), "{x}");
        }
    }

    #[test]
    fn unknown_datasets_and_missing_caches_say_what_to_do() {
        let e = load("imagenet").unwrap_err().to_string();
        assert!(
            e.contains("unknown dataset \"imagenet\" (known: digits, mnist)"),
            "{e}"
        );
        let e = load_from("cifar", Path::new("/nonexistent")).unwrap_err();
        assert!(matches!(e, DataError::Unknown(_)));
        let e = load_from("mnist", Path::new("/nonexistent/mnist")).unwrap_err();
        assert!(
            e.to_string().contains("run `tenet models fetch mnist`"),
            "{e}"
        );
    }
}
