"""Key analysis: Filter.equalities pins key values so the SOW can look records up directly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_on_kafka.expr import FilterError, compile_filter
from amps_on_kafka.expr.analysis import MAX_KEYS


def keys(text: str, *paths: str) -> list[tuple] | None:
    return compile_filter(text).equalities(list(paths))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/id = 42", [(42,)]),
        ("42 = /id", [(42,)]),
        ("/id == 'abc'", [("abc",)]),
        ("/id = -1.5", [(-1.5,)]),
        ("/id IN (1, 2)", [(1,), (2,)]),
        ("/id IN (1, 2, 1)", [(1,), (2,)]),
        ("/id = 1 AND /x > 3", [(1,)]),
        ("/x > 3 AND (/id = 1)", [(1,)]),
        ("/id = 1 OR /id = 2 OR /id IN (3, 1)", [(1,), (2,), (3,)]),
        ("(/id = 1 AND /x = 1) OR (/id = 2 AND /y = 2)", [(1,), (2,)]),
        ("/id = true", [(True,)]),
        ("/id IN (1, 1.0, true)", [(1,), (1.0,), (True,)]),
    ],
)
def test_single_key_is_pinned(text, expected):
    assert keys(text, "/id") == expected


@pytest.mark.parametrize(
    "text",
    [
        "/id = 1 OR /x = 2",
        "/id > 1",
        "/id != 1",
        "NOT /id = 1",
        "/x = 1",
        "/id = /other",
        "/id IN (1, /other)",
        "/id LIKE '1'",
        "/id + 0 = 1",
        "1=1",
        "/id/sub = 1",
    ],
)
def test_unpinned_key_is_none(text):
    assert keys(text, "/id") is None


def test_null_literals_pin_nothing():
    assert keys("/id = NULL", "/id") == []
    assert keys("/id = ''", "/id") == []
    assert keys("/id IN (1, NULL)", "/id") == [(1,)]


def test_every_key_path_must_be_pinned():
    assert keys("/a = 1 AND /b = 'x'", "/a", "/b") == [(1, "x")]
    assert keys("/b = 'x' AND /a = 1", "/a", "/b") == [(1, "x")]
    assert keys("/a = 1 AND /b > 'x'", "/a", "/b") is None
    assert keys("/a IN (1, 2) AND /b IN ('x', 'y')", "/a", "/b") == [
        (1, "x"),
        (1, "y"),
        (2, "x"),
        (2, "y"),
    ]


def test_nested_and_indexed_key_paths():
    assert keys("/k/id = 7 AND /arr[1] = 'z'", "/k/id", "/arr[1]") == [(7, "z")]


def test_no_key_paths_is_none():
    assert keys("/id = 1") is None


def test_too_many_combinations_is_none():
    items = ", ".join(str(i) for i in range(101))
    assert keys(f"/a IN ({items}) AND /b IN ({items})", "/a", "/b") is None
    assert MAX_KEYS < 101 * 101


def test_invalid_key_path_is_a_filter_error():
    with pytest.raises(FilterError):
        keys("/id = 1", "id")
    with pytest.raises(FilterError):
        keys("/id = 1", "/id = 1")


def test_caller_must_still_apply_the_filter():
    f = compile_filter("/id = 1 AND /x > 3")
    assert f.equalities(["/id"]) == [(1,)]
    assert not f.matches({"id": 1, "x": 2})


ids = st.integers(-3, 3)
conditions = st.recursive(
    st.one_of(
        ids.map(lambda i: f"/id = {i}"),
        st.lists(ids, min_size=1, max_size=3).map(lambda xs: f"/id IN ({', '.join(map(str, xs))})"),
        ids.map(lambda i: f"/x > {i}"),
        ids.map(lambda i: f"/id != {i}"),
    ),
    lambda inner: st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    ),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(conditions, ids, ids)
def test_pinned_keys_are_a_superset_of_matches(text, id_value, x_value):
    f = compile_filter(text)
    pinned = f.equalities(["/id"])
    if pinned is not None and f.matches({"id": id_value, "x": x_value}):
        assert (id_value,) in pinned
