"""publish, delta_publish, sow_delete and flush: commands that go to the log.

Every command is written by LogPublisher, the same code path as the `kafka://` client,
so validation (bad JSON, a missing key field) happens there, before Kafka, and becomes a
failure ack. Each session has its own LogPublisher, because the publisher id stamped on
every record is the client's logon name, but they all share the gateway's one producer:
a producer per connection cost 3 threads and up to 1 GiB of buffer each, and took the
worker from 64 to 707 MiB with three publishers during a Kafka outage.

Sequence numbers are the client's (`s`, as AMPS clients number their publishes), so the
log carries them and a republished message keeps its number; without `s` the session's
publisher numbers the command.

Kafka's verdicts and the bound on publishes in flight are server/delivery.py; a
session's commands in flight and its flushes server/writes.py; sow_delete's counts
server/deletes.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.log.codecs import avro_document
from amps_on_kafka.log.envelope import Command
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.native import core
from amps_on_kafka.protocol.frames import Event, Publish
from amps_on_kafka.security.entitlements import Denied
from amps_on_kafka.server.cluster import RESULTS
from amps_on_kafka.server.replies import ack
from amps_on_kafka.server.requests import (
    Request,
    compiled_filter,
    count,
    number,
    sow_keys,
    text,
)
from amps_on_kafka.server.writes import BATCH_BITS, RECORD_OVERHEAD, PendingWrite, Writes

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session


def publish_data(spec: TopicSpec, payload: bytes) -> Any:
    """The wire carries JSON: an Avro topic's publisher encodes the decoded document."""
    return avro_document(payload) if spec.message_type == "avro" else payload


async def publish(session: Session, request: Request) -> None:
    """publish and delta_publish."""
    topic: str = text(request.header, "t", required=True)  # type: ignore[assignment]
    writes = session.writes
    pending = await writes.begin(request)  # first: the spec must be fresh when it is used
    try:
        spec = await writes.spec(topic)
    except BaseException:  # the session closed meanwhile: free its share
        writes.abandon(pending)
        raise
    _write(session, pending, topic, spec)


def publish_at_once(session: Session, header: dict[str, Any], payload: bytes) -> bool:
    """A plain publish (the session checked: no acks asked, nothing to authorize, no
    queue's name) written without a turn of the event loop, when the budget has room and
    the topic's spec is fresh; False, having done nothing, when it must take the full
    path. A refusal is a failure ack, as on the full path. Most of a tcp:// publish's
    cost was the layers of that path, each a coroutine (docs/performance.md)."""
    topic = header.get("t")
    writes = session.writes
    if type(topic) is not str or (spec := writes.known_spec(topic)) is None:
        return False
    pending = writes.begin_at_once(Request(header, payload, NO_ACKS))
    if pending is None:
        return False
    try:
        _write(session, pending, topic, spec)
    except AmpsError as exc:  # as _handle answers it
        session.fail(header, exc.reason, exc)
    return True


NO_ACKS: frozenset[str] = frozenset()


def publish_run(session: Session, events: list[Event], start: int) -> int:
    """Write the run of plain publishes beginning at events[start] as one PublishBatch
    and return the index of the first event not taken, which the session handles as
    ever (the session checked its user: nothing to authorize). A frame publish_encoded
    can't take (bad JSON, no key, a full producer queue...) ends the run, so its error
    is the per-command path's; the run is as long as the budget has room for now, and
    the command after it takes the per-command path (which waits for room).
    Handling a read's publishes by the batch, not one by one, is what tcp:// publishing
    needed (docs/performance.md)."""
    writes = session.writes
    end, size = _plain_run(session, writes, events, start)
    if end == start or not writes.budget.take_now(size, end - start):
        return start
    batch = writes.open_batch(size, end - start)
    run = writes.publisher.publish_run  # compiled: the common case with no Python frame
    try:
        run(events, start, end, writes.delivery, batch.number << BATCH_BITS, batch.publishes)
    finally:  # a run that raised (a bug) still seals: else its share is held for good
        position = start + len(batch.publishes)  # what it returns: the first not produced
        left: list[Publish] = events[position:end]  # type: ignore[assignment]
        writes.seal(batch, sum(len(e[2]) for e in left) + RECORD_OVERHEAD * len(left))
    return position


def _plain_run(
    session: Session, writes: Writes, events: list[Event], start: int
) -> tuple[int, int]:
    """The end of the run of plain publishes (Publish tuples) from `start` that
    publish_encoded may write, and their budget share: to topics whose specs are fresh
    (Writes.known_spec), routed by the publisher, and no queue's; as many as the budget
    has room for now (a run cut short there is not scanned again for each command the
    per-command path then takes)."""
    queues = session.gateway.queues

    def takes(topic: str) -> bool:
        return (
            writes.known_spec(topic) is not None
            and writes.publisher.routed(topic)
            and not (queues is not None and queues.serves(topic))
        )

    commands, room = writes.budget.room()
    last = min(len(events), start + commands)
    return plain_extent(events, start, last, room, RECORD_OVERHEAD, takes)


def plain_extent_twin(
    events: list[Event],
    start: int,
    last: int,
    room: int,
    overhead: int,
    takes: Callable[[str], bool],
) -> tuple[int, int]:
    """(end, size): the Publish tuples from events[start] on, before `last`, whose
    topics `takes` (asked once a topic) and whose payloads plus `overhead` each fit
    `room` bytes in all. The compiled core's plain_extent (native/src/frames.rs) gives
    the same with no Python frame an event: this loop was a tenth of the gateway's
    work a publish (docs/performance.md)."""
    taken_by_topic: dict[str, bool] = {}
    position, size = start, 0
    while position < last:
        event = events[position]
        if type(event) is not tuple:
            break
        topic = event[0]
        taken = taken_by_topic.get(topic)
        if taken is None:
            taken = taken_by_topic[topic] = takes(topic)
        cost = len(event[2]) + overhead
        if not taken or size + cost > room:
            break
        size += cost
        position += 1
    return position, size


plain_extent = plain_extent_twin if core is None else core.plain_extent


def _write(session: Session, pending: PendingWrite, topic: str, spec: TopicSpec) -> None:
    """Produce a publish or delta_publish whose budget share `pending` holds."""
    header, writes = pending.request.header, pending.writes
    try:
        writes.publisher.publish(  # a field absent is None: no call to read it
            topic,
            publish_data(spec, pending.request.payload),
            expiration=number(header, "e") if "e" in header else None,
            command=Command.PUBLISH if header["c"] == "publish" else Command(header["c"]),
            sow_key=text(header, "k") if "k" in header else None,
            correlation_id=text(header, "x") if "x" in header else None,
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except BaseException:  # refused: free its share
        writes.abandon(pending)
        raise
    writes.written(pending, 1)
    if pending.request.wants("processed"):
        session.send(ack(header, "processed"))


def _only_from_peers(session: Session, header: dict[str, Any]) -> None:
    """Refuse RESULTS (a peer's question for its sow_delete's counts) from a session
    that is not a peer gateway's, once peers log on as such (a PeerSecret): a user's
    session could take another publisher's counts (the peer asking would wait them out)
    and hold a watch per sequence it names for as long as it stays connected."""
    identity = session.identity
    from_peer = identity is not None and identity.method == "peer"
    if RESULTS in header and session.gateway.peer_access.secret is not None and not from_peer:
        raise Denied(f"{RESULTS!r} is for the gateways of one group only")


async def sow_delete(session: Session, request: Request) -> None:
    """By filter `f`, by SOW keys `k`, or by the data in the payload.

    With `s`, the records written are numbered s, s+1, ... (one per partition for a
    filter, one per key): the client reserves that many sequence numbers.
    """
    header = request.header
    topic = text(header, "t", required=True)
    session.gateway.engine.sow_config(topic)  # only this worker's SOW topics can be counted
    cluster = session.gateway.cluster
    _only_from_peers(session, header)
    if cluster is not None and cluster.results_wanted(header):  # a peer counting its delete
        cluster.send_results(session, request)
        return
    filter_text = text(header, "f")
    if filter_text is not None:
        await compiled_filter(session, header)  # a bad filter is refused with its position
    writes = session.writes
    pending = await writes.begin(request)  # first: the spec must be fresh when it is used
    try:
        spec = await writes.spec(topic)
        data = publish_data(spec, request.payload) if request.payload else None
        sequences = writes.publisher.sow_delete(
            topic,
            filter=filter_text,
            keys=sow_keys(header),
            data=data,
            correlation_id=text(header, "x"),
            on_persisted=writes.pump.callback(pending.persisted),
            sequence=count(header, "s"),
        )
    except BaseException:  # refused, or the session closed meanwhile: free its share
        writes.abandon(pending)
        raise
    writes.written(pending, len(sequences))
    entry = session.gateway.deletes.expect(
        session, request, writes.publisher.publisher_id, sequences
    )
    if cluster is not None and sequences:  # results from the partitions the others serve
        session.spawn(cluster.collect_results(session, topic, entry), request)


async def flush(session: Session, request: Request) -> None:
    """Answered with a processed ack once everything published before it is persisted."""
    session.spawn(_flush(session, request), request)


async def _flush(session: Session, request: Request) -> None:
    await session.writes.flushed()
    session.send(ack(request.header, "processed"))
