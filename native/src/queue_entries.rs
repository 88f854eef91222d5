//! A queue's consumed batch read into its messages (`QueueEntry`), in one call
//! (`amps_on_kafka/processor/queue_runtime.py`, `read_records`; its twin
//! `_read_records_twin`).
//!
//! Per record the twin makes eight C calls, reads the headers for the command and the
//! expiration, and calls the dataclass's `__init__` (eighteen slot writes): about 1.1 us
//! a record on the queue's thread. Here each entry is allocated and its slots written
//! directly, with the helpers the replay's builder uses (records.rs), and the headers
//! are only scanned: a record with a command or an expiration header (a value that is
//! not None) is handed to the twin's own function (`_message_expiration`), which
//! decides what it is, so every rule about those headers stays in one place.
use pyo3::exceptions::{PySystemError, PyUnicodeDecodeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::rdkafka_reader::RawBatch;
use crate::records::{allocate, check_layout, locate, put};

/// The header names whose values decide what a record is (`H_COMMAND`, `H_EXPIRATION`).
const DECIDING: [&str; 2] = ["c", "e"];

/// Builds the entries of consumed batches: instances of `QueueEntry` with the record's
/// id, timestamp, payload, codec, headers and expiration, and every other slot at its
/// default.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct EntryReader {
    cls: Py<PyType>,
    id_at: isize,
    timestamp_at: isize,
    payload_at: isize,
    codec_at: isize,
    headers_at: isize,
    expiration_at: isize,
    defaults: Vec<(isize, Py<PyAny>)>,
    expiration_of: Py<PyAny>,
    not_a_message: Py<PyAny>,
    bad_header: Py<PyAny>,
}

/// What a record is, once its headers are read.
enum Kind<'py> {
    Message(Bound<'py, PyAny>, Bound<'py, PyAny>), // headers, expiration
    NotAMessage,
    BadHeader,
}

#[pymethods]
impl EntryReader {
    /// `cls` (QueueEntry: slots, no `__dict__`), (slot, value) pairs for every slot the
    /// record does not fill, the twin's `_message_expiration` and the two markers it
    /// returns for a record that is not a message and one whose header is bad.
    #[new]
    fn new(
        cls: &Bound<PyType>,
        defaults: Vec<(String, Py<PyAny>)>,
        expiration_of: Py<PyAny>,
        not_a_message: Py<PyAny>,
        bad_header: Py<PyAny>,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        let reader = Self {
            cls: cls.clone().unbind(),
            id_at: locate(cls, "id")?,
            timestamp_at: locate(cls, "timestamp")?,
            payload_at: locate(cls, "payload")?,
            codec_at: locate(cls, "codec")?,
            headers_at: locate(cls, "headers")?,
            expiration_at: locate(cls, "expiration")?,
            defaults: defaults
                .into_iter()
                .map(|(name, value)| Ok((locate(cls, &name)?, value)))
                .collect::<PyResult<_>>()?,
            expiration_of,
            not_a_message,
            bad_header,
        };
        reader.check_every_slot_once(cls)?;
        Ok(reader)
    }

    /// Reads `records` from index `start` into `entries` (a QueueEntry per message, a
    /// `((topic, partition), offset)` per record that is not one) and the ids of those
    /// whose header is bad into `bad`, up to the first record with an error: its index
    /// is returned (the length of `records` when none has one). `records` is a list of
    /// confluent-kafka's records, or a RawBatch of librdkafka's (the compiled reader's).
    fn read(
        &self,
        records: &Bound<PyAny>,
        start: usize,
        codecs: &Bound<PyDict>,
        entries: &Bound<PyList>,
        bad: &Bound<PyList>,
    ) -> PyResult<usize> {
        if let Ok(batch) = records.cast::<RawBatch>() {
            return self.read_raw(&mut batch.borrow_mut(), start, codecs, entries, bad);
        }
        let records = records.cast::<PyList>()?;
        let py = records.py();
        // The consumer makes each record a topic text of its own: the run's ids share
        // the last one instead, so the engine's dicts (entries, leases, changed) compare
        // their ids' topics by identity and hash them once, and a message holds no copy.
        let mut last_topic: Option<Bound<PyAny>> = None;
        for at in start..records.len() {
            let record = records.get_item(at)?;
            if !record.call_method0(intern!(py, "error"))?.is_none() {
                return Ok(at);
            }
            let mut topic = record.call_method0(intern!(py, "topic"))?;
            match &last_topic {
                Some(last) if last.eq(&topic)? => topic = last.clone(),
                _ => last_topic = Some(topic.clone()),
            }
            let partition = record.call_method0(intern!(py, "partition"))?;
            let offset = record.call_method0(intern!(py, "offset"))?;
            let kind = self.kind(py, record.call_method0(intern!(py, "headers")))?;
            let message = || {
                let timestamp = record.call_method0(intern!(py, "timestamp"))?.get_item(1)?;
                Ok((timestamp, record.call_method0(intern!(py, "value"))?))
            };
            self.add(
                kind,
                message,
                codecs,
                [topic, partition, offset],
                entries,
                bad,
            )?;
        }
        Ok(records.len())
    }

    /// Gives the cyclic collector back the entries this reader made (others are left
    /// alone). An entry refers to nothing that leads back to it but its `holder`, a
    /// subscription whose callbacks reach the engine and so the queue holding the
    /// entry: a cycle the collector must see once the queue is dropped, so a closing
    /// queue tracks every entry it holds again.
    fn track(&self, entries: &Bound<PyAny>) -> PyResult<()> {
        let cls = self.cls.bind(entries.py());
        for entry in entries.try_iter()? {
            let entry = entry?;
            // SAFETY: an instance of `cls`, a class with the collector's support (slots
            // of objects), tracked only if it is not already.
            unsafe {
                if entry.get_type().is(cls) && ffi::PyObject_GC_IsTracked(entry.as_ptr()) == 0 {
                    ffi::PyObject_GC_Track(entry.as_ptr().cast());
                }
            }
        }
        Ok(())
    }
}

impl EntryReader {
    /// `read` of a RawBatch: each record's parts straight from librdkafka's record.
    fn read_raw(
        &self,
        batch: &mut RawBatch,
        start: usize,
        codecs: &Bound<PyDict>,
        entries: &Bound<PyList>,
        bad: &Bound<PyList>,
    ) -> PyResult<usize> {
        let py = entries.py();
        for at in start..batch.len() {
            if batch.failed(at) {
                return Ok(at);
            }
            let topic = batch.topic(py, at).into_bound(py).into_any();
            let partition = batch.partition(at).into_pyobject(py)?.into_any();
            let offset = batch.offset(at).into_pyobject(py)?.into_any();
            let kind = self.kind(py, batch.headers(py, at))?;
            let message = || {
                let timestamp = batch.timestamp(at).into_pyobject(py)?.into_any();
                Ok((timestamp, batch.value(py, at)))
            };
            self.add(
                kind,
                message,
                codecs,
                [topic, partition, offset],
                entries,
                bad,
            )?;
        }
        Ok(batch.len())
    }

    /// Adds a record to `entries` as what `kind` makes it (and its id to `bad` when its
    /// header is bad): a message's entry is made of `message()`, its timestamp and value.
    fn add<'py>(
        &self,
        kind: Kind<'py>,
        message: impl FnOnce() -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
        codecs: &Bound<'py, PyDict>,
        [topic, partition, offset]: [Bound<'py, PyAny>; 3],
        entries: &Bound<'py, PyList>,
        bad: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let py = entries.py();
        match kind {
            Kind::Message(headers, expiration) => {
                let (timestamp, payload) = message()?;
                let id = PyTuple::new(py, [&topic, &partition, &offset])?;
                let entry =
                    self.entry(codecs, &topic, id, timestamp, payload, headers, expiration)?;
                entries.append(entry)
            }
            kind => {
                let tp = PyTuple::new(py, [&topic, &partition])?;
                entries.append((tp, &offset))?;
                if matches!(kind, Kind::BadHeader) {
                    bad.append((topic, partition, offset))?;
                }
                Ok(())
            }
        }
    }

    /// ValueError unless the record's slots and the defaults name every slot of `cls`
    /// once: an entry with a slot left unset would raise AttributeError where it is read.
    fn check_every_slot_once(&self, cls: &Bound<PyType>) -> PyResult<()> {
        let slots: Vec<String> = cls.getattr(intern!(cls.py(), "__slots__"))?.extract()?;
        let mut written = vec![
            self.id_at,
            self.timestamp_at,
            self.payload_at,
            self.codec_at,
            self.headers_at,
            self.expiration_at,
        ];
        written.extend(self.defaults.iter().map(|(at, _)| *at));
        written.sort_unstable();
        written.dedup();
        if written.len() != slots.len() || written.len() != 6 + self.defaults.len() {
            return Err(PyValueError::new_err(format!(
                "the defaults must name every slot of {} but the record's, once",
                cls.name()?
            )));
        }
        Ok(())
    }

    /// What a record's headers (read once, see `amps_on_kafka/log/envelope.py`,
    /// `read_headers`) make it.
    fn kind<'py>(
        &self,
        py: Python<'py>,
        headers: PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Kind<'py>> {
        let headers = match headers {
            Ok(headers) => headers,
            Err(err)
                if err.is_instance_of::<PySystemError>(py)
                    || err.is_instance_of::<PyUnicodeDecodeError>(py) =>
            {
                return Ok(Kind::BadHeader)
            }
            Err(err) => return Err(err),
        };
        let expiration = if deciding(&headers) {
            self.expiration_of.bind(py).call1((&headers,))?
        } else {
            py.None().into_bound(py)
        };
        if expiration.is(self.not_a_message.bind(py)) {
            Ok(Kind::NotAMessage)
        } else if expiration.is(self.bad_header.bind(py)) {
            Ok(Kind::BadHeader)
        } else {
            Ok(Kind::Message(headers, expiration))
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn entry<'py>(
        &self,
        codecs: &Bound<'py, PyDict>,
        topic: &Bound<'py, PyAny>,
        id: Bound<'py, PyTuple>,
        timestamp: Bound<'py, PyAny>,
        mut payload: Bound<'py, PyAny>,
        headers: Bound<'py, PyAny>,
        expiration: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = topic.py();
        if !payload.is_truthy()? {
            payload = PyBytes::new(py, b"").into_any();
        }
        let codec = codecs.as_any().get_item(topic)?;
        let entry = allocate(self.cls.bind(py))?;
        // SAFETY: the offsets were located on the class and `entry` is a fresh instance;
        // the constructor checked each slot is written once.
        unsafe {
            put(&entry, self.id_at, id.as_any());
            put(&entry, self.timestamp_at, &timestamp);
            put(&entry, self.payload_at, &payload);
            put(&entry, self.codec_at, &codec);
            put(&entry, self.headers_at, &headers);
            put(&entry, self.expiration_at, &expiration);
            for (at, value) in &self.defaults {
                put(&entry, *at, value.bind(py));
            }
            // The cyclic collector does not see the entry (see `track`): a message lives
            // in the queue until acked, and the collector's young and middle passes each
            // walked it once, ~0.6 us a message of the queue's thread.
            ffi::PyObject_GC_UnTrack(entry.as_ptr().cast());
        }
        Ok(entry)
    }
}

/// Whether the headers hold a command or an expiration with a value (or are not the list
/// of (name, value) pairs confluent-kafka gives): the twin's function decides those.
fn deciding(headers: &Bound<PyAny>) -> bool {
    if headers.is_none() {
        return false;
    }
    let Ok(list) = headers.cast::<PyList>() else {
        return true;
    };
    list.iter().any(|header| {
        let Ok(pair) = header.cast::<PyTuple>() else {
            return true;
        };
        if pair.len() != 2 {
            return true;
        }
        let (Ok(name), Ok(value)) = (pair.get_item(0), pair.get_item(1)) else {
            return true;
        };
        match name.cast::<PyString>().map(|name| name.to_str()) {
            Ok(Ok(name)) => DECIDING.contains(&name) && !value.is_none(),
            _ => true,
        }
    })
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<EntryReader>()
}
