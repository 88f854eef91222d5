"""The gateway over a running worker: sow, subscriptions, oof, sow_delete, sow_and_subscribe."""

from __future__ import annotations

import itertools
import threading

import orjson
import pytest

from amps_on_kafka.errors import ServerError
from amps_on_kafka.native import core
from amps_on_kafka.server import queries
from tests.server.helpers import WAIT, is_ack


def publish_applied(client, topic: str, docs: list[dict], expiration: float | None = None) -> None:
    """Publish and return once the worker has applied every document."""
    with client.subscribe(topic, timeout=WAIT) as applied:
        for doc in docs:
            client.publish(topic, doc, expiration=expiration)
        client.publish_flush(WAIT)
        assert len(list(itertools.islice(applied, len(docs)))) == len(docs)


@pytest.fixture
def client(served, client_to):
    return client_to(served.address)


@pytest.fixture
def wire(served, wire_to):
    connection = wire_to(served.address)
    connection.logon("sow-test")
    return connection


def test_a_tcp_publish_reaches_the_sow_with_its_metadata(served, client):
    publish_applied(client, served.topic, [{"id": 1, "qty": 5}])
    [record] = list(client.sow(served.topic))
    assert record.command == "sow" and record.data == {"id": 1, "qty": 5}
    assert record.sow_key == "1" and record.topic == served.topic
    assert record.bookmark.startswith(f"{served.topic}|") and record.timestamp > 0
    assert record.expiration is None


def test_sow_filters_orders_and_limits(served, client):
    publish_applied(client, served.topic, [{"id": i, "qty": i} for i in range(10)])
    records = list(client.sow(served.topic, "/qty >= 3", order_by="/qty DESC", top_n=3))
    assert [r.data["qty"] for r in records] == [9, 8, 7]
    assert [r.data for r in client.sow(served.topic, "/id = 4")] == [{"id": 4, "qty": 4}]


def test_sow_results_come_in_batches_with_stats(served, client, wire):
    publish_applied(client, served.topic, [{"id": i} for i in range(10)])
    wire.send({"c": "sow", "cid": "q", "t": served.topic, "bs": 3, "a": "stats,completed"})
    frames = wire.until(lambda f: is_ack(f, "completed"))
    assert [f.header["c"] for f in frames] == [
        "group_begin",
        *["sow"] * 4,
        "group_end",
        "ack",
        "ack",
    ]
    assert [len(f.header["recs"]) for f in frames[1:5]] == [3, 3, 3, 1]
    keys = sorted(int(meta["k"]) for f in frames[1:5] for meta in f.header["recs"])
    assert keys == list(range(10))
    stats = frames[-2].header
    assert (stats["a"], stats["matches"], stats["records_returned"]) == ("stats", 10, 10)


@pytest.mark.parametrize("read_ahead", [1, 4, 100])
def test_a_streamed_answer_reads_ahead_a_bounded_run_and_loses_nothing(
    served, client, wire, monkeypatch, read_ahead
):
    """An unordered sow is read STREAM_WRITE records at a time while the last run is sent
    (server/queries.py): whatever that bound, against `bs`, every match comes once, in
    batches of at most `bs`, with stats that count them."""
    monkeypatch.setattr(queries, "STREAM_WRITE", read_ahead)
    publish_applied(client, served.topic, [{"id": i, "even": i % 2 == 0} for i in range(11)])
    request = {"c": "sow", "cid": "q", "t": served.topic, "bs": 2, "a": "stats,completed"}
    wire.send({**request, "f": "/even = true"})
    frames = wire.until(lambda f: is_ack(f, "completed"))
    batches = [f.header["recs"] for f in frames if f.header["c"] == "sow"]
    assert all(1 <= len(batch) <= 2 for batch in batches)
    assert sorted(int(meta["k"]) for batch in batches for meta in batch) == list(range(0, 11, 2))
    stats = frames[-2].header
    assert (stats["a"], stats["matches"], stats["records_returned"]) == ("stats", 6, 6)


def _answer(wire, topic: str, filter: str) -> tuple[list, dict]:
    """A sow's records (metadata and payload, the `cid` aside) and its stats ack."""
    wire.send({"c": "sow", "cid": "q", "t": topic, "f": filter, "a": "stats,completed"})
    frames = wire.until(lambda f: is_ack(f, "completed"))
    records = [(f.header["recs"], f.payload) for f in frames if f.header["c"] == "sow"]
    stats = frames[-2].header
    return records, {k: stats[k] for k in ("a", "matches", "records_returned")}


class PoolTrips:
    """Counts the work a gateway sends to its pool; `happened` is set at the first."""

    def __init__(self) -> None:
        self.count = 0
        self.happened = threading.Event()


@pytest.fixture
def pool_trips(served, monkeypatch) -> PoolTrips:
    trips = PoolTrips()
    blocking = served.gateway.blocking

    async def counted(work, *args):
        trips.count += 1
        trips.happened.set()
        return await blocking(work, *args)

    monkeypatch.setattr(served.gateway, "blocking", counted)
    return trips


@pytest.mark.parametrize("key", [3, 99])
def test_a_key_look_up_on_the_loop_answers_as_the_pools_query_does(
    served, client, wire, pool_trips, key
):
    """`/id = N` is answered on the event loop (server/queries.py _key_answer); `/id IN (N)`
    pins the same key but takes the pool: same records, same stats, and no pool trip."""
    publish_applied(client, served.topic, [{"id": i, "qty": i * 10} for i in range(5)])
    for _ in range(20):  # the worker holding the engine's lock sends it to the pool (below)
        pool_trips.count = 0
        fast = _answer(wire, served.topic, f"/id = {key}")
        if pool_trips.count == 0:
            break
    assert pool_trips.count == 0
    general = _answer(wire, served.topic, f"/id IN ({key})")
    assert pool_trips.count >= 1
    assert fast == general
    assert fast[1]["matches"] == (1 if key < 5 else 0)


def _whole_answer(wire, topic: str, filter: str) -> list:
    """Every frame of a sow's answer, headers and payloads, with every ack and every key
    a reply echoes asked for, in small batches."""
    request = {"c": "sow", "cid": "q", "t": topic, "f": filter, "s": 12, "query_id": "w"}
    wire.send({**request, "a": "processed,stats,completed", "bs": 1})
    return [(f.header, f.payload) for f in wire.until(lambda f: is_ack(f, "completed"))]


def _on_the_loop(pool_trips: PoolTrips, answer):
    """`answer()` once it was answered with no pool trip (the worker holding the engine's
    lock, applying a batch, sends a look-up to the pool; see the test below)."""
    for _ in range(20):
        pool_trips.count = 0
        given = answer()
        if pool_trips.count == 0:
            return given
    raise AssertionError("every look-up took the pool")


@pytest.mark.parametrize("literal", ["3", "003", "-3", "99", "'3'", "7", "'7'", "'x y'"])
def test_every_frame_of_a_key_look_up_on_the_loop_is_the_pools(
    served, client, wire, pool_trips, literal
):
    """The loop's answer (server/queries.py _answer_at_once) frame for frame as the
    pool's, present and absent keys alike, and a literal of the other type than the
    record's field: `'3'` against 3 and `7` against "7" pin the same SOW key, and the
    filter decides whether the record matches, on either path. `003` pins the key `3`."""
    docs = [{"id": 3, "qty": 30}, {"id": "7", "qty": 70}, {"id": "x y", "qty": 1}]
    docs.append({"id": -3, "qty": -30})
    publish_applied(client, served.topic, docs)
    fast = _on_the_loop(pool_trips, lambda: _whole_answer(wire, served.topic, f"/id = {literal}"))
    general = _whole_answer(wire, served.topic, f"/id IN ({literal})")
    assert pool_trips.count >= 1
    assert fast == general
    assert [h["c"] for h, _ in fast][:2] == ["ack", "group_begin"]


def test_a_key_look_up_on_the_loop_leaves_out_an_expired_record_as_the_pool_does(
    served, client, wire, pool_trips, monkeypatch
):
    """A record past its deadline that the worker has not swept yet (the engine's clock
    moved on, the worker's not) is no answer on the loop, as on the pool."""
    publish_applied(client, served.topic, [{"id": 4, "qty": 40}], expiration=3600)
    publish_applied(client, served.topic, [{"id": 5, "qty": 50}])
    look_up = lambda key: _answer(wire, served.topic, f"/id = {key}")  # noqa: E731
    assert _on_the_loop(pool_trips, lambda: look_up(4))[1]["matches"] == 1
    later = served.worker.engine.clock() + 7_200_000
    monkeypatch.setattr(served.worker.engine, "clock", lambda: later)
    for key, matches in ((4, 0), (5, 1)):
        fast = _on_the_loop(pool_trips, lambda key=key: look_up(key))
        assert fast == _answer(wire, served.topic, f"/id IN ({key})")
        assert fast[1]["matches"] == matches


def test_a_key_look_up_fails_as_the_general_path_does(served, wire):
    """The loop's path checks the header as Query.parse does, in its order: an unknown
    topic, then a bad `bs`, each with the general path's reason."""
    for filter in ("/id = 1", "/id IN (1)"):
        for fields, reason in (
            ({"t": "elsewhere", "bs": -1}, "'elsewhere' is not a SOW topic of this worker"),
            ({"t": served.topic, "bs": -1}, "'bs' must be a whole number >= 0, not -1"),
        ):
            wire.send({"c": "sow", "cid": "e", "f": filter, "a": "completed", **fields})
            [failure] = wire.until(lambda f: is_ack(f, "processed"))
            assert failure.header["status"] == "failure"
            assert failure.header["reason"] == reason


def test_a_key_look_up_while_the_worker_holds_the_engine_waits_on_the_pool(
    served, client, wire, pool_trips
):
    """The loop never waits for the engine's lock: held (a batch being applied), the
    look-up goes to the pool, which answers once the lock is let go."""
    publish_applied(client, served.topic, [{"id": 1, "qty": 10}])
    expected = _answer(wire, served.topic, "/id IN (1)")
    pool_trips.count = 0
    pool_trips.happened.clear()
    with served.worker.engine.lock:
        request = {"c": "sow", "cid": "q", "t": served.topic, "f": "/id = 1", "a": "stats"}
        wire.send(request)
        assert pool_trips.happened.wait(WAIT)
    frames = wire.until(lambda f: is_ack(f, "stats"))
    records = [(f.header["recs"], f.payload) for f in frames if f.header["c"] == "sow"]
    assert pool_trips.count >= 1 and records == expected[0]


class AtOnce:
    """Counts the look-ups queries.look_up_at_once answered (True) and passed on."""

    def __init__(self) -> None:
        self.answered = 0
        self.passed = 0


@pytest.fixture
def at_once(monkeypatch) -> AtOnce:
    counts = AtOnce()
    direct = queries.look_up_at_once

    def counted(session, header):
        answered = direct(session, header)
        if answered:
            counts.answered += 1
        else:
            counts.passed += 1
        return answered

    monkeypatch.setattr(queries, "look_up_at_once", counted)
    return counts


def _frames(wire, header: dict) -> list:
    """Every frame answering `header` (which asks for the completed ack), the `cid` aside."""
    wire.send(header)
    return [
        ({k: v for k, v in f.header.items() if k != "cid"}, f.payload)
        for f in wire.until(lambda f: is_ack(f, "completed") or f.header.get("status") == "failure")
    ]


# the literals the compiled core answers (a text against a number field, and the
# reverse, or a negative number, it passes on: the general path's filter decides)
AT_ONCE = ["3", "003", "99", "'7'", "'x y'"]


@pytest.mark.parametrize("literal", [*AT_ONCE, "-3", "'3'", "7"])
@pytest.mark.parametrize("acks", ["processed,completed", "processed,stats,completed"])
def test_a_clients_look_up_is_answered_from_the_frame_split_as_the_general_path(
    served, client, wire, pool_trips, at_once, literal, acks
):
    """A client's look-up header (`c`, `cid`, `t`, `a`, `bs`, `f`) is answered by
    queries.look_up_at_once, with the checks of its shape made once: every frame as the
    pool's answer to `/id IN (literal)`, present and absent keys alike; a literal the
    compiled core is not sure of is passed on, and _handle answers it the same."""
    docs = [{"id": 3, "qty": 30}, {"id": "7", "qty": 70}, {"id": "x y", "qty": 1}]
    publish_applied(client, served.topic, [*docs, {"id": -3, "qty": -30}])
    request = {"c": "sow", "cid": "q", "t": served.topic, "a": acks, "bs": 1}
    answered = literal in AT_ONCE and core is not None  # AMPS_NATIVE=0: _handle answers all
    for _ in range(20):  # the worker holding the engine's lock passes it on (as below)
        at_once.answered = 0
        fast = _frames(wire, {**request, "f": f"/id = {literal}"})
        if at_once.answered or not answered:
            break
    assert at_once.answered == answered
    assert fast == _frames(wire, {**request, "f": f"/id IN ({literal})"})
    assert pool_trips.count >= 1  # the IN took the pool: the two paths were compared


@pytest.mark.parametrize(
    ("fields", "answer"),
    [
        ({"query_id": "w"}, 1),  # a key a client's look-up does not have
        ({"s": 12}, 1),
        ({"top_n": 1}, 1),
        ({"a": "received,completed"}, 1),  # the received ack: _handle sends it
        ({"cid": 5}, 1),
        ({"f": "/qty = 30"}, 1),  # not the Key path
        ({"f": "/id = 3 AND /qty = 30"}, 1),
        ({"a": ["completed"]}, "'a' must be a comma-separated string"),
        ({"bs": -1}, "'bs' must be a whole number >= 0, not -1"),
        ({"bs": True}, "'bs' must be a whole number >= 0, not True"),
        ({"t": "elsewhere"}, "'elsewhere' is not a SOW topic of this worker"),
    ],
)
def test_a_look_up_of_another_shape_is_passed_to_the_general_path(
    served, client, wire, at_once, fields, answer
):
    """What look_up_at_once does not take it passes on having sent nothing, and the
    general path answers it (`answer` records), or names its fault, as before."""
    publish_applied(client, served.topic, [{"id": 3, "qty": 30}])
    request = {"c": "sow", "cid": "q", "t": served.topic, "a": "completed", "bs": 10}
    given = _frames(wire, {**request, "f": "/id = 3", **fields})
    assert (at_once.answered, at_once.passed) == (0, 1)
    if isinstance(answer, str):
        assert [(h["status"], h["reason"]) for h, _ in given] == [("failure", answer)]
    else:
        assert sum(len(h["recs"]) for h, _ in given if h["c"] == "sow") == answer
        assert given[-1][0]["a"] == "completed"


@pytest.mark.skipif(core is None, reason="no compiled core (AMPS_NATIVE=0): no plans made")
def test_a_gateway_keeps_at_most_max_plans_look_up_shapes(
    served, client, wire, at_once, monkeypatch
):
    """The plans' keys are the clients' (`a`, `bs`): a gateway keeps MAX_PLANS of them."""
    monkeypatch.setattr(queries, "MAX_PLANS", 2)
    publish_applied(client, served.topic, [{"id": 3, "qty": 30}])
    for batch in range(1, 6):
        request = {"c": "sow", "cid": "q", "t": served.topic, "a": "completed", "bs": batch}
        frames = _frames(wire, {**request, "f": "/id = 3"})
        assert [h["c"] for h, _ in frames] == ["group_begin", "sow", "group_end", "ack"]
        assert len(served.gateway.key_plans) <= 2
    assert at_once.answered >= 1


def test_delta_publish_merges_into_the_record(served, client):
    publish_applied(client, served.topic, [{"id": 1, "a": 1, "b": 1}])
    with client.subscribe(served.topic, timeout=WAIT) as applied:
        client.delta_publish(served.topic, {"id": 1, "b": 2})
        assert next(applied).data == {"id": 1, "a": 1, "b": 2}
    assert [r.data for r in client.sow(served.topic)] == [{"id": 1, "a": 1, "b": 2}]


def test_a_subscription_gets_matching_upserts_live_in_order(served, client, client_to):
    publisher = client_to(served.address)
    with client.subscribe(served.topic, "/qty > 5", timeout=WAIT) as live:
        for qty in (1, 6, 2, 7, 8):
            publisher.publish(served.topic, {"id": 1, "qty": qty})
        publisher.publish_flush(WAIT)
        seen = [(m.command, m.sow_key, m.data["qty"]) for m in itertools.islice(live, 3)]
    assert seen == [("publish", "1", 6), ("publish", "1", 7), ("publish", "1", 8)]


def test_oof_for_records_that_leave_the_subscription(served, client, wire):
    wire.send(
        {
            "c": "subscribe",
            "cid": "s",
            "sub_id": "s",
            "t": served.topic,
            "f": "/qty > 5",
            "o": "oof",
            "a": "processed",
        }
    )
    assert is_ack(wire.recv(), "processed")
    for doc in ({"id": 1, "qty": 10}, {"id": 2, "qty": 10}, {"id": 4, "qty": 1}):
        client.publish(served.topic, doc)
    client.publish(served.topic, {"id": 3, "qty": 7}, expiration=0.5)
    client.publish_flush(WAIT)
    assert sorted(orjson.loads(f.payload)["id"] for f in (wire.recv() for _ in range(3))) == [
        1,
        2,
        3,
    ]

    client.publish(served.topic, {"id": 1, "qty": 1})  # no longer matches
    client.sow_delete(served.topic, keys=["2", "4"])  # 4 never matched: no oof for it
    oofs = {}
    for frame in (wire.recv() for _ in range(3)):  # 3 expires after half a second
        assert frame.header["c"] == "oof" and frame.header["sub_id"] == "s"
        oofs[frame.header["reason"]] = (frame.header["k"], orjson.loads(frame.payload))
    assert oofs == {
        "match": ("1", {"id": 1, "qty": 1}),
        "deleted": ("2", {"id": 2, "qty": 10}),
        "expired": ("3", {"id": 3, "qty": 7}),
    }
    fence = wire.request({"c": "sow", "cid": "fence", "t": served.topic})
    assert fence.header["c"] == "group_begin"  # nothing else was delivered before it


@pytest.mark.parametrize("served", ["disabled"], indirect=True)
def test_oof_match_where_the_worker_writes_publishes_blind(served, client, wire):
    """Without expiration, the worker reads old records only while an oof subscription
    asks for them; one that arrives after the record was written blind still gets its
    oof when the record stops matching."""
    engine = served.worker.engine
    publish_applied(client, served.topic, [{"id": 1, "qty": 10}])
    assert not engine.wants_previous(served.topic)
    subscription = {"c": "subscribe", "cid": "s", "sub_id": "s", "t": served.topic}
    wire.send({**subscription, "f": "/qty > 5", "o": "oof", "a": "processed"})
    assert is_ack(wire.recv(), "processed")
    assert engine.wants_previous(served.topic)
    again = wire.request({**subscription, "cid": "dup", "o": "oof", "a": "processed"})
    assert again.header["status"] == "failure" and "already in use" in again.header["reason"]
    client.publish(served.topic, {"id": 1, "qty": 1})
    client.publish_flush(WAIT)
    oof = wire.recv()
    assert (oof.header["c"], oof.header["reason"], oof.header["k"]) == ("oof", "match", "1")
    assert is_ack(
        wire.request({"c": "unsubscribe", "cid": "u", "sub_id": "s", "a": "processed"}), "processed"
    )
    assert not engine.wants_previous(served.topic)


def test_unsubscribe_stops_deliveries(served, client, wire):
    wire.send({"c": "subscribe", "cid": "s", "sub_id": "gone", "t": served.topic, "a": "processed"})
    assert is_ack(wire.recv(), "processed")
    assert is_ack(
        wire.request({"c": "unsubscribe", "cid": "u", "sub_id": "gone", "a": "processed"}),
        "processed",
    )
    publish_applied(client, served.topic, [{"id": 1}])
    assert (
        wire.request({"c": "sow", "cid": "fence", "t": served.topic}).header["c"] == "group_begin"
    )


def test_sow_delete_acks_count_what_was_deleted(served, client):
    publish_applied(client, served.topic, [{"id": i, "qty": i} for i in range(10)])
    by_filter = client.sow_delete(served.topic, "/qty < 4")  # one record per partition
    assert (by_filter.command, by_filter.ack_type, by_filter.status, by_filter.matches) == (
        "ack",
        "processed",
        "success",
        4,
    )
    assert client.sow_delete(served.topic, keys=["5", "6", "no-such-key"]).matches == 2
    assert client.sow_delete(served.topic, data={"id": 9}).matches == 1
    assert client.sow_delete(served.topic, "/qty > 100").matches == 0
    assert sorted(r.data["id"] for r in client.sow(served.topic)) == [4, 7, 8]


def test_errors_carry_the_servers_reason(served, client):
    with pytest.raises(ServerError, match="at position 8"):
        client.sow(served.topic, "/qty > > 1")
    with pytest.raises(ServerError, match="not a SOW topic of this worker"):
        client.sow("elsewhere")
    with pytest.raises(ServerError, match=r"order_by term '/qty DESC DESC DESC': .*ASC or DESC"):
        client.sow_and_subscribe(served.topic, order_by="/qty DESC DESC DESC", sub_id="x")
    with client.sow_and_subscribe(served.topic, sub_id="x", timeout=WAIT) as stream:  # x was freed
        assert next(stream).command == "group_begin"
    client.heartbeat()


def test_sow_and_subscribe_joins_snapshot_and_live_with_no_gap_and_no_duplicate(
    served, client, client_to
):
    """Versions of each key are published before, during and after the snapshot; the
    subscriber's view of every key must step through consecutive versions to the last."""
    keys, topic = 20, served.topic
    publisher = client_to(served.address)
    ten_rounds, subscribed = threading.Event(), threading.Event()
    final: list[int] = []

    def publish_rounds() -> None:
        stop_at = None
        for version in itertools.count():
            for key in range(keys):
                publisher.publish(topic, {"id": key, "v": version})
            publisher.publish_flush(WAIT)
            if version == 9:
                ten_rounds.set()
            if subscribed.is_set():
                stop_at = version + 5 if stop_at is None else stop_at
                if version >= stop_at:
                    final.append(version)
                    return

    thread = threading.Thread(target=publish_rounds)
    thread.start()
    assert ten_rounds.wait(WAIT)
    seen: dict[str, list[int]] = {}
    snapshot_keys = set()
    with client.sow_and_subscribe(topic, batch_size=7, timeout=WAIT) as stream:
        subscribed.set()
        thread.join(60)
        in_snapshot = None
        for message in stream:
            if message.command in ("group_begin", "group_end"):
                in_snapshot = message.command == "group_begin"
                continue
            assert message.command == ("sow" if in_snapshot else "publish")
            if in_snapshot:
                snapshot_keys.add(message.sow_key)
            seen.setdefault(message.sow_key, []).append(message.data["v"])
            if len(seen) == keys and all(v[-1] == final[0] for v in seen.values()):
                break
    assert len(snapshot_keys) == keys
    for versions in seen.values():
        assert versions == list(range(versions[0], final[0] + 1))
    assert all(len(versions) > 5 for versions in seen.values())  # live deliveries happened
