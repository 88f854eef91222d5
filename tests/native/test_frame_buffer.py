"""The compiled outbox bytes of a tcp:// client (native/src/frame_buffer.rs, FrameBuffer)
against their twin (protocol/frame_buffer.py, PyFrameBuffer).

Two buffers numbered alike take the same calls — plain publishes to topics that need
escaping (quotes, backslashes, control characters, non-ASCII, a lone surrogate) or are
not text at all, payloads that are not bytes, reservations of sequence numbers (none,
many, negative, past 64 bits), frames appended whole, takes and a close — and must
answer each call alike (the same sequence numbers, the same bytes pending, the same
error) and hold the same bytes, which the gateway's decoder reads back as the publishes
made.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.native import core
from amps_on_kafka.protocol.frame_buffer import MAX_SEQUENCE, PyFrameBuffer, publish_frame
from amps_on_kafka.protocol.frames import FrameDecoder

topics = st.text(max_size=6) | st.sampled_from(['a"b', "a\\b", "\x00\x1f\x7f", "é😀", "\ud800"])
payloads = st.binary(max_size=8) | st.sampled_from([b"{}", bytearray(b"[1]"), "text", None])
calls = st.lists(
    st.tuples(st.just("publish"), topics | st.just(7), payloads)
    | st.tuples(st.just("reserve"), st.integers(-2, 3) | st.just(2**64))
    | st.tuples(st.just("append"), st.binary(max_size=6))
    | st.tuples(st.sampled_from(["take", "close", "len"])),
    max_size=12,
)
firsts = st.integers(0, 2**53) | st.sampled_from([MAX_SEQUENCE - 2, -5])


def outcome(buffer: Any, call: tuple[Any, ...]) -> Any:
    """What one call gives: its result or its error's type."""
    name, *args = call
    try:
        return len(buffer) if name == "len" else getattr(buffer, name)(*args)
    except Exception as exc:  # the same error from both is what is compared
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(firsts, calls)
@example(1, [("publish", "orders", b'{"id":1}'), ("publish", "o", b""), ("take",)])
@example(MAX_SEQUENCE, [("publish", "a", b"1"), ("reserve", 0), ("reserve", 1)])
@example(3, [("close",), ("publish", "a", b"x"), ("append", b"y"), ("reserve", 1)])
@example(3, [("publish", "\ud800", b"x"), ("publish", 7, b"x"), ("publish", "a", None)])
def test_compiled_buffer_answers_as_its_twin(first: int, steps: list[tuple[Any, ...]]) -> None:
    compiled = core.FrameBuffer(first, publish_frame)  # type: ignore[union-attr]
    twin = PyFrameBuffer(first, publish_frame)
    for step in [*steps, ("len",), ("take",)]:
        assert outcome(compiled, step) == outcome(twin, step), step


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(topics.filter(lambda t: "\ud800" not in t), st.binary(max_size=8))))
def test_published_frames_read_back_as_the_publishes(publishes: list[tuple[str, bytes]]) -> None:
    """The gateway's decoder reads the bytes as the very publishes, numbered in order."""
    buffer = core.FrameBuffer(100, publish_frame)  # type: ignore[union-attr]
    numbers = [buffer.publish(topic, payload)[0] for topic, payload in publishes]
    events = FrameDecoder(1 << 20, publishes=True).feed(buffer.take())
    assert events == [(t, n, p) for (t, p), n in zip(publishes, numbers, strict=True)]
    assert numbers == list(range(100, 100 + len(publishes)))


@pytest.mark.parametrize("cls", [PyFrameBuffer, core and core.FrameBuffer])
def test_a_closed_buffer_refuses_frames_and_keeps_what_it_holds(cls: Any) -> None:
    buffer = cls(1, publish_frame)
    assert buffer.append(b"abc") == 0
    assert buffer.publish("t", b"{}") == (1, 3)
    buffer.close()
    assert buffer.append(b"d") == -1
    assert buffer.publish("t", b"{}") == (2, -1)  # numbered, not queued
    assert buffer.take() == b"abc" + publish_frame("t", 1, b"{}")
    assert len(buffer) == 0


@pytest.mark.parametrize("cls", [PyFrameBuffer, core and core.FrameBuffer])
def test_publishes_from_several_threads_are_queued_in_sequence_order(cls: Any) -> None:
    """Numbering and queueing are one step in both: a publish numbered later never lands
    before one numbered earlier, whichever thread made it."""
    buffer = cls(0, publish_frame)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes
    try:
        threads = [
            threading.Thread(target=lambda: [buffer.publish("t", b"{}") for _ in range(2_000)])
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    numbers = [n for _, n, _ in FrameDecoder(1 << 20, publishes=True).feed(buffer.take())]
    assert numbers == list(range(8_000))
