"""The gateway on uvloop's loop (server/gateway.py new_loop) under many idle connections
and connections cut mid-frame by a reset: every one is held, the loop keeps serving, and
each cut connection's session goes (none left behind on either loop)."""

from __future__ import annotations

import socket
import struct

import pytest

from amps_on_kafka.config import Config
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.protocol.frames import encode_frame
from amps_on_kafka.server.gateway import Gateway
from tests.polling import until
from tests.server.helpers import Wire
from tests.server.test_loop import _running_kind

IDLE = 500


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a killed peer's kernel may."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("switch", ["1", "0"])
def test_many_idle_and_reset_connections_leave_no_sessions(
    switch: str, bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPS_UVLOOP", switch)
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0") as gateway:
        assert _running_kind(gateway) == ("uvloop" if switch == "1" else "asyncio")
        host, _, port = gateway.address.rpartition(":")  # type: ignore[union-attr]
        idle = [socket.create_connection((host, int(port))) for _ in range(IDLE)]
        half = encode_frame({"c": "logon", "cid": "1", "client_name": "x"})[:-3]
        for sock in idle[::2]:
            sock.sendall(half)  # half a frame, then nothing
        until(lambda: gateway.session_count == IDLE, "every idle connection a session")
        wire = Wire(gateway.address)  # type: ignore[arg-type]
        assert wire.logon("served").header["status"] == "success"
        assert wire.request({"c": "heartbeat", "cid": "h"}).header["status"] == "success"
        for sock in idle:
            _reset(sock)
        until(lambda: gateway.session_count == 1, "only wire's session left")
        wire.close()
        until(lambda: gateway.session_count == 0, "no session left")
