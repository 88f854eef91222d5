"""Freed memory handed back to the system once a burst of large records is over.

glibc keeps what Python and librdkafka free for later use instead of returning it: a
worker that applied 300 MB of 200 KB records sat at about 1.4 GiB resident, idle, with
22 MiB of live Python objects (malloc_trim brought it to 236 MiB). The worker's loop,
when a turn finds nothing to apply, trims once its resident size has grown SLACK beyond
what it was after the last trim: the hot path pays nothing, and a steady worker never
trims.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

SLACK = 128 * 1024 * 1024  # bytes of growth of the resident size before a trim


def release_freed_memory() -> None:
    """glibc's malloc_trim(0): return the free memory of every malloc arena to the
    system (not a leak: what glibc keeps for later). Nothing where libc has none."""
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)


def resident_bytes() -> int | None:
    """This process's resident size (Linux's /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class IdleTrim:
    """Trims at an idle turn of the worker's loop once the resident size grew SLACK
    beyond what it was after the last trim (or at the first idle turn)."""

    def __init__(self, slack: int = SLACK) -> None:
        self.slack = slack
        self.floor: int | None = None
        self.trims = 0

    def idle(self) -> None:
        resident = resident_bytes()
        if resident is None:
            return
        if self.floor is None:
            self.floor = resident
        elif resident > self.floor + self.slack:
            release_freed_memory()
            self.trims += 1
            self.floor = resident_bytes() or resident
