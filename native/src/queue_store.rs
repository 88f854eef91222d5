//! A queue checkpoint's entries (`amps_on_kafka/state/queue_store.py`, `put_entries`; its
//! twin `_put_entries_twin`): each changed message encoded and put in the checkpoint's
//! `WriteBatch`, or its stored copy deleted once it left the queue (runs of consecutive
//! arrival numbers as one range, `delete_runs`).
//!
//! Per entry the twin reads ten attributes, builds a list and a list of header pairs,
//! encodes them with orjson, joins the length, the JSON and the payload, and packs the
//! key: about 1 us of the queue's thread for each message that outlives a checkpoint
//! (with a read-ahead of thousands, most). Here the JSON is written directly, byte for
//! byte what orjson writes (held to it by tests/native/test_queue_store.py). An entry this
//! code is not sure of (a field of another type, an integer beyond 64 bits, text that is
//! not UTF-8) is left to the twin, which encodes it or raises as it always did.
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PyString, PyTuple, PyType};

use crate::queue_store_runs::UnstoredRuns;
use crate::records::{check_layout, locate, read};
use crate::scans::{escape_into, push_int};

/// `NO_DEADLINE`: what the stored entry holds for a message that never expires.
const NO_DEADLINE: i64 = -1;

/// The slots of QueueEntry the checkpoint reads, in the order `Fields` holds them.
const SLOTS: [&str; 13] = [
    "status",
    "seq",
    "stored",
    "id",
    "timestamp",
    "deadline",
    "rank",
    "barrier",
    "deliveries",
    "cancels",
    "ev_pos",
    "headers",
    "payload",
];

/// An entry's slots that a checkpoint reads (borrowed from the entry).
struct Fields<'py>([Bound<'py, PyAny>; 13]);

impl<'py> Fields<'py> {
    fn get(&self, name: usize) -> &Bound<'py, PyAny> {
        &self.0[name]
    }
}

const STATUS: usize = 0;
const SEQ: usize = 1;
const STORED: usize = 2;
const ID: usize = 3;
const TIMESTAMP: usize = 4;
const DEADLINE: usize = 5;
const RANK: usize = 6;
const BARRIER: usize = 7;
const COUNTS: [usize; 3] = [8, 9, 10]; // deliveries, cancels, ev_pos
const HEADERS: usize = 11;
const PAYLOAD: usize = 12;

/// Puts a checkpoint's entries in its batch, leaving to the twin what it is not sure of.
/// An entry's slots are read where the class stores them (a `getattr` each was a fifth
/// of the call).
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct EntryWriter {
    cls: Py<PyType>,
    at: [isize; 13],
    gone: Py<PyTuple>,
    /// The enum class every status in `gone` is a member of, if one is: a status of that
    /// class is gone exactly when it is one of them (a member is the one object of its
    /// value), without a comparison.
    gone_enum: Option<Py<PyType>>,
    twin: Py<PyAny>,
    shortest_range: usize,
}

#[pymethods]
impl EntryWriter {
    /// `cls`: QueueEntry (slots, no `__dict__`); `gone`: the statuses of a message out
    /// of the queue (`GONE`); `twin`: the Python function that puts a list of entries
    /// (`_put_entries_twin`), given any entry that is not a QueueEntry exactly, has a
    /// slot unset or a field this code does not write; `shortest_range`
    /// (`DELETE_RANGE_FROM`): a run of at least this many consecutive arrival numbers
    /// that left the queue is deleted as one range (by default none is: a key each).
    #[new]
    #[pyo3(signature = (cls, gone, twin, shortest_range = usize::MAX))]
    fn new(
        cls: &Bound<PyType>,
        gone: Py<PyTuple>,
        twin: Py<PyAny>,
        shortest_range: usize,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        let mut at = [0; 13];
        for (place, name) in at.iter_mut().zip(SLOTS) {
            *place = locate(cls, name)?;
        }
        let py = cls.py();
        let enum_class = py
            .import(intern!(py, "enum"))?
            .getattr(intern!(py, "Enum"))?;
        let members = gone.bind(py);
        let gone_enum = match members.iter().next() {
            Some(first) => {
                let class = first.get_type();
                let shared = members.iter().all(|member| member.get_type().is(&class));
                (shared && class.is_subclass(&enum_class)?).then(|| class.unbind())
            }
            None => None,
        };
        Ok(Self {
            cls: cls.clone().unbind(),
            at,
            gone,
            gone_enum,
            twin,
            shortest_range,
        })
    }

    /// For each entry: put in `column` of `batch` encoded (and marked stored), or, if it
    /// left the queue and was stored, deleted from it after the puts (`delete_runs`).
    /// Given the queue's `runs`, an unstored entry that only waited (no cancel, and no
    /// delivery where MaxDeliveries counts them) is noted there instead of put, and an
    /// entry leaves them as it leaves the queue or is put.
    #[pyo3(signature = (batch, column, entries, runs = None))]
    fn put(
        &self,
        batch: &Bound<PyAny>,
        column: &Bound<PyAny>,
        entries: &Bound<PyAny>,
        runs: Option<&Bound<UnstoredRuns>>,
    ) -> PyResult<()> {
        let py = batch.py();
        let gone = self.gone.bind(py);
        let mut removed = Vec::new();
        for entry in entries.try_iter()? {
            let entry = entry?;
            let Some((fields, seq)) = self.fields(&entry).and_then(|f| {
                let seq = seq_of(f.get(SEQ))?;
                Some((f, seq))
            }) else {
                self.twin.bind(py).call1((batch, column, [&entry], runs))?;
                continue;
            };
            let stored = fields.get(STORED).is_truthy()?;
            if self.is_gone(gone, fields.get(STATUS))? {
                if stored {
                    removed.push(seq);
                } else if let Some(runs) = runs {
                    if !runs.borrow_mut().leave_id(fields.get(ID)) {
                        self.twin.bind(py).call1((batch, column, [&entry], runs))?;
                    }
                }
                continue;
            }
            if let (Some(runs), false) = (runs, stored) {
                let counted = runs.borrow().deliveries_counted;
                match waited_only(&fields, counted) {
                    Some(true) if runs.borrow_mut().note_id(fields.get(ID), seq) => continue,
                    Some(false) if runs.borrow_mut().leave_id(fields.get(ID)) => {}
                    _ => {
                        self.twin.bind(py).call1((batch, column, [&entry], runs))?;
                        continue;
                    }
                }
            }
            if let Some(value) = encoded(&fields)? {
                batch.call_method1(intern!(py, "put"), (key(py, seq), value, column))?;
                entry.setattr(intern!(py, "stored"), true)?;
            } else {
                self.twin.bind(py).call1((batch, column, [&entry]))?;
            }
        }
        delete_runs(batch, column, removed, self.shortest_range)
    }

    /// `encode_entry(entry)` as this code writes it, or None where it leaves the entry
    /// to the twin.
    fn encode<'py>(&self, entry: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.fields(entry) {
            Some(fields) => encoded(&fields),
            None => Ok(None),
        }
    }
}

impl EntryWriter {
    /// The entry's slots, if it is a QueueEntry (exactly) with all of them set (read
    /// into an array: a vector's allocation and free were a tenth of the walk).
    fn fields<'py>(&self, entry: &Bound<'py, PyAny>) -> Option<Fields<'py>> {
        let py = entry.py();
        if !entry.get_type().is(self.cls.bind(py)) {
            return None;
        }
        let values: [Option<Bound<'py, PyAny>>; 13] = std::array::from_fn(|slot| {
            // SAFETY: `entry` is an instance of the class whose slots were located.
            let value = unsafe { read(entry, self.at[slot]) };
            // SAFETY: a live object the slot holds a reference to, when set.
            (!value.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(py, value) })
        });
        if values.iter().any(Option::is_none) {
            return None;
        }
        Some(Fields(values.map(Option::unwrap)))
    }

    /// Whether `status` is one of `gone`: by identity for a member of their enum, else
    /// as the tuple's `in` compares.
    fn is_gone(&self, gone: &Bound<PyTuple>, status: &Bound<PyAny>) -> PyResult<bool> {
        match &self.gone_enum {
            Some(class) if status.get_type().is(class.bind(status.py())) => {
                Ok(gone.iter().any(|member| member.is(status)))
            }
            _ => gone.contains(status),
        }
    }
}

fn encoded<'py>(fields: &Fields<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let py = fields.get(PAYLOAD).py();
    let Ok(payload) = fields.get(PAYLOAD).cast_exact::<PyBytes>() else {
        return Ok(None);
    };
    let mut meta = Vec::with_capacity(128);
    if !write_meta(&mut meta, fields)? {
        return Ok(None);
    }
    let Ok(length) = u32::try_from(meta.len()) else {
        return Ok(None);
    };
    let payload = payload.as_bytes();
    let value = PyBytes::new_with(py, 4 + meta.len() + payload.len(), |out| {
        out[..4].copy_from_slice(&length.to_be_bytes());
        out[4..4 + meta.len()].copy_from_slice(&meta);
        out[4 + meta.len()..].copy_from_slice(payload);
        Ok(())
    })?;
    Ok(Some(value))
}

/// The entry's JSON (`[topic, partition, offset, timestamp, deadline, rank, barrier,
/// deliveries, cancels, ev_pos, [[name, value], ...]]`) into `out`; false when a field is
/// not what this code writes.
fn write_meta(out: &mut Vec<u8>, fields: &Fields) -> PyResult<bool> {
    let Ok(id) = fields.get(ID).cast_exact::<PyTuple>() else {
        return Ok(false);
    };
    if id.len() != 3 {
        return Ok(false);
    }
    out.push(b'[');
    if !write_text(out, &id.get_item(0)?) {
        return Ok(false);
    }
    for number in [&id.get_item(1)?, &id.get_item(2)?, fields.get(TIMESTAMP)] {
        out.push(b',');
        if !write_int(out, number) {
            return Ok(false);
        }
    }
    out.push(b',');
    let deadline = fields.get(DEADLINE);
    if deadline.is_none() {
        push_int(out, NO_DEADLINE);
    } else if !write_int(out, deadline) {
        return Ok(false);
    }
    out.push(b',');
    if !write_int(out, fields.get(RANK)) {
        return Ok(false);
    }
    let Ok(barrier) = fields.get(BARRIER).cast_exact::<PyBool>() else {
        return Ok(false);
    };
    out.extend_from_slice(if barrier.is_true() {
        b",true"
    } else {
        b",false"
    });
    for count in COUNTS {
        out.push(b',');
        if !write_int(out, fields.get(count)) {
            return Ok(false);
        }
    }
    out.extend_from_slice(b",[");
    if !write_headers(out, fields.get(HEADERS))? {
        return Ok(false);
    }
    out.extend_from_slice(b"]]");
    Ok(true)
}

/// `[name, value]` pairs, the value as latin-1 text or null; false unless `headers` is
/// None or a list of (str, bytes or None) tuples.
fn write_headers(out: &mut Vec<u8>, headers: &Bound<PyAny>) -> PyResult<bool> {
    if headers.is_none() {
        return Ok(true);
    }
    let Ok(headers) = headers.cast_exact::<PyList>() else {
        return Ok(false);
    };
    for (at, header) in headers.iter().enumerate() {
        let Ok(pair) = header.cast_exact::<PyTuple>() else {
            return Ok(false);
        };
        if pair.len() != 2 {
            return Ok(false);
        }
        if at > 0 {
            out.push(b',');
        }
        out.push(b'[');
        if !write_text(out, &pair.get_item(0)?) {
            return Ok(false);
        }
        out.push(b',');
        let value = pair.get_item(1)?;
        if value.is_none() {
            out.extend_from_slice(b"null");
        } else if let Ok(value) = value.cast_exact::<PyBytes>() {
            let text: String = value
                .as_bytes()
                .iter()
                .map(|&byte| char::from(byte))
                .collect();
            out.push(b'"');
            escape_into(out, &text);
            out.push(b'"');
        } else {
            return Ok(false);
        }
        out.push(b']');
    }
    Ok(true)
}

/// A JSON string of `text`, if it is a str (exactly) of valid UTF-8.
fn write_text(out: &mut Vec<u8>, text: &Bound<PyAny>) -> bool {
    let Ok(text) = text.cast_exact::<PyString>() else {
        return false;
    };
    let Ok(text) = text.to_str() else {
        return false;
    };
    out.push(b'"');
    escape_into(out, text);
    out.push(b'"');
    true
}

/// The digits of an int (exactly: not a bool) within orjson's range, 64 bits signed or
/// unsigned.
fn write_int(out: &mut Vec<u8>, number: &Bound<PyAny>) -> bool {
    if !number.is_exact_instance_of::<PyInt>() {
        return false;
    }
    if let Ok(n) = number.extract::<i64>() {
        push_int(out, n);
    } else if let Ok(n) = number.extract::<u64>() {
        out.extend_from_slice(n.to_string().as_bytes());
    } else {
        return false;
    }
    true
}

/// Whether an entry only waited (no cancel; no delivery, where they are counted), or
/// None when its counts are not ints this code reads.
fn waited_only(fields: &Fields, deliveries_counted: bool) -> Option<bool> {
    let count = |at: usize| {
        let value = fields.get(at);
        if value.is_exact_instance_of::<PyInt>() {
            value.extract::<i64>().ok()
        } else {
            None
        }
    };
    let (deliveries, cancels) = (count(COUNTS[0])?, count(COUNTS[1])?);
    Some(cancels == 0 && (deliveries == 0 || !deliveries_counted))
}

/// A stored entry's arrival number, if `seq` is an int that fits its key.
fn seq_of(seq: &Bound<PyAny>) -> Option<i64> {
    if !seq.is_exact_instance_of::<PyInt>() {
        return None;
    }
    seq.extract::<i64>().ok()
}

/// A stored entry's key (`_SEQ`: big-endian signed 64 bits).
fn key(py: Python<'_>, seq: i64) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &seq.to_be_bytes())
}

/// The twin's `_delete_runs`: the stored copies of entries that left the queue deleted,
/// a run of at least `shortest` consecutive non-negative arrival numbers as one range
/// (its keys sort as the numbers do), any other a key at a time. A queue acked in order
/// removes thousands of consecutive entries a checkpoint: a tombstone each cost RocksDB
/// ~1 us a message (the batch's delete and its write), the range a few a checkpoint.
fn delete_runs(
    batch: &Bound<PyAny>,
    column: &Bound<PyAny>,
    mut seqs: Vec<i64>,
    shortest: usize,
) -> PyResult<()> {
    let py = batch.py();
    seqs.sort_unstable();
    let mut at = 0;
    while at < seqs.len() {
        let mut end = at + 1;
        while end < seqs.len() && seqs[end - 1].checked_add(1) == Some(seqs[end]) {
            end += 1;
        }
        let (first, last) = (seqs[at], seqs[end - 1]);
        match last.checked_add(1) {
            Some(after) if end - at >= shortest && first >= 0 => {
                let range = (key(py, first), key(py, after), column);
                batch.call_method1(intern!(py, "delete_range"), range)?;
            }
            _ => {
                for &seq in &seqs[at..end] {
                    batch.call_method1(intern!(py, "delete"), (key(py, seq), column))?;
                }
            }
        }
        at = end;
    }
    Ok(())
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<EntryWriter>()?;
    m.add_class::<UnstoredRuns>()
}
