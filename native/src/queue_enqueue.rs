//! Messages read from the log admitted to a queue in one call: the common case of
//! `QueueState.enqueue` (`amps_on_kafka/state/queue.py`, through `enqueue_read`), a
//! queue with no Priority, no barrier, no TargetQueueDepth, no Expiration and no ack
//! that came early, and a message with no expiration of its own.
//!
//! Per message the twin reads the id, moves the partition's position, numbers the
//! message, notes it in the entries, the partition's order and the dirty set, and makes
//! it available (`_admit`, `_activate`, `_place`, `_make_available`, `ReadyQueue.push`):
//! about 1.5 us a message on the queue's thread. Here the same changes are made on the
//! same structures in the same order. The call stops at an item it leaves to the twin (a
//! position read past, a message of another class or with an expiration or a barrier
//! flag), which the caller's loop handles before calling again.
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyTuple, PyType};

use crate::queue_messages::Layout;
use crate::records::replace;

/// Admits messages to a `QueueState`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Enqueuer {
    entry: Layout<8>,
    ready: Layout<2>,
    available: Py<PyAny>,
    deque: Py<PyAny>,
    heappush: Py<PyAny>,
}

// The slots of QueueEntry this reads or writes, by position in `entry`.
const ID: usize = 0;
const EXPIRATION: usize = 1;
const SEQ: usize = 2;
const DEADLINE: usize = 3;
const RANK: usize = 4;
const BARRIER: usize = 5;
const EV_POS: usize = 6;
const STATUS: usize = 7;

/// What a call reads from the state once.
struct Parts<'py> {
    positions: Bound<'py, PyDict>,
    entries: Bound<'py, PyDict>,
    partitions: Bound<'py, PyDict>,
    dirty: Bound<'py, PyDict>,
    in_order: Bound<'py, PyAny>,
    others: Bound<'py, PyList>,
    ev_next: Bound<'py, PyAny>,
}

/// A message's id taken apart: (topic, partition), the offset and its value.
struct Id<'py> {
    tp: Bound<'py, PyTuple>,
    offset: Bound<'py, PyAny>,
    value: i64,
}

#[pymethods]
impl Enqueuer {
    /// QueueEntry and ReadyQueue (classes with slots), Status.AVAILABLE,
    /// collections.deque and heapq.heappush.
    #[new]
    fn new(
        entry: &Bound<PyType>,
        ready: &Bound<PyType>,
        available: Py<PyAny>,
        deque: Py<PyAny>,
        heappush: Py<PyAny>,
    ) -> PyResult<Self> {
        let names = [
            "id",
            "expiration",
            "seq",
            "deadline",
            "rank",
            "barrier",
            "ev_pos",
            "status",
        ];
        Ok(Self {
            entry: Layout::new(entry, names)?,
            ready: Layout::new(ready, ["_in_order", "_others"])?,
            available,
            deque,
            heappush,
        })
    }

    /// Enqueues `read[start:]` on `state` until the first item it leaves to the
    /// caller: the index of that item, or the list's end.
    fn run(&self, state: &Bound<PyAny>, read: &Bound<PyList>, start: usize) -> PyResult<usize> {
        let py = state.py();
        let Some(parts) = self.parts(state)? else {
            return Ok(start);
        };
        let mut seq: i64 = state.getattr(intern!(py, "next_seq"))?.extract()?;
        let first = seq;
        let mut at = start;
        let outcome = loop {
            if at >= read.len() {
                break Ok(());
            }
            match self.enqueue(&parts, &read.get_item(at)?, seq) {
                Ok(Some(admitted)) => {
                    seq += i64::from(admitted);
                    at += 1;
                }
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        if seq > first {
            state.setattr(intern!(py, "next_seq"), seq)?;
            let active = state.getattr(intern!(py, "_active"))?.add(seq - first)?;
            state.setattr(intern!(py, "_active"), active)?;
        }
        outcome.map(|()| at)
    }
}

impl Enqueuer {
    fn parts<'py>(&self, state: &Bound<'py, PyAny>) -> PyResult<Option<Parts<'py>>> {
        let py = state.py();
        let Some([in_order, others]) = self.ready.read(&state.getattr(intern!(py, "_ready"))?)
        else {
            return Ok(None);
        };
        Ok(Some(Parts {
            positions: state.getattr(intern!(py, "positions"))?.cast_into()?,
            entries: state.getattr(intern!(py, "entries"))?.cast_into()?,
            partitions: state.getattr(intern!(py, "_partitions"))?.cast_into()?,
            dirty: state.getattr(intern!(py, "dirty"))?.cast_into()?,
            in_order,
            others: others.cast_into()?,
            ev_next: state.getattr(intern!(py, "ev_next"))?,
        }))
    }

    /// Whether `item` joined the queue as message number `seq`; None, with nothing
    /// changed, when it is left to the caller.
    fn enqueue(&self, parts: &Parts, item: &Bound<PyAny>, seq: i64) -> PyResult<Option<bool>> {
        let py = item.py();
        let Some(slots) = self.entry.read(item) else {
            return Ok(None);
        };
        if !slots[EXPIRATION].is_none() || !slots[BARRIER].is(PyBool::new(py, false)) {
            return Ok(None);
        }
        let Some(id) = split(&slots[ID]) else {
            return Ok(None);
        };
        let Some(rank) = exact_int(&slots[RANK]) else {
            return Ok(None);
        };
        let Some(behind_last) = self.behind_last(parts, rank, seq)? else {
            return Ok(None);
        };
        if let Some(position) = parts.positions.get_item(&id.tp)? {
            if id.offset.lt(&position)? {
                return Ok(Some(false)); // read before
            }
        } else if id.value < 0 {
            return Ok(Some(false));
        }
        parts.positions.set_item(&id.tp, id.offset.add(1)?)?;
        let seq_object = seq.into_pyobject(py)?.into_any();
        // SAFETY: the layout was located on the class `read` checked `item` is.
        unsafe {
            replace(item, self.entry.at[SEQ], &seq_object);
            replace(item, self.entry.at[EV_POS], &parts.ev_next);
            replace(item, self.entry.at[DEADLINE], &py.None().into_bound(py));
        }
        let key = &slots[ID];
        parts.entries.set_item(key, item)?;
        let order = match parts.partitions.get_item(&id.tp)? {
            Some(order) => order,
            None => {
                let order = self.deque.bind(py).call0()?;
                parts.partitions.set_item(&id.tp, &order)?;
                order
            }
        };
        order.call_method1(
            intern!(py, "append"),
            (PyTuple::new(py, [&id.offset, &parts.ev_next])?,),
        )?;
        // SAFETY: as above.
        unsafe { replace(item, self.entry.at[STATUS], self.available.bind(py)) };
        if behind_last {
            parts
                .in_order
                .call_method1(intern!(py, "append"), (item,))?;
        } else {
            let order = (-rank).into_pyobject(py)?;
            let key = PyTuple::new(py, [order.as_any(), &seq_object, item])?;
            self.heappush.bind(py).call1((&parts.others, key))?;
        }
        parts.dirty.set_item(key, item)?;
        Ok(Some(true))
    }

    /// `ReadyQueue.push`'s choice: whether a message of `rank` and `seq` goes after the
    /// last in arrival order (else into the heap); None when that one is of another
    /// class or its rank or seq is not an exact integer.
    fn behind_last(&self, parts: &Parts, rank: i64, seq: i64) -> PyResult<Option<bool>> {
        let count = parts.in_order.len()?;
        if count == 0 {
            return Ok(Some(true));
        }
        let last = parts.in_order.get_item(count - 1)?;
        let Some(slots) = self.entry.read(&last) else {
            return Ok(None);
        };
        let (Some(last_rank), Some(last_seq)) = (exact_int(&slots[RANK]), exact_int(&slots[SEQ]))
        else {
            return Ok(None);
        };
        Ok(Some(
            last_rank > rank || (last_rank == rank && last_seq < seq),
        ))
    }
}

/// An exact int of 64 bits.
fn exact_int(value: &Bound<PyAny>) -> Option<i64> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    value.extract().ok()
}

/// (topic, partition) and the offset of an id that is a tuple of three with an exact
/// int of 64 bits for the offset.
fn split<'py>(id: &Bound<'py, PyAny>) -> Option<Id<'py>> {
    let id = id.cast_exact::<PyTuple>().ok()?;
    if id.len() != 3 {
        return None;
    }
    let offset = id.get_item(2).ok()?;
    let value = exact_int(&offset)?;
    let tp = PyTuple::new(id.py(), [id.get_item(0).ok()?, id.get_item(1).ok()?]).ok()?;
    Some(Id { tp, offset, value })
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<Enqueuer>()
}
