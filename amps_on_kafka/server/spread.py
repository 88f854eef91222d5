"""A subscription spread over the group's workers (server/cluster.py): the partitions
held here feed it from the local engine, and each peer's part comes over a Leg, a link
on which the peer answers the same subscription for its partitions. A sow_and_subscribe
merges every part's snapshot into one before any part goes live; changes arriving
meanwhile are held (at most MAX_HELD_CHANGES per leg). The subscription ends with a
"retry:" failure when its plan no longer holds, so a client never misses or doubles a
partition: it subscribes again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import AmpsError, PartitionsMoving
from amps_on_kafka.processor.engine import QueryResult
from amps_on_kafka.protocol.frames import Frame
from amps_on_kafka.server.fanout import Boundary
from amps_on_kafka.server.peers import (
    ANSWER_IDLE,
    PeerLink,
    RemoteRecord,
    forwarded,
    merge,
    refused,
    remote_records,
)
from amps_on_kafka.server.requests import MAX_BATCH, Request
from amps_on_kafka.server.subscriptions import ENTITLEMENT, MAX_HELD_CHANGES, SowSubscription

if TYPE_CHECKING:
    from amps_on_kafka.server.cluster import Cluster, Plan
    from amps_on_kafka.server.queries import Query
    from amps_on_kafka.server.session import Session


class SpreadSubscription:
    """One client subscription fed by the local engine and a leg per peer."""

    def __init__(
        self, cluster: Cluster, session: Session, request: Request, local: SowSubscription
    ) -> None:
        self.cluster = cluster
        self.session = session
        self.request = request
        self.local = local
        self.sub_id = local.sub_id
        self.closed = False
        self.plan: Plan | None = None
        self.legs: list[Leg] = []

    async def open_legs(self, plan: Plan, command: str, **extra: Any) -> None:
        """Ask each peer for its part; returns once each has answered (a processed ack,
        or a snapshot's stats ack)."""
        self.plan = plan
        self.cluster.watch(self)
        if self.local.entitlement is not None:  # for the peer's oof reasons
            extra[ENTITLEMENT] = self.local.entitlement.text
        for address, parts in plan.remote.items():
            link = await PeerLink.open(address, self.cluster.gateway.peer_access)
            if self.closed:  # closed while the link opened: close() saw no leg for it
                link.close()
                return
            leg = Leg(self, link)
            self.legs.append(leg)
            link.send(forwarded(self.request.header, command, parts, sub_id=self.sub_id, **extra))
            leg.start()
        await asyncio.gather(*(leg.answered for leg in self.legs))

    async def snapshot_then_live(self, query: Query) -> None:
        """sow_and_subscribe: each peer's snapshot and the local one (taken with its
        Boundary), merged and sent as one; then every part goes live."""
        from amps_on_kafka.server.queries import send_snapshot

        gateway = self.cluster.gateway
        plan = await self.cluster.plan(query.topic)
        await self.open_legs(plan, "sow_and_subscribe", a="stats", bs=MAX_BATCH)
        if self.closed:
            return
        boundary = Boundary(gateway.fanout)
        options = query.options()
        local = await gateway.blocking(
            lambda: boundary.query(query.topic, partitions=plan.local, **options)
        )
        answers = [local, *(leg.snapshot() for leg in self.legs)]
        result = await gateway.blocking(merge, answers, query.order_by, query.top_n)
        await send_snapshot(self.session, self.request, query, result)
        self.local.raise_if_overflowed()
        if not self.closed:
            self.local.go_live(boundary.first)  # type: ignore[arg-type]
            self.go_live_remote()

    def go_live_remote(self) -> None:
        for leg in self.legs:
            leg.go_live()

    def recheck(self) -> None:
        """The plan must still hold: otherwise a partition may be missed or doubled."""
        if self.closed or self.plan is None:
            return
        try:
            now = self.cluster.current(self.plan.topic, len(self.plan.owners))
        except PartitionsMoving as exc:
            self.fail(exc.reason)
            return
        if now.owners != self.plan.owners:
            self.fail(f"retry: partitions moving ({self.plan.topic} changed hands)")

    def fail(self, reason: str) -> None:
        """End the subscription with a failure ack: the client subscribes again."""
        if self.closed:
            return
        self.session.fail(self.request.header, reason)  # its sub_id names the subscription
        self.session.remove_subscription(self.sub_id)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.cluster.unwatch(self)
        self.local.close()
        for leg in self.legs:
            leg.close()


class Leg:
    """A peer's part of a spread subscription: its snapshot, then its live changes,
    relayed under the client's sub_id (held until the merged snapshot has gone)."""

    def __init__(self, spread: SpreadSubscription, link: PeerLink) -> None:
        self.spread = spread
        self.link = link
        self.records: list[RemoteRecord] = []
        self.matches = 0
        self.answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held: list[tuple[dict, bytes]] | None = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def snapshot(self) -> QueryResult:
        return QueryResult(self.records, self.matches)  # type: ignore[arg-type]

    def go_live(self) -> None:
        held, self.held = self.held or [], None
        for header, payload in held:
            self.spread.session.send(header, payload)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.link.close()
        if not self.answered.done():
            self.answered.cancel()

    async def _run(self) -> None:
        try:
            while True:
                idle = None if self.answered.done() else ANSWER_IDLE
                self._on_frame(await self.link.receive(idle))
        except AmpsError as exc:
            if not self.answered.done():
                self.answered.set_exception(exc)
            else:
                self.spread.fail(exc.reason)

    def _on_frame(self, frame: Frame) -> None:
        header, kind = frame.header, frame.header.get("c")
        if kind in ("publish", "oof"):
            header["sub_id"] = self.spread.sub_id
            if self.held is None:
                self.spread.session.send(header, frame.payload)
            elif len(self.held) >= MAX_HELD_CHANGES:
                raise PartitionsMoving(
                    f"retry: more than {MAX_HELD_CHANGES:,} changes arrived while the "
                    "snapshot was sent (a slow consumer); subscribe again"
                )
            else:
                self.held.append((header, frame.payload))
        elif kind == "sow":
            self.records.extend(remote_records(header, frame.payload))
        elif kind == "ack":
            refused(header)
            if header.get("a") == "stats":
                self.matches = int(header.get("matches", len(self.records)))
            if not self.answered.done():
                self.answered.set_result(None)
