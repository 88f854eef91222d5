"""The gateway's event loop (server/gateway.py new_loop): uvloop's, except with TLS or
AMPS_UVLOOP=0; a gateway serves alike on either."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable

import pytest
import uvloop

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.errors import PartitionsMoving
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
from amps_on_kafka.server.peers import PeerLink
from amps_on_kafka.server.session import Session
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


def test_writes_to_a_connection_reset_under_the_session_close_it_and_raise_nothing(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch, wire_to: Callable[[str], Wire]
) -> None:
    """uvloop closes a transport whose write found the connection reset, and raises
    RuntimeError for each write after, until the session's read loop has seen the reset
    and closed the session. Raised from Session.send_encoded, that ended the writer's task:
    the fan-out's job, whose other subscribers lost their frames of it. Here each of
    CLIENTS reset connections is written to once a turn of the loop until its session is
    closed, as the fan-out writes; without the fix one raised in every run tried."""
    monkeypatch.setenv("AMPS_UVLOOP", "1")
    engine = SowEngine(Config(), {}, now_ms)
    frame = encode_frame({"c": "publish", "t": "t", "sub_id": "1"}, b"{}")

    async def write_until_closed(session: Session) -> int:
        writes = 0
        while not session.closed and writes < 1000:
            session.send_encoded(frame, 1)
            writes += 1
            await asyncio.sleep(0)
        return writes

    with Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway:
        for _ in range(CLIENTS):
            wire = wire_to(gateway.address)  # type: ignore[arg-type]
            assert wire.logon().header["status"] == "success"
            (session,) = on_loop(gateway, gateway.sessions)  # type: ignore[misc]
            wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            wire.sock.close()  # a reset, not an orderly close
            future = asyncio.run_coroutine_threadsafe(write_until_closed(session), gateway.loop)
            assert future.result(10) < 1000
            assert on_loop(gateway, gateway.sessions) == []


CLIENTS = 20


def test_a_peer_link_reset_under_it_fails_its_send_with_retry() -> None:
    """A forwarded command's write to a peer whose connection was reset raised uvloop's
    RuntimeError, which from a client's command (a spread subscription's legs, a
    forwarded sow) closed that client's connection; it is PartitionsMoving, as a peer
    that went away is (retry:)."""

    async def run() -> None:
        async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        peer = await asyncio.start_server(reset, "127.0.0.1", 0)
        address = f"127.0.0.1:{peer.sockets[0].getsockname()[1]}"
        reader, writer = await asyncio.open_connection(*address.split(":"))
        writer.transport.pause_reading()  # the reset is found by the writes, not a read
        link = PeerLink(address, reader, writer)
        await asyncio.wait_for(peer_closed(link), 10)
        with pytest.raises(PartitionsMoving, match=r"^retry: partitions moving"):
            for _ in range(3):
                link.send({"c": "sow", "cid": "1", "t": "t"})
        link.close()
        peer.close()

    async def peer_closed(link: PeerLink) -> None:
        """Until a write finds the reset (uvloop then closes the transport)."""
        while not link.writer.is_closing():
            link.send({"c": "heartbeat", "cid": "probe"})
            await asyncio.sleep(0.01)

    uvloop.run(run())
