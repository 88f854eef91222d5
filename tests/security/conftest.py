"""One Kafka broker with a SASL_SSL listener for the whole run, started as a user would:
`amps-kafka broker start --secure` on free ports, in a temporary data directory.

It is started by the first test that asks for `secured_kafka`, and only then: the tests
that need no secured broker (the gateway's, the unit tests) never wait for one.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from amps_on_kafka.broker.secure import SecureFiles
from amps_on_kafka.broker.testing import free_ports
from amps_on_kafka.cli import main
from amps_on_kafka.config.properties import read_properties_file
from amps_on_kafka.log.kafka import Bootstrap


@dataclass(frozen=True)
class SecuredKafka:
    bootstrap: Bootstrap  # the address, carrying the client properties
    properties_file: Path  # client.properties, as `broker start --secure` wrote it
    start_output: str  # what `broker start --secure` printed

    @property
    def password(self) -> str:
        return self.bootstrap.properties["sasl.password"]


def _port_pair() -> int:
    """A free port whose successor is free too: the broker's controller takes PORT+1."""
    while True:
        (port,) = free_ports(1)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    data_dir = tmp_path_factory.mktemp("secured-kafka")
    where = ["--secure", "--data-dir", str(data_dir)]
    runner = CliRunner()
    started = runner.invoke(main, ["broker", "start", *where, "--port", str(_port_pair())])
    try:
        assert started.exit_code == 0, started.output
        files = SecureFiles(data_dir)
        properties = read_properties_file(files.client_properties)
        address = properties.pop("bootstrap.servers")
        yield SecuredKafka(Bootstrap(address, properties), files.client_properties, started.output)
    finally:
        runner.invoke(main, ["broker", "stop", *where])
