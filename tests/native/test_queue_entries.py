"""The compiled reader of a queue's consumed batches (native/src/queue_entries.rs) against
its Python twin (processor/queue_runtime.py `_read_records_twin`).

The reader writes each QueueEntry's slots itself, so every slot of every entry must hold
what the twin's constructor puts there; it must sort records into messages, records that
are not messages and records with a bad header exactly as the twin does, stop at the same
record with an error, and fail with the same error where the twin fails.
"""

from __future__ import annotations

import gc
import sys

import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.log.codecs import BINARY, JSON
from amps_on_kafka.native import core
from amps_on_kafka.processor import queue_runtime
from amps_on_kafka.processor.queue_runtime import _read_records_twin, read_records
from amps_on_kafka.state.queue_types import QueueEntry

CODECS = {"t": JSON, "orders.v1": BINARY}
HEADERS = st.sampled_from(
    [
        None,
        [],
        [("p", b"pub"), ("s", b"3")],
        [("c", b"publish"), ("e", b"1.5")],
        [("c", b"delta_publish")],
        [("c", b"sow_delete")],  # not a message
        [("c", b"\xff")],  # a bad command
        [("c", None), ("e", None)],  # no value: says nothing
        [("e", b"0")],
        [("e", b"-1")],  # a bad expiration
        [("e", b"x")],
        [("e", b" 2 ")],
        [("e", b"1_0")],
        [("e", b"nan")],
        [("k", b"\xff"), ("x", None)],
        [(b"c", b"publish")],  # a name that is not text
        [("c",)],  # not a pair: the twin's error
    ]
)


class Unreadable:
    """A consumed record whose headers() fails in the C API, as confluent-kafka's does for
    a header name that is not UTF-8 (a constructed Message keeps any list it is given)."""

    def __init__(self, offset: int, error: Exception) -> None:
        self._offset, self._error = offset, error

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def headers(self) -> None:
        raise self._error


def _errors() -> list[Exception]:
    """What headers() may raise: the two a bad name gives, and one it never does."""
    return [
        SystemError("bad name"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
        KeyError("k"),
    ]


@st.composite
def records(draw) -> list:
    """The parameters of a batch's records, made twice so neither reader sees the other's
    (confluent-kafka keeps a record's headers list once read)."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        code = draw(st.sampled_from([KafkaError._PARTITION_EOF, KafkaError._FATAL]))
        return [lambda: Message(topic="t", partition=0, offset=0, error=KafkaError(code))]
    if kind == 1:
        offset = draw(st.integers(0, 99))
        error = draw(st.sampled_from([0, 1, 2]))
        return [lambda: Unreadable(offset, _errors()[error])]
    fields = {
        "topic": draw(st.sampled_from(["t", "orders.v1", "unknown"] if kind == 2 else ["t"])),
        "partition": draw(st.integers(0, 3)),
        "offset": draw(st.integers(0, 2**40)),
        "value": draw(st.one_of(st.none(), st.just(b""), st.binary(max_size=8))),
        "headers": draw(HEADERS),
        "timestamp": (1, draw(st.integers(0, 2**42))),
    }
    return [lambda: Message(**fields)]


def outcome(read, batch: list, start: int):
    """What reading gives: the index it stopped at, the entries and the bad ids, or the
    error (type and text)."""
    entries: list = []
    bad: list = []
    try:
        stopped = read(batch, start, CODECS, entries, bad)
    except Exception as exc:  # every error, whatever its type, must match
        return ("error", (type(exc), str(exc)), len(entries), bad)
    return ("read", stopped, [_fields(entry) for entry in entries], bad)


def _fields(item):
    if not isinstance(item, QueueEntry):
        return item
    return [
        (name, type(value), value)
        for name in QueueEntry.__slots__
        for value in [getattr(item, name)]
    ]


def test_the_compiled_reader_is_in_use():
    assert read_records != _read_records_twin
    assert type(read_records.__self__) is core.EntryReader


@given(st.lists(records(), max_size=6), st.integers(0, 6))
def test_the_reader_reads_what_the_twin_reads(makers, start):
    ours = [make() for (make,) in makers]
    twin = [make() for (make,) in makers]
    start = min(start, len(ours))
    assert outcome(read_records, ours, start) == outcome(_read_records_twin, twin, start)


def test_entries_hold_the_twins_defaults_and_their_references():
    payload = b'{"a": 1}'
    batch = [
        Message(topic="t", partition=0, offset=i, value=payload, timestamp=(1, 5))
        for i in range(20)
    ]
    expected = QueueEntry(("t", 0, 0), 5, payload, JSON)
    before = sys.getrefcount(payload)
    entries: list = []
    assert read_records(batch, 0, CODECS, entries, []) == 20
    for name in QueueEntry.__slots__:
        assert getattr(entries[0], name) == getattr(expected, name), name
    assert entries[0].status is expected.status and entries[0].codec is JSON
    assert sys.getrefcount(payload) == before + len(entries)  # one each, none leaked
    assert entries[3].data == {"a": 1} and entries[3].id == ("t", 0, 3)
    del entries
    assert sys.getrefcount(payload) == before


def test_a_run_of_one_topic_shares_its_text():
    """The consumer makes each record a topic text of its own; the reader gives the ids of
    a run of one topic the same one, so the engine's dicts compare them by identity and a
    message holds no copy. A record of another topic starts a run of its own."""

    def fresh(*parts: str) -> str:
        return "".join(parts)  # a new object each call, as the consumer's texts are

    topics = [
        fresh("queue", ".a"),
        fresh("queue", ".a"),
        fresh("queue", ".b"),
        fresh("queue", ".a"),
    ]
    assert len({id(topic) for topic in topics}) == 4
    batch = [
        Message(topic=topic, partition=0, offset=i, value=b"{}", timestamp=(1, 5))
        for i, topic in enumerate(topics)
    ]
    batch.insert(
        2,
        Message(topic=fresh("queue", ".a"), partition=0, offset=9, headers=[("c", b"sow_delete")]),
    )
    entries: list = []
    codecs = {"queue.a": JSON, "queue.b": BINARY}
    assert read_records(batch, 0, codecs, entries, []) == 5
    texts = [e.id[0] if isinstance(e, QueueEntry) else e[0][0] for e in entries]
    assert texts == ["queue.a", "queue.a", "queue.a", "queue.b", "queue.a"]
    assert texts[0] is texts[1] is texts[2]
    assert texts[3] is topics[2] and texts[4] is topics[3]


def test_the_collector_sees_the_entries_only_once_given_back():
    """The entries read are not tracked (the collector's passes walked each message the
    queue held); track_entries tracks them again, twice is harmless, and an entry made
    otherwise, or any other object, is left as it was."""
    batch = [
        Message(topic="t", partition=0, offset=i, value=b"{}", timestamp=(1, 5)) for i in range(3)
    ]
    entries: list = []
    read_records(batch, 0, CODECS, entries, [])
    assert [gc.is_tracked(entry) for entry in entries] == [False] * 3
    made = QueueEntry(("t", 0, 9), 5, b"{}", JSON)
    queue_runtime.track_entries([entries[0], made, [1]])
    queue_runtime.track_entries(iter(entries))
    assert [gc.is_tracked(entry) for entry in [*entries, made]] == [True] * 4


def test_a_record_with_an_error_stops_the_read_where_the_runtime_resumes():
    batch = [
        Message(topic="t", partition=0, offset=0, value=b"1", timestamp=(1, 0)),
        Message(topic="t", partition=0, offset=1, error=KafkaError(KafkaError._PARTITION_EOF)),
        Message(topic="t", partition=0, offset=2, value=b"2", headers=[("c", b"\xff")]),
    ]
    entries: list = []
    bad: list = []
    assert read_records(batch, 0, CODECS, entries, bad) == 1
    assert read_records(batch, 2, CODECS, entries, bad) == 3
    assert [e.id if isinstance(e, QueueEntry) else e for e in entries] == [
        ("t", 0, 0),
        (("t", 0), 2),
    ]
    assert bad == [("t", 0, 2)]


@pytest.mark.parametrize(
    ("defaults", "error"),
    [
        ([], ValueError),  # slots left unset
        ([*queue_runtime._entry_defaults(), ("seq", 0)], ValueError),  # a slot twice
        ([("no_such_slot", 0)], AttributeError),
    ],
)
def test_a_reader_refuses_a_layout_that_leaves_or_doubles_a_slot(defaults, error):
    with pytest.raises(error):
        core.EntryReader(QueueEntry, defaults, len, None, None)


def test_a_reader_refuses_a_class_without_slots():
    with pytest.raises(TypeError, match="__slots__"):
        core.EntryReader(type("Open", (), {}), [], len, None, None)
