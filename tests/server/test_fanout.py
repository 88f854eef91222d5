"""The gateway over a real SowEngine whose PartitionStore the test fills itself.

Batches are applied exactly as the worker does (write under the engine lock, then
notify), at moments the test chooses: around a sow_and_subscribe snapshot, as an
expiration, or faster than a subscriber reads.
"""

from __future__ import annotations

import random
import string
import threading
from collections.abc import Iterator

import orjson
import pytest

from amps_on_kafka.server import fanout, subscriptions
from amps_on_kafka.state.events import ChangeKind
from tests.server.conftest import TOPIC, fanned_out
from tests.server.helpers import is_ack
from tests.server.test_fairness import EXPENSIVE


@pytest.fixture
def wire(direct, wire_to):
    connection = wire_to(direct[1].address)
    connection.logon("direct-test")
    return connection


def test_sow_and_subscribe_delivers_exactly_the_batches_after_its_snapshot(direct, wire):
    """A batch applied after the subscription exists but before the snapshot is in the
    snapshot and must not be delivered again; one applied after it must be."""
    source, gateway = direct
    source.upsert(a={"id": "a", "v": 0}, b={"id": "b", "v": 0})
    source.engine.before_snapshot = lambda: source.upsert(a={"id": "a", "v": 1})
    source.engine.after_snapshot = lambda: source.upsert(b={"id": "b", "v": 1})
    wire.send({"c": "sow_and_subscribe", "cid": "q", "sub_id": "q", "t": TOPIC})
    frames = wire.until(lambda f: f.header["c"] == "group_end")
    snapshot = {m["k"]: orjson.loads(p) for m, p in records_of(frames)}
    assert snapshot == {"a": {"id": "a", "v": 1}, "b": {"id": "b", "v": 0}}
    live = wire.recv()
    assert (live.header["c"], orjson.loads(live.payload)) == ("publish", {"id": "b", "v": 1})
    source.engine.before_snapshot = source.engine.after_snapshot = lambda: None
    fanned_out(gateway)
    fence = wire.request({"c": "sow", "cid": "fence", "t": TOPIC})
    assert fence.header["c"] == "group_begin"  # "a" v1 was not delivered twice


def test_changes_during_a_snapshot_wait_for_group_end(direct, wire):
    source, _ = direct
    source.upsert(**{str(i): {"id": i} for i in range(50)})
    source.engine.after_snapshot = lambda: source.upsert(new={"id": "new"})
    wire.send({"c": "sow_and_subscribe", "cid": "q", "t": TOPIC, "bs": 1})
    frames = wire.until(lambda f: f.header["c"] == "publish")
    kinds = [f.header["c"] for f in frames]
    assert kinds == ["group_begin", *["sow"] * 50, "group_end", "publish"]
    assert {f.header["sub_id"] for f in frames} == {"q"}  # the cid, when no sub_id is given


def test_a_snapshot_outrun_by_more_live_changes_than_can_be_held_fails_the_subscription(
    direct, wire, monkeypatch
):
    """The changes held while a snapshot goes out are bounded: past the limit the
    subscription fails with a reason instead of growing without end or going live with
    a gap, and the connection goes on."""
    monkeypatch.setattr(subscriptions, "MAX_HELD_CHANGES", 3)
    source, gateway = direct
    source.upsert(a={"id": "a"})

    def outrun() -> None:  # the changes reach the subscription before its snapshot ends
        source.upsert(**{k: {"id": k} for k in "bcdef"})
        fanned_out(gateway)

    source.engine.after_snapshot = outrun
    wire.send({"c": "sow_and_subscribe", "cid": "q", "sub_id": "q", "t": TOPIC})
    frames = wire.until(lambda f: f.header["c"] == "ack")
    failure = frames[-1].header
    assert [f.header["c"] for f in frames] == ["group_begin", "sow", "group_end", "ack"]
    assert failure["status"] == "failure" and "more than 3 changes arrived" in failure["reason"]
    source.engine.after_snapshot = lambda: None
    source.upsert(g={"id": "g"})  # the failed subscription no longer delivers
    fanned_out(gateway)
    fence = wire.request({"c": "sow", "cid": "fence", "t": TOPIC})
    assert fence.header["c"] == "group_begin"


def test_oof_expired_and_deleted_only_for_records_that_matched(direct, wire):
    source, gateway = direct
    source.upsert(
        hot={"id": "hot", "t": 90}, cold={"id": "cold", "t": 10}, warm={"id": "warm", "t": 80}
    )
    wire.send(
        {"c": "subscribe", "cid": "s", "t": TOPIC, "f": "/t > 50", "o": "oof", "a": "processed"}
    )
    assert is_ack(wire.recv(), "processed")
    source.remove(ChangeKind.EXPIRE, "hot", "cold")
    source.remove(ChangeKind.DELETE, "warm")
    first, second = wire.recv(), wire.recv()
    assert (first.header["reason"], first.header["k"], orjson.loads(first.payload)["t"]) == (
        "expired",
        "hot",
        90,
    )
    assert (second.header["reason"], second.header["k"]) == ("deleted", "warm")
    fanned_out(gateway)
    assert wire.request({"c": "sow", "cid": "fence", "t": TOPIC}).header["c"] == "group_begin"


def test_a_subscriber_that_does_not_read_is_disconnected_and_others_go_on(
    direct, wire, wire_to, caplog
):
    source, gateway = direct
    wire.send({"c": "subscribe", "cid": "s", "t": TOPIC, "a": "processed"})
    assert is_ack(wire.recv(), "processed")
    other = wire_to(gateway.address)
    other.logon("reader")
    pad = "x" * 10_000
    for batch in range(400):  # 40 MB: more than the socket buffers and the 1 MiB allowed
        source.upsert(**{f"{batch}-{i}": {"id": f"{batch}-{i}", "pad": pad} for i in range(10)})
    # Every delivery is written before this test starts reading (and draining): the slow
    # subscriber's queue overflowed, and the other session is still served.
    fanned_out(gateway)
    assert is_ack(other.request({"c": "heartbeat", "cid": "hb"}), "heartbeat")
    assert wire.is_closed()
    assert gateway.stats.slow_consumers == 1  # what amps_gateway_slow_consumers_total shows
    [logged] = [r for r in caplog.records if getattr(r, "event", None) == "slow_consumer"]
    assert logged.subscriptions == 1 and logged.peer[0] == "127.0.0.1"  # once, with context


def test_a_subscription_whose_filter_cannot_keep_up_is_failed_and_the_others_go_on(
    direct, wire, wire_to, monkeypatch
):
    """Past the fan-out backlog's bound, the subscription that cost the last job the most
    is failed with a reason; a cheap one on the same topic still gets every change, in
    order. The loop is held while the batches come, so all wait in the backlog."""
    monkeypatch.setattr(fanout, "JOB_CHANGES", 1)
    monkeypatch.setattr(fanout, "MAX_BACKLOG_CHANGES", 2)
    source, gateway = direct
    costly = EXPENSIVE.replace("/id >= 0", "/id <> 'none'")
    request = {"c": "subscribe", "sub_id": "costly", "t": TOPIC, "f": costly, "a": "processed"}
    assert is_ack(wire.request({**request, "cid": "costly"}), "processed")
    cheap = wire_to(gateway.address)
    cheap.logon("cheap")
    assert is_ack(
        cheap.request({"c": "subscribe", "cid": "cheap", "t": TOPIC, "a": "processed"}), "processed"
    )
    note = "".join(random.Random(5).choices(string.ascii_lowercase, k=100_000))
    gate = threading.Event()
    gateway.loop.call_soon_threadsafe(gate.wait, 30)
    for i in range(6):
        source.upsert(**{str(i): {"id": str(i), "note": note}})
    gate.set()
    frames = wire.until(lambda f: f.header["c"] == "ack")
    assert frames[-1].header["status"] == "failure"
    assert frames[-1].header["sub_id"] == "costly"
    assert "can't keep up" in frames[-1].header["reason"]
    assert [cheap.recv().header["k"] for _ in range(6)] == [str(i) for i in range(6)]
    fanned_out(gateway)
    assert is_ack(wire.request({"c": "heartbeat", "cid": "hb"}), "heartbeat")  # nothing more


def records_of(frames) -> Iterator[tuple[dict, bytes]]:
    for frame in frames:
        offset = 0
        for meta in frame.header.get("recs", ()):
            yield meta, frame.payload[offset : offset + meta["n"]]
            offset += meta["n"]
