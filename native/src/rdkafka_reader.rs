//! A replay's reader through librdkafka's C API (`amps_on_kafka/log/native_reader.py`).
//!
//! confluent-kafka's `consume` detaches every record's headers into Python-owned memory
//! (`rd_kafka_message_detach_headers`: a parse and an allocation per header) and frees
//! them with its `Message`, whether anything reads them or not: ~2.9k of the ~13.8k
//! instructions a record of the raw loop over our records (docs/performance.md). This
//! reader is its own consumer handle on the librdkafka the confluent-kafka wheel already
//! loaded (found by path, its version checked), and makes the replay's messages straight
//! from each `rd_kafka_message_t`: the payload copied, the coordinates read from the public
//! struct, the headers parsed only when a message's headers are asked for. Each `Record`
//! keeps its `rd_kafka_message_t` (and through it the handle) until it is freed.
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::records::RecordBuilder;

/// `RD_KAFKA_RESP_ERR__PARTITION_EOF`: a partition's end, not an error (the replay's rule).
const PARTITION_EOF: c_int = -191;
/// `RD_KAFKA_CONSUMER`.
const CONSUMER: c_int = 1;
/// `RD_KAFKA_OFFSET_INVALID`: no position yet.
const OFFSET_INVALID: i64 = -1001;

/// `rd_kafka_message_t`, public and stable in rdkafka.h.
#[repr(C)]
pub(crate) struct RawMessage {
    pub(crate) err: c_int,
    pub(crate) rkt: *mut c_void,
    pub(crate) partition: i32,
    payload: *mut c_void,
    len: usize,
    key: *mut c_void,
    key_len: usize,
    pub(crate) offset: i64,
    pub(crate) private: *mut c_void,
}

/// `rd_kafka_topic_partition_t`.
#[repr(C)]
struct RawPartition {
    topic: *mut c_char,
    partition: i32,
    offset: i64,
    metadata: *mut c_void,
    metadata_size: usize,
    opaque: *mut c_void,
    err: c_int,
    private: *mut c_void,
}

/// `rd_kafka_topic_partition_list_t`.
#[repr(C)]
struct RawPartitionList {
    cnt: c_int,
    size: c_int,
    elems: *mut RawPartition,
}

/// librdkafka's `log_cb`: (handle, syslog level, facility, line).
pub(crate) type LogCallback = extern "C" fn(*const c_void, c_int, *const c_char, *const c_char);

/// What every handle of ours on the loaded librdkafka needs (this reader, and the
/// gateway's producer in rdkafka_producer.rs): its version, and a configuration made
/// of text settings with librdkafka's log lines handed to a callback of ours.
pub(crate) struct Config {
    version: extern "C" fn() -> c_int,
    conf_new: extern "C" fn() -> *mut c_void,
    conf_set: extern "C" fn(*mut c_void, *const c_char, *const c_char, *mut c_char, usize) -> c_int,
    conf_set_log_cb: extern "C" fn(*mut c_void, LogCallback),
    pub(crate) conf_destroy: extern "C" fn(*mut c_void),
}

impl Config {
    /// SAFETY: `library` is a dlopen'd librdkafka.
    pub(crate) unsafe fn load(library: *mut c_void) -> Result<Self, String> {
        Ok(Self {
            version: symbol(library, "version")?,
            conf_new: symbol(library, "conf_new")?,
            conf_set: symbol(library, "conf_set")?,
            conf_set_log_cb: symbol(library, "conf_set_log_cb")?,
            conf_destroy: symbol(library, "conf_destroy")?,
        })
    }

    /// ValueError unless the library is `version` (confluent_kafka.libversion()[1]).
    pub(crate) fn check_version(&self, version: i32) -> PyResult<()> {
        if (self.version)() != version {
            return Err(PyValueError::new_err(format!(
                "librdkafka is version {:#x}, not {version:#x}",
                (self.version)()
            )));
        }
        Ok(())
    }

    /// A configuration of `settings` (ValueError naming a setting librdkafka refuses),
    /// its log lines handed to `log`. The caller owns it until rd_kafka_new takes it.
    pub(crate) fn build(
        &self,
        settings: &[(String, String)],
        log: LogCallback,
    ) -> PyResult<*mut c_void> {
        let conf = (self.conf_new)();
        let mut errstr = [0 as c_char; 512];
        for (name, value) in settings {
            let (cname, cvalue) = match (CString::new(name.as_str()), CString::new(value.as_str()))
            {
                (Ok(n), Ok(v)) => (n, v),
                _ => {
                    (self.conf_destroy)(conf);
                    return Err(PyValueError::new_err(format!("a NUL in setting {name:?}")));
                }
            };
            let res = (self.conf_set)(
                conf,
                cname.as_ptr(),
                cvalue.as_ptr(),
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            if res != 0 {
                (self.conf_destroy)(conf);
                return Err(PyValueError::new_err(text(errstr.as_ptr())));
            }
        }
        (self.conf_set_log_cb)(conf, log);
        Ok(conf)
    }
}

/// The few librdkafka functions the reader calls, found in the loaded library.
struct Api {
    config: Config,
    new: extern "C" fn(c_int, *mut c_void, *mut c_char, usize) -> *mut c_void,
    poll_set_consumer: extern "C" fn(*mut c_void) -> c_int,
    queue_get_consumer: extern "C" fn(*mut c_void) -> *mut c_void,
    queue_destroy: extern "C" fn(*mut c_void),
    consume_batch_queue: extern "C" fn(*mut c_void, c_int, *mut *mut RawMessage, usize) -> isize,
    message_destroy: extern "C" fn(*mut RawMessage),
    message_headers: extern "C" fn(*const RawMessage, *mut *mut c_void) -> c_int,
    header_get_all: extern "C" fn(
        *const c_void,
        usize,
        *mut *const c_char,
        *mut *const c_void,
        *mut usize,
    ) -> c_int,
    message_timestamp: extern "C" fn(*const RawMessage, *mut c_int) -> i64,
    topic_name: extern "C" fn(*const c_void) -> *const c_char,
    topic_new: extern "C" fn(*mut c_void, *const c_char, *mut c_void) -> *mut c_void,
    topic_destroy: extern "C" fn(*mut c_void),
    list_new: extern "C" fn(c_int) -> *mut RawPartitionList,
    list_add: extern "C" fn(*mut RawPartitionList, *const c_char, i32) -> *mut RawPartition,
    list_destroy: extern "C" fn(*mut RawPartitionList),
    assign: extern "C" fn(*mut c_void, *const RawPartitionList) -> c_int,
    position: extern "C" fn(*mut c_void, *mut RawPartitionList) -> c_int,
    incremental_assign: extern "C" fn(*mut c_void, *const RawPartitionList) -> *mut c_void,
    error_code: extern "C" fn(*const c_void) -> c_int,
    error_string: extern "C" fn(*const c_void) -> *const c_char,
    error_destroy: extern "C" fn(*mut c_void),
    assignment: extern "C" fn(*mut c_void, *mut *mut RawPartitionList) -> c_int,
    pause_partitions: extern "C" fn(*mut c_void, *mut RawPartitionList) -> c_int,
    resume_partitions: extern "C" fn(*mut c_void, *mut RawPartitionList) -> c_int,
    get_watermark_offsets:
        extern "C" fn(*mut c_void, *const c_char, i32, *mut i64, *mut i64) -> c_int,
    query_watermark_offsets:
        extern "C" fn(*mut c_void, *const c_char, i32, *mut i64, *mut i64, c_int) -> c_int,
    committed: extern "C" fn(*mut c_void, *mut RawPartitionList, c_int) -> c_int,
    commit: extern "C" fn(*mut c_void, *const RawPartitionList, c_int) -> c_int,
    err2str: extern "C" fn(c_int) -> *const c_char,
    consumer_close: extern "C" fn(*mut c_void) -> c_int,
    destroy: extern "C" fn(*mut c_void),
}

/// The library, loaded once (the first path given; confluent-kafka loads one).
static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The address of `name` in `library`, as a function pointer of type `T`.
///
/// SAFETY: `T` must be the C signature of `name` (the declarations above are rdkafka.h's).
pub(crate) unsafe fn symbol<T: Copy>(library: *mut c_void, name: &str) -> Result<T, String> {
    let cname = CString::new(format!("rd_kafka_{name}")).expect("no NUL in a symbol name");
    let found = libc::dlsym(library, cname.as_ptr());
    if found.is_null() {
        return Err(format!("rd_kafka_{name} is not in the library"));
    }
    Ok(std::mem::transmute_copy(&found))
}

/// The librdkafka at `path`, loaded (it stays loaded: never dlclose'd).
pub(crate) fn open(path: &str) -> Result<*mut c_void, String> {
    let cpath = CString::new(path).map_err(|_| "a NUL in the library's path".to_string())?;
    // SAFETY: dlopen of a path.
    let library = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if library.is_null() {
        return Err(format!("{path} does not load"));
    }
    Ok(library)
}

fn load(path: &str) -> Result<Api, String> {
    let library = open(path)?;
    // SAFETY: each type is the function's signature in rdkafka.h.
    unsafe {
        Ok(Api {
            config: Config::load(library)?,
            new: symbol(library, "new")?,
            poll_set_consumer: symbol(library, "poll_set_consumer")?,
            queue_get_consumer: symbol(library, "queue_get_consumer")?,
            queue_destroy: symbol(library, "queue_destroy")?,
            consume_batch_queue: symbol(library, "consume_batch_queue")?,
            message_destroy: symbol(library, "message_destroy")?,
            message_headers: symbol(library, "message_headers")?,
            header_get_all: symbol(library, "header_get_all")?,
            message_timestamp: symbol(library, "message_timestamp")?,
            topic_name: symbol(library, "topic_name")?,
            topic_new: symbol(library, "topic_new")?,
            topic_destroy: symbol(library, "topic_destroy")?,
            list_new: symbol(library, "topic_partition_list_new")?,
            list_add: symbol(library, "topic_partition_list_add")?,
            list_destroy: symbol(library, "topic_partition_list_destroy")?,
            assign: symbol(library, "assign")?,
            position: symbol(library, "position")?,
            incremental_assign: symbol(library, "incremental_assign")?,
            error_code: symbol(library, "error_code")?,
            error_string: symbol(library, "error_string")?,
            error_destroy: symbol(library, "error_destroy")?,
            assignment: symbol(library, "assignment")?,
            pause_partitions: symbol(library, "pause_partitions")?,
            resume_partitions: symbol(library, "resume_partitions")?,
            get_watermark_offsets: symbol(library, "get_watermark_offsets")?,
            query_watermark_offsets: symbol(library, "query_watermark_offsets")?,
            committed: symbol(library, "committed")?,
            commit: symbol(library, "commit")?,
            err2str: symbol(library, "err2str")?,
            consumer_close: symbol(library, "consumer_close")?,
            destroy: symbol(library, "destroy")?,
        })
    }
}

/// librdkafka's log lines, dropped: the Python side uses this reader only while the
/// `amps_on_kafka.librdkafka` logger would drop them too (LibrdkafkaLog below DEBUG).
extern "C" fn drop_log(_: *const c_void, _: c_int, _: *const c_char, _: *const c_char) {}

pub(crate) fn text(at: *const c_char) -> String {
    if at.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka's texts are NUL-terminated.
    unsafe { CStr::from_ptr(at) }.to_string_lossy().into_owned()
}

/// One consumer handle. Destroyed when the reader and every record it made are gone:
/// librdkafka wants every message destroyed before its handle.
struct Handle {
    api: &'static Api,
    rk: *mut c_void,
    queue: *mut c_void,
    /// Whether `consumer_close` was called; held while librdkafka is asked for records,
    /// so a close waits for a consume in flight (at most its timeout).
    closed: Mutex<bool>,
}

// SAFETY: librdkafka's handles may be used from any thread; `closed` orders close and
// consume.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Handle {
    fn error(&self, err: c_int, what: &str) -> PyErr {
        PyRuntimeError::new_err(format!("{what}: {}", text((self.api.err2str)(err))))
    }

    /// A partition list of `partitions`, each at `offset` when given.
    fn list(&self, partitions: &[(String, i32, i64)]) -> PyResult<PartitionList> {
        let list = PartitionList {
            api: self.api,
            raw: (self.api.list_new)(partitions.len() as c_int),
        };
        for (topic, partition, offset) in partitions {
            let topic = CString::new(topic.as_str())
                .map_err(|_| PyValueError::new_err("a NUL in a topic name"))?;
            let added = (self.api.list_add)(list.raw, topic.as_ptr(), *partition);
            // SAFETY: list_add returns the new element, inside the list.
            unsafe { (*added).offset = *offset };
        }
        Ok(list)
    }

    /// Up to `max` records into `into`, waiting up to `timeout_ms`.
    fn consume(&self, timeout_ms: c_int, max: usize, into: &mut Consumed) -> isize {
        let into = &mut into.0;
        let start = into.len();
        into.reserve(max);
        // SAFETY: room for `max` pointers past `start`; librdkafka writes at most `max`.
        unsafe {
            let got = (self.api.consume_batch_queue)(
                self.queue,
                timeout_ms,
                into.as_mut_ptr().add(start),
                max,
            );
            into.set_len(start + got.max(0) as usize);
            got
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let closed = *self.closed.get_mut().unwrap_or_else(|e| e.into_inner());
        if !closed {
            (self.api.consumer_close)(self.rk);
        }
        (self.api.queue_destroy)(self.queue);
        (self.api.destroy)(self.rk);
    }
}

struct PartitionList {
    api: &'static Api,
    raw: *mut RawPartitionList,
}

// SAFETY: a list librdkafka made, used by one thread at a time (the GIL released).
unsafe impl Send for PartitionList {}
unsafe impl Sync for PartitionList {}

impl PartitionList {
    /// The list, for librdkafka (a method: a closure then captures the whole list).
    fn raw(&self) -> *mut RawPartitionList {
        self.raw
    }

    /// (topic, partition) of each element.
    fn partitions(&self) -> Vec<(String, i32)> {
        // SAFETY: `cnt` elements from `elems`.
        unsafe {
            let list = &*self.raw;
            (0..list.cnt as usize)
                .map(|i| {
                    let element = &*list.elems.add(i);
                    (text(element.topic), element.partition)
                })
                .collect()
        }
    }

    fn offsets(&self) -> Vec<i64> {
        // SAFETY: `cnt` elements from `elems`.
        unsafe {
            let list = &*self.raw;
            (0..list.cnt as usize)
                .map(|i| (*list.elems.add(i)).offset)
                .collect()
        }
    }
}

impl Drop for PartitionList {
    fn drop(&mut self) {
        (self.api.list_destroy)(self.raw);
    }
}

/// A consumer of its own on librdkafka, configured as `log/kafka.py`'s `reader()`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct RdReader {
    handle: Arc<Handle>,
}

impl RdReader {
    /// What is there now, up to `max` records; waits up to `timeout` seconds (the GIL
    /// released) only when nothing is (consume_available's rule).
    fn available(&self, py: Python, max: usize, timeout: f64) -> PyResult<Messages> {
        let handle = &self.handle;
        let mut raw = Consumed(Vec::new());
        let closed = py.detach(|| {
            let closed = handle.closed.lock().unwrap_or_else(|e| e.into_inner());
            if *closed || max == 0 {
                return *closed;
            }
            if handle.consume(0, max, &mut raw) <= 0
                && handle.consume((timeout * 1000.0) as c_int, 1, &mut raw) > 0
            {
                handle.consume(0, max - 1, &mut raw);
            }
            false
        });
        let messages = Messages {
            handle: handle.clone(),
            raw: raw.0.into(),
        };
        if closed {
            return Err(PyRuntimeError::new_err("the reader is closed"));
        }
        Ok(messages)
    }
}

/// (topic, partition) as list elements without an offset.
fn at_no_offset(partitions: Vec<(String, i32)>) -> Vec<(String, i32, i64)> {
    partitions
        .into_iter()
        .map(|(topic, partition)| (topic, partition, OFFSET_INVALID))
        .collect()
}

/// confluent-kafka's timeouts: seconds, any negative one meaning none (-1).
fn timeout_ms(timeout: f64) -> c_int {
    if timeout < 0.0 {
        -1
    } else {
        (timeout * 1000.0) as c_int
    }
}

#[pymethods]
impl RdReader {
    /// The library at `path` (the one confluent-kafka loaded), which must be version
    /// `version` (confluent_kafka.libversion()[1]), and the configuration as text.
    /// ValueError when the library or a setting is refused (the caller falls back).
    #[new]
    fn new(path: &str, version: i32, config: Vec<(String, String)>) -> PyResult<Self> {
        let api = API
            .get_or_init(|| load(path))
            .as_ref()
            .map_err(|e| PyValueError::new_err(e.clone()))?;
        api.config.check_version(version)?;
        let conf = api.config.build(&config, drop_log)?;
        let mut errstr = [0 as c_char; 512];
        let rk = (api.new)(CONSUMER, conf, errstr.as_mut_ptr(), errstr.len());
        if rk.is_null() {
            (api.config.conf_destroy)(conf);
            return Err(PyValueError::new_err(text(errstr.as_ptr())));
        }
        // Without a group.id librdkafka's consumer has no consumer queue (NULL): refused
        // here rather than read from or destroyed later.
        let queue = (api.queue_get_consumer)(rk);
        if queue.is_null() || (api.poll_set_consumer)(rk) != 0 {
            if !queue.is_null() {
                (api.queue_destroy)(queue);
            }
            (api.destroy)(rk);
            return Err(PyValueError::new_err("a consumer needs a group.id"));
        }
        let handle = Handle {
            api,
            rk,
            queue,
            closed: Mutex::new(false),
        };
        Ok(Self {
            handle: Arc::new(handle),
        })
    }

    /// Have librdkafka look `topics` up (their leaders, a connection to each) now, while
    /// the replay is prepared elsewhere, rather than when the partitions are assigned.
    fn look_up(&self, topics: Vec<String>) -> PyResult<()> {
        for topic in topics {
            let topic =
                CString::new(topic).map_err(|_| PyValueError::new_err("a NUL in a topic name"))?;
            let handle =
                (self.handle.api.topic_new)(self.handle.rk, topic.as_ptr(), ptr::null_mut());
            if !handle.is_null() {
                (self.handle.api.topic_destroy)(handle);
            }
        }
        Ok(())
    }

    /// Read `partitions` (topic, partition, offset) from those offsets.
    fn assign(&self, partitions: Vec<(String, i32, i64)>) -> PyResult<()> {
        let list = self.handle.list(&partitions)?;
        match (self.handle.api.assign)(self.handle.rk, list.raw) {
            0 => Ok(()),
            err => Err(self.handle.error(err, "assign")),
        }
    }

    /// The position (the offset after the last record consumed) of each (topic,
    /// partition); -1001 where nothing was consumed yet.
    fn position(&self, partitions: Vec<(String, i32)>) -> PyResult<Vec<i64>> {
        let list = self.handle.list(&at_no_offset(partitions))?;
        match (self.handle.api.position)(self.handle.rk, list.raw) {
            0 => Ok(list.offsets()),
            err => Err(self.handle.error(err, "position")),
        }
    }

    /// What is there now, up to `max` records; waits up to `timeout` seconds (the GIL
    /// released) only when nothing is (consume_available's rule). The records become
    /// `builder`'s messages with `codec` as the batch is iterated.
    fn consume(
        &self,
        py: Python,
        max: usize,
        timeout: f64,
        builder: Py<RecordBuilder>,
        codec: Py<PyAny>,
    ) -> PyResult<ReadBatch> {
        Ok(ReadBatch {
            raw: self.available(py, max, timeout)?,
            builder,
            codec,
            topics: Topics::default(),
            error: None,
        })
    }

    /// What is there now, up to `max` records, as `consume` takes them, kept as
    /// librdkafka's records for a queue's EntryReader (queue_entries.rs) to read;
    /// `kafka_error(code, text)` makes a record's error, as confluent-kafka's `Message`
    /// gives it. Partition ends are records with an error here, as confluent-kafka's.
    fn consume_raw(
        &self,
        py: Python,
        max: usize,
        timeout: f64,
        kafka_error: Py<PyAny>,
    ) -> PyResult<RawBatch> {
        Ok(RawBatch {
            raw: self.available(py, max, timeout)?,
            topics: Topics::default(),
            kafka_error,
        })
    }

    /// Also read `partitions` (topic, partition, offset), beside those read already:
    /// the error's code and text, (0, "") when there is none.
    fn incremental_assign(&self, partitions: Vec<(String, i32, i64)>) -> PyResult<(i32, String)> {
        let api = self.handle.api;
        let list = self.handle.list(&partitions)?;
        let error = (api.incremental_assign)(self.handle.rk, list.raw);
        if error.is_null() {
            return Ok((0, String::new()));
        }
        let found = ((api.error_code)(error), text((api.error_string)(error)));
        (api.error_destroy)(error);
        Ok(found)
    }

    /// The error code (0 when none) and the (topic, partition) read now.
    fn assignment(&self) -> (i32, Vec<(String, i32)>) {
        let mut raw: *mut RawPartitionList = ptr::null_mut();
        let err = (self.handle.api.assignment)(self.handle.rk, &mut raw);
        if err != 0 {
            return (err, Vec::new());
        }
        let list = PartitionList {
            api: self.handle.api,
            raw,
        };
        (0, list.partitions())
    }

    /// Stop fetching `partitions` (topic, partition) until resumed: the error code.
    fn pause(&self, partitions: Vec<(String, i32)>) -> PyResult<i32> {
        let list = self.handle.list(&at_no_offset(partitions))?;
        Ok((self.handle.api.pause_partitions)(self.handle.rk, list.raw))
    }

    /// Fetch paused `partitions` (topic, partition) again: the error code.
    fn resume(&self, partitions: Vec<(String, i32)>) -> PyResult<i32> {
        let list = self.handle.list(&at_no_offset(partitions))?;
        Ok((self.handle.api.resume_partitions)(
            self.handle.rk,
            list.raw,
        ))
    }

    /// (error code, low, high) of a partition: the last fetches' when `cached`, else
    /// asked of the broker, waiting up to `timeout` seconds (the GIL released).
    fn watermarks(
        &self,
        py: Python,
        topic: &str,
        partition: i32,
        cached: bool,
        timeout: f64,
    ) -> PyResult<(i32, i64, i64)> {
        let topic =
            CString::new(topic).map_err(|_| PyValueError::new_err("a NUL in a topic name"))?;
        let handle = &self.handle;
        let (mut low, mut high) = (OFFSET_INVALID, OFFSET_INVALID);
        let err = if cached {
            (handle.api.get_watermark_offsets)(
                handle.rk,
                topic.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        } else {
            py.detach(|| {
                (handle.api.query_watermark_offsets)(
                    handle.rk,
                    topic.as_ptr(),
                    partition,
                    &mut low,
                    &mut high,
                    timeout_ms(timeout),
                )
            })
        };
        Ok((err, low, high))
    }

    /// The error code and the offsets the group committed for `partitions` (topic,
    /// partition), -1001 where none; waits up to `timeout` seconds (the GIL released).
    fn committed(
        &self,
        py: Python,
        partitions: Vec<(String, i32)>,
        timeout: f64,
    ) -> PyResult<(i32, Vec<i64>)> {
        let list = self.handle.list(&at_no_offset(partitions))?;
        let handle = &self.handle;
        let err = py.detach(|| (handle.api.committed)(handle.rk, list.raw(), timeout_ms(timeout)));
        Ok((err, list.offsets()))
    }

    /// Commit `offsets` (topic, partition, offset) for the group: the error code. Waits
    /// for the broker's answer (the GIL released) unless `asynchronous`.
    fn commit(
        &self,
        py: Python,
        offsets: Vec<(String, i32, i64)>,
        asynchronous: bool,
    ) -> PyResult<i32> {
        let list = self.handle.list(&offsets)?;
        let handle = &self.handle;
        Ok(py.detach(|| (handle.api.commit)(handle.rk, list.raw(), c_int::from(asynchronous))))
    }

    /// Leave the partitions and stop fetching (the GIL released; waits for a consume in
    /// flight). The handle is destroyed once the last record it made is freed.
    fn close(&self, py: Python) {
        let handle = &self.handle;
        py.detach(|| {
            let mut closed = handle.closed.lock().unwrap_or_else(|e| e.into_inner());
            if !*closed {
                *closed = true;
                (handle.api.consumer_close)(handle.rk);
            }
        });
    }
}

/// Messages librdkafka is filling in (the GIL released).
struct Consumed(Vec<*mut RawMessage>);

// SAFETY: librdkafka messages may be handled from any thread.
unsafe impl Send for Consumed {}

/// Consumed messages not made into Python objects yet, destroyed with the batch (before
/// the handle they keep).
struct Messages {
    handle: Arc<Handle>,
    raw: VecDeque<*mut RawMessage>,
}

// SAFETY: librdkafka messages may be destroyed from any thread.
unsafe impl Send for Messages {}
unsafe impl Sync for Messages {}

impl Messages {
    fn destroy(&self, raw: *mut RawMessage) {
        (self.handle.api.message_destroy)(raw);
    }

    /// Message `at`, alive while the batch is.
    fn at(&self, at: usize) -> &RawMessage {
        // SAFETY: a message librdkafka returned, destroyed only with the batch.
        unsafe { &*self.raw[at] }
    }
}

impl Drop for Messages {
    fn drop(&mut self) {
        for raw in self.raw.drain(..) {
            (self.handle.api.message_destroy)(raw);
        }
    }
}

/// Topic names as Python text, by librdkafka topic handle: one per topic a batch.
#[derive(Default)]
struct Topics(Vec<(usize, Py<PyString>)>);

impl Topics {
    fn name(&mut self, py: Python, api: &Api, rkt: *mut c_void) -> Py<PyString> {
        if let Some((_, name)) = self.0.iter().find(|(at, _)| *at == rkt as usize) {
            return name.clone_ref(py);
        }
        let name = PyString::new(py, &text((api.topic_name)(rkt))).unbind();
        self.0.push((rkt as usize, name.clone_ref(py)));
        name
    }
}

/// A consumed batch: iterated, its messages up to the first record that is an error
/// (`error` then holds its code and text); `records()` gives what is left as records.
#[pyclass(module = "amps_on_kafka_native")]
struct ReadBatch {
    raw: Messages,
    builder: Py<RecordBuilder>,
    codec: Py<PyAny>,
    topics: Topics,
    #[pyo3(get)]
    error: Option<(i32, String)>,
}

impl ReadBatch {
    /// The record over `raw`, which it now owns, and its payload.
    fn record<'py>(
        &mut self,
        py: Python<'py>,
        raw: *mut RawMessage,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        // SAFETY: a message librdkafka returned, not destroyed yet.
        let message = unsafe { &*raw };
        let value = bytes_or_none(py, message.payload, message.len);
        let handle = self.raw.handle.clone();
        let topic = self.topics.name(py, handle.api, message.rkt);
        let record = Record {
            handle,
            raw: RawPtr(raw),
            topic,
            value: value.clone().unbind(),
        };
        Ok((Bound::new(py, record)?.into_any(), value))
    }
}

#[pymethods]
impl ReadBatch {
    fn __len__(&self) -> usize {
        self.raw.raw.len()
    }

    fn __iter__(slf: PyRef<Self>) -> PyRef<Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        while let Some(&raw) = self.raw.raw.front() {
            // SAFETY: a message librdkafka returned, not destroyed yet.
            let err = unsafe { (*raw).err };
            if err == 0 {
                self.raw.raw.pop_front();
                let (record, value) = self.record(py, raw)?;
                let builder = self.builder.bind(py).get();
                return builder
                    .message(&record, &value, self.codec.bind(py))
                    .map(Some);
            }
            if err != PARTITION_EOF {
                self.error = Some((err, error_text(self.raw.handle.api, raw)));
                return Ok(None);
            }
            self.raw.raw.pop_front();
            self.raw.destroy(raw);
        }
        Ok(None)
    }

    /// What is left of the batch as records (confluent-kafka `Message`'s methods a
    /// replay reads), an error one included: `kafka_error(code, text)` is its `error()`.
    fn records<'py>(
        &mut self,
        py: Python<'py>,
        kafka_error: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let records = PyList::empty(py);
        while let Some(raw) = self.raw.raw.pop_front() {
            // SAFETY: as in __next__.
            let err = unsafe { (*raw).err };
            if err == 0 {
                records.append(self.record(py, raw)?.0)?;
                continue;
            }
            if err == PARTITION_EOF {
                self.raw.destroy(raw);
                continue;
            }
            let error = kafka_error.call1((err, error_text(self.raw.handle.api, raw)))?;
            self.raw.destroy(raw);
            records.append(Bound::new(
                py,
                Failed {
                    error: error.unbind(),
                },
            )?)?;
        }
        Ok(records)
    }
}

/// A consumed batch kept as librdkafka's records (`RdReader.consume_raw`), which a
/// queue's EntryReader (queue_entries.rs) reads into its entries: no record object is
/// made for a message. `batch[at].error()` is record `at`'s error as confluent-kafka's
/// `Message.error()` gives it (None when it has none), which is all the queue asks of
/// a record besides what EntryReader reads.
#[pyclass(module = "amps_on_kafka_native")]
pub(crate) struct RawBatch {
    raw: Messages,
    topics: Topics,
    kafka_error: Py<PyAny>,
}

impl RawBatch {
    pub(crate) fn len(&self) -> usize {
        self.raw.raw.len()
    }

    /// Whether record `at` is an error (a partition's end included).
    pub(crate) fn failed(&self, at: usize) -> bool {
        self.raw.at(at).err != 0
    }

    /// Record `at`'s topic: one text a topic a batch.
    pub(crate) fn topic(&mut self, py: Python, at: usize) -> Py<PyString> {
        let rkt = self.raw.at(at).rkt;
        self.topics.name(py, self.raw.handle.api, rkt)
    }

    pub(crate) fn partition(&self, at: usize) -> i32 {
        self.raw.at(at).partition
    }

    pub(crate) fn offset(&self, at: usize) -> i64 {
        self.raw.at(at).offset
    }

    /// Record `at`'s timestamp (milliseconds; -1 without one), as confluent-kafka's.
    pub(crate) fn timestamp(&self, at: usize) -> i64 {
        let mut kind: c_int = 0;
        (self.raw.handle.api.message_timestamp)(self.raw.raw[at], &mut kind)
    }

    /// Record `at`'s value: None without one.
    pub(crate) fn value<'py>(&self, py: Python<'py>, at: usize) -> Bound<'py, PyAny> {
        let message = self.raw.at(at);
        bytes_or_none(py, message.payload, message.len)
    }

    /// Record `at`'s headers as confluent-kafka gives them (see `Record.headers`).
    pub(crate) fn headers<'py>(&self, py: Python<'py>, at: usize) -> PyResult<Bound<'py, PyAny>> {
        let headers = headers_of(py, self.raw.handle.api, self.raw.raw[at])?;
        Ok(headers.map_or_else(|| py.None().into_bound(py), Bound::into_any))
    }
}

#[pymethods]
impl RawBatch {
    fn __len__(&self) -> usize {
        self.len()
    }

    fn __getitem__(&self, py: Python, at: usize) -> PyResult<Failed> {
        if at >= self.len() {
            return Err(PyIndexError::new_err("batch index out of range"));
        }
        let raw = self.raw.raw[at];
        let error = match self.raw.at(at).err {
            0 => py.None(),
            err => self
                .kafka_error
                .bind(py)
                .call1((err, error_text(self.raw.handle.api, raw)))?
                .unbind(),
        };
        Ok(Failed { error })
    }
}

/// `rd_kafka_message_errstr` (inline in rdkafka.h): the message's own text, else the
/// code's.
fn error_text(api: &Api, raw: *mut RawMessage) -> String {
    // SAFETY: a live message; an error message's payload is its text.
    let message = unsafe { &*raw };
    if message.payload.is_null() {
        return text((api.err2str)(message.err));
    }
    // SAFETY: `len` bytes at `payload`.
    let bytes = unsafe { std::slice::from_raw_parts(message.payload as *const u8, message.len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn bytes_or_none(py: Python, at: *const c_void, len: usize) -> Bound<PyAny> {
    if at.is_null() {
        return py.None().into_bound(py);
    }
    // SAFETY: `len` bytes at `at`, alive while the message is.
    let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
    PyBytes::new(py, bytes).into_any()
}

/// A message's headers, [(name, value or None)], or None without headers, as
/// confluent-kafka gives them; UnicodeDecodeError for a name that is not UTF-8, as its
/// decoding raises it.
fn headers_of<'py>(
    py: Python<'py>,
    api: &Api,
    raw: *const RawMessage,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let mut headers: *mut c_void = ptr::null_mut();
    if (api.message_headers)(raw, &mut headers) != 0 {
        return Ok(None);
    }
    let list = PyList::empty(py);
    let mut index = 0;
    loop {
        let mut name: *const c_char = ptr::null();
        let mut value: *const c_void = ptr::null();
        let mut size = 0usize;
        if (api.header_get_all)(headers, index, &mut name, &mut value, &mut size) != 0 {
            break;
        }
        // SAFETY: a NUL-terminated name, alive with the message.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let name = match std::str::from_utf8(name) {
            Ok(name) => PyString::new(py, name).into_any(),
            Err(_) => PyBytes::new(py, name).call_method1("decode", ("utf-8",))?,
        };
        let value = bytes_or_none(py, value, size);
        list.append(PyTuple::new(py, [name, value])?)?;
        index += 1;
    }
    Ok(Some(list))
}

struct RawPtr(*mut RawMessage);

// SAFETY: as for Messages.
unsafe impl Send for RawPtr {}
unsafe impl Sync for RawPtr {}

/// A consumed record: the methods of confluent-kafka's `Message` a replay's messages
/// read, over the `rd_kafka_message_t` it keeps. Its headers are parsed when asked for.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Record {
    handle: Arc<Handle>,
    raw: RawPtr,
    topic: Py<PyString>,
    value: Py<PyAny>,
}

impl Record {
    fn message(&self) -> &RawMessage {
        // SAFETY: the record owns the message until it is dropped.
        unsafe { &*self.raw.0 }
    }
}

#[pymethods]
impl Record {
    fn error(&self) -> Option<()> {
        None
    }

    fn value(&self, py: Python) -> Py<PyAny> {
        self.value.clone_ref(py)
    }

    fn key<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        let message = self.message();
        bytes_or_none(py, message.key, message.key_len)
    }

    fn topic(&self, py: Python) -> Py<PyString> {
        self.topic.clone_ref(py)
    }

    fn partition(&self) -> i32 {
        self.message().partition
    }

    fn offset(&self) -> i64 {
        self.message().offset
    }

    /// (timestamp type, milliseconds since the epoch), as confluent-kafka gives it.
    fn timestamp(&self) -> (i32, i64) {
        let mut kind: c_int = 0;
        let at = (self.handle.api.message_timestamp)(self.raw.0, &mut kind);
        (kind, at)
    }

    /// [(name, value or None)], or None without headers, as confluent-kafka gives them
    /// (`headers_of`).
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        headers_of(py, self.handle.api, self.raw.0)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        (self.handle.api.message_destroy)(self.raw.0);
    }
}

/// A record's error: `error()` is the KafkaError the replay raises (or None, for a
/// record of a RawBatch that has none).
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Failed {
    error: Py<PyAny>,
}

#[pymethods]
impl Failed {
    fn error(&self, py: Python) -> Py<PyAny> {
        self.error.clone_ref(py)
    }
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<RdReader>()?;
    m.add_class::<ReadBatch>()?;
    m.add_class::<RawBatch>()?;
    m.add_class::<Record>()?;
    m.add_class::<Failed>()
}
