"""Performance regression check for a filtered `sow` scan over tcp:// (docs/performance.md).

The scan runs beside raw confluent-kafka consuming and decoding the same records from
the log, in the same run, a few rounds, and the best ratio is compared with a floor: a
busy machine slows both sides alike and a one-off stall costs one round, so only a real
regression fails it. The client runs in a process of its own, as in `bench gateway`. The
streamed scan reached 0.39-0.75x at load 5-15 (read whole first: 0.21-0.45x), so the
floor is 0.3x, below half the target (0.4x) by the noise of those runs.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from bench.common import documents
from bench.gateway import scan, serve
from bench.log import raw_consume
from bench.sow import fill

SAMPLE = 20_000  # records: enough that the per-record cost dominates
ROUNDS = 3
SCAN_FLOOR = 0.3  # of raw consume (issue 18's target: 0.8x)
FILTER = "/qty > 500"


@pytest.mark.timing
def test_a_filtered_scan_keeps_up_with_raw_kafka(bootstrap, topic_factory, tmp_path) -> None:
    docs = documents(SAMPLE, SAMPLE)
    topic = topic_factory(1, key=("/id",))
    fill(bootstrap, topic, docs)
    matching = sum(1 for doc in docs if doc["qty"] > 500)
    worker, gateway = serve(bootstrap, topic, str(tmp_path))
    ratios = []
    try:
        spawn = multiprocessing.get_context("spawn")  # never fork a process holding RocksDB
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as client:
            for _ in range(ROUNDS):
                peer = raw_consume(bootstrap, topic, 1, SAMPLE)
                seconds, delivered = client.submit(scan, gateway.address, topic, FILTER).result()
                assert delivered == matching
                ratios.append(SAMPLE / seconds / peer.rate)
    finally:
        gateway.stop()
        worker.stop()
    assert max(ratios) >= SCAN_FLOOR, f"scan / raw consume ratios {ratios}"
