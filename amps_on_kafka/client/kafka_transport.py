"""The `kafka://` transport: publish and replay straight against Kafka, no worker needed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from amps_on_kafka.broker.probe import require_answer
from amps_on_kafka.client.message import DeleteAck
from amps_on_kafka.config.properties import read_properties_file, resolve_all
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, Bootstrap
from amps_on_kafka.log.publisher import FailedWrite, LogPublisher
from amps_on_kafka.log.registry import TopicRegistry
from amps_on_kafka.log.replay import Replay

# What Client.connect takes as kafka_config: properties, or a properties file's path.
KafkaConfigSource = Mapping[str, object] | str | Path | None


def secured(address: str, source: KafkaConfigSource) -> Bootstrap:
    """`address` carrying the Kafka client properties `source` gives (log.kafka.Bootstrap)."""
    if source is None:
        return Bootstrap(address)
    if isinstance(source, str | Path):
        return Bootstrap(address, read_properties_file(source))
    try:
        return Bootstrap(address, resolve_all(source))
    except ValueError as exc:
        raise ConfigError(f"kafka_config: {exc}") from None


class KafkaTransport:
    def __init__(self, bootstrap: str, client_name: str) -> None:
        self.bootstrap = bootstrap
        self.client_name = client_name
        self.registry = TopicRegistry(bootstrap)
        self._publisher: LogPublisher | None = None
        self._failed_write_handler: Callable[[FailedWrite], None] | None = None

    def logon(self, timeout: float | None) -> None:
        """Return once Kafka answers; a TransportError naming why not (refused
        credentials and failed TLS handshakes at once)."""
        require_answer(self.bootstrap, timeout or METADATA_TIMEOUT)

    @property
    def publisher(self) -> LogPublisher:
        if self._publisher is None:
            self._publisher = LogPublisher(
                self.bootstrap,
                self.client_name,
                registry=self.registry,
                on_failed_write=self._failed_write_handler,
                report_successes=False,
            )
        return self._publisher

    def set_failed_write_handler(self, handler: Callable[[FailedWrite], None] | None) -> None:
        self._failed_write_handler = handler
        if self._publisher is not None:
            self._publisher.on_failed_write = handler

    def publish(
        self, topic: str, data: Any, expiration: float | None, command: Command, **kw: Any
    ) -> int:
        publisher = self._publisher or self.publisher
        if kw:
            return publisher.publish(topic, data, expiration, command, **kw)
        return publisher.publish(topic, data, expiration, command)  # no keyword dict to build

    @property
    def publish_document(self) -> Callable[..., int]:
        """Client.publish, which binds it on the client instance: the publisher's
        one-frame publish (LogPublisher.publish_document)."""
        return self.publisher.publish_document

    def sow_delete(
        self,
        topic: str,
        *,
        correlation_id: str | None = None,
        timeout: float | None = None,
        **kw: Any,
    ) -> DeleteAck:
        """Written to Kafka, counted by nobody: `matches` is None. `timeout` (how long a
        tcp:// client waits for the worker's count) is taken so that one call runs on
        both transports; nothing here waits (publish_flush does)."""
        written = self.publisher.sow_delete(topic, correlation_id=correlation_id, **kw)
        first = written[0] if written else None
        return DeleteAck(topic, first, correlation_id=correlation_id)

    def publish_flush(self, timeout: float | None) -> None:
        if self._publisher is not None:
            self._publisher.flush(timeout)

    def bookmark_subscribe(
        self, topic: str, bookmark: str, predicate, until: str | None, timeout: float | None
    ) -> Replay:
        return Replay(
            self.bootstrap,
            topic,
            bookmark,
            predicate=predicate,
            until=until,
            registry=self.registry,
            max_idle=timeout,
        )

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
