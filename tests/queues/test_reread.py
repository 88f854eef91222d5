"""A queue's checkpoint leaves the messages that only waited in their topics
(state/queue_store_runs.py), and a restart reads them again (processor/queue_recovery.py
`Reread`): after a SIGKILL, none is lost, none acked comes back, each keeps its arrival
number (so the order of delivery); a message whose record retention deleted meanwhile is
said lost in one log line, and the queue serves the rest."""

from __future__ import annotations

import logging

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from amps_on_kafka.processor.queue_recovery import Reread
from amps_on_kafka.state.queue import QueueState
from amps_on_kafka.state.queue_store import QueueStore, queue_store_path
from amps_on_kafka.state.queue_store_runs import _UnstoredRunsTwin, members
from amps_on_kafka.state.queue_types import EventKind, QueueEntry, QueueEvent, QueuePolicy, Reason
from tests.queues.conftest import Inbox
from tests.queues.crash_child import crashing
from tests.queues.helpers import eventually
from tests.queues.test_engine import publish

COUNT = 3000
ACKED = 500  # the crashing worker acks the messages below it and holds the rest's leases
BACKLOG = 20  # so at the crash 20 are leased and the rest, thousands, only wait


def _stored(state_dir, queue: str):
    store = QueueStore(queue_store_path(state_dir, queue))
    try:
        return store.load(lambda topic: None)
    finally:
        store.close()


def _offset(bookmark: str) -> int:
    return int(bookmark.split("|")[2])


def test_a_sigkill_with_thousands_waiting_loses_none_and_keeps_their_order(
    queue_config, engines, publisher, bootstrap, tmp_path
):
    config = queue_config(LeasePeriod="1h")
    queue = config.queues[0].name
    state_dir = tmp_path / "crashing"
    publish(publisher, queue, range(COUNT))  # read at once
    acked: set[str] = set()
    held: set[str] = set()
    with crashing(config, state_dir, bootstrap, BACKLOG, ACKED) as child:
        while len(acked) < ACKED or len(held) < BACKLOG:  # each ack answered: durable
            verb, *bookmark = child.stdout.readline().split()
            {"acked": acked, "held": held}.get(verb, set()).update(bookmark)
    stored = _stored(state_dir, queue)
    assert stored is not None and stored.runs, "the waiting messages were noted as runs"
    assert len(stored.entries) < COUNT // 10, "and not written to the store"
    engine = engines(config, state_dir)
    runtime = engine.runtimes[queue]
    eventually(engine, lambda: runtime.state.positions[(queue, 0)] == COUNT, what="all read")
    kept = {entry.bookmark for entry in runtime.state.entries.values()}
    everything = {f"{queue}|0|{n}|" for n in range(COUNT)}
    assert kept == everything - acked, "nothing lost, nothing acked comes back"
    inbox = Inbox()
    engine.subscribe(queue, inbox, session="s2", sub_id="after", max_backlog=1000)
    first = sorted(kept, key=_offset)[:1000]
    assert inbox.wait_for(len(first)) and inbox.bookmarks == first, "in their order"
    assert sorted(e.seq for e in runtime.state.entries.values()) == [
        e.seq for e in sorted(runtime.state.entries.values(), key=lambda e: e.id[2])
    ], "each message read again keeps its arrival number"


def test_waiting_messages_that_retention_deleted_are_said_lost_and_the_rest_served(
    queue_config, engines, publisher, bootstrap, tmp_path, caplog
):
    config = queue_config()
    queue = config.queues[0].name
    publish(publisher, queue, range(10))
    state_dir = tmp_path / "state"
    engine = engines(config, state_dir)
    inbox = Inbox()
    handle = engine.subscribe(queue, inbox, session="s", sub_id="a", max_backlog=3)
    engine.ack(queue, [m.bookmark for m in inbox.wait_for(3)], "s").result(10)
    engine.unsubscribe(handle)
    engine.stop()  # checkpoints: 3..9 waited only, left in the topic
    stored = _stored(state_dir, queue)
    assert stored is not None and not stored.entries and stored.runs
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deleted = admin.delete_records([TopicPartition(queue, 0, 6)])
    assert next(iter(deleted.values())).result(10).low_watermark == 6  # "retention"
    with caplog.at_level(logging.ERROR, logger="amps_on_kafka.processor.queue_runtime"):
        again = engines(config, state_dir)
    assert [m.data["n"] for m in again.browse(queue)] == list(range(6, 10))
    lost = [r for r in caplog.records if getattr(r, "event", None) == "lost"]
    assert [(r.count, r.partition) for r in lost] == [(3, 0)]
    assert "offsets 3 to 5" in lost[0].getMessage()
    again.stop()
    caplog.clear()
    third = engines(config, state_dir)  # the lost ones are out of the runs: said once
    assert [m.data["n"] for m in third.browse(queue)] == list(range(6, 10))
    assert not [r for r in caplog.records if getattr(r, "event", None) == "lost"]


def test_a_reread_gives_members_their_arrival_numbers_and_passes_the_rest():
    """Offsets 3-6 and 8 waited unstored, 7 was counted and stored, 4 was acked after the
    checkpoint (its event replayed): each member read again gets its arrival number back,
    the stored one and the acked one are passed, and what follows the store's offset
    arrives as new; the queue's order and its recovery point are the ones it had."""
    tp = ("t", 0)
    state = QueueState(QueuePolicy("q"), lambda: 0)
    state.start_at(tp, 9)
    state.restore(QueueEntry(("t", 0, 7), 1, b"{}", seq=5, cancels=1, stored=True))
    state.next_seq = 9
    runs = _UnstoredRunsTwin(False, [["t", 0, [[3, 1, 4], [8, 6, 1]]]])
    reread = Reread(members(runs.state()), dict(state.positions), None, runs)
    state.start_at(tp, reread.fronts()[tp])
    state.apply_event(QueueEvent(EventKind.REMOVE, ("t", 0, 4), 0, 0, Reason.ACK))
    read = [QueueEntry(("t", 0, n), 1, b"{}") for n in range(3, 9)]
    after = [(tp, 9), QueueEntry(("t", 0, 10), 1, b"{}")]
    assert reread.take(state, read + after) == after
    state.enqueue_read(after)
    reread.finish(state, "q")
    assert {e.id[2]: e.seq for e in state.entries.values()} == {3: 1, 5: 3, 6: 4, 7: 5, 8: 6, 10: 9}
    assert [e.id[2] for e in state.browse()] == [3, 5, 6, 7, 8, 10]
    assert runs.state() == [["t", 0, [[3, 1, 1], [5, 3, 2], [8, 6, 1]]]]
    assert state.recovery_point().offsets[tp] == 3
    assert state.positions[tp] == 11
