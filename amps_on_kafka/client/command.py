"""`Command`: AMPS's command builder, for `Client.execute`.

    stream = client.execute(Command("sow").set_topic("orders").set_filter("/qty > 10"))

Each setter returns the command, so calls chain; `Client.execute` runs it with the
client method of the same name. A Command is typed by what executing it returns, read
from its name (`Command("sow")` is a `Command[MessageStream]`), so a type checker knows
what `client.execute(command)` gives.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

if TYPE_CHECKING:
    from amps_on_kafka.client.message import DeleteAck
    from amps_on_kafka.client.stream import MessageStream

R = TypeVar("R")  # what executing the command returns

COMMANDS = frozenset(
    {
        "publish",
        "delta_publish",
        "sow_delete",
        "sow",
        "subscribe",
        "sow_and_subscribe",
        "unsubscribe",
        "flush",
        "heartbeat",
    }
)


class Command(Generic[R]):
    """An AMPS command to build and run with `client.execute` or `client.execute_async`."""

    @overload
    def __init__(
        self: Command[MessageStream], command: Literal["sow", "subscribe", "sow_and_subscribe"]
    ) -> None: ...
    @overload
    def __init__(self: Command[int], command: Literal["publish", "delta_publish"]) -> None: ...
    @overload
    def __init__(self: Command[DeleteAck], command: Literal["sow_delete"]) -> None: ...
    @overload
    def __init__(
        self: Command[None], command: Literal["unsubscribe", "flush", "heartbeat"]
    ) -> None: ...
    @overload
    def __init__(self: Command[Any], command: str) -> None: ...

    def __init__(self, command: str) -> None:
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r} (one of {', '.join(sorted(COMMANDS))})")
        self.command = command
        self.topic: str | None = None
        self.filter: str | None = None
        self.data: Any = None
        self.bookmark: str | None = None
        self.options: str | None = None
        self.order_by: str | None = None
        self.top_n: int | None = None
        self.batch_size: int | None = None
        self.sub_id: str | None = None
        self.sow_key: str | None = None
        self.sow_keys: list[str] | None = None
        self.expiration: float | None = None
        self.correlation_id: str | None = None
        self.timeout: float | None = None

    def set_topic(self, topic: str) -> Command[R]:
        """The topic (or a regular expression of topics, for bookmark subscriptions)."""
        self.topic = topic
        return self

    def set_filter(self, filter: str) -> Command[R]:
        """A content filter (docs/filters.md)."""
        self.filter = filter
        return self

    def set_data(self, data: Any) -> Command[R]:
        """The payload of a publish: a dict (JSON), str or bytes."""
        self.data = data
        return self

    def set_bookmark(self, bookmark: str) -> Command[R]:
        """Where a subscription replays from: it becomes a bookmark subscription."""
        self.bookmark = bookmark
        return self

    def set_options(self, options: str) -> Command[R]:
        """AMPS's options, comma-separated (oof, rate=..., conflation=..., ...)."""
        self.options = options
        return self

    def set_order_by(self, order_by: str) -> Command[R]:
        """A query's order: `/field [ASC|DESC], ...`."""
        self.order_by = order_by
        return self

    def set_top_n(self, top_n: int) -> Command[R]:
        """Keep only the first n records of a query."""
        self.top_n = top_n
        return self

    def set_batch_size(self, batch_size: int) -> Command[R]:
        """Records per sow frame from the gateway."""
        self.batch_size = batch_size
        return self

    def set_sub_id(self, sub_id: str) -> Command[R]:
        """The subscription's id (unsubscribe, pause and bookmark stores use it)."""
        self.sub_id = sub_id
        return self

    def set_sow_key(self, key: str) -> Command[R]:
        """The SOW key of a publish, for topics with KeyFromPublish."""
        self.sow_key = key
        return self

    def set_sow_keys(self, keys: Iterable[str] | str) -> Command[R]:
        """A list of keys, or AMPS's comma-separated text."""
        self.sow_keys = (
            [k.strip() for k in keys.split(",")] if isinstance(keys, str) else list(keys)
        )
        return self

    def set_expiration(self, seconds: float) -> Command[R]:
        """A publish's expiration, in seconds."""
        self.expiration = seconds
        return self

    def set_correlation_id(self, correlation_id: str) -> Command[R]:
        """An id stored with the record and delivered with it."""
        self.correlation_id = correlation_id
        return self

    def set_timeout(self, seconds: float) -> Command[R]:
        """For streams: end after this many idle seconds; for others: how long to wait."""
        self.timeout = seconds
        return self

    def __repr__(self) -> str:
        return f"Command({self.command!r}, topic={self.topic!r})"
