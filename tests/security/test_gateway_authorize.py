"""Which permission each command needs, queues included, and how an entitlement filter
narrows a command's own filter: the session's check alone, over a stand-in gateway
(no Kafka; the end-to-end path is in test_gateway_attacks.py)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from amps_on_kafka.config import Config
from amps_on_kafka.config.model import GatewayConfig
from amps_on_kafka.errors import FilterError
from amps_on_kafka.security.entitlements import Denied, Entitlements
from amps_on_kafka.server.requests import Request
from amps_on_kafka.server.session import Session

QUEUES = ("work.fx", "work.eq")


class Queues:
    def serves(self, topic: str) -> bool:
        return bool(self.names(topic))

    def names(self, topic: str) -> list[str]:
        return [q for q in QUEUES if q == topic or re.fullmatch(topic, q)]


class Gateway:
    max_frame_bytes = 1 << 20
    settings = GatewayConfig()
    queues = Queues()

    async def blocking(self, work: Any, *args: Any) -> Any:
        return work(*args)


class Writer:
    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 5000)


ENTITLEMENTS = Entitlements(
    Config.model_validate(
        {
            "Entitlements": {
                "Users": {
                    "alice": {
                        "Read": [
                            {"Topic": "orders", "Filter": "/desk = 'fx'"},
                            {"Topic": "work.fx", "Filter": "/desk = 'fx'"},
                            "work.eq",
                        ],
                        "Write": ["orders", "work.fx"],
                    },
                    "bob": {"Read": [r"work\..*"]},
                }
            }
        }
    ).entitlements
)


def authorize(user: str, header: dict[str, Any]) -> dict[str, Any]:
    """The header as the command handler would get it, or Denied / FilterError."""
    session = Session(Gateway(), None, Writer())  # type: ignore[arg-type]
    session.entitlements = ENTITLEMENTS.for_user(user)
    asyncio.run(session._authorize(Request(header, b"", frozenset())))
    return header


@pytest.mark.parametrize("command", ["sow", "subscribe", "sow_and_subscribe"])
def test_reads_get_the_entitlement_filter_anded_with_their_own(command: str) -> None:
    assert authorize("alice", {"c": command, "t": "orders"})["f"] == "/desk = 'fx'"
    header = authorize("alice", {"c": command, "t": "orders", "f": "/qty > 1"})
    assert header["f"] == "(/desk = 'fx') AND (/qty > 1)"
    # its own text's position, and never the entitlement filter's text
    with pytest.raises(FilterError, match=r'^at position 8: .* in "/qty > > 1"$'):
        authorize("alice", {"c": command, "t": "orders", "f": "/qty > > 1"})
    with pytest.raises(Denied, match=f"user 'bob' may not {command} 'orders'"):
        authorize("bob", {"c": command, "t": "orders"})


@pytest.mark.parametrize("command", ["publish", "delta_publish", "sow_delete"])
def test_writes_need_write(command: str) -> None:
    where = "from" if command == "sow_delete" else "to"
    with pytest.raises(Denied, match=f"user 'alice' may not {command} {where} 'trades'"):
        authorize("alice", {"c": command, "t": "trades"})


@pytest.mark.parametrize("command", ["publish", "delta_publish"])
def test_publishes_are_not_filtered(command: str) -> None:
    header = authorize("alice", {"c": command, "t": "orders", "f": "1=1"})
    assert header["f"] == "1=1"  # write permission, not the read filter, governs them


def test_a_sow_delete_is_narrowed_to_what_the_user_sees() -> None:
    header = authorize("alice", {"c": "sow_delete", "t": "orders", "f": "1=1"})
    assert header["f"] == "(/desk = 'fx') AND (1=1)"
    with pytest.raises(Denied, match="may sow_delete from 'orders' by filter only"):
        authorize("alice", {"c": "sow_delete", "t": "orders", "k": "7"})


def test_queue_acks_are_the_consumers_right() -> None:
    by_bookmark = {"c": "sow_delete", "t": "work.fx", "bm": "work|0|1|"}
    assert "f" not in authorize("alice", by_bookmark)  # acking by bookmark takes no filter
    by_filter = authorize("alice", {"c": "sow_delete", "t": "work.fx", "f": "/id = 1"})
    assert by_filter["f"] == "(/desk = 'fx') AND (/id = 1)"  # only what she may see
    authorize("bob", {"c": "sow_delete", "t": "work.eq", "bm": "work|0|1|"})  # Read only
    with pytest.raises(Denied, match=re.escape("may not publish to 'work.eq'")):
        authorize("bob", {"c": "publish", "t": "work.eq"})


def test_a_queue_regex_needs_every_queue_it_matches_with_one_filter() -> None:
    authorize("bob", {"c": "subscribe", "t": r"work\..*"})
    with pytest.raises(Denied, match="different entitlement filters"):
        authorize("alice", {"c": "subscribe", "t": r"work\..*"})
    assert authorize("alice", {"c": "subscribe", "t": r"work\.e.*"}).get("f") is None


def test_other_commands_and_unrestricted_users_pass_untouched() -> None:
    for header in ({"c": "flush"}, {"c": "heartbeat"}, {"c": "unsubscribe", "sub_id": "1"}):
        assert authorize("nobody-at-all", dict(header)) == header
    session = Session(Gateway(), None, Writer())  # type: ignore[arg-type]
    session.entitlements = Entitlements(None).for_user("anyone")
    header = {"c": "sow", "t": "orders"}
    asyncio.run(session._authorize(Request(header, b"", frozenset())))
    assert header == {"c": "sow", "t": "orders"}
