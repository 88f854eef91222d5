"""Publishes applied without reading the old record (the worker's fast path).

With expiration off and no oof subscriber, nobody needs an upsert's old record, so the
worker writes it blind. Two things must still hold: an oof subscriber that arrives
while such a batch is applied gets the same old records as if they had been read
(`fill_previous`), and expiry entries a blind write leaves behind never expire the
newer record and are cleared by the sweep.
"""

from __future__ import annotations

import copy

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import SowConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.envelope import Command, Envelope
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.state.sow import Applied, DictState, SowRules, fill_previous
from tests.sow.conftest import sow_config, wait_caught_up

RULES = SowRules(SowConfig.model_validate({"Topic": "t", "Key": "/id"}), JSON)

operation = st.tuples(
    st.sampled_from([Command.PUBLISH, Command.DELTA_PUBLISH, Command.SOW_DELETE]),
    st.integers(0, 4),  # the key
    st.integers(0, 99),  # a value
)


def messages(ops: list[tuple[Command, int, int]], first_offset: int) -> list[LogMessage]:
    out = []
    for offset, (command, key, value) in enumerate(ops, first_offset):
        envelope = Envelope(command=command, sequence=offset)
        if command is Command.SOW_DELETE:
            envelope.sow_keys = (str(key),)
            raw = None
        else:
            raw = orjson.dumps({"id": key, f"f{value % 3}": value})
        out.append(LogMessage("t", 0, offset, 1000 + offset, raw, envelope.to_headers(), JSON))
    return out


def changes_of(state: DictState, batch: list[LogMessage], previous: bool) -> list[tuple]:
    applied = Applied(previous=previous)
    before = copy.copy(state.records)
    for message in batch:
        RULES.apply(state, message, applied)
    if not previous:
        fill_previous(applied.changes, before.get)
    return [(c.kind, c.sow_key, c.old, c.new) for c in applied.changes]


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=20), st.lists(operation, min_size=1, max_size=30))
def test_fill_previous_gives_the_old_records_a_read_would_have_given(earlier, batch):
    read, blind = DictState(), DictState()
    for state in (read, blind):
        changes_of(state, messages(earlier, 0), previous=True)
    ops = messages(batch, len(earlier))
    assert changes_of(blind, ops, previous=False) == changes_of(read, ops, previous=True)
    assert blind.records == read.records


def test_a_blind_publish_never_expires_the_record_and_its_stale_entry_is_swept(
    bootstrap, sow_topic, publisher, start_worker, tmp_path
):
    """Disabled expiration keeps a message's own deadline in the index (seed 000); a
    publish with no expiration that replaces it blind leaves that entry behind. With
    expiration enabled later, the sweep drops the entry and keeps the record."""
    state = tmp_path / "s"
    first = start_worker(sow_config(sow_topic), state, group="g-blind")
    for value, expiration in (("expiring", 5), ("kept", None)):  # two batches
        publisher.publish(sow_topic, {"id": 1, "v": value}, expiration=expiration)
        publisher.publish_flush(10)
        wait_caught_up(first, bootstrap, sow_topic, 2)
    hours_later = now_ms() + 3_600_000
    assert sum(len(s.due(hours_later)) for s in first.engine.stores()) == 1  # the stale entry
    first.stop()

    second = start_worker(
        sow_config(sow_topic, Expiration="enabled"),
        state,
        group="g-blind",
        clock=lambda: hours_later,
    )
    stores = second.engine.stores()
    assert [s.get("1").data for s in stores if s.get("1")] == [{"id": 1, "v": "kept"}]
    assert sum(len(s.due(hours_later)) for s in stores) == 0
