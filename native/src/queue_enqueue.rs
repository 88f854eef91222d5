//! Messages read from the log admitted to a queue in one call: the common case of
//! `QueueState.enqueue` (`amps_on_kafka/state/queue.py`, through `enqueue_read`), a
//! queue with no Priority, no barrier, no TargetQueueDepth, no Expiration and no ack
//! that came early, and a message with no expiration of its own.
//!
//! Per message the twin reads the id, moves the partition's position, numbers the
//! message, notes it in the entries, the partition's arrivals (its offset) and the
//! dirty set, and makes it available (`_admit`, `_activate`, `_place`,
//! `_make_available`, `ReadyQueue.push`): about 1.5 us a message on the queue's thread.
//! Here the same changes are made on the same structures in the same order. The call
//! stops at an item it leaves to the twin (a position read past, a message of another
//! class or with an expiration or a barrier flag), which the caller's loop handles
//! before calling again. `first_queued` is the recovery point's walk of the arrivals.
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple, PyType};

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

/// A message's id taken apart: topic, partition and offset, and their values.
struct Id<'py> {
    topic: Bound<'py, PyString>,
    partition: Bound<'py, PyAny>,
    partition_value: i64,
    offset: Bound<'py, PyAny>,
    value: i64,
}

/// The partition of the messages a call is admitting, kept from one message to the next
/// (a batch is mostly runs of one partition's): its position, moved here, and its new
/// arrivals, written to `positions` and added to its deque once the call ends or reaches
/// another partition (`Enqueuer::settle`). Per message the twin hashes its (topic,
/// partition) three times, makes the next position's int and appends to the deque (a
/// call that makes a tuple of its argument here: no vectorcall in Python 3.11's
/// limited API).
struct Current<'py> {
    topic: Bound<'py, PyString>,
    partition: i64,
    tp: Bound<'py, PyTuple>,
    /// The next offset to read, None while `positions` has none (the twin reads 0).
    position: Option<i64>,
    moved: bool,
    /// The partition's arrivals (a deque), once it has some.
    order: Option<Bound<'py, PyAny>>,
    /// Offsets arrived since, to add to `order`.
    arrived: Vec<Bound<'py, PyAny>>,
}

/// What a call has changed but not yet written to the state's structures: its
/// partition's, and the messages made available in arrival order, to add to the ready
/// queue's deque (with the rank and seq of the last, which the next one is placed by).
#[derive(Default)]
struct Unwritten<'py> {
    current: Option<Current<'py>>,
    available: Vec<Bound<'py, PyAny>>,
    last: (i64, i64),
}

impl Current<'_> {
    fn holds(&self, id: &Id) -> bool {
        self.partition == id.partition_value
            && (self.topic.is(&id.topic) || self.topic.as_any().eq(&id.topic).unwrap_or(false))
    }
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
        let mut unwritten = Unwritten::default();
        let outcome = loop {
            if at >= read.len() {
                break Ok(());
            }
            match self.enqueue(&parts, &mut unwritten, &read.get_item(at)?, seq) {
                Ok(Some(admitted)) => {
                    seq += i64::from(admitted);
                    at += 1;
                }
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        let settled = Self::settle(&parts, unwritten.current.take()).and_then(|()| {
            if unwritten.available.is_empty() {
                return Ok(());
            }
            let available = PyList::new(py, unwritten.available)?;
            parts
                .in_order
                .call_method1(intern!(py, "extend"), (available,))
                .map(drop)
        });
        if seq > first {
            state.setattr(intern!(py, "next_seq"), seq)?;
            let active = state.getattr(intern!(py, "_active"))?.add(seq - first)?;
            state.setattr(intern!(py, "_active"), active)?;
        }
        outcome.and(settled).map(|()| at)
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

    /// The partition's position written to `positions`, if a message moved it, and its
    /// new arrivals added to its deque.
    fn settle(parts: &Parts, current: Option<Current>) -> PyResult<()> {
        let Some(current) = current else {
            return Ok(());
        };
        if let (Some(position), true) = (current.position, current.moved) {
            parts.positions.set_item(&current.tp, position)?;
        }
        match current.order {
            Some(order) if !current.arrived.is_empty() => {
                let arrived = PyList::new(order.py(), current.arrived)?;
                order.call_method1(intern!(order.py(), "extend"), (arrived,))?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The partition of `id` as `current`, the one before it settled; false, with
    /// nothing changed, when its position is not an int of 64 bits (left to the twin).
    fn enter<'py>(
        parts: &Parts<'py>,
        current: &mut Option<Current<'py>>,
        id: &Id<'py>,
    ) -> PyResult<bool> {
        if current.as_ref().is_some_and(|c| c.holds(id)) {
            return Ok(true);
        }
        let py = id.topic.py();
        let tp = PyTuple::new(py, [id.topic.as_any(), &id.partition])?;
        let position = match parts.positions.get_item(&tp)? {
            None => None,
            Some(position) => match exact_int(&position) {
                Some(value) => Some(value),
                None => return Ok(false),
            },
        };
        let order = parts.partitions.get_item(&tp)?;
        Self::settle(parts, current.take())?;
        *current = Some(Current {
            topic: id.topic.clone(),
            partition: id.partition_value,
            tp,
            position,
            moved: false,
            order,
            arrived: Vec::new(),
        });
        Ok(true)
    }

    /// Whether `item` joined the queue as message number `seq`; None, with nothing
    /// changed, when it is left to the caller.
    fn enqueue<'py>(
        &self,
        parts: &Parts<'py>,
        unwritten: &mut Unwritten<'py>,
        item: &Bound<'py, PyAny>,
        seq: i64,
    ) -> PyResult<Option<bool>> {
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
        let Some(behind_last) = self.behind_last(parts, unwritten, rank, seq)? else {
            return Ok(None);
        };
        let Some(next) = id.value.checked_add(1) else {
            return Ok(None);
        };
        if !Self::enter(parts, &mut unwritten.current, &id)? {
            return Ok(None);
        }
        let Some(partition) = unwritten.current.as_mut() else {
            return Ok(None); // `enter` set it
        };
        if id.value < partition.position.unwrap_or(0) {
            return Ok(Some(false)); // read before
        }
        partition.position = Some(next);
        partition.moved = true;
        let seq_object = seq.into_pyobject(py)?.into_any();
        // SAFETY: the layout was located on the class `read` checked `item` is.
        unsafe {
            replace(item, self.entry.at[SEQ], &seq_object);
            replace(item, self.entry.at[EV_POS], &parts.ev_next);
            replace(item, self.entry.at[DEADLINE], &py.None().into_bound(py));
        }
        let key = &slots[ID];
        parts.entries.set_item(key, item)?;
        if partition.order.is_none() {
            let order = self.deque.bind(py).call0()?;
            parts.partitions.set_item(&partition.tp, &order)?;
            partition.order = Some(order);
        }
        partition.arrived.push(id.offset);
        // SAFETY: as above.
        unsafe { replace(item, self.entry.at[STATUS], self.available.bind(py)) };
        if behind_last {
            unwritten.available.push(item.clone());
            unwritten.last = (rank, seq);
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
    fn behind_last(
        &self,
        parts: &Parts,
        unwritten: &Unwritten,
        rank: i64,
        seq: i64,
    ) -> PyResult<Option<bool>> {
        if !unwritten.available.is_empty() {
            let (last_rank, last_seq) = unwritten.last;
            return Ok(Some(
                last_rank > rank || (last_rank == rank && last_seq < seq),
            ));
        }
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

/// The parts of an id that is a tuple of three: an exact str for the topic and exact
/// ints of 64 bits for the partition and the offset.
fn split<'py>(id: &Bound<'py, PyAny>) -> Option<Id<'py>> {
    let id = id.cast_exact::<PyTuple>().ok()?;
    if id.len() != 3 {
        return None;
    }
    let topic = id.get_item(0).ok()?.cast_into_exact::<PyString>().ok()?;
    let partition = id.get_item(1).ok()?;
    let partition_value = exact_int(&partition)?;
    let offset = id.get_item(2).ok()?;
    let value = exact_int(&offset)?;
    Some(Id {
        topic,
        partition,
        partition_value,
        offset,
        value,
    })
}

/// `QueueState.recovery_point`'s walk of one partition (the twin: `_first_queued` in
/// `amps_on_kafka/state/queue.py`): the offsets at the front of `order` (the partition's
/// arrivals) whose message is no longer in `entries` are dropped, and the message at
/// the first offset still there is returned (None once `order` is empty). Every
/// message removed passes here once, after its removal: in Python, a tuple made and
/// hashed and a `popleft` a message, ~0.3 us of the queue's thread.
#[pyfunction]
fn first_queued<'py>(
    order: &Bound<'py, PyAny>,
    entries: &Bound<'py, PyDict>,
    topic: &Bound<'py, PyAny>,
    partition: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = order.py();
    while order.is_truthy()? {
        let offset = order.get_item(0)?;
        let id = PyTuple::new(py, [topic, partition, &offset])?;
        if let Some(entry) = entries.get_item(&id)? {
            return Ok(Some(entry));
        }
        order.call_method0(intern!(py, "popleft"))?;
    }
    Ok(None)
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<Enqueuer>()?;
    m.add_function(wrap_pyfunction!(first_queued, m)?)
}
