"""The delivery-order structure of a queue's available messages (see ReadyQueue)."""

from __future__ import annotations

import heapq
from collections import deque

from amps_on_kafka.state.queue_types import QueueEntry, Status


class ReadyQueue:
    """The messages available for delivery, in delivery order: highest rank, then oldest.

    Messages mostly become available in that order (they arrive oldest first, and
    without Priority every rank is 0), so those wait in a deque at O(1) a message; only
    the ones out of order (a lease that ended, a cancel, a higher priority) go through
    a heap. `pop` takes the first of the two. A message that leaves the queue while it
    waits here stays until popped or `compact`ed: the caller skips it.
    """

    __slots__ = ("_in_order", "_others")

    def __init__(self) -> None:
        self._in_order: deque[QueueEntry] = deque()
        self._others: list[tuple[int, int, QueueEntry]] = []  # heap of (-rank, seq, entry)

    def __bool__(self) -> bool:
        return bool(self._in_order or self._others)

    def __len__(self) -> int:
        return len(self._in_order) + len(self._others)

    def push(self, entry: QueueEntry) -> None:
        in_order = self._in_order
        if not in_order:
            in_order.append(entry)
            return
        last = in_order[-1]  # _order(last) < _order(entry), without two tuples a message
        if last.rank > entry.rank or (last.rank == entry.rank and last.seq < entry.seq):
            in_order.append(entry)
        else:
            heapq.heappush(self._others, (-entry.rank, entry.seq, entry))

    def head(self) -> tuple[int, int]:
        """The delivery order of the message `pop` would return (the queue is not empty)."""
        return self._others[0][:2] if self._others_first() else _order(self._in_order[0])

    def pop(self) -> QueueEntry:
        if self._others and self._others_first():
            return heapq.heappop(self._others)[2]
        return self._in_order.popleft()  # the common case: no call to _others_first

    def take(self) -> QueueEntry | None:
        """`pop`, or None when empty: the common case (all in order) in one call."""
        if self._others:
            return self.pop()
        in_order = self._in_order
        return in_order.popleft() if in_order else None

    def _others_first(self) -> bool:
        in_order, others = self._in_order, self._others
        return bool(others) and (not in_order or others[0][:2] < _order(in_order[0]))

    def drain_into(self, other: ReadyQueue) -> None:
        while self:
            other.push(self.pop())

    def compact(self) -> None:
        """Drop the messages that are no longer available."""
        self._in_order = deque(e for e in self._in_order if e.status is Status.AVAILABLE)
        self._others = [item for item in self._others if item[2].status is Status.AVAILABLE]
        heapq.heapify(self._others)


def _order(entry: QueueEntry) -> tuple[int, int]:
    return (-entry.rank, entry.seq)


def pop_first(sources: list[ReadyQueue]) -> QueueEntry | None:
    """The first message in delivery order among `sources`; None when all are empty."""
    if len(sources) == 1:
        return sources[0].take()
    first = min((s for s in sources if s), key=ReadyQueue.head, default=None)
    return None if first is None else first.pop()
