"""subscribe: live SOW changes, or the log itself through a Replay.

A subscription to a SOW topic of this worker follows the engine: each upsert whose new
record matches is delivered as `publish`; with the `oof` option, a record the subscriber
could have seen (its old version matched) that is deleted, expires or stops matching is
announced by `oof` with reason `deleted`, `expired` or `match` (the last carrying the
new record), or `entitlement` when the new record is outside the user's entitlement
filter (carrying the old record: the user may not see the new one). Its filter runs on
the gateway's pool, never on the event loop (see server/fanout.py); the loop only writes
the frames found.

A subscription with a bookmark, or to a log topic that is not a SOW topic, reads the
log: a Replay (one Kafka consumer, assigned, never in a group) iterated on a thread of
its own, from the bookmark or from NOW. Its `completed` ack marks the end of the replay.
The thread waits for the connection to drain every BACKPRESSURE_EVERY messages, so a
replay goes at the subscriber's pace instead of filling memory. Its options (rate,
conflation, live, fully_durable: seed 004) are parsed and applied by log/controls.py,
the code a kafka:// client runs for itself, so both transports behave alike.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING

from amps_on_kafka import NOW
from amps_on_kafka.errors import AmpsError, MessageError, TransportError
from amps_on_kafka.expr import Filter, compile_filter
from amps_on_kafka.log.controls import TICK, Controlled, ReplayOptions, controlled, parse_options
from amps_on_kafka.log.message import Completed, LogMessage
from amps_on_kafka.log.replay import Replay
from amps_on_kafka.protocol.frames import encode_frame
from amps_on_kafka.server.replies import ack, delivery, log_delivery, log_payload, record_payload
from amps_on_kafka.server.requests import (
    ProtocolError,
    Request,
    compiled_filter,
    options,
    text,
    words,
)
from amps_on_kafka.state.events import Change, ChangeKind
from amps_on_kafka.state.record import SowRecord

if TYPE_CHECKING:
    from amps_on_kafka.server.session import Session

log = logging.getLogger(__name__)

SUBSCRIBE_OPTIONS = frozenset({"oof"})
REPLAY_IDLE = 0.25  # seconds: how often an idle replay thread checks that it should go on
BACKPRESSURE_EVERY = 500
MAX_HELD_CHANGES = 200_000  # live changes a sow_and_subscribe holds while its snapshot goes
PUBLISHED = frozenset({"publish", "delta_publish"})
#: A subscription forwarded to a peer gateway (server/cluster.py) carries the user's
#: entitlement filter under this key. The peer's session reads unrestricted, so without
#: it a record leaving the user's entitled set was an oof `match` carrying the new record,
#: which the user may not see; with it, an oof `entitlement` with the record as they saw it.
ENTITLEMENT = "_entitlement"


def subscription_id(header: dict) -> str:
    """`sub_id`, else the `cid`; recorded in the header so that every reply carries it."""
    sub_id = text(header, "sub_id") or text(header, "cid")
    if sub_id is None:
        raise ProtocolError(f"{header.get('c')} needs 'sub_id' (or 'cid')")
    header["sub_id"] = sub_id
    return sub_id


class SowSubscription:
    """Live changes of one SOW topic, filtered; buffered until a snapshot has been sent."""

    def __init__(
        self,
        session: Session,
        sub_id: str,
        topic: str,
        filter: Filter | None,
        *,
        oof: bool,
        header: dict | None = None,
    ) -> None:
        self.session = session
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter  # the user's filter AND the entitlement filter (session.py)
        self.entitlement = entitlement_of(session, topic, header or {})
        self.oof = oof
        self.closed = False
        self.buffer: list[tuple[int, bytes]] | None = None  # batch number, its frames
        self.held = 0  # changes that arrived while buffering
        self.first = 0  # batches numbered below this one came before the subscription

    def register(self) -> None:
        """Start receiving the engine's changes (the loop, once the session holds it)."""
        self.session.gateway.fanout.add(self)
        if self.oof:
            self._want_previous()

    def _want_previous(self) -> None:
        """oof needs each upsert's old record, which the worker reads only when asked.

        Batches numbered before the request may have been applied without it; they were
        durable before this subscription existed, so it skips them.
        """
        fanout = self.session.gateway.fanout
        with fanout.engine.lock:
            fanout.engine.want_previous(self.topic)
            self.first = fanout.batches + 1

    def hold(self) -> None:
        """Buffer changes until go_live (sow_and_subscribe sends its snapshot meanwhile)."""
        self.buffer = []
        self.held = 0

    def raise_if_overflowed(self) -> None:
        """More than MAX_HELD_CHANGES arrived while the snapshot went out: they were
        dropped, and the subscription fails rather than go live with a gap."""
        if self.held > MAX_HELD_CHANGES:
            raise TransportError(
                f"sow_and_subscribe {self.sub_id}: more than {MAX_HELD_CHANGES:,} changes "
                "arrived while its snapshot was sent (a slow consumer); subscribe again"
            )

    def go_live(self, first: int) -> None:
        """Deliver the buffered batches numbered `first` or later, then follow live.
        Batches still being filtered (server/fanout.py) come later: those numbered below
        `first` are in the snapshot, so they are skipped then too."""
        held, self.buffer = self.buffer or [], None
        self.first = max(self.first, first)
        for number, frames in held:
            if number >= first and frames:
                self.session.send_encoded(frames)

    # -- the gateway's pool ----------------------------------------------------------
    def frames_for(self, changes: list[Change]) -> bytes:
        """The `publish` and `oof` frames these changes give this subscription, encoded."""
        frames = []
        for change in changes:
            reply = self._reply(change)
            if reply is not None:
                frames.append(encode_frame(*reply))
        return b"".join(frames)

    # -- the event loop ----------------------------------------------------------------
    def on_frames(self, number: int, offered: int, frames: bytes) -> None:
        if number < self.first:
            return
        if self.buffer is not None:
            self.held += offered
            if self.held > MAX_HELD_CHANGES:
                self.buffer.clear()  # memory stays bounded however slow the snapshot
            else:
                self.buffer.append((number, frames))
        elif frames and not self.closed:
            self.session.send_encoded(frames)

    def fail(self, reason: str) -> None:
        """Ended by the gateway (server/fanout.py's bound): a failure ack names why."""
        session = self.session
        if session.subscriptions.get(self.sub_id) is self:
            session.remove_subscription(self.sub_id)
        self.close()
        session.fail(
            {"sub_id": self.sub_id, "t": self.topic}, f"subscription {self.sub_id}: {reason}"
        )

    def _reply(self, change: Change) -> tuple[dict, bytes] | None:
        old_matched = self.oof and change.old is not None and self._matches(change.old)
        if change.kind is ChangeKind.UPSERT:
            new: SowRecord = change.new  # type: ignore[assignment]
            if self._matches(new):
                return delivery("publish", self.sub_id, new), record_payload(new)
            if old_matched and not _entitled(self.entitlement, new):  # show the old, not new
                return delivery("oof", self.sub_id, change.old, "entitlement"), record_payload(
                    change.old  # type: ignore[arg-type]
                )
            if old_matched:
                return delivery("oof", self.sub_id, new, "match"), record_payload(new)
            return None
        if old_matched:
            reason = "deleted" if change.kind is ChangeKind.DELETE else "expired"
            return delivery("oof", self.sub_id, change.old, reason), record_payload(change.old)  # type: ignore[arg-type]
        return None

    def _matches(self, record: SowRecord) -> bool:
        if self.filter is None:
            return True
        try:
            return self.filter.matches(record.data)
        except MessageError:
            return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fanout = self.session.gateway.fanout
        fanout.remove(self)
        if self.oof:
            fanout.engine.release_previous(self.topic)


def entitlement_of(session: Session, topic: str, header: dict) -> Filter | None:
    """The filter limiting what the subscriber may see of `topic`: its user's, or for a
    peer gateway's session, the one the forwarded command carries (ENTITLEMENT)."""
    forwarded = header.get(ENTITLEMENT)
    identity = session.identity
    if isinstance(forwarded, str) and identity is not None and identity.method == "peer":
        return compile_filter(forwarded)
    return session.entitlement_filter(topic)


def _entitled(entitlement: Filter | None, record: SowRecord) -> bool:
    """Whether the user may see `record` (docs/security.md, Entitlements)."""
    try:
        return entitlement is None or entitlement.matches(record.data)
    except MessageError:
        return False


class LogSubscription:
    """The log from a bookmark (or NOW), filtered, on a thread that owns its Replay."""

    def __init__(
        self,
        session: Session,
        request: Request,
        sub_id: str,
        topic: str,
        filter: Filter | None,
        replay_options: ReplayOptions,
    ) -> None:
        self.session = session
        self.request = request
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.options = replay_options
        self.closed = False
        self._completed = False
        self._stop = threading.Event()
        self._loop = asyncio.get_running_loop()

    async def start(self, bookmark: str) -> None:
        gateway = self.session.gateway
        run = await gateway.blocking(
            partial(
                controlled,
                self._open_replay,
                bookmark,
                self.options,
                bounded=False,
                idle_limit=None,
                heartbeat=REPLAY_IDLE,  # TICKs: the thread sees a close in a quiet log
                sleep=self._stop.wait,  # a paced wait ends at once when it closes
            )
        )
        if self.closed:
            await gateway.blocking(run.source.close)
            return
        if self.request.wants("processed"):
            self.session.send(ack(self.request.header, "processed"))
        gateway.run_thread(partial(self._pump, run), f"amps-replay-{self.sub_id}")

    def _open_replay(self, bookmark: str, max_idle: float | None) -> Replay:
        gateway = self.session.gateway
        return Replay(
            gateway.bootstrap,
            self.topic,
            bookmark,
            predicate=self.filter.matches if self.filter is not None else None,
            registry=gateway.registry,
            max_idle=max_idle,
        )

    def close(self) -> None:
        self.closed = True
        self._stop.set()

    # -- the replay thread -------------------------------------------------------------
    def _pump(self, run: Controlled) -> None:
        posted = 0
        try:
            for item in run.items:  # never ends; a TICK after REPLAY_IDLE without messages
                if self._stop.is_set():
                    break
                if item is TICK:
                    continue
                self._loop.call_soon_threadsafe(self._deliver, item)
                posted += 1
                if posted % BACKPRESSURE_EVERY == 0:
                    self._wait_drained()
        except AmpsError as exc:
            self._post_failure(exc.reason)
        except RuntimeError:
            pass  # the event loop closed under us: the gateway stopped
        finally:
            run.source.close()

    def _wait_drained(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self.session.drain(), self._loop)
        while not self._stop.is_set():
            try:
                future.result(REPLAY_IDLE)
                return
            except TimeoutError:
                continue
        future.cancel()

    def _post_failure(self, reason: str) -> None:
        reason = f"subscription {self.sub_id}: {reason}"
        with suppress(RuntimeError):  # the event loop closed under us: the gateway stopped
            self._loop.call_soon_threadsafe(self.session.fail, self.request.header, reason)

    # -- the event loop ----------------------------------------------------------------
    def _deliver(self, item: LogMessage | Completed) -> None:
        if self.closed:
            return
        if isinstance(item, Completed):
            if not self._completed and self.request.wants("completed"):
                self.session.send(ack(self.request.header, "completed"))
            self._completed = True
            return
        try:
            if item.command not in PUBLISHED:
                return  # sow_delete records are state changes, not messages
            self.session.send(log_delivery(self.sub_id, item), log_payload(item))
        except MessageError as exc:
            log.warning("subscription %s skips %s: %s", self.sub_id, item.bookmark, exc)


async def subscribe(session: Session, request: Request) -> None:
    header = request.header
    topic = text(header, "t", required=True)
    sub_id = subscription_id(header)
    filter = await compiled_filter(session, header)
    if session.closed:  # while the filter compiled: a subscription now would never be closed
        return
    bookmark = text(header, "bm")
    if bookmark is None and session.gateway.engine.is_sow_topic(topic):
        oof = "oof" in options(header, SUBSCRIBE_OPTIONS)
        sub = SowSubscription(session, sub_id, topic, filter, oof=oof, header=header)
        if session.gateway.cluster is not None:  # the whole topic, over the group's workers
            await session.gateway.cluster.subscribe(session, request, sub)
            return
        session.add_subscription(sub)
        sub.register()
        if request.wants("processed"):
            session.send(ack(header, "processed"))
        return
    replayed = LogSubscription(session, request, sub_id, topic, filter, log_options(header))
    session.add_subscription(replayed)
    session.spawn(replayed.start(bookmark or NOW), request, on_failure=replayed)


def log_options(header: dict) -> ReplayOptions:
    """A log subscription's `o`, parsed by log/controls.py as a kafka:// client parses
    it; an OptionError names what is wrong. `pause` is the client's own: it holds the
    stream it reads (Client.pause / resume), and nothing of it goes over the wire."""
    given = (text(header, "o") or "").split(",")
    parsed = parse_options(",".join(item for item in given if item.strip() != "oof"))
    if "oof" in words(header, "o"):
        raise ProtocolError("oof needs a SOW topic of this worker and no bookmark")
    if parsed.paused:
        raise ProtocolError("pause is not a gateway option: the client pauses its own stream")
    return parsed
