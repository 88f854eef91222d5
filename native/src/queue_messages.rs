//! A queue's deliveries made into the messages its subscribers get (`QueueMessage`), in
//! one call (`amps_on_kafka/processor/queues.py`, `messages_of`; its twin
//! `_messages_twin`, which calls `_message` for each).
//!
//! Per delivery the twin reads the subscription, the entry and the lease, formats the
//! bookmark (`topic|partition|offset|`) and runs the dataclass's `__init__` (ten slot
//! writes): about 0.6 us a message, on whichever thread frees the room (the gateway's for
//! acks). Here each message is allocated and its slots written directly (records.rs's
//! helpers), the deliveries', subscriptions' and entries' slots read where their classes
//! store them. A delivery of other classes, with a slot unset, or whose entry id is not
//! (str, int, int) exactly is made by the twin, which formats whatever it is.
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyString, PyTuple, PyType};

use crate::records::{allocate, check_layout, locate, put, read};
use crate::scans::push_int;

/// The slots of QueueMessage, in the order they are written.
const SLOTS: [&str; 10] = [
    "queue",
    "sub_id",
    "id",
    "bookmark",
    "payload",
    "timestamp",
    "lease_ms",
    "codec",
    "headers",
    "deliveries",
];

/// Where a class stores the named slots.
pub(crate) struct Layout<const N: usize> {
    pub(crate) cls: Py<PyType>,
    pub(crate) at: [isize; N],
}

impl<const N: usize> Layout<N> {
    pub(crate) fn new(cls: &Bound<PyType>, names: [&str; N]) -> PyResult<Self> {
        check_layout(cls)?;
        let mut at = [0; N];
        for (place, name) in at.iter_mut().zip(names) {
            *place = locate(cls, name)?;
        }
        Ok(Self {
            cls: cls.clone().unbind(),
            at,
        })
    }

    /// The slots of `object` if it is an instance of the class exactly and all are set.
    pub(crate) fn read<'py>(&self, object: &Bound<'py, PyAny>) -> Option<[Bound<'py, PyAny>; N]> {
        let py = object.py();
        if !object.get_type().is(self.cls.bind(py)) {
            return None;
        }
        // SAFETY: `object` is an instance of the class whose slots were located.
        let values = self.at.map(|at| unsafe { read(object, at) });
        if values.iter().any(|value| value.is_null()) {
            return None;
        }
        // SAFETY: live objects the slots hold references to (no heap list a read: this
        // is called for every message of the queue's hot paths).
        Some(values.map(|value| unsafe { Bound::from_borrowed_ptr(py, value) }))
    }
}

/// Makes the messages of a call's deliveries.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct MessageMaker {
    message: Layout<10>,
    delivery: Layout<3>,
    subscription: Layout<1>,
    entry: Layout<6>,
    twin: Py<PyAny>,
}

#[pymethods]
impl MessageMaker {
    /// The classes (each with slots and no `__dict__`): QueueMessage (these ten slots and
    /// no other), Delivery, Subscription and QueueEntry; `twin`: `_messages_twin(queue,
    /// deliveries, now)`, given each delivery this code leaves to it.
    #[new]
    fn new(
        message: &Bound<PyType>,
        delivery: &Bound<PyType>,
        subscription: &Bound<PyType>,
        entry: &Bound<PyType>,
        twin: Py<PyAny>,
    ) -> PyResult<Self> {
        let slots: Vec<String> = message
            .getattr(intern!(message.py(), "__slots__"))?
            .extract()?;
        if slots != SLOTS {
            return Err(PyValueError::new_err(format!(
                "{} must have the slots {SLOTS:?}, in that order",
                message.name()?
            )));
        }
        Ok(Self {
            message: Layout::new(message, SLOTS)?,
            delivery: Layout::new(delivery, ["subscription", "entry", "lease_until"])?,
            subscription: Layout::new(subscription, ["sub_id"])?,
            entry: Layout::new(
                entry,
                [
                    "id",
                    "payload",
                    "timestamp",
                    "codec",
                    "headers",
                    "deliveries",
                ],
            )?,
            twin,
        })
    }

    /// The message of each delivery of `queue`, in order: leased for what is left of
    /// its lease at `now` (ms), or None for a barrier.
    fn make<'py>(
        &self,
        queue: &Bound<'py, PyAny>,
        deliveries: &Bound<'py, PyList>,
        now: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = queue.py();
        let messages = PyList::empty(py);
        for delivery in deliveries.iter() {
            let made = match self.common(queue, &delivery, now)? {
                Some(message) => message,
                None => {
                    let one = PyList::new(py, [&delivery])?;
                    self.twin.bind(py).call1((queue, one, now))?.get_item(0)?
                }
            };
            messages.append(made)?;
        }
        Ok(messages)
    }
}

impl MessageMaker {
    /// The delivery's message, or None when it is not made of the classes given or its
    /// entry's id is not (str, int, int) exactly.
    fn common<'py>(
        &self,
        queue: &Bound<'py, PyAny>,
        delivery: &Bound<'py, PyAny>,
        now: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some([subscription, entry, until]) = self.delivery.read(delivery) else {
            return Ok(None);
        };
        let (Some([sub_id]), Some([id, payload, timestamp, codec, headers, deliveries])) = (
            self.subscription.read(&subscription),
            self.entry.read(&entry),
        ) else {
            return Ok(None);
        };
        let Some(bookmark) = bookmark(&id) else {
            return Ok(None);
        };
        let lease = if until.is_none() {
            until
        } else {
            until.sub(now)?
        };
        let values = [
            queue.clone(),
            sub_id,
            id,
            bookmark.into_any(),
            payload,
            timestamp,
            lease,
            codec,
            headers,
            deliveries,
        ];
        let py = queue.py();
        let message = allocate(self.message.cls.bind(py))?;
        // SAFETY: the offsets were located on the class, `message` is a fresh instance
        // and the constructor checked the ten slots are the class's, each once.
        unsafe {
            for (at, value) in self.message.at.iter().zip(&values) {
                put(&message, *at, value);
            }
        }
        Ok(Some(message))
    }
}

/// `topic|partition|offset|` (`format_bookmark`) for an id of an exact str and two exact
/// ints that fit 64 bits; None for anything else, which the twin formats.
fn bookmark<'py>(id: &Bound<'py, PyAny>) -> Option<Bound<'py, PyString>> {
    let id = id.cast_exact::<PyTuple>().ok()?;
    if id.len() != 3 {
        return None;
    }
    let topic = id.get_item(0).ok()?;
    let topic = topic.cast_exact::<PyString>().ok()?.to_str().ok()?;
    let mut text = Vec::with_capacity(topic.len() + 24);
    text.extend_from_slice(topic.as_bytes());
    for at in [1, 2] {
        let number = id.get_item(at).ok()?;
        if !number.is_exact_instance_of::<PyInt>() {
            return None;
        }
        text.push(b'|');
        push_int(&mut text, number.extract::<i64>().ok()?);
    }
    text.push(b'|');
    let text = String::from_utf8(text).ok()?;
    Some(PyString::new(id.py(), &text))
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<MessageMaker>()
}
