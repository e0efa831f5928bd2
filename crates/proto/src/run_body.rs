//! The JSON body of a call to a deployed task (`POST /v1/tasks/{id}/run` on the coordinator):
//! `{"inputs": {name: tensor}, "tier": "exact", "seed": 7}`, decoded against the task's declared
//! inputs while it is parsed.
//!
//! A stranger sends this body, so nothing in it is trusted: the body may be at most
//! [`max_json_body`] bytes for the task's inputs (checked before it is read); every element is
//! converted to the input's dtype as it is parsed, straight into the tensor's bytes, and an input
//! may not hold more elements than the task declares — so decoding never holds more than the
//! inputs' own size beside the body (a generic JSON tree costs ~20× the text in memory). A name
//! the task does not have, a value out of its dtype's range (`1e39` for an `f32`), a seed that
//! is not a whole number in `0..2^64`, and a tier other than `exact`/`tolerant` are refused by
//! name, never turned into something else.
//!
//! A tensor is a nested list (`[[1, 2], [3, 4]]`), a bare scalar, or an object
//! `{"dtype": "f32", "shape": [2, 2], "data": [...]}` whose `data` may be flat or nested;
//! floats also take `"nan"`, `"inf"` and `"-inf"` (and `"NaN"`, `"Infinity"`, `"-Infinity"`).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tenet_ir::{DType, HostTensor, TensorType};

use crate::commit::Tier;

/// JSON text allowed per declared input element: the longest number any JSON writer prints
/// (`-1.7976931348623157e+308`, 24 characters) plus a separator and generous indentation.
pub const JSON_BYTES_PER_ELEMENT: u64 = 64;

/// JSON text allowed beyond the elements: keys, tier, seed, shapes, whitespace.
pub const JSON_SLACK_BYTES: u64 = 64 << 10;

/// The deepest list nesting accepted, whatever the inputs' ranks.
const MAX_NESTING: usize = 64;

/// A decoded call.
#[derive(Debug)]
pub struct RunBody {
    /// Every declared input, with exactly its declared type.
    pub inputs: BTreeMap<String, HostTensor>,
    pub tier: Option<Tier>,
    pub seed: Option<u64>,
}

/// Why a call's body was refused.
#[derive(Debug, thiserror::Error)]
pub enum RunBodyError {
    #[error(
        "the body is {size} bytes; this task's inputs fit in {limit} bytes of JSON (send large inputs as a safetensors body)"
    )]
    TooLarge { size: u64, limit: u64 },
    #[error("{0}")]
    Invalid(String),
}

/// The largest JSON body a call with these inputs may send.
pub fn max_json_body<'a>(inputs: impl IntoIterator<Item = &'a TensorType>) -> u64 {
    inputs
        .into_iter()
        .map(|t| t.numel().unwrap_or(u64::MAX))
        .fold(JSON_SLACK_BYTES, |acc, n| {
            acc.saturating_add(n.saturating_mul(JSON_BYTES_PER_ELEMENT))
        })
}

/// Decode `body` for a task whose inputs are `inputs` (name, type). Every input must be present
/// with exactly its declared type.
pub fn decode_run_json(
    body: &[u8],
    inputs: &[(&str, &TensorType)],
) -> Result<RunBody, RunBodyError> {
    let limit = max_json_body(inputs.iter().map(|(_, t)| *t));
    if body.len() as u64 > limit {
        return Err(RunBodyError::TooLarge {
            size: body.len() as u64,
            limit,
        });
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let decoded = BodySeed { inputs }
        .deserialize(&mut de)
        .and_then(|b| de.end().map(|()| b))
        .map_err(|e| RunBodyError::Invalid(e.to_string()))?;
    for (name, ty) in inputs {
        match decoded.inputs.get(*name) {
            None => {
                return Err(RunBodyError::Invalid(format!(
                    "input {name} ({ty}) is missing"
                )));
            }
            Some(t) if t.ty() != *ty => {
                return Err(RunBodyError::Invalid(format!(
                    "input {name} is {}, the task needs {ty}",
                    t.ty()
                )));
            }
            Some(_) => {}
        }
    }
    Ok(decoded)
}

struct BodySeed<'a> {
    inputs: &'a [(&'a str, &'a TensorType)],
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = RunBody;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RunBody, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = RunBody;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object {\"inputs\": {name: tensor}, \"tier\", \"seed\"}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RunBody, A::Error> {
        let mut body = RunBody {
            inputs: BTreeMap::new(),
            tier: None,
            seed: None,
        };
        let (mut seen_inputs, mut seen_seed) = (false, false);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "inputs" if !seen_inputs => {
                    seen_inputs = true;
                    body.inputs = map.next_value_seed(InputsSeed {
                        inputs: self.inputs,
                    })?;
                }
                "tier" if body.tier.is_none() => {
                    let t: String = map.next_value()?;
                    body.tier = Some(Tier::parse(&t).ok_or_else(|| {
                        de::Error::custom(format!("tier `{t}` is not exact or tolerant"))
                    })?);
                }
                "seed" if !seen_seed => {
                    seen_seed = true;
                    body.seed = map.next_value_seed(SeedSeed)?;
                }
                "inputs" | "tier" | "seed" => {
                    return Err(de::Error::custom(format!("\"{key}\" is given twice")));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !seen_inputs {
            return Err(de::Error::custom(
                "expected {\"inputs\": {name: tensor}}: \"inputs\" is missing",
            ));
        }
        Ok(body)
    }
}

/// A seed: a whole number in `0..2^64` (or `null`: none given), nothing else (not `-1`, not
/// `"7"`, not `7.0`).
struct SeedSeed;

impl<'de> DeserializeSeed<'de> for SeedSeed {
    type Value = Option<u64>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SeedSeed {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("\"seed\" as a whole number from 0 to 18446744073709551615")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(Some(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
}

struct InputsSeed<'a> {
    inputs: &'a [(&'a str, &'a TensorType)],
}

impl<'de> DeserializeSeed<'de> for InputsSeed<'_> {
    type Value = BTreeMap<String, HostTensor>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for InputsSeed<'_> {
    type Value = BTreeMap<String, HostTensor>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("\"inputs\" as an object {name: tensor}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(name) = map.next_key::<String>()? {
            // Refused before its value is read: a tensor under a name the task does not
            // have is never parsed.
            let Some((_, ty)) = self.inputs.iter().find(|(n, _)| *n == name) else {
                return Err(de::Error::custom(format!("the task has no input {name}")));
            };
            if out.contains_key(&name) {
                return Err(de::Error::custom(format!("input {name} is given twice")));
            }
            let t = map.next_value_seed(TensorSeed { name: &name, ty })?;
            out.insert(name, t);
        }
        Ok(out)
    }
}

/// One input's value, parsed into a tensor of its declared dtype.
struct TensorSeed<'a> {
    name: &'a str,
    ty: &'a TensorType,
}

impl<'de> DeserializeSeed<'de> for TensorSeed<'_> {
    type Value = HostTensor;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<HostTensor, D::Error> {
        d.deserialize_any(self)
    }
}

impl TensorSeed<'_> {
    fn elements(&self) -> Elements<'_> {
        Elements {
            name: self.name,
            dtype: self.ty.dtype,
            room: self.ty.numel().unwrap_or(0),
            bytes: Vec::new(),
            dims: Vec::new(),
            leaf_depth: None,
            max_depth: self.ty.rank().clamp(1, MAX_NESTING),
        }
    }

    /// The value is bare elements: their nesting is the shape.
    fn bare<E: de::Error>(
        &self,
        fill: impl FnOnce(&mut Elements) -> Result<(), String>,
    ) -> Result<HostTensor, E> {
        let mut els = self.elements();
        fill(&mut els).map_err(E::custom)?;
        let shape = els.nested_shape();
        els.finish(shape).map_err(E::custom)
    }
}

macro_rules! scalar_tensor {
    ($($method:ident: $t:ty => $add:ident),* $(,)?) => {
        $(fn $method<E: de::Error>(self, v: $t) -> Result<HostTensor, E> {
            self.bare(|els| els.$add(v, 0))
        })*
    };
}

impl<'de> Visitor<'de> for TensorSeed<'_> {
    type Value = HostTensor;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "input {} as a list, a number or {{\"dtype\", \"shape\", \"data\"}}",
            self.name
        )
    }

    scalar_tensor! {
        visit_f64: f64 => add_f64,
        visit_u64: u64 => add_u64,
        visit_i64: i64 => add_i64,
        visit_bool: bool => add_bool,
        visit_str: &str => add_str,
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<HostTensor, A::Error> {
        let mut els = self.elements();
        ListVisitor {
            els: &mut els,
            depth: 0,
        }
        .visit_seq(seq)?;
        let shape = els.nested_shape();
        els.finish(shape).map_err(de::Error::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HostTensor, A::Error> {
        let mut els = self.elements();
        let mut shape: Option<Vec<u64>> = None;
        let mut has_data = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "dtype" => {
                    let d: String = map.next_value()?;
                    let dtype = DType::from_name(&d)
                        .ok_or_else(|| de::Error::custom(format!("unknown dtype {d:?}")))?;
                    if dtype != self.ty.dtype {
                        return Err(de::Error::custom(format!(
                            "input {} is {dtype}, the task needs {}",
                            self.name, self.ty
                        )));
                    }
                }
                "shape" => {
                    shape = Some(map.next_value_seed(ShapeSeed {
                        max_rank: self.ty.rank() + 1,
                    })?);
                }
                "data" if !has_data => {
                    has_data = true;
                    map.next_value_seed(DataSeed {
                        els: &mut els,
                        depth: 0,
                    })?;
                }
                _ => {
                    return Err(de::Error::custom(format!(
                        "input {}: a tensor object has \"dtype\", \"shape\" and \"data\" once each, not {key:?}",
                        self.name
                    )));
                }
            }
        }
        if !has_data {
            return Err(de::Error::custom(format!(
                "input {}: a tensor object needs \"data\"",
                self.name
            )));
        }
        let shape = match shape {
            Some(s) => {
                if tenet_ir::numel(&s) != Some(els.count()) {
                    return Err(de::Error::custom(format!(
                        "input {}: \"shape\" {s:?} does not match {} values",
                        self.name,
                        els.count()
                    )));
                }
                s
            }
            None => els.nested_shape(),
        };
        els.finish(shape).map_err(de::Error::custom)
    }
}

/// A `"shape"`: a list of at most `max_rank` dimensions.
struct ShapeSeed {
    max_rank: usize,
}

impl<'de> DeserializeSeed<'de> for ShapeSeed {
    type Value = Vec<u64>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed {
    type Value = Vec<u64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("\"shape\" as a list of whole numbers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let mut dims = Vec::new();
        while let Some(d) = seq.next_element::<u64>()? {
            if dims.len() == self.max_rank {
                return Err(de::Error::custom(
                    "\"shape\" has more dimensions than the input",
                ));
            }
            dims.push(d);
        }
        Ok(dims)
    }
}

/// Elements parsed so far, as the input dtype's little-endian bytes, with the list nesting
/// seen: `dims[d]` is the length of every list at depth `d`.
struct Elements<'a> {
    name: &'a str,
    dtype: DType,
    /// Elements the input declares: no more are accepted.
    room: u64,
    bytes: Vec<u8>,
    dims: Vec<Option<u64>>,
    leaf_depth: Option<usize>,
    max_depth: usize,
}

impl Elements<'_> {
    fn count(&self) -> u64 {
        self.bytes.len() as u64 / self.dtype.size()
    }

    fn push(&mut self, bits: u64, depth: usize) -> Result<(), String> {
        if self.count() >= self.room {
            return Err(format!(
                "input {} has more than the {} values it declares",
                self.name, self.room
            ));
        }
        self.leaf(depth)?;
        let size = self.dtype.size() as usize;
        self.bytes.extend_from_slice(&bits.to_le_bytes()[..size]);
        Ok(())
    }

    fn leaf(&mut self, depth: usize) -> Result<(), String> {
        match self.leaf_depth {
            Some(d) if d != depth => Err(self.ragged()),
            _ => {
                self.leaf_depth = Some(depth);
                Ok(())
            }
        }
    }

    fn ragged(&self) -> String {
        format!("input {}: nested lists are not rectangular", self.name)
    }

    /// A list of `len` items ended at `depth`.
    fn list(&mut self, depth: usize, len: u64) -> Result<(), String> {
        if self.leaf_depth.is_some_and(|d| d <= depth) {
            return Err(self.ragged());
        }
        if self.dims.len() <= depth {
            self.dims.resize(depth + 1, None);
        }
        match self.dims[depth] {
            Some(n) if n != len => Err(self.ragged()),
            _ => {
                self.dims[depth] = Some(len);
                Ok(())
            }
        }
    }

    fn nested_shape(&self) -> Vec<u64> {
        let depth = self.leaf_depth.unwrap_or(self.dims.len());
        self.dims.iter().take(depth).map_while(|d| *d).collect()
    }

    fn finish(self, shape: Vec<u64>) -> Result<HostTensor, String> {
        let name = self.name;
        HostTensor::new(TensorType::new(self.dtype, shape), self.bytes)
            .map_err(|e| format!("input {name}: {e}"))
    }

    fn bad(&self, v: impl fmt::Display) -> String {
        format!(
            "input {}: {v} is not a valid {} value",
            self.name, self.dtype
        )
    }

    fn add_f64(&mut self, v: f64, depth: usize) -> Result<(), String> {
        let bits = match self.dtype {
            DType::F32 | DType::F16 | DType::BF16 => self.float_bits(v, format_args!("{v:e}"))?,
            _ => return Err(self.bad(v)),
        };
        self.push(bits, depth)
    }

    /// A float's bits in the input's float dtype; a finite value its dtype cannot hold (it
    /// would become infinite) is refused, shown as `shown` prints it.
    fn float_bits(&self, v: f64, shown: impl fmt::Display) -> Result<u64, String> {
        self.dtype.float_bits(v).ok_or_else(|| {
            format!(
                "input {}: {shown} is outside {}'s range",
                self.name, self.dtype
            )
        })
    }

    fn add_i64(&mut self, v: i64, depth: usize) -> Result<(), String> {
        let bits = match self.dtype {
            DType::F32 | DType::F16 | DType::BF16 => self.float_bits(v as f64, v)?,
            DType::I64 => v as u64,
            DType::I32 => i32::try_from(v).map_err(|_| self.bad(v))? as u32 as u64,
            DType::U8 => u8::try_from(v).map_err(|_| self.bad(v))? as u64,
            DType::Bool if v == 0 || v == 1 => v as u64,
            DType::Bool => return Err(self.bad(v)),
        };
        self.push(bits, depth)
    }

    fn add_u64(&mut self, v: u64, depth: usize) -> Result<(), String> {
        match i64::try_from(v) {
            Ok(i) => self.add_i64(i, depth),
            Err(_) if self.dtype.is_float() => {
                let bits = self.float_bits(v as f64, v)?;
                self.push(bits, depth)
            }
            Err(_) => Err(self.bad(v)),
        }
    }

    fn add_bool(&mut self, v: bool, depth: usize) -> Result<(), String> {
        if self.dtype != DType::Bool {
            return Err(self.bad(v));
        }
        self.push(v as u64, depth)
    }

    fn add_str(&mut self, v: &str, depth: usize) -> Result<(), String> {
        let x = match v {
            "nan" | "NaN" => f64::NAN,
            "inf" | "Infinity" => f64::INFINITY,
            "-inf" | "-Infinity" => f64::NEG_INFINITY,
            _ => return Err(self.bad(format_args!("{v:?}"))),
        };
        if !self.dtype.is_float() {
            return Err(self.bad(format_args!("{v:?}")));
        }
        let bits = self.float_bits(x, v)?;
        self.push(bits, depth)
    }
}

/// A tensor object's `"data"`: a scalar or a list.
struct DataSeed<'e, 'a> {
    els: &'e mut Elements<'a>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for DataSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(ListVisitor {
            els: self.els,
            depth: self.depth,
        })
    }
}

/// A list (or a scalar inside one) at `depth`.
struct ListVisitor<'e, 'a> {
    els: &'e mut Elements<'a>,
    depth: usize,
}

macro_rules! element {
    ($($method:ident: $t:ty => $add:ident),* $(,)?) => {
        $(fn $method<E: de::Error>(self, v: $t) -> Result<(), E> {
            self.els.$add(v, self.depth).map_err(E::custom)
        })*
    };
}

impl<'de> Visitor<'de> for ListVisitor<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "input {}'s values as (nested) lists", self.els.name)
    }

    element! {
        visit_f64: f64 => add_f64,
        visit_u64: u64 => add_u64,
        visit_i64: i64 => add_i64,
        visit_bool: bool => add_bool,
        visit_str: &str => add_str,
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= self.els.max_depth {
            return Err(de::Error::custom(format!(
                "input {}: lists are nested deeper than its rank",
                self.els.name
            )));
        }
        let mut len = 0u64;
        while seq
            .next_element_seed(DataSeed {
                els: &mut *self.els,
                depth: self.depth + 1,
            })?
            .is_some()
        {
            len += 1;
        }
        self.els.list(self.depth, len).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[u64]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    fn decode(body: &str, inputs: &[(&str, &TensorType)]) -> Result<RunBody, String> {
        decode_run_json(body.as_bytes(), inputs).map_err(|e| e.to_string())
    }

    #[test]
    fn every_tensor_form_decodes_to_the_same_tensor() {
        let ty = f32s(&[2, 2]);
        let want = HostTensor::from_f32(&[2, 2], &[1.0, 2.5, -3.0, 4.0]).unwrap();
        for body in [
            r#"{"inputs": {"x": [[1, 2.5], [-3, 4]]}}"#,
            r#"{"inputs": {"x": {"dtype": "f32", "shape": [2, 2], "data": [1, 2.5, -3, 4]}}}"#,
            r#"{"inputs": {"x": {"data": [[1.0, 2.5], [-3.0, 4.0]], "dtype": "f32"}}}"#,
            r#"{"tier": "exact", "inputs": {"x": {"shape": [2,2], "data": [[1,2.5],[-3,4]]}}, "other": [1]}"#,
        ] {
            let b = decode(body, &[("x", &ty)]).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(b.inputs["x"], want, "{body}");
        }
        let scalar = decode(r#"{"inputs": {"s": 7}}"#, &[("s", &f32s(&[]))]).unwrap();
        assert_eq!(scalar.inputs["s"].to_f32_vec(), vec![7.0]);
        let empty = decode(r#"{"inputs": {"e": [[], []]}}"#, &[("e", &f32s(&[2, 0]))]).unwrap();
        assert_eq!(empty.inputs["e"].shape(), &[2, 0]);
    }

    #[test]
    fn non_finite_floats_travel_as_strings() {
        let b = decode(
            r#"{"inputs": {"x": ["nan", "inf", "-Infinity", 0]}}"#,
            &[("x", &f32s(&[4]))],
        )
        .unwrap();
        let v = b.inputs["x"].to_f32_vec();
        assert!(v[0].is_nan() && v[1] == f32::INFINITY && v[2] == f32::NEG_INFINITY);
    }

    #[test]
    fn values_out_of_their_dtype_range_are_refused() {
        let e = decode(r#"{"inputs": {"x": [1e39]}}"#, &[("x", &f32s(&[1]))]).unwrap_err();
        assert!(
            e.contains("1e39") && e.contains("outside f32's range"),
            "{e}"
        );
        let f16 = TensorType::new(DType::F16, vec![1]);
        let e = decode(r#"{"inputs": {"x": [70000]}}"#, &[("x", &f16)]).unwrap_err();
        assert!(e.contains("outside f16's range"), "{e}");
        let i32s = TensorType::new(DType::I32, vec![1]);
        assert!(decode(r#"{"inputs": {"x": [2147483648]}}"#, &[("x", &i32s)]).is_err());
        assert!(decode(r#"{"inputs": {"x": [1.5]}}"#, &[("x", &i32s)]).is_err());
        let u8s = TensorType::new(DType::U8, vec![1]);
        assert!(decode(r#"{"inputs": {"x": [-1]}}"#, &[("x", &u8s)]).is_err());
        let bools = TensorType::new(DType::Bool, vec![2]);
        assert!(decode(r#"{"inputs": {"x": [true, 2]}}"#, &[("x", &bools)]).is_err());
        assert!(decode(r#"{"inputs": {"x": [true, 0]}}"#, &[("x", &bools)]).is_ok());
        assert!(decode(r#"{"inputs": {"x": ["inf"]}}"#, &[("x", &i32s)]).is_err());
    }

    #[test]
    fn a_seed_is_a_whole_number_or_refused() {
        let ty = f32s(&[1]);
        let ok = decode(
            r#"{"inputs": {"x": [1]}, "seed": 18446744073709551615}"#,
            &[("x", &ty)],
        );
        assert_eq!(ok.unwrap().seed, Some(u64::MAX));
        for seed in ["-1", "\"7\"", "7.0", "1e3", "[7]"] {
            let body = format!(r#"{{"inputs": {{"x": [1]}}, "seed": {seed}}}"#);
            let e = decode(&body, &[("x", &ty)]).unwrap_err();
            assert!(e.contains("seed"), "{seed}: {e}");
        }
        let none = decode(r#"{"inputs": {"x": [1]}, "seed": null}"#, &[("x", &ty)]);
        assert_eq!(none.unwrap().seed, None);
        let e = decode(r#"{"inputs": {"x": [1]}, "tier": "loose"}"#, &[("x", &ty)]).unwrap_err();
        assert!(e.contains("loose"), "{e}");
    }

    #[test]
    fn names_counts_and_shapes_are_checked_while_parsing() {
        let ty = f32s(&[2]);
        let inputs = [("x", &ty)];
        let square = f32s(&[2, 2]);
        for body in [
            r#"{"inputs": {"x": [[1, 2], 3]}}"#,
            r#"{"inputs": {"x": [3, [1, 2]]}}"#,
            r#"{"inputs": {"x": [[1, 2], [3]]}}"#,
        ] {
            let e = decode(body, &[("x", &square)]).unwrap_err();
            assert!(e.contains("not rectangular"), "{body}: {e}");
        }
        for (body, says) in [
            (r#"{"inputs": {"y": [1, 2]}}"#, "no input y"),
            (r#"{"inputs": {}}"#, "input x (f32[2]) is missing"),
            (r#"{"inputs": {"x": [1, 2, 3]}}"#, "more than the 2 values"),
            (
                r#"{"inputs": {"x": [1]}}"#,
                "is f32[1], the task needs f32[2]",
            ),
            (r#"{"inputs": {"x": [[1]]}}"#, "deeper than its rank"),
            (r#"{"inputs": {"x": [1, 2], "x": [1, 2]}}"#, "twice"),
            (
                r#"{"inputs": {"x": {"dtype": "f16", "data": [1, 2]}}}"#,
                "is f16",
            ),
            (
                r#"{"inputs": {"x": {"shape": [3], "data": [1, 2]}}}"#,
                "does not match",
            ),
            (r#"{"inputs": {"x": [1, 2]}} trailing"#, "trailing"),
            (r#"{"x": [1, 2]}"#, "\"inputs\" is missing"),
            (r#"[1, 2]"#, "expected"),
        ] {
            let e = decode(body, &inputs).unwrap_err();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn a_body_larger_than_its_inputs_allow_is_refused_unread() {
        let ty = f32s(&[4]);
        let limit = max_json_body([&ty]);
        assert_eq!(limit, JSON_SLACK_BYTES + 4 * JSON_BYTES_PER_ELEMENT);
        let body = vec![b' '; limit as usize + 1];
        assert!(matches!(
            decode_run_json(&body, &[("x", &ty)]),
            Err(RunBodyError::TooLarge { .. })
        ));
        // Whitespace up to the limit is fine.
        let mut body = br#"{"inputs": {"x": [1, 2, 3, 4]}}"#.to_vec();
        body.resize(limit as usize, b' ');
        assert!(decode_run_json(&body, &[("x", &ty)]).is_ok());
    }
}
