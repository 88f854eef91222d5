"""SOW keys from Key paths: AMPS compares key fields as text."""

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from amps_on_kafka.errors import MessageError
from amps_on_kafka.log.keys import KeyExtractor


def test_a_single_key_is_the_field_text():
    assert KeyExtractor(["/id"])({"id": 42}) == "42"
    assert KeyExtractor(["/id"])({"id": "42"}) == "42"


def test_nested_and_numeric_paths():
    assert KeyExtractor(["/order/id"])({"order": {"id": "A1"}}) == "A1"
    assert KeyExtractor(["/55", "/109"])({"55": "IBM", "109": 7}) == '["IBM","7"]'


@pytest.mark.parametrize("document", [{}, {"id": None}, {"id": ""}, {"other": 1}, [1, 2], b"raw"])
def test_a_message_missing_its_key_field_is_rejected_with_the_path(document):
    with pytest.raises(MessageError, match="SOW key field /id"):
        KeyExtractor(["/id"])(document)


field_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=3)
    | st.floats()
    | st.lists(st.integers(), max_size=2)
)
documents = (
    st.dictionaries(
        st.sampled_from(["id", "a", "other"]),
        field_values | st.dictionaries(st.just("id"), field_values, max_size=1),
        max_size=3,
    )
    | st.lists(st.integers(), max_size=2)
    | st.text(max_size=2)
)


@given(st.lists(documents, max_size=8), st.sampled_from([["/id"], ["/a/id"], ["/id", "/a"]]))
@example([{"id": "a"}, {"id": ""}], ["/id"])  # texts, one empty
@example([{"id": 1}, {"id": True}], ["/id"])  # a bool among integers
def test_a_batch_is_keyed_as_each_document_would_be(batch, paths):
    """KeyExtractor.many (the worker's fast path) gives each document's key, or the error
    the first without one gives."""
    extract = KeyExtractor(paths)
    try:
        expected = [extract(document) for document in batch]
    except MessageError as exc:
        with pytest.raises(MessageError, match=re.escape(str(exc))):
            extract.many(batch)
        return
    assert extract.many(batch) == expected


@given(
    st.tuples(st.text(min_size=1), st.text(min_size=1)),
    st.tuples(st.text(min_size=1), st.text(min_size=1)),
)
def test_composite_keys_collide_only_when_every_field_is_equal(a, b):
    extract = KeyExtractor(["/a", "/b"])
    same = extract({"a": a[0], "b": a[1]}) == extract({"a": b[0], "b": b[1]})
    assert same == (a == b)
