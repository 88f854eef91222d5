"""The gateway's bounds (issue 13, defects 5, 6, 7 and 13): connections, read timeouts,
commands in flight per session, one shared producer, and errors that name what was asked.

Each test fails on the gateway before these bounds: an unlimited accept, a read with no
timeout, a task per pipelined query, a producer per publishing connection.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.protocol.frames import Frame, encode_frame
from amps_on_kafka.server.deletes import MAX_WATCHED, DeleteTracker
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.server.requests import MAX_SOW_KEYS, ProtocolError
from amps_on_kafka.server.session import Session
from amps_on_kafka.state.events import CommandResult
from tests.server.helpers import Wire, is_ack

GatewayFactory = Callable[..., Gateway]
PAD = b"x" * 200


@pytest.fixture
def gateway_with(bootstrap: str) -> Iterator[GatewayFactory]:
    """``gateway_with(**settings)``: a bare gateway (no SOW topic) with those Gateway settings."""
    started: list[Gateway] = []

    def start(**settings: object) -> Gateway:
        gateway = Gateway(
            SowEngine(Config(), {}, now_ms),
            bootstrap,
            listen="127.0.0.1:0",
            settings=GatewayConfig(**settings),
        )
        started.append(gateway)
        gateway.start()
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def closing_reason(wire: Wire) -> str:
    """The failure ack (without cid) a connection gets before the gateway closes it."""
    notice = wire.recv()
    assert is_ack(notice, "processed") and notice.header["status"] == "failure", notice.header
    assert "cid" not in notice.header
    assert wire.is_closed()
    return notice.header["reason"]


def heartbeat_seconds(wire: Wire) -> float:
    started = time.perf_counter()
    reply = wire.request({"c": "heartbeat", "cid": f"hb-{started}"})
    assert is_ack(reply, "heartbeat")
    return time.perf_counter() - started


def on_loop(gateway: Gateway, work: Callable[[], object]) -> object:
    """Read gateway state on its own loop (the only thread that changes it)."""

    async def read() -> object:
        return work()

    return asyncio.run_coroutine_threadsafe(read(), gateway.loop).result(10)


def test_max_connections_refuses_with_a_reason_and_serves_again_after_a_close(
    gateway_with, wire_to, caplog
):
    """Defect 7: there was no limit on connections. The refusal is logged once, with
    the peer and the limit (issue 16)."""
    gateway = gateway_with(max_connections=2)
    first, second = wire_to(gateway.address), wire_to(gateway.address)
    assert first.logon("first").header["status"] == "success"
    assert second.logon("second").header["status"] == "success"
    third = wire_to(gateway.address)
    assert closing_reason(third) == (
        "too many connections: this gateway serves at most 2 (MaxConnections)"
    )
    [refused] = [r for r in caplog.records if getattr(r, "event", None) == "connection_refused"]
    assert refused.limit == 2 and refused.peer[0] == "127.0.0.1"
    first.close()
    assert second.is_closed(timeout=0.2) is False  # the others are untouched
    retry = wire_to(gateway.address)
    deadline = time.monotonic() + 10
    while retry.logon("retry").header["status"] != "success":  # until the close is seen
        assert time.monotonic() < deadline
        retry = wire_to(gateway.address)


def test_a_truncated_frame_is_closed_after_read_timeout(gateway_with, wire_to):
    """Defect 7: a truncated frame held its connection open forever."""
    gateway = gateway_with(read_timeout=0.5)
    wire = wire_to(gateway.address)
    assert wire.logon("truncated").header["status"] == "success"
    started = time.monotonic()
    wire.send_raw(struct.pack(">II", 100, 20) + b'{"c": "pub')  # 90 bytes promised, 10 sent
    reason = closing_reason(wire)
    assert reason == "a frame begun was not completed within 0.5s (ReadTimeout)"
    assert time.monotonic() - started < 5


def test_a_frame_dribbled_byte_by_byte_is_timed_from_its_first_byte(gateway_with, wire_to):
    """A frame's clock starts at its first byte: trickling keeps no connection alive."""
    gateway = gateway_with(read_timeout=1.0)
    wire = wire_to(gateway.address)
    assert wire.logon("dribble").header["status"] == "success"
    frame = struct.pack(">II", 200, 100) + b" " * 100
    started = time.monotonic()
    closed_after = None
    for byte in frame:  # one byte every 0.2 s: 20 s for the frame if nothing stops it
        wire.send_raw(bytes([byte]))
        if wire.is_closed(timeout=0.2):
            closed_after = time.monotonic() - started
            break
    # uvloop's timers count whole milliseconds, so its 1 s may end a hair early
    assert closed_after is not None and 0.99 <= closed_after < 6


def test_a_steady_stream_split_across_reads_is_not_timed_out(gateway_with, wire_to):
    """ReadTimeout times one frame: a client whose reads always end inside some frame
    (any busy publisher) is not closed once ReadTimeout has passed since the first one."""
    gateway = gateway_with(read_timeout=0.5)
    wire = wire_to(gateway.address)
    assert wire.logon("stream").header["status"] == "success"
    stream = b"".join(encode_frame({"c": "heartbeat", "cid": str(n)}) for n in range(30))
    step = len(stream) // 30
    for start in range(0, len(stream), step):  # each piece ends inside a frame
        wire.send_raw(stream[start + 3 : start + step + 3] if start else stream[: step + 3])
        time.sleep(0.1)  # the client's rhythm: 3 s in all, 6 times ReadTimeout
    replies = wire.until(lambda f: f.header.get("cid") == "29")
    assert [f.header["cid"] for f in replies] == [str(n) for n in range(30)]


def test_a_connection_that_never_logs_on_is_closed_after_read_timeout(gateway_with, wire_to):
    """Defect 7: a connection that says nothing is not kept before logon."""
    gateway = gateway_with(read_timeout=0.5)
    wire = wire_to(gateway.address)
    assert closing_reason(wire) == "no logon within 0.5s of connecting (ReadTimeout)"


def test_a_logged_on_quiet_connection_is_kept(gateway_with, wire_to):
    """ReadTimeout is for frames begun and logons, not for subscribers with nothing to say."""
    gateway = gateway_with(read_timeout=0.3)
    wire = wire_to(gateway.address)
    assert wire.logon("quiet").header["status"] == "success"
    assert wire.is_closed(timeout=1.0) is False
    assert heartbeat_seconds(wire) < 5


def test_subscriptions_per_connection_are_bounded(gateway_with, wire_to, topic_factory):
    """Each log subscription holds a Kafka consumer and a thread: a connection could open
    them without end. Beyond MaxSubscriptions one is refused, and room comes back."""
    gateway = gateway_with(max_subscriptions=2)
    topic = topic_factory(1)
    wire = wire_to(gateway.address)
    wire.logon("subscriber")

    def subscribe(sub_id: str) -> dict:
        header = {"c": "subscribe", "cid": sub_id, "t": topic, "a": "processed"}
        return wire.request(header).header

    assert subscribe("one")["status"] == subscribe("two")["status"] == "success"
    refused = subscribe("three")
    assert refused["status"] == "failure"
    assert refused["reason"] == (
        "too many subscriptions on this connection: at most 2 (MaxSubscriptions); "
        "unsubscribe one first"
    )
    wire.request({"c": "unsubscribe", "cid": "u", "sub_id": "one", "a": "processed"})
    assert subscribe("three")["status"] == "success"


def test_an_ack_to_a_missing_queue_names_the_queue(bare_gateway, wire_to):
    """Defect 13: it said "'X' is not a SOW topic of this worker"."""
    wire = wire_to(bare_gateway.address)
    wire.logon("acker")
    reply = wire.request(
        {"c": "sow_delete", "cid": "ack", "t": "orders-queue", "bm": "orders|0|1|"}
    )
    assert reply.header["status"] == "failure"
    assert reply.header["reason"] == (
        "no queue 'orders-queue' on this worker: an ack (sow_delete with bm) needs a queue"
    )


def test_a_sow_delete_naming_too_many_keys_is_refused_and_the_connection_kept(served, wire_to):
    """review8: a 4 MiB frame could name two million keys, a record each produced from
    the event loop, past librdkafka's queue: every connection stalled until Kafka drained."""
    topic = served.topic
    wire = wire_to(served.address)
    wire.logon("deleter")
    keys = [str(n) for n in range(MAX_SOW_KEYS + 1)]
    reply = wire.request({"c": "sow_delete", "cid": "many", "t": topic, "k": keys})
    assert reply.header["status"] == "failure"
    assert reply.header["reason"] == (
        f"'k' names {MAX_SOW_KEYS + 1:,} keys: a sow_delete deletes at most "
        f"{MAX_SOW_KEYS:,} keys a command; split the list"
    )
    reply = wire.request(
        {"c": "sow_delete", "cid": "few", "t": topic, "k": keys[:3], "a": "processed"}
    )
    assert reply.header["status"] == "success"


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_publishing_sessions_share_one_producer(bare_gateway, wire_to, topic_factory):
    """Defect 5: each publishing connection built its own producer (3 threads each)."""
    topic = topic_factory(1, key=("/id",))
    first = wire_to(bare_gateway.address)
    first.logon("publisher-0")
    first.request({"c": "publish", "cid": "p", "t": topic, "a": "persisted"}, b'{"id": 0}')
    before = os_threads()
    wires = [wire_to(bare_gateway.address) for _ in range(8)]
    for number, wire in enumerate(wires, 1):
        wire.logon(f"publisher-{number}")
        reply = wire.request(
            {"c": "publish", "cid": "p", "t": topic, "a": "persisted"}, b'{"id": %d}' % number
        )
        assert reply.header["status"] == "success"
    assert os_threads() - before < 4  # 8 producers were 24+ threads


def test_pipelined_queries_are_paced_and_all_answered(served, wire_to):
    """Defect 6: 10k pipelined sow frames whose replies were not read each became a task
    and a reply in memory. Now a session runs at most MaxCommandsInFlight of them and
    stops reading meanwhile; every query is still answered, and others are served."""
    limit = 4
    served.gateway.settings = GatewayConfig(max_commands_in_flight=limit)  # before any session
    writer = wire_to(served.address)
    writer.logon("seed")
    for key in range(20):
        writer.send({"c": "publish", "t": served.topic}, b'{"id": %d, "pad": "%s"}' % (key, PAD))
    assert writer.request({"c": "flush", "cid": "f"}).header["status"] == "success"

    flood, other = wire_to(served.address), wire_to(served.address)
    flood.logon("flood")
    other.logon("other")
    queries = 3000
    frames = b"".join(
        encode_frame({"c": "sow", "cid": str(n), "t": served.topic}) for n in range(queries)
    )
    sender = threading.Thread(target=_send_ignoring_timeout, args=(flood, frames), daemon=True)
    sender.start()
    latencies = []
    for _ in range(20):
        latencies.append(heartbeat_seconds(other))
        tasks = on_loop(served.gateway, lambda: max(_tasks_per_session(served.gateway)))
        assert tasks <= limit
    assert max(latencies) < 2.0, latencies
    answered: list[str] = []  # queries run side by side, so they may end out of order

    def all_ended(frame: Frame) -> bool:
        if frame.header.get("c") == "group_end":
            answered.append(frame.header["cid"])
        return len(answered) == queries

    flood.until(all_ended)
    assert sorted(answered, key=int) == [str(n) for n in range(queries)]
    sender.join(10)


def _tasks_per_session(gateway: Gateway) -> list[int]:
    sessions: set[Session] = gateway._sessions
    return [len(session._tasks) for session in sessions] or [0]


def _send_ignoring_timeout(wire: Wire, data: bytes) -> None:
    """The gateway stops reading a flooding client: its send blocks until replies are read."""
    wire.sock.settimeout(None)
    wire.sock.sendall(data)


def test_results_a_connection_awaits_are_bounded() -> None:
    """qa15: `_results` (a peer's question for a sow_delete's counts) held a watch per
    sequence it named until the connection closed; without a PeerSecret any client may
    send it, and five 3 MB requests grew a worker by 440 MiB. A connection may await at
    most MAX_WATCHED results; what comes is delivered and frees its place."""
    tracker = DeleteTracker()
    greedy, other = object(), object()
    delivered: list[int] = []
    tracker.watch(greedy, "p", list(range(MAX_WATCHED)), lambda r: delivered.append(r.sequence))
    with pytest.raises(ProtocolError, match=f"at most {MAX_WATCHED:,} at once"):
        tracker.watch(greedy, "p", [MAX_WATCHED], delivered.append)
    tracker.watch(other, "q", [1], delivered.append)  # another connection is not held back
    tracker.apply([CommandResult("t", 0, 0, "sow_delete", "p", 0, None, deleted=1)])
    assert delivered == [0]
    tracker.watch(greedy, "p", [MAX_WATCHED], delivered.append)  # its place was freed
    tracker.forget(greedy)
    tracker.watch(greedy, "p", list(range(MAX_WATCHED)), delivered.append)  # all freed
