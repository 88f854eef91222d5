//! The compiled hot paths of amps_on_kafka. Each function here has a Python twin that
//! gives the same result (held to it by differential property tests); the Python package
//! uses this module when it is installed and its twin when it is not
//! (`amps_on_kafka/native.py`). One Rust module per concern, each with a `register`
//! that adds its functions to the Python module.
mod acks;
mod batches;
mod filters;
mod frame_buffer;
mod frames;
mod json_scan;
mod lookups;
mod publish;
mod publish_runs;
mod queue_acks;
mod queue_dispatch;
mod queue_enqueue;
mod queue_entries;
mod queue_messages;
mod queue_store;
mod queue_store_runs;
mod rdkafka_handle;
mod rdkafka_producer;
mod rdkafka_reader;
mod rdkafka_reports;
mod records;
mod scans;
mod staging;

use pyo3::prelude::*;

#[pymodule]
fn amps_on_kafka_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", 1)?;
    staging::register(m)?;
    frames::register(m)?;
    frame_buffer::register(m)?;
    records::register(m)?;
    rdkafka_reader::register(m)?;
    rdkafka_producer::register(m)?;
    rdkafka_reports::register(m)?;
    filters::register(m)?;
    acks::register(m)?;
    scans::register(m)?;
    lookups::register(m)?;
    batches::register(m)?;
    publish::register(m)?;
    publish_runs::register(m)?;
    queue_entries::register(m)?;
    queue_store::register(m)?;
    queue_messages::register(m)?;
    queue_acks::register(m)?;
    queue_dispatch::register(m)?;
    queue_enqueue::register(m)?;
    Ok(())
}
