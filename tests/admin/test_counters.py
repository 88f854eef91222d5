"""The counters the gateway keeps for the admin port (server/stats.py, count_frames)."""

from __future__ import annotations

import itertools
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.admin.rates import HISTORY, RateHistory
from amps_on_kafka.protocol.frames import count_frames, encode_frame
from amps_on_kafka.server.stats import LATENCY_BUCKETS, Latencies

headers = st.dictionaries(st.sampled_from(["c", "t", "sub_id", "bm"]), st.text(max_size=20))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(headers, st.binary(max_size=300)), max_size=20))
def test_a_burst_of_frames_counts_each(frames):
    assert count_frames(b"".join(encode_frame(h, p) for h, p in frames)) == len(frames)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=50))
def test_latencies_are_a_cumulative_histogram(durations):
    latencies = Latencies()
    for seconds in durations:
        latencies.observe(seconds)
    buckets = latencies.cumulative()
    assert [bound for bound, _ in buckets] == [*LATENCY_BUCKETS, float("inf")]
    for bound, count in buckets:
        assert count == sum(1 for d in durations if d <= bound)
    assert abs(latencies.sum - sum(durations)) < 1e-6


def test_the_status_pages_history_keeps_its_last_samples_only():
    """RateHistory's ring (docs/operations.md, Bounds: 300 samples): however long the
    worker runs, it holds `size` samples, and their rates come from consecutive pairs."""
    calls = itertools.count(1)
    enough = threading.Event()

    def view() -> dict:
        n = next(calls)
        if n >= 20:
            enough.set()
        return {
            "worker": {"applied": n * 10},
            "sow_topics": [{"lag": 1}],
            "queues": [{"depth": 2}],
            "gateway": None,
        }

    history = RateHistory(view, every=0.001, size=5)
    history.start()
    try:
        assert enough.wait(10)
    finally:
        history.stop()
    points = history.points()
    assert len(points) == 4  # pairs of the 5 samples kept
    assert all(p["applied_per_second"] > 0 and p["lag"] == 1 for p in points)
    assert RateHistory(view).points() == [] and HISTORY == 300
