"""Replay controls for bookmark subscriptions (seed 004): rate, conflation, pause, shared replays.

AMPS applies these on the server, to the replay it runs for a subscription. With the
`kafka://` transport the replay runs in the client (a Replay: one consumer reading the
log), so the controls are wrappers over the Replay's iterator, each with one job:

- RateLimiter: at most N messages/s, N bytes/s, or a multiple of the original pace
  (from the records' LogAppendTime timestamps);
- Conflator: holds messages for an interval and delivers the newest per conflation key,
  carrying the bookmark of the FIRST message it replaced (so recovering from that
  bookmark loses nothing);
- PauseGate: stops delivery without dropping the subscription or its position;
- FanOut: one replay feeding several subscriptions, in one order (resumed together);
- Ticks: a Replay yields only when a record arrives; a conflator holding messages needs
  to be woken in a quiet log, so Ticks lets a quiet replay end and reopens it where it
  stopped, yielding TICK in between.

Options are spelt as AMPS spells them: `rate=1000`, `rate=500KB`, `rate=2x`, `pause`,
`conflation=1s,conflation_key=/id`, `live`, `fully_durable`.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from amps_on_kafka.config import parse_duration
from amps_on_kafka.errors import MessageError, OptionError
from amps_on_kafka.log.bookmarks import TP, Position, format_list
from amps_on_kafka.log.envelope import H_PUBLISHER, H_SEQUENCE
from amps_on_kafka.log.keys import KeyExtractor
from amps_on_kafka.log.message import COMPLETED, LogMessage
from amps_on_kafka.log.message import TICK as TICK  # where streams have always imported it
from amps_on_kafka.log.replay import Replay

Predicate = Callable[[Any], bool]
SLACK = 0.05  # seconds a paced stream may fall behind before it stops catching up
MIN_TICK = 0.05  # seconds: how often a quiet conflated replay is reopened, at most
# Keys a conflator holds at most: beyond, the oldest is delivered before its interval
# ends. A gateway conflates for any client, so the interval must not decide its memory.
MAX_CONFLATED = 100_000


# -- options --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """A delivery limit: messages/s, bytes/s, or a multiple of the original rate."""

    amount: float
    unit: Literal["messages", "bytes", "multiple"]

    def __str__(self) -> str:
        amount = f"{self.amount:g}"
        return {"messages": amount, "bytes": f"{amount}B", "multiple": f"{amount}x"}[self.unit]


_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(x|b|kb|mb|gb)?$", re.IGNORECASE)
_BYTE_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_rate(text: str) -> Rate:
    """`1000` (messages/s), `500KB` (bytes/s, KB = 1024 bytes), `2x` / `0.5x` (multiple)."""
    match = _RATE.match(text.strip())
    if not match or float(match[1]) <= 0:
        raise OptionError(
            f"rate {text!r}: expected a positive number of messages/s (1000), "
            "bytes/s (500KB, 2MB) or a multiple of the original rate (2x, 0.5x)"
        )
    amount, unit = float(match[1]), (match[2] or "").lower()
    if unit == "x":
        return Rate(amount, "multiple")
    if unit:
        return Rate(amount * _BYTE_UNITS[unit], "bytes")
    return Rate(amount, "messages")


@dataclass(frozen=True)
class ReplayOptions:
    rate: Rate | None = None
    paused: bool = False
    conflation: float | None = None  # seconds
    conflation_keys: tuple[str, ...] = ()
    live: bool = False
    fully_durable: bool = False

    def server_options(self) -> str | None:
        """The options for a gateway to apply: all but `pause`, which the client holds."""
        parts = [f"rate={self.rate}"] if self.rate is not None else []
        if self.conflation is not None:
            parts.append(f"conflation={self.conflation:g}s")
        parts.extend(f"conflation_key={key}" for key in self.conflation_keys)
        parts.extend(name for name in ("live", "fully_durable") if getattr(self, name))
        return ",".join(parts) or None


_FLAGS = {"pause": "paused", "live": "live", "fully_durable": "fully_durable"}
_VALUED = ("rate", "conflation", "conflation_key")


def parse_options(text: str | None) -> ReplayOptions:
    """AMPS's comma-separated subscription options; OptionError names what is wrong."""
    fields: dict[str, Any] = {}
    keys: list[str] = []
    for item in (part.strip() for part in (text or "").split(",")):
        name, _, value = item.partition("=")
        name = name.strip().lower()
        if not item:
            continue
        if name in _FLAGS and not value:
            fields[_FLAGS[name]] = True
        elif name == "rate" and value:
            fields["rate"] = parse_rate(value)
        elif name == "conflation" and value:
            fields["conflation"] = _interval(value)
        elif name == "conflation_key" and value.strip().startswith("/"):
            keys.append(value.strip())
        else:
            raise OptionError(
                f"unknown or malformed option {item!r} (known: {', '.join(_FLAGS)}, "
                f"{', '.join(f'{v}=...' for v in _VALUED)})"
            )
    options = ReplayOptions(conflation_keys=tuple(keys), **fields)
    _check_combination(options)
    return options


def _interval(value: str) -> float:
    try:
        seconds = parse_duration(value.strip())
    except ValueError as exc:
        raise OptionError(f"conflation interval: {exc}") from exc
    if seconds <= 0:
        raise OptionError(f"conflation interval {value!r} must be longer than 0")
    return seconds


def _check_combination(options: ReplayOptions) -> None:
    if options.conflation_keys and options.conflation is None:
        raise OptionError("conflation_key needs conflation=<interval>")
    if options.live and (options.rate or options.paused):
        raise OptionError("rate and pause are not supported with the live option (seed 004)")
    if options.live and options.fully_durable:
        raise OptionError("live and fully_durable exclude each other")


# -- rate ---------------------------------------------------------------------------


class RateLimiter:
    """Paces messages; COMPLETED and TICK pass at once.

    Due times advance by exact steps, so sleeping late never accumulates into a slower
    rate; a stream that fell behind by more than SLACK (a pause, a quiet live log)
    starts again from now instead of bursting to catch up.
    """

    def __init__(
        self,
        rate: Rate,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep

    def paced(self, items: Iterable[Any]) -> Iterator[Any]:
        if self.rate.unit == "multiple":
            return self._by_timestamps(items)
        return self._by_weight(items, self.rate.unit == "bytes")

    def _by_weight(self, items: Iterable[Any], by_bytes: bool) -> Iterator[Any]:
        per_second, clock = self.rate.amount, self._clock
        due = clock()
        for item in items:
            if isinstance(item, LogMessage):
                now = clock()
                if due > now:
                    self._sleep(due - now)
                elif now - due > SLACK:
                    due = now
                due += (len(item.raw or b"") if by_bytes else 1) / per_second
            yield item

    def _by_timestamps(self, items: Iterable[Any]) -> Iterator[Any]:
        """Message i is due at start + (its timestamp - the first's) / multiple."""
        factor, clock = self.rate.amount, self._clock
        anchor_wall = anchor_stamp = latest = None
        for item in items:
            if isinstance(item, LogMessage):
                now = clock()
                # partitions interleave: a stamp older than one already paced is not waited for
                latest = item.timestamp if latest is None else max(latest, item.timestamp)
                if anchor_wall is None:
                    anchor_wall, anchor_stamp = now, latest
                due = anchor_wall + (latest - anchor_stamp) / 1000 / factor
                if due > now:
                    self._sleep(due - now)
                elif now - due > SLACK:
                    anchor_wall, anchor_stamp = now, latest
            yield item


# -- conflation ---------------------------------------------------------------------


class Conflator:
    """Holds each message for the interval; a newer one with the same key replaces it.

    The delivered message has the newest payload and headers but the bookmark (offset),
    publisher id and sequence of the FIRST message held for that key (seed 004): a
    subscriber that recovers from that bookmark gets the replaced messages again, and
    duplicate detection sees sequences in log order. The key is the conflation_key
    fields, else the SOW key; a message with neither is not conflated. Held messages are
    released before COMPLETED, so the marker still means "the replay has been delivered".
    At most `max_held` keys are held: a newer key beyond that releases the oldest early
    (conflated less, never lost), so memory doesn't grow with the interval.
    """

    def __init__(
        self,
        interval: float,
        key_paths: Sequence[str] = (),
        *,
        max_held: int = MAX_CONFLATED,
        on_holding: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.max_held = max_held
        self._extract = KeyExtractor(key_paths) if key_paths else None
        self._on_holding = on_holding or (lambda holding: None)
        self._clock = clock

    def conflated(self, items: Iterable[Any]) -> Iterator[Any]:
        held: OrderedDict[Any, list] = OrderedDict()  # key -> [first, newest, deadline]
        for item in items:
            if item is COMPLETED:
                yield from self._release(held, None)
                yield item
                continue
            if isinstance(item, LogMessage):
                self._hold(held, item)
            elif item is not TICK:
                yield item
            yield from self._release(held, self._clock())
            if item is TICK:
                yield item  # the reader wakes: a closed subscription's thread sees it
        yield from self._release(held, None)

    def _hold(self, held: OrderedDict[Any, list], message: LogMessage) -> None:
        key = self._key(message)
        entry = held.get(key)
        if entry is None:
            held[key] = [message, message, self._clock() + self.interval]
            if len(held) == 1:
                self._on_holding(True)
        else:
            entry[1] = message

    def _release(self, held: OrderedDict[Any, list], now: float | None) -> Iterator[LogMessage]:
        """Messages whose interval ended (all of them when now is None), oldest first,
        and the oldest beyond max_held."""
        had = bool(held)
        while held:
            first, newest, deadline = next(iter(held.values()))
            if now is not None and deadline > now and len(held) <= self.max_held:
                break
            held.popitem(last=False)
            yield merged(first, newest)
        if had and not held:
            self._on_holding(False)

    def _key(self, message: LogMessage) -> Any:
        """A message with no key, or whose payload or headers don't decode, is never
        conflated with another: it is delivered as it is, and the replay goes on."""
        try:
            message.envelope  # noqa: B018 - merged() reads the headers: they must decode
            if self._extract is not None:
                return self._extract(message.data)
            return message.sow_key or message.bookmark
        except MessageError:
            return message.bookmark


def merged(first: LogMessage, newest: LogMessage) -> LogMessage:
    """The newest message, with the first one's place in the log and its publisher."""
    if first is newest:
        return first
    stamp = [(n, v) for n, v in first.headers or () if n in (H_PUBLISHER, H_SEQUENCE)]
    rest = [(n, v) for n, v in newest.headers or () if n not in (H_PUBLISHER, H_SEQUENCE)]
    return LogMessage(
        first.topic,
        first.partition,
        first.offset,
        newest.timestamp,
        newest.raw,
        stamp + rest,
        newest.codec,
    )


# -- ticks for a quiet log ---------------------------------------------------------------


class Ticks:
    """Replays one after another, with TICK between them while a consumer is holding.

    Replay yields only when a record arrives. While `holding` (a conflator has messages
    to release on time), the current replay ends after `tick` quiet seconds (its
    max_idle) and the next opens after the last message it delivered; otherwise it waits
    as long as the subscription's own idle timeout. COMPLETED is passed once.
    """

    def __init__(
        self,
        open_replay: Callable[[str, float | None], Replay],
        bookmark: str,
        *,
        tick: float,
        idle_limit: float | None,
    ) -> None:
        self._open = open_replay
        self._tick = tick
        self._idle_limit = idle_limit
        self._holding = False
        self.replay = open_replay(bookmark, idle_limit)
        self.positions = dict(self.replay.starts)  # the next offset per partition

    def holding(self, holding: bool) -> None:
        self._holding = holding
        self.replay.max_idle = self._max_idle()

    def _max_idle(self) -> float | None:
        if not self._holding:
            return self._idle_limit
        return self._tick if self._idle_limit is None else min(self._tick, self._idle_limit)

    def __iter__(self) -> Iterator[Any]:
        completed = False
        quiet_since = time.monotonic()
        positions = self.positions
        while True:
            for item in self.replay:
                if item is COMPLETED:
                    if completed:
                        continue
                    completed = True
                else:
                    positions[(item.topic, item.partition)] = item.offset + 1
                quiet_since = time.monotonic()
                yield item
            if self.replay.stops is not None or not self._holding or self._idle_over(quiet_since):
                return  # reached `until`, or quiet for the subscription's idle timeout
            yield TICK
            self._reopen()

    def _idle_over(self, quiet_since: float) -> bool:
        limit = self._idle_limit
        return limit is not None and time.monotonic() - quiet_since >= limit

    def _reopen(self) -> None:
        previous = self.replay
        self.replay = self._open(resume_bookmark(self.positions), self._max_idle())
        previous.close()

    def close(self) -> None:
        self.replay.close()


def resume_bookmark(positions: dict[TP, int]) -> str:
    """A bookmark list that starts a replay at these next offsets (partitions at 0: EPOCH)."""
    listed = [Position(t, p, offset - 1) for (t, p), offset in sorted(positions.items()) if offset]
    return format_list(listed) or "0"


# -- all together -----------------------------------------------------------------------


@dataclass
class Controlled:
    """A replay with its controls applied: the items to deliver, the source to ask for
    positions and to close, and the first Replay (its starts and ends)."""

    items: Iterator[Any]
    source: Ticks | Replay
    replay: Replay


def controlled(
    open_replay: Callable[[str, float | None], Replay],
    bookmark: str,
    options: ReplayOptions,
    *,
    bounded: bool,
    idle_limit: float | None,
    heartbeat: float | None = None,
    sleep: Callable[[float], object] = time.sleep,
    batches: bool = False,
) -> Controlled:
    """Open a replay (`open_replay(bookmark, max_idle)`) and apply rate and conflation.

    A conflated replay that follows the log (not `bounded` by an end point) needs Ticks to
    release held messages in a quiet log; a bounded one releases them at its end. With
    `heartbeat` (a gateway's replay thread) the replay never ends and yields TICK after
    each quiet `heartbeat` seconds instead, which also wakes the conflator. `sleep` is
    how the rate limiter waits: a gateway passes its stop event's wait, so a slow rate
    never holds a closed subscription's thread. `batches`: a replay with a heartbeat and
    no rate or conflation hands its batches over whole (Replay.ticking).
    """
    source: Ticks | Replay
    ticks = None
    tick = max(MIN_TICK, options.conflation / 4) if options.conflation is not None else None
    if heartbeat is not None:
        source = replay = open_replay(bookmark, min(heartbeat, tick or heartbeat))
        plain = options.rate is None and options.conflation is None
        items: Iterator[Any] = replay.ticking(batches=batches and plain)
    elif tick is not None and not bounded:
        source = ticks = Ticks(open_replay, bookmark, tick=tick, idle_limit=idle_limit)
        replay = ticks.replay
        items = iter(source)
    else:
        source = replay = open_replay(bookmark, idle_limit)
        items = iter(source)
    if options.rate is not None:
        items = RateLimiter(options.rate, sleep=sleep).paced(items)
    if options.conflation is not None:
        holding = ticks.holding if ticks is not None else None
        conflator = Conflator(options.conflation, options.conflation_keys, on_holding=holding)
        items = conflator.conflated(items)
    return Controlled(items, source, replay)


# -- pause ---------------------------------------------------------------------------


class PauseGate:
    """Stops delivery while paused. `paused` is a plain attribute: checked per message."""

    def __init__(self, paused: bool = False) -> None:
        self.paused = paused
        self._running = threading.Event()
        if not paused:
            self._running.set()

    def pause(self) -> None:
        self.paused = True
        self._running.clear()

    def resume(self) -> None:
        self.paused = False
        self._running.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until resumed (or opened for good by a close), or for `timeout` seconds at
        most; False if still paused."""
        return self._running.wait(timeout)


# -- one replay, several subscriptions ------------------------------------------------------


class FanOut:
    """One replay delivered to several subscriptions, each with its own filter.

    Every branch sees the replay's items in the replay's order: that is what resuming
    several paused subscriptions together guarantees (seed 004). A branch that falls
    behind keeps a queue of what the others already read; the replay is read by
    whichever branch needs the next item, under a lock. A message matching several
    branches is copied for all but the first, so each subscription owns its message.
    """

    def __init__(
        self,
        replay: Replay,
        items: Iterator[Any],
        predicates: Sequence[Predicate | None],
    ) -> None:
        self.replay = replay
        self._positions = dict(replay.starts)  # the next offset the replay gives, per partition
        self._items = items
        self._predicates = list(predicates)
        self._queues: list[deque | None] = [deque() for _ in predicates]
        self._lock = threading.Lock()
        self._ended = False
        self._error: BaseException | None = None

    def branch(self, index: int) -> Iterator[Any]:
        queue = self._queues[index]
        while True:
            if queue:
                yield queue.popleft()
                continue
            with self._lock:
                if not queue and not self._pull():
                    if self._error is not None:
                        raise self._error
                    return

    def _pull(self) -> bool:
        """Read one item and hand it to every branch that wants it; False at the end."""
        if self._ended:
            return False
        try:
            item = next(self._items)
        except StopIteration:
            self._ended = True
            return False
        except Exception as exc:
            self._ended, self._error = True, exc
            return False
        if isinstance(item, LogMessage):
            self._positions[(item.topic, item.partition)] = item.offset + 1
        given = False
        for queue, predicate in zip(self._queues, self._predicates, strict=True):
            if queue is None or not _wanted(item, predicate):
                continue
            queue.append(_copy(item) if given else item)
            given = True
        return True

    def positions(self, index: int) -> dict[TP, int]:
        """Next offsets for one branch: the replay's, less what waits in its queue."""
        positions = dict(self._positions)
        for item in self._queues[index] or ():
            if isinstance(item, LogMessage):
                tp = (item.topic, item.partition)
                positions[tp] = min(positions[tp], item.offset)
        return positions

    def detach(self, index: int) -> None:
        """A branch closed; the replay closes with the last one."""
        with self._lock:
            self._queues[index] = None
            if all(queue is None for queue in self._queues):
                self.replay.close()


def _wanted(item: Any, predicate: Predicate | None) -> bool:
    if predicate is None or not isinstance(item, LogMessage):
        return True
    try:
        return predicate(item.data)
    except MessageError:
        return False  # a payload that doesn't decode can't match a content filter


def _copy(item: Any) -> Any:
    if not isinstance(item, LogMessage):
        return item
    return LogMessage(
        item.topic,
        item.partition,
        item.offset,
        item.timestamp,
        item.raw,
        item.headers,
        item.codec,
    )
