"""The fence between queue owners (issue 15, item 4): an owner frozen past its session
timeout, while another worker takes the queue, neither delivers nor accepts acks once it
resumes, and nothing acked is delivered again.

Two `amps-kafka worker` processes share one queue. A client connected to the owner's
gateway holds leases and has an ack answered; the owner is frozen (SIGSTOP) until the
other worker owns the queue and serves it, more messages are published, and an ack is
sent to the frozen owner (it waits in its socket). When it resumes (SIGCONT), its
transactional events writer has been fenced by the new owner's init_transactions: the
ack is refused with `retry:` (or, once it stopped serving the queue, carried to the new
owner), its subscription ends with `retry: queue moving` and nothing more, and a consumer
of the new owner is given every message except those acked. About 10-15 s.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.processor.queue_runtime import events_topic
from tests.conftest import delete_topics
from tests.scaling.helpers import (
    DEADLINE,
    Consumer,
    owner_of,
    publish,
    queue_config,
    retried,
)
from tests.scaling.workers import WorkerProcess, start_all

BEFORE = 3  # published before the freeze: taken by the owner's client, one acked
DURING = 6  # published while the owner is frozen


def wait_owner(bootstrap: str, group: str, queue: str, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + DEADLINE
    while owner_of(bootstrap, group, queue) != worker.name:
        assert time.monotonic() < deadline, f"{worker.name} never owned {queue}"


@pytest.mark.timeout(120)
def test_a_frozen_owner_resumes_fenced_and_neither_delivers_nor_takes_acks(
    bootstrap, topic_factory, tmp_path
):
    queue = topic_factory(1)
    config = queue_config(tmp_path / "queue.yaml", queue, bootstrap)
    group = f"fence-{uuid.uuid4().hex[:8]}"
    workers = [WorkerProcess(f"w{i}", config, bootstrap, group, tmp_path) for i in range(2)]
    direct = Client(f"direct-{uuid.uuid4().hex[:6]}")
    consumer = Consumer(queue, workers)
    try:
        start_all(workers)
        first = next(w for w in workers if w.name == owner_of(bootstrap, group, queue))
        other = next(w for w in workers if w is not first)
        publish(other.address, queue, range(BEFORE))
        direct.connect(first.address)
        direct.logon(10)
        stream = direct.subscribe(queue, options="max_backlog=3")
        taken = [stream.next(timeout=10) for _ in range(BEFORE)]
        acked, *held = [m.bookmark for m in taken]
        assert direct.ack(queue, [acked]).matches == 1

        first.freeze()
        wait_owner(bootstrap, group, queue, other)
        peer = Client(f"peer-{uuid.uuid4().hex[:6]}")
        peer.connect(other.address)
        peer.logon(10)
        # served: the new owner has opened the queue (init_transactions) and recovered
        assert len(retried(lambda: list(peer.sow(queue, timeout=10)))) == BEFORE - 1
        peer.close()
        publish(other.address, queue, range(BEFORE, BEFORE + DURING))
        answer: list[object] = []
        late_ack = threading.Thread(target=lambda: answer.append(try_ack(direct, queue, held[0])))
        late_ack.start()  # sent to the frozen owner: read when it resumes
        first.thaw()

        late_ack.join(DEADLINE)
        outcome = answer[0]
        assert outcome is True or outcome.startswith("retry:"), outcome  # type: ignore[union-attr]
        delivered, ended = after_thaw(stream)
        assert delivered == []  # the fenced owner delivered nothing more
        assert ended.startswith("retry: queue moving"), ended

        gone = {acked, held[0]} if outcome is True else {acked}
        consumer.acked = set(gone)  # any of them delivered again is a redelivery
        consumer.connect(other)
        consumer.drain(BEFORE + DURING)
        assert consumer.redelivered == []
        numbers = {m.bookmark: m.data["n"] for m in taken}
        expected = set(range(BEFORE + DURING)) - {numbers[b] for b in gone}
        assert sorted(consumer.seen.values()) == sorted(expected)
    finally:
        for worker in workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.thaw()
        direct.close()
        if consumer.client is not None:
            consumer.client.close()
        for worker in workers:
            worker.stop()
        delete_topics(bootstrap, [events_topic(queue)])


def try_ack(client: Client, queue: str, bookmark: str) -> bool | str:
    """True when the ack was answered, else the failure's reason."""
    try:
        matches = client.ack(queue, [bookmark], timeout=DEADLINE).matches
    except AmpsError as exc:
        return exc.reason
    return True if matches == 1 else f"{matches} matched"


def after_thaw(stream) -> tuple[list[str], str]:
    """What the subscription delivers before it ends, and why it ended."""
    delivered: list[str] = []
    try:
        while (message := stream.next(timeout=DEADLINE)) is not None:
            delivered.append(message.bookmark)
    except AmpsError as exc:
        return delivered, exc.reason
    return delivered, "no end"
