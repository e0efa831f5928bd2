//! Content addresses: a graph's id and a weights file's id are the blake3 hashes of their bytes.

use std::fmt;

macro_rules! hash_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The blake3 hash of `bytes`.
            pub fn of_bytes(bytes: &[u8]) -> $name {
                $name(*blake3::hash(bytes).as_bytes())
            }

            /// Full 64-character lowercase hex.
            pub fn to_hex(&self) -> String {
                let mut s = String::with_capacity(64);
                for b in self.0 {
                    s.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
                    s.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
                }
                s
            }

            /// The first 12 hex characters, for people (like a short git hash).
            pub fn short(&self) -> String {
                self.to_hex()[..12].to_string()
            }

            /// Parse exactly 64 hex characters (either case).
            pub fn from_hex(s: &str) -> Option<$name> {
                let bytes = s.as_bytes();
                if bytes.len() != 64 {
                    return None;
                }
                let mut out = [0u8; 32];
                for (i, pair) in bytes.chunks_exact(2).enumerate() {
                    let hi = (pair[0] as char).to_digit(16)?;
                    let lo = (pair[1] as char).to_digit(16)?;
                    out[i] = (hi * 16 + lo) as u8;
                }
                Some($name(out))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }
    };
}

hash_id! {
    /// The id of a graph (a task): blake3 of its canonical binary encoding.
    GraphId
}

hash_id! {
    /// The id of a weights file: blake3 of the file's bytes.
    WeightsId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = GraphId::of_bytes(b"tenet");
        let hex = id.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(GraphId::from_hex(&hex), Some(id));
        assert_eq!(GraphId::from_hex(&hex.to_uppercase()), Some(id));
        assert_eq!(id.short(), hex[..12]);
        assert_eq!(GraphId::from_hex(&hex[1..]), None);
        assert_eq!(GraphId::from_hex(&format!("{}g", &hex[1..])), None);
    }
}
