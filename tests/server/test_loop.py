"""The gateway's event loop (server/gateway.py new_loop): uvloop's, except with TLS or
AMPS_UVLOOP=0; a gateway serves alike on either."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import pytest
import uvloop

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.protocol.frames import encode_frame
from amps_on_kafka.server.gateway import (
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    KEEPALIVE_PROBES,
    Gateway,
    new_loop,
)
from tests.server.helpers import Wire
from tests.server.test_bounds import on_loop


def _kind(loop: asyncio.AbstractEventLoop) -> str:
    kind = "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"
    loop.close()
    return kind


def test_uvloop_serves_unless_tls_or_amps_uvloop_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMPS_UVLOOP", raising=False)
    assert _kind(new_loop(tls=False)) == "uvloop"
    assert _kind(new_loop(tls=True)) == "asyncio"  # uvloop's start_tls: MagicStack/uvloop#707
    monkeypatch.setenv("AMPS_UVLOOP", "0")
    assert _kind(new_loop(tls=False)) == "asyncio"


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_gateway_on_either_loop_answers_pipelined_commands_in_order(
    switch: str,
    bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    wire_to: Callable[[str], Wire],
) -> None:
    monkeypatch.setenv("AMPS_UVLOOP", switch)
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway:
        assert _running_kind(gateway) == ("uvloop" if switch == "1" else "asyncio")
        wire = wire_to(gateway.address)  # type: ignore[arg-type]
        assert wire.logon().header["status"] == "success"
        commands = [{"c": "heartbeat", "cid": str(n)} for n in range(200)]
        commands.insert(100, {"c": "no_such_command", "cid": "bad"})
        for header in commands:
            wire.send(header)
        replies = [wire.recv() for _ in commands]
        assert [reply.header["cid"] for reply in replies] == [h["cid"] for h in commands]
        assert "unknown command" in replies[100].header["reason"]


def _running_kind(gateway: Gateway) -> str:
    return "uvloop" if isinstance(gateway.loop, uvloop.Loop) else "asyncio"


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_client_that_does_not_read_is_paced_by_its_own_replies(
    switch: str,
    bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    wire_to: Callable[[str], Wire],
) -> None:
    """After each read's commands the session waits for their replies to drain before it
    reads more (it skips the wait only when nothing is queued): 30,000 pipelined heartbeats
    whose 1.8 MB of replies go unread leave at most one read's replies queued, well under
    MaxQueuedBytes (1 MiB here), so the client is paced, not cut, and all are answered."""
    monkeypatch.setenv("AMPS_UVLOOP", switch)
    engine, settings = SowEngine(Config(), {}, now_ms), GatewayConfig(MaxQueuedBytes=1 << 20)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings) as gateway:
        wire = wire_to(gateway.address)  # type: ignore[arg-type]
        wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # kernel holds little
        assert wire.logon().header["status"] == "success"
        on_loop(gateway, lambda: _small_send_buffers(gateway))
        count = 30_000
        frames = b"".join(encode_frame({"c": "heartbeat", "cid": str(n)}) for n in range(count))
        sender = threading.Thread(target=wire.sock.sendall, args=(frames,), daemon=True)
        sender.start()
        replies = [wire.recv() for _ in range(count)]
        sender.join(10)
        assert [reply.header["cid"] for reply in replies] == [str(n) for n in range(count)]
        assert gateway.stats.slow_consumers == 0


def _small_send_buffers(gateway: Gateway) -> None:
    for session in gateway._sessions:
        sock = session.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_client_socket_gets_tcp_keepalive_on_either_loop(
    switch: str,
    bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    wire_to: Callable[[str], Wire],
) -> None:
    """A quiet logged-on client whose host vanished is found by keepalive probes, not held
    with its MaxConnections slot for good (gateway.keep_alive)."""
    monkeypatch.setenv("AMPS_UVLOOP", switch)
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway:
        wire = wire_to(gateway.address)  # type: ignore[arg-type]
        assert wire.logon().header["status"] == "success"
        (session,) = gateway._sessions
        sock = session.writer.get_extra_info("socket")
        options = [
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE),
            (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES),
        ]
        for level, option, value in options:
            assert sock.getsockopt(level, option) == value
