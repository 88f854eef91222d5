"""What the gateway sends: acks, query results, subscription deliveries and oof messages.

Only header dictionaries are built here; payloads are passed through as stored, so a
record is encoded once however many subscribers receive it. The wire carries JSON
(`tcp://…/amps/json`): Avro records are converted, JSON and binary ones go as they are.
"""

from __future__ import annotations

from typing import Any

import orjson

from amps_on_kafka.log.codecs import Codec, bytes_as_base64
from amps_on_kafka.log.message import LogMessage
from amps_on_kafka.state.record import SowRecord

# Keys of a command echoed on every reply to it, so the client can route and match them.
ECHOED = ("cid", "t", "s", "sub_id", "query_id")


def ack(
    request: dict[str, Any], ack_type: str, reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A success ack, or a failure ack when a reason is given."""
    reply: dict[str, Any] = {
        "c": "ack",
        "a": ack_type,
        "status": "failure" if reason else "success",
    }
    for key in ECHOED:
        if key in request:
            reply[key] = request[key]
    if reason:
        reply["reason"] = reason
    reply.update(extra)
    return reply


def ids(request: dict[str, Any]) -> dict[str, Any]:
    """The routing keys of a command, for the group and record messages that answer it."""
    return {key: request[key] for key in ("cid", "sub_id", "query_id") if key in request}


def group(kind: str, request: dict[str, Any], topic: str) -> dict[str, Any]:
    """`group_begin` or `group_end` around the records of a query."""
    return {"c": kind, **ids(request), "t": topic}


def sow_batch(
    request: dict[str, Any], topic: str, records: list[SowRecord]
) -> tuple[dict[str, Any], bytes]:
    """Several `sow` records in one frame: `recs` describes each, payloads follow in order."""
    metas, payloads = [], []
    for record in records:
        meta, payload = record_entry(record)
        metas.append(meta)
        payloads.append(payload)
    return {"c": "sow", **ids(request), "t": topic, "recs": metas}, b"".join(payloads)


def sow_prefix(request: dict[str, Any], topic: str) -> bytes:
    """The JSON of sow_batch's header up to its first `recs` entry (`recs` comes last)."""
    return orjson.dumps({"c": "sow", **ids(request), "t": topic})[:-1] + b',"recs":['


def record_entry(record: SowRecord) -> tuple[dict[str, Any], bytes]:
    """A record's entry in a batch frame's `recs` (`n`: its payload's length) and payload."""
    payload = record_payload(record)
    meta = record_meta(record)
    meta["n"] = len(payload)
    return meta, payload


def record_meta(record: SowRecord) -> dict[str, Any]:
    meta: dict[str, Any] = {"k": record.sow_key, "bm": record.bookmark, "ts": record.timestamp}
    expiration = record.expiration
    if expiration is not None:
        meta["e"] = expiration
    return meta


def delivery(
    kind: str, sub_id: str, record: SowRecord, reason: str | None = None
) -> dict[str, Any]:
    """A `publish` or an `oof` of a SOW record to one subscription."""
    header = {"c": kind, "sub_id": sub_id, "t": record.topic, **record_meta(record)}
    if reason is not None:
        header["reason"] = reason
    return header


def log_delivery(sub_id: str, message: LogMessage) -> dict[str, Any]:
    """A `publish` of a record read from the log (non-SOW and bookmark subscriptions)."""
    header: dict[str, Any] = {
        "c": "publish",
        "sub_id": sub_id,
        "t": message.logical_topic,
        "bm": message.bookmark,
        "ts": message.timestamp,
    }
    envelope = message.envelope
    for key, value in (
        ("k", envelope.sow_key),
        ("e", envelope.expiration),
        ("x", envelope.correlation_id),
        ("p", envelope.publisher_id),  # the client's Message has them on both transports,
        ("s", envelope.sequence),  # and a bookmark store drops duplicates by them
    ):
        if value is not None:
            header[key] = value
    return header


def record_payload(record: SowRecord) -> bytes:
    return wire_payload(record.codec, record.payload, record)


def log_payload(message: LogMessage) -> bytes:
    return wire_payload(message.codec, message.raw or b"", message)


def wire_payload(codec: Codec | None, raw: bytes, holder: SowRecord | LogMessage) -> bytes:
    """Avro as JSON; a `bytes` or `fixed` field as {"base64": "..."} (docs/protocol.md)."""
    if not converted(codec):
        return raw
    return orjson.dumps(holder.data, default=bytes_as_base64)


def converted(codec: Codec | None) -> bool:
    """Whether a record's wire payload is not its stored one (Avro's is JSON)."""
    return codec is not None and codec.message_type == "avro"
