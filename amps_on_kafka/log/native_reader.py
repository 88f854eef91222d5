"""A replay's reader through librdkafka's C API (native/src/rdkafka_reader.rs).

confluent-kafka's consume copies every record's headers out of librdkafka (a parse and an
allocation a header) and frees them with its Message, whether anything reads them or not:
with our three-header envelope, ~2.9k of the ~13.8k instructions a record of the raw loop
(docs/performance.md, replay). The compiled reader is a consumer of its own on the very
librdkafka confluent-kafka loaded, and makes a replay's messages straight from librdkafka's
records, parsing a record's headers only when its headers are read.

It is used only where it reads exactly as confluent-kafka would: the compiled core is
there, the library is found and is the version confluent-kafka reports, and every setting
is text librdkafka takes as is (no Python callback). librdkafka's log lines are dropped,
so while LibrdkafkaLog's logger is on at DEBUG (``--log-level debug``) replays read
through confluent-kafka, whose lines that logger shows. Anything else: None, and the
caller reads through confluent-kafka as without the core (AMPS_NATIVE=0).

A queue's consumer (processor/queue_runtime.py) reads through it the same way
(queue_consumer): QueueReader gives the compiled reader the part of confluent-kafka's
Consumer API the queue calls, and its batches stay librdkafka's records, which the
queue's EntryReader (native/src/queue_entries.rs) makes its entries of in one call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cache
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from amps_on_kafka.log.bookmarks import TP
from amps_on_kafka.log.kafka import LIBRDKAFKA_LOG, ProducerLog
from amps_on_kafka.native import core


def native_reader(config: Mapping[str, Any]) -> Any | None:
    """A compiled reader (core.RdReader) configured as `config` (log/kafka.reader_config),
    or None where it would not read as confluent-kafka does."""
    path = loaded_library()
    settings = text_settings(config)
    if core is None or not hasattr(core, "RdReader") or path is None or settings is None:
        return None
    try:
        return core.RdReader(path, confluent_kafka.libversion()[1], settings)
    except ValueError:  # another librdkafka, or a setting it refuses: confluent-kafka says why
        return None


@cache
def loaded_library() -> str | None:
    """The path of the librdkafka this process loaded (confluent-kafka's), None if it is
    not to be found (no /proc: not Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and "/librdkafka" in f"/{path}":
                    return f"/{path}"
    except OSError:
        return None
    return None


def text_settings(config: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """`config` as librdkafka's text settings, converted as confluent-kafka converts them
    (True -> "true", numbers by str); None if a value is anything else (a callback), or
    LibrdkafkaLog must see librdkafka's lines (its logger on at DEBUG). A ProducerLog as
    the logger is the compiled producer's to serve (native_producer)."""
    settings = []
    for name, value in config.items():
        if name == "logger" and (value is LIBRDKAFKA_LOG or isinstance(value, ProducerLog)):
            if LIBRDKAFKA_LOG.logger.isEnabledFor(logging.DEBUG):
                return None
        elif isinstance(value, bool):
            settings.append((name, "true" if value else "false"))
        elif isinstance(value, (str, int, float)):
            settings.append((name, str(value)))
        else:
            return None
    return settings


def positions(reader: Any, partitions: list[TP]) -> list[tuple[TP, int]]:
    """Each partition's position (the offset after its last consumed record)."""
    return list(zip(partitions, reader.position(partitions), strict=True))


def queue_consumer(config: Mapping[str, Any]) -> QueueReader | Consumer:
    """A queue's consumer configured as `config` (log/kafka.reader_config): the compiled
    reader where native_reader gives one, else confluent-kafka's."""
    compiled = native_reader(config)
    return QueueReader(compiled) if compiled is not None else Consumer(dict(config))


def _checked(err: int) -> None:
    """confluent-kafka's way with an error code: KafkaException."""
    if err:
        raise KafkaException(KafkaError(err))


def _seconds(timeout: float | None) -> float:
    """confluent-kafka's timeouts: None waits for ever (-1)."""
    return -1.0 if timeout is None else timeout


class QueueReader:
    """The compiled reader as the queue's consumer: the methods of confluent-kafka's
    Consumer the queue calls, taking and giving TopicPartitions and raising
    KafkaException as they do, and `available` (log/kafka.consume_available's rule)
    whose batch (core.RawBatch) the queue's read_records reads."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def available(self, max_messages: int, timeout: float) -> Any:
        """What is there now, up to max_messages; waits up to timeout only when nothing is."""
        return self._reader.consume_raw(max_messages, timeout, KafkaError)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._reader.assign([(tp.topic, tp.partition, tp.offset) for tp in partitions])

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        err, text = self._reader.incremental_assign(
            [(tp.topic, tp.partition, tp.offset) for tp in partitions]
        )
        if err:
            raise KafkaException(KafkaError(err, text))

    def assignment(self) -> list[TopicPartition]:
        err, partitions = self._reader.assignment()
        _checked(err)
        return [TopicPartition(topic, partition) for topic, partition in partitions]

    def pause(self, partitions: list[TopicPartition]) -> None:
        _checked(self._reader.pause([(tp.topic, tp.partition) for tp in partitions]))

    def resume(self, partitions: list[TopicPartition]) -> None:
        _checked(self._reader.resume([(tp.topic, tp.partition) for tp in partitions]))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        offsets = self._reader.position([(tp.topic, tp.partition) for tp in partitions])
        return [
            TopicPartition(tp.topic, tp.partition, offset)
            for tp, offset in zip(partitions, offsets, strict=True)
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        err, low, high = self._reader.watermarks(
            partition.topic, partition.partition, cached, _seconds(timeout)
        )
        _checked(err)
        return low, high

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        wanted = [(tp.topic, tp.partition) for tp in partitions]
        err, offsets = self._reader.committed(wanted, _seconds(timeout))
        _checked(err)
        return [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in zip(wanted, offsets, strict=True)
        ]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        _checked(
            self._reader.commit(
                [(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous
            )
        )

    def close(self) -> None:
        self._reader.close()
