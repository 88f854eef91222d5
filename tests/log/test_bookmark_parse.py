"""Bookmark syntax: every form of seed 004, and clear errors for the rest."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_on_kafka.errors import InvalidBookmark
from amps_on_kafka.log.bookmarks import (
    Epoch,
    Moment,
    MostRecent,
    Now,
    Position,
    format_bookmark,
    format_list,
    parse_bookmark,
)

topics = st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True)
positions = st.builds(Position, topics, st.integers(0, 10_000), st.integers(0, 2**62))


def test_epoch_now_and_most_recent():
    assert parse_bookmark("0") is Epoch
    assert parse_bookmark("0|1|") is Now
    assert parse_bookmark("recent") is MostRecent


def test_timestamps_are_utc_with_an_optional_z():
    assert parse_bookmark("20150102T123500") == Moment(1420202100000)
    assert parse_bookmark("20150102T123500Z") == Moment(1420202100000)


@pytest.mark.parametrize(
    "text", ["20150102T123500+01", "20151302T123500", "20150102 123500", "2015-01-02T12:35:00Z"]
)
def test_only_the_amps_timestamp_form_with_z_is_accepted(text):
    with pytest.raises(InvalidBookmark):
        parse_bookmark(text)


@given(positions)
def test_a_message_bookmark_round_trips(position):
    assert (
        parse_bookmark(format_bookmark(position.topic, position.partition, position.offset))
        == position
    )


@given(st.lists(positions, min_size=2, max_size=6))
def test_a_list_is_a_position_per_entry(items):
    assert parse_bookmark(format_list(items)) == tuple(items)


def test_a_list_holding_epoch_begins_at_epoch():
    assert parse_bookmark("orders|0|5|,0") is Epoch


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "orders|0|5",
        "orders|x|5|",
        "or|ders|0|1|",
        "orders|0|-1|",
        "bogus",
        "orders|0|5|,0|1|",
    ],
)
def test_malformed_bookmarks_are_invalid_bookmark_errors(text):
    with pytest.raises(InvalidBookmark):
        parse_bookmark(text)


@given(st.text(max_size=60))
def test_any_text_parses_or_is_an_invalid_bookmark(text):
    try:
        parse_bookmark(text)
    except InvalidBookmark as exc:
        assert str(exc)
