"""sow_delete as LogPublisher (log/publisher.py) writes it: the records go where the
state they delete lives, so one delete may be many records. A delete by filter is one
record per partition that holds state (every partition Kafka has now, or a
repartitioned topic's internal ones), a delete by keys one record per key, placed as the
key's publishes are. check_delete_target is the rule both transports check before they
send.

A mixin of LogPublisher: it reads the publisher's state, set by LogPublisher.__init__.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.codecs import encode_payload
from amps_on_kafka.log.envelope import Command, Envelope
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.log.topics import H_TARGET_PARTITION, repartition_topic

if TYPE_CHECKING:
    from amps_on_kafka.log.publisher import Persisted


class SowDeletes:
    """LogPublisher.sow_delete (LogPublisher's attributes and methods it uses are declared
    here for the type checker)."""

    publisher_id: str
    _sequences: Iterator[int]
    spec: Callable[[str], TopicSpec]
    partition_count: Callable[[str], int]
    _partition: Callable[[TopicSpec, str | None], int | None]
    _sow_key: Callable[[TopicSpec, Any, str | None], str | None]
    _produce: Callable[..., None]

    def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        keys: Iterable[str] | None = None,
        data: Any = None,
        correlation_id: str | None = None,
        on_persisted: Persisted | None = None,
        sequence: int | None = None,
    ) -> list[int]:
        """Produce a sow_delete by filter, by SOW keys or by data (exactly one of them).

        The records go where the state lives: a delete by filter to every partition, a
        delete by keys one record per key, routed by the key like the publishes it
        deletes. Returns the sequence of every record written: with an explicit
        `sequence` (a republish), the records are numbered from it, one apart.
        """
        check_delete_target(filter, keys, data)
        spec = self.spec(topic)
        common = {"correlation_id": correlation_id, "message_type": spec.message_type}
        numbers = self._sequences if sequence is None else itertools.count(sequence)
        if filter is not None:
            return [
                self._delete_record(
                    topic,
                    None,
                    None,
                    Envelope(filter=filter, sequence=next(numbers), **common),
                    on_persisted,
                    partition,
                    extra,
                )
                for partition, extra in self._fan_out(spec)
            ]
        if keys is not None:
            return [
                self._delete_record(
                    topic,
                    key,
                    None,
                    Envelope(sow_keys=(key,), sequence=next(numbers), **common),
                    on_persisted,
                    self._partition(spec, key),
                )
                for key in (str(k) for k in keys)
            ]
        value, document = encode_payload(spec.codec, data)
        key = self._sow_key(spec, document, None)
        return [
            self._delete_record(
                topic,
                key,
                value,
                Envelope(sow_key=key, sequence=next(numbers), **common),
                on_persisted,
                self._partition(spec, key),
            )
        ]

    def _delete_record(
        self,
        topic: str,
        key: str | None,
        value: bytes | None,
        envelope: Envelope,
        on_persisted: Persisted | None,
        partition: int | None = None,
        extra: list[tuple[str, bytes]] | None = None,
    ) -> int:
        stamped = replace(envelope, command=Command.SOW_DELETE, publisher_id=self.publisher_id)
        sequence: int = stamped.sequence  # type: ignore[assignment]
        headers = stamped.to_headers() + (extra or [])
        self._produce(topic, key, value, headers, sequence, on_persisted, partition)
        return sequence

    def _fan_out(self, spec: TopicSpec) -> list[tuple[int | None, list[tuple[str, bytes]]]]:
        """(partition, extra headers) of each record of a delete by filter: one per
        partition that holds state. That is every partition Kafka has now, or, on a
        repartitioned topic, every partition of its internal topic: each record names
        its own (header `rp`) for the repartitioner, so the gateway's processed ack
        still counts one result per record written."""
        if not spec.repartition:
            return [(p, []) for p in range(self.partition_count(spec.name))]
        count = self.partition_count(repartition_topic(spec.name))
        return [(None, [(H_TARGET_PARTITION, str(p).encode())]) for p in range(count)]


def check_delete_target(filter: str | None, keys: Iterable[str] | None, data: Any) -> None:
    """A sow_delete deletes by exactly one of filter, keys or data: MessageError if not.
    The client checks before it sends, so both transports refuse alike."""
    given = [
        name for name, v in (("filter", filter), ("keys", keys), ("data", data)) if v is not None
    ]
    if len(given) != 1:
        raise MessageError(
            f"sow_delete takes exactly one of filter, keys or data (got {given or 'none'})"
        )
    if isinstance(keys, str | bytes):  # its characters would each be a key to delete
        raise MessageError(
            f"sow_delete keys= takes a list of keys, not a string: keys=[{keys!r}] "
            f"deletes that one key"
        )
