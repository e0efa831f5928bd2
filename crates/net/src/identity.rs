//! The node's identity: an Ed25519 key pair created in the data directory on first start
//! (`node.key`, readable by its owner only) and read back on every later start.

use std::path::Path;

use tenet_proto::auth::KeyPair;

/// 32 bytes from the operating system's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // The OS source failing is not something a node can run without.
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b
}

/// A fresh key pair from the OS random source.
pub fn generate() -> KeyPair {
    KeyPair::from_seed(random_bytes())
}

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read or write key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a tenet key file (expected 64 hex characters)")]
    Malformed { path: String },
}

/// Read the key at `path`.
pub fn read_key(path: &Path) -> Result<KeyPair, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Io {
        path: path.display().to_string(),
        source,
    })?;
    KeyPair::from_file_text(&text).ok_or_else(|| KeyFileError::Malformed {
        path: path.display().to_string(),
    })
}

/// Write `key` to `path` (mode 0600, atomically; refuses to overwrite).
pub fn write_key(path: &Path, key: &KeyPair) -> Result<(), KeyFileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| KeyFileError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("key.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(key.to_file_text().as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    // hard_link fails if `path` exists: a second start never replaces an identity.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(io)
}

/// The node's key in `data_dir`, created on first use.
pub fn load_or_create(data_dir: &Path) -> Result<KeyPair, KeyFileError> {
    load_or_create_at(&data_dir.join("node.key"))
}

/// The key at `path`, created on first use.
pub fn load_or_create_at(path: &Path) -> Result<KeyPair, KeyFileError> {
    if path.exists() {
        return read_key(path);
    }
    let key = generate();
    write_key(path, &key)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_identity_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = super::load_or_create(dir.path()).unwrap();
        let b = super::load_or_create(dir.path()).unwrap();
        assert_eq!(a.public(), b.public());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("node.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(super::write_key(&dir.path().join("node.key"), &super::generate()).is_err());
    }
}
