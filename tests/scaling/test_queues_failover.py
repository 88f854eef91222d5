"""A queue shared by three workers (issue 15, item 4): one owner, elected by Kafka; a
consumer connected through another gateway; owners SIGKILLed and stopped.

Three `amps-kafka worker` processes run the same queue config. The consumer subscribes
through a gateway that does not own the queue (its commands are carried to the owner),
acks some messages and holds leases on others; then the owner is killed. The consumer
gets a `retry:` failure, subscribes again, and must be given every message not acked
before, and no acked one again. Then the first owner is restarted on its (now stale)
store, the other two are stopped (one SIGKILLed, the owner with SIGTERM: it hands the
queue over), and the same must hold once the first owner has the queue again. Takes
about 15-30 s: four worker starts and two session timeouts. The multi-worker test
(test_workers.py) runs a queue consumer through kills too; this one adds the held
leases, the queue's sow through a peer, the restart on a stale store (sticky) and the
SIGTERM hand-over.
"""

from __future__ import annotations

import uuid

import pytest

from amps_on_kafka.processor.queue_runtime import events_topic
from tests.conftest import delete_topics
from tests.scaling.helpers import (
    Consumer,
    owner_of,
    publish,
    queue_config,
    retried,
)
from tests.scaling.workers import WorkerProcess, start_all

MESSAGES = 40
ACKED_BEFORE = 15  # acked (durably) before the owner dies
HELD = 5  # leased to the consumer, not acked, when the owner dies


@pytest.mark.timeout(180)
def test_a_queue_fails_over_to_another_worker_losing_nothing_and_redelivering_no_ack(
    bootstrap, topic_factory, tmp_path
):
    queue = topic_factory(1)
    config = queue_config(tmp_path / "queue.yaml", queue, bootstrap)
    group = f"queues-{uuid.uuid4().hex[:8]}"
    workers = {
        f"w{i}": WorkerProcess(f"w{i}", config, bootstrap, group, tmp_path) for i in range(3)
    }
    consumer = Consumer(queue, list(workers.values()))
    try:
        start_all(workers.values())
        first = workers[owner_of(bootstrap, group, queue)]
        via = next(w for w in workers.values() if w is not first)
        publish(via.address, queue, range(MESSAGES))
        consumer.connect(via)  # not the owner: its commands are carried there
        consumer.take(ACKED_BEFORE)
        held = consumer.take(HELD, ack=False)  # leased when the owner dies: they come back
        browsed = retried(lambda: list(consumer.client.sow(queue, timeout=10)))
        assert len(browsed) == MESSAGES - ACKED_BEFORE  # the owner's sow, through a peer
        first.kill()
        consumer.drain(MESSAGES)
        assert consumer.retries >= 1  # the subscription through the dead owner said retry:
        assert held <= consumer.acked

        # the first owner comes back on its stale store and gets the queue again
        first.start()
        first.wait_ready()
        publish(first.address, queue, range(MESSAGES, 2 * MESSAGES))
        consumer.take(ACKED_BEFORE)
        held = consumer.take(HELD, ack=False)
        owner = workers[owner_of(bootstrap, group, queue)]
        assert owner is not first  # cooperative-sticky: a worker joining takes nothing
        next(w for w in workers.values() if w not in (first, owner)).kill()
        owner.stop()  # SIGTERM: the owner hands the queue over (its store is up to date)
        consumer.drain(2 * MESSAGES)
        assert owner_of(bootstrap, group, queue) == first.name
        assert held <= consumer.acked
        assert consumer.redelivered == []
        assert sorted(consumer.seen.values()) == list(range(2 * MESSAGES))
    finally:
        if consumer.client is not None:
            consumer.client.close()
        for worker in workers.values():
            worker.stop()
        delete_topics(bootstrap, [events_topic(queue)])
