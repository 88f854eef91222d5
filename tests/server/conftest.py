"""Gateways for the tests: over a bare engine (no SOW topic), over a running worker, or
over an engine whose store the test fills itself (`direct`, batches at chosen moments).

The worker fixture gives each test its own SOW topic (2 partitions, Key /id, expiration
enabled), its own consumer group and state directory, and a gateway on a free port.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson
import pytest

from amps_on_kafka.client import Client
from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.processor.engine import QueryResult, SowEngine
from amps_on_kafka.processor.worker import Worker, now_ms
from amps_on_kafka.server.gateway import Gateway
from amps_on_kafka.state.events import BatchApplied, Change, ChangeKind
from amps_on_kafka.state.record import SowRecord
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore, StateBatch
from tests.server.helpers import Wire


@dataclass
class Served:
    topic: str
    address: str
    worker: Worker
    gateway: Gateway

    @property
    def uri(self) -> str:
        return f"tcp://{self.address}/amps/json"


def sow_config(topic: str, partitions: int = 2, expiration: str = "enabled") -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": topic, "Partitions": partitions}],
            "SOW": [{"Topic": topic, "Key": "/id", "Expiration": expiration}],
        }
    )


@pytest.fixture
def bare_gateway(bootstrap: str) -> Iterator[Gateway]:
    """A gateway whose engine holds no SOW topic: protocol, publishing, log subscriptions."""
    with Gateway(SowEngine(Config(), {}, now_ms), bootstrap, listen="127.0.0.1:0") as gateway:
        yield gateway


@pytest.fixture
def served(bootstrap: str, topic_factory, tmp_path, request) -> Iterator[Served]:
    """A worker and its gateway; expiration enabled unless parametrized (indirect)."""
    topic = topic_factory(2, key=("/id",))
    config = sow_config(topic, expiration=getattr(request, "param", "enabled"))
    worker = Worker(config, bootstrap, tmp_path / "state", group_id=f"test-{uuid.uuid4().hex}")
    worker.start()
    try:
        worker.wait_ready(60)
        gateway = Gateway(worker.engine, bootstrap, listen="127.0.0.1:0")
        try:
            yield Served(topic, gateway.start(), worker, gateway)
        finally:
            gateway.stop()
    finally:
        worker.stop()


@pytest.fixture
def wire_to() -> Iterator[Callable[[str], Wire]]:
    """``wire_to(address)``: a raw connection, closed after the test."""
    opened: list[Wire] = []

    def connect(address: str) -> Wire:
        opened.append(Wire(address))
        return opened[-1]

    yield connect
    for wire in opened:
        wire.close()


@pytest.fixture
def client_to() -> Iterator[Callable[..., Client]]:
    """``client_to(address, name=None)``: a logged-on tcp:// Client, closed after the test."""
    opened: list[Client] = []

    def connect(address: str, name: str | None = None) -> Client:
        client = Client(name or f"test-{uuid.uuid4().hex[:8]}")
        client.connect(f"tcp://{address}/amps/json")
        client.logon()
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


TOPIC = "direct"


class SteppedEngine(SowEngine):
    """A real engine whose queries can run test code just before and after the snapshot."""

    before_snapshot: Callable[[], None] = staticmethod(lambda: None)
    after_snapshot: Callable[[], None] = staticmethod(lambda: None)

    def query(self, *args, **kwargs) -> QueryResult:
        self.before_snapshot()
        result = super().query(*args, **kwargs)
        self.after_snapshot()
        return result


class Direct:
    """Applies upserts and removals to the store and tells the engine, like the worker."""

    def __init__(self, engine: SowEngine, store: PartitionStore) -> None:
        self.engine = engine
        self.store = store
        self.offset = 0

    def upsert(self, **docs: dict) -> None:
        self._apply({key: doc for key, doc in docs.items()}, ChangeKind.UPSERT)

    def remove(self, kind: ChangeKind, *keys: str) -> None:
        self._apply(dict.fromkeys(keys), kind)

    def _apply(self, docs: dict[str, dict | None], kind: ChangeKind) -> None:
        batch, changes = StateBatch(self.store), []
        for key, doc in docs.items():
            old = batch.get(key)
            new = None if doc is None else self._record(key, doc)
            batch.set(key, new)
            changes.append(Change(TOPIC, key, kind, old, new))
        with self.engine.lock:
            self.store.write(batch)
            self.engine.notify(BatchApplied(changes, []))

    def _record(self, key: str, doc: dict) -> SowRecord:
        self.offset += 1
        return SowRecord(TOPIC, 0, key, orjson.dumps(doc), self.offset, now_ms(), codec=JSON)


def fanned_out(gateway: Gateway, timeout: float = 30.0) -> None:
    """Wait until the gateway has written the frames of every batch applied so far: its
    subscriptions filter on the gateway's pool (server/fanout.py), so no reply to another
    command is a fence for them."""
    deadline = time.monotonic() + timeout
    while gateway.fanout.delivered < gateway.fanout.batches:
        assert time.monotonic() < deadline, "the fan-out did not catch up"
        time.sleep(0.01)


@pytest.fixture
def direct(bootstrap, tmp_path, request) -> Iterator[tuple[Direct, Gateway]]:
    """A gateway over a store the test fills; its Gateway settings parametrizable
    (indirect), else a 1 MiB MaxQueuedBytes."""
    config = Config.model_validate(
        {
            "Topics": [{"Name": TOPIC}],
            "SOW": [{"Topic": TOPIC, "Key": "/id", "Expiration": "enabled"}],
        }
    )
    engine = SteppedEngine(config, {TOPIC: SowRules(config.sow[0], JSON)}, now_ms)
    store = PartitionStore(tmp_path / "store", TOPIC, 0, JSON)
    engine.attach(store)
    settings = getattr(request, "param", GatewayConfig(max_queued_bytes=1024 * 1024))
    gateway = Gateway(engine, bootstrap, listen="127.0.0.1:0", settings=settings)
    gateway.start()
    yield Direct(engine, store), gateway
    gateway.stop()
    engine.detach(TOPIC, 0)
    store.close()
