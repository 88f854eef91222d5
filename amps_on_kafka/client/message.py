"""`Message`, the one type every stream yields (defined in log/message.py, beside the
log's records, and re-exported here), and `GatewayMessage`, the tcp:// transport's kind.

An application iterating a stream reads the same attributes whichever transport
delivered the message (docs/subscribers.md, "Messages"). A GatewayMessage's `command` is
one of "sow", "publish", "oof", "group_begin", "group_end" or "ack"; an oof message also
has a `reason` (deleted, expired or match). Everything is read from the frame's header
on demand and the payload is decoded on first access, so a subscriber that only counts
pays for nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import not_json
from amps_on_kafka.log.message import COMPLETED, Completed, LogMessage, Message
from amps_on_kafka.native import core

if TYPE_CHECKING:
    from amps_on_kafka.client.acks import AckBatcher

__all__ = ["COMPLETED", "Completed", "DeleteAck", "GatewayMessage", "LogMessage", "Message"]

_UNSET = object()


class GatewayMessage(Message):
    """A message from a worker's gateway: a frame's header (`meta`) and payload."""

    __slots__ = ("_data", "acks", "command", "meta", "payload", "sub_id", "topic")

    def __init__(
        self,
        command: str,
        topic: str | None,
        meta: dict[str, Any],
        payload: bytes = b"",
        sub_id: str | None = None,
    ) -> None:
        self.command = command  # type: ignore[misc]  # slots where Message has properties
        self.topic = topic  # type: ignore[misc]
        self.meta = meta  # the frame header, or one record's entry of a `sow` batch
        self.payload = payload  # type: ignore[misc]
        self.sub_id = sub_id  # type: ignore[misc]
        self.acks: AckBatcher | None = None  # set on messages delivered by a subscription
        self._data: Any = _UNSET

    @property
    def data(self) -> Any:
        """The decoded JSON payload (None when there is none)."""
        if self._data is _UNSET:
            try:  # JSON.decode without its call: a scan reads a hundred thousand of these
                self._data = orjson.loads(self.payload) if self.payload else None
            except orjson.JSONDecodeError as exc:
                raise not_json(exc) from exc
        return self._data

    @property
    def lease_period(self) -> int | None:
        """A queue message's lease left when it was delivered, in ms."""
        return self.meta.get("lp")

    def ack(self, option: str | None = None) -> None:
        """Acknowledge a queue message: processed (no option), "cancel" (back to the
        queue) or "expire" (removed at once). The client batches acks (docs/queues.md).

        A subscription's message without a lease, such as a barrier message (which left
        the queue as it was sent, seed 001), needs no ack: acking it does nothing, as in
        AMPS clients, so a subscriber may ack everything it receives.
        """
        acks = self.acks
        if acks is None:
            raise MessageError(
                f"{self!r} was not delivered by a subscription: there is nothing to ack"
            )
        # one compiled call reads the bookmark and lease and queues the ack (AckBatcher.add
        # is the compiled AckPending's method: docs/performance.md, the queue's ninth round)
        due = acks.add(self.topic, self.meta, option)
        if due is not None:  # a batch filled, or began while the timer sleeps
            acks.settle(due)

    @property
    def bookmark(self) -> str | None:
        return self.meta.get("bm")

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch: the log's stamp of the record's last update."""
        return self.meta.get("ts")

    @property
    def sow_key(self) -> str | None:
        return self.meta.get("k")

    @property
    def expiration(self) -> float | None:
        return self.meta.get("e")

    @property
    def correlation_id(self) -> str | None:
        return self.meta.get("x")

    @property
    def publisher_id(self) -> str | None:
        return self.meta.get("p")

    @property
    def sequence(self) -> int | None:
        return self.meta.get("s")

    @property
    def reason(self) -> str | None:
        return self.meta.get("reason")

    @property
    def ack_type(self) -> str | None:
        return self.meta.get("a")

    @property
    def status(self) -> str | None:
        return self.meta.get("status")

    @property
    def matches(self) -> int | None:
        """For a stats ack, the records that matched; for sow_delete, the records deleted."""
        return self.meta.get("matches")


class Batch(Protocol):
    """The messages of a batch frame made by the compiled core, up to the first entry it
    is not sure of: `read` entries taking `offset` bytes of the payload."""

    read: int
    offset: int

    def __iter__(self) -> Iterator[GatewayMessage]: ...


def _compiled_batches() -> Callable[[list[Any], bytes, tuple[Any, ...]], Batch] | None:
    """The compiled maker of a batch frame's messages (native/src/batches.rs), given the
    slots GatewayMessage's constructor fills: each record's entry and payload, the
    frame's command, topic and sub_id, then its `acks` (a queue's burst: the messages
    can be acked; None for a query's records), and what every message starts with; None
    without the core (tcp_connection._records is its twin; tests/native/test_batches.py
    holds the two alike)."""
    if core is None:
        return None
    frame_slots = ["command", "topic", "sub_id", "acks"]
    builder = core.BatchBuilder(GatewayMessage, "meta", "payload", frame_slots, [("_data", _UNSET)])
    return builder.build  # type: ignore[no-any-return]


batch_messages = _compiled_batches()

if core is not None:  # the same getter without a Python frame (native/src/records.rs)
    GatewayMessage.data = core.LazyData(  # type: ignore[method-assign]
        GatewayMessage,
        "_data",
        "payload",
        None,
        _UNSET,
        None,
        orjson.loads,
        vars(GatewayMessage)["data"].fget,
    )


class DeleteAck(Message):
    """What `sow_delete` returns on every transport: an ack (command "ack", status
    "success"; a refused delete raises instead) naming the topic, the sequence number of
    the first record the delete wrote (the others follow it) and its correlation id.

    Over tcp:// the worker applied the delete before answering: `ack_type` is
    "processed" and `matches` the number of records deleted. Over kafka:// nothing
    between the client and the log counts: the records were handed to Kafka
    (`publish_flush()` waits until they are persisted), `ack_type` and `matches` are None.
    """

    __slots__ = ("_ack_type", "_correlation_id", "_matches", "_sequence", "_topic")

    def __init__(
        self,
        topic: str,
        sequence: int | None,
        *,
        matches: int | None = None,
        ack_type: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        self._topic = topic
        self._sequence = sequence
        self._matches = matches
        self._ack_type = ack_type
        self._correlation_id = correlation_id

    @property
    def command(self) -> str:
        return "ack"

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def sequence(self) -> int | None:
        """The first record's sequence number (None when the delete wrote none)."""
        return self._sequence

    @property
    def matches(self) -> int | None:
        """Records deleted, counted by the worker (tcp://); None over kafka://."""
        return self._matches

    @property
    def ack_type(self) -> str | None:
        """ "processed" over tcp:// (the worker applied the delete); None over kafka://."""
        return self._ack_type

    @property
    def status(self) -> str:
        return "success"

    @property
    def correlation_id(self) -> str | None:
        return self._correlation_id

    def __repr__(self) -> str:
        return f"DeleteAck({self._topic}, matches={self._matches}, sequence={self._sequence})"
