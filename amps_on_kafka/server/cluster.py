"""Any gateway answers for the whole topic: scatter-gather over the group's workers.

A worker holds some partitions of each SOW topic (the Kafka consumer group shares them
out). A `sow`, `subscribe` or `sow_and_subscribe` reaching any gateway is planned over
every partition of its topic: the partitions held here are answered from the local
engine, the others are asked of the worker the Directory says holds them
(server/membership.py), over the ordinary gateway protocol, with the same command and
one more header key, PARTS, naming the partitions that peer answers for. A command
carrying PARTS is answered locally only (never spread again), and only if every one of
those partitions is held here: PartitionsMoving otherwise.

The answers are merged as one worker holding every partition would have given them:
records in partition order, then ordered by `orderby` (a stable sort, so ties keep
partition order) and cut to `top_n` (each part was cut to `top_n` already, which keeps
every record the merged cut can want); the stats ack sums the matches.

A query whose partitions are not all held by a worker that answers (a move under way, a
worker dead and its partitions not yet taken over) fails with a reason starting
"retry: partitions moving": never a part of the topic as if it were all of it. A
subscription spread over workers ends with that failure when its plan no longer holds
(a partition changed hands, a peer's connection dropped): the client subscribes again,
and a sow_and_subscribe then starts from a fresh snapshot, with no gap and no duplicate.

This module plans (Plan, Cluster) and answers sow, subscribe and sow_delete over the
group; what is said to a peer, and the links it goes over, are server/peers.py, and a
subscription spread over workers server/spread.py.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections import defaultdict
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from amps_on_kafka.errors import PartitionsMoving
from amps_on_kafka.processor.engine import QueryResult
from amps_on_kafka.server.peers import (
    ANSWER_IDLE,
    PeerLink,
    PeerPool,
    RemoteRecord,
    forwarded,
    merge,
    parts_of,
    refused,
    remote_records,
)
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import MAX_BATCH, ProtocolError, Request
from amps_on_kafka.server.spread import SpreadSubscription
from amps_on_kafka.server.subscriptions import SowSubscription
from amps_on_kafka.state.events import CommandResult

if TYPE_CHECKING:
    from amps_on_kafka.server.deletes import _Delete
    from amps_on_kafka.server.gateway import Gateway
    from amps_on_kafka.server.membership import Membership
    from amps_on_kafka.server.queries import Query
    from amps_on_kafka.server.session import Session

LOCAL = ""  # the owner of a partition held here, in a plan
RESULTS = "_results"  # a peer's sow_delete asks for its records' results: {p, s}
RESULT = "_result"  # one of them, sent back
RESULTS_WAIT = 60.0  # seconds a sow_delete waits for the peers' partitions to apply it
PLAN_WAIT = 5.0  # seconds a query waits for a partition with no worker before retry:
T = TypeVar("T")


def reachable(address: str) -> str:
    """A bound address as the other workers can reach it: 0.0.0.0 or :: is no host."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


@dataclass(frozen=True)
class Plan:
    """Who answers for each partition of a topic: LOCAL or a peer's gateway address."""

    topic: str
    owners: dict[int, str]

    @property
    def local(self) -> list[int]:
        return sorted(p for p, owner in self.owners.items() if owner == LOCAL)

    @property
    def remote(self) -> dict[str, list[int]]:
        by_peer: dict[str, list[int]] = defaultdict(list)
        for partition, owner in sorted(self.owners.items()):
            if owner != LOCAL:
                by_peer[owner].append(partition)
        return dict(by_peer)


class Cluster:
    """The gateway's view of its group (one per gateway, on its event loop)."""

    def __init__(self, gateway: Gateway, membership: Membership) -> None:
        self.gateway = gateway
        self.membership = membership
        self._spread: set[SpreadSubscription] = set()
        self.pool = PeerPool(gateway.peer_access)
        self._change: asyncio.Future[None] = gateway.loop.create_future()  # done at a change
        membership.directory.on_change(self._directory_changed)
        gateway.engine.on_assignment(self._directory_changed)

    @classmethod
    def join(cls, gateway: Gateway, group: str, instance_id: str | None) -> Cluster:
        """Announce the started `gateway` to its group (at the address it is bound to, a
        wildcard host replaced by this machine's name) and follow the others; returns
        once every announcement written so far is read."""
        from amps_on_kafka.server.membership import Membership

        membership = Membership(gateway.engine, gateway.bootstrap, group, instance_id)
        if gateway.queues is not None:  # the queues this worker owns are announced too
            from amps_on_kafka.server.queue_links import QueueLinks

            membership.queues = gateway.queues.engine.owned
            gateway.queues.engine.on_ownership(membership.changed)
            gateway.queues.links = QueueLinks(gateway)
        membership.start(reachable(gateway.address))  # type: ignore[arg-type]
        return cls(gateway, membership)

    def leave(self) -> None:
        """Tell the group this gateway no longer answers (a clean stop)."""
        self.membership.stop()
        with suppress(RuntimeError):  # the loop is closed: the links went with it
            self.gateway.loop.call_soon_threadsafe(self.pool.close)

    async def _ask(self, address: str, parts: list[int], request: Request) -> QueryResult:
        """A peer's answer to the sow forwarded for `parts`: its records, and the matches
        its stats ack counts."""
        link = await self.pool.take(address)
        records: list[RemoteRecord] = []
        try:
            link.send(forwarded(request.header, "sow", parts, a="stats", bs=MAX_BATCH))
            while True:
                frame = await link.receive(ANSWER_IDLE)
                header = frame.header
                if header.get("c") == "sow":
                    records.extend(remote_records(header, frame.payload))
                elif header.get("c") == "ack":
                    refused(header)
                    if header.get("a") == "stats":
                        break
        except BaseException:
            link.close()
            raise
        self.pool.give(link)
        return QueryResult(records, int(header.get("matches", len(records))))  # type: ignore[arg-type]

    async def plan(self, topic: str, deadline: float | None = None) -> Plan:
        """Who answers for each partition now; while a partition has no worker, wait for
        the group to change (until `deadline`, loop time, else PLAN_WAIT from now), then
        PartitionsMoving. A move that settles meanwhile is not seen by the client."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PLAN_WAIT if deadline is None else deadline
        count = await self.gateway.blocking(self.membership.partition_count, topic)
        while True:
            changed = self._change
            try:
                return self.current(topic, count)
            except PartitionsMoving as exc:
                await self._wait(changed, deadline, exc)

    async def _wait(
        self, changed: asyncio.Future[None], deadline: float, error: PartitionsMoving
    ) -> None:
        """Until the group changes after `changed` was taken; `error` once `deadline`
        (loop time) has passed."""
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise error
        with suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(changed), remaining)

    def current(self, topic: str, count: int) -> Plan:
        """The plan as the directory and the engine have it now; PartitionsMoving when a
        partition has no worker to ask."""
        held = set(self.gateway.engine.serving(topic))
        claims = self.membership.directory.owners(topic)
        owners: dict[int, str] = {}
        missing = []
        for partition in range(count):
            claim = claims.get(partition)
            if partition in held:
                owners[partition] = LOCAL
            elif claim is None or claim.worker == self.membership.worker:
                missing.append(partition)
            else:
                owners[partition] = claim.address
        if missing:
            listed = ", ".join(map(str, missing))
            raise PartitionsMoving(
                f"retry: partitions moving ({topic} partition(s) {listed} have no worker now)"
            )
        return Plan(topic, owners)

    # -- sow --------------------------------------------------------------------------
    async def query(self, session: Session, request: Request, query: Query) -> QueryResult:
        """A sow over the whole topic (or, for a peer, over the PARTS it named)."""
        engine = self.gateway.engine
        options = query.options()
        if query.parts is not None:
            parts = query.parts
            return await self.gateway.blocking(
                lambda: engine.query(query.topic, partitions=parts, **options)
            )
        deadline = asyncio.get_running_loop().time() + PLAN_WAIT
        while True:
            changed = self._change
            plan = await self.plan(query.topic, deadline)
            try:
                answers = await self._gather_until_moved(plan, request, query)
            except PartitionsMoving as exc:  # a stale claim: its worker no longer serves it
                await self._wait(changed, deadline, exc)
                continue
            return await self.gateway.blocking(merge, answers, query.order_by, query.top_n)

    async def _gather_until_moved(
        self, plan: Plan, request: Request, query: Query
    ) -> list[QueryResult]:
        """The plan's answers; PartitionsMoving as soon as the group changes the plan. A
        frozen peer (a long pause) keeps its connection open but never answers: without
        this, the query waited ANSWER_IDLE (30 s) for it after its partitions had moved."""
        gather = asyncio.ensure_future(self._gather(plan, request, query))
        try:
            while True:
                changed: asyncio.Future[Any] = self._change
                await asyncio.wait([gather, changed], return_when=asyncio.FIRST_COMPLETED)
                if gather.done():
                    return gather.result()
                if self.current_or_none(plan.topic, len(plan.owners)) != plan:
                    raise PartitionsMoving(f"retry: partitions moving ({plan.topic} moved)")
        finally:
            gather.cancel()

    def current_or_none(self, topic: str, count: int) -> Plan | None:
        """The plan now, None while a partition has no worker."""
        try:
            return self.current(topic, count)
        except PartitionsMoving:
            return None

    async def _gather(self, plan: Plan, request: Request, query: Query) -> list[QueryResult]:
        engine, options = self.gateway.engine, query.options()
        local = self.gateway.blocking(
            lambda: engine.query(query.topic, partitions=plan.local, **options)
        )
        asked = (self._ask(address, parts, request) for address, parts in plan.remote.items())
        return await all_of(local, *asked)

    # -- subscriptions ----------------------------------------------------------------
    async def subscribe(self, session: Session, request: Request, sub: SowSubscription) -> None:
        """A live subscription: here for the partitions held here, through each peer
        for the others."""
        parts = parts_of(request.header)
        if parts is not None:  # a peer's leg: these partitions must be held here
            self.gateway.engine.held(sub.topic, parts)
            session.add_subscription(sub)
            sub.register()
        else:
            spread = SpreadSubscription(self, session, request, sub)
            session.add_subscription(spread)
            sub.register()
            try:
                await spread.open_legs(await self.plan(sub.topic), "subscribe", a="processed")
            except BaseException:
                session.remove_subscription(spread.sub_id)
                raise
            spread.go_live_remote()
        if request.wants("processed"):
            session.send(ack(request.header, "processed"))

    # -- sow_delete -------------------------------------------------------------------
    @staticmethod
    def results_wanted(header: dict[str, Any]) -> bool:
        return RESULTS in header

    def send_results(self, session: Session, request: Request) -> None:
        """A peer wrote a sow_delete and counts what it deleted: send it the result of
        each of its records applied here (one RESULT frame each), as they come."""
        header = request.header
        asked = header[RESULTS]
        if not (
            isinstance(asked, dict)
            and isinstance(asked.get("p"), str)
            and isinstance(asked.get("s"), list)
            and all(isinstance(n, int) for n in asked["s"])
        ):
            raise ProtocolError(f"{RESULTS!r} must be {{'p': publisher id, 's': [sequences]}}")

        def deliver(result: CommandResult) -> None:
            reply = {"c": RESULT, "cid": header.get("cid"), "s": result.sequence}
            session.send({**reply, "d": result.deleted, "e": result.error})

        self.gateway.deletes.watch(session, asked["p"], asked["s"], deliver)

    async def collect_results(self, session: Session, topic: str, entry: _Delete) -> None:
        """The results of a sow_delete's records applied by the peers, into `entry`
        (the local ones reach it from the engine) until every record is counted."""
        plan = await self.plan(topic)
        asked = {RESULTS: {"p": entry.publisher_id, "s": entry.sequences}}
        links = [await PeerLink.open(address, self.gateway.peer_access) for address in plan.remote]
        try:
            for link in links:
                link.send({"c": "sow_delete", "cid": uuid.uuid4().hex[:12], "t": topic, **asked})
            reading = [
                asyncio.ensure_future(self._results(link, topic, entry.publisher_id))
                for link in links
            ]
            finished = asyncio.ensure_future(entry.finished.wait())
            done, _ = await asyncio.wait(
                [finished, *reading], timeout=RESULTS_WAIT, return_when=asyncio.FIRST_COMPLETED
            )
            for task in (finished, *reading):
                task.cancel()
            for task in done - {finished}:
                task.result()  # a peer gone: its PartitionsMoving
            if finished not in done:
                raise PartitionsMoving(
                    f"retry: partitions moving: the delete is in the log, but not every "
                    f"partition applied it within {RESULTS_WAIT:g}s, so its count is unknown"
                )
        finally:
            for link in links:
                link.close()

    async def _results(self, link: PeerLink, topic: str, publisher_id: str) -> None:
        """A peer's RESULT frames, applied as the engine's own results would be (a
        record applied twice, by two owners in turn, is counted once)."""
        while True:
            header = (await link.receive(None)).header
            refused(header)
            if header.get("c") == RESULT:
                deleted, error = int(header.get("d") or 0), header.get("e")
                result = CommandResult(
                    topic, -1, -1, "sow_delete", publisher_id, header["s"], None, deleted, error
                )
                self.gateway.deletes.apply([result])

    def spread(
        self, session: Session, request: Request, sub: SowSubscription
    ) -> SpreadSubscription:
        """`sub` (already held and registered) as one part of a subscription spread over
        the workers: it takes sub's place in the session."""
        spread = SpreadSubscription(self, session, request, sub)
        session.subscriptions[sub.sub_id] = spread
        return spread

    def watch(self, spread: SpreadSubscription) -> None:
        self._spread.add(spread)

    def unwatch(self, spread: SpreadSubscription) -> None:
        self._spread.discard(spread)

    def _directory_changed(self) -> None:
        """Any thread: a worker announced itself, or this worker's partitions changed."""
        with suppress(RuntimeError):  # the loop is closed: the gateway is stopping
            self.gateway.loop.call_soon_threadsafe(self._recheck)

    def _recheck(self) -> None:
        for spread in list(self._spread):
            spread.recheck()
        changed, self._change = self._change, self.gateway.loop.create_future()
        changed.set_result(None)


async def all_of(*work: Awaitable[T]) -> list[T]:
    """Every result, in order; the first failure cancels the rest (and is raised)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
