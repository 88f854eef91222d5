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
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::frames::push_frame;
use crate::scans::{escape_into, push_int};

/// A record of the answer: SOW key, bookmark, timestamp (ms), `e` as JSON (None: the
/// record never expires) and the payload as sent.
type Record<'py> = (
    String,
    String,
    i64,
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
);

/// Append one frame (frames.rs's `push_frame`), or the error an answer past 4 GiB gets.
fn frame(out: &mut Vec<u8>, header: &[&[u8]], payloads: &[&[u8]]) -> PyResult<()> {
    push_frame(out, header, payloads).ok_or_else(|| {
        PyValueError::new_err("an answer's frame past 4 GiB: a frame's length is at most 4 GiB")
    })
}

/// A record's `recs` entry, as `record_entry` makes it and orjson writes it.
fn entry(out: &mut Vec<u8>, record: &Record) {
    let (key, bookmark, timestamp, seconds, payload) = record;
    out.extend_from_slice(b"{\"k\":\"");
    escape_into(out, key);
    out.extend_from_slice(b"\",\"bm\":\"");
    escape_into(out, bookmark);
    out.extend_from_slice(b"\",\"ts\":");
    push_int(out, *timestamp);
    if let Some(seconds) = seconds {
        out.extend_from_slice(b",\"e\":");
        out.extend_from_slice(seconds.as_bytes());
    }
    out.extend_from_slice(b",\"n\":");
    push_int(out, payload.as_bytes().len() as i64);
    out.push(b'}');
}

/// The `sow` frames of `records`, cut as `queries.batches` cuts them: after `batch`
/// records, or once their payloads reach `batch_bytes`. How many frames.
fn sow_frames(
    out: &mut Vec<u8>,
    echo: &[u8],
    records: &[Record],
    batch: usize,
    batch_bytes: usize,
) -> PyResult<usize> {
    let (mut frames, mut first) = (0, 0);
    let mut payload = 0;
    for (at, record) in records.iter().enumerate() {
        payload += record.4.as_bytes().len();
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
            let payloads: Vec<&[u8]> = chunk.iter().map(|record| record.4.as_bytes()).collect();
            frame(out, &header, &payloads)?;
            (frames, first, payload) = (frames + 1, at + 1, 0);
        }
    }
    Ok(frames)
}

/// The answer's frames, one bytes for one write, and how many. `echo`: the echoed keys
/// as group frames carry them (`"cid":..,"t":..`, no braces), `acked`: as acks carry
/// them (`s` too); `wants`: the processed, stats and completed acks asked for;
/// `matches`: the stats ack's matches (`records_returned` is `len(records)`).
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
    if batch == 0 {
        return Err(PyValueError::new_err(
            "look_up_answer: a batch of at least one record",
        ));
    }
    let (processed, stats, completed) = wants;
    let payloads: usize = records.iter().map(|record| record.4.as_bytes().len()).sum();
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
    count += sow_frames(&mut out, echo, &records, batch, batch_bytes)?;
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

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(look_up_answer, m)?)
}
