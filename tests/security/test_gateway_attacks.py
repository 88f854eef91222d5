"""The secured gateway, tried as an attacker would (issue 14): every privileged action
without credentials, with wrong ones, under another user's identity and outside one's
entitlements is refused with a clear reason; what a user is entitled to works over TLS.

One worker and gateway serve the whole module (tests/security/gateway_fixtures.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from itertools import takewhile

import orjson
import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import ServerError, TransportError
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.security.policy import PeerAccess
from amps_on_kafka.security.users import PEER_USER
from amps_on_kafka.server.peers import PeerLink
from tests.client_tcp.test_reader_baton import callers_beside_a_flood
from tests.polling import until
from tests.security.gateway_fixtures import (
    FAILURE_DELAY,
    PASSWORDS,
    PEER_SECRET,
    WAIT,
    Secured,
    TlsWire,
    secured,
)
from tests.server.helpers import is_ack

__all__ = ["secured"]  # the module's fixture

PRIVILEGED = [
    {"c": "publish", "t": "{orders}"},
    {"c": "delta_publish", "t": "{orders}"},
    {"c": "sow_delete", "t": "{orders}", "f": "1=1"},
    {"c": "sow", "t": "{orders}"},
    {"c": "subscribe", "t": "{orders}"},
    {"c": "sow_and_subscribe", "t": "{orders}"},
    {"c": "subscribe", "t": "{orders}", "bm": "0"},
    {"c": "flush"},
    {"c": "unsubscribe", "sub_id": "all"},
]


def _command(template: dict, secured: Secured, cid: str) -> dict:
    header = {k: v.format(orders=secured.orders) for k, v in template.items()}
    return {**header, "cid": cid, "a": "processed"}


def _failure(reply) -> str:
    header = reply if isinstance(reply, dict) else reply.header
    assert header["status"] == "failure", header
    return header["reason"]


def test_plain_tcp_to_the_tls_port_gets_nowhere(secured: Secured) -> None:
    with pytest.raises(TransportError, match=r"gateway with TLS tcps://"), Client("p") as client:
        client.connect(f"tcp://{secured.address}/amps/json")
        client.logon(timeout=5)


def test_a_gateway_certificate_from_an_unknown_ca_is_refused(secured: Secured) -> None:
    with pytest.raises(TransportError, match="certificate verify failed"), Client("c") as client:
        client.connect(secured.uri("alice", ca=False))  # the system's CAs don't know it


def test_every_command_before_a_logon_is_refused(secured: Secured) -> None:
    with secured.wire() as wire:
        for number, template in enumerate(PRIVILEGED):
            reply = wire.request(_command(template, secured, str(number)))
            assert "log on first" in _failure(reply)


def test_a_logon_without_credentials_is_refused_and_audited(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    with secured.wire() as wire:
        with caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"):
            reply = wire.request({"c": "logon", "cid": "1", "client_name": "nobody"})
        assert "authentication required" in _failure(reply)
        assert any("logon failed" in r.getMessage() for r in caplog.records)
        assert "log on first" in _failure(wire.request(_command(PRIVILEGED[0], secured, "2")))


def test_wrong_passwords_are_refused_alike_and_slowed_down(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    wire = secured.wire()
    user = "bob"
    try:
        with caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"):
            wrong = wire.logon_as(user, "guesser", "guess-1")
            started = time.monotonic()
            unknown = wire.logon_as(f"nobody-{uuid.uuid4().hex[:6]}", "guesser", "guess-2")
            wrong_again = wire.logon_as(user, "guesser", "guess-3")
            waited = time.monotonic() - started
        for reply in (wrong, unknown, wrong_again):
            assert reply["status"] == "failure"
            assert reply["reason"] == "wrong user_id or password"  # not which of the two
        # the address failed before each later attempt: each waited at least FailureDelay
        assert waited >= 2 * FAILURE_DELAY
        failed = [r.getMessage() for r in caplog.records if "logon failed" in r.getMessage()]
        assert len(failed) == 3 and "guess" not in " ".join(failed)  # no password logged
        time.sleep(1.0)  # MaxFailureDelay: the next module test starts unthrottled
        assert wire.logon_as(user, "guesser", PASSWORDS[user])["status"] == "success"
    finally:
        wire.close()


def test_a_client_certificate_is_an_identity_and_a_foreign_one_is_refused(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    with secured.wire(cert="carol") as wire:
        assert (
            wire.request({"c": "logon", "cid": "1", "client_name": "c1"}).header["user_id"]
            == "carol"
        )
    with secured.wire(cert="carol") as wire:
        reply = wire.logon_as("alice", "c2")  # a certificate's holder can't claim another
        assert "not the client certificate's subject" in _failure(reply)
    with pytest.raises(OSError):  # signed by a CA the gateway does not trust
        secured.wire(cert="mallory").logon_as("carol", "m")
    refused = "the gateway did not accept the client certificate .*mallory.pem"
    with (
        caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"),
        pytest.raises(TransportError, match=refused),
        Client("m") as client,
    ):
        client.connect(secured.uri(cert="mallory"))  # the client says why it was closed
        client.logon(timeout=5)
    handshakes = [m for r in caplog.records if "TLS handshake failed" in (m := r.getMessage())]
    assert handshakes and "certificate verify failed" in handshakes[-1]  # the gateway's side


def test_a_gateway_requiring_client_certificates_admits_only_their_holders(
    secured: Secured, bootstrap: str
) -> None:
    """RequireClientCertificate: true: no certificate, no connection, even with a good
    password (and the client says a certificate may be wanted); a certificate the CA
    signed logs on as its CN."""
    tls = secured.gateway.settings.tls
    assert tls is not None
    required = tls.model_copy(update={"require_client_certificate": True})
    with secured.gateway_with(bootstrap, tls=required) as (_, address):
        uri = f"tcps://alice:{PASSWORDS['alice']}@{address}/amps/json?ca={secured.certs}/ca.pem"
        wanted = "may require a client certificate"
        with pytest.raises(TransportError, match=wanted), Client("no-cert") as client:
            client.connect(uri)
            client.logon(timeout=5)
        with TlsWire(address, secured.certs, "carol") as wire:
            logon = wire.request({"c": "logon", "cid": "1", "client_name": "required"})
            assert logon.header["user_id"] == "carol"


def test_a_connection_that_never_ends_its_tls_handshake_is_closed_and_audited(
    secured: Secured, bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handshake must end within ReadTimeout: a connection that sends nothing is closed
    after it, and the refusal is an audit event."""
    with secured.gateway_with(bootstrap, read_timeout=0.3) as (_, address):
        host, _, port = address.rpartition(":")
        with (
            caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"),
            socket.create_connection((host, int(port)), timeout=WAIT) as silent,
        ):
            assert silent.recv(1) == b""  # closed by the gateway, not by this side

            def audited() -> list[str]:  # the close can reach us before the audit line
                messages = (r.getMessage() for r in caplog.records)
                return [m for m in messages if "TLS handshake failed" in m]

            until(audited, "the refused handshake audited", WAIT, 0.01)
        assert "taking longer than 0.3 seconds" in audited()[-1]


def test_tls_handshakes_in_progress_count_against_max_connections(
    secured: Secured, bootstrap: str
) -> None:
    """Connections that never end their handshake hold sockets for up to ReadTimeout:
    with MaxConnections of them open, one more is refused at once, and once they are
    gone a client is served again."""
    with secured.gateway_with(bootstrap, max_connections=2) as (gateway, address):
        host, _, port = address.rpartition(":")
        silent = [socket.create_connection((host, int(port)), timeout=WAIT) for _ in range(2)]
        until(lambda: gateway._handshakes == 2, "two handshakes held", WAIT, 0.01)
        with socket.create_connection((host, int(port)), timeout=WAIT) as one_more:
            assert b"too many connections" in one_more.recv(4096)
        for sock in silent:
            sock.close()
        until(lambda: gateway._handshakes == 0, "the handshakes let go", WAIT, 0.01)
        with TlsWire(address, secured.certs, "carol") as wire:
            logon = wire.request({"c": "logon", "cid": "1", "client_name": "after-the-flood"})
            assert logon.header["status"] == "success"


def test_a_client_name_is_taken_over_only_by_its_own_user(secured: Secured) -> None:
    name = f"pricer-{uuid.uuid4().hex[:6]}"
    bob, alice, bob_again = secured.wire(), secured.wire(), secured.wire()
    try:
        assert bob.logon_as("bob", name, PASSWORDS["bob"])["status"] == "success"
        reply = alice.logon_as("alice", name, PASSWORDS["alice"])
        assert "logged on as another user" in reply["reason"]
        assert bob.request({"c": "heartbeat", "cid": "h"}).header["status"] == "success"
        assert "must not contain ':'" in alice.logon_as("alice", f"bob:{name}", "x")["reason"]
        assert bob_again.logon_as("bob", name, PASSWORDS["bob"])["status"] == "success"
        assert bob.is_closed()  # the same user's new logon replaced the old connection
    finally:
        for wire in (bob, alice, bob_again):
            wire.close()


def test_a_publisher_id_is_bound_to_its_user(secured: Secured, bootstrap: str) -> None:
    """alice publishing as client `pricer-1` is `alice:pricer-1` in the log: nobody else
    can publish under her id or push her sequence numbers."""
    with Client("pricer-1") as client:
        client.connect(secured.uri("alice"))
        client.logon(timeout=10)
        client.publish(secured.orders, {"id": "bound", "desk": "fx"}, sequence=10**15)
        client.publish_flush(10)
    replay = Replay(bootstrap, secured.orders, "0", max_idle=30)
    try:
        ids = {m.envelope.publisher_id for m in takewhile(lambda m: m is not COMPLETED, replay)}
    finally:
        replay.close()
    assert "alice:pricer-1" in ids and "pricer-1" not in ids


def test_commands_outside_ones_entitlements_are_denied_and_audited(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    bob, alice = secured.wire(), secured.wire()
    try:
        bob.logon_as("bob", "bob-denied", PASSWORDS["bob"])
        alice.logon_as("alice", "alice-denied", PASSWORDS["alice"])
        with caplog.at_level(logging.WARNING, logger="amps_on_kafka.audit"):
            for number, command in enumerate(("publish", "delta_publish", "sow_delete")):
                header = {"c": command, "t": secured.orders, "cid": str(number), "a": "processed"}
                if command == "sow_delete":
                    header["f"] = "1=1"
                reason = _failure(bob.request(header, b'{"id": "x"}'))
                where = "from" if command == "sow_delete" else "to"
                assert reason == (
                    f"not entitled: user 'bob' may not {command} {where} {secured.orders!r}"
                )
            for number, template in enumerate(PRIVILEGED[3:7]):
                header = _command(template, secured, f"r{number}")
                header["t"] = secured.secret
                reason = _failure(alice.request(header))
                assert reason == (
                    f"not entitled: user 'alice' may not {header['c']} {secured.secret!r}"
                )
        denied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("denied")]
        assert len(denied) == 7
    finally:
        bob.close()
        alice.close()


def test_entitled_users_work_over_tls_and_see_only_their_records(secured: Secured) -> None:
    ids = [f"e-{uuid.uuid4().hex[:6]}-{n}" for n in range(3)]
    with Client("carol-app") as carol:
        carol.connect(secured.uri(cert="carol"))
        carol.logon(timeout=10)
        carol.publish(secured.secret, {"note": "carol only"})
        for record_id, desk in zip(ids, ("fx", "rates", "fx"), strict=True):
            carol.publish(secured.orders, {"id": record_id, "desk": desk, "qty": 1})
        carol.publish_flush(10)
        _until_in_sow(carol, secured.orders, ids)
    with Client("alice-app") as alice:
        alice.connect(secured.uri("alice"))
        alice.logon(timeout=10)
        seen = {m.data["id"] for m in alice.sow(secured.orders, timeout=10)}
        assert ids[0] in seen and ids[2] in seen and ids[1] not in seen
        own = {m.data["id"] for m in alice.sow(secured.orders, f"/id = '{ids[0]}'", timeout=10)}
        assert own == {ids[0]}  # her filter AND the entitlement filter
        # a key look-up (served on the gateway's loop when unrestricted) of a rates record
        assert not list(alice.sow(secured.orders, f"/id = '{ids[1]}'", timeout=10))
        with pytest.raises(ServerError, match="position"):  # her own filter's error
            list(alice.sow(secured.orders, "/id = = 1", timeout=10))
    with Client("bob-app") as bob:
        bob.connect(secured.uri("bob"))
        bob.logon(timeout=10)
        assert set(ids) <= {m.data["id"] for m in bob.sow(secured.orders, timeout=10)}
        [rates] = bob.sow(secured.orders, f"/id = '{ids[1]}'", timeout=10)
        assert rates.data["desk"] == "rates"


def test_a_live_subscription_delivers_only_entitled_records(secured: Secured) -> None:
    """A record published outside alice's entitled set never reaches her subscription:
    the rates record published first, the fx one after it, and she gets the fx one."""
    marker = uuid.uuid4().hex[:6]
    with Client("alice-live") as alice, Client("carol-live") as carol:
        alice.connect(secured.uri("alice"))
        alice.logon(timeout=10)
        carol.connect(secured.uri(cert="carol"))
        carol.logon(timeout=10)
        with alice.subscribe(secured.orders, f"/id LIKE '{marker}'") as stream:
            for desk in ("rates", "fx"):
                carol.publish(secured.orders, {"id": f"l-{marker}-{desk}", "desk": desk})
            carol.publish_flush(10)
            first = stream.next(timeout=WAIT)
            assert first is not None and first.data["desk"] == "fx"


def test_callers_and_a_subscription_flood_share_one_tls_connection(secured: Secured) -> None:
    """The reader baton over TLS (client/tcp_reader.py): callers read their own replies
    through the connection's TLS state while its subscription takes a flood."""
    suffix = uuid.uuid4().hex[:6]
    with Client(f"carol-callers-{suffix}") as client, Client(f"carol-flood-{suffix}") as flooder:
        for each in (client, flooder):
            each.connect(secured.uri(cert="carol"))
            each.logon(timeout=10)
        callers_beside_a_flood(client, flooder, secured.orders)


def test_a_replay_shows_only_entitled_records(secured: Secured) -> None:
    marker = uuid.uuid4().hex[:6]
    with Client("carol-replay") as carol:
        carol.connect(secured.uri(cert="carol"))
        carol.logon(timeout=10)
        for desk in ("rates", "fx"):
            carol.publish(secured.orders, {"id": f"r-{marker}-{desk}", "desk": desk})
        carol.publish_flush(10)
    with secured.wire() as wire:
        wire.logon_as("alice", "alice-replay", PASSWORDS["alice"])
        wire.send(
            {
                "c": "subscribe",
                "t": secured.orders,
                "bm": "0",
                "sub_id": "r",
                "cid": "r",
                "a": "completed",
                "f": f"/id LIKE '{marker}'",
            }
        )
        frames = wire.until(lambda f: is_ack(f, "completed"))
        desks = [orjson.loads(f.payload)["desk"] for f in frames if f.header["c"] == "publish"]
        assert desks == ["fx"]


def test_a_record_leaving_the_entitled_set_is_an_oof_with_reason_entitlement(
    secured: Secured,
) -> None:
    record_id = f"o-{uuid.uuid4().hex[:6]}"
    with secured.wire() as wire:
        wire.logon_as("alice", "alice-oof", PASSWORDS["alice"])
        wire.request(
            {
                "c": "subscribe",
                "t": secured.orders,
                "sub_id": "s",
                "cid": "s",
                "o": "oof",
                "a": "processed",
                "f": f"/id = '{record_id}'",
            }
        )
        with Client("carol-oof") as carol:
            carol.connect(secured.uri(cert="carol"))
            carol.logon(timeout=10)
            carol.publish(secured.orders, {"id": record_id, "desk": "fx", "qty": 1})
            carol.publish_flush(10)
            first = wire.until(lambda f: f.header.get("c") == "publish")[-1]
            assert orjson.loads(first.payload)["qty"] == 1
            carol.publish(secured.orders, {"id": record_id, "desk": "rates", "qty": 2})
            carol.publish_flush(10)
        oof = wire.until(lambda f: f.header.get("c") in ("oof", "publish"))[-1]
        assert oof.header["c"] == "oof" and oof.header["reason"] == "entitlement"
        assert orjson.loads(oof.payload)["qty"] == 1  # the record she saw, not the new one


def test_gateways_of_a_group_log_on_to_each_other_with_their_secret(secured: Secured) -> None:
    """What server/peers.py forwards to a peer: over TLS, with PeerSecret; a wrong
    secret, or none, is refused like any logon."""

    async def peer_logon(secret: str | None) -> None:
        access = PeerAccess.of(secured.gateway.settings.tls, secret)
        link = await PeerLink.open(secured.address, access)
        link.close()

    asyncio.run(peer_logon(PEER_SECRET))
    with pytest.raises(ServerError, match="wrong user_id or password"):
        asyncio.run(peer_logon("a guess of sixteen chars"))
    with pytest.raises(ServerError, match="authentication required"):
        asyncio.run(peer_logon(None))
    time.sleep(1.0)  # MaxFailureDelay: the next module test starts unthrottled


def test_only_a_peer_may_ask_for_a_sow_deletes_results(secured: Secured) -> None:
    """`_results` (server/cluster.py) asks a gateway for another publisher's sow_delete
    counts and holds a watch per sequence named: a user's session is refused it, a peer's
    (logged on with the PeerSecret) is not."""
    asked = {"p": "alice:victim", "s": list(range(1000))}
    header = {"c": "sow_delete", "t": secured.orders, "cid": "r", "a": "processed"}
    header["f"] = "/id = 'no such id'"  # alice may delete by filter only
    alice, peer = secured.wire(), secured.wire()
    try:
        alice.logon_as("alice", "alice-results", PASSWORDS["alice"])
        reason = _failure(alice.request({**header, "_results": asked}))
        assert reason == "'_results' is for the gateways of one group only"
        peer.logon_as(PEER_USER, f"_peer-{uuid.uuid4().hex}", PEER_SECRET)
        reply = peer.request({**header, "_results": asked}).header
        assert reply.get("reason") != reason, reply
    finally:
        alice.close()
        peer.close()


def _until_in_sow(client: Client, topic: str, ids: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(ids) <= {m.data["id"] for m in client.sow(topic, timeout=10)}:
            return
        time.sleep(0.1)
    raise AssertionError(f"{ids} not in the SOW of {topic} after {timeout}s")


def test_a_sow_delete_reaches_only_the_records_the_user_may_see(secured: Secured) -> None:
    """alice sees the fx desk of orders and may write it: a delete by filter `1=1`-style
    took the rates desk's records too, and its count told her they existed."""
    marker = uuid.uuid4().hex[:6]
    ids = {desk: f"d-{marker}-{desk}" for desk in ("fx", "rates")}
    with Client("carol-delete") as carol:
        carol.connect(secured.uri(cert="carol"))
        carol.logon(timeout=10)
        for desk, record_id in ids.items():
            carol.publish(secured.orders, {"id": record_id, "desk": desk})
        carol.publish_flush(10)
        _until_in_sow(carol, secured.orders, list(ids.values()))
        with Client("alice-delete") as alice:
            alice.connect(secured.uri("alice"))
            alice.logon(timeout=10)
            with pytest.raises(ServerError, match="by filter only"):
                alice.sow_delete(secured.orders, keys=["anything"])
            ack = alice.sow_delete(secured.orders, f"/id LIKE '{marker}'")
            assert ack.matches == 1
        left = {m.data["id"] for m in carol.sow(secured.orders, f"/id LIKE '{marker}'")}
        assert left == {ids["rates"]}
