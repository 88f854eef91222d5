"""The SOW rules: how each log record changes the State of the World.

These functions are the single definition of publish, delta_publish, sow_delete and
expiration. The worker applies them batch by batch; the Spark pipeline applies the very
same functions to compute the SOW as of a past bookmark.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache, partial
from operator import itemgetter
from typing import Any, Protocol

from amps_on_kafka.config import SowConfig
from amps_on_kafka.errors import AmpsError, FilterError, MessageError
from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.envelope import H_EXPIRATION, Command, Envelope, EnvelopeError
from amps_on_kafka.log.keys import KeyExtractor, MisplacedKey, Placement
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.state.events import Change, ChangeKind, CommandResult
from amps_on_kafka.state.record import MAX_DEADLINE, NEVER, SowRecord


class State(Protocol):
    """What the rules read and write: a StateBatch in the worker, a dict in Spark."""

    def get(self, sow_key: str) -> SowRecord | None: ...

    def set(self, sow_key: str, record: SowRecord | None) -> None: ...

    def current(self) -> Iterator[SowRecord]: ...


class DictState:
    """State held in a dict: for computing a SOW outside the worker (Spark, tests)."""

    def __init__(self) -> None:
        self.records: dict[str, SowRecord] = {}

    def get(self, sow_key: str) -> SowRecord | None:
        return self.records.get(sow_key)

    def set(self, sow_key: str, record: SowRecord | None) -> None:
        if record is None:
            self.records.pop(sow_key, None)
        else:
            self.records[sow_key] = record

    def current(self) -> Iterator[SowRecord]:
        return iter(list(self.records.values()))


@dataclass
class Applied:
    """What a batch did. With `previous` False a publish replaces its record unread, so
    its change carries no old record: the worker's fast path when nobody needs one."""

    changes: list[Change] = field(default_factory=list)
    results: list[CommandResult] = field(default_factory=list)
    previous: bool = True


Expiry = tuple[int | None, bool]  # a topic's default expiration (ms or None), and whether on


@dataclass(frozen=True)
class ExpirySchedule:
    """A topic's expiration config (Expiry) in one partition, as (first offset, default
    ms, expiring) entries in rising offset order: a record is applied with the entry at
    or before its offset (one before every entry, with the first).

    The worker keeps it in each store (PartitionStore.expiry_history), so what a record
    gets (its deadline; whether the record it updates counts as expired) is a function
    of the log and the store, the same before and after a crash (docs/operations.md,
    "A changed default expiration").
    """

    entries: tuple[tuple[int, int | None, bool], ...]

    def at(self, offset: int) -> Expiry:
        entries = self.entries
        if len(entries) == 1:
            return entries[0][1:]
        index = bisect_right(entries, offset, key=itemgetter(0))
        return entries[max(index - 1, 0)][1:]

    def expires_from(self, offset: int) -> bool:
        """Whether a record at this offset or later is applied with a default deadline
        or with expiration on: then it can't be applied blind (Worker._replace_blind)."""
        later = [entry[1:] for entry in self.entries if entry[0] > offset]
        return any(d is not None or on for d, on in (self.at(offset), *later))


class SowRules:
    """The rules of one SOW topic, built once from its configuration."""

    def __init__(self, sow: SowConfig, codec: Codec) -> None:
        self.topic = sow.topic
        self.codec = codec
        self.keys = KeyExtractor(sow.key)
        self.key_from_publish = sow.key_from_publish
        self.expiring = sow.expiration.mode != "disabled"
        default = sow.expiration.default_seconds
        self.default_ms = None if default is None else round(default * 1000)
        # The expiration config in force per partition, by offset, as the worker's stores
        # recorded it (ExpirySchedule); a partition without one (Spark, tests of the rules
        # alone) applies the config's to every record.
        self.schedules: dict[int, ExpirySchedule] = {}
        # A plain publish then stores its payload under the key from its data, with no
        # deadline, whatever the old record was: the worker may apply such a batch
        # without reading anything (Worker._replace_blind).
        self.blind_publishes = not self.expiring and not self.key_from_publish
        # Where each SOW key belongs among the topic's partitions: set by the worker from
        # Kafka's metadata, so a record found in another partition is rejected. None (Spark,
        # tests of the rules alone) checks nothing.
        self.placement: Placement | None = None

    # -- expiration (seed 000) ------------------------------------------------------
    def deadline(self, timestamp: int, expiration: float | None, default_ms: int | None) -> int:
        """The absolute deadline stored with a record, from its update's log timestamp.

        The message's expiration overrides the topic default (`expiry_at`); 0 means
        never. With expiration disabled the message's own expiration is still stored
        (and honoured if expiration is enabled later), but no topic default applies.
        """
        if expiration is not None:
            deadline = NEVER if expiration == 0 else timestamp + round(expiration * 1000)
        elif default_ms is not None:
            deadline = timestamp + default_ms
        else:
            return NEVER
        if not -MAX_DEADLINE <= deadline <= MAX_DEADLINE:  # a log timestamp beyond reason
            raise MessageError(
                f"expiration {expiration} (header {H_EXPIRATION!r}) from timestamp {timestamp} "
                "gives a deadline a stored record cannot hold"
            )
        return deadline

    def expiry_at(self, partition: int, offset: int) -> Expiry:
        """The default (ms) and expiration mode the record at this offset is applied
        with: seed 000 stores a deadline once, so a record the worker applies again after
        a crash must be applied as the first time, not by a config changed since."""
        schedule = self.schedules.get(partition)
        return (self.default_ms, self.expiring) if schedule is None else schedule.at(offset)

    def is_expired(self, record: SowRecord, at: int) -> bool:
        return self.expiring and record.expired_at(at)

    def expire(self, state: State, sow_key: str, now: int) -> Change | None:
        record = state.get(sow_key)
        if record is None or not self.is_expired(record, now):
            return None
        state.set(sow_key, None)
        return Change(self.topic, sow_key, ChangeKind.EXPIRE, record, None)

    # -- applying log records ---------------------------------------------------------
    def apply(self, state: State, message: LogMessage, out: Applied) -> None:
        """Apply one record; a record invalid for this topic is rejected, never fatal.

        Anything a record makes the rules raise rejects that record alone, with the error
        as its reason: one record must not stop its partition (it would stop it on every
        restart too, since the record stays in the log). Every check comes before the
        first change to the state, so a rejected record changes nothing.
        """
        try:
            envelope = message.envelope
            if envelope.command is Command.SOW_DELETE:
                deleted = self._delete(state, message, envelope, out)
                out.results.append(_result(message, envelope, deleted=deleted))
            else:
                self._upsert(state, message, envelope, out)
        except AmpsError as exc:
            out.results.append(_rejected(message, exc.reason, _kind(exc)))
        except Exception as exc:  # a defect the record exposed: still never fatal
            reason = f"can't apply the record ({type(exc).__name__}: {exc})"
            out.results.append(_rejected(message, reason, "apply_error"))

    def key_of(self, message: LogMessage, envelope: Envelope) -> str:
        """The record's SOW key by this topic's configuration, computed once per record."""
        key = message.computed_key
        if key is None:
            key = self._own_key(message, envelope)
            self.check_placement(key, message.partition)
            message.computed_key = key
        return key

    def _own_key(self, message: LogMessage, envelope: Envelope) -> str:
        if self.key_from_publish and envelope.sow_key is not None:
            return envelope.sow_key
        return self.keys(message.data)

    def place(self, messages: list[LogMessage], partition: int) -> None:
        """Check where a batch's keys belong all at once (Placement.misplaced): one hash
        per record in Python cost a quarter of the general path. A record whose key
        belongs here gets it as its computed_key, which key_of then takes unchecked;
        the others are left to key_of, which refuses them with the reason."""
        placement = self.placement
        if placement is None:
            return
        keyed = []
        for message in messages:
            try:
                envelope = message.envelope
                if envelope.filter is None and envelope.sow_keys is None:
                    keyed.append((message, self._own_key(message, envelope)))
            except Exception:  # refused when applied, with its reason
                continue
        wrong = set(placement.misplaced([key.encode() for _, key in keyed], partition))
        for index, (message, key) in enumerate(keyed):
            if index not in wrong:
                message.computed_key = key

    def check_placement(self, key: str, partition: int) -> None:
        """A record whose SOW key belongs in another partition is refused: applied here,
        the key would have a record in two partitions, each half of its history."""
        placement = self.placement
        if placement is not None and placement.count > 1:
            home = placement.partition(key)
            if home != partition:
                raise MisplacedKey(
                    f"SOW key {key!r} belongs in partition {home} of {placement.count} "
                    f"({placement.partitioner}), not in partition {partition}"
                )

    def _upsert(self, state: State, message: LogMessage, envelope: Envelope, out: Applied) -> None:
        data = message.data
        key = self.key_of(message, envelope)
        default, expiring = self.expiry_at(message.partition, message.offset)
        deadline = self.deadline(message.timestamp, envelope.expiration, default)
        delta = envelope.command is Command.DELTA_PUBLISH
        if out.previous or delta or expiring:
            existing = self._live(state, key, message.timestamp, out, expiring)
        else:
            existing = None
        payload = message.raw or b""
        if delta and existing is not None:
            payload = self._merge(existing, data)
        record = SowRecord(
            self.topic,
            message.partition,
            key,
            payload,
            message.offset,
            message.timestamp,
            deadline,
            self.codec,
        )
        state.set(key, record)
        out.changes.append(Change(self.topic, key, ChangeKind.UPSERT, existing, record))

    def _merge(self, existing: SowRecord, delta: Any) -> bytes:
        """Fields present overwrite, new fields are added, nested values replace whole."""
        base = existing.data
        if not isinstance(base, dict) or not isinstance(delta, dict):
            raise MessageError("delta_publish needs a document of fields on both sides")
        return self.codec.encode({**base, **delta})

    def _live(
        self, state: State, key: str, at: int, out: Applied, expiring: bool
    ) -> SowRecord | None:
        """The stored record, unless `expiring` and its deadline passed before `at` (then
        it expires now).

        This keeps the SOW a function of the log: a replay applies an update to an
        expired record exactly as the live worker did, whenever its sweep ran.
        """
        record = state.get(key)
        if record is not None and expiring and record.expired_at(at):
            state.set(key, None)
            out.changes.append(Change(self.topic, key, ChangeKind.EXPIRE, record, None))
            return None
        return record

    def _delete(self, state: State, message: LogMessage, envelope: Envelope, out: Applied) -> int:
        victims = self._victims(state, message, envelope, out)
        for record in victims:
            state.set(record.sow_key, None)
            out.changes.append(Change(self.topic, record.sow_key, ChangeKind.DELETE, record, None))
        return len(victims)

    def _victims(
        self, state: State, message: LogMessage, envelope: Envelope, out: Applied
    ) -> list[SowRecord]:
        live = partial(
            self._live,
            state,
            at=message.timestamp,
            out=out,
            expiring=self.expiry_at(message.partition, message.offset)[1],
        )
        if envelope.filter is not None:
            matcher = _compiled(envelope.filter)
            candidates = [r for r in state.current() if _matches(matcher, r)]
            return [r for r in candidates if live(r.sow_key) is not None]
        if envelope.sow_keys is not None:
            keys = envelope.sow_keys
            for key in keys:
                self.check_placement(key, message.partition)
        else:
            keys = (self.key_of(message, envelope),)
        return [r for r in map(live, keys) if r is not None]


def fill_previous(changes: list[Change], stored: Callable[[str], SowRecord | None]) -> None:
    """Give each upsert of a batch applied without `previous` its old record: the batch's
    own earlier change to that key, else what the store held before the batch."""
    latest: dict[str, SowRecord | None] = {}
    for change in changes:
        key = change.sow_key
        if change.kind is ChangeKind.UPSERT:
            change.old = latest[key] if key in latest else stored(key)
        latest[key] = change.new


@lru_cache(maxsize=256)
def _compiled(text: str) -> Filter:
    return compile_filter(text)


def _matches(matcher: Filter, record: SowRecord) -> bool:
    try:
        return matcher.matches(record.data)
    except MessageError:
        return False


def _envelope_or_blank(message: LogMessage) -> Envelope:
    try:
        return message.envelope
    except Exception:  # a refusal must still be reported, whatever the headers are
        return Envelope()


def _kind(exc: AmpsError) -> str:
    """The rejection's category, for the worker's counters (Worker.rejected)."""
    if isinstance(exc, MisplacedKey):
        return "misplaced_key"
    if isinstance(exc, EnvelopeError):
        return "bad_envelope"
    if isinstance(exc, FilterError):
        return "bad_filter"
    return "bad_record"


def _rejected(message: LogMessage, reason: str, kind: str) -> CommandResult:
    result = _result(message, _envelope_or_blank(message), error=reason)
    result.rejection = kind
    return result


def _result(
    message: LogMessage, envelope: Envelope, *, deleted: int = 0, error: str | None = None
) -> CommandResult:
    return CommandResult(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        command=envelope.command.value,
        publisher_id=envelope.publisher_id,
        sequence=envelope.sequence,
        correlation_id=envelope.correlation_id,
        deleted=deleted,
        error=error,
    )
