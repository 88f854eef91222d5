"""Messages: `Message`, what every stream yields, and `LogMessage`, a record read from
the log, with AMPS's view of it.

`Message` is the one type an application meets, whichever transport delivered it: a
record replayed from Kafka (`LogMessage`, kafka://), a frame from a worker's gateway
(`client.message.GatewayMessage`, tcp://), or the `COMPLETED` marker. Every message has
every attribute of the table in docs/subscribers.md ("Messages"); one that doesn't apply
to it is None. It lives here, below the client, because the log layer builds messages
(Replay) and the marker.

A LogMessage decodes its envelope and payload on first access only: a replay that
filters on a few fields, or only counts, must not pay for what it never reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import Message as KafkaRecord
from orjson import JSONDecodeError
from orjson import loads as json_loads

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.bookmarks import format_bookmark
from amps_on_kafka.log.codecs import JSON, Codec, not_json
from amps_on_kafka.log.envelope import Envelope, EnvelopeError, headers_of
from amps_on_kafka.native import core


class Message:
    """A delivered message. Each attribute is None where it does not apply.

    Subclasses hold the data (slots or a frame header); this class only names the
    attributes and their defaults, so `isinstance(m, Message)` holds for every message
    and `Iterator[Message]` types every stream.
    """

    __slots__ = ()

    @property
    def command(self) -> str:
        """What the message is: "publish", "delta_publish", "sow_delete" (a log record),
        "sow", "oof", "group_begin", "group_end" (gateway deliveries) or "ack"."""
        raise NotImplementedError

    @property
    def topic(self) -> str | None:
        """The topic it was read from."""
        return None

    @property
    def logical_topic(self) -> str | None:
        """The topic as AMPS names it (a view or queue may be stored under another)."""
        return self.topic

    @property
    def data(self) -> Any:
        """The decoded payload: dict for JSON and Avro, bytes for binary, None if none."""
        return None

    @property
    def payload(self) -> bytes | None:
        """The payload's bytes as delivered, undecoded."""
        return None

    @property
    def raw(self) -> bytes | None:
        """Same as `payload`."""
        return self.payload

    @property
    def bookmark(self) -> str | None:
        """Where the message is in the log: `topic|partition|offset|`."""
        return None

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch: the log's stamp of the record (its last update)."""
        return None

    @property
    def sow_key(self) -> str | None:
        """The record's key in its SOW topic."""
        return None

    @property
    def sow_keys(self) -> tuple[str, ...] | None:
        """The keys a replayed sow_delete by key deletes."""
        return None

    @property
    def filter(self) -> str | None:
        """The filter a replayed sow_delete by filter deletes with."""
        return None

    @property
    def expiration(self) -> float | None:
        """Seconds the record lives (log) or has left (gateway deliveries)."""
        return None

    @property
    def correlation_id(self) -> str | None:
        """The publisher's correlation id, delivered with the record."""
        return None

    @property
    def sub_id(self) -> str | None:
        """The subscription that delivered it."""
        return None

    @property
    def publisher_id(self) -> str | None:
        """The name of the client that published it."""
        return None

    @property
    def sequence(self) -> int | None:
        """The publisher's sequence number for it (duplicate detection)."""
        return None

    @property
    def reason(self) -> str | None:
        """Why an oof message left the subscription (deleted, expired, match), or why a
        command failed (a failure ack)."""
        return None

    @property
    def lease_period(self) -> int | None:
        """A queue message's lease left when it was delivered, in ms."""
        return None

    @property
    def ack_type(self) -> str | None:
        """For command "ack": its type (processed, completed, stats, ...)."""
        return None

    @property
    def status(self) -> str | None:
        """For an ack: success or failure."""
        return None

    @property
    def matches(self) -> int | None:
        """For a stats ack, the records that matched; for sow_delete, the records deleted."""
        return None

    def __repr__(self) -> str:
        """One form whichever transport built it (their classes are the engine's own):
        `Message(command, topic, bookmark)`, or the ack type where there is no bookmark."""
        try:
            command = self.command
        except MessageError:  # a log record whose envelope does not decode
            command = "?"
        return f"Message({command}, {self.topic}, {self.bookmark or self.ack_type or ''})"

    def ack(self, option: str | None = None) -> None:
        """Acknowledge a queue message (docs/queues.md). Only messages a tcp:// queue
        subscription delivers can be acked; others raise MessageError."""
        raise MessageError(
            f"{self!r} can't be acked: only messages of a queue subscription over tcp:// "
            "have a lease to acknowledge"
        )

    def discard(self) -> None:
        """Tell the bookmark store the application has finished with this message. Only
        messages of a bookmark subscription made with a store can be discarded; others
        raise MessageError."""
        raise MessageError(
            f"{self!r} can't be discarded: it was not delivered by a bookmark subscription "
            "with a bookmark store (call client.set_bookmark_store(...) before subscribing)"
        )


class LogMessage(Message):
    __slots__ = (
        "_data",
        "_envelope",
        "_headers",
        "_record",
        "codec",
        "computed_key",
        "offset",
        "partition",
        "raw",
        "sub_id",
        "timestamp",
        "topic",
    )

    command_kind = "message"

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        raw: bytes | None,
        headers: list[tuple[str, bytes]] | KafkaRecord | EnvelopeError | None,
        codec: Codec,
    ) -> None:
        """`headers` may be the consumed Message itself: its headers() builds a list of
        tuples, so it is called only when the envelope is read, not for every record.
        An EnvelopeError stands for headers that were read and did not decode.
        """
        self.topic = topic  # type: ignore[misc]  # a slot where Message has a property
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp  # type: ignore[misc]  # milliseconds since the epoch (LogAppendTime)
        self.raw = raw
        self._headers = headers
        self.codec = codec
        self._envelope: Envelope | None = None
        self._data: Any = _UNSET
        self.computed_key: str | None = None  # the SOW key, once a worker computed it
        self.sub_id: str | None = None  # type: ignore[misc]  # set by a client's subscription

    def ack(self, option: str | None = None) -> None:
        """A log record has no lease. Delivered by a subscription, acking it does nothing,
        as for a tcp:// subscription's message without a lease (so a subscriber may ack
        everything it receives on either transport); read without one, MessageError."""
        if self.sub_id is None:
            super().ack(option)

    @property
    def headers(self) -> list[tuple[str, bytes]] | None:
        """EnvelopeError when they don't read, every time, without asking the Message
        again (see headers_of: a second headers() call can crash the process)."""
        headers = self._headers
        if isinstance(headers, _RECORDS):
            try:
                headers = self._headers = headers_of(headers)
            except EnvelopeError as exc:
                self._headers = exc
                raise
        if isinstance(headers, EnvelopeError):
            raise EnvelopeError(headers.reason)
        return headers  # type: ignore[return-value]

    @property
    def envelope(self) -> Envelope:
        if self._envelope is None:
            self._envelope = Envelope.from_headers(self.headers)
        return self._envelope

    @property
    def data(self) -> Any:
        """The decoded payload (dict for JSON and Avro, bytes for binary)."""
        data = self._data
        if data is _UNSET:
            raw, codec = self.raw, self.codec
            if raw is None:
                data = None
            elif codec is JSON:  # decoded here: a replay's hot path (docs/performance.md)
                try:
                    data = json_loads(raw)
                except JSONDecodeError as exc:
                    raise not_json(exc) from exc
            else:
                data = codec.decode(raw)
            self._data = data
        return data

    @property
    def payload(self) -> bytes | None:
        return self.raw

    @property
    def bookmark(self) -> str:
        return format_bookmark(self.topic, self.partition, self.offset)

    @property
    def command(self) -> str:
        return self.envelope.command.value

    @property
    def logical_topic(self) -> str:
        return self.envelope.topic or self.topic

    @property
    def sow_key(self) -> str | None:
        return self.envelope.sow_key

    @property
    def sow_keys(self) -> tuple[str, ...] | None:
        """The keys a sow_delete by key deletes: with `filter`, what a replayed delete
        needs to be applied to a SOW (its `data` is None)."""
        return self.envelope.sow_keys

    @property
    def filter(self) -> str | None:
        """The filter a sow_delete by filter deletes with."""
        return self.envelope.filter

    @property
    def expiration(self) -> float | None:
        return self.envelope.expiration

    @property
    def publisher_id(self) -> str | None:
        return self.envelope.publisher_id

    @property
    def sequence(self) -> int | None:
        return self.envelope.sequence

    @property
    def correlation_id(self) -> str | None:
        return self.envelope.correlation_id


class RecordMessage(LogMessage):
    """A LogMessage over the consumed record itself, which a replay builds for every record.

    Eight slot writes and one call into the record (its payload): its coordinates and
    headers are read from it when asked (each a C call), not copied for every record
    whether asked or not: about half the eager constructor's cost (docs/performance.md).
    Same slots as LogMessage, so a subscription can re-class it (StoredMessage).
    """

    __slots__ = ()

    def __init__(self, record: KafkaRecord, codec: Codec) -> None:
        self._record = record
        self.raw = record.value()  # nearly every reader wants it: one C call, here
        self._headers = record
        self.codec = codec
        self._envelope = None
        self._data = _UNSET
        self.computed_key = None
        self.sub_id = None

    @property
    def topic(self) -> str:  # LogMessage's slot, read from the record here
        return self._record.topic()

    @property
    def partition(self) -> int:  # type: ignore[override]
        return self._record.partition()

    @property
    def offset(self) -> int:  # type: ignore[override]
        return self._record.offset()

    @property
    def timestamp(self) -> int:
        return self._record.timestamp()[1]


class Completed(Message):
    """The `completed` ack: the replay has caught up with the log as it was at the start.

    A message like the others (command "ack", ack_type "completed", no topic, data or
    bookmark), so a loop that reads every message's attributes runs through it; compare
    with `is COMPLETED` to tell it apart. Acking or discarding it does nothing: there is
    nothing to acknowledge.
    """

    __slots__ = ()

    @property
    def command(self) -> str:
        return "ack"

    @property
    def ack_type(self) -> str:
        return "completed"

    @property
    def status(self) -> str:
        return "success"

    def ack(self, option: str | None = None) -> None:
        """Nothing to acknowledge."""

    def discard(self) -> None:
        """Nothing to discard."""

    def __repr__(self) -> str:
        return "COMPLETED"


COMPLETED = Completed()


class _Tick:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TICK"


TICK = _Tick()  # a quiet moment in the log: time passed and no message came (Replay.ticking)
_UNSET = object()


class _BuiltOneByOne:
    """The messages of a consumed batch, in order, up to the first record that is an
    error; `read` counts them, which is also that record's index if there is one.

    The Python twin of the compiled builder (native/src/records.rs), which makes the
    same messages without a Python frame per record: `record_messages` is that one when
    the compiled core is loaded. An iterator, so each message is freed when its reader
    drops it (a batch's messages and decoded payloads alive at once keep the collector
    busy).
    """

    __slots__ = ("_codec", "_records", "read")

    def __init__(self, records: list[KafkaRecord], codec: Codec) -> None:
        self._records = records
        self._codec = codec
        self.read = 0

    def __iter__(self) -> _BuiltOneByOne:
        return self

    def __next__(self) -> RecordMessage:
        records, read = self._records, self.read
        if read >= len(records) or records[read].error() is not None:
            raise StopIteration
        self.read = read + 1
        return RecordMessage(records[read], self._codec)


def _compiled_builder() -> Any:
    """The compiled builder, given the slots RecordMessage's constructor fills: the record
    (read lazily through `_record` and `_headers`), its payload and codec, and the
    values every message starts with (the differential test holds the two alike)."""
    if core is None:
        return None
    starts = [("_envelope", None), ("_data", _UNSET), ("computed_key", None), ("sub_id", None)]
    return core.RecordBuilder(RecordMessage, ["_record", "_headers"], "raw", "codec", starts)


# Also what a replay's compiled reader makes its messages with (log/native_reader.py).
RECORD_BUILDER = _compiled_builder()
record_messages = cast(
    Callable[[list[KafkaRecord], Codec], _BuiltOneByOne],
    _BuiltOneByOne if RECORD_BUILDER is None else RECORD_BUILDER.build,
)
# What record_messages returns: a replay asked for batches hands a batch over as one of
# these instead of message by message (Replay.ticking); READ_BATCH is the compiled
# reader's batch, handed over alike.
BATCH = _BuiltOneByOne if core is None else core.Built
READ_BATCH = getattr(core, "ReadBatch", None)  # None before the core had the reader
# What a message's `_headers` holds until they are read: the consumed record, confluent-
# kafka's or the compiled reader's.
_RECORDS = (KafkaRecord, getattr(core, "Record", KafkaRecord))

if core is not None:  # the same getter without a Python frame (native/src/records.rs)
    LogMessage.data = core.LazyData(  # type: ignore[method-assign]
        LogMessage, "_data", "raw", "codec", _UNSET, JSON, json_loads, vars(LogMessage)["data"].fget
    )
