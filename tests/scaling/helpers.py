"""Helpers shared by the multi-worker tests (test_workers, test_queues_failover,
test_changelog): the session timeout the broker allows, the queue owner the membership
directory names, and a queue consumer that survives owners and gateways dying."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError, TransportError
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.server.membership import WORKERS_TOPIC, Directory
from tests.scaling.workers import WorkerProcess

SESSION_TIMEOUT = 2.0  # at least the broker's group.min.session.timeout.ms (session_timeout)
DEADLINE = 60.0  # seconds for an owner to be announced, or a retried command to succeed

R = TypeVar("R")
DRAIN_SILENCE = 75.0  # seconds: past the queue's 60 s lease (workers.py)


def session_timeout(bootstrap: str) -> float:
    """SESSION_TIMEOUT, or the least the broker allows if that is more (6 s unless set,
    as on a broker the tests did not start; the project's local broker allows 1 s)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = next(iter(admin.list_topics(timeout=10).brokers))
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    configs = admin.describe_configs([resource])[resource].result(10)
    return max(SESSION_TIMEOUT, int(configs["group.min.session.timeout.ms"].value) / 1000)


def queue_config(path: Path, queue: str, bootstrap: str) -> Path:
    """A config serving only `queue` (over a one-partition topic of that name, 60 s
    leases), anonymous logons, the least session timeout the broker allows."""
    config = {
        "Topics": [{"Name": queue, "Partitions": 1}],
        "Queues": [{"Name": queue, "LeasePeriod": "60s"}],
        "Worker": {"SessionTimeout": session_timeout(bootstrap)},
        "Authentication": {"Anonymous": True},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def owner_of(bootstrap: str, group: str, queue: str) -> str:
    """The worker the membership directory names as the queue's owner (waits for one)."""
    owner = announced(bootstrap, group, lambda directory: directory.queue_owner(queue))
    return owner.worker


def partition_owners(bootstrap: str, group: str, topic: str, count: int) -> dict[int, str]:
    """The worker the membership directory names for each of the topic's `count`
    partitions (waits until every one has one)."""

    def claims(directory: Directory) -> dict[int, str] | None:
        owners = {p: member.worker for p, member in directory.owners(topic).items()}
        return owners if len(owners) == count else None

    return announced(bootstrap, group, claims)


def announced(bootstrap: str, group: str, found: Callable[[Directory], R | None]) -> R:
    """What `found` makes of the group's membership directory once it is not None,
    asked once the directory is read to its end as of the call: an earlier announcement
    (the owner before a hand-over) is not taken for the latest."""
    deadline = time.monotonic() + DEADLINE
    directory = Directory(group)
    consumer = reader(bootstrap)
    start = TopicPartition(WORKERS_TOPIC, 0, OFFSET_BEGINNING)
    end = consumer.get_watermark_offsets(start, timeout=10)[1]
    consumer.assign([start])
    try:
        while True:
            for record in consumer.consume(500, timeout=0.2):
                if record.error() is None:
                    directory.apply(record.key(), record.value(), record.offset())
            read = consumer.position([start])[0].offset  # past gaps compaction left
            if read >= end and (answer := found(directory)) is not None:
                return answer
            assert time.monotonic() < deadline, f"not announced in {group}"
    finally:
        consumer.close()


def publish(address: str, queue: str, numbers: Iterable[int]) -> None:
    """Publish {"n": n} to `queue` through the gateway at `address`, and flush."""
    publish_all(address, queue, ({"n": n} for n in numbers))


def publish_all(address: str, topic: str, documents: Iterable[dict[str, Any]]) -> None:
    """Publish `documents` to `topic` through `address` (a client URI: a gateway's, or
    kafka:// to write the log directly), and wait until Kafka has them all."""
    with Client(f"publisher-{uuid.uuid4().hex[:6]}") as client:
        client.connect(address)
        client.logon(10)
        for document in documents:
            client.publish(topic, document)
        client.publish_flush(DEADLINE)


def retried(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call`, again while it fails with retry: (ownership is moving)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return call(*args, **kwargs)
        except AmpsError as exc:
            if not exc.reason.startswith("retry:") or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Consumer:
    """A queue consumer that acks synchronously, subscribes again after `retry:` and
    connects to another live gateway when its own goes away. `follow` runs it on a
    thread until `halt` is set, beside whatever else the test does."""

    def __init__(self, queue: str, workers: Sequence[WorkerProcess]) -> None:
        self.queue = queue
        self.workers = workers
        self.acked: set[str] = set()  # the ack returned: never to be delivered again
        self.unsure: set[str] = set()  # the connection dropped during the ack
        self.seen: dict[str, int] = {}
        self.redelivered: list[str] = []
        self.retries = 0
        self.reconnects = 0
        self.client: Client | None = None
        self.stream = None
        self.halt = threading.Event()
        self.failure: BaseException | None = None  # what ended `follow`, if not `halt`
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def connect(self, worker: WorkerProcess) -> None:
        if self.client is not None:
            self.client.close()
        self.client = Client(f"consumer-{uuid.uuid4().hex[:6]}")
        self.client.connect(worker.address)
        self.client.logon(10)
        self.subscribe()

    def subscribe(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.stream = retried(self.client.subscribe, self.queue, options="max_backlog=20")

    def step(self, ack: bool = True, timeout: float = 10.0, quiet: bool = False) -> str | None:
        """Waits up to `timeout` for one message not acked before and returns its
        bookmark (acked unless `ack` is false); None after a redelivery, a retry: or a
        lost gateway (handled by subscribing again, elsewhere if need be), or after
        silence if `quiet` (else silence fails the test)."""
        try:
            message = self.stream.next(timeout=timeout)
            if message is None:
                assert quiet, f"{len(self.acked)} acked, then silence"
                return None
            if message.bookmark in self.acked:
                self.redelivered.append(message.bookmark)
                return None
            self.seen[message.bookmark] = message.data["n"]
            if ack:
                self._ack(message.bookmark)
            return message.bookmark
        except AmpsError as exc:
            self._recover(exc)
            return None

    def _recover(self, exc: AmpsError) -> None:
        """Subscribes again after a retry:, through another live gateway once its own is
        gone (which may also happen while subscribing again)."""
        while True:
            try:
                if exc.reason.startswith("retry:"):
                    self.retries += 1
                    self.subscribe()
                elif isinstance(exc, TransportError):  # its gateway is gone: another one
                    self.reconnects += 1
                    self.connect(next(w for w in self.workers if w.alive))
                else:
                    raise exc
                return
            except TransportError as again:
                exc = again

    def take(self, count: int, ack: bool = True, silence: float = 10.0) -> set[str]:
        """`count` messages not acked before (acked unless `ack` is false)."""
        taken: set[str] = set()
        while len(taken) < count:
            if (bookmark := self.step(ack, timeout=silence)) is not None:
                taken.add(bookmark)
        return taken

    def _ack(self, bookmark: str) -> None:
        try:
            assert self.client.ack(self.queue, [bookmark]).matches == 1
        except AmpsError as exc:
            # The connection dropped, or the owner died with the ack in flight (retry:):
            # the owner may have stored it first. Durable or not, it is not lost: it
            # comes back, or it was acked.
            if isinstance(exc, TransportError) or exc.reason.startswith("retry:"):
                self.unsure.add(bookmark)
            raise
        self.acked.add(bookmark)

    def drain(self, total: int) -> None:
        """Until every message published has been acked, or its ack's outcome is unknown
        (`unsure`: a CI run once waited here for a message whose ack failed with retry:
        after the owner had stored it). Silence up to DRAIN_SILENCE may still be a lease
        that must run out (60 s, workers.py). Losing a message fails: it never comes."""
        while len(self.acked | self.unsure) < total:
            try:
                self.take(1, silence=DRAIN_SILENCE)
            except AssertionError as silence:
                numbers = sorted(self.seen[b] for b in self.acked | self.unsure)
                missing = sorted(set(range(total)) - set(numbers))
                raise AssertionError(f"{silence}; never delivered: n = {missing[:20]}") from None

    def _follow(self) -> None:
        try:
            while not self.halt.is_set():
                self.step(timeout=0.5, quiet=True)
        except BaseException as exc:  # reported by the test, not lost with the thread
            self.failure = exc
