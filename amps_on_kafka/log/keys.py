"""SOW keys: the text that identifies a record, computed from its Key paths.

Like AMPS, key fields are compared as text: `42` and `"42"` name the same record. A
single key is the field's text; a composite key is a JSON array of the fields' texts,
which can't collide with a single key nor be split ambiguously.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import orjson

from amps_on_kafka.errors import MessageError


def split_path(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def field_at(data: Any, parts: Sequence[str]) -> Any:
    """The value at a path, or None where any step is missing."""
    for part in parts:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def key_text(value: Any) -> str:
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    try:
        if isinstance(value, int | float):
            return orjson.dumps(value).decode()
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as exc:  # bytes from an Avro or binary field, an int beyond 64 bits
        raise MessageError(f"a SOW key field can't hold {type(value).__name__}: {exc}") from exc


class KeyExtractor:
    """Computes SOW keys for one topic; built once from its Key paths."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._parts = [split_path(p) for p in self.paths]
        only = self._parts[0] if len(self._parts) == 1 else ()
        self._single = only[0] if len(only) == 1 else None

    @property
    def single_field(self) -> str | None:
        """The field, when the key is one top-level field (the common case, which hot
        paths read themselves for an int or a text value), else None."""
        return self._single

    def __call__(self, data: Any) -> str:
        if self._single is not None:  # the common case: one top-level field
            value = data.get(self._single) if type(data) is dict else None
            if value is None or value == "":
                raise MessageError(f"message has no value for the SOW key field {self.paths[0]}")
            return value if type(value) is str else key_text(value)
        values = []
        for path, parts in zip(self.paths, self._parts, strict=True):
            value = field_at(data, parts)
            if value is None or value == "":
                raise MessageError(f"message has no value for the SOW key field {path}")
            values.append(value)
        return key_from_values(values)

    def many(self, batch: list[Any]) -> list[str]:
        """The keys of a batch of decoded payloads: [self(data) for data in batch], and
        the same MessageError for the first that has none.

        Why: the worker's fast path called this object once a record, two Python frames
        (with key_text) per key. With the common key, one top-level field of texts or
        of integers, the values are read by one comprehension and checked by type for
        the whole batch; anything else is keyed one by one, as before.
        """
        field = self._single
        if field is None:
            return list(map(self, batch))
        values = [data.get(field) if type(data) is dict else None for data in batch]
        kinds = set(map(type, values))
        if kinds == {int}:
            return list(map(str, values))  # key_text of an int (a bool is not one here)
        if kinds == {str} and "" not in values:
            return cast(list[str], values)
        return list(map(self, batch))


def key_from_values(values: Sequence[Any]) -> str:
    """The SOW key of a record whose key fields hold these values, in Key path order."""
    if len(values) == 1:
        return key_text(values[0])
    return orjson.dumps([key_text(v) for v in values]).decode()


# -- where a SOW key belongs ---------------------------------------------------------
# A publisher makes the SOW key the Kafka key, and librdkafka's murmur2_random partitioner
# (log/kafka.py) places it as Kafka's Java client does: murmur2 of the key's UTF-8 bytes,
# made positive, modulo the partition count. The worker checks each record against it,
# so a record some other producer put elsewhere is reported instead of splitting a key's
# state over two partitions.

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_LONG_KEY = 64  # bytes: longer keys are hashed one by one, not padded into the batch array


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as unsigned 32 bits."""
    length = len(data)
    h = _SEED ^ length
    end = length & ~3
    for i in range(0, end, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    if length & 3:
        h = ((h ^ int.from_bytes(data[end:], "little")) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


class MisplacedKey(MessageError):
    """A record's SOW key belongs in another partition than the one that holds it."""


def fnv1a(data: bytes) -> int:
    """32-bit FNV-1a, unsigned."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & _MASK
    return h


def _fnv1a_sarama(key: bytes) -> int:
    """FNV-1a read as a signed 32-bit number, then its absolute value (INT32_MIN stays
    2**31): librdkafka's fnv1a partitioner does this to place keys as Sarama's (Go)
    default hash partitioner does (rdfnv1a.c)."""
    h = fnv1a(key)
    return (2**32 - h) & _MASK if h & 0x80000000 else h


# A topic's `Partitioner`: how the producers that write it place a keyed record, so ours
# put each SOW key where theirs do. The names are librdkafka's hashes; for a non-empty key
# its `_random` variants (murmur2_random, consistent_random, fnv1a_random) hash alike.
#   murmur2  Kafka's Java client and librdkafka's murmur2(_random): positive murmur2 % n
#   crc32    librdkafka's default consistent_random (kcat, confluent-kafka): CRC-32 % n
#   fnv1a    librdkafka's fnv1a(_random) and Sarama's (Go) default: |FNV-1a as int32| % n
_HASHES: dict[str, Callable[[bytes], int]] = {
    "murmur2": lambda key: murmur2(key) & 0x7FFFFFFF,
    "crc32": zlib.crc32,
    "fnv1a": _fnv1a_sarama,
}
PARTITIONERS = tuple(_HASHES)


def partition_for(key: bytes, count: int, partitioner: str = "murmur2") -> int:
    """The partition a Kafka key goes to among `count`, by the topic's partitioner.

    The one definition every publisher and the worker's placement check use, held to
    librdkafka's own partitioners by tests/log/test_partitioners.py.
    """
    hash_of = _HASHES.get(partitioner)
    if hash_of is None:
        raise ValueError(f"unknown partitioner {partitioner!r} (one of {', '.join(PARTITIONERS)})")
    return hash_of(key) % count


class Placement:
    """Where the SOW keys of one topic belong: partition_for over its partition count.

    The worker asks it for every record it applies, so `misplaced` checks a whole batch
    at once: murmur2 in numpy cost 0.14-0.2 us a key where the Python loop cost 1.5.
    """

    def __init__(self, count: int, partitioner: str = "murmur2") -> None:
        partition_for(b"", 1, partitioner)  # an unknown partitioner fails here, not per record
        self.count = count
        self.partitioner = partitioner

    def partition(self, key: str) -> int:
        return partition_for(key.encode(), self.count, self.partitioner)

    def misplaced(self, keys: list[bytes], partition: int) -> list[int]:
        """The indexes of the keys that do not belong in `partition`, in order."""
        if self.count == 1:
            return [] if partition == 0 else list(range(len(keys)))
        if self.partitioner != "murmur2" or not keys:
            return self._misplaced_each(keys, range(len(keys)), partition)
        import numpy as np  # here: only the worker pays for importing numpy, not the CLI

        lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
        if lengths.max() <= _LONG_KEY:
            return self._wrong(_murmur2_many(keys, lengths), partition).tolist()
        short = np.nonzero(lengths <= _LONG_KEY)[0]  # a long key would widen every row
        found = self._misplaced_each(keys, np.nonzero(lengths > _LONG_KEY)[0].tolist(), partition)
        if len(short):
            hashes = _murmur2_many([keys[i] for i in short], lengths[short])
            found.extend(short[self._wrong(hashes, partition)].tolist())
        return sorted(found)

    def _wrong(self, hashes, partition: int):
        """The indexes of the murmur2 hashes whose partition is not `partition`."""
        return ((hashes & 0x7FFFFFFF) % self.count != partition).nonzero()[0]

    def _misplaced_each(
        self, keys: list[bytes], indexes: Iterable[int], partition: int
    ) -> list[int]:
        count, partitioner = self.count, self.partitioner
        return [i for i in indexes if partition_for(keys[i], count, partitioner) != partition]


def _murmur2_many(keys: list[bytes], lengths):
    """murmur2 of every key (`lengths` their lengths, each at most _LONG_KEY) as a numpy
    uint32 array.

    The keys are laid out zero-padded in rows of a common width of 4-byte words (one
    join, one masked copy: no Python call per key). The words past a key's full blocks
    are zero, so its tail (1 to 3 bytes) reads as one word, as murmur2's tail switch
    combines those bytes. numpy's uint32 arithmetic wraps as murmur2's does.
    """
    import numpy as np

    m = np.uint32(_M)
    n = len(keys)
    width = (int(lengths.max()) + 3) & ~3
    h = np.uint32(_SEED) ^ lengths
    if width:
        rows = np.zeros((n, width), dtype=np.uint8)
        rows[np.arange(width) < lengths[:, None]] = np.frombuffer(b"".join(keys), np.uint8)
        words = rows.view("<u4")
        full = lengths >> 2
        for j in range(width // 4):
            k = words[:, j] * m
            k ^= k >> 24
            k *= m
            h = np.where(full > j, (h * m) ^ k, h)
        tail = words[np.arange(n), np.minimum(full, width // 4 - 1)]
        h = np.where((lengths & 3) != 0, (h ^ tail) * m, h)
    h ^= h >> 13
    h *= m
    return h ^ (h >> 15)
