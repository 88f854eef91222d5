"""One real Kafka broker for a whole test session, wherever the tests run.

Order of preference (docs/operations.md, "Running Kafka"):

1. ``$KAFKA_BOOTSTRAP_SERVERS``: a broker someone already runs; used as is, never stopped.
2. A Docker engine that answers a ping: the official ``apache/kafka`` image in a container.
   testcontainers' ``KafkaContainer`` drives only Confluent ``cp-kafka`` images (it
   rewrites their start scripts), so the generic ``DockerContainer`` runs Apache's image
   with the same single-node settings as ``docker/compose.yml``.
3. Otherwise a ``LocalBroker`` in a temporary directory on free ports, removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from amps_on_kafka.broker.config import new_cluster_id
from amps_on_kafka.broker.errors import BrokerError
from amps_on_kafka.broker.jars import KAFKA_VERSION
from amps_on_kafka.broker.local import START_TIMEOUT, LocalBroker
from amps_on_kafka.broker.resolve import BOOTSTRAP_ENV
from amps_on_kafka.log.kafka import await_answer

KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"


@contextmanager
def kafka_for_tests(*, echo: Callable[[str], None] | None = None) -> Iterator[str]:
    """Yield the bootstrap address of a broker for this test session; clean up after."""
    from_env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    with ExitStack() as stack:
        if from_env:
            yield from_env
        elif docker_answers():
            yield stack.enter_context(_container())
        else:
            yield stack.enter_context(temporary_broker(echo=echo))


def docker_answers(timeout: float = 3.0) -> bool:
    """Whether a Docker engine answers a ping; a ``docker`` binary alone isn't enough."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` right now (all held open while chosen)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


@contextmanager
def temporary_broker(*, echo: Callable[[str], None] | None = None) -> Iterator[str]:
    """A LocalBroker in a fresh temporary directory on free ports, stopped and removed after."""
    data_dir = Path(tempfile.mkdtemp(prefix="amps-kafka-test-"))
    port, controller_port = free_ports(2)
    broker = LocalBroker(data_dir, port=port, controller_port=controller_port, echo=echo)
    try:
        yield broker.start()
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def _container() -> Iterator[str]:
    """Apache's Kafka image, listening on the same port inside and outside the container.

    Kafka must advertise the address clients use; binding host port N to container port N
    lets the advertised listener be set before the container starts.
    """
    from testcontainers.core.container import DockerContainer

    (port,) = free_ports(1)
    container = DockerContainer(KAFKA_IMAGE)
    host = container.get_docker_client().host()
    container.with_bind_ports(port, port)
    for key, value in container_env(host, port).items():
        container.with_env(key, value)
    with container:
        bootstrap = f"{host}:{port}"
        if not await_answer(bootstrap, START_TIMEOUT, alive=lambda: _running(container)):
            stdout, stderr = container.get_logs()
            tail = (stdout + stderr).decode(errors="replace")[-3000:]
            raise BrokerError(
                f"Kafka container {KAFKA_IMAGE} did not answer at {bootstrap}:\n{tail}"
            )
        yield bootstrap


def _running(container: Any) -> bool:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return wrapped.status == "running"


def container_env(host: str, port: int) -> dict[str, str]:
    """Environment of the apache/kafka image for one KRaft node advertising ``host:port``."""
    return {
        "CLUSTER_ID": new_cluster_id(),
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
