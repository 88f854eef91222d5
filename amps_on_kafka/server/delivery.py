"""Kafka's verdicts on the gateway's publishes, and the bound on those in flight.

Bounds: the commands produced and not yet reported by Kafka are counted against the
worker's PublishBudget (commands and bytes). A session that would exceed it waits, and
while it waits its socket is not read — the client is slowed down, the worker's memory is
not grown. Kafka's `message.timeout.ms` is the gateway's PublishTimeout, so a publish that
Kafka cannot take in time gets a failure ack naming the cause and frees its share.

`persisted` comes only from Kafka's delivery report (acks=all). librdkafka runs delivery
callbacks inside poll/flush only, so one DeliveryPump thread serves the shared producer
and hands the outcomes to the event loop in batches. With the compiled producer
(log/native_producer.py) a poll's reports of batched records come as one list per batch.

A fatal error (an idempotent producer that can no longer keep its guarantees) leaves
the producer refusing every produce for good: the pump replaces it (`_replace`). The
old one is flushed first, so each record it held is answered (Kafka's own verdict for
those in flight, a failure naming the fatal error for those it purged) before any
session writes to the new one: nothing from before lands after what is acknowledged
after. The sessions' commands produced meanwhile are refused at once, naming it. A
replacement that can't be built is tried again, after RENEW_FIRST seconds and twice as
long after each failure (up to RENEW_LONGEST), logged and counted (`renew_failures`):
publishing resumes once one is built, without a restart.

librdkafka reports every record within `message.timeout.ms` (its timeout scan runs once a
second) until its handle is destroyed; a record whose report still has not come
REPORT_MARGIN after that never gets one (a handle closed with records in it, or a bug
in the counting). The pump's sweep (`_sweep`, on the loop every SWEEP_EVERY) answers such
commands with a failure that says their fate is not known and frees their budget share,
logged at ERROR and counted (`unreported`): a lost report held its share for good, and a
session waiting for room stopped reading its connection.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from amps_on_kafka.errors import PublishError
from amps_on_kafka.log.native_producer import PURGED, CompiledProducer, fatal_text, flush_all
from amps_on_kafka.log.publisher import Persisted
from amps_on_kafka.processor.memory import release_freed_memory

if TYPE_CHECKING:
    from amps_on_kafka.server.writes import PublishBatch, Writes

log = logging.getLogger(__name__)

Outcome = Callable[[PublishError | None], None]  # runs on the loop with Kafka's verdict

IDLE_WAIT = 0.1  # seconds the pump waits for a report when nothing is in flight
SERVE_SLICE = 0.02  # seconds the pump waits for reports while something is in flight
DRAIN_SLICE = 500  # delivery outcomes handled per turn of the event loop
TRIM_AFTER_BYTES = 8 * 1024 * 1024  # see PublishBudget
TRIM_AFTER_COMMANDS = 2_000
# Batch numbers wrap at 31 bits: a compiled record's report carries its number as
# (batch << 32 | index) << 1 | 1 in 64 bits (native/src/rdkafka_reports.rs), and a
# gateway writing one-publish reads passes 2^31 batches in a day or two. Kafka reports
# every record within PublishTimeout, long before its batch's number comes round again.
BATCH_NUMBERS = 1 << 31
REPLACE_MARGIN = 5.0  # seconds beyond PublishTimeout a failed producer is flushed for
RENEW_FIRST = 1.0  # seconds before a failed build of a replacement producer is tried again
RENEW_LONGEST = 60.0  # ... doubled after each failure up to this
REPORT_MARGIN = 5.0  # seconds beyond PublishTimeout after which a report is taken as lost
SWEEP_EVERY = 1.0  # seconds between the loop's looks for reports lost (DeliveryPump._sweep)

SharedProducer = Producer | CompiledProducer


class DeliveryPump:
    """Runs the shared producer's delivery callbacks, off the event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        producer: SharedProducer,
        timeout: float,
        renew: Callable[[], SharedProducer] | None = None,
        adopt: Callable[[SharedProducer], None] | None = None,
    ) -> None:
        """`renew()` makes a producer to replace one that failed fatally, `adopt(new)`
        (run on the loop) hands it to the sessions; without them a fatal error is only
        logged and every publish after it refused."""
        self._loop = loop
        self._producer = producer
        self._timeout = timeout
        self._renew = renew
        self._adopt = adopt
        self.fatal: str | None = None  # the fatal error being recovered from
        self.renew_failures = 0  # replacements that could not be built (_take_new)
        self._renew_at: float | None = None  # when the next attempt is due (monotonic)
        self._renew_wait = 0.0  # seconds waited before it
        self._outcomes: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._posted = False
        # Batches by number, every session's (numbered here, so that a compiled producer's
        # reports, which carry only the number, find theirs), with their finish.
        self.batch_numbers = batch_numbers()
        self.batches: dict[int, tuple[PublishBatch, Callable[[PublishBatch], None]]] = {}
        # Every session's Writes, while it lives (a closed session's until its last
        # report): swept for reports lost. `unreported` counts the commands so answered.
        self.writes: weakref.WeakSet[Writes] = weakref.WeakSet()
        self.report_limit = timeout + REPORT_MARGIN
        self.unreported = 0
        self._serve_batches(producer)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="amps-gateway-deliveries", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        self._loop.call_soon_threadsafe(self._sweep)

    def stop(self) -> None:
        """Stop serving (the loop, if it still runs, stops sweeping at its next turn)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def callback(self, handler: Outcome) -> Persisted:
        """An on_persisted callback that runs `handler` on the event loop."""

        def persisted(error: PublishError | None, message: Message) -> None:
            if error is not None:
                error = PublishError(self.failure_reason(message.error()))
            self.post(handler, error)

        return persisted

    def post(self, handler: Callable[[Any], None], argument: Any) -> None:
        """Run `handler(argument)` on the event loop, in the order posted (from the
        thread serving the reports)."""
        self._outcomes.append((handler, argument))
        if not self._posted:  # one loop wake-up per burst of reports
            self._posted = True
            with suppress(RuntimeError):  # the loop is closed: the gateway stopped
                self._loop.call_soon_threadsafe(self._drain)

    def _batch_reports(self, groups: list[tuple[int, int, list[tuple[int, int, str]]]]) -> None:
        """A poll's reports of batched records from the compiled producer, by batch
        (number, reports, failures): counted down as each report is by BatchDelivery."""
        for batch_number, reports, failures in groups:
            known = self.batches.get(batch_number)
            if known is None:  # answered already as unreported (_sweep): too late
                continue
            batch, finish = known
            for index, code, reason in failures:
                batch.failures.append((index, self.failure_reason(KafkaError(code, reason))))
            draws = batch.reports
            for _ in range(reports):
                if next(draws) == batch.expected:
                    self.post(finish, batch)

    def _serve_batches(self, producer: SharedProducer) -> None:
        if getattr(producer, "compiled", False):  # reports come by the batch (native_producer)
            producer.serve_batches(self._batch_reports)  # type: ignore[union-attr]

    def failure_reason(self, error: KafkaError) -> str:
        """What the publisher is told: a timeout says how long Kafka was given; a record
        purged after a fatal error, which error and that it was not written."""
        if error.code() == KafkaError._MSG_TIMED_OUT:
            return f"Kafka did not acknowledge within {self._timeout:g}s: {error.str()}"
        fatal = (self.fatal or fatal_text(self._producer)) if error.code() in PURGED else None
        if fatal is not None:
            return (
                f"Kafka did not persist the message: {error.str()} (the gateway's producer "
                f"failed fatally: {fatal}; it is replaced, publish again)"
            )
        return f"Kafka did not persist the message: {error.str()}"

    def _drain(self) -> None:
        """Hand Kafka's verdicts to the sessions, DRAIN_SLICE at a time: when a broker
        comes back, thousands arrive at once, and the other clients must not wait for
        all of their acks to be written (that was a 0.7 s pause). A handler that raises
        (a bug) is logged and the rest are handed on: left queued, they waited for the
        next report, and a session waiting for budget they held would never get one."""
        self._posted = False
        outcomes = self._outcomes
        for _ in range(min(len(outcomes), DRAIN_SLICE)):
            handler, argument = outcomes.popleft()
            try:
                handler(argument)
            except Exception:
                log.exception("handing Kafka's verdict to %r failed", handler)
        if outcomes and not self._posted:
            self._posted = True
            self._loop.call_soon(self._drain)

    def _sweep(self) -> None:
        """(On the loop, every SWEEP_EVERY.) Answer the commands whose reports are
        overdue (Writes.expire), logging how many."""
        if self._stop.is_set():
            return
        cutoff = time.perf_counter() - self.report_limit
        lost = sum(writes.expire(cutoff) for writes in list(self.writes))
        if lost:
            self.unreported += lost
            log.error(
                "%d publish command(s) got no report from the gateway's Kafka producer "
                "within %gs (PublishTimeout and %gs): answered as not known to be "
                "persisted, their budget share freed",
                lost,
                self.report_limit,
                REPORT_MARGIN,
            )
        self._loop.call_later(SWEEP_EVERY, self._sweep)

    def lost_reason(self) -> str:
        """A command's failure when its report never came (Writes.expire)."""
        return (
            f"no report from Kafka within {self.report_limit:g}s: not known whether "
            "Kafka persisted the message (publish again to be sure)"
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fatal = self._serve(self._producer)
                if fatal is not None and self.fatal is None:
                    self._replace(fatal)
                elif self._renew_at is not None and time.monotonic() >= self._renew_at:
                    self._take_new()
            except Exception:  # a bug in a report's handling: the others must still be served
                log.exception("handling Kafka's delivery reports failed")

    def _serve(self, producer: SharedProducer) -> KafkaError | None:
        """One poll's reports served; the producer's fatal error, if it raised one
        (confluent-kafka's raises it from poll, once; the compiled one is asked)."""
        try:
            producer.poll(SERVE_SLICE if len(producer) else IDLE_WAIT)
        except KafkaException as exc:
            if not exc.args[0].fatal():
                raise
            return exc.args[0]  # type: ignore[no-any-return]
        fatal = getattr(producer, "fatal", None)
        return None if fatal is None else fatal()  # type: ignore[no-any-return]

    def _replace(self, fatal: KafkaError) -> None:
        """Answer every record of the producer that failed fatally, then put a new one
        in its place (`renew`, `adopt`): the old one is flushed before any session
        writes to the new one, so the sessions' order holds across the change."""
        self.fatal = fatal.str()
        old = self._producer
        log.error(
            "the gateway's Kafka producer failed fatally (%s): the %d record(s) it holds "
            "are answered, then %s",
            self.fatal,
            len(old),
            "a new producer takes its place" if self._renew else "every publish is refused",
        )
        if self._renew is None or self._adopt is None:
            return
        flush_all(old, self._timeout + REPLACE_MARGIN)
        self._take_new()

    def _take_new(self) -> None:
        """Build the replacement and hand it to the sessions. A build that fails (a
        setting refused, no thread or file left for librdkafka...) is logged and tried
        again RENEW_FIRST seconds later, twice as long after each failure up to
        RENEW_LONGEST (`renew_failures` counts them, for the admin); the old producer
        refuses every publish meanwhile, naming its fatal error."""
        renew, adopt = self._renew, self._adopt
        if renew is None or adopt is None:
            return
        try:
            new = renew()
        except Exception as exc:
            self.renew_failures += 1
            self._renew_wait = min(RENEW_LONGEST, self._renew_wait * 2 or RENEW_FIRST)
            self._renew_at = time.monotonic() + self._renew_wait
            log.error(
                "building the gateway's replacement Kafka producer failed (%s: %s); "
                "publishes are refused until one is built: next attempt in %gs",
                type(exc).__name__,
                exc,
                self._renew_wait,
            )
            return
        self._renew_at, self._renew_wait = None, 0.0
        self._serve_batches(new)
        adopted = threading.Event()

        def hand_over() -> None:
            adopt(new)
            adopted.set()

        with suppress(RuntimeError):  # the loop is closed: the gateway stopped
            self._loop.call_soon_threadsafe(hand_over)
        while not adopted.wait(0.1):
            if self._stop.is_set():  # stopping before the loop took it: the loop is gone
                new.close()
                return
        old, self._producer, self.fatal = self._producer, new, None
        old.close()
        log.warning("the gateway's Kafka producer was replaced; publishing goes on")


def batch_numbers(start: int = 0) -> Iterator[int]:
    """The pump's batch numbers: `start`, `start + 1`, ..., wrapping to 0 at BATCH_NUMBERS."""
    yield from range(start, BATCH_NUMBERS)
    while True:
        yield from range(BATCH_NUMBERS)


class PublishBudget:
    """The worker's publish commands produced and not yet reported by Kafka, bounded.

    Lives on the event loop. Waiters are served first come, first served, so a heavy
    publisher cannot starve a light one; a command larger than the whole byte budget
    still goes when nothing else is in flight (the frame limit bounds it).

    When the budget empties after holding TRIM_AFTER_BYTES or TRIM_AFTER_COMMANDS (a
    publish costs librdkafka about a kilobyte beside its payload), the freed memory is
    handed back to the system (`release_freed_memory`): librdkafka's copies of the
    publishes are freed in its threads' malloc arenas, which glibc keeps, so a worker
    stayed 35 MiB larger after a Kafka outage (bench robustness, a log topic).
    """

    def __init__(self, max_bytes: int, max_commands: int) -> None:
        self.max_bytes = max_bytes
        self.max_commands = max_commands
        self.bytes = 0
        self.commands = 0
        self.peak = (0, 0)  # bytes, commands held at most since the budget was last empty
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def take_now(self, size: int, commands: int = 1) -> bool:
        """Take `size` bytes and `commands` commands if they fit now, ahead of nobody."""
        if not self._waiting and self._fits(size, commands):
            self._take(size, commands)
            return True
        return False

    def room(self) -> tuple[int, int]:
        """(commands, bytes) a batch may take now; none while others wait."""
        if self._waiting:
            return 0, 0
        return self.max_commands - self.commands, self.max_bytes - self.bytes

    async def reserve(self, size: int) -> None:
        """Take `size` bytes and one command, waiting for room."""
        if self.take_now(size):
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((size, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted just as it was cancelled: give it back
            else:  # those behind it may fit now
                self._waiting = deque(w for w in self._waiting if w[1] is not future)
                self._grant()
            raise

    def release(self, size: int, commands: int = 1) -> None:
        self.bytes -= size
        self.commands -= commands
        self._grant()
        if self.commands == 0:
            if self.peak[0] >= TRIM_AFTER_BYTES or self.peak[1] >= TRIM_AFTER_COMMANDS:
                asyncio.get_running_loop().run_in_executor(None, release_freed_memory)
            self.peak = (0, 0)

    def _grant(self) -> None:
        """Serve the waiters in order while the first one fits."""
        while self._waiting and self._fits(self._waiting[0][0]):
            size, future = self._waiting.popleft()
            if not future.cancelled():
                self._take(size)
                future.set_result(None)

    def _fits(self, size: int, commands: int = 1) -> bool:
        if self.commands + commands > self.max_commands:
            return False
        # one command larger than the byte budget goes alone; a batch never exceeds it
        return (self.commands == 0 and commands == 1) or self.bytes + size <= self.max_bytes

    def _take(self, size: int, commands: int = 1) -> None:
        self.bytes += size
        self.commands += commands
        peak = self.peak
        if self.bytes > peak[0] or self.commands > peak[1]:
            self.peak = (max(peak[0], self.bytes), max(peak[1], self.commands))
