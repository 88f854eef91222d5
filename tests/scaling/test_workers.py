"""Three workers, one service (issue 15, item 5): any gateway answers for the whole topic,
a queue keeps its messages through its owner's death, and a worker's death costs a
retryable error, never a partial answer.

Three `amps-kafka worker` processes share a 4-partition SOW topic and a queue. While a
publisher updates every key again and again (and queues one message a round), one
thread queries through every live gateway, one follows a sow_and_subscribe through the
worker that is never killed, and one consumes the queue, acking each message, through
a gateway that does not own it. Two workers are SIGKILLed in turn: first the queue's
owner, then the consumer's gateway; then the first is restarted on its state directory
(static membership). w1 and w2 keep standby copies of the partitions they don't own,
w0 doesn't. Every answer must be complete (all keys: the keys exist before the storm
and are never deleted) or refused with a reason starting "retry:". At the end the SOW
through every gateway, and the fold of the subscription's stream, equal the fold of
the log; every queued message was delivered, and none acked came back; a sow_delete
through one gateway counts every worker's deletions. Takes about 30-60 s: the group's
session timeout (2 s, or the least the broker allows) runs out twice, and the workers
restore and hand over partitions and the queue; that is what is tested.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import orjson
import pytest
from confluent_kafka import TopicPartition

from amps_on_kafka.client import Client
from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.kafka import end_offsets, reader
from amps_on_kafka.processor.queue_runtime import events_topic
from tests.conftest import delete_topics
from tests.scaling.helpers import DEADLINE, Consumer, owner_of, publish_all, session_timeout
from tests.scaling.workers import WorkerProcess, start_all, write_config

KEYS = 120
PARTITIONS = 4


def sow_of(address: str, topic: str) -> dict[int, int]:
    with Client(f"q-{uuid.uuid4().hex[:8]}") as client:
        client.connect(address)
        client.logon(10)
        return {m.data["id"]: m.data["v"] for m in client.sow(topic, timeout=30)}


def settled(address: str, topic: str, wanted: dict[int, int] | None = None) -> dict[int, int]:
    """The SOW through `address` once it answers in full (and equals `wanted`)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            answer = sow_of(address, topic)
            if len(answer) == KEYS and (wanted is None or answer == wanted):
                return answer
        except AmpsError as exc:
            if not exc.reason.startswith("retry:"):
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{address} did not settle within {DEADLINE}s")
        time.sleep(0.2)


def fold_of_log(bootstrap: str, topic: str) -> dict[int, int]:
    """Each key's last value in the log (a key lives in one partition: log order)."""
    ends = end_offsets(bootstrap, topic)
    consumer = reader(bootstrap)
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    folded, left = {}, sum(ends.values())
    try:
        while left:
            for record in consumer.consume(1000, timeout=1.0):
                if not record.error():
                    data = orjson.loads(record.value())
                    folded[data["id"]] = data["v"]
                    left -= 1
    finally:
        consumer.close()
    return folded


class Storm:
    """Publishes rounds of every key (v = round) until stopped, and one queue message
    (n = 0, 1, ...) per round; `queued` counts those flushed."""

    def __init__(self, bootstrap: str, topic: str, queue: str) -> None:
        self.bootstrap, self.topic, self.queue = bootstrap, topic, queue
        self.stop = threading.Event()
        self.rounds = self.queued = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client("storm") as client:
            client.connect(f"kafka://{self.bootstrap}")
            client.logon()
            while not self.stop.is_set():
                self.rounds += 1
                for key in range(KEYS):
                    client.publish(self.topic, {"id": key, "v": self.rounds})
                client.publish(self.queue, {"n": self.queued})
                client.publish_flush(30)
                self.queued += 1


class Queries:
    """Queries every live gateway in turn; counts complete, retryable and other answers."""

    def __init__(self, workers: list[WorkerProcess], topic: str) -> None:
        self.workers, self.topic = workers, topic
        self.stop = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for worker in [w for w in self.workers if w.alive and w.address]:
                try:
                    answer = sow_of(worker.address, self.topic)  # type: ignore[arg-type]
                except AmpsError as exc:
                    if exc.reason.startswith("retry:"):
                        self.outcomes["retry"] += 1
                    elif worker.alive:  # a gateway killed under the query is not an answer
                        self.wrong.append(exc.reason)
                    continue
                if sorted(answer) == list(range(KEYS)):
                    self.outcomes["complete"] += 1
                else:
                    self.wrong.append(f"{len(answer)} of {KEYS} keys from {worker.name}")


class Follower:
    """sow_and_subscribe through one gateway, folded; subscribes again after a retry."""

    def __init__(self, address: str, topic: str) -> None:
        self.address, self.topic = address, topic
        self.stop = threading.Event()
        self.folded: dict[int, int] = {}
        self.retries = 0
        self.wrong: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(f"follower-{uuid.uuid4().hex[:6]}") as client:
            client.connect(self.address)
            client.logon(10)
            while not self.stop.is_set():
                try:
                    self._follow(client)
                except AmpsError as exc:
                    if not exc.reason.startswith("retry:"):
                        self.wrong.append(exc.reason)
                        return
                    self.retries += 1
                    time.sleep(0.2)

    def _follow(self, client: Client) -> None:
        folded: dict[int, int] = {}
        self.folded = folded  # a new subscription starts from its own snapshot
        with client.sow_and_subscribe(self.topic) as stream:
            while not self.stop.is_set():
                message = stream.next(timeout=0.5)
                if message is not None and message.command in ("sow", "publish"):
                    folded[message.data["id"]] = message.data["v"]


def roles(workers: list[WorkerProcess], owner: str) -> tuple[list[WorkerProcess], WorkerProcess]:
    """The two workers to kill, the queue's owner first, and the one never killed
    (w2 unless it owns the queue)."""
    first = next(w for w in workers if w.name == owner)
    survivor = next(w for w in reversed(workers) if w is not first)
    return [first, next(w for w in workers if w not in (first, survivor))], survivor


@pytest.mark.timeout(240)
def test_three_workers_answer_for_the_whole_topic_through_kills(bootstrap, topic_factory, tmp_path):
    topic, queue = topic_factory(PARTITIONS, key=("/id",)), topic_factory(1)
    timeout = session_timeout(bootstrap)
    plain = write_config(tmp_path / "plain.yaml", topic, PARTITIONS, timeout, queue=queue)
    standby = write_config(tmp_path / "standby.yaml", topic, PARTITIONS, timeout, True, queue=queue)
    group = f"scaling-{uuid.uuid4().hex[:8]}"
    workers = [  # w0 restores moved partitions from the log, w1 and w2 keep standby copies
        WorkerProcess(f"w{i}", plain if i == 0 else standby, bootstrap, group, tmp_path)
        for i in range(3)
    ]
    storm = Storm(bootstrap, topic, queue)
    queries = Queries(workers, topic)
    consumer = Consumer(queue, workers)
    try:
        start_all(workers)
        publish_all(f"kafka://{bootstrap}", topic, ({"id": key, "v": 0} for key in range(KEYS)))
        for worker in workers:
            settled(worker.address, topic)  # type: ignore[arg-type]
        victims, survivor = roles(workers, owner_of(bootstrap, group, queue))
        follower = Follower(survivor.address, topic)  # type: ignore[arg-type]
        consumer.connect(victims[1])  # not the owner's gateway, and it dies second
        for thread in (storm, queries, follower, consumer):
            thread.thread.start()

        rounds = storm.rounds
        for victim in victims:
            deadline = time.monotonic() + DEADLINE
            while storm.rounds < rounds + 2:  # some storm before each kill
                assert storm.thread.is_alive() and time.monotonic() < deadline, "storm stalled"
                time.sleep(0.1)
            victim.kill()
            settled(survivor.address, topic)  # type: ignore[arg-type]
            rounds = storm.rounds
        victims[0].start().wait_ready()  # static membership: back on its state
        storm.stop.set()
        storm.thread.join(60)

        expected = fold_of_log(bootstrap, topic)
        assert sorted(expected) == list(range(KEYS))
        for worker in (victims[0], survivor):
            assert settled(worker.address, topic, expected) == expected  # type: ignore[arg-type]
        deadline = time.monotonic() + DEADLINE
        while follower.folded != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        follower.stop.set()
        queries.stop.set()
        consumer.halt.set()
        follower.thread.join(30)
        queries.thread.join(60)
        consumer.thread.join(60)
        assert not consumer.thread.is_alive()
        assert (follower.wrong, Counter(queries.wrong)) == ([], Counter())
        assert follower.folded == expected
        assert queries.outcomes["complete"] > 0

        assert consumer.failure is None, repr(consumer.failure)
        consumer.drain(storm.queued)  # what the storm queued and was not acked yet
        assert consumer.retries >= 1  # its subscription through the dead owner said retry:
        assert consumer.reconnects >= 1  # and it moved on when its own gateway died
        assert consumer.redelivered == []  # nothing acked came back
        assert sorted(set(consumer.seen.values())) == list(range(storm.queued))  # none lost

        with Client("deleter") as client:  # counted over every worker's partitions
            client.connect(victims[0].address)  # type: ignore[arg-type]
            client.logon(10)
            reply = client.sow_delete(topic, "/id >= 0", timeout=60)
        assert reply.matches == KEYS
        assert sow_of(survivor.address, topic) == {}  # type: ignore[arg-type]
    finally:
        storm.stop.set()
        queries.stop.set()
        consumer.halt.set()
        if consumer.client is not None:
            consumer.client.close()
        for worker in workers:
            worker.stop()
        delete_topics(bootstrap, [events_topic(queue)])
