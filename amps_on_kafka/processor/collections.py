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
