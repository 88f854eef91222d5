//! The gateway's shared producer through librdkafka's C API
//! (`amps_on_kafka/log/native_producer.py`).
//!
//! Through confluent-kafka a `tcp://` publish cost the gateway 5,900 instructions in
//! `produce` (keyword parsing, three headers converted) and 4,100 more for its delivery
//! report (the GIL taken, a `Message` made, a Python callback called), per record
//! (docs/performance.md). This is a producer handle of its own on the librdkafka the
//! confluent-kafka wheel loaded (found and version-checked as the replay's reader is),
//! configured with the same text settings, that:
//! - produces a gateway read's run of plain publishes in one call (publish_runs.rs
//!   `ProducerRun`), the headers given to `rd_kafka_produceva` as C strings, the SOW key
//!   read by the worker's own `key_of`, no Python object made per record;
//! - takes delivery reports in a C callback into a queue of its own, with no GIL, and
//!   hands a poll's reports of batched records to Python as one list of
//!   `(batch number, reports, failures)`: no Python call per record;
//! - still takes confluent-kafka's `produce(topic, value, key, partition, callback,
//!   on_delivery, timestamp, headers)` with a Python callback per record, for every other
//!   command the gateway writes, so all of them go through one producer, in order.
use std::ffi::{c_int, CString};
use std::sync::OnceLock;

use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::rdkafka_handle::{Handle, Vu, PARTITION_UA};
use crate::rdkafka_reports::{
    batched, boxed, count_batched, number_of, numbered, Delivered, Group, Report,
};

/// `RD_KAFKA_RESP_ERR__QUEUE_FULL`: confluent-kafka raises BufferError for it.
const QUEUE_FULL: c_int = -184;

/// confluent-kafka's `Producer` as the gateway uses it, on a handle of our own.
#[pyclass(frozen, module = "amps_on_kafka_native")]
pub(crate) struct RdProducer {
    handle: Handle,
    kafka_error: Py<PyAny>,
    kafka_exception: Py<PyAny>,
    /// `batches([(batch number, reports, [(index, code, text)])])`, set once.
    batches: OnceLock<Py<PyAny>>,
    /// `failures(number, error, message)` for a numbered record that failed, set once.
    failures: OnceLock<Py<PyAny>>,
    /// `log([(syslog level, facility, text)], dropped)`: librdkafka's warnings, set once.
    log: OnceLock<Py<PyAny>>,
}

#[pymethods]
impl RdProducer {
    /// The library at `path` (confluent-kafka's), of `version`, configured with text
    /// `settings`; `KafkaError` and `KafkaException` for the errors it raises and
    /// reports. ValueError when the library or a setting is refused (the caller falls
    /// back to confluent-kafka's producer).
    #[new]
    fn new(
        path: &str,
        version: i32,
        settings: Vec<(String, String)>,
        kafka_error: Py<PyAny>,
        kafka_exception: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            handle: Handle::open(path, version, &settings)?,
            kafka_error,
            kafka_exception,
            batches: OnceLock::new(),
            failures: OnceLock::new(),
            log: OnceLock::new(),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.kafka_error)?;
        visit.call(&self.kafka_exception)?;
        for handler in [&self.batches, &self.failures, &self.log] {
            if let Some(handler) = handler.get() {
                visit.call(handler)?;
            }
        }
        Ok(())
    }

    /// Where a poll's reports of batched records go (the gateway's DeliveryPump).
    fn serve_batches(&self, handler: Py<PyAny>) -> PyResult<()> {
        self.batches
            .set(handler)
            .map_err(|_| PyRuntimeError::new_err("the batches' handler is set already"))
    }

    /// Where librdkafka's warnings and errors go, once per poll that found any:
    /// `handler([(syslog level, facility, text)], dropped)` (log/kafka.py ProducerLog).
    /// Until it is set they are dropped.
    fn serve_log(&self, handler: Py<PyAny>) -> PyResult<()> {
        self.log
            .set(handler)
            .map_err(|_| PyRuntimeError::new_err("the log's handler is set already"))
    }

    /// Where a numbered record's failure goes: `handler(number, KafkaError, message)`
    /// (the client's LogPublisher._delivered). Until it is set nothing is numbered.
    fn serve_failures(&self, handler: Py<PyAny>) -> PyResult<()> {
        self.failures
            .set(handler)
            .map_err(|_| PyRuntimeError::new_err("the failures' handler is set already"))
    }

    /// confluent-kafka's `produce`: BufferError when the queue is full, KafkaException
    /// with its text ("Unable to produce message: ...") for any other refusal.
    #[pyo3(signature = (
        topic, value=None, key=None, partition=-1, callback=None, on_delivery=None,
        timestamp=0, headers=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn produce(
        &self,
        py: Python<'_>,
        topic: &str,
        value: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
        partition: i32,
        callback: Option<Py<PyAny>>,
        on_delivery: Option<Py<PyAny>>,
        timestamp: i64,
        headers: Option<&Bound<'_, PyList>>,
    ) -> PyResult<()> {
        self.check_open()?;
        let value = value.map(as_bytes).transpose()?;
        let key = key.map(as_bytes).transpose()?;
        let mut names = Vec::new();
        let mut values = Vec::new();
        for header in headers.into_iter().flatten() {
            let header = header.cast_into::<PyTuple>()?;
            let name = header.get_item(0)?.extract::<String>()?;
            names.push(
                CString::new(name).map_err(|_| PyValueError::new_err("a NUL in a header name"))?,
            );
            let value = header.get_item(1)?;
            values.push(if value.is_none() {
                None
            } else {
                Some(as_bytes(&value)?)
            });
        }
        let vus: Vec<Vu> = names
            .iter()
            .zip(&values)
            .map(|(name, value)| Vu::header(name, value.as_deref()))
            .collect();
        let opaque = match callback.or(on_delivery) {
            Some(callback) => Box::into_raw(Box::new(callback)) as usize,
            None => 0,
        };
        let code = self.handle.send(
            topic,
            value.as_deref(),
            key.as_deref(),
            partition,
            timestamp,
            &vus,
            opaque,
        );
        if code == 0 {
            return Ok(());
        }
        if opaque != 0 {
            // SAFETY: refused, so librdkafka did not keep the Box made above.
            drop(unsafe { Box::from_raw(opaque as *mut Py<PyAny>) });
        }
        Err(self.refusal(py, code))
    }

    /// Serve delivery reports, waiting up to `timeout` seconds (the GIL released) for
    /// the first; the number served. Every report is handed on even if a callback
    /// raises; the first exception is raised after.
    #[pyo3(signature = (timeout=-1.0))]
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<i32> {
        let (handle, wait) = (&self.handle, millis(timeout));
        let served = py.detach(|| handle.poll(wait));
        self.serve(py)?;
        Ok(served.unwrap_or(0))
    }

    /// Wait up to `timeout` seconds for every record to be reported, serving the
    /// reports; the number still queued.
    #[pyo3(signature = (timeout=-1.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<i32> {
        let (handle, wait) = (&self.handle, millis(timeout));
        py.detach(|| handle.flush(wait));
        self.serve(py)?;
        Ok(self.__len__() as i32)
    }

    fn __len__(&self) -> usize {
        self.handle.queued()
    }

    /// Destroy the handle now (its threads and connections), after any poll or flush
    /// under way returns; idempotent. A produce, poll or flush after it does nothing
    /// (produce raises RuntimeError).
    fn close(&self, py: Python<'_>) {
        self.handle.shut(py)
    }

    /// `(code, text)` of librdkafka's fatal error once it raised one (every later
    /// produce fails: the owner replaces the producer), else None; None once closed.
    fn fatal_error(&self) -> Option<(i32, String)> {
        self.handle.fatal()
    }

    /// Tests only: librdkafka raises fatal error `code` with `reason` as if it had met
    /// one (`rd_kafka_test_fatal_error`); its result code, -1 once closed.
    fn _test_fatal_error(&self, code: i32, reason: &str) -> PyResult<i32> {
        let reason = CString::new(reason).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(self.handle.test_fatal(code, &reason))
    }
}

impl RdProducer {
    /// RuntimeError once closed.
    pub(crate) fn check_open(&self) -> PyResult<()> {
        if self.handle.is_closed() {
            return Err(PyRuntimeError::new_err("the producer is closed"));
        }
        Ok(())
    }

    /// What confluent-kafka raises for a refused produce.
    fn refusal(&self, py: Python<'_>, code: c_int) -> PyErr {
        let reason = self.handle.reason(code);
        if code == QUEUE_FULL {
            return PyBufferError::new_err(reason);
        }
        let message = format!("Unable to produce message: {reason}");
        match self.kafka_error.bind(py).call1((code, message)) {
            Ok(error) => PyErr::from_value(match self.kafka_exception.bind(py).call1((error,)) {
                Ok(exception) => exception,
                Err(err) => return err,
            }),
            Err(err) => err,
        }
    }

    /// Hand the queued log lines and reports on: the lines to the log's handler, each
    /// Python callback called, the batched records' reports grouped by batch and handed
    /// to the batches' handler in one call.
    fn serve(&self, py: Python<'_>) -> PyResult<()> {
        let logged = self.serve_lines(py);
        let reports = self.handle.take_reports();
        if reports.is_empty() {
            return logged;
        }
        let mut first_error = logged.err();
        let mut groups: Vec<Group> = Vec::new();
        for report in reports {
            let Some(report) = count_batched(&mut groups, report) else {
                continue;
            };
            if let Some(number) = number_of(report.opaque) {
                if let Err(err) = self.fail_numbered(py, number, report) {
                    first_error.get_or_insert(err);
                }
            } else if boxed(report.opaque) {
                // SAFETY: a boxed opaque is a Box made by `produce`.
                let callback = unsafe { Box::from_raw(report.opaque as *mut Py<PyAny>) };
                let called = self
                    .arguments(py, report)
                    .and_then(|arguments| callback.bind(py).call1(arguments).map(drop));
                if let Err(err) = called {
                    first_error.get_or_insert(err);
                }
            }
        }
        if let (false, Some(handler)) = (groups.is_empty(), self.batches.get()) {
            if let Err(err) = handler.bind(py).call1((groups,)) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The log lines kept since the last serve, to the log's handler (if any).
    fn serve_lines(&self, py: Python<'_>) -> PyResult<()> {
        let (lines, dropped) = self.handle.take_lines();
        match self.log.get() {
            Some(handler) if !lines.is_empty() || dropped > 0 => {
                handler.bind(py).call1((lines, dropped)).map(drop)
            }
            _ => Ok(()),
        }
    }

    /// A numbered record's failure, handed to the failures' handler (the C callback
    /// queued no success of one).
    fn fail_numbered(&self, py: Python<'_>, number: i64, report: Report) -> PyResult<()> {
        let Some(handler) = self.failures.get() else {
            return Ok(()); // produce_numbered numbers nothing without one
        };
        let (error, message) = self.arguments(py, report)?;
        handler.bind(py).call1((number, error, message))?;
        Ok(())
    }

    /// A report as a delivery callback takes it: (KafkaError or None, the message).
    fn arguments(&self, py: Python<'_>, mut report: Report) -> PyResult<(Py<PyAny>, Delivered)> {
        let error = if report.err == 0 {
            py.None()
        } else {
            let reason = std::mem::take(&mut report.reason);
            self.kafka_error
                .bind(py)
                .call1((report.err, reason))?
                .unbind()
        };
        let message = Delivered::new(report, error.clone_ref(py));
        Ok((error, message))
    }

    /// Produce batched record `number` (`batch << 32 | index`, publish_runs.rs
    /// ProducerRun), reported in its batch's group to the batches' handler; 0 or
    /// librdkafka's refusal code.
    pub(crate) fn produce_batched(
        &self,
        topic: &str,
        value: &[u8],
        key: Option<&[u8]>,
        headers: &[Vu],
        number: u64,
    ) -> c_int {
        let opaque = batched(number);
        let handle = &self.handle;
        handle.send(topic, Some(value), key, PARTITION_UA, 0, headers, opaque)
    }

    /// Produce a record reported only if it fails, by `number`, to the failures'
    /// handler: no Python callback is made or kept (publish.rs DocumentPublisher, the
    /// client's publish). At most three `headers`, their names NUL-terminated. None, having
    /// done nothing, when no handler is set or the number is past ±2^61 (the caller
    /// produces with a callback); else 0 or librdkafka's refusal code.
    pub(crate) fn produce_numbered(
        &self,
        topic: &str,
        value: &[u8],
        key: Option<&[u8]>,
        headers: &[(&CString, &[u8])],
        number: i64,
    ) -> PyResult<Option<c_int>> {
        self.check_open()?;
        let (Some(_), Some(opaque)) = (self.failures.get(), numbered(number)) else {
            return Ok(None);
        };
        let mut vus = [Vu::end(); 3];
        let count = headers.len();
        if count > vus.len() {
            return Err(PyValueError::new_err(
                "a numbered record takes at most 3 headers",
            ));
        }
        for (vu, (name, value)) in vus.iter_mut().zip(headers) {
            *vu = Vu::header(name, Some(value));
        }
        let code = self.handle.send(
            topic,
            Some(value),
            key,
            PARTITION_UA,
            0,
            &vus[..count],
            opaque,
        );
        Ok(Some(code))
    }
}

/// A value or key as confluent-kafka takes it: bytes, or text encoded as UTF-8.
fn as_bytes(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(text.to_str()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!(
        "expected bytes or str, not {}",
        value.get_type().name()?
    )))
}

/// librdkafka's timeout in milliseconds (-1: wait for good).
fn millis(seconds: f64) -> c_int {
    if seconds < 0.0 {
        -1
    } else {
        (seconds * 1000.0).min(c_int::MAX as f64) as c_int
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<RdProducer>()
}
