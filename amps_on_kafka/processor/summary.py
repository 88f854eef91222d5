"""The worker's periodic summary line: that it is alive, and how it is doing.

A worker that runs fine logs almost nothing, so its log alone can't tell a quiet worker
from a stuck one. Every Worker.SummaryEvery the process logs one INFO line with the rates
since the previous line (records applied; errors: records refused, dead letters Kafka did
not take, slow consumers disconnected, connections refused), the lag of its partitions
now, its gateway sessions and whether Kafka is reachable. The line's numbers are also its
JSON context fields (`--log-format json`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from amps_on_kafka.processor.worker import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayCounts:
    """What the summary reads of the gateway (processor/ doesn't import server/)."""

    sessions: int  # connections open now
    slow_consumers: int  # disconnected for MaxQueuedBytes, since start
    refused: int  # connections refused beyond MaxConnections, since start


_NO_GATEWAY = GatewayCounts(0, 0, 0)


@dataclass(frozen=True)
class Totals:
    """The counters since start, at one moment."""

    at: float  # time.monotonic()
    applied: int
    rejected: int
    dead_letter_failures: int
    gateway: GatewayCounts


class Summary:
    """`start()` logs the line every `every` seconds on a thread of its own; `log_now()`
    logs it at once."""

    def __init__(
        self,
        worker: Worker,
        gateway: Callable[[], GatewayCounts] | None = None,
        every: float | None = None,
    ) -> None:
        self.worker = worker
        self.gateway = gateway
        self.every = worker.config.worker.summary_every if every is None else every
        self._last = self._totals()

    def start(self, stopping: threading.Event) -> None:
        """Until `stopping` is set. Not on the main thread: the worker command's signal
        handler raises there, and a raise inside a log call is swallowed by logging,
        which prints "--- Logging error ---" and a traceback instead of the line."""
        thread = threading.Thread(
            target=self._run, args=(stopping,), name="amps-summary", daemon=True
        )
        thread.start()

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.every):
            try:
                self.log_now()
            except Exception:  # a bug: say so, and keep the worker and the next lines
                log.exception("the summary line failed")

    def log_now(self) -> None:
        now, last = self._totals(), self._last
        seconds = max(now.at - last.at, 1e-9)
        lag = self.worker.lag()
        down = self.worker.outage.down_since
        context = {
            "event": "summary",
            "seconds": round(seconds, 1),
            "applied": now.applied - last.applied,
            "applied_per_second": round((now.applied - last.applied) / seconds, 1),
            "lag": sum(lag.values()),
            "partitions": len(lag),
            "sessions": now.gateway.sessions,
            "skipped": now.rejected - last.rejected,
            "dead_letter_failures": now.dead_letter_failures - last.dead_letter_failures,
            "slow_consumers": now.gateway.slow_consumers - last.gateway.slow_consumers,
            "refused_connections": now.gateway.refused - last.gateway.refused,
            "kafka_down_seconds": None if down is None else round(now.at - down),
        }
        self._last = now
        log.info(_text(context), extra=context)

    def _totals(self) -> Totals:
        worker = self.worker
        return Totals(
            time.monotonic(),
            worker.applied,
            sum(worker.rejected.values()),
            worker.dead_letter_failures,
            self.gateway() if self.gateway is not None else _NO_GATEWAY,
        )


def _text(context: dict) -> str:
    down = context["kafka_down_seconds"]
    return (
        f"summary: applied {context['applied']} records in {context['seconds']:g} s "
        f"({context['applied_per_second']:g}/s), lag {context['lag']} over "
        f"{context['partitions']} partitions, {context['sessions']} sessions, errors: "
        f"{context['skipped']} skipped, {context['dead_letter_failures']} dead letters not "
        f"written, {context['slow_consumers']} slow consumers disconnected, "
        f"{context['refused_connections']} connections refused, "
        + ("Kafka reachable" if down is None else f"Kafka unreachable for {down} s")
    )
