"""The compiled split of a queue ack's bookmarks (native/src/acks.rs, message_ids)
against its twin (processor/queues.py, _message_ids_twin).

Bookmark lists as clients send them and odd ones (other part counts, signs, spaces,
non-ASCII digits, numbers past 64 bits, empty items, lone surrogates): where the
compiled split answers, the twin gives the same ids; it declines (None) only what is
not the common form, and never declines a list of common-form bookmarks.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from amps_on_kafka.errors import AmpsError
from amps_on_kafka.native import core
from amps_on_kafka.processor.queues import _message_ids, _message_ids_twin

# a lone surrogate is not UTF-8: the compiled split declines it (odd_parts has one)
topics = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="|,"), max_size=12)
numbers = st.integers(0, 2**64 + 5).map(str) | st.sampled_from(["007", "0"])
common = st.builds(lambda t, p, o: f"{t}|{p}|{o}|", topics, numbers, numbers)
odd_parts = st.sampled_from(["", "-1", "+1", " 1", "1 ", "²", "٣", "1.0", "x", "\ud800"])
odd = st.builds(
    lambda parts: "|".join(parts),
    st.lists(topics | numbers | odd_parts, min_size=0, max_size=6),
)


def twin(text: str) -> list | str:
    """The twin's ids, or its error's class name (the compiled split must decline)."""
    try:
        return _message_ids_twin(text)
    except (AmpsError, ValueError) as exc:
        return type(exc).__name__


@settings(max_examples=500, deadline=None)
@given(st.lists(common, min_size=1, max_size=6).map(",".join))
@example("q|0|1|,q|0|2|")
@example(f"q|{2**64 - 1}|{2**64 - 1}|")
def test_a_list_of_common_bookmarks_is_read_alike(text: str) -> None:
    expected = twin(text)
    got = core.message_ids(text)
    if any(int(n) >= 2**64 for item in text.split(",") for n in item.split("|")[1:3]):
        assert got is None  # past 64 bits: the twin's big ints
    else:
        assert got == expected
        assert _message_ids(text) == expected


@settings(max_examples=500, deadline=None)
@given(st.lists(common | odd, min_size=1, max_size=5).map(",".join))
@example("")
@example("q|1|2")
@example("q|1|2|x")
@example("q|²|2|")
@example("q|٣|2|")
@example("\ud800|1|2|")
def test_odd_bookmarks_are_left_to_the_twin_or_read_alike(text: str) -> None:
    got = core.message_ids(text)
    if got is not None:
        assert got == twin(text)
    expected = twin(text)
    if isinstance(expected, str):  # the twin's error stands whichever path runs
        with pytest.raises((AmpsError, ValueError)) as raised:
            _message_ids(text)
        assert type(raised.value).__name__ == expected
    else:
        assert _message_ids(text) == expected


def test_the_ids_of_one_topic_share_its_text() -> None:
    """Consecutive ids of one topic hold one text object (its hash computed once for
    the ack's look-ups); another topic gets its own, equal to what the twin reads."""
    ids = core.message_ids("q|0|1|,q|0|2|,r|0|3|,q|0|4|")
    assert ids == _message_ids_twin("q|0|1|,q|0|2|,r|0|3|,q|0|4|")
    assert ids[0][0] is ids[1][0] and ids[2][0] == "r" and ids[3][0] == "q"
