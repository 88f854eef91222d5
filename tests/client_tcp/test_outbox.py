"""The tcp:// client's write path: the Outbox (socket writes) and the AckBatcher (acks)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from amps_on_kafka.client import tcp_outbox
from amps_on_kafka.client.acks import AckBatcher
from amps_on_kafka.client.message import GatewayMessage
from amps_on_kafka.client.tcp_outbox import Outbox
from amps_on_kafka.protocol.frame_buffer import publish_frame
from amps_on_kafka.protocol.frames import FrameDecoder

WAIT = 10.0  # seconds an event that must happen may take


def read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        assert chunk, "the writer closed early"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@pytest.fixture
def pair():
    ours, peer = socket.socketpair()
    yield ours, peer
    ours.close()
    peer.close()


def test_frames_from_many_threads_arrive_whole_and_in_each_threads_order(pair):
    ours, peer = pair
    errors: list[str] = []
    outbox = Outbox(ours, errors.append)
    threads, per_thread = 4, 500

    def put_all(thread: int) -> None:
        for number in range(per_thread):
            assert outbox.put(f"{thread}:{number:04d};".encode())

    workers = [threading.Thread(target=put_all, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    data = read_exactly(peer, threads * per_thread * len(b"0:0000;"))
    for worker in workers:
        worker.join()
    outbox.close(WAIT)
    seen: dict[str, list[int]] = {}
    for item in data.decode().rstrip(";").split(";"):
        thread, number = item.split(":")
        seen.setdefault(thread, []).append(int(number))
    assert seen == {str(t): list(range(per_thread)) for t in range(threads)}
    assert errors == []


def test_publishers_wait_while_the_peer_reads_nothing_and_queue_at_most_max_outbox(
    pair, monkeypatch
):
    ours, peer = pair
    monkeypatch.setattr(tcp_outbox, "MAX_OUTBOX", 64 * 1024)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    outbox = Outbox(ours, lambda reason: None)
    frame, frames = b"x" * 8192, 100  # per publisher: far more than socket and outbox hold
    finished = [threading.Event(), threading.Event()]

    def publish(done: threading.Event) -> None:
        for _ in range(frames):
            assert outbox.put(frame)
        done.set()

    publishers = [threading.Thread(target=publish, args=(done,)) for done in finished]
    for publisher in publishers:
        publisher.start()
    assert not finished[0].wait(0.5), "the frames fitted without the peer reading"
    assert not finished[1].is_set()
    assert len(outbox.buffer) <= tcp_outbox.MAX_OUTBOX + len(frame)  # memory stays bounded
    read_exactly(peer, 2 * frames * len(frame))  # reading lets every frame through
    assert all(done.wait(WAIT) for done in finished)
    for publisher in publishers:
        publisher.join()
    outbox.close(WAIT)


def test_deferred_frames_go_out_by_the_writer_thread_in_order_with_the_others(pair):
    """A publish is deferred: the writer thread sends it, with whatever queued behind it;
    a lone one is not held back, and a command put after publishes comes after them."""
    ours, peer = pair
    outbox = Outbox(ours, lambda reason: None)
    assert outbox.put(b"lone;", deferred=True)
    assert read_exactly(peer, len(b"lone;")) == b"lone;"  # nothing else had to follow it
    frames = [f"p{n:03d};".encode() for n in range(300)]
    for frame in frames:
        assert outbox.put(frame, deferred=True)
    assert outbox.put(b"flush;")  # sent at once, or after what the writer holds
    expected = b"".join(frames) + b"flush;"
    assert read_exactly(peer, len(expected)) == expected
    outbox.close(WAIT)


def test_a_write_to_a_closed_peer_is_refused_and_reported(pair):
    ours, peer = pair
    errors: list[str] = []
    outbox = Outbox(ours, errors.append)
    peer.close()
    results = [outbox.put(b"frame") for _ in range(3)]
    assert results[-1] is False
    assert errors and errors[0].startswith("sending to the gateway failed")
    outbox.close(WAIT)


def test_a_frame_put_after_close_is_refused_and_not_sent(pair):
    """The idle socket's direct write (a command with nothing queued) refuses what the
    buffer would refuse: a frame put once the outbox closed is neither sent nor kept."""
    ours, peer = pair
    outbox = Outbox(ours, lambda reason: None)
    assert outbox.put(b"before;")
    assert read_exactly(peer, len(b"before;")) == b"before;"
    outbox.close(WAIT)
    assert outbox.put(b"after;") is False
    assert outbox.put(b"deferred;", deferred=True) is False
    ours.close()  # the peer reads the end: nothing came after the first frame
    assert peer.recv(64) == b""


class Sent:
    """What an AckBatcher sent, with an event per sow_delete."""

    def __init__(self) -> None:
        self.headers: list[dict] = []
        self.arrived = threading.Semaphore(0)
        self._taken = 0

    def __call__(self, header: dict) -> None:
        self.headers.append(header)
        self.arrived.release()

    def next(self) -> dict:
        assert self.arrived.acquire(timeout=WAIT), "no sow_delete was sent"
        self._taken += 1
        return self.headers[self._taken - 1]


def ack(batcher: AckBatcher, bookmark: str, option: str | None = None) -> None:
    """message.ack() of a leased queue message delivered with `batcher`'s connection."""
    message = GatewayMessage("publish", "q", {"bm": bookmark, "lp": 60_000, "n": 0})
    message.acks = batcher
    message.ack(option)


def test_a_full_batch_goes_at_once_as_one_comma_separated_sow_delete():
    sent = Sent()
    batcher = AckBatcher(sent, batch_size=3, timeout=60)
    for bookmark in ("q|0|1|", "q|0|2|", "q|0|3|"):
        ack(batcher, bookmark)
    assert sent.headers == [{"c": "sow_delete", "t": "q", "bm": "q|0|1|,q|0|2|,q|0|3|"}]
    batcher.close()


def test_a_partial_batch_goes_once_its_timeout_passes():
    sent = Sent()
    batcher = AckBatcher(sent, batch_size=100, timeout=0.01)
    ack(batcher, "q|0|1|")
    ack(batcher, "q|0|2|", "cancel")
    first, second = sent.next(), sent.next()
    assert {first["bm"], second["bm"]} == {"q|0|1|", "q|0|2|"}
    assert [h.get("o") for h in (first, second) if h["bm"] == "q|0|2|"] == ["cancel"]
    batcher.close()


def test_the_timer_still_sends_after_it_went_idle():
    """With nothing waiting the timer sleeps until a batch begins: each batch wakes it."""
    sent = Sent()
    batcher = AckBatcher(sent, batch_size=100, timeout=0.01)
    for number in range(3):
        ack(batcher, f"q|0|{number}|")
        assert sent.next()["bm"] == f"q|0|{number}|"
    batcher.close()


@pytest.mark.parametrize("size", [0, 2.5, True, "3"])
def test_an_ack_batch_size_is_a_whole_number_of_at_least_one(size):
    with pytest.raises(ValueError, match="ack batch size must be a whole number of at least 1"):
        AckBatcher(Sent()).configure(batch_size=size)


@pytest.mark.parametrize("seconds", [-0.001, float("nan")])
def test_an_ack_timeout_is_seconds_of_at_least_zero(seconds):
    with pytest.raises(ValueError, match="ack timeout must be seconds, at least 0"):
        AckBatcher(Sent()).configure(timeout=seconds)


def test_close_sends_what_waits():
    sent = Sent()
    batcher = AckBatcher(sent, batch_size=100, timeout=60)
    ack(batcher, "q|0|7|")
    started = time.monotonic()
    batcher.close()
    assert time.monotonic() - started < WAIT  # the timer's 60 s sleep was cut short
    assert sent.headers == [{"c": "sow_delete", "t": "q", "bm": "q|0|7|"}]


def test_plain_publishes_wait_past_max_outbox_and_arrive_numbered_in_order(pair, monkeypatch):
    """Outbox.publish, a plain publish's path: no lock unless the buffer was empty or full,
    yet bounded like put() (each blocked publisher's own frame queued already), and its
    frames reach the socket whole, numbered in the order queued."""
    ours, peer = pair
    monkeypatch.setattr(tcp_outbox, "MAX_OUTBOX", 64 * 1024)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    outbox = Outbox(ours, lambda reason: None)
    payload, count = b"x" * 8000, 100  # far more than socket and outbox hold
    numbers: list[int] = []
    done = threading.Event()

    def publish() -> None:
        for _ in range(count):
            numbers.append(outbox.publish("t", payload))
        done.set()

    publisher = threading.Thread(target=publish)
    publisher.start()
    assert not done.wait(0.5), "the frames fitted without the peer reading"
    assert len(outbox.buffer) <= tcp_outbox.MAX_OUTBOX + len(publish_frame("t", 0, payload))
    frame_size = len(publish_frame("t", numbers[0], payload))
    events = FrameDecoder(1 << 20, publishes=True).feed(read_exactly(peer, count * frame_size))
    assert done.wait(WAIT)
    publisher.join()
    assert numbers == list(range(numbers[0], numbers[0] + count))
    assert events == [("t", number, payload) for number in numbers]
    outbox.close(WAIT)
    assert outbox.publish("t", payload) is None  # closed: refused, not queued
