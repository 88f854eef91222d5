"""Connection URIs: `kafka://host:port[,host:port]` or `tcp://host:port/amps/json`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from amps_on_kafka.errors import TransportError


@dataclass(frozen=True)
class Endpoint:
    scheme: str  # "kafka" or "tcp"
    address: str  # bootstrap servers for kafka, host:port for tcp
    message_type: str = "json"


def parse_uri(uri: str) -> Endpoint:
    """Surrounding blanks are dropped; a message type with stray characters (a comma copied
    from a log line) is refused with the URI it probably meant."""
    uri = uri.strip()
    parts = urlsplit(uri)
    if parts.scheme == "kafka":
        if not parts.netloc:
            raise TransportError(
                f"{uri!r}: a kafka:// URI needs host:port (kafka://127.0.0.1:9092)"
            )
        return Endpoint("kafka", parts.netloc)
    if parts.scheme == "tcp":
        segments = [s for s in parts.path.split("/") if s]
        if not parts.hostname or not parts.port:
            raise TransportError(
                f"{uri!r}: a tcp:// URI needs host:port (tcp://127.0.0.1:9007/amps/json)"
            )
        if segments and segments[0] != "amps":
            raise TransportError(f"{uri!r}: the path must be /amps/<message type>, e.g. /amps/json")
        message_type = segments[1] if len(segments) > 1 else "json"
        if not message_type.isalnum():
            meant = f"tcp://{parts.netloc}/amps/{re.sub(r'[^A-Za-z0-9].*', '', message_type)}"
            raise TransportError(
                f"{uri!r}: {message_type!r} is not a message type; did you mean {meant!r}?"
            )
        return Endpoint("tcp", f"{parts.hostname}:{parts.port}", message_type)
    raise TransportError(f"{uri!r}: unknown scheme {parts.scheme!r} (use kafka:// or tcp://)")
