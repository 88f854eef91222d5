"""A batch of log records, or a sweep of due deadlines, applied to a partition's state
in memory: what the worker then writes and announces, and what a standby copy only
writes (processor/standby.py). One code path, so both stores hold the same state."""

from __future__ import annotations

from collections import deque
from functools import cache
from typing import Any

from confluent_kafka import Message

from amps_on_kafka.log.codecs import JsonCodec
from amps_on_kafka.log.envelope import (
    _STATEFUL,
    _TEXT,
    H_SEQUENCE,
    Command,
    EnvelopeError,
    is_plain_publish,
    read_headers,
    unreadable_headers,
)
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.native import core
from amps_on_kafka.state.events import Change
from amps_on_kafka.state.record import NEVER, pack_header
from amps_on_kafka.state.sow import Applied, SowRules
from amps_on_kafka.state.store import PartitionStore, Replacements, StateBatch


def replace_blind(
    store: PartitionStore,
    rules: SowRules,
    records: list[Message],
    unreadable: dict[int, EnvelopeError],
) -> Replacements | None:
    """A batch of plain publishes staged as the records they store, each replacing its
    key's record unread (Worker._replace_blind says when that may be), or None unless
    every record is a plain publish with a payload that decodes and a key that belongs
    in this partition: the general path (`stage`) then applies the batch and rejects
    what it must. A record whose headers don't read goes in `unreadable` (headers are
    read at most once: log/envelope.py read_headers).

    The records are staged by the compiled core when it is there and the topic's key is
    one top-level field of JSON payloads (`compiled_stager`), else, or when it is not
    sure, by its Python twin `blind_records`. A key twice in the batch is put twice, the
    later last, as the log has it.
    """
    headers: list = []
    try:
        headers.extend(map(read_headers, records))  # stops at the first that fails
    except (SystemError, UnicodeDecodeError) as exc:
        unreadable[records[len(headers)].offset()] = unreadable_headers(exc)
        return None
    compiled = compiled_stager(rules)
    found = compiled(records, headers) if compiled is not None else None
    if found is None:
        found = blind_records(rules, records, headers)
        if found is None:
            return None
    raw_keys, keys, stored = found
    placement = rules.placement
    if placement is not None and placement.misplaced(raw_keys, store.partition):
        return None
    staged = store.replacements()
    deque(map(staged.put, raw_keys, stored), maxlen=0)  # every put, in C
    staged.pairs.extend(zip(keys, stored, strict=True))
    return staged


StagedRecords = tuple[list[bytes], list[str], list[bytes]]  # raw keys, keys, records as stored


def blind_records(rules: SowRules, records: list[Message], headers: list) -> StagedRecords | None:
    """The keys (raw and as text) and records as stored of a batch of plain publishes
    whose payloads decode and have a key, or None: the compiled core's twin
    (native/src/staging.rs), and what runs for a batch the core leaves to it.

    Each step takes the whole batch (a comprehension, or a map over a C function), so
    few Python frames run per record: is_plain_publish (a check of the batch's headers
    all at once, with joins, cost as much), the decoding, nothing else
    (docs/performance.md, "SOW apply").
    """
    payloads = [record.value() for record in records]
    if None in payloads or not all(map(is_plain_publish, headers)):
        return None
    try:
        keys = rules.keys.many(list(map(rules.codec.decode, payloads)))
        raw_keys = [key.encode() for key in keys]
    except Exception:  # MessageError, or anything odd: the general path says why
        return None
    pack = pack_header
    stored = [
        pack(record.offset(), record.timestamp()[1], NEVER) + payload
        for record, payload in zip(records, payloads, strict=True)
    ]
    return raw_keys, keys, stored


def compiled_stager(rules: SowRules) -> Any:
    """The compiled core's `blind_records` for the topic's key, or None (no core, a key
    that is not one top-level field, payloads that are not JSON). Called as
    `stager(records, headers)`, it gives what `blind_records` gives, or None where it is
    not sure, and the twin decides (tests/native/test_staging.py holds it to that)."""
    field = rules.keys.single_field
    if core is None or field is None or type(rules.codec) is not JsonCodec:
        return None
    return _stager(field)


@cache
def _stager(field: str) -> Any:
    """One compiled stager per key field, made once: it holds the field and the envelope's
    header names the plain-publish check reads (log/envelope.py is_plain_publish)."""
    assert core is not None
    return core.BlindRecords(field, sorted(_STATEFUL), sorted(_TEXT), H_SEQUENCE, _give_way)


def _give_way() -> None:
    """Called by the compiled stager every megabyte or so of a batch: entering a Python
    function is where the interpreter hands the GIL to a thread that waits for it (the
    gateway's event loop), as the twin's loops do between bytecodes."""


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
