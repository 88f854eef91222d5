//! The tcp:// client's outbox bytes (`amps_on_kafka/protocol/frame_buffer.py`,
//! `FrameBuffer`): the frames waiting for the socket, and the publish sequence numbers.
//!
//! A plain publish (`{"c":"publish","t":topic,"s":n}` and its JSON payload) is numbered
//! and appended here in one call, its header written from a template straight into the
//! pending bytes: no header dict, no orjson call, no frame object, no join. The writer
//! thread takes every pending byte at once. The Python twin numbers under a lock, builds
//! the frame with `frame(topic, sequence, payload)` and keeps a list of frames; this code
//! hands that same `frame` callable whatever it is not sure of (a topic that is not a
//! plain str, a lone surrogate, a payload that is not bytes, a frame past 4 GiB), so the
//! bytes and the errors are the twin's (tests/native/test_frame_buffer.py).
use std::sync::Mutex;

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use pyo3::{PyTraverseError, PyVisit};

use crate::frames::push_frame;

/// What the lock guards: the pending bytes, the next sequence number, whether closed.
struct State {
    pending: Vec<u8>,
    next: i64,
    closed: bool,
}

impl State {
    /// The next sequence number, or an error once they are exhausted (as the twin's).
    fn number(&mut self, count: i64) -> PyResult<i64> {
        if count < 0 {
            return Err(PyValueError::new_err(format!(
                "can't reserve {count} sequence numbers"
            )));
        }
        let first = self.next;
        self.next = first
            .checked_add(count)
            .ok_or_else(|| PyOverflowError::new_err("publish sequence numbers exhausted"))?;
        Ok(first)
    }

    /// Append a frame; the bytes pending before it, or -1 once closed (nothing appended).
    fn append(&mut self, frame: &[u8]) -> i64 {
        if self.closed {
            return -1;
        }
        let before = self.pending.len() as i64;
        self.pending.extend_from_slice(frame);
        before
    }
}

#[pyclass(frozen, module = "amps_on_kafka_native")]
struct FrameBuffer {
    state: Mutex<State>,
    frame: Py<PyAny>,
}

#[pymethods]
impl FrameBuffer {
    /// `first_sequence`: the first number publish or reserve gives; `frame(topic,
    /// sequence, payload)`: the twin's plain publish frame, for what this code leaves it.
    #[new]
    fn new(first_sequence: i64, frame: Py<PyAny>) -> Self {
        let state = State {
            pending: Vec::new(),
            next: first_sequence,
            closed: false,
        };
        Self {
            state: Mutex::new(state),
            frame,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.frame)
    }

    /// The first of `count` consecutive sequence numbers.
    fn reserve(&self, count: i64) -> PyResult<i64> {
        self.lock().number(count)
    }

    /// Number a plain publish and queue its frame: (its sequence, the bytes pending
    /// before it, -1 if closed). The number is taken even when the frame is refused.
    fn publish(
        &self,
        topic: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<(i64, i64)> {
        let text = topic
            .cast_exact::<PyString>()
            .ok()
            .and_then(|t| t.to_str().ok());
        let bytes = payload.cast_exact::<PyBytes>().ok().map(|p| p.as_bytes());
        if let (Some(text), Some(bytes)) = (text, bytes) {
            let mut state = self.lock();
            let sequence = state.number(1)?;
            if let Some(before) = write_publish(&mut state, text, sequence, bytes) {
                return Ok((sequence, before));
            }
            drop(state);
            return self.append_built(topic, sequence, payload);
        }
        let sequence = self.lock().number(1)?;
        self.append_built(topic, sequence, payload)
    }

    /// Queue a frame: the bytes pending before it, -1 if closed (nothing queued).
    fn append(&self, frame: &[u8]) -> i64 {
        self.lock().append(frame)
    }

    /// Every pending byte, in order; the buffer is empty after.
    fn take<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let taken = {
            let mut state = self.lock();
            let room = state.pending.len();
            std::mem::replace(&mut state.pending, Vec::with_capacity(room))
        };
        PyBytes::new(py, &taken)
    }

    /// Refuse every later frame (append and publish give -1); what is pending stays.
    fn close(&self) {
        self.lock().closed = true;
    }

    fn __len__(&self) -> usize {
        self.lock().pending.len()
    }
}

impl FrameBuffer {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // no Python code runs under the lock, so a panic can't leave it poisoned midway
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The twin's way: `frame(topic, sequence, payload)` built in Python, then queued.
    fn append_built(
        &self,
        topic: &Bound<'_, PyAny>,
        sequence: i64,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<(i64, i64)> {
        let built = self
            .frame
            .bind(topic.py())
            .call1((topic, sequence, payload))?;
        let built = built.cast_into::<PyBytes>()?;
        Ok((sequence, self.lock().append(built.as_bytes())))
    }
}

/// Append `[total][header length]{"c":"publish","t":<topic>,"s":<sequence>}<payload>`,
/// the topic escaped as orjson escapes it (serde_json's escaping is the same); None
/// (nothing appended) for a frame whose lengths don't fit 32 bits.
fn write_publish(state: &mut State, topic: &str, sequence: i64, payload: &[u8]) -> Option<i64> {
    if state.closed {
        return Some(-1);
    }
    let mut header = Vec::with_capacity(topic.len() + 48);
    header.extend_from_slice(br#"{"c":"publish","t":"#);
    serde_json::to_writer(&mut header, topic).ok()?;
    header.extend_from_slice(br#","s":"#);
    header.extend_from_slice(sequence.to_string().as_bytes());
    header.push(b'}');
    let before = state.pending.len() as i64;
    push_frame(&mut state.pending, &[&header], &[payload])?;
    Some(before)
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<FrameBuffer>()
}
