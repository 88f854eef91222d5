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
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple, PyType};

use crate::records::{allocate, check_layout, locate, put, read};
use crate::scans::{escape_into, push_int};

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
        let mut topics = TopicText::new(false);
        for delivery in deliveries.iter() {
            let made = match self.common(queue, &delivery, now, &mut topics)? {
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
        topics: &mut TopicText<'py>,
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
        let Some(bookmark) = bookmark(&id, topics) else {
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
fn bookmark<'py>(
    id: &Bound<'py, PyAny>,
    topics: &mut TopicText<'py>,
) -> Option<Bound<'py, PyString>> {
    let mut text = Vec::with_capacity(48);
    push_bookmark(&mut text, id, topics)?;
    let text = String::from_utf8(text).ok()?;
    Some(PyString::new(id.py(), &text))
}

/// Appends the bookmark of `id` (see `bookmark`), its topic written by `topics`; None
/// (with `out` partly written) for an id `bookmark` leaves.
fn push_bookmark<'py>(
    out: &mut Vec<u8>,
    id: &Bound<'py, PyAny>,
    topics: &mut TopicText<'py>,
) -> Option<()> {
    let id = id.cast_exact::<PyTuple>().ok()?;
    if id.len() != 3 {
        return None;
    }
    topics.write(out, id.get_item(0).ok()?)?;
    for at in [1, 2] {
        out.push(b'|');
        push_int(out, exact_i64(&id.get_item(at).ok()?)?);
    }
    out.push(b'|');
    Some(())
}

/// A topic's text as written into a bookmark or an event, escaped as in a JSON string or
/// as it is, kept for the last topic written: the ids of a burst or an ack mostly name
/// one topic (each entry's id has a text object of its own, as the consumer made it, so
/// the text is compared, not the object), so it is escaped once.
pub(crate) struct TopicText<'py> {
    escaped: bool,
    topic: Option<Bound<'py, PyAny>>,
    raw: Vec<u8>,
    text: Vec<u8>,
}

impl<'py> TopicText<'py> {
    pub(crate) fn new(escaped: bool) -> Self {
        Self {
            escaped,
            topic: None,
            raw: Vec::new(),
            text: Vec::new(),
        }
    }

    /// Appends the text of `topic`, an exact str; None (nothing written) for another.
    pub(crate) fn write(&mut self, out: &mut Vec<u8>, topic: Bound<'py, PyAny>) -> Option<()> {
        if !self.topic.as_ref().is_some_and(|last| last.is(&topic)) {
            let raw = topic.cast_exact::<PyString>().ok()?.to_str().ok()?;
            if self.topic.is_none() || raw.as_bytes() != self.raw.as_slice() {
                self.raw.clear();
                self.raw.extend_from_slice(raw.as_bytes());
                self.text.clear();
                if self.escaped {
                    escape_into(&mut self.text, raw);
                } else {
                    self.text.extend_from_slice(raw.as_bytes());
                }
            }
            self.topic = Some(topic);
        }
        out.extend_from_slice(&self.text);
        Some(())
    }
}

/// The value of an exact int (not a bool) that fits 64 bits.
pub(crate) fn exact_i64(number: &Bound<PyAny>) -> Option<i64> {
    if !number.is_exact_instance_of::<PyInt>() {
        return None;
    }
    number.extract::<i64>().ok()
}

/// Writes a batched subscription's `recs` entries (docs/protocol.md) straight from its
/// deliveries (`amps_on_kafka/server/queues.py`, `write_recs`; its twin
/// `_write_recs_twin`): no `QueueMessage` and no dict a message, each entry's JSON as
/// orjson writes the twin's dict, `{"bm":..,"ts":..,"lp":..,"n":..}`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct BurstWriter {
    delivery: Layout<2>,
    entry: Layout<4>,
}

#[pymethods]
impl BurstWriter {
    /// The classes Delivery and QueueEntry (each with slots and no `__dict__`).
    #[new]
    fn new(delivery: &Bound<PyType>, entry: &Bound<PyType>) -> PyResult<Self> {
        Ok(Self {
            delivery: Layout::new(delivery, ["entry", "lease_until"])?,
            entry: Layout::new(entry, ["id", "payload", "timestamp", "codec"])?,
        })
    }

    /// From `deliveries[at]` on, while a delivery's codec is None or `plain` (one whose
    /// payloads go out as stored), appends its entry's JSON to `recs` and its payload to
    /// `payloads`, leased for what is left at `now`: (the index it stopped at, `size`
    /// plus the payloads' bytes). It also stops, where the twin would go on, at
    /// anything not of the classes given, a payload not exactly bytes, or an id,
    /// timestamp or lease that is not an exact int of 64 bits.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        deliveries: &Bound<PyList>,
        at: usize,
        now: &Bound<PyAny>,
        plain: &Bound<PyAny>,
        recs: &Bound<PyList>,
        payloads: &Bound<PyList>,
        size: usize,
    ) -> PyResult<(usize, usize)> {
        let (mut at, mut size) = (at, size);
        let Some(now) = exact_i64(now) else {
            return Ok((at, size));
        };
        let mut rec = Vec::with_capacity(96);
        let mut topics = TopicText::new(true);
        while at < deliveries.len() {
            let delivery = deliveries.get_item(at)?;
            rec.clear();
            let Some(payload) = self.rec(&delivery, now, plain, &mut topics, &mut rec) else {
                break;
            };
            size += payload.as_bytes().len();
            recs.append(PyBytes::new(deliveries.py(), &rec))?;
            payloads.append(payload)?;
            at += 1;
        }
        Ok((at, size))
    }
}

impl BurstWriter {
    /// Writes the delivery's entry into `out` and gives its payload; None where `write`
    /// stops.
    fn rec<'py>(
        &self,
        delivery: &Bound<'py, PyAny>,
        now: i64,
        plain: &Bound<PyAny>,
        topics: &mut TopicText<'py>,
        out: &mut Vec<u8>,
    ) -> Option<Bound<'py, PyBytes>> {
        let [entry, until] = self.delivery.read(delivery)?;
        let [id, payload, timestamp, codec] = self.entry.read(&entry)?;
        if !codec.is_none() && !codec.is(plain) {
            return None;
        }
        let payload = payload.cast_into_exact::<PyBytes>().ok()?;
        let lease = if until.is_none() {
            None
        } else {
            Some(exact_i64(&until)?.checked_sub(now)?)
        };
        out.extend_from_slice(b"{\"bm\":\"");
        push_bookmark(out, &id, topics)?;
        out.extend_from_slice(b"\",\"ts\":");
        push_int(out, exact_i64(&timestamp)?);
        if let Some(lease) = lease {
            out.extend_from_slice(b",\"lp\":");
            push_int(out, lease);
        }
        out.extend_from_slice(b",\"n\":");
        push_int(out, i64::try_from(payload.as_bytes().len()).ok()?);
        out.push(b'}');
        Some(payload)
    }
}

/// How many of a flush's deliveries are redeliveries (`queue_recording.py`,
/// `redelivered`; its twin `_redelivered_twin`): the runtime counts them for the admin
/// port at every flush, and the twin's generator cost ~0.07 us a delivery.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct RedeliveryCount {
    delivery: Layout<1>,
    entry: Layout<1>,
}

#[pymethods]
impl RedeliveryCount {
    /// The classes Delivery and QueueEntry (each with slots and no `__dict__`).
    #[new]
    fn new(delivery: &Bound<PyType>, entry: &Bound<PyType>) -> PyResult<Self> {
        Ok(Self {
            delivery: Layout::new(delivery, ["entry"])?,
            entry: Layout::new(entry, ["deliveries"])?,
        })
    }

    /// The deliveries whose entry was delivered more than once; None when one is not of
    /// the classes given or its count is not an exact int of 64 bits (the twin counts).
    fn count(&self, deliveries: &Bound<PyList>) -> Option<usize> {
        let mut redelivered = 0;
        for delivery in deliveries.iter() {
            let [entry] = self.delivery.read(&delivery)?;
            let [times] = self.entry.read(&entry)?;
            if exact_i64(&times)? > 1 {
                redelivered += 1;
            }
        }
        Some(redelivered)
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<MessageMaker>()?;
    m.add_class::<BurstWriter>()?;
    m.add_class::<RedeliveryCount>()
}
