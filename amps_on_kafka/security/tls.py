"""TLS contexts for the gateway (server) and the tcps:// client, from PEM files.

Both sides use ssl.create_default_context's choices (TLS 1.2 or newer, certificate and
host name verification on the client). The gateway asks for a client certificate when a
CA is configured, and requires one with RequireClientCertificate.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from amps_on_kafka.config.model import TLSConfig
from amps_on_kafka.errors import ConfigError


def server_context(tls: TLSConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_chain(context, tls.certificate, tls.key, "Gateway.TLS")
    if tls.ca is not None:
        _load_ca(context, tls.ca, "Gateway.TLS.CA")
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.require_client_certificate else ssl.CERT_OPTIONAL
        )
    return context


def client_context(
    ca: str | Path | None = None,
    certificate: str | Path | None = None,
    key: str | Path | None = None,
) -> ssl.SSLContext:
    """Verifies the gateway against `ca` (else the system's CAs); presents `certificate`
    (and its `key`) when given, for mutual TLS."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca is not None:
        _load_ca(context, Path(ca), "ca")
    if certificate is not None:
        _load_chain(context, Path(certificate), Path(key) if key else None, "cert")
    elif key is not None:
        raise ConfigError("a TLS key needs its certificate (cert=...)")
    return context


def certificate_subject(peer: dict | None) -> str | None:
    """The common name (CN) of a verified peer certificate (ssl's getpeercert() form)."""
    for rdn in (peer or {}).get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return value
    return None


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path | None, what: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: can't load certificate {cert} and key {key}: {exc}") from exc


def _load_ca(context: ssl.SSLContext, ca: Path, what: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: can't load CA certificates from {ca}: {exc}") from exc
