//! A queue's dispatch in one call: the common case of `Delivering.dispatch`
//! (`amps_on_kafka/state/queue_delivery.py`), available messages in arrival order
//! handed to subscriptions that want everything, by the fairness `fast` or
//! `proportional`, each leased, in a queue that records no delivery (not at-most-once,
//! no MaxDeliveries) and has nothing parked.
//!
//! Per message the twin pops the ready queue, chooses the subscription (`_choose`,
//! `_most_room`), leases the message to it (`_deliver`: the counts, the holder, the
//! lease's end, the leases' dicts) and makes a `Delivery`: about 1.5 us a message, on
//! whichever thread frees the room (the gateway's, for acks). Here the same changes are
//! made on the same structures in the same order. The call stops where the twin's loop
//! must go on: a message out of arrival order waiting in the ready queue's heap, or one
//! of another class; the caller's loop (`dispatch`) continues from there with the same
//! open subscriptions and the same clock reading.
//!
//! What a call can do once it does once (the same values the twin writes a message): the
//! lease's end is one integer for the call's messages, a subscription's dict of leases is
//! looked up at its first delivery, and its `outstanding` is counted here and written to
//! its slot when it fills or the call ends.
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyType};

use crate::queue_messages::Layout;
use crate::records::{allocate, put, replace};

/// Leases available messages to open subscriptions of a `QueueState`.
#[pyclass(frozen, module = "amps_on_kafka_native")]
struct Dispatcher {
    entry: Layout<5>,
    subscription: Layout<2>,
    ready: Layout<2>,
    delivery: Layout<3>,
    available: Py<PyAny>,
    leased: Py<PyAny>,
}

/// What a call reads from the state once.
struct Parts<'py> {
    in_order: Bound<'py, PyAny>,
    popleft: Bound<'py, PyAny>,
    others: Bound<'py, PyList>,
    leased_by: Bound<'py, PyDict>,
    leases: Bound<'py, PyAny>,
    deliveries: Bound<'py, PyList>,
    /// `now + lease_ms`: every lease of the call ends then.
    until: Bound<'py, PyAny>,
    fast: bool,
}

/// An open subscription: the object and its counts.
struct Open<'py> {
    subscription: Bound<'py, PyAny>,
    outstanding: i64,
    max_backlog: i64,
    /// `outstanding` as the subscription's slot holds it.
    written: i64,
    /// Its dict in the state's `_leased`, once looked up.
    leases: Option<Bound<'py, PyAny>>,
}

impl Open<'_> {
    /// The subscription's slot `at` (its `outstanding`) set to the count, if it moved.
    fn write(&mut self, at: isize) -> PyResult<()> {
        if self.outstanding != self.written {
            let outstanding = self.outstanding.into_pyobject(self.subscription.py())?;
            // SAFETY: `open` read the slot `at` on the class whose layout was located.
            unsafe { replace(&self.subscription, at, outstanding.as_any()) };
            self.written = self.outstanding;
        }
        Ok(())
    }
}

#[pymethods]
impl Dispatcher {
    /// QueueEntry, Subscription, ReadyQueue and Delivery (classes with slots),
    /// Status.AVAILABLE and Status.LEASED.
    #[new]
    fn new(
        entry: &Bound<PyType>,
        subscription: &Bound<PyType>,
        ready: &Bound<PyType>,
        delivery: &Bound<PyType>,
        members: (Py<PyAny>, Py<PyAny>),
    ) -> PyResult<Self> {
        let (available, leased) = members;
        Ok(Self {
            entry: Layout::new(
                entry,
                ["id", "status", "holder", "deliveries", "lease_until"],
            )?,
            subscription: Layout::new(subscription, ["outstanding", "max_backlog"])?,
            ready: Layout::new(ready, ["_in_order", "_others"])?,
            delivery: Layout::new(delivery, ["subscription", "entry", "lease_until"])?,
            available,
            leased,
        })
    }

    /// Dispatches on `state` to `open_subs` (those with room, in order; it takes out
    /// those it fills) at `now` (ms) until the ready queue is empty, no subscription
    /// has room, or the next message is one it leaves to the caller's loop.
    fn run(
        &self,
        state: &Bound<PyAny>,
        open_subs: &Bound<PyList>,
        now: &Bound<PyAny>,
    ) -> PyResult<()> {
        let Some(mut open) = self.open(open_subs) else {
            return Ok(());
        };
        let Some(parts) = self.parts(state, now)? else {
            return Ok(());
        };
        let outcome = self.lease(&parts, &mut open, open_subs);
        for left in &mut open {
            left.write(self.subscription.at[0])?;
        }
        outcome
    }
}

impl Dispatcher {
    /// The loop of `run`: leases messages until it must stop. A subscription that
    /// fills has its count written as it leaves `open`; the caller writes the others'.
    fn lease<'py>(
        &self,
        parts: &Parts<'py>,
        open: &mut Vec<Open<'py>>,
        open_subs: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let available = self.available.bind(open_subs.py());
        while !open.is_empty() && parts.others.is_empty() && parts.in_order.len()? > 0 {
            let entry = parts.in_order.get_item(0)?;
            let Some([id, status, _, deliveries, _]) = self.entry.read(&entry) else {
                break;
            };
            if !deliveries.is_exact_instance_of::<PyInt>() {
                break;
            }
            parts.popleft.call0()?;
            if !status.is(available) {
                continue; // removed while it waited to be delivered
            }
            let chosen = if parts.fast { 0 } else { most_room(open) };
            self.deliver(parts, &entry, &id, &deliveries, &mut open[chosen])?;
            if open[chosen].outstanding >= open[chosen].max_backlog {
                let mut full = open.remove(chosen);
                full.write(self.subscription.at[0])?;
                let at = open_subs.index(&full.subscription)?;
                open_subs.del_item(at)?;
            }
        }
        Ok(())
    }

    /// The open subscriptions' counts, or None when one is of another class or its
    /// counts are not exact integers of 64 bits.
    fn open<'py>(&self, open_subs: &Bound<'py, PyList>) -> Option<Vec<Open<'py>>> {
        let mut open = Vec::with_capacity(open_subs.len());
        for subscription in open_subs.iter() {
            let [outstanding, max_backlog] = self.subscription.read(&subscription)?;
            if !outstanding.is_exact_instance_of::<PyInt>()
                || !max_backlog.is_exact_instance_of::<PyInt>()
            {
                return None;
            }
            let outstanding = outstanding.extract().ok()?;
            open.push(Open {
                outstanding,
                written: outstanding,
                max_backlog: max_backlog.extract().ok()?,
                leases: None,
                subscription,
            });
        }
        Some(open)
    }

    fn parts<'py>(
        &self,
        state: &Bound<'py, PyAny>,
        now: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Parts<'py>>> {
        let py = state.py();
        let policy = state.getattr(intern!(py, "policy"))?;
        let Some([in_order, others]) = self.ready.read(&state.getattr(intern!(py, "_ready"))?)
        else {
            return Ok(None);
        };
        if !now.is_exact_instance_of::<PyInt>() {
            return Ok(None);
        }
        let (Ok(lease_ms), Ok(now)) = (
            policy.getattr(intern!(py, "lease_ms"))?.extract::<i64>(),
            now.extract::<i64>(),
        ) else {
            return Ok(None);
        };
        let Some(until) = now.checked_add(lease_ms) else {
            return Ok(None);
        };
        let fairness = policy.getattr(intern!(py, "fairness"))?;
        Ok(Some(Parts {
            popleft: in_order.getattr(intern!(py, "popleft"))?,
            in_order,
            others: others.cast_into()?,
            leased_by: state.getattr(intern!(py, "_leased"))?.cast_into()?,
            leases: state.getattr(intern!(py, "_leases"))?,
            deliveries: state
                .getattr(intern!(py, "outbox"))?
                .getattr(intern!(py, "deliveries"))?
                .cast_into()?,
            until: until.into_pyobject(py)?.into_any(),
            fast: fairness.eq("fast")?,
        }))
    }

    /// `_deliver` when the queue records no delivery: the message leased to `open`
    /// (its `outstanding` counted, written by the caller).
    fn deliver<'py>(
        &self,
        parts: &Parts<'py>,
        entry: &Bound<'py, PyAny>,
        id: &Bound<'py, PyAny>,
        deliveries: &Bound<'py, PyAny>,
        open: &mut Open<'py>,
    ) -> PyResult<()> {
        let py = entry.py();
        let until = &parts.until;
        let deliveries = deliveries.add(1)?;
        open.outstanding += 1;
        let subscription = &open.subscription;
        // SAFETY: the layouts were located on the classes `read` checked these are.
        unsafe {
            replace(entry, self.entry.at[3], &deliveries);
            replace(entry, self.entry.at[2], subscription);
        }
        let leases = match &open.leases {
            Some(leases) => leases,
            None => open
                .leases
                .insert(parts.leased_by.as_any().get_item(subscription)?),
        };
        leases.set_item(id, entry)?;
        // SAFETY: as above.
        unsafe { replace(entry, self.entry.at[4], until) };
        parts.leases.set_item(id, entry)?;
        // SAFETY: as above.
        unsafe { replace(entry, self.entry.at[1], self.leased.bind(py)) };
        let delivery = allocate(self.delivery.cls.bind(py))?;
        // SAFETY: a fresh instance of the class whose slots were located, each unset.
        unsafe {
            put(&delivery, self.delivery.at[0], subscription);
            put(&delivery, self.delivery.at[1], entry);
            put(&delivery, self.delivery.at[2], until);
        }
        parts.deliveries.append(delivery)
    }
}

/// `_most_room` when every open subscription wants the message: the lowest
/// outstanding / max_backlog, the first found on a tie.
fn most_room(open: &[Open]) -> usize {
    let mut best = 0;
    for (at, candidate) in open.iter().enumerate().skip(1) {
        let (b, c) = (&open[best], candidate);
        if (c.outstanding as i128) * (b.max_backlog as i128)
            < (b.outstanding as i128) * (c.max_backlog as i128)
        {
            best = at;
        }
    }
    best
}

pub fn register(m: &Bound<PyModule>) -> PyResult<()> {
    m.add_class::<Dispatcher>()
}
