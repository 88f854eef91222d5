"""sow_delete's `processed` ack: it waits for the worker to apply every record the command
wrote (one per partition for a filter, one per key) and sums what they deleted. The
results reach DeleteTracker through the gateway's listener; a peer gateway counting a
delete it wrote asks for them by (publisher id, sequence).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amps_on_kafka.server.cluster import RESULTS
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import ProtocolError, Request
from amps_on_kafka.state.events import CommandResult

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

RECENT_RESULTS = 10_000  # results of records no command here waits for, kept for a peer
MAX_WATCHED = 100_000  # results one connection may await at once (a peer's _results)


@dataclass(eq=False)
class _Delete:
    session: Session
    request: Request
    remaining: int
    publisher_id: str = ""
    sequences: list[int] = field(default_factory=list)
    deleted: int = 0
    errors: list[str] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, result: CommandResult) -> None:
        self.deleted += result.deleted
        if result.error is not None:
            self.errors.append(result.error)
        self.remaining -= 1
        if self.remaining == 0:
            self.done()

    def done(self) -> None:
        self.finished.set()
        reason = "; ".join(self.errors) or None
        if reason or self.request.wants("processed"):
            self.session.send(ack(self.request.header, "processed", reason, matches=self.deleted))


class DeleteTracker:
    """Matches the worker's results of sow_delete records to the commands that wrote them.

    Keyed by (publisher id, sequence), which LogPublisher stamps on every record. Lives on
    the event loop; the engine's results reach it through the gateway's listener.
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], _Delete] = {}
        # For a peer gateway counting a delete it wrote (server/cluster.py): what it asked
        # to be sent, and the results nobody here waited for, the latest RECENT_RESULTS
        # (a result may come before the peer's request does).
        self._watched: dict[tuple[str, int], tuple[Session, Callable[[CommandResult], None]]]
        self._watched = {}
        self._watching: Counter[Session] = Counter()  # per connection, bounded: MAX_WATCHED
        self._recent: dict[tuple[str, int], CommandResult] = {}

    def expect(
        self, session: Session, request: Request, publisher_id: str, sequences: list[int]
    ) -> _Delete:
        entry = _Delete(session, request, len(sequences), publisher_id, sequences)
        if not sequences:
            entry.done()
        for sequence in sequences:
            self._waiting[(publisher_id, sequence)] = entry
        return entry

    def apply(self, results: list[CommandResult]) -> None:
        for result in results:
            if result.publisher_id is None or result.sequence is None:
                continue
            key = (result.publisher_id, result.sequence)
            entry = self._waiting.pop(key, None)
            watcher = self._watched.pop(key, None) if entry is None else None
            if entry is not None:
                entry.add(result)
            elif watcher is not None:
                self._watching[watcher[0]] -= 1
                watcher[1](result)
            else:
                self._recent[key] = result
                if len(self._recent) > RECENT_RESULTS:  # dicts keep insertion order
                    del self._recent[next(iter(self._recent))]

    def watch(
        self,
        session: Session,
        publisher_id: str,
        sequences: list[int],
        deliver: Callable[[CommandResult], None],
    ) -> None:
        """`deliver` each result of these records applied here, past or to come. What a
        connection awaits is bounded (MAX_WATCHED): each costs memory until it comes or
        the connection closes, and any client may ask when no PeerSecret is set."""
        if self._watching[session] + len(sequences) > MAX_WATCHED:
            raise ProtocolError(
                f"{RESULTS!r} asks for {len(sequences)} results where this connection awaits "
                f"{self._watching[session]}: at most {MAX_WATCHED:,} at once"
            )
        for sequence in sequences:
            key = (publisher_id, sequence)
            result = self._recent.pop(key, None)
            if result is not None:
                deliver(result)
            else:
                replaced = self._watched.get(key)
                if replaced is not None:
                    self._watching[replaced[0]] -= 1
                self._watched[key] = (session, deliver)
                self._watching[session] += 1

    def forget(self, session: Session) -> None:
        self._waiting = {k: e for k, e in self._waiting.items() if e.session is not session}
        self._watched = {k: w for k, w in self._watched.items() if w[0] is not session}
        self._watching.pop(session, None)
