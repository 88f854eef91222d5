"""The messages a queue's checkpoint leaves in Kafka: runs of unstored messages.

A message that has only waited in the queue (never counted: no cancel, and no delivery
where MaxDeliveries reads the count) holds nothing a restart cannot read again from its
topic: its payload, headers and timestamp are the record's, its rank, barrier and
deadline follow from them by the queue's policy. A checkpoint does not write it (a
RocksDB put, then a delete once acked: ~1.6 us of the queue's thread a message). It
notes it instead in a run: consecutive offsets of one partition that got consecutive
arrival numbers, so a restart gives each re-read message its arrival number back, and
delivers in the order it would have. A member leaves its run when it leaves the queue
or is stored (a cancel counted it): the run's front moves on, or the run splits in two
around it, so the runs kept (and written with each checkpoint) never outnumber the
messages waiting, however many passed. A restart reads each partition again from its
first run's first member (`UnstoredRuns.fronts`) and enqueues exactly the members
(processor/queue_recovery.py `Reread`).

`UnstoredRuns` here is the twin of the compiled core's (native/src/queue_store_runs.rs),
held to the same results by tests/native/test_queue_store.py.
"""

from __future__ import annotations

import bisect
from typing import Any

TP = tuple[str, int]
# One run: [first offset, its arrival number, count]
Run = list[Any]


class _UnstoredRunsTwin:
    """The runs of every partition of one queue (see the module docstring)."""

    def __init__(self, deliveries_counted: bool, runs: list[list[Any]] | None = None) -> None:
        # MaxDeliveries reads a message's delivery count: a delivered one is then stored
        self.deliveries_counted = deliveries_counted
        self._runs: dict[TP, list[Run]] = {}
        for topic, partition, kept in runs or ():
            self._runs[(topic, partition)] = [[first, seq, count] for first, seq, count in kept]

    def note(self, topic: str, partition: int, offset: int, seq: int) -> None:
        """A message that only waited, not stored: a member of its partition's runs
        (already one when its offset is within them: a re-read member)."""
        runs = self._runs.setdefault((topic, partition), [])
        if runs:
            last = runs[-1]
            end = last[0] + last[2]
            if offset < end:
                return
            if offset == end and seq == last[1] + last[2]:
                last[2] += 1
                return
        runs.append([offset, seq, 1])

    def leave(self, topic: str, partition: int, offset: int) -> None:
        """The message at `offset` left the queue or is stored: no longer a member (a
        message that never was one is not in any run's range). A member within a run
        splits it in two: the runs never hold more than the messages still waiting."""
        runs = self._runs.get((topic, partition))
        if not runs:
            return
        at = 0 if runs[0][0] <= offset < runs[0][0] + runs[0][2] else _find(runs, offset)
        if at is None:
            return
        first, seq, count = runs[at]
        after = first + count - offset - 1  # members after it
        if offset == first:
            runs[at] = [offset + 1, seq + 1, count - 1]
        else:
            runs[at] = [first, seq, offset - first]
            if after:
                runs.insert(at + 1, [offset + 1, seq + offset + 1 - first, after])
        if runs[at][2] == 0:
            del runs[at]
            if not runs:
                del self._runs[(topic, partition)]

    def fronts(self) -> dict[TP, int]:
        """Each partition's first member: where a restart reads it again from."""
        return {tp: runs[0][0] for tp, runs in self._runs.items()}

    def state(self) -> list[list[Any]]:
        """Every run, as the store keeps them: [[topic, partition, [[first, seq, count],
        ...]], ...] in the order the partitions were first noted."""
        return [
            [topic, partition, [list(run) for run in runs]]
            for (topic, partition), runs in self._runs.items()
        ]


def _find(runs: list[Run], offset: int) -> int | None:
    """The index of the run whose range holds `offset`, if one does."""
    at = bisect.bisect_right(runs, offset, key=lambda run: run[0]) - 1
    if at >= 0 and offset < runs[at][0] + runs[at][2]:
        return at
    return None


def members(runs: list[list[Any]]) -> dict[TP, dict[int, int]]:
    """Every member of stored runs: offset -> arrival number, by partition (a restart's
    re-read, which holds them while it reads the partitions again)."""
    found: dict[TP, dict[int, int]] = {}
    for topic, partition, kept in runs:
        offsets = found.setdefault((topic, partition), {})
        for first, seq, count in kept:
            for offset in range(first, first + count):
                offsets[offset] = seq + offset - first
    return found
