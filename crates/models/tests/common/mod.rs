//! What the real-model tests share: finding a model in the cache, or saying plainly that the
//! test was skipped (`.ci/run` fetches the models first, so CI never skips).

use std::path::PathBuf;

use tenet_models::fetch::{ModelPackage, cached};

/// The model's directory, or `None` after telling stderr why the caller skips.
pub fn cached_or_skip(pkg: &ModelPackage) -> Option<PathBuf> {
    match cached(pkg) {
        Ok(dir) => Some(dir),
        Err(e) => {
            // Straight to stderr: the test harness would swallow eprintln!.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED: {e}");
            None
        }
    }
}
