//! Training settings from a small YAML file, in the spirit of GT's sharding signals:
//!
//! ```yaml
//! dataset: digits
//! model: mlp
//! seed: 1
//! epochs: 2
//! batch: 32
//! data_parallel: 3        # shards per step, each on its own verified job
//! stage_boundaries: [fc2] # pipeline stages begin at these layers
//! coordinator: http://127.0.0.1:7070
//! ```
//!
//! Only flat `key: value` lines are read (comments after `#`, quotes around a value allowed,
//! a list written inline as `[a, b]`); anything else — nesting, block lists, an unknown key, a
//! key twice — is refused with its line, so a typo never silently falls back to a default.

use std::collections::BTreeMap;

/// The keys a training file may set.
pub const KEYS: [&str; 11] = [
    "dataset",
    "model",
    "seed",
    "epochs",
    "batch",
    "data_parallel",
    "stage_boundaries",
    "optimizer",
    "lr",
    "coordinator",
    "out",
];

/// Files larger than this are refused before they are parsed.
pub const MAX_CONFIG_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ConfigError {
    pub line: usize,
    pub message: String,
}

/// The settings of a training file, by key.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let fail = |line: usize, message: String| ConfigError { line, message };
    if text.len() > MAX_CONFIG_BYTES {
        return Err(fail(
            0,
            format!("the file is over {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = match raw.find('#') {
            Some(at) => &raw[..at],
            None => raw,
        };
        if content.trim().is_empty() || (line == 1 && content.trim() == "---") {
            continue;
        }
        if content.starts_with([' ', '\t']) || content.trim_start().starts_with('-') {
            return Err(fail(line, "only flat `key: value` lines are read".into()));
        }
        let (key, value) = content
            .split_once(':')
            .ok_or_else(|| fail(line, format!("`{}` is not `key: value`", content.trim())))?;
        let key = key.trim();
        if !KEYS.contains(&key) {
            return Err(fail(
                line,
                format!("unknown key {key:?} (known: {})", KEYS.join(", ")),
            ));
        }
        let mut value = value.trim();
        for q in ['"', '\''] {
            if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
                value = &value[1..value.len() - 1];
            }
        }
        if value.is_empty() {
            return Err(fail(line, format!("{key} has no value")));
        }
        if out.insert(key.to_string(), value.to_string()).is_some() {
            return Err(fail(line, format!("{key} is set twice")));
        }
    }
    Ok(out)
}

/// An inline list value, `[a, "b", 3]` or `a, b, 3`, as its items (quotes removed).
pub fn list(value: &str) -> Vec<String> {
    let inner = value
        .trim()
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(value);
    inner
        .split(',')
        .map(|item| item.trim().trim_matches(['"', '\'']).to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_files_read_and_mistakes_are_named() {
        let ok = "---\n# a run\ndataset: digits\nseed: 3   # the seed\nbatch: 32\ndata_parallel: 3\ncoordinator: \"http://127.0.0.1:7070\"\n";
        let m = parse(ok).unwrap();
        assert_eq!(m["dataset"], "digits");
        assert_eq!(m["seed"], "3");
        assert_eq!(m["coordinator"], "http://127.0.0.1:7070");
        assert_eq!(m.len(), 5);
        for (text, want) in [
            ("datset: digits\n", "line 1: unknown key \"datset\""),
            (
                "dataset: digits\ndataset: mnist\n",
                "line 2: dataset is set twice",
            ),
            ("model:\n  layers: 2\n", "line 1: model has no value"),
            ("seed: 1\n  nested: 2\n", "line 2: only flat"),
            ("- dataset: digits\n", "line 1: only flat"),
            ("just words\n", "line 1: `just words` is not `key: value`"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        assert!(parse(&"#".repeat(MAX_CONFIG_BYTES + 1)).is_err());
        let m = parse("stage_boundaries: [conv2, \"fc1\"]\n").unwrap();
        assert_eq!(list(&m["stage_boundaries"]), ["conv2", "fc1"]);
        assert_eq!(list("7, fc2"), ["7", "fc2"]);
        assert!(list("[]").is_empty());
    }
}
