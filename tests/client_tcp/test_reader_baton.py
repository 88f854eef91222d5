"""The tcp:// client's reader baton (client/tcp_reader.py): a caller reads its own reply
when no other thread reads the socket, routing every other frame as the reader thread
would. Tried against a real gateway (callers beside a subscription flood, the reader
thread left asleep) and against a scripted one that misbehaves on cue (half a reply and
then a close, a reply that never comes, replies out of order, a close from another
thread)."""

from __future__ import annotations

import random
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log.publisher import FailedWrite
from amps_on_kafka.protocol.frames import Frame, FrameDecoder, encode_frame
from tests.polling import until
from tests.server.helpers import WAIT

KEYS = 20  # records the look-ups read, id k holding v = 10 * k
FLOOD = 3_000  # messages delivered to the subscription while the callers run


def callers_beside_a_flood(client: Client, publisher: Client, topic: str) -> None:
    """Three threads look up keys and send heartbeats on `client` while its subscription
    takes FLOOD messages published by `publisher`: every look-up gets its own record, and
    the subscription every message, in order (one key: one partition). The records are
    this call's own (a marker in their ids), so the topic may be shared."""
    marker = uuid.uuid4().hex[:8]
    for k in range(KEYS):
        publisher.publish(topic, {"id": f"{marker}-{k}", "v": 10 * k})
    publisher.publish_flush(WAIT)
    mine = f"/id LIKE '^{marker}-'"
    until(lambda: len(list(client.sow(topic, mine, timeout=WAIT))) >= KEYS, "the records stored")
    flooded = threading.Event()
    with (
        client.subscribe(topic, f"/flood = '{marker}'", timeout=WAIT) as stream,
        ThreadPoolExecutor(3) as pool,
    ):
        callers = [pool.submit(_look_up_until, client, topic, marker, flooded) for _ in range(3)]
        for n in range(FLOOD):
            publisher.publish(topic, {"id": f"{marker}-flood", "flood": marker, "n": n})
        publisher.publish_flush(WAIT)
        try:
            delivered = [stream.next(timeout=WAIT) for _ in range(FLOOD)]
        finally:
            flooded.set()
        assert [m.data["n"] for m in delivered if m is not None] == list(range(FLOOD))
        assert all(caller.result(WAIT) >= 20 for caller in callers)


def _look_up_until(client: Client, topic: str, marker: str, done: threading.Event) -> int:
    """Look-ups and heartbeats until `done` (and at least 20); how many look-ups."""
    rng, count = random.Random(), 0
    while count < 20 or not done.is_set():
        k = rng.randrange(KEYS)
        [record] = client.sow(topic, f"/id = '{marker}-{k}'", timeout=WAIT)
        assert record.data == {"id": f"{marker}-{k}", "v": 10 * k}
        client.heartbeat(WAIT)
        count += 1
    return count


def test_callers_and_a_subscription_flood_share_one_connection(served, client_to):
    callers_beside_a_flood(
        client_to(served.address), client_to(served.address, "flooder"), served.topic
    )


def test_back_to_back_commands_leave_the_reader_thread_asleep(bare_gateway, client_to):
    """Each caller reads its own heartbeat's reply: the reader thread, parked, is not
    woken per round trip (before the baton it was, at least once each)."""
    client = client_to(bare_gateway.address)
    client.heartbeat(WAIT)
    reader = client._transport._reader._thread  # type: ignore[union-attr]
    switches = Path(f"/proc/self/task/{reader.native_id}/status")
    if not switches.exists():
        pytest.skip("needs Linux's /proc to count the reader thread's wake-ups")
    before = _voluntary_switches(switches)
    for _ in range(200):
        client.heartbeat(WAIT)
    assert _voluntary_switches(switches) - before < 100


def _voluntary_switches(status: Path) -> int:
    for line in status.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in " + str(status))


def test_a_refused_publish_reaches_the_handler_while_no_caller_reads(
    bare_gateway, client_to, topic_factory
):
    """No command waits: the reader thread reads again once callers are quiet."""
    topic = topic_factory(1, key=("/id",))
    client = client_to(bare_gateway.address)
    refused = threading.Event()
    failures: list[FailedWrite] = []
    client.set_failed_write_handler(lambda failure: (failures.append(failure), refused.set()))
    sequence = client.publish(topic, {"qty": 1})  # no SOW key: the gateway refuses it
    assert refused.wait(WAIT)
    assert [(f.topic, f.sequence) for f in failures] == [(topic, sequence)]


# -- a scripted gateway ------------------------------------------------------------------
class ScriptedGateway:
    """The gateway's side of one connection, played by the test: frames in, bytes out."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(1 << 30)
        self._frames: list[Frame] = []

    def accept(self) -> None:
        self._listener.settimeout(WAIT)
        self._sock, _ = self._listener.accept()
        self._sock.settimeout(WAIT)

    def recv(self) -> Frame:
        """The client's next frame."""
        assert self._sock is not None
        while not self._frames:
            data = self._sock.recv(1 << 16)
            assert data, "the client closed the connection"
            self._frames += self._decoder.feed(data)
        return self._frames.pop(0)

    def send(self, data: bytes) -> None:
        assert self._sock is not None
        self._sock.sendall(data)

    def answer(self) -> None:
        """The next frame's processed ack (its cid, and its sub_id if any)."""
        header = self.recv().header
        sub_id = {"sub_id": header["sub_id"]} if "sub_id" in header else {}
        self.send(ack(header["cid"], **sub_id))

    def kill(self) -> None:
        """Close the connection abruptly, as a gateway killed mid-write (RST)."""
        assert self._sock is not None
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._sock.close()

    def close(self) -> None:
        for sock in (self._sock, self._listener):
            if sock is not None:
                sock.close()


def ack(cid: str, **fields: Any) -> bytes:
    return encode_frame({"c": "ack", "cid": cid, "a": "processed", "status": "success", **fields})


Scripted = tuple["ScriptedGateway", Client, ThreadPoolExecutor]


@contextmanager
def scripted_client(workers: int = 4) -> Iterator[Scripted]:
    """A client logged on to a scripted gateway, and threads to run its calls on (a
    context manager too, for hypothesis tests, whose examples can't share a fixture)."""
    gateway = ScriptedGateway()
    client = Client(f"scripted-{uuid.uuid4().hex[:6]}")
    with ThreadPoolExecutor(workers) as pool:
        client.connect(f"tcp://{gateway.address}/amps/json")
        gateway.accept()
        logon = pool.submit(client.logon, WAIT)
        gateway.answer()
        logon.result(WAIT)
        try:
            yield gateway, client, pool
        finally:
            client.close()
            gateway.close()


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    with scripted_client() as scripted:
        yield scripted


def test_replies_out_of_order_reach_their_own_callers(scripted):
    """Four callers at once; the gateway answers them in reverse: whoever reads routes
    each reply to its caller."""
    gateway, client, pool = scripted
    calls = [pool.submit(client.sow_delete, "t", keys=[str(n)]) for n in range(4)]
    commands = [gateway.recv() for _ in calls]
    by_key = {frame.header["k"][0]: frame.header["cid"] for frame in commands}
    for n in reversed(range(4)):
        gateway.send(ack(by_key[str(n)], matches=n))
        assert calls[n].result(WAIT).matches == n


@pytest.mark.parametrize("subscribed", [False, True], ids=["alone", "beside-a-subscription"])
def test_the_gateway_killed_mid_reply_fails_every_waiter(scripted, subscribed):
    gateway, client, pool = scripted
    stream = None
    if subscribed:
        opened = pool.submit(client.subscribe, "t")
        gateway.answer()
        stream = opened.result(WAIT)
    waiters = [pool.submit(client.heartbeat, None) for _ in range(2)]
    first = gateway.recv()
    gateway.recv()
    reply = ack(first.header["cid"])
    gateway.send(reply[: len(reply) // 2])
    gateway.kill()
    for waiter in waiters:
        with pytest.raises(TransportError, match="connection"):
            waiter.result(WAIT)
    if stream is not None:
        with pytest.raises(TransportError, match="connection"):
            stream.next(timeout=WAIT)
    with pytest.raises(TransportError, match="connection"):
        client.heartbeat(WAIT)


def test_a_caller_that_times_out_gives_the_socket_back_and_loses_nothing(scripted, caplog):
    """A caller times out with half a frame read: the next reader finishes that frame,
    routes a refused publish to the handler (which raises: logged, reading goes on) and
    takes its own reply from the same read."""
    gateway, client, pool = scripted
    failures: list[FailedWrite] = []
    client.set_failed_write_handler(_raising(failures.append))
    late = pool.submit(client.heartbeat, 0.3)
    late_reply = ack(gateway.recv().header["cid"])
    gateway.send(late_reply[:7])
    with pytest.raises(TransportError, match=r"no reply from the gateway .* in 0\.3s"):
        late.result(WAIT)
    on_time = pool.submit(client.heartbeat, WAIT)
    refused = encode_frame({"c": "ack", "status": "failure", "t": "t", "s": 9, "reason": "no"})
    gateway.send(late_reply[7:] + refused + ack(gateway.recv().header["cid"]))
    on_time.result(WAIT)
    assert [(f.topic, f.sequence, f.reason) for f in failures] == [("t", 9, "no")]
    assert "the failed-write handler raised" in caplog.text


def _raising(record: Callable[[FailedWrite], None]) -> Callable[[FailedWrite], None]:
    def handler(failure: FailedWrite) -> None:
        record(failure)
        raise RuntimeError("the application's handler failed")

    return handler


def test_close_from_another_thread_ends_a_caller_reading_for_its_reply(scripted):
    gateway, client, pool = scripted
    waiting: Future = pool.submit(client.heartbeat, None)  # no limit: only close ends it
    gateway.recv()
    client.close()
    with pytest.raises(TransportError, match="connection"):
        waiting.result(WAIT)


# -- subscriptions: the reader thread reads for them ------------------------------------
def burst(sub_id: str, first: int, count: int, size: int = 2) -> bytes:
    """A queue's burst frame (option `batch`) of `count` messages of `size` bytes each,
    bookmarks q|0|first| onwards."""
    recs = [{"bm": f"q|0|{n}|", "lp": 60_000, "n": size} for n in range(first, first + count)]
    header = {"c": "publish", "t": "q", "sub_id": sub_id, "recs": recs}
    return encode_frame(header, b"0" * size * count)


def subscribed(gateway: ScriptedGateway, client: Client, pool: ThreadPoolExecutor) -> tuple:
    """A queue subscription opened through the scripted gateway: its stream and sub_id."""
    opened = pool.submit(client.subscribe, "q", options="max_backlog=1000,batch")
    header = gateway.recv().header
    gateway.send(ack(header["cid"], sub_id=header["sub_id"]))
    return opened.result(WAIT), header["sub_id"]


def test_acks_go_out_on_their_timeout_while_the_stream_waits(scripted):
    """The application acks, then its stream waits for more: the partial batch goes out
    after the ack timeout (the timer writes, whoever holds the socket to read)."""
    gateway, client, pool = scripted
    client.set_ack_batch_size(100)
    client.set_ack_timeout(0.05)
    stream, sub_id = subscribed(gateway, client, pool)
    gateway.send(burst(sub_id, 1, 3))
    for _ in range(3):
        stream.next(timeout=WAIT).ack()
    more = pool.submit(stream.next, WAIT)
    bookmarks: list[str] = []
    while len(bookmarks) < 3:  # one sow_delete, or more if the host was slow between acks
        header = gateway.recv().header
        assert (header["c"], header["t"]) == ("sow_delete", "q")
        bookmarks += header["bm"].split(",")
    assert bookmarks == ["q|0|1|", "q|0|2|", "q|0|3|"]
    gateway.send(burst(sub_id, 4, 1))
    assert more.result(WAIT).bookmark == "q|0|4|"


def test_a_busy_applications_subscription_is_still_read(scripted):
    """Nobody iterates the stream (the application is busy): the reader thread reads its
    deliveries, so the gateway can write them all (32 MiB, more than both sockets'
    buffers hold: it is not cut as a slow consumer) and the stream then has them, in
    order."""
    gateway, client, pool = scripted
    stream, sub_id = subscribed(gateway, client, pool)
    frames = [burst(sub_id, 1000 * n, 1000, size=2048) for n in range(16)]
    for frame in frames:
        gateway.send(frame)  # a socket timeout (WAIT) here: nobody read them
    bookmarks = [stream.next(timeout=WAIT).bookmark for _ in range(16_000)]
    assert bookmarks == [f"q|0|{n}|" for n in range(16_000)]


def test_two_subscriptions_on_one_connection_each_get_theirs(scripted):
    """Two streams of one connection iterated by two threads, their bursts interleaved:
    each gets its own, in order."""
    gateway, client, pool = scripted
    (first, first_id), (second, second_id) = (subscribed(gateway, client, pool) for _ in "ab")

    def take(stream: Any) -> list[str]:
        return [stream.next(timeout=WAIT).bookmark for _ in range(500)]

    takers = [pool.submit(take, first), pool.submit(take, second)]
    for n in range(100):
        gateway.send(burst(first_id, 5 * n, 5) + burst(second_id, 10_000 + 5 * n, 5))
    assert takers[0].result(WAIT) == [f"q|0|{n}|" for n in range(500)]
    assert takers[1].result(WAIT) == [f"q|0|{n}|" for n in range(10_000, 10_500)]
