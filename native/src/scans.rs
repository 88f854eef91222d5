//! A streamed SOW scan's `sow` frames, built from the stored records by the compiled core
//! (`amps_on_kafka/server/scans.py` drives it; `docs/performance.md`, the scan).
//!
//! The Python path builds a `SowRecord` for every record a scan keeps, then its `recs`
//! entry (a dict), then the frame (orjson): about 0.9 us of the gateway's CPU per record
//! kept, the largest cost of a scan after the compiled filter. Here the loop over a
//! store's RocksDB iterator runs in Rust: each record's header is read, an expired record
//! skipped, the compiled filter (filters.rs) asked directly, and a kept record's `recs`
//! entry and payload appended to the open frame's buffers. The frames are byte for byte
//! those of `encode_frame(*sow_batch(...))` (held to them by tests/native/test_scans.py).
//!
//! A record's expiration (`e`, seconds as a float) is written by a Python function given
//! to the constructor (orjson's float format is not Rust's). A record this code is not
//! sure of is handed back to Python, which decides it and adds it with `add` (its entry
//! encoded by orjson): one the filter is not sure of, a key that is not UTF-8, a record
//! shorter than its header.
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::filters::RawFilter;

/// A stored record's header: offset, timestamp (ms) and deadline (ms, 0: never), each a
/// big-endian signed 64-bit integer (`amps_on_kafka/state/record.py`).
pub(crate) const HEADER: usize = 24;
pub(crate) const NEVER: i64 = 0;

pub(crate) fn int_at(stored: &[u8], at: usize) -> i64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&stored[at..at + 8]);
    i64::from_be_bytes(word)
}

/// `value`'s decimal digits (core::fmt's `write!` was a tenth of the read's time).
pub(crate) fn push_int(out: &mut Vec<u8>, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut left = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (left % 10) as u8;
        left /= 10;
        if left == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// `text` as orjson writes a JSON string's contents: `"` and `\` escaped, control
/// characters as their short escape or `\u00xx`, everything else as it is.
pub(crate) fn escape_into(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in text.as_bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xf)]);
            }
            _ => out.push(byte),
        }
    }
}

/// The `sow` frames of a streamed scan: a frame is closed at `batch` records or once its
/// payloads reach `batch_bytes` (as `queries.batches` cuts them), the last one left open.
#[pyclass(module = "amps_on_kafka_native")]
struct SowFrames {
    /// The header's JSON up to its `recs` list's first entry: `{"c":"sow",...,"recs":[`.
    prefix: Vec<u8>,
    batch: usize,
    batch_bytes: usize,
    /// `seconds(deadline, timestamp)`: the JSON of a record's `e`.
    seconds: Py<PyAny>,
    /// The open frame's `recs` entries, comma-separated, and its payloads.
    entries: Vec<u8>,
    payloads: Vec<u8>,
    open: usize,
    /// The frames closed since the last `take`, and the records they hold.
    closed: Vec<Py<PyBytes>>,
    closed_records: usize,
}

impl SowFrames {
    fn entry(&mut self, meta: impl FnOnce(&mut Vec<u8>)) {
        if self.open > 0 {
            self.entries.push(b',');
        }
        meta(&mut self.entries);
        self.open += 1;
    }

    fn close(&mut self, py: Python) -> PyResult<()> {
        if self.open == 0 {
            return Ok(());
        }
        let header = self.prefix.len() + self.entries.len() + 2;
        let total = 4 + header + self.payloads.len();
        if total > u32::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "a sow frame of {total} bytes: a frame's length is at most 4 GiB"
            )));
        }
        let frame = PyBytes::new_with(py, 4 + total, |out| {
            let lengths = [(total as u32).to_be_bytes(), (header as u32).to_be_bytes()];
            let mut at = 0;
            for part in [
                &lengths[0][..],
                &lengths[1][..],
                &self.prefix,
                &self.entries,
                b"]}",
                &self.payloads,
            ] {
                out[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            Ok(())
        });
        self.closed.push(frame?.unbind());
        self.closed_records += self.open;
        self.entries.clear();
        self.payloads.clear();
        self.open = 0;
        Ok(())
    }

    fn added(&mut self, py: Python, payload: &[u8]) -> PyResult<()> {
        self.payloads.extend_from_slice(payload);
        if self.open >= self.batch || self.payloads.len() >= self.batch_bytes {
            self.close(py)?;
        }
        Ok(())
    }
}

#[pymethods]
impl SowFrames {
    #[new]
    fn new(prefix: &[u8], batch: usize, batch_bytes: usize, seconds: Py<PyAny>) -> PyResult<Self> {
        if batch == 0 {
            return Err(PyValueError::new_err(
                "SowFrames: a batch of at least one record",
            ));
        }
        Ok(SowFrames {
            prefix: prefix.to_vec(),
            batch,
            batch_bytes,
            seconds,
            entries: Vec::new(),
            payloads: Vec::new(),
            open: 0,
            closed: Vec::new(),
            closed_records: 0,
        })
    }

    /// Records in the frames closed since the last `take`.
    #[getter]
    fn closed(&self) -> usize {
        self.closed_records
    }

    /// Add a record whose `recs` entry Python encoded (a JSON object, `n` included).
    fn add(&mut self, py: Python, entry: &[u8], payload: &[u8]) -> PyResult<()> {
        self.entry(|out| out.extend_from_slice(entry));
        self.added(py, payload)
    }

    /// Read a store's records from `iterator` (rocksdict's, positioned on the next one)
    /// until the frames closed since the last `take` hold `limit` records or it ends; None then, or the stored bytes of a
    /// record left to Python (the iterator stays on it). `check` is the compiled filter
    /// (None: keep every record), `bookmark` the JSON-escaped text `"topic|partition|`,
    /// `expired_by` the expiry clock (ms; None: nothing expires).
    #[pyo3(signature = (iterator, check, bookmark, expired_by, limit))]
    fn read<'py>(
        &mut self,
        iterator: &Bound<'py, PyAny>,
        check: Option<PyRef<'py, RawFilter>>,
        bookmark: &[u8],
        expired_by: Option<i64>,
        limit: usize,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let py = iterator.py();
        // the bound methods, looked up once a call (not per record)
        let [valid, value, key, next] = ["valid", "value", "key", "next"]
            .map(|name| iterator.getattr(PyString::intern(py, name)));
        let (valid, value, key, next) = (valid?, value?, key?, next?);
        while self.closed_records < limit {
            // `value` is None where the iterator is not valid: one call a record, not two
            let value = value.call0()?;
            if value.is_none() && !valid.call0()?.is_truthy()? {
                break;
            }
            let value = value.cast_into::<PyBytes>()?;
            let stored = value.as_bytes();
            if stored.len() < HEADER {
                return Ok(Some(value));
            }
            let deadline = int_at(stored, 16);
            let expired = deadline != NEVER && expired_by.is_some_and(|by| deadline <= by);
            let kept = match (&check, expired) {
                (_, true) => false,
                (None, false) => true,
                (Some(check), false) => match check.check(stored) {
                    Some(kept) => kept,
                    None => return Ok(Some(value)),
                },
            };
            if kept {
                let seconds = if deadline == NEVER {
                    None
                } else {
                    let seconds = self.seconds.bind(py).call1((deadline, int_at(stored, 8)))?;
                    Some(seconds.cast_into::<PyBytes>()?)
                };
                let name = key.call0()?.cast_into::<PyBytes>()?;
                let Ok(name) = std::str::from_utf8(name.as_bytes()) else {
                    return Ok(Some(value));
                };
                let payload = &stored[HEADER..];
                let (offset, timestamp) = (int_at(stored, 0), int_at(stored, 8));
                self.entry(|out| {
                    out.extend_from_slice(b"{\"k\":\"");
                    escape_into(out, name);
                    out.extend_from_slice(b"\",\"bm\":");
                    out.extend_from_slice(bookmark);
                    push_int(out, offset);
                    out.extend_from_slice(b"|\",\"ts\":");
                    push_int(out, timestamp);
                    if let Some(seconds) = seconds {
                        out.extend_from_slice(b",\"e\":");
                        out.extend_from_slice(seconds.as_bytes());
                    }
                    out.extend_from_slice(b",\"n\":");
                    push_int(out, payload.len() as i64);
                    out.push(b'}');
                });
                self.added(py, payload)?;
            }
            next.call0()?;
        }
        Ok(None)
    }

    /// The frames closed since the last call (with `all`, the open one too) and the
    /// records they hold.
    fn take<'py>(&mut self, py: Python<'py>, all: bool) -> PyResult<(Bound<'py, PyList>, usize)> {
        if all {
            self.close(py)?;
        }
        let frames = PyList::new(py, self.closed.drain(..))?;
        let records = std::mem::take(&mut self.closed_records);
        Ok((frames, records))
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<SowFrames>()
}
