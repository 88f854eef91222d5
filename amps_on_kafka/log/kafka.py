"""Small shared pieces of confluent-kafka set-up, so every part talks to Kafka alike."""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from amps_on_kafka.errors import TransportError, UnknownTopic

log = logging.getLogger(__name__)

METADATA_TIMEOUT = 10.0
# librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (1 s by default)
# whenever its local queue is over queued.min.messages: a reader that keeps that queue
# full then fetches a few times a second, which capped a one-partition read near 230k
# records/s on a local broker (750k+ without the pause).
CONSUMER_TUNING = {
    "queued.min.messages": 100_000,
    "fetch.queue.backoff.ms": 10,
}


class LibrdkafkaLog:
    """librdkafka's own log lines, sent to the Python logger ``amps_on_kafka.librdkafka``
    at DEBUG instead of straight to stderr.

    Left to itself librdkafka prints a line per failed connection attempt to stderr: an
    unreachable broker buried a command's one-line error under hundreds of them. What a
    user needs from those lines comes back to the code anyway (an exception, a delivery
    report, an error callback such as OutageWatch's), so the lines themselves are for
    debugging: `--log-level debug` shows them. confluent-kafka calls ``log`` with the
    line's level mapped to Python's; it is kept in the text.
    """

    logger = logging.getLogger("amps_on_kafka.librdkafka")

    def log(self, level: int, msg: str, *args: object) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("%s " + msg, logging.getLevelName(level), *args)


LIBRDKAFKA_LOG = LibrdkafkaLog()

# librdkafka's syslog levels as Python's (confluent-kafka's mapping for its logger).
SYSLOG_LEVELS = {
    0: logging.CRITICAL,
    1: logging.CRITICAL,
    2: logging.CRITICAL,
    3: logging.ERROR,
    4: logging.WARNING,
    5: logging.INFO,
    6: logging.INFO,
    7: logging.DEBUG,
}
COALESCE_SECONDS = 60.0  # a line like one logged within this long is counted, not logged
COALESCE_KEPT = 1_000  # lines remembered for coalescing; the oldest are forgotten past it
_FIGURES = re.compile(r"\d+")


class ProducerLog:
    """A producer's librdkafka lines: each to LIBRDKAFKA_LOG (DEBUG) as any client's, and
    a critical one (a fatal error: the producer is replaced, its records purged) also at
    its level to ``amps_on_kafka.librdkafka``. Warnings and errors stay at DEBUG: they are
    mostly a broker's connection failing and retried, which the worker's outage watcher
    already reports once ("Kafka unreachable ... since", "reachable again") where
    librdkafka repeats them at every reconnect and after (docs/operations.md).

    Coalesced, as librdkafka may repeat a line: a line alike to one logged within
    COALESCE_SECONDS (the same text, its figures aside) is counted, and the count said at
    the end of the next alike line logged. ``log`` is confluent-kafka's logger interface;
    ``lines`` takes the compiled producer's (RdProducer.serve_log: what librdkafka's
    thread kept, handed over at a poll, never waiting in that thread) with how many it
    had to drop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._logged: dict[str, tuple[float, int]] = {}  # alike -> (logged at, held since)

    def log(self, level: int, msg: str, *args: object) -> None:
        LIBRDKAFKA_LOG.log(level, msg, *args)
        if level >= logging.CRITICAL:
            self._coalesced(level, msg % args if args else msg)

    def lines(self, lines: list[tuple[int, str, str]], dropped: int) -> None:
        for syslog, facility, text in lines:
            self.log(SYSLOG_LEVELS.get(syslog, logging.ERROR), "%s %s", facility, text)
        if dropped:
            LibrdkafkaLog.logger.debug(
                "%d librdkafka warning(s) dropped (too many at once to keep)", dropped
            )

    def _coalesced(self, level: int, text: str) -> None:
        alike, now = _FIGURES.sub("#", text), self._clock()
        logged = self._logged.get(alike)
        if logged is not None and now - logged[0] < COALESCE_SECONDS:
            self._logged[alike] = (logged[0], logged[1] + 1)
            return
        held = logged[1] if logged is not None else 0
        if len(self._logged) >= COALESCE_KEPT:
            del self._logged[next(iter(self._logged))]
        self._logged.pop(alike, None)
        self._logged[alike] = (now, 0)
        suffix = f" ({held} more like it since the last logged)" if held else ""
        LibrdkafkaLog.logger.log(level, "%s%s", text, suffix)


class Bootstrap(str):
    """Bootstrap servers that carry the client properties (security.protocol, sasl.*,
    ssl.*, client.id...) every client made for them must use.

    A str, so it goes unchanged wherever a bootstrap address goes (the worker, the
    gateway, the registry, replays, Spark tasks) and every client built from it by
    client_config connects alike: no layer between the command line and librdkafka has
    to pass security settings along, or can forget to. It prints and formats as the
    bare address, so the properties (passwords among them) never reach a log line or an
    error message that names where Kafka is. Pickles with its properties (Spark ships
    it to its tasks).
    """

    properties: Mapping[str, str]

    def __new__(cls, servers: str, properties: Mapping[str, str] | None = None) -> Bootstrap:
        self = super().__new__(cls, servers)
        self.properties = MappingProxyType(dict(properties or {}))
        return self

    def __repr__(self) -> str:
        return repr(str(self))

    def __reduce__(self) -> tuple:
        return (Bootstrap, (str(self), dict(self.properties)))


def properties_of(bootstrap: str) -> Mapping[str, str]:
    """The client properties `bootstrap` carries (none for a plain str)."""
    return bootstrap.properties if isinstance(bootstrap, Bootstrap) else {}


def with_properties(bootstrap: str, properties: Mapping[str, str]) -> Bootstrap:
    """`bootstrap` carrying `properties` too; its own properties win over them."""
    return Bootstrap(str(bootstrap), {**properties, **properties_of(bootstrap)})


def client_config(bootstrap: str, **settings: Any) -> dict[str, Any]:
    """The configuration every Kafka client of the project starts from: the bootstrap
    servers, the properties they carry (Bootstrap) and librdkafka's log routed through
    Python logging (LibrdkafkaLog). `settings`, and what each kind of client sets for
    its role after this (acks, idempotence, group.id...), win over the properties."""
    return {
        "bootstrap.servers": str(bootstrap),
        "logger": LIBRDKAFKA_LOG,
        **properties_of(bootstrap),
        **settings,
    }


def admin_client(bootstrap: str, **overrides: Any) -> AdminClient:
    """An admin client. Its log lines wait in librdkafka's main queue until a poll();
    they come at most one per reconnect attempt (reconnect.backoff.max.ms, 10 s), so
    even a long-lived admin client through an outage queues only a few hundred."""
    return AdminClient(client_config(bootstrap, **overrides))


# librdkafka's reports that no retry can cure: the broker refused the credentials, or the
# TLS handshake failed (a certificate not trusted or not for this host, TLS against a
# plaintext listener). Each is a reason a client stops trying, named by what failed.
_DECISIVE = {
    KafkaError._AUTHENTICATION: "refused the credentials",
    KafkaError._SSL: "failed the TLS handshake",
}
# librdkafka's error texts start with the broker's URL and end with the connection's
# state; neither helps a user, and the URL repeats the address the message names.
_BROKER_PREFIX = re.compile(r"^\S+/(bootstrap|\d+): (SSL handshake failed: )?")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)$")


class ConnectionErrors:
    """An error_cb (and logger) for a client that is connecting: keeps the last error
    librdkafka reported and the first decisive one (_DECISIVE), for a one-line reason why
    it could not connect. Errors reach it when the client is polled.

    Some failures are only logged: a broker that closes the connection at the first
    request (a TLS or SASL listener spoken to in plaintext) gives no error, only FAIL log
    lines, so as the client's logger this keeps the last of those too, and passes every
    line on to LIBRDKAFKA_LOG.
    """

    def __init__(self, bootstrap: str) -> None:
        self._properties = properties_of(bootstrap)  # secrets to scrub from the texts
        self.last: KafkaError | None = None
        self.decisive: KafkaError | None = None
        self.failure: str | None = None  # the last FAIL log line's text

    def log(self, level: int, msg: str, *args: object) -> None:
        LIBRDKAFKA_LOG.log(level, msg, *args)
        text = msg % args if args else msg
        if text.startswith("FAIL "):
            self.failure = text.partition("]: ")[2]

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            return  # says that it failed, not why
        self.last = error
        if self.decisive is None and error.code() in _DECISIVE:
            self.decisive = error

    def reason(self) -> str | None:
        """Why the client could not connect, in one line (the decisive error if there
        is one, else the last), or None if librdkafka said nothing."""
        # Here, not at the top: the config package (pydantic) is no import of a process
        # that only reads the log (a Spark task), and this runs only when a client failed.
        from amps_on_kafka.config.properties import scrub

        error = self.decisive or self.last
        if error is None and self.failure is None:
            return None
        text = error.str() if error is not None else self.failure or ""
        hint = _PLAINTEXT_HINT if error is None and "state APIVERSION_QUERY" in text else ""
        text = scrub(_STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", text)), self._properties)
        what = _DECISIVE.get(error.code()) if error is not None else None
        return (f"{what}: {text}" if what else text) + hint


# A broker that closes the connection at a client's first request (ApiVersion) most often
# has a listener that wants TLS or SASL while the client speaks plaintext.
_PLAINTEXT_HINT = (
    " at the first request: does its listener want TLS or SASL (security.protocol in "
    "--kafka-config or Kafka.Properties)?"
)


_PROBE_CONFIG = {
    # Retry a refused connection quickly instead of librdkafka's backoff of up to 10 s.
    "reconnect.backoff.ms": 100,
    "reconnect.backoff.max.ms": 500,
}


def await_answer(
    bootstrap: str,
    timeout: float,
    *,
    alive: Callable[[], bool],
    errors: ConnectionErrors | None = None,
) -> bool:
    """Ask for metadata until the broker answers (True), ``alive()`` is False or time is up.

    A metadata request that lists at least one broker means the listener is up, this
    client is let in, and the broker has caught up with the controller. Each request
    waits at most one second, so a broker process that dies is noticed within about a
    second. "Connection refused" is expected while a broker starts: its log lines go to
    the librdkafka logger at DEBUG, never to stderr. ``errors``, when given, collects
    librdkafka's reports, and a decisive one (credentials refused, TLS handshake failed)
    ends the wait at once: retrying can't help.
    """
    watch = {"error_cb": errors, "logger": errors} if errors is not None else {}
    admin = admin_client(bootstrap, **_PROBE_CONFIG, **watch)
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0 and alive():
        try:
            if admin.list_topics(timeout=min(1.0, remaining)).brokers:
                return True
        except KafkaException:
            pass
        admin.poll(0)  # serves error_cb
        if errors is not None and errors.decisive is not None:
            return False
    return False


# The hash a log producer places keys with when the publisher gives no partition.
PRODUCER_PARTITIONER = "murmur2"


def log_producer(bootstrap: str, **overrides: Any) -> Producer:
    """A producer whose delivery report means persisted: acks=all, idempotent, in order.

    murmur2 is Kafka's Java partitioner, so a SOW key lands in the same partition
    whichever client published it. A topic whose producers use another partitioner
    gets an explicit partition from the publisher (log/publisher.py).
    """
    return Producer(log_producer_config(bootstrap, **overrides))


def log_producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """log_producer()'s configuration (the gateway's compiled producer takes it too)."""
    config = {
        **client_config(bootstrap),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "compression.type": "lz4",
        "partitioner": f"{PRODUCER_PARTITIONER}_random",
        "topic.metadata.refresh.interval.ms": 30_000,
    }
    config.update(overrides)
    return config


def reader(bootstrap: str, **overrides: Any) -> Consumer:
    """A consumer for assign-and-seek reading: no group membership, no commits."""
    return Consumer(reader_config(bootstrap, **overrides))


def reader_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """reader()'s configuration (a replay's compiled reader takes it too)."""
    config = {
        **client_config(bootstrap),
        "group.id": f"amps-reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
        "fetch.max.bytes": 52_428_800,
        **CONSUMER_TUNING,
    }
    config.update(overrides)
    return config


def partitions_of(client: AdminClient | Consumer | Producer, topic: str) -> list[int]:
    """The partitions of a topic; UnknownTopic when Kafka doesn't have it."""
    if "\0" in topic:  # a client's: librdkafka's C string would raise ValueError
        raise unknown_topic(topic)
    try:
        metadata = client.list_topics(topic, timeout=METADATA_TIMEOUT)
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka for metadata of {topic!r}: {exc}") from exc
    info = metadata.topics.get(topic)
    if info is None or (
        info.error is not None
        and info.error.code()
        in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_TOPIC,
        )
    ):
        raise unknown_topic(topic)
    if info.error is not None:
        raise TransportError(f"metadata for topic {topic!r}: {info.error.str()}")
    return sorted(info.partitions)


def unknown_topic(topic: str) -> UnknownTopic:
    """The error for a topic Kafka doesn't have, saying what to do about it."""
    if "\0" in topic:
        return UnknownTopic(f"topic {topic!r} does not exist (a topic name holds no NUL)")
    return UnknownTopic(f"topic {topic!r} does not exist (create it with amps-kafka topics create)")


def topic_names(client: AdminClient | Consumer, *, internal: bool = False) -> list[str]:
    """Every user topic (Kafka's internal topics and ours, starting with '_', left out
    unless `internal`)."""
    return sorted(_all_topics(client) if internal else _user_topics(client))


def partitions_matching(
    client: AdminClient | Consumer, wanted: Callable[[str], bool]
) -> list[tuple[str, int]]:
    """Every partition of the user topics `wanted` accepts, from one metadata request."""
    return sorted(
        (name, partition)
        for name, info in _user_topics(client).items()
        if info.error is None and wanted(name)
        for partition in info.partitions
    )


def _user_topics(client: AdminClient | Consumer) -> dict[str, Any]:
    return {name: info for name, info in _all_topics(client).items() if not name.startswith("_")}


def _all_topics(client: AdminClient | Consumer) -> dict[str, Any]:
    try:
        return client.list_topics(timeout=METADATA_TIMEOUT).topics
    except KafkaException as exc:
        raise TransportError(f"can't reach Kafka: {exc}") from exc


def consume_available(consumer: Consumer, max_messages: int, timeout: float) -> list:
    """What is there now, up to max_messages; waits up to timeout only when nothing is.

    librdkafka's batch consume waits for the full timeout unless the batch fills, which
    would hold a live message back; this returns as soon as anything arrives.
    """
    records = consumer.consume(max_messages, timeout=0)
    if records:
        return records
    records = consumer.consume(1, timeout=timeout)
    if records:
        records.extend(consumer.consume(max_messages - 1, timeout=0))
    return records


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The offset after the last record of each partition: where a reader is caught up."""
    consumer = reader(bootstrap)
    try:
        return {
            p: consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=METADATA_TIMEOUT, cached=False
            )[1]
            for p in partitions_of(consumer, topic)
        }
    finally:
        consumer.close()


class OutageWatch:
    """Logs a Kafka outage once when it starts and once when it ends.

    librdkafka reports every failed reconnect; a worker that logged each one flooded
    its log through an outage while saying nothing about the recovery. Give ``error``
    as a client's ``error_cb``: the first _ALL_BROKERS_DOWN (a single broker gone is not
    an outage of a cluster) logs "Kafka unreachable at X since T: reason" and starts a
    thread that asks the brokers for metadata (each request waits at most a second)
    until they answer, then logs "Kafka reachable again after N s". The errors
    librdkafka reports meanwhile are not logged.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.down_since: float | None = None  # time.monotonic() of the current outage
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._prober: threading.Thread | None = None

    def error(self, error: KafkaError) -> None:
        """An error_cb: called on the client's polling thread."""
        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            return
        with self._lock:
            if self.down_since is not None or self._closed.is_set():
                return
            self.down_since = time.monotonic()
            log.warning(
                "Kafka unreachable at %s since %s: %s",
                self.bootstrap,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                error.str(),
                extra={"event": "kafka_down", "bootstrap": self.bootstrap},
            )
            self._prober = threading.Thread(
                target=self._await_recovery, name="amps-kafka-outage", daemon=True
            )
            self._prober.start()

    def close(self) -> None:
        """Stop waiting for a recovery (the client is closing): within about a second."""
        with self._lock:
            self._closed.set()
            prober = self._prober
        if prober is not None:
            prober.join()

    def _await_recovery(self) -> None:
        if not await_answer(self.bootstrap, math.inf, alive=lambda: not self._closed.is_set()):
            return  # closed first
        with self._lock:
            started, self.down_since = self.down_since, None
        seconds = time.monotonic() - started  # type: ignore[operator]
        log.warning(
            "Kafka reachable again at %s after %.0f s",
            self.bootstrap,
            seconds,
            extra={"event": "kafka_up", "bootstrap": self.bootstrap, "down_seconds": seconds},
        )
