"""Cyclic garbage collection held off while a batch is applied.

Applying a batch of 5,000 records allocates some 40,000 short-lived objects (payload
dicts, messages, records, changes), none of them in reference cycles: reference counting
frees them all once the batch is written. With the collector on, they live long enough
to be promoted, and the young generations fill so fast that CPython runs a full
collection every batch or two, scanning every object of the process. Measured on the SOW
apply benchmark, that was a third of the worker's time. Paused for the batch and resumed
after, the collector finds the batch's objects already freed.

The worker consumes inside the pause too, so the consumed records (tracked by the
collector) are also freed before it resumes. Nothing is left uncollected: the collector
counts objects allocated and not yet freed, so cyclic garbage made meanwhile (by any
thread) still triggers a collection once the pause ends.

The pause is process-wide (the gc module has no other kind), so it nests: several workers
in one process keep it off until the last batch in flight ends, and a process that
turned the collector off itself keeps it off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_resume = False


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
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
