//! Parsing the text form from untrusted text. Never panics; every error names `line:column`.

use std::collections::HashMap;

use super::lex::{Tok, Token, lex_line};
use super::literal::parse_bits;
use super::{HEADER, ParseError};
use crate::dtype::{DType, TensorType};
use crate::error::ValidationError;
use crate::graph::{Graph, Limits, Node, Output, check_node};
use crate::id::WeightsId;
use crate::op::{
    BinaryOp, Distribution, NodeId, NormOp, Op, PoolKind, QDot, QuantFormat, ReduceOp, SliceRange,
    UnaryOp, Window2d,
};

/// Largest text accepted, before anything else is looked at.
pub const MAX_TEXT_BYTES: usize = 256 << 20;

type PResult<T> = Result<T, (usize, String)>;

/// An argument value as written, with its column.
#[derive(Debug)]
enum Val {
    Node(String),
    Str(String),
    Scalar(String),
    List(Vec<(usize, String)>),
}

#[derive(Debug)]
struct Arg {
    col: usize,
    key: Option<(String, usize)>,
    val: Val,
}

struct Cursor<'a> {
    toks: &'a [Token],
    pos: usize,
    end_col: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos).map(|t| &t.kind)
    }
    fn col(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end_col, |t| t.col)
    }
    fn next(&mut self, expected: &str) -> PResult<(usize, &'a Tok)> {
        match self.toks.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok((t.col, &t.kind))
            }
            None => Err((
                self.end_col,
                format!("expected {expected}, found end of line"),
            )),
        }
    }
    fn punct(&mut self, c: char) -> PResult<()> {
        match self.next(&format!("`{c}`"))? {
            (_, Tok::Punct(p)) if *p == c => Ok(()),
            (col, t) => Err((col, format!("expected `{c}`, found {}", t.describe()))),
        }
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn end(&self) -> PResult<()> {
        match self.toks.get(self.pos) {
            None => Ok(()),
            Some(t) => Err((
                t.col,
                format!("unexpected {} at end of statement", t.kind.describe()),
            )),
        }
    }
}

/// Parse text into a validated graph under the default limits.
pub fn parse(text: &str) -> Result<Graph, ParseError> {
    parse_with_limits(text, &Limits::default())
}

pub fn parse_with_limits(text: &str, limits: &Limits) -> Result<Graph, ParseError> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(ParseError::new(
            1,
            1,
            format!(
                "text is {} bytes, the limit is {MAX_TEXT_BYTES}",
                text.len()
            ),
        ));
    }
    let mut p = Parser {
        limits,
        names: HashMap::new(),
        nodes: Vec::new(),
        node_lines: Vec::new(),
        outputs: Vec::new(),
        output_lines: Vec::new(),
    };
    let mut seen_header = false;
    let mut last_line = 1;
    for (i, line) in text.split('\n').enumerate() {
        let line_no = i + 1;
        last_line = line_no;
        let at = |(col, msg): (usize, String)| ParseError::new(line_no, col, msg);
        let toks = lex_line(line).map_err(at)?;
        if toks.is_empty() {
            continue;
        }
        if !seen_header {
            let words: Vec<_> = toks.iter().map(|t| &t.kind).collect();
            let expected = [
                Tok::Ident("tenet".into()),
                Tok::Ident("graph".into()),
                Tok::Ident("v1".into()),
            ];
            if words.len() != 3 || words.iter().zip(&expected).any(|(a, b)| *a != b) {
                return Err(ParseError::new(
                    line_no,
                    1,
                    format!("a text graph starts with the line `{HEADER}`"),
                ));
            }
            seen_header = true;
            continue;
        }
        let mut c = Cursor {
            toks: &toks,
            pos: 0,
            end_col: line.trim_end().len() + 1,
        };
        match c.peek() {
            Some(Tok::Node(_)) => p.node_statement(&mut c).map_err(at)?,
            Some(Tok::Ident(w)) if w == "output" => {
                p.output_statement(&mut c, line_no).map_err(at)?
            }
            Some(t) => {
                return Err(at((
                    c.col(),
                    format!(
                        "expected a node definition `%name = op(...) : type` or `output \"name\" = %node`, found {}",
                        t.describe()
                    ),
                )));
            }
            None => {}
        }
        if p.nodes.len() > p.node_lines.len() {
            p.node_lines.push(line_no);
        }
    }
    if !seen_header {
        return Err(ParseError::new(
            1,
            1,
            format!("empty text: a text graph starts with the line `{HEADER}`"),
        ));
    }
    let Parser {
        nodes,
        node_lines,
        outputs,
        output_lines,
        ..
    } = p;
    Graph::with_limits(nodes, outputs, limits).map_err(|e| {
        let line = match &e {
            _ if e.node().is_some() => e.node().and_then(|n| node_lines.get(n.index()).copied()),
            ValidationError::Output { name, .. }
            | ValidationError::Duplicate {
                what: "output",
                name,
            } => output_lines
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, l)| *l),
            _ => None,
        };
        ParseError::new(line.unwrap_or(last_line), 1, e.to_string())
    })
}

struct Parser<'l> {
    limits: &'l Limits,
    names: HashMap<String, NodeId>,
    nodes: Vec<Node>,
    node_lines: Vec<usize>,
    outputs: Vec<Output>,
    output_lines: Vec<(String, usize)>,
}

impl Parser<'_> {
    fn output_statement(&mut self, c: &mut Cursor<'_>, line: usize) -> PResult<()> {
        c.next("output")?;
        let name = match c.next("an output name")? {
            (_, Tok::Str(s)) => s.clone(),
            (col, t) => {
                return Err((
                    col,
                    format!("expected an output name in quotes, found {}", t.describe()),
                ));
            }
        };
        c.punct('=')?;
        let node = match c.next("a node reference")? {
            (col, Tok::Node(n)) => self.resolve(n, col)?,
            (col, t) => {
                return Err((
                    col,
                    format!("expected a node reference, found {}", t.describe()),
                ));
            }
        };
        c.end()?;
        self.output_lines.push((name.clone(), line));
        self.outputs.push(Output { name, node });
        Ok(())
    }

    fn resolve(&self, name: &str, col: usize) -> PResult<NodeId> {
        self.names.get(name).copied().ok_or_else(|| {
            (
                col,
                format!("unknown node %{name} (a node must be defined before it is used)"),
            )
        })
    }

    fn node_statement(&mut self, c: &mut Cursor<'_>) -> PResult<()> {
        let (name_col, name) = match c.next("a node name")? {
            (col, Tok::Node(n)) => (col, n.clone()),
            (col, t) => return Err((col, format!("expected a node name, found {}", t.describe()))),
        };
        if self.names.contains_key(&name) {
            return Err((name_col, format!("node %{name} is already defined")));
        }
        if self.nodes.len() >= self.limits.max_nodes {
            return Err((
                name_col,
                format!("more than {} nodes", self.limits.max_nodes),
            ));
        }
        c.punct('=')?;
        let (op_col, op_name) = match c.next("an op name")? {
            (col, Tok::Ident(s)) => (col, s.clone()),
            (col, t) => return Err((col, format!("expected an op name, found {}", t.describe()))),
        };
        c.punct('(')?;
        let args = parse_args(c)?;
        c.punct(':')?;
        let ty_col = c.col();
        let ty = parse_type(c, self.limits)?;
        c.end()?;
        let mut call = Call {
            args,
            used: Vec::new(),
            parser: self,
            close_col: ty_col,
        };
        call.used = vec![false; call.args.len()];
        let op = call.build(&op_name, op_col, &ty)?;
        call.finish(&op_name)?;
        let node = Node { op, ty };
        check_node(&self.nodes, self.nodes.len(), &node, self.limits)
            .map_err(|e| (op_col, e.to_string()))?;
        self.names.insert(name, NodeId(self.nodes.len() as u32));
        self.nodes.push(node);
        Ok(())
    }
}

fn parse_args(c: &mut Cursor<'_>) -> PResult<Vec<Arg>> {
    let mut args = Vec::new();
    if c.eat(')') {
        return Ok(args);
    }
    loop {
        let col = c.col();
        let key = match (c.toks.get(c.pos), c.toks.get(c.pos + 1)) {
            (
                Some(Token {
                    kind: Tok::Ident(k),
                    col,
                }),
                Some(Token {
                    kind: Tok::Punct('='),
                    ..
                }),
            ) => {
                c.pos += 2;
                Some((k.clone(), *col))
            }
            _ => None,
        };
        let val = parse_value(c)?;
        args.push(Arg { col, key, val });
        match c.next("`,` or `)`")? {
            (_, Tok::Punct(',')) => continue,
            (_, Tok::Punct(')')) => return Ok(args),
            (col, t) => return Err((col, format!("expected `,` or `)`, found {}", t.describe()))),
        }
    }
}

fn scalar_text(t: &Tok) -> Option<String> {
    match t {
        Tok::Num(s) | Tok::Ident(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse_value(c: &mut Cursor<'_>) -> PResult<Val> {
    match c.next("a value")? {
        (_, Tok::Node(n)) => Ok(Val::Node(n.clone())),
        (_, Tok::Str(s)) => Ok(Val::Str(s.clone())),
        (_, Tok::Punct('[')) => {
            let mut items = Vec::new();
            if c.eat(']') {
                return Ok(Val::List(items));
            }
            loop {
                let (col, t) = c.next("a list item")?;
                let s = scalar_text(t)
                    .ok_or_else(|| (col, format!("expected a number, found {}", t.describe())))?;
                items.push((col, s));
                match c.next("`,` or `]`")? {
                    (_, Tok::Punct(',')) => continue,
                    (_, Tok::Punct(']')) => return Ok(Val::List(items)),
                    (col, t) => {
                        return Err((col, format!("expected `,` or `]`, found {}", t.describe())));
                    }
                }
            }
        }
        (col, t) => scalar_text(t)
            .map(Val::Scalar)
            .ok_or_else(|| (col, format!("expected a value, found {}", t.describe()))),
    }
}

fn parse_type(c: &mut Cursor<'_>, limits: &Limits) -> PResult<TensorType> {
    let dtype = match c.next("a type such as f32[2,3]")? {
        (col, Tok::Ident(s)) => DType::from_name(s).ok_or_else(|| {
            (
                col,
                format!("unknown dtype `{s}` (one of f32, f16, bf16, i32, i64, u8, bool)"),
            )
        })?,
        (col, t) => {
            return Err((
                col,
                format!("expected a type such as f32[2,3], found {}", t.describe()),
            ));
        }
    };
    c.punct('[')?;
    let mut shape = Vec::new();
    if c.eat(']') {
        return Ok(TensorType::new(dtype, shape));
    }
    loop {
        let (col, t) = c.next("a dimension")?;
        let d = match t {
            Tok::Num(s) => s
                .parse::<u64>()
                .map_err(|_| (col, format!("dimension {s} is not a whole number")))?,
            t => return Err((col, format!("expected a dimension, found {}", t.describe()))),
        };
        if shape.len() >= limits.max_rank {
            return Err((col, format!("rank above the limit of {}", limits.max_rank)));
        }
        shape.push(d);
        match c.next("`,` or `]`")? {
            (_, Tok::Punct(',')) => continue,
            (_, Tok::Punct(']')) => return Ok(TensorType::new(dtype, shape)),
            (col, t) => return Err((col, format!("expected `,` or `]`, found {}", t.describe()))),
        }
    }
}

/// The arguments of one op call, consumed by the op's builder; leftovers are errors.
struct Call<'p, 'l> {
    args: Vec<Arg>,
    used: Vec<bool>,
    parser: &'p Parser<'l>,
    close_col: usize,
}

impl Call<'_, '_> {
    fn positional(&self) -> impl Iterator<Item = (usize, &Arg)> {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| a.key.is_none())
    }

    /// Index of the next unused positional argument.
    fn next_pos(&mut self, what: &str) -> PResult<usize> {
        let found = self
            .positional()
            .find(|(i, _)| !self.used[*i])
            .map(|(i, _)| i);
        let i = found.ok_or_else(|| (self.close_col, format!("missing {what}")))?;
        self.used[i] = true;
        Ok(i)
    }

    /// Argument `i` as a reference to an already defined node.
    fn node_arg(&self, i: usize) -> PResult<NodeId> {
        let col = self.args[i].col;
        match &self.args[i].val {
            Val::Node(n) => self.parser.resolve(n, col),
            _ => Err((col, "expected a node reference such as %3".into())),
        }
    }

    fn operand(&mut self) -> PResult<NodeId> {
        let i = self.next_pos("operand")?;
        self.node_arg(i)
    }

    fn kw(&mut self, key: &str) -> Option<(usize, usize)> {
        let i = self
            .args
            .iter()
            .position(|a| a.key.as_ref().is_some_and(|(k, _)| k == key))?;
        self.used[i] = true;
        Some((i, self.args[i].col))
    }

    fn req(&mut self, key: &str) -> PResult<(usize, usize)> {
        self.kw(key)
            .ok_or_else(|| (self.close_col, format!("missing attribute `{key}=`")))
    }

    fn kw_scalar(&mut self, key: &str) -> PResult<(usize, String)> {
        let (i, col) = self.req(key)?;
        match &self.args[i].val {
            Val::Scalar(s) => Ok((col, s.clone())),
            _ => Err((col, format!("`{key}` takes a single value"))),
        }
    }

    fn kw_int<T: std::str::FromStr>(&mut self, key: &str) -> PResult<T> {
        let (col, s) = self.kw_scalar(key)?;
        s.parse()
            .map_err(|_| (col, format!("`{key}={s}` is not a valid integer here")))
    }

    fn kw_bool(&mut self, key: &str) -> PResult<bool> {
        match self.kw_scalar(key)? {
            (_, s) if s == "true" => Ok(true),
            (_, s) if s == "false" => Ok(false),
            (col, s) => Err((col, format!("`{key}={s}` must be true or false"))),
        }
    }

    fn kw_list<T: std::str::FromStr>(&mut self, key: &str) -> PResult<Vec<T>> {
        let (i, col) = self.req(key)?;
        match &self.args[i].val {
            Val::List(items) => items
                .iter()
                .map(|(c, s)| {
                    s.parse()
                        .map_err(|_| (*c, format!("`{s}` is not a valid integer here")))
                })
                .collect(),
            _ => Err((col, format!("`{key}` takes a list such as [0, 1]"))),
        }
    }

    fn kw_array<const N: usize>(&mut self, key: &str) -> PResult<[u32; N]> {
        let col = self
            .args
            .iter()
            .find(|a| a.key.as_ref().is_some_and(|(k, _)| k == key))
            .map_or(self.close_col, |a| a.col);
        let v: Vec<u32> = self.kw_list(key)?;
        v.try_into()
            .map_err(|_| (col, format!("`{key}` takes exactly {N} values")))
    }

    fn kw_node(&mut self, key: &str) -> PResult<Option<NodeId>> {
        match self.kw(key) {
            None => Ok(None),
            Some((i, _)) => self.node_arg(i).map(Some),
        }
    }

    fn kw_f32_bits(&mut self, key: &str) -> PResult<u32> {
        let (col, s) = self.kw_scalar(key)?;
        parse_bits(DType::F32, &s)
            .map(|b| b as u32)
            .map_err(|e| (col, e))
    }

    fn kw_format(&mut self) -> PResult<QuantFormat> {
        let (col, s) = self.kw_scalar("format")?;
        QuantFormat::from_name(&s).ok_or_else(|| {
            let known: Vec<&str> = QuantFormat::ALL.iter().map(|f| f.name()).collect();
            (
                col,
                format!(
                    "unknown quantisation format `{s}` (one of {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn window(&mut self) -> PResult<Window2d> {
        Ok(Window2d {
            stride: self.kw_array("stride")?,
            padding: self.kw_array("padding")?,
            dilation: self.kw_array("dilation")?,
        })
    }

    fn string(&mut self, what: &str) -> PResult<(usize, String)> {
        let i = self.next_pos(what)?;
        match &self.args[i].val {
            Val::Str(s) => Ok((self.args[i].col, s.clone())),
            _ => Err((
                self.args[i].col,
                format!("expected {what} in double quotes"),
            )),
        }
    }

    fn finish(&self, op: &str) -> PResult<()> {
        match self.used.iter().position(|u| !u) {
            None => Ok(()),
            Some(i) => {
                let a = &self.args[i];
                Err(match &a.key {
                    Some((k, col)) => (*col, format!("`{op}` has no attribute `{k}`")),
                    None => (a.col, format!("too many arguments for `{op}`")),
                })
            }
        }
    }

    fn build(&mut self, name: &str, col: usize, ty: &TensorType) -> PResult<Op> {
        Ok(match name {
            "input" => Op::Input {
                name: self.string("the input name")?.1,
            },
            "weight" => {
                let tensor = self.string("the tensor name")?.1;
                let (i, kcol) = self.req("file")?;
                let file = match &self.args[i].val {
                    Val::Str(s) => WeightsId::from_hex(s),
                    _ => None,
                }
                .ok_or((
                    kcol,
                    "`file` takes the weights file's blake3 hash: 64 hex digits in quotes"
                        .to_string(),
                ))?;
                Op::Weight { file, tensor }
            }
            "const" => Op::Constant {
                data: self.constant(ty)?,
            },
            "where" => Op::Where {
                cond: self.operand()?,
                a: self.operand()?,
                b: self.operand()?,
            },
            "cast" => Op::Cast { x: self.operand()? },
            "matmul" => Op::MatMul {
                a: self.operand()?,
                b: self.operand()?,
            },
            "reshape" => Op::Reshape { x: self.operand()? },
            "expand" => Op::Expand { x: self.operand()? },
            "permute" => Op::Permute {
                x: self.operand()?,
                perm: self.kw_list("perm")?,
            },
            "slice" => {
                let x = self.operand()?;
                let (s, e, st): (Vec<u64>, Vec<u64>, Vec<u64>) = (
                    self.kw_list("start")?,
                    self.kw_list("end")?,
                    self.kw_list("step")?,
                );
                if s.len() != e.len() || s.len() != st.len() {
                    return Err((col, "`start`, `end` and `step` need the same length".into()));
                }
                let ranges = (0..s.len())
                    .map(|i| SliceRange {
                        start: s[i],
                        end: e[i],
                        step: st[i],
                    })
                    .collect();
                Op::Slice { x, ranges }
            }
            "pad" => {
                let x = self.operand()?;
                let (before, after): (Vec<u64>, Vec<u64>) =
                    (self.kw_list("before")?, self.kw_list("after")?);
                if before.len() != after.len() {
                    return Err((col, "`before` and `after` need the same length".into()));
                }
                let (vcol, v) = self.kw_scalar("value")?;
                let value = parse_bits(ty.dtype, &v).map_err(|e| (vcol, e))?;
                Op::Pad {
                    x,
                    pads: before.into_iter().zip(after).collect(),
                    value,
                }
            }
            "concat" => {
                let mut xs = Vec::new();
                while self.positional().any(|(i, _)| !self.used[i]) {
                    if xs.len() >= self.parser.limits.max_operands {
                        return Err((
                            col,
                            format!("more than {} operands", self.parser.limits.max_operands),
                        ));
                    }
                    xs.push(self.operand()?);
                }
                Op::Concat {
                    xs,
                    axis: self.kw_int("axis")?,
                }
            }
            "gather" => Op::Gather {
                x: self.operand()?,
                indices: self.operand()?,
                axis: self.kw_int("axis")?,
            },
            "iota" => Op::Iota {
                axis: self.kw_int("axis")?,
            },
            "tri_mask" => Op::TriMask {
                upper: self.kw_bool("upper")?,
                diagonal: self.kw_int("diagonal")?,
            },
            "layer_norm" => Op::LayerNorm {
                x: self.operand()?,
                gamma: self.kw_node("gamma")?,
                beta: self.kw_node("beta")?,
                eps_bits: self.kw_f32_bits("eps")?,
            },
            "rms_norm" => Op::RmsNorm {
                x: self.operand()?,
                gamma: self.kw_node("gamma")?,
                eps_bits: self.kw_f32_bits("eps")?,
            },
            "dequantize" => Op::Dequantize {
                x: self.operand()?,
                format: self.kw_format()?,
            },
            "qmatmul" | "qmatmul_q8" => Op::QMatMul {
                a: self.operand()?,
                w: self.operand()?,
                format: self.kw_format()?,
                dot: QDot::from_name(name).unwrap_or(QDot::F32),
            },
            "conv2d" => Op::Conv2d {
                x: self.operand()?,
                w: self.operand()?,
                bias: self.kw_node("bias")?,
                window: self.window()?,
                groups: self.kw_int("groups")?,
            },
            _ => {
                if let Some(op) = UnaryOp::from_name(name) {
                    Op::Unary {
                        op,
                        x: self.operand()?,
                    }
                } else if let Some(op) = BinaryOp::from_name(name) {
                    Op::Binary {
                        op,
                        a: self.operand()?,
                        b: self.operand()?,
                    }
                } else if let Some(op) = ReduceOp::from_name(name) {
                    Op::Reduce {
                        op,
                        x: self.operand()?,
                        axes: self.kw_list("axes")?,
                        keepdim: self.kw_bool("keepdim")?,
                    }
                } else if let Some(op) = NormOp::from_name(name) {
                    Op::Normalize {
                        op,
                        x: self.operand()?,
                        axis: self.kw_int("axis")?,
                    }
                } else if let Some(kind) = PoolKind::from_name(name) {
                    Op::Pool2d {
                        kind,
                        x: self.operand()?,
                        kernel: self.kw_array("kernel")?,
                        window: self.window()?,
                    }
                } else if let Some(dist) = Distribution::from_name(name) {
                    Op::Random {
                        dist,
                        key: self.kw_int("key")?,
                    }
                } else {
                    return Err((
                        col,
                        format!("unknown op `{name}` (docs/OPS.md lists the op set)"),
                    ));
                }
            }
        })
    }

    /// A constant's literal: a bare scalar for rank 0, else a flat row-major list.
    fn constant(&mut self, ty: &TensorType) -> PResult<Vec<u8>> {
        let i = self.next_pos("the constant's value")?;
        let col = self.args[i].col;
        let items: Vec<(usize, String)> = match (&self.args[i].val, ty.rank()) {
            (Val::Scalar(s), 0) => vec![(col, s.clone())],
            (Val::List(items), r) if r > 0 => items.clone(),
            _ => {
                return Err((
                    col,
                    format!(
                        "a constant of type {ty} is written as {}",
                        if ty.rank() == 0 {
                            "a single value"
                        } else {
                            "a flat list [a, b, ...]"
                        }
                    ),
                ));
            }
        };
        let n = ty.numel().unwrap_or(u64::MAX);
        if items.len() as u64 != n {
            return Err((
                col,
                format!(
                    "a constant of type {ty} needs {n} values, found {}",
                    items.len()
                ),
            ));
        }
        let size = ty.dtype.size() as usize;
        let mut data = Vec::with_capacity(items.len() * size);
        for (c, s) in items {
            let bits = parse_bits(ty.dtype, &s).map_err(|e| (c, e))?;
            data.extend_from_slice(&bits.to_le_bytes()[..size]);
        }
        Ok(data)
    }
}
