"""Whether the log a quiet replay follows is still there (docs/operations.md, A replay
whose topic or Kafka goes away).

librdkafka neither reports a deleted topic to a consumer that is assigned its partitions
nor gives up on unreachable brokers: it retries for good, and a follower of the log waited
silently in either case. So while a replay's polls come back empty, it asks Kafka about
its topics every CHECK_INTERVAL seconds, without blocking its reader: a topic Kafka no
longer knows ends the replay with UnknownTopic, and Kafka not answering for the outage
limit ends it with TransportError (an HAClient then reconnects and resubscribes). A
shorter outage is ridden over: librdkafka reconnects and the replay goes on where it was.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from amps_on_kafka.errors import TransportError, UnknownTopic
from amps_on_kafka.log.kafka import admin_client, properties_of

CHECK_INTERVAL = 2.0  # seconds of empty polls between two questions to Kafka
CHECK_TIMEOUT = 5.0  # how long one question may go unanswered
OUTAGE_LIMIT = 60.0  # seconds Kafka may not answer before the replay fails
_GONE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


class _Asker:
    """One admin client a process's replays of one Kafka share: a quiet replay asks
    through it instead of holding a client (and its threads) of its own."""

    def __init__(self, bootstrap: str) -> None:
        self.admin: AdminClient = admin_client(bootstrap)


_askers: weakref.WeakValueDictionary[tuple, _Asker] = weakref.WeakValueDictionary()
_askers_lock = threading.Lock()


def _asker(bootstrap: str) -> _Asker:
    """The process's asker for `bootstrap`, alive while a replay holds it."""
    key = (str(bootstrap), tuple(sorted(properties_of(bootstrap).items())))
    with _askers_lock:
        found = _askers.get(key)
        if found is None:
            found = _askers[key] = _Asker(bootstrap)
        return found


class ReplayWatch:
    """Asks Kafka about a replay's topics while its polls are empty; `quiet()` raises
    what ended the replay. Nothing is asked while records come."""

    def __init__(self, bootstrap: str, topics: Sequence[str], outage_limit: float) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.outage_limit = outage_limit
        self._due = time.monotonic() + CHECK_INTERVAL
        self._asker: _Asker | None = None
        self._asked: dict[str, Future] | None = None
        self._asked_at = 0.0
        self._unanswered_since: float | None = None

    def quiet(self) -> None:
        """A poll came back empty: ask Kafka if a question is due, judge its answer once it
        came. UnknownTopic for a deleted topic; TransportError after the outage limit."""
        now = time.monotonic()
        if now < self._due:
            return
        if self._asked is None:
            self._ask(now)
        elif all(future.done() for future in self._asked.values()):
            self._judge(self._asked, now)

    def close(self) -> None:
        self._asker = self._asked = None

    def _ask(self, now: float) -> None:
        if self._asker is None:
            self._asker = _asker(self.bootstrap)
        self._asked = self._asker.admin.describe_topics(
            TopicCollection(self.topics), request_timeout=CHECK_TIMEOUT
        )
        self._asked_at = now

    def _judge(self, answers: dict[str, Future], now: float) -> None:
        self._asked = None
        failure: KafkaError | BaseException | None = None  # a local error: no answer
        for topic, answer in answers.items():
            error = answer.exception()
            code = error.args[0].code() if isinstance(error, KafkaException) else None
            if code in _GONE:
                raise UnknownTopic(
                    f"topic {topic!r} was deleted while it was replayed (Kafka no longer "
                    "has it); create it again and resubscribe to read on"
                )
            if code is not None and code >= 0:
                continue  # the broker answered, refusing (an ACL, say): Kafka is there
            if error is not None and failure is None:
                failure = error.args[0] if isinstance(error, KafkaException) else error
        # the next question: in an outage at once if this one waited out its timeout,
        # as the limit counts unanswered time, but never more often than CHECK_INTERVAL
        self._due = self._asked_at + CHECK_INTERVAL
        if failure is None:
            self._unanswered_since = None
            return
        since = self._unanswered_since = self._unanswered_since or self._asked_at
        if now - since >= self.outage_limit:
            reason = failure.str() if isinstance(failure, KafkaError) else str(failure)
            raise TransportError(
                f"Kafka at {self.bootstrap} has not answered for {now - since:.0f} s while "
                f"{', '.join(map(repr, self.topics))} was replayed (a replay rides over "
                f"outages of up to {self.outage_limit:g} s); resubscribe from the last "
                f"message's bookmark once Kafka is back: {reason}"
            )
