"""The bookmark store as a state machine (seed 003), against a model of its rules.

Messages are logged in log order per partition and discarded in any order; some are
republished copies (a sequence not newer than one already seen). Always:

- the recovery point of a partition is the newest delivered offset such that it and
  every offset delivered before it are discarded (or refused as duplicates);
- after a crash (the store is abandoned, never closed) and a reopen, the logged store
  gives the same recovery point, and a resubscribe from it delivers exactly the messages
  not discarded; the ring store gives the same recovery point and delivers everything
  after it (seed 003: it "does not filter discarded messages after the resubscribe
  point").
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from amps_on_kafka import EPOCH
from amps_on_kafka.client import LoggedBookmarkStore, MemoryBookmarkStore, RingBookmarkStore
from amps_on_kafka.log.bookmarks import format_bookmark
from tests.subscribers.conftest import record

PARTITIONS = (0, 1)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="bookmark-machine-"))
        self.abandoned: list = []  # crashed stores: kept referenced, never closed
        self.delivered: dict[int, list[int]] = {p: [] for p in PARTITIONS}
        self.discarded: dict[int, set[int]] = {p: set() for p in PARTITIONS}
        self.sequences: dict[tuple[int, int], int] = {}
        self.newest: dict[int, int] = {p: 1000 for p in PARTITIONS}
        # the newest sequence the store can know: the ring store forgets them on a restart
        self.known: dict[int, int | None] = {p: None for p in PARTITIONS}
        self.next_offset: dict[int, int] = {p: 0 for p in PARTITIONS}

    @initialize(kind=st.sampled_from(["memory", "logged", "ring"]))
    def open(self, kind: str) -> None:
        self.kind = kind
        self.store = self._open()

    def _open(self):
        if self.kind == "memory":
            return MemoryBookmarkStore()
        if self.kind == "logged":
            return LoggedBookmarkStore(self.folder / "store.log")
        return RingBookmarkStore(self.folder / "store.ring")

    def recovery(self, partition: int) -> int:
        point = -1
        for offset in self.delivered[partition]:
            if offset not in self.discarded[partition]:
                break
            point = offset
        return point

    @rule(partition=st.sampled_from(PARTITIONS), gap=st.integers(1, 3), copy_back=st.integers(0, 3))
    def deliver(self, partition: int, gap: int, copy_back: int) -> None:
        """copy_back > 0 republishes a sequence that many steps back: a duplicate."""
        offset = self.next_offset[partition] + gap - 1
        self.next_offset[partition] = offset + 1
        copied = copy_back > 0 and bool(self.delivered[partition])
        sequence = self.newest[partition] + (1 - copy_back if copied else 1)
        known = self.known[partition]
        duplicate = known is not None and sequence <= known
        if not duplicate:
            self.known[partition] = sequence if known is None else max(known, sequence)
        self.newest[partition] = max(self.newest[partition], sequence)
        self.sequences[(partition, offset)] = sequence
        self.delivered[partition].append(offset)
        if duplicate:
            self.discarded[partition].add(offset)
        assert self.store.log(record(offset, sequence, partition=partition), "s") is not duplicate

    @rule(data=st.data(), partition=st.sampled_from(PARTITIONS))
    def discard(self, data: st.DataObject, partition: int) -> None:
        open_ = [o for o in self.delivered[partition] if o not in self.discarded[partition]]
        if not open_:
            return
        offset = data.draw(st.sampled_from(open_))
        self.discarded[partition].add(offset)
        self.store.discard(record(offset, partition=partition), "s")

    @precondition(lambda self: self.kind != "memory")
    @rule(graceful=st.booleans())
    def restart(self, graceful: bool) -> None:
        """Close (or crash) and reopen, then resubscribe from the recovery point."""
        if graceful:
            self.store.close()
        else:
            self.abandoned.append(self.store)
        self.store = self._open()
        for partition in PARTITIONS:
            self._resubscribe(partition)

    def _resubscribe(self, partition: int) -> None:
        point = self.recovery(partition)
        again = [o for o in self.delivered[partition] if o > point]
        if self.kind == "ring":  # it forgot the discards after the point, and the sequences
            self.discarded[partition] = {o for o in self.discarded[partition] if o <= point}
            newest = None
            for offset in again:
                sequence = self.sequences[(partition, offset)]
                if newest is not None and sequence <= newest:
                    self.discarded[partition].add(offset)
                newest = sequence if newest is None else max(newest, sequence)
            self.known[partition] = newest
        for offset in again:
            message = record(offset, self.sequences[(partition, offset)], partition=partition)
            expected = offset not in self.discarded[partition]
            assert self.store.log(message, "s") is expected, (partition, offset)

    @invariant()
    def recovery_point_matches_the_model(self) -> None:
        if not hasattr(self, "store"):
            return
        marks = [
            format_bookmark("orders", p, self.recovery(p))
            for p in PARTITIONS
            if self.recovery(p) >= 0
        ]
        assert self.store.get_most_recent("s") == (",".join(marks) or EPOCH)

    @invariant()
    def discarded_messages_are_known(self) -> None:
        if not hasattr(self, "store") or self.kind == "ring":
            return
        for p in PARTITIONS:
            for offset in self.delivered[p]:
                known = self.store.is_discarded(record(offset, partition=p), "s")
                assert known is (offset in self.discarded[p]), (p, offset)

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_bookmark_store_state_machine = StoreMachine.TestCase
