"""Changelog topics: a partition's SOW restored on any machine, without its log (SOW
Changelog: true; docs/scaling.md, "State without the whole log").

A worker keeps each partition's state in a local store that only its own disk holds: a
worker elsewhere rebuilds it from the log, which must then be kept from its first
record. With a changelog, every batch the worker writes to a store is first written to
the compacted topic `_amps_changelog.<group>.<topic>` (one partition per partition of the
log it reads): each changed SOW key with its record as stored (deadline included), a
tombstone for each key deleted or expired, and one meta record per partition holding the
log offset the batch brings the state to and the expiration config history. The batch
and its meta go in one Kafka transaction, committed before the store is written, so
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
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
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
COMMIT_TIMEOUT = TRANSACTION_TIMEOUT  # seconds a batch waits for its transaction's commit
RESTORE_BATCH = 10_000  # changelog records loaded into the store per write
Entry = tuple[bytes, bytes | None]  # raw SOW key, record as stored (None: deleted)


class ChangelogFailed(TransportError):
    """Kafka did not take a batch's changelog transaction: the batch is not written to
    the store either, and its partition tries again (Worker._hold)."""


def changelog_topic(group: str, topic: str) -> str:
    return f"{PREFIX}{group}.{topic}"


def ensure_changelog_topics(bootstrap: str, config: Config, group: str) -> None:
    """The changelog of each SOW topic with Changelog on exists, compacted, with as many
    partitions as the log it mirrors (a Repartition SOW's internal topic has the source's
    count, and may not exist yet); a changelog with another count is a ConfigError (its
    partitions would not match the stores')."""
    wanted = [sow for sow in config.sow if sow.changelog]
    if not wanted:
        return
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
                f"{count}; delete it, then start the workers once with Changelog off and "
                "again with it on: they copy their stores into the new one"
            )


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
        suffix = instance_id or uuid.uuid4().hex
        self._producer = Producer(
            {
                **client_config(bootstrap),
                "transactional.id": f"amps-changelog.{group}.{suffix}",
                "transaction.timeout.ms": int(TRANSACTION_TIMEOUT * 1000),
                "linger.ms": 5,
                "compression.type": "lz4",
            }
        )
        self._ready = False
        self.failures = 0  # transactions that aborted or failed (admin metrics)

    def send(
        self,
        store: PartitionStore,
        changes: Iterable[Entry],
        next_offset: int | None,
        member: Consumer,
        consumed: str,
    ) -> None:
        """Write a batch's changes and the log offset it brings the state to (None: the
        store's own, for a sweep) in one transaction; returns once Kafka committed it,
        else raises ChangelogFailed, and nothing of it is visible to a read_committed
        reader. The caller writes the store only after.

        The offset is also committed for `member`'s group (on `consumed`, the log the
        store reads) within the transaction, which the broker refuses from a member of
        an older generation: a worker the group has dropped (a zombie, whose partitions
        another worker now owns) can't commit a batch any more (Kafka's KIP-447).
        """
        producer = self._begin()
        name, partition = changelog_topic(self.group, store.topic), store.partition
        try:
            for raw_key, stored in changes:
                _produce(producer, name, stored, _RECORD + raw_key, partition)
            offset = next_offset if next_offset is not None else store.next_offset()
            if offset is not None:
                meta = _OFFSET.pack(offset) + pack_history(store.expiry_history())
                producer.produce(name, meta, _META, partition)
                producer.send_offsets_to_transaction(
                    [TopicPartition(consumed, partition, offset)],
                    member.consumer_group_metadata(),
                    COMMIT_TIMEOUT,
                )
            producer.commit_transaction(COMMIT_TIMEOUT)
        except (KafkaException, BufferError) as exc:
            self.failures += 1
            self._abort(exc)
            raise ChangelogFailed(
                f"changelog {name}|{partition} not written ({exc}): the batch waits"
            ) from exc

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
        self.send(store, snapshot(), store.next_offset(), member, consumed)
        store.mark_changelogged(True)

    def close(self) -> None:
        self._producer.flush(COMMIT_TIMEOUT)

    def _begin(self) -> Producer:
        try:
            if not self._ready:
                self._producer.init_transactions(COMMIT_TIMEOUT)
                self._ready = True
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise ChangelogFailed(f"changelog transaction not started: {exc}") from exc
        return self._producer

    def _abort(self, exc: BaseException) -> None:
        """Abort a failed transaction, or fail the worker when it can't go on (fenced by
        a newer run with the same instance id: two workers would write one changelog)."""
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(error, KafkaError) and error.fatal():
            raise TransportError(f"changelog producer failed for good: {error.str()}") from exc
        try:
            self._producer.abort_transaction(COMMIT_TIMEOUT)
        except KafkaException as abort_error:
            log.warning("aborting a changelog transaction failed: %s", abort_error)


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
    store.mark_changelogged(True)
    log.info(
        "restored %s|%s from its changelog: %d records, at offset %d",
        store.topic,
        store.partition,
        loaded,
        offset,
    )
    return offset
