//! What every Python peer of a benchmark prints: chatter, then its result as one JSON object on
//! its last such line, or `{"unavailable": why}` when its module does not import.

/// The peer's JSON result, or why there is none. `peer` names it in messages (`onnxruntime`);
/// `install` says how to get it (`pip install onnxruntime, or set TENET_ONNX_PYTHON`).
pub(crate) fn result(
    peer: &str,
    install: &str,
    python: &str,
    success: bool,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<serde_json::Value, String> {
    if !success {
        let err = String::from_utf8_lossy(stderr);
        return Err(format!(
            "{peer} failed under {python}: {}",
            err.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
        ));
    }
    let text = String::from_utf8_lossy(stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("{peer} printed no result"))?;
    let v: serde_json::Value =
        serde_json::from_str(last).map_err(|e| format!("unreadable {peer} output: {e}"))?;
    if let Some(why) = v["unavailable"].as_str() {
        return Err(format!(
            "{peer} is not importable by {python} ({why}; {install})"
        ));
    }
    Ok(v)
}
