//! The text form of a graph: for review by people, for tests, and for writing small graphs by
//! hand. One statement per line, `#` starts a comment:
//!
//! ```text
//! tenet graph v1
//! %0 = input("a") : f32[1024,1024]
//! %1 = input("b") : f32[1024,1024]
//! %2 = matmul(%0, %1) : f32[1024,1024]
//! output "c" = %2
//! ```
//!
//! A node line is `%name = op(operands, key=value, ...) : dtype[dims]`; every node states its
//! result type, which is checked against the op's rules. Node names may be any `[A-Za-z0-9_.]`
//! word; the canonical form printed by `print` numbers them `%0, %1, ...` in order, prints every
//! attribute, and has no comments. Canonical text round-trips byte for byte through a graph, and
//! any accepted text gives the graph whose id its canonical text has.

mod lex;
mod literal;
mod parse;
mod print;

pub use literal::{format_bits, parse_bits};
pub use parse::{MAX_TEXT_BYTES, parse, parse_with_limits};
pub use print::print;

/// The first line of every text graph.
pub const HEADER: &str = "tenet graph v1";

/// Why a text is not a valid graph, at `line:column` (1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}:{column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl ParseError {
    fn new(line: usize, column: usize, message: String) -> ParseError {
        ParseError {
            line,
            column,
            message,
        }
    }
}
