"""A key look-up's answer written by the compiled core (native/src/lookups.rs,
look_up_answer) against its twin (server/queries.py _answer_frames): the same bytes.

Generated answers: records with keys and topics that need escaping (quotes,
backslashes, control characters, non-ASCII), timestamps, records that expire and ones
that never do, payloads of any size (so both cuts of a `sow` frame happen: `bs` records,
or BATCH_BYTES of payload), every combination of the acks asked for and the keys a
reply echoes (`cid`, `sub_id`, `query_id`, `s`). Both go through _answer_at_once, the
twin with the core taken away.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.log.codecs import JSON
from amps_on_kafka.native import core
from amps_on_kafka.processor.engine import QueryResult
from amps_on_kafka.server import queries
from amps_on_kafka.server.requests import Request, acks
from amps_on_kafka.state.record import NEVER, SowRecord

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
