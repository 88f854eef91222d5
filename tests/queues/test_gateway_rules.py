"""Seed rules that the state-machine tests check one by one, checked again end to end:
publisher, broker, queue engine, gateway and client, as an application would see them."""

from __future__ import annotations

from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.state.queue_types import Status
from tests.polling import until
from tests.queues.helpers import eventually, take


def publish(client, queue: str, documents) -> None:
    for document in documents:
        client.publish(queue, document)
    client.publish_flush()


def dead_letters(bootstrap: str, topic: str) -> list:
    """The dead letters once the first is committed: the queue's state drops the message
    before the transaction carrying its dead letter commits, and until then the stop at
    offset 1 (the letter, then the commit marker) is past the log's end."""

    def read() -> list:
        try:
            with Replay(bootstrap, topic, "0", until="0|1|") as log:
                return [m.data for m in log if m is not COMPLETED]
        except InvalidBookmark:
            return []

    return until(read, what=f"a dead letter in {topic}", timeout=20)


def test_at_most_once_a_delivered_message_leaves_the_queue_and_the_ack_frees_the_backlog(
    serve, clients, queue_config
):
    served = serve(queue_config(Semantics="at-most-once"))
    queue, engine = served.queue, served.engine
    state = engine.runtimes[queue].state
    client = clients(served)
    with client.subscribe(queue, options="max_backlog=1", timeout=5) as stream:
        publish(client, queue, [{"n": 0}, {"n": 1}])
        [first] = take(stream, 1)
        eventually(engine, lambda: state.depth == 1, what="0 out of the queue, 1 in it")
        assert [m.data["n"] for m in client.sow(queue)] == [1]
        with engine.lock:
            assert state.entries[(queue, 0, 1)].status is Status.AVAILABLE  # backlog full
        first.ack()
        [second] = take(stream, 1)
        assert second.data == {"n": 1}
    # the subscription ended without acking 1: it is not delivered again
    with clients(served).subscribe(queue, options="max_backlog=5", timeout=5) as stream:
        publish(client, queue, [{"n": 2}])
        assert [m.data["n"] for m in take(stream, 1)] == [2]


def test_TargetQueueDepth_shows_and_delivers_only_the_active_part_and_keeps_early_acks(
    serve, clients, queue_config
):
    served = serve(queue_config(TargetQueueDepth=2))
    queue, engine = served.queue, served.engine
    client = clients(served)
    publish(client, queue, [{"n": n} for n in range(5)])
    eventually(engine, lambda: engine.runtimes[queue].state.depth == 5)
    assert [m.data["n"] for m in client.sow(queue)] == [0, 1]
    assert client.sow_delete(queue, "/n = 2").matches == 0  # not active yet
    assert client.ack(queue, f"{queue}|0|3|").matches == 1  # remembered until it would be
    with client.subscribe(queue, options="max_backlog=10", timeout=5) as stream:
        first = take(stream, 2)
        assert [m.data["n"] for m in first] == [0, 1]
        for message in first:
            message.ack()
        assert [m.data["n"] for m in take(stream, 2)] == [2, 4]


def test_priority_highest_first_and_non_numeric_last(serve, clients, queue_config):
    served = serve(queue_config(Priority="/p"))
    queue, engine = served.queue, served.engine
    client = clients(served)
    publish(client, queue, [{"p": p} for p in (1, 5, "high", 3, 5)])
    eventually(engine, lambda: engine.runtimes[queue].state.depth == 5)
    with client.subscribe(queue, options="max_backlog=10", timeout=5) as stream:
        delivered = take(stream, 5)
    assert [m.data["p"] for m in delivered] == [5, 5, 3, 1, "high"]
    assert [m.bookmark for m in delivered[:2]] == [f"{queue}|0|1|", f"{queue}|0|4|"]


def test_a_cancel_past_MaxCancels_expires_the_message_to_the_dead_letter_topic(
    serve, clients, queue_config, topic_factory, bootstrap
):
    dead = topic_factory()
    served = serve(queue_config(MaxCancels=1, DeadLetterTopic=dead))
    queue, engine = served.queue, served.engine
    client = clients(served)
    with client.subscribe(queue, timeout=5) as stream:
        publish(client, queue, [{"n": 1}])
        [first] = take(stream, 1)
        first.ack("cancel")  # one cancel is allowed: it comes back
        [again] = take(stream, 1)
        assert again.bookmark == first.bookmark
        again.ack("cancel")
        eventually(engine, lambda: engine.runtimes[queue].state.depth == 0)
    assert dead_letters(bootstrap, dead) == [{"n": 1}]


def test_an_unleased_message_older_than_Expiration_leaves_for_the_dead_letter_topic(
    serve, clients, queue_config, topic_factory, bootstrap
):
    dead = topic_factory()
    served = serve(queue_config(Expiration="300ms", DeadLetterTopic=dead))
    queue, engine = served.queue, served.engine
    publish(clients(served), queue, [{"n": 1}])
    eventually(engine, lambda: engine.runtimes[queue].state.positions.get((queue, 0)) == 1)
    eventually(engine, lambda: engine.runtimes[queue].state.depth == 0, what="expired")
    assert dead_letters(bootstrap, dead) == [{"n": 1}]
