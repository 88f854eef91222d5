"""Queue commands for a queue another worker owns: carried to the owner's gateway.

Among workers sharing a queue config one owns each queue (processor/queue_owner.py) and
announces it in the membership directory. A queue command (subscribe, sow, or an ack:
sow_delete with bookmarks or a filter) reaching another gateway is sent, as the client
wrote it plus OWNED, over one peer link per client connection and owner (OwnerLink): the
owner sees one session per client connection, so leases, Leasing strict and a disconnect
breaking leases work as if the client were connected there. Every frame the owner sends
back (deliveries, sow batches, acks) is relayed as it is: it carries the client's own
cid and sub_id. A command carrying OWNED is answered where it arrives or refused with
"retry: queue moving" (the queue moved meanwhile), never sent on again.

When the link drops (the owner died or stopped) each subscription it carried ends with a
failure ack "retry: queue moving ...", and so does each command still awaiting its ack:
the client subscribes again, and the queue's group gives it a new owner within its
session timeout. A publish to a queue's name needs no owner: it goes to the underlying
topic from any gateway.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from amps_on_kafka.errors import AmpsError, PartitionsMoving
from amps_on_kafka.protocol.frames import encode_frame
from amps_on_kafka.server.peers import PeerLink
from amps_on_kafka.server.requests import ProtocolError, Request
from amps_on_kafka.server.subscriptions import subscription_id

if TYPE_CHECKING:
    from amps_on_kafka.server.gateway import Gateway
    from amps_on_kafka.server.session import Session

OWNED = "_owned"  # a forwarded queue command: answer it here, or refuse it with retry:
LAST_ACKS = ("completed", "stats", "processed")  # the last ack a command asked for ends it


def moving(names: list[str], why: str) -> PartitionsMoving:
    """The retry: refusal of a queue command; `why` may be another retry: reason (a peer
    link that could not open), which is not prefixed twice."""
    why = why.removeprefix("retry: ")
    return PartitionsMoving(f"retry: queue moving ({', '.join(names)}: {why})")


class QueueLinks:
    """A gateway's links to the owners of the queues it does not own."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._links: dict[tuple[Session, str], OwnerLink] = {}

    def owner(self, names: list[str]) -> str:
        """The gateway address of the worker owning every queue in `names`."""
        cluster = self.gateway.cluster
        if cluster is None:
            raise moving(names, "not served here now")
        directory, me = cluster.membership.directory, cluster.membership.worker
        owners = [directory.queue_owner(name) for name in names]
        if any(owner is None or owner.worker == me for owner in owners):
            raise moving(names, "no worker owns it now")
        addresses = {owner.address for owner in owners}  # type: ignore[union-attr]
        if len(addresses) > 1:
            raise ProtocolError(
                f"the queues {names} are owned by different workers: subscribe to each by name"
            )
        return addresses.pop()

    async def forward(self, session: Session, request: Request, names: list[str]) -> None:
        if OWNED in request.header:  # it was sent here as the owner: the queue moved since
            raise moving(names, "its owner changed")
        key = (session, self.owner(names))
        link = self._links.get(key)
        if link is None or link.lost:
            link = self._links[key] = OwnerLink(session, key[1])
        await link.forward(request)

    def forget(self, session: Session) -> None:
        """The client connection closed: so do its links (the owner breaks its leases)."""
        for key in [key for key in self._links if key[0] is session]:
            self._links.pop(key).close()


class OwnerLink:
    """One client connection's queue commands to one owner, and the owner's frames back."""

    def __init__(self, session: Session, address: str) -> None:
        self.session = session
        self.address = address
        self.lost = False
        self.subscriptions: dict[str, dict[str, Any]] = {}  # sub_id: its subscribe header
        self.pending: dict[Any, tuple[dict[str, Any], str]] = {}  # cid: (header, last frame)
        self._opened = asyncio.ensure_future(PeerLink.open(address, session.gateway.peer_access))
        self._link: PeerLink | None = None
        self._task: asyncio.Task[None] | None = None

    async def forward(self, request: Request) -> None:
        if self._task is None:
            try:
                link = await asyncio.shield(self._opened)
            except AmpsError as exc:
                self.lost = True
                raise moving([request.header.get("t", "?")], exc.reason) from None
            if self._task is None:  # not opened meanwhile by another command
                self._link = link
                self._task = asyncio.get_running_loop().create_task(self._relay())
        header = request.header
        last = _last_frame(request)
        if header.get("c") == "subscribe":
            sub_id = subscription_id(header)
            header = {**header, "sub_id": sub_id}  # its failure ack names it
            self.session.add_subscription(Forwarded(self, sub_id, header.get("t")))
            self.subscriptions[sub_id] = header
        if last is not None and "cid" in header:
            self.pending[header["cid"]] = (header, last)
        self._link.writer.write(encode_frame({**header, OWNED: True}, request.payload))

    def unsubscribe(self, sub_id: str) -> None:
        if self.subscriptions.pop(sub_id, None) is not None and self._link and not self.lost:
            self._link.send({"c": "unsubscribe", "sub_id": sub_id})

    async def _relay(self) -> None:
        try:
            while True:
                frame = await self._link.receive(None)  # type: ignore[union-attr]
                self._relayed(frame.header)
                self.session.send(frame.header, frame.payload)
        except AmpsError:
            self._lose(f"its owner at {self.address} is gone")

    def _relayed(self, header: dict[str, Any]) -> None:
        kind, cid = header.get("c"), header.get("cid")
        waiting = self.pending.get(cid)
        if waiting is not None and (kind == waiting[1] or header.get("a") == waiting[1]):
            del self.pending[cid]
        if kind == "ack" and header.get("status") == "failure":
            self.pending.pop(cid, None)
            sub_id = header.get("sub_id")
            if sub_id in self.subscriptions:  # the owner ended it (the queue moved)
                self._end(sub_id)

    def _lose(self, why: str) -> None:
        """The owner is gone: what waited on it fails with retry: (the client retries)."""
        self.lost = True
        for sub_id, header in list(self.subscriptions.items()):
            self.session.fail(header, moving([str(header.get("t"))], why).reason)
            self._end(sub_id)
        for header, _ in self.pending.values():
            self.session.fail(header, moving([str(header.get("t"))], why).reason)
        self.pending.clear()

    def _end(self, sub_id: str) -> None:
        """The owner no longer holds the subscription: the session forgets it."""
        del self.subscriptions[sub_id]
        held = self.session.subscriptions.get(sub_id)
        if isinstance(held, Forwarded) and held.link is self:
            self.session.remove_subscription(sub_id)

    def close(self) -> None:
        self.lost = True
        if self._task is not None:
            self._task.cancel()
        if self._link is not None:
            self._link.close()
        else:
            self._opened.cancel()
            self._opened.add_done_callback(_close_opened)


def _close_opened(opened: asyncio.Future[PeerLink]) -> None:
    with suppress(BaseException):
        opened.result().close()


def _last_frame(request: Request) -> str | None:
    """The frame that ends a command's answer: its last ack asked for; group_end for a
    sow without acks; None when nothing answers it (a batched ack)."""
    for name in LAST_ACKS:
        if request.wants(name):
            return name
    return "group_end" if request.command == "sow" else None


class Forwarded:
    """A queue subscription held at the owner: a session's entry for unsubscribe."""

    def __init__(self, link: OwnerLink, sub_id: str, topic: str | None) -> None:
        self.link = link
        self.sub_id = sub_id
        self.topic = topic
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.link.unsubscribe(self.sub_id)
