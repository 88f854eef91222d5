//! The tcp:// client's messages of a batch frame (`amps_on_kafka/client/tcp_transport.py`,
//! `_records`): a `sow` frame of a query, or a queue's batched `publish` frame.
//!
//! A batch frame's header lists its records in `recs` (each entry a dict with the
//! record's payload length `n`); the payloads follow in order. The Python twin makes a
//! `GatewayMessage` per entry (a Python `__init__` frame, seven slot writes and the
//! payload's slice): about 0.65 us a record, a third of a client's CPU per record of a
//! scan. Here each message is allocated and its slots written directly (records.rs's
//! way), one at a time as its reader asks (an iterator: a frame's messages are not all
//! alive at once for the collector to traverse).
//!
//! An entry this code is not sure of (not a dict, no `n`, `n` not an int or not within
//! the payload left) ends the iterator; `read` and `offset` say where, and the twin goes
//! on from there, so its errors are its own.
//!
//! `AckPending` holds the acks `message.ack()` batches for a connection (client/acks.py,
//! `AckBatcher`; its twin there is `PendingAcks`): an ack a message, so one compiled call
//! does what `ack()` and `AckBatcher.add` did in two Python frames, a lock and a tuple
//! (about 0.5 us a message, the largest piece of a queue subscriber's own work).
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};

use crate::records::{allocate, check_layout, locate, put};

/// Makes the messages of batch frames: instances of one class whose slots hold the
/// entry, its payload, the frame's values and fixed values.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct BatchBuilder {
    cls: Py<PyType>,
    entry_at: isize,
    payload_at: isize,
    frame_at: Vec<isize>,
    fixed: Vec<(isize, Py<PyAny>)>,
}

#[pymethods]
impl BatchBuilder {
    /// `cls` (a class defined in Python, with slots), the slots that hold each record's
    /// entry and its payload, those that hold the frame's values (`build`'s
    /// `frame_values`, in order), and (slot, value) pairs every message starts with.
    #[new]
    fn new(
        cls: &Bound<PyType>,
        entry_slot: &str,
        payload_slot: &str,
        frame_slots: Vec<String>,
        fixed: Vec<(String, Py<PyAny>)>,
    ) -> PyResult<Self> {
        check_layout(cls)?;
        let frame_at: Vec<isize> = frame_slots
            .iter()
            .map(|name| locate(cls, name))
            .collect::<PyResult<_>>()?;
        let fixed: Vec<(isize, Py<PyAny>)> = fixed
            .into_iter()
            .map(|(name, value)| Ok((locate(cls, &name)?, value)))
            .collect::<PyResult<_>>()?;
        let (entry_at, payload_at) = (locate(cls, entry_slot)?, locate(cls, payload_slot)?);
        let mut written: Vec<isize> = frame_at.clone();
        written.extend([entry_at, payload_at]);
        written.extend(fixed.iter().map(|(at, _)| *at));
        written.sort_unstable();
        if written.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(PyValueError::new_err("a slot is named twice"));
        }
        Ok(Self {
            cls: cls.clone().unbind(),
            entry_at,
            payload_at,
            frame_at,
            fixed,
        })
    }

    /// The messages of a frame's `recs` over its `payload`, in order, up to the first
    /// entry this code is not sure of.
    fn build(
        slf: &Bound<Self>,
        recs: &Bound<PyList>,
        payload: &Bound<PyBytes>,
        frame_values: &Bound<PyTuple>,
    ) -> PyResult<Batch> {
        if frame_values.len() != slf.get().frame_at.len() {
            return Err(PyValueError::new_err("a value for each frame slot"));
        }
        Ok(Batch {
            builder: slf.clone().unbind(),
            recs: recs.clone().unbind(),
            payload: payload.clone().unbind(),
            frame_values: frame_values.clone().unbind(),
            read: 0,
            offset: 0,
            stopped: false,
        })
    }
}

/// The messages of one frame, made one at a time; `read` counts the entries made into
/// messages and `offset` the payload bytes they took.
#[pyclass(module = "amps_on_kafka_native")]
struct Batch {
    builder: Py<BatchBuilder>,
    recs: Py<PyList>,
    payload: Py<PyBytes>,
    frame_values: Py<PyTuple>,
    #[pyo3(get)]
    read: usize,
    #[pyo3(get)]
    offset: usize,
    stopped: bool,
}

impl Batch {
    /// The payload length of `entry` when this code is sure of it: a dict whose `n` is
    /// an int (not a bool) within what is left of the payload.
    fn length(&self, entry: &Bound<PyAny>, left: usize) -> PyResult<Option<usize>> {
        let Ok(entry) = entry.cast_exact::<PyDict>() else {
            return Ok(None);
        };
        let Some(n) = entry.get_item(intern!(entry.py(), "n"))? else {
            return Ok(None);
        };
        if !n.is_exact_instance_of::<PyInt>() {
            return Ok(None);
        }
        Ok(n.extract::<usize>().ok().filter(|&n| n <= left))
    }
}

#[pymethods]
impl Batch {
    fn __iter__(slf: PyRef<Self>) -> PyRef<Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let recs = self.recs.bind(py);
        if self.stopped || self.read >= recs.len() {
            return Ok(None);
        }
        let entry = recs.get_item(self.read)?;
        let bytes = self.payload.bind(py).as_bytes();
        let Some(n) = self.length(&entry, bytes.len() - self.offset)? else {
            self.stopped = true;
            return Ok(None);
        };
        let payload = PyBytes::new(py, &bytes[self.offset..self.offset + n]);
        let builder = self.builder.get();
        let message = allocate(builder.cls.bind(py))?;
        // SAFETY: the offsets were located on the class and `message` is a fresh instance.
        unsafe {
            put(&message, builder.entry_at, &entry);
            put(&message, builder.payload_at, &payload);
            for (&at, value) in builder.frame_at.iter().zip(self.frame_values.bind(py)) {
                put(&message, at, &value);
            }
            for (at, fixed) in &builder.fixed {
                put(&message, *at, fixed.bind(py));
            }
        }
        self.read += 1;
        self.offset += n;
        Ok(Some(message))
    }
}

/// A connection's acks waiting to be sent, by (topic, option), and what the ack timer
/// needs: when the batch waiting began, whether the timer sleeps until one begins, and
/// whether the batcher is closed. Every method runs under the GIL without calling Python
/// code that could switch threads (the keys are the frame's topic and an option checked
/// against two texts), so the twin's lock is not needed here; a call made while another
/// thread's is under way would fail on the borrow, not corrupt the batch.
#[pyclass(module = "amps_on_kafka_native")]
struct AckPending {
    pending: Py<PyDict>,
    /// the bookmarks of the last (topic, option) added, while that list is pending: a
    /// burst's messages share their frame's topic, so most acks skip the tuple and the
    /// dict look-up
    last: Option<(Py<PyAny>, Py<PyAny>, Py<PyList>)>,
    #[pyo3(get)]
    count: u64,
    #[pyo3(get, set)]
    batch_size: u64,
    first: Instant,
    idle: bool,
    closed: bool,
}

impl AckPending {
    /// Everything pending, handed over; nothing pending after.
    fn taken<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyDict> {
        self.count = 0;
        self.last = None;
        std::mem::replace(&mut self.pending, PyDict::new(py).unbind()).into_bound(py)
    }

    /// The list `bookmark` joins: the last one when `topic` and `option` are the same
    /// objects, else the dict's (made when it has none).
    fn list_for<'py>(
        &mut self,
        topic: &Bound<'py, PyAny>,
        option: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = topic.py();
        if let Some((last_topic, last_option, list)) = &self.last {
            if last_topic.is(topic) && last_option.is(option) {
                return Ok(list.bind(py).clone());
            }
        }
        let key = PyTuple::new(py, [topic, option])?;
        let pending = self.pending.bind(py);
        let list = match pending.get_item(&key)? {
            Some(list) => list.cast_into::<PyList>()?,
            None => {
                let list = PyList::empty(py);
                pending.set_item(key, &list)?;
                list
            }
        };
        self.last = Some((
            topic.clone().unbind(),
            option.clone().unbind(),
            list.clone().unbind(),
        ));
        Ok(list)
    }
}

#[pymethods]
impl AckPending {
    #[new]
    fn new(py: Python<'_>, batch_size: u64) -> Self {
        Self {
            pending: PyDict::new(py).unbind(),
            last: None,
            count: 0,
            batch_size,
            first: Instant::now(),
            idle: true,
            closed: false,
        }
    }

    /// Queue the ack of a message with header (or `recs` entry) `meta`: nothing when it has
    /// no bookmark, topic or lease (a barrier message needs no ack). Returns None, True
    /// when a batch began while the timer sleeps until one does (wake it), or the batches
    /// to send when this ack filled one.
    fn add<'py>(
        &mut self,
        topic: &Bound<'py, PyAny>,
        meta: &Bound<'py, PyDict>,
        option: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = topic.py();
        let Some(bookmark) = meta.get_item(intern!(py, "bm"))? else {
            return Ok(None);
        };
        if bookmark.is_none() || topic.is_none() {
            return Ok(None);
        }
        match meta.get_item(intern!(py, "lp"))? {
            Some(lease) if !lease.is_none() => {}
            _ => return Ok(None),
        }
        if !option.is_none()
            && !option.eq(intern!(py, "cancel"))?
            && !option.eq(intern!(py, "expire"))?
        {
            return Err(PyValueError::new_err(format!(
                "ack option must be cancel or expire, not {}",
                option.repr()?
            )));
        }
        self.list_for(topic, option)?.append(bookmark)?;
        self.count += 1;
        if self.count >= self.batch_size {
            return Ok(Some(self.taken(py).into_any()));
        }
        if self.count == 1 {
            self.first = Instant::now();
            if self.idle && !self.closed {
                self.idle = false;
                return Ok(Some(PyBool::new(py, true).to_owned().into_any()));
            }
        }
        Ok(None)
    }

    /// Everything pending, {(topic, option): [bookmark, ...]}, handed over.
    fn take<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyDict> {
        self.taken(py)
    }

    /// The timer's look, `timeout` seconds a batch may wait: None once closed (the timer
    /// ends), the batches to send when the waiting one is due, else the seconds to sleep
    /// (-1: until a batch begins; `add` then says to wake it).
    fn due<'py>(&mut self, py: Python<'py>, timeout: f64) -> Option<Bound<'py, PyAny>> {
        if self.closed {
            return None;
        }
        if self.count == 0 {
            self.idle = true;
            return Some(PyFloat::new(py, -1.0).into_any());
        }
        let left = timeout - self.first.elapsed().as_secs_f64();
        if left > 0.0 {
            return Some(PyFloat::new(py, left).into_any());
        }
        Some(self.taken(py).into_any())
    }

    /// No batch wakes the timer from now on; its next look ends it.
    fn close(&mut self) {
        self.closed = true;
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<BatchBuilder>()?;
    m.add_class::<Batch>()?;
    m.add_class::<AckPending>()
}
