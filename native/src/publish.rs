//! `LogPublisher.publish_document` (log/publisher.py), the call `Client.publish` is on
//! kafka://: the common publish — a dict to a JSON topic whose key the producer's own
//! partitioner places, no expiration, no options — read, numbered and handed to Kafka's
//! `produce` here. Its Python twin (`_document_twin`) spends about half a microsecond a
//! message interpreting the same steps and making the per-record delivery callback, an
//! object the garbage collector tracks until Kafka answers (docs/performance.md).
//!
//! Every step is the twin's, in the twin's order, through the same Python objects (the
//! route table, the sequence counter, orjson's `dumps`, the key extractor, the partition
//! count cache, `produce`); whatever the twin hands to the general path (LogPublisher.
//! publish) or to its own fallbacks is handed to the same callables here, so refusals,
//! errors and records are the same.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyIterator, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use std::ffi::CString;
use std::io::Write;

use crate::rdkafka_producer::RdProducer;

/// A record's delivery report callback: `delivered(sequence, error, message)`. librdkafka
/// holds one per record until Kafka answers (up to a million at once); not being a
/// container the collector tracks, it triggers no collections while it waits.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Delivery {
    delivered: Py<PyAny>,
    sequence: Py<PyAny>,
}

#[pymethods]
impl Delivery {
    fn __call__(&self, py: Python<'_>, error: Py<PyAny>, message: Py<PyAny>) -> PyResult<()> {
        let delivered = self.delivered.bind(py);
        delivered.call1((self.sequence.clone_ref(py), error, message))?;
        Ok(())
    }

    /// The sequence number of its record, as the twin's (an int) gives it.
    fn __index__(&self, py: Python<'_>) -> Py<PyAny> {
        self.sequence.clone_ref(py)
    }
}

/// The callable bound as `publish_document`: `publish(topic, data, expiration=None, **kw)`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct DocumentPublisher {
    general: Py<PyAny>,
    routes: Py<PyDict>,
    route_of: Py<PyAny>,
    check_topic: Py<PyAny>,
    dumps: Py<PyAny>,
    sequences: Py<PyIterator>,
    publisher: Py<PyAny>,
    sequence_header: Py<PyString>,
    key_header: Py<PyString>,
    counts: Py<PyDict>,
    monotonic: Py<PyAny>,
    recheck: Py<PyAny>,
    produce: Py<PyAny>,
    retried: Py<PyAny>,
    retry: Py<PyAny>,
    delivered: Py<PyAny>,
    poll: Py<PyAny>,
    poll_every: i64,
    /// The client's own compiled producer (log/native_producer.py), whose records are
    /// numbered (reported only if they fail) instead of given a callback each; with
    /// the headers' names (the publisher's, the sequence's, the key's) as C strings.
    /// And the publisher's id, its header's value.
    numbered: Option<(Py<RdProducer>, [CString; 3], Vec<u8>)>,
}

#[pymethods]
impl DocumentPublisher {
    /// The twin's closure variables, by name: `general` (LogPublisher.publish), the
    /// route table and `route_of` filling it, `check_topic` naming a topic of a wrong
    /// type, orjson's `dumps`, the sequence counter, the publisher's header and the
    /// header names of the sequence and the key, the partition count cache and the clock
    /// it expires by, `recheck(topic, key)` (the general partition check), `produce`,
    /// the exceptions of `produce` that `retry` (LogPublisher._produce) takes over,
    /// `delivered` (the reports' receiver), the producer's `poll` and its cadence; and
    /// `numbered`, the publisher's own RdProducer when it is compiled (records numbered,
    /// not given a callback: RdProducer.produce_numbered).
    #[new]
    #[pyo3(signature = (
        general, routes, route_of, check_topic, dumps, sequences, publisher,
        sequence_header, key_header, counts, monotonic, recheck, produce, retried, retry,
        delivered, poll, poll_every, numbered=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        general: Py<PyAny>,
        routes: Py<PyDict>,
        route_of: Py<PyAny>,
        check_topic: Py<PyAny>,
        dumps: Py<PyAny>,
        sequences: Py<PyIterator>,
        publisher: Py<PyAny>,
        sequence_header: Py<PyString>,
        key_header: Py<PyString>,
        counts: Py<PyDict>,
        monotonic: Py<PyAny>,
        recheck: Py<PyAny>,
        produce: Py<PyAny>,
        retried: Py<PyAny>,
        retry: Py<PyAny>,
        delivered: Py<PyAny>,
        poll: Py<PyAny>,
        poll_every: i64,
        numbered: Option<Py<RdProducer>>,
    ) -> PyResult<Self> {
        if poll_every < 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "poll_every must be at least 1, not {poll_every}"
            )));
        }
        let numbered = match numbered {
            None => None,
            Some(producer) => Python::attach(|py| -> PyResult<_> {
                let name = |text: &Bound<PyAny>| -> PyResult<CString> {
                    CString::new(text.extract::<String>()?).map_err(|_| {
                        pyo3::exceptions::PyValueError::new_err("a NUL in a header name")
                    })
                };
                let names = [
                    name(&publisher.bind(py).get_item(0)?)?,
                    name(sequence_header.bind(py).as_any())?,
                    name(key_header.bind(py).as_any())?,
                ];
                let id = publisher.bind(py).get_item(1)?.extract::<Vec<u8>>()?;
                Ok(Some((producer, names, id)))
            })?,
        };
        Ok(Self {
            general,
            routes,
            route_of,
            check_topic,
            dumps,
            sequences,
            publisher,
            sequence_header,
            key_header,
            counts,
            monotonic,
            recheck,
            produce,
            retried,
            retry,
            delivered,
            poll,
            poll_every,
            numbered,
        })
    }

    /// What it holds, for the collector: it holds its LogPublisher's methods and the
    /// publisher holds it, a cycle the publisher's own clear breaks.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in [
            self.general.as_any(),
            self.routes.as_any(),
            self.route_of.as_any(),
            self.check_topic.as_any(),
            self.dumps.as_any(),
            self.sequences.as_any(),
            self.publisher.as_any(),
            self.sequence_header.as_any(),
            self.key_header.as_any(),
            self.counts.as_any(),
            self.monotonic.as_any(),
            self.recheck.as_any(),
            self.produce.as_any(),
            self.retried.as_any(),
            self.retry.as_any(),
            self.delivered.as_any(),
            self.poll.as_any(),
        ] {
            visit.call(held)?;
        }
        if let Some((producer, _, _)) = &self.numbered {
            visit.call(producer)?;
        }
        Ok(())
    }

    #[pyo3(signature = (topic, data, expiration=None, **kw))]
    fn __call__<'py>(
        &self,
        topic: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
        expiration: Option<&Bound<'py, PyAny>>,
        kw: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = topic.py();
        let route = self.route(topic)?;
        let plain = kw.is_none_or(|kw| kw.is_empty()) && expiration.is_none();
        let data = match data.cast_exact::<PyDict>() {
            Ok(data) if plain && !route.is_none() => data,
            _ => return self.general.bind(py).call((topic, data, expiration), kw),
        };
        let route = route.cast_into::<PyTuple>()?;
        let name = route.get_item(0)?;
        let value = match self.dumps.bind(py).call1((data,)) {
            Ok(value) => value,
            Err(err) if err.is_instance_of::<PyTypeError>(py) => {
                return self.general.bind(py).call1((topic, data)); // the codec's MessageError
            }
            Err(err) => return Err(err),
        };
        let extract = route.get_item(1)?;
        let (key, key_bytes, sequence) = if extract.is_none() {
            let sequence = self.next_sequence(py)?; // numbered once valid, as publish() does
            (py.None().into_bound(py), None, sequence)
        } else {
            let key = Self::key(data, &route.get_item(2)?, &extract)?;
            let sequence = self.next_sequence(py)?;
            let key_bytes = match key.cast::<PyString>() {
                Ok(text) => text.encode_utf8()?.into_any(),
                Err(_) => key.call_method0("encode")?,
            };
            let partitions = route.get_item(3)?;
            if partitions.is_truthy()? && self.count_stale(&name, &partitions)? {
                self.recheck.bind(py).call1((topic, &key))?; // refused if it changed
            }
            (key, Some(key_bytes), sequence)
        };
        let numbered = self.produce_numbered(&name, &value, &key, key_bytes.as_ref(), &sequence)?;
        if numbered == Some(0) {
            if self.due_poll(&sequence)? {
                self.poll.bind(py).call1((0,))?;
            }
            return Ok(sequence);
        }
        let headers = self.headers(key_bytes.as_ref(), &sequence)?; // the twin's, for produce
        if numbered.is_some() {
            // refused, as produce raising BufferError or KafkaException: the general handling
            let retry = self.retry.bind(py);
            retry.call1((&name, &key, &value, &headers, &sequence, py.None()))?;
            return Ok(sequence);
        }
        let delivery = Bound::new(
            py,
            Delivery {
                delivered: self.delivered.clone_ref(py),
                sequence: sequence.clone().unbind(),
            },
        )?;
        // produce(topic, value, key, partition, callback, on_delivery, timestamp, headers):
        // partition -1 lets the producer place it, timestamp 0 is now, as their defaults
        let args = (&name, &value, &key, -1, delivery, py.None(), 0, &headers);
        if let Err(err) = self.produce.bind(py).call1(args) {
            if !err.is_instance(py, self.retried.bind(py)) {
                return Err(err);
            }
            let retry = self.retry.bind(py);
            retry.call1((&name, &key, &value, &headers, &sequence, py.None()))?;
            return Ok(sequence);
        }
        if self.due_poll(&sequence)? {
            self.poll.bind(py).call1((0,))?;
        }
        Ok(sequence)
    }
}

impl DocumentPublisher {
    /// The topic's route (None: the general path), as `routes[topic] if topic in routes
    /// else route_of(topic)`; a topic that can't be a key is named by check_topic.
    fn route<'py>(&self, topic: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = topic.py();
        match self.routes.bind(py).get_item(topic) {
            Ok(Some(route)) => Ok(route),
            Ok(None) => self.route_of.bind(py).call1((topic,)),
            Err(err) if err.is_instance_of::<PyTypeError>(py) => {
                self.check_topic.bind(py).call1((topic,))?;
                Err(err)
            }
            Err(err) => Err(err),
        }
    }

    /// The SOW key: the top-level `field`'s int (its digits) or non-empty text, read
    /// here; anything else (and a key of several fields, `field` None) by `extract`.
    fn key<'py>(
        data: &Bound<'py, PyDict>,
        field: &Bound<'py, PyAny>,
        extract: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !field.is_none() {
            if let Some(known) = data.get_item(field)? {
                if known.is_exact_instance_of::<PyInt>() {
                    return Ok(known.str()?.into_any());
                }
                if let Ok(text) = known.cast_exact::<PyString>() {
                    if text.len()? > 0 {
                        return Ok(known);
                    }
                }
            }
        }
        extract.call1((data,))
    }

    /// `next(sequences)`.
    fn next_sequence<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.sequences.bind(py).clone().next() {
            Some(sequence) => sequence,
            None => Err(pyo3::exceptions::PyStopIteration::new_err(())),
        }
    }

    /// The sequence header, `(H_SEQUENCE, b"%d" % sequence)`.
    fn numbered<'py>(&self, sequence: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = sequence.py();
        let header = [self.sequence_header.bind(py).as_any(), &digits(sequence)?];
        Ok(PyTuple::new(py, header)?.into_any())
    }

    fn count_stale(&self, name: &Bound<PyAny>, partitions: &Bound<PyAny>) -> PyResult<bool> {
        let py = name.py();
        count_stale(
            self.counts.bind(py),
            self.monotonic.bind(py),
            name,
            partitions,
        )
    }

    /// The record produced on the client's compiled producer as a numbered one (no
    /// callback), with the bytes of the `headers` the twin would give `produce`: Some(0)
    /// or librdkafka's refusal code; None, having done nothing, without that producer
    /// or for a number it cannot hold (then `produce` takes it with a callback).
    fn produce_numbered(
        &self,
        name: &Bound<PyAny>,
        value: &Bound<PyAny>,
        key: &Bound<PyAny>,
        key_bytes: Option<&Bound<PyAny>>,
        sequence: &Bound<PyAny>,
    ) -> PyResult<Option<std::ffi::c_int>> {
        let Some((producer, [publisher, numbered, keyed], id)) = &self.numbered else {
            return Ok(None);
        };
        let Ok(number) = sequence.extract::<i64>() else {
            return Ok(None);
        };
        // the key as `produce` encodes a str key, the bytes of the twin's `k` header
        let key = match key_bytes {
            None => None,
            Some(bytes) if key.is_instance_of::<PyString>() => Some(bytes.cast::<PyBytes>()?),
            Some(_) => return Ok(None), // what `produce` makes of another key, it says
        };
        let mut written = [0u8; 20];
        let digits = stack_digits(number, &mut written);
        let mut fields = [(publisher, &id[..]), (numbered, digits), (keyed, &[][..])];
        if let Some(key) = key {
            fields[2].1 = key.as_bytes();
        }
        producer.get().produce_numbered(
            name.cast::<PyString>()?.to_str()?,
            value.cast::<PyBytes>()?.as_bytes(),
            key.map(|key| key.as_bytes()),
            &fields[..if key.is_some() { 3 } else { 2 }],
            number,
        )
    }

    /// The twin's header list: the publisher's, the sequence's, and the key's if keyed.
    fn headers<'py>(
        &self,
        key_bytes: Option<&Bound<'py, PyAny>>,
        sequence: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = sequence.py();
        let headers = PyList::new(py, [self.publisher.bind(py), &self.numbered(sequence)?])?;
        if let Some(bytes) = key_bytes {
            headers.append(PyTuple::new(
                py,
                [self.key_header.bind(py).as_any(), bytes],
            )?)?;
        }
        Ok(headers)
    }

    /// `not sequence % poll_every`.
    fn due_poll(&self, sequence: &Bound<PyAny>) -> PyResult<bool> {
        match sequence.extract::<i64>() {
            Ok(number) => Ok(number.rem_euclid(self.poll_every) == 0),
            Err(_) => Ok(!sequence.rem(self.poll_every)?.is_truthy()?),
        }
    }
}

/// Whether the cached partition count of `name` is missing, expired or not the one the
/// route was made with (`cached is None or cached[1] <= monotonic() or cached[0] !=
/// partitions`), as the twins check it.
pub(crate) fn count_stale(
    counts: &Bound<PyDict>,
    monotonic: &Bound<PyAny>,
    name: &Bound<PyAny>,
    partitions: &Bound<PyAny>,
) -> PyResult<bool> {
    let Some(cached) = counts.get_item(name)? else {
        return Ok(true);
    };
    if cached.get_item(1)?.le(monotonic.call0()?)? {
        return Ok(true);
    }
    cached.get_item(0)?.ne(partitions)
}

/// `b"%d" % number` written into `buffer`, no allocation (20 bytes hold any i64).
pub(crate) fn stack_digits(number: i64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = std::io::Cursor::new(&mut buffer[..]);
    write!(at, "{number}").expect("20 bytes hold an i64's digits");
    let end = at.position() as usize;
    &buffer[..end]
}

/// `b"%d" % sequence`.
pub(crate) fn digits<'py>(sequence: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = sequence.py();
    Ok(match sequence.extract::<i64>() {
        Ok(number) => PyBytes::new(py, number.to_string().as_bytes()),
        Err(_) => PyBytes::new(py, sequence.str()?.to_str()?.as_bytes()),
    }
    .into_any())
}

/// A session's report callbacks of batched records (server/publishing.py,
/// `_batch_delivery`, whose `Delivery(number)` int is the twin): `deliveries(number)` is
/// the callback of record `number` (batch << 32 | index). Made on the loop for every
/// record a run produces and called on the pump's thread for its report: here neither is
/// a Python frame, and the callback is not an object the collector tracks.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct BatchDeliveries {
    batches: Py<PyDict>,
    failure_reason: Py<PyAny>,
    post: Py<PyAny>,
    finish: Py<PyAny>,
}

#[pymethods]
impl BatchDeliveries {
    /// The session's batches by number, the pump's `failure_reason` and `post`, and
    /// `finish` (Writes.finish_batch), posted with a batch once its last report came.
    #[new]
    fn new(
        batches: Py<PyDict>,
        failure_reason: Py<PyAny>,
        post: Py<PyAny>,
        finish: Py<PyAny>,
    ) -> Self {
        Self {
            batches,
            failure_reason,
            post,
            finish,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in [
            self.batches.as_any(),
            self.failure_reason.as_any(),
            self.post.as_any(),
            self.finish.as_any(),
        ] {
            visit.call(held)?;
        }
        Ok(())
    }

    fn __call__(slf: &Bound<'_, Self>, number: u64) -> PyResult<BatchDelivery> {
        Ok(BatchDelivery {
            number,
            owner: slf.clone().unbind(),
        })
    }
}

/// One record's report callback: `callback(error, message)`; `int()` of it is its number.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct BatchDelivery {
    number: u64,
    owner: Py<BatchDeliveries>,
}

#[pymethods]
impl BatchDelivery {
    /// As the twin's: the batch counted down, a failure kept with its index and reason,
    /// the batch posted to the loop by the report that draws its `expected`; nothing
    /// for a batch no longer there.
    fn __call__(&self, py: Python<'_>, error: Py<PyAny>, _message: Py<PyAny>) -> PyResult<()> {
        let owner = self.owner.get();
        let key = self.number >> 32;
        let Some(batch) = owner.batches.bind(py).get_item(key)? else {
            return Ok(()); // answered already as unreported (Writes.expire): too late
        };
        let error = error.bind(py);
        if !error.is_none() {
            let reason = owner.failure_reason.bind(py).call1((error,))?;
            let failures = batch.getattr(intern!(py, "failures"))?;
            failures.call_method1(
                intern!(py, "append"),
                ((self.number & 0xFFFF_FFFF, reason),),
            )?;
        }
        let reports = batch.getattr(intern!(py, "reports"))?;
        let drawn = match reports.cast_into::<PyIterator>()?.next() {
            Some(drawn) => drawn?,
            None => return Err(pyo3::exceptions::PyStopIteration::new_err(())),
        };
        if drawn.eq(batch.getattr(intern!(py, "expected"))?)? {
            owner.post.bind(py).call1((owner.finish.bind(py), batch))?;
        }
        Ok(())
    }

    fn __index__(&self) -> u64 {
        self.number
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<DocumentPublisher>()?;
    m.add_class::<BatchDeliveries>()?;
    m.add_class::<BatchDelivery>()?;
    m.add_class::<Delivery>()
}
