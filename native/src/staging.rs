//! The SOW apply's blind path (`amps_on_kafka/processor/staging.py`, `replace_blind`):
//! a consumed batch of plain publishes staged as the records they store, in one call.
//!
//! Per record, the Python twin (`staging.blind_records`) checks the headers, decodes the
//! payload with orjson to read its SOW key, and packs the stored record; each step a C
//! call and a Python operation. Here the payload is parsed without building a Python
//! object: the whole document is validated (serde_json) and only the key field is kept.
//!
//! Whatever this code is not sure gives what the twin gives returns None, and the caller
//! runs the twin on the batch: a payload serde_json rejects (orjson may accept it, e.g.
//! nesting deeper than 128), a key that is not non-empty text or a 64-bit integer, the
//! key field twice, a float beyond 1e308, odd header or record types.
use std::borrow::Cow;
use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::json_scan;

/// The bytes of the stored record's header: offset, timestamp ms, deadline ms (0 = never),
/// each big-endian signed 64 bits (`state/record.py`, `_HEADER`).
const HEADER: usize = 24;

/// Floats larger than this are left to orjson: near f64::MAX the two parsers' rounding
/// disagrees on whether a number is infinite, which orjson rejects (serde_json reads
/// 1.79769313486231585e308 as f64::MAX; rounded exactly it is infinite).
pub(crate) const LARGEST_SURE_FLOAT: f64 = 1e308;

/// A SOW key as the twin computes it (`KeyExtractor.many`): the text, or an integer's
/// decimal digits.
pub(crate) enum Key<'de> {
    Text(Cow<'de, str>),
    Unsigned(u64),
    Signed(i64),
}

impl Key<'_> {
    pub(crate) fn text(&self) -> Cow<'_, str> {
        match self {
            Key::Text(text) => Cow::Borrowed(text),
            Key::Unsigned(n) => Cow::Owned(n.to_string()),
            Key::Signed(n) => Cow::Owned(n.to_string()),
        }
    }
}

/// Any JSON value, parsed through (so every string's escapes and every number's range are
/// checked, as orjson checks them) and dropped.
pub(crate) struct Valid;

impl<'de> DeserializeSeed<'de> for Valid {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Valid {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if v.abs() > LARGEST_SURE_FLOAT {
            return Err(E::custom("a float near the limit"));
        }
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Valid)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Valid)?.is_some() {
            map.next_value_seed(Valid)?;
        }
        Ok(())
    }
}

/// A member's name, borrowed from the payload when it has no escapes.
pub(crate) struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// The key field's value: non-empty text or an integer, anything else is Unsure.
struct KeyValue;

impl<'de> DeserializeSeed<'de> for KeyValue {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyValue {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("non-empty text or an integer")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        non_empty(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        non_empty(Cow::Owned(v.to_owned()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Key::Unsigned(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Key::Signed(v))
    }
}

fn non_empty<E: de::Error>(text: Cow<'_, str>) -> Result<Key<'_>, E> {
    if text.is_empty() {
        return Err(E::custom("an empty key"));
    }
    Ok(Key::Text(text))
}

/// The top-level object's key field, every other member validated.
struct Document<'f> {
    field: &'f str,
}

impl<'de> DeserializeSeed<'de> for Document<'_> {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut key = None;
        while let Some(name) = map.next_key_seed(Name)? {
            if name != self.field {
                map.next_value_seed(Valid)?;
            } else if key.is_some() {
                return Err(de::Error::custom("the key field twice"));
            } else {
                key = Some(map.next_value_seed(KeyValue)?);
            }
        }
        key.ok_or_else(|| de::Error::custom("no key field"))
    }
}

/// The SOW key of a JSON payload, or None when the twin must decide.
pub(crate) fn key_of<'p>(payload: &'p [u8], field: &str) -> Option<Key<'p>> {
    if let Some(key) = json_scan::key(payload, field) {
        return Some(key); // the common case, without serde's visitors
    }
    let text = std::str::from_utf8(payload).ok()?;
    let mut parser = serde_json::Deserializer::from_str(text);
    let key = Document { field }.deserialize(&mut parser).ok()?;
    parser.end().ok()?;
    Some(key)
}

/// The twin's `is_plain_publish` over one record's headers: Some(true) for a plain
/// publish, Some(false) for another record, None for a shape it does not expect.
fn plain_publish(headers: &Bound<PyAny>, rules: &HeaderRules) -> Option<bool> {
    if headers.is_none() {
        return Some(true);
    }
    for header in headers.cast::<PyList>().ok()?.iter() {
        let pair = header.cast_into::<PyTuple>().ok()?;
        if pair.len() != 2 {
            return None;
        }
        let name = pair.get_borrowed_item(0).ok()?;
        let name = name.cast::<PyString>().ok()?;
        let kind = rules.kind(name.to_str().ok()?);
        let value = pair.get_borrowed_item(1).ok()?;
        if value.is_none() || kind == Header::Stateful {
            return Some(false);
        }
        let value = value.cast::<PyBytes>().ok()?;
        let value = value.as_bytes();
        let plain = match kind {
            Header::Sequence => !value.is_empty() && value.iter().all(u8::is_ascii_digit),
            Header::Text => value.is_ascii(),
            _ => true,
        };
        if !plain {
            return Some(false);
        }
    }
    Some(true)
}

/// What the plain-publish check makes of a header, by its name.
#[derive(Clone, Copy, PartialEq)]
enum Header {
    /// Changes what the record does to the state (command, expiration, filter, keys).
    Stateful,
    /// The publisher's sequence number: plain digits.
    Sequence,
    /// Text the envelope decodes: plain ASCII.
    Text,
    Other,
}

/// The envelope's header names the plain-publish check reads (`log/envelope.py`), each
/// packed into a number with its length: every name there is a few bytes, and comparing
/// numbers costs less than a call to memcmp per name and header.
struct HeaderRules {
    names: Vec<(u64, Header)>,
}

/// A name of at most 7 bytes as one number (its bytes and its length), None if longer.
fn packed(name: &str) -> Option<u64> {
    let bytes = name.as_bytes();
    if bytes.len() > 7 {
        return None;
    }
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    word[7] = bytes.len() as u8;
    Some(u64::from_le_bytes(word))
}

impl HeaderRules {
    fn new(stateful: Vec<String>, text: Vec<String>, sequence: String) -> PyResult<Self> {
        let kinds = stateful.into_iter().map(|n| (n, Header::Stateful));
        let kinds = kinds.chain(text.into_iter().map(|n| (n, Header::Text)));
        let kinds = kinds.chain([(sequence, Header::Sequence)]);
        let names = kinds
            .map(|(name, kind)| match packed(&name) {
                Some(word) => Ok((word, kind)),
                None => Err(PyValueError::new_err(format!(
                    "header name {name:?} is longer than 7 bytes"
                ))),
            })
            .collect::<PyResult<_>>()?;
        Ok(HeaderRules { names })
    }

    fn kind(&self, name: &str) -> Header {
        let Some(word) = packed(name) else {
            return Header::Other;
        };
        self.names
            .iter()
            .find(|(known, _)| *known == word)
            .map_or(Header::Other, |(_, kind)| *kind)
    }
}

/// One record staged: its key's text, the raw key, the record as stored.
type StagedRecord<'py> = (
    Bound<'py, PyString>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// How much work (bytes parsed, RECORD_WORK a record) a call does between calls of its
/// `give_way`, about a millisecond here. The twin's loops run in bytecode, where the
/// interpreter hands the GIL to a thread that has waited for it 5 ms; a batch of large
/// records would otherwise hold the GIL for the whole batch (48 MB of JSON: 40-60 ms)
/// and keep the gateway's event loop, in the same process, from running.
///
/// `give_way` is a Python function that does nothing: entering it is where the
/// interpreter makes that hand-over. Releasing the GIL from here (`Python::detach`) does
/// not: the waiting thread asks for the GIL only after 5 ms with no switch, and each
/// release and re-take counts as one, so releasing it every millisecond starved it.
const YIELD_WORK: usize = 1 << 20;

/// A record's fixed cost (its method calls and objects) in bytes of parsing, about as long.
const RECORD_WORK: usize = 1024;

/// A staged batch: raw keys, keys, records as stored, in the batch's order.
type StagedBatch<'py> = (Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>);

/// The blind path's staging for a topic whose SOW key is one top-level field of JSON
/// payloads: built once with the field and the envelope's header names, then called
/// with each consumed batch and its headers.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct BlindRecords {
    field: String,
    headers: HeaderRules,
    give_way: Py<PyAny>,
}

#[pymethods]
impl BlindRecords {
    #[new]
    fn new(
        field: String,
        stateful: Vec<String>,
        text: Vec<String>,
        sequence: String,
        give_way: Py<PyAny>,
    ) -> PyResult<Self> {
        let headers = HeaderRules::new(stateful, text, sequence)?;
        Ok(BlindRecords {
            field,
            headers,
            give_way,
        })
    }

    /// (raw keys, keys, records as stored), three lists in the batch's order, or None
    /// when some record is not one the twin would stage or one this code is not sure
    /// of: the caller then runs the twin on the batch. `headers` are the records'
    /// headers, read once by the caller (see `log/envelope.py`, read_headers).
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        records: &Bound<'py, PyList>,
        headers: &Bound<'py, PyList>,
    ) -> PyResult<Option<StagedBatch<'py>>> {
        if records.len() != headers.len() {
            return Ok(None);
        }
        let raw_keys = PyList::empty(py);
        let keys = PyList::empty(py);
        let stored = PyList::empty(py);
        let mut work = 0;
        for (record, headers) in records.iter().zip(headers.iter()) {
            if plain_publish(&headers, &self.headers) != Some(true) {
                return Ok(None);
            }
            let Some((key, raw, packed)) = self.stage(py, &record)? else {
                return Ok(None);
            };
            work += packed.as_bytes().len() + RECORD_WORK;
            if work > YIELD_WORK {
                self.give_way.call0(py)?;
                work = 0;
            }
            keys.append(key)?;
            raw_keys.append(raw)?;
            stored.append(packed)?;
        }
        Ok(Some((raw_keys, keys, stored)))
    }
}

impl BlindRecords {
    /// One record's key and record as stored, None when the twin must decide. Errors
    /// are those of the record's own methods, which the twin would raise as well.
    fn stage<'py>(
        &self,
        py: Python<'py>,
        record: &Bound<'py, PyAny>,
    ) -> PyResult<Option<StagedRecord<'py>>> {
        let value = record.call_method0(intern!(py, "value"))?;
        let Ok(payload) = value.cast::<PyBytes>() else {
            return Ok(None);
        };
        let payload = payload.as_bytes();
        let Some(key) = key_of(payload, &self.field) else {
            return Ok(None);
        };
        let offset = record.call_method0(intern!(py, "offset"))?.extract::<i64>();
        let timestamp = record.call_method0(intern!(py, "timestamp"))?;
        let timestamp = timestamp.get_item(1).and_then(|t| t.extract::<i64>());
        let (Ok(offset), Ok(timestamp)) = (offset, timestamp) else {
            return Ok(None); // the twin's struct.pack raises what it does today
        };
        let packed = PyBytes::new_with(py, HEADER + payload.len(), |buf| {
            buf[..8].copy_from_slice(&offset.to_be_bytes());
            buf[8..16].copy_from_slice(&timestamp.to_be_bytes());
            buf[16..HEADER].fill(0); // the deadline: never
            buf[HEADER..].copy_from_slice(payload);
            Ok(())
        })?;
        let text = key.text();
        let raw = PyBytes::new(py, text.as_bytes());
        Ok(Some((PyString::new(py, &text), raw, packed)))
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<BlindRecords>()
}
