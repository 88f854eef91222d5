"""Waiting for a condition that another thread or process brings about without an event
to wait on (a worker's counter, a broker's view, a port that frees its places)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(
    condition: Callable[[], T], what: str = "it", timeout: float = 30.0, interval: float = 0.05
) -> T:
    """The condition's first true outcome, asked every `interval` up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = condition()
        if outcome:
            return outcome
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached after {timeout}s")
        time.sleep(interval)
