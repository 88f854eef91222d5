"""Bounded waits: `stream.next(timeout)` gives up and leaves the stream open."""

from __future__ import annotations

import threading

import pytest

from amps_on_kafka import COMPLETED, NOW
from amps_on_kafka.client.message import GatewayMessage
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.log.controls import TICK
from tests.client_api.conftest import wait_for


def test_next_returns_none_at_a_tick_past_its_deadline_and_goes_on_after():
    message = GatewayMessage("publish", "t", {"bm": "t|0|0|"})
    closed = []
    stream = MessageStream(iter([TICK, TICK, message]), lambda: closed.append(1))
    assert stream.next(timeout=0) is None
    assert not stream.ended
    assert stream.next() is message  # the second tick is skipped: no deadline
    with pytest.raises(StopIteration):
        stream.next(timeout=0)
    assert stream.ended and closed == [1]


def test_iterating_leaves_ticks_out_and_a_break_leaves_the_stream_open():
    items = [GatewayMessage("publish", "t", {"bm": f"t|0|{n}|"}) for n in range(3)]
    stream = MessageStream(iter([TICK, items[0], TICK, items[1], items[2]]), lambda: None)
    for message in stream:
        assert message is items[0]
        break
    assert list(stream) == items[1:]
    assert stream.ended


def test_a_quiet_subscription_times_out_and_stays_open(uri, connect, topic_factory):
    topic = topic_factory(1)
    client = connect(uri)
    with client.bookmark_subscribe(topic, NOW) as stream:
        assert stream.next(timeout=30) is COMPLETED
        assert stream.next(timeout=0.3) is None
        assert not stream.ended
        client.publish(topic, {"n": 1})
        client.publish_flush(30)
        message = stream.next(timeout=30)
        assert message is not None and message.data == {"n": 1}


def test_the_idle_timeout_still_ends_the_stream(uri, connect, topic_factory):
    topic = topic_factory(1)
    client = connect(uri)
    with client.bookmark_subscribe(topic, NOW, timeout=0.5) as stream:
        assert list(stream) == [COMPLETED]
        assert stream.ended


def test_a_stream_bounded_by_until_ends_there(bootstrap, connect, topic_factory):
    """Its replay ticks while it runs (log/test_replay.py) and still ends at `until`
    (kafka:// only: over tcp:// `until` is WrongTransport, tests/client_tcp)."""
    topic = topic_factory(1)
    client = connect(f"kafka://{bootstrap}")
    for n in range(3):
        client.publish(topic, {"n": n})
    client.publish_flush(30)
    with client.bookmark_subscribe(topic, "0", until=f"{topic}|0|1|") as stream:
        seen = []
        with pytest.raises(StopIteration):
            while True:
                message = stream.next(timeout=30)
                assert message is not None, f"a bounded stream stayed quiet after {seen}"
                seen.append(message.data)
        assert stream.ended
    assert [data for data in seen if data is not None] == [{"n": 0}, {"n": 1}]


def test_unsubscribe_from_another_thread_ends_a_stream_being_read(uri, connect, topic_factory):
    """The reader closes its kafka:// replay itself (closing it under its poll would hang)."""
    topic = topic_factory(1)
    client = connect(uri)
    stream = client.bookmark_subscribe(topic, NOW, sub_id="read-elsewhere")
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
    reader.start()
    wait_for(lambda: seen == [COMPLETED])
    client.unsubscribe("read-elsewhere")
    reader.join(30)
    assert not reader.is_alive() and stream.ended


def test_a_timeout_that_is_no_number_of_seconds_is_refused_before_subscribing(
    uri, connect, topic_factory
):
    """AMPS clients read timeout=0 as "no limit": it ended the stream at once here, and
    NaN never ended it. Refused, on both transports, before anything is opened."""
    topic = topic_factory(1)
    client = connect(uri)
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds above 0"):
            client.bookmark_subscribe(topic, NOW, sub_id="t", timeout=bad)
    with client.bookmark_subscribe(topic, NOW, sub_id="t") as stream:  # nothing was opened
        assert stream.next(timeout=0) in (COMPLETED, None)  # 0: don't wait
        for bad in (-1, float("nan"), "5"):
            with pytest.raises(ValueError, match=r"seconds 0 or more"):
                stream.next(timeout=bad)
