"""A small certificate authority for local TLS: a CA, certificates it signs, PEM files.

Used by `amps-kafka broker start --secure` (the broker's SASL_SSL listener) and by tests that
need TLS (the secured broker, the gateway's TLS). Real deployments bring their own PKI; this
exists so a user can try TLS locally without openssl or keytool incantations.

Typical use::

    ca = make_ca("amps-kafka local CA")
    server = issue(ca, "localhost", dns=["localhost"], ips=["127.0.0.1"])
    write_pem(ca, tmp / "ca.pem")                       # certificate only
    write_pem(server, tmp / "server.pem", tmp / "server.key")

`issue(..., client=True)` makes a client certificate (for mutual TLS) instead of a server one.
Keys are EC P-256: small, fast to generate (a few ms) and accepted by Java, OpenSSL and Python.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long generated certificates stay valid: long enough for a local trial, short enough
#: that nobody mistakes them for production material.
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key (the CA's, a server's or a client's)."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def certificate_pem(self) -> bytes:
        """The certificate in PEM form."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self, password: str | None = None) -> bytes:
        """The private key in PKCS#8 PEM form, encrypted when a password is given."""
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password.encode())
            if password
            else serialization.NoEncryption()
        )
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + VALIDITY)
    )


def make_ca(common_name: str = "amps-kafka local CA") -> KeyPair:
    """A self-signed certificate authority that can sign certificates (and nothing else)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    dns: list[str] | tuple[str, ...] = (),
    ips: list[str] | tuple[str, ...] = (),
    client: bool = False,
) -> KeyPair:
    """A certificate for `common_name` signed by `ca`.

    `dns` and `ips` become subject-alternative names (what TLS clients verify the host
    against; the CN alone is not checked by modern clients). `client=True` makes a client
    certificate for mutual TLS (extended key usage clientAuth), otherwise a server one.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        _builder(common_name, ca.certificate.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def write_pem(
    pair: KeyPair,
    certificate_path: Path,
    key_path: Path | None = None,
    *,
    key_password: str | None = None,
) -> None:
    """Write the certificate (and, when `key_path` is given, the key) as PEM files.

    The key file is created readable by its owner only (0600): it is a secret.
    """
    Path(certificate_path).write_bytes(pair.certificate_pem())
    if key_path is not None:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pair.key_pem(key_password))
