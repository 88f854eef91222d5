"""A long filter compiles off the event loop (defect 2 of the hardening issue: one query
must not freeze the worker). Tokenizing and parsing 64 KiB of filter is 0.1-0.2 s of
Python; on the event loop every other session waited for it. The test orders events
instead of timing them: the other session's heartbeat, sent once the gateway has said it
received the long filter, is answered before that filter's compile error comes back."""

from __future__ import annotations

import threading
import time

import pytest

from amps_on_kafka.expr.parser import MAX_BYTES
from tests.server.helpers import Wire, is_ack


def long_bad_filter() -> str:
    """Nearly MAX_BYTES of IN list, then a backreference: refused only at its very end."""
    tail = r" AND /name LIKE '(a)\1'"
    values, length, i = [], len("/id IN ()") + len(tail), 0
    while length + len(str(i)) + 2 < MAX_BYTES:
        values.append(str(i))
        length += len(str(i)) + 2
        i += 1
    return f"/id IN ({', '.join(values)}){tail}"


class FailureWatch(threading.Thread):
    """Notes the `received` ack of a command (sent once the gateway has the whole frame,
    before it compiles the filter), then when the command's refusal arrives."""

    def __init__(self, wire: Wire) -> None:
        super().__init__(daemon=True)
        self.wire = wire
        self.received = threading.Event()
        self.reason: str | None = None
        self.at: float | None = None

    def run(self) -> None:
        try:
            self.wire.until(lambda f: is_ack(f, "received"), timeout=60)
            self.received.set()
            frame = self.wire.until(lambda f: f.header.get("status") == "failure", timeout=60)[-1]
            self.at = time.monotonic()
            self.reason = frame.header.get("reason")
        finally:
            self.received.set()


@pytest.mark.parametrize(
    "command",
    [
        {"c": "sow"},
        {"c": "sow_and_subscribe", "sub_id": "s"},
        {"c": "subscribe", "sub_id": "s"},
        {"c": "sow_delete"},
    ],
    ids=lambda command: command["c"],
)
def test_a_heartbeat_is_answered_while_another_sessions_long_filter_compiles(
    served, wire_to, command
) -> None:
    text = long_bad_filter()
    assert len(text) <= MAX_BYTES
    compiler, other = wire_to(served.address), wire_to(served.address)
    compiler.logon("compiler")
    other.logon("other")
    watch = FailureWatch(compiler)
    watch.start()
    compiler.send({**command, "cid": "q", "t": served.topic, "f": text, "a": "received"})
    assert watch.received.wait(60)
    assert is_ack(other.request({"c": "heartbeat", "cid": "hb"}), "heartbeat")
    answered_at = time.monotonic()
    watch.join(60)
    assert watch.reason is not None and "backreferences not supported" in watch.reason
    assert watch.at is not None and answered_at < watch.at


def test_a_sow_and_subscribe_with_a_bad_filter_is_refused_and_holds_no_subscription(
    served, wire_to
) -> None:
    wire = wire_to(served.address)
    wire.logon()
    header = {"c": "sow_and_subscribe", "cid": "s", "sub_id": "s", "t": served.topic}
    reply = wire.request({**header, "f": "/a LIKE '(?=x)'"})
    assert reply.header.get("status") == "failure"
    assert "lookahead" in reply.header["reason"]
    good = wire.request({**header, "cid": "s2", "f": "/id = 1", "a": "completed"})
    assert good.header.get("status") != "failure"  # the sub_id was not left taken
