"""The log envelope: AMPS metadata in Kafka headers, the payload as the record value.

Header names are one or two letters, like AMPS's own header abbreviations, because they
are paid for on every record. A header whose value is the default is left out: the
command defaults to publish, the logical topic to the Kafka topic, the message type to
json. A consumer that sees no header knows the default.
"""

from __future__ import annotations

import math
import operator
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


class EnvelopeError(MessageError):
    """A header of a log record does not decode: the record says nothing usable."""


# The longest lifetime a message may ask for: 100 years. A stored deadline is a signed
# 64-bit count of milliseconds (state/record.py); capping the lifetime here leaves room
# for any timestamp a log can hold before year 292 million, and makes `inf`, `nan` or
# `1e17` a refusal with a reason instead of a record no worker can store.
MAX_EXPIRATION = 100 * 365.25 * 86_400


def check_expiration(value: float) -> float:
    """An expiration in seconds as every entry point and the worker accept it: finite,
    0 (never) or positive, and at most MAX_EXPIRATION. One definition for the client,
    the gateway, the CLI and the log, so all refuse the same values, with this reason.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MessageError(f"expiration must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or value > MAX_EXPIRATION:
        raise MessageError(
            f"expiration must be 0 (never) or a positive number of seconds up to "
            f"{MAX_EXPIRATION:.0f} (100 years), got {value!r}"
        )
    return value


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
        """Inverse of to_headers; an undecodable header is a MessageError, never a crash.

        Read for every record a worker applies, so it sets fields directly rather than
        dispatching through a table of parsers: half the cost per record.
        """
        if not headers:
            return _PLAIN_PUBLISH
        envelope = cls()
        name = ""
        try:
            for name, value in headers:
                if value is None:
                    continue
                if name == H_PUBLISHER:
                    envelope.publisher_id = value.decode()
                elif name == H_SEQUENCE:
                    envelope.sequence = int(value)
                elif name == H_COMMAND:
                    envelope.command = _command(value)
                elif name == H_SOW_KEY:
                    envelope.sow_key = value.decode()
                elif name == H_EXPIRATION:
                    envelope.expiration = check_expiration(float(value))
                elif name == H_CORRELATION:
                    envelope.correlation_id = value.decode()
                elif name == H_TOPIC:
                    envelope.topic = value.decode()
                elif name == H_MESSAGE_TYPE:
                    envelope.message_type = value.decode()
                elif name == H_FILTER:
                    envelope.filter = value.decode()
                elif name == H_SOW_KEYS:
                    envelope.sow_keys = _sow_keys(value)
        except (ValueError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
            raise EnvelopeError(f"bad envelope header {name!r}: {exc}") from exc
        return envelope


_PLAIN_PUBLISH = Envelope()
_STATEFUL = frozenset((H_COMMAND, H_EXPIRATION, H_FILTER, H_SOW_KEYS))
_TEXT = frozenset((H_PUBLISHER, H_SOW_KEY, H_CORRELATION, H_TOPIC, H_MESSAGE_TYPE))


# A consumed Message's headers(), called through the C API. confluent-kafka decodes each
# header name as UTF-8; for a name that is not (any producer but the Python client can
# write one) it returns a list holding a tuple without a name AND sets an exception. The
# C API turns that into SystemError. Called as `record.headers()`, CPython's specialised
# call (3.11+, once the call site is warm) only asserts on it, returns the broken list,
# and reading it crashes the process. confluent-kafka also keeps that list: a second call
# returns it, whichever way, so a record's headers are read once (LogMessage keeps the
# failure).
read_headers = operator.methodcaller("headers")


def headers_of(record) -> list[tuple[str, bytes | None]] | None:
    """A consumed record's headers; EnvelopeError when they don't read: the record's
    command is then unknown, and it is refused like any undecodable header. At most once
    per record (see read_headers)."""
    try:
        return read_headers(record)
    except (SystemError, UnicodeDecodeError) as exc:
        raise unreadable_headers(exc) from exc


def unreadable_headers(exc: Exception) -> EnvelopeError:
    cause = exc.__cause__ or exc.__context__ or exc
    return EnvelopeError(f"a header name is not UTF-8 text ({cause})")


def is_plain_publish(headers: list[tuple[str, bytes | None]] | None) -> bool:
    """Whether a record is a publish with no expiration of its own whose envelope decodes.

    The worker's fast path asks this instead of decoding the envelope. It answers True
    only where from_headers would succeed and give command publish, no expiration, no
    filter and no key list; anything unusual (a None value, non-ASCII text, a sequence
    that is not plain digits) is left to from_headers, which then decides.
    """
    if not headers:
        return True
    for name, value in headers:
        if name in _STATEFUL or value is None:
            return False
        if name == H_SEQUENCE:
            if not value.isdigit():
                return False
        elif name in _TEXT and not value.isascii():
            return False
    return True


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


def _command(raw: bytes) -> Command:
    command = _COMMANDS.get(raw.decode())
    if command is None:
        raise ValueError(f"unknown command {raw.decode()!r}")
    return command


def _sow_keys(raw: bytes) -> tuple[str, ...]:
    keys = orjson.loads(raw)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("sow keys must be a JSON list of strings")
    return tuple(keys)


def dead_letter_headers(
    headers: list[tuple[str, bytes]] | None, reason: str, bookmark: str
) -> list[tuple[str, bytes]]:
    """A dead letter keeps its envelope and says why it was refused and where it came from."""
    return [*(headers or []), ("reason", reason.encode()), ("source", bookmark.encode())]
