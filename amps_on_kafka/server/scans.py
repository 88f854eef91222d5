"""A streamed scan's `sow` frames, built by the compiled core from the stored records.

The Python path (server/queries.py) builds a SowRecord for each record a scan keeps, cuts
them into runs (`batches`) and encodes each run (`sow_batch`, `encode_frame`): about
0.9 us of the gateway's CPU per record kept. Here `SowFrames` (native/src/scans.rs)
reads each store's RocksDB iterator itself, asks the compiled filter directly and
appends each kept record's `recs` entry and payload to the open frame; the frames are
the Python path's, byte for byte (tests/native/test_scans.py). A record's expiration
(`e`) is written by `_seconds` (orjson's float format is not Rust's). A record it is not
sure of (the filter is not sure, a key that is not UTF-8) it leaves to
`PartitionStore.raw_scan`'s `left`, scan_matching's own reading of it, and that record
is added with its entry encoded here. Without the core, for an Avro store (whose wire
payload is converted), or a filter the compiled check can't take: the Python path.
"""

from __future__ import annotations

from typing import Any

import orjson

from amps_on_kafka.expr import Filter
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import RawScans, SowEngine
from amps_on_kafka.server.replies import converted, record_entry, sow_prefix

Write = tuple[list[bytes], int]  # a write's frames and the records they hold


class CompiledWrites:
    """The writes of a streamed scan: each call gives frames whose records number at
    least `least`, in whole frames, or fewer (the last write), as queries._next_frames
    cuts them."""

    def __init__(self, scans: RawScans, frames: Any, least: int) -> None:
        self._scans = scans
        self._stores = list(scans.stores)
        self._frames = frames
        self._least = least

    def __call__(self) -> Write:
        frames, check, expired_by = self._frames, self._scans.check, self._scans.expired_by
        while self._stores:
            store, iterator, left = self._stores[0]
            bookmark = orjson.dumps(f"{store.topic}|{store.partition}|")[:-1]  # SowRecord's
            while frames.read(iterator, check, bookmark, expired_by, self._least) is not None:
                # a record the compiled loop left: scan_matching reads it (and goes on)
                if (record := left()) is not None:
                    entry, payload = record_entry(record)
                    frames.add(orjson.dumps(entry), payload)
                    iterator.next()
            if frames.closed >= self._least:
                break
            del self._stores[0]
        written: Write = frames.take(not self._stores)
        return written


def compiled_writes(
    engine: SowEngine,
    request: dict[str, Any],
    topic: str,
    filter: Filter | None,
    batch: int,
    batch_bytes: int,
    least: int,
) -> CompiledWrites | None:
    """The compiled writes of a scan, or None where the Python path must read it."""
    if core is None:
        return None
    scans = engine.raw_scans(topic, filter)
    if scans is None or any(converted(store.codec) for store, _, _ in scans.stores):
        return None
    frames = core.SowFrames(sow_prefix(request, topic), batch, batch_bytes, _seconds)
    return CompiledWrites(scans, frames, least)


def _seconds(deadline: int, timestamp: int) -> bytes:
    """A record's `e` as record_meta writes it: SowRecord.expiration, by orjson."""
    return orjson.dumps((deadline - timestamp) / 1000)
