"""Freed memory handed back to the system once a burst of large records is over.

glibc keeps what Python and librdkafka free for later use instead of returning it: a
worker that applied 300 MB of 200 KB records sat at about 1.4 GiB resident, idle, with
22 MiB of live Python objects (malloc_trim brought it to 236 MiB). A Kafka outage under
a publish storm leaves the same behind once the worker has applied the publishes that
Kafka took after it: 158 MiB resident, 106 MiB after a trim (bench robustness, the SOW
target; the gateway's own trim, when its publish budget empties, comes before that
apply). So the worker's loop, when a turn finds nothing to apply after turns that
applied records, trims once its resident size is SLACK above its low mark (IdleTrim):
the hot path pays nothing, and an idle worker never trims.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import time
from collections.abc import Callable

SLACK = 32 * 1024 * 1024  # bytes of growth of the resident size before a trim
INTERVAL = 5.0  # seconds between two trims at least


def release_freed_memory() -> None:
    """glibc's malloc_trim(0): return the free memory of every malloc arena to the
    system (not a leak: what glibc keeps for later). Nothing where libc has none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """Looked up once: find_library may run ldconfig in a subprocess, and the worker's
    loop trims on its own thread."""
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None


def resident_bytes() -> int | None:
    """This process's resident size (Linux's /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class IdleTrim:
    """Trims at an idle turn of the worker's loop that follows applied records, once the
    resident size is SLACK above the lowest it was after a trim (or at the first idle
    turn): at once when it also grew SLACK since the last trim, else at most every
    INTERVAL seconds. The low mark never rises: a trim at an outage's peak (the gateway
    holding its whole budget) must not hide what the apply after it frees. A worker whose
    state keeps it above the mark trims at most every INTERVAL while records arrive (a
    trim walks glibc's free lists: 34 ms over 300 MB of freed small blocks), never while
    nothing arrives."""

    def __init__(self, slack: int = SLACK, interval: float = INTERVAL) -> None:
        self.slack = slack
        self.interval = interval
        self.low: int | None = None  # the lowest resident size after a trim
        self.trims = 0
        self._after_last = 0  # the resident size after the last trim
        self._applied = False  # records applied since the last trim
        self._last = -math.inf  # time.monotonic() of the last trim

    def mark(self) -> None:
        """The low mark, if none is set yet: the resident size as the worker is assigned
        its partitions, before their records arrive (with a wait of up to a quarter
        second a turn, a burst published at once may come before any idle turn)."""
        resident = resident_bytes() if self.low is None else None
        if resident is not None:
            self.low = self._after_last = resident

    def applied(self) -> None:
        """The loop applied records: what they held may be freed by now."""
        self._applied = True

    def idle(self) -> None:
        if self.low is not None and not self._applied:
            return
        resident = resident_bytes()
        if resident is None:
            return
        if self.low is None:
            self.low = self._after_last = resident
        elif resident > self.low + self.slack and self._due(resident):
            release_freed_memory()
            self.trims += 1
            self._applied = False
            self._last = time.monotonic()
            self._after_last = resident_bytes() or resident
            self.low = min(self.low, self._after_last)

    def _due(self, resident: int) -> bool:
        """A burst (SLACK more than after the last trim) trims at once, else each INTERVAL."""
        grew = resident > self._after_last + self.slack
        return grew or time.monotonic() - self._last >= self.interval
