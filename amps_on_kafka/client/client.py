"""The adapter client: an AMPS-like API over either transport.

    with Client("pub-1") as client:
        client.connect("kafka://127.0.0.1:39092")
        client.logon()
        client.publish("orders", {"id": 1, "qty": 5})
        client.publish_flush()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from amps_on_kafka.client.kafka_transport import KafkaTransport
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.client.uri import parse_uri
from amps_on_kafka.errors import TransportError
from amps_on_kafka.expr import compile_filter
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.publisher import FailedWrite


class Client:
    """One named connection. The name is the publisher id carried by every record."""

    def __init__(self, name: str) -> None:
        if not name or "|" in name:
            raise ValueError(f"client name {name!r} must be non-empty and hold no '|'")
        self.name = name
        self._transport: KafkaTransport | None = None
        self._failed_write_handler: Callable[[FailedWrite], None] | None = None

    # -- connection -------------------------------------------------------------
    def connect(self, uri: str) -> None:
        endpoint = parse_uri(uri)
        if endpoint.scheme != "kafka":
            raise TransportError(f"{uri!r}: the gateway transport (tcp://) needs a worker")
        self._transport = KafkaTransport(endpoint.address, self.name)
        self._transport.set_failed_write_handler(self._failed_write_handler)

    def logon(self, timeout: float | None = None) -> None:
        self.transport.logon(timeout)

    @property
    def transport(self) -> KafkaTransport:
        if self._transport is None:
            raise TransportError("not connected: call connect(uri) first")
        return self._transport

    def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ----------------------------------------------------------------
    def publish(self, topic: str, data: Any, expiration: float | None = None, **kw: Any) -> int:
        """Publish; returns the sequence number. Persisted once publish_flush returns."""
        return self.transport.publish(topic, data, expiration, Command.PUBLISH, **kw)

    def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        return self.transport.publish(topic, data, expiration, Command.DELTA_PUBLISH, **kw)

    def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> int:
        if filter is not None:
            compile_filter(filter)  # a bad filter is refused before it reaches the log
        return self.transport.sow_delete(topic, filter=filter, keys=keys, data=data, **kw)

    def publish_flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka persisted every publish; PublishError names what failed."""
        self.transport.publish_flush(timeout)

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        """Called for each publish Kafka refused, instead of raising at publish_flush."""
        self._failed_write_handler = handler
        if self._transport is not None:
            self._transport.set_failed_write_handler(handler)

    # -- subscribing ---------------------------------------------------------------
    def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = None,
        *,
        until: str | None = None,
        timeout: float | None = None,
    ) -> MessageStream:
        """Replay the log from a bookmark, then follow it live.

        The stream yields messages in log order per partition, one `completed` marker
        when the replay has reached the end offsets taken at the start, then live
        messages. `until` ends the stream at a bookmark or time; `timeout` ends it after
        that many idle seconds.
        """
        predicate = compile_filter(filter).matches if filter else None
        replay = self.transport.bookmark_subscribe(topic, bookmark, predicate, until, timeout)
        return MessageStream(iter(replay), replay.close)
