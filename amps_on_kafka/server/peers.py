"""Talking to another gateway of the group (server/cluster.py): the command a peer is
asked (the client's query restricted to PARTS), a peer's failure ack raised as ours, the
records its sow frames carry and how the parts' answers merge into the whole, and the
logged-on links that carry it all, pooled for forwarded queries.

A peer that is gone, unreachable or silent too long is PartitionsMoving ("retry:"), as a
partition with no worker is: the client asks again once the group has settled.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict, deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from amps_on_kafka.errors import PartitionsMoving, ServerError
from amps_on_kafka.processor.engine import QueryResult, ordered
from amps_on_kafka.protocol.frames import READ_SIZE, BadFrame, Frame, FrameDecoder, encode_frame
from amps_on_kafka.server.requests import ProtocolError

if TYPE_CHECKING:
    from amps_on_kafka.security.policy import PeerAccess

PARTS = "_parts"  # a forwarded command's partitions: answer for these, here, only
CONNECT_TIMEOUT = 5.0  # seconds to reach a peer's gateway and log on
ANSWER_IDLE = 30.0  # seconds a peer may stay silent while a snapshot is awaited
FORWARDED_KEYS = ("t", "f", "orderby", "top_n", "o")
MAX_IDLE_LINKS = 4  # idle logged-on links kept per peer for forwarded queries (PeerPool)
# A peer's frames: a sow batch is at most about 1 MiB of payload (queries.BATCH_BYTES)
# beyond one record, and a record at most a publish frame (MaxFrameBytes).
MAX_PEER_FRAME = 64 * 1024 * 1024


def parts_of(header: dict[str, Any]) -> list[int] | None:
    """PARTS, checked: a list of partition numbers, or None for an ordinary command."""
    value = header.get(PARTS)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in value
    ):
        raise ProtocolError(f"{PARTS!r} must be a list of partition numbers")
    return value


def forwarded(header: dict[str, Any], command: str, parts: list[int], **extra: Any) -> dict:
    """The command a peer is asked: the client's query, restricted to `parts`."""
    kept = {key: header[key] for key in FORWARDED_KEYS if key in header}
    return {"c": command, "cid": uuid.uuid4().hex[:12], **kept, PARTS: parts, **extra}


def refused(header: dict[str, Any]) -> None:
    """A peer's failure ack, raised as ours: PartitionsMoving keeps its "retry:"."""
    if header.get("status") != "failure":
        return
    reason = str(header.get("reason", "a peer refused the command"))
    if reason.startswith("retry:"):
        raise PartitionsMoving(reason)
    raise ServerError(reason)


@dataclass(slots=True)
class RemoteRecord:
    """A SOW record as a peer sent it: what replies.sow_batch and ordering read."""

    topic: str
    partition: int
    sow_key: str
    payload: bytes
    bookmark: str
    timestamp: int
    expiration: float | None
    codec: None = None  # the payload is already in its wire form
    _data: Any = field(default=None, repr=False)

    @property
    def data(self) -> Any:
        if self._data is None:
            with suppress(orjson.JSONDecodeError):
                self._data = orjson.loads(self.payload)
        return self._data


def remote_records(header: dict[str, Any], payload: bytes) -> list[RemoteRecord]:
    """The records of one `sow` frame (replies.sow_batch's layout)."""
    records, start = [], 0
    for meta in header.get("recs", ()):
        end = start + int(meta["n"])
        bookmark = str(meta["bm"])
        partition = int(bookmark.split("|")[1])
        records.append(
            RemoteRecord(
                header["t"],
                partition,
                meta["k"],
                payload[start:end],
                bookmark,
                meta["ts"],
                meta.get("e"),
            )
        )
        start = end
    return records


def merge(answers: list[QueryResult], order_by: str | None, top_n: int | None) -> QueryResult:
    """Parts of one query as the whole would have been answered (see the module doc)."""
    records = sorted((r for answer in answers for r in answer.records), key=_partition)
    if order_by:
        records = ordered(records, order_by)
    if top_n is not None:
        records = records[:top_n]
    return QueryResult(records, sum(answer.matches for answer in answers))


def _partition(record: Any) -> int:
    return record.partition


class PeerPool:
    """Idle links to peers, logged on, reused by forwarded sow queries: a connection and
    a logon for each one cost round trips (and a line in the peer's audit log). At most
    MAX_IDLE_LINKS wait per peer; one whose peer went away fails its next query with
    retry:, like a new connection to a dead peer would."""

    def __init__(self, access: PeerAccess) -> None:
        self.access = access
        self._idle: dict[str, list[PeerLink]] = defaultdict(list)

    async def take(self, address: str) -> PeerLink:
        idle = self._idle[address]
        while idle:
            link = idle.pop()
            if not link.writer.is_closing():
                return link
        return await PeerLink.open(address, self.access)

    def give(self, link: PeerLink) -> None:
        idle = self._idle[link.address]
        if len(idle) < MAX_IDLE_LINKS and not link.frames and not link.writer.is_closing():
            idle.append(link)
        else:
            link.close()

    def close(self) -> None:
        for links in self._idle.values():
            for link in links:
                link.close()
        self._idle.clear()


class PeerLink:
    """One connection to a peer's gateway, logged on, for one forwarded command."""

    def __init__(
        self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(MAX_PEER_FRAME)
        self.frames: deque[Frame] = deque()

    @classmethod
    async def open(cls, address: str, access: PeerAccess) -> PeerLink:
        """Connected (over TLS when the gateways serve it) and logged on as a peer
        (docs/security.md, Gateways of one group)."""
        host, _, port = address.rpartition(":")
        tls = {"ssl": access.context, "server_hostname": host} if access.context else {}
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), **tls), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise _unreachable(address, exc) from exc
        link = cls(address, reader, writer)
        name = f"_peer-{uuid.uuid4().hex}"
        link.send({"c": "logon", "cid": "logon", "client_name": name, **access.credentials()})
        try:
            refused((await link.receive(CONNECT_TIMEOUT)).header)
        except BaseException:
            link.close()
            raise
        return link

    def send(self, header: dict[str, Any]) -> None:
        """Queue `header`; PartitionsMoving if the connection is gone: uvloop raises
        RuntimeError for a write on a transport a reset closed, which from a client's
        command closed that client's connection (a gateway's bug, not a peer's death)."""
        try:
            self.writer.write(encode_frame(header))
        except RuntimeError as exc:
            raise _unreachable(self.address, "connection closed") from exc

    async def receive(self, timeout: float | None) -> Frame:
        """The next frame; PartitionsMoving if the peer is gone or silent `timeout` s."""
        while not self.frames:
            try:
                data = await asyncio.wait_for(self.reader.read(READ_SIZE), timeout)
            except (OSError, TimeoutError) as exc:
                raise _unreachable(self.address, exc) from exc
            if not data:
                raise _unreachable(self.address, "closed the connection")
            for event in self.decoder.feed(data):
                if isinstance(event, BadFrame):
                    raise _unreachable(self.address, event.reason)
                self.frames.append(event)
        return self.frames.popleft()

    def close(self) -> None:
        self.writer.close()


def _unreachable(address: str, why: object) -> PartitionsMoving:
    return PartitionsMoving(
        f"retry: partitions moving (the worker at {address}: {why or 'timeout'})"
    )
