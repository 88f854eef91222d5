"""The log envelope: AMPS metadata in Kafka headers, the payload as the record value.

Header names are one or two letters, like AMPS's own header abbreviations, because they
are paid for on every record. A header whose value is the default is left out: the
command defaults to publish, the logical topic to the Kafka topic, the message type to
json. A consumer that sees no header knows the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import orjson

from amps_on_kafka.errors import MessageError


class Command(StrEnum):
    PUBLISH = "publish"
    DELTA_PUBLISH = "delta_publish"
    SOW_DELETE = "sow_delete"


H_COMMAND = "c"
H_TOPIC = "t"
H_SOW_KEY = "k"
H_EXPIRATION = "e"
H_PUBLISHER = "p"
H_SEQUENCE = "s"
H_CORRELATION = "x"
H_MESSAGE_TYPE = "m"
H_FILTER = "f"
H_SOW_KEYS = "ks"

_COMMANDS = {c.value: c for c in Command}


@dataclass(slots=True)
class Envelope:
    """Everything about a log record except its payload and its Kafka coordinates.

    Not frozen: a frozen dataclass costs a setattr call per field, per record read.
    """

    command: Command = Command.PUBLISH
    topic: str | None = None
    sow_key: str | None = None
    expiration: float | None = None
    publisher_id: str | None = None
    sequence: int | None = None
    correlation_id: str | None = None
    message_type: str = "json"
    filter: str | None = None
    sow_keys: tuple[str, ...] | None = None

    def to_headers(self) -> list[tuple[str, bytes]]:
        headers = command_headers(
            self.publisher_id.encode() if self.publisher_id is not None else None,
            self.sequence,
            self.command,
            self.sow_key,
            self.expiration,
            self.correlation_id,
            self.message_type,
        )
        if self.topic is not None:
            headers.append((H_TOPIC, self.topic.encode()))
        if self.filter is not None:
            headers.append((H_FILTER, self.filter.encode()))
        if self.sow_keys is not None:
            headers.append((H_SOW_KEYS, orjson.dumps(list(self.sow_keys))))
        return headers

    @classmethod
    def from_headers(cls, headers: list[tuple[str, bytes | None]] | None) -> Envelope:
        """Inverse of to_headers; an undecodable header is a MessageError, never a crash."""
        if not headers:
            return _PLAIN_PUBLISH
        fields: dict[str, object] = {}
        try:
            for name, value in headers:
                parse = _PARSERS.get(name)
                if parse is not None and value is not None:
                    field, parsed = parse(value)
                    fields[field] = parsed
        except (ValueError, KeyError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
            raise MessageError(f"bad envelope header {name!r}: {exc}") from exc
        return cls(**fields)  # type: ignore[arg-type]


_PLAIN_PUBLISH = Envelope()


def command_headers(
    publisher_id: bytes | None,
    sequence: int | None,
    command: Command = Command.PUBLISH,
    sow_key: str | None = None,
    expiration: float | None = None,
    correlation_id: str | None = None,
    message_type: str = "json",
) -> list[tuple[str, bytes]]:
    """The headers of a publish: the hot path of every publisher, so no Envelope object."""
    headers: list[tuple[str, bytes]] = []
    if publisher_id is not None:
        headers.append((H_PUBLISHER, publisher_id))
    if sequence is not None:
        headers.append((H_SEQUENCE, b"%d" % sequence))
    if command is not Command.PUBLISH:
        headers.append((H_COMMAND, command.value.encode()))
    if sow_key is not None:
        headers.append((H_SOW_KEY, sow_key.encode()))
    if expiration is not None:
        headers.append((H_EXPIRATION, _number(expiration)))
    if correlation_id is not None:
        headers.append((H_CORRELATION, correlation_id.encode()))
    if message_type != "json":
        headers.append((H_MESSAGE_TYPE, message_type.encode()))
    return headers


def _number(value: float) -> bytes:
    return str(int(value) if float(value).is_integer() else value).encode()


def _text(field: str):
    return lambda raw: (field, raw.decode())


def _command(raw: bytes) -> tuple[str, Command]:
    text = raw.decode()
    if text not in _COMMANDS:
        raise ValueError(f"unknown command {text!r}")
    return "command", _COMMANDS[text]


def _sow_keys(raw: bytes) -> tuple[str, tuple[str, ...]]:
    keys = orjson.loads(raw)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("sow keys must be a JSON list of strings")
    return "sow_keys", tuple(keys)


_PARSERS = {
    H_COMMAND: _command,
    H_TOPIC: _text("topic"),
    H_SOW_KEY: _text("sow_key"),
    H_EXPIRATION: lambda raw: ("expiration", float(raw)),
    H_PUBLISHER: _text("publisher_id"),
    H_SEQUENCE: lambda raw: ("sequence", int(raw)),
    H_CORRELATION: _text("correlation_id"),
    H_MESSAGE_TYPE: _text("message_type"),
    H_FILTER: _text("filter"),
    H_SOW_KEYS: _sow_keys,
}


def dead_letter_headers(
    headers: list[tuple[str, bytes]] | None, reason: str, bookmark: str
) -> list[tuple[str, bytes]]:
    """A dead letter keeps its envelope and says why it was refused and where it came from."""
    return [*(headers or []), ("reason", reason.encode()), ("source", bookmark.encode())]
