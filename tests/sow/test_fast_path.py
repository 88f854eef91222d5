"""The worker's fast path for batches of plain publishes (Worker._replace_blind).

It stages each record as stored without building an envelope, a SowRecord or a Change,
so it must give exactly what the rules give, and take a batch only when every record
is one it can apply: anything else goes to the general path, which rejects with reasons.
"""

from __future__ import annotations

import tempfile

import orjson
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import Config
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import Command, Envelope
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.processor.applying import _replaced
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.state.events import BatchApplied
from amps_on_kafka.state.sow import Applied, DictState, SowRules

CONFIG = Config.model_validate(
    {"Topics": [{"Name": "t", "Partitions": 1}], "SOW": [{"Topic": "t", "Key": "/id"}]}
)
RULES = SowRules(CONFIG.sow[0], JSON)
KINDS = ("plain", "plain", "plain", "expiring", "delta", "bad_json", "no_key", "odd_header")


def record(kind: str, offset: int, key: int) -> Message:
    """A log record as the consumer hands it over; `kind` says what is unusual about it."""
    envelope = Envelope(publisher_id="pub", sequence=offset)
    payload = orjson.dumps({"id": key, "v": offset})
    if kind == "expiring":
        envelope.expiration = 30
    elif kind == "delta":
        envelope.command = Command.DELTA_PUBLISH
    elif kind == "bad_json":
        payload = b"{not json"
    elif kind == "no_key":
        payload = orjson.dumps({"v": offset})
    elif kind == "odd_header":
        envelope.publisher_id = "pub-é"  # valid, but not ASCII: left to the full decoder
    return Message(
        topic="t",
        partition=0,
        offset=offset,
        value=payload,
        headers=envelope.to_headers(),
        timestamp=(1, 1_000 + offset),
    )


def by_the_rules(records: list[Message]) -> tuple[DictState, Applied]:
    state, applied = DictState(), Applied(previous=False)
    for r in records:
        message = LogMessage("t", 0, r.offset(), r.timestamp()[1], r.value(), r.headers(), JSON)
        RULES.apply(state, message, applied)
    return state, applied


batches = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 5)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_the_fast_path_gives_what_the_rules_give_or_declines(batch):
    records = [record(kind, offset, key) for offset, (kind, key) in enumerate(batch)]
    expected, applied = by_the_rules(records)
    with tempfile.TemporaryDirectory() as state_dir:
        worker = Worker(CONFIG, "unused:9092", state_dir)
        store = worker._open("t", 0)
        try:
            staged = worker._replace_blind(store, worker.rules["t"], records, {})
            if any(kind != "plain" for kind, _ in batch):
                assert staged is None
                return
            assert staged is not None
            assert staged.pairs == [(c.sow_key, c.new.encode()) for c in applied.changes]
            seen: list[BatchApplied] = []
            worker.engine.add_listener(seen.append)
            worker._commit(_replaced(store, staged, len(records)))
            assert seen[0].changes == applied.changes
            assert {r.sow_key: r for r in store.scan()} == expected.records
            assert store.next_offset() == len(records)
        finally:
            store.close()


def test_an_oof_subscriber_that_comes_mid_batch_gets_the_old_records(tmp_path):
    """Staged blind, written after an oof subscription asked for old records: the
    changes carry what the store held before the batch, or the batch's own earlier one."""
    worker = Worker(CONFIG, "unused:9092", tmp_path)
    store = worker._open("t", 0)
    rules = worker.rules["t"]
    first = [record("plain", 0, 1)]
    worker._commit(_replaced(store, worker._replace_blind(store, rules, first, {}), 1))
    staged = worker._replace_blind(
        store, rules, [record("plain", o, k) for o, k in ((1, 1), (2, 1))], {}
    )
    worker.engine.want_previous("t")
    seen: list[BatchApplied] = []
    worker.engine.add_listener(seen.append)
    worker._commit(_replaced(store, staged, 3))
    changes = seen[0].changes
    assert [c.old.offset for c in changes] == [0, 1]
    assert [c.new.offset for c in changes] == [1, 2]
    store.close()


def test_changes_are_built_once_and_only_when_read():
    built: list[str] = []

    def build(key: str, stored: bytes):
        built.append(key)
        return (key, stored)

    applied = BatchApplied([("a", b"1"), ("b", b"2")], [], build)  # type: ignore[arg-type]
    assert built == []
    assert applied.changes == applied.changes == [("a", b"1"), ("b", b"2")]
    assert built == ["a", "b"]
