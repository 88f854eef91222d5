"""A queue shared by three workers (issue 15, item 4): one owner, elected by Kafka; a
consumer connected through another gateway; the owner SIGKILLed.

Three `amps-kafka worker` processes run the same queue config. The consumer subscribes
through a gateway that does not own the queue (its commands are carried to the owner),
acks some messages and holds leases on others; then the owner is killed. The consumer
gets a `retry:` failure, subscribes again (at whichever gateway it is connected to),
and must be given every message not acked before, and no acked one again. Takes about
15-30 s: three worker starts and one session timeout.
"""

from __future__ import annotations

import time
import uuid

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.server.membership import WORKERS_TOPIC, Directory
from tests.conftest import delete_topics
from tests.scaling.test_workers import session_timeout
from tests.scaling.workers import WorkerProcess

MESSAGES = 40
ACKED_BEFORE = 15  # acked (durably) before the owner dies
HELD = 5  # leased to the consumer, not acked, when the owner dies
DEADLINE = 60.0


def owner_of(bootstrap: str, group: str, queue: str) -> str:
    """The worker the membership directory names as the queue's owner (waits for one)."""
    deadline = time.monotonic() + DEADLINE
    directory = Directory(group)
    consumer = reader(bootstrap)
    consumer.assign([TopicPartition(WORKERS_TOPIC, 0, OFFSET_BEGINNING)])
    try:
        while True:
            for record in consumer.consume(500, timeout=0.2):
                if record.error() is None:
                    directory.apply(record.key(), record.value(), record.offset())
            owner = directory.queue_owner(queue)
            if owner is not None:
                return owner.worker
            assert time.monotonic() < deadline, f"no owner of {queue} announced"
    finally:
        consumer.close()


def retried(call, *args, **kwargs):
    """`call`, again while it fails with retry: (ownership is moving)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return call(*args, **kwargs)
        except AmpsError as exc:
            if not exc.reason.startswith("retry:") or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.timeout(180)
def test_a_queue_fails_over_to_another_worker_losing_nothing_and_redelivering_no_ack(
    bootstrap, topic_factory, tmp_path
):
    queue = topic_factory(1)
    config = tmp_path / "queue.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "Topics": [{"Name": queue, "Partitions": 1}],
                "Queues": [{"Name": queue, "LeasePeriod": "60s"}],
                "Worker": {"SessionTimeout": session_timeout(bootstrap)},
                "Authentication": {"Anonymous": True},
            }
        )
    )
    group = f"queues-{uuid.uuid4().hex[:8]}"
    workers = {
        f"w{i}": WorkerProcess(f"w{i}", config, bootstrap, group, tmp_path) for i in range(3)
    }
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            worker.wait_ready()
        owner = workers[owner_of(bootstrap, group, queue)]
        via = next(w for w in workers.values() if w is not owner)
        with Client(f"consumer-{uuid.uuid4().hex[:6]}") as client:
            client.connect(via.address)
            client.logon(10)
            for n in range(MESSAGES):
                client.publish(queue, {"n": n})
            client.publish_flush()
            acked: set[str] = set()
            seen: dict[str, int] = {}
            stream = retried(client.subscribe, queue, options="max_backlog=20", timeout=10)
            while len(acked) < ACKED_BEFORE + HELD:
                message = stream.next(timeout=10)
                assert message is not None, "the owner stopped delivering through a peer"
                seen[message.bookmark] = message.data["n"]
                if len(acked) < ACKED_BEFORE:
                    assert client.ack(queue, [message.bookmark]).matches == 1
                acked.add(message.bookmark)
            browsed = retried(lambda: list(client.sow(queue, timeout=10)))  # the owner's answer
            assert len(browsed) == MESSAGES - ACKED_BEFORE
            held = acked - set(list(seen)[:ACKED_BEFORE])
            acked -= held  # HELD leases, never acked: they must come back
            owner.kill()

            redelivered: list[str] = []
            retries = 0
            while len(acked) < MESSAGES:
                try:
                    message = stream.next(timeout=10)
                    assert message is not None, f"{len(acked)} of {MESSAGES} acked, then silence"
                    if message.bookmark in acked:
                        redelivered.append(message.bookmark)
                        continue
                    seen[message.bookmark] = message.data["n"]
                    if client.ack(queue, [message.bookmark]).matches == 1:
                        acked.add(message.bookmark)
                except AmpsError as exc:
                    assert exc.reason.startswith("retry:"), exc.reason
                    retries += 1
                    stream.close()
                    stream = retried(client.subscribe, queue, options="max_backlog=20", timeout=10)
            stream.close()
        assert retries >= 1  # the subscription held through the dead owner ended with retry:
        assert redelivered == []
        assert sorted(seen.values()) == list(range(MESSAGES))
        assert held <= acked  # the dead owner's leases came back and were taken again
    finally:
        for worker in workers.values():
            worker.stop()
        delete_topics(bootstrap, [events_topic(queue)])
