"""The gateway over a real SowEngine whose PartitionStore the test fills itself.

Batches are applied exactly as the worker does (write under the engine lock, then
notify), at moments the test chooses: around a sow_and_subscribe snapshot, as an
expiration, or faster than a subscriber reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.processor.engine import QueryResult, SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.server import subscriptions
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.state.events import BatchApplied, Change, ChangeKind
from amps_on_kafka.state.record import SowRecord
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore, StateBatch
from tests.server.helpers import is_ack

TOPIC = "direct"


class SteppedEngine(SowEngine):
    """A real engine whose queries can run test code just before and after the snapshot."""

    before_snapshot: Callable[[], None] = staticmethod(lambda: None)
    after_snapshot: Callable[[], None] = staticmethod(lambda: None)

    def query(self, *args, **kwargs) -> QueryResult:
        self.before_snapshot()
        result = super().query(*args, **kwargs)
        self.after_snapshot()
        return result


class Direct:
    """Applies upserts and removals to the store and tells the engine, like the worker."""

    def __init__(self, engine: SowEngine, store: PartitionStore) -> None:
        self.engine = engine
        self.store = store
        self.offset = 0

    def upsert(self, **docs: dict) -> None:
        self._apply({key: doc for key, doc in docs.items()}, ChangeKind.UPSERT)

    def remove(self, kind: ChangeKind, *keys: str) -> None:
        self._apply(dict.fromkeys(keys), kind)

    def _apply(self, docs: dict[str, dict | None], kind: ChangeKind) -> None:
        batch, changes = StateBatch(self.store), []
        for key, doc in docs.items():
            old = batch.get(key)
            new = None if doc is None else self._record(key, doc)
            batch.set(key, new)
            changes.append(Change(TOPIC, key, kind, old, new))
        with self.engine.lock:
            self.store.write(batch)
            self.engine.notify(BatchApplied(changes, []))

    def _record(self, key: str, doc: dict) -> SowRecord:
        self.offset += 1
        return SowRecord(TOPIC, 0, key, orjson.dumps(doc), self.offset, now_ms(), codec=JSON)


@pytest.fixture
def direct(bootstrap, tmp_path) -> Iterator[tuple[Direct, Gateway]]:
    config = Config.model_validate(
        {
            "Topics": [{"Name": TOPIC}],
            "SOW": [{"Topic": TOPIC, "Key": "/id", "Expiration": "enabled"}],
        }
    )
    engine = SteppedEngine(config, {TOPIC: SowRules(config.sow[0], JSON)}, now_ms)
    store = PartitionStore(tmp_path / "store", TOPIC, 0, JSON)
    engine.attach(store)
    settings = GatewayConfig(max_queued_bytes=1024 * 1024)
    gateway = Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings)
    gateway.start()
    yield Direct(engine, store), gateway
    gateway.stop()
    engine.detach(TOPIC, 0)
    store.close()


@pytest.fixture
def wire(direct, wire_to):
    connection = wire_to(direct[1].address)
    connection.logon("direct-test")
    return connection


def test_sow_and_subscribe_delivers_exactly_the_batches_after_its_snapshot(direct, wire):
    """A batch applied after the subscription exists but before the snapshot is in the
    snapshot and must not be delivered again; one applied after it must be."""
    source, _ = direct
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
    source, _ = direct
    source.upsert(a={"id": "a"})
    source.engine.after_snapshot = lambda: source.upsert(**{k: {"id": k} for k in "bcdef"})
    wire.send({"c": "sow_and_subscribe", "cid": "q", "sub_id": "q", "t": TOPIC})
    frames = wire.until(lambda f: f.header["c"] == "ack")
    failure = frames[-1].header
    assert [f.header["c"] for f in frames] == ["group_begin", "sow", "group_end", "ack"]
    assert failure["status"] == "failure" and "more than 3 changes arrived" in failure["reason"]
    source.engine.after_snapshot = lambda: None
    source.upsert(g={"id": "g"})  # the failed subscription no longer delivers
    fence = wire.request({"c": "sow", "cid": "fence", "t": TOPIC})
    assert fence.header["c"] == "group_begin"


def test_oof_expired_and_deleted_only_for_records_that_matched(direct, wire):
    source, _ = direct
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
    assert wire.request({"c": "sow", "cid": "fence", "t": TOPIC}).header["c"] == "group_begin"


def test_a_subscriber_that_does_not_read_is_disconnected_and_others_go_on(direct, wire, wire_to):
    source, gateway = direct
    wire.send({"c": "subscribe", "cid": "s", "t": TOPIC, "a": "processed"})
    assert is_ack(wire.recv(), "processed")
    other = wire_to(gateway.address)
    other.logon("reader")
    pad = "x" * 10_000
    for batch in range(400):  # 40 MB: more than the socket buffers and the 1 MiB allowed
        source.upsert(**{f"{batch}-{i}": {"id": f"{batch}-{i}", "pad": pad} for i in range(10)})
    # The heartbeat is a fence: the loop has run every delivery posted before it, so the
    # slow subscriber's queue overflowed before this test starts reading (and draining) it.
    assert is_ack(other.request({"c": "heartbeat", "cid": "hb"}), "heartbeat")
    assert wire.is_closed()


def records_of(frames) -> Iterator[tuple[dict, bytes]]:
    for frame in frames:
        offset = 0
        for meta in frame.header.get("recs", ()):
            yield meta, frame.payload[offset : offset + meta["n"]]
            offset += meta["n"]
