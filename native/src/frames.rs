//! The gateway's read of a client's frames (`amps_on_kafka/protocol/frames.py`,
//! `split_frames`): the whole frames of a read, split in one call, a plain publish's
//! header read without building a Python object for it.
//!
//! A busy publisher's read holds a few hundred frames, nearly all of them plain publishes
//! (`{"c": "publish", "t": topic, "s": n}`). The Python twin decodes each header with
//! orjson into a dict, checks its shape and makes a (topic, s, payload) tuple of it; here
//! the header is parsed (serde_json) without a dict and the tuple is made directly.
//! Anything this code is not sure of — another command, another key, a key twice, an
//! escape serde_json rejects, a sequence that is not a whole number, a header that is not
//! JSON — is handed to the twin's own `decode(start, header_length, end)`, so the events
//! are the twin's, frame for frame.
//!
//! `publish_key` reads such a publish's SOW key from its payload (`log/publisher.py`,
//! `payload_key`) without decoding it into Python objects: staging.rs's `key_of`, the
//! worker's own reading of the same key.
use std::borrow::Cow;
use std::fmt;

use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyByteArrayMethods, PyBytes, PyDict, PyList, PyString, PyTuple,
};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};

use crate::json_scan;
use crate::staging::{key_of, Name, Valid};

/// A plain publish's topic and sequence (`s`, when given).
struct Plain<'de> {
    topic: Cow<'de, str>,
    sequence: Option<u64>,
}

/// A header that is exactly a plain publish's: `c` "publish", `t` text, at most `s` a
/// whole number, each once; anything else is an error (the twin decides).
struct Header;

impl<'de> DeserializeSeed<'de> for Header {
    type Value = Plain<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Header {
    type Value = Plain<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a plain publish's header")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut publish, mut topic, mut sequence) = (false, None, None);
        while let Some(name) = map.next_key_seed(Name)? {
            match name.as_ref() {
                "c" if !publish => publish = map.next_value_seed(Name)? == "publish",
                "t" if topic.is_none() => topic = Some(map.next_value_seed(Name)?),
                "s" if sequence.is_none() => sequence = Some(map.next_value_seed(Whole)?),
                _ => return Err(de::Error::custom("not a plain publish")),
            }
            if !publish {
                return Err(de::Error::custom("not a plain publish"));
            }
        }
        match topic {
            Some(topic) => Ok(Plain { topic, sequence }),
            None => Err(de::Error::custom("no topic")),
        }
    }
}

/// A whole number >= 0 of at most 64 bits (what orjson reads as an int >= 0).
struct Whole;

impl<'de> DeserializeSeed<'de> for Whole {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<u64, D::Error> {
        deserializer.deserialize_u64(self)
    }
}

impl Visitor<'_> for Whole {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a whole number")
    }

    fn visit_u64<E>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom("a negative number"))
    }
}

/// The plain publish a header holds, or None when the twin must decide.
fn plain(header: &[u8]) -> Option<Plain<'_>> {
    if let Some(plain) = templated(header) {
        return Some(plain);
    }
    let text = std::str::from_utf8(header).ok()?;
    let mut parser = serde_json::Deserializer::from_str(text);
    let plain = Header.deserialize(&mut parser).ok()?;
    parser.end().ok()?;
    Some(plain)
}

/// A plain publish's header as our client writes it (frame_buffer.rs's template,
/// `{"c":"publish","t":"<topic>","s":<digits>}`), read without serde_json's visitors
/// (a third of the split's work); None for any other spelling (spaces, another order, an
/// escape in the topic, a sequence past 19 digits...), which serde_json reads.
fn templated(header: &[u8]) -> Option<Plain<'_>> {
    let rest = header.strip_prefix(br#"{"c":"publish","t":""#)?;
    let end = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    if rest[end] != b'"' {
        return None;
    }
    let topic = std::str::from_utf8(&rest[..end]).ok()?;
    let sequence = match &rest[end + 1..] {
        b"}" => None,
        rest => {
            let digits = rest.strip_prefix(br#","s":"#)?.strip_suffix(b"}")?;
            let whole = digits.iter().all(u8::is_ascii_digit) && !digits.starts_with(b"0");
            if !(whole && (1..=19).contains(&digits.len()) || digits == b"0") {
                return None;
            }
            Some(std::str::from_utf8(digits).ok()?.parse().ok()?)
        }
    };
    Some(Plain {
        topic: Cow::Borrowed(topic),
        sequence,
    })
}

/// Append one frame to `out`, as `encode_frame` lays it out: `>II` (the frame's length
/// after this word, the header's length), the header's parts, then the payloads. None,
/// with nothing appended, when a length does not fit 32 bits (a frame past 4 GiB).
pub(crate) fn push_frame(out: &mut Vec<u8>, header: &[&[u8]], payloads: &[&[u8]]) -> Option<()> {
    let header_length: usize = header.iter().map(|part| part.len()).sum();
    let total = 4 + header_length + payloads.iter().map(|part| part.len()).sum::<usize>();
    let (total, header_length) = (
        u32::try_from(total).ok()?,
        u32::try_from(header_length).ok()?,
    );
    out.reserve(4 + total as usize);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&header_length.to_be_bytes());
    for part in header.iter().chain(payloads) {
        out.extend_from_slice(part);
    }
    Some(())
}

fn length(data: &[u8], at: usize) -> usize {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize
}

/// The frame at `pos` if the buffer holds it whole and it is within `limit`: where its
/// header starts, the header's length and where the frame ends. None for a partial frame
/// or one whose lengths don't add up: the twin's own decode then says which.
fn whole_frame(data: &[u8], pos: usize, limit: usize) -> Option<(usize, usize, usize)> {
    if data.len() < pos + 8 {
        return None;
    }
    let (total, header_length) = (length(data, pos), length(data, pos + 4));
    let end = pos + 4 + total;
    if total < 4 || header_length > total - 4 || total > limit || end > data.len() {
        return None;
    }
    Some((pos + 8, header_length, end))
}

/// `split_frames(buffer, pos, limit, decode)`: the twin's events for the whole frames
/// within `limit` from `pos` on, and the position after them.
#[pyfunction]
fn split_frames<'py>(
    buffer: &Bound<'py, PyByteArray>,
    mut pos: usize,
    limit: usize,
    decode: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let py = buffer.py();
    let events = PyList::empty(py);
    // the last plain publish's topic: a read's publishes share one str (hashed once)
    let mut topic: Option<(String, Bound<'py, PyString>)> = None;
    loop {
        // SAFETY: the bytes are read while no Python code runs; they are borrowed again
        // after each `decode`, which reads the buffer and never resizes it.
        let data = unsafe { buffer.as_bytes() };
        let Some((start, header_length, end)) = whole_frame(data, pos, limit) else {
            break;
        };
        match plain(&data[start..start + header_length]) {
            Some(publish) => {
                let payload = PyBytes::new(py, &data[start + header_length..end]);
                let name = match &topic {
                    Some((text, name)) if *text == publish.topic => name.clone(),
                    _ => {
                        let name = PyString::new(py, &publish.topic);
                        topic = Some((publish.topic.into_owned(), name.clone()));
                        name
                    }
                };
                events.append((name, publish.sequence, payload))?;
            }
            None => events.append(decode.call1((start, header_length, end))?)?,
        }
        pos = end;
    }
    Ok((events, pos))
}

/// `client_frames(buffer, pos, limit, decode, loads, frame)`: the twin's events
/// (protocol/frames.py, split_frames with FrameDecoder._frame) for the whole frames within
/// `limit` from `pos` on, as a client reads them: each header given to `loads` (orjson's)
/// and made `frame(header, payload)` here, with no Python frame of the twin's a frame.
/// A header `loads` refuses, or that is not a JSON object, goes to `decode`, the twin's
/// own, which names the problem (a BadFrame), so the events are the twin's.
#[pyfunction]
fn client_frames<'py>(
    buffer: &Bound<'py, PyByteArray>,
    mut pos: usize,
    limit: usize,
    decode: &Bound<'py, PyAny>,
    loads: &Bound<'py, PyAny>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let py = buffer.py();
    let events = PyList::empty(py);
    loop {
        // SAFETY: the bytes are copied out before any Python code runs (`loads` gets its
        // own bytes object); they are borrowed again after, and nothing here resizes them.
        let data = unsafe { buffer.as_bytes() };
        let Some((start, header_length, end)) = whole_frame(data, pos, limit) else {
            break;
        };
        let header = PyBytes::new(py, &data[start..start + header_length]);
        let payload = PyBytes::new(py, &data[start + header_length..end]);
        match loads.call1((header,)) {
            Ok(parsed) if parsed.is_instance_of::<PyDict>() => {
                events.append(frame.call1((parsed, payload))?)?
            }
            _ => events.append(decode.call1((start, header_length, end))?)?,
        }
        pos = end;
    }
    Ok((events, pos))
}

/// `plain_extent(events, start, last, room, overhead, takes)`: the twin's
/// (server/publishing.py, `plain_extent_twin`) `(end, size)` of the run of Publish tuples
/// from `events[start]` before `last` whose topics `takes` (asked once a topic) and whose
/// payloads plus `overhead` each fit `room` bytes in all, with no Python frame an event.
#[pyfunction]
fn plain_extent(
    events: &Bound<'_, PyList>,
    start: usize,
    last: usize,
    room: i64,
    overhead: i64,
    takes: &Bound<'_, PyAny>,
) -> PyResult<(usize, i64)> {
    let mut known: Vec<(Bound<'_, PyAny>, bool)> = Vec::new();
    let (mut position, mut size) = (start, 0i64);
    while position < last {
        let event = events.get_item(position)?;
        let Ok(event) = event.cast_exact::<PyTuple>() else {
            break;
        };
        let topic = event.get_item(0)?;
        let mut taken = None;
        for (name, verdict) in &known {
            if name.is(&topic) || name.eq(&topic)? {
                taken = Some(*verdict);
                break;
            }
        }
        let taken = match taken {
            Some(taken) => taken,
            None => {
                let verdict = takes.call1((&topic,))?.is_truthy()?;
                known.push((topic, verdict));
                verdict
            }
        };
        let cost = event.get_item(2)?.len()? as i64 + overhead;
        if !taken || size + cost > room {
            break;
        }
        size += cost;
        position += 1;
    }
    Ok((position, size))
}

/// `publish_key(payload, field)`: the twin's `payload_key` — the SOW key (the text, or an
/// integer's digits) when the JSON payload is an object whose top-level `field` holds one;
/// None, with no field, when the payload is JSON; False when the twin must decide (not
/// JSON, another value, or what this code is not sure of: see staging.rs).
#[pyfunction]
fn publish_key<'py>(payload: &Bound<'py, PyBytes>, field: Option<&str>) -> Bound<'py, PyAny> {
    let py = payload.py();
    let bytes = payload.as_bytes();
    match field {
        Some(field) => match key_of(bytes, field) {
            Some(key) => PyString::new(py, &key.text()).into_any(),
            None => PyBool::new(py, false).to_owned().into_any(),
        },
        None if valid(bytes) => py.None().into_bound(py),
        None => PyBool::new(py, false).to_owned().into_any(),
    }
}

/// Whether `payload` is JSON orjson surely takes.
pub(crate) fn valid(payload: &[u8]) -> bool {
    if json_scan::valid(payload) {
        return true;
    }
    let Ok(text) = std::str::from_utf8(payload) else {
        return false;
    };
    let mut parser = serde_json::Deserializer::from_str(text);
    Valid.deserialize(&mut parser).is_ok() && parser.end().is_ok()
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(split_frames, m)?)?;
    m.add_function(wrap_pyfunction!(client_frames, m)?)?;
    m.add_function(wrap_pyfunction!(plain_extent, m)?)?;
    m.add_function(wrap_pyfunction!(publish_key, m)?)
}
