"""Message types: how a payload becomes the bytes of a record value and back.

JSON is the default (orjson); Avro uses a schema named in the topic's configuration;
binary is opaque bytes. `encode` takes structured data (a dict); `encode_payload`
also takes bytes the caller already encoded and validates them by decoding, so a bad
payload is refused before it reaches the log instead of being skipped by every
consumer after it. A payload in text or bytes for an Avro topic is JSON, as users write
it (the CLI, a shell pipe, the gateway's wire): it is parsed and encoded with the topic's
schema (`avro_document`). Bytes mean the same on kafka:// as on tcp://, whose wire can't
tell JSON bytes from Avro ones, so Avro already encoded is refused alike on both.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any, Protocol

import fastavro
import orjson

from amps_on_kafka.errors import MessageError


def bytes_as_base64(value: Any) -> Any:
    """orjson's `default` for bytes inside a decoded payload (an Avro `bytes` or `fixed`
    field): JSON has no bytes, so they show as {"base64": "..."}, the form a binary payload
    takes wherever JSON is written (replay lines, the gateway's wire)."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Codec(Protocol):
    message_type: str

    def encode(self, data: Any) -> bytes: ...

    def decode(self, raw: bytes) -> Any: ...


class JsonCodec:
    """JSON documents; text or bytes given by the caller must already be valid JSON."""

    message_type = "json"

    def encode(self, data: Any) -> bytes:
        try:
            return orjson.dumps(data)
        except TypeError as exc:
            raise MessageError(f"can't encode payload as JSON: {exc}") from exc

    def decode(self, raw: bytes) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise not_json(exc) from exc


def not_json(exc: orjson.JSONDecodeError) -> MessageError:
    """The error for a JSON payload that doesn't decode (LogMessage.data decodes JSON
    itself, without a call into the codec)."""
    return MessageError(f"payload is not valid JSON: {exc}")


class BinaryCodec:
    """Opaque payloads: the application owns the format; filters see no fields."""

    message_type = "binary"

    def encode(self, data: Any) -> bytes:
        raise MessageError(f"binary payloads must be bytes or str, not {type(data).__name__}")

    def decode(self, raw: bytes) -> Any:
        return raw


class AvroCodec:
    """Schemaless Avro bodies: the schema lives in the configuration, not in each record."""

    message_type = "avro"

    def __init__(self, schema: dict[str, Any]) -> None:
        try:
            self.schema = schema
            self._parsed = fastavro.parse_schema(schema)
        except Exception as exc:  # fastavro raises several unrelated types
            raise MessageError(f"invalid Avro schema: {exc}") from exc

    def encode(self, data: Any) -> bytes:
        self._refuse_unknown_fields(data)
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self._parsed, data)
        except Exception as exc:  # ValueError, TypeError, KeyError, AttributeError
            raise MessageError(f"payload does not fit the Avro schema: {exc}") from exc
        return buffer.getvalue()

    def _refuse_unknown_fields(self, data: Any) -> None:
        """fastavro drops a record's fields the schema lacks: a misspelt field would vanish
        from the log without a word, so a top-level one is named instead."""
        fields = self.schema.get("fields") if isinstance(self.schema, dict) else None
        if fields is None or not isinstance(data, dict):
            return
        unknown = data.keys() - {field["name"] for field in fields}
        if unknown:
            raise MessageError(
                f"payload does not fit the Avro schema: field {sorted(unknown)[0]!r} is not in "
                f"the schema of record {self.schema.get('name')!r}"
            )

    def decode(self, raw: bytes) -> Any:
        buffer = io.BytesIO(raw)
        try:
            record = fastavro.schemaless_reader(buffer, self._parsed, None)
        except Exception as exc:  # truncated or garbage input raises many types
            reason = _OBJECT_REPR.sub("", str(exc))  # fastavro names its buffer's address
            raise MessageError(
                f"payload ({len(raw)} bytes) is not valid Avro for the schema: {reason}"
            ) from exc
        if buffer.tell() != len(raw):
            raise MessageError("payload is not valid Avro: trailing bytes after the record")
        return record


_OBJECT_REPR = re.compile(r" from <[^>]* at 0x[0-9a-f]+>")

JSON = JsonCodec()
BINARY = BinaryCodec()


def codec_for(message_type: str, schema: dict[str, Any] | None = None) -> Codec:
    if message_type == "json":
        return JSON
    if message_type == "binary":
        return BINARY
    if message_type == "avro":
        if schema is None:
            raise MessageError("message type avro needs a schema")
        return AvroCodec(schema)
    raise MessageError(f"unknown message type {message_type!r} (json, avro or binary)")


def avro_document(payload: str | bytes | bytearray | memoryview) -> Any:
    """An Avro topic's payload given as text or bytes: JSON, to be encoded with the
    topic's schema. One error for every path (kafka://, the gateway, the CLI)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise MessageError(
            f"payload for an Avro topic is not valid JSON ({exc}): publish the record as a "
            "dict or JSON text, which is encoded with the topic's schema (Avro bytes "
            "already encoded are not taken)"
        ) from None


PAYLOAD_TYPES = (dict, str, bytes, bytearray, memoryview)


def check_topic(topic: object) -> None:
    """A publish's topic is a str: checked by every client (where the topic is first met,
    off the hot path), so a wrong type is one TypeError naming the argument, not Kafka's
    or the gateway's own."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, not {type(topic).__name__}")


def check_payload(data: object) -> None:
    """A publish's data is a dict (a JSON or Avro document), str or bytes; JSON text of
    another value (a number, a list) is taken as text. One TypeError on every client."""
    if not isinstance(data, PAYLOAD_TYPES):
        raise TypeError(f"data must be a dict, str or bytes, not {type(data).__name__}")


def encode_payload(codec: Codec, data: Any) -> tuple[bytes, Any]:
    """The record value and the decoded document (for SOW keys) of a payload."""
    if type(data) is dict:  # the common case first: one type check per message
        return codec.encode(data), data
    if isinstance(data, str | bytes | bytearray | memoryview) and codec.message_type == "avro":
        document = avro_document(data)
        return codec.encode(document), document
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        return raw, codec.decode(raw)
    check_payload(data)
    return codec.encode(data), data
