//! The message ids of a queue ack (`bm`: `topic|partition|offset|`, comma-separated), as
//! `processor/queues.py` `_message_ids` reads them: the gateway parses a few bookmarks
//! for every ack frame, and the Python split and int() of each cost ~1 µs a message.
//! Only the common form is read here (every item four `|` parts, the last empty, ASCII
//! digits that fit 64 bits); anything else is left (None) to the twin, which reads it
//! and names the problem.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

/// One item's (topic, partition, offset), or None when it is not the common form.
fn common_id(item: &str) -> Option<(&str, u64, u64)> {
    let mut parts = item.split('|');
    let topic = parts.next()?;
    let partition = digits(parts.next()?)?;
    let offset = digits(parts.next()?)?;
    match (parts.next(), parts.next()) {
        (Some(""), None) => Some((topic, partition, offset)),
        _ => None,
    }
}

fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The ids of every item of `text`, or None when any item is not the common form.
#[pyfunction]
fn message_ids<'py>(text: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyList>>> {
    let py = text.py();
    let Ok(text) = text.to_str() else {
        return Ok(None); // not UTF-8 (a lone surrogate): the twin's
    };
    let ids = PyList::empty(py);
    // the ids of one topic share its text (an ack names one queue's messages): one
    // object made, and its hash computed once for every look-up of the ack
    let mut last: Option<(&str, Bound<'py, PyString>)> = None;
    for item in text.split(',') {
        let Some((topic, partition, offset)) = common_id(item) else {
            return Ok(None);
        };
        let name = match &last {
            Some((seen, name)) if *seen == topic => name.clone(),
            _ => {
                let name = PyString::new(py, topic);
                last = Some((topic, name.clone()));
                name
            }
        };
        ids.append((name, partition, offset))?;
    }
    Ok(Some(ids))
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(message_ids, m)?)
}
