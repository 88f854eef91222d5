"""The pieces of a query spread over workers (server/cluster.py, server/peers.py,
server/membership.py), without Kafka: merging the parts, the directory of announcements,
the PARTS header."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid

import orjson
import pytest
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import PartitionsMoving
from amps_on_kafka.log.kafka import reader
from amps_on_kafka.processor.engine import QueryResult, ordered
from amps_on_kafka.security.policy import PeerAccess
from amps_on_kafka.server.cluster import reachable
from amps_on_kafka.server.membership import Directory, Membership
from amps_on_kafka.server.peers import PARTS, PeerPool, RemoteRecord, merge, parts_of
from amps_on_kafka.server.requests import ProtocolError

PARTITIONS = 4


def record(partition: int, key: int, value: int | None) -> RemoteRecord:
    payload = orjson.dumps({"id": key, "v": value})
    return RemoteRecord("t", partition, str(key), payload, f"t|{partition}|{key}|", 0, None)


def answer(records: list[RemoteRecord], order_by: str | None, top_n: int | None) -> QueryResult:
    """What one worker answers for `records` (the engine's order: partition, then as kept)."""
    chosen = sorted(records, key=lambda r: r.partition)
    if order_by:
        chosen = ordered(chosen, order_by)
    return QueryResult(chosen[:top_n] if top_n is not None else chosen, len(records))  # type: ignore[arg-type]


rows = st.lists(
    st.tuples(st.integers(0, PARTITIONS - 1), st.none() | st.integers(-3, 3)), max_size=40
)


@given(
    rows=rows,
    owners=st.lists(st.integers(0, 2), min_size=PARTITIONS, max_size=PARTITIONS),
    order_by=st.sampled_from([None, "/v", "/v DESC", "/v DESC, /id"]),
    top_n=st.none() | st.integers(0, 10),
)
def test_merged_parts_answer_as_one_worker_holding_every_partition(rows, owners, order_by, top_n):
    records = [record(p, key, v) for key, (p, v) in enumerate(rows)]
    whole = answer(records, order_by, top_n)
    parts = [
        answer([r for r in records if owners[r.partition] == worker], order_by, top_n)
        for worker in set(owners)
    ]
    merged = merge(parts, order_by, top_n)
    assert [r.sow_key for r in merged.records] == [r.sow_key for r in whole.records]
    assert merged.matches == len(records)


def announce(directory: Directory, worker: str, parts: list[int] | None, offset: int) -> None:
    value = None if parts is None else orjson.dumps({"address": worker, "parts": {"t": parts}})
    directory.apply(f"{directory.group}\x00{worker}".encode(), value, offset)


def test_the_claim_written_last_wins_and_a_tombstone_withdraws_every_claim():
    directory = Directory("g")
    announce(directory, "a", [0, 1, 2, 3], 0)
    announce(directory, "b", [2, 3], 1)  # took 2 and 3 over; a's record still claims them
    assert {p: m.worker for p, m in directory.owners("t").items()} == {
        0: "a",
        1: "a",
        2: "b",
        3: "b",
    }
    announce(directory, "b", None, 2)
    assert {p: m.worker for p, m in directory.owners("t").items()} == {
        0: "a",
        1: "a",
        2: "a",
        3: "a",
    }


def test_other_groups_and_unreadable_announcements_are_ignored():
    directory = Directory("g")
    assert not directory.apply(b"other\x00a", orjson.dumps({"address": "x", "parts": {}}), 0)
    assert directory.apply(b"g\x00a", b"not json", 1)
    assert directory.owners("t") == {}


def test_parts_header_is_a_list_of_partition_numbers():
    assert parts_of({}) is None
    assert parts_of({PARTS: [0, 3]}) == [0, 3]
    for bad in ([-1], ["0"], [True], 3):
        with pytest.raises(ProtocolError, match=PARTS):
            parts_of({PARTS: bad})


def test_a_wildcard_listen_address_is_announced_by_the_host_name():
    assert reachable("10.0.0.1:9007") == "10.0.0.1:9007"
    host, _, port = reachable("0.0.0.0:9007").rpartition(":")
    assert host not in ("0.0.0.0", "") and port == "9007"


def test_a_peer_that_does_not_answer_is_a_retryable_error():
    """A dead worker's stale claim: its address refuses connections."""
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(PartitionsMoving, match=r"^retry: partitions moving \(the worker at "):
        asyncio.run(PeerPool(PeerAccess()).take(address))


def test_the_latest_claim_of_a_queue_names_its_owner():
    directory = Directory("g")

    def claim(worker: str, queues: list[str], offset: int) -> None:
        value = {"address": f"{worker}:1", "parts": {}, "queues": queues}
        directory.apply(f"g\x00{worker}".encode(), orjson.dumps(value), offset)

    assert directory.queue_owner("q") is None
    claim("a", ["q"], 0)
    claim("b", ["q"], 1)  # took q over; a's record (a dead worker's) still claims it
    assert directory.queue_owner("q").address == "b:1"
    claim("b", [], 2)  # b let it go: the stale claim is all there is (a peer refuses it)
    assert directory.queue_owner("q").worker == "a"
    directory.apply(b"g\x00a", None, 3)
    assert directory.queue_owner("q") is None


def test_the_directory_end_is_asked_again_while_its_topic_is_unknown(bootstrap, topic_factory):
    """A worker started just after the directory topic was made got `Unknown partition`
    for its end, gave up following, and its start failed 30 s later (seen in CI)."""
    name = f"late-{uuid.uuid4().hex[:8]}"
    membership = Membership(None, bootstrap, "g")  # type: ignore[arg-type]  # _end only
    consumer = reader(bootstrap)
    later = threading.Timer(1.0, topic_factory, kwargs={"name": name})
    later.start()
    try:
        assert membership._end(consumer, TopicPartition(name, 0)) == 0
    finally:
        later.join()
        consumer.close()
