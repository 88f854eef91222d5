"""The adapter client: `Client`, the `Message`s and streams it returns, and `Command`;
bookmark and publish stores, the reconnecting `HAClient` (docs/subscribers.md) and the
asyncio `AsyncClient`, all on the one engine of `Client`."""

from amps_on_kafka.client.aio import AsyncClient, AsyncStream
from amps_on_kafka.client.base import ClientBase
from amps_on_kafka.client.bookmark_store import MemoryBookmarkStore
from amps_on_kafka.client.client import Client
from amps_on_kafka.client.command import Command
from amps_on_kafka.client.ha import Backoff, HAClient, RoundRobinChooser
from amps_on_kafka.client.logged_bookmark_store import LoggedBookmarkStore
from amps_on_kafka.client.message import COMPLETED, DeleteAck, Message
from amps_on_kafka.client.publish_store import FilePublishStore, MemoryPublishStore
from amps_on_kafka.client.ring_bookmark_store import RingBookmarkStore
from amps_on_kafka.client.stream import MessageStream

__all__ = [
    "COMPLETED",
    "AsyncClient",
    "AsyncStream",
    "Backoff",
    "Client",
    "ClientBase",
    "Command",
    "DeleteAck",
    "FilePublishStore",
    "HAClient",
    "LoggedBookmarkStore",
    "MemoryBookmarkStore",
    "MemoryPublishStore",
    "Message",
    "MessageStream",
    "RingBookmarkStore",
    "RoundRobinChooser",
]
