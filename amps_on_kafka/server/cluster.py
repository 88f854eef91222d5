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
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections import defaultdict, deque
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from amps_on_kafka.errors import AmpsError, PartitionsMoving, ServerError
from amps_on_kafka.processor.engine import QueryResult, ordered
from amps_on_kafka.protocol.frames import READ_SIZE, BadFrame, Frame, FrameDecoder, encode_frame
from amps_on_kafka.server.fanout import Boundary
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import MAX_BATCH, ProtocolError, Request
from amps_on_kafka.server.subscriptions import ENTITLEMENT, MAX_HELD_CHANGES, SowSubscription
from amps_on_kafka.state.events import CommandResult

if TYPE_CHECKING:
    from amps_on_kafka.security.policy import PeerAccess
    from amps_on_kafka.server.gateway import Gateway
    from amps_on_kafka.server.membership import Membership
    from amps_on_kafka.server.publishing import _Delete
    from amps_on_kafka.server.queries import Query
    from amps_on_kafka.server.session import Session

PARTS = "_parts"  # a forwarded command's partitions: answer for these, here, only
CONNECT_TIMEOUT = 5.0  # seconds to reach a peer's gateway and log on
ANSWER_IDLE = 30.0  # seconds a peer may stay silent while a snapshot is awaited
FORWARDED_KEYS = ("t", "f", "orderby", "top_n", "o")
LOCAL = ""  # the owner of a partition held here, in a plan
RESULTS = "_results"  # a peer's sow_delete asks for its records' results: {p, s}
RESULT = "_result"  # one of them, sent back
RESULTS_WAIT = 60.0  # seconds a sow_delete waits for the peers' partitions to apply it
PLAN_WAIT = 5.0  # seconds a query waits for a partition with no worker before retry:
MAX_IDLE_LINKS = 4  # idle logged-on links kept per peer for forwarded queries (PeerPool)
# A peer's frames: a sow batch is at most about 1 MiB of payload (queries.BATCH_BYTES)
# beyond one record, and a record at most a publish frame (MaxFrameBytes).
MAX_PEER_FRAME = 64 * 1024 * 1024
T = TypeVar("T")


def reachable(address: str) -> str:
    """A bound address as the other workers can reach it: 0.0.0.0 or :: is no host."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


def parts_of(header: dict[str, Any]) -> list[int] | None:
    """PARTS, checked: a list of partition numbers, or None for an ordinary command."""
    value = header.get(PARTS)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in value
    ):
        raise ProtocolError(f"{PARTS!r} must be a list of partition numbers")
    return value


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


@dataclass(slots=True)
class RemoteRecord:
    """A SOW record as a peer sent it: what replies.sow_batch and ordering read."""

    topic: str
    partition: int
    sow_key: str
    payload: bytes
    bookmark: str
    timestamp: int
    expiration: float | None
    codec: None = None  # the payload is already in its wire form
    _data: Any = field(default=None, repr=False)

    @property
    def data(self) -> Any:
        if self._data is None:
            with suppress(orjson.JSONDecodeError):
                self._data = orjson.loads(self.payload)
        return self._data


def remote_records(header: dict[str, Any], payload: bytes) -> list[RemoteRecord]:
    """The records of one `sow` frame (replies.sow_batch's layout)."""
    records, start = [], 0
    for meta in header.get("recs", ()):
        end = start + int(meta["n"])
        bookmark = str(meta["bm"])
        partition = int(bookmark.split("|")[1])
        records.append(
            RemoteRecord(
                header["t"],
                partition,
                meta["k"],
                payload[start:end],
                bookmark,
                meta["ts"],
                meta.get("e"),
            )
        )
        start = end
    return records


def merge(answers: list[QueryResult], order_by: str | None, top_n: int | None) -> QueryResult:
    """Parts of one query as the whole would have been answered (see the module doc)."""
    records = sorted((r for answer in answers for r in answer.records), key=_partition)
    if order_by:
        records = ordered(records, order_by)
    if top_n is not None:
        records = records[:top_n]
    return QueryResult(records, sum(answer.matches for answer in answers))


def _partition(record: Any) -> int:
    return record.partition


def forwarded(header: dict[str, Any], command: str, parts: list[int], **extra: Any) -> dict:
    """The command a peer is asked: the client's query, restricted to `parts`."""
    kept = {key: header[key] for key in FORWARDED_KEYS if key in header}
    return {"c": command, "cid": uuid.uuid4().hex[:12], **kept, PARTS: parts, **extra}


def refused(header: dict[str, Any]) -> None:
    """A peer's failure ack, raised as ours: PartitionsMoving keeps its "retry:"."""
    if header.get("status") != "failure":
        return
    reason = str(header.get("reason", "a peer refused the command"))
    if reason.startswith("retry:"):
        raise PartitionsMoving(reason)
    raise ServerError(reason)


async def all_of(*work: Awaitable[T]) -> list[T]:
    """Every result, in order; the first failure cancels the rest (and is raised)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


class PeerPool:
    """Idle links to peers, logged on, reused by forwarded sow queries: a connection and
    a logon for each one cost round trips (and a line in the peer's audit log). At most
    MAX_IDLE_LINKS wait per peer; one whose peer went away fails its next query with
    retry:, like a new connection to a dead peer would."""

    def __init__(self, access: PeerAccess) -> None:
        self.access = access
        self._idle: dict[str, list[PeerLink]] = defaultdict(list)

    async def take(self, address: str) -> PeerLink:
        idle = self._idle[address]
        while idle:
            link = idle.pop()
            if not link.writer.is_closing():
                return link
        return await PeerLink.open(address, self.access)

    def give(self, link: PeerLink) -> None:
        idle = self._idle[link.address]
        if len(idle) < MAX_IDLE_LINKS and not link.frames and not link.writer.is_closing():
            idle.append(link)
        else:
            link.close()

    def close(self) -> None:
        for links in self._idle.values():
            for link in links:
                link.close()
        self._idle.clear()


class PeerLink:
    """One connection to a peer's gateway, logged on, for one forwarded command."""

    def __init__(
        self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(MAX_PEER_FRAME)
        self.frames: deque[Frame] = deque()

    @classmethod
    async def open(cls, address: str, access: PeerAccess) -> PeerLink:
        """Connected (over TLS when the gateways serve it) and logged on as a peer
        (docs/security.md, Gateways of one group)."""
        host, _, port = address.rpartition(":")
        tls = {"ssl": access.context, "server_hostname": host} if access.context else {}
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), **tls), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise _unreachable(address, exc) from exc
        link = cls(address, reader, writer)
        name = f"_peer-{uuid.uuid4().hex}"
        link.send({"c": "logon", "cid": "logon", "client_name": name, **access.credentials()})
        try:
            refused((await link.receive(CONNECT_TIMEOUT)).header)
        except BaseException:
            link.close()
            raise
        return link

    def send(self, header: dict[str, Any]) -> None:
        self.writer.write(encode_frame(header))

    async def receive(self, timeout: float | None) -> Frame:
        """The next frame; PartitionsMoving if the peer is gone or silent `timeout` s."""
        while not self.frames:
            try:
                data = await asyncio.wait_for(self.reader.read(READ_SIZE), timeout)
            except (OSError, TimeoutError) as exc:
                raise _unreachable(self.address, exc) from exc
            if not data:
                raise _unreachable(self.address, "closed the connection")
            for event in self.decoder.feed(data):
                if isinstance(event, BadFrame):
                    raise _unreachable(self.address, event.reason)
                self.frames.append(event)
        return self.frames.popleft()

    def close(self) -> None:
        self.writer.close()


def _unreachable(address: str, why: object) -> PartitionsMoving:
    return PartitionsMoving(
        f"retry: partitions moving (the worker at {address}: {why or 'timeout'})"
    )
