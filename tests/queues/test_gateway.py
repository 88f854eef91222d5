"""Queues through the gateway and the client (tcp://): subscribe with max_backlog,
message.ack() with its options and batching, sow and filtered acks on a queue, leases
broken by a disconnect, publishes to a queue's name, and the Worker hook."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka import AsyncClient
from amps_on_kafka.config import Config
from amps_on_kafka.errors import MessageError, PublishError, ServerError
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.protocol.frames import FrameDecoder, encode_frame
from amps_on_kafka.server import queues
from amps_on_kafka.server.queues import (
    BATCH_BYTES,
    BATCH_RECORDS,
    DeliveryBatch,
    QueueService,
    QueueSubscriber,
)
from amps_on_kafka.state.queue_types import Delivery, QueueEntry, Subscription
from tests.conftest import create_topic, delete_topics
from tests.queues.helpers import event_records, eventually, stall, take
from tests.server.helpers import Wire


def test_queue_subscription_gets_max_backlog_messages_each_with_bookmark_and_lease(
    serve, clients, queue_config
):
    served = serve(queue_config(LeasePeriod="20s"))
    client = clients(served)
    with client.subscribe(served.queue, options="max_backlog=2", timeout=5) as stream:
        for n in range(4):
            client.publish(served.queue, {"n": n})
        client.publish_flush()
        first = take(stream, 2)
        assert [m.data["n"] for m in first] == [0, 1]
        assert all(0 < m.lease_period <= 20_000 for m in first)
        assert [m.bookmark for m in first] == [f"{served.queue}|0|{n}|" for n in (0, 1)]
        eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 4)
        for message in first:
            message.ack()
        assert [m.data["n"] for m in take(stream, 2)] == [2, 3]


@pytest.mark.parametrize("stalled", [False, True], ids=["at-once", "after-a-stall"])
@pytest.mark.parametrize("backlog", [None, 2], ids=["default-backlog", "max_backlog=2"])
def test_a_message_goes_to_one_subscriber_and_not_again_within_its_lease(
    serve, clients, queue_config, caplog, stalled, backlog
):
    """Seed 002: one subscriber at a time, and no redelivery while the lease runs, whether
    the deliveries went out at once or waited for an events commit after a stall
    (queue_recording.flush). A later message in the same stream proves that no copy came
    before it (one subscription's deliveries arrive in order), so nothing waits for a
    duplicate not to happen. The same message again after LeasePeriod, with a new lease,
    is the lease running out (test_engine), not a duplicate."""
    served = serve(queue_config(LeasePeriod="20s"))
    first, second = clients(served), clients(served)
    held = backlog or 1  # max_backlog defaults to 1
    if stalled:
        stall(served.engine, served.queue)
    options = None if backlog is None else f"max_backlog={backlog}"
    with first.subscribe(served.queue, options=options, timeout=5) as mine:
        _publish(first, served.queue, range(held + 1))
        taken = take(mine, held)
        assert [m.data["n"] for m in taken] == list(range(held))
        assert all(m.lease_period > 0 for m in taken)
        with second.subscribe(served.queue, timeout=5) as theirs:
            [other] = take(theirs, 1)
            assert other.data["n"] == held  # not one the first subscriber holds
            other.ack()
            _publish(first, served.queue, [held + 1])
            [later] = take(theirs, 1)
            assert later.data["n"] == held + 1
            later.ack()
        taken[0].ack()
        _publish(first, served.queue, [held + 2])
        assert [m.data["n"] for m in take(mine, 1)] == [held + 2]
    if stalled:  # the deliveries above did take the stalled path
        assert "deliveries wait for a commit" in caplog.text


def _publish(client, queue: str, numbers) -> None:
    for n in numbers:
        client.publish(queue, {"n": n})
    client.publish_flush()


def test_message_ack_cancel_returns_it_and_expire_removes_it(serve, clients, queue_config):
    served = serve(queue_config())
    client = clients(served)
    with client.subscribe(served.queue, timeout=5) as stream:
        client.publish(served.queue, {"n": 1})
        client.publish_flush()
        [first] = take(stream, 1)
        first.ack("cancel")
        [again] = take(stream, 1)
        assert again.bookmark == first.bookmark
        again.ack("expire")
        eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 0)
    assert list(client.sow(served.queue)) == []


def test_client_batches_acks_into_one_sow_delete(serve, clients, queue_config):
    served = serve(queue_config())
    client = clients(served)
    client.set_ack_batch_size(3)
    client.set_ack_timeout(30)  # only a full batch goes
    with client.subscribe(served.queue, options="max_backlog=3", timeout=5) as stream:
        for n in range(3):
            client.publish(served.queue, {"n": n})
        client.publish_flush()
        for message in take(stream, 3):
            message.ack()
        eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 0)
    records = event_records(served.engine, served.queue)
    removes = [sum(e.kind.value == "remove" for e in r) for r in records]
    # one record, one sow_delete, three bookmarks (a loaded run may add records without
    # removes: after a stalled turn an empty one proves the fence before deliveries)
    assert [n for n in removes if n] == [3], records


def test_only_a_leased_queue_message_can_be_acked(serve, clients, queue_config):
    served = serve(queue_config())
    client = clients(served)
    client.publish(served.queue, {"n": 1})
    client.publish_flush()
    eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 1)
    [browsed] = list(client.sow(served.queue))
    with pytest.raises(MessageError, match="not delivered by a subscription"):
        browsed.ack()


def test_a_barrier_waits_for_the_acks_before_it_and_a_subscriber_may_ack_it(
    serve, clients, queue_config
):
    served = serve(queue_config(BarrierExpression="/eod = 1"))
    state = served.engine.runtimes[served.queue].state
    client = clients(served)
    client.set_ack_batch_size(1)
    with client.subscribe(served.queue, options="max_backlog=10", timeout=5) as stream:
        for document in ({"n": 0}, {"n": 1}, {"n": 2, "eod": 1}, {"n": 3}):
            client.publish(served.queue, document)
        client.publish_flush()
        before = take(stream, 2)
        eventually(served.engine, lambda: state.depth == 4)
        with served.engine.lock:
            held = {e.id[2]: e.status.name for e in state.browse() if e.id[2] >= 2}
        assert held == {2: "HELD", 3: "HELD"}  # room for 10, yet nothing after 1 went out
        for message in before:
            message.ack()
        barrier, after = take(stream, 2)
        assert (barrier.data["n"], barrier.lease_period) == (2, None)
        assert (after.data["n"], after.lease_period is not None) == (3, True)
        barrier.ack()  # nothing to do: it left the queue as it was sent
        after.ack()
        eventually(served.engine, lambda: state.depth == 0)


def test_sow_on_a_queue_and_an_ack_by_filter_through_the_gateway(serve, clients, queue_config):
    served = serve(queue_config())
    client = clients(served)
    for n in range(5):
        client.publish(served.queue, {"n": n})
    client.publish_flush()
    eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 5)
    assert [m.data["n"] for m in client.sow(served.queue, "/n >= 3")] == [3, 4]
    assert client.sow_delete(served.queue, "/n < 2").matches == 2
    records = list(client.sow(served.queue))
    assert [m.data["n"] for m in records] == [2, 3, 4]
    assert records[0].bookmark == f"{served.queue}|0|2|"


def test_client_ack_returns_once_durable_and_strict_leasing_refuses_others(
    serve, clients, queue_config
):
    served = serve(queue_config())
    holder, other = clients(served), clients(served)
    with holder.subscribe(served.queue, timeout=5) as stream:
        holder.publish(served.queue, {"n": 1})
        holder.publish_flush()
        [message] = take(stream, 1)
        with pytest.raises(ServerError, match="Leasing strict"):
            other.ack(served.queue, message.bookmark)
        with pytest.raises(ValueError, match="ack option must be cancel or expire, not 'x'"):
            holder.ack(served.queue, message.bookmark, "x")  # as message.ack("x"), unsent
        assert holder.ack(served.queue, [message.bookmark]).matches == 1


def test_a_batched_ack_is_answered_only_when_it_fails(serve, clients, queue_config):
    """A sow_delete without `a` (how the client sends batched acks) gets no reply when it
    succeeds, and a failure naming the refused bookmarks (Leasing strict) when not."""
    served = serve(queue_config())
    holder = clients(served)
    wire = Wire(served.address)
    try:
        wire.logon()
        with holder.subscribe(served.queue, timeout=5) as stream:
            holder.publish(served.queue, {"n": 1})
            holder.publish_flush()
            [message] = take(stream, 1)
            wire.send({"c": "sow_delete", "t": served.queue, "bm": message.bookmark})
            reply = wire.recv()
            assert reply.header["status"] == "failure"
            assert "Leasing strict" in reply.header["reason"]
            assert message.bookmark in reply.header["reason"]
            holder.ack(served.queue, message.bookmark)  # the holder may: it is gone
            wire.send({"c": "sow_delete", "t": served.queue, "bm": message.bookmark})
            pong = wire.request({"c": "heartbeat", "cid": "hb"})
            assert pong.header["cid"] == "hb"  # the ack of nothing gone was not answered
    finally:
        wire.close()


def test_option_batch_delivers_a_burst_as_frames_of_records(serve, clients, queue_config):
    """Option `batch`: the messages waiting when the subscription opens come as `publish`
    frames with a `recs` entry each (bookmark, lease, payload length), in order (one
    frame, unless a stalled queue hands them over from another thread), and are acked
    as usual."""
    served = serve(queue_config(LeasePeriod="20s"))
    publisher = clients(served)
    for n in range(5):
        publisher.publish(served.queue, {"n": n})
    publisher.publish_flush()
    eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 5)
    wire = Wire(served.address)
    try:
        wire.logon()
        subscribe = {"c": "subscribe", "cid": "q", "t": served.queue, "a": "processed"}
        wire.request({**subscribe, "o": "max_backlog=5,batch"})
        recs, payloads = [], []
        while len(recs) < 5:
            frame = wire.recv()
            assert (frame.header["c"], frame.header["sub_id"]) == ("publish", "q")
            assert sum(r["n"] for r in frame.header["recs"]) == len(frame.payload)
            offset = 0
            for rec in frame.header["recs"]:
                payloads.append(orjson.loads(frame.payload[offset : offset + rec["n"]]))
                offset += rec["n"]
            recs.extend(frame.header["recs"])
        assert [r["bm"] for r in recs] == [f"{served.queue}|0|{n}|" for n in range(5)]
        assert all(0 < r["lp"] <= 20_000 for r in recs)
        assert payloads == [{"n": n} for n in range(5)]
        bookmarks = ",".join(r["bm"] for r in recs)
        ack = {"c": "sow_delete", "cid": "a", "t": served.queue, "bm": bookmarks}
        assert wire.request({**ack, "a": "processed"}).header["matches"] == 5
    finally:
        wire.close()


def test_a_delivery_batch_closes_at_its_bounds_and_encodes_as_one_frame():
    batch = DeliveryBatch("s", "q")
    rec = orjson.dumps({"bm": "q|0|1|", "n": 2})
    more = BATCH_RECORDS - 1
    assert batch.add_run([rec] * more, [b"{}"] * more, 0, 2 * more) == more
    assert not batch.full
    assert batch.add_run([rec] * 2, [b"{}"] * 2, 0, 4) == 1  # full by count at the first
    assert batch.full
    [frame] = FrameDecoder(1 << 30).feed(batch.encode())
    assert (frame.header["c"], frame.header["sub_id"], frame.header["t"]) == ("publish", "s", "q")
    assert frame.header["recs"] == [{"bm": "q|0|1|", "n": 2}] * BATCH_RECORDS
    assert len(frame.payload) == 2 * BATCH_RECORDS
    big = DeliveryBatch("s", "q")
    assert big.add_run([rec] * 2, [b"x" * BATCH_BYTES, b""], 0, BATCH_BYTES) == 1
    assert big.full  # by bytes


@settings(max_examples=150, deadline=None)
@given(
    bursts=st.lists(st.lists(st.integers(0, 40), max_size=30), max_size=8),
    records=st.integers(1, 12),
    limit=st.integers(1, 120),
)
def test_bursts_join_batches_as_one_message_at_a_time_would(bursts, records, limit):
    """post_batched joins a burst to its subscription's open batch in runs; the frames are
    the ones a message at a time makes: a batch closes at the message that brings it to
    BATCH_RECORDS messages or BATCH_BYTES of payload, and the next one opens another.
    (Small bounds, so both close batches, alone and together, mid-burst and at its end.)"""
    expected: list[list[bytes]] = []
    closed = True
    for burst in bursts:
        for size in burst:
            if closed:
                expected.append([])
            expected[-1].append(b"x" * size)
            closed = len(expected[-1]) >= records or sum(map(len, expected[-1])) >= limit
    loop = asyncio.new_event_loop()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(queues, "BATCH_RECORDS", records)
            patch.setattr(queues, "BATCH_BYTES", limit)
            engine = SimpleNamespace(on_ownership=lambda listener: None)
            service = QueueService(engine, loop)  # type: ignore[arg-type]
            session = SimpleNamespace(gateway=SimpleNamespace(queues=service))
            sub = QueueSubscriber(session, "s1", batched=True)  # type: ignore[arg-type]
            for burst in bursts:
                payloads = [b"x" * size for size in burst]
                recs = [b"{}"] * len(burst)
                service.post_batched(sub, "q", recs, payloads, sum(burst))
            batches = [batch for _, batch in service._outbox]
    finally:
        loop.close()
    assert [batch.payloads for batch in batches] == expected
    assert [batch.size for batch in batches] == [sum(map(len, b)) for b in expected]
    assert [len(batch.recs) for batch in batches] == [len(b) for b in expected]


def test_a_delivery_batch_header_is_the_dict_orjson_writes():
    """The batch joins its header around the entries' JSON: the bytes orjson writes for
    the header as a dict, for a name that needs escaping and for an empty batch too."""
    for recs in ([], [{"bm": "q|0|1|", "ts": 5, "n": 0}], [{"n": 1}, {"n": 2}]):
        batch = DeliveryBatch('s"\\1', "q\n")
        batch.add_run([orjson.dumps(rec) for rec in recs], [b""] * len(recs), 0, 0)
        header = {"c": "publish", "sub_id": 's"\\1', "t": "q\n", "recs": recs}
        assert batch.encode() == encode_frame(header, b"")


def burst_sent(burst: list[Delivery]) -> tuple[object, object, list[dict], list[bytes]]:
    """deliver_burst of a batched subscription (of a service with no engine behind it),
    leased at 1000: the subscription's session, where the outbox's one frame goes, and
    that frame's `recs` and payloads, decoded from the frame sent."""
    loop = asyncio.new_event_loop()
    try:
        engine = SimpleNamespace(on_ownership=lambda listener: None)
        service = QueueService(engine, loop)  # type: ignore[arg-type]
        session = SimpleNamespace(gateway=SimpleNamespace(queues=service))
        sub = QueueSubscriber(session, "s1", batched=True)  # type: ignore[arg-type]
        sub.deliver_burst("q", burst, 1000)
        [(to, batch)] = list(service._outbox)
        [frame] = FrameDecoder(1 << 30).feed(batch.encode())
        payloads, at = [], 0
        for rec in frame.header["recs"]:
            payloads.append(frame.payload[at : at + rec["n"]])
            at += rec["n"]
        return session, to, frame.header["recs"], payloads
    finally:
        loop.close()


def test_a_burst_message_that_cannot_be_sent_fails_alone(caplog):
    """deliver_burst: a message whose payload can't be made JSON (an Avro one that does
    not decode) is logged and skipped; the rest of its burst goes out in one frame."""

    class Broken:
        message_type = "avro"

        def decode(self, payload: bytes) -> object:
            raise ValueError("not avro")

    burst = [leased(n, b"{}", None) for n in range(3)]
    burst[1].entry.codec = Broken()  # type: ignore[assignment]
    session, to, recs, _ = burst_sent(burst)
    assert to is session
    assert recs == [{"bm": f"q|0|{n}|", "ts": 1, "lp": 500, "n": 2} for n in (0, 2)]
    assert "delivering to s1 failed" in caplog.text


def test_a_burst_of_mixed_codecs_sends_each_payload_as_its_codec_makes_it():
    """deliver_burst sends a payload as stored while the codec stays one that does not
    convert: Avro messages among them still go out as JSON, each of them, and those
    after as stored again."""

    class Avro:
        message_type = "avro"

        def decode(self, payload: bytes) -> object:
            return {"was": payload.decode()}

    avro = Avro()
    codecs = [None, JSON, JSON, avro, avro, JSON, None, avro]
    burst = [leased(n, b"[%d]" % n, codec) for n, codec in enumerate(codecs)]
    burst[6].lease_until = None  # a barrier: no lease
    _, _, recs, payloads = burst_sent(burst)
    expected = [
        b'{"was":"[%d]"}' % n if codec is avro else b"[%d]" % n for n, codec in enumerate(codecs)
    ]
    assert payloads == expected
    assert [rec["n"] for rec in recs] == [len(p) for p in expected]
    assert [rec.get("lp") for rec in recs] == [500] * 6 + [None, 500]
    assert [rec["bm"] for rec in recs] == [f"q|0|{n}|" for n in range(len(codecs))]


def leased(offset: int, payload: bytes, codec: object) -> Delivery:
    """A delivery of message ("q", 0, offset) leased until 1500 (500 ms left at 1000)."""
    entry = QueueEntry(("q", 0, offset), 1, payload, codec)  # type: ignore[arg-type]
    return Delivery(Subscription("s1", "a", burst=True), entry, 1500)


def test_a_client_reads_batched_deliveries_as_messages(serve, clients, queue_config):
    served = serve(queue_config())
    client = clients(served)
    client.set_ack_batch_size(4)
    with client.subscribe(served.queue, options="max_backlog=4,batch", timeout=5) as stream:
        for n in range(8):
            client.publish(served.queue, {"n": n})
        client.publish_flush()
        seen = []
        for _ in range(2):  # a backlog of 4 at a time: the second four come after the acks
            for message in take(stream, 4):
                assert message.command == "publish" and message.lease_period > 0
                seen.append(message.data["n"])
                message.ack()
        assert seen == list(range(8))
        eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 0)


def test_disconnect_breaks_the_leases_at_once(serve, clients, queue_config):
    served = serve(queue_config(LeasePeriod="1h"))
    first, second = clients(served), clients(served)
    stream = first.subscribe(served.queue, options="max_backlog=5", timeout=5)
    for n in range(3):
        first.publish(served.queue, {"n": n})
    first.publish_flush()
    take(stream, 3)
    with second.subscribe(served.queue, options="max_backlog=5", timeout=5) as later:
        first.close()
        assert sorted(m.data["n"] for m in take(later, 3)) == [0, 1, 2]


def test_a_queue_subscription_with_a_bookmark_replays_the_underlying_topic(
    serve, clients, queue_config
):
    served = serve(queue_config())
    client = clients(served)
    for n in range(2):
        client.publish(served.queue, {"n": n})
    client.publish_flush()
    with client.bookmark_subscribe(served.queue, "0", timeout=5) as replay:
        assert [m.data["n"] for m in take(replay, 3) if m.command == "publish"] == [0, 1]


def test_publish_to_the_queue_name_is_written_to_its_direct_topic(
    serve, clients, bootstrap, topic_factory
):
    base = topic_factory()
    queue, direct = f"{base}_Q", f"{base}_Q_DIRECT"
    create_topic(bootstrap, TopicSpec(direct, 1))
    config = Config.model_validate(
        {
            "Topics": [{"Name": base}, {"Name": direct}],
            "Queues": [{"Name": queue, "UnderlyingTopic": f"^{base}(_Q_DIRECT)?$"}],
        }
    )
    try:
        served = serve(config)
        client = clients(served)
        client.publish(queue, {"via": "name"})
        client.publish(base, {"via": "underlying"})
        client.publish_flush()
        eventually(served.engine, lambda: served.engine.runtimes[queue].state.depth == 2)
        bookmarks = {m.data["via"]: m.bookmark for m in client.sow(queue)}
        assert bookmarks["name"].startswith(f"{direct}|")
        assert bookmarks["underlying"].startswith(f"{base}|")
    finally:
        delete_topics(bootstrap, [direct, events_topic(queue)])


def test_a_queue_over_a_differently_named_topic_takes_its_publishes_and_refuses_its_own(
    serve, clients, bootstrap, topic_factory
):
    """WorkToDo over Work: a publish to the queue's name would go to WorkToDo_DIRECT, which
    the queue does not read, so the gateway refuses it instead of losing it."""
    work = topic_factory()
    queue = f"{work}ToDo"
    config = Config.model_validate(
        {"Topics": [{"Name": work}], "Queues": [{"Name": queue, "UnderlyingTopic": work}]}
    )
    try:
        served = serve(config)
        client = clients(served)
        client.publish(queue, {"n": 0})
        with pytest.raises(PublishError, match=f"DefaultPublishTarget '{queue}_DIRECT'"):
            client.publish_flush()
        with client.subscribe(queue, options="max_backlog=5") as stream:
            client.publish(work, {"n": 1})
            client.publish_flush()
            [message] = take(stream, 1)
        assert message.data == {"n": 1}
        assert message.bookmark.startswith(f"{work}|")
    finally:
        delete_topics(bootstrap, [events_topic(queue)])


def test_the_worker_starts_and_stops_the_queue_engine(bootstrap, topic_factory, tmp_path):
    sow_topic, queued = topic_factory(key=("/id",)), topic_factory()
    config = Config.model_validate(
        {
            "Topics": [{"Name": sow_topic}, {"Name": queued}],
            "SOW": [{"Topic": sow_topic, "Key": "/id"}],
            "Queues": [{"Name": queued}],
        }
    )
    worker = Worker(config, bootstrap, tmp_path, group_id=f"test-{uuid.uuid4().hex}")
    worker.start()
    try:
        worker.wait_ready(60)
        assert worker.queues is not None
        assert worker.queues.runtimes[queued].ready.is_set()
    finally:
        worker.stop()
        delete_topics(bootstrap, [events_topic(queued)])
    assert (tmp_path / "_queues" / queued).is_dir()


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ({"c": "subscribe", "o": "max_backlog=lots"}, "max_backlog=N, batch"),
        ({"c": "subscribe", "o": "oof"}, "not supported on a queue"),
        ({"c": "subscribe", "f": "/n = = 1"}, "position"),
        ({"c": "sow", "f": "/n >"}, "position"),
        ({"c": "sow_delete", "f": "/n ="}, "position"),
        ({"c": "sow_delete", "bm": "not-a-bookmark"}, "not-a-bookmark"),
        ({"c": "sow_delete", "bm": "QUEUE|0|0|", "o": "later"}, "cancel or expire, not later"),
        ({"c": "sow_delete"}, "sow_delete"),
        ({"c": "sow_and_subscribe"}, "not supported on a queue"),
    ],
)
def test_bad_queue_commands_fail_with_a_reason_and_the_queue_keeps_serving(
    serve, clients, queue_config, command, reason
):
    served = serve(queue_config())
    wire = Wire(served.address)
    try:
        wire.logon()
        header = {"t": served.queue, **command, "cid": "bad", "a": "processed"}
        if "bm" in header:
            header["bm"] = header["bm"].replace("QUEUE", served.queue)
        reply = wire.request(header)
        assert reply.header["status"] == "failure"
        assert reason in reply.header["reason"]
        assert wire.request({"c": "heartbeat", "cid": "hb"}).header["cid"] == "hb"
    finally:
        wire.close()
    client = clients(served)
    with client.subscribe(served.queue, timeout=5) as stream:
        client.publish(served.queue, {"n": 1})
        client.publish_flush()
        assert [m.data for m in take(stream, 1)] == [{"n": 1}]


def test_message_ack_in_an_async_client_is_a_plain_call_that_takes_effect(
    serve, clients, queue_config
):
    """docs/queues.md: with an AsyncClient, message.ack() is not a coroutine (nothing to
    await, so nothing is left un-awaited) and returns without waiting for the gateway;
    the awaitable calls are flush_acks() and client.ack(...)."""
    served = serve(queue_config(LeasePeriod="20s"))

    async def run() -> None:
        async with (
            AsyncClient(client=clients(served)) as aclient,
            await aclient.subscribe(served.queue) as stream,
        ):
            await aclient.publish(served.queue, {"n": 1})
            await aclient.publish_flush()
            message = await stream.next(30)
            assert message is not None and message.lease_period is not None
            outcome = message.ack()
            assert outcome is None and not inspect.isawaitable(outcome)
            await aclient.flush_acks()
            eventually(served.engine, lambda: served.engine.runtimes[served.queue].state.depth == 0)

    asyncio.run(run())
