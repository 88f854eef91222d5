"""Checked by mypy (pyproject's [tool.mypy] files; scripts/test.sh), never run: what
`execute(Command(...))` returns is typed from the command's name, for every client."""

from __future__ import annotations

from typing import Any, assert_type

from amps_on_kafka import AsyncClient, Command, HAClient
from amps_on_kafka.client import AsyncStream, Client, DeleteAck, MessageStream


def sync_clients(client: Client, ha: HAClient, name: str) -> None:
    for each in (client, ha):
        assert_type(each.execute(Command("sow").set_topic("t")), MessageStream)
        assert_type(each.execute(Command("subscribe").set_topic("t")), MessageStream)
        assert_type(each.execute(Command("publish").set_topic("t").set_data({})), int)
        assert_type(each.execute(Command("sow_delete").set_topic("t")), DeleteAck)
        assert_type(each.execute(Command("flush")), None)
        assert_type(each.execute(Command(name)), Any)  # a name known only at run time


async def async_client(client: AsyncClient) -> None:
    assert_type(await client.execute(Command("sow_and_subscribe")), AsyncStream)
    assert_type(await client.execute(Command("delta_publish")), int)
    assert_type(await client.execute(Command("heartbeat")), None)
