"""Cyclic garbage collection held off while a batch is applied.

Applying a batch of 5,000 records allocates some 40,000 short-lived objects (payload
dicts, messages, records, changes), none of them in reference cycles: reference counting
frees them all once the batch is written. With the collector on, they live long enough
to be promoted, and the young generations fill so fast that CPython runs a full
collection every batch or two, scanning every object of the process. Measured on the SOW
apply benchmark, that was a third of the worker's time. Paused for the batch and resumed
after, the collector finds the batch's objects already freed.

The worker consumes inside the pause too, so the consumed records (tracked by the
collector) are also freed before it resumes. Cyclic garbage made meanwhile, by any
thread, is still collected: the collector counts objects allocated and not yet freed,
so real garbage triggers a collection once the pause ends.

The pause is process-wide (the gc module has no other kind), so it nests: several
threads (the SOW worker, each queue) keep it off until the last of their batches ends,
and a process that turned the collector off itself keeps it off. Because those threads
spend most of their time inside a pause, the collector could stay off for good in a
busy process; so a pause that ends while others go on runs a full collection when none
has had a chance for COLLECT_EVERY seconds.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

COLLECT_EVERY = 10.0  # seconds the collector may stay off while pauses overlap

_lock = threading.Lock()
_depth = 0
_resume = False
_resumed_at = time.monotonic()  # when the collector last ran or could run


@contextmanager
def collections_paused() -> Iterator[None]:
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        if _end_pause():
            gc.collect()  # outside the lock: finalizers may pause again


def _end_pause() -> bool:
    """Whether the collector is overdue and this pause must run it."""
    global _depth, _resumed_at
    with _lock:
        _depth -= 1
        if not _resume:
            return False
        now = time.monotonic()
        if _depth == 0:
            gc.enable()
            _resumed_at = now
            return False
        if now - _resumed_at < COLLECT_EVERY:
            return False
        _resumed_at = now
        return True


RELEASE_SLICE = 2_000  # items freed by one C call (well under a millisecond of GIL)


def let_go(items: list) -> None:
    """Empty `items` a slice at a time, from its end (no items move).

    Dropping the last reference to a list of half a million tuples (a large query's rows
    and sort keys) frees them all in one C call, which holds the GIL for 0.1-0.3 s: no
    other thread runs, the gateway's event loop included. Freed a slice at a time, the
    other threads get their turn between slices.
    """
    while items:
        del items[-RELEASE_SLICE:]


def freeze_long_lived() -> None:
    """Leave every object alive now out of the collector's full passes (gc.freeze).

    Called once by the worker command when the worker and its gateway have started:
    what they hold then (modules, config, clients, compiled filters: some 45,000 objects)
    lives as long as the process, and each full pass walked all of it with the GIL held.
    Garbage is collected first, since a frozen cycle is never freed. A library never
    calls this: an application embedding a worker decides for its own objects.
    """
    gc.collect()
    gc.freeze()
