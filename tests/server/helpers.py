"""A raw protocol connection for tests: frames out, frames in, always with a timeout."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from amps_on_kafka.protocol.frames import BadFrame, Frame, FrameDecoder, encode_frame

WAIT = 15.0


class Wire:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT)
        self.decoder = FrameDecoder(1 << 30)
        self.frames: deque[Frame] = deque()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.sock.sendall(encode_frame(header, payload))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = WAIT) -> Frame:
        """The next frame; socket.timeout (an OSError) if none comes in time."""
        self.sock.settimeout(timeout)
        while not self.frames:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the gateway closed the connection")
            for event in self.decoder.feed(data):
                assert not isinstance(event, BadFrame), event
                self.frames.append(event)
        return self.frames.popleft()

    def until(self, done: Callable[[Frame], bool], timeout: float = WAIT) -> list[Frame]:
        """Frames up to and including the first for which `done` is true."""
        frames = [self.recv(timeout)]
        while not done(frames[-1]):
            frames.append(self.recv(timeout))
        return frames

    def request(self, header: dict[str, Any], payload: bytes = b"") -> Frame:
        """Send a command and return the first reply to its cid."""
        self.send(header, payload)
        return self.until(lambda f: f.header.get("cid") == header["cid"])[-1]

    def logon(self, name: str = "wire") -> Frame:
        return self.request({"c": "logon", "cid": "logon", "client_name": name})

    def is_closed(self, timeout: float = WAIT) -> bool:
        """Read (and drop) what is left until the gateway closes; False if it doesn't."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_ack(frame: Frame, ack_type: str) -> bool:
    return frame.header.get("c") == "ack" and frame.header.get("a") == ack_type
