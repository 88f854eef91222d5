"""Message streams: what subscriptions return, to iterate in a for loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class MessageStream:
    """An iterable of messages (and a `completed` marker where one was asked for).

    Closing the stream ends the subscription; use it as a context manager.
    """

    def __init__(
        self, source: Iterator[Any], on_close: Callable[[], None], sub_id: str | None = None
    ) -> None:
        self._source = source
        self._on_close = on_close
        self._closed = False
        self.sub_id = sub_id

    def __iter__(self) -> Iterator[Any]:
        return self._source if not self._closed else iter(())  # no extra frame per message

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        return next(self._source)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()

    def __enter__(self) -> MessageStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
