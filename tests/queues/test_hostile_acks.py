"""Acks as a confused or hostile client sends them, over the gateway: another session's
bookmarks, bookmarks no message has, garbage, the same bookmark twice, an ack from a
subscriber after it left. The queue answers and ends the same with the compiled core's
acks, dispatch and enqueue (native/src/queue_*.rs) as with their twins."""

from __future__ import annotations

from typing import Any

import pytest

from amps_on_kafka.state.queue import QueueState
from tests.queues.helpers import eventually
from tests.server.helpers import Wire

COMPILED_PARTS = ("_acks_compiled", "_dispatch_compiled", "_enqueue_compiled")


def _deliveries(wire: Wire, count: int) -> list[str]:
    """The bookmarks of the next `count` messages delivered to the wire's subscription."""
    bookmarks: list[str] = []
    while len(bookmarks) < count:
        frame = wire.recv()
        if frame.header.get("c") == "publish":
            bookmarks.append(frame.header["bm"])
    return bookmarks


def _request(wire: Wire, header: dict[str, Any]) -> tuple[str, str]:
    reply = wire.request({**header, "a": "processed"})
    reason = reply.header.get("reason", "").replace(header["t"], "Q") if "t" in header else ""
    return reply.header["status"], reason


def _scenario(served: Any, publish: Any) -> list[Any]:
    queue, state = served.queue, lambda: served.engine.runtimes[served.queue].state
    holder, stranger = Wire(served.address), Wire(served.address)
    try:
        holder.logon("holder")
        stranger.logon("stranger")
        subscribe = {"c": "subscribe", "t": queue, "sub_id": "s", "o": "max_backlog=4"}
        assert _request(holder, {**subscribe, "cid": "sub"}) == ("success", "")
        publish(queue, 4)
        eventually(served.engine, lambda: state().depth == 4)
        b0, b1, b2, b3 = _deliveries(holder, 4)

        def ack(wire: Wire, bookmarks: str) -> tuple[str, str, int]:
            answer = _request(wire, {"c": "sow_delete", "t": queue, "bm": bookmarks, "cid": "a"})
            return (*answer, state().depth)

        return [
            ack(stranger, b0),  # another session's lease (Leasing strict)
            ack(stranger, f"{queue}|0|999999|"),  # a message there is not (yet)
            ack(holder, "not|a|bookmark"),
            ack(holder, f"{b1},{b1},{b1}"),  # the same message three times
            ack(holder, b1),  # again, once removed
            _request(holder, {"c": "unsubscribe", "sub_id": "s", "cid": "u", "t": queue}),
            ack(holder, b2),  # after it left: its leases went with it
            ack(stranger, f"{b3},{b0}"),
        ]
    finally:
        holder.close()
        stranger.close()


@pytest.mark.parametrize("compiled", [True, False])
def test_hostile_acks_answer_alike_with_or_without_the_compiled_core(
    compiled, serve, queue_config, publisher, monkeypatch
):
    if compiled and QueueState._acks_compiled is None:
        pytest.skip("no compiled core (AMPS_NATIVE=0)")
    if not compiled:
        for part in COMPILED_PARTS:
            monkeypatch.setattr(QueueState, part, None)
    served = serve(queue_config(LeasePeriod="1h"))

    def publish(queue: str, count: int) -> None:
        for n in range(count):
            publisher.publish(queue, {"n": n})
        publisher.flush(30)

    outcome = _scenario(served, publish)
    strict = "not leased to this client (Leasing strict): "
    malformed = "malformed bookmark 'not|a|bookmark': expected 0 (EPOCH), 0|1| (NOW), "
    assert outcome == [
        ("failure", strict + "Q|0|0|", 4),
        ("success", "", 4),  # nothing to remove: past the end of the log, not remembered
        ("failure", malformed + "YYYYmmddTHHMMSS[Z] or topic|partition|offset|", 4),
        ("success", "", 3),  # removed once
        ("success", "", 3),
        ("success", ""),
        ("failure", strict + "Q|0|2|", 3),  # its lease went with its subscription:
        ("failure", strict + "Q|0|3|,Q|0|0|", 3),  # available again, acked by no one
    ]
