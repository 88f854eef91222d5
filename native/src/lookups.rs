//! A key look-up's answer, every frame written in one call (`amps_on_kafka/server/
//! queries.py` `_answer_at_once` drives it; its Python path is the twin).
//!
//! The gateway answers a `sow` by key on its event loop with the processed ack,
//! `group_begin`, the `sow` frame(s), `group_end` and the stats and completed acks, in
//! one write. Built in Python (each record's `recs` entry through `record_entry` and
//! orjson, `sow_batch`'s header, a length prefix and a join per frame) that was ~55,000
//! of a look-up's ~215,000 instructions through the gateway (docs/performance.md).
//! Here the same bytes are appended to one buffer: the keys every frame echoes come
//! encoded by orjson (`echo`, `acked`), as does each record's `e` (orjson's float
//! format is not Rust's); the rest is written as orjson writes it (`escape_into`,
//! `push_int`, shared with the scan's frames). tests/native/test_lookups.py holds the
//! bytes to the Python path's.
//!
//! `key_answer` goes one step further for a `sow` of `/path = literal` on a topic's one
//! Key path (`queries._key_answer`): it is given each store's stored bytes for the key
//! and reads the header, the expiry and the equality on them (json_scan.rs's `key`), so
//! no `SowRecord`, no decoded payload and no entry tuple is made in Python. It answers
//! only where it is sure of the twin's answer (the record built, `KeyEquality.matches`
//! on its decoded payload, `look_up_answer`): None otherwise, and the twin answers.
use std::borrow::Cow;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString};

use crate::frames::push_frame;
use crate::json_scan;
use crate::scans::{escape_into, int_at, push_int, HEADER, NEVER};
use crate::staging::Key;

/// A record of `look_up_answer`: SOW key, bookmark, timestamp (ms), `e` as JSON (None:
/// the record never expires) and the payload as sent.
type Record<'py> = (
    String,
    String,
    i64,
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
);

/// A record of an answer, whichever call was given it.
struct Entry<'a> {
    key: &'a str,
    bookmark: Cow<'a, str>,
    timestamp: i64,
    seconds: Option<Cow<'a, [u8]>>,
    payload: &'a [u8],
}

/// Append one frame (frames.rs's `push_frame`), or the error an answer past 4 GiB gets.
fn frame(out: &mut Vec<u8>, header: &[&[u8]], payloads: &[&[u8]]) -> PyResult<()> {
    push_frame(out, header, payloads).ok_or_else(|| {
        PyValueError::new_err("an answer's frame past 4 GiB: a frame's length is at most 4 GiB")
    })
}

/// A record's `recs` entry, as `record_entry` makes it and orjson writes it.
fn entry(out: &mut Vec<u8>, record: &Entry) {
    out.extend_from_slice(b"{\"k\":\"");
    escape_into(out, record.key);
    out.extend_from_slice(b"\",\"bm\":\"");
    escape_into(out, &record.bookmark);
    out.extend_from_slice(b"\",\"ts\":");
    push_int(out, record.timestamp);
    if let Some(seconds) = &record.seconds {
        out.extend_from_slice(b",\"e\":");
        out.extend_from_slice(seconds);
    }
    out.extend_from_slice(b",\"n\":");
    push_int(out, record.payload.len() as i64);
    out.push(b'}');
}

/// The `sow` frames of `records`, cut as `queries.batches` cuts them: after `batch`
/// records, or once their payloads reach `batch_bytes`. How many frames.
fn sow_frames(
    out: &mut Vec<u8>,
    echo: &[u8],
    records: &[Entry],
    batch: usize,
    batch_bytes: usize,
) -> PyResult<usize> {
    let (mut frames, mut first) = (0, 0);
    let mut payload = 0;
    for (at, record) in records.iter().enumerate() {
        payload += record.payload.len();
        if at + 1 - first >= batch || payload >= batch_bytes || at + 1 == records.len() {
            let chunk = &records[first..=at];
            let mut entries = Vec::new();
            for (index, record) in chunk.iter().enumerate() {
                if index > 0 {
                    entries.push(b',');
                }
                entry(&mut entries, record);
            }
            let header: [&[u8]; 5] = [b"{\"c\":\"sow\",", echo, b",\"recs\":[", &entries, b"]}"];
            let payloads: Vec<&[u8]> = chunk.iter().map(|record| record.payload).collect();
            frame(out, &header, &payloads)?;
            (frames, first, payload) = (frames + 1, at + 1, 0);
        }
    }
    Ok(frames)
}

/// The answer's frames, one bytes for one write, and how many. `echo`: the echoed keys
/// as group frames carry them (`"cid":..,"t":..`, no braces), `acked`: as acks carry
/// them (`s` too); `wants`: the processed, stats and completed acks asked for;
/// `matches`: the stats ack's matches (`records_returned` is `records.len()`).
#[allow(clippy::too_many_arguments)]
fn answer<'py>(
    py: Python<'py>,
    echo: &[u8],
    acked: &[u8],
    wants: (bool, bool, bool),
    records: &[Entry],
    matches: usize,
    batch: usize,
    batch_bytes: usize,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    if batch == 0 {
        return Err(PyValueError::new_err(
            "look_up_answer: a batch of at least one record",
        ));
    }
    let (processed, stats, completed) = wants;
    let payloads: usize = records.iter().map(|record| record.payload.len()).sum();
    let mut out = Vec::with_capacity(512 + acked.len() * 6 + payloads + records.len() * 96);
    let ack_head: &[u8] = b"{\"c\":\"ack\",\"a\":\"";
    let success: &[u8] = b"\",\"status\":\"success\",";
    let mut count = 2;
    if processed {
        frame(
            &mut out,
            &[ack_head, b"processed", success, acked, b"}"],
            &[],
        )?;
        count += 1;
    }
    frame(&mut out, &[b"{\"c\":\"group_begin\",", echo, b"}"], &[])?;
    count += sow_frames(&mut out, echo, records, batch, batch_bytes)?;
    frame(&mut out, &[b"{\"c\":\"group_end\",", echo, b"}"], &[])?;
    if stats {
        let mut counts = b",\"matches\":".to_vec();
        push_int(&mut counts, matches as i64);
        counts.extend_from_slice(b",\"records_returned\":");
        push_int(&mut counts, records.len() as i64);
        frame(
            &mut out,
            &[ack_head, b"stats", success, acked, &counts, b"}"],
            &[],
        )?;
        count += 1;
    }
    if completed {
        frame(
            &mut out,
            &[ack_head, b"completed", success, acked, b"}"],
            &[],
        )?;
        count += 1;
    }
    Ok((PyBytes::new(py, &out), count))
}

/// `answer` for records the caller made (`queries._answer_at_once`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn look_up_answer<'py>(
    py: Python<'py>,
    echo: &[u8],
    acked: &[u8],
    wants: (bool, bool, bool),
    records: Vec<Record<'py>>,
    matches: usize,
    batch: usize,
    batch_bytes: usize,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let entries: Vec<Entry> = records
        .iter()
        .map(|(key, bookmark, timestamp, seconds, payload)| Entry {
            key,
            bookmark: Cow::Borrowed(bookmark),
            timestamp: *timestamp,
            seconds: seconds
                .as_ref()
                .map(|seconds| Cow::Borrowed(seconds.as_bytes())),
            payload: payload.as_bytes(),
        })
        .collect();
    answer(
        py,
        echo,
        acked,
        wants,
        &entries,
        matches,
        batch,
        batch_bytes,
    )
}

/// Whether `KeyEquality.matches` gives true for a payload whose `field` holds `found`,
/// when it is sure: a value of the literal's own type is decided by `==`; any other
/// (a number in a text, a text for a number) is the compiled filter's to decide.
fn equal(found: &Key, literal: &Bound<PyAny>) -> Option<bool> {
    if let Ok(text) = literal.cast::<PyString>() {
        return match found {
            Key::Text(value) => Some(value.as_ref() == text.to_str().ok()?),
            _ => None,
        };
    }
    let number: i64 = literal.cast::<PyInt>().ok()?.extract().ok()?;
    match found {
        Key::Unsigned(value) => Some(u64::try_from(number).is_ok_and(|n| n == *value)),
        Key::Signed(value) => Some(number == *value),
        Key::Text(_) => None,
    }
}

/// A record's `e` as orjson writes `SowRecord.expiration`, `(deadline - timestamp) / 1000`:
/// the shortest text that reads back as that double (as Rust's `Display` writes it), with
/// `.0` on a whole number. None outside 1 ms to 10^15 ms, where orjson may write an
/// exponent (from 1e16 s) and the twin answers.
fn seconds(deadline: i64, timestamp: i64) -> Option<String> {
    let millis = deadline.checked_sub(timestamp)?;
    if !(1..1_000_000_000_000_000).contains(&millis) {
        return None;
    }
    let mut text = (millis as f64 / 1000.0).to_string();
    if !text.contains('.') {
        text.push_str(".0");
    }
    Some(text)
}

/// A `sow` of `/field = literal` answered from the stored bytes (`queries._key_answer`):
/// `stored` is each store's (partition, stored record) for `sow_key`, read in one moment
/// with the clock `now`; a record `expiring` past its deadline is left out, one whose
/// payload's top-level `field` is not the literal too; a record that will expire gets its
/// `e` (`seconds`). None where the twin must decide: an `e` `seconds` does not write, a
/// stored record shorter than
/// its header, a payload the scan is not sure of, a field of another type than the
/// literal's, a literal that is neither a text nor an int (the caller gives only those).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn key_answer<'py>(
    py: Python<'py>,
    echo: &[u8],
    acked: &[u8],
    wants: (bool, bool, bool),
    topic: &str,
    sow_key: &str,
    field: &str,
    literal: &Bound<'py, PyAny>,
    stored: Vec<(i64, Bound<'py, PyBytes>)>,
    now: i64,
    expiring: bool,
    batch: usize,
    batch_bytes: usize,
) -> PyResult<Option<(Bound<'py, PyBytes>, usize)>> {
    let mut kept = Vec::with_capacity(stored.len());
    for (partition, record) in &stored {
        let record = record.as_bytes();
        if record.len() < HEADER {
            return Ok(None);
        }
        let (offset, timestamp, deadline) =
            (int_at(record, 0), int_at(record, 8), int_at(record, 16));
        if expiring && deadline != NEVER && deadline <= now {
            continue;
        }
        let e = if deadline == NEVER {
            None
        } else {
            let Some(text) = seconds(deadline, timestamp) else {
                return Ok(None);
            };
            Some(Cow::Owned(text.into_bytes()))
        };
        let payload = &record[HEADER..];
        let Some(found) = json_scan::key(payload, field) else {
            return Ok(None);
        };
        match equal(&found, literal) {
            None => return Ok(None),
            Some(false) => continue,
            Some(true) => {}
        }
        kept.push(Entry {
            key: sow_key,
            bookmark: Cow::Owned(format!("{topic}|{partition}|{offset}|")),
            timestamp,
            seconds: e,
            payload,
        });
    }
    let matches = kept.len();
    answer(py, echo, acked, wants, &kept, matches, batch, batch_bytes).map(Some)
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(look_up_answer, m)?)?;
    m.add_function(wrap_pyfunction!(key_answer, m)?)
}
