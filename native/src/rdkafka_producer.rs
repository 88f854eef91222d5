//! The gateway's shared producer through librdkafka's C API
//! (`amps_on_kafka/log/native_producer.py`).
//!
//! Through confluent-kafka a `tcp://` publish cost the gateway 5,900 instructions in
//! `produce` (keyword parsing, three headers converted) and 4,100 more for its delivery
//! report (the GIL taken, a `Message` made, a Python callback called), per record
//! (docs/performance.md). This is a producer handle of its own on the librdkafka the
//! confluent-kafka wheel loaded (found and version-checked as the replay's reader is),
//! configured with the same text settings, that:
//! - produces a gateway read's run of plain publishes in one call (`ProducerRun`), the
//!   headers given to `rd_kafka_produceva` as C strings, the SOW key read by the worker's
//!   own `key_of`, no Python object made per record;
//! - takes delivery reports in a C callback into a queue of its own, with no GIL, and
//!   hands a poll's reports of batched records to Python as one list of
//!   `(batch number, reports, failures)`: no Python call per record;
//! - still takes confluent-kafka's `produce(topic, value, key, partition, callback,
//!   on_delivery, timestamp, headers)` with a Python callback per record, for every other
//!   command the gateway writes, so all of them go through one producer, in order.
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyIterator, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use crate::frames::valid;
use crate::publish::{count_stale, digits};
use crate::rdkafka_reader::{open, symbol, text, Config, RawMessage};
use crate::staging::key_of;

/// `RD_KAFKA_PRODUCER`.
const PRODUCER: c_int = 0;
/// `RD_KAFKA_RESP_ERR__QUEUE_FULL`: confluent-kafka raises BufferError for it.
const QUEUE_FULL: c_int = -184;
/// `RD_KAFKA_RESP_ERR__DESTROY`: what a produce on a closed handle is refused with.
const DESTROYED: c_int = -197;
/// `RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT`: every record not yet reported.
const PURGE_ALL: c_int = 3;
/// `RD_KAFKA_MSG_F_COPY`: librdkafka copies the value and key.
const MSG_F_COPY: c_int = 2;
/// `RD_KAFKA_PARTITION_UA`: the partitioner places the record.
const PARTITION_UA: i32 = -1;
/// `rd_kafka_vtype_t`.
const V_END: c_int = 0;
const V_TOPIC: c_int = 1;
const V_RKT: c_int = 2;
const V_PARTITION: c_int = 3;
const V_VALUE: c_int = 4;
const V_KEY: c_int = 5;
const V_OPAQUE: c_int = 6;
const V_MSGFLAGS: c_int = 7;
const V_TIMESTAMP: c_int = 8;
const V_HEADER: c_int = 9;
/// The most fields a record has besides its headers: topic, partition, flags, opaque,
/// value, key, timestamp.
const FIELDS: usize = 7;
/// A batched record's number is `batch << INDEX_BITS | index` (server/publishing.py).
const INDEX_BITS: u32 = 32;
/// The low bits of a numbered record's opaque, `number << 2 | NUMBERED`: a record
/// reported only if it fails, by its number, to the failures' handler (the client's
/// publisher, whose successes need no call). A batched record's opaque is odd, a boxed
/// callback's a multiple of 8.
const NUMBERED: usize = 2;
/// A numbered record's number is within ±2^61 (it is shifted into the opaque).
const NUMBER_LIMIT: u64 = 1 << 61;

/// The opaque of a numbered record, or None for a number it cannot hold.
fn numbered(number: i64) -> Option<usize> {
    (number.unsigned_abs() < NUMBER_LIMIT).then_some(((number << 2) as usize) | NUMBERED)
}

/// Whether `opaque` is a boxed Python callback (made by `produce`).
fn boxed(opaque: usize) -> bool {
    opaque != 0 && opaque & 3 == 0
}

/// `rd_kafka_vu_t`'s value union (64 bytes of padding in rdkafka.h).
#[repr(C)]
#[derive(Clone, Copy)]
union Value {
    words: [usize; 8],
    int: c_int,
    long: i64,
}

/// `rd_kafka_vu_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Vu {
    vtype: c_int,
    value: Value,
}

impl Vu {
    fn words(vtype: c_int, first: usize, second: usize, third: usize) -> Self {
        let mut words = [0usize; 8];
        (words[0], words[1], words[2]) = (first, second, third);
        Self {
            vtype,
            value: Value { words },
        }
    }

    fn int(vtype: c_int, int: c_int) -> Self {
        let mut vu = Self::words(vtype, 0, 0, 0);
        vu.value.int = int;
        vu
    }

    fn bytes(vtype: c_int, bytes: &[u8]) -> Self {
        Self::words(vtype, bytes.as_ptr() as usize, bytes.len(), 0)
    }

    /// A header `name` (NUL-terminated) with `value`, or a null value.
    fn header(name: &CString, value: Option<&[u8]>) -> Self {
        let (at, size) = value.map_or((0, -1isize), |v| (v.as_ptr() as usize, v.len() as isize));
        Self::words(V_HEADER, name.as_ptr() as usize, at, size as usize)
    }
}

type DeliveryCallback = extern "C" fn(*mut c_void, *const RawMessage, *mut c_void);

/// The librdkafka functions the producer calls.
struct Api {
    config: Config,
    new: extern "C" fn(c_int, *mut c_void, *mut c_char, usize) -> *mut c_void,
    conf_set_dr_msg_cb: extern "C" fn(*mut c_void, DeliveryCallback),
    conf_set_opaque: extern "C" fn(*mut c_void, *mut c_void),
    produceva: extern "C" fn(*mut c_void, *const Vu, usize) -> *mut c_void,
    error_code: extern "C" fn(*const c_void) -> c_int,
    error_destroy: extern "C" fn(*mut c_void),
    poll: extern "C" fn(*mut c_void, c_int) -> c_int,
    flush: extern "C" fn(*mut c_void, c_int) -> c_int,
    purge: extern "C" fn(*mut c_void, c_int) -> c_int,
    outq_len: extern "C" fn(*mut c_void) -> c_int,
    topic_new: extern "C" fn(*mut c_void, *const c_char, *mut c_void) -> *mut c_void,
    topic_destroy: extern "C" fn(*mut c_void),
    topic_name: extern "C" fn(*const c_void) -> *const c_char,
    /// `rd_kafka_message_produce_errstr`, as confluent-kafka reads a report's error.
    message_errstr: extern "C" fn(*const RawMessage) -> *const c_char,
    err2str: extern "C" fn(c_int) -> *const c_char,
    destroy: extern "C" fn(*mut c_void),
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn load(path: &str) -> Result<Api, String> {
    let library = open(path)?;
    // SAFETY: each type is the function's signature in rdkafka.h.
    unsafe {
        Ok(Api {
            config: Config::load(library)?,
            new: symbol(library, "new")?,
            conf_set_dr_msg_cb: symbol(library, "conf_set_dr_msg_cb")?,
            conf_set_opaque: symbol(library, "conf_set_opaque")?,
            produceva: symbol(library, "produceva")?,
            error_code: symbol(library, "error_code")?,
            error_destroy: symbol(library, "error_destroy")?,
            poll: symbol(library, "poll")?,
            flush: symbol(library, "flush")?,
            purge: symbol(library, "purge")?,
            outq_len: symbol(library, "outq_len")?,
            topic_new: symbol(library, "topic_new")?,
            topic_destroy: symbol(library, "topic_destroy")?,
            topic_name: symbol(library, "topic_name")?,
            message_errstr: symbol(library, "message_produce_errstr")?,
            err2str: symbol(library, "err2str")?,
            destroy: symbol(library, "destroy")?,
        })
    }
}

/// One delivery report, as the C callback took it. `opaque` is 0 (no callback), a
/// batched record's `number << 1 | 1`, a numbered record's `number << 2 | NUMBERED`, or
/// a boxed Python callback (aligned: bits 0 and 1 clear).
struct Report {
    opaque: usize,
    err: c_int,
    partition: i32,
    offset: i64,
    /// The topic and error text, read only where Python is handed them.
    topic: String,
    reason: String,
}

/// librdkafka's delivery report callback: runs inside poll/flush (the GIL released) and
/// only queues the report.
extern "C" fn delivered(_rk: *mut c_void, message: *const RawMessage, opaque: *mut c_void) {
    // SAFETY: `opaque` is the handle's report queue (set at rd_kafka_new, outlives it);
    // `message` is valid for the callback's duration.
    let (queue, message) = unsafe { (&*(opaque as *const Mutex<Vec<Report>>), &*message) };
    let tag = message.private as usize;
    if tag & 3 == NUMBERED && message.err == 0 {
        return; // a numbered record's success: nothing to report, nothing to free
    }
    let api = match API.get() {
        Some(Ok(api)) => api,
        _ => return,
    };
    let named = tag & 1 == 0 || message.err != 0;
    let report = Report {
        opaque: tag,
        err: message.err,
        partition: message.partition,
        offset: message.offset,
        topic: if named && tag != 0 {
            text((api.topic_name)(message.rkt))
        } else {
            String::new()
        },
        reason: match message.err {
            0 => String::new(),
            // as confluent-kafka: the record's own error text, else the code's
            err => match (api.message_errstr)(message) {
                at if at.is_null() => text((api.err2str)(err)),
                at => text(at),
            },
        },
    };
    queue.lock().unwrap_or_else(|e| e.into_inner()).push(report);
}

/// A poll's reports of one batch: its number, how many, and the failures' (index, code,
/// text).
type Group = (u64, usize, Vec<(u64, c_int, String)>);

/// The producer handle and what its callbacks need.
struct Handle {
    api: &'static Api,
    rk: *mut c_void,
    reports: Box<Mutex<Vec<Report>>>,
    /// Topic handles by name, made once (a topic by name costs a look-up per record).
    topics: Mutex<HashMap<String, usize>>,
    /// Set by close with the GIL held. `send` reads it with the GIL held and keeps the
    /// GIL until librdkafka returns, so no produce runs on a destroyed handle.
    closed: AtomicBool,
    /// Held shared by a poll or flush waiting in librdkafka without the GIL, and alone
    /// by close: the handle is never destroyed under a thread still inside it.
    serving: RwLock<()>,
}

// SAFETY: librdkafka's handles may be used from any thread; the rest is behind locks.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Handle {
    /// The topic handle of `name`, made the first time (0 when librdkafka refuses it:
    /// the record then names its topic, and produce says why).
    fn topic(&self, name: &str) -> usize {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&rkt) = topics.get(name) {
            return rkt;
        }
        let Ok(cname) = CString::new(name) else {
            return 0;
        };
        let rkt = (self.api.topic_new)(self.rk, cname.as_ptr(), std::ptr::null_mut()) as usize;
        if rkt != 0 {
            topics.insert(name.to_string(), rkt);
        }
        rkt
    }

    /// Produce one record (value and key copied); 0 or librdkafka's error code.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        topic: &str,
        value: Option<&[u8]>,
        key: Option<&[u8]>,
        partition: i32,
        timestamp: i64,
        headers: &[Vu],
        opaque: usize,
    ) -> c_int {
        if self.closed.load(Ordering::SeqCst) {
            return DESTROYED; // a run's Python calls may have let close in
        }
        let rkt = self.topic(topic);
        let named = if rkt == 0 {
            CString::new(topic).ok()
        } else {
            None
        };
        let mut fields = [Vu::words(V_END, 0, 0, 0); FIELDS];
        fields[0] = match &named {
            _ if rkt != 0 => Vu::words(V_RKT, rkt, 0, 0),
            Some(name) => Vu::words(V_TOPIC, name.as_ptr() as usize, 0, 0),
            None => return -186, // RD_KAFKA_RESP_ERR__INVALID_ARG: a NUL in the name
        };
        fields[1] = Vu::int(V_PARTITION, partition);
        fields[2] = Vu::int(V_MSGFLAGS, MSG_F_COPY);
        fields[3] = Vu::words(V_OPAQUE, opaque, 0, 0);
        let mut count = 4;
        for (vtype, bytes) in [(V_VALUE, value), (V_KEY, key)] {
            if let Some(bytes) = bytes {
                fields[count] = Vu::bytes(vtype, bytes);
                count += 1;
            }
        }
        if timestamp != 0 {
            fields[count] = Vu::words(V_TIMESTAMP, 0, 0, 0);
            fields[count].value.long = timestamp;
            count += 1;
        }
        // on the stack for the records of the run (three headers); a Vec for more
        let mut inline = [Vu::words(V_END, 0, 0, 0); FIELDS + 4];
        let mut heap = Vec::new();
        let vus: &mut [Vu] = if count + headers.len() <= inline.len() {
            &mut inline[..count + headers.len()]
        } else {
            heap.resize(count + headers.len(), Vu::words(V_END, 0, 0, 0));
            &mut heap[..]
        };
        vus[..count].copy_from_slice(&fields[..count]);
        vus[count..].copy_from_slice(headers);
        let error = (self.api.produceva)(self.rk, vus.as_ptr(), vus.len());
        if error.is_null() {
            return 0;
        }
        let code = (self.api.error_code)(error);
        (self.api.error_destroy)(error);
        code
    }

    /// `call(rk)` with close kept out meanwhile (run without the GIL); None when closed.
    fn serving<T>(&self, call: impl FnOnce(*mut c_void) -> T) -> Option<T> {
        let _shared = self.serving.read().unwrap_or_else(|e| e.into_inner());
        (!self.closed.load(Ordering::SeqCst)).then(|| call(self.rk))
    }

    fn take_reports(&self) -> Vec<Report> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.close();
        }
    }
}

impl Handle {
    /// Destroy the handle (its topics first). Records not yet reported are purged and
    /// their callbacks freed, not called (the owner flushed first, as
    /// Gateway._close_producer does): librdkafka's destroy drops them without a report,
    /// which kept each callback, and all it referenced, for good.
    fn close(&self) {
        (self.api.purge)(self.rk, PURGE_ALL);
        (self.api.poll)(self.rk, 0); // the purged records' reports, queued here
        for (_, rkt) in self
            .topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
        {
            (self.api.topic_destroy)(rkt as *mut c_void);
        }
        (self.api.destroy)(self.rk);
        for report in self.take_reports() {
            if boxed(report.opaque) {
                // SAFETY: a boxed opaque is a Box made by `produce`.
                drop(unsafe { Box::from_raw(report.opaque as *mut Py<PyAny>) });
            }
        }
    }
}

/// A delivered record as a callback sees it: confluent-kafka's `Message` methods that
/// the gateway's callbacks read.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Delivered {
    topic: String,
    partition: i32,
    offset: i64,
    error: Py<PyAny>,
}

#[pymethods]
impl Delivered {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn partition(&self) -> Option<i32> {
        (self.partition >= 0).then_some(self.partition)
    }

    fn offset(&self) -> Option<i64> {
        (self.offset >= 0).then_some(self.offset)
    }

    fn error(&self, py: Python<'_>) -> Py<PyAny> {
        self.error.clone_ref(py)
    }
}

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
        let api = API
            .get_or_init(|| load(path))
            .as_ref()
            .map_err(|e| PyValueError::new_err(e.clone()))?;
        api.config.check_version(version)?;
        let conf = api.config.build(&settings)?;
        let reports: Box<Mutex<Vec<Report>>> = Box::default();
        (api.conf_set_dr_msg_cb)(conf, delivered);
        (api.conf_set_opaque)(conf, &*reports as *const _ as *mut c_void);
        let mut errstr = [0 as c_char; 512];
        let rk = (api.new)(PRODUCER, conf, errstr.as_mut_ptr(), errstr.len());
        if rk.is_null() {
            (api.config.conf_destroy)(conf);
            return Err(PyValueError::new_err(text(errstr.as_ptr())));
        }
        let handle = Handle {
            api,
            rk,
            reports,
            topics: Mutex::default(),
            closed: AtomicBool::new(false),
            serving: RwLock::new(()),
        };
        Ok(Self {
            handle,
            kafka_error,
            kafka_exception,
            batches: OnceLock::new(),
            failures: OnceLock::new(),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.kafka_error)?;
        visit.call(&self.kafka_exception)?;
        for handler in [&self.batches, &self.failures] {
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
        let served = py.detach(|| handle.serving(|rk| (handle.api.poll)(rk, wait)));
        self.serve(py)?;
        Ok(served.unwrap_or(0))
    }

    /// Wait up to `timeout` seconds for every record to be reported, serving the
    /// reports; the number still queued.
    #[pyo3(signature = (timeout=-1.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<i32> {
        let (handle, wait) = (&self.handle, millis(timeout));
        py.detach(|| handle.serving(|rk| (handle.api.flush)(rk, wait)));
        self.serve(py)?;
        Ok(self.__len__() as i32)
    }

    fn __len__(&self) -> usize {
        if self.handle.closed.load(Ordering::SeqCst) {
            return 0;
        }
        (self.handle.api.outq_len)(self.handle.rk).max(0) as usize
    }

    /// Destroy the handle now (its threads and connections), after any poll or flush
    /// under way returns; idempotent. A produce, poll or flush after it does nothing
    /// (produce raises RuntimeError).
    fn close(&self, py: Python<'_>) {
        if !self.handle.closed.swap(true, Ordering::SeqCst) {
            py.detach(|| {
                let _alone = self
                    .handle
                    .serving
                    .write()
                    .unwrap_or_else(|e| e.into_inner());
                self.handle.close()
            });
        }
    }
}

impl RdProducer {
    fn check_open(&self) -> PyResult<()> {
        if self.handle.closed.load(Ordering::SeqCst) {
            return Err(PyRuntimeError::new_err("the producer is closed"));
        }
        Ok(())
    }

    /// What confluent-kafka raises for a refused produce.
    fn refusal(&self, py: Python<'_>, code: c_int) -> PyErr {
        let reason = text((self.handle.api.err2str)(code));
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

    /// Hand the queued reports on: each Python callback called, the batched records'
    /// reports grouped by batch and handed to the batches' handler in one call.
    fn serve(&self, py: Python<'_>) -> PyResult<()> {
        let reports = self.handle.take_reports();
        if reports.is_empty() {
            return Ok(());
        }
        let mut first_error = None;
        let mut groups: Vec<Group> = Vec::new();
        for report in reports {
            if report.opaque & 1 == 1 {
                let number = (report.opaque >> 1) as u64;
                let batch = number >> INDEX_BITS;
                let at = match groups.iter().rposition(|g| g.0 == batch) {
                    Some(at) => at,
                    None => {
                        groups.push((batch, 0, Vec::new()));
                        groups.len() - 1
                    }
                };
                let group = &mut groups[at];
                group.1 += 1;
                if report.err != 0 {
                    group
                        .2
                        .push((number & 0xFFFF_FFFF, report.err, report.reason));
                }
            } else if report.opaque & 3 == NUMBERED {
                let number = (report.opaque as i64) >> 2;
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
    fn arguments(&self, py: Python<'_>, report: Report) -> PyResult<(Py<PyAny>, Delivered)> {
        let error = if report.err == 0 {
            py.None()
        } else {
            self.kafka_error
                .bind(py)
                .call1((report.err, report.reason))?
                .unbind()
        };
        let message = Delivered {
            topic: report.topic,
            partition: report.partition,
            offset: report.offset,
            error: error.clone_ref(py),
        };
        Ok((error, message))
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
        let mut vus = [Vu::words(V_END, 0, 0, 0); 3];
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

/// `LogPublisher.publish_run` when the publisher's producer is an `RdProducer`: the twin
/// and the confluent-kafka path is `EncodedRun` (publish.rs). The common case — a routed
/// topic, its key read from the payload by `key_of` (no key, or a top-level field), a
/// fresh partition count — is produced here with the headers `publish_encoded` writes,
/// reported as batched record `base | index`; anything else is handed to
/// `publish_encoded` with `delivery(base | index)`, as EncodedRun does. A refusal by
/// librdkafka (a full queue...) ends the run: the per-command path takes the publish.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct ProducerRun {
    producer: Py<RdProducer>,
    encoded: Py<PyAny>,
    routes: Py<PyDict>,
    counts: Py<PyDict>,
    monotonic: Py<PyAny>,
    sequences: Py<PyIterator>,
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
    ) -> PyResult<Self> {
        let names = names.map(|name| CString::new(name).unwrap_or_default());
        Ok(Self {
            producer,
            encoded,
            routes,
            counts,
            monotonic,
            sequences,
            publisher,
            names,
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for held in [
            self.producer.as_any(),
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
        let py = events.py();
        self.producer.get().check_open()?;
        let mut fresh = Vec::new();
        let mut position = start;
        while position < end {
            let event = events.get_item(position)?;
            let number = base | produced.len() as u64;
            let taken = match self.produced(&event, number, &mut fresh)? {
                Some(taken) => taken,
                None => {
                    let event = event.cast::<PyTuple>()?;
                    let (topic, sequence, payload) =
                        (event.get_item(0)?, event.get_item(1)?, event.get_item(2)?);
                    let report = delivery.call1((number,))?;
                    let answer = self.encoded.bind(py);
                    !answer.call1((topic, payload, sequence, report))?.is_none()
                }
            };
            if !taken {
                break;
            }
            produced.append(event)?;
            position += 1;
        }
        Ok(position)
    }
}

impl ProducerRun {
    /// Some(whether produced) for the common case; None, having done nothing, for what
    /// `publish_encoded` decides.
    ///
    /// `fresh` holds the route names whose partition counts this call found fresh: a
    /// run takes microseconds, so each topic's count is checked once a run, not once a
    /// record (the clock read and the comparisons were 1,000 instructions a record).
    fn produced<'py>(
        &self,
        event: &Bound<'py, PyAny>,
        number: u64,
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
        if !field.is_none() && !field.is_truthy()? {
            return Ok(None); // as EncodedRun: an empty field name is publish_encoded's
        }
        let bytes = payload.cast::<PyBytes>()?.as_bytes();
        let key = if field.is_none() {
            if !extract.is_none() || !valid(bytes) {
                return Ok(None); // a key `extract` reads, or what orjson must judge
            }
            None
        } else {
            match key_of(bytes, field.cast::<PyString>()?.to_str()?) {
                Some(key) => Some(key.text().into_owned()),
                None => return Ok(None),
            }
        };
        let partitions = route.get_item(3)?;
        if partitions.is_truthy()? && !fresh.iter().any(|known| known.is(&name)) {
            if count_stale(
                self.counts.bind(py),
                self.monotonic.bind(py),
                &name,
                &partitions,
            )? {
                return Ok(None);
            }
            fresh.push(name.clone());
        }
        let sequence = if given.is_none() {
            match self.sequences.bind(py).clone().next() {
                Some(sequence) => sequence?,
                None => return Err(PyStopIteration::new_err(())),
            }
        } else {
            given
        };
        let mut written = [0u8; 20];
        let long; // `b"%d" % sequence`: on the stack for a 64-bit one
        let sequence = match sequence.extract::<i64>() {
            Ok(value) => {
                let mut at = std::io::Cursor::new(&mut written[..]);
                write!(at, "{value}").map_err(|e| PyValueError::new_err(e.to_string()))?;
                let end = at.position() as usize;
                &written[..end]
            }
            Err(_) => {
                long = digits(&sequence)?;
                long.cast::<PyBytes>()?.as_bytes()
            }
        };
        let [publisher, numbered, keyed] = &self.names;
        let headers = [
            Vu::header(publisher, Some(&self.publisher)),
            Vu::header(numbered, Some(sequence)),
            Vu::header(keyed, key.as_deref().map(str::as_bytes)),
        ];
        let code = self.producer.get().handle.send(
            name.cast::<PyString>()?.to_str()?,
            Some(bytes),
            key.as_deref().map(str::as_bytes),
            PARTITION_UA,
            0,
            &headers[..if key.is_some() { 3 } else { 2 }],
            ((number as usize) << 1) | 1,
        );
        Ok(Some(code == 0))
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<RdProducer>()?;
    m.add_class::<ProducerRun>()?;
    m.add_class::<Delivered>()
}
