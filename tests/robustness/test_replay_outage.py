"""Followers of the log whose Kafka goes away (docs/operations.md, A replay whose topic
or Kafka goes away). librdkafka retries for good, so a follower used to wait silently:
now one rides over an outage shorter than its limit, and one whose limit passes fails
with a TransportError naming Kafka's address. The test runs its own broker (the shared
one is never stopped)."""

from __future__ import annotations

import queue
import threading
import uuid

import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.errors import TransportError
from amps_on_kafka.log import replay_watch
from amps_on_kafka.log.message import COMPLETED
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.log.replay import Replay
from tests.conftest import create_topic


def test_a_follower_rides_over_a_short_outage_and_fails_after_its_limit(
    private_broker, monkeypatch
):
    monkeypatch.setattr(replay_watch, "CHECK_TIMEOUT", 1.0)  # unanswered sooner
    bootstrap = private_broker.start()
    topic = f"followed-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, TopicSpec(topic, 1))
    patient = Replay(bootstrap, topic, "0|1|")  # the default limit, 60 s
    impatient = Replay(bootstrap, topic, "0|1|", outage_limit=1.0)
    received: queue.Queue = queue.Queue()

    def follow() -> None:  # the patient replay polls through the outage, as a reader does
        try:
            received.put(next(item for item in patient if item is not COMPLETED))
        except Exception as exc:
            received.put(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        private_broker.stop()
        with pytest.raises(TransportError) as raised:
            for _ in impatient:
                pass
        assert f"Kafka at {bootstrap} has not answered for" in str(raised.value)
        assert "outages of up to 1 s" in str(raised.value)
        private_broker.start()
        with Client("after-the-outage") as client:
            client.connect(f"kafka://{bootstrap}")
            client.logon()
            client.publish(topic, {"id": 1})
            client.publish_flush(30)
        message = received.get(timeout=60)
        assert not isinstance(message, Exception), message
        assert message.data == {"id": 1}
    finally:
        follower.join(60)
        patient.close()
        impatient.close()
