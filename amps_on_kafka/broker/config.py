"""Configuration files of the local single-node KRaft broker.

The settings make one JVM act as both controller and broker, with every internal topic at
replication factor 1 and a single partition, small thread pools (the project runs on small
machines), no delay before the first consumer-group rebalance (tests would wait 3 s each),
and no auto-created topics: the project creates its topics explicitly, and a typo in a
topic name must fail rather than silently create a new log. Share groups (KIP-932) need no
setting: formatting with Kafka 4.3's default metadata version already sets share.version=1.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from pathlib import Path

_SINGLE_NODE = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",  # a worker's SessionTimeout may be 1 s
    "num.network.threads": "2",
    "num.io.threads": "2",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
}


def server_properties(
    host: str,
    port: int,
    controller_port: int,
    log_dir: Path,
    *,
    secure: Mapping[str, str] | None = None,
) -> str:
    """The ``server.properties`` text for a broker on ``host:port``.

    With ``secure`` (broker/secure.py's settings) the client listener, which the broker
    also uses to reach itself, is SASL_SSL instead of PLAINTEXT.
    """
    listener = "SASL_SSL" if secure is not None else "PLAINTEXT"
    props = {
        **_SINGLE_NODE,
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": listener,
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"{listener}://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"{listener}://{host}:{port}",
        "log.dirs": str(log_dir),
        **(secure or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in props.items())


def new_cluster_id() -> str:
    """A Kafka cluster id, made here instead of by ``StorageTool random-uuid``.

    It is the same thing Kafka's ``Uuid.randomUuid()`` prints (16 random bytes in URL-safe
    base64 without padding, never starting with ``-``) and saves a JVM start (~1 s).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
