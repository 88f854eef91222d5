"""A secured gateway for the gateway-security tests, shared by each test module.

One worker and gateway per module (they take seconds to start): TLS with a test CA,
a users file (alice, bob), client certificates (carol: CN carol; mallory: signed by a
CA the gateway does not trust), and entitlements:
- alice reads `orders` through the entitlement filter /desk = 'fx' and writes it;
- bob reads `orders` whole and writes nothing;
- carol (certificate) reads and writes `orders` and `secret`.
Tests connect with `tcps://` URIs built by `Secured.uri`, or raw frames over TLS (TlsWire).
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from amps_on_kafka.broker.certs import issue, make_ca, write_pem
from amps_on_kafka.config import Config
from amps_on_kafka.log.registry import TopicSpec
from amps_on_kafka.processor.worker import Worker
from amps_on_kafka.security.policy import Security
from amps_on_kafka.security.users import UsersFile
from amps_on_kafka.server.gateway import Gateway
from tests.conftest import create_topic, delete_topics
from tests.server.helpers import WAIT, Wire

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
PEER_SECRET = "the group's own secret"
FAILURE_DELAY = 0.2


@dataclass
class Secured:
    address: str
    orders: str  # a SOW topic (Key /id)
    secret: str  # a log topic only carol may use
    certs: Path
    gateway: Gateway
    worker: Worker

    def uri(self, user: str | None = None, *, cert: str | None = None, ca: bool = True) -> str:
        """tcps:// for `user` (with its password), or for a client certificate `cert`."""
        who = f"{user}:{PASSWORDS[user]}@" if user in PASSWORDS else f"{user}@" if user else ""
        query = [f"ca={self.certs / 'ca.pem'}"] if ca else []
        if cert is not None:
            query += [f"cert={self.certs / f'{cert}.pem'}", f"key={self.certs / f'{cert}.key'}"]
        return f"tcps://{who}{self.address}/amps/json?{'&'.join(query)}"

    def wire(self, cert: str | None = None) -> TlsWire:
        return TlsWire(self.address, self.certs, cert)

    @contextmanager
    def gateway_with(self, bootstrap: str, **updates: Any) -> Iterator[tuple[Gateway, str]]:
        """Another gateway over the same worker and security, its settings changed by
        `updates` (GatewayConfig fields): started, with its address; stopped at the end."""
        gateway = Gateway(
            self.worker.engine,
            bootstrap,
            listen="127.0.0.1:0",
            settings=self.gateway.settings.model_copy(update=updates),
            security=self.gateway.security,
        )
        address = gateway.start()
        try:
            yield gateway, address
        finally:
            gateway.stop()


class TlsWire(Wire):
    """tests/server/helpers.Wire over TLS (one thread: an ssl.SSLSocket is fine here)."""

    def __init__(self, address: str, certs: Path, cert: str | None = None) -> None:
        super().__init__(address)
        context = ssl.create_default_context(cafile=certs / "ca.pem")
        if cert is not None:
            context.load_cert_chain(certs / f"{cert}.pem", certs / f"{cert}.key")
        self.sock = context.wrap_socket(self.sock, server_hostname="127.0.0.1")

    def logon_as(self, user: str, name: str, password: str | None = None) -> dict:
        header = {"c": "logon", "cid": "logon", "client_name": name, "user_id": user}
        if password is not None:
            header["pw"] = password
        return self.request(header).header


def make_certs(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("gateway test CA")
    write_pem(ca, directory / "ca.pem")
    server = issue(ca, "localhost", dns=["localhost"], ips=["127.0.0.1"])
    write_pem(server, directory / "gateway.pem", directory / "gateway.key")
    write_pem(issue(ca, "carol", client=True), directory / "carol.pem", directory / "carol.key")
    stranger = make_ca("a CA the gateway does not trust")
    write_pem(
        issue(stranger, "carol", client=True), directory / "mallory.pem", directory / "mallory.key"
    )
    return directory


def secured_config(orders: str, secret: str, certs: Path, users: Path) -> Config:
    return Config.model_validate(
        {
            "Topics": [{"Name": orders, "Partitions": 1}, {"Name": secret, "Partitions": 1}],
            "SOW": [{"Topic": orders, "Key": "/id"}],
            "Gateway": {
                "Listen": "127.0.0.1:0",
                "TLS": {
                    "Certificate": str(certs / "gateway.pem"),
                    "Key": str(certs / "gateway.key"),
                    "CA": str(certs / "ca.pem"),
                },
            },
            "Authentication": {
                "UsersFile": str(users),
                "ClientCertificate": True,
                "FailureDelay": f"{int(FAILURE_DELAY * 1000)}ms",
                "MaxFailureDelay": "1s",
                "PeerSecret": PEER_SECRET,
            },
            "Entitlements": {
                "Roles": {"desk-fx": {"Read": [{"Topic": orders, "Filter": "/desk = 'fx'"}]}},
                "Users": {
                    "alice": {"Roles": ["desk-fx"], "Write": [orders]},
                    "bob": {"Read": [orders]},
                    "carol": {"Read": [orders, secret], "Write": [f"{secret[:-8]}.*", orders]},
                },
            },
        }
    )


@pytest.fixture(scope="module")
def secured(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    certs = make_certs(base / "certs")
    users = UsersFile(base / "users.txt")
    for name, password in PASSWORDS.items():
        users.add(name, password)
    suffix = uuid.uuid4().hex[:8]
    orders, secret = f"sec-orders-{suffix}", f"sec-secret-{suffix}"
    create_topic(bootstrap, TopicSpec(orders, 1, key=("/id",)))
    create_topic(bootstrap, TopicSpec(secret, 1))
    config = secured_config(orders, secret, certs, users.path)
    worker = Worker(config, bootstrap, base / "state", group_id=f"test-{suffix}")
    worker.start()
    try:
        worker.wait_ready(60)
        gateway = Gateway(
            worker.engine,
            bootstrap,
            listen="127.0.0.1:0",
            settings=config.gateway,
            security=Security.from_config(config),
        )
        try:
            yield Secured(gateway.start(), orders, secret, certs, gateway, worker)
        finally:
            gateway.stop()
    finally:
        worker.stop()
        delete_topics(bootstrap, [orders, secret])


__all__ = ["WAIT", "Secured", "TlsWire", "secured"]
