"""Fixtures for the client API tests: a connected client per transport.

`uri` is parametrized over kafka:// (the broker) and tcp:// (a bare gateway, which serves
log subscriptions and publishing without a SOW); tests that need a worker's SOW use
`served` from tests/server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from amps_on_kafka.client import Client
from tests.server.conftest import bare_gateway, served

__all__ = ["bare_gateway", "served"]


@pytest.fixture(params=["kafka", "tcp"])
def uri(request: pytest.FixtureRequest, bootstrap: str) -> str:
    """A URI of each transport: the broker itself, or a bare gateway over it."""
    if request.param == "kafka":
        return f"kafka://{bootstrap}"
    gateway = request.getfixturevalue("bare_gateway")
    return f"tcp://{gateway.address}/amps/json"


@pytest.fixture
def connect() -> Iterator[Callable[[str], Client]]:
    """``connect(uri)``: a logged-on Client, closed after the test."""
    opened: list[Client] = []

    def make(uri: str) -> Client:
        client = Client(f"api-{uuid.uuid4().hex[:8]}")
        client.connect(uri)
        client.logon(30)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll until `condition()` holds; fail after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s")
        time.sleep(0.02)
