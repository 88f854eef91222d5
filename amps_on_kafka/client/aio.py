"""`AsyncClient`: the client for asyncio applications, on the same engine as `Client`.

    async with AsyncClient("viewer") as client:
        await client.connect("tcp://127.0.0.1:9007/amps/json")
        await client.logon()
        async with await client.subscribe("orders") as stream:
            async for message in stream:
                ...

It wraps a `Client` (or an `HAClient`, `AsyncClient(client=HAClient(...))`): commands run
on one worker thread per client, in the order they were awaited, so two publishes keep
their order and the event loop never blocks on a socket or on Kafka. Each stream has a
pump thread that reads the engine's stream and hands messages to the loop; it runs at
most MAX_PENDING messages ahead of the application (a slow consumer holds the pump, and
with it the subscription, back: the same flow control a for loop has).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar, overload

from amps_on_kafka.client.base import ClientBase
from amps_on_kafka.client.client import Client
from amps_on_kafka.client.command import Command
from amps_on_kafka.client.kafka_transport import KafkaConfigSource
from amps_on_kafka.client.message import DeleteAck
from amps_on_kafka.client.stream import TICK_INTERVAL, MessageStream, check_timeout
from amps_on_kafka.client.tcp_transport import DEFAULT_BATCH
from amps_on_kafka.log.message import Message

MAX_PENDING = 1000  # messages a stream's pump hands to the loop ahead of the application
JOIN_TIMEOUT = 10.0  # seconds close() waits for a pump thread

T = TypeVar("T")
R = TypeVar("R")  # what a Command returns
_END = object()
log = logging.getLogger(__name__)


class AsyncStream:
    """A MessageStream for `async for`; `await stream.next(timeout)` bounds a wait."""

    def __init__(
        self,
        stream: MessageStream,
        max_pending: int = MAX_PENDING,
        on_done: Callable[[AsyncStream], object] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}")
        self._stream = stream
        self._on_done = on_done
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._room = threading.Semaphore(max_pending)  # bounds what waits in the queue
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._pump, name=f"amps-async-{stream.sub_id or 'stream'}", daemon=True
        )
        self._thread.start()

    @property
    def sub_id(self) -> str | None:
        """The subscription's id (None for a query)."""
        return self._stream.sub_id

    def _pump(self) -> None:
        """Read the engine's stream on this thread; the stream is closed here too, so a
        kafka:// replay is never closed under a poll in progress."""
        end: object = _END
        try:
            while not self._stop.is_set():
                if not self._room.acquire(timeout=TICK_INTERVAL):
                    continue  # the application is MAX_PENDING behind: wait for it
                try:
                    message = self._stream.next(timeout=TICK_INTERVAL)
                except StopIteration:
                    self._room.release()
                    return
                if message is None:
                    self._room.release()
                    continue
                self._hand(message)
        except Exception as exc:  # the stream failed: the application gets the error
            end = exc
        finally:
            self._stream.close()
            self._hand(end)

    def _hand(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Message:
        item = await self._queue.get()
        if isinstance(item, Message):
            self._room.release()
            return item
        self._queue.put_nowait(item)  # the end: every later read ends the same way
        self._done()
        if isinstance(item, BaseException):
            raise item
        raise StopAsyncIteration

    async def next(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none came within `timeout` seconds; the stream
        stays open. Raises StopAsyncIteration once the stream has ended."""
        check_timeout(timeout, wait=True)
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except TimeoutError:
            return None

    async def close(self) -> None:
        """End the stream and its subscription."""
        self._stop.set()
        self._done()
        await asyncio.to_thread(self._thread.join, JOIN_TIMEOUT)

    def _done(self) -> None:
        if self._on_done is not None:
            self._on_done(self)

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncClient:
    """A Client for asyncio: every command is awaitable, every stream async-iterable."""

    def __init__(self, name: str | None = None, *, client: ClientBase | None = None) -> None:
        """Give a name (a new Client) or a client to wrap (e.g. an HAClient)."""
        if client is None:
            if name is None:
                raise ValueError("AsyncClient needs a name or a client")
            client = Client(name)
        self.client = client
        self.name = client.name
        self._commands = ThreadPoolExecutor(1, thread_name_prefix=f"amps-async-{self.name}")
        self._streams: set[AsyncStream] = set()
        self._handled: dict[str, asyncio.Task[None]] = {}  # execute_async deliveries by id
        self._ids = itertools.count(1)

    async def _run(self, call: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a client call on the command thread (one at a time, in order)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._commands, partial(call, *args, **kw))

    async def _stream(
        self, call: Callable[..., MessageStream], *args: Any, **kw: Any
    ) -> AsyncStream:
        return self._wrap(await self._run(call, *args, **kw))

    def _wrap(self, stream: MessageStream) -> AsyncStream:
        wrapped = AsyncStream(stream, on_done=self._streams.discard)
        self._streams.add(wrapped)
        return wrapped

    # -- connection ----------------------------------------------------------------------
    async def connect(self, uri: str, *, kafka_config: KafkaConfigSource = None) -> None:
        """Client.connect: `kafka_config` carries a secured Kafka's properties (kafka://)."""
        await self._run(self.client.connect, uri, kafka_config=kafka_config)

    async def logon(self, timeout: float | None = None) -> None:
        """Client.logon."""
        await self._run(self.client.logon, timeout)

    async def close(self) -> None:
        """Stop the handlers, close the streams, then the client (flushing what was
        published)."""
        await self._stop_handlers("all")
        for stream in list(self._streams):
            await stream.close()
        self._streams.clear()
        try:
            await self._run(self.client.close)
        finally:
            self._commands.shutdown(wait=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- publishing ----------------------------------------------------------------------
    async def publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        """Client.publish: the sequence number. Persisted once publish_flush returns."""
        return await self._run(self.client.publish, topic, data, expiration, **kw)

    async def delta_publish(
        self, topic: str, data: Any, expiration: float | None = None, **kw: Any
    ) -> int:
        """Client.delta_publish."""
        return await self._run(self.client.delta_publish, topic, data, expiration, **kw)

    async def sow_delete(
        self,
        topic: str,
        filter: str | None = None,
        *,
        keys: Iterable[str] | None = None,
        data: Any = None,
        **kw: Any,
    ) -> DeleteAck:
        """Client.sow_delete: a DeleteAck on both transports."""
        delete = self.client.sow_delete
        return await self._run(delete, topic, filter, keys=keys, data=data, **kw)

    async def publish_flush(self, timeout: float | None = None) -> None:
        """Client.publish_flush: wait until Kafka persisted every publish."""
        await self._run(self.client.publish_flush, timeout)

    # -- receiving -----------------------------------------------------------------------
    async def bookmark_subscribe(
        self,
        topic: str,
        bookmark: str,
        filter: str | None = None,
        *,
        until: str | None = None,
        timeout: float | None = None,
        sub_id: str | None = None,
        options: str | None = None,
        on_message: None = None,  # a type checker flags a handler: use execute_async
    ) -> AsyncStream:
        """Client.bookmark_subscribe, as an AsyncStream (handlers: execute_async)."""
        _no_handler("bookmark_subscribe", on_message)
        return await self._stream(
            self.client.bookmark_subscribe,
            topic,
            bookmark,
            filter,
            until=until,
            timeout=timeout,
            sub_id=sub_id,
            options=options,
        )

    async def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        sub_id: str | None = None,
        timeout: float | None = None,
        on_message: None = None,  # a type checker flags a handler: use execute_async
    ) -> AsyncStream:
        """Client.subscribe, as an AsyncStream (handlers: execute_async)."""
        _no_handler("subscribe", on_message)
        return await self._stream(
            self.client.subscribe, topic, filter, options, sub_id=sub_id, timeout=timeout
        )

    async def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        options: str | None = None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        sub_id: str | None = None,
        timeout: float | None = None,
        on_message: None = None,  # a type checker flags a handler: use execute_async
    ) -> AsyncStream:
        """Client.sow_and_subscribe, as an AsyncStream (handlers: execute_async)."""
        _no_handler("sow_and_subscribe", on_message)
        return await self._stream(
            self.client.sow_and_subscribe,
            topic,
            filter,
            options,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            sub_id=sub_id,
            timeout=timeout,
        )

    async def sow(
        self,
        topic: str,
        filter: str | None = None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout: float | None = None,
    ) -> AsyncStream:
        """Client.sow, as an AsyncStream."""
        return await self._stream(
            self.client.sow,
            topic,
            filter,
            order_by=order_by,
            top_n=top_n,
            batch_size=batch_size,
            timeout=timeout,
        )

    async def unsubscribe(self, sub_id: str = "all") -> None:
        """Client.unsubscribe; also stops an execute_async delivery of that id. This client's
        streams of that id close first, each on its pump thread, so a kafka:// replay is
        never closed under a poll in progress (closing one ends its subscription)."""
        stopped = await self._stop_handlers(sub_id)
        streams = [s for s in self._streams if sub_id in ("all", s.sub_id)]
        for stream in streams:
            await stream.close()
        if sub_id == "all" or not (stopped or streams):
            await self._run(self.client.unsubscribe, sub_id)

    @overload
    async def execute(self, command: Command[MessageStream]) -> AsyncStream: ...
    @overload
    async def execute(self, command: Command[R]) -> R: ...

    async def execute(self, command: Command[Any]) -> Any:
        """Client.execute; a command with a stream gives an AsyncStream."""
        return await self._execute(command, handled=False)

    async def _execute(self, command: Command[Any], *, handled: bool) -> Any:
        result = await self._run(self.client._execute, command, handled=handled)
        return self._wrap(result) if isinstance(result, MessageStream) else result

    async def execute_async(
        self, command: Command[Any], handler: Callable[[Message], object]
    ) -> str:
        """Client.execute_async for asyncio: `handler`, a function or an `async def`, runs on
        the event loop, one message at a time in order (a coroutine is awaited before the
        next message). Returns the command id (the sub_id of a subscription), which
        unsubscribe() takes to stop it. A query (sow) delivers group_begin, the records,
        then group_end. A handler that raises is logged and delivery goes on. A command
        without a stream runs now and hands the handler its ack, if any."""
        result = await self._execute(command, handled=True)
        if not isinstance(result, AsyncStream):
            if isinstance(result, Message):
                await _handle(handler, result)
            return command.sub_id or f"async-{next(self._ids)}"
        sub_id = result.sub_id or command.sub_id or f"async-{next(self._ids)}"
        await self._stop_handlers(sub_id)  # an id names one delivery at a time
        task = asyncio.get_running_loop().create_task(_deliver(result, handler))
        self._handled[sub_id] = task
        task.add_done_callback(lambda done: self._forget(sub_id, done))
        return sub_id

    def _forget(self, sub_id: str, task: asyncio.Task[None]) -> None:
        if self._handled.get(sub_id) is task:
            del self._handled[sub_id]

    async def _stop_handlers(self, sub_id: str) -> bool:
        """Cancel the execute_async deliveries of that id (each closes its stream); True
        if there was one."""
        names = list(self._handled) if sub_id == "all" else [sub_id]
        tasks = [task for name in names if (task := self._handled.pop(name, None))]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return bool(tasks)

    # -- queues ----------------------------------------------------------------------------
    async def ack(
        self,
        topic: str,
        bookmarks: str | Iterable[str],
        option: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Message:
        """Client.ack: returns once the gateway made the acks durable."""
        return await self._run(self.client.ack, topic, bookmarks, option, timeout=timeout)

    async def flush_acks(self) -> None:
        """Client.flush_acks: send the acks message.ack() batched."""
        await self._run(self.client.flush_acks)

    async def heartbeat(self, timeout: float | None = None) -> None:
        """Client.heartbeat."""
        await self._run(self.client.heartbeat, timeout)


def _no_handler(method: str, on_message: object) -> None:
    """AsyncClient's receiving methods return streams; handlers go through execute_async,
    which can await a coroutine handler on the loop."""
    if on_message is not None:
        raise TypeError(
            f"AsyncClient.{method} takes no on_message: iterate the AsyncStream it returns "
            "(async for), or run a Command with execute_async(command, handler), whose "
            "handler may be an async def"
        )


async def _handle(handler: Callable[[Message], object], message: Message) -> None:
    """Call a handler, awaiting it if it is a coroutine; an exception is logged."""
    try:
        outcome = handler(message)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("message handler %r raised on %r; delivery goes on", handler, message)


async def _deliver(stream: AsyncStream, handler: Callable[[Message], object]) -> None:
    """An execute_async delivery: every message of the stream to the handler, in order."""
    async with stream:
        async for message in stream:
            await _handle(handler, message)
