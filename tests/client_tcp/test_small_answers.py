"""A query's small answer taken whole by its caller (TcpTransport._answered): the frames
that came in the read that brought the command's ack are made into the stream's
messages at once, and the rest (a larger answer, or one still on its way) streams as
before. Held to the streaming path: every answer gives the same messages and the same
error however its bytes are split, the streaming path alone (SMALL_ANSWER = 0) against
a real gateway gives what the whole-answer path gives, and a large answer still leaves
its route to stream."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_on_kafka.client import tcp_transport
from amps_on_kafka.errors import ServerError
from amps_on_kafka.protocol.frames import encode_frame, frame_of
from tests.client_tcp.test_reader_baton import ack, scripted_client
from tests.polling import until
from tests.server.helpers import WAIT


def records(cid: str, ids: list[int]) -> bytes:
    """One batch frame of the records with these ids, as the gateway lays it out."""
    payloads = [f'{{"id":{n},"v":"{"x" * (n % 7)}"}}'.encode() for n in ids]
    recs = [
        {"k": str(n), "bm": f"t|0|{n}|", "ts": 1000 + n, "n": len(p)}
        for n, p in zip(ids, payloads, strict=True)
    ]
    return encode_frame({"c": "sow", "cid": cid, "t": "t", "recs": recs}, b"".join(payloads))


def answer(cid: str, batches: list[list[int]], failure: str | None = None) -> bytes:
    """A query's frames after its processed ack: group_begin, the batches, group_end,
    then the completed ack (a failure one when `failure` says why)."""
    end = {"status": "failure", "reason": failure} if failure else {"status": "success"}
    return b"".join(
        [
            encode_frame({"c": "group_begin", "cid": cid, "t": "t"}),
            *(records(cid, ids) for ids in batches),
            encode_frame({"c": "group_end", "cid": cid, "t": "t"}),
            encode_frame({"c": "ack", "cid": cid, "t": "t", "a": "completed", **end}),
        ]
    )


def seen(messages: list[Any]) -> list[tuple[Any, ...]]:
    """Each message's fields; a group frame's header without its cid (a query's own)."""
    return [
        (m.command, m.topic, m.sub_id, m.meta | {"cid": None}, m.payload, m.data) for m in messages
    ]


def expected(batches: list[list[int]], groups: bool) -> list[tuple[str, Any]]:
    """(command, id) of the messages a query's stream gives for these batches."""
    inner = [("sow", n) for ids in batches for n in ids]
    return [("group_begin", None), *inner, ("group_end", None)] if groups else inner


def read(stream: Any) -> tuple[list[tuple[str, Any]], str | None]:
    """(command, id) of each message a stream gives, and the error that ended it."""
    got: list[tuple[str, Any]] = []
    try:
        for message in stream:
            got.append((message.command, message.data["id"] if message.command == "sow" else None))
    except ServerError as exc:
        return got, str(exc)
    return got, None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(st.integers(0, 999), min_size=1, max_size=4), max_size=4),
    failure=st.sampled_from([None, "the query failed"]),
    groups=st.booleans(),
    cuts=st.lists(st.floats(0, 1), max_size=3),
)
def test_an_answer_gives_the_same_messages_however_it_is_split(batches, failure, groups, cuts):
    """The ack and the answer in one write (the whole-answer path), or the answer cut
    anywhere into writes sent after the call returned (the stream reads the rest):
    the same messages in order, and a failure ack raised after them."""
    with scripted_client(2) as (gateway, client, pool):
        transport = client._transport
        opened = pool.submit(transport.sow, "t", "/id = 1", groups=groups)
        cid = gateway.recv().header["cid"]
        rest = answer(cid, batches, failure)
        at = sorted({int(cut * len(rest)) for cut in cuts})
        pieces = [rest[a:b] for a, b in zip([0, *at], [*at, len(rest)], strict=True)]
        gateway.send(ack(cid) + pieces[0])
        stream = opened.result(WAIT)
        for piece in pieces[1:]:
            gateway.send(piece)
        assert read(stream) == (expected(batches, groups), failure)
        assert cid not in transport._commands  # the route is gone once the answer ended


@pytest.mark.parametrize("ids", [[], [7]], ids=["no-record", "one-record"])
def test_a_small_answer_is_whole_when_the_call_returns(ids):
    """A look-up's answer in the ack's read: its route is gone before the stream is
    iterated (nothing is left to read), and the stream gives the record."""
    with scripted_client(2) as (gateway, client, pool):
        transport = client._transport
        opened = pool.submit(client.sow, "t", "/id = 7", timeout=WAIT)
        cid = gateway.recv().header["cid"]
        gateway.send(ack(cid) + answer(cid, [ids] if ids else []))
        stream = opened.result(WAIT)
        assert cid not in transport._commands
        got = list(stream)
        assert [m.data for m in got] == ([{"id": 7, "v": ""}] if ids else [])
        assert stream.ended


def test_a_failed_answer_raises_as_it_is_iterated():
    """A completed ack that says failure, in the ack's read: sow() returns, the record
    before it is given, then ServerError, as the streaming path raises it."""
    with scripted_client(2) as (gateway, client, pool):
        opened = pool.submit(client.sow, "t", "/id = 7")
        cid = gateway.recv().header["cid"]
        gateway.send(ack(cid) + answer(cid, [[7]], failure="entitlement"))
        stream = opened.result(WAIT)
        assert next(iter(stream)).data["id"] == 7
        with pytest.raises(ServerError, match="entitlement"):
            list(stream)


def test_a_refused_query_raises_from_the_call():
    with scripted_client(2) as (gateway, client, pool):
        opened = pool.submit(client.sow, "t", "/id = ")
        cid = gateway.recv().header["cid"]
        gateway.send(ack(cid, status="failure", reason="bad filter"))
        with pytest.raises(ServerError, match="bad filter"):
            opened.result(WAIT)


def test_an_answer_that_stops_coming_ends_at_the_idle_timeout():
    """A record, then nothing (no completed ack): the stream gives the record and ends
    after `timeout` quiet seconds, as a streamed answer does."""
    with scripted_client(2) as (gateway, client, pool):
        opened = pool.submit(client.sow, "t", "/id = 7", timeout=0.3)
        cid = gateway.recv().header["cid"]
        begin = encode_frame({"c": "group_begin", "cid": cid, "t": "t"})
        gateway.send(ack(cid) + begin + records(cid, [7]))  # no group_end, no completed
        stream = opened.result(WAIT)
        assert [m.data["id"] for m in stream] == [7]
        assert stream.ended


def test_a_large_answer_in_one_read_still_streams():
    """Ten batches in the ack's read: the caller takes two (SMALL_ANSWER), the route
    stays for the stream, which gives every record in order."""
    with scripted_client(2) as (gateway, client, pool):
        transport = client._transport
        batches = [list(range(10 * b, 10 * b + 10)) for b in range(10)]
        opened = pool.submit(client.sow, "t", "/id > 0")
        cid = gateway.recv().header["cid"]
        gateway.send(ack(cid) + answer(cid, batches))
        stream = opened.result(WAIT)
        assert len(batches) > tcp_transport.SMALL_ANSWER
        assert transport._commands.get(cid) is not None  # the rest is read as it is iterated
        assert [m.data["id"] for m in stream] == list(range(100))
        assert cid not in transport._commands


def test_deliveries_in_the_answers_read_reach_their_subscription():
    """A subscription's deliveries interleaved with a look-up's frames in one read: the
    look-up gets its record whole, the subscription its messages in order."""
    with scripted_client(2) as (gateway, client, pool):
        opened = pool.submit(client.subscribe, "s", timeout=WAIT)
        gateway.answer()
        subscription = opened.result(WAIT)
        sub_id = subscription.sub_id
        looked = pool.submit(client.sow, "t", "/id = 7")
        cid = gateway.recv().header["cid"]

        def delivery(n: int) -> bytes:
            return encode_frame({"c": "publish", "t": "s", "sub_id": sub_id}, b'{"n":%d}' % n)

        frames = answer(cid, [[7]])
        gateway.send(delivery(0) + ack(cid) + delivery(1) + frames + delivery(2))
        assert [m.data["id"] for m in looked.result(WAIT)] == [7]
        assert [subscription.next(timeout=WAIT).data["n"] for _ in range(3)] == [0, 1, 2]


def test_a_bad_frame_in_the_answers_read_is_logged_and_the_rest_routed(caplog):
    """A read's frames are routed in one call: a frame whose header is not JSON, read
    with a look-up's answer, is logged, and the frames before and after it still reach
    their waiter in order."""
    with scripted_client(2) as (gateway, client, pool):
        looked = pool.submit(client.sow, "t", "/id = 7")
        cid = gateway.recv().header["cid"]
        gateway.send(ack(cid) + frame_of(b"not json") + answer(cid, [[7, 8]]))
        assert [m.data["id"] for m in looked.result(WAIT)] == [7, 8]
    assert "bad frame from the gateway" in caplog.text


def test_a_real_gateways_answers_are_those_the_stream_gives(served, client_to, monkeypatch):
    """Against a worker's gateway: look-ups (a key there and one not), a query of a few
    records, and the same with group frames (execute_async's stream), taken whole and,
    with SMALL_ANSWER = 0, streamed: the same messages, field by field."""
    client = client_to(served.address)
    client.publish(served.topic, {"id": "small-1", "v": 1})
    client.publish(served.topic, {"id": "small-2", "v": 2})
    client.publish_flush(WAIT)
    until(lambda: len(list(client.sow(served.topic, "/id LIKE '^small-'"))) == 2, "stored")
    queries = ["/id = 'small-1'", "/id = 'small-none'", "/id LIKE '^small-'"]
    transport = client._transport

    def run() -> list[list[tuple[Any, ...]]]:
        return [
            seen(list(transport.sow(served.topic, f, groups=g)))
            for f in queries
            for g in (False, True)
        ]

    whole = run()
    monkeypatch.setattr(tcp_transport, "SMALL_ANSWER", 0)
    streamed = run()
    assert whole == streamed
    assert [len(answer) for answer in whole] == [1, 3, 0, 2, 2, 4]
