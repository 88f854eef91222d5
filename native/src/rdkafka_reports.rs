//! The compiled producer's delivery reports (rdkafka_producer.rs): what a record's
//! opaque says of how it is reported, the C callback that queues each report without the
//! GIL, a poll's batched reports counted by batch, and the `Message` a Python callback
//! is handed.
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

use crate::rdkafka_handle::API;
use crate::rdkafka_reader::{text, RawMessage};

/// The syslog level of librdkafka's warnings: lines above it (notice, info, debug) are
/// not kept.
const WARNING: c_int = 4;
/// Log lines kept between two serves of the handle (a poll's turn, 0.1 s at most in
/// the gateway's pump); those beyond are counted, not kept.
const LINES_KEPT: usize = 200;

/// One log line of librdkafka's: (syslog level, facility, text).
pub(crate) type Line = (c_int, String, String);

/// What librdkafka's callbacks queue for the handle's owner, served by poll and flush
/// (the handle's opaque: it outlives the handle).
#[derive(Default)]
pub(crate) struct Queues {
    pub(crate) reports: Mutex<Vec<Report>>,
    pub(crate) lines: Mutex<Vec<Line>>,
    /// Lines not kept: beyond LINES_KEPT, or met the queue taken by a serve.
    pub(crate) dropped: AtomicUsize,
}

impl Queues {
    /// The log lines kept since the last take, and how many were dropped.
    pub(crate) fn take_lines(&self) -> (Vec<Line>, usize) {
        let lines = std::mem::take(&mut *self.lines.lock().unwrap_or_else(|e| e.into_inner()));
        (lines, self.dropped.swap(0, Ordering::Relaxed))
    }
}

/// librdkafka's log callback: runs on librdkafka's own threads, so it only keeps a
/// warning or worse (a broker that can't be reached, a request that failed) for the
/// next serve, and never waits: a queue being taken, or full, counts the line dropped.
pub(crate) extern "C" fn logged(
    rk: *const c_void,
    level: c_int,
    facility: *const c_char,
    line: *const c_char,
) {
    if level > WARNING || rk.is_null() {
        return;
    }
    let opaque = match API.get() {
        Some(Ok(api)) => (api.opaque)(rk),
        _ => return,
    };
    if opaque.is_null() {
        return;
    }
    // SAFETY: the opaque is the handle's Queues (set at rd_kafka_new, outlives it).
    let queues = unsafe { &*(opaque as *const Queues) };
    match queues.lines.try_lock() {
        Ok(mut lines) if lines.len() < LINES_KEPT => {
            lines.push((level, text(facility), text(line)));
        }
        _ => {
            queues.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

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
pub(crate) fn numbered(number: i64) -> Option<usize> {
    (number.unsigned_abs() < NUMBER_LIMIT).then_some(((number << 2) as usize) | NUMBERED)
}

/// The opaque of batched record `number` (`batch << 32 | index`).
pub(crate) fn batched(number: u64) -> usize {
    ((number as usize) << 1) | 1
}

/// Whether `opaque` is a boxed Python callback (made by `produce`).
pub(crate) fn boxed(opaque: usize) -> bool {
    opaque != 0 && opaque & 3 == 0
}

/// A numbered record's number, if `opaque` is one's.
pub(crate) fn number_of(opaque: usize) -> Option<i64> {
    (opaque & 3 == NUMBERED).then_some((opaque as i64) >> 2)
}

/// One delivery report, as the C callback took it. `opaque` is 0 (no callback), a
/// batched record's `number << 1 | 1`, a numbered record's `number << 2 | NUMBERED`, or
/// a boxed Python callback (aligned: bits 0 and 1 clear).
pub(crate) struct Report {
    pub(crate) opaque: usize,
    pub(crate) err: c_int,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// The topic and error text, read only where Python is handed them.
    pub(crate) topic: String,
    pub(crate) reason: String,
}

/// librdkafka's delivery report callback: runs inside poll/flush (the GIL released) and
/// only queues the report.
pub(crate) extern "C" fn delivered(
    _rk: *mut c_void,
    message: *const RawMessage,
    opaque: *mut c_void,
) {
    // SAFETY: `opaque` is the handle's Queues (set at rd_kafka_new, outlives it);
    // `message` is valid for the callback's duration.
    let (queues, message) = unsafe { (&*(opaque as *const Queues), &*message) };
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
    queues
        .reports
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(report);
}

/// A poll's reports of one batch: its number, how many, and the failures' (index, code,
/// text).
pub(crate) type Group = (u64, usize, Vec<(u64, c_int, String)>);

/// Count `report` into its batch's group if it is a batched record's (the report given
/// back if not).
pub(crate) fn count_batched(groups: &mut Vec<Group>, report: Report) -> Option<Report> {
    if report.opaque & 1 == 0 {
        return Some(report);
    }
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
    None
}

/// A delivered record as a callback sees it: confluent-kafka's `Message` methods that
/// the gateway's callbacks read.
#[pyclass(frozen, module = "amps_on_kafka_native")]
pub(crate) struct Delivered {
    topic: String,
    partition: i32,
    offset: i64,
    error: Py<PyAny>,
}

impl Delivered {
    /// The message of `report`, whose error is `error` (a KafkaError, or None).
    pub(crate) fn new(report: Report, error: Py<PyAny>) -> Self {
        Self {
            topic: report.topic,
            partition: report.partition,
            offset: report.offset,
            error,
        }
    }
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

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<Delivered>()
}
