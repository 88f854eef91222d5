//! A queue's acks applied in one call: the common case of `Removal.ack`
//! (`amps_on_kafka/state/queue_removal.py`), a leased message acked by the session that
//! holds it, in a queue with no barrier waiting and no TargetQueueDepth.
//!
//! Per message the twin looks the entry up, checks the lease (`_may_act`), and in
//! `_remove` and `_unlease` frees the holder's backlog slot, drops the lease, takes the
//! entry out of the queue, marks it dirty for the checkpoint and puts a `QueueEvent` in
//! the outbox: about 2 us a message on the gateway thread, where acks are applied. Here
//! the same changes are made on the same structures (the entries', dirty and leases'
//! dicts, the slots of the entry and its holder), in the same order. The events are not a
//! named tuple an ack: they go into an `EventRun` at the outbox's end, the ids acked and
//! the events record's JSON of their remove events as `encode_events` writes them (the
//! recording joins it in place; `queue_types.expanded` gives the twin's QueueEvents back).
//! An id that is not (str, int, int) of 64 bits gets the named tuple, as the twin makes
//! it. The call stops at the first message it does not take (absent, not leased, held by
//! another session, objects of other classes); the twin applies that one and calls again
//! after it, so the outbox's order is the twin's.
//!
//! The acks of one frame are of one holder's messages: the holder's dict of leases is
//! looked up once for a run of its acks, and its `outstanding` written once at the
//! run's end (the count the twin leaves, one integer instead of one an ack).
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::queue_messages::{exact_i64, Layout, TopicText};
use crate::records::replace;
use crate::scans::{escape_into, push_int};

/// Acks the compiled applier made, in order: their ids, and their remove events as the
/// events record's JSON (each `[kind,topic,partition,offset,0,0,reason]`, comma-separated,
/// no brackets). Only the applier makes one; it goes on filling the one at the outbox's
/// end.
#[pyclass(module = "amps_on_kafka_native")]
struct EventRun {
    ids: Py<PyList>,
    json: Vec<u8>,
}

#[pymethods]
impl EventRun {
    /// The ids acked, in order (a copy).
    #[getter]
    fn ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.ids.bind(py);
        PyList::new(py, ids.iter())
    }

    /// The events' JSON, comma-separated.
    #[getter]
    fn json<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.json)
    }

    fn __len__(&self, py: Python) -> usize {
        self.ids.bind(py).len()
    }
}

/// Applies acks of leased messages to a `QueueState`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct AckApplier {
    entry: Layout<3>,
    subscription: Layout<2>,
    event: Py<PyType>,
    tuple_new: Py<PyAny>,
    leased: Py<PyAny>,
    removed: Py<PyAny>,
    remove: Py<PyAny>,
    ack: Py<PyAny>,
    /// `["<remove>",` and `,0,0,"<ack>"]`: an event's JSON around its id.
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// What a call reads from the state once.
struct Parts<'py> {
    entries: Bound<'py, PyDict>,
    dirty: Bound<'py, PyDict>,
    leased_by: Bound<'py, PyDict>,
    leases: Bound<'py, PyAny>,
    events: Bound<'py, PyList>,
    permissive: bool,
}

/// Where a call puts its events: the run at the outbox's end, if there is one; the
/// topics' escaped text, and the JSON of the event being written (reused, not made an
/// ack).
struct Sink<'py> {
    run: Option<Bound<'py, EventRun>>,
    topics: TopicText<'py>,
    json: Vec<u8>,
    holder: Option<Holder<'py>>,
}

/// The holder of the last messages acked: its dict of leases and how many of its
/// leases the run acked (not yet taken off its `outstanding`).
struct Holder<'py> {
    subscription: Bound<'py, PyAny>,
    leases: Bound<'py, PyDict>,
    acked: usize,
}

#[pymethods]
impl AckApplier {
    /// QueueEntry and Subscription (classes with slots), QueueEvent (a named tuple),
    /// Status.LEASED, Status.REMOVED, EventKind.REMOVE and Reason.ACK.
    #[new]
    fn new(
        entry: &Bound<PyType>,
        subscription: &Bound<PyType>,
        event: &Bound<PyType>,
        members: (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>),
    ) -> PyResult<Self> {
        let py = entry.py();
        let tuple_new = py
            .get_type::<PyTuple>()
            .getattr(intern!(py, "__new__"))?
            .unbind();
        let (leased, removed, remove, ack) = members;
        let mut head = b"[\"".to_vec();
        escape_into(&mut head, remove.bind(py).cast::<PyString>()?.to_str()?);
        head.extend_from_slice(b"\",");
        let mut tail = b",0,0,\"".to_vec();
        escape_into(&mut tail, ack.bind(py).cast::<PyString>()?.to_str()?);
        tail.extend_from_slice(b"\"]");
        Ok(Self {
            head,
            tail,
            entry: Layout::new(entry, ["id", "status", "holder"])?,
            subscription: Layout::new(subscription, ["session", "outstanding"])?,
            event: event.clone().unbind(),
            tuple_new,
            leased,
            removed,
            remove,
            ack,
        })
    }

    /// Acks `messages[start:]` for `session` on `state` until the first one this call
    /// leaves to the twin: (how many it acked, the index of that one or the list's end).
    fn apply(
        &self,
        state: &Bound<PyAny>,
        messages: &Bound<PyList>,
        start: usize,
        session: &Bound<PyAny>,
    ) -> PyResult<(usize, usize)> {
        let py = state.py();
        let parts = self.parts(state)?;
        let mut sink = Sink {
            run: None,
            topics: TopicText::new(true),
            json: Vec::with_capacity(64),
            holder: None,
        };
        if let Ok(last) = parts.events.get_item(parts.events.len().wrapping_sub(1)) {
            sink.run = last.cast_into::<EventRun>().ok();
        }
        let mut at = start;
        let mut acked = 0;
        let outcome = loop {
            if at >= messages.len() {
                break Ok(());
            }
            match self.ack_one(&parts, &mut sink, &messages.get_item(at)?, session) {
                Ok(true) => {
                    acked += 1;
                    at += 1;
                }
                Ok(false) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        self.release(&mut sink)?;
        if acked > 0 {
            let active = state.getattr(intern!(py, "_active"))?.sub(acked)?;
            state.setattr(intern!(py, "_active"), active)?;
        }
        outcome.map(|()| (acked, at))
    }
}

impl AckApplier {
    fn parts<'py>(&self, state: &Bound<'py, PyAny>) -> PyResult<Parts<'py>> {
        let py = state.py();
        let outbox = state.getattr(intern!(py, "outbox"))?;
        Ok(Parts {
            entries: state.getattr(intern!(py, "entries"))?.cast_into()?,
            dirty: state.getattr(intern!(py, "dirty"))?.cast_into()?,
            leased_by: state.getattr(intern!(py, "_leased"))?.cast_into()?,
            leases: state.getattr(intern!(py, "_leases"))?,
            events: outbox.getattr(intern!(py, "events"))?.cast_into()?,
            permissive: state
                .getattr(intern!(py, "policy"))?
                .getattr(intern!(py, "permissive"))?
                .is_truthy()?,
        })
    }

    /// Acks one message if it is leased by `session` (any session, permissive) and
    /// made of the classes given; false, with nothing changed, otherwise.
    fn ack_one<'py>(
        &self,
        parts: &Parts<'py>,
        sink: &mut Sink<'py>,
        message: &Bound<'py, PyAny>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<bool> {
        let py = message.py();
        let Some(entry) = parts.entries.get_item(message)? else {
            return Ok(false);
        };
        let Some([id, status, holder]) = self.entry.read(&entry) else {
            return Ok(false);
        };
        if !status.is(self.leased.bind(py)) {
            return Ok(false);
        }
        let Some([holder_session, _]) = self.subscription.read(&holder) else {
            return Ok(false);
        };
        if !parts.permissive && !holder_session.is(session) && !holder_session.eq(session)? {
            return Ok(false);
        }
        let held = match &mut sink.holder {
            Some(held) if held.subscription.is(&holder) => held,
            _ => {
                let Some(leases) = parts.leased_by.get_item(&holder)? else {
                    return Ok(false);
                };
                let leases = leases.cast_into::<PyDict>()?;
                self.release(sink)?;
                sink.holder.insert(Holder {
                    subscription: holder,
                    leases,
                    acked: 0,
                })
            }
        };
        // _unlease (the holder's outstanding: `release`)
        held.acked += 1;
        forget(py, held.leases.del_item(&id))?;
        // SAFETY: the layouts were located on the classes `read` checked these are.
        unsafe {
            replace(&entry, self.entry.at[2], &py.None().into_bound(py));
        }
        forget(py, parts.leases.del_item(&id))?;
        // _remove
        // SAFETY: as above.
        unsafe {
            replace(&entry, self.entry.at[1], self.removed.bind(py));
        }
        parts.entries.del_item(&id)?;
        parts.dirty.set_item(&id, &entry)?;
        self.record(parts, sink, &id)?;
        Ok(true)
    }

    /// The last holder's `outstanding` less the leases its run acked.
    fn release(&self, sink: &mut Sink) -> PyResult<()> {
        let Some(held) = sink.holder.take() else {
            return Ok(());
        };
        let Some([_, outstanding]) = self.subscription.read(&held.subscription) else {
            return Ok(());
        };
        let outstanding = outstanding.sub(held.acked)?;
        // SAFETY: `read` checked the class whose layout was located.
        unsafe { replace(&held.subscription, self.subscription.at[1], &outstanding) };
        Ok(())
    }

    /// The remove event of an ack of `id`: into the run at the outbox's end (a new one
    /// if none), or, for an id the run can't write, a QueueEvent as the twin makes it.
    fn record<'py>(
        &self,
        parts: &Parts<'py>,
        sink: &mut Sink<'py>,
        id: &Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let py = id.py();
        if self.event_json(sink, id).is_none() {
            let fields = (self.remove.bind(py), id, 0, 0, self.ack.bind(py));
            let event = self
                .tuple_new
                .bind(py)
                .call1((self.event.bind(py), fields))?;
            sink.run = None;
            return parts.events.append(event);
        }
        if sink.run.is_none() {
            let run = EventRun {
                ids: PyList::empty(py).unbind(),
                json: Vec::new(),
            };
            let run = Bound::new(py, run)?;
            parts.events.append(&run)?;
            sink.run = Some(run);
        }
        let Some(run) = &sink.run else {
            return Ok(());
        };
        let mut run = run.borrow_mut();
        run.ids.bind(py).append(id)?;
        if !run.json.is_empty() {
            run.json.push(b',');
        }
        run.json.extend_from_slice(&sink.json);
        Ok(())
    }

    /// `["remove","topic",partition,offset,0,0,"ack"]` into `sink.json` for an id of an
    /// exact str and two exact ints of 64 bits; None for another.
    fn event_json<'py>(&self, sink: &mut Sink<'py>, id: &Bound<'py, PyAny>) -> Option<()> {
        let id = id.cast_exact::<PyTuple>().ok()?;
        if id.len() != 3 {
            return None;
        }
        let out = &mut sink.json;
        out.clear();
        out.extend_from_slice(&self.head);
        out.push(b'"');
        sink.topics.write(out, id.get_item(0).ok()?)?;
        out.push(b'"');
        for at in [1, 2] {
            out.push(b',');
            push_int(out, exact_i64(&id.get_item(at).ok()?)?);
        }
        out.extend_from_slice(&self.tail);
        Some(())
    }
}

/// `pop(key, None)`: a key that is not there is no error.
fn forget(py: Python, outcome: PyResult<()>) -> PyResult<()> {
    match outcome {
        Err(error) if error.is_instance_of::<PyKeyError>(py) => Ok(()),
        other => other,
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<AckApplier>()?;
    m.add_class::<EventRun>()
}
