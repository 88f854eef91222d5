"""Issue 15: Kafka stopped and started again under two workers of one group.

The test runs its own broker (the shared one is never stopped). Two worker processes
share a 4-partition SOW topic and a queue; every key is published, and both gateways
answer for the whole topic. The broker is stopped long enough for the workers' group
sessions to lapse, then started again on the same files. While it is down, every `sow`
through either gateway is complete or fails with a clear error: never a partial answer
taken for a whole one. Afterwards:
- neither worker exited;
- what is published after the restart reaches the SOW through both gateways, which
  equals the fold of the log;
- the queue has an owner again: a message queued after the restart is delivered through
  the gateway that does not own it, and its ack is answered.
"""

from __future__ import annotations

import time

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.registry import TopicSpec
from tests.conftest import create_topic
from tests.scaling.helpers import DEADLINE, Consumer, owner_of, publish_all, session_timeout
from tests.scaling.test_workers import KEYS, PARTITIONS, fold_of_log, settled, sow_of
from tests.scaling.workers import WorkerProcess, start_all, write_config

OUTAGE = 8.0  # seconds down: past the workers' session timeout (2 s here)


def publish_round(bootstrap: str, topic: str, value: int) -> None:
    publish_all(f"kafka://{bootstrap}", topic, ({"id": key, "v": value} for key in range(KEYS)))


def outage_answers(workers: list[WorkerProcess], topic: str, seconds: float) -> list[str]:
    """Queries through every gateway for `seconds`; what each answer was."""
    outcomes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for worker in workers:
            try:
                answer = sow_of(worker.address, topic)  # type: ignore[arg-type]
                outcomes.append("complete" if sorted(answer) == list(range(KEYS)) else "partial")
            except AmpsError as exc:
                assert exc.reason, "a failure must say why"
                outcomes.append("failure")
    return outcomes


@pytest.mark.timeout(300)
def test_two_workers_outlive_a_broker_outage(private_broker, tmp_path):
    bootstrap = private_broker.start()
    topic, queue = "outage-sow", "outage-queue"
    create_topic(bootstrap, TopicSpec(topic, PARTITIONS, key=("/id",)))
    create_topic(bootstrap, TopicSpec(queue, 1))
    config = write_config(
        tmp_path / "w.yaml", topic, PARTITIONS, session_timeout(bootstrap), queue=queue
    )
    workers = [WorkerProcess(f"w{i}", config, bootstrap, "outage", tmp_path) for i in range(2)]
    consumer = None
    try:
        start_all(workers)
        publish_round(bootstrap, topic, 0)
        for worker in workers:
            settled(worker.address, topic)  # type: ignore[arg-type]

        private_broker.stop()
        outcomes = outage_answers(workers, topic, OUTAGE)
        private_broker.start()
        assert "partial" not in outcomes, outcomes
        assert outcomes, "no query answered during the outage"
        assert all(worker.alive for worker in workers), "a worker exited during the outage"

        publish_round(bootstrap, topic, 1)
        expected = fold_of_log(bootstrap, topic)
        assert expected == {key: 1 for key in range(KEYS)}
        for worker in workers:
            assert settled(worker.address, topic, expected) == expected  # type: ignore[arg-type]

        owner = owner_of(bootstrap, "outage", queue)
        other = next(w for w in workers if w.name != owner)
        consumer = Consumer(queue, workers)
        consumer.connect(other)
        with Client("queue-publisher") as client:
            client.connect(other.address)  # type: ignore[arg-type]
            client.logon(10)
            client.publish(queue, {"n": 0})
        deadline = time.monotonic() + DEADLINE
        while not consumer.acked and time.monotonic() < deadline:
            consumer.step(timeout=5.0, quiet=True)
        assert {consumer.seen[b] for b in consumer.acked} == {0}
        assert all(worker.alive for worker in workers), "a worker exited after the outage"
    finally:
        if consumer is not None and consumer.client is not None:
            consumer.client.close()
        for worker in workers:
            worker.stop()
