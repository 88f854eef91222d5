//! The compiled producer's librdkafka handle (rdkafka_producer.rs): the C functions it
//! calls, loaded from the library confluent-kafka's wheel carries (found and
//! version-checked as the replay's reader is, rdkafka_reader.rs); a record as
//! `rd_kafka_produceva`'s field list; and the handle itself, kept from being destroyed
//! under a thread still inside librdkafka.
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::rdkafka_reader::{open, symbol, text, Config, RawMessage};
use crate::rdkafka_reports::{boxed, delivered, logged, Line, Queues, Report};

/// `RD_KAFKA_PRODUCER`.
const PRODUCER: c_int = 0;
/// `RD_KAFKA_RESP_ERR__DESTROY`: what a produce on a closed handle is refused with.
const DESTROYED: c_int = -197;
/// `RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT`: every record not yet reported.
const PURGE_ALL: c_int = 3;
/// `RD_KAFKA_MSG_F_COPY`: librdkafka copies the value and key.
const MSG_F_COPY: c_int = 2;
/// `RD_KAFKA_PARTITION_UA`: the partitioner places the record.
pub(crate) const PARTITION_UA: i32 = -1;
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

/// `rd_kafka_vu_t`'s value union (64 bytes of padding in rdkafka.h).
#[repr(C)]
#[derive(Clone, Copy)]
union Value {
    words: [usize; 8],
    int: c_int,
    long: i64,
}

/// `rd_kafka_vu_t`: one field of a record as `rd_kafka_produceva` takes it.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Vu {
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

    /// No field: what a header array not yet filled holds.
    pub(crate) fn end() -> Self {
        Self::words(V_END, 0, 0, 0)
    }

    /// A header `name` (NUL-terminated) with `value`, or a null value.
    pub(crate) fn header(name: &CString, value: Option<&[u8]>) -> Self {
        let (at, size) = value.map_or((0, -1isize), |v| (v.as_ptr() as usize, v.len() as isize));
        Self::words(V_HEADER, name.as_ptr() as usize, at, size as usize)
    }
}

type DeliveryCallback = extern "C" fn(*mut c_void, *const RawMessage, *mut c_void);

/// The librdkafka functions the producer calls.
pub(crate) struct Api {
    config: Config,
    new: extern "C" fn(c_int, *mut c_void, *mut c_char, usize) -> *mut c_void,
    conf_set_dr_msg_cb: extern "C" fn(*mut c_void, DeliveryCallback),
    conf_set_opaque: extern "C" fn(*mut c_void, *mut c_void),
    /// `rd_kafka_opaque`: the log callback's way to the handle's Queues.
    pub(crate) opaque: extern "C" fn(*const c_void) -> *mut c_void,
    produceva: extern "C" fn(*mut c_void, *const Vu, usize) -> *mut c_void,
    error_code: extern "C" fn(*const c_void) -> c_int,
    error_destroy: extern "C" fn(*mut c_void),
    poll: extern "C" fn(*mut c_void, c_int) -> c_int,
    flush: extern "C" fn(*mut c_void, c_int) -> c_int,
    purge: extern "C" fn(*mut c_void, c_int) -> c_int,
    outq_len: extern "C" fn(*mut c_void) -> c_int,
    topic_new: extern "C" fn(*mut c_void, *const c_char, *mut c_void) -> *mut c_void,
    topic_destroy: extern "C" fn(*mut c_void),
    pub(crate) topic_name: extern "C" fn(*const c_void) -> *const c_char,
    /// `rd_kafka_message_produce_errstr`, as confluent-kafka reads a report's error.
    pub(crate) message_errstr: extern "C" fn(*const RawMessage) -> *const c_char,
    pub(crate) err2str: extern "C" fn(c_int) -> *const c_char,
    destroy: extern "C" fn(*mut c_void),
    fatal_error: extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int,
    test_fatal_error: extern "C" fn(*mut c_void, c_int, *const c_char) -> c_int,
}

pub(crate) static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn load(path: &str) -> Result<Api, String> {
    let library = open(path)?;
    // SAFETY: each type is the function's signature in rdkafka.h.
    unsafe {
        Ok(Api {
            config: Config::load(library)?,
            new: symbol(library, "new")?,
            conf_set_dr_msg_cb: symbol(library, "conf_set_dr_msg_cb")?,
            conf_set_opaque: symbol(library, "conf_set_opaque")?,
            opaque: symbol(library, "opaque")?,
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
            fatal_error: symbol(library, "fatal_error")?,
            test_fatal_error: symbol(library, "test_fatal_error")?,
        })
    }
}

/// The producer handle and what its callbacks need.
pub(crate) struct Handle {
    api: &'static Api,
    rk: *mut c_void,
    queues: Box<Queues>,
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
    /// A producer on the library at `path` (confluent-kafka's), of `version`, configured
    /// with text `settings`, its delivery reports queued by `delivered` and its warnings
    /// by `logged`. ValueError when the library or a setting is refused.
    pub(crate) fn open(path: &str, version: i32, settings: &[(String, String)]) -> PyResult<Self> {
        let api = API
            .get_or_init(|| load(path))
            .as_ref()
            .map_err(|e| PyValueError::new_err(e.clone()))?;
        api.config.check_version(version)?;
        let conf = api.config.build(settings, logged)?;
        let queues: Box<Queues> = Box::default();
        (api.conf_set_dr_msg_cb)(conf, delivered);
        (api.conf_set_opaque)(conf, &*queues as *const _ as *mut c_void);
        let mut errstr = [0 as c_char; 512];
        let rk = (api.new)(PRODUCER, conf, errstr.as_mut_ptr(), errstr.len());
        if rk.is_null() {
            (api.config.conf_destroy)(conf);
            return Err(PyValueError::new_err(text(errstr.as_ptr())));
        }
        Ok(Self {
            api,
            rk,
            queues,
            topics: Mutex::default(),
            closed: AtomicBool::new(false),
            serving: RwLock::new(()),
        })
    }

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
    pub(crate) fn send(
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
        let mut fields = [Vu::end(); FIELDS];
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
        let mut inline = [Vu::end(); FIELDS + 4];
        let mut heap = Vec::new();
        let vus: &mut [Vu] = if count + headers.len() <= inline.len() {
            &mut inline[..count + headers.len()]
        } else {
            heap.resize(count + headers.len(), Vu::end());
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

    /// `rd_kafka_poll` for up to `wait` ms (call it without the GIL): the events served,
    /// None when closed.
    pub(crate) fn poll(&self, wait: c_int) -> Option<c_int> {
        self.serving(|rk| (self.api.poll)(rk, wait))
    }

    /// `rd_kafka_flush` for up to `wait` ms (call it without the GIL).
    pub(crate) fn flush(&self, wait: c_int) {
        self.serving(|rk| (self.api.flush)(rk, wait));
    }

    /// The records not yet reported (0 once closed).
    pub(crate) fn queued(&self) -> usize {
        if self.is_closed() {
            return 0;
        }
        (self.api.outq_len)(self.rk).max(0) as usize
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// librdkafka's text for an error `code`.
    pub(crate) fn reason(&self, code: c_int) -> String {
        text((self.api.err2str)(code))
    }

    /// librdkafka's fatal error (code, text) once it raised one (an idempotent producer
    /// that can no longer keep its guarantees): every later produce fails. None while
    /// there is none, or once closed.
    pub(crate) fn fatal(&self) -> Option<(c_int, String)> {
        let mut buffer = [0 as c_char; 512];
        let code = self
            .serving(|rk| (self.api.fatal_error)(rk, buffer.as_mut_ptr(), buffer.len()))
            .unwrap_or(0);
        (code != 0).then(|| (code, text(buffer.as_ptr())))
    }

    /// `rd_kafka_test_fatal_error`: librdkafka raises a fatal error `code` as if it had
    /// met one (tests only); librdkafka's result code, -1 once closed.
    pub(crate) fn test_fatal(&self, code: c_int, reason: &CStr) -> c_int {
        self.serving(|rk| (self.api.test_fatal_error)(rk, code, reason.as_ptr()))
            .unwrap_or(-1)
    }

    pub(crate) fn take_reports(&self) -> Vec<Report> {
        std::mem::take(
            &mut *self
                .queues
                .reports
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// The warnings librdkafka logged since the last take, and how many were dropped.
    pub(crate) fn take_lines(&self) -> (Vec<Line>, usize) {
        self.queues.take_lines()
    }

    /// Destroy the handle once any poll or flush under way returns, the GIL released
    /// meanwhile; idempotent. Marked closed with the GIL held, so no `send` is under way.
    pub(crate) fn shut(&self, py: Python<'_>) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            py.detach(|| {
                let _alone = self.serving.write().unwrap_or_else(|e| e.into_inner());
                self.close()
            });
        }
    }

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

impl Drop for Handle {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.close();
        }
    }
}
