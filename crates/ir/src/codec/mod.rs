//! Canonical binary encoding of graphs (`.tnt` files).
//!
//! Layout (all integers little-endian, fixed width, so each value has exactly one encoding):
//!
//! ```text
//! magic "TENETGRF" | version u16 = 1 | node count u32 | nodes | output count u32 | outputs
//! node   = op tag u8 | dtype u8 | rank u8 | dims u64 × rank | op payload
//! output = name | node u32
//! name   = length u32 | UTF-8 bytes (validated: printable ASCII)
//! option = 0 u8 | 1 u8, value
//! ```
//!
//! Op payloads are listed in `encode.rs`; `decode.rs` reads them back. The decoder accepts a
//! byte string only if it is exactly what the encoder would write for the graph it describes:
//! tags, flags and booleans are checked, nothing may trail, and the graph must validate. So
//! canonical bytes re-encode to the same bytes, and a graph's id (blake3 of these bytes) is
//! well defined.

mod decode;
mod encode;

pub use decode::{DecodeError, DecodeErrorKind, decode, decode_with_limits};
pub use encode::encode;

/// First bytes of every encoded graph.
pub const MAGIC: &[u8; 8] = b"TENETGRF";
/// The format version this build reads and writes.
pub const VERSION: u16 = 1;

/// Op tags in the binary encoding. Append only: a tag's meaning never changes within a version.
pub(crate) mod tag {
    pub const INPUT: u8 = 0;
    pub const WEIGHT: u8 = 1;
    pub const CONSTANT: u8 = 2;
    pub const UNARY: u8 = 3;
    pub const BINARY: u8 = 4;
    pub const WHERE: u8 = 5;
    pub const CAST: u8 = 6;
    pub const REDUCE: u8 = 7;
    pub const MATMUL: u8 = 8;
    pub const RESHAPE: u8 = 9;
    pub const PERMUTE: u8 = 10;
    pub const EXPAND: u8 = 11;
    pub const SLICE: u8 = 12;
    pub const PAD: u8 = 13;
    pub const CONCAT: u8 = 14;
    pub const GATHER: u8 = 15;
    pub const IOTA: u8 = 16;
    pub const TRI_MASK: u8 = 17;
    pub const NORMALIZE: u8 = 18;
    pub const LAYER_NORM: u8 = 19;
    pub const RMS_NORM: u8 = 20;
    pub const CONV2D: u8 = 21;
    pub const POOL2D: u8 = 22;
    pub const RANDOM: u8 = 23;
    pub const DEQUANTIZE: u8 = 24;
    pub const QMATMUL: u8 = 25;
    pub const QMATMUL_Q8: u8 = 26;
}

#[cfg(test)]
mod tests {
    use super::tag::*;

    /// The op tags, in the order they were added: new ops append, none is ever renumbered.
    #[test]
    fn op_tags_are_append_only() {
        let tags = [
            INPUT, WEIGHT, CONSTANT, UNARY, BINARY, WHERE, CAST, REDUCE, MATMUL, RESHAPE, PERMUTE,
            EXPAND, SLICE, PAD, CONCAT, GATHER, IOTA, TRI_MASK, NORMALIZE, LAYER_NORM, RMS_NORM,
            CONV2D, POOL2D, RANDOM, DEQUANTIZE, QMATMUL, QMATMUL_Q8,
        ];
        assert_eq!(tags.to_vec(), (0..27).collect::<Vec<u8>>());
    }
}
