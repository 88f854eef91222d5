"""A batch of log records, or a sweep of due deadlines, applied to a partition's state
in memory: what the worker then writes and announces, and what a standby copy only
writes (processor/standby.py). One code path, so both stores hold the same state."""

from __future__ import annotations

from confluent_kafka import Message

from amps_on_kafka.log.envelope import Command, EnvelopeError
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.state.events import Change
from amps_on_kafka.state.sow import Applied, SowRules
from amps_on_kafka.state.store import PartitionStore, StateBatch


def log_messages(
    store: PartitionStore,
    rules: SowRules,
    batch: list[Message],
    unreadable: dict[int, EnvelopeError] | None = None,
) -> list[LogMessage]:
    """The records of one partition as LogMessages (a record whose headers didn't read
    carries its EnvelopeError from `unreadable`: headers are read at most once)."""
    unreadable = unreadable or {}
    return [
        LogMessage(
            store.topic,
            store.partition,
            r.offset(),
            r.timestamp()[1],
            r.value(),
            unreadable.get(r.offset(), r),
            rules.codec,
        )
        for r in batch
    ]


def stage(
    store: PartitionStore, rules: SowRules, messages: list[LogMessage], previous: bool
) -> tuple[StateBatch, Applied]:
    """Apply `messages` with the SOW rules into a StateBatch ending at their offset. With
    `previous`, each upsert's old record is read (oof subscribers, expiring topics)."""
    rules.place(messages, store.partition)
    state = StateBatch(store)
    state.prefetch(keys_to_read(rules, messages, previous))
    applied = Applied(previous=previous)
    for message in messages:
        rules.apply(state, message, applied)
    state.next_offset = messages[-1].offset + 1
    return state, applied


def stage_expiry(
    store: PartitionStore, rules: SowRules, now: int
) -> tuple[StateBatch, list[Change]] | None:
    """The records whose deadline passed by `now`, removed in a StateBatch; None when
    nothing is due."""
    due = store.due(now)
    if not due:
        return None
    keys = [store.key_of_entry(entry) for entry in due]
    state = StateBatch(store)
    state.prefetch(keys)
    state.swept = due
    changes = [c for c in (rules.expire(state, key, now) for key in keys) if c is not None]
    return state, changes


def keys_to_read(rules: SowRules, messages: list[LogMessage], previous: bool) -> list[str]:
    """The keys a batch will read, for one multi-get: without `previous`, only those of
    delta_publishes and deletes. Undecodable records are left out."""
    keys = []
    for message in messages:
        try:
            envelope = message.envelope
            if envelope.sow_keys is not None:
                keys.extend(envelope.sow_keys)
            elif envelope.filter is None and (previous or envelope.command is not Command.PUBLISH):
                keys.append(rules.key_of(message, envelope))
        except Exception:
            continue
    return keys
