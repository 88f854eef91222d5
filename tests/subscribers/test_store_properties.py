"""The bookmark store as a state machine (seed 003), against a model of its rules.

Messages are logged in log order per partition and discarded in any order; some are
republished copies (a sequence not newer than one already seen). Always:

- the recovery point of a partition is the newest delivered offset such that it and
  every offset delivered before it are discarded (or refused as duplicates);
- after a crash (the store is abandoned, never closed) and a reopen, the logged store
  gives the same recovery point, and a resubscribe from it delivers exactly the messages
  not discarded; the ring store gives the same recovery point and delivers everything
  after it (seed 003: it "does not filter discarded messages after the resubscribe
  point").
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from amps_on_kafka import EPOCH
from amps_on_kafka.client import LoggedBookmarkStore, MemoryBookmarkStore, RingBookmarkStore
from amps_on_kafka.client.mapped_file import DamagedFile, unseal
from amps_on_kafka.client.publish_store import FilePublishStore, StoredPublish
from amps_on_kafka.client.ring_bookmark_store import KEY_SPACE, SLOT_SIZE
from amps_on_kafka.log.bookmarks import format_bookmark
from tests.subscribers.conftest import record

PARTITIONS = (0, 1)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="bookmark-machine-"))
        self.abandoned: list = []  # crashed stores: kept referenced, never closed
        self.delivered: dict[int, list[int]] = {p: [] for p in PARTITIONS}
        self.discarded: dict[int, set[int]] = {p: set() for p in PARTITIONS}
        self.sequences: dict[tuple[int, int], int] = {}
        self.newest: dict[int, int] = {p: 1000 for p in PARTITIONS}
        # the newest sequence the store can know: the ring store forgets them on a restart
        self.known: dict[int, int | None] = {p: None for p in PARTITIONS}
        self.next_offset: dict[int, int] = {p: 0 for p in PARTITIONS}

    @initialize(kind=st.sampled_from(["memory", "logged", "ring"]))
    def open(self, kind: str) -> None:
        self.kind = kind
        self.store = self._open()

    def _open(self):
        if self.kind == "memory":
            return MemoryBookmarkStore()
        if self.kind == "logged":
            return LoggedBookmarkStore(self.folder / "store.log")
        return RingBookmarkStore(self.folder / "store.ring")

    def recovery(self, partition: int) -> int:
        point = -1
        for offset in self.delivered[partition]:
            if offset not in self.discarded[partition]:
                break
            point = offset
        return point

    @rule(partition=st.sampled_from(PARTITIONS), gap=st.integers(1, 3), copy_back=st.integers(0, 3))
    def deliver(self, partition: int, gap: int, copy_back: int) -> None:
        """copy_back > 0 republishes a sequence that many steps back: a duplicate."""
        offset = self.next_offset[partition] + gap - 1
        self.next_offset[partition] = offset + 1
        copied = copy_back > 0 and bool(self.delivered[partition])
        sequence = self.newest[partition] + (1 - copy_back if copied else 1)
        known = self.known[partition]
        duplicate = known is not None and sequence <= known
        if not duplicate:
            self.known[partition] = sequence if known is None else max(known, sequence)
        self.newest[partition] = max(self.newest[partition], sequence)
        self.sequences[(partition, offset)] = sequence
        self.delivered[partition].append(offset)
        if duplicate:
            self.discarded[partition].add(offset)
        assert self.store.log(record(offset, sequence, partition=partition), "s") is not duplicate

    @rule(data=st.data(), partition=st.sampled_from(PARTITIONS))
    def discard(self, data: st.DataObject, partition: int) -> None:
        open_ = [o for o in self.delivered[partition] if o not in self.discarded[partition]]
        if not open_:
            return
        offset = data.draw(st.sampled_from(open_))
        self.discarded[partition].add(offset)
        self.store.discard(record(offset, partition=partition), "s")

    @precondition(lambda self: self.kind != "memory")
    @rule(graceful=st.booleans())
    def restart(self, graceful: bool) -> None:
        """Close (or crash) and reopen, then resubscribe from the recovery point."""
        if graceful:
            self.store.close()
        else:
            self.abandoned.append(self.store)
        self.store = self._open()
        for partition in PARTITIONS:
            self._resubscribe(partition)

    def _resubscribe(self, partition: int) -> None:
        point = self.recovery(partition)
        again = [o for o in self.delivered[partition] if o > point]
        if self.kind == "ring":  # it forgot the discards after the point, and the sequences
            self.discarded[partition] = {o for o in self.discarded[partition] if o <= point}
            newest = None
            for offset in again:
                sequence = self.sequences[(partition, offset)]
                if newest is not None and sequence <= newest:
                    self.discarded[partition].add(offset)
                newest = sequence if newest is None else max(newest, sequence)
            self.known[partition] = newest
        for offset in again:
            message = record(offset, self.sequences[(partition, offset)], partition=partition)
            expected = offset not in self.discarded[partition]
            assert self.store.log(message, "s") is expected, (partition, offset)

    @invariant()
    def recovery_point_matches_the_model(self) -> None:
        if not hasattr(self, "store"):
            return
        marks = [
            format_bookmark("orders", p, self.recovery(p))
            for p in PARTITIONS
            if self.recovery(p) >= 0
        ]
        assert self.store.get_most_recent("s") == (",".join(marks) or EPOCH)

    @invariant()
    def discarded_messages_are_known(self) -> None:
        if not hasattr(self, "store") or self.kind == "ring":
            return
        for p in PARTITIONS:
            for offset in self.delivered[p]:
                known = self.store.is_discarded(record(offset, partition=p), "s")
                assert known is (offset in self.discarded[p]), (p, offset)

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_bookmark_store_state_machine = StoreMachine.TestCase


# -- defect 9: a damaged file never loses what its intact records hold, silently


@st.composite
def store_files(draw: st.DrawFn) -> tuple[bytes, bool]:
    """The file of a logged store after random deliveries (some duplicates), discards in
    random order and maybe a reopen (which compacts it), closed or left as a kill leaves
    it (with its zero fill)."""
    count = draw(st.integers(1, 24))
    partitions = draw(st.lists(st.sampled_from(PARTITIONS), min_size=count, max_size=count))
    copies = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    order = draw(st.permutations(range(count)))
    discards = order[: draw(st.integers(0, count))]
    reopen_after = draw(st.integers(0, len(discards)))
    closed = draw(st.booleans())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "store.log")
        store = LoggedBookmarkStore(path)
        messages = [
            record(i, 1000 if copy else 1000 + i, partition=p)
            for i, (p, copy) in enumerate(zip(partitions, copies, strict=True))
        ]
        for message in messages:
            store.log(message, "s")
        for number, index in enumerate(discards):
            if number == reopen_after:
                store.close()
                store = LoggedBookmarkStore(path)
            store.discard(messages[index], "s")
        content = path.read_bytes()
        store.close()
        return (path.read_bytes() if closed else content), closed


@st.composite
def damages(draw: st.DrawFn, size: int, header: int) -> tuple[str, int, bytes]:
    """A flipped byte, a cut, or garbage inserted, somewhere after the header."""
    kind = draw(st.sampled_from(["flip", "cut", "insert"]))
    at = draw(st.integers(header, size - 1 if kind == "flip" else size))
    if kind == "flip":
        return kind, at, bytes([draw(st.integers(1, 255))])
    if kind == "cut":
        return kind, at, b""
    return kind, at, draw(st.binary(min_size=1, max_size=12))


def damaged(content: bytes, damage: tuple[str, int, bytes]) -> bytes:
    kind, at, data = damage
    if kind == "flip":
        return content[:at] + bytes([content[at] ^ data[0]]) + content[at + 1 :]
    if kind == "cut":
        return content[:at]
    return content[:at] + data + content[at:]


def state_of(content: bytes, **options) -> dict:
    """What a logged store opened on this file knows (on a copy: opening rewrites it)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "store.log")
        path.write_bytes(content)
        with LoggedBookmarkStore(path, **options) as store:
            return {
                (sub, tp): (p.recovery, p.seen, sorted(p.discarded), sorted(p.publishers.items()))
                for sub, parts in store._subs.items()
                for tp, p in parts.items()
            }


def line_start(content: bytes, at: int) -> int:
    """Where the line holding byte `at` starts."""
    return content.rfind(b"\n", 0, at) + 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_defect_9_damage_refuses_the_file_or_loses_no_intact_record_after_it(data):
    """Any damage to a logged store's file: the store refuses it (DamagedFile), or it
    knows exactly what the undamaged file held - unless no complete record follows the
    damage (a cut, or the last record hit), when it may know what the records before the
    damaged one held, as after a kill. With salvage=True it never refuses, and knows
    what the records before the damaged one held. Never anything else: before the fix,
    the records after a damaged one were silently dropped."""
    content, _ = data.draw(store_files())
    header = content.index(b"\n") + 1
    damage = data.draw(damages(len(content), header))
    spoiled = damaged(content, damage)
    whole = state_of(content)
    kind, at, _ = damage
    body_end = len(content.rstrip(b"\0"))
    records_after = kind != "cut" and content.rfind(b"\n", 0, body_end) >= at + (kind == "flip")
    before = state_of(content[: line_start(content, at)])
    try:
        opened = state_of(spoiled)
    except DamagedFile as refused:
        assert refused.offset >= line_start(content, at) - 1
        assert state_of(spoiled, salvage=True) == before
        return
    if records_after:
        assert opened == whole
    else:
        assert opened in (whole, before)


@st.composite
def publish_files(draw: st.DrawFn) -> bytes:
    """A FilePublishStore's file after random stores and acknowledgements, closed or not
    (it is appended to with write(2): nothing follows the last record either way)."""
    sequences = draw(st.lists(st.integers(1, 60), min_size=1, max_size=20, unique=True))
    acked = draw(st.lists(st.sampled_from(sequences), max_size=4))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "publishes")
        store = FilePublishStore(path)
        store.claim("feed")
        for number, sequence in enumerate(sequences):
            store.store(StoredPublish(sequence, "publish", "orders", {"n": sequence}))
            if number < len(acked):
                store.discard_up_to(acked[number])
        store.close()
        return path.read_bytes()


def unacknowledged(content: bytes, **options) -> tuple[str | None, list[int]]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "publishes")
        path.write_bytes(content)
        with FilePublishStore(path, **options) as store:
            return store.publisher_id, [e.sequence for e in store.unpersisted()]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_defect_9_a_damaged_publish_store_is_refused_or_loses_no_intact_entry(data):
    """The publish store's file under the same damage: refused, or exactly what the
    undamaged file held (a prefix of it when no complete record follows the damage).
    Salvaged, it keeps every entry whose record is intact: a publish Kafka never
    acknowledged is never dropped because a record before it was damaged."""
    content = data.draw(publish_files())
    header = content.index(b"\n") + 1
    damage = data.draw(damages(len(content), header))
    spoiled = damaged(content, damage)
    whole = unacknowledged(content)
    kind, at, _ = damage
    start = line_start(content, at)
    records_after = kind != "cut" and content.rfind(b"\n") >= at + (kind == "flip")
    try:
        opened = unacknowledged(spoiled)
    except DamagedFile:
        hit = entries_in(content, at, at + (kind == "flip"))
        assert set(whole[1]) - hit <= set(unacknowledged(spoiled, salvage=True)[1])
        return
    assert opened == whole or (not records_after and opened == unacknowledged(content[:start]))


def entries_in(content: bytes, low: int, high: int) -> set[int]:
    """The sequences of the entries whose lines (newline included) touch bytes low..high."""
    hit, start = set(), content.index(b"\n") + 1
    for line in content[start:].split(b"\n")[:-1]:
        if start <= high and start + len(line) >= low and line.startswith(b"+ "):
            hit.add(orjson.loads(unseal(line)[2:])["s"])
        start += len(line) + 1
    return hit


@settings(max_examples=200, deadline=None)
@given(
    points=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    steps=st.integers(1, 4),
    data=st.data(),
)
def test_defect_9_a_damaged_ring_store_is_refused_or_never_ahead_of_its_recovery_points(
    points, steps, data
):
    """A flipped byte anywhere in a ring store's slots: the store refuses the file, or
    each subscription's recovery point is the one it had, or (a cell hit) the one
    before it - never one it did not reach, and never another slot's."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "store.ring")
        with RingBookmarkStore(path) as store:
            for number, point in enumerate(points):
                sub = store.subscription(f"sub-{number}")
                for offset in range(point + steps):
                    sub.log(record(offset))
                for offset in range(point + 1):
                    sub.discard(record(offset))
        content = path.read_bytes()
        at = data.draw(st.integers(len(b"AMPS-KAFKA RING 2\n"), len(content) - 1))
        flip = data.draw(st.integers(1, 255))
        path.write_bytes(content[:at] + bytes([content[at] ^ flip]) + content[at + 1 :])
        try:
            reopened = RingBookmarkStore(path)
        except DamagedFile:
            return
        with reopened:
            for number, point in enumerate(points):
                mark = reopened.get_most_recent(f"sub-{number}")
                recovered = -1 if mark == EPOCH else int(mark.split("|")[2])
                assert recovered in (point, point - 1)
                if recovered != point:  # only a cell of that very slot was hit
                    slot = content.index(f'["sub-{number}"'.encode()) - 8
                    assert slot + 8 + KEY_SPACE <= at < slot + SLOT_SIZE
