"""Messages delivered by the gateway transport, shaped like LogMessage.

An application iterating a stream reads `topic`, `data`, `bookmark`, `timestamp`,
`sow_key`, `expiration` and `command` whichever transport delivered the message. Here
`command` is one of "sow", "publish", "oof", "group_begin", "group_end" or "ack"; an
oof message also has a `reason` (deleted, expired or match). Everything is read from the
frame's header on demand and the payload is decoded on first access, so a subscriber
that only counts pays for nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import JSON

if TYPE_CHECKING:
    from amps_on_kafka.client.acks import AckBatcher

_UNSET = object()


class Message:
    __slots__ = ("_data", "acks", "command", "meta", "payload", "sub_id", "topic")

    def __init__(
        self,
        command: str,
        topic: str | None,
        meta: dict[str, Any],
        payload: bytes = b"",
        sub_id: str | None = None,
    ) -> None:
        self.command = command
        self.topic = topic
        self.meta = meta  # the frame header, or one record's entry of a `sow` batch
        self.payload = payload
        self.sub_id = sub_id
        self.acks: AckBatcher | None = None  # set on messages delivered by a subscription
        self._data: Any = _UNSET

    @property
    def data(self) -> Any:
        """The decoded JSON payload (None when there is none)."""
        if self._data is _UNSET:
            self._data = JSON.decode(self.payload) if self.payload else None
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
        if self.acks is None:
            raise MessageError(
                f"{self!r} was not delivered by a subscription: there is nothing to ack"
            )
        if self.lease_period is not None:
            self.acks.add(self.topic, self.bookmark, option)  # type: ignore[arg-type]

    @property
    def logical_topic(self) -> str | None:
        return self.topic

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

    def __repr__(self) -> str:
        where = self.bookmark or self.ack_type or ""
        return f"Message({self.command}, {self.topic}, {where})"
