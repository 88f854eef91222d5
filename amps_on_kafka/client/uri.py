"""Connection URIs: `kafka://host:port[,host:port]` or `tcp://host:port/amps/json`.

`tcps://` is the gateway over TLS (docs/security.md); its query may name the CA that
signs the gateway's certificate and a client certificate for mutual TLS:
`tcps://alice:secret@host:9007/amps/json?ca=ca.pem&cert=alice.pem&key=alice.key`.
A user and password before the host are sent at logon (user_id and pw), as AMPS's URIs
carry them; over tcp:// they would cross the network in clear.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from amps_on_kafka.client.tls import TlsOptions
from amps_on_kafka.errors import TransportError

TLS_OPTIONS = ("ca", "cert", "key")


@dataclass(frozen=True)
class Endpoint:
    scheme: str  # "kafka" or "tcp"
    address: str  # bootstrap servers for kafka, host:port for tcp
    message_type: str = "json"
    tls: TlsOptions | None = None  # tcps://
    user: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_uri(uri: str) -> Endpoint:
    """Surrounding blanks are dropped; a message type with stray characters (a comma copied
    from a log line) is refused with the URI it probably meant."""
    parts = urlsplit(uri.strip())
    uri = shown(uri)  # as errors show it
    if parts.scheme == "kafka":
        if not parts.netloc:
            raise TransportError(
                f"{uri!r}: a kafka:// URI needs host:port (kafka://127.0.0.1:9092)"
            )
        return Endpoint("kafka", parts.netloc)
    if parts.scheme in ("tcp", "tcps"):
        segments = [s for s in parts.path.split("/") if s]
        if not parts.hostname or not parts.port:
            raise TransportError(
                f"{uri!r}: a tcp:// URI needs host:port (tcp://127.0.0.1:9007/amps/json)"
            )
        if segments and segments[0] != "amps":
            raise TransportError(f"{uri!r}: the path must be /amps/<message type>, e.g. /amps/json")
        message_type = segments[1] if len(segments) > 1 else "json"
        if not message_type.isalnum():
            host = parts.netloc.rpartition("@")[2]  # never the credentials
            meant = f"{parts.scheme}://{host}/amps/{re.sub(r'[^A-Za-z0-9].*', '', message_type)}"
            raise TransportError(
                f"{uri!r}: {message_type!r} is not a message type; did you mean {meant!r}?"
            )
        return Endpoint(
            "tcp",
            f"{parts.hostname}:{parts.port}",
            message_type,
            _tls(uri, parts.scheme, parts.query),
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password is not None else None,
        )
    if "://" not in uri:  # host:port alone, as a new user types it
        raise TransportError(
            f"{uri!r}: unknown scheme '' (use kafka://, tcp:// or tcps://, e.g. "
            f"tcp://{uri.strip()}/amps/json for a gateway, kafka://{uri.strip()} for Kafka)"
        )
    raise TransportError(
        f"{uri!r}: unknown scheme {parts.scheme!r} (use kafka://, tcp:// or tcps://)"
    )


def _tls(uri: str, scheme: str, query: str) -> TlsOptions | None:
    options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(options) - set(TLS_OPTIONS))
    if unknown or (options and scheme != "tcps"):
        raise TransportError(
            f"{uri!r}: unknown URI option(s) {', '.join(unknown or sorted(options))} "
            "(a tcps:// URI takes ca, cert and key)"
        )
    if scheme != "tcps":
        return None
    if "key" in options and "cert" not in options:
        raise TransportError(f"{uri!r}: key needs cert (the client certificate)")
    return TlsOptions(options.get("ca"), options.get("cert"), options.get("key"))


def shown(uri: str) -> str:
    """The URI as errors and output may show it: never with its password."""
    uri = uri.strip()
    password = urlsplit(uri).password
    return uri if not password else uri.replace(f":{password}@", ":***@", 1)
