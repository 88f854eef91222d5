"""The gateway's security policy in one object: who may log on, what each user may do,
and the throttle on failed logons; built from a configuration, or open for embedding.
Also how this gateway logs on to the other gateways of its group (PeerAccess)."""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass, field
from typing import Any

from amps_on_kafka.config.model import AuthenticationConfig, Config, TLSConfig
from amps_on_kafka.errors import ConfigError
from amps_on_kafka.security.auth import Authentication, Identity, Throttle
from amps_on_kafka.security.entitlements import Entitlements, UserEntitlements
from amps_on_kafka.security.tls import client_context, server_context
from amps_on_kafka.security.users import PEER_USER, UsersFile


@dataclass(frozen=True)
class PeerAccess:
    """How a gateway reaches a peer's (server/peers.py): over TLS when the gateways
    serve TLS (verified against Gateway.TLS.CA, else the system's CAs; presenting its own
    certificate when client certificates are required), logged on with PeerSecret."""

    context: ssl.SSLContext | None = None
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, tls: TLSConfig | None, secret: str | None) -> PeerAccess:
        if tls is None:
            return cls(None, secret)
        own = (tls.certificate, tls.key) if tls.require_client_certificate else (None, None)
        return cls(client_context(tls.ca, *own), secret)

    def credentials(self) -> dict[str, Any]:
        """The logon's user_id and pw; none without a secret (an anonymous logon)."""
        return {} if self.secret is None else {"user_id": PEER_USER, "pw": self.secret}


@dataclass(frozen=True)
class Security:
    authentication: Authentication
    entitlements: Entitlements = field(default_factory=lambda: Entitlements(None))
    throttle: Throttle = field(default_factory=lambda: Throttle(0.5, 30.0))
    peer_secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Config) -> Security:
        """The configuration's Authentication and Entitlements: nobody may log on unless
        they say how (the default configuration refuses every logon)."""
        auth: AuthenticationConfig = config.authentication
        return cls(
            Authentication.from_config(auth),
            Entitlements(config.entitlements),
            Throttle(auth.failure_delay, auth.max_failure_delay),
            auth.peer_secret.get_secret_value() if auth.peer_secret else None,
        )

    @classmethod
    def open(cls) -> Security:
        """Anyone, anonymously, may do anything: what a Gateway built in code without a
        configuration gets (tests, embedding). The worker always passes from_config."""
        return cls(Authentication.open())

    def entitlements_of(self, identity: Identity) -> UserEntitlements:
        """A peer gateway may read everything: its user's gateway narrowed the request."""
        if identity.method == "peer":
            return UserEntitlements(identity.user, None)
        return self.entitlements.for_user(identity.user)


def file_problems(config: Config) -> list[str]:
    """The security files a gateway can't use: TLS certificates, keys or CAs it can't
    load, a users file missing or damaged. `config check` and the worker's start look
    before anything waits for Kafka: the gateway itself starts only after recovery, and
    a missing users file would only make every password logon fail."""
    problems = []
    if config.gateway.tls is not None:
        try:
            server_context(config.gateway.tls)
        except ConfigError as exc:
            problems.append(exc.reason)
    users = config.authentication.users_file
    if users is not None and not users.exists():
        problems.append(
            f"Authentication.UsersFile: {users} does not exist "
            f"(amps-kafka users add NAME --file {users} creates it)"
        )
    elif users is not None:
        try:
            UsersFile(users).hashes()
        except ConfigError as exc:
            problems.append(f"Authentication.UsersFile: {exc.reason}")
    return problems


def no_logon_note(config: Config) -> str | None:
    """What an operator should hear when the configuration lets nobody log on (no
    Authentication section: the secure default), or None."""
    auth = config.authentication
    if auth.anonymous or auth.users_file is not None or auth.client_certificate:
        return None
    return (
        "no user can log on to the gateway: the configuration's Authentication names no "
        "UsersFile, ClientCertificate or Anonymous (docs/security.md)"
    )


def clear_password_note(config: Config, listen: str) -> str | None:
    """What an operator should hear when passwords would cross the network unencrypted:
    a UsersFile, no Gateway.TLS, and a gateway listening beyond this machine."""
    if config.authentication.users_file is None or config.gateway.tls is not None:
        return None
    host = listen.rpartition(":")[0].strip("[]")
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    if local:
        return None
    return (
        f"the gateway listens on {listen} without TLS: passwords cross the network in "
        "clear (set Gateway.TLS, docs/security.md)"
    )
