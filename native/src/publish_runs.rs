//! `LogPublisher.publish_run` (log/one_frame_publishers.py; its twin `_run_twin`): a
//! gateway read's run of plain publishes (`(topic, s, payload)` tuples,
//! server/publishing.py `publish_run`) produced in one call. For each, the common case —
//! a routed topic, its key read from the payload by `key_of` (no key, or a top-level
//! field), a fresh partition count — is handed to the producer here with the headers
//! `publish_encoded` writes; anything else is handed to `publish_encoded` itself (the
//! twin's one publish) with its report callback `delivery(base | index)`, so every
//! record, refusal and number is the twin's. A publish neither takes ends the run (the
//! per-command path takes it).
//!
//! One loop, two producers (`Sink`): confluent-kafka's `produce` with a report callback
//! per record (`EncodedRun`), or the gateway's compiled producer, whose records are
//! reported as their batch's without a callback (`ProducerRun`, rdkafka_producer.rs).
use std::ffi::CString;

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyIterator, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::frames::valid;
use crate::publish::{count_stale, digits, stack_digits};
use crate::rdkafka_handle::Vu;
use crate::rdkafka_producer::RdProducer;
use crate::staging::{key_of, Key};

/// A run's common publish, read: what its producer is handed.
struct Record<'a, 'py> {
    /// The route's topic name (a str).
    name: &'a Bound<'py, PyAny>,
    payload: &'a Bound<'py, PyBytes>,
    key: Option<&'a str>,
    /// `b"%d" % sequence`.
    sequence: &'a [u8],
    /// `base | index`: the record's number in its batch's reports.
    number: u64,
}

/// Where a run's common publishes go.
trait Sink {
    /// Refuse the whole run before its first publish (a closed producer).
    fn open(&self) -> PyResult<()>;

    /// Produce `record` (reported through `delivery(record.number)` or its batch):
    /// whether the producer took it (false: it refused, and the run ends).
    fn send(&self, record: &Record<'_, '_>, delivery: &Bound<'_, PyAny>) -> PyResult<bool>;
}

/// What a run needs besides its producer: `publish_encoded`, the route table, the
/// partition count cache and its clock, and the sequence counter.
struct Run {
    encoded: Py<PyAny>,
    routes: Py<PyDict>,
    counts: Py<PyDict>,
    monotonic: Py<PyAny>,
    sequences: Py<PyIterator>,
}

impl Run {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in [
            self.encoded.as_any(),
            self.routes.as_any(),
            self.counts.as_any(),
            self.monotonic.as_any(),
            self.sequences.as_any(),
        ] {
            visit.call(held)?;
        }
        Ok(())
    }

    /// Produce `events[start:end]` in order, each reported as `base | index` (its index
    /// in `produced`, where each one produced is appended); the index of the first not
    /// produced (`end` when all were).
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        sink: &impl Sink,
        events: &Bound<'_, PyList>,
        start: usize,
        end: usize,
        delivery: &Bound<'_, PyAny>,
        base: u64,
        produced: &Bound<'_, PyList>,
    ) -> PyResult<usize> {
        sink.open()?;
        let mut fresh = Vec::new();
        let mut position = start;
        while position < end {
            let event = events.get_item(position)?;
            let number = base | produced.len() as u64;
            let taken = match self.common(sink, &event, number, delivery, &mut fresh)? {
                Some(taken) => taken,
                None => self.encoded(&event, &delivery.call1((number,))?)?,
            };
            if !taken {
                break;
            }
            produced.append(event)?;
            position += 1;
        }
        Ok(position)
    }

    /// `publish_encoded(topic, payload, s, report)`: whether it took the publish.
    fn encoded(&self, event: &Bound<'_, PyAny>, report: &Bound<'_, PyAny>) -> PyResult<bool> {
        let event = event.cast::<PyTuple>()?;
        let (topic, sequence, payload) =
            (event.get_item(0)?, event.get_item(1)?, event.get_item(2)?);
        let answer = self.encoded.bind(event.py());
        Ok(!answer.call1((topic, payload, sequence, report))?.is_none())
    }

    /// Some(whether produced) for the common case; None, having done nothing, for what
    /// `publish_encoded` decides.
    ///
    /// `fresh` holds the route names whose partition counts this run found fresh.
    fn common<'py>(
        &self,
        sink: &impl Sink,
        event: &Bound<'py, PyAny>,
        number: u64,
        delivery: &Bound<'py, PyAny>,
        fresh: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Option<bool>> {
        let py = event.py();
        let event = event.cast::<PyTuple>()?;
        let (topic, given, payload) = (event.get_item(0)?, event.get_item(1)?, event.get_item(2)?);
        let Some(route) = self.routes.bind(py).get_item(&topic)? else {
            return Ok(None);
        };
        let Ok(route) = route.cast_into::<PyTuple>() else {
            return Ok(None); // None: publish() takes the topic
        };
        let (name, extract, field) = (route.get_item(0)?, route.get_item(1)?, route.get_item(2)?);
        let Some((payload, key)) = Self::key(&payload, &extract, &field)? else {
            return Ok(None);
        };
        if !self.count_fresh(&name, &route.get_item(3)?, fresh)? {
            return Ok(None);
        }
        let sequence = match given.is_none() {
            true => self.next_sequence(py)?,
            false => given,
        };
        let (mut written, long);
        let sequence = match sequence.extract::<i64>() {
            Ok(value) => {
                written = [0u8; 20];
                stack_digits(value, &mut written)
            }
            Err(_) => {
                long = digits(&sequence)?;
                long.cast::<PyBytes>()?.as_bytes()
            }
        };
        let text = key.as_ref().map(|key| key.text());
        let record = Record {
            name: &name,
            payload,
            key: text.as_deref(),
            sequence,
            number,
        };
        sink.send(&record, delivery).map(Some)
    }

    /// The payload's bytes and the SOW key they give: no key (valid JSON, a topic with
    /// no key), or a top-level `field`'s; None for what `publish_encoded` decides (a key
    /// `extract` reads, an empty field name, what orjson must judge).
    fn key<'a, 'py>(
        payload: &'a Bound<'py, PyAny>,
        extract: &Bound<'py, PyAny>,
        field: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(&'a Bound<'py, PyBytes>, Option<Key<'a>>)>> {
        if (field.is_none() && !extract.is_none()) || (!field.is_none() && !field.is_truthy()?) {
            return Ok(None);
        }
        let payload = payload.cast::<PyBytes>()?;
        let bytes = payload.as_bytes();
        if field.is_none() {
            return Ok(valid(bytes).then_some((payload, None)));
        }
        let key = key_of(bytes, field.cast::<PyString>()?.to_str()?);
        Ok(key.map(|key| (payload, Some(key))))
    }

    /// Whether the route's partition count (`partitions`, 0 for a topic the producer's
    /// partitioner places) is the cached one and unexpired: checked once a run for each
    /// topic (`fresh`), as a run takes microseconds (the clock read and the comparisons
    /// were 1,000 instructions a record).
    fn count_fresh<'py>(
        &self,
        name: &Bound<'py, PyAny>,
        partitions: &Bound<'py, PyAny>,
        fresh: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        if !partitions.is_truthy()? || fresh.iter().any(|known| known.is(name)) {
            return Ok(true);
        }
        let py = name.py();
        let (counts, monotonic) = (self.counts.bind(py), self.monotonic.bind(py));
        if count_stale(counts, monotonic, name, partitions)? {
            return Ok(false);
        }
        fresh.push(name.clone());
        Ok(true)
    }

    /// `next(sequences)`.
    fn next_sequence<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.sequences.bind(py).clone().next() {
            Some(sequence) => sequence,
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

/// `publish_run` on confluent-kafka's producer (or a publisher's own compiled one, which
/// has no batches' handler): each record handed to `produce` with the headers
/// `publish_encoded` writes and its report callback `delivery(base | index)`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct EncodedRun {
    run: Run,
    publisher: Py<PyAny>,
    sequence_header: Py<PyString>,
    key_header: Py<PyString>,
    produce: Py<PyAny>,
    retried: Py<PyAny>,
}

#[pymethods]
impl EncodedRun {
    /// `encoded` (publish_encoded, the twin of one publish), the route table, the
    /// partition count cache and its clock, the sequence counter, the publisher's header
    /// and the header names of the sequence and the key, `produce`, and the exceptions
    /// of `produce` that end a run (`publish_encoded` answers None).
    #[new]
    #[pyo3(signature = (
        encoded, routes, counts, monotonic, sequences, publisher, sequence_header,
        key_header, produce, retried
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        encoded: Py<PyAny>,
        routes: Py<PyDict>,
        counts: Py<PyDict>,
        monotonic: Py<PyAny>,
        sequences: Py<PyIterator>,
        publisher: Py<PyAny>,
        sequence_header: Py<PyString>,
        key_header: Py<PyString>,
        produce: Py<PyAny>,
        retried: Py<PyAny>,
    ) -> Self {
        Self {
            run: Run {
                encoded,
                routes,
                counts,
                monotonic,
                sequences,
            },
            publisher,
            sequence_header,
            key_header,
            produce,
            retried,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.run.traverse(&visit)?;
        for held in [
            self.publisher.as_any(),
            self.sequence_header.as_any(),
            self.key_header.as_any(),
            self.produce.as_any(),
            self.retried.as_any(),
        ] {
            visit.call(held)?;
        }
        Ok(())
    }

    /// Produce `events[start:end]` in order, each reported to `delivery(base | index)`
    /// (its index in `produced`, where each one produced is appended); the index of the
    /// first not produced (`end` when all were).
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        start: usize,
        end: usize,
        delivery: &Bound<'_, PyAny>,
        base: u64,
        produced: &Bound<'_, PyList>,
    ) -> PyResult<usize> {
        self.run
            .call(self, events, start, end, delivery, base, produced)
    }
}

impl Sink for EncodedRun {
    fn open(&self) -> PyResult<()> {
        Ok(())
    }

    fn send(&self, record: &Record<'_, '_>, delivery: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = delivery.py();
        let report = delivery.call1((record.number,))?;
        let sequence = PyBytes::new(py, record.sequence);
        let numbered = PyTuple::new(py, [self.sequence_header.bind(py).as_any(), &sequence])?;
        let headers = PyList::new(py, [self.publisher.bind(py).as_any(), numbered.as_any()])?;
        let key = match record.key {
            Some(text) => {
                let encoded = PyBytes::new(py, text.as_bytes());
                headers.append((self.key_header.bind(py), encoded))?;
                PyString::new(py, text).into_any()
            }
            None => py.None().into_bound(py),
        };
        // produce(topic, value, key, partition, callback, on_delivery, timestamp, headers)
        let args = (
            record.name,
            record.payload,
            key,
            -1,
            report,
            py.None(),
            0,
            headers,
        );
        match self.produce.bind(py).call1(args) {
            Ok(_) => Ok(true),
            Err(err) if err.is_instance(py, self.retried.bind(py)) => Ok(false),
            Err(err) => Err(err),
        }
    }
}

/// `publish_run` on the gateway's compiled producer: each record handed to librdkafka
/// with the headers `publish_encoded` writes as C strings, reported as batched record
/// `base | index` (no Python callback made); a refusal by librdkafka (a full queue...)
/// ends the run.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct ProducerRun {
    run: Run,
    producer: Py<RdProducer>,
    publisher: Vec<u8>,
    names: [CString; 3],
}

#[pymethods]
impl ProducerRun {
    /// The producer, `publish_encoded`, the route table, the partition count cache and
    /// its clock, the sequence counter, the publisher's id, and the header names of the
    /// publisher, the sequence and the key.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        producer: Py<RdProducer>,
        encoded: Py<PyAny>,
        routes: Py<PyDict>,
        counts: Py<PyDict>,
        monotonic: Py<PyAny>,
        sequences: Py<PyIterator>,
        publisher: Vec<u8>,
        names: [String; 3],
    ) -> Self {
        Self {
            run: Run {
                encoded,
                routes,
                counts,
                monotonic,
                sequences,
            },
            producer,
            publisher,
            names: names.map(|name| CString::new(name).unwrap_or_default()),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.run.traverse(&visit)?;
        visit.call(&self.producer)
    }

    /// EncodedRun's call: produce `events[start:end]` in order, appending each one
    /// produced to `produced`; the index of the first not produced.
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        start: usize,
        end: usize,
        delivery: &Bound<'_, PyAny>,
        base: u64,
        produced: &Bound<'_, PyList>,
    ) -> PyResult<usize> {
        self.run
            .call(self, events, start, end, delivery, base, produced)
    }
}

impl Sink for ProducerRun {
    fn open(&self) -> PyResult<()> {
        self.producer.get().check_open()
    }

    fn send(&self, record: &Record<'_, '_>, _delivery: &Bound<'_, PyAny>) -> PyResult<bool> {
        let [publisher, numbered, keyed] = &self.names;
        let key = record.key.map(str::as_bytes);
        let headers = [
            Vu::header(publisher, Some(&self.publisher)),
            Vu::header(numbered, Some(record.sequence)),
            Vu::header(keyed, key),
        ];
        let code = self.producer.get().produce_batched(
            record.name.cast::<PyString>()?.to_str()?,
            record.payload.as_bytes(),
            key,
            &headers[..if key.is_some() { 3 } else { 2 }],
            record.number,
        );
        Ok(code == 0)
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<EncodedRun>()?;
    m.add_class::<ProducerRun>()
}
