"""The admin view: one JSON-able picture of a worker, in AMPS's spirit (its instance,
clients, subscriptions, SOW topics and queues), which the metrics, /ready, the status
page and `amps-kafka stats` all read.

It is assembled at request time from the counters the worker, its gateway and its queue
engine keep in plain ints (nothing here runs per message). Each part is read where it
is safe to read: the gateway's connections on its event loop, the stores and queues
under their engines' locks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import TransportError
from amps_on_kafka.server.stats import Latencies, Traffic

if TYPE_CHECKING:
    from amps_on_kafka.processor.queues import QueueEngine
    from amps_on_kafka.processor.worker import Worker
    from amps_on_kafka.server.gateway import Gateway
    from amps_on_kafka.server.session import Session

LOOP_TIMEOUT = 5.0  # seconds the gateway's loop may take to answer (it never blocks long)
QUEUE_COUNTS = ("delivered", "redelivered", "ack", "expire", "taken", "dead_lettered")
# what an operator reads for each kind of a session's subscriptions (by class name)
SUBSCRIPTION_KINDS = {
    "SowSubscription": "sow",
    "SpreadSubscription": "sow",
    "LogSubscription": "log",
    "QueueSubscriber": "queue",
    "Forwarded": "queue",  # held by the queue's owner, another worker
}


@cache
def package_version() -> str:
    try:
        return version("amps_on_kafka")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@dataclass
class Sources:
    """What the admin port reports on: a worker, and its gateway once it runs."""

    worker: Worker
    gateway: Gateway | None = None
    gateway_expected: bool = True  # /ready waits for the gateway to be set here
    started: float = field(default_factory=time.time)

    def view(self) -> dict[str, Any]:
        worker = self.worker
        gateway = self.gateway
        return {
            "instance": self.instance(),
            "worker": worker_view(worker),
            "sow_topics": sow_view(worker),
            **(gateway_view(gateway) if gateway is not None else _no_gateway()),
            "queues": queue_view(worker.queues) if worker.queues is not None else [],
        }

    def instance(self) -> dict[str, Any]:
        worker, gateway = self.worker, self.gateway
        down = worker.outage.down_since
        return {
            "version": package_version(),
            "started": datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds"),
            "uptime_seconds": round(time.time() - self.started, 1),
            "group": worker.group_id,
            "state_dir": str(worker.state_dir),
            "gateway": None if gateway is None else gateway.address,
            "kafka_down_seconds": None if down is None else round(time.monotonic() - down),
            "config": config_summary(worker),
        }


def config_summary(worker: Worker) -> dict[str, Any]:
    """What the worker serves and its main settings. Chosen field by field rather than
    dumped, so no credential a config section may hold can reach the admin port."""
    config = worker.config
    return {
        "bootstrap_servers": worker.bootstrap,
        "topics": [
            {"name": t.name, "partitions": t.partitions, "message_type": t.message_type}
            for t in config.topics
        ],
        "sow": [
            {"topic": s.topic, "key": list(s.key), "expiration": _expiration(s.expiration)}
            for s in config.sow
        ],
        "queues": [
            {"name": q.name, "underlying_topic": q.topic_pattern, "semantics": q.semantics}
            for q in config.queues
        ],
        "gateway": {
            "listen": config.gateway.listen,
            "max_connections": config.gateway.max_connections,
        },
        "admin": {"listen": config.admin.listen, "ready_max_lag": config.admin.ready_max_lag},
        "state": {"flush_every": config.state.flush_every},
    }


def _expiration(expiration: Any) -> str:
    if expiration.mode == "disabled" or expiration.default_seconds is None:
        return expiration.mode
    return f"{expiration.default_seconds:g}s"


def worker_view(worker: Worker) -> dict[str, Any]:
    rejected, dead = worker.rejected.copy(), worker.dead_lettered.copy()
    return {
        "assigned": worker.engine.ready.is_set(),  # a first assignment is open
        "applied": worker.applied,
        "expired": worker.expired,
        "dead_lettered": dict(dead),
        "skipped": {reason: n - dead[reason] for reason, n in rejected.items() if n > dead[reason]},
        "dead_letter_failures": worker.dead_letter_failures,
        "changelog_failures": worker.changelog_failures,
        "changelog_lost": worker.changelog_lost,
        "failed": _failure(worker),
    }


def _failure(worker: Worker) -> str | None:
    """Why the worker's loop stopped, or None while it runs."""
    try:
        worker.raise_if_failed()
    except TransportError as exc:
        return exc.reason
    return None


def sow_view(worker: Worker) -> list[dict[str, Any]]:
    """Each SOW topic: its records (RocksDB's estimate) and, per owned partition, the
    offset applied, the log end as last fetched and the lag between them."""
    lags = worker.lag()
    topics = []
    for sow in worker.config.sow:
        with worker.engine.lock:  # a store is closed only once detached under it
            stores = [
                worker.engine.store(sow.topic, p) for p in worker.engine.partitions(sow.topic)
            ]
            owned = [(s.partition, s.next_offset(), s.estimated_count()) for s in stores if s]
        partitions = []
        for partition, applied, _ in owned:
            lag = lags.get((sow.topic, partition))
            end = None if lag is None else (applied or 0) + lag
            partitions.append({"partition": partition, "applied": applied, "end": end, "lag": lag})
        topics.append(
            {
                "topic": sow.topic,
                "records": sum(count for _, _, count in owned),
                "lag": sum(p["lag"] or 0 for p in partitions),
                "partitions": partitions,
            }
        )
    return topics


def _no_gateway() -> dict[str, Any]:
    return {"gateway": None, "clients": [], "subscriptions": []}


def gateway_view(gateway: Gateway) -> dict[str, Any]:
    """The gateway's totals, clients and subscriptions, read on its event loop."""

    async def read() -> dict[str, Any]:
        return _gateway_parts(gateway)

    if not gateway.loop.is_running():
        return _no_gateway()
    return asyncio.run_coroutine_threadsafe(read(), gateway.loop).result(LOOP_TIMEOUT)


def _gateway_parts(gateway: Gateway) -> dict[str, Any]:
    stats = gateway.stats
    sessions = gateway.sessions()
    traffic = Traffic()
    traffic.add(stats.closed)
    clients, subscriptions = [], []
    for session in sessions:
        traffic.add(session.traffic)
        clients.append(_client(session))
        subscriptions.extend(_subscription(session, sub) for sub in session.subscriptions.values())
    return {
        "gateway": {
            "address": gateway.address,
            "sessions": len(sessions),
            "subscriptions": len(subscriptions),
            "connections": stats.connections,
            "refused": stats.refused,
            "slow_consumers": stats.slow_consumers,
            "producer_replacements": stats.producer_replacements,
            # a failed producer not yet replaced: publishes are refused meanwhile
            "producer_failed": gateway.pump.fatal is not None,
            "producer_replacement_failures": gateway.pump.renew_failures,
            "publishes_unreported": gateway.pump.unreported,
            # the sum MaxBufferedBytes bounds (each connection's is in `clients`)
            "queued_bytes": sum(client["queued_bytes"] for client in clients),
            **vars(traffic),
            "publish_latency": _histogram(stats.publish_latency),
            "query_latency": _histogram(stats.query_latency),
        },
        "clients": clients,
        "subscriptions": subscriptions,
    }


def _client(session: Session) -> dict[str, Any]:
    queued = session.writer.transport.get_write_buffer_size()
    limit = session.gateway.max_queued_bytes
    host, port = (session.peer or ("?", 0))[:2]
    return {
        "name": session.client_name,
        # who logged on, once the gateway authenticates (None before the logon)
        "user": session.identity.user if session.identity is not None else None,
        "address": f"{host}:{port}",
        "subscriptions": sorted(session.subscriptions),
        **vars(session.traffic),
        "queued_bytes": queued,
        # how near the slow-consumer limit (MaxQueuedBytes) it is: 1.0 is disconnected
        "slow_consumer": round(queued / limit, 3),
    }


def _subscription(session: Session, sub: Any) -> dict[str, Any]:
    kind = SUBSCRIPTION_KINDS.get(type(sub).__name__, type(sub).__name__)
    # a subscription spread over the group's workers (what a worker's gateway makes of
    # every SOW subscription): its local part holds the topic and filter
    sub = getattr(sub, "local", sub)
    handle = getattr(sub, "handle", None)  # a queue subscription's engine handle
    topic = getattr(sub, "topic", None)
    if topic is None and handle is not None:
        topic = ",".join(handle.queues)
    filter_ = getattr(sub, "filter", None)
    return {
        "client": session.client_name,
        "sub_id": sub.sub_id,
        "kind": kind,
        "topic": topic,
        "filter": getattr(filter_, "text", filter_),
    }


def _histogram(latencies: Latencies) -> dict[str, Any]:
    buckets = latencies.cumulative()
    return {
        "count": buckets[-1][1],
        "sum": round(latencies.sum, 6),
        "buckets": [[bound if bound != float("inf") else "+Inf", n] for bound, n in buckets],
    }


def queue_view(engine: QueueEngine) -> list[dict[str, Any]]:
    """Each queue's depth, leases per subscriber and counts since start (under the
    engine's lock, which every change of queue state holds)."""
    queues = []
    with engine.lock:
        for runtime in engine.runtimes.values():
            state = runtime.state
            counts = runtime.counts.copy()
            subscribers = [
                {
                    "client": getattr(sub.session, "client_name", str(sub.session)),
                    "sub_id": sub.sub_id,
                    "leases": sub.outstanding,
                    "backlog": sub.max_backlog,
                }
                for sub in state.subscriptions
            ]
            queues.append(
                {
                    "name": runtime.name,
                    "ready": runtime.ready.is_set(),
                    "failed": runtime.failure,
                    "depth": state.depth,
                    "waiting": state.waiting,
                    "leased": sum(1 for _ in state.leased()),
                    "skipped": runtime.skipped,
                    **{name: counts[name] for name in QUEUE_COUNTS},
                    "subscribers": subscribers,
                }
            )
    return queues
