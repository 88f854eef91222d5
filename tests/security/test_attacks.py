"""Attacks found by trying the secured gateway as an attacker (qa14), each now refused.

A topic regular expression (AMPS's topic regex: a log subscription reads every topic it
matches) was checked against a user's grants as a string: `prices..*|orders` matches a
Read grant `prices\\..*` as text, and the replay then read all of `orders`, entitlement
filter or not. The grant must hold for every topic the pattern matches.

Guessing passwords (the throttle, below): a burst of attempts sent before the first
failure was tried whole, and waits piled up without bound behind the guesser's.

One worker and plain-TCP gateway serve the module (the TLS side is
tests/security/test_gateway_attacks.py's).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.admin.auth import BasicAuth
from amps_on_kafka.config import Config
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.security.auth import (
    FREE_ATTEMPTS,
    Authentication,
    LogonFailed,
    PasswordAuthenticator,
    Throttle,
    Throttled,
)
from amps_on_kafka.security.policy import Security
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.server.subscriptions import ENTITLEMENT
from tests.conftest import create_topic, delete_topics
from tests.server.helpers import Wire, is_ack

PASSWORD = "a password of the test"
PEER_SECRET = "the secret of the group's gateways"


@dataclass
class Target:
    address: str
    orders: str  # a SOW topic nobody may read whole but through a filter
    prices: str  # the one topic the prefix grant is for
    prefix: str


def _config(target: Target, users: Path) -> Config:
    grant = f"{target.prefix}\\..*"  # a regular expression: every prefix.* topic
    return Config.model_validate(
        {
            "Topics": [
                {"Name": target.orders, "Partitions": 1},
                {"Name": target.prices, "Partitions": 1},
            ],
            "SOW": [{"Topic": target.orders, "Key": "/id"}],
            "Gateway": {"Listen": "127.0.0.1:0"},
            "Authentication": {
                "UsersFile": str(users),
                "FailureDelay": "10ms",
                "PeerSecret": PEER_SECRET,
            },
            "Entitlements": {
                "Users": {
                    "dave": {"Read": [grant], "Write": [grant]},
                    "erin": {"Read": [grant, {"Topic": target.orders, "Filter": "/desk = 'fx'"}]},
                },
            },
        }
    )


@pytest.fixture(scope="module")
def target(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    base = tmp_path_factory.mktemp("attacks")
    users = UsersFile(base / "users.txt")
    for name in ("dave", "erin"):
        users.add(name, PASSWORD)
    suffix = uuid.uuid4().hex[:8]
    prefix = f"atk-{suffix}"
    spec = Target("", f"atk-orders-{suffix}", f"{prefix}.eur", prefix)
    create_topic(bootstrap, TopicSpec(spec.orders, 1, key=("/id",)))
    create_topic(bootstrap, TopicSpec(spec.prices, 1))
    config = _config(spec, users.path)
    worker = Worker(config, bootstrap, base / "state", group_id=f"test-{suffix}")
    worker.start()
    try:
        worker.wait_ready(60)
        security = Security.from_config(config)
        with Gateway(
            worker.engine,
            bootstrap,
            listen="127.0.0.1:0",
            settings=config.gateway,
            security=security,
        ) as gateway:
            spec.address = gateway.address
            yield spec
    finally:
        worker.stop()
        delete_topics(bootstrap, [spec.orders, spec.prices])


def _logon(target: Target, user: str) -> Wire:
    wire = Wire(target.address)
    header = {"c": "logon", "cid": "l", "client_name": f"{user}-{uuid.uuid4().hex[:6]}"}
    reply = wire.request({**header, "user_id": user, "pw": PASSWORD}).header
    assert reply["status"] == "success", reply
    return wire


def _replay(wire: Wire, topic: str, cid: str) -> list:
    wire.send(
        {"c": "subscribe", "t": topic, "bm": "0", "sub_id": cid, "cid": cid, "a": "completed"}
    )
    return wire.until(lambda f: is_ack(f, "completed") or f.header.get("status") == "failure")


def test_a_topic_regex_needs_read_on_every_topic_it_matches(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    dave, erin = _logon(target, "dave"), _logon(target, "erin")
    try:
        dave.request(
            {"c": "publish", "t": target.prices, "cid": "p", "a": "persisted"}, b'{"px": 1.5}'
        )
        # what the grant is for still works through a pattern
        frames = _replay(dave, f"{target.prefix}\\..*", "ok")
        assert [orjson.loads(f.payload) for f in frames if f.header["c"] == "publish"] == [
            {"px": 1.5}
        ]
        attack = f"{target.prefix}..*|{target.orders}"  # matches dave's grant as a string
        with caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"):
            replayed = _replay(dave, attack, "r")[-1].header
            live = dave.request({"c": "subscribe", "t": attack, "sub_id": "s", "cid": "s"})
            mixed = _replay(erin, attack, "e")[-1].header
        denied = (
            f"not entitled: user 'dave' may not subscribe {attack!r}: it matches a topic or "
            "queue this user may not read"
        )
        assert (replayed["status"], replayed["reason"]) == ("failure", denied)
        assert (live.header["status"], live.header["reason"]) == ("failure", denied)
        # erin reads both, but orders only through a filter the pattern can't carry
        assert mixed["status"] == "failure" and "different entitlement filters" in mixed["reason"]
        audited = [r.getMessage() for r in caplog.records if r.getMessage().startswith("denied")]
        assert len(audited) == 3
    finally:
        dave.close()
        erin.close()


def test_a_peer_leg_tells_an_entitlement_oof_and_a_user_cannot_forge_one(target: Target) -> None:
    """A subscription spread over a group reaches the other gateways as `_peer`, which
    reads unrestricted: a record leaving the user's entitled set was an oof `match`
    carrying the new record (desk 'rates', which the user may not see). The forwarded
    command now carries the entitlement filter; a user's own `_entitlement` is ignored."""
    record = f"x-{uuid.uuid4().hex[:6]}"
    peer, erin = Wire(target.address), _logon(target, "erin")
    try:
        logon = {"c": "logon", "cid": "l", "client_name": "_peer-test", "user_id": "_peer"}
        assert peer.request({**logon, "pw": PEER_SECRET}).header["status"] == "success"
        own = f"/id = '{record}'"
        forwarded = {"f": f"(/desk = 'fx') AND ({own})", ENTITLEMENT: "/desk = 'fx'"}
        forged = {"f": own, ENTITLEMENT: "1=1"}
        for wire, extra in ((peer, forwarded), (erin, forged)):
            header = {"c": "subscribe", "t": target.orders, "sub_id": "s", "cid": "s"}
            reply = wire.request({**header, "o": "oof", "a": "processed", **extra})
            assert reply.header["status"] == "success", reply.header
        for qty, desk in ((1, "fx"), (2, "rates")):
            payload = orjson.dumps({"id": record, "desk": desk, "qty": qty})
            peer.send({"c": "publish", "t": target.orders, "cid": f"p{qty}"}, payload)
        for wire in (peer, erin):
            frames = wire.until(lambda f: f.header.get("c") == "oof")
            oof = frames[-1]
            assert oof.header["reason"] == "entitlement", oof.header
            assert orjson.loads(oof.payload)["desk"] == "fx"  # as seen, never the new one
    finally:
        peer.close()
        erin.close()


def test_a_filter_error_does_not_show_the_entitlement_filter(target: Target) -> None:
    """A filter within the limits alone, beyond them with the entitlement filter ANDed:
    the error quoted the combined text (`...fx') AND (((((...`)."""
    erin = _logon(target, "erin")
    try:
        deep = "(" * 50 + "/qty = 1" + ")" * 50
        reply = erin.request({"c": "sow", "t": target.orders, "cid": "d", "f": deep}).header
        assert reply["reason"] == (
            "filter: nested more than 50 levels deep, counting the entitlement filter ANDed with it"
        )
        wrong = erin.request({"c": "sow", "t": target.orders, "cid": "w", "f": "/qty = = 1"})
        assert wrong.header["reason"].startswith("at position 8:")  # her own, as before
    finally:
        erin.close()


def test_a_client_name_with_a_line_break_is_refused(target: Target) -> None:
    """It went into audit lines as it was: a name could add lines to the audit trail."""
    with Wire(target.address) as wire:
        header = {"c": "logon", "cid": "l", "user_id": "erin", "pw": PASSWORD}
        reply = wire.request({**header, "client_name": "app\nWARNING denied nothing"}).header
        assert reply["reason"].endswith("must be printable: no line breaks")


# -- guessing passwords: the throttle (qa14) ------------------------------------------
# 20 connections sending wrong passwords for alice at once had all 20 tried before the
# first failure was counted, and every later attempt queued behind the others: after 15 s
# of it, alice's own logon got no answer for minutes (the waits added up, 30 s each).


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_guesses_before_any_failure_is_spaced_too() -> None:
    throttle = Throttle(0.5, 30.0, Clock())
    admitted = []
    for _ in range(20):  # all at once, none answered yet
        with contextlib.suppress(LogonFailed):
            admitted.append(throttle.reserve(["address x", "user alice"]))
    assert admitted[:FREE_ATTEMPTS] == [0.0] * FREE_ATTEMPTS
    assert admitted == sorted(admitted) and len(admitted) <= 8  # not 20


def test_no_attempt_waits_longer_than_the_cap_it_is_refused_untried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = Throttle(1.0, 4.0, Clock())
    throttle.failed(["address x", "user alice"])
    throttle.failed(["address x", "user alice"])
    with caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"):
        waits = [throttle.reserve(["address y", "user alice"]) for _ in range(2)]
        for _ in range(1000):  # refused at once, untried; one audit line, not 1000
            with pytest.raises(LogonFailed, match="too many failed logons: try again in"):
                throttle.reserve(["address z", "user alice"])
    assert waits == [2.0, 4.0]
    assert sum("refused untried" in r.getMessage() for r in caplog.records) == 1


def test_logons_one_after_another_from_one_address_are_not_slowed() -> None:
    """A client opening a pool of connections: each logon answered before the next."""
    throttle = Throttle(0.5, 30.0, Clock())
    for n in range(20):
        keys = ["address x", f"user app-{n}"]
        assert throttle.reserve(keys) == 0
        throttle.succeeded(f"user app-{n}", *keys)


def test_logons_without_a_password_in_parallel_are_not_throttled(target: Target) -> None:
    """Found in a multi-worker run: anonymous logons opened at once from one address (a
    NAT, the workers of one host) were refused as "too many failed logons", none having
    failed. Nothing secret is checked in them: they are answered, whatever they are, and
    leave the address free for a password logon right after."""
    wires = [Wire(target.address) for _ in range(24)]
    try:
        for n, wire in enumerate(wires):  # all sent before any is answered
            wire.send({"c": "logon", "cid": "l", "client_name": f"anon-{n}"})
        replies = [wire.until(lambda f: f.header.get("cid") == "l")[-1].header for wire in wires]
    finally:
        for wire in wires:
            wire.close()
    reasons = {reply.get("reason", "") for reply in replies}
    assert not any("too many failed logons" in reason for reason in reasons), reasons
    assert {reply["status"] for reply in replies} == {"failure"}  # no Anonymous here
    _logon(target, "dave").close()  # not made to wait


def test_peer_logons_in_parallel_are_not_spaced_but_a_wrong_secret_still_counts(
    target: Target,
) -> None:
    """A gateway opens a peer link for each leg of a query spread over workers: many at
    once from one address under load. They were spaced as a password burst, delays
    doubling past two in flight, until queries were refused. A wrong peer secret is
    still a failed logon, which slows the next attempt."""
    wires = [Wire(target.address) for _ in range(24)]
    try:
        for n, wire in enumerate(wires):
            header = {"c": "logon", "cid": "l", "client_name": f"peer-{n}"}
            wire.send({**header, "user_id": "_peer", "pw": PEER_SECRET})
        replies = [wire.until(lambda f: f.header.get("cid") == "l")[-1].header for wire in wires]
    finally:
        for wire in wires:
            wire.close()
    assert [reply["status"] for reply in replies] == ["success"] * len(wires), replies
    throttle = Throttle(0.5, 30.0, Clock())
    throttle.reserve(["address x", "user _peer"], spaced=False)
    throttle.failed(["address x", "user _peer"], spaced=False)
    assert throttle.reserve(["address x", "user _peer"], spaced=False) == 0.5


def test_a_refusal_is_answered_after_the_delay_not_at_once() -> None:
    throttle = Throttle(0.5, 2.0, Clock())
    for _ in range(3):
        throttle.failed(["address x"])
    throttle.reserve(["address x"])  # 2 s: the cap
    with pytest.raises(Throttled) as refused:
        throttle.reserve(["address x"])
    assert refused.value.pause == 2.0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["reserve", "failed", "succeeded", "wait"]),
            st.sampled_from(["address a", "address b", "user u", "user v"]),
            st.floats(0, 40),
        ),
        max_size=60,
    )
)
def test_any_sequence_of_attempts_waits_at_most_the_cap(steps) -> None:
    clock = Clock()
    throttle = Throttle(0.5, 8.0, clock)
    for action, key, seconds in steps:
        if action == "wait":
            clock.now += seconds
        elif action == "failed":
            throttle.failed(["address a", key])
        elif action == "succeeded":
            throttle.succeeded(key)
        else:
            with contextlib.suppress(LogonFailed):
                assert 0 <= throttle.reserve(["address a", key]) <= 8.0
    assert len(throttle) <= 4


# -- the admin port: Admin.Users (qa14) -------------------------------------------------
# Every user who could log on could read /admin: a user entitled to nothing saw every
# client, user and subscription filter (entitlement filters included).


def test_the_admin_port_admits_only_admin_users(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users.txt")
    for name in ("ops", "bob"):
        users.add(name, PASSWORD)
    security = Security(Authentication([PasswordAuthenticator(users)], anonymous=False))

    def basic(user: str) -> dict:
        token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        return {"HTTP_AUTHORIZATION": f"Basic {token}", "REMOTE_ADDR": "10.0.0.1"}

    narrowed, everyone = BasicAuth(security, ["ops"]), BasicAuth(security)
    assert narrowed(basic("ops")) and not narrowed(basic("bob"))
    assert everyone(basic("bob"))  # without Admin.Users: as before
