"""Prometheus metrics, read from the admin view at scrape time.

The worker, gateway and queues count in plain Python ints (an add per record or frame);
this collector turns one admin view into metric families when Prometheus scrapes, so
metrics cost nothing between scrapes. docs/operations.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

# queue counts by the name of the counter that exposes each, with its help text
QUEUE_COUNTERS = {
    "delivered": ("amps_queue_delivered", "Messages delivered (leased, or taken at most once)"),
    "redelivered": ("amps_queue_redelivered", "Deliveries of a message delivered before"),
    "ack": ("amps_queue_acked", "Messages acknowledged (removed by an ack)"),
    "expire": ("amps_queue_expired", "Messages expired (Expiration, MaxDeliveries, MaxCancels)"),
    "taken": ("amps_queue_taken", "Messages removed as delivered (at-most-once)"),
    "dead_lettered": ("amps_queue_dead_lettered", "Expired messages written to DeadLetterTopic"),
}


class AdminCollector(Collector):
    """Every amps_ metric, from `view()` (Sources.view) at each scrape."""

    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view()
        yield from _worker(view["worker"])
        yield from _sow(view["sow_topics"])
        if view["gateway"] is not None:
            yield from _gateway(view["gateway"])
        yield from _queues(view["queues"])
        uptime = view["instance"]["uptime_seconds"]
        yield GaugeMetricFamily("amps_uptime_seconds", "Seconds since the worker started", uptime)


def registry(view: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry of the amps_ metrics alone (the process and platform collectors of
    prometheus-client's default registry are left out: other exporters cover them)."""
    collected = CollectorRegistry(auto_describe=False)
    collected.register(AdminCollector(view))
    return collected


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


def _worker(worker: dict[str, Any]) -> Iterator[Metric]:
    yield _counter("amps_records_applied", "Log records applied to the SOW", worker["applied"])
    yield _counter("amps_sow_expired", "SOW records expired", worker["expired"])
    yield _counter(
        "amps_dead_letter_failures",
        "Dead letters Kafka did not acknowledge (the partition waits and retries)",
        worker["dead_letter_failures"],
    )
    yield _counter(
        "amps_changelog_failures",
        "Changelog transactions aborted or failed (the batch waits and is tried again)",
        worker["changelog_failures"],
    )
    yield _counter(
        "amps_changelog_lost",
        "Stores found written to a changelog topic since deleted (each copied into the new one)",
        worker["changelog_lost"],
    )
    rejected = CounterMetricFamily(
        "amps_records_rejected",
        "Log records the SOW refused, by reason and by what became of them",
        labels=["reason", "outcome"],
    )
    for outcome in ("dead_lettered", "skipped"):
        for reason, count in sorted(worker[outcome].items()):
            rejected.add_metric([reason, outcome], count)
    yield rejected
    yield GaugeMetricFamily(
        "amps_worker_up",
        "1 while the worker's loop runs, 0 once it failed",
        0 if worker["failed"] else 1,
    )


def _sow(topics: list[dict[str, Any]]) -> Iterator[Metric]:
    labels = ["topic", "partition"]
    applied = GaugeMetricFamily(
        "amps_partition_applied_offset", "Next offset to apply (the store's)", labels=labels
    )
    end = GaugeMetricFamily(
        "amps_partition_end_offset", "Log end offset, as the worker last fetched it", labels=labels
    )
    lag = GaugeMetricFamily("amps_partition_lag", "Records between applied and end", labels=labels)
    records = GaugeMetricFamily(
        "amps_sow_records", "Records in the SOW (RocksDB's estimate)", labels=["topic"]
    )
    partitions = GaugeMetricFamily(
        "amps_sow_partitions", "Partitions this worker owns", labels=["topic"]
    )
    for topic in topics:
        records.add_metric([topic["topic"]], topic["records"])
        partitions.add_metric([topic["topic"]], len(topic["partitions"]))
        for part in topic["partitions"]:
            key = [topic["topic"], str(part["partition"])]
            if part["applied"] is not None:
                applied.add_metric(key, part["applied"])
            if part["end"] is not None:
                end.add_metric(key, part["end"])
                lag.add_metric(key, part["lag"])
    yield from (applied, end, lag, records, partitions)


def _gateway(gateway: dict[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily("amps_gateway_sessions", "Connections now", gateway["sessions"])
    yield GaugeMetricFamily(
        "amps_gateway_subscriptions", "Subscriptions now", gateway["subscriptions"]
    )
    yield GaugeMetricFamily(
        "amps_gateway_queued_bytes",
        "Bytes queued unsent for all connections now (bound: MaxBufferedBytes)",
        gateway["queued_bytes"],
    )
    yield GaugeMetricFamily(
        "amps_gateway_producer_failed",
        "1 while the shared producer failed fatally and is not yet replaced (publishes refused)",
        int(gateway["producer_failed"]),
    )
    for name, text in (
        ("connections", "Connections accepted"),
        ("refused", "Connections refused beyond MaxConnections"),
        ("slow_consumers", "Connections dropped as slow consumers (Max{Queued,Buffered}Bytes)"),
        ("producer_replacements", "Shared Kafka producers replaced after a fatal error"),
        (
            "producer_replacement_failures",
            "Replacements of a failed shared producer that could not be built (retried)",
        ),
        (
            "publishes_unreported",
            "Publish commands Kafka's producer never reported on, answered as unknown",
        ),
        ("frames_in", "Frames received"),
        ("frames_out", "Frames sent"),
        ("bytes_in", "Bytes received"),
        ("bytes_out", "Bytes sent"),
    ):
        yield _counter(f"amps_gateway_{name}", text, gateway[name])
    yield _histogram(
        "amps_publish_persisted_seconds",
        "From a publish's arrival to Kafka's acknowledgement (its persisted ack)",
        gateway["publish_latency"],
    )
    yield _histogram(
        "amps_query_seconds",
        "From a sow (or sow_and_subscribe) to its group_end",
        gateway["query_latency"],
    )


def _histogram(name: str, text: str, data: dict[str, Any]) -> HistogramMetricFamily:
    buckets = [(str(bound if bound == "+Inf" else float(bound)), n) for bound, n in data["buckets"]]
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=data["sum"])


def _queues(queues: list[dict[str, Any]]) -> Iterator[Metric]:
    gauges = {
        name: GaugeMetricFamily(f"amps_queue_{name}", text, labels=["queue"])
        for name, text in (
            ("depth", "Messages in the queue"),
            ("leased", "Messages leased to a subscriber now"),
            ("waiting", "Messages beyond TargetQueueDepth"),
        )
    }
    counters = {
        key: CounterMetricFamily(name, text, labels=["queue"])
        for key, (name, text) in QUEUE_COUNTERS.items()
    }
    skipped = CounterMetricFamily(
        "amps_queue_skipped", "Records not enqueued: a header did not decode", labels=["queue"]
    )
    for queue in queues:
        label = [queue["name"]]
        for name, gauge in gauges.items():
            gauge.add_metric(label, queue[name])
        for key, counter in counters.items():
            counter.add_metric(label, queue[key])
        skipped.add_metric(label, queue["skipped"])
    yield from gauges.values()
    yield from counters.values()
    yield skipped
