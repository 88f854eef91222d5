"""The gateway's counters, kept in plain ints on the event loop.

Every frame and publish passes here, so counting must cost next to nothing: an int add
per frame, a bisect per latency. Nothing here knows Prometheus; the admin port
(amps_on_kafka/admin/) reads these at scrape time and turns them into metrics.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Seconds: from a millisecond (a publish acked by a local broker) to PublishTimeout's scale.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Latencies:
    """A histogram of durations: a count per bucket (the last one past every bound) and
    the sum. Written by one thread (the event loop); read by the scraper, which may see
    one observation half-counted: a scrape is a moment, not a transaction."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        """`times` observations of `seconds` (a batch of publishes persisted together)."""
        self.counts[bisect_left(self.bounds, seconds)] += times
        self.sum += seconds * times

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with +Inf."""
        total, result = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            result.append((bound, total))
        return result


@dataclass
class Traffic:
    """Frames and bytes of a connection (or of the closed ones, summed)."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def add(self, other: Traffic) -> None:
        self.frames_in += other.frames_in
        self.frames_out += other.frames_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out


@dataclass
class GatewayStats:
    """Since the gateway started. Live connections count their own Traffic; a closed one
    adds its Traffic to `closed` (server/gateway.py `forget`)."""

    connections: int = 0  # accepted
    refused: int = 0  # beyond MaxConnections
    slow_consumers: int = 0  # disconnected: MaxQueuedBytes, or MaxBufferedBytes in all
    producer_replacements: int = 0  # shared producers replaced after a fatal error
    closed: Traffic = field(default_factory=Traffic)
    publish_latency: Latencies = field(default_factory=Latencies)  # to the persisted ack
    query_latency: Latencies = field(default_factory=Latencies)  # to the group_end
