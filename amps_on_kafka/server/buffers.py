"""The gateway-wide bound on bytes queued unsent for clients (Gateway.MaxBufferedBytes).

A connection's unsent replies and deliveries wait in its transport's buffer, at most
MaxQueuedBytes each; with MaxConnections of them that alone is no bound (8 connections
that subscribed and never read took a worker to 2 GiB). This caps their sum, as AMPS's
MessageMemoryLimit caps the memory held for all clients' outgoing messages: once the sum
is over it, the connection holding the most is disconnected as a slow consumer, then the
next, until the sum is under it.

The sum is kept from what each connection's buffer held after its last write
(Session.send_encoded reads that size anyway, for its own limit): one subtraction and one
addition per write. A buffer also shrinks as the kernel takes it, which nobody is told,
so the sum can only overestimate: before anyone is cut, every buffer is measured again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from amps_on_kafka.server.session import Session


class SendBudget:
    """The bytes queued for all of a gateway's connections, and who to cut beyond `limit`."""

    def __init__(self, limit: int, sessions: Callable[[], list[Session]]) -> None:
        self.limit = limit
        self.total = 0  # the sum of every open session's `queued` (its last measure)
        self._sessions = sessions

    def note(self, session: Session, queued: int) -> None:
        """`session`'s buffer holds `queued` bytes now (the loop, after each write)."""
        self.total += queued - session.queued
        session.queued = queued
        if self.total > self.limit:
            self._enforce()

    def forget(self, session: Session) -> None:
        """A closed session holds nothing any more."""
        self.total -= session.queued
        session.queued = 0

    def _enforce(self) -> None:
        """Measure every buffer; while the sum is over the limit, cut the largest."""
        sessions = self._sessions()
        for session in sessions:
            session.queued = session.writer.transport.get_write_buffer_size()
        self.total = sum(session.queued for session in sessions)
        while self.total > self.limit and sessions:
            largest = max(sessions, key=lambda session: session.queued)
            share = largest.queued
            largest.cut_slow_consumer(
                f"it held the most unsent bytes ({share:,}) when those queued for all "
                f"connections ({self.total:,}) passed MaxBufferedBytes ({self.limit:,})"
            )  # closed: forget() took its share off the total
            sessions.remove(largest)
