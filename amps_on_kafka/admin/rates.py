"""The recent past for the status page: totals sampled every second, kept for minutes.

Prometheus keeps history for those who run it; the status page must show some without
it, so a thread samples the admin view every SAMPLE_EVERY seconds into a ring of
HISTORY samples (5 minutes: a bounded few hundred small dicts), and /admin/rates turns
consecutive samples into rates.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SAMPLE_EVERY = 1.0  # seconds
HISTORY = 300  # samples kept
TOTALS = ("applied", "frames_in", "frames_out", "bytes_in", "bytes_out")  # shown per second


def sample(view: dict[str, Any], at: float) -> dict[str, float]:
    """The numbers the status page charts, from one admin view."""
    gateway = view["gateway"] or {}
    return {
        "t": at,
        "applied": view["worker"]["applied"],
        "lag": sum(topic["lag"] for topic in view["sow_topics"]),
        "queue_depth": sum(queue["depth"] for queue in view["queues"]),
        "sessions": gateway.get("sessions", 0),
        **{name: gateway.get(name, 0) for name in TOTALS if name != "applied"},
    }


def rates(samples: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per pair of consecutive samples: the totals' rates per second, the gauges as of
    the later one."""
    points = []
    for before, after in itertools.pairwise(samples):
        seconds = max(after["t"] - before["t"], 1e-6)
        point = {k: v for k, v in after.items() if k not in TOTALS}
        for name in TOTALS:
            point[f"{name}_per_second"] = round((after[name] - before[name]) / seconds, 1)
        points.append(point)
    return points


class RateHistory:
    """Samples `view()` on a daemon thread until stopped."""

    def __init__(
        self, view: Callable[[], dict[str, Any]], every: float = SAMPLE_EVERY, size: int = HISTORY
    ) -> None:
        self.view = view
        self.every = every
        self._samples: deque[dict[str, float]] = deque(maxlen=size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="amps-admin-rates", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def points(self) -> list[dict[str, float]]:
        return rates(list(self._samples))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._samples.append(sample(self.view(), time.time()))
            except Exception as exc:  # a gateway stopping meanwhile: the next one will do
                log.debug("admin: sampling rates failed: %s", exc)
            self._stop.wait(self.every)
