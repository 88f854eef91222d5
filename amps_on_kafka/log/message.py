"""A record read from the log, with AMPS's view of it.

The envelope and the payload are decoded on first access only: a replay that filters
on a few fields, or only counts, must not pay for what it never reads.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message

from amps_on_kafka.log.bookmarks import format_bookmark
from amps_on_kafka.log.codecs import Codec
from amps_on_kafka.log.envelope import Envelope, EnvelopeError, headers_of


class LogMessage:
    __slots__ = (
        "_data",
        "_envelope",
        "_headers",
        "codec",
        "computed_key",
        "offset",
        "partition",
        "raw",
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
        headers: list[tuple[str, bytes]] | Message | EnvelopeError | None,
        codec: Codec,
    ) -> None:
        """`headers` may be the consumed Message itself: its headers() builds a list of
        tuples, so it is called only when the envelope is read, not for every record.
        An EnvelopeError stands for headers that were read and did not decode.
        """
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp  # milliseconds since the epoch (LogAppendTime)
        self.raw = raw
        self._headers = headers
        self.codec = codec
        self._envelope: Envelope | None = None
        self._data: Any = _UNSET
        self.computed_key: str | None = None  # the SOW key, once a worker computed it

    @property
    def headers(self) -> list[tuple[str, bytes]] | None:
        """EnvelopeError when they don't read, every time, without asking the Message
        again (see headers_of: a second headers() call can crash the process)."""
        headers = self._headers
        if isinstance(headers, Message):
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
        if self._data is _UNSET:
            self._data = self.codec.decode(self.raw) if self.raw is not None else None
        return self._data

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

    def __repr__(self) -> str:
        return f"LogMessage({self.bookmark}, {self.command})"


class Completed:
    """The `completed` ack: the replay has caught up with the log as it was at the start."""

    __slots__ = ()
    command = "ack"
    ack_type = "completed"

    def __repr__(self) -> str:
        return "COMPLETED"


COMPLETED = Completed()
_UNSET = object()
