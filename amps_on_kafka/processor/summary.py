"""The worker's periodic summary line: that it is alive, and how it is doing.

A worker that runs fine logs almost nothing, so its log alone can't tell a quiet worker
from a stuck one. Every Worker.SummaryEvery the process logs one INFO line with the rates
since the previous line (records applied, records refused, dead letters Kafka did not
take), the lag of its partitions now, its gateway sessions and whether Kafka is reachable.
The line's numbers are also its JSON context fields (`--log-format json`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from amps_on_kafka.processor.worker import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Totals:
    """The worker's counters since start, at one moment."""

    at: float  # time.monotonic()
    applied: int
    rejected: int
    dead_letter_failures: int


class Summary:
    """Call `tick()` often (the worker command does, twice a second): it logs when due."""

    def __init__(
        self,
        worker: Worker,
        sessions: Callable[[], int] | None = None,
        every: float | None = None,
    ) -> None:
        self.worker = worker
        self.sessions = sessions
        self.every = worker.config.worker.summary_every if every is None else every
        self._last = self._totals()

    def tick(self) -> None:
        if time.monotonic() - self._last.at >= self.every:
            self.log_now()

    def log_now(self) -> None:
        now = self._totals()
        seconds = max(now.at - self._last.at, 1e-9)
        lag = self.worker.lag()
        context = {
            "event": "summary",
            "seconds": round(seconds, 1),
            "applied": now.applied - self._last.applied,
            "applied_per_second": round((now.applied - self._last.applied) / seconds, 1),
            "lag": sum(lag.values()),
            "partitions": len(lag),
            "skipped": now.rejected - self._last.rejected,
            "dead_letter_failures": now.dead_letter_failures - self._last.dead_letter_failures,
        }
        if self.sessions is not None:
            context["sessions"] = self.sessions()
        down = self.worker.outage.down_since
        context["kafka_down_seconds"] = None if down is None else round(now.at - down)
        self._last = now
        log.info(_text(context), extra=context)

    def _totals(self) -> Totals:
        worker = self.worker
        return Totals(
            time.monotonic(),
            worker.applied,
            sum(worker.rejected.values()),
            worker.dead_letter_failures,
        )


def _text(context: dict) -> str:
    parts = [
        f"applied {context['applied']} records in {context['seconds']:g} s "
        f"({context['applied_per_second']:g}/s)",
        f"lag {context['lag']} over {context['partitions']} partitions",
    ]
    if "sessions" in context:
        parts.append(f"{context['sessions']} sessions")
    parts.append(
        f"errors: {context['skipped']} skipped, "
        f"{context['dead_letter_failures']} dead letters not written"
    )
    down = context["kafka_down_seconds"]
    parts.append("Kafka reachable" if down is None else f"Kafka unreachable for {down} s")
    return "summary: " + ", ".join(parts)
