"""Issue 13, defect 5: Kafka stopped and restarted under a publish storm through the gateway.

The test runs its own LocalBroker (the shared one is never stopped). A client publishes
as fast as the gateway lets it, each publish asking for a `persisted` ack; the broker is
stopped until publishes start failing, then started again. Afterwards:
- every publish got exactly one answer: a persisted ack, or a failure naming the cause
  (persisted: "Kafka did not acknowledge within 3s: ..."; processed, when the topic's
  partition count could not be read: "can't reach Kafka for metadata ..."); none was
  silently dropped;
- every publish acknowledged as persisted is in the topic, read back from Kafka;
- the worker's publishes in flight never exceeded its PublishBudget, and the budget is
  empty again once the storm is over (the memory of the outage is returned);
- another client's heartbeats were answered throughout: no publish asked Kafka for
  metadata on the event loop (that froze every client for 10 s once the partition count
  expired during an outage; its TTL is cut to 6 s here so that it expires).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable

import orjson

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log import publisher
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.processor.engine import SowEngine
from amps_on_kafka.processor.worker import now_ms
from amps_on_kafka.protocol.frames import BadFrame, FrameDecoder, encode_frame
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import create_topic
from tests.polling import until
from tests.server.helpers import Wire

TOPIC = "outage-storm"
TIMEOUT = 3.0  # the gateway's PublishTimeout
BUDGET = 300  # its MaxPublishesInFlight
WAIT = 120.0


class Storm:
    """One connection publishing without pause, and a reader collecting persisted acks."""

    def __init__(self, address: str, plain: bool = False, topic: str = TOPIC) -> None:
        host, _, port = address.rpartition(":")
        self.plain = plain  # plain publishes (no acks asked: the gateway's batch path)
        self.topic = topic
        self.state: Callable[[], str] = str  # what the gateway holds, said on a timeout
        self.sock = socket.create_connection((host, int(port)), timeout=WAIT)
        self.sent = 0
        self.acks: list[dict] = []
        self.persisted = 0  # successes among them, counted as they come: a wait's test
        # runs at every answer, with the reader held meanwhile, so it must not count them
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.flushed = threading.Event()
        self.gone: Exception | None = None  # what ended the reader, if anything did
        self._decoder = FrameDecoder(1 << 30)

    def run(self) -> None:
        self.sock.sendall(encode_frame({"c": "logon", "cid": "logon", "client_name": "storm"}))
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        while not self.stop.is_set():  # sendall blocks while the gateway holds us back
            burst = b"".join(self._publish(self.sent + n) for n in range(50))
            self.sock.sendall(burst)
            self.sent += 50
        self.sock.sendall(encode_frame({"c": "flush", "cid": "flush", "a": "processed"}))

    def _publish(self, number: int) -> bytes:
        header: dict = {"c": "publish", "t": self.topic, "s": number}
        if not self.plain:
            header = {"c": "publish", "cid": str(number), "t": self.topic, "a": "persisted"}
        return encode_frame(header, orjson.dumps({"id": number}))

    def _read(self) -> None:
        """Collect the answers until the gateway closes. A quiet socket is no failure:
        plain publishes are answered only when they fail, and the socket's timeout (for
        the sender's writes) would end this thread while the gateway still writes, so
        its writes would back up and it would stop reading the storm. A reader that dies
        says why in every timed-out wait (`gone`)."""
        try:
            while True:
                try:
                    data = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    return
                self._answers(data)
        except Exception as exc:
            self.gone = exc
            raise

    def _answers(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            assert not isinstance(frame, BadFrame)
            if frame.header.get("cid") == "flush":
                self.flushed.set()
            elif frame.header.get("a") == "persisted" or frame.header["status"] == "failure":
                with self.changed:
                    self.acks.append(frame.header)
                    self.persisted += frame.header["status"] == "success"
                    self.changed.notify_all()

    def wait_for(self, what: str, test) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: test(self.acks), WAIT), (
                f"no {what} in time: {self.sent} sent, {self.successes()} persisted, "
                f"{len(self.acks) - self.successes()} failed, the last answer {self.acks[-1:]}; "
                f"{self.said()}"
            )

    def said(self) -> str:
        """What a stalled storm's reader and gateway say."""
        reader = f"ended by {self.gone!r}" if self.gone else "reads"
        return f"the reader {reader}; {self.state()}"

    def successes(self) -> int:
        return self.persisted


def gateway_state(gateway: Gateway) -> str:
    """What a stalled storm needs to be explained: the budget, the producer's queue, the
    pump, and what the gateway's pool threads are doing."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    pool = [
        f"{names[ident]}: "
        + " < ".join(f"{f.name}:{f.lineno}" for f in reversed(traceback.extract_stack(frame)[-5:]))
        for ident, frame in sys._current_frames().items()
        if names.get(ident, "").startswith("amps-gateway-work")
    ]
    budget, pump = gateway.budget, gateway.pump
    return (
        f"budget {budget.commands} commands {budget.bytes} bytes, {len(budget._waiting)} "
        f"waiting; producer holds {len(gateway.producer)}, fatal {pump.fatal}; pump alive "
        f"{pump._thread.is_alive()}, {len(pump._outcomes)} outcomes to hand over; pool {pool}"
    )


def in_flight(gateway: Gateway) -> int:
    async def read() -> int:
        return gateway.budget.commands

    return asyncio.run_coroutine_threadsafe(read(), gateway.loop).result(10)


def heartbeats_during(address: str, seconds: float) -> list[float]:
    """Round trips of a bystander's heartbeats, one after another for `seconds`."""
    bystander = Wire(address)
    try:
        bystander.logon("bystander")
        latencies: list[float] = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.monotonic()
            bystander.request({"c": "heartbeat", "cid": str(started)})
            latencies.append(time.monotonic() - started)
        return latencies
    finally:
        bystander.close()


def test_a_broker_outage_under_a_publish_storm_loses_nothing_acknowledged(
    private_broker, monkeypatch
):
    broker = private_broker
    monkeypatch.setattr(publisher, "PARTITION_COUNT_TTL", 6.0)
    bootstrap = broker.start()
    create_topic(bootstrap, TopicSpec(TOPIC, 1, key=("/id",)))
    settings = GatewayConfig(publish_timeout=TIMEOUT, max_publishes_in_flight=BUDGET)
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings) as gateway:
        storm = Storm(gateway.address)  # type: ignore[arg-type]
        storm.state = lambda: gateway_state(gateway)
        sender = threading.Thread(target=storm.run, daemon=True)
        sender.start()
        storm.wait_for("publishes persisted", lambda acks: len(acks) >= 1000)

        broker.stop()
        before = storm.successes()
        storm.wait_for("failure", lambda acks: any(a["status"] == "failure" for a in acks))
        peak = max(in_flight(gateway) for _ in range(20))
        assert peak <= BUDGET
        latencies = heartbeats_during(gateway.address, 12.0)  # the counts expire meanwhile
        assert max(latencies) < 3.0, f"a client waited {max(latencies):.1f} s"
        broker.start()
        storm.wait_for("recovery", lambda acks: storm.successes() > before + 1000)

        storm.stop.set()
        assert storm.flushed.wait(WAIT), f"the flush was not answered: {storm.said()}"
        sender.join(WAIT)
        assert in_flight(gateway) == 0  # the outage's publishes are all accounted for

    answers = Counter(a["cid"] for a in storm.acks)
    assert sorted(int(cid) for cid in answers) == list(range(storm.sent)), "a publish got no ack"
    assert set(answers.values()) == {1}, "a publish was answered twice"
    failures = [a for a in storm.acks if a["status"] == "failure"]
    assert failures
    for failure in failures:
        expected = {
            "persisted": f"Kafka did not acknowledge within {TIMEOUT:g}s: ",
            "processed": f"can't reach Kafka for metadata of {TOPIC!r}",
        }[failure["a"]]
        assert failure["reason"].startswith(expected), failure
    persisted = {int(a["cid"]) for a in storm.acks if a["status"] == "success"}
    with Replay(bootstrap, TOPIC, "0", until="0|1|") as log:
        in_kafka = {orjson.loads(m.raw)["id"] for m in log if getattr(m, "raw", None)}
    assert persisted <= in_kafka, f"{len(persisted - in_kafka)} acknowledged publishes lost"


def test_a_broker_outage_under_plain_publishes_answers_each_one_not_written(private_broker):
    """The gateway's batch path (plain publishes, produced by the run and reported by the
    batch) through a broker stopped and started: every publish is in Kafka or answered
    with a failure naming the cause, once; the flush after is answered; nothing hangs."""
    broker = private_broker
    bootstrap = broker.start()
    create_topic(bootstrap, TopicSpec(TOPIC, 1, key=("/id",)))
    settings = GatewayConfig(publish_timeout=TIMEOUT, max_publishes_in_flight=BUDGET)
    engine = SowEngine(Config(), {}, now_ms)
    with Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings) as gateway:
        storm = Storm(gateway.address, plain=True)  # type: ignore[arg-type]
        storm.state = lambda: gateway_state(gateway)
        sender = threading.Thread(target=storm.run, daemon=True)
        sender.start()
        until(lambda: storm.sent >= 3000, "publishes sent", WAIT)
        broker.stop()
        storm.wait_for("failure", lambda acks: any(a["status"] == "failure" for a in acks))
        broker.start()
        storm.stop.set()
        assert storm.flushed.wait(WAIT), f"the flush was not answered: {storm.said()}"
        sender.join(WAIT)
        assert in_flight(gateway) == 0

    failed = Counter(a["s"] for a in storm.acks if a["status"] == "failure")
    assert failed and set(failed.values()) == {1}, "a publish was answered twice"
    for failure in storm.acks:
        assert failure["reason"].startswith(
            (
                f"Kafka did not acknowledge within {TIMEOUT:g}s: ",  # the batch's report
                "can't reach Kafka",  # the per-command path: the partition count
                "timed out reading the topic registry",  # ... and the topic's spec
            )
        ), failure
    with Replay(bootstrap, TOPIC, "0", until="0|1|") as log:
        in_kafka = {orjson.loads(m.raw)["id"] for m in log if getattr(m, "raw", None)}
    lost = set(range(storm.sent)) - in_kafka - set(failed)
    assert not lost, f"{len(lost)} publishes neither written nor answered"
