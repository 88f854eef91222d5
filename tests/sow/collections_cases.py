"""The collector pause around each batch: nested, and never turning on a disabled one.

Run by test_collections.py in an interpreter of its own (not collected here: the pause is
process-wide, so a worker thread another test left running would decide the outcome)."""

import gc
import weakref

import pytest

from amps_on_kafka.processor import collections
from amps_on_kafka.processor.collections import collections_paused, freeze_long_lived


@pytest.fixture(autouse=True)
def collector_restored():
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_and_resumed_after_the_outermost_pause():
    gc.enable()
    with collections_paused():
        assert not gc.isenabled()
        with collections_paused():  # a second worker's batch in the same process
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_process_disabled_stays_disabled():
    gc.disable()
    with collections_paused():
        pass
    assert not gc.isenabled()


def test_an_error_in_the_batch_still_resumes_the_collector():
    gc.enable()
    with pytest.raises(RuntimeError), collections_paused():
        raise RuntimeError("batch failed")
    assert gc.isenabled()


def test_overlapping_pauses_still_collect_cyclic_garbage_now_and_then(monkeypatch):
    """Threads that keep the collector paused between them (the worker and each queue)
    must not switch it off for good: a pause ending while another goes on runs a full
    collection once COLLECT_EVERY has passed."""
    gc.enable()
    monkeypatch.setattr(collections, "COLLECT_EVERY", 0.0)

    class Node:
        pass

    with collections_paused():  # another thread's batch, in progress throughout
        cycle = Node()
        cycle.me = cycle
        alive = weakref.ref(cycle)
        del cycle
        assert alive() is not None  # only the collector frees a cycle
        with collections_paused():
            pass
        assert alive() is None
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


class Node:
    """An object that can be in a reference cycle and have a weak reference."""

    def __init__(self) -> None:
        self.other: object = None


def test_freezing_collects_garbage_first_and_leaves_live_objects_out_of_full_passes():
    cycle = Node()
    cycle.other = cycle
    garbage = weakref.ref(cycle)
    live = Node()
    del cycle
    try:
        freeze_long_lived()
        assert garbage() is None  # never frozen: a frozen cycle would never be freed
        assert live not in gc.get_objects(generation=2)  # left out of full passes
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
