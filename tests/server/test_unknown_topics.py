"""A client publishing through the gateway to topics that don't exist (log/registry.py):
each publish is refused naming its topic, the gateway's memory does not grow with the
names, and Kafka is asked at most once per TOPIC_LIST_INTERVAL however many names come."""

from __future__ import annotations

import time
import uuid

from amps_on_kafka.log import registry as registry_module
from tests.server.helpers import Wire


def test_a_flood_of_publishes_to_random_names_is_refused_within_bounds(
    bare_gateway, wire_to, monkeypatch
) -> None:
    monkeypatch.setattr(registry_module, "UNKNOWN_NAMES", 20)
    wire: Wire = wire_to(bare_gateway.address)
    wire.logon("flood")
    names = [f"nosuch-{uuid.uuid4().hex}" for _ in range(40)]
    began = time.monotonic()
    for n, name in enumerate(names):
        wire.send({"c": "publish", "cid": str(n), "t": name, "a": "processed"}, b'{"id": 1}')
    replies = {}
    while len(replies) < len(names):
        frame = wire.recv()
        replies[int(frame.header["cid"])] = frame.header
    elapsed = time.monotonic() - began
    for n, name in enumerate(names):
        assert replies[n]["status"] == "failure"
        assert f"topic '{name}' does not exist" in replies[n]["reason"]
    registry = bare_gateway.registry
    assert registry.unknown_names() == 20
    assert registry.looks.calls <= elapsed / registry_module.TOPIC_LIST_INTERVAL + 1
    assert registry.reads.calls <= registry.looks.calls
    assert wire.request({"c": "heartbeat", "cid": "alive"}).header["status"] == "success"
