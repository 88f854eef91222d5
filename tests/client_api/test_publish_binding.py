"""Client.publish binds its transport's publish on the instance at the first call
(docs/performance.md): closing unbinds it, and a client connected again publishes through
its new transport, on both transports."""

from __future__ import annotations

import uuid

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import TransportError


def test_publish_after_close_says_not_connected_and_a_reconnect_publishes_again(uri, topic_factory):
    topic = topic_factory(1, key=("/id",))
    client = Client(f"binding-{uuid.uuid4().hex[:8]}")
    try:
        client.connect(uri)
        client.logon(30)
        first = client.publish(topic, {"id": 1})
        client.publish_flush(30)
        client.close()
        with pytest.raises(TransportError, match="not connected"):
            client.publish(topic, {"id": 2})
        client.connect(uri)
        client.logon(30)
        second = client.publish(topic, {"id": 3})
        client.publish_flush(30)  # persisted through the new connection
        assert second > first
    finally:
        client.close()
