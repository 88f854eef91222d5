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
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyTuple, PyType};

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

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<BatchBuilder>()?;
    m.add_class::<Batch>()
}
