//! A filtered SOW scan's filter evaluated on the stored JSON bytes
//! (`amps_on_kafka/expr/raw.py` makes the plan; `PartitionStore.scan_matching` calls it).
//!
//! The Python path decodes every stored record with orjson into a dict and runs the
//! compiled filter on it, so a scan that keeps half its records builds a dict for each
//! record it drops: the largest cost left in a gateway's scan (docs/performance.md). Here
//! a narrow, common shape — comparisons of a path of object fields with a number or a
//! non-empty text, under AND, OR and NOT — is answered while the document is parsed
//! (serde_json, no Python object), every value off the plan's paths validated and dropped.
//!
//! Each record's answer is True, False, or None: not sure, and the caller decodes and
//! filters that record as before. Not sure is whatever could differ from the Python
//! filter (`expr/values.py`): a document serde_json rejects (orjson may accept it), one
//! that is not an object, a plan's key twice in an object, a non-empty array on a path
//! (comparisons lift over arrays), a float within rounding of the literal (serde_json's
//! float parsing may be an ulp off orjson's), a string the numeric-string rules could
//! read as a number.
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString, PyTuple};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::staging::{Name, Valid, LARGEST_SURE_FLOAT};

/// The most distinct fields one object of a plan's paths may name (a bit each).
const MOST_FIELDS: usize = 64;

/// Floats this close to the literal (relatively) are left to the Python filter.
const ROUNDING: f64 = 1e-9;

/// Below this size, how close is measured from here: near zero (subnormal floats) one
/// ulp is most of the value.
const TINY: f64 = 1e-290;

#[derive(Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

enum Literal {
    Num(Num),
    /// Non-empty text, and its value as a number where the language reads one from it
    /// (`values.to_number`): None for text above every number.
    Text {
        text: String,
        numeric: Option<Num>,
    },
}

#[derive(Clone, Copy)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

enum Plan {
    Compare {
        slot: usize,
        op: Op,
        literal: Literal,
    },
    And(Vec<Plan>),
    Or(Vec<Plan>),
    Not(Box<Plan>),
}

/// The plan's paths as a tree of field names; `slot` is where a path ending here keeps
/// the value it found.
#[derive(Default)]
struct Fields {
    slot: Option<usize>,
    children: Vec<(String, Fields)>,
}

impl Fields {
    fn slot_of(&mut self, steps: &[String], slots: &mut usize) -> PyResult<usize> {
        let Some((first, rest)) = steps.split_first() else {
            return Ok(*self.slot.get_or_insert_with(|| {
                *slots += 1;
                *slots - 1
            }));
        };
        let found = self.children.iter().position(|(name, _)| name == first);
        let index = match found {
            Some(index) => index,
            None if self.children.len() < MOST_FIELDS => {
                self.children.push((first.clone(), Fields::default()));
                self.children.len() - 1
            }
            None => return Err(PyValueError::new_err("a filter plan names too many fields")),
        };
        self.children[index].1.slot_of(rest, slots)
    }
}

/// What a path found, as the comparison rules see it.
#[derive(Default)]
enum Field<'de> {
    /// Missing, JSON null, "" or []: NULL.
    #[default]
    Null,
    Bool,
    Num(Num),
    Text(Cow<'de, str>),
    Object,
    /// A non-empty array: comparisons lift over its elements; not handled here.
    Array,
}

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    True,
    False,
    Unknown,
    Unsure,
}

impl Verdict {
    fn of(holds: bool) -> Verdict {
        if holds {
            Verdict::True
        } else {
            Verdict::False
        }
    }
}

impl Op {
    fn parse(text: &str) -> PyResult<Op> {
        Ok(match text {
            "=" => Op::Eq,
            "!=" => Op::Ne,
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            _ => return Err(PyValueError::new_err(format!("not a comparison: {text:?}"))),
        })
    }

    fn holds(self, order: Ordering) -> bool {
        match self {
            Op::Eq => order == Ordering::Equal,
            Op::Ne => order != Ordering::Equal,
            Op::Lt => order == Ordering::Less,
            Op::Le => order != Ordering::Greater,
            Op::Gt => order == Ordering::Greater,
            Op::Ge => order != Ordering::Less,
        }
    }
}

/// An integer against a finite float, exactly (as Python compares int with float).
fn int_float(int: i128, float: f64) -> Ordering {
    const LIMIT: f64 = 1.7e38; // below 2**127: the float's whole part fits an i128
    if float >= LIMIT {
        return Ordering::Less;
    }
    if float <= -LIMIT {
        return Ordering::Greater;
    }
    let whole = float.trunc();
    match int.cmp(&(whole as i128)) {
        Ordering::Equal => whole.partial_cmp(&float).unwrap_or(Ordering::Equal),
        order => order,
    }
}

/// A field's number against the literal's; None when a float read from the document is
/// too close to the literal for serde_json's rounding to be trusted.
fn numbers(field: Num, literal: Num) -> Option<Ordering> {
    match (field, literal) {
        (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
        (Num::Int(a), Num::Float(b)) => Some(int_float(a, b)),
        (Num::Float(a), literal) => {
            let b = match literal {
                Num::Int(b) => b as f64,
                Num::Float(b) => b,
            };
            if (a - b).abs() <= ROUNDING * a.abs().max(b.abs()).max(TINY) {
                return None;
            }
            a.partial_cmp(&b)
        }
    }
}

/// Text the numeric-string rules surely read as no number: a character no number has.
fn surely_not_numeric(text: &str) -> bool {
    !text.bytes().all(|b| b"0123456789+-.eE".contains(&b))
}

fn compare(field: &Field, op: Op, literal: &Literal) -> Verdict {
    let order = match (field, literal) {
        (Field::Null | Field::Object, _) => return Verdict::Unknown,
        (Field::Array, _) => return Verdict::Unsure,
        (Field::Bool, _) => {
            // a boolean equals only a boolean; ordered against anything else: unknown
            return match op {
                Op::Eq => Verdict::False,
                Op::Ne => Verdict::True,
                _ => Verdict::Unknown,
            };
        }
        (Field::Num(a), Literal::Num(b)) => numbers(*a, *b),
        (Field::Num(a), Literal::Text { numeric, .. }) => match numeric {
            Some(b) => numbers(*a, *b),
            None => Some(Ordering::Less), // text that is no number is above every number
        },
        (Field::Text(a), _) if a.is_empty() => return Verdict::Unknown,
        (Field::Text(a), Literal::Text { text, .. }) => Some(a.as_ref().cmp(text.as_str())),
        (Field::Text(a), Literal::Num(_)) if surely_not_numeric(a) => Some(Ordering::Greater),
        (Field::Text(_), Literal::Num(_)) => None,
    };
    order.map_or(Verdict::Unsure, |order| Verdict::of(op.holds(order)))
}

impl Plan {
    fn verdict(&self, fields: &[Field]) -> Verdict {
        match self {
            Plan::Compare { slot, op, literal } => compare(&fields[*slot], *op, literal),
            Plan::And(parts) => combine(parts, fields, Verdict::False, Verdict::True),
            Plan::Or(parts) => combine(parts, fields, Verdict::True, Verdict::False),
            Plan::Not(part) => match part.verdict(fields) {
                Verdict::True => Verdict::False,
                Verdict::False => Verdict::True,
                other => other,
            },
        }
    }
}

/// Three-valued AND (`decisive` False) or OR (True): a decisive part decides, whatever
/// the parts not sure of would have been; otherwise not sure, unknown, or `otherwise`.
fn combine(parts: &[Plan], fields: &[Field], decisive: Verdict, otherwise: Verdict) -> Verdict {
    let mut result = otherwise;
    for part in parts {
        match part.verdict(fields) {
            found if found == decisive => return decisive,
            Verdict::Unsure => result = Verdict::Unsure,
            Verdict::Unknown if result != Verdict::Unsure => result = Verdict::Unknown,
            _ => {}
        }
    }
    result
}

/// A value at a node of the plan's fields: kept in its slot if a path ends here, its
/// members on a path walked into, everything else validated and dropped.
struct At<'f, 's, 'de> {
    fields: &'f Fields,
    found: &'s mut [Field<'de>],
}

impl<'de> At<'_, '_, 'de> {
    fn keep<E>(self, value: Field<'de>) -> Result<(), E> {
        if let Some(slot) = self.fields.slot {
            self.found[slot] = value;
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for At<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for At<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.keep(Field::Bool)
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.keep(Field::Num(Num::Int(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.keep(Field::Num(Num::Int(v.into())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if v.abs() > LARGEST_SURE_FLOAT {
            return Err(E::custom("a float near the limit"));
        }
        self.keep(Field::Num(Num::Float(v)))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<(), E> {
        self.keep(Field::Text(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.keep(Field::Text(Cow::Owned(v.to_owned())))
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.keep(Field::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if seq.next_element_seed(Valid)?.is_none() {
            return self.keep(Field::Null);
        }
        while seq.next_element_seed(Valid)?.is_some() {}
        self.keep(Field::Array)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = 0u64;
        while let Some(name) = map.next_key_seed(Name)? {
            let children = &self.fields.children;
            let Some(index) = children.iter().position(|(field, _)| *field == name) else {
                map.next_value_seed(Valid)?;
                continue;
            };
            if seen & (1 << index) != 0 {
                return Err(de::Error::custom("a field twice"));
            }
            seen |= 1 << index;
            let fields = &children[index].1;
            map.next_value_seed(At {
                fields,
                found: &mut *self.found,
            })?;
        }
        self.keep(Field::Object)
    }
}

/// A filter of the narrow shape, built once from its plan (`expr/raw.py`), called with
/// each stored record: True or False as the Python filter answers on its decoded
/// payload, None when not sure.
#[pyclass(frozen, module = "amps_on_kafka_native")]
pub(crate) struct RawFilter {
    plan: Plan,
    fields: Fields,
    slots: usize,
    /// Bytes before the payload (the stored record's header).
    skip: usize,
}

#[pymethods]
impl RawFilter {
    #[new]
    fn new(plan: &Bound<PyAny>, skip: usize) -> PyResult<Self> {
        let (mut fields, mut slots) = (Fields::default(), 0);
        let plan = parse(plan, &mut fields, &mut slots)?;
        Ok(RawFilter {
            plan,
            fields,
            slots,
            skip,
        })
    }

    fn __call__(&self, stored: &[u8]) -> Option<bool> {
        self.check(stored)
    }
}

impl RawFilter {
    /// The answer on one stored record (scans.rs calls it without a Python call).
    pub(crate) fn check(&self, stored: &[u8]) -> Option<bool> {
        let payload = std::str::from_utf8(stored.get(self.skip..)?).ok()?;
        let mut found: Vec<Field> = (0..self.slots).map(|_| Field::Null).collect();
        let mut parser = serde_json::Deserializer::from_str(payload);
        let at = At {
            fields: &self.fields,
            found: &mut found,
        };
        parser.deserialize_map(at).ok()?;
        parser.end().ok()?;
        match self.plan.verdict(&found) {
            Verdict::True => Some(true),
            Verdict::False | Verdict::Unknown => Some(false),
            Verdict::Unsure => None,
        }
    }
}

fn error(what: &str) -> PyErr {
    PyValueError::new_err(format!("a filter plan: {what}"))
}

/// A plan from its Python form: ("and" | "or", (plans...)), ("not", plan), or
/// ("cmp", (field names...), op, literal, the literal text's number or None).
fn parse(plan: &Bound<PyAny>, fields: &mut Fields, slots: &mut usize) -> PyResult<Plan> {
    let plan = plan.cast::<PyTuple>().map_err(|_| error("not a tuple"))?;
    let tag = plan.get_item(0)?;
    let tag = tag.cast::<PyString>().map_err(|_| error("no tag"))?;
    let parts = |at: usize, fields: &mut Fields, slots: &mut usize| -> PyResult<Vec<Plan>> {
        let items = plan.get_item(at)?;
        items
            .try_iter()?
            .map(|item| parse(&item?, fields, slots))
            .collect()
    };
    Ok(match tag.to_str()? {
        "and" => Plan::And(parts(1, fields, slots)?),
        "or" => Plan::Or(parts(1, fields, slots)?),
        "not" => Plan::Not(Box::new(parse(&plan.get_item(1)?, fields, slots)?)),
        "cmp" => {
            let steps: Vec<String> = plan.get_item(1)?.extract()?;
            if steps.is_empty() {
                return Err(error("an empty path"));
            }
            let slot = fields.slot_of(&steps, slots)?;
            let op = Op::parse(plan.get_item(2)?.cast::<PyString>()?.to_str()?)?;
            let literal = literal(&plan.get_item(3)?, &plan.get_item(4)?)?;
            Plan::Compare { slot, op, literal }
        }
        other => return Err(error(&format!("unknown tag {other:?}"))),
    })
}

fn literal(value: &Bound<PyAny>, numeric: &Bound<PyAny>) -> PyResult<Literal> {
    if let Ok(text) = value.cast::<PyString>() {
        let text = text.to_str()?.to_owned();
        if text.is_empty() {
            return Err(error("an empty text is NULL"));
        }
        let numeric = if numeric.is_none() {
            None
        } else {
            Some(number(numeric)?)
        };
        return Ok(Literal::Text { text, numeric });
    }
    Ok(Literal::Num(number(value)?))
}

fn number(value: &Bound<PyAny>) -> PyResult<Num> {
    if value.is_instance_of::<PyBool>() {
        return Err(error("a boolean literal"));
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(int) = value.extract::<i64>() {
            return Ok(Num::Int(int.into()));
        }
        return Ok(Num::Int(value.extract::<u64>()?.into()));
    }
    if value.is_instance_of::<PyFloat>() {
        let float: f64 = value.extract()?;
        if float.is_finite() {
            return Ok(Num::Float(float));
        }
    }
    Err(error(
        "a literal that is not a 64-bit integer, a finite float or text",
    ))
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<RawFilter>()
}
