"""The gateway's shared producer through librdkafka's C API (native/src/rdkafka_producer.rs).

Through confluent-kafka a gateway's plain publish cost 5,900 instructions in `produce`
and 4,100 more for its delivery report, a Python callback on the pump's thread
(docs/performance.md, publishing over tcp://). The compiled producer is a handle of its
own on the very librdkafka confluent-kafka loaded: a read's run of plain publishes is
produced in one call with no Python object per record, and a poll's reports of those
records reach Python as one list per batch. Every other command the gateway writes goes
to the same handle through confluent-kafka's `produce` signature with a Python callback,
so a session's records keep their order whichever path wrote them.

It is used only where it produces exactly as confluent-kafka would: the compiled core is
there, the library is found and is the version confluent-kafka reports, and every
setting is text (native_reader's rules: no callback, LibrdkafkaLog's logger not at
DEBUG). Anything else: None, and the gateway produces through confluent-kafka
(AMPS_NATIVE=0 does the same). A ProducerLog given as the logger (the gateway's) gets
librdkafka's warnings as confluent-kafka's logger would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient

from amps_on_kafka.log.kafka import ProducerLog, client_config, log_producer, log_producer_config
from amps_on_kafka.log.native_reader import loaded_library, text_settings
from amps_on_kafka.native import core

# What a record purged by librdkafka after a fatal error is reported with.
PURGED = (
    confluent_kafka.KafkaError._PURGE_QUEUE,
    confluent_kafka.KafkaError._PURGE_INFLIGHT,
    confluent_kafka.KafkaError._FATAL,
)

# A poll's reports of batched records: (batch number, reports, [(index, code, text)]).
BatchReports = Callable[[list[tuple[int, int, list[tuple[int, int, str]]]]], None]


class CompiledProducer:
    """confluent-kafka's Producer as the gateway uses it (produce, poll, flush, len,
    close, list_topics), on the compiled core's RdProducer. Metadata (list_topics) is
    read through an AdminClient of the same settings: the C API's metadata is not
    wrapped here."""

    compiled = True

    def __init__(self, producer: Any, metadata: AdminClient) -> None:
        self.core = producer
        self.produce = producer.produce  # bound once: the publishers bind it again
        self.poll = producer.poll
        self.flush = producer.flush
        self._metadata: AdminClient | None = metadata

    def __len__(self) -> int:
        return len(self.core)

    def serve_batches(self, handler: BatchReports) -> None:
        """Hand each poll's reports of batched records to `handler`, once per poll."""
        self.core.serve_batches(handler)

    def fatal(self) -> confluent_kafka.KafkaError | None:
        """librdkafka's fatal error once it raised one (every later produce fails: the
        owner replaces the producer), else None. confluent-kafka's producer raises it
        from poll instead, once (server/delivery.py and log/publisher.py take both)."""
        found = self.core.fatal_error()
        return None if found is None else confluent_kafka.KafkaError(*found, fatal=True)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        if self._metadata is None:
            raise RuntimeError("the producer is closed")
        return self._metadata.list_topics(*args, **kwargs)

    def close(self) -> None:
        """Destroy the handle now, once the caller flushed (records still unreported are
        purged, their callbacks freed uncalled); a poll or flush under way is waited for,
        and any call after it does nothing. The metadata client goes with its last
        reference."""
        self.core.close()
        self._metadata = None


def native_producer(
    config: Mapping[str, Any], metadata: Mapping[str, Any]
) -> CompiledProducer | None:
    """A compiled producer configured as `config` (log/kafka.log_producer_config), its
    metadata read with `metadata` (a plain client's configuration: no idempotence), or
    None where it would not produce as confluent-kafka does."""
    path = loaded_library()
    settings = text_settings(config)
    if core is None or not hasattr(core, "RdProducer") or path is None or settings is None:
        return None
    if str(config.get("delivery.report.only.error", False)).lower() not in ("false", "f", "0"):
        return None  # a success is never reported ("t" is true too): its callback never freed
    try:
        producer = core.RdProducer(
            path,
            confluent_kafka.libversion()[1],
            settings,
            confluent_kafka.KafkaError,
            confluent_kafka.KafkaException,
        )
    except ValueError:  # another librdkafka, or a setting it refuses: confluent-kafka says why
        return None
    logger = config.get("logger")
    if isinstance(logger, ProducerLog):  # confluent-kafka's would call its log()
        producer.serve_log(logger.lines)
    return CompiledProducer(producer, AdminClient(dict(metadata)))


def own_producer(
    bootstrap: str, config: Mapping[str, Any]
) -> confluent_kafka.Producer | CompiledProducer:
    """A LogPublisher's own producer (the client's on kafka://): log_producer(bootstrap,
    **config), compiled where it produces as confluent-kafka's would.

    The compiled one is told to report every record (delivery.report.only.error off,
    whatever `config` says), so a record produced with a callback is always answered and
    its callback freed; a success is still a Python call only where confluent-kafka's
    would make one or the callback ignores it (LogPublisher's Delivery). The publisher's
    common publish is numbered instead (RdProducer.produce_numbered): a success stops in
    librdkafka's C callback, a failure reaches the failures' handler, as with
    delivery.report.only.error (docs/performance.md, Client.publish)."""
    settings = {**config, "delivery.report.only.error": False}
    compiled = native_producer(log_producer_config(bootstrap, **settings), client_config(bootstrap))
    return log_producer(bootstrap, **config) if compiled is None else compiled


def fatal_text(producer: Any) -> str | None:
    """A compiled producer's fatal error as text, else None (confluent-kafka's raises it
    from poll instead). Asked when a purged record is reported before its owner saw the
    error: librdkafka purges the queue as it fails, and the poll serving the purge
    reports comes before the owner's next question."""
    fatal = getattr(producer, "fatal", None)
    error = None if fatal is None else fatal()
    return None if error is None else error.str()  # type: ignore[no-any-return]


def flush_all(producer: Any, timeout: float) -> None:
    """Serve every report of a producer (either kind) that failed fatally, up to
    `timeout`. By poll, not flush: confluent-kafka's flush goes on calling delivery
    callbacks once its error callback has set the fatal error as the exception, and
    each of those callbacks then fails ("returned a result with an exception set"),
    its report lost; its poll stops at the error and raises it, once."""
    deadline = time.monotonic() + timeout
    while len(producer) and time.monotonic() < deadline:
        with suppress(confluent_kafka.KafkaException):
            producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
