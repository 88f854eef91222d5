//! A queue's acks applied in one call: the common case of `Removal.ack`
//! (`amps_on_kafka/state/queue_removal.py`), a leased message acked by the session that
//! holds it, in a queue with no barrier waiting and no TargetQueueDepth.
//!
//! Per message the twin looks the entry up, checks the lease (`_may_act`), and in
//! `_remove` and `_unlease` frees the holder's backlog slot, drops the lease, takes the
//! entry out of the queue, marks it dirty for the checkpoint and puts a `QueueEvent` in
//! the outbox: about 2 us a message on the gateway thread, where acks are applied. Here
//! the same changes are made on the same structures (the entries', dirty and leases'
//! dicts, the slots of the entry and its holder), in the same order, and the event is the
//! same named tuple. The call stops at the first message it does not take (absent,
//! not leased, held by another session, objects of other classes); the twin applies that
//! one and calls again after it, so the outbox's order is the twin's.
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};

use crate::queue_messages::Layout;
use crate::records::replace;

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
        Ok(Self {
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
        let mut at = start;
        let mut acked = 0;
        let outcome = loop {
            if at >= messages.len() {
                break Ok(());
            }
            match self.ack_one(&parts, &messages.get_item(at)?, session) {
                Ok(true) => {
                    acked += 1;
                    at += 1;
                }
                Ok(false) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
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
    fn ack_one(
        &self,
        parts: &Parts,
        message: &Bound<PyAny>,
        session: &Bound<PyAny>,
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
        let Some([holder_session, outstanding]) = self.subscription.read(&holder) else {
            return Ok(false);
        };
        if !parts.permissive && !holder_session.eq(session)? {
            return Ok(false);
        }
        let Some(holder_leases) = parts.leased_by.get_item(&holder)? else {
            return Ok(false);
        };
        let holder_leases = holder_leases.cast_into::<PyDict>()?;
        // _unlease
        let outstanding = outstanding.sub(1)?;
        // SAFETY: the layouts were located on the classes `read` checked these are.
        unsafe {
            replace(&holder, self.subscription.at[1], &outstanding);
        }
        forget(py, holder_leases.del_item(&id))?;
        // SAFETY: as above.
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
        let fields = (self.remove.bind(py), &id, 0, 0, self.ack.bind(py));
        let event = self
            .tuple_new
            .bind(py)
            .call1((self.event.bind(py), fields))?;
        parts.events.append(event)?;
        Ok(true)
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
    m.add_class::<AckApplier>()
}
