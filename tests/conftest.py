"""Fixtures for the whole suite: one real Kafka broker per test run, and topics on it.

``bootstrap`` is started lazily, by the first test that asks for it, so tests that need no
Kafka (the filter language, config parsing) never wait for a broker.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.admin import AdminClient

from amps_on_kafka.broker.resolve import BOOTSTRAP_ENV
from amps_on_kafka.broker.testing import free_ports, kafka_for_tests

if TYPE_CHECKING:
    from amps_on_kafka.broker.local import LocalBroker

ADMIN_TIMEOUT = 30.0
_shared_broker = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``), start one broker in the controlling process and hand it
    to every test process through ``$KAFKA_BOOTSTRAP_SERVERS``, which they inherit: N brokers
    on a 2-core machine would cost more than the parallel run saves."""
    controller = not hasattr(config, "workerinput")
    parallel = bool(getattr(config.option, "numprocesses", None))
    if controller and parallel and not os.environ.get(BOOTSTRAP_ENV):
        os.environ[BOOTSTRAP_ENV] = _shared_broker.enter_context(kafka_for_tests())


def pytest_unconfigure(config: pytest.Config) -> None:
    _shared_broker.close()


def create_topic(bootstrap: str, spec: Any, retention: float | None = None) -> None:
    """Create one log topic the way the project does and register its spec.

    The single place tests create topics. amps_on_kafka.log is imported here, not at the
    top, so a test that needs no Kafka doesn't depend on it.
    """
    from amps_on_kafka.log.registry import TopicRegistry
    from amps_on_kafka.log.topics import create_log_topics

    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_log_topics(admin, TopicRegistry(bootstrap), [(spec, 1, retention)])


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete topics a test made, waiting for (but not failing on) each deletion."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics(names, operation_timeout=ADMIN_TIMEOUT)
    concurrent.futures.wait(futures.values(), timeout=ADMIN_TIMEOUT)


@pytest.fixture
def private_broker() -> Iterator[LocalBroker]:
    """A broker of the test's own, started, for a test that stops it: the shared one is
    never stopped. Stopped and its files removed when the test ends."""
    from amps_on_kafka.broker.local import LocalBroker

    data_dir = Path(tempfile.mkdtemp(prefix="amps-private-"))
    port, controller_port = free_ports(2)
    local = LocalBroker(data_dir, port=port, controller_port=controller_port)
    local.start()
    try:
        yield local
    finally:
        local.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """Bootstrap address of the run's broker (see amps_on_kafka.broker.testing for which)."""
    with kafka_for_tests() as address:
        yield address
        gc.collect()  # Kafka clients left in reference cycles go while their broker is up


@pytest.fixture
def client(bootstrap: str) -> Iterator[Any]:
    """A kafka:// Client connected to the run's broker and logged on, closed after."""
    from amps_on_kafka.client import Client

    with Client(f"test-{uuid.uuid4().hex[:8]}") as connected:
        connected.connect(f"kafka://{bootstrap}")
        connected.logon()
        yield connected


@pytest.fixture
def topic_factory(bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``topic_factory(partitions=1, *, name=None, retention=None, **spec) -> name``.

    Creates a log topic (``message.timestamp.type=LogAppendTime``) and registers its
    TopicSpec (``spec``: ``key=("/id",)``, ``message_type=``, ``schema=`` ...), waiting until
    Kafka has it. The default name starts with the test's name and is unique, so a broker
    shared by several runs stays readable. The topics are deleted when the test ends.
    """
    from amps_on_kafka.log.registry import TopicSpec

    prefix = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:180]
    created: list[str] = []

    def make(
        partitions: int = 1,
        *,
        name: str | None = None,
        retention: float | None = None,
        **spec: Any,
    ) -> str:
        name = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, TopicSpec(name, partitions, **spec), retention)
        created.append(name)
        return name

    yield make
    if created:
        delete_topics(bootstrap, created)
