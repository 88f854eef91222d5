//! The messages a queue's checkpoint leaves in Kafka (`amps_on_kafka/state/queue_store_runs.py`,
//! whose `_UnstoredRunsTwin` is this class's twin): runs of consecutive offsets of one
//! partition that got consecutive arrival numbers, each member a message that only waited
//! in the queue, which a restart reads again from its topic instead of the store. The
//! checkpoint's walk over its changed entries (`EntryWriter.put`, queue_store.rs) notes
//! and removes members here without a Python call: a message read and acked costs a
//! comparison with its partition's last run and, when it leaves, one with its first.
use std::collections::VecDeque;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

/// Consecutive offsets from `first`, with arrival numbers from `seq`.
#[derive(Clone, Copy)]
struct Run {
    first: i64,
    seq: i64,
    count: i64,
}

impl Run {
    fn end(&self) -> i64 {
        self.first + self.count
    }
}

/// One partition's runs, in offset order.
struct Part {
    topic: Py<PyString>,
    name: String,
    partition: i64,
    runs: VecDeque<Run>,
}

/// Every partition's runs of one queue (see the module's doc).
#[pyclass(module = "amps_on_kafka_native")]
pub(crate) struct UnstoredRuns {
    /// MaxDeliveries reads a message's delivery count: a delivered one is then stored.
    #[pyo3(get)]
    pub(crate) deliveries_counted: bool,
    parts: Vec<Part>,
    last: usize, // the part found last: a checkpoint's entries mostly share one
}

#[pymethods]
impl UnstoredRuns {
    /// `runs`: what `state()` returned (read back from the store), or None.
    #[new]
    #[pyo3(signature = (deliveries_counted, runs = None))]
    fn new(deliveries_counted: bool, runs: Option<&Bound<PyAny>>) -> PyResult<Self> {
        let mut this = Self {
            deliveries_counted,
            parts: Vec::new(),
            last: 0,
        };
        for item in runs
            .map(|r| r.try_iter())
            .transpose()?
            .into_iter()
            .flatten()
        {
            let item = item?;
            let topic = item.get_item(0)?.cast_into::<PyString>()?;
            let partition: i64 = item.get_item(1)?.extract()?;
            let mut kept = VecDeque::new();
            for run in item.get_item(2)?.try_iter()? {
                let run = run?;
                kept.push_back(Run {
                    first: run.get_item(0)?.extract()?,
                    seq: run.get_item(1)?.extract()?,
                    count: run.get_item(2)?.extract()?,
                });
            }
            let at = this.part(&topic, partition);
            this.parts[at].runs = kept;
        }
        this.parts.retain(|part| !part.runs.is_empty());
        Ok(this)
    }

    /// A message that only waited, not stored, at `offset` with arrival number `seq`: a
    /// member (already one when its offset is within the partition's runs).
    fn note(&mut self, topic: &Bound<PyString>, partition: i64, offset: i64, seq: i64) {
        let at = self.part(topic, partition);
        let runs = &mut self.parts[at].runs;
        if let Some(last) = runs.back_mut() {
            let end = last.end();
            if offset < end {
                return;
            }
            if offset == end && last.seq.checked_add(last.count) == Some(seq) {
                last.count += 1;
                return;
            }
        }
        runs.push_back(Run {
            first: offset,
            seq,
            count: 1,
        });
    }

    /// The message at `offset` left the queue or is stored: no longer a member; within a
    /// run it splits the run in two, so the runs never outnumber the members.
    fn leave(&mut self, topic: &Bound<PyString>, partition: i64, offset: i64) {
        let Some(at) = self.find(topic, partition) else {
            return;
        };
        let runs = &mut self.parts[at].runs;
        let held = |run: &Run| run.first <= offset && offset < run.end();
        let index = match runs.front() {
            Some(front) if held(front) => 0,
            _ => {
                let index = runs.partition_point(|run| run.first <= offset);
                match index.checked_sub(1) {
                    Some(index) if held(&runs[index]) => index,
                    _ => return,
                }
            }
        };
        let run = runs[index];
        let after = run.end() - offset - 1; // members after it
        if offset == run.first {
            runs[index] = Run {
                first: offset + 1,
                seq: run.seq + 1,
                count: run.count - 1,
            };
        } else {
            runs[index].count = offset - run.first;
            if after > 0 {
                let rest = Run {
                    first: offset + 1,
                    seq: run.seq + (offset + 1 - run.first),
                    count: after,
                };
                runs.insert(index + 1, rest);
            }
        }
        if runs[index].count == 0 {
            runs.remove(index);
            if runs.is_empty() {
                self.parts.remove(at);
                self.last = 0;
            }
        }
    }

    /// Each partition's first member: where a restart reads it again from.
    fn fronts(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let found = pyo3::types::PyDict::new(py);
        for part in &self.parts {
            if let Some(front) = part.runs.front() {
                found.set_item((part.topic.bind(py), part.partition), front.first)?;
            }
        }
        Ok(found.into_any().unbind())
    }

    /// Every run as the store keeps it: `[[topic, partition, [[first, seq, count], ...]],
    /// ...]`, partitions in the order first noted.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for part in &self.parts {
            let runs = PyList::empty(py);
            for run in &part.runs {
                runs.append(PyList::new(py, [run.first, run.seq, run.count])?)?;
            }
            let item: [Bound<PyAny>; 3] = [
                part.topic.bind(py).clone().into_any(),
                part.partition.into_pyobject(py)?.into_any(),
                runs.into_any(),
            ];
            out.append(PyList::new(py, item)?)?;
        }
        Ok(out)
    }
}

impl UnstoredRuns {
    /// `note` for an entry's id `(topic, partition, offset)`; false if the id is not
    /// one this code reads (the caller leaves the entry to the twin).
    pub(crate) fn note_id(&mut self, id: &Bound<PyAny>, seq: i64) -> bool {
        match parse_id(id) {
            Some((topic, partition, offset)) => {
                self.note(&topic, partition, offset, seq);
                true
            }
            None => false,
        }
    }

    /// `leave` for an entry's id; false if the id is not one this code reads.
    pub(crate) fn leave_id(&mut self, id: &Bound<PyAny>) -> bool {
        match parse_id(id) {
            Some((topic, partition, offset)) => {
                self.leave(&topic, partition, offset);
                true
            }
            None => false,
        }
    }

    /// The index of the partition's part, if it has one.
    fn find(&mut self, topic: &Bound<PyString>, partition: i64) -> Option<usize> {
        let matches = |part: &Part| {
            part.partition == partition
                && (part.topic.is(topic) || topic.to_str().is_ok_and(|name| name == part.name))
        };
        if self.parts.get(self.last).is_some_and(matches) {
            return Some(self.last);
        }
        let at = self.parts.iter().position(matches)?;
        self.last = at;
        Some(at)
    }

    /// The index of the partition's part, made when it has none.
    fn part(&mut self, topic: &Bound<PyString>, partition: i64) -> usize {
        if let Some(at) = self.find(topic, partition) {
            return at;
        }
        self.parts.push(Part {
            topic: topic.clone().unbind(),
            name: topic.to_string_lossy().into_owned(),
            partition,
            runs: VecDeque::new(),
        });
        self.last = self.parts.len() - 1;
        self.last
    }
}

/// `(topic, partition, offset)` if `id` is a tuple of exactly a str and two 64-bit ints.
fn parse_id<'py>(id: &Bound<'py, PyAny>) -> Option<(Bound<'py, PyString>, i64, i64)> {
    let id = id.cast_exact::<PyTuple>().ok()?;
    if id.len() != 3 {
        return None;
    }
    let topic = id.get_item(0).ok()?.cast_into_exact::<PyString>().ok()?;
    topic.to_str().ok()?;
    let partition = id.get_item(1).ok()?.extract::<i64>().ok()?;
    let offset = id.get_item(2).ok()?.extract::<i64>().ok()?;
    Some((topic, partition, offset))
}
