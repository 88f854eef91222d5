"""Changelog topics: a partition's SOW restored on any machine, without its log (SOW
Changelog: true; docs/scaling.md, "State without the whole log").

A worker keeps each partition's state in a local store that only its own disk holds: a
worker elsewhere rebuilds it from the log, which must then be kept from its first
record. With a changelog, every batch the worker writes to a store is first written to
the compacted topic `_amps_changelog.<group>.<topic>` (one partition per partition of the
log it reads): each changed SOW key with its record as stored (deadline included), a
tombstone for each key deleted or expired, and one meta record per partition holding the
log offset the batch brings the state to and the expiration config history. The batch
and its meta go in one Kafka transaction (with the other partitions' batches of the
worker's loop turn), committed before the store is written, so
whatever committed prefix of the changelog a reader sees is the exact state at the
offset its last meta record names. A worker that opens a partition with no store reads
the changelog (read_committed) to its end into the store, then resumes the log after
that offset: only the log since needs to be kept (the retention a user may then set).

Compaction keeps one record per key: the changelog holds as many records as the SOW,
not as the log.
"""

from __future__ import annotations

import logging
import struct
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from amps_on_kafka.config import Config
from amps_on_kafka.errors import ConfigError, TransportError, UnknownTopic
from amps_on_kafka.log.kafka import (
    METADATA_TIMEOUT,
    admin_client,
    client_config,
    consume_available,
    partitions_of,
    reader,
)
from amps_on_kafka.state.store import (
    PartitionStore,
    StateBatch,
    pack_history,
    unpack_history,
)

log = logging.getLogger(__name__)

PREFIX = "_amps_changelog."
# Keys: b"r" + SOW key for a record, b"m" for the partition's meta record, so no SOW key
# can be taken for the meta record.
_RECORD, _META = b"r", b"m"
_OFFSET = struct.Struct(">q")
# seconds: a dead worker's open transaction is aborted after it; a seed (Changelog.seed)
# must commit within it
TRANSACTION_TIMEOUT = 60.0
COMMIT_TIMEOUT = TRANSACTION_TIMEOUT  # seconds a seed (a whole store) waits for its commit
# seconds a loop turn's transaction (and its start, its abort) may take: the worker's loop
# waits on it, so a commit Kafka can't finish (its changelog topic deleted by hand under
# it: 60 s before) fails at this bound, and its partitions are held and tried again
TURN_TIMEOUT = 10.0
RESTORE_BATCH = 10_000  # changelog records loaded into the store per write
CHECK_EVERY = 5.0  # seconds between two looks at whether a changelog topic was deleted
Entry = tuple[bytes, bytes | None]  # raw SOW key, record as stored (None: deleted)
# a batch of one store: its changes, the log offset they bring it to (None: the store's
# own, for a sweep), and the Kafka topic its offsets point into (the log it reads)
Batch = tuple[PartitionStore, Iterable[Entry], int | None, str]


class ChangelogFailed(TransportError):
    """Kafka did not take a batch's changelog transaction: the batch is not written to
    the store either, and its partition tries again (Worker._hold)."""


def changelog_topic(group: str, topic: str) -> str:
    return f"{PREFIX}{group}.{topic}"


def ensure_changelog_topics(bootstrap: str, config: Config, group: str) -> dict[str, str]:
    """The changelog of each SOW topic with Changelog on exists, compacted, with as many
    partitions as the log it mirrors (a Repartition SOW's internal topic has the source's
    count, and may not exist yet); a changelog with another count is a ConfigError (its
    partitions would not match the stores'). Returns each one's Kafka topic id, by SOW
    topic: a changelog deleted and created again has a new one."""
    wanted = [sow for sow in config.sow if sow.changelog]
    if not wanted:
        return {}
    admin = admin_client(bootstrap)
    for sow in wanted:
        name = changelog_topic(group, sow.topic)
        count = len(partitions_of(admin, sow.topic))  # a repartition topic's count too
        try:
            existing = len(partitions_of(admin, name))
        except UnknownTopic:
            _create(admin, name, count)
            continue
        if existing != count:
            raise ConfigError(
                f"SOW {sow.topic}: its changelog {name} has {existing} partitions, its log "
                f"{count}; delete it and start the workers again: they copy their stores "
                "into the new one"
            )
    return _created_ids(admin, {sow.topic: changelog_topic(group, sow.topic) for sow in wanted})


def _created_ids(admin: AdminClient, names: dict[str, str]) -> dict[str, str]:
    """The ids of topics just created: a broker may not describe a new topic at once
    (its metadata is still propagating), so it is asked again, for METADATA_TIMEOUT."""
    deadline = time.monotonic() + METADATA_TIMEOUT
    while True:
        ids = _topic_ids(admin, names)
        found = {key: topic_id for key, topic_id in ids.items() if topic_id is not None}
        if len(found) == len(ids):
            return found
        if time.monotonic() > deadline:  # deleted again since, or Kafka can't tell
            raise TransportError(f"changelog topics not described after their creation: {ids}")
        time.sleep(0.1)  # no event says when the metadata has propagated


def _topic_ids(admin: AdminClient, names: dict[str, str]) -> dict[str, str | None]:
    """By key, the Kafka topic id of the topic named (None: there is no such topic)."""
    asked = _ask_ids(admin, list(names.values()))
    return {key: _id_of(asked[name], METADATA_TIMEOUT) for key, name in names.items()}


def _ask_ids(admin: AdminClient, names: list[str]) -> dict[str, Future[Any]]:
    collection = TopicCollection(names)
    return admin.describe_topics(collection, request_timeout=METADATA_TIMEOUT)


def _id_of(answer: Future[Any], timeout: float | None = None) -> str | None:
    """A topic's id from describe_topics' answer; None when the topic does not exist.
    Another failure (Kafka unreachable) raises TransportError: it says nothing of it."""
    try:
        return str(answer.result(timeout).topic_id)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise TransportError(f"can't describe a changelog topic: {exc}") from exc


def _create(admin: AdminClient, name: str, partitions: int) -> None:
    topic = NewTopic(name, partitions, config={"cleanup.policy": "compact"})
    futures = admin.create_topics([topic], operation_timeout=METADATA_TIMEOUT)
    try:
        futures[name].result()
        log.info("created the changelog topic %s (%d partitions)", name, partitions)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise TransportError(f"can't create the changelog topic {name!r}: {exc}") from exc


def state_changes(state: StateBatch) -> Iterator[Entry]:
    """What a StateBatch changes, as changelog records."""
    for key, _, after in state.changed():
        yield key.encode(), None if after is None else after.encode()


def encoded_pairs(pairs: Iterable[tuple[str, bytes]]) -> Iterator[Entry]:
    """Records replaced blind (store.Replacements.pairs), as changelog records: a key
    replaced twice in the batch is written once, with its later record."""
    for key, stored in dict(pairs).items():
        yield key.encode(), stored


class Changelog:
    """The changelog writer of one worker: one transactional producer for every topic.

    Its transactional id is the worker's instance id when it has one, so a worker
    restarted with it aborts what its previous run left open (and fences that run);
    otherwise a new id per run, whose open transaction the broker aborts after
    TRANSACTION_TIMEOUT. Readers are read_committed: they never see half a batch.
    """

    def __init__(self, bootstrap: str, group: str, instance_id: str | None) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self._settings = {
            **client_config(bootstrap),
            "transactional.id": f"amps-changelog.{group}.{instance_id or uuid.uuid4().hex}",
            "transaction.timeout.ms": int(TRANSACTION_TIMEOUT * 1000),
            "linger.ms": 5,
            "compression.type": "lz4",
            # a changelog deleted by hand must not come back as a broker's default topic
            "allow.auto.create.topics": False,
        }
        self._producer = Producer(self._settings)
        self._ready = False
        self.failures = 0  # transactions that aborted or failed (admin metrics)
        # by SOW topic, the Kafka topic id of its changelog (ensure); a store marked with
        # another was written to a changelog since deleted, and is copied into this one
        self.ids: dict[str, str] = {}
        self._asked: dict[str, Future[Any]] | None = None  # a look under way (replaced)
        self._admin: AdminClient | None = None  # made for the first look
        self._next_check = 0.0

    def ensure(self, config: Config) -> None:
        """Create the changelogs missing (ensure_changelog_topics) and note their ids."""
        self.ids = ensure_changelog_topics(self.bootstrap, config, self.group)
        self._asked = None  # a look asked before would compare its answer with old ids

    def replaced(self) -> list[str]:
        """The SOW topics whose changelog topic is gone or not the one noted (deleted by
        hand, maybe created again), as Kafka last answered: asked every CHECK_EVERY by the
        worker's loop, which never waits for the answer (it reads it a turn later)."""
        asked, gone = self._asked, []
        if asked is not None and all(answer.done() for answer in asked.values()):
            self._asked = None
            names = {changelog_topic(self.group, topic): topic for topic in self.ids}
            try:
                gone = [names[n] for n, a in asked.items() if _id_of(a) != self.ids[names[n]]]
            except TransportError as exc:  # Kafka away: nothing known, asked again later
                log.debug("changelog topics not described: %s", exc)
        now = time.monotonic()
        if self._asked is None and self.ids and now >= self._next_check:
            self._next_check = now + CHECK_EVERY
            names_now = [changelog_topic(self.group, topic) for topic in self.ids]
            self._admin = self._admin or admin_client(self.bootstrap)
            self._asked = _ask_ids(self._admin, names_now)
        return gone

    def send(
        self,
        store: PartitionStore,
        changes: Iterable[Entry],
        next_offset: int | None,
        member: Consumer,
        consumed: str,
        timeout: float = TURN_TIMEOUT,
    ) -> None:
        """One store's batch in a transaction of its own (send_all)."""
        self.send_all([(store, changes, next_offset, consumed)], member, timeout)

    def send_all(
        self, batches: list[Batch], member: Consumer, timeout: float = TURN_TIMEOUT
    ) -> None:
        """Write batches' changes and the log offsets they bring their stores to in one
        transaction (the worker sends every partition of a loop turn together: a commit is
        a round trip to the coordinator and each partition's leader); returns once Kafka
        committed it, else raises ChangelogFailed, and nothing of it is visible to a
        read_committed reader. The caller writes the stores only after.

        The offsets are also committed for `member`'s group within the transaction,
        which the broker refuses from a member of an older generation: a worker the group
        has dropped (a zombie, whose partitions another worker now owns) can't commit a
        batch any more (Kafka's KIP-447).
        """
        producer = self._begin(timeout)
        try:
            offsets = [self._produce_batch(producer, *batch) for batch in batches]
            positions = [tp for tp in offsets if tp is not None]
            if positions:
                metadata = member.consumer_group_metadata()
                producer.send_offsets_to_transaction(positions, metadata, timeout)
            producer.commit_transaction(timeout)
        except (KafkaException, BufferError) as exc:
            self.failures += 1
            self._abort(exc, timeout)
            names = ", ".join(f"{b[0].topic}|{b[0].partition}" for b in batches)
            raise ChangelogFailed(f"changelog of {names} not written ({exc}): it waits") from exc

    def _produce_batch(
        self,
        producer: Producer,
        store: PartitionStore,
        changes: Iterable[Entry],
        next_offset: int | None,
        consumed: str,
    ) -> TopicPartition | None:
        """Produce one store's changes and meta record; the log offset to commit."""
        name, partition = changelog_topic(self.group, store.topic), store.partition
        for raw_key, stored in changes:
            _produce(producer, name, stored, _RECORD + raw_key, partition)
        offset = next_offset if next_offset is not None else store.next_offset()
        if offset is None:
            return None
        meta = _OFFSET.pack(offset) + pack_history(store.expiry_history())
        _produce(producer, name, meta, _META, partition)
        return TopicPartition(consumed, partition, offset)

    def seed(self, store: PartitionStore, member: Consumer, consumed: str) -> None:
        """Copy a store whose state predates its changelog (Changelog turned on, or off
        and on again, over existing stores) into it, in one transaction (`send`): every
        record, a tombstone for each key the changelog holds that the store doesn't, and
        the store's offset. Once committed, the changelog holds exactly the store's state,
        whatever it held before; until then none of it shows."""
        part = (changelog_topic(self.group, store.topic), store.partition)
        in_changelog = {
            key[len(_RECORD) :]
            for _, key, value in _committed(self.bootstrap, [part])
            if key != _META and value is not None
        }

        def snapshot() -> Iterator[Entry]:
            for record in store.scan():
                key = record.sow_key.encode()
                in_changelog.discard(key)
                yield key, record.encode()
            for key in list(in_changelog):
                yield key, None

        log.info("copying %s|%s into its changelog", store.topic, store.partition)
        self.send(store, snapshot(), store.next_offset(), member, consumed, COMMIT_TIMEOUT)
        store.mark_changelogged(self.ids[store.topic])

    def close(self) -> None:
        self._producer.flush(TURN_TIMEOUT)

    def _begin(self, timeout: float) -> Producer:
        try:
            if not self._ready:
                self._producer.init_transactions(timeout)
                self._ready = True
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise ChangelogFailed(f"changelog transaction not started: {exc}") from exc
        return self._producer

    def _abort(self, exc: BaseException, timeout: float) -> None:
        """Abort a failed transaction, or fail the worker when it can't go on (fenced by
        a newer run with the same instance id: two workers would write one changelog)."""
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(error, KafkaError) and error.fatal():
            raise TransportError(f"changelog producer failed for good: {error.str()}") from exc
        try:
            self._producer.abort_transaction(timeout)
        except KafkaException as abort_error:
            # e.g. a commit that timed out (its topic deleted) is still under way, and
            # every later call would conflict with it: a new producer with the same
            # transactional id fences this one and aborts what it left open
            log.warning("aborting a changelog transaction failed (%s): new producer", abort_error)
            self._producer.purge()
            self._producer = Producer(self._settings)
            self._ready = False


def _produce(
    producer: Producer, topic: str, value: bytes | None, key: bytes, partition: int
) -> None:
    """Produce, waiting for room when the producer's queue is full (a large seed)."""
    while True:
        try:
            producer.produce(topic, value, key, partition)
            producer.poll(0)
            return
        except BufferError:
            producer.poll(0.1)


def restore(bootstrap: str, group: str, stores: list[PartitionStore]) -> dict[int, int | None]:
    """Load partitions' changelogs (what is committed, to their end) into their empty
    stores, with one reader; by store (its index in `stores`), the log offset it now
    reflects, or None when its changelog holds no position yet (the partition is then
    built from the log, as without a changelog)."""
    parts = [(changelog_topic(group, store.topic), store.partition) for store in stores]
    metas: dict[int, bytes] = {}
    pending: dict[int, list[Entry]] = defaultdict(list)
    loaded = [0] * len(stores)
    for index, key, value in _committed(bootstrap, parts):
        if key == _META:
            metas[index] = value  # type: ignore[assignment]
            continue
        batch = pending[index]
        batch.append((key[len(_RECORD) :], value))
        if len(batch) >= RESTORE_BATCH:
            stores[index].load(batch)
            loaded[index] += len(batch)
            pending[index] = []
    for index, batch in pending.items():
        stores[index].load(batch)
        loaded[index] += len(batch)
    return {i: _position(store, metas.get(i), loaded[i]) for i, store in enumerate(stores)}


def _committed(
    bootstrap: str, parts: list[tuple[str, int]]
) -> Iterator[tuple[int, bytes, bytes | None]]:
    """Every committed record of the changelog partitions `parts`, to their end, as
    (index in parts, key, value), with one reader."""
    where = {part: index for index, part in enumerate(parts)}
    consumer = reader(
        bootstrap, **{"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in where])
    try:
        while where:
            for message in consume_available(consumer, RESTORE_BATCH, METADATA_TIMEOUT) or [None]:
                if message is None:
                    raise TransportError(f"reading changelogs {sorted(where)}: Kafka is silent")
                part = (message.topic(), message.partition())
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        raise TransportError(f"reading changelog {part}: {message.error()}")
                    where.pop(part, None)
                elif part in where:
                    yield where[part], message.key(), message.value()
    finally:
        consumer.close()


def _position(store: PartitionStore, meta: bytes | None, loaded: int) -> int | None:
    """Put the restored offset and expiration history in the store (and it on disk)."""
    if meta is None:
        return None
    offset = _OFFSET.unpack_from(meta)[0]
    store.load_position(offset, unpack_history(meta[_OFFSET.size :]))
    log.info(
        "restored %s|%s from its changelog: %d records, at offset %d",
        store.topic,
        store.partition,
        loaded,
        offset,
    )
    return offset
