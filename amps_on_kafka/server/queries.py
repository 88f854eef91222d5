"""sow and sow_and_subscribe: a SOW snapshot, in batches, then (for the latter) live.

Queries run off the event loop (RocksDB reads and filtering take time) and the results
are sent batch by batch, waiting for the connection to drain after each, so a large
result follows the client's pace instead of piling up in memory. Each batch also yields
to the event loop: a million-record answer to one client must not keep every other
session (their heartbeats included) waiting until it is all encoded.

Replies: `group_begin`, `sow` frames of up to `bs` records (and about BATCH_BYTES of
payload), `group_end`, then the `stats` and `completed` acks if asked for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.expr import Filter
from amps_on_kafka.expr.keys import KeyEquality
from amps_on_kafka.log.keys import key_from_values
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import QueryResult, Records, SowEngine
from amps_on_kafka.protocol.frames import encode_frame, frame_of
from amps_on_kafka.server.fanout import Boundary
from amps_on_kafka.server.peers import PARTS, parts_of
from amps_on_kafka.server.replies import ack, converted, group, ids, sow_batch
from amps_on_kafka.server.requests import (
    MAX_BATCH,
    Request,
    acks,
    content_filter,
    count,
    options,
    text,
)
from amps_on_kafka.server.scans import compiled_writes
from amps_on_kafka.server.subscriptions import SUBSCRIBE_OPTIONS, SowSubscription, subscription_id
from amps_on_kafka.state.record import SowRecord
from amps_on_kafka.state.store import PartitionStore

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

DEFAULT_BATCH = 100
BATCH_BYTES = 1024 * 1024
STREAM_WRITE = 2000  # records a streamed answer reads ahead, and sends in one write, at most


@dataclass(slots=True)
class Query:
    """A query's header, checked. Not frozen, though nothing assigns its fields: a frozen
    dataclass is built through object.__setattr__, a cost every key look-up paid (as
    Request, server/requests.py)."""

    topic: str
    filter: Filter | None
    order_by: str | None
    top_n: int | None
    batch_size: int
    parts: list[int] | None = None  # a peer's part of a query (server/peers.py)

    @classmethod
    def parse(cls, session: Session, header: dict) -> Query:
        topic = text(header, "t", required=True)
        session.gateway.engine.sow_config(topic)  # UnknownTopic before any work
        return cls(
            topic=topic,  # type: ignore[arg-type]
            filter=content_filter(header),
            order_by=text(header, "orderby"),
            top_n=count(header, "top_n"),
            batch_size=count(header, "bs", default=DEFAULT_BATCH, limit=MAX_BATCH) or 1,  # type: ignore[arg-type]
            parts=parts_of(header),
        )

    def options(self) -> dict:
        return {"filter": self.filter, "order_by": self.order_by, "top_n": self.top_n}


async def parse_query(session: Session, header: dict) -> Query:
    """Query.parse on the gateway's pool. Compiling a filter of 64 KiB is 0.1-0.2 s of
    Python (the expr limits bound the single calls that hold the GIL), which on the event
    loop kept every other session waiting; in a thread the loop gets the GIL back every
    switch interval."""
    return await session.gateway.blocking(Query.parse, session, header)


async def sow(session: Session, request: Request) -> None:
    started = time.perf_counter()
    answer = _key_answer(session, request)
    if answer is None:
        query = await parse_query(session, request.header)
        result = _looked_up(session, query)
        if result is None:
            session.spawn(_sow(session, request, query, started), request)
            return
        answer = _answer_at_once(request, query.topic, query.batch_size, result)
    session.send_encoded(*answer)
    session.gateway.stats.query_latency.observe(time.perf_counter() - started)


# a query with any of these takes the general path (Query.parse checks them)
GENERAL_KEYS = frozenset({"orderby", "top_n", PARTS})
# the only keys a `sow` answered by look_up_at_once may have (a client's look-up by key)
AT_ONCE_KEYS = frozenset({"c", "cid", "t", "a", "bs", "f"})
MAX_PLANS = 256  # shapes a gateway keeps (their keys are the clients': bounded)


@dataclass(slots=True)
class KeyPlan:
    """What a `sow` of one (topic, acks, batch size) shape needs once its header was
    checked (look_up_at_once): the Key path it pins, the answer's echoed topic and acks."""

    path: str  # the topic's one Key path, top level (`/id`)
    topic: bytes  # `"t":"<topic>"`, the end of every echo
    wants: tuple[bool, bool, bool]  # processed, stats, completed
    expiring: bool
    batch: int


def look_up_at_once(session: Session, header: dict[str, Any]) -> bool:
    """Answer a client's look-up by key (`/path = literal`, acks, `bs`, a text `cid`,
    nothing else) straight from the frame split, for a user with nothing to check
    (Session._answered_at_once): the header's checks (acks, topic, `bs`, not a queue,
    the Key path, the codec) are made once per (topic, acks, bs) shape and kept
    (`KeyPlan`), and the compiled core writes the answer from the stored bytes. The
    Request, the handler's routing and _key_answer's checks were ~50,000 instructions
    a look-up above a heartbeat (docs/performance.md). False, with nothing sent, for
    anything else, or where the compiled core declines: _handle then takes the command
    the general way, which answers it or names what is wrong with it."""
    gateway = session.gateway
    if gateway.cluster is not None or core is None or not header.keys() <= AT_ONCE_KEYS:
        return False
    cid, topic = header.get("cid"), header.get("t")
    wanted, batch = header.get("a"), header.get("bs")
    if type(cid) is not str or type(topic) is not str:
        return False
    if not (wanted is None or type(wanted) is str) or not (batch is None or type(batch) is int):
        return False  # the general path checks them (a list would not hash)
    equality = KeyEquality.of(header.get("f"))
    if equality is None:
        return False
    shape = (topic, wanted, batch)
    plan = gateway.key_plans.get(shape)
    if plan is None:
        plan = _key_plan(session, header)
        if plan is None:
            return False
        if len(gateway.key_plans) >= MAX_PLANS:
            gateway.key_plans.clear()
        gateway.key_plans[shape] = plan
    if equality.path != plan.path:
        return False
    started = time.perf_counter()
    read = gateway.engine.stored(topic, equality.key)
    if read is None:
        return False
    found, now = read
    echo = b'"cid":' + orjson.dumps(cid) + b"," + plan.topic
    stored = [(store.partition, record) for store, record in found]
    answer: tuple[bytes, int] | None = core.key_answer(
        echo, echo, plan.wants, topic, equality.key, plan.path[1:], equality.literal, stored,
        now, plan.expiring, plan.batch, BATCH_BYTES,
    )  # fmt: skip
    if answer is None:
        return False
    session.send_encoded(*answer)
    gateway.stats.query_latency.observe(time.perf_counter() - started)
    return True


def _key_plan(session: Session, header: dict[str, Any]) -> KeyPlan | None:
    """The shape's plan, checked as _handle and _key_answer check it; None where the
    general path must answer: a bad header (it names the fault), a `received` ack, a
    queue, a topic not JSON, a Key of more than one path or a nested one."""
    gateway, topic = session.gateway, header["t"]
    queues = gateway.queues
    if queues is not None and queues.serves(topic):
        return None
    try:
        wanted = acks(header)
        key = gateway.engine.sow_config(topic).key
        batch = count(header, "bs", default=DEFAULT_BATCH, limit=MAX_BATCH) or 1
    except AmpsError:
        return None
    rules = gateway.engine.rules[topic]
    if "received" in wanted or rules.codec.message_type != "json":
        return None
    if len(key) != 1 or key[0].count("/") != 1:
        return None
    return KeyPlan(
        path=key[0],
        topic=b'"t":' + orjson.dumps(topic),
        wants=("processed" in wanted, "stats" in wanted, "completed" in wanted),
        expiring=rules.expiring,
        batch=batch,
    )


def _key_answer(session: Session, request: Request) -> tuple[bytes, int] | None:
    """The answer to a `sow` whose filter is `/path = literal` on the topic's one Key
    path, made on the event loop with no Query and no Filter: the key from the literal
    (expr/keys.py KeyEquality), a point get, the frames from a template. Parsing the
    filter (even without the parser), the Query and the key pinned from the filter's tree
    were a fifth of a look-up's CPU (docs/performance.md). On a JSON topic keyed by a
    top-level field the compiled core writes the answer from the stored bytes (the
    header, the expiry and the equality read on them: native/src/lookups.rs
    key_answer), with no SowRecord, decoded payload or entry made here; the records and
    _answer_at_once, its twin, answer wherever it is not sure. None for any other query,
    across a cluster, or while the worker holds the engine: the general path then
    (parse_query on the pool, then _looked_up), whose answers these are."""
    header, gateway = request.header, session.gateway
    equality = KeyEquality.of(header.get("f"))
    if equality is None or gateway.cluster is not None or not GENERAL_KEYS.isdisjoint(header):
        return None
    topic: str = text(header, "t", required=True)  # type: ignore[assignment]
    if gateway.engine.sow_config(topic).key != (equality.path,):  # UnknownTopic first
        return None
    batch = count(header, "bs", default=DEFAULT_BATCH, limit=MAX_BATCH) or 1
    read = gateway.engine.stored(topic, equality.key)
    if read is None:
        return None
    return _stored_answer(request, gateway.engine, topic, batch, equality, *read)


def _stored_answer(
    request: Request,
    engine: SowEngine,
    topic: str,
    batch: int,
    equality: KeyEquality,
    found: list[tuple[PartitionStore, bytes]],
    now: int,
) -> tuple[bytes, int]:
    """_key_answer's answer from the stores' stored records of its key (`found`, read
    with the clock `now`): written by the compiled core from the bytes where it is sure
    of it (native/src/lookups.rs key_answer: a JSON topic, a top-level field, a record's
    `e` within 1 ms to 10^12 s), else by the twin: the records made, engine.kept, then
    _answer_at_once."""
    rules, key = engine.rules[topic], equality.key
    if core is not None and rules.codec.message_type == "json" and len(equality.steps) == 1:
        echo, acked, wants = _echoes(request, topic)
        stored = [(store.partition, record) for store, record in found]
        answer: tuple[bytes, int] | None = core.key_answer(
            echo, acked, wants, topic, key, equality.path[1:], equality.literal, stored, now,
            rules.expiring, batch, BATCH_BYTES,
        )  # fmt: skip
        if answer is not None:
            return answer
    records = [store.record_of(key, record) for store, record in found]
    return _answer_at_once(request, topic, batch, engine.kept(topic, equality, records, now))


def _looked_up(session: Session, query: Query) -> QueryResult | None:
    """A `sow` of keys, answered on the event loop by point gets: no trip to the pool to
    read them (the trips were most of a look-up's time, docs/performance.md). None for
    any other query, across a cluster, or while the worker holds the engine."""
    gateway, filter = session.gateway, query.filter
    if filter is None or gateway.cluster is not None or query.parts is not None:
        return None
    if query.order_by is not None or query.top_n is not None:
        return None
    pinned = filter.equalities(list(gateway.engine.sow_config(query.topic).key))
    if pinned is None:
        return None
    return gateway.engine.look_up(query.topic, filter, [key_from_values(v) for v in pinned])


async def _sow(session: Session, request: Request, query: Query, started: float) -> None:
    engine, cluster = session.gateway.engine, session.gateway.cluster
    if cluster is not None:  # the whole topic, over the group's workers
        result = await cluster.query(session, request, query)
        await send_snapshot(session, request, query, result)
    elif query.order_by is None and query.top_n is None:
        await _send_streamed(session, request, query)
    else:
        result = await session.gateway.blocking(
            lambda: engine.query(query.topic, **query.options())
        )
        await send_snapshot(session, request, query, result)
    session.gateway.stats.query_latency.observe(time.perf_counter() - started)


async def _send_streamed(session: Session, request: Request, query: Query) -> None:
    """An unordered answer sent while it is read: the pool reads and filters the next
    writes' worth of records while the loop sends the last, and the client decodes them
    meanwhile. Read whole first, a scan's time was the read plus the transfer (about
    half each); streamed, it is the longer of the two (docs/performance.md)."""
    gateway, header = session.gateway, request.header
    sent = 0
    next_write: Callable[[], tuple[list[bytes], int]] = lambda: ([], 0)  # noqa: E731

    def first() -> tuple[list[bytes], int]:  # one trip to the pool for a small answer
        nonlocal next_write
        next_write = _stream_writes(gateway.engine, header, query)
        return next_write()

    def read(work: Callable[..., tuple[list[bytes], int]], *args: Any) -> asyncio.Future:
        return asyncio.ensure_future(gateway.blocking(work, *args))

    async def writes() -> AsyncIterator[list[bytes]]:
        nonlocal sent
        pending = read(first)
        try:
            while True:
                written, count = await pending
                if count >= STREAM_WRITE:  # maybe more: read on while this write goes out
                    pending = read(next_write)
                if written:
                    sent += count
                    yield written
                if count < STREAM_WRITE:
                    return
        finally:
            pending.cancel()

    await _send_answer(session, request, query, writes(), lambda: (sent, sent))


def _stream_writes(
    engine: SowEngine, header: dict[str, Any], query: Query
) -> Callable[[], tuple[list[bytes], int]]:
    """The writes of a streamed answer, one a call: made by the compiled core from the
    stored records where it can (server/scans.py), else from the engine's stream."""
    topic, filter, batch = query.topic, query.filter, query.batch_size
    writes = compiled_writes(engine, header, topic, filter, batch, BATCH_BYTES, STREAM_WRITE)
    if writes is not None:
        return writes
    chunks = batches(engine.stream(topic, filter), batch)
    return lambda: _next_frames(header, topic, chunks)


def _next_frames(
    header: dict, topic: str, chunks: Iterator[list[SowRecord]]
) -> tuple[list[bytes], int]:
    """The `sow` frames of the next write, up to STREAM_WRITE records in whole batches,
    and how many records they hold. Encoded on the pool thread that read them: encoded
    on the loop, the two threads passed the GIL back and forth for every record read
    (docs/performance.md)."""
    frames: list[bytes] = []
    count = 0
    for chunk in chunks:
        frames.append(encode_frame(*sow_batch(header, topic, chunk)))
        count += len(chunk)
        if count >= STREAM_WRITE:
            break
    return frames, count


async def sow_and_subscribe(session: Session, request: Request) -> None:
    header = request.header
    started = time.perf_counter()
    query = await parse_query(session, header)
    if session.closed:  # while the filter compiled: a subscription now would never be closed
        return
    sub = SowSubscription(
        session,
        subscription_id(header),
        query.topic,
        query.filter,
        oof="oof" in options(header, SUBSCRIBE_OPTIONS),
        header=header,
    )
    session.add_subscription(sub)
    sub.hold()
    sub.register()  # before the snapshot: no batch after it can be missed
    cluster = session.gateway.cluster
    if cluster is not None and query.parts is None:  # the whole topic, over the workers
        spread = cluster.spread(session, request, sub)
        session.spawn(spread.snapshot_then_live(query), request, on_failure=spread)
        return
    work = _snapshot_then_live(session, request, query, sub, started)
    session.spawn(work, request, on_failure=sub)


async def _snapshot_then_live(
    session: Session, request: Request, query: Query, sub: SowSubscription, started: float
) -> None:
    boundary = Boundary(session.gateway.fanout)
    options = query.options()
    result = await session.gateway.blocking(
        lambda: boundary.query(query.topic, partitions=query.parts, **options)
    )
    await send_snapshot(session, request, query, result)
    session.gateway.stats.query_latency.observe(time.perf_counter() - started)
    sub.raise_if_overflowed()
    if not sub.closed:
        sub.go_live(boundary.first)  # type: ignore[arg-type]


async def send_snapshot(
    session: Session, request: Request, query: Query, result: QueryResult
) -> None:
    records = result.records
    taken = records.take() if isinstance(records, Records) else records

    async def writes() -> AsyncIterator[list[bytes]]:
        for chunk in batches(taken, query.batch_size):
            yield [encode_frame(*sow_batch(request.header, query.topic, chunk))]

    await _send_answer(session, request, query, writes(), lambda: (result.matches, len(records)))


async def _send_answer(
    session: Session,
    request: Request,
    query: Query,
    writes: AsyncIterator[list[bytes]],
    counts: Callable[[], tuple[int, int]],
) -> None:
    """The answer in as few writes as it allows: one per element of `writes` (a list of
    encoded `sow` frames), the frames before the first with it and the ones after the last
    with that one, so a small answer (a key look-up) is one write and one wake-up of the
    client instead of five. `counts` gives the stats ack's matches and records returned
    once everything was sent."""
    header, topic = request.header, query.topic
    frames = [encode_frame(ack(header, "processed"))] if request.wants("processed") else []
    frames.append(encode_frame(group("group_begin", header, topic)))
    written = await anext(writes, None)
    while written is not None:
        frames.extend(written)
        written = await anext(writes, None)
        if written is None:
            break  # the last batches go with the frames that end the answer
        session.send_encoded(b"".join(frames), len(frames))
        frames = []
        await session.drain()
        await asyncio.sleep(0)  # drain returns at once while the buffer is low: let others run
    frames.append(encode_frame(group("group_end", header, topic)))
    if request.wants("stats"):
        matches, returned = counts()
        stats = ack(header, "stats", matches=matches, records_returned=returned)
        frames.append(encode_frame(stats))
    if request.wants("completed"):
        frames.append(encode_frame(ack(header, "completed")))
    session.send_encoded(b"".join(frames), len(frames))


def _answer_at_once(
    request: Request, topic: str, batch_size: int, result: QueryResult
) -> tuple[bytes, int]:
    """send_snapshot's frames for a look-up's answer (a record per partition at most),
    and how many, for one write: the keys each frame echoes are encoded once and the
    fixed frames built around them, where encoding five header dicts was a sixth of a
    look-up's CPU on the gateway. The frames hold what ack() and group() would. Written
    by the compiled core where it is installed and no record's payload is converted
    (native/src/lookups.rs: the Python frames were a quarter of a look-up's
    instructions), else by _answer_frames, its twin."""
    header, records = request.header, result.records
    echo, acked, wants = _echoes(request, topic)
    if core is None or any(converted(record.codec) for record in records):
        return _answer_frames(header, topic, echo, acked, wants, result, batch_size)
    entries = [
        (r.sow_key, r.bookmark, r.timestamp, _seconds(r), r.payload)  # record_entry's
        for r in records
    ]
    answer: tuple[bytes, int] = core.look_up_answer(
        echo, acked, wants, entries, result.matches, batch_size, BATCH_BYTES
    )
    return answer


def _echoes(request: Request, topic: str) -> tuple[bytes, bytes, tuple[bool, bool, bool]]:
    """The keys an answer's group frames echo (group()'s), those its acks echo (ack()'s:
    `s` too), both encoded without braces, and whether the processed, stats and
    completed acks are asked for."""
    header = request.header
    echo = orjson.dumps({**ids(header), "t": topic})[1:-1]
    acked = echo + b',"s":' + orjson.dumps(header["s"]) if "s" in header else echo
    wants = (request.wants("processed"), request.wants("stats"), request.wants("completed"))
    return echo, acked, wants


def _seconds(record: SowRecord) -> bytes | None:
    """A record's `e` as record_meta writes it (orjson's float), None if it never expires."""
    expiration = record.expiration
    return None if expiration is None else orjson.dumps(expiration)


def _answer_frames(
    header: dict[str, Any],
    topic: str,
    echo: bytes,
    acked: bytes,
    wants: tuple[bool, bool, bool],
    result: QueryResult,
    batch_size: int,
) -> tuple[bytes, int]:
    """_answer_at_once's frames in Python: the compiled core's twin."""
    processed, stats, completed = wants

    def ack_frame(kind: bytes, extra: bytes = b"") -> bytes:
        return frame_of(
            b'{"c":"ack","a":"' + kind + b'","status":"success",' + acked + extra + b"}"
        )

    frames = [ack_frame(b"processed")] if processed else []
    frames.append(frame_of(b'{"c":"group_begin",' + echo + b"}"))
    for chunk in batches(result.records, batch_size):
        frames.append(encode_frame(*sow_batch(header, topic, chunk)))
    frames.append(frame_of(b'{"c":"group_end",' + echo + b"}"))
    if stats:
        returned = len(result.records)
        frames.append(
            ack_frame(b"stats", b',"matches":%d,"records_returned":%d' % (result.matches, returned))
        )
    if completed:
        frames.append(ack_frame(b"completed"))
    return b"".join(frames), len(frames)


def batches(records: Iterable[SowRecord], size: int) -> Iterator[list[SowRecord]]:
    """Runs of at most `size` records and about BATCH_BYTES of payload."""
    chunk: list[SowRecord] = []
    payload = 0
    for record in records:
        chunk.append(record)
        payload += len(record.payload)
        if len(chunk) >= size or payload >= BATCH_BYTES:
            yield chunk
            chunk, payload = [], 0
    if chunk:
        yield chunk
