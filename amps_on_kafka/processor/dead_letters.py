"""Dead letters: copies of the records a worker refused, with why and where they came from.

A record the worker cannot apply is skipped, and its copy must be durable on the topic's
DeadLetterTopic before the worker's offset moves past it: otherwise a refused record
would be gone from the worker's view for good once retention removed it from the log.
So a dead-letter topic (a SOW topic's, or a queue's for its expired messages) must exist
when the worker starts (or be created, when the config says so), and a letter Kafka does
not acknowledge is an error the worker answers by staying on the record and trying again,
never by moving on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from amps_on_kafka.config import Config
from amps_on_kafka.errors import ConfigError, TransportError, UnknownTopic
from amps_on_kafka.log.envelope import dead_letter_headers
from amps_on_kafka.log.kafka import METADATA_TIMEOUT, admin_client, log_producer, partitions_of

log = logging.getLogger(__name__)

# How long Kafka may take to acknowledge one write of dead letters before the worker
# gives up on it and tries again later (message.timeout.ms of the dead-letter producer).
DELIVERY_TIMEOUT = 10.0
# librdkafka's largest message.max.bytes. A letter is as large as the record it copies,
# which its own topic may allow beyond the client's default of 1 MB: only the dead-letter
# topic's max.message.bytes, which an operator can raise, may refuse it.
MAX_LETTER_BYTES = 1_000_000_000


class DeadLetterFailed(TransportError):
    """Kafka did not acknowledge a dead letter: the worker must not move past its record."""


@dataclass(frozen=True, slots=True)
class Letter:
    """One refused record, as it will be written: its copy, with reason and source."""

    target: str
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @classmethod
    def of(
        cls, target: str, value: bytes | None, headers: list | None, reason: str, source: str
    ) -> Letter:
        return cls(target, value, dead_letter_headers(headers, reason, source))


def ensure_dead_letter_topics(bootstrap: str, config: Config) -> None:
    """Every DeadLetterTopic (of a SOW topic or of a queue) exists on Kafka before the
    worker reads a record.

    A missing one is created when its section says CreateDeadLetterTopic, else it is a
    ConfigError naming it: Kafka would refuse every letter to it, and each refused record
    (or expired queue message) would then hold its partition (see DeadLetters.send).
    """
    wanted = dead_letter_topics(config)
    if not wanted:
        return
    admin = admin_client(bootstrap)
    for owner, target, create in wanted:
        try:
            partitions_of(admin, target)
        except UnknownTopic:
            if not create:
                raise ConfigError(
                    f"{owner}: DeadLetterTopic {target!r} does not exist on Kafka; "
                    f"create it (amps-kafka topics create {target}), or set "
                    "CreateDeadLetterTopic: true"
                ) from None
            _create(admin, target)


def dead_letter_topics(config: Config) -> list[tuple[str, str, bool]]:
    """(whose, DeadLetterTopic, CreateDeadLetterTopic) for each SOW topic and queue that
    names one; `whose` reads "SOW T" or "queue Q", as errors name them."""
    sections = [(f"SOW {sow.topic}", sow) for sow in config.sow]
    sections += [(f"queue {queue.name}", queue) for queue in config.queues]
    return [
        (owner, section.dead_letter_topic, section.create_dead_letter_topic)
        for owner, section in sections
        if section.dead_letter_topic is not None
    ]


def _create(admin, name: str) -> None:
    """One partition, the broker's default replication: letters are few, read by people."""
    futures = admin.create_topics([NewTopic(name, 1)], operation_timeout=METADATA_TIMEOUT)
    try:
        futures[name].result()
        log.info("created the dead-letter topic %s", name)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TransportError(f"can't create the dead-letter topic {name!r}: {exc}") from exc


class DeadLetters:
    """Writes letters and waits until Kafka acknowledged every one, or says it did not."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None  # made for the first letters

    def send(self, letters: Iterable[Letter]) -> None:
        """Write the letters; DeadLetterFailed (naming the first failure) unless Kafka
        acknowledged all of them within DELIVERY_TIMEOUT. A letter may then be written
        twice when the worker tries again: dead letters are at least once."""
        letters = list(letters)
        self._check_targets({letter.target for letter in letters})
        producer = self._producer or self._start()
        failures: list[str] = []

        def delivered(error: KafkaError | None, message) -> None:
            if error is not None:
                failures.append(f"{message.topic()}: {error.str()}")

        for letter in letters:
            try:
                producer.produce(
                    letter.target, letter.value, headers=letter.headers, on_delivery=delivered
                )
            except (BufferError, KafkaException) as exc:
                failures.append(f"{letter.target}: {exc}")
                break
        unacknowledged = producer.flush(DELIVERY_TIMEOUT + 5)
        if failures or unacknowledged:
            first = failures[0] if failures else f"{unacknowledged} not acknowledged in time"
            raise DeadLetterFailed(f"dead letters not written ({first})")

    def _check_targets(self, targets: set[str]) -> None:
        """DeadLetterFailed at once when a target is gone (deleted by hand while the
        worker runs) or Kafka can't say: writing to it waited DELIVERY_TIMEOUT at every
        try, and the worker's loop, every partition, with it. One metadata request per
        batch that has letters."""
        self._admin = self._admin or admin_client(self.bootstrap)
        for target in sorted(targets):
            try:
                partitions_of(self._admin, target)
            except UnknownTopic:
                raise DeadLetterFailed(
                    f"dead letters not written (DeadLetterTopic {target!r} does not exist "
                    "on Kafka: create it again)"
                ) from None
            except TransportError as exc:
                raise DeadLetterFailed(f"dead letters not written ({exc})") from exc

    def _start(self) -> Producer:
        self._producer = log_producer(
            self.bootstrap,
            **{
                "linger.ms": 0,
                "message.timeout.ms": int(DELIVERY_TIMEOUT * 1000),
                "message.max.bytes": MAX_LETTER_BYTES,
            },
        )
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(DELIVERY_TIMEOUT)
            self._producer.close()
            self._producer = None
