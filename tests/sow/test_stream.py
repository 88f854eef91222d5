"""SowEngine.stream (a gateway's unordered `sow`) answers as query() does.

stream() of a filter that pins no key checks expiry and the filter on the stored bytes
(PartitionStore.scan_matching) and builds only the records it keeps; query() builds
every record and checks it (engine._rows_kept). Over a store holding live, expired and
never-expiring records, payloads that don't decode and ones that decode to null, both
must give the same records, in the same order, with the same data.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from amps_on_kafka.expr import compile_filter
from amps_on_kafka.processor import engine as engine_module
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.state.record import NEVER, SowRecord
from amps_on_kafka.state.store import PartitionStore, StateBatch
from tests.sow.engine_helpers import two_store_engine

TOPIC = "streamed"
NOW = 1_000_000  # the engine's clock, ms
RECORDS = 300
FILTERS = [
    None,
    "/qty > 5",
    "/qty = 3 OR /name = 'x'",
    "/missing IS NULL",
    "NOT /qty < 100",
    "/qty > '5' AND NOT /name <> 'x'",  # these four: the compiled check (expr/raw.py)
    "/n/v >= 2.5 OR /qty <= 1.5",
    "/qty = 7",
    "/name > 5",
    "/id = 7",  # pins the key: stream's other path
    "/id IN (1, 2, 250)",
]


def payload(i: int) -> bytes:
    """Mostly documents (the quantity a number, a numeric string, an array, a float or
    null); some that don't decode, some null, some arrays, some with a field twice."""
    if i % 17 == 0:
        return b"{not json"
    if i % 19 == 0:
        return b"null"
    if i % 23 == 0:
        return b"[1, 2]"
    if i % 29 == 0:
        return b'{"id": %d, "qty": 1, "qty": 9}' % i  # orjson keeps the last
    qty = (i % 12, str(i % 12), [i % 12, 3], i / 7, None)[i % 11 % 5]
    return orjson.dumps(
        {"id": i, "qty": qty, "name": "x" if i % 5 == 0 else "y", "n": {"v": i / 4}}
    )


def deadline(i: int) -> int:
    """Never, past (at or before NOW: expired) or future."""
    return (NEVER, NOW - 1, NOW, NOW + 1)[i % 4]


def fill(stores: list[PartitionStore]) -> None:
    for i in range(RECORDS):
        store = stores[i % 2]
        batch = StateBatch(store)
        record = SowRecord(TOPIC, store.partition, str(i), payload(i), i, NOW - 10, deadline(i))
        batch.set(str(i), record)
        store.write(batch)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[SowEngine]:
    with two_store_engine(tmp_path_factory.mktemp, TOPIC, NOW, fill) as engine:
        yield engine


@pytest.mark.parametrize("text", FILTERS)
def test_a_stream_answers_as_the_query_does(engine: SowEngine, text: str | None) -> None:
    filter = compile_filter(text) if text is not None else None
    streamed = list(engine.stream(TOPIC, filter))
    queried = list(engine.query(TOPIC, filter).records)
    assert streamed == queried
    assert [r.data if r.payload != b"{not json" else None for r in streamed] == [
        r.data if r.payload != b"{not json" else None for r in queried
    ]


def test_a_stream_leaves_out_expired_and_undecodable_records(engine: SowEngine) -> None:
    kept = list(engine.stream(TOPIC, compile_filter("/qty >= 0")))
    assert kept, "some records are live and match"
    assert all(r.deadline in (NEVER, NOW + 1) for r in kept)
    assert all(r.payload not in (b"{not json", b"null", b"[1, 2]") for r in kept)
    everything = list(engine.stream(TOPIC))
    assert {r.payload for r in everything} >= {b"{not json", b"null"}
    assert len(everything) == sum(1 for i in range(RECORDS) if deadline(i) in (NEVER, NOW + 1))


@pytest.mark.parametrize("text", FILTERS[1:])
def test_a_stream_answers_as_it_does_without_the_compiled_check(
    engine: SowEngine, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    filter = compile_filter(text)
    checked = list(engine.stream(TOPIC, filter))
    monkeypatch.setattr(engine_module, "raw_check", lambda filter, skip: None)
    assert list(engine.stream(TOPIC, filter)) == checked
