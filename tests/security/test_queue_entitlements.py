"""A queue behind a secured gateway: a user whose Read grant on the queue carries an
entitlement filter is delivered only the messages it matches; the others stay for a
user who may read them all. (Which commands need Read on a queue is
test_gateway_authorize.py's; this is the delivery itself.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.queue_runtime import events_topic
from amps_on_kafka.processor.queues import QueueEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.security.policy import Security
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import delete_topics
from tests.security.gateway_fixtures import PASSWORDS, WAIT


@pytest.fixture
def queue_gateway(bootstrap: str, topic_factory, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(gateway address, queue name): a queue over a topic of its name; alice reads it
    through /desk = 'fx', bob reads and writes it whole."""
    queue = topic_factory(1)
    users = UsersFile(tmp_path / "users.txt")
    for name, password in PASSWORDS.items():
        users.add(name, password)
    config = Config.model_validate(
        {
            "Topics": [{"Name": queue, "Partitions": 1}],
            "Queues": [{"Name": queue}],
            "Authentication": {"UsersFile": str(users.path), "FailureDelay": "0s"},
            "Entitlements": {
                "Users": {
                    "alice": {"Read": [{"Topic": queue, "Filter": "/desk = 'fx'"}]},
                    "bob": {"Read": [queue], "Write": [queue]},
                }
            },
        }
    )
    engine = QueueEngine(config, bootstrap, tmp_path / "state")
    engine.start()
    try:
        engine.wait_ready(60)
        with Gateway(
            SowEngine(Config(), {}, now_ms),
            bootstrap,
            listen="127.0.0.1:0",
            queues=engine,
            security=Security.from_config(config),
        ) as gateway:
            yield gateway.address, queue
    finally:
        engine.stop()
        delete_topics(bootstrap, [events_topic(queue)])


def test_a_queue_delivers_a_user_only_the_messages_of_their_entitlement_filter(
    queue_gateway: tuple[str, str],
) -> None:
    address, queue = queue_gateway
    desks = ["rates", "fx", "rates", "fx"]  # in the queue's order: rates first
    with _client(address, "bob") as bob:
        for number, desk in enumerate(desks):
            bob.publish(queue, {"n": number, "desk": desk})
        bob.publish_flush(WAIT)
        with _client(address, "alice") as alice, alice.subscribe(queue) as stream:
            taken = [_take(stream) for _ in range(2)]
        assert [m["desk"] for m in taken] == ["fx", "fx"]  # the rates ahead of them skipped
        with bob.subscribe(queue) as stream:
            left = [_take(stream) for _ in range(2)]
        assert [m["n"] for m in left] == [0, 2]  # still there for bob


def _client(address: str, user: str) -> Client:
    client = Client(f"{user}-{uuid.uuid4().hex[:6]}")
    client.connect(f"tcp://{user}:{PASSWORDS[user]}@{address}/amps/json")
    client.logon(timeout=WAIT)
    return client


def _take(stream) -> dict:
    """The next message's data, acknowledged."""
    message = stream.next(timeout=WAIT)
    assert message is not None, "no message delivered"
    message.ack()
    return message.data
