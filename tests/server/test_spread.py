"""A spread subscription closed while it still opens its legs (server/spread.py).

The client may unsubscribe, disconnect, or the plan may fail while `open_legs` waits for
a peer's link: `close()` then closes the legs it knows, and a link opened after it must
not become a leg nobody closes (a connection to the peer and a task that outlive the
subscription, still sending its snapshot under a sub_id that has already ended).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from amps_on_kafka.server import spread
from amps_on_kafka.server.cluster import LOCAL, Plan
from amps_on_kafka.server.spread import SpreadSubscription


class Link:
    """A peer link that records what was sent on it and whether it was closed."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.closed = False

    def send(self, header: dict) -> None:
        self.sent.append(header)

    def close(self) -> None:
        self.closed = True

    async def receive(self, idle: float | None) -> None:
        await asyncio.Event().wait()  # a peer that has not answered yet


def subscription() -> SpreadSubscription:
    watched: set[object] = set()
    cluster = SimpleNamespace(
        gateway=SimpleNamespace(peer_access=None), watch=watched.add, unwatch=watched.discard
    )
    local = SimpleNamespace(sub_id="s1", entitlement=None, close=lambda: None)
    request = SimpleNamespace(header={"c": "subscribe", "t": "orders", "sub_id": "s1"})
    return SpreadSubscription(cluster, None, request, local)  # type: ignore[arg-type]


@pytest.mark.parametrize("closed_at", [0, 1])
def test_a_link_opened_after_the_subscription_closed_is_closed_not_made_a_leg(
    monkeypatch, closed_at
):
    sub = subscription()
    links: list[Link] = []

    async def open_link(address: str, access: object) -> Link:
        await asyncio.sleep(0)  # the await the client's unsubscribe lands in
        if len(links) == closed_at:
            sub.close()
        links.append(Link())
        return links[-1]

    monkeypatch.setattr(spread.PeerLink, "open", open_link)
    plan = Plan("orders", {0: LOCAL, 1: "peer-a:1", 2: "peer-b:1"})

    asyncio.run(asyncio.wait_for(sub.open_legs(plan, "subscribe"), 10))
    assert sub.closed
    assert all(link.closed for link in links), "every link opened is closed"
    assert len(links) == closed_at + 1, "no link is opened once the subscription closed"
    assert len(sub.legs) == closed_at
    assert [len(link.sent) for link in links] == [1] * closed_at + [0]
