"""The local broker's secured listener: SASL_SSL with SCRAM-SHA-512 users and a certificate
from a CA made here (broker/certs.py), and the client properties that reach it.

Everything lives in ``<data dir>/secure/`` (mode 0700), made on the first secured start and
reused after: ``ca.pem`` (what clients trust), ``broker.pem`` (the broker's key and
certificate, a PEM keystore), ``credentials.json`` (the generated passwords). The SCRAM
users are written into the metadata log when the storage is formatted (``kafka-storage
format --add-scram``): ``admin``, the broker's own inter-broker user, and ``amps``, the one
clients use. ``client.properties`` (0600) in the data directory holds what a client needs,
for ``--kafka-config`` or Kafka's own tools' ``--command-config``.

The controller listener stays plaintext on the loopback address: only the broker itself
talks to it. This is a broker to try security with, not a production setup: every
authenticated user may do everything (no ACLs).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"  # the broker's own user, for its inter-broker listener
CLIENT_USER = "amps"
LISTENER = "SASL_SSL"


@dataclass(frozen=True)
class Credentials:
    """The generated passwords of the broker's SCRAM users."""

    admin_password: str
    user: str
    password: str


class SecureFiles:
    """The TLS material and credentials of one secured local broker."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "secure"
        self.ca = self.dir / "ca.pem"
        self.keystore = self.dir / "broker.pem"
        self.client_properties = data_dir / "client.properties"
        self._credentials = self.dir / "credentials.json"

    def exists(self) -> bool:
        return self._credentials.is_file()

    def ensure(self, host: str) -> Credentials:
        """The credentials, and a CA and broker certificate for `host`: made the first
        time (certificate and key written before the credentials, which mark the set as
        complete), read after."""
        if self.exists():
            return Credentials(**json.loads(self._credentials.read_text()))
        # Here, not at the top: importing cryptography costs every command 0.1-0.2 s, and
        # only a first secured start needs it.
        from amps_on_kafka.broker.certs import issue, make_ca, write_pem

        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca = make_ca("amps-kafka local broker CA")
        broker = issue(ca, host, dns=["localhost"], ips=_ips(host))
        write_pem(ca, self.ca)
        _write_private(self.keystore, broker.key_pem() + broker.certificate_pem())
        credentials = Credentials(_password(), CLIENT_USER, _password())
        _write_private(self._credentials, json.dumps(asdict(credentials)).encode())
        return credentials

    def broker_settings(self, credentials: Credentials) -> dict[str, str]:
        """What server.properties adds for the SASL_SSL listener (config.server_properties)."""
        return {
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN_USER}" password="{credentials.admin_password}";'
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    @staticmethod
    def scram_users(credentials: Credentials) -> list[str]:
        """The storage tool's arguments that create both SCRAM users at format time."""
        users = ((ADMIN_USER, credentials.admin_password), (credentials.user, credentials.password))
        return [
            arg
            for name, password in users
            for arg in ("--add-scram", f"{MECHANISM}=[name={name},password={password}]")
        ]

    def client_settings(self, credentials: Credentials) -> dict[str, str]:
        """librdkafka's properties for a client of this broker."""
        return {
            "security.protocol": LISTENER,
            "sasl.mechanisms": MECHANISM,
            "sasl.username": credentials.user,
            "sasl.password": credentials.password,
            "ssl.ca.location": str(self.ca),
        }

    def write_client_properties(self, bootstrap: str, credentials: Credentials) -> Path:
        """client.properties: bootstrap.servers and client_settings, readable by its owner."""
        lines = [
            "# Client properties of the local secured Kafka broker (amps-kafka broker start"
            " --secure)",
            f"bootstrap.servers={bootstrap}",
            *(f"{key}={value}" for key, value in self.client_settings(credentials).items()),
        ]
        _write_private(self.client_properties, ("\n".join(lines) + "\n").encode())
        return self.client_properties


def _password() -> str:
    """A random password of URL-safe characters: none of them is special in a JAAS line
    or in the storage tool's `[name=...,password=...]`."""
    return secrets.token_urlsafe(24)


def _ips(host: str) -> list[str]:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return ["127.0.0.1"]
    return sorted({host, "127.0.0.1"})


def _write_private(path: Path, data: bytes) -> None:
    """Write `path` readable and writable by its owner only, whatever existed before."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, 0o600)
