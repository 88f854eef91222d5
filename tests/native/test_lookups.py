"""A key look-up's answer written by the compiled core (native/src/lookups.rs,
look_up_answer) against its twin (server/queries.py _answer_frames): the same bytes.

key_answer (the answer written from a key's stored bytes, the expiry and the equality
read on them) against its twin (queries._stored_answer without the core: the records,
engine.kept, _answer_at_once): the same bytes wherever it answers, and an answer for the
common record.

Generated answers: records with keys and topics that need escaping (quotes,
backslashes, control characters, non-ASCII), timestamps, records that expire and ones
that never do, payloads of any size (so both cuts of a `sow` frame happen: `bs` records,
or BATCH_BYTES of payload), every combination of the acks asked for and the keys a
reply echoes (`cid`, `sub_id`, `query_id`, `s`). Both go through _answer_at_once, the
twin with the core taken away.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.config import Config
from amps_on_kafka.expr.keys import KeyEquality
from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import QueryResult, SowEngine
from amps_on_kafka.server import queries
from amps_on_kafka.server.requests import Request, acks
from amps_on_kafka.state.record import HEADER_SIZE, NEVER, SowRecord, pack_record
from amps_on_kafka.state.sow import SowRules
from amps_on_kafka.state.store import PartitionStore

texts = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)
odd = st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "😀", "a|b"])
names = st.one_of(texts, st.lists(odd | texts, min_size=1, max_size=3).map("".join))
ACK_SETS = ["", "processed", "completed", "processed,completed", "processed,stats,completed"]


@st.composite
def records(draw: st.DrawFn, topic: str) -> SowRecord:
    timestamp = draw(st.integers(0, 2**62))
    lives = draw(st.one_of(st.just(None), st.integers(1, 10**9)))
    deadline = NEVER if lives is None else timestamp + lives
    payload = draw(st.binary(max_size=300))
    partition, offset = draw(st.integers(0, 99)), draw(st.integers(0, 2**62))
    return SowRecord(topic, partition, draw(names), payload, offset, timestamp, deadline, JSON)


@st.composite
def answers(draw: st.DrawFn) -> tuple[Request, str, int, QueryResult]:
    topic = draw(names)
    header: dict = {"c": "sow", "t": topic, "cid": draw(names)}
    for key, values in (("sub_id", names), ("query_id", names), ("s", st.integers(0, 2**40))):
        if draw(st.booleans()):
            header[key] = draw(values)
    header["a"] = draw(st.sampled_from(ACK_SETS))
    found = draw(st.lists(records(topic), max_size=4))
    matches = draw(st.integers(len(found), len(found) + 3))
    return (
        Request(header, b"", acks(header)),
        topic,
        draw(st.integers(1, 3)),
        QueryResult(found, matches),
    )


@settings(max_examples=600, deadline=None)
@given(answers())
@example(
    (
        Request({"c": "sow", "t": "t", "cid": "1", "a": "processed,completed"}, b"", frozenset()),
        "t",
        100,
        QueryResult([], 0),
    )
)
def test_an_answer_is_the_twins_byte_for_byte(case) -> None:
    request, topic, batch, result = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(queries, "BATCH_BYTES", 400)  # a frame cut by its payloads' size too
        compiled = queries._answer_at_once(request, topic, batch, result)
        patch.setattr(queries, "core", None)
        twin = queries._answer_at_once(request, topic, batch, result)
    assert compiled == twin


def test_a_batch_of_no_record_is_refused() -> None:
    with pytest.raises(ValueError, match="a batch of at least one record"):
        core.look_up_answer(b'"t":"t"', b'"t":"t"', (False, False, False), [], 0, 0, 1)


# -- key_answer: the answer written from the stored bytes ------------------------------

FIELD_NAMES = st.sampled_from(["id", "k", "a_1"])
NUMBERS = st.integers(-(10**18) + 1, 10**18 - 1)
TEXTS = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="'\\\x7f"), min_size=1, max_size=12
).filter(lambda text: not any(ord(c) < 0x20 for c in text))


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[PartitionStore]]:
    """Two real stores of the topic: the bytes are given to the answer, these only give
    the records their partition (PartitionStore.record_of)."""
    root = tmp_path_factory.mktemp("key-answer")
    made = [PartitionStore(root / f"p{p}", "t", p, JSON) for p in (0, 3)]
    yield made
    for store in made:
        store.close()


def _engine(expiring: bool) -> SowEngine:
    config = Config.model_validate(
        {
            "Topics": [{"Name": "t"}],
            "SOW": [
                {"Topic": "t", "Key": "/id", "Expiration": "enabled" if expiring else "disabled"}
            ],
        }
    )
    return SowEngine(config, {"t": SowRules(config.sow[0], JSON)}, lambda: 0)


ENGINES = {expiring: _engine(expiring) for expiring in (False, True)}


@st.composite
def payloads(draw: st.DrawFn, field: str, literal: int | str) -> bytes:
    """A payload at or near the look-up's: the field holding the literal, a value of the
    other type, a close value, a nested or listed one, none; and texts the scan must not
    be sure of (the field twice, an escaped name, an escaped value, broken JSON)."""
    value = draw(
        st.sampled_from(
            [
                literal,
                str(literal),
                literal + 1 if isinstance(literal, int) else literal + "x",
                float(literal) if isinstance(literal, int) else 1.5,
                [literal],
                {"v": literal},
                None,
                True,
                -5,
            ]
        )
    )
    shape = draw(st.integers(0, 9))
    document = {"other": draw(st.integers(0, 9)), field: value}
    if shape == 1:
        del document[field]
    encoded = orjson.dumps(document)
    if shape == 2:  # the field twice
        return encoded[:-1] + b"," + orjson.dumps({field: literal})[1:]
    if shape == 3:  # a name escaped
        return encoded.replace(
            b'"' + field.encode() + b'"',
            b'"\\u00' + b"%02x" % ord(field[0]) + field[1:].encode() + b'"',
        )
    if shape == 4:  # broken
        return encoded[: draw(st.integers(0, len(encoded) - 1))]
    if shape == 5:  # a value escaped
        return orjson.dumps({field: 'a"b'})
    if shape == 6:
        return b" \n" + encoded + b"\t "
    if shape == 7:  # past 64 bits
        return b'{"' + field.encode() + b'":123456789012345678901234}'
    return encoded


@st.composite
def stored_cases(draw: st.DrawFn) -> tuple:
    field = draw(FIELD_NAMES)
    literal = draw(NUMBERS | TEXTS)
    text = f"/{field} = {literal}" if isinstance(literal, int) else f"/{field} = '{literal}'"
    equality = KeyEquality.of(text)
    assert equality is not None, text
    now = draw(st.integers(10**12, 2 * 10**12))
    found = []
    for at in draw(st.lists(st.sampled_from([0, 1]), max_size=2, unique=True)):
        timestamp = draw(st.integers(0, now))
        deadline = draw(
            st.sampled_from([NEVER, now - 1, now, now + 1, now + 10**6])
            | st.integers(-5, 10**16).map(lambda lives, ts=timestamp: ts + lives)
        )  # the last: an `e` from below 0 to past where orjson writes an exponent
        stored = pack_record(
            draw(st.integers(0, 2**62)), timestamp, deadline, draw(payloads(field, literal))
        )
        if draw(st.integers(0, 30)) == 0:
            stored = stored[: draw(st.integers(0, 23))]
        found.append((at, stored))
    header: dict = {"c": "sow", "t": "t", "cid": draw(names), "a": draw(st.sampled_from(ACK_SETS))}
    if draw(st.booleans()):
        header["s"] = draw(st.integers(0, 2**40))
    return equality, draw(st.booleans()), found, now, Request(header, b"", acks(header))


def _key_answers_compiled(case: tuple) -> tuple | None:
    """The compiled core's answer, None where it declines."""
    equality, expiring, found, now, request = case
    echo, acked, wants = queries._echoes(request, "t")
    return core.key_answer(  # type: ignore[no-any-return]
        echo, acked, wants, "t", equality.key, equality.path[1:], equality.literal,
        [((0, 3)[at], stored) for at, stored in found], now, expiring, 2, 400,
    )  # fmt: skip


def _key_answers(stores: list[PartitionStore], case: tuple) -> tuple[tuple | None, tuple]:
    """The compiled core's answer (None where it declines) and the twin's."""
    equality, expiring, found, now, request = case
    engine = ENGINES[expiring]
    in_stores = [(stores[at], stored) for at, stored in found]
    compiled = _key_answers_compiled(case)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(queries, "BATCH_BYTES", 400)
        patch.setattr(queries, "core", None)
        twin = queries._stored_answer(request, engine, "t", 2, equality, in_stores, now)
    return compiled, twin


@settings(max_examples=800, deadline=None)
@given(stored_cases())
def test_an_answer_from_the_stored_bytes_is_the_twins(
    stores: list[PartitionStore], case: tuple
) -> None:
    """Wherever key_answer answers, byte for byte what the records, engine.kept and the
    Python frames give: records expired or not, fields of the literal's type equal or
    not; it declines (None) only where the twin must decide."""
    if any(len(stored) < HEADER_SIZE for _, stored in case[2]):  # the twin fails on it
        assert _key_answers_compiled(case) is None
        return
    compiled, twin = _key_answers(stores, case)
    if compiled is not None:
        assert compiled == twin


@pytest.mark.parametrize(
    ("payload", "literal", "expected"),
    [
        (b'{"id":42,"sym":"IBM"}', 42, 1),  # the common case
        (b'{"sym":"IBM","id":"42"}', "42", 1),
        (b'{"id":43}', 42, 0),  # another value of the literal's type: no match, decided
        (b'{"id":"42"}', 42, None),  # a text for a number: the compiled filter decides
        (b'{"id":42.0}', 42, None),
        (b'{"id":42,"id":42}', 42, None),  # the field twice
        (b'{"id":"4\\"2"}', '4"2', None),  # an escaped value
        (b'{"id":42', 42, None),  # not JSON
    ],
)
def test_key_answer_answers_the_common_cases_and_declines_the_rest(
    payload: bytes, literal: int | str, expected: int | None
) -> None:
    stored = [(0, pack_record(7, 1_000, NEVER, payload))]
    answer = core.key_answer(
        b'"t":"t"',
        b'"t":"t"',
        (False, True, False),
        "t",
        "42",
        "id",
        literal,
        stored,
        2_000,
        False,
        10,
        400,
    )
    if expected is None:
        assert answer is None
        return
    assert answer is not None
    assert b'"records_returned":%d' % expected in answer[0]


def test_key_answer_leaves_expired_records_out_and_writes_the_e_of_expiring_ones() -> None:
    """An expired record of an expiring topic is left out; a live record with a deadline
    is answered with its `e` as orjson writes SowRecord.expiration; an `e` of 0 or
    less, or of 10^12 s or more (orjson's exponent is near), is declined."""
    args = (b'"t":"t"', b'"t":"t"', (False, True, False), "t", "42", "id", 42)

    def answer(timestamp: int, deadline: int, now: int, expiring: bool = True) -> bytes | None:
        stored = [(0, pack_record(7, timestamp, deadline, b'{"id":42}'))]
        given = core.key_answer(*args, stored, now, expiring, 10, 400)
        return None if given is None else given[0]

    assert b'"records_returned":0' in answer(1_000, 1_500, 2_000)  # type: ignore[operator]
    for lives, e in ((500, b"0.5"), (1, b"0.001"), (3_600_000, b"3600.0"), (10**15 - 1, None)):
        written = answer(1_000, 1_000 + lives, 1_000)
        assert written is not None and b'"e":' + (e or orjson.dumps(lives / 1000)) in written
    assert answer(1_000, 1_000 + 10**15, 1_000) is None
    assert answer(1_000, 1_000, 900) is None
    assert b'"e":0.5' in answer(1_000, 1_500, 2_000, expiring=False)  # type: ignore[operator]
