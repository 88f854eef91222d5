"""Fixtures for the log tests: a client connected to the session broker."""

import uuid

import pytest

from amps_on_kafka.client import Client


@pytest.fixture
def client(bootstrap):
    with Client(f"test-{uuid.uuid4().hex[:8]}") as connected:
        connected.connect(f"kafka://{bootstrap}")
        connected.logon()
        yield connected
