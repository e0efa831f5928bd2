//! Tokens of one line of the text form. Every statement is one line, so lexing is per line and
//! every token knows its column.

/// A token and the 1-based byte column where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub col: usize,
    pub kind: Tok,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// `%name`: a node reference or definition.
    Node(String),
    /// A bare word: op names, dtypes, keywords, `true`, `inf`, `nan:0x…`.
    Ident(String),
    /// A number as written (`12`, `-3`, `1e-5`, `-inf`); interpreted by the parser per dtype.
    Num(String),
    /// A double-quoted string, without the quotes (no escapes exist in the format).
    Str(String),
    /// One of `( ) [ ] , = :`.
    Punct(char),
}

impl Tok {
    pub fn describe(&self) -> String {
        match self {
            Tok::Node(n) => format!("node %{n}"),
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Num(s) => format!("number {s}"),
            Tok::Str(s) => format!("string \"{s}\""),
            Tok::Punct(c) => format!("`{c}`"),
        }
    }
}

/// Split one line into tokens; `#` starts a comment. Errors carry the column.
pub fn lex_line(line: &str) -> Result<Vec<Token>, (usize, String)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'.';
    while i < b.len() {
        let c = b[i];
        let col = i + 1;
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'#' => break,
            b'%' => {
                i += 1;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                if i == start + 1 {
                    return Err((col, "`%` must be followed by a node name".into()));
                }
                Tok::Node(line[start + 1..i].to_string())
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += 1;
                }
                if i == b.len() {
                    return Err((col, "unterminated string".into()));
                }
                i += 1;
                Tok::Str(line[start + 1..i - 1].to_string())
            }
            b'(' | b')' | b'[' | b']' | b',' | b'=' | b':' => {
                i += 1;
                Tok::Punct(c as char)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                // `nan:0x7fc00001`: a NaN with explicit bits is one token.
                if &line[start..i] == "nan" && line[i..].starts_with(":0x") {
                    i += 3;
                    while i < b.len() && b[i].is_ascii_hexdigit() {
                        i += 1;
                    }
                }
                Tok::Ident(line[start..i].to_string())
            }
            c if c.is_ascii_digit() || c == b'-' || c == b'+' => {
                i += 1;
                while i < b.len() {
                    let d = b[i];
                    let exp_sign = (d == b'-' || d == b'+') && matches!(b[i - 1], b'e' | b'E');
                    if word(d) || exp_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                Tok::Num(line[start..i].to_string())
            }
            _ => {
                let ch = line[i..].chars().next().unwrap_or('?');
                return Err((col, format!("unexpected character {ch:?}")));
            }
        };
        out.push(Token { col, kind });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(line: &str) -> Vec<Tok> {
        lex_line(line)
            .unwrap()
            .into_iter()
            .map(|t| t.kind)
            .collect()
    }

    #[test]
    fn lexes_a_node_line() {
        assert_eq!(
            kinds("%2 = sum(%x, axes=[1], eps=1e-5) : f32[4,1] # c"),
            vec![
                Tok::Node("2".into()),
                Tok::Punct('='),
                Tok::Ident("sum".into()),
                Tok::Punct('('),
                Tok::Node("x".into()),
                Tok::Punct(','),
                Tok::Ident("axes".into()),
                Tok::Punct('='),
                Tok::Punct('['),
                Tok::Num("1".into()),
                Tok::Punct(']'),
                Tok::Punct(','),
                Tok::Ident("eps".into()),
                Tok::Punct('='),
                Tok::Num("1e-5".into()),
                Tok::Punct(')'),
                Tok::Punct(':'),
                Tok::Ident("f32".into()),
                Tok::Punct('['),
                Tok::Num("4".into()),
                Tok::Punct(','),
                Tok::Num("1".into()),
                Tok::Punct(']'),
            ]
        );
    }

    #[test]
    fn special_floats_and_errors() {
        assert_eq!(
            kinds("-inf nan:0x7fc00001"),
            vec![Tok::Num("-inf".into()), Tok::Ident("nan:0x7fc00001".into())]
        );
        assert_eq!(lex_line("  \"abc").unwrap_err().0, 3);
        assert_eq!(lex_line("%0 = é").unwrap_err().0, 6);
        assert_eq!(lex_line("% ").unwrap_err().0, 1);
    }
}
