"""Bookmark stores on their own (seed 003): recovery points, discards, duplicates, files.

Messages are built as a replay builds them; the broker tests in test_subscriber_recovery
run the same rules end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amps_on_kafka import EPOCH
from amps_on_kafka.client import LoggedBookmarkStore, MemoryBookmarkStore, RingBookmarkStore
from amps_on_kafka.client.bookmark_store import BookmarkStore
from amps_on_kafka.client.mapped_file import DamagedFile
from tests.subscribers.conftest import record

KINDS = ["memory", "logged", "ring"]
FILED = ["logged", "ring"]


def open_store(kind: str, folder: Path) -> BookmarkStore:
    if kind == "memory":
        return MemoryBookmarkStore()
    if kind == "logged":
        return LoggedBookmarkStore(folder / "bookmarks.log")
    return RingBookmarkStore(folder / "bookmarks.ring")


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def store(kind, tmp_path):
    with open_store(kind, tmp_path) as opened:
        yield opened


def deliver(store: BookmarkStore, offsets, sub_id="s", **where) -> list[bool]:
    return [store.log(record(o, 1000 + o, **where), sub_id) for o in offsets]


def test_recovery_point_is_the_newest_bookmark_with_everything_before_it_discarded(store):
    """Seed 003: the store resubscribes at "the earliest message not discarded"."""
    deliver(store, range(6))
    for offset in (0, 1, 3, 4):
        store.discard(record(offset), "s")
    assert store.get_most_recent("s") == "orders|0|1|"  # 2 is still being processed
    store.discard(record(2), "s")
    assert store.get_most_recent("s") == "orders|0|4|"


def test_the_recovery_point_lists_one_bookmark_per_partition(store):
    """A subscription's place on a multi-partition topic is a bookmark list (DESIGN 6)."""
    for partition in (0, 1, 2):
        deliver(store, range(3), partition=partition)
    store.discard(record(0, partition=0), "s")
    store.discard(record(0, partition=2), "s")
    store.discard(record(1, partition=2), "s")
    assert store.get_most_recent("s") == "orders|0|0|,orders|2|1|"


def test_a_store_that_knows_nothing_recovers_from_epoch(store):
    """Seed 004: MOST_RECENT with no record of the subscription starts at EPOCH."""
    assert store.get_most_recent("never-seen") == EPOCH
    deliver(store, range(3))
    assert store.get_most_recent("s") == EPOCH  # delivered, but nothing discarded yet


def test_is_discarded_answers_for_messages_before_and_after_the_recovery_point(store):
    deliver(store, range(4))
    store.discard(record(0), "s")
    store.discard(record(2), "s")
    assert [store.is_discarded(record(o), "s") for o in range(4)] == [True, False, True, False]


def test_a_message_delivered_once_is_not_delivered_again_in_the_same_session(store):
    """A reconnect resubscribes from the recovery point: what the application already
    holds (delivered, not yet discarded) must not come twice."""
    assert deliver(store, range(5)) == [True] * 5
    store.discard(record(0), "s")
    assert deliver(store, range(1, 7)) == [False] * 4 + [True, True]


@pytest.mark.parametrize("kind", ["memory", "logged"])
def test_duplicate_detection_seed_example_1000_1002_then_999_is_dropped(store):
    """Seed 003: "sequence numbers 1000 and 1002 followed by 999, it must discard 999"."""
    assert store.log(record(0, 1000), "s")
    assert store.log(record(1, 1002), "s")
    assert not store.log(record(2, 999), "s")
    assert not store.log(record(3, 1002), "s")  # not newer than one already seen
    assert store.log(record(4, 1003), "s")
    assert store.log(record(5, 999, publisher=b"pub-b"), "s")  # sequences are per publisher


def test_duplicates_are_judged_per_partition_where_kafka_keeps_order(store):
    """A publisher's records interleave across partitions; within one they rise."""
    assert store.log(record(0, 1002, partition=1), "s")
    assert store.log(record(0, 1001, partition=0), "s")
    assert not store.log(record(1, 1001, partition=0), "s")


def test_a_dropped_duplicate_does_not_hold_back_the_recovery_point(store):
    store.log(record(0, 1000), "s")
    store.log(record(1, 1000), "s")  # a republished copy: refused
    store.discard(record(0), "s")
    assert store.get_most_recent("s") == "orders|0|1|"


def test_discard_is_idempotent_and_ignores_what_it_never_saw(store):
    deliver(store, range(2))
    store.discard(record(0), "s")
    store.discard(record(0), "s")
    store.discard(record(0), "unknown-subscription")
    assert store.get_most_recent("s") == "orders|0|0|"


def test_purge_forgets_one_subscription_or_all(store):
    for sub_id in ("a", "b"):
        deliver(store, range(2), sub_id)
        store.discard(record(0), sub_id)
    store.purge("a")
    assert (store.get_most_recent("a"), store.get_most_recent("b")) == (EPOCH, "orders|0|0|")
    store.purge()
    assert store.get_most_recent("b") == EPOCH


def test_a_subscription_purged_while_open_starts_afresh(store):
    handle = store.subscription("s")
    assert [handle.log(record(o, 1000 + o)) for o in range(2)] == [True, True]
    store.purge("s")
    assert [handle.log(record(o, 1000 + o)) for o in range(2)] == [True, True]


@pytest.mark.parametrize("kind", FILED)
def test_purge_is_kept_by_the_file(kind, tmp_path):
    with open_store(kind, tmp_path) as store:
        for sub_id in ("a", "b"):
            deliver(store, range(2), sub_id)
            store.discard(record(0), sub_id)
        store.purge("a")
    with open_store(kind, tmp_path) as store:
        assert (store.get_most_recent("a"), store.get_most_recent("b")) == (EPOCH, "orders|0|0|")


@pytest.mark.parametrize("kind", FILED)
def test_a_new_subscription_recovers_where_it_started(kind, tmp_path):
    """A NOW subscription that dies before it gets a message must not come back at EPOCH:
    the store keeps where each partition started."""
    with open_store(kind, tmp_path) as store:
        store.note_start("s", {("orders", 0): 40, ("orders", 1): 0})
    with open_store(kind, tmp_path) as store:
        assert store.get_most_recent("s") == "orders|0|39|"
        store.note_start("s", {("orders", 0): 0})  # known partitions keep their place
        assert store.get_most_recent("s") == "orders|0|39|"


def test_logged_store_filters_what_was_discarded_out_of_order_before_a_restart(tmp_path):
    """Seed 003: after a resubscribe, only messages not yet discarded are reprocessed."""
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        deliver(store, range(8))
        for offset in (0, 1, 3, 5, 6):
            store.discard(record(offset), "s")
    with LoggedBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|1|"
        assert deliver(store, range(2, 9)) == [True, False, True, False, False, True, True]
        store.discard(record(2), "s")
        assert store.get_most_recent("s") == "orders|0|3|"


def test_logged_store_keeps_duplicate_detection_across_restarts(tmp_path):
    """Seed 003 names LoggedBookmarkStore as keeping the latest sequence per publisher."""
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        assert deliver(store, range(3)) == [True] * 3
        for offset in range(3):
            store.discard(record(offset), "s")
    with LoggedBookmarkStore(path) as store:
        assert not store.log(record(3, 1001), "s")  # a republished copy after a restart
        assert store.log(record(4, 1003), "s")


def test_logged_store_keeps_a_delivery_written_before_its_out_of_order_discard(tmp_path):
    """Deliveries are written lazily; an out-of-order discard must write them first."""
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        deliver(store, range(3))
        store.discard(record(1), "s")
        store.discard(record(0), "s")
    with LoggedBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|1|"
        assert not store.log(record(3, 1001), "s")  # 1001 was seen, even though undiscarded


def test_ring_store_keeps_only_the_recovery_point(tmp_path):
    """Seed 003: the ring store "does not filter discarded messages after the resubscribe
    point, thus potentially delivering duplicates" - and keeps no sequences."""
    path = tmp_path / "bookmarks.ring"
    with RingBookmarkStore(path) as store:
        deliver(store, range(4))
        for offset in (0, 2):
            store.discard(record(offset), "s")
    with RingBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|0|"
        assert deliver(store, range(1, 4)) == [True, True, True]  # 2 comes again


def test_ring_store_survives_a_torn_write_of_one_cell(tmp_path):
    path = tmp_path / "bookmarks.ring"
    with RingBookmarkStore(path) as store:
        deliver(store, range(3))
        for offset in range(3):
            store.discard(record(offset), "s")
    data = bytearray(path.read_bytes())
    slot = data.index(b'["s"')
    newest_cell = slot - 8 + 512 - 32  # offset 2 went to cell 0 (three writes: 0, 1, 0)
    data[newest_cell : newest_cell + 4] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))
    with RingBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|1|"  # the other cell, one step back


def test_logged_store_ignores_a_record_torn_by_a_crash(tmp_path):
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        deliver(store, range(3))
        store.discard(record(0), "s")
    with path.open("ab") as out:
        out.write(b"x 3 1 4 10")  # a kill in the middle of a record: no newline
    with LoggedBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|0|"


def test_logged_store_is_compacted_on_open(tmp_path):
    path = tmp_path / "bookmarks.log"
    with LoggedBookmarkStore(path) as store:
        deliver(store, range(2000))
        for offset in range(1990):
            store.discard(record(offset), "s")
        store.discard(record(1995), "s")
    grown = path.stat().st_size
    with LoggedBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|1989|"
        assert store.is_discarded(record(1995), "s") and not store.is_discarded(record(1994), "s")
    assert path.stat().st_size < grown / 20


def test_a_file_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "not-a-store"
    path.write_bytes(b"something else\n")
    with pytest.raises(ValueError, match="not a LoggedBookmarkStore"):
        LoggedBookmarkStore(path)
    with pytest.raises(ValueError, match="header differs"):
        RingBookmarkStore(path)


# -- defect 9: a damaged file is refused (or salvaged on request), never cut short silently


def out_of_order_file(path: Path) -> bytes:
    """A logged store's file whose discards after the recovery point are each a record
    of their own: 0 and 1 are discarded in order, then 3, 5 ... 19 out of order."""
    with LoggedBookmarkStore(path) as store:
        deliver(store, range(20))
        for offset in (0, *range(1, 20, 2)):
            store.discard(record(offset), "s")
    return path.read_bytes()


def test_defect_9_a_record_damaged_in_the_middle_refuses_the_file_and_leaves_it_as_it_is(
    tmp_path,
):
    """Before: everything after the damaged record was dropped without an error, the
    file was rewritten compacted, and the discards recorded after it came back."""
    path = tmp_path / "bookmarks.log"
    data = bytearray(out_of_order_file(path))
    damaged_at = data.index(b"d 3 5 ")  # the discard of 5; those of 7..19 come after it
    data[damaged_at + 4] ^= 0x01  # "5" becomes "4": still a number, but its checksum fails
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFile) as refused:
        LoggedBookmarkStore(path)
    message = str(refused.value)
    assert str(path) in message and f"byte {damaged_at}" in message
    assert "salvage=True" in message and "checksum" in message
    assert path.read_bytes() == bytes(data)  # not rewritten


def test_defect_9_salvage_keeps_the_damaged_file_and_the_state_before_the_damage(tmp_path):
    """An explicit salvage keeps a copy and the state of the records before the damage:
    an earlier state, so what was discarded after it is delivered again, never skipped."""
    path = tmp_path / "bookmarks.log"
    data = bytearray(out_of_order_file(path))
    damaged_at = data.index(b"d 3 5 ")
    data[damaged_at + 4] ^= 0x01
    path.write_bytes(bytes(data))
    with LoggedBookmarkStore(path, salvage=True) as store:
        assert store.get_most_recent("s") == "orders|0|1|"  # 0 and 1 were in order
        delivered = deliver(store, range(2, 20))
    assert (tmp_path / "bookmarks.log.damaged").read_bytes() == bytes(data)
    refused = {o for o, ok in zip(range(2, 20), delivered, strict=True) if not ok}
    assert refused == {3}  # only the discards recorded before the damage


def test_defect_9_a_zero_byte_before_the_last_record_is_damage_not_a_torn_tail(tmp_path):
    """A kill tears only the last record; zeros in the middle (pages an OS crash did
    not write) used to end the reading there, silently."""
    path = tmp_path / "bookmarks.log"
    data = bytearray(out_of_order_file(path))
    middle = data.index(b"d 3 9 ")
    data[middle : middle + 6] = bytes(6)
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFile, match=f"byte {middle}"):
        LoggedBookmarkStore(path)


def test_a_file_of_the_first_format_without_checksums_is_still_read(tmp_path):
    path = tmp_path / "bookmarks.log"
    path.write_bytes(
        b'AMPS-KAFKA BOOKMARKS 1\nS 2 "s"\nT 3 2 0 orders\nl 3 0\nl 3 1\nx 3 2\nd 3 0\n'
    )
    with LoggedBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|0|"
        assert store.is_discarded(record(2), "s") and not store.is_discarded(record(1), "s")
    assert path.read_bytes().startswith(b"AMPS-KAFKA BOOKMARKS 2\n")


def ring_file(path: Path) -> bytearray:
    """A ring store's file with two subscriptions: "s" at offset 2, "t" at offset 5."""
    with RingBookmarkStore(path) as store:
        deliver(store, range(3), "s")
        deliver(store, range(6), "t")
        for offset in range(3):
            store.discard(record(offset), "s")
        for offset in range(6):
            store.discard(record(offset), "t")
    return bytearray(path.read_bytes())


@pytest.mark.parametrize(
    "spoil",
    ["key length", "key byte", "both cells"],
)
def test_defect_9_a_damaged_ring_slot_refuses_the_file(tmp_path, spoil):
    """Before: a slot whose length word was damaged was taken for a free one (its
    subscription's recovery point forgotten without a word, the slot then reused), a
    damaged key raised a bare JSON error, and two damaged cells read as EPOCH."""
    path = tmp_path / "bookmarks.ring"
    data = ring_file(path)
    slot = data.index(b'["s"') - 8
    if spoil == "key length":
        data[slot + 2] ^= 0x40  # a length far beyond the slot
    elif spoil == "key byte":
        data[slot + 10] ^= 0x01  # "s" becomes "r": valid JSON, another subscription
    else:
        data[slot + 512 - 32 : slot + 512] = b"\x01" * 32
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFile, match=f"byte {slot}: slot 0") as refused:
        RingBookmarkStore(path)
    assert "salvage=True" in str(refused.value)
    assert path.read_bytes() == bytes(data)


def test_defect_9_salvage_drops_only_the_damaged_ring_slot(tmp_path):
    path = tmp_path / "bookmarks.ring"
    data = ring_file(path)
    slot = data.index(b'["s"') - 8
    data[slot + 10] ^= 0x01
    path.write_bytes(bytes(data))
    with RingBookmarkStore(path, salvage=True) as store:
        assert store.get_most_recent("s") == EPOCH  # read again from the start: no loss
        assert store.get_most_recent("t") == "orders|0|5|"
        deliver(store, range(2), "u")  # the dropped slot is free again
    assert (tmp_path / "bookmarks.ring.damaged").read_bytes() == bytes(data)
    assert path.read_bytes()[slot + 8 : slot + 12] == b'["u"'
    with RingBookmarkStore(path) as store:
        assert store.get_most_recent("t") == "orders|0|5|"


def test_a_ring_file_of_the_first_format_is_read_and_brought_to_the_second(tmp_path):
    path = tmp_path / "bookmarks.ring"
    data = ring_file(path)
    data[: len(b"AMPS-KAFKA RING 1\n")] = b"AMPS-KAFKA RING 1\n"
    header = len(b"AMPS-KAFKA RING 1\n")
    for start in range(header, len(data), 512):
        data[start + 4 : start + 8] = bytes(4)  # no checksums in the first format
    path.write_bytes(bytes(data))
    with RingBookmarkStore(path) as store:
        assert store.get_most_recent("s") == "orders|0|2|"
    assert path.read_bytes().startswith(b"AMPS-KAFKA RING 2\n")
    with RingBookmarkStore(path) as store:  # the keys' checksums were written
        assert store.get_most_recent("t") == "orders|0|5|"
