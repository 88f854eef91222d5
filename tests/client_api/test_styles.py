"""Three styles on one engine: iterators, message handlers, asyncio; both transports."""

from __future__ import annotations

import asyncio
import logging
import threading

from amps_on_kafka import COMPLETED, AsyncClient, Command, HAClient, Message
from amps_on_kafka.client.aio import AsyncStream
from amps_on_kafka.client.stream import MessageStream
from amps_on_kafka.log.controls import TICK
from tests.client_api.conftest import wait_for


class Collector:
    """A handler that keeps what it gets and fails on the first message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.done = threading.Event()

    def __call__(self, message: Message) -> None:
        self.messages.append(message)
        if message is COMPLETED:
            self.done.set()
        if len(self.messages) == 1:
            raise RuntimeError("a handler's own bug")


def test_handlers_survive_their_exceptions_and_stop_on_unsubscribe(
    uri, connect, topic_factory, caplog
):
    topic = topic_factory(1)
    client = connect(uri)
    for n in range(3):
        client.publish(topic, {"n": n})
    client.publish_flush(30)
    handler = Collector()
    with caplog.at_level(logging.ERROR, logger="amps_on_kafka.client.handlers"):
        sub_id = client.bookmark_subscribe(topic, "0", sub_id="h", on_message=handler)
        assert sub_id == "h"
        assert handler.done.wait(30)
    assert [m.data for m in handler.messages] == [{"n": 0}, {"n": 1}, {"n": 2}, None]
    assert "a handler's own bug" in caplog.text
    thread = next(t for t in threading.enumerate() if t.name == "amps-handler-h")
    client.unsubscribe("h")
    assert not thread.is_alive()
    again = Collector()  # the sub_id is free again: the subscription ended
    command = Command("subscribe").set_topic(topic).set_bookmark("0").set_sub_id("h")
    assert client.execute_async(command, again) == "h"
    assert again.done.wait(30)
    assert len(again.messages) == 4


def test_a_live_subscription_feeds_its_handler(bare_gateway, connect, topic_factory):
    """subscribe(topic, on_message=...) over tcp:// (live subscriptions need a gateway)."""
    topic = topic_factory(1)
    client = connect(f"tcp://{bare_gateway.address}/amps/json")
    got: list[Message] = []
    sub_id = client.subscribe(topic, on_message=got.append)
    client.publish(topic, {"n": 1})
    client.publish_flush(30)
    wait_for(lambda: len(got) == 1)
    assert (got[0].data, got[0].sub_id) == ({"n": 1}, sub_id)
    client.unsubscribe(sub_id)


def test_execute_async_of_a_publish_runs_it_and_returns_an_id(uri, connect, topic_factory):
    topic = topic_factory(1)
    client = connect(uri)
    got: list[Message] = []
    publish = Command("publish").set_topic(topic).set_data({"n": 1})
    command_id = client.execute_async(publish, got.append)
    assert command_id and got == []  # a publish has no ack message to give
    client.publish_flush(30)
    with client.bookmark_subscribe(topic, "0") as stream:
        assert next(stream).data == {"n": 1}


def test_asyncio_publishes_streams_and_waits_bounded(uri, topic_factory):
    topic = topic_factory(1)

    async def run() -> list[object]:
        async with AsyncClient("async-api") as client:
            await client.connect(uri)
            await client.logon(30)
            sequences = [await client.publish(topic, {"n": n}) for n in range(3)]
            assert sequences == sorted(sequences)
            await client.publish_flush(30)
            seen: list[object] = []
            async with await client.bookmark_subscribe(topic, "0") as stream:
                async for message in stream:
                    seen.append(message.data)
                    if message is COMPLETED:
                        break
                assert await stream.next(timeout=0.3) is None  # open, nothing new
                await client.publish(topic, {"n": 3})
                await client.publish_flush(30)
                late = await stream.next(timeout=30)
                seen.append(late.data if late is not None else "timed out")
            return seen

    assert asyncio.run(run()) == [{"n": 0}, {"n": 1}, {"n": 2}, None, {"n": 3}]


def test_asyncio_handlers_may_be_coroutines_and_survive_their_exceptions(
    uri, topic_factory, caplog
):
    """execute_async awaits an async def handler on the loop, in order; a handler that
    raises is logged and delivery goes on; unsubscribe stops it; on_message is refused."""
    topic = topic_factory(1)

    async def run() -> list[object]:
        async with AsyncClient("async-handlers") as client:
            await client.connect(uri)
            await client.logon(30)
            for n in range(3):
                await client.publish(topic, {"n": n})
            await client.publish_flush(30)
            seen: list[object] = []
            caught_up = asyncio.Event()

            async def handler(message: Message) -> None:
                await asyncio.sleep(0)  # a real coroutine: awaited before the next message
                seen.append(message.data)
                if message is COMPLETED:
                    caught_up.set()
                elif message.data == {"n": 1}:
                    raise RuntimeError("handler failed on purpose")

            command = Command("subscribe").set_topic(topic).set_bookmark("0").set_sub_id("h")
            assert await client.execute_async(command, handler) == "h"
            await asyncio.wait_for(caught_up.wait(), 30)
            await client.unsubscribe("h")
            assert client._handled == {}
            try:
                await client.subscribe(topic, on_message=handler)
            except TypeError as exc:
                assert "execute_async" in str(exc)
            else:
                raise AssertionError("on_message was accepted")
            return seen

    with caplog.at_level(logging.ERROR, logger="amps_on_kafka.client.aio"):
        assert asyncio.run(run()) == [{"n": 0}, {"n": 1}, {"n": 2}, None]
    assert "handler failed on purpose" in caplog.text


def test_an_async_stream_runs_at_most_max_pending_ahead():
    """The pump stops reading once max_pending messages wait for the application."""
    pulled: list[int] = []

    def source():
        for n in range(10):
            pulled.append(n)
            yield COMPLETED
        while True:
            yield TICK

    async def run() -> tuple[int, int]:
        stream = AsyncStream(MessageStream(source(), lambda: None), max_pending=2)
        await asyncio.to_thread(wait_for, lambda: len(pulled) >= 2)
        await asyncio.sleep(0.3)  # a few ticks of the pump: it must not read on
        held = len(pulled)
        await stream.next(timeout=30)  # one taken: room for one more
        await asyncio.to_thread(wait_for, lambda: len(pulled) >= 3)
        await stream.close()
        return held, len(pulled)

    assert asyncio.run(run()) == (2, 3)


def test_the_three_styles_query_a_worker_alike(served, connect):
    """sow over tcp:// as an iterator, through a handler and with asyncio."""
    client = connect(served.uri)
    for n in range(3):
        client.publish(served.topic, {"id": n, "qty": n * 10})
    client.publish_flush(30)

    def rows(messages) -> list[object]:
        return sorted(m.data["id"] for m in messages if m.command == "sow")

    wait_for(lambda: rows(client.sow(served.topic, timeout=30)) == [0, 1, 2])
    got: list[Message] = []
    query = Command("sow").set_topic(served.topic).set_filter("/qty >= 10")
    client.execute_async(query, got.append)
    wait_for(lambda: rows(got) == [1, 2])

    async def run() -> list[object]:
        async with AsyncClient(client=connect(served.uri)) as aclient:
            stream = await aclient.sow(served.topic, "/qty < 20")
            return rows([m async for m in stream])

    assert asyncio.run(run()) == [0, 1]


def test_a_query_handler_gets_group_begin_the_records_and_group_end(served, connect):
    """A handler can't see a stream end, so execute_async of a sow delivers AMPS's
    group_begin and group_end around the records, through a Client, an HAClient and an
    AsyncClient's coroutine handler; an iterator of the same query gets the records."""
    client = connect(served.uri)
    client.publish(served.topic, {"id": 1, "qty": 10})
    client.publish_flush(30)
    wait_for(lambda: [m.sow_key for m in client.sow(served.topic, timeout=30)] == ["1"])
    query = Command("sow").set_topic(served.topic)
    expected = ["group_begin", "sow", "group_end"]

    def delivered(runner: object) -> list[str]:
        got: list[Message] = []
        ended = threading.Event()

        def handler(message: Message) -> None:
            got.append(message)
            if message.command == "group_end":
                ended.set()

        runner.execute_async(query, handler)  # type: ignore[attr-defined]
        assert ended.wait(30), got
        return [m.command for m in got]

    assert delivered(client) == expected
    assert [m.command for m in client.execute(query)] == ["sow"]
    with HAClient(f"ha-{client.name}", [served.uri]) as ha:
        ha.connect_and_logon()
        assert delivered(ha) == expected

    async def run() -> list[str]:
        got: list[Message] = []
        ended = asyncio.Event()

        async def handler(message: Message) -> None:
            got.append(message)
            if message.command == "group_end":
                ended.set()

        async with AsyncClient(client=connect(served.uri)) as aclient:
            await aclient.execute_async(query, handler)
            await asyncio.wait_for(ended.wait(), 30)
        return [m.command for m in got]

    assert asyncio.run(run()) == expected
